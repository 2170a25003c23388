//! Full queues (Base 2.1 §3.3.1 queue full conditions; completion queue entry SQ Head
//! Pointer and Phase Tag): a CQ smaller than its SQs, SQs the host fills to the last
//! slot, several SQs on one CQ, an SQ deleted with commands in flight, and the
//! interrupts all of that raises.
//!
//! Like the EventIdx tests in doorbells.rs, the strict runs here wake the device only
//! on a trapped doorbell write, so a completion that waits for CQ space and is never
//! announced to the host shows up as a stranded command.

mod io_common;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use block_backend::{Backend, BackendInfo, BackendQueue, Completion, RamBackend, Request, SyncExec};
use guest_mem::GuestMemory;
use io_common::*;
use nvme_spec::{Cqe, Status};
use test_kit::{CqRing, HostSq};
use test_kit::{InitOptions, MockHost};
use test_util::Rng;

const NS_BYTES: u64 = 1 << 20;

/// Host bookkeeping for one SQ in a strict run: what is in flight, in order.
#[derive(Debug)]
struct Track {
    sq: HostSq,
    /// (cid, absolute submission index) of commands in flight, oldest first.
    order: VecDeque<(u16, u64)>,
    /// Commands ever submitted (the absolute tail).
    tail_abs: u64,
    /// The controller's head, as an absolute index, from the last completion.
    head_abs: u64,
    done: u64,
}

impl Track {
    fn new(sq: HostSq) -> Self {
        Track { sq, order: VecDeque::new(), tail_abs: 0, head_abs: 0, done: 0 }
    }
}

/// Checks one completion against its SQ: it is the oldest command in flight there
/// (one SQ, one namespace, a synchronous backend: commands finish in order), and its
/// SQ Head Pointer never moves backwards, has moved past the command's own slot and
/// not past anything the host submitted.
///
/// The head is absolute-ised against the previous one: the host never has more than
/// `size - 1` entries beyond a head it learnt, so a new head lies within `size - 1`
/// of the last.
fn check_completion(t: &mut Track, c: &Cqe, what: &str) {
    assert_status(c, Status::SUCCESS, false);
    let (cid, index) =
        t.order.pop_front().unwrap_or_else(|| panic!("{what}: completion with nothing in flight"));
    assert_eq!(c.cid.get(), cid, "{what}: SQ {} completions out of order", t.sq.ring.qid);
    let size = t.sq.ring.size as u64;
    let sqhd = u64::from(c.sqhd.get());
    assert!(sqhd < size, "{what}: sqhd {sqhd} outside a {size}-entry SQ");
    let head = t.head_abs + (sqhd + size - t.head_abs % size) % size;
    assert!(
        head > index && head <= t.tail_abs,
        "{what}: sqhd {sqhd} (absolute {head}) for command {index}, {} submitted",
        t.tail_abs
    );
    t.head_abs = head;
    assert!(t.sq.complete(c), "{what}: cid {cid} was not in flight");
    t.done += 1;
}

