//! Quiesce, save and restore (`nvme_ctrl::state`): a workload run with the controller
//! replaced by a restored copy at random points ends exactly as the same workload run
//! without: the same completions on every queue, in order, with the same statuses
//! and read data, and the same blocks on the backend. The points fall anywhere:
//! mid-burst (commands submitted, doorbells rung, not yet fetched), with an
//! Asynchronous Event Request outstanding, with a CQ full and completions waiting
//! for room, with shadow doorbells and without. The state goes through its JSON form
//! each time, into a controller built from scratch.

use std::collections::BTreeMap;
use std::sync::Arc;

use block_backend::{Backend, RamBackend};
use nvme_ctrl::{Controller, ControllerConfig, ControllerState, NamespaceConfig, StateError, STATE_VERSION};
use nvme_spec::opcode::nvm as iop;
use nvme_spec::regs::DoorbellKind;
use nvme_spec::{Cqe, Status};
use test_kit::{HostSq, InitOptions, ManualClock, MockHost};
use test_util::{pattern, Rng};

const MEM: u64 = 64 << 20;
const NS_BYTES: u64 = 1 << 20;
const BLOCKS: u64 = NS_BYTES / 4096;

fn config(ram: &RamBackend) -> ControllerConfig {
    ControllerConfig {
        namespaces: vec![NamespaceConfig::new(Arc::new(ram.clone()) as Arc<dyn Backend>, 0)],
        ..Default::default()
    }
}

/// What a run ends with: completions per queue (cid, status, and for reads a
/// checksum of the data), and the backend's blocks.
#[derive(Debug, PartialEq)]
struct Outcome {
    completions: BTreeMap<u16, Vec<(u16, u16, u64)>>,
    aer_dw0: Vec<u32>,
    blocks: Vec<u8>,
}

fn sum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ x as u64).wrapping_mul(0x100_0000_01b3))
}

/// The restored controller: from the JSON of `ctrl`'s state, into a new controller
/// over the same memory, interrupts and backend, its clock continuing.
fn swap(h: &mut MockHost, ram: &RamBackend, clock: &Arc<ManualClock>) -> ControllerState {
    h.ctrl.quiesce(std::time::Duration::from_secs(5)).expect("quiesce");
    let saved = h.ctrl.save_state();
    let json = serde_json::to_string(&saved).expect("to JSON");
    let state: ControllerState = serde_json::from_str(&json).expect("from JSON");
    assert_eq!(state, saved, "the JSON round trip loses nothing");
    let mut fresh = Controller::with_clock(config(ram), h.mem.clone(), h.irq.clone(), clock.clone()).unwrap();
    fresh.restore_state(&state).expect("restore");
    // The old controller is dropped without a reset: nothing it does reaches the
    // guest any more.
    let old = std::mem::replace(&mut h.ctrl, fresh);
    std::mem::forget(old);
    state
}

/// Runs the workload of `seed`, replacing the controller at the steps in `swaps`.
/// What the swaps of a run caught the controller in the middle of.
#[derive(Debug, Default)]
struct Caught {
    swaps: usize,
    /// Submitted, doorbell rung or shadow slot written, not yet fetched.
    mid_burst: usize,
    /// A CQ full, completions waiting for room.
    cq_full: usize,
    /// An AER outstanding.
    aer: usize,
}

