//! Set Features and Get Features (Base §5.1.25, §5.1.11): every feature the
//! controller implements, the Select and Save fields, invalid values, and the
//! features the data path honours (coalescing, arbitration burst, temperature).

mod common;

use common::*;
use nvme_spec::admin::CreateIoCqCmd;
use nvme_spec::admin::SetFeaturesCmd;
use nvme_spec::features::fid;
use nvme_spec::log::lid;
use nvme_spec::opcode::nvm as iop;
use nvme_spec::regs::DoorbellKind;
use nvme_spec::{Cqe, Status, CQE_SIZE, SQE_SIZE};
use test_kit::MockHost;

const SEL_CURRENT: u8 = 0;
const SEL_DEFAULT: u8 = 1;
const SEL_SAVED: u8 = 2;
const SEL_CAPS: u8 = 3;

/// Get Features (current) that must succeed; returns dword 0.
fn get(h: &mut MockHost, f: u8, cdw11: u32) -> u32 {
    let c = h.get_features_raw(f, SEL_CURRENT, cdw11);
    assert_cqe(&c, Status::SUCCESS);
    c.dw0.get()
}

fn set_ok(h: &mut MockHost, f: u8, v: u32) {
    assert_cqe(&h.set_features_raw(f, v, false), Status::SUCCESS);
}

/// Every feature the controller implements, with a valid non-default value, the
/// CDW11 Get Features needs to select it, and its default.
const CHANGEABLE: &[(u8, u32, u32, u32)] = &[
    // (FID, value set, Get CDW11, default)
    (fid::ARBITRATION, 0x0302_0103, 0, 7),
    (fid::POWER_MANAGEMENT, 1 << 5, 0, 0),
    (fid::TEMPERATURE_THRESHOLD, 350, 0, 343),
    (fid::TEMPERATURE_THRESHOLD, 250 | (1 << 20), 1 << 20, 1 << 20),
    (fid::ERROR_RECOVERY, 100, 0, 0),
    (fid::INTERRUPT_COALESCING, 0x0a03, 0, 0),
    (fid::INTERRUPT_VECTOR_CONFIG, 3 | (1 << 16), 3, 3),
    (fid::WRITE_ATOMICITY_NORMAL, 1, 0, 0),
    (fid::ASYNC_EVENT_CONFIG, 0x0102, 0, 0),
];

