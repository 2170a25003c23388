//! The revoke guarantee on the `nvme://` wire (block_backend's in-flight core, direct
//! mode, states it), against a downstream whose I/O is held back: a request given up
//! on while the downstream device holds it.

use std::time::{Duration, Instant};

use block_backend::{Backend, BackendError, BackendQueue, Completion, DataBuf, Op};
use guest_mem::GuestMemory;
use nvme_disk::NvmeBackend;

mod common;
use common::*;

/// Reaps until `tag` completes (bounded); every completion reaped is returned.
fn reap_until(q: &mut dyn BackendQueue, tag: u64) -> Vec<Completion> {
    q.commit();
    let mut out = Vec::new();
    let deadline = Instant::now() + TIMEOUT;
    while !out.iter().any(|c: &Completion| c.tag == tag) {
        assert!(Instant::now() < deadline, "request {tag} never completed");
        if q.reap(&mut out) == 0 {
            match q.notifier() {
                Some(fd) => {
                    wait_readable(fd, 50);
                }
                None => std::thread::yield_now(),
            }
        }
    }
    out
}

/// Opens the downstream's gate when dropped, so a failing check while it is closed
/// does not leave the downstream's worker (and the teardown that waits for it) stuck.
struct OpenGate<'a>(&'a TestNs);

impl Drop for OpenGate<'_> {
    fn drop(&mut self) {
        self.0.set_gate(true);
    }
}

fn all(mem: &GuestMemory, gpa: u64, len: usize, byte: u8) -> bool {
    let mut b = vec![0u8; len];
    mem.read(gpa, &mut b).unwrap();
    b.iter().all(|&x| x == byte)
}

/// A bounced read given up on while the device holds it completes at once as given
/// up on; the device's completion never reaches the caller, and its data never
/// reaches guest memory; its slot is not handed to a write submitted meanwhile (the
/// read's data would land in that write's guest buffer). A zero-copy read the
/// device holds cannot be given up on, and completes with its data.
#[test]
fn requests_given_up_on_while_the_device_holds_them() {
    for poll in [false, true] {
        let s = Setup::default();
        let d = Downstream::start(&s);
        let b = NvmeBackend::open(&d.uri(&format!("queues=1&poll={}", poll as u8))).unwrap();
        let mut q = b.open_queue().unwrap();
        // Dropped first, on a failure too.
        let _open = OpenGate(&s.ns);
        let q = q.as_mut();
        let old = pattern(51, 0x10000);
        write_host(q, 0, old.clone());

        // Anonymous memory: bounced.
        let mem = GuestMemory::anonymous(&[(0, 4 * MIB)]).unwrap();
        mem.fill(0, MIB, 0xee).unwrap();
        s.ns.set_gate(false);
        q.submit(&mem, req(1, Op::Read, 0, 0x10000, guest(&[(0, 0x10000)])));
        q.commit();
        assert_eq!(q.revoke(1), Some(true), "a bounced read can be given up on");
        let mut out = Vec::new();
        assert_eq!(q.reap(&mut out), 1, "it completes at once, the device still holding it");
        assert!(matches!(out[0].result, Err(BackendError::NotReady(_))), "{:?}", out[0].result);
        assert!(matches!(out[0].data, DataBuf::None));
        assert_eq!(q.in_flight(), 0);
        // A bounced write, reusing the tag, while the device still holds the read.
        let new = pattern(52, 0x10000);
        mem.write(2 * MIB, &new).unwrap();
        q.submit(&mem, req(1, Op::Write { fua: false }, MIB, 0x10000, guest(&[(2 * MIB, 0x10000)])));
        s.ns.set_gate(true);
        let done = reap_until(q, 1);
        assert_eq!(done.len(), 1, "the device's completion of the revoked read reached the caller");
        assert!(done[0].result.is_ok(), "{:?}", done[0].result);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(q.reap(&mut out), 0, "the device's completion of the revoked read reached the caller");
        assert!(all(&mem, 0, MIB as usize, 0xee), "a revoked read's data reached guest memory");
        let mut w = vec![0u8; 0x10000];
        mem.read(2 * MIB, &mut w).unwrap();
        assert!(w == new, "the read's data landed in another request's buffer");
        assert!(read_host(q, MIB, 0x10000) == new, "the write");

        // Fd-backed memory: zero copy, which the device cannot be stopped from.
        let fd_mem = memfd_memory(&[(0, 4 * MIB)]);
        fd_mem.fill(0, 0x10000, 0xee).unwrap();
        s.ns.set_gate(false);
        q.submit(&fd_mem, req(2, Op::Read, 0, 0x10000, guest(&[(0, 0x10000)])));
        q.commit();
        assert_eq!(q.revoke(2), Some(false), "a zero-copy read the device holds cannot be stopped");
        s.ns.set_gate(true);
        let done = reap_until(q, 2);
        assert!(done.len() == 1 && done[0].result.is_ok(), "{done:?}");
        let mut got = vec![0u8; 0x10000];
        fd_mem.read(0, &mut got).unwrap();
        assert!(got == old, "the zero-copy read's data");
        drop(d);
    }
}
