//! Doorbell Buffer Config (Base §5.2.5): validation, attaching to live queues, the
//! admin queue's shadow slot, and the Linux 6.1 reset race.

mod common;

use common::*;
use nvme_spec::opcode::nvm as iop;
use nvme_spec::regs::{doorbell_offset, DoorbellKind};
use nvme_spec::Status;
use test_kit::PAGE;

fn slot(qid: u16, kind: DoorbellKind) -> u64 {
    doorbell_offset(qid, kind, 0)
}

#[test]
fn spec_5_2_5_unaligned_buffers_are_invalid_field() {
    let (mut h, _) = ready(2, false);
    let p = h.alloc.alloc_pages(2);
    for (a, b) in [(p + 4, p + PAGE), (p, p + PAGE + 0x800), (p + 0x800, p + PAGE + 8)] {
        assert_status(h.dbbuf_raw(a, b), Status::INVALID_FIELD.with_dnr());
    }
    assert!(h.dbbuf.is_none());
    assert_alive(&mut h);
}

#[test]
fn spec_5_2_5_same_page_or_outside_memory_is_invalid_field() {
    let (mut h, _) = ready(2, false);
    let p = h.alloc.alloc_pages(2);
    assert_status(h.dbbuf_raw(p, p), Status::INVALID_FIELD.with_dnr());
    for (a, b) in [(MEM, p), (p, MEM), (p, MEM + 16 * PAGE), (!(PAGE - 1), p)] {
        assert_status(h.dbbuf_raw(a, b), Status::INVALID_FIELD.with_dnr());
    }
    // The last page of guest memory is fine.
    assert_status(h.dbbuf_raw(MEM - PAGE, p), Status::SUCCESS);
    assert_alive(&mut h);
}

#[test]
fn spec_5_2_5_config_on_live_queues_publishes_eventidx_and_stops_trapped_doorbells() {
    let (mut h, _) = ready(2, false);
    // Move the queues off zero with trapped doorbells first.
    for qid in [1, 2] {
        for i in 0..3 {
            assert_eq!(h.read_blocks(qid, 1, i, 1, 512).0, Status::SUCCESS);
        }
    }
    let shadow = h.alloc.alloc_pages(1);
    let eventidx = h.alloc.alloc_pages(1);
    h.mem.fill(eventidx, PAGE, 0xff).unwrap();
    assert_status(h.dbbuf_raw(shadow, eventidx), Status::SUCCESS);
    for qid in [1u16, 2] {
        let q = &h.io[qid as usize - 1];
        let ei_sq = h.mem.load_u32(eventidx + slot(qid, DoorbellKind::SqTail)).unwrap();
        assert_eq!(ei_sq, q.sq.tail, "queue {qid}: SQ EventIdx published at what was consumed");
        let sh_sq = h.mem.load_u32(shadow + slot(qid, DoorbellKind::SqTail)).unwrap();
        assert_eq!(sh_sq, q.sq.tail, "queue {qid}: shadow tail holds the controller's value");
        let ei_cq = h.mem.load_u32(eventidx + slot(qid, DoorbellKind::CqHead)).unwrap();
        assert!(ei_cq < q.size(), "queue {qid}: CQ EventIdx published ({ei_cq:#x})");
    }
    // 32 commands at once: almost no trapped doorbell writes.
    let before = h.ctrl.stats();
    let buf = h.alloc.alloc_pages(1);
    for i in 0..32 {
        let s = h.rw_sqe(iop::READ, 1, i, 1, (buf, 512));
        h.submit(1, s).unwrap();
    }
    let mut done = 0;
    for _ in 0..100 {
        h.process();
        let got = h.reap_queue(1);
        assert!(got.iter().all(|c| c.status() == Status::SUCCESS));
        done += got.len();
        if done == 32 {
            break;
        }
    }
    assert_eq!(done, 32);
    let d = h.ctrl.stats() - before;
    assert_eq!(d.io_commands, 32);
    assert!(
        d.io_doorbell_writes <= 2,
        "{} trapped I/O doorbell writes for 32 commands",
        d.io_doorbell_writes
    );
    assert_alive(&mut h);
}

#[test]
fn spec_5_2_5_config_before_queues_exist_attaches_them_at_creation() {
    let mut h = enabled();
    let shadow = h.alloc.alloc_pages(1);
    let eventidx = h.alloc.alloc_pages(1);
    h.mem.fill(shadow, PAGE, 0x77).unwrap();
    assert_status(h.dbbuf_raw(shadow, eventidx), Status::SUCCESS);
    h.create_queue_pair(1, 64, true).unwrap();
    assert_eq!(h.mem.load_u32(shadow + slot(1, DoorbellKind::SqTail)).unwrap(), 0, "new queue's slot reset");
    for i in 0..100 {
        assert_eq!(h.read_blocks(1, 1, i, 1, 512).0, Status::SUCCESS, "read {i}");
    }
    assert_alive(&mut h);
}

