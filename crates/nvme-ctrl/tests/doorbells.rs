//! Doorbells (PCIe §3.1.2 doorbell registers; Base §5.2.5 Doorbell Buffer Config and
//! its EventIdx protocol; Asynchronous Event Request error events).
//!
//! The EventIdx tests run the device only when a doorbell register write trapped, as
//! a real transport does (its I/O thread sleeps until a doorbell or backend notifier
//! wakes it). A command that completes only because the test polled the device anyway
//! would hide exactly the bug EventIdx can have: a submission or CQ head update the
//! host did not ring for and the device never looked at.

mod io_common;

use std::collections::BTreeSet;

use io_common::*;
use nvme_spec::regs::DoorbellKind::{CqHead, SqTail};
use nvme_spec::{Sqe, Status};
use test_kit::{InitOptions, MockHost};
use test_util::Rng;

const NS_BYTES: u64 = 1 << 20;

fn host(shadow: bool, queue_size: u32) -> MockHost {
    let opts = InitOptions { io_queues: 2, queue_size, shadow_doorbells: shadow, ..Default::default() };
    ram_host(&[(NS_BYTES, 0)], opts).0
}

/// Submits an Asynchronous Event Request and lets the controller park it.
fn arm_aer(h: &mut MockHost) -> u16 {
    let cid = h.submit_aer();
    assert!(h.reap_queue(0).is_empty(), "an AER waits for an event");
    cid
}

/// The AER `cid`'s completion dword 0, if it completed. Reads the Error Information
/// log afterwards (without RAE) so the next error event can be reported.
fn take_aer(h: &mut MockHost, cid: u16) -> Option<u32> {
    h.process();
    let c = h.reap_queue(0).into_iter().find(|c| c.cid.get() == cid)?;
    assert_status(&c, Status::SUCCESS, false);
    h.get_log(0x01, 0, 64, false).expect("error log");
    Some(c.dw0.get())
}

/// Error status event (type 0h) with `info`, cleared by the Error Information log (01h).
fn error_event(info: u8) -> u32 {
    (0x01 << 16) | ((info as u32) << 8)
}

const INVALID_DOORBELL_REGISTER: u8 = 0x00;
const INVALID_DOORBELL_WRITE_VALUE: u8 = 0x01;

fn one_read(h: &mut MockHost) -> Sqe {
    let buf = h.alloc.alloc_pages(1);
    h.rw_sqe(READ, 1, 0, 1, (buf, 512))
}

#[test]
fn aer_sq_tail_register_beyond_queue_size_is_not_processed_and_raises_invalid_value() {
    for shadow in [false, true] {
        let mut h = host(shadow, 16);
        let before = h.ctrl.stats().io_commands;
        // The (zeroed) slots hold Flush commands for NSID 0: any fetch would complete.
        for bad in [16u32, 17, 0xffff, u32::MAX] {
            let aer = arm_aer(&mut h);
            h.ring(1, SqTail, bad);
            h.process();
            assert_eq!(take_aer(&mut h, aer), Some(error_event(INVALID_DOORBELL_WRITE_VALUE)), "tail {bad}");
            assert!(h.reap_queue(1).is_empty(), "nothing was fetched (shadow {shadow})");
        }
        assert_eq!(h.ctrl.stats().io_commands, before);
        assert_still_works(&mut h, 1, 1, 512);
    }
}

#[test]
fn aer_sq_tail_register_that_would_overfill_the_queue_raises_invalid_value() {
    let mut h = host(false, 16);
    let aer = arm_aer(&mut h);
    // Five commands the device has not fetched yet: tail 5, head 0.
    for _ in 0..5 {
        let s = one_read(&mut h);
        h.submit(1, s).unwrap();
    }
    // Tail 0 would put 16 entries in a 16-entry ring (where it reads as empty), and
    // tail 4 would add 15 to the 5 already there; neither is taken. Slots 5..15 hold
    // zeroes (Flush of NSID 0): had either been taken, extra completions would show.
    for bad in [0, 4] {
        h.ring(1, SqTail, bad);
    }
    h.process();
    assert_eq!(take_aer(&mut h, aer), Some(error_event(INVALID_DOORBELL_WRITE_VALUE)));
    // Only the five validly submitted commands ran.
    let done = h.reap_queue(1);
    assert_eq!(done.len(), 5);
    assert!(done.iter().all(|c| c.status() == Status::SUCCESS));
    assert_still_works(&mut h, 1, 1, 512);
}

