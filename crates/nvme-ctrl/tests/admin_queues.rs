//! Create and Delete I/O Completion / Submission Queue (Base §5.2.1 - §5.2.4) and
//! Set Features Number of Queues (Base §5.1.25.1.7): every status the spec names for
//! them, and 64 queue pairs on 65 interrupt vectors.

mod common;

use common::*;
use nvme_spec::admin::CreateIoCqCmd;
use nvme_spec::features::fid;
use nvme_spec::opcode::nvm as iop;
use nvme_spec::Status;
use test_kit::{MockHost, PAGE};
use test_util::pattern;

/// A page-aligned queue ring of `pages` pages.
fn ring(h: &mut MockHost, pages: u64) -> u64 {
    h.alloc.alloc_pages(pages)
}

// ---- Create I/O Completion Queue (Base §5.2.1)

#[test]
fn spec_5_2_1_create_cq_qid_0_is_invalid_queue_identifier() {
    let mut h = enabled();
    let b = ring(&mut h, 1);
    assert_status(
        h.create_cq_raw(CreateIoCqCmd { qid: 0, qsize_z: 15, base: b, pc: true, ien: true, iv: 0 }),
        Status::INVALID_QUEUE_IDENTIFIER.with_dnr(),
    );
    assert_alive(&mut h);
}

