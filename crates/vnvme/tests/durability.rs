//! Nothing acknowledged and flushed is ever lost: a client streams writes to a
//! file-backed namespace with Flush commands and FUA writes mixed in, the server is
//! killed with SIGKILL while writes and a flush are in flight, a new server opens
//! the same file, and every block that was acknowledged before a completed Flush
//! (or acknowledged as a FUA write) reads back exactly.
//!
//! SIGKILL ends the process, not the machine: what this proves is that the
//! controller acknowledges nothing before the backend has it (no acknowledged
//! write is still sitting in a userspace queue when the process dies) and that the
//! file survives a crash mid-stream in a state a restart can serve. Power loss is
//! the kernel's fdatasync contract, which Flush and FUA map to.

mod common;

use std::collections::HashMap;

use common::{opts, temp_dir, Server};
use nvme_driver::{CompletionMode, DoorbellMode, IoCommand};
use test_util::pattern;

const NS_BYTES: u64 = 64 << 20;
const BLOCK: u64 = 4096;
const LBA: u64 = 512;
/// Writes in flight per round.
const QD: usize = 32;
const ROUNDS: u64 = 24;

/// Block `i` of the stream goes to a distinct slot (a permutation of the namespace),
/// so each block is written once and its expected content is unambiguous.
fn slot(i: u64) -> u64 {
    (i * 7919) % (NS_BYTES / BLOCK)
}

fn block_data(i: u64) -> Vec<u8> {
    let mut d = pattern(0xd0_0000 + i, BLOCK as usize);
    d[..8].copy_from_slice(&i.to_le_bytes());
    d
}

/// Streams to a server started with `--ns first`, kills it, restarts it with
/// `--ns again` (the same storage) and verifies.
fn sigkill_mid_stream_keeps_flushed_writes(dir: &std::path::Path, first: &str, again: &str) {
    sigkill_mid_stream_env(dir, first, again, &[])
}

/// [`sigkill_mid_stream_keeps_flushed_writes`], the servers started with `env` added.
fn sigkill_mid_stream_env(dir: &std::path::Path, first: &str, again: &str, env: &[(String, String)]) {
    let mut server = Server::start_in_env(dir, "a", &["--ns", first], env);
    let mut d = server.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Interrupts));
    let q = d.queue(1).expect("queue 1");

    // Stream: each round submits QD writes and a Flush together; a Flush covers the
    // writes acknowledged before it was submitted. Every seventh write is FUA.
    let mut durable: Vec<u64> = Vec::new();
    let mut acked_unflushed: Vec<u64> = Vec::new();
    let mut next = 0u64;
    let mut inflight: HashMap<u16, (Option<u64>, bool)> = HashMap::new();
    let mut done = Vec::new();
    for round in 0..=ROUNDS {
        // The flush goes first, so it covers exactly what was acknowledged so far.
        let covered = std::mem::take(&mut acked_unflushed);
        let cid = q.submit(IoCommand::Flush { nsid: 1 }).expect("submit flush");
        inflight.insert(cid, (None, false));
        let mut flushed = Some(covered);
        for _ in 0..QD {
            let buf = q.alloc_buf(BLOCK).expect("buffer");
            buf.write_at(0, &block_data(next)).unwrap();
            let fua = next % 7 == 3;
            let cmd = IoCommand::Write {
                nsid: 1,
                slba: slot(next) * BLOCK / LBA,
                nlb: (BLOCK / LBA) as u32,
                buf,
                fua,
            };
            let cid = q.submit(cmd).expect("submit write");
            inflight.insert(cid, (Some(next), fua));
            next += 1;
        }
        if round == ROUNDS {
            // Everything of this round is in flight (or just finishing): now.
            server.kill_hard();
            break;
        }
        while !inflight.is_empty() {
            done.clear();
            q.wait_completions(&mut done).expect("completions");
            for c in done.drain(..) {
                let (block, fua) = inflight.remove(&c.cid).expect("a command we sent");
                assert!(c.status.is_success(), "command {} failed: {:?}\n{}", c.cid, c.status, server.log());
                match block {
                    Some(b) if fua => durable.push(b),
                    Some(b) => acked_unflushed.push(b),
                    None => durable.extend(flushed.take().expect("one flush per round")),
                }
            }
        }
    }
    // The driver's controller is gone; dropping the driver must not hang.
    drop(d);
    assert!(
        durable.len() as u64 > ROUNDS * QD as u64 / 2,
        "the test made a meaningful number of blocks durable"
    );

    // A new server on the same storage.
    let server = Server::start_in_env(dir, "b", &["--ns", again], env);
    let mut d = server.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Polling));
    let q = d.queue(1).expect("queue 1");
    let mut got = vec![0u8; BLOCK as usize];
    for &b in &durable {
        q.read(1, slot(b) * BLOCK / LBA, &mut got).expect("read back");
        assert!(
            got == block_data(b),
            "block {b} (slot {}) was acknowledged and flushed but reads back wrong",
            slot(b)
        );
    }
    // Blocks never written read back as zeroes (a hole in the file, not garbage).
    q.read(1, slot(next + 1) * BLOCK / LBA, &mut got).expect("read back");
    assert!(got.iter().all(|&x| x == 0), "an unwritten block reads zeroes");
    eprintln!("{first}: {} durable blocks verified after SIGKILL ({} written)", durable.len(), next);
}