#[test]
fn aer_doorbell_of_a_nonexistent_queue_raises_invalid_doorbell_register() {
    for shadow in [false, true] {
        let mut h = host(shadow, 16);
        // Queue 3 could exist but does not; 64 is the highest the controller supports
        // and was never created; 65 and beyond are past every queue.
        for (qid, kind) in [(3u16, SqTail), (3, CqHead), (64, SqTail), (65, CqHead), (300, SqTail)] {
            let aer = arm_aer(&mut h);
            h.ring(qid, kind, 1);
            h.process();
            assert_eq!(
                take_aer(&mut h, aer),
                Some(error_event(INVALID_DOORBELL_REGISTER)),
                "qid {qid} {kind:?} (shadow {shadow})"
            );
        }
        assert_still_works(&mut h, 2, 1, 512);
    }
}

#[test]
fn aer_cq_head_beyond_tail_raises_invalid_value() {
    for shadow in [false, true] {
        let mut h = host(shadow, 16);
        // Three completions posted and consumed by the host: head = tail = 3.
        for _ in 0..3 {
            let s = one_read(&mut h);
            h.io_cmd(1, s);
        }
        // Head past the tail (nothing there to consume), and past the ring. With shadow
        // doorbells a register value is only a wake-up (a late write may be older than
        // the shadow value), so only the ring bound applies to it.
        let bad_heads: &[u32] = if shadow { &[16, 1000] } else { &[4, 15, 16, 1000] };
        for &bad in bad_heads {
            let aer = arm_aer(&mut h);
            h.ring(1, CqHead, bad);
            h.process();
            assert_eq!(take_aer(&mut h, aer), Some(error_event(INVALID_DOORBELL_WRITE_VALUE)), "head {bad}");
        }
        // The current head is fine (no event); the queue keeps going.
        let aer = arm_aer(&mut h);
        let head = h.io[0].cq.head;
        h.ring(1, CqHead, head);
        h.process();
        assert_eq!(take_aer(&mut h, aer), None);
        assert_still_works(&mut h, 1, 1, 512);
        // The AER is still outstanding; it completes with the next error.
        h.ring(9, SqTail, 0);
        assert_eq!(take_aer(&mut h, aer), Some(error_event(INVALID_DOORBELL_REGISTER)));
    }
}

#[test]
fn dbbuf_shadow_sq_tail_beyond_queue_size_runs_nothing_and_raises_invalid_value() {
    let mut h = host(true, 16);
    let before = h.ctrl.stats().io_commands;
    for bad in [16u32, 40, 0xffff_ffff] {
        let aer = arm_aer(&mut h);
        h.set_shadow_slot(1, SqTail, bad);
        // A valid register value wakes the device, which then reads the shadow slot.
        h.ring(1, SqTail, 1);
        h.process();
        assert_eq!(
            take_aer(&mut h, aer),
            Some(error_event(INVALID_DOORBELL_WRITE_VALUE)),
            "shadow tail {bad}"
        );
        assert!(h.reap_queue(1).is_empty(), "nothing was fetched");
        assert_eq!(h.ctrl.stats().io_commands, before);
        h.set_shadow_slot(1, SqTail, 0);
    }
    // Put things right: the host's next submission runs normally.
    h.process();
    assert_still_works(&mut h, 1, 1, 512);
}

#[test]
fn dbbuf_shadow_cq_head_beyond_the_ring_raises_invalid_value_and_recovers() {
    // A 4-entry CQ under a 64-entry SQ, so the device has to read the CQ head.
    let mut h = host(true, 16);
    let mut cq = h.new_io_cq(3, 4, true, 3).unwrap();
    let mut sq = h.new_io_sq(3, 3, 64).unwrap();
    let mut cids = BTreeSet::new();
    for _ in 0..10 {
        let s = one_read(&mut h);
        cids.insert(h.push_sqe(&mut sq, s).unwrap().0);
    }
    h.process();
    // The CQ is full (3 entries); the host consumes them but writes a garbage head.
    let aer = arm_aer(&mut h);
    let mut got = Vec::new();
    for _ in 0..3 {
        let (c, _) = h.pop_cqes(&mut cq, 1);
        got.extend(c);
    }
    assert_eq!(got.len(), 3);
    h.set_shadow_slot(3, CqHead, 77);
    h.ring(3, CqHead, cq.head);
    h.process();
    assert_eq!(take_aer(&mut h, aer), Some(error_event(INVALID_DOORBELL_WRITE_VALUE)));
    // The right value gets everything delivered.
    h.set_shadow_slot(3, CqHead, cq.head);
    h.ring(3, CqHead, cq.head);
    for _ in 0..20 {
        h.process();
        let (c, _) = h.pop_cqes(&mut cq, usize::MAX);
        got.extend(c);
    }
    assert_eq!(got.len(), 10);
    for c in &got {
        assert_status(c, Status::SUCCESS, false);
        assert!(sq.complete(c));
    }
    assert_still_works(&mut h, 1, 1, 512);
}