#[test]
fn spec_5_2_5_admin_doorbell_writes_are_copied_into_the_shadow_slot() {
    let (mut h, _) = ready(1, true);
    let b = h.dbbuf.unwrap();
    for _ in 0..5 {
        h.identify(0x01, 0).unwrap();
        let a = h.admin.as_ref().unwrap();
        assert_eq!(h.mem.load_u32(b.shadow + slot(0, DoorbellKind::SqTail)).unwrap(), a.sq.tail);
        assert_eq!(h.mem.load_u32(b.shadow + slot(0, DoorbellKind::CqHead)).unwrap(), a.cq.head);
    }
    assert_alive(&mut h);
}

#[test]
fn spec_5_2_5_linux_6_1_reset_race_adopts_the_newer_shadow_tail() {
    let (mut h, _) = ready(1, true);
    let b = h.dbbuf.unwrap();
    // Reset: the controller forgets the buffers; Linux 6.1 keeps them, zeroes them and
    // recreates its queues with shadow-doorbell rules before it re-sends the command.
    h.enable(32).unwrap();
    h.set_feature(0x07, 0).unwrap();
    h.create_queue_pair(1, 64, true).unwrap();
    h.mem.fill(b.shadow, PAGE, 0).unwrap();
    h.mem.fill(b.eventidx, PAGE, 0).unwrap();
    h.dbbuf = Some(b);

    let before = h.ctrl.stats();
    let buf = h.alloc.alloc_pages(1);
    let mut cids = Vec::new();
    for i in 0..5 {
        let s = h.rw_sqe(iop::READ, 1, i, 1, (buf, 512));
        cids.push(h.submit(1, s).unwrap());
    }
    let d = h.ctrl.stats() - before;
    assert_eq!(d.io_doorbell_writes, 1, "EventIdx reads 0: only the first submission rang");
    assert_eq!(h.mem.load_u32(b.shadow + slot(1, DoorbellKind::SqTail)).unwrap(), 5);
    // The controller runs meanwhile and sees only the rung tail.
    h.process();
    let mut got: Vec<u16> = h.reap_queue(1).iter().map(|c| c.cid.get()).collect();
    assert_eq!(got, vec![cids[0]]);

    // Now the host sends Doorbell Buffer Config with the same buffers.
    assert_status(h.dbbuf_raw(b.shadow, b.eventidx), Status::SUCCESS);
    for _ in 0..100 {
        h.process();
        got.extend(h.reap_queue(1).iter().map(|c| c.cid.get()));
        if got.len() == 5 {
            break;
        }
    }
    got.sort();
    let mut want = cids.clone();
    want.sort();
    assert_eq!(got, want, "every submitted command completed");
    for i in 0..100 {
        assert_eq!(h.read_blocks(1, 1, i, 1, 512).0, Status::SUCCESS);
    }
    assert_alive(&mut h);
}

#[test]
fn spec_5_2_5_admin_eventidx_is_armed_when_polling_and_an_idle_admin_queue_is_not_read() {
    let mut h = enabled();
    h.doorbell_buffer_config().unwrap();
    let b = h.dbbuf.unwrap();
    // A poller leaves I/O queues unarmed; the admin queue is armed whenever it empties.
    h.ctrl.set_arm_eventidx(false);
    for _ in 0..3 {
        h.identify(0x01, 0).unwrap();
        let tail = h.admin.as_ref().unwrap().sq.tail;
        let ei = h.mem.load_u32(b.eventidx + slot(0, DoorbellKind::SqTail)).unwrap();
        assert_eq!(ei, tail, "admin SQ EventIdx at what was consumed");
        // So a host that used the admin shadow slot would ring for its next command.
        let next = (tail + 1) % 32;
        assert!(nvme_spec::regs::need_event(ei as u16, next as u16, tail as u16));
    }
    // Idle runs: nothing rang, the armed empty admin SQ is not read again.
    let before = h.ctrl.stats();
    for _ in 0..50 {
        h.process();
    }
    let d = h.ctrl.stats() - before;
    assert_eq!(d.shadow_reads, 0, "idle runs read the admin shadow slot");
    // And the next trapped admin command still runs.
    h.identify(0x01, 0).unwrap();
    assert_alive(&mut h);
}
