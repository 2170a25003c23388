//! `vnvme serve` on NBD exports, across processes, with the sandbox on: the
//! userspace driver writes, reads back, flushes, deallocates and writes zeroes on a
//! namespace served by qemu-nbd (a qcow2 image) and by nbdkit (memory plugin); the
//! NBD server restarted under a running vnvme is reconnected to and I/O goes on; an
//! NBD server that is not there fails the start-up, naming it.

mod common;

use common::{opts, temp_dir, Server};
use nvme_driver::{CompletionMode, DoorbellMode, IoCommand, IoQueue, LbaRange};
use test_kit::nbd::{qcow2, servers, NbdServer};
use test_kit::pattern;

/// Writes 64 blocks of 4 KiB at QD 16 and reads them back.
fn write_read_verify(q: &mut IoQueue, first_lba: u64, seed: u64) {
    let mut cids = std::collections::HashMap::new();
    for i in 0..64u64 {
        let buf = q.alloc_buf(4096).unwrap();
        buf.write_at(0, &pattern(seed ^ i, 4096)).unwrap();
        let cid = q
            .submit(IoCommand::Write { nsid: 1, slba: first_lba + i * 8, nlb: 8, buf, fua: i % 5 == 0 })
            .unwrap();
        cids.insert(cid, i);
        if cids.len() == 16 || i == 63 {
            let mut done = Vec::new();
            while done.len() < cids.len() {
                q.wait_completions(&mut done).unwrap();
            }
            assert!(
                done.iter().all(|c| c.status.is_success()),
                "writes: {:?}",
                done.iter().map(|c| c.status).collect::<Vec<_>>()
            );
            cids.clear();
        }
    }
    for i in 0..64u64 {
        let buf = q.alloc_buf(4096).unwrap();
        q.submit(IoCommand::Read { nsid: 1, slba: first_lba + i * 8, nlb: 8, buf }).unwrap();
        let mut done = Vec::new();
        while done.is_empty() {
            q.wait_completions(&mut done).unwrap();
        }
        let c = done.remove(0);
        assert!(c.status.is_success(), "read: {:?}", c.status);
        let b = c.into_result().unwrap().unwrap();
        let mut got = vec![0u8; 4096];
        b.read_at(0, &mut got).unwrap();
        assert!(got == pattern(seed ^ i, 4096), "block {i} reads back different");
    }
}

#[test]
fn io_on_a_qemu_nbd_export_and_its_restart_under_a_running_server() {
    let Some(bin) = servers() else { return };
    let dir = temp_dir("nbd-qemu");
    let img = dir.join("disk.qcow2");
    qcow2(&bin, &img, "64M");
    let nbd = NbdServer::qemu_nbd(&bin, &img, &dir.join("nbd.sock"));
    let server = Server::start_in(&dir, "s", &["--ns", &nbd.uri(), "--workers", "1"]);
    assert!(server.log().contains("sandbox on"), "{}", server.log());
    let mut d = server.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Interrupts));
    let id = d.identify(0x01, 0).unwrap();
    let oncs = u16::from_le_bytes([id[520], id[521]]);
    write_read_verify(d.queue(1).unwrap(), 0, 1);
    d.flush(1).expect("flush");
    if oncs & nvme_spec::identify::oncs::WRITE_ZEROES != 0 {
        d.write_zeroes(1, 0, 8, false).expect("write zeroes");
        let mut got = vec![1u8; 4096];
        d.read(1, 0, &mut got).unwrap();
        assert!(got.iter().all(|&b| b == 0), "write zeroes read back non-zero");
    }
    if oncs & nvme_spec::identify::oncs::DSM != 0 {
        d.deallocate(1, &[LbaRange { slba: 512, nlb: 64 }]).expect("deallocate");
    }
    let q = d.queue(1).unwrap();
    // qemu-nbd goes away and comes back: vnvme (sandboxed) reconnects.
    drop(nbd);
    let _nbd = NbdServer::qemu_nbd(&bin, &img, &dir.join("nbd.sock"));
    write_read_verify(q, 2048, 2);
    assert!(server.log().contains("re-established"), "{}", server.log());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn io_on_an_nbdkit_memory_export_with_workers() {
    let Some(bin) = servers() else { return };
    let dir = temp_dir("nbd-kit");
    let nbd = NbdServer::nbdkit_memory(&bin, &dir.join("nbd.sock"), "64M");
    let server = Server::start_in(&dir, "s", &["--ns", &nbd.uri(), "--workers", "2"]);
    let mut d = server.driver(DoorbellMode::Trapped, opts(2, true, CompletionMode::Interrupts));
    write_read_verify(d.queue(1).unwrap(), 0, 3);
    write_read_verify(d.queue(2).unwrap(), 4096, 4);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_nbd_server_that_is_not_there_fails_the_start_naming_it() {
    let dir = temp_dir("nbd-none");
    let uri = format!("nbd+unix:///?socket={}", dir.join("nobody.sock").display());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vnvme"))
        .args(["serve", "--socket"])
        .arg(dir.join("s.sock"))
        .args(["--ns", &uri])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nobody.sock"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