/// A strict run: one CQ of `cq_size` entries shared by SQs of `sq_sizes`, `total`
/// commands spread over them with random batches, random partial reaps and random
/// delays before the woken device runs.
fn strict_full_run(seed: u64, shadow: bool, cq_size: u32, sq_sizes: &[u32], total: u64) {
    let (mut h, _) = bare_host(NS_BYTES, 8);
    let mut cq = h.new_io_cq(1, cq_size, true, 1).unwrap();
    let mut sqs: Vec<Track> = sq_sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| Track::new(h.new_io_sq(i as u16 + 1, 1, size).unwrap()))
        .collect();
    if shadow {
        h.doorbell_buffer_config().unwrap();
    }
    let mut rng = Rng::new(seed);
    let buf = h.alloc.alloc_pages(1);
    let (mut submitted, mut completed) = (0u64, 0u64);
    let mut wake = false;
    let what = |completed: u64| {
        format!("seed {seed} shadow {shadow} cq {cq_size} sqs {sq_sizes:?} after {completed}")
    };
    let reap = |h: &mut MockHost, cq: &mut CqRing, sqs: &mut Vec<Track>, max: usize, completed: &mut u64| {
        let (got, rang) = h.pop_cqes(cq, max);
        for c in &got {
            let t = &mut sqs[c.sqid.get() as usize - 1];
            check_completion(t, c, &what(*completed));
            *completed += 1;
        }
        (got.len(), rang)
    };
    while completed < total {
        match rng.below(10) {
            0..=3 => {
                let i = rng.below(sqs.len() as u64) as usize;
                let n = rng.range(1, sqs[i].sq.ring.size as u64);
                for _ in 0..n {
                    if submitted == total {
                        break;
                    }
                    let s = h.rw_sqe(READ, 1, submitted % 2048, 1, (buf, 512));
                    let Some((cid, rang)) = h.push_sqe(&mut sqs[i].sq, s) else { break };
                    let t = &mut sqs[i];
                    t.order.push_back((cid, t.tail_abs));
                    t.tail_abs += 1;
                    wake |= rang;
                    submitted += 1;
                }
            }
            4..=6 => {
                let max = if rng.chance(50) { usize::MAX } else { rng.range(1, cq_size as u64) as usize };
                let (_, rang) = reap(&mut h, &mut cq, &mut sqs, max, &mut completed);
                wake |= rang;
            }
            _ => {
                if wake {
                    wake = false;
                    h.process();
                }
            }
        }
        let can_submit = submitted < total && sqs.iter().any(|t| !t.sq.is_full());
        let in_flight: usize = sqs.iter().map(|t| t.order.len()).sum();
        if !can_submit && !wake && in_flight > 0 {
            let (n, rang) = reap(&mut h, &mut cq, &mut sqs, usize::MAX, &mut completed);
            if n == 0 {
                panic!("{}: {in_flight} commands stranded (CQ head {} )", what(completed), cq.head);
            }
            wake |= rang;
        }
    }
    assert_eq!(sqs.iter().map(|t| t.done).sum::<u64>(), total);
    assert!(sqs.iter().all(|t| t.order.is_empty()));
}

#[test]
fn spec_3_3_1_cq_smaller_than_sq_delivers_every_completion_in_order() {
    for shadow in [false, true] {
        for seed in 0..8 {
            strict_full_run(seed, shadow, 4, &[64], 3000);
            strict_full_run(seed + 100, shadow, 2, &[16], 1000);
            strict_full_run(seed + 200, shadow, 3, &[1024], 4000);
        }
    }
}

#[test]
fn spec_3_3_1_many_sqs_sharing_one_small_cq() {
    for shadow in [false, true] {
        for seed in 0..6 {
            strict_full_run(seed, shadow, 8, &[16, 2, 64, 5], 4000);
            strict_full_run(seed + 50, shadow, 3, &[4, 4, 4], 2000);
            strict_full_run(seed + 90, shadow, 64, &[32, 32, 32, 32, 32, 32], 4000);
        }
    }
}

/// 60 commands queued at once on a 64-entry SQ whose CQ holds 3: the device posts 3,
/// holds the rest, and posts more each time the host frees room, keeping order and
/// flipping the phase tag on every wrap.
#[test]
fn spec_3_3_1_overflowing_completions_wait_for_room_with_correct_phase() {
    for shadow in [false, true] {
        let (mut h, _) = bare_host(NS_BYTES, 2);
        let mut cq = h.new_io_cq(1, 4, true, 1).unwrap();
        let mut sq = h.new_io_sq(1, 1, 64).unwrap();
        if shadow {
            h.doorbell_buffer_config().unwrap();
        }
        let buf = h.alloc.alloc_pages(1);
        let mut cids = VecDeque::new();
        for i in 0..60 {
            let s = h.rw_sqe(READ, 1, i, 1, (buf, 512));
            cids.push_back(h.push_sqe(&mut sq, s).unwrap().0);
        }
        let irq_before = h.irq.count(1);
        h.process();
        assert_eq!(h.irq.count(1), irq_before + 1, "one interrupt for the pass that filled the CQ");
        let mut passes = 0;
        let mut expected_phase = true;
        let mut seen = 0;
        while !cids.is_empty() {
            // Read the ring directly: exactly the entries the device posted, no more.
            let mut got = Vec::new();
            loop {
                let addr = cq.base + cq.head as u64 * 16;
                let e: Cqe = h.mem.read_obj(addr).unwrap();
                if e.phase() != cq.phase {
                    break;
                }
                assert_eq!(e.phase(), expected_phase, "phase of entry {seen}");
                got.push(e);
                seen += 1;
                cq.head = (cq.head + 1) % cq.size;
                if cq.head == 0 {
                    cq.phase = !cq.phase;
                    expected_phase = !expected_phase;
                }
            }
            assert!(
                !got.is_empty() && got.len() <= 3,
                "shadow {shadow}: {} entries in a 4-entry CQ",
                got.len()
            );
            for c in &got {
                assert_status(c, Status::SUCCESS, false);
                assert_eq!(Some(c.cid.get()), cids.pop_front(), "completions keep submission order");
                assert!(sq.complete(c));
            }
            let before = h.irq.count(1);
            h.update_doorbell(1, nvme_spec::regs::DoorbellKind::CqHead, cq.head);
            h.process();
            if !cids.is_empty() {
                assert_eq!(h.irq.count(1), before + 1, "room made, entries posted, one interrupt");
            }
            passes += 1;
            assert!(passes < 100);
        }
        assert_eq!(seen, 60);
        assert!(passes >= 20, "3 at a time");
        // The SQ head the host learnt is the whole queue: all 60 were fetched.
        assert_eq!(sq.head, 60);
    }
}