// ---- EventIdx

/// What one run of the strict model observed.
#[derive(Debug, Default)]
struct Run {
    completed: u64,
    cq_rings: u64,
    cq_wraps: u64,
    reaps: u64,
}

/// Runs `total` commands through queue pair 1 (`size` entries, at most `qd` in
/// flight) with random submission batches, random partial reaps and random delays
/// before the woken device runs. The device runs only after a trapped doorbell write.
/// Panics if the host is left waiting with no doorbell to ring and nothing to reap.
fn strict_eventidx_run(seed: u64, size: u32, qd: u32, total: u64) -> Run {
    let opts = InitOptions { io_queues: 1, queue_size: size, shadow_doorbells: true, ..Default::default() };
    let (mut h, _) = ram_host(&[(NS_BYTES, 0)], opts);
    assert!(h.dbbuf.is_some());
    let mut rng = Rng::new(seed);
    let buf = h.alloc.alloc_pages(1);
    let mut run = Run::default();
    let mut in_flight = BTreeSet::new();
    let mut submitted = 0u64;
    let mut wake = false;
    let ctx = |what: &str, run: &Run, n: usize| {
        format!("{what}: seed {seed} size {size} qd {qd} after {} completions, {n} in flight", run.completed)
    };
    while run.completed < total {
        match rng.below(10) {
            // Submit a batch.
            0..=3 => {
                let room = qd as u64 - in_flight.len() as u64;
                let left = total - submitted;
                if room == 0 || left == 0 {
                    continue;
                }
                let n = rng.range(1, room.min(left));
                for _ in 0..n {
                    let s = h.rw_sqe(READ, 1, submitted % 2048, 1, (buf, 512));
                    let (cid, rang) = h.submit_counted(1, s).expect("host keeps qd below the ring size");
                    assert!(in_flight.insert(cid));
                    wake |= rang;
                    submitted += 1;
                }
            }
            // Reap some or all of what is there.
            4..=6 => {
                let max = if rng.chance(50) { usize::MAX } else { rng.range(1, qd as u64) as usize };
                let (got, rang) = h.reap_some(1, max);
                if got.is_empty() {
                    continue;
                }
                run.reaps += 1;
                run.cq_rings += rang as u64;
                wake |= rang;
                for c in &got {
                    assert_status(c, Status::SUCCESS, false);
                    assert!(
                        in_flight.remove(&c.cid.get()),
                        "{}",
                        ctx("unknown or repeated cid", &run, in_flight.len())
                    );
                    run.completed += 1;
                }
            }
            // The woken device thread gets to run.
            _ => {
                if wake {
                    wake = false;
                    h.process();
                }
            }
        }
        // The host has nothing left to do but wait: is anything going to happen?
        let stuck = in_flight.len() as u64 == qd as u64 || submitted == total;
        if stuck && !wake && !in_flight.is_empty() {
            let (got, rang) = h.reap_some(1, usize::MAX);
            if got.is_empty() {
                let ei = h.eventidx_slot(1, SqTail);
                let sh = h.shadow_slot(1, SqTail);
                panic!(
                    "{} (SQ shadow {sh:?} EventIdx {ei:?})",
                    ctx("commands stranded", &run, in_flight.len())
                );
            }
            run.reaps += 1;
            run.cq_rings += rang as u64;
            wake |= rang;
            for c in &got {
                assert_status(c, Status::SUCCESS, false);
                assert!(in_flight.remove(&c.cid.get()));
                run.completed += 1;
            }
        }
    }
    // Every completion moved the host's CQ head by one entry.
    run.cq_wraps = run.completed / size as u64;
    // Idle: the SQ EventIdx is the tail the device consumed, so the next submission rings.
    if wake {
        h.process();
    }
    assert_eq!(h.eventidx_slot(1, SqTail), Some(h.io[0].sq.tail), "SQ EventIdx = consumed tail when idle");
    let s = h.rw_sqe(READ, 1, 0, 1, (buf, 512));
    assert!(h.submit_counted(1, s).unwrap().1, "the first submission after idle rings");
    run
}

