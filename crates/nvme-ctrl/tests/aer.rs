//! Asynchronous Event Request (Base §5.1.2): the request limit, Error events for
//! invalid doorbell writes, Notice events for namespace changes, and masking until
//! the associated log page is read with RAE cleared.

mod common;

use common::*;
use nvme_spec::features::fid;
use nvme_spec::log::lid;
use nvme_spec::opcode::admin as aop;
use nvme_spec::regs::{offset, DoorbellKind};
use nvme_spec::{Cqe, Status};
use test_kit::MockHost;
use zerocopy::little_endian::U32;

/// Completion dword 0 of an Error status event with `info`, log page 01h.
fn error_event(info: u32) -> u32 {
    (info << 8) | ((lid::ERROR_INFORMATION as u32) << 16)
}
const INVALID_DOORBELL_REGISTER: u32 = 0x00;
const INVALID_DOORBELL_WRITE_VALUE: u32 = 0x01;
const NS_ATTRIBUTE_CHANGED: u32 = 2 | ((lid::CHANGED_NAMESPACE_LIST as u32) << 16);

#[track_caller]
fn one_event(got: &[Cqe], cid: u16, dw0: u32) {
    assert_eq!(got.len(), 1, "one AER completion: {got:?}");
    assert_cqe(&got[0], Status::SUCCESS);
    assert_eq!(got[0].cid.get(), cid, "the outstanding AER completed");
    assert_eq!(got[0].dw0.get(), dw0, "event dword 0 {:#x}", got[0].dw0.get());
}

/// Reads the Error Information log (one entry's worth), returning other completions.
fn read_error_log(h: &mut MockHost, rae: bool) -> Vec<Cqe> {
    let (st, _, others) = h.get_log_exec(lid::ERROR_INFORMATION, 0xffff_ffff, 15, 0, rae);
    assert_eq!(st, Status::SUCCESS);
    others
}

#[test]
fn spec_5_1_2_aerl_plus_one_outstanding_then_limit_exceeded() {
    let mut h = enabled();
    let aerl_z = h.identify(0x01, 0).unwrap()[259];
    assert_eq!(aerl_z, 3);
    let cids: Vec<u16> = (0..=aerl_z).map(|_| h.submit_aer()).collect();
    assert!(h.reap_admin().is_empty(), "AERL + 1 requests stay outstanding");
    let (c, others) = h.admin_exec(MockHost::admin_sqe(aop::ASYNC_EVENT_REQUEST));
    assert!(others.is_empty());
    assert_cqe(&c.expect("the extra AER completes at once"), Status::AER_LIMIT_EXCEEDED.with_dnr());
    assert_alive(&mut h);
    // The outstanding requests still work: an event completes the oldest.
    h.ring(9, DoorbellKind::SqTail, 1);
    one_event(&h.reap_admin(), cids[0], error_event(INVALID_DOORBELL_REGISTER));
    // ... and one slot is free again.
    let again = h.submit_aer();
    assert!(h.reap_admin().is_empty());
    assert_ne!(again, cids[0]);
}

#[test]
fn spec_5_1_2_invalid_doorbell_register_posts_error_event() {
    for shadow in [false, true] {
        let (mut h, _) = ready(2, shadow);
        let aer = h.submit_aer();
        // SQ 5 tail doorbell: queue 5 was never created.
        h.ring(5, DoorbellKind::SqTail, 1);
        one_event(&h.reap_admin(), aer, error_event(INVALID_DOORBELL_REGISTER));
        assert_alive(&mut h);

        // The Error type is now masked: another bad write is not reported ...
        let aer2 = h.submit_aer();
        h.ring(6, DoorbellKind::CqHead, 1);
        // A doorbell past every queue the controller can have, too.
        h.write32(offset::DOORBELL_BASE + 8 * 100, 1);
        assert!(h.reap_admin().is_empty(), "masked until the error log is read");
        // ... reading the log with RAE = 1 keeps it masked ...
        assert!(read_error_log(&mut h, true).is_empty(), "RAE = 1 retains the mask");
        // ... and reading it with RAE = 0 clears the mask; the retained event follows.
        let got = read_error_log(&mut h, false);
        one_event(&got, aer2, error_event(INVALID_DOORBELL_REGISTER));
        assert_alive(&mut h);
    }
}

#[test]
fn spec_5_1_2_invalid_doorbell_write_value_posts_error_event_and_is_ignored() {
    for shadow in [false, true] {
        let (mut h, _) = ready(2, shadow);
        // Tail equal to the queue size (64 entries: valid tails are 0..=63).
        let aer = h.submit_aer();
        h.ring(1, DoorbellKind::SqTail, 64);
        one_event(&h.reap_admin(), aer, error_event(INVALID_DOORBELL_WRITE_VALUE));
        assert!(read_error_log(&mut h, false).is_empty());
        assert_alive(&mut h);

        // CQ head beyond the tail: consuming entries that were never posted. With
        // shadow doorbells a register value is only a wake-up (a late write may be
        // older than the shadow value), so only the ring bound applies to it there.
        if !shadow {
            let aer = h.submit_aer();
            let q = &h.io[1];
            let bad_head = (q.cq.head + 5) % q.size();
            h.ring(2, DoorbellKind::CqHead, bad_head);
            one_event(&h.reap_admin(), aer, error_event(INVALID_DOORBELL_WRITE_VALUE));
            assert!(read_error_log(&mut h, false).is_empty());
        }
        let aer = h.submit_aer();
        h.ring(2, DoorbellKind::CqHead, 0xffff);
        one_event(&h.reap_admin(), aer, error_event(INVALID_DOORBELL_WRITE_VALUE));
        assert!(read_error_log(&mut h, false).is_empty());

        // Both queues were left as they were: I/O on them still works.
        for qid in [1, 2] {
            for i in 0..70 {
                let (st, _) = h.read_blocks(qid, 1, i, 1, 512);
                assert_eq!(st, Status::SUCCESS, "shadow {shadow} queue {qid} read {i}");
            }
        }
        assert_alive(&mut h);
    }
}