#[test]
fn spec_3_3_1_sq_full_host_cannot_submit_more_than_size_minus_one() {
    for shadow in [false, true] {
        let (mut h, _) = bare_host(NS_BYTES, 2);
        let mut cq = h.new_io_cq(1, 16, true, 1).unwrap();
        let mut sq = h.new_io_sq(1, 1, 8).unwrap();
        if shadow {
            h.doorbell_buffer_config().unwrap();
        }
        let buf = h.alloc.alloc_pages(1);
        for round in 0..20 {
            let mut n = 0;
            loop {
                let s = h.rw_sqe(READ, 1, round, 1, (buf, 512));
                if h.push_sqe(&mut sq, s).is_none() {
                    break;
                }
                n += 1;
            }
            // After the first round the host's view of the head lags: it still
            // submits exactly up to one slot short of what it last learnt.
            assert_eq!(n, 7, "round {round}: size - 1 entries fit");
            h.process();
            let (got, _) = h.pop_cqes(&mut cq, usize::MAX);
            assert_eq!(got.len(), 7);
            for c in &got {
                assert_status(c, Status::SUCCESS, false);
                assert!(sq.complete(c));
            }
            assert_eq!(sq.head, sq.ring.tail, "sqhd of the last completion is the tail");
        }
    }
}

// ---- a backend that completes late, so commands really are in flight

/// A RAM backend whose requests complete only after `delay` reap calls, like an
/// asynchronous backend under load.
#[derive(Debug, Clone)]
struct SlowRam {
    ram: RamBackend,
    delay: u32,
    submitted: Arc<AtomicU64>,
}

#[derive(Debug)]
struct SlowQueue {
    ram: RamBackend,
    delay: u32,
    pending: Vec<(u32, Completion)>,
    submitted: Arc<AtomicU64>,
}

impl Backend for SlowRam {
    fn info(&self) -> BackendInfo {
        self.ram.info()
    }
    fn open_queue(&self) -> std::io::Result<Box<dyn BackendQueue>> {
        Ok(Box::new(SlowQueue {
            ram: self.ram.clone(),
            delay: self.delay,
            pending: Vec::new(),
            submitted: self.submitted.clone(),
        }))
    }
}

impl BackendQueue for SlowQueue {
    fn submit(&mut self, mem: &GuestMemory, mut req: Request) {
        self.submitted.fetch_add(1, Ordering::Relaxed);
        let result = self.ram.exec(mem, &mut req);
        self.pending.push((self.delay, Completion { tag: req.tag, result, data: req.data }));
    }
    fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        let mut n = 0;
        let mut keep = Vec::new();
        for (left, c) in self.pending.drain(..) {
            if left == 0 {
                out.push(c);
                n += 1;
            } else {
                keep.push((left - 1, c));
            }
        }
        self.pending = keep;
        n
    }
    fn in_flight(&self) -> usize {
        self.pending.len()
    }
}