#[test]
fn dbbuf_eventidx_never_strands_a_command_at_any_depth_or_queue_size() {
    let mut runs = 0;
    for size in [2u32, 3, 16, 1024] {
        for qd in [1u32, 2, 4, 16, 64, 127] {
            let qd = qd.min(size - 1);
            for seed in 0..6 {
                // Enough commands for many wraps of the ring.
                let total = (size as u64 * 12).clamp(600, 13_000);
                let r = strict_eventidx_run(seed * 1000 + size as u64 * 7 + qd as u64, size, qd, total);
                assert_eq!(r.completed, total);
                runs += 1;
            }
        }
    }
    assert!(runs >= 60);
}

#[test]
fn dbbuf_cq_head_doorbell_rings_about_once_per_wrap_not_per_reap() {
    for (size, qd) in [(16u32, 4u32), (64, 16), (256, 127), (3, 2)] {
        let r = strict_eventidx_run(77 + size as u64, size, qd, size as u64 * 20);
        assert!(r.cq_wraps >= 19, "{r:?}");
        assert!(
            r.cq_rings <= r.cq_wraps + 1,
            "size {size}: CQ head rang {} times in {} wraps",
            r.cq_rings,
            r.cq_wraps
        );
        if size >= 16 {
            assert!(r.reaps > 2 * r.cq_rings, "size {size}: {} reaps but {} CQ rings", r.reaps, r.cq_rings);
        }
    }
}

#[test]
fn dbbuf_sq_eventidx_equals_the_consumed_tail_when_idle() {
    let mut h = host(true, 32);
    let mut rng = Rng::new(5);
    for round in 0..100 {
        let n = rng.range(1, 31);
        let mut rings = 0;
        for _ in 0..n {
            let s = one_read(&mut h);
            rings += h.submit_counted(2, s).unwrap().1 as u32;
        }
        assert_eq!(rings, 1, "round {round}: only the first of a batch to an idle device rings");
        h.process();
        assert_eq!(h.eventidx_slot(2, SqTail), Some(h.io[1].sq.tail), "round {round}");
        let (got, _) = h.reap_some(2, usize::MAX);
        assert_eq!(got.len() as u64, n);
    }
    // Queue 1 never saw a command: its EventIdx is still 0, the tail.
    assert_eq!(h.eventidx_slot(1, SqTail), Some(0));
}

