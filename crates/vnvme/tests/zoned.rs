//! A zoned namespace on a file keeps its write pointers across a SIGKILL: a client
//! streams sequential writes into eight zones, the server is killed, a new server
//! opens the same file (and the zone state file beside it), and each zone's write
//! pointer is exactly where the acknowledged writes ended: a write there is
//! accepted, one a block before or after is refused Zone Invalid Write, and the
//! data below it reads back. Killed with writes in flight, each pointer is at or
//! past every acknowledged write and at most at the end of what was sent.
//!
//! The pointer is probed with writes, not read from a report: what a host relies
//! on is which write the zone takes next.

mod common;

use std::collections::HashMap;

use common::{opts, temp_dir, Server};
use nvme_driver::{CompletionMode, DoorbellMode, IoCommand, IoQueue as Queue};
use nvme_spec::Status;
use test_util::pattern;

const LBA: u64 = 512;
/// 1 MiB zones: 2,048 blocks.
const ZONE_BLOCKS: u64 = (1 << 20) / LBA;
const ZONES: u64 = 8;
/// Each write: 4 KiB, 8 blocks.
const NLB: u64 = 8;

fn data(zone: u64, k: u64) -> Vec<u8> {
    pattern(0x20_0000 + zone * 4096 + k, (NLB * LBA) as usize)
}

/// Submits `per_zone` writes at the pointer in `sent` of each zone in `zones` (all
/// in flight at once), returning (cid -> zone).
fn submit_round(q: &mut Queue, sent: &mut [u64], zones: &[u64], per_zone: u64) -> HashMap<u16, u64> {
    let mut inflight = HashMap::new();
    for _ in 0..per_zone {
        for &z in zones {
            let buf = q.alloc_buf(NLB * LBA).expect("buffer");
            buf.write_at(0, &data(z, sent[z as usize])).unwrap();
            let slba = z * ZONE_BLOCKS + sent[z as usize] * NLB;
            let cid = q
                .submit(IoCommand::Write { nsid: 1, slba, nlb: NLB as u32, buf, fua: false })
                .expect("submit");
            inflight.insert(cid, z);
            sent[z as usize] += 1;
        }
    }
    inflight
}

/// Writes of `NLB` blocks at `slba`: its status.
fn probe(q: &mut Queue, slba: u64) -> Status {
    let buf = q.alloc_buf(NLB * LBA).expect("buffer");
    let cid = q.submit(IoCommand::Write { nsid: 1, slba, nlb: NLB as u32, buf, fua: false }).expect("submit");
    let mut done = Vec::new();
    loop {
        q.wait_completions(&mut done).expect("completion");
        if let Some(c) = done.iter().find(|c| c.cid == cid) {
            return c.status.code();
        }
    }
}

/// On io_uring, a write's completion is reaped (the tracked path); on the
/// synchronous engine it is run where it is fetched: both move and record the
/// pointer before the host hears of the write.
#[test]
fn write_pointers_survive_a_sigkill_exactly_io_uring() {
    write_pointers_survive_a_sigkill_exactly(":engine=uring");
}

#[test]
fn write_pointers_survive_a_sigkill_exactly_sync_engine() {
    write_pointers_survive_a_sigkill_exactly(":engine=sync");
}