#[test]
fn spec_5_delete_sq_with_commands_in_flight_completes_them_first() {
    let ram = RamBackend::new(NS_BYTES);
    let slow = SlowRam { ram: ram.clone(), delay: 50, submitted: Arc::new(AtomicU64::new(0)) };
    let mut h = host_with(
        vec![(Arc::new(slow.clone()) as Arc<dyn Backend>, 0)],
        InitOptions { io_queues: 2, queue_size: 64, ..Default::default() },
    );
    // Queue pair 1 is the one to delete; 2 keeps working throughout.
    let data = Rng::new(40).bytes(512);
    let buf = h.alloc.alloc_pages(1);
    h.mem.write(buf, &data).unwrap();
    let mut cids = Vec::new();
    for i in 0..20 {
        let s = h.rw_sqe(WRITE, 1, i, 1, (buf, 512));
        cids.push(h.submit(1, s).unwrap());
    }
    // One pass: everything fetched and handed to the backend, nothing finished yet.
    assert!(h.ctrl.process());
    assert_eq!(slow.submitted.load(Ordering::Relaxed), 20);
    // Delete I/O SQ 1 (the mock host runs the device until the admin completion).
    let c = h.remove_io_sq(1).unwrap();
    assert_status(&c, Status::SUCCESS, false);
    // Every command fetched before the delete has completed, on CQ 1, before it.
    let done = h.reap_queue(1);
    assert_eq!(done.len(), 20, "in-flight commands complete before Delete I/O SQ does");
    for c in &done {
        assert!(
            c.status() == Status::SUCCESS || c.status().code() == Status::ABORT_SQ_DELETION,
            "{:?}",
            c.status()
        );
    }
    for i in 0..20 {
        let mut b = [0u8; 512];
        ram.read_at(i * 512, &mut b).unwrap();
        assert!(b[..] == data[..] || b == [0; 512]);
    }
    // The CQ has no users now and can go; the other pair still works.
    assert_status(&h.remove_io_cq(1).unwrap(), Status::SUCCESS, false);
    let s = h.rw_sqe(READ, 1, 0, 1, (buf, 512));
    let cid = h.submit(2, s).unwrap();
    let mut got = None;
    for _ in 0..200 {
        h.process();
        if let Some(c) = h.reap_queue(2).into_iter().find(|c| c.cid.get() == cid) {
            got = Some(c);
            break;
        }
    }
    assert_status(&got.expect("queue 2 still completes"), Status::SUCCESS, false);
}

#[test]
fn spec_5_delete_sq_with_unfetched_entries_drops_them_and_the_qid_is_reusable() {
    let (mut h, _) = bare_host(NS_BYTES, 2);
    let mut cq = h.new_io_cq(1, 16, true, 1).unwrap();
    let mut sq = h.new_io_sq(1, 1, 16).unwrap();
    h.doorbell_buffer_config().unwrap();
    let buf = h.alloc.alloc_pages(1);
    for i in 0..10 {
        let s = h.rw_sqe(READ, 1, i, 1, (buf, 512));
        h.push_sqe(&mut sq, s).unwrap();
    }
    let c = h.remove_io_sq(1).unwrap();
    assert_status(&c, Status::SUCCESS, false);
    // Whatever was fetched completed; nothing arrives later.
    let (first, _) = h.pop_cqes(&mut cq, usize::MAX);
    h.process();
    let (later, _) = h.pop_cqes(&mut cq, usize::MAX);
    assert!(later.is_empty());
    assert!(first.len() <= 10);
    // Re-create SQ 1 on the same CQ: it starts from slot 0 and works with EventIdx.
    let mut sq = h.new_io_sq(1, 1, 16).unwrap();
    for i in 0..40 {
        let s = h.rw_sqe(READ, 1, i, 1, (buf, 512));
        let (_, rang) = h.push_sqe(&mut sq, s).unwrap();
        assert!(rang, "idle device: every single submission rings");
        h.process();
        let (got, _) = h.pop_cqes(&mut cq, usize::MAX);
        assert_eq!(got.len(), 1);
        assert!(sq.complete(&got[0]));
    }
}

