//! The controller lifecycle behind CC and CSTS (Base §3.1.4, §3.5.1 initialization,
//! §3.6 shutdown, §3.7 reset) and BAR0 register access.

mod common;

use common::*;
use nvme_spec::admin::IdentifyCmd;
use nvme_spec::identify::cns;
use nvme_spec::opcode::{admin as aop, nvm as iop};
use nvme_spec::regs::{offset, Aqa, Cc, DoorbellKind, ShutdownStatus};
use nvme_spec::Status;
use test_kit::{MockHost, PAGE};

/// CC as Linux writes it: IOCQES 4, IOSQES 6, everything else 0.
const CC_LINUX: u32 = Cc::LINUX.0;

fn fresh() -> MockHost {
    let (cfg, _) = ram_cfg(1);
    MockHost::new(cfg, MEM)
}

/// Programs the admin queue registers and writes CC with EN set.
fn enable_with(h: &mut MockHost, aqa: u32, asq: u64, acq: u64, cc: u32) {
    h.write32(offset::CC, 0);
    h.write32(offset::AQA, aqa);
    h.write64(offset::ASQ, asq);
    h.write64(offset::ACQ, acq);
    h.write32(offset::CC, cc);
    h.write32(offset::CC, cc | 1);
}

#[test]
fn spec_3_5_1_enable_with_bad_configuration_sets_cfs_until_disabled() {
    let mut h = fresh();
    let asq = h.alloc.alloc_pages(1);
    let acq = h.alloc.alloc_pages(1);
    let good_aqa = Aqa::new(31, 31).0;
    let cases: &[(&str, u32, u64, u64, u32)] = &[
        ("MPS above CAP.MPSMAX", good_aqa, asq, acq, CC_LINUX | (5 << 7)),
        ("MPS far above CAP.MPSMAX", good_aqa, asq, acq, CC_LINUX | (15 << 7)),
        ("CSS not NVM", good_aqa, asq, acq, CC_LINUX | (1 << 4)),
        ("CSS admin only without CAP.CSS bit 7", good_aqa, asq, acq, CC_LINUX | (7 << 4)),
        ("AMS weighted round robin", good_aqa, asq, acq, CC_LINUX | (1 << 11)),
        ("AQA: one-entry queues", Aqa::new(0, 0).0, asq, acq, CC_LINUX),
        ("AQA: one-entry SQ", Aqa::new(0, 31).0, asq, acq, CC_LINUX),
        ("AQA: one-entry CQ", Aqa::new(31, 0).0, asq, acq, CC_LINUX),
        ("ASQ not page aligned", good_aqa, asq + 64, acq, CC_LINUX),
        ("ACQ not page aligned", good_aqa, asq, acq + 16, CC_LINUX),
    ];
    for &(why, aqa, s, c, cc) in cases {
        enable_with(&mut h, aqa, s, c, cc);
        let csts = h.csts();
        assert!(csts.cfs() && !csts.rdy(), "{why}: CSTS {:#x}", csts.0);
        // Doorbells do nothing; nothing panics.
        h.ring(0, DoorbellKind::SqTail, 1);
        assert!(!h.ctrl.process());
        // EN = 0 clears the fatal status.
        h.write32(offset::CC, 0);
        assert_eq!(h.csts().0, 0, "{why}: CC.EN = 0 resets CSTS");
    }
    h.enable(32).expect("a good enable works after all that");
    assert_alive(&mut h);
}

