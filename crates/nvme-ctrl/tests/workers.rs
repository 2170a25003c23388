//! The data path on I/O worker threads: the host (this thread) submits and reaps while
//! workers own the queues, in every polling mode, with and without shadow doorbells.

use std::sync::Arc;
use std::time::{Duration, Instant};

use block_backend::RamBackend;
use nvme_ctrl::{ControllerConfig, NamespaceConfig, PollMode};
use nvme_spec::opcode::nvm as iop;
use test_kit::{InitOptions, MockHost};
use test_util::pattern;

/// Waits (bounded) until queue `qid` has returned `n` completions; returns them.
fn wait_for(h: &mut MockHost, qid: u16, n: usize) -> Vec<nvme_spec::Cqe> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = Vec::new();
    while got.len() < n {
        h.process();
        got.extend(h.reap_queue(qid));
        assert!(Instant::now() < deadline, "queue {qid}: {} of {n} completions after 30 s", got.len());
        std::thread::yield_now();
    }
    got
}

fn run(mode: PollMode, shadow: bool) {
    let ram = RamBackend::new(32 << 20);
    let cfg = ControllerConfig {
        namespaces: vec![NamespaceConfig::new(Arc::new(ram.clone()), 0)],
        ..Default::default()
    };
    let mut h = MockHost::new(cfg, 128 << 20);
    h.ctrl.spawn_workers(2, mode).unwrap();
    h.init(InitOptions { io_queues: 4, queue_size: 64, shadow_doorbells: shadow, ..Default::default() })
        .unwrap();
    for qid in 1..=4u16 {
        for qd in [1u32, 8, 63] {
            let mut expect = Vec::new();
            for j in 0..qd {
                let slba = qid as u64 * 10_000 + j as u64 * 16;
                let data = pattern(slba ^ qd as u64, 8 * 512);
                let buf = h.alloc.alloc(data.len() as u64, 4096);
                h.mem.write(buf, &data).unwrap();
                let s = h.rw_sqe(iop::WRITE, 1, slba, 8, (buf, data.len() as u64));
                h.submit(qid, s).unwrap();
                expect.push((slba, data));
            }
            for c in wait_for(&mut h, qid, qd as usize) {
                assert!(c.status().is_success(), "{mode:?} shadow={shadow} q{qid}: {:?}", c.status());
            }
            for (slba, data) in &expect {
                let mut back = vec![0u8; data.len()];
                ram.read_at(slba * 512, &mut back).unwrap();
                assert!(back == *data, "{mode:?} shadow={shadow}: data at {slba}");
            }
        }
    }
    // Reads through the workers return what was written.
    let buf = h.alloc.alloc_pages(1);
    let s = h.rw_sqe(iop::READ, 1, 10_000, 8, (buf, 4096));
    h.submit(1, s).unwrap();
    assert!(wait_for(&mut h, 1, 1)[0].status().is_success());
    let mut got = vec![0u8; 4096];
    h.mem.read(buf, &mut got).unwrap();
    assert!(got == pattern(10_000 ^ 63, 4096));
    // Reset with workers running, then bring up again.
    h.init(InitOptions { io_queues: 2, queue_size: 16, shadow_doorbells: shadow, ..Default::default() })
        .unwrap();
    let s = h.rw_sqe(iop::READ, 1, 0, 1, (buf, 512));
    h.submit(2, s).unwrap();
    assert!(wait_for(&mut h, 2, 1)[0].status().is_success());
}

#[test]
fn workers_poll_off_trapped() {
    run(PollMode::Off, false);
}

#[test]
fn workers_poll_off_shadow() {
    run(PollMode::Off, true);
}

#[test]
fn workers_adaptive_shadow() {
    run(PollMode::Adaptive, true);
}

#[test]
fn workers_always_shadow() {
    run(PollMode::Always, true);
}

#[test]
fn workers_adaptive_trapped() {
    run(PollMode::Adaptive, false);
}

/// A doorbell page mapped into the guest notifies nobody, so workers that may sleep
/// are refused; workers that poll always are accepted, and clearing the page is
/// always allowed.
#[test]
fn a_mapped_doorbell_page_needs_workers_that_poll_always() {
    for (mode, ok) in [(PollMode::Off, false), (PollMode::Adaptive, false), (PollMode::Always, true)] {
        let cfg = ControllerConfig {
            namespaces: vec![NamespaceConfig::new(Arc::new(RamBackend::new(1 << 20)), 0)],
            ..Default::default()
        };
        let mut h = MockHost::new(cfg, 16 << 20);
        h.ctrl.spawn_workers(1, mode).unwrap();
        let page = guest_mem::GuestMemory::anonymous(&[(0, 4096)]).unwrap();
        let r = h.ctrl.set_doorbell_page(Some(page));
        assert_eq!(r.is_ok(), ok, "{mode:?}: {r:?}");
        if let Err(e) = r {
            assert!(e.to_string().contains("poll always"), "{e}");
        }
        h.ctrl.set_doorbell_page(None).expect("clearing the page");
    }
}