/// The EventIdx protocol under real concurrency: the host thread writes SQ entries,
/// shadow doorbells and CQ heads without any lock while the device thread runs
/// `process`, and traps (register writes) are the only way to wake the device. If
/// the host ever waits with no wake pending, the device idle, and nothing new in the
/// CQ, a command was stranded.
#[test]
fn dbbuf_eventidx_holds_with_host_and_device_on_separate_threads() {
    use std::sync::atomic::{fence, Ordering};
    use std::sync::{Arc, Condvar, Mutex};

    use nvme_spec::regs::doorbell_offset;
    use nvme_spec::regs::need_event;
    use nvme_spec::{Cqe, CQE_SIZE, SQE_SIZE};

    /// RAM whose submissions take a few microseconds, so the host keeps writing
    /// entries and shadow tails while the device is between reading a tail and
    /// re-arming EventIdx: the window the protocol has to close.
    #[derive(Debug)]
    struct SlowSubmit(block_backend::RamBackend);
    #[derive(Debug)]
    struct SlowQueue(Box<dyn block_backend::BackendQueue>);
    impl block_backend::Backend for SlowSubmit {
        fn info(&self) -> block_backend::BackendInfo {
            self.0.info()
        }
        fn open_queue(&self) -> std::io::Result<Box<dyn block_backend::BackendQueue>> {
            Ok(Box::new(SlowQueue(self.0.open_queue()?)))
        }
    }
    impl block_backend::BackendQueue for SlowQueue {
        fn submit(&mut self, mem: &guest_mem::GuestMemory, req: block_backend::Request) {
            let t = std::time::Instant::now();
            while t.elapsed() < std::time::Duration::from_micros(3) {
                std::hint::spin_loop();
            }
            self.0.submit(mem, req)
        }
        fn reap(&mut self, out: &mut Vec<block_backend::Completion>) -> usize {
            self.0.reap(out)
        }
        fn in_flight(&self) -> usize {
            self.0.in_flight()
        }
    }

    struct Device {
        host: MockHost,
        wakes: u64,
        stop: bool,
    }

    for (size, qd, total) in
        [(2u32, 1u32, 4000u64), (3, 2, 4000), (16, 15, 20_000), (64, 8, 20_000), (1024, 127, 30_000)]
    {
        let opts =
            InitOptions { io_queues: 1, queue_size: size, shadow_doorbells: true, ..Default::default() };
        let h = host_with(vec![(Arc::new(SlowSubmit(block_backend::RamBackend::new(NS_BYTES))), 0)], opts);
        let mem = h.mem.clone();
        let b = h.dbbuf.expect("shadow doorbells");
        let (sq_base, cq_base) = (h.io[0].sq.base, h.io[0].cq.base);
        let sq_off = doorbell_offset(1, SqTail, h.dstrd);
        let cq_off = doorbell_offset(1, CqHead, h.dstrd);
        let dev = Arc::new((Mutex::new(Device { host: h, wakes: 0, stop: false }), Condvar::new()));
        let worker = {
            let dev = dev.clone();
            std::thread::Builder::new()
                .name("vnvme-test-dev".into())
                .spawn(move || {
                    let (m, cv) = &*dev;
                    let mut g = m.lock().unwrap();
                    loop {
                        while g.wakes == 0 && !g.stop {
                            g = cv.wait(g).unwrap();
                        }
                        if g.wakes == 0 && g.stop {
                            return;
                        }
                        g.wakes = 0;
                        g.host.process();
                    }
                })
                .unwrap()
        };
        let ring = |qid_kind: nvme_spec::regs::DoorbellKind, v: u32| {
            let (m, cv) = &*dev;
            let mut g = m.lock().unwrap();
            g.host.ring(1, qid_kind, v);
            g.wakes += 1;
            cv.notify_one();
        };
        // Linux nvme_dbbuf_update_and_check_event.
        let update = |off: u64, kind, v: u32| {
            let old = mem.load_u32(b.shadow + off).unwrap();
            mem.store_u32(b.shadow + off, v).unwrap();
            fence(Ordering::SeqCst);
            let ei = mem.load_u32(b.eventidx + off).unwrap();
            if need_event(ei as u16, v as u16, old as u16) {
                ring(kind, v);
            }
        };
        let mut rng = Rng::new(size as u64);
        let (mut tail, mut head, mut phase) = (0u32, 0u32, true);
        let (mut submitted, mut completed, mut in_flight) = (0u64, 0u64, 0u32);
        while completed < total {
            // Submit a random batch.
            let n = rng.range(0, (qd - in_flight) as u64).min(total - submitted) as u32;
            for _ in 0..n {
                let mut s = MockHost::lba_sqe(nvme_spec::opcode::nvm::FLUSH, 1, 0, 1);
                s.set_cid(submitted as u16);
                mem.write_obj(sq_base + tail as u64 * SQE_SIZE as u64, &s).unwrap();
                fence(Ordering::Release);
                tail = (tail + 1) % size;
                update(sq_off, SqTail, tail);
                submitted += 1;
                in_flight += 1;
            }
            // Reap up to a random number of entries.
            let max = rng.range(1, qd as u64);
            let mut got = 0;
            while got < max {
                let addr = cq_base + head as u64 * CQE_SIZE as u64;
                let dw3 = mem.load_u32(addr + 12).unwrap();
                if ((dw3 >> 16) & 1 != 0) != phase {
                    break;
                }
                fence(Ordering::Acquire);
                let c: Cqe = mem.read_obj(addr).unwrap();
                assert_eq!(c.cid.get(), (completed & 0xffff) as u16, "in order, once each");
                assert_status(&c, Status::SUCCESS, false);
                head += 1;
                if head == size {
                    head = 0;
                    phase = !phase;
                }
                got += 1;
                completed += 1;
                in_flight -= 1;
            }
            if got > 0 {
                update(cq_off, CqHead, head);
                continue;
            }
            if in_flight < qd && submitted < total {
                continue;
            }
            // Nothing to reap and nothing to submit: is anything still going to happen?
            let (m, _) = &*dev;
            let g = m.lock().unwrap();
            if g.wakes == 0 {
                let dw3 = mem.load_u32(cq_base + head as u64 * CQE_SIZE as u64 + 12).unwrap();
                assert!(
                    ((dw3 >> 16) & 1 != 0) == phase,
                    "size {size} qd {qd}: {in_flight} commands stranded after {completed} (tail {tail}, \
                     SQ EventIdx {})",
                    mem.load_u32(b.eventidx + sq_off).unwrap()
                );
            }
            drop(g);
            std::thread::yield_now();
        }
        {
            let (m, cv) = &*dev;
            m.lock().unwrap().stop = true;
            cv.notify_one();
        }
        worker.join().expect("device thread did not panic");
    }
}