#[test]
fn spec_3_5_1_doorbell_writes_while_disabled_are_ignored() {
    let mut h = fresh();
    for qid in [0u16, 1, 64, 100] {
        h.ring(qid, DoorbellKind::SqTail, 5);
        h.ring(qid, DoorbellKind::CqHead, 5);
    }
    assert!(!h.ctrl.process());
    assert_eq!(h.ctrl.stats().admin_commands, 0);
    h.enable(32).unwrap();
    // The admin queue starts empty: nothing written while disabled is acted on.
    h.process();
    assert!(h.reap_queue(0).is_empty());
    assert_alive(&mut h);

    // Disable an enabled controller, write an SQE and ring: no completion appears.
    let admin = h.admin.as_ref().unwrap();
    let (sq, cq) = (admin.sq.base, admin.cq.base);
    h.write32(offset::CC, 0);
    let mut c = IdentifyCmd { cns: cns::CONTROLLER, ..Default::default() }.to_sqe();
    c.set_prps(h.admin_buf, 0);
    h.mem.write_obj(sq, &c).unwrap();
    h.mem.fill(cq, PAGE, 0).unwrap();
    h.ring(0, DoorbellKind::SqTail, 1);
    assert!(!h.ctrl.process());
    assert!(h.mem.read_obj::<nvme_spec::Cqe>(cq).unwrap() == Default::default(), "no completion posted");
    h.enable(32).unwrap();
    assert_alive(&mut h);
}

fn shutdown(kind: u32) {
    let (mut h, _) = ready(2, true);
    // Submitted and not yet run: shutdown processing completes them.
    let buf = h.alloc.alloc_pages(1);
    for i in 0..6 {
        let s = h.rw_sqe(iop::READ, 1, i, 1, (buf, 512));
        h.submit(1 + (i % 2) as u16, s).unwrap();
    }
    let cc = h.read32(offset::CC);
    h.write32(offset::CC, cc | (kind << 14));
    let csts = h.csts();
    assert_eq!(csts.shst(), ShutdownStatus::Complete, "SHST = shutdown processing complete");
    assert!(!csts.cfs());
    let done = h.reap_queue(1).len() + h.reap_queue(2).len();
    assert_eq!(done, 6, "commands submitted before the notification completed");

    // After shutdown the controller processes nothing.
    let s = h.rw_sqe(iop::READ, 1, 0, 1, (buf, 512));
    h.submit(1, s).unwrap();
    let (admin, _) = h.admin_exec(MockHost::admin_sqe(aop::ABORT));
    assert!(admin.is_none(), "admin command not processed after shutdown");
    assert!(!h.ctrl.process());
    assert!(h.reap_queue(1).is_empty(), "I/O not processed after shutdown");
    assert_eq!(h.csts().shst(), ShutdownStatus::Complete);

    // A reset and re-initialisation bring it back.
    h.init(test_kit::InitOptions { io_queues: 2, queue_size: 64, ..Default::default() }).unwrap();
    assert_eq!(h.csts().shst(), ShutdownStatus::Normal);
    assert_alive(&mut h);
}

#[test]
fn spec_3_6_1_normal_shutdown_completes_and_stops_processing() {
    shutdown(1);
}

#[test]
fn spec_3_6_2_abrupt_shutdown_completes_and_stops_processing() {
    shutdown(2);
}

#[test]
fn spec_3_7_2_reset_during_outstanding_io() {
    let (mut h, _) = ready(2, true);
    let buf = h.alloc.alloc_pages(4);
    // Some commands run, more are only submitted, when CC.EN goes to 0.
    for i in 0..10 {
        let s = h.rw_sqe(iop::WRITE, 1, i * 8, 8, (buf, 4096));
        h.submit(1, s).unwrap();
    }
    h.process();
    for i in 0..10 {
        let s = h.rw_sqe(iop::READ, 1, i * 8, 8, (buf, 4096));
        h.submit(2, s).unwrap();
    }
    h.write32(offset::CC, 0);
    assert_eq!(h.csts().0, 0);
    assert!(!h.ctrl.process());
    h.init(test_kit::InitOptions { io_queues: 2, queue_size: 64, ..Default::default() }).unwrap();
    for qid in [1, 2] {
        for i in 0..70 {
            assert_eq!(h.read_blocks(qid, 1, i, 1, 512).0, Status::SUCCESS);
        }
    }
    assert_alive(&mut h);
}