fn run(seed: u64, shadow: bool, swaps: &[usize]) -> (Outcome, Caught) {
    let ram = RamBackend::new(NS_BYTES);
    let clock = Arc::new(ManualClock::default());
    let mut h = MockHost::with_clock(config(&ram), MEM, clock.clone());
    h.init(InitOptions {
        io_queues: 3,
        queue_size: 16,
        admin_queue_size: 16,
        shadow_doorbells: shadow,
        interrupts: true,
    })
    .expect("bring-up");
    // A CQ of 4 entries fed by an SQ of 16 (qid 4): completions overflow and wait.
    let mut small_cq = h.new_io_cq(4, 4, true, 1).expect("CQ 4");
    let mut big_sq: HostSq = h.new_io_sq(4, 4, 16).expect("SQ 4");
    let aer = h.submit_aer();
    let mut rng = Rng::new(seed);
    let mut out = Outcome { completions: BTreeMap::new(), aer_dw0: Vec::new(), blocks: Vec::new() };
    // Read buffers by (qid, cid).
    let mut reads: BTreeMap<(u16, u16), (u64, u64)> = BTreeMap::new();
    let mut caught = Caught::default();
    let steps = 400;
    let record =
        |out: &mut Outcome, h: &MockHost, reads: &mut BTreeMap<(u16, u16), (u64, u64)>, qid: u16, c: &Cqe| {
            let data = reads.remove(&(qid, c.cid.get())).map_or(0, |(buf, len)| {
                let mut b = vec![0u8; len as usize];
                h.mem.read(buf, &mut b).unwrap();
                sum(&b)
            });
            out.completions.entry(qid).or_default().push((c.cid.get(), c.status().raw(), data));
        };
    for step in 0..steps {
        if swaps.contains(&step) {
            let s = swap(&mut h, &ram, &clock);
            assert_eq!(s.version, STATE_VERSION);
            caught.swaps += 1;
            let tails: Vec<(u16, u32)> = (1..=4u16)
                .filter_map(|q| {
                    let t = if shadow && q != 4 {
                        h.shadow_slot(q, DoorbellKind::SqTail)
                    } else {
                        s.sqs.iter().find(|x| x.qid == q).map(|x| x.tail)
                    };
                    t.map(|t| (q, t))
                })
                .collect();
            caught.mid_burst +=
                usize::from(tails.iter().any(|&(q, t)| s.sqs.iter().any(|x| x.qid == q && x.head != t)));
            caught.cq_full += usize::from(s.cqs.iter().any(|c| !c.overflow.is_empty()));
            caught.aer += usize::from(!s.admin.aers.is_empty());
        }
        match rng.below(10) {
            // A burst: submissions on a queue pair, not yet run.
            0..=3 => {
                let qid = 1 + rng.below(3) as u16;
                for _ in 0..rng.range(1, 6) {
                    let lba = rng.below(BLOCKS) * 8;
                    let buf = h.alloc.alloc_pages(1);
                    let sqe = if rng.chance(60) {
                        h.mem.write(buf, &pattern(seed ^ step as u64 ^ lba, 4096)).unwrap();
                        h.rw_sqe(iop::WRITE, 1, lba, 8, (buf, 4096))
                    } else {
                        h.rw_sqe(iop::READ, 1, lba, 8, (buf, 4096))
                    };
                    let read = sqe.opcode() == iop::READ;
                    match h.submit(qid, sqe) {
                        Some(cid) if read => {
                            reads.insert((qid, cid), (buf, 4096));
                        }
                        _ => {}
                    }
                }
            }
            // Writes to the SQ whose CQ is small.
            4 => {
                for _ in 0..rng.range(1, 8) {
                    if big_sq.is_full() {
                        break;
                    }
                    let lba = rng.below(BLOCKS) * 8;
                    let buf = h.alloc.alloc_pages(1);
                    h.mem.write(buf, &pattern(seed ^ 0x4444 ^ lba, 4096)).unwrap();
                    let sqe = h.rw_sqe(iop::WRITE, 1, lba, 8, (buf, 4096));
                    h.push_sqe(&mut big_sq, sqe);
                }
            }
            // The device runs.
            5..=6 => {
                h.process();
                clock.advance_us(rng.range(1, 200));
            }
            // The host reaps some completions of a pair.
            7 => {
                let qid = 1 + rng.below(3) as u16;
                let (cqes, _) = h.reap_some(qid, rng.range(1, 8) as usize);
                for c in &cqes {
                    record(&mut out, &h, &mut reads, qid, c);
                }
            }
            // ...or of the small CQ (room appears for the completions waiting).
            8 => {
                let (cqes, _) = h.pop_cqes(&mut small_cq, rng.range(1, 3) as usize);
                for c in &cqes {
                    assert!(big_sq.complete(c));
                    record(&mut out, &h, &mut reads, 4, c);
                }
            }
            // A flush.
            _ => {
                let qid = 1 + rng.below(3) as u16;
                let _ = h.submit(qid, test_kit::MockHost::lba_sqe(iop::FLUSH, 1, 0, 1));
            }
        }
    }
    // An event for the AER outstanding since the start: an invalid doorbell (a
    // queue that does not exist).
    h.ring(9, DoorbellKind::SqTail, 1);
    // Drain everything.
    for _ in 0..200 {
        h.process();
        for qid in 1..=3 {
            for c in h.reap_queue(qid) {
                record(&mut out, &h, &mut reads, qid, &c);
            }
        }
        let (cqes, _) = h.pop_cqes(&mut small_cq, 4);
        for c in &cqes {
            assert!(big_sq.complete(c));
            record(&mut out, &h, &mut reads, 4, c);
        }
    }
    for c in h.reap_queue(0) {
        if c.cid.get() == aer {
            out.aer_dw0.push(c.dw0.get());
        }
    }
    assert!(big_sq.in_flight.is_empty(), "SQ 4 has commands never completed: {:?}", big_sq.in_flight);
    for qid in 1..=3 {
        assert_eq!(h.outstanding(qid), 0, "queue {qid} has commands never completed");
    }
    let mut blocks = vec![0u8; NS_BYTES as usize];
    for (i, chunk) in blocks.chunks_mut(4096).enumerate() {
        let (st, c) = h.read_blocks(1, 1, i as u64 * 8, 8, 512);
        assert_eq!(st, Status::SUCCESS);
        chunk.copy_from_slice(&c);
    }
    out.blocks = blocks;
    (out, caught)
}

