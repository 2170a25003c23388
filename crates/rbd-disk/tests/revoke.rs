//! The revoke guarantee on librbd's wire (block_backend's in-flight core states it),
//! against the real test cluster: a read given up on leaves guest memory alone when
//! librbd hands its data back, and completes without it. Without Ceph every test
//! here is a loud skip.

use std::time::{Duration, Instant};

use block_backend::{Backend, BackendError, BackendQueue, Completion, DataBuf, Op, Request, Segment};
use guest_mem::GuestMemory;
use rbd_disk::{RbdBackend, RbdSpec};
use test_servers::ceph::cluster;
use test_util::pattern;

const TIMEOUT: Duration = Duration::from_secs(60);

fn wait_for(q: &mut Box<dyn BackendQueue>, tag: u64) -> Completion {
    let t = Instant::now();
    let mut out = Vec::new();
    loop {
        q.reap(&mut out);
        if let Some(i) = out.iter().position(|c| c.tag == tag) {
            return out.remove(i);
        }
        assert!(t.elapsed() < TIMEOUT, "request {tag} did not complete");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn rw(tag: u64, op: Op, offset: u64, len: u64, gpa: u64) -> Request {
    Request { tag, op, offset, len, data: DataBuf::Guest(vec![Segment::Guest { gpa, len }]) }
}

/// Set in the copy of this test binary that runs the test with librbd's
/// environment (the loader reads LD_LIBRARY_PATH at start only).
const CHILD: &str = "VNVME_TEST_RBD_CHILD";

#[test]
fn a_read_given_up_on_keeps_off_guest_memory() {
    let Some(ceph) = cluster() else { return };
    if std::env::var_os(CHILD).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "a_read_given_up_on_keeps_off_guest_memory", "--nocapture", "--test-threads=1"])
            .envs(ceph.env.iter().map(|(k, v)| (k, v)))
            .env(test_servers::ceph::CLUSTER_ENV, &ceph.dir)
            .env(CHILD, "1")
            .output()
            .expect("run the test with librbd's environment");
        let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
        return;
    }
    ceph.create_image("revoke", "16M");
    let mut spec = RbdSpec::parse_image("rbd/revoke").unwrap();
    spec.conf = Some(ceph.dir.join("ceph.conf"));
    spec.id = Some("vnvme".into());
    spec.keyring = Some(ceph.keyring());
    let be = RbdBackend::open(&spec).expect("open the image");
    let mut q = be.open_queue().expect("a queue");
    let mem = GuestMemory::anonymous(&[(0, 4 << 20)]).unwrap();

    mem.write(0, &pattern(31, 65536)).unwrap();
    q.submit(&mem, rw(1, Op::Write { fua: true }, 1 << 20, 65536, 0));
    q.commit();
    assert!(wait_for(&mut q, 1).result.is_ok(), "the write (with its flush)");

    mem.fill(1 << 20, 65536, 0xee).unwrap();
    q.submit(&mem, rw(2, Op::Read, 1 << 20, 65536, 1 << 20));
    q.commit();
    assert_eq!(q.revoke(2), Some(true));
    let c = wait_for(&mut q, 2);
    assert!(matches!(c.result, Err(BackendError::NotReady(_))), "{:?}", c.result);
    assert!(matches!(c.data, DataBuf::None), "a revoked read hands its buffer back");
    let mut got = vec![0u8; 65536];
    mem.read(1 << 20, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 0xee), "a revoked read's data reached guest memory");

    // The same read, not revoked, does bring the data: the check above can fail.
    q.submit(&mem, rw(3, Op::Read, 1 << 20, 65536, 1 << 20));
    q.commit();
    assert!(wait_for(&mut q, 3).result.is_ok());
    mem.read(1 << 20, &mut got).unwrap();
    assert!(got == pattern(31, 65536), "the read brings what was written");
}