#[test]
fn spec_3_7_2_reset_forgets_doorbell_buffer_config() {
    let (mut h, _) = ready(2, true);
    let old = h.dbbuf.unwrap();
    // Re-initialise without Doorbell Buffer Config: the host rings every doorbell.
    h.init(test_kit::InitOptions {
        io_queues: 2,
        queue_size: 64,
        shadow_doorbells: false,
        ..Default::default()
    })
    .unwrap();
    assert!(h.dbbuf.is_none());
    h.mem.fill(old.shadow, PAGE, 0x5a).unwrap();
    h.mem.fill(old.eventidx, PAGE, 0x5a).unwrap();
    let before = h.ctrl.stats();
    for i in 0..100 {
        assert_eq!(h.read_blocks(1 + (i % 2) as u16, 1, i, 1, 512).0, Status::SUCCESS);
    }
    let d = h.ctrl.stats() - before;
    assert!(d.io_doorbell_writes >= 100, "every submission trapped: {}", d.io_doorbell_writes);
    let mut page = vec![0u8; 2 * PAGE as usize];
    h.mem.read(old.shadow, &mut page[..PAGE as usize]).unwrap();
    h.mem.read(old.eventidx, &mut page[PAGE as usize..]).unwrap();
    assert!(page.iter().all(|&b| b == 0x5a), "the old buffers are neither read as doorbells nor written");
    // The host may send it again, and shadow doorbells work again.
    h.doorbell_buffer_config().unwrap();
    for i in 0..100 {
        assert_eq!(h.read_blocks(1, 1, i, 1, 512).0, Status::SUCCESS);
    }
    assert_alive(&mut h);
}

#[test]
fn spec_3_1_4_register_reads_in_every_width() {
    let mut h = fresh();
    h.enable(32).unwrap();
    let cap = h.read64(offset::CAP);
    assert_eq!(cap, h.ctrl.cap().0);
    assert_eq!(h.read32(offset::CAP) as u64, cap & 0xffff_ffff, "CAP low half");
    assert_eq!(h.read32(offset::CAP + 4) as u64, cap >> 32, "CAP high half");
    let mut b2 = [0u8; 2];
    h.ctrl.mmio_read(offset::CAP, &mut b2);
    assert_eq!(u16::from_le_bytes(b2), 1023, "CAP.MQES as a 2-byte read");
    let mut b1 = [0u8; 1];
    h.ctrl.mmio_read(offset::CAP + 6, &mut b1);
    assert_eq!(b1[0], (cap >> 48) as u8, "CAP byte 6 (MPSMIN/MPSMAX)");
    assert_eq!(h.read32(offset::VS), 0x0001_0400);
    assert_eq!(h.read32(offset::CC), CC_LINUX | 1);
    assert_eq!(h.read32(offset::CSTS), 1);
    assert_eq!(h.read32(offset::AQA), Aqa::new(31, 31).0);
    let a = h.admin.as_ref().unwrap();
    let (asq, acq) = (a.sq.base, a.cq.base);
    for (reg, v) in [(offset::ASQ, asq), (offset::ACQ, acq)] {
        assert_eq!(h.read64(reg), v);
        assert_eq!(h.read32(reg) as u64, v & 0xffff_ffff);
        assert_eq!(h.read32(reg + 4) as u64, v >> 32);
    }
    // 64-bit base registers written as two 32-bit halves (lo then hi) while disabled.
    h.write32(offset::CC, 0);
    h.write32(offset::ASQ, 0x1234_5000);
    h.write32(offset::ASQ + 4, 0x9);
    h.write32(offset::ACQ, 0x6789_a000);
    h.write32(offset::ACQ + 4, 0x1);
    assert_eq!(h.read64(offset::ASQ), 0x9_1234_5000);
    assert_eq!(h.read64(offset::ACQ), 0x1_6789_a000);
    // Doorbells and reserved space read as zero.
    assert_eq!(h.read32(offset::DOORBELL_BASE), 0);
    assert_eq!(h.read32(0x50), 0);
    h.enable(32).unwrap();
    assert_alive(&mut h);
}