#[test]
fn spec_5_1_2_event_raised_before_any_request_is_reported_later() {
    let (mut h, _) = ready(1, false);
    h.ring(7, DoorbellKind::SqTail, 3);
    assert!(h.reap_admin().is_empty());
    let aer = h.submit_aer();
    one_event(&h.reap_admin(), aer, error_event(INVALID_DOORBELL_REGISTER));
    assert_alive(&mut h);
}

fn format_exec(h: &mut MockHost, nsid: u32) -> Vec<Cqe> {
    let mut c = MockHost::admin_sqe(aop::FORMAT_NVM);
    c.nsid = U32::new(nsid);
    let (mine, others) = h.admin_exec(c);
    assert_cqe(&mine.expect("format completed"), Status::SUCCESS);
    others
}

fn changed_list(h: &mut MockHost, rae: bool) -> (Vec<u32>, Vec<Cqe>) {
    let (st, data, others) = h.get_log_exec(lid::CHANGED_NAMESPACE_LIST, 0xffff_ffff, 1023, 0, rae);
    assert_eq!(st, Status::SUCCESS);
    let ids = data
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .take_while(|&n| n != 0)
        .collect();
    (ids, others)
}

#[test]
fn spec_5_1_2_format_posts_namespace_attribute_changed_notice() {
    let (cfg, _) = ram_cfg(3);
    let mut h = MockHost::new(cfg, MEM);
    h.init(test_kit::InitOptions { io_queues: 1, queue_size: 64, ..Default::default() }).unwrap();
    let oaes = le32(&h.identify(0x01, 0).unwrap(), 92);
    assert_ne!(oaes & (1 << 8), 0, "OAES advertises Namespace Attribute Notices");
    assert_cqe(&h.set_features_raw(fid::ASYNC_EVENT_CONFIG, 1 << 8, false), Status::SUCCESS);
    let aer = h.submit_aer();
    one_event(&format_exec(&mut h, 2), aer, NS_ATTRIBUTE_CHANGED);
    let (ids, others) = changed_list(&mut h, true);
    assert_eq!(ids, vec![2]);
    assert!(others.is_empty());

    // More changes while the Notice type is masked: listed in increasing order.
    let aer2 = h.submit_aer();
    assert!(format_exec(&mut h, 3).is_empty());
    assert!(format_exec(&mut h, 1).is_empty());
    let (ids, others) = changed_list(&mut h, true);
    assert_eq!(ids, vec![1, 2, 3]);
    assert!(others.is_empty(), "RAE = 1 keeps the Notice type masked");
    let (ids, others) = changed_list(&mut h, false);
    assert_eq!(ids, vec![1, 2, 3]);
    one_event(&others, aer2, NS_ATTRIBUTE_CHANGED);
    let (ids, _) = changed_list(&mut h, false);
    assert!(ids.is_empty(), "reading with RAE = 0 cleared the list");
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_2_format_without_notice_enabled_posts_no_event() {
    let (cfg, _) = ram_cfg(2);
    let mut h = MockHost::new(cfg, MEM);
    h.enable(32).unwrap();
    let _aer = h.submit_aer();
    assert!(format_exec(&mut h, 0xffff_ffff).is_empty(), "AEC bit 8 clear: no notice");
    let (ids, others) = changed_list(&mut h, false);
    assert_eq!(ids, vec![1, 2], "the list still names both namespaces");
    assert!(others.is_empty());
    assert_alive(&mut h);
}

#[test]
fn spec_3_7_reset_drops_outstanding_requests_and_masks() {
    let (mut h, _) = ready(1, false);
    for _ in 0..4 {
        h.submit_aer();
    }
    h.ring(9, DoorbellKind::SqTail, 1);
    assert_eq!(h.reap_admin().len(), 1, "one event reported, Error type now masked");
    h.init(test_kit::InitOptions {
        io_queues: 1,
        queue_size: 64,
        shadow_doorbells: false,
        ..Default::default()
    })
    .unwrap();
    // After the reset the limit counts from zero and the mask is gone.
    let cids: Vec<u16> = (0..4).map(|_| h.submit_aer()).collect();
    assert!(h.reap_admin().is_empty());
    h.ring(9, DoorbellKind::SqTail, 1);
    one_event(&h.reap_admin(), cids[0], error_event(INVALID_DOORBELL_REGISTER));
    assert_alive(&mut h);
}
