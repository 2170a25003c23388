//! QoS limits on namespaces (Controller::set_qos with a qos::QosGroup): commands over
//! the limit are held back in order and start when the limit allows, on the
//! controller's clock; limits change live; a group is shared; held commands of a
//! deleted queue or a removed namespace complete with the status the spec names.

mod common;

use std::sync::Arc;

use common::*;
use nvme_ctrl::qos::{Limit, QosGroup, QosLimits};
use nvme_spec::opcode::nvm as iop;
use nvme_spec::{Cqe, Status};
use test_kit::{InitOptions, ManualClock, MockHost};

fn host(namespaces: usize, workers: usize) -> (MockHost, Arc<ManualClock>) {
    let (cfg, _) = ram_cfg(namespaces);
    let clock = Arc::new(ManualClock::default());
    let mut h = MockHost::with_clock(cfg, MEM, clock.clone());
    h.ctrl.spawn_workers(workers, nvme_ctrl::PollMode::Off).unwrap();
    h.init(InitOptions { io_queues: 2, queue_size: 64, ..Default::default() }).unwrap();
    (h, clock)
}

fn iops(rate: u64, burst: u64) -> Arc<QosGroup> {
    Arc::new(
        QosGroup::new("test", QosLimits { iops: Some(Limit { rate, burst }), ..Default::default() }).unwrap(),
    )
}

/// Submits `n` one-block reads of `nsid` on queue `qid` without waiting.
fn reads(h: &mut MockHost, qid: u16, nsid: u32, n: usize) -> Vec<u16> {
    (0..n)
        .map(|i| {
            let buf = h.alloc.alloc_pages(1);
            let s = h.rw_sqe(iop::READ, nsid, i as u64, 1, (buf, 512));
            h.submit(qid, s).expect("room")
        })
        .collect()
}

/// Runs the device a few times and returns what completed on `qid`.
fn settle(h: &mut MockHost, qid: u16) -> Vec<Cqe> {
    let mut out = Vec::new();
    for _ in 0..20 {
        h.process();
        out.extend(h.reap_queue(qid));
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    out
}

#[test]
fn commands_over_an_iops_limit_wait_their_turn_in_order() {
    let (mut h, clock) = host(2, 0);
    h.ctrl.set_qos(1, Some(iops(100, 2))).unwrap();
    let cids = reads(&mut h, 1, 1, 6);
    let first = settle(&mut h, 1);
    assert_eq!(first.len(), 2, "the burst: {first:?}");
    // Namespace 2 has no limit: not held behind namespace 1.
    assert_eq!(reads(&mut h, 2, 2, 3).len(), 3);
    assert_eq!(settle(&mut h, 2).len(), 3);
    let mut done: Vec<u16> = first.iter().map(|c| c.cid.get()).collect();
    for _ in 0..4 {
        clock.advance_us(10_000); // 1 / 100 s
        let got = settle(&mut h, 1);
        assert_eq!(got.len(), 1, "one per 10 ms");
        done.extend(got.iter().map(|c| c.cid.get()));
    }
    assert_eq!(done, cids, "in order");
    let s = h.ctrl.namespace(1).unwrap().stats.snapshot();
    assert_eq!(s.throttled_commands, 4);
    assert!(s.throttled_ns >= 10_000_000 * 4, "{}", s.throttled_ns);
    assert_eq!(h.ctrl.namespace(2).unwrap().stats.snapshot().throttled_commands, 0);
}

#[test]
fn limits_change_live_and_clearing_them_releases_what_waits() {
    let (mut h, clock) = host(1, 2);
    let g = iops(10, 1);
    h.ctrl.set_qos(1, Some(g.clone())).unwrap();
    reads(&mut h, 1, 1, 5);
    assert_eq!(settle(&mut h, 1).len(), 1);
    // A higher rate takes effect for what is held: at 1,000/s, 1 ms each.
    g.set_limits(QosLimits { iops: Some(Limit { rate: 1000, burst: 1 }), ..Default::default() }).unwrap();
    clock.advance_us(100_000); // the old 10/s slot has passed too
    assert_eq!(settle(&mut h, 1).len(), 1);
    clock.advance_us(1_000);
    assert_eq!(settle(&mut h, 1).len(), 1);
    h.ctrl.set_qos(1, None).unwrap();
    assert_eq!(settle(&mut h, 1).len(), 2, "no limit: the rest go at once");
    assert_eq!(h.ctrl.qos(1).map(|g| g.name.clone()), None);
}

#[test]
fn a_group_is_shared_by_its_namespaces() {
    let (mut h, clock) = host(2, 0);
    let g = iops(100, 1);
    h.ctrl.set_qos(1, Some(g.clone())).unwrap();
    h.ctrl.set_qos(2, Some(g)).unwrap();
    reads(&mut h, 1, 1, 2);
    reads(&mut h, 2, 2, 2);
    let n = settle(&mut h, 1).len() + settle(&mut h, 2).len();
    assert_eq!(n, 1, "one command between the two namespaces");
    clock.advance_us(10_000);
    let n = settle(&mut h, 1).len() + settle(&mut h, 2).len();
    assert_eq!(n, 1);
}

#[test]
fn held_commands_of_a_deleted_queue_or_removed_namespace_complete_with_the_spec_status() {
    let (mut cfg, _) = ram_cfg(2);
    cfg.max_namespaces = 4;
    let clock = Arc::new(ManualClock::default());
    let mut h = MockHost::with_clock(cfg, MEM, clock);
    h.init(InitOptions { io_queues: 2, queue_size: 64, ..Default::default() }).unwrap();
    h.ctrl.set_qos(1, Some(iops(1, 1))).unwrap();
    h.ctrl.set_qos(2, Some(iops(1, 1))).unwrap();
    reads(&mut h, 1, 1, 3);
    assert_eq!(settle(&mut h, 1).len(), 1);
    reads(&mut h, 2, 2, 3);
    assert_eq!(settle(&mut h, 2).len(), 1);
    h.ctrl.remove_namespace(2).unwrap();
    let gone = h.reap_queue(2);
    assert_eq!(gone.len(), 2);
    assert!(gone.iter().all(|c| c.status() == Status::INVALID_NAMESPACE.with_dnr()), "{gone:?}");
    let c = h.remove_io_sq(1).unwrap();
    assert_eq!(c.status(), Status::SUCCESS);
    let aborted = h.reap_queue(1);
    assert_eq!(aborted.len(), 2);
    assert!(aborted.iter().all(|c| c.status() == Status::ABORT_SQ_DELETION), "{aborted:?}");
    assert!(matches!(h.ctrl.set_qos(9, None), Err(nvme_ctrl::NamespaceError::NotFound(9))));
}