/// Base §5.2.5 / the EventIdx protocol, the order a polling owner meets: the SQ
/// EventIdx the controller last published is what it remembers publishing.
///
/// A poller leaves EventIdx stale while it spins, then re-arms when it stops. Here
/// the last value it armed with is 1; a lap of the ring later it re-arms at 0 and
/// the host submits in that very window (its tail store lands between the
/// controller's read of the tail and its re-read after the fence), so the re-arm
/// finds new work; the controller takes it, and its head is 1 again. EventIdx in
/// memory is now 0, not the 1 it armed with a lap before: if it takes its own
/// record of "armed at 1" for the truth, it sleeps with EventIdx 0, and the host's
/// next submission (1 to 2) does not ring. A lost wake-up, a command stranded.
#[test]
fn dbbuf_a_rearm_that_races_the_host_is_remembered_at_the_value_it_published() {
    use std::sync::{Arc, Mutex};

    use nvme_spec::regs::{doorbell_offset, need_event};
    use nvme_spec::{Cqe, CQE_SIZE, SQE_SIZE};

    type Hook = Box<dyn FnOnce() + Send>;
    /// RAM whose next submission first runs a hook: the host, acting while the
    /// controller is between its read of the tail and its re-arm.
    struct HookedRam(block_backend::RamBackend, Arc<Mutex<Option<Hook>>>);
    struct HookedQueue(Box<dyn block_backend::BackendQueue>, Arc<Mutex<Option<Hook>>>);
    impl std::fmt::Debug for HookedRam {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("HookedRam")
        }
    }
    impl std::fmt::Debug for HookedQueue {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("HookedQueue")
        }
    }
    impl block_backend::Backend for HookedRam {
        fn info(&self) -> block_backend::BackendInfo {
            self.0.info()
        }
        fn open_queue(&self) -> std::io::Result<Box<dyn block_backend::BackendQueue>> {
            Ok(Box::new(HookedQueue(self.0.open_queue()?, self.1.clone())))
        }
    }
    impl block_backend::BackendQueue for HookedQueue {
        fn submit(&mut self, mem: &guest_mem::GuestMemory, req: block_backend::Request) {
            let hook = self.1.lock().unwrap().take();
            if let Some(h) = hook {
                h();
            }
            self.0.submit(mem, req)
        }
        fn reap(&mut self, out: &mut Vec<block_backend::Completion>) -> usize {
            self.0.reap(out)
        }
        fn in_flight(&self) -> usize {
            self.0.in_flight()
        }
    }

    const SIZE: u32 = 8;
    let hook: Arc<Mutex<Option<Hook>>> = Arc::default();
    let opts = InitOptions { io_queues: 1, queue_size: SIZE, shadow_doorbells: true, ..Default::default() };
    let ram = block_backend::RamBackend::new(NS_BYTES);
    let mut h = host_with(vec![(Arc::new(HookedRam(ram, hook.clone())), 0)], opts);
    let mem = h.mem.clone();
    let b = h.dbbuf.expect("shadow doorbells");
    let (sq_base, cq_base) = (h.io[0].sq.base, h.io[0].cq.base);
    let buf = h.alloc.alloc_pages(1);
    let sqe = h.rw_sqe(READ, 1, 0, 1, (buf, 512));
    let sq_off = doorbell_offset(1, SqTail, h.dstrd);
    // The host's half (Linux nvme_dbbuf_update_and_check_event): true if it rang.
    let submit = move |slot: u32, cid: u16| -> bool {
        let mut s = sqe;
        s.set_cid(cid);
        mem.write_obj(sq_base + slot as u64 * SQE_SIZE as u64, &s).unwrap();
        let (old, new) = (slot, (slot + 1) % SIZE);
        mem.store_u32(b.shadow + sq_off, new).unwrap();
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        let ei = mem.load_u32(b.eventidx + sq_off).unwrap();
        need_event(ei as u16, new as u16, old as u16)
    };
    let (mut cq_head, mut phase) = (0u32, true);
    let mut reap = |h: &mut MockHost, want: usize| {
        for _ in 0..want {
            let addr = cq_base + cq_head as u64 * CQE_SIZE as u64;
            let c: Cqe = h.mem.read_obj(addr).unwrap();
            assert_eq!(c.status.get() & 1 != 0, phase, "a completion is missing");
            assert_status(&c, Status::SUCCESS, false);
            cq_head = (cq_head + 1) % SIZE;
            phase ^= cq_head == 0;
        }
        // The CQ head, shadowed (the controller reads it when it needs room).
        let off = doorbell_offset(1, CqHead, h.dstrd);
        h.mem.store_u32(b.shadow + off, cq_head).unwrap();
    };

    // Armed: one command, then the run that finds the queue empty arms at 1.
    h.ctrl.set_arm_eventidx(true);
    assert!(submit(0, 0), "the first submission to an idle controller rings");
    h.ring(1, SqTail, 1);
    h.process();
    reap(&mut h, 1);
    assert_eq!(h.eventidx_slot(1, SqTail), Some(1));
    // Polling, EventIdx stale: the head goes round to 7 (the host need not ring).
    h.ctrl.set_arm_eventidx(false);
    for slot in 1..SIZE - 1 {
        submit(slot, slot as u16);
        h.process();
        reap(&mut h, 1);
    }
    assert_eq!(h.eventidx_slot(1, SqTail), Some(1), "a poller leaves EventIdx stale");
    // The poller stops: its armed run takes the command in slot 7, and while it does
    // the host submits slot 0 (the hook), reading EventIdx 1: no ring.
    let rang = Arc::new(Mutex::new(None));
    *hook.lock().unwrap() = Some(Box::new({
        let (submit, rang) = (submit.clone(), rang.clone());
        move || *rang.lock().unwrap() = Some(submit(0, 100))
    }));
    submit(SIZE - 1, 99);
    h.ctrl.set_arm_eventidx(true);
    h.process();
    assert_eq!(*rang.lock().unwrap(), Some(false), "the hook ran, and its submission did not ring");
    reap(&mut h, 2);
    // Idle and armed: EventIdx is the consumed tail, so the next submission rings.
    assert_eq!(h.eventidx_slot(1, SqTail), Some(1), "EventIdx left behind the consumed tail");
    assert!(submit(1, 101), "the next submission rings");
}