#[test]
fn spec_5_2_1_create_cq_qid_above_maximum_is_invalid_queue_identifier() {
    let mut h = enabled();
    let b = ring(&mut h, 1);
    for qid in [65, 0x1000, 0xffff] {
        assert_status(
            h.create_cq_raw(CreateIoCqCmd { qid, qsize_z: 15, base: b, pc: true, ien: true, iv: 1 }),
            Status::INVALID_QUEUE_IDENTIFIER.with_dnr(),
        );
    }
    assert_status(
        h.create_cq_raw(CreateIoCqCmd { qid: 64, qsize_z: 15, base: b, pc: true, ien: true, iv: 1 }),
        Status::SUCCESS,
    );
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_25_1_7_create_cq_qid_beyond_allocated_queues_is_invalid_queue_identifier() {
    // A controller with 8 queue pairs allocates 8 even when the host asks for 64, and
    // an identifier past the allocation is refused.
    let (mut cfg, _) = ram_cfg(1);
    cfg.max_io_queues = 8;
    let mut h = MockHost::new(cfg, MEM);
    h.enable(32).unwrap();
    let c = h.set_features_raw(fid::NUMBER_OF_QUEUES, 63 | (63 << 16), false);
    assert_cqe(&c, Status::SUCCESS);
    assert_eq!(c.dw0.get(), 7 | (7 << 16), "NSQA/NCQA: 8 of each allocated (0's based)");
    let b = ring(&mut h, 1);
    assert_status(
        h.create_cq_raw(CreateIoCqCmd { qid: 9, qsize_z: 15, base: b, pc: true, ien: true, iv: 1 }),
        Status::INVALID_QUEUE_IDENTIFIER.with_dnr(),
    );
    assert_status(
        h.create_cq_raw(CreateIoCqCmd { qid: 8, qsize_z: 15, base: b, pc: true, ien: true, iv: 1 }),
        Status::SUCCESS,
    );
    let s = ring(&mut h, 1);
    assert_status(h.create_sq_raw(9, 15, s, true, 8), Status::INVALID_QUEUE_IDENTIFIER.with_dnr());
    assert_status(h.create_sq_raw(8, 15, s, true, 8), Status::SUCCESS);
    assert_alive(&mut h);
}

#[test]
fn spec_5_2_1_create_cq_qid_already_in_use_is_invalid_queue_identifier() {
    let (mut h, _) = ready(2, true);
    let b = ring(&mut h, 1);
    assert_status(
        h.create_cq_raw(CreateIoCqCmd { qid: 1, qsize_z: 15, base: b, pc: true, ien: true, iv: 1 }),
        Status::INVALID_QUEUE_IDENTIFIER.with_dnr(),
    );
    assert_alive(&mut h);
}

#[test]
fn spec_5_2_1_create_cq_qsize_0_or_above_mqes_is_invalid_queue_size() {
    let mut h = enabled();
    let mqes_z = h.cap().mqes_z();
    assert_eq!(mqes_z, 1023);
    let b = ring(&mut h, 5);
    // QSIZE is 0's based: 0 means a one-entry queue, which cannot work.
    assert_status(
        h.create_cq_raw(CreateIoCqCmd { qid: 1, qsize_z: 0, base: b, pc: true, ien: true, iv: 1 }),
        Status::INVALID_QUEUE_SIZE.with_dnr(),
    );
    assert_status(
        h.create_cq_raw(CreateIoCqCmd { qid: 1, qsize_z: mqes_z + 1, base: b, pc: true, ien: true, iv: 1 }),
        Status::INVALID_QUEUE_SIZE.with_dnr(),
    );
    assert_status(
        h.create_cq_raw(CreateIoCqCmd { qid: 1, qsize_z: 0xffff, base: b, pc: true, ien: true, iv: 1 }),
        Status::INVALID_QUEUE_SIZE.with_dnr(),
    );
    // The limits themselves are fine.
    assert_status(
        h.create_cq_raw(CreateIoCqCmd { qid: 1, qsize_z: 1, base: b, pc: true, ien: true, iv: 1 }),
        Status::SUCCESS,
    );
    assert_status(
        h.create_cq_raw(CreateIoCqCmd { qid: 2, qsize_z: mqes_z, base: b, pc: true, ien: true, iv: 1 }),
        Status::SUCCESS,
    );
    assert_alive(&mut h);
}

#[test]
fn spec_5_2_1_create_cq_pc_0_is_invalid_field_when_cap_cqr() {
    let mut h = enabled();
    assert!(h.cap().cqr());
    let b = ring(&mut h, 1);
    assert_status(
        h.create_cq_raw(CreateIoCqCmd { qid: 1, qsize_z: 15, base: b, pc: false, ien: true, iv: 1 }),
        Status::INVALID_FIELD.with_dnr(),
    );
    assert_alive(&mut h);
}

#[test]
fn spec_5_2_1_create_cq_base_not_page_aligned_is_prp_offset_invalid() {
    let mut h = enabled();
    let b = ring(&mut h, 2);
    for off in [4, 16, 0x800] {
        assert_status(
            h.create_cq_raw(CreateIoCqCmd { qid: 1, qsize_z: 15, base: b + off, pc: true, ien: true, iv: 1 }),
            Status::PRP_OFFSET_INVALID.with_dnr(),
        );
    }
    assert_alive(&mut h);
}

#[test]
fn spec_5_2_1_create_cq_base_outside_guest_memory_is_refused() {
    let mut h = enabled();
    // Wholly outside, and starting inside but running off the end.
    assert_status(
        h.create_cq_raw(CreateIoCqCmd { qid: 1, qsize_z: 15, base: MEM + PAGE, pc: true, ien: true, iv: 1 }),
        Status::INVALID_FIELD.with_dnr(),
    );
    assert_status(
        h.create_cq_raw(CreateIoCqCmd {
            qid: 1,
            qsize_z: 1023,
            base: MEM - PAGE,
            pc: true,
            ien: true,
            iv: 1,
        }),
        Status::INVALID_FIELD.with_dnr(),
    );
    assert_status(
        h.create_cq_raw(CreateIoCqCmd { qid: 1, qsize_z: 15, base: !(PAGE - 1), pc: true, ien: true, iv: 1 }),
        Status::INVALID_FIELD.with_dnr(),
    );
    assert_alive(&mut h);
}

#[test]
fn spec_5_2_1_create_cq_vector_beyond_msix_is_invalid_interrupt_vector() {
    let mut h = enabled();
    let b = ring(&mut h, 1);
    for iv in [65, 66, 0xffff] {
        assert_status(
            h.create_cq_raw(CreateIoCqCmd { qid: 1, qsize_z: 15, base: b, pc: true, ien: true, iv }),
            Status::INVALID_INTERRUPT_VECTOR.with_dnr(),
        );
    }
    // With interrupts disabled the vector is not used, so it is not checked.
    assert_status(
        h.create_cq_raw(CreateIoCqCmd { qid: 1, qsize_z: 15, base: b, pc: true, ien: false, iv: 65 }),
        Status::SUCCESS,
    );
    let b2 = ring(&mut h, 1);
    assert_status(
        h.create_cq_raw(CreateIoCqCmd { qid: 2, qsize_z: 15, base: b2, pc: true, ien: true, iv: 64 }),
        Status::SUCCESS,
    );
    assert_alive(&mut h);
}

// ---- Create I/O Submission Queue (Base §5.2.2)

/// The CQID field: 0h (the admin CQ) or outside the CQs granted is Invalid Queue
/// Identifier; in range but not created, Completion Queue Invalid (as SPDK's
/// compliance test, and its target, read the field).
#[test]
fn spec_5_2_2_create_sq_cqid_0_or_out_of_range_is_invalid_qid_and_missing_is_cq_invalid() {
    let mut h = enabled();
    let s = ring(&mut h, 1);
    assert_status(h.create_sq_raw(1, 15, s, true, 0), Status::INVALID_QUEUE_IDENTIFIER.with_dnr());
    assert_status(h.create_sq_raw(1, 15, s, true, 1), Status::COMPLETION_QUEUE_INVALID.with_dnr());
    assert_status(h.create_sq_raw(1, 15, s, true, 200), Status::INVALID_QUEUE_IDENTIFIER.with_dnr());
    let c = ring(&mut h, 1);
    assert_status(
        h.create_cq_raw(CreateIoCqCmd { qid: 1, qsize_z: 15, base: c, pc: true, ien: true, iv: 1 }),
        Status::SUCCESS,
    );
    assert_status(h.create_sq_raw(1, 15, s, true, 1), Status::SUCCESS);
    assert_alive(&mut h);
}

#[test]
fn spec_5_2_2_create_sq_bad_qid_size_pc_and_base() {
    let mut h = enabled();
    let c = ring(&mut h, 1);
    assert_status(
        h.create_cq_raw(CreateIoCqCmd { qid: 1, qsize_z: 15, base: c, pc: true, ien: true, iv: 1 }),
        Status::SUCCESS,
    );
    let s = ring(&mut h, 16);
    assert_status(h.create_sq_raw(0, 15, s, true, 1), Status::INVALID_QUEUE_IDENTIFIER.with_dnr());
    assert_status(h.create_sq_raw(65, 15, s, true, 1), Status::INVALID_QUEUE_IDENTIFIER.with_dnr());
    assert_status(h.create_sq_raw(1, 0, s, true, 1), Status::INVALID_QUEUE_SIZE.with_dnr());
    assert_status(h.create_sq_raw(1, 1024, s, true, 1), Status::INVALID_QUEUE_SIZE.with_dnr());
    assert_status(h.create_sq_raw(1, 15, s, false, 1), Status::INVALID_FIELD.with_dnr());
    assert_status(h.create_sq_raw(1, 15, s + 64, true, 1), Status::PRP_OFFSET_INVALID.with_dnr());
    assert_status(h.create_sq_raw(1, 15, MEM, true, 1), Status::INVALID_FIELD.with_dnr());
    assert_status(h.create_sq_raw(1, 15, s, true, 1), Status::SUCCESS);
    assert_status(h.create_sq_raw(1, 15, s, true, 1), Status::INVALID_QUEUE_IDENTIFIER.with_dnr());
    // A second SQ may share the CQ.
    assert_status(h.create_sq_raw(2, 15, s + 8 * PAGE, true, 1), Status::SUCCESS);
    assert_alive(&mut h);
}

// ---- 64 queue pairs, 65 vectors

#[test]
fn spec_5_2_1_all_64_queue_pairs_run_io_and_interrupt_on_their_own_vector() {
    let (cfg, _) = ram_cfg(1);
    assert_eq!((cfg.max_io_queues, cfg.msix_vectors), (64, 65));
    let mut h = MockHost::new(cfg, MEM);
    h.init(test_kit::InitOptions { io_queues: 64, queue_size: 16, ..Default::default() }).unwrap();
    assert!(h.dbbuf.is_some());
    let buf = h.alloc.alloc_pages(1);
    for qid in 1..=64u16 {
        let data = pattern(qid as u64, 512);
        h.mem.write(buf, &data).unwrap();
        let w = h.rw_sqe(iop::WRITE, 1, qid as u64, 1, (buf, 512));
        assert_cqe(&h.io_cmd(qid, w), Status::SUCCESS);
    }
    for qid in 1..=64u16 {
        let before: Vec<u64> = (0..65).map(|v| h.irq.count(v)).collect();
        let (st, back) = h.read_blocks(qid, 1, qid as u64, 1, 512);
        assert_eq!(st, Status::SUCCESS);
        assert_eq!(back, pattern(qid as u64, 512), "queue {qid} read back");
        for v in 0..65u16 {
            let d = h.irq.count(v) - before[v as usize];
            if v == qid {
                assert!(d >= 1, "queue {qid}: no interrupt on its vector");
            } else {
                assert_eq!(d, 0, "queue {qid}: stray interrupt on vector {v}");
            }
        }
    }
    assert!(h.irq.count(0) > 0, "admin completions interrupt on vector 0");
    assert_alive(&mut h);
}

// ---- Delete I/O Completion Queue (Base §5.2.3) / Delete I/O Submission Queue (Base §5.2.4)

#[test]
fn spec_5_2_3_and_5_2_4_delete_qid_0_or_nonexistent_is_invalid_queue_identifier() {
    let (mut h, _) = ready(2, true);
    assert_status(h.delete_sq(0), Status::INVALID_QUEUE_IDENTIFIER.with_dnr());
    assert_status(h.delete_cq(0), Status::INVALID_QUEUE_IDENTIFIER.with_dnr());
    for qid in [3, 64, 65, 0xffff] {
        assert_status(h.delete_sq(qid), Status::INVALID_QUEUE_IDENTIFIER.with_dnr());
        assert_status(h.delete_cq(qid), Status::INVALID_QUEUE_IDENTIFIER.with_dnr());
    }
    assert_alive(&mut h);
}

#[test]
fn spec_5_2_3_delete_cq_with_sqs_attached_is_invalid_queue_deletion() {
    let (mut h, _) = ready(2, true);
    assert_status(h.delete_cq(2), Status::INVALID_QUEUE_DELETION.with_dnr());
    assert_status(h.delete_sq(2), Status::SUCCESS);
    // The deleted SQ is gone; a second delete fails.
    assert_status(h.delete_sq(2), Status::INVALID_QUEUE_IDENTIFIER.with_dnr());
    assert_status(h.delete_cq(2), Status::SUCCESS);
    assert_status(h.delete_cq(2), Status::INVALID_QUEUE_IDENTIFIER.with_dnr());
    assert_alive(&mut h);
}

#[test]
fn spec_5_2_3_and_5_2_4_delete_then_recreate_works_with_and_without_shadow_doorbells() {
    for shadow in [false, true] {
        let (mut h, _) = ready(2, shadow);
        // Move queue 1's pointers off zero first, so the new queue must start fresh.
        for i in 0..5 {
            let (st, _) = h.read_blocks(1, 1, i, 1, 512);
            assert_eq!(st, Status::SUCCESS);
        }
        assert_status(h.delete_sq(1), Status::SUCCESS);
        assert_status(h.delete_cq(1), Status::SUCCESS);
        h.create_queue_pair(1, 32, true).expect("re-create queue pair 1");
        let data = pattern(9, 512);
        assert_eq!(h.write_blocks(1, 1, 3, 512, &data), Status::SUCCESS);
        for _ in 0..40 {
            // Wrap the new 32-entry queue at least once.
            let (st, back) = h.read_blocks(1, 1, 3, 1, 512);
            assert_eq!(st, Status::SUCCESS, "shadow {shadow}");
            assert_eq!(back, data);
        }
        assert_alive(&mut h);
    }
}

#[test]
fn spec_5_2_4_delete_sq_with_commands_submitted_still_completes_them() {
    // Commands the controller fetched before the delete complete before the Delete
    // does; the host then reaps them from the CQ.
    let (mut h, _) = ready(1, false);
    let buf = h.alloc.alloc_pages(1);
    let mut cids = Vec::new();
    for i in 0..4 {
        let s = h.rw_sqe(iop::READ, 1, i, 1, (buf, 512));
        cids.push(h.submit(1, s).unwrap());
    }
    h.process();
    assert_status(h.delete_sq(1), Status::SUCCESS);
    let got: Vec<u16> = h.reap_queue(1).iter().map(|c| c.cid.get()).collect();
    for cid in cids {
        assert!(got.contains(&cid), "cid {cid} completed");
    }
    assert_status(h.delete_cq(1), Status::SUCCESS);
    h.io.clear();
    assert_alive(&mut h);
}

// ---- Number of Queues (Base §5.1.25.1.7)

#[test]
fn spec_5_1_25_1_7_number_of_queues_65535_is_invalid_field() {
    let mut h = enabled();
    for v in [0xffffu32, 0xffff << 16, 0xffff_ffff] {
        assert_cqe(&h.set_features_raw(fid::NUMBER_OF_QUEUES, v, false), Status::INVALID_FIELD.with_dnr());
    }
    let c = h.set_features_raw(fid::NUMBER_OF_QUEUES, 3 | (3 << 16), false);
    assert_cqe(&c, Status::SUCCESS);
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_25_1_7_number_of_queues_returns_allocated_counts() {
    let mut h = enabled();
    let c = h.set_features_raw(fid::NUMBER_OF_QUEUES, 3 | (1 << 16), false);
    assert_cqe(&c, Status::SUCCESS);
    let (nsqa_z, ncqa_z) = (c.dw0.get() & 0xffff, c.dw0.get() >> 16);
    assert_eq!((nsqa_z, ncqa_z), (63, 63), "the controller allocates all 64 pairs");
    let g = h.get_features_raw(fid::NUMBER_OF_QUEUES, 0, 0);
    assert_cqe(&g, Status::SUCCESS);
    assert_eq!(g.dw0.get(), c.dw0.get(), "Get Features reports the allocation");
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_25_1_7_number_of_queues_after_io_queue_creation_is_command_sequence_error() {
    let (mut h, _) = ready(2, true);
    let c = h.set_features_raw(fid::NUMBER_OF_QUEUES, 1 | (1 << 16), false);
    assert_cqe(&c, Status::COMMAND_SEQUENCE_ERROR.with_dnr());
    // Still refused after the queues are deleted again (only a reset clears it).
    assert_status(h.delete_sq(2), Status::SUCCESS);
    assert_status(h.delete_cq(2), Status::SUCCESS);
    let c = h.set_features_raw(fid::NUMBER_OF_QUEUES, 1 | (1 << 16), false);
    assert_cqe(&c, Status::COMMAND_SEQUENCE_ERROR.with_dnr());
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_25_1_7_number_of_queues_allowed_again_after_reset() {
    let (mut h, _) = ready(2, true);
    h.enable(32).unwrap();
    let c = h.set_features_raw(fid::NUMBER_OF_QUEUES, 1 | (1 << 16), false);
    assert_cqe(&c, Status::SUCCESS);
    assert_alive(&mut h);
}