/// A file namespace with `options`, created at 64 MiB, then reopened at its size.
fn on_file(options: &str) {
    let dir = temp_dir("durability");
    let img = dir.join("disk.img").display().to_string();
    sigkill_mid_stream_keeps_flushed_writes(
        &dir,
        &format!("file:{img}:64M{options}"),
        &format!("file:{img}{options}"),
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigkill_keeps_flushed_writes_io_uring_direct() {
    on_file(":direct=auto");
}

#[test]
fn sigkill_keeps_flushed_writes_io_uring_buffered() {
    on_file(":direct=off");
}

#[test]
fn sigkill_keeps_flushed_writes_sync_engine() {
    on_file(":engine=sync");
}

/// The front server passes everything to a second vnvme over `nvme://` (Flush and
/// FUA become downstream Flush and FUA); the front is the one killed.
#[test]
fn sigkill_of_an_nvme_front_keeps_flushed_writes() {
    let dir = temp_dir("durability-chain");
    let img = dir.join("disk.img");
    let _back = Server::start_in(&dir, "back", &["--ns", &format!("file:{}:64M", img.display())]);
    let uri = format!("nvme://{}", dir.join("back.sock").display());
    sigkill_mid_stream_keeps_flushed_writes(&dir, &uri, &uri);
    drop(_back);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The backing file shrinks, then disappears, under a running server: reads past the
/// new end and then every command fail with Namespace Not Ready (the host may retry),
/// SMART reports degraded reliability, and the server keeps serving.
#[test]
fn backend_file_truncated_then_removed_underneath() {
    use nvme_spec::Status;
    let dir = temp_dir("vanish");
    let img = dir.join("disk.img");
    let server = Server::start_in(&dir, "a", &["--ns", &format!("file:{}:16M", img.display())]);
    let mut d = server.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Interrupts));
    let data = pattern(42, 8192);
    d.write(1, 100, &data).expect("write before the trouble");
    d.write(1, 20_000, &data).expect("write near the end");

    // Shrink the file to 8 MiB: block 20000 (10 MB in) is gone, block 100 is not.
    std::fs::OpenOptions::new().write(true).open(&img).unwrap().set_len(8 << 20).unwrap();
    let mut got = vec![0u8; 8192];
    let e = d.read(1, 20_000, &mut got).expect_err("a read past the new end fails");
    assert_eq!(e.status().map(|s| s.code()), Some(Status::NAMESPACE_NOT_READY), "{e}");
    assert!(!e.status().unwrap().dnr(), "Namespace Not Ready may be retried");
    d.read(1, 100, &mut got).expect("a read before the new end still works");
    assert!(got == data);

    // Remove it: Flush finds out, and so does everything after.
    std::fs::remove_file(&img).unwrap();
    let e = d.flush(1).expect_err("flush of a removed file fails");
    assert_eq!(e.status().map(|s| s.code()), Some(Status::NAMESPACE_NOT_READY), "{e}");
    let e = d.write(1, 100, &data).expect_err("writes to a removed file fail");
    assert_eq!(e.status().map(|s| s.code()), Some(Status::NAMESPACE_NOT_READY), "{e}");

    // The controller is healthy and says the storage degraded.
    let smart = d.get_log_page(0x02, 0xffff_ffff, 512).expect("SMART log");
    assert_eq!(smart[0] & 0x04, 0x04, "critical warning: reliability degraded");
    assert!(server.log().contains("backend request failed"), "the server logged it:\n{}", server.log());
    drop(d);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The namespace is an NBD export: qemu-nbd serving a qcow2 image (a real server from
/// Debian). vnvme is the one killed; flushed and FUA writes must be on the export
/// when a new vnvme opens it.
#[test]
fn sigkill_of_a_server_on_nbd_keeps_flushed_writes() {
    let Some(bin) = test_servers::nbd::servers() else { return };
    let dir = temp_dir("durability-nbd");
    let img = dir.join("disk.qcow2");
    test_servers::nbd::qcow2(&bin, &img, "64M");
    let nbd = test_servers::nbd::NbdServer::qemu_nbd(&bin, &img, &dir.join("nbd.sock"));
    let uri = nbd.uri();
    sigkill_mid_stream_keeps_flushed_writes(&dir, &uri, &uri);
    drop(nbd);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The namespace is an RBD image on a real single-node Ceph cluster (one OSD on
/// memstore), reached as a user with `profile rbd` caps: a SIGKILLed vnvme loses
/// nothing flushed (librbd's cache is written back by Flush, and FUA is a write then
/// a flush).
#[test]
fn sigkill_of_a_server_on_rbd_keeps_flushed_writes() {
    let Some(ceph) = test_servers::ceph::cluster() else { return };
    let dir = temp_dir("durability-rbd");
    ceph.create_image("durability", "64M");
    let ns = ceph.ns("durability");
    sigkill_mid_stream_env(&dir, &ns, &ns, &ceph.env);
    let _ = std::fs::remove_dir_all(&dir);
}