#[test]
fn restoring_at_random_points_changes_nothing_the_host_sees() {
    let mut all = Caught::default();
    for seed in 1..=12u64 {
        let shadow = seed % 2 == 0;
        let (plain, _) = run(seed, shadow, &[]);
        assert!(plain.completions.values().map(Vec::len).sum::<usize>() > 100, "a meaningful workload");
        assert_eq!(plain.aer_dw0.len(), 1, "the AER completed once the event came");
        let mut rng = Rng::new(seed * 7919);
        let swaps: Vec<usize> = (0..rng.range(3, 10)).map(|_| rng.below(400) as usize).collect();
        let (restored, c) = run(seed, shadow, &swaps);
        assert!(c.swaps > 0);
        all.swaps += c.swaps;
        all.mid_burst += c.mid_burst;
        all.cq_full += c.cq_full;
        all.aer += c.aer;
        assert_eq!(
            plain.completions, restored.completions,
            "seed {seed} (shadow {shadow}): completions differ"
        );
        assert_eq!(plain.aer_dw0, restored.aer_dw0, "seed {seed}: the AER's event differs");
        assert!(plain.blocks == restored.blocks, "seed {seed}: the backend's blocks differ");
    }
    eprintln!("{all:?}");
    assert!(all.mid_burst > 0 && all.cq_full > 0 && all.aer > 0, "the swaps caught every case: {all:?}");
}

#[test]
fn a_restore_checks_before_it_changes_anything() {
    let ram = RamBackend::new(NS_BYTES);
    let mut h = MockHost::new(config(&ram), MEM);
    h.init(InitOptions::default()).unwrap();
    h.ctrl.quiesce(std::time::Duration::from_secs(1)).unwrap();
    let good = h.ctrl.save_state();
    let fresh = || Controller::new(config(&ram), h.mem.clone(), h.irq.clone()).unwrap();
    let mut s = good.clone();
    s.version = STATE_VERSION + 1;
    assert_eq!(fresh().restore_state(&s), Err(StateError::Version(STATE_VERSION + 1)));
    let mut s = good.clone();
    s.namespaces[0].size *= 2;
    assert!(matches!(fresh().restore_state(&s), Err(StateError::Mismatch(_))));
    let mut s = good.clone();
    s.cqs[1].head = s.cqs[1].size;
    let mut c = fresh();
    assert!(matches!(c.restore_state(&s), Err(StateError::Mismatch(_))));
    // A restored controller that already has state refuses a second restore.
    let mut c = fresh();
    c.restore_state(&good).unwrap();
    assert!(matches!(c.restore_state(&good), Err(StateError::Mismatch(_))));
    // The original resumes and serves I/O.
    h.ctrl.resume();
    assert_eq!(h.write_blocks(1, 1, 0, 512, &pattern(5, 4096)), Status::SUCCESS);
}