/// A polling engine that found work pauses before it reads doorbells in memory again
/// (shadow doorbells here; a mapped page alike), so a host in a burst can write more of
/// them first. An engine with EventIdx armed, or one whose doorbells trap, never pauses:
/// its host rings, and nothing of it would be read in the pause. Either way every
/// command completes. One pause per round of the queues, however many had work.
#[test]
fn a_polling_engine_pauses_between_looks_only_at_doorbells_in_memory() {
    for (shadow, polling, pauses) in [(true, true, true), (true, false, false), (false, true, false)] {
        let mut h = host(shadow, 16);
        h.ctrl.set_arm_eventidx(!polling);
        let before = h.ctrl.stats().doorbell_pauses;
        let sqe = one_read(&mut h);
        for _ in 0..4 {
            h.submit(1, sqe).expect("room in the queue");
        }
        h.process();
        assert_eq!(h.reap_queue(1).len(), 4, "shadow {shadow}, polling {polling}");
        let paused = h.ctrl.stats().doorbell_pauses - before;
        assert_eq!(paused > 0, pauses, "shadow {shadow}, polling {polling}: {paused} pauses");
    }
    // Two busy queues are one round: one pause, not one per queue.
    let mut h = host(true, 16);
    h.ctrl.set_arm_eventidx(false);
    let sqe = one_read(&mut h);
    for qid in [1, 2, 1, 2] {
        h.submit(qid, sqe).expect("room in the queue");
    }
    h.process();
    assert_eq!(h.reap_queue(1).len() + h.reap_queue(2).len(), 4);
    assert_eq!(h.ctrl.stats().doorbell_pauses, 1, "one round found work on both queues");
}