#[test]
fn spec_5_1_25_every_feature_round_trips_through_get_current() {
    let mut h = enabled();
    for &(f, v, sel_dw11, default) in CHANGEABLE {
        assert_eq!(get(&mut h, f, sel_dw11), default, "FID {f:#x} default before any Set");
        set_ok(&mut h, f, v);
        assert_eq!(get(&mut h, f, sel_dw11), v, "FID {f:#x} current after Set");
    }
    // Number of Queues: the allocation (64 pairs).
    assert_eq!(get(&mut h, fid::NUMBER_OF_QUEUES, 0), 63 | (63 << 16));
    // The RAM backend has no volatile write cache.
    assert_eq!(get(&mut h, fid::VOLATILE_WRITE_CACHE, 0), 0);
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_11_select_default_and_saved_return_defaults() {
    let mut h = enabled();
    for &(f, v, sel_dw11, default) in CHANGEABLE {
        set_ok(&mut h, f, v);
        for sel in [SEL_DEFAULT, SEL_SAVED] {
            let c = h.get_features_raw(f, sel, sel_dw11);
            assert_cqe(&c, Status::SUCCESS);
            // Nothing is saveable, so Saved reports the default (Base §5.1.11).
            assert_eq!(c.dw0.get(), default, "FID {f:#x} SEL {sel}");
        }
    }
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_11_select_supported_capabilities() {
    let mut h = enabled();
    for f in [
        fid::ARBITRATION,
        fid::POWER_MANAGEMENT,
        fid::TEMPERATURE_THRESHOLD,
        fid::ERROR_RECOVERY,
        fid::NUMBER_OF_QUEUES,
        fid::INTERRUPT_COALESCING,
        fid::INTERRUPT_VECTOR_CONFIG,
        fid::WRITE_ATOMICITY_NORMAL,
        fid::ASYNC_EVENT_CONFIG,
        fid::TIMESTAMP,
    ] {
        let c = h.get_features_raw(f, SEL_CAPS, 0);
        assert_cqe(&c, Status::SUCCESS);
        // Changeable (bit 2), neither saveable (bit 0) nor namespace specific (bit 1).
        assert_eq!(c.dw0.get(), 0b100, "FID {f:#x}");
    }
    let c = h.get_features_raw(fid::VOLATILE_WRITE_CACHE, SEL_CAPS, 0);
    assert_cqe(&c, Status::SUCCESS);
    assert_eq!(c.dw0.get(), 0, "no volatile write cache: not changeable");
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_25_save_is_feature_identifier_not_saveable() {
    let mut h = enabled();
    for &(f, v, _, _) in CHANGEABLE {
        assert_cqe(&h.set_features_raw(f, v, true), Status::FEATURE_NOT_SAVEABLE.with_dnr());
    }
    assert_cqe(&h.set_features_raw(fid::NUMBER_OF_QUEUES, 0, true), Status::FEATURE_NOT_SAVEABLE.with_dnr());
    // Nothing changed.
    assert_eq!(get(&mut h, fid::ARBITRATION, 0), 7);
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_11_reserved_select_is_invalid_field() {
    let mut h = enabled();
    for sel in 4..=7u8 {
        let c = h.get_features_raw(fid::ARBITRATION, sel, 0);
        assert_cqe(&c, Status::INVALID_FIELD.with_dnr());
    }
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_25_invalid_values_are_invalid_field() {
    let mut h = enabled();
    let bad: &[(u8, u32, &str)] = &[
        (fid::POWER_MANAGEMENT, 1, "PS above NPSS"),
        (fid::POWER_MANAGEMENT, 31, "PS above NPSS"),
        (fid::TEMPERATURE_THRESHOLD, 300 | (2 << 20), "THSEL 10b reserved"),
        (fid::TEMPERATURE_THRESHOLD, 300 | (3 << 20), "THSEL 11b reserved"),
        (fid::TEMPERATURE_THRESHOLD, 300 | (9 << 16), "TMPSEL of a sensor that does not exist"),
        (fid::ERROR_RECOVERY, 1 << 16, "DULBE without NSFEAT.DAE"),
        (fid::INTERRUPT_VECTOR_CONFIG, 65, "IV beyond the MSI-X vectors"),
        (fid::INTERRUPT_VECTOR_CONFIG, 0xffff | (1 << 16), "IV beyond the MSI-X vectors"),
        (fid::VOLATILE_WRITE_CACHE, 1, "no volatile write cache"),
    ];
    for &(f, v, why) in bad {
        let c = h.set_features_raw(f, v, false);
        assert_eq!(c.status(), Status::INVALID_FIELD.with_dnr(), "FID {f:#x} value {v:#x}: {why}");
    }
    // Get Features checks the selectors it is given too.
    for (f, dw11) in [(fid::INTERRUPT_VECTOR_CONFIG, 65), (fid::TEMPERATURE_THRESHOLD, 2 << 20)] {
        assert_cqe(&h.get_features_raw(f, SEL_CURRENT, dw11), Status::INVALID_FIELD.with_dnr());
    }
    // Unknown and unimplemented feature identifiers (81h-83h: no namespace here
    // has reservations; 0Fh, the Keep Alive Timer, is implemented).
    for f in [0x00, 0x03, 0x0c, 0x0d, 0x10, 0x11, 0x7f, 0x80, 0x81, 0x82, 0x83, 0xc0, 0xff] {
        assert_cqe(&h.set_features_raw(f, 0, false), Status::INVALID_FIELD.with_dnr());
        for sel in [SEL_CURRENT, SEL_DEFAULT, SEL_CAPS] {
            assert_cqe(&h.get_features_raw(f, sel, 0), Status::INVALID_FIELD.with_dnr());
        }
    }
    // Nothing was changed by the failures.
    assert_eq!(get(&mut h, fid::POWER_MANAGEMENT, 0), 0);
    assert_eq!(get(&mut h, fid::ERROR_RECOVERY, 0), 0);
    assert_eq!(get(&mut h, fid::TEMPERATURE_THRESHOLD, 0), 343);
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_25_features_return_to_defaults_after_reset() {
    let mut h = enabled();
    for &(f, v, _, _) in CHANGEABLE {
        set_ok(&mut h, f, v);
    }
    h.enable(32).unwrap();
    for &(f, _, sel_dw11, default) in CHANGEABLE {
        assert_eq!(get(&mut h, f, sel_dw11), default, "FID {f:#x} after Controller Level Reset");
    }
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_25_1_9_admin_vector_reports_coalescing_disabled() {
    let mut h = enabled();
    // The admin vector is never coalesced, so it reads back CD = 1.
    assert_eq!(get(&mut h, fid::INTERRUPT_VECTOR_CONFIG, 0), 1 << 16);
    assert_eq!(get(&mut h, fid::INTERRUPT_VECTOR_CONFIG, 64), 64);
    assert_alive(&mut h);
}

// ---- Interrupt Coalescing (Base §5.1.25.1.8) and Interrupt Vector Configuration

/// Submits `n` one-block reads on queue `qid` and lets the device complete them.
fn reads(h: &mut MockHost, qid: u16, n: u32) {
    let buf = h.alloc.alloc_pages(1);
    for i in 0..n {
        let s = h.rw_sqe(iop::READ, 1, i as u64, 1, (buf, 512));
        h.submit(qid, s).unwrap();
    }
    h.process();
    let got = h.reap_queue(qid);
    assert_eq!(got.len() as u32, n);
    assert!(got.iter().all(|c| c.status() == Status::SUCCESS));
}

#[test]
fn spec_5_1_25_1_8_interrupt_coalescing_threshold_and_time_are_honoured() {
    let (cfg, _) = ram_cfg(1);
    let (mut h, clock) = ready_with_clock(cfg, 2, true);
    // Threshold 4 completions (0's based 3), time 1 ms (10 x 100 µs).
    set_ok(&mut h, fid::INTERRUPT_COALESCING, 3 | (10 << 8));
    let v1 = h.irq.count(1);

    // Two completions: below the threshold, so no interrupt yet, and a deadline.
    reads(&mut h, 1, 2);
    assert_eq!(h.irq.count(1), v1, "coalesced: no interrupt for 2 completions");
    assert_eq!(h.ctrl.next_deadline(), Some(1_000_000), "fires 1 ms after the first completion");
    clock.advance_us(999);
    h.process();
    assert_eq!(h.irq.count(1), v1, "not before the aggregation time");
    clock.advance_us(1);
    h.process();
    assert_eq!(h.irq.count(1), v1 + 1, "the aggregation timer fired");
    assert_eq!(h.ctrl.next_deadline(), None);

    // Eight completions at once: one interrupt, not eight.
    reads(&mut h, 1, 8);
    assert_eq!(h.irq.count(1), v1 + 2, "threshold reached: a single interrupt for 8 completions");
    let interrupts_for_10 = h.irq.count(1) - v1;
    assert!(interrupts_for_10 < 10, "fewer interrupts than completions");

    // The admin vector is never coalesced: one interrupt per admin command.
    let v0 = h.irq.count(0);
    for _ in 0..3 {
        h.identify(0x01, 0).unwrap();
    }
    assert_eq!(h.irq.count(0), v0 + 3, "admin completions are not coalesced");
    assert_eq!(h.ctrl.next_deadline(), None);
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_25_1_9_coalescing_disable_exempts_one_vector() {
    let (cfg, _) = ram_cfg(1);
    let (mut h, clock) = ready_with_clock(cfg, 2, false);
    set_ok(&mut h, fid::INTERRUPT_COALESCING, 7 | (100 << 8));
    set_ok(&mut h, fid::INTERRUPT_VECTOR_CONFIG, 2 | (1 << 16));
    let (v1, v2) = (h.irq.count(1), h.irq.count(2));
    for _ in 0..3 {
        reads(&mut h, 2, 1);
        reads(&mut h, 1, 1);
    }
    assert_eq!(h.irq.count(2), v2 + 3, "vector 2 (CD = 1): an interrupt per completion");
    assert_eq!(h.irq.count(1), v1, "vector 1 still coalesced");
    clock.advance_us(10_000);
    h.process();
    assert_eq!(h.irq.count(1), v1 + 1, "vector 1's timer fires once");
    // Re-enabling coalescing on vector 2 brings it back under the rule.
    set_ok(&mut h, fid::INTERRUPT_VECTOR_CONFIG, 2);
    reads(&mut h, 2, 1);
    assert_eq!(h.irq.count(2), v2 + 3);
    assert_alive(&mut h);
}

// ---- Arbitration (Base §5.1.25.1.1): the burst is honoured

/// Runs 4 reads on each of two SQs that share one CQ, rung before the device runs,
/// and returns the SQ identifiers in completion order.
fn two_sq_completion_order(ab: u32) -> Vec<u16> {
    let mut h = enabled();
    set_ok(&mut h, fid::ARBITRATION, ab);
    let cq = h.alloc.alloc_pages(1);
    let sq1 = h.alloc.alloc_pages(1);
    let sq2 = h.alloc.alloc_pages(1);
    assert_status(
        h.create_cq_raw(CreateIoCqCmd { qid: 1, qsize_z: 63, base: cq, pc: true, ien: true, iv: 1 }),
        Status::SUCCESS,
    );
    assert_status(h.create_sq_raw(1, 15, sq1, true, 1), Status::SUCCESS);
    assert_status(h.create_sq_raw(2, 15, sq2, true, 1), Status::SUCCESS);
    let buf = h.alloc.alloc_pages(1);
    for (qid, base) in [(1u16, sq1), (2, sq2)] {
        for i in 0..4u16 {
            let mut s = h.rw_sqe(iop::READ, 1, i as u64, 1, (buf, 512));
            s.set_cid((qid << 8) | i);
            h.mem.write_obj(base + i as u64 * SQE_SIZE as u64, &s).unwrap();
        }
    }
    h.ring(1, DoorbellKind::SqTail, 4);
    h.ring(2, DoorbellKind::SqTail, 4);
    h.process();
    let mut order = Vec::new();
    for i in 0..8u64 {
        let c: Cqe = h.mem.read_obj(cq + i * CQE_SIZE as u64).unwrap();
        assert!(c.phase(), "8 completions posted");
        assert_eq!(c.status(), Status::SUCCESS);
        assert_eq!(c.cid.get() >> 8, c.sqid.get());
        order.push(c.sqid.get());
    }
    h.ring(1, DoorbellKind::CqHead, 8);
    assert_alive(&mut h);
    order
}

fn runs(v: &[u16]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let j = v[i..].iter().position(|&x| x != v[i]).map_or(v.len(), |p| i + p);
        out.push(j - i);
        i = j;
    }
    out
}

#[test]
fn spec_5_1_25_1_1_arbitration_burst_interleaves_submission_queues() {
    // AB = 0: one command per SQ per turn; AB = 1: two; AB = 7: no limit.
    assert_eq!(runs(&two_sq_completion_order(0)), vec![1; 8]);
    assert_eq!(runs(&two_sq_completion_order(1)), vec![2; 4]);
    assert_eq!(runs(&two_sq_completion_order(7)), vec![4, 4]);
}

// ---- Temperature Threshold (Base §5.1.25.1.4) and the SMART / Health event

fn set_exec(h: &mut MockHost, f: u8, v: u32) -> (Cqe, Vec<Cqe>) {
    let (mine, others) = h.admin_exec(SetFeaturesCmd { fid: f, cdw11: v, ..Default::default() }.to_sqe());
    (mine.expect("set features completed"), others)
}

const SMART_TEMP_EVENT: u32 = 1 | (1 << 8) | ((lid::SMART_HEALTH as u32) << 16);

#[test]
fn spec_5_1_25_1_4_threshold_below_temperature_warns_and_raises_smart_event() {
    let mut h = enabled();
    set_ok(&mut h, fid::ASYNC_EVENT_CONFIG, 1 << 1);
    let aer = h.submit_aer();
    assert!(h.reap_admin().is_empty(), "no event yet");
    // Composite temperature is 313 K; an over-temperature threshold of 300 K is crossed.
    let (c, others) = set_exec(&mut h, fid::TEMPERATURE_THRESHOLD, 300);
    assert_cqe(&c, Status::SUCCESS);
    assert_eq!(others.len(), 1, "the AER completed");
    assert_eq!(others[0].cid.get(), aer);
    assert_cqe(&others[0], Status::SUCCESS);
    assert_eq!(others[0].dw0.get(), SMART_TEMP_EVENT, "SMART/Health, temperature threshold, log 02h");
    let smart = h.log_at(lid::SMART_HEALTH, 512, 0, true);
    assert_eq!(smart[0] & 0b10, 0b10, "critical warning bit 1: temperature");

    // Clear and cross again: the event is masked until the SMART log is read with RAE = 0.
    set_ok(&mut h, fid::TEMPERATURE_THRESHOLD, 350);
    assert_eq!(h.log_at(lid::SMART_HEALTH, 512, 0, true)[0] & 0b10, 0, "warning clears");
    let aer2 = h.submit_aer();
    let (_, others) = set_exec(&mut h, fid::TEMPERATURE_THRESHOLD, 300);
    assert!(others.is_empty(), "masked: the type was reported and its log not read");
    let (st, _, others) = h.get_log_exec(lid::SMART_HEALTH, 0xffff_ffff, 127, 0, true);
    assert_eq!(st, Status::SUCCESS);
    assert!(others.is_empty(), "RAE = 1 keeps the event type masked");
    let (st, _, others) = h.get_log_exec(lid::SMART_HEALTH, 0xffff_ffff, 127, 0, false);
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(others.len(), 1, "reading the log with RAE = 0 unmasks; the waiting event is reported");
    assert_eq!((others[0].cid.get(), others[0].dw0.get()), (aer2, SMART_TEMP_EVENT));
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_25_1_4_under_temperature_threshold_and_disabled_event() {
    let mut h = enabled();
    // AEC bit 1 clear: the warning is set, but no event is reported.
    let _aer = h.submit_aer();
    let (c, others) = set_exec(&mut h, fid::TEMPERATURE_THRESHOLD, 320 | (1 << 20));
    assert_cqe(&c, Status::SUCCESS);
    assert!(others.is_empty(), "temperature events not enabled in Asynchronous Event Configuration");
    assert_eq!(h.log_at(lid::SMART_HEALTH, 512, 0, false)[0] & 0b10, 0b10, "under-temperature warning");
    set_ok(&mut h, fid::TEMPERATURE_THRESHOLD, 1 << 20);
    assert_eq!(h.log_at(lid::SMART_HEALTH, 512, 0, false)[0] & 0b10, 0, "under threshold 0 disables it");
    assert_alive(&mut h);
}

// ---- Timestamp (Base §5.1.25.1.13)

fn read_timestamp(h: &mut MockHost) -> (u64, u8) {
    h.mem.fill(h.admin_buf, 8, 0xff).unwrap();
    let c = h.get_features_raw(fid::TIMESTAMP, SEL_CURRENT, 0);
    assert_cqe(&c, Status::SUCCESS);
    let mut b = [0u8; 8];
    h.mem.read(h.admin_buf, &mut b).unwrap();
    let mut ms = [0u8; 8];
    ms[..6].copy_from_slice(&b[..6]);
    assert_eq!(b[7], 0, "reserved byte");
    (u64::from_le_bytes(ms), b[6])
}

#[test]
fn spec_5_1_25_1_13_timestamp_set_get_round_trip() {
    let (cfg, _) = ram_cfg(1);
    let clock = std::sync::Arc::new(test_kit::ManualClock::default());
    let mut h = MockHost::with_clock(cfg, MEM, clock.clone());
    h.enable(32).unwrap();
    clock.advance_us(1_500_000);
    let (ms, attr) = read_timestamp(&mut h);
    assert_eq!((ms, attr), (1500, 0), "not set: ms since reset, origin 0, not synchronised");

    let set_to: u64 = 0x1234_5678_9abc;
    h.mem.write(h.admin_buf, &set_to.to_le_bytes()).unwrap();
    assert_cqe(&h.set_features_raw(fid::TIMESTAMP, 0, false), Status::SUCCESS);
    clock.advance_us(2_500_000);
    let (ms, attr) = read_timestamp(&mut h);
    assert_eq!(ms, set_to + 2500, "elapsed milliseconds added");
    assert_eq!((attr >> 1) & 7, 1, "origin: set by a Set Features command");
    assert_eq!(attr & 1, 0, "Synch: the timestamp did not stop");

    // A Controller Level Reset forgets it and restarts from 0.
    clock.advance_us(1_000);
    h.enable(32).unwrap();
    clock.advance_us(7_000);
    assert_eq!(read_timestamp(&mut h), (7, 0), "after reset: ms since the reset, origin 0");
    assert_alive(&mut h);
}

/// Keep Alive (Base §3.9.5), optional over PCIe and offered: Identify says KAS (100
/// ms), the Keep Alive Timer feature is off by default, rounded up to KAS when set,
/// and a Keep Alive command restarts it. Without one within KATO the controller
/// reports Controller Fatal Status and records Keep Alive Timer Expired in the
/// Error Information log; a reset (what the host does then) recovers it.
#[test]
fn spec_3_9_5_keep_alive_timer() {
    let (cfg, _) = ram_cfg(1);
    let clock = std::sync::Arc::new(test_kit::ManualClock::default());
    let mut h = MockHost::with_clock(cfg, MEM, clock.clone());
    h.enable(32).unwrap();
    let id = h.identify(0x01, 0).unwrap();
    assert_eq!(u16::from_le_bytes([id[320], id[321]]), 1, "KAS: 100 ms");
    assert_eq!(get(&mut h, fid::KEEP_ALIVE_TIMER, 0), 0, "off by default over PCIe");
    let caps = h.get_features_raw(fid::KEEP_ALIVE_TIMER, SEL_CAPS, 0);
    assert_eq!(caps.dw0.get(), 0b100, "changeable");
    // Off: no expiry however long the host is silent.
    clock.advance_us(60_000_000);
    h.process();
    assert_alive(&mut h);
    set_ok(&mut h, fid::KEEP_ALIVE_TIMER, 150);
    assert_eq!(get(&mut h, fid::KEEP_ALIVE_TIMER, 0), 200, "rounded up to KAS");
    // Keep alives within KATO keep it alive.
    let keep_alive = nvme_spec::Sqe::with_opcode(nvme_spec::opcode::admin::KEEP_ALIVE);
    for _ in 0..5 {
        clock.advance_us(150_000);
        assert_cqe(&h.admin_cmd(keep_alive).unwrap(), Status::SUCCESS);
    }
    assert_alive(&mut h);
    // Silence past KATO: fatal, and said in the Error Information log.
    clock.advance_us(201_000);
    h.process();
    assert!(h.csts().cfs(), "controller fatal status after KATO without a Keep Alive");
    h.enable(32).unwrap();
    let log = h.log_at(lid::ERROR_INFORMATION, 64, 0, false);
    let sts = u16::from_le_bytes([log[12], log[13]]) >> 1;
    assert_eq!(sts & 0x7ff, 0x19, "Keep Alive Timer Expired (generic 19h) recorded");
    // Reset: the feature is off again, nothing expires.
    assert_eq!(get(&mut h, fid::KEEP_ALIVE_TIMER, 0), 0);
    clock.advance_us(10_000_000);
    h.process();
    assert_alive(&mut h);
}