#[test]
fn spec_3_1_4_writes_to_read_only_registers_are_ignored() {
    let (mut h, _) = ready(1, true);
    let (cap, vs, aqa, asq, acq) = (
        h.read64(offset::CAP),
        h.read32(offset::VS),
        h.read32(offset::AQA),
        h.read64(offset::ASQ),
        h.read64(offset::ACQ),
    );
    h.write64(offset::CAP, !cap);
    h.write32(offset::CAP, 0);
    h.write32(offset::CAP + 4, 0);
    h.write32(offset::VS, 0x0002_0000);
    h.write32(offset::CSTS, 0xffff_ffff);
    h.write32(0x50, 0xffff_ffff);
    // Admin queue registers are read-only while the controller is enabled.
    h.write32(offset::AQA, 0);
    h.write64(offset::ASQ, 0x1000);
    h.write64(offset::ACQ, 0x2000);
    // Sizes other than 4 and 8 bytes are ignored.
    h.ctrl.mmio_write(offset::CC, &[0]);
    h.ctrl.mmio_write(offset::CC, &[0, 0]);
    assert_eq!(h.read64(offset::CAP), cap);
    assert_eq!(h.read32(offset::VS), vs);
    assert_eq!(h.read32(offset::CSTS), 1);
    assert_eq!((h.read32(offset::AQA), h.read64(offset::ASQ), h.read64(offset::ACQ)), (aqa, asq, acq));
    assert_eq!(h.read32(offset::CC) & 1, 1);
    assert_alive(&mut h);
}

#[test]
fn spec_3_1_4_6_queue_memory_removed_sets_cfs_not_panic() {
    for shadow in [false, true] {
        let (mut h, _) = ready(2, shadow);
        let (gpa, len) = h.mem.regions().next().unwrap();
        h.ctrl.set_memory(h.mem.without_region(gpa, len).expect("the one region"));
        let buf = h.alloc.alloc_pages(1);
        let s = h.rw_sqe(iop::READ, 1, 0, 1, (buf, 512));
        h.submit(1, s).unwrap();
        // Make sure the controller looks at queue 1 even if the shadow rule skipped the ring.
        h.ring(1, DoorbellKind::SqTail, h.io[0].sq.tail);
        h.process();
        let csts = h.csts();
        assert!(csts.cfs(), "shadow {shadow}: CSTS.CFS after the SQ became unreachable ({:#x})", csts.0);
        assert!(!h.ctrl.process(), "a fatal controller does nothing");
        // The host resets; with memory back, the controller comes back.
        h.ctrl.set_memory(h.mem.clone());
        h.init(test_kit::InitOptions {
            io_queues: 2,
            queue_size: 64,
            shadow_doorbells: shadow,
            ..Default::default()
        })
        .unwrap();
        assert_alive(&mut h);
    }
}

#[test]
fn spec_3_1_4_6_admin_queue_memory_removed_sets_cfs_not_panic() {
    let mut h = fresh();
    h.enable(32).unwrap();
    let (gpa, len) = h.mem.regions().next().unwrap();
    h.ctrl.set_memory(h.mem.without_region(gpa, len).unwrap());
    let (c, _) = h.admin_exec(MockHost::admin_sqe(aop::ABORT));
    assert!(c.is_none());
    assert!(h.csts().cfs());
    h.ctrl.set_memory(h.mem.clone());
    h.enable(32).unwrap();
    assert_alive(&mut h);
}

#[test]
fn spec_3_6_1_admin_command_pending_at_shutdown_never_completes_after_reset() {
    let (mut h, _) = ready(1, false);
    // An admin command submitted and rung, the device not yet run, then shutdown.
    let mut c = IdentifyCmd { cns: cns::CONTROLLER, ..Default::default() }.to_sqe();
    c.set_prps(h.admin_buf, 0);
    let cid = h.submit(0, c).unwrap();
    let cc = h.read32(offset::CC);
    h.write32(offset::CC, cc | (1 << 14));
    let got = h.reap_queue(0);
    assert_eq!(got.len(), 1, "the command completed during shutdown processing");
    assert_eq!((got[0].cid.get(), got[0].status()), (cid, Status::SUCCESS));
    // After a reset the new admin queue sees completions of its own commands only.
    h.enable(32).unwrap();
    let mut id = IdentifyCmd { cns: cns::CONTROLLER, ..Default::default() }.to_sqe();
    id.set_prps(h.admin_buf, 0);
    assert_cqe(&h.admin_raw(id), Status::SUCCESS);
    assert_alive(&mut h);
}