/// issue 25.5: a restore is all or nothing. Each state here is a good one with one
/// field broken (queues, registers, shadow buffers, events, features), many of them
/// late in the state, after parts an eager restore would already have put in place.
/// Each is refused, naming what is wrong, and leaves the controller new: the good
/// state restores into the same controller afterwards, which then serves I/O.
#[test]
fn spec_restore_a_state_refused_for_any_field_leaves_the_controller_new() {
    type Mutation = (&'static str, fn(&mut ControllerState));
    let mutations: &[Mutation] = &[
        ("the last SQ posts to a CQ that is not there", |s| s.sqs.last_mut().unwrap().cqid = 9),
        ("the last CQ's head past its size", |s| {
            let c = s.cqs.last_mut().unwrap();
            c.head = c.size
        }),
        ("a CQ's waiting completion is not 16 bytes of hex", |s| {
            s.cqs.last_mut().unwrap().overflow.push("zz".into())
        }),
        ("a waiting completion with a character across a byte's two digits", |s| {
            s.cqs.last_mut().unwrap().overflow.push(format!("0\u{e9}{}", "0".repeat(29)))
        }),
        ("an error log entry with a character across a byte's two digits", |s| {
            s.events.errors.push(format!("0\u{e9}{}", "0".repeat(125)))
        }),
        ("more completions waiting than the SQs hold", |s| {
            let c = s.cqs.last_mut().unwrap();
            c.overflow = vec!["00".repeat(16); 5000]
        }),
        ("an SQ twice", |s| {
            let q = s.sqs.last().unwrap().clone();
            s.sqs.push(q)
        }),
        ("a CQ twice", |s| {
            let q = s.cqs.last().unwrap().clone();
            s.cqs.push(q)
        }),
        ("a queue beyond the controller's", |s| {
            let q = s.sqs.last_mut().unwrap();
            q.qid = 4000
        }),
        ("a queue beyond those granted", |s| s.admin.nsq_granted_z = 0),
        ("an I/O queue larger than CAP.MQES allows", |s| s.sqs.last_mut().unwrap().size = 70_000),
        ("a queue whose base is not page aligned", |s| s.cqs.last_mut().unwrap().base += 8),
        ("an admin SQ that is not the one AQA describes", |s| s.sqs[0].size += 1),
        ("ready with CC.EN clear", |s| s.regs.cc &= !1),
        ("reserved CSTS bits", |s| s.regs.csts |= 1 << 12),
        ("disabled, yet with queues", |s| {
            s.regs.lifecycle = "disabled".into();
            s.regs.cc &= !1;
            s.regs.csts = 0
        }),
        ("fatal without CSTS.CFS", |s| s.regs.lifecycle = "fatal".into()),
        ("a page size that is not CC.MPS's", |s| s.regs.page_size = 8192),
        ("a page size that is no page size", |s| s.regs.page_size = 12345),
        ("shadow buffers not page aligned", |s| s.shadow.as_mut().unwrap().eventidx += 4),
        ("one buffer for shadow doorbells and EventIdx", |s| {
            let b = s.shadow.as_mut().unwrap();
            b.eventidx = b.shadow
        }),
        ("more AERs than AERL allows", |s| s.admin.aers = (0..40).collect()),
        ("an AER's command identifier twice", |s| s.admin.aers = vec![5, 5]),
        ("more I/O queues granted than the controller has", |s| s.admin.ncq_granted_z = 60_000),
        ("a power state the controller does not have", |s| s.admin.features.power_management = 3),
        ("an event of no type", |s| s.events.queued.push(5)),
        ("an endless event queue", |s| s.events.queued = vec![0x0001_0002; 10_000]),
        ("more error log entries than the log holds", |s| s.events.errors = vec!["00".repeat(64); 65]),
        ("a changed namespace list out of order", |s| s.events.changed_ns = vec![1, 1]),
        ("a changed namespace that cannot exist", |s| s.events.changed_ns = vec![0]),
        ("an LBA format the namespace does not have", |s| s.namespaces[0].lba_format = 9),
        ("the next SQ is not there", |s| s.next_sq = Some(7)),
        ("a vector beyond the controller's", |s| s.cqs.last_mut().unwrap().iv = 5000),
        // Found by the state fuzzer (nvme-fuzz state.rs): each once overflowed.
        ("an SQ of no entries", |s| s.sqs.last_mut().unwrap().size = 0),
        ("every queue identifier granted", |s| s.admin.ncq_granted_z = u16::MAX),
        ("a timestamp past its 48 bits", |s| s.admin.timestamp_ms = Some(u64::MAX)),
    ];
    let ram = RamBackend::new(NS_BYTES);
    let mut h = MockHost::new(config(&ram), MEM);
    h.init(InitOptions { io_queues: 2, shadow_doorbells: true, ..Default::default() }).unwrap();
    h.submit_aer();
    h.process();
    h.ctrl.quiesce(std::time::Duration::from_secs(1)).unwrap();
    let good = h.ctrl.save_state();
    assert!(good.shadow.is_some() && good.sqs.len() == 3 && good.admin.aers.len() == 1, "{good:?}");
    let fresh = || Controller::new(config(&ram), h.mem.clone(), h.irq.clone()).unwrap();
    for (what, mutate) in mutations {
        let mut bad = good.clone();
        mutate(&mut bad);
        let mut c = fresh();
        match c.restore_state(&bad) {
            Err(StateError::Mismatch(_)) => {}
            other => panic!("{what}: {other:?}"),
        }
        c.restore_state(&good)
            .unwrap_or_else(|e| panic!("{what}: the refused restore left state behind: {e}"));
    }
    // The original resumes and serves I/O.
    h.ctrl.resume();
    assert_eq!(h.write_blocks(1, 1, 0, 512, &pattern(6, 4096)), Status::SUCCESS);
}

/// Base Error Information log: the Error Count never reads 0h; one restored at its
/// largest value goes on from 1h at the next error (an increment once overflowed).
#[test]
fn spec_error_count_goes_on_from_one_past_its_largest_value() {
    let ram = RamBackend::new(NS_BYTES);
    let mut h = MockHost::new(config(&ram), MEM);
    h.init(InitOptions::default()).unwrap();
    h.ctrl.quiesce(std::time::Duration::from_secs(1)).unwrap();
    let mut st = h.ctrl.save_state();
    st.events.error_count = u64::MAX;
    let mut c = Controller::new(config(&ram), h.mem.clone(), h.irq.clone()).unwrap();
    c.restore_state(&st).unwrap();
    h.ctrl = c;
    h.ctrl.resume();
    // A read of a namespace that does not exist: an error, logged.
    let buf = h.alloc.alloc_pages(1);
    let sqe = h.rw_sqe(iop::READ, 9, 0, 1, (buf, 512));
    h.submit(1, sqe).unwrap();
    h.process();
    let c = h.reap_queue(1);
    assert!(!c[0].status().is_success());
    let log = h.get_log(0x01, 0, 64, false).expect("error log");
    assert_eq!(u64::from_le_bytes(log[..8].try_into().unwrap()), 1, "the newest entry's Error Count");
}

/// Runs the device (its workers run by themselves) and reaps queues 1..=n until
/// every command submitted there has completed; returns the completions.
fn drain(h: &mut MockHost, n: u16) -> Vec<(u16, Cqe)> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut out = Vec::new();
    while (1..=n).any(|q| h.outstanding(q) > 0) {
        assert!(std::time::Instant::now() < deadline, "commands never completed");
        h.process();
        for q in 1..=n {
            out.extend(h.reap_queue(q).into_iter().map(|c| (q, c)));
        }
        std::thread::yield_now();
    }
    out
}