#[test]
fn spec_5_completions_waiting_for_room_survive_deleting_their_sq() {
    for shadow in [false, true] {
        let (mut h, _) = bare_host(NS_BYTES, 2);
        let mut cq = h.new_io_cq(1, 4, true, 1).unwrap();
        let mut sq = h.new_io_sq(1, 1, 64).unwrap();
        if shadow {
            h.doorbell_buffer_config().unwrap();
        }
        let buf = h.alloc.alloc_pages(1);
        for i in 0..20 {
            let s = h.rw_sqe(READ, 1, i, 1, (buf, 512));
            h.push_sqe(&mut sq, s).unwrap();
        }
        h.process();
        // 3 posted, 17 waiting for room; the SQ goes away meanwhile.
        assert_status(&h.remove_io_sq(1).unwrap(), Status::SUCCESS, false);
        // The host consumes; the device runs only when a CQ head update trapped.
        let mut got = Vec::new();
        loop {
            let (c, rang) = h.pop_cqes(&mut cq, usize::MAX);
            if c.is_empty() {
                break;
            }
            got.extend(c);
            if rang {
                h.process();
            }
        }
        assert_eq!(got.len(), 20, "shadow {shadow}: every completion reached the host");
        for c in &got {
            assert!(sq.complete(c));
        }
        assert_status(&h.remove_io_cq(1).unwrap(), Status::SUCCESS, false);
    }
}

// ---- interrupts

#[test]
fn interrupts_one_per_cq_per_processing_pass() {
    let (mut h, _) = bare_host(NS_BYTES, 4);
    let mut cqs: Vec<CqRing> = (1..=3).map(|q| h.new_io_cq(q, 64, true, q).unwrap()).collect();
    let mut sqs: Vec<HostSq> = (1..=3).map(|q| h.new_io_sq(q, q, 64).unwrap()).collect();
    h.doorbell_buffer_config().unwrap();
    let buf = h.alloc.alloc_pages(1);
    let mut rng = Rng::new(50);
    for round in 0..30 {
        let counts: Vec<u64> = (1..=3).map(|v| h.irq.count(v)).collect();
        let n: Vec<u64> = (0..3).map(|_| rng.below(20)).collect();
        for q in 0..3 {
            for _ in 0..n[q] {
                let s = h.rw_sqe(READ, 1, 0, 1, (buf, 512));
                h.push_sqe(&mut sqs[q], s).unwrap();
            }
        }
        h.process();
        for q in 0..3 {
            let want = counts[q] + (n[q] > 0) as u64;
            assert_eq!(
                h.irq.count(q as u16 + 1),
                want,
                "round {round}: CQ {} got {} completions",
                q + 1,
                n[q]
            );
            let (got, _) = h.pop_cqes(&mut cqs[q], usize::MAX);
            assert_eq!(got.len() as u64, n[q]);
            for c in &got {
                assert!(sqs[q].complete(c));
            }
        }
    }
}

#[test]
fn interrupts_none_for_a_cq_with_ien_clear() {
    let (mut h, _) = bare_host(NS_BYTES, 2);
    let mut quiet = h.new_io_cq(1, 8, false, 0).unwrap();
    let mut sq = h.new_io_sq(1, 1, 32).unwrap();
    let mut loud = h.new_io_cq(2, 8, true, 2).unwrap();
    let mut sq2 = h.new_io_sq(2, 2, 32).unwrap();
    h.doorbell_buffer_config().unwrap();
    let buf = h.alloc.alloc_pages(1);
    let total_before = h.irq.total();
    let admin_before = h.irq.count(0);
    // Overflow the quiet CQ too: draining it must not raise interrupts either.
    let mut done = 0;
    for i in 0..30 {
        let s = h.rw_sqe(READ, 1, i, 1, (buf, 512));
        h.push_sqe(&mut sq, s).unwrap();
    }
    while done < 30 {
        h.process();
        let (got, _) = h.pop_cqes(&mut quiet, usize::MAX);
        for c in &got {
            assert!(sq.complete(c));
        }
        done += got.len();
    }
    assert_eq!(h.irq.total(), total_before, "IEN = 0: no interrupt on any vector");
    let s = h.rw_sqe(READ, 1, 0, 1, (buf, 512));
    h.push_sqe(&mut sq2, s).unwrap();
    h.process();
    assert_eq!(h.irq.count(2), 1);
    let (got, _) = h.pop_cqes(&mut loud, usize::MAX);
    assert!(sq2.complete(&got[0]));
    assert_eq!(h.irq.count(0), admin_before);
}