fn write_pointers_survive_a_sigkill_exactly(engine: &str) {
    let dir = temp_dir("zoned-kill");
    let img = dir.join("zns.img").display().to_string();
    let spec = format!("file:{img}:{}M:zoned=1M{engine}", ZONES);
    let mut server = Server::start_in(&dir, "a", &["--ns", &spec]);
    let mut d = server.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Interrupts));
    let q = d.queue(1).expect("queue 1");
    // Zone z gets 3 + z writes, all acknowledged.
    let mut sent = vec![0u64; ZONES as usize];
    for round in 0..3 + ZONES {
        let zones: Vec<u64> = (0..ZONES).filter(|&z| round < 3 + z).collect();
        let mut inflight = submit_round(q, &mut sent, &zones, 1);
        let mut done = Vec::new();
        while !inflight.is_empty() {
            q.wait_completions(&mut done).expect("completions");
            for c in done.drain(..) {
                assert!(c.status.is_success(), "write failed: {:?}\n{}", c.status, server.log());
                inflight.remove(&c.cid);
            }
        }
    }
    assert_eq!(sent, (3..3 + ZONES).collect::<Vec<_>>());
    let acked = sent.clone();
    server.kill_hard();
    drop(d);
    // `vnvme inspect zones` reads what the killed server left: each zone open,
    // its pointer where its acknowledged writes end.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vnvme"))
        .args(["inspect", "zones", &format!("{img}.zones")])
        .output()
        .expect("vnvme inspect zones");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["zone_size"], 1 << 20);
    let zones = v["zones"].as_array().expect("zones");
    assert_eq!(zones.len() as u64, ZONES);
    for (z, got) in zones.iter().enumerate() {
        assert_eq!(got["written"], acked[z] * NLB * LBA, "zone {z}: {v}");
        assert_eq!(got["state"], 2, "zone {z}: implicitly opened by its writes: {v}");
    }

    let server = Server::start_in(&dir, "b", &["--ns", &format!("file:{img}:zoned=1M{engine}")]);
    let mut d = server.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Polling));
    let q = d.queue(1).expect("queue 1");
    for z in 0..ZONES {
        let wp = z * ZONE_BLOCKS + acked[z as usize] * NLB;
        assert_eq!(probe(q, wp - NLB), Status::ZONE_INVALID_WRITE, "zone {z}: a write below its pointer");
        assert_eq!(probe(q, wp + NLB), Status::ZONE_INVALID_WRITE, "zone {z}: a write past its pointer");
        assert_eq!(
            probe(q, wp),
            Status::SUCCESS,
            "zone {z}: a write at its pointer ({wp})\n{}",
            server.log()
        );
        let mut got = vec![0u8; (NLB * LBA) as usize];
        for k in 0..acked[z as usize] {
            q.read(1, z * ZONE_BLOCKS + k * NLB, &mut got).expect("read back");
            assert!(got == data(z, k), "zone {z}, write {k}: acknowledged before the kill, reads back wrong");
        }
    }
    drop(d);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn killed_with_writes_in_flight_each_pointer_is_past_what_was_acknowledged() {
    let dir = temp_dir("zoned-kill-inflight");
    let img = dir.join("zns.img").display().to_string();
    let spec = format!("file:{img}:{}M:zoned=1M", ZONES);
    let mut server = Server::start_in(&dir, "a", &["--ns", &spec]);
    let mut d = server.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Interrupts));
    let q = d.queue(1).expect("queue 1");
    let mut sent = vec![0u64; ZONES as usize];
    let mut acked = vec![0u64; ZONES as usize];
    for round in 0..6 {
        let all: Vec<u64> = (0..ZONES).collect();
        let mut inflight = submit_round(q, &mut sent, &all, 4);
        if round == 5 {
            server.kill_hard();
            break;
        }
        let mut done = Vec::new();
        while !inflight.is_empty() {
            q.wait_completions(&mut done).expect("completions");
            for c in done.drain(..) {
                assert!(c.status.is_success(), "write failed: {:?}", c.status);
                acked[inflight.remove(&c.cid).expect("ours") as usize] += 1;
            }
        }
    }
    drop(d);

    let server = Server::start_in(&dir, "b", &["--ns", &format!("file:{img}:zoned=1M")]);
    let mut d = server.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Polling));
    let q = d.queue(1).expect("queue 1");
    for z in 0..ZONES as usize {
        let start = z as u64 * ZONE_BLOCKS;
        assert_eq!(
            probe(q, start + (acked[z] - 1) * NLB),
            Status::ZONE_INVALID_WRITE,
            "zone {z}: the pointer is past the acknowledged writes"
        );
        let at = (acked[z]..=sent[z]).find(|&k| probe(q, start + k * NLB) == Status::SUCCESS);
        assert!(
            at.is_some(),
            "zone {z}: no write between {} and {} blocks taken\n{}",
            acked[z],
            sent[z],
            server.log()
        );
    }
    drop(d);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