#[test]
fn state_moves_between_controllers_with_different_workers() {
    let ram = RamBackend::new(NS_BYTES);
    let mut h = MockHost::new(config(&ram), MEM);
    h.ctrl.spawn_workers(2, nvme_ctrl::PollMode::Off).unwrap();
    h.init(InitOptions { io_queues: 4, queue_size: 32, ..Default::default() }).unwrap();
    let mut rng = Rng::new(99);
    // Each queue writes its own stripe of blocks, so the final content is known.
    let mut expect: BTreeMap<u64, u64> = BTreeMap::new();
    for round in 0..8u64 {
        for q in 1..=4u16 {
            for _ in 0..rng.range(4, 20) {
                let block = rng.below(BLOCKS / 4) * 4 + q as u64 - 1;
                let buf = h.alloc.alloc_pages(1);
                h.mem.write(buf, &pattern(round << 32 | block, 4096)).unwrap();
                let sqe = h.rw_sqe(iop::WRITE, 1, block * 8, 8, (buf, 4096));
                h.submit(q, sqe).expect("room");
                expect.insert(block, round << 32 | block);
            }
        }
        // Mid-burst: some submitted commands may run, others not yet.
        h.process();
        // Into a controller with 0, 1 or 3 workers.
        let workers = [0, 1, 3][round as usize % 3];
        h.ctrl.quiesce(std::time::Duration::from_secs(5)).unwrap();
        let state = h.ctrl.save_state();
        let mut fresh = Controller::new(config(&ram), h.mem.clone(), h.irq.clone()).unwrap();
        fresh.spawn_workers(workers, nvme_ctrl::PollMode::Off).unwrap();
        fresh.restore_state(&state).unwrap();
        let old = std::mem::replace(&mut h.ctrl, fresh);
        std::mem::forget(old);
        for (q, c) in drain(&mut h, 4) {
            assert_eq!(c.status(), Status::SUCCESS, "queue {q}");
        }
    }
    for (&block, &seed) in &expect {
        let (st, data) = h.read_blocks(1, 1, block * 8, 8, 512);
        assert_eq!(st, Status::SUCCESS);
        assert!(data == pattern(seed, 4096), "block {block} holds something else");
    }
}

#[test]
fn a_quiesce_that_cannot_finish_gives_up_and_the_controller_goes_on() {
    use block_backend::{FaultBackend, FaultRule};
    let ram = RamBackend::new(NS_BYTES);
    let hung =
        FaultBackend::new(Arc::new(ram.clone()), vec!["read/hang/lba=0+8".parse::<FaultRule>().unwrap()]);
    let cfg = ControllerConfig {
        namespaces: vec![NamespaceConfig {
            timeout: None,
            ..NamespaceConfig::new(Arc::new(hung) as Arc<dyn Backend>, 0)
        }],
        ..Default::default()
    };
    // The bound runs on the controller's clock: here 1 ms per reading.
    let clock = Arc::new(test_kit::SteppingClock::new(std::time::Duration::from_millis(1)));
    let mut h = MockHost::with_clock(cfg, MEM, clock.clone());
    h.init(InitOptions::default()).unwrap();
    let buf = h.alloc.alloc_pages(1);
    let sqe = h.rw_sqe(iop::READ, 1, 0, 8, (buf, 4096));
    h.submit(1, sqe).unwrap();
    h.process();
    let bound = std::time::Duration::from_millis(300);
    let t0 = clock.peek();
    let r = test_util::bounded("quiesce", || h.ctrl.quiesce(bound));
    assert!(matches!(r, Err(StateError::Busy(_))), "{r:?}");
    let took = clock.peek() - t0;
    assert!(
        took >= bound && took < 2 * bound,
        "gave up after {took:?} of clock time, not at the {bound:?} bound"
    );
    assert!(!h.ctrl.is_quiesced(), "a failed quiesce resumes");
    // The controller serves other I/O as before.
    assert_eq!(h.write_blocks(2, 1, 64, 512, &pattern(1, 4096)), Status::SUCCESS);
    let (st, d) = h.read_blocks(2, 1, 64, 8, 512);
    assert_eq!((st, d == pattern(1, 4096)), (Status::SUCCESS, true));
}

/// A fatal controller (CSTS.CFS) fetches and posts nothing more, so a quiesce (a
/// migration's STOP, an upgrade) does not wait for what its backends still have in
/// flight: that waits for the reset its host owes it. (The fuzzer found a STOP that
/// held the server for the whole quiesce bound.)
#[test]
fn a_fatal_controller_quiesces_at_once_whatever_its_backends_hold() {
    use block_backend::{FaultBackend, FaultRule};
    let ram = RamBackend::new(NS_BYTES);
    let hung =
        FaultBackend::new(Arc::new(ram.clone()), vec!["read/hang/lba=0+8".parse::<FaultRule>().unwrap()]);
    let cfg = ControllerConfig {
        namespaces: vec![NamespaceConfig {
            timeout: None,
            ..NamespaceConfig::new(Arc::new(hung) as Arc<dyn Backend>, 0)
        }],
        ..Default::default()
    };
    let mut h = MockHost::new(cfg, MEM);
    h.init(InitOptions::default()).unwrap();
    let buf = h.alloc.alloc_pages(1);
    let sqe = h.rw_sqe(iop::READ, 1, 0, 8, (buf, 4096));
    h.submit(1, sqe).unwrap();
    h.process();
    // The guest's memory goes away under its queues: the next fetch is fatal.
    h.ctrl.set_memory(guest_mem::GuestMemory::empty());
    let sqe = h.rw_sqe(iop::READ, 1, 64, 8, (buf, 4096));
    h.submit(2, sqe).unwrap();
    h.process();
    assert!(h.csts().cfs(), "the controller is fatal");
    assert_eq!(h.ctrl.quiesce(std::time::Duration::from_secs(30)), Ok(()));
}

/// A migration's source whose worker polls leaves EventIdx behind the tail (the
/// host need not ring: the device looks on its own), and the state it saves says
/// so. The destination's worker is asleep when it resumes: it must publish its own
/// EventIdx first, or the host's next commands (shadow tail written, no doorbell, as
/// EventIdx says) would never be seen.
#[test]
fn a_resumed_controller_arms_eventidx_before_its_worker_sleeps() {
    let ram = RamBackend::new(NS_BYTES);
    let mut h = MockHost::new(config(&ram), MEM);
    h.ctrl.spawn_workers(1, nvme_ctrl::PollMode::Always).unwrap();
    h.init(InitOptions { io_queues: 1, queue_size: 32, shadow_doorbells: true, ..Default::default() })
        .unwrap();
    for _ in 0..3 {
        let buf = h.alloc.alloc_pages(1);
        let sqe = h.rw_sqe(iop::READ, 1, 0, 8, (buf, 4096));
        h.submit(1, sqe).expect("room");
        drain(&mut h, 1);
    }
    h.ctrl.quiesce(std::time::Duration::from_secs(5)).unwrap();
    let state = h.ctrl.save_state();
    let tail = h.shadow_slot(1, DoorbellKind::SqTail).unwrap();
    let mut fresh = Controller::new(config(&ram), h.mem.clone(), h.irq.clone()).unwrap();
    fresh.spawn_workers(1, nvme_ctrl::PollMode::Adaptive).unwrap();
    // The worker falls asleep (an idle destination), then the state arrives.
    std::thread::sleep(std::time::Duration::from_millis(50));
    fresh.restore_state(&state).unwrap();
    fresh.resume();
    let old = std::mem::replace(&mut h.ctrl, fresh);
    std::mem::forget(old);
    assert_eq!(h.eventidx_slot(1, DoorbellKind::SqTail), Some(tail), "armed at what it has consumed");
    let buf = h.alloc.alloc_pages(1);
    let sqe = h.rw_sqe(iop::READ, 1, 0, 8, (buf, 4096));
    h.submit(1, sqe).expect("room");
    for (_, c) in drain(&mut h, 1) {
        assert_eq!(c.status(), Status::SUCCESS);
    }
}
