//! The load: one thread per I/O queue, each owning its queue and keeping `qd`
//! commands in flight until the deadline, then the threads' results summed.

use std::time::Instant;

use nvme_driver::{IoCommand, IoQueue, QueueStats};
use test_kit::Rng;

use super::{Histogram, PerfArgs, Workload};

/// What one queue's thread did.
#[derive(Debug, Default)]
pub(super) struct ThreadResult {
    hist: Histogram,
    reads: u64,
    writes: u64,
    bytes: u64,
    errors: u64,
    first_error: Option<String>,
    stats: QueueStats,
}

fn drive(mut q: IoQueue, a: &PerfArgs, lba: u64, blocks: u64, deadline: Instant) -> (IoQueue, ThreadResult) {
    let mut r = ThreadResult::default();
    let nlb = (a.bs / lba) as u32;
    let slots = (blocks / nlb as u64).max(1);
    // Each queue works its own share of the namespace for sequential patterns.
    let share = (slots / a.queues as u64).max(1);
    let mut seq = (q.qid() as u64 - 1) * share;
    let mut rng = Rng::new((q.qid() as u64) << 32);
    let mut bufs = Vec::new();
    for _ in 0..a.qd {
        match q.alloc_buf(a.bs) {
            Ok(b) => {
                let _ = b.fill(0xa5);
                bufs.push(b);
            }
            Err(e) => {
                r.errors += 1;
                r.first_error = Some(e.to_string());
                return (q, r);
            }
        }
    }
    let mut started = vec![Instant::now(); q.depth() as usize + 1];
    let mut done = Vec::with_capacity(a.qd as usize);
    let mut inflight = 0usize;
    loop {
        let now = Instant::now();
        let stop = now >= deadline;
        while !stop && inflight < a.qd as usize {
            let Some(buf) = bufs.pop() else { break };
            let slot = if a.rw.random() {
                rng.below(slots)
            } else {
                seq = (seq + 1) % slots;
                seq
            };
            let slba = slot * nlb as u64;
            let read = match a.rw {
                Workload::RandRead | Workload::Read => true,
                Workload::RandWrite | Workload::Write => false,
                Workload::RandRw => rng.below(100) < a.mix as u64,
            };
            let cmd = if read {
                IoCommand::Read { nsid: a.nsid, slba, nlb, buf }
            } else {
                IoCommand::Write { nsid: a.nsid, slba, nlb, buf, fua: false }
            };
            let t0 = Instant::now();
            match q.submit(cmd) {
                Ok(cid) => {
                    started[cid as usize] = t0;
                    inflight += 1;
                }
                Err(e) => {
                    r.errors += 1;
                    r.first_error.get_or_insert(e.to_string());
                    break;
                }
            }
        }
        if inflight == 0 {
            break;
        }
        done.clear();
        if let Err(e) = q.wait_completions(&mut done) {
            r.errors += 1;
            r.first_error.get_or_insert(e.to_string());
            break;
        }
        let t1 = Instant::now();
        for c in done.drain(..) {
            inflight -= 1;
            r.hist.record((t1 - started[c.cid as usize]).as_nanos() as u64);
            if c.opcode == nvme_spec::opcode::nvm::READ {
                r.reads += 1;
            } else {
                r.writes += 1;
            }
            r.bytes += a.bs;
            let ok = c.status.is_success();
            if !ok {
                r.errors += 1;
                r.first_error.get_or_insert(format!("status {:?}", c.status));
            }
            if let Some(b) = c.buf {
                bufs.push(b);
            }
        }
    }
    r.stats = q.stats();
    (q, r)
}

/// Runs `drive` on every queue, each on its own thread (`perf-q<qid>`), until
/// `deadline`; hands back the queues with their results.
pub(super) fn run(
    queues: Vec<IoQueue>,
    a: &PerfArgs,
    lba: u64,
    blocks: u64,
    deadline: Instant,
) -> Vec<(IoQueue, ThreadResult)> {
    std::thread::scope(|s| {
        let hs: Vec<_> = queues
            .into_iter()
            .map(|q| {
                std::thread::Builder::new()
                    .name(format!("perf-q{}", q.qid()))
                    .spawn_scoped(s, move || drive(q, a, lba, blocks, deadline))
                    .expect("spawn perf thread")
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("perf thread")).collect()
    })
}

/// Every queue's results together.
#[derive(Debug, Default)]
pub(super) struct Totals {
    pub hist: Histogram,
    pub reads: u64,
    pub writes: u64,
    pub bytes: u64,
    pub errors: u64,
    /// The first error of the first queue that had one.
    pub first_error: Option<String>,
    pub sq_doorbell_writes: u64,
    pub cq_doorbell_writes: u64,
    pub interrupt_wakeups: u64,
}

impl Totals {
    /// Sums the threads' results; the queues come back to be returned to the driver.
    pub(super) fn sum(results: Vec<(IoQueue, ThreadResult)>) -> (Vec<IoQueue>, Totals) {
        let mut t = Totals::default();
        let mut queues = Vec::with_capacity(results.len());
        for (q, r) in results {
            t.hist.merge(&r.hist);
            t.reads += r.reads;
            t.writes += r.writes;
            t.bytes += r.bytes;
            t.errors += r.errors;
            t.first_error = t.first_error.or(r.first_error);
            t.sq_doorbell_writes += r.stats.sq_doorbell_writes;
            t.cq_doorbell_writes += r.stats.cq_doorbell_writes;
            t.interrupt_wakeups += r.stats.interrupt_wakeups;
            queues.push(q);
        }
        (queues, t)
    }

    pub(super) fn ios(&self) -> u64 {
        self.reads + self.writes
    }

    /// `n` per I/O (0 without I/O).
    pub(super) fn per_io(&self, n: u64) -> f64 {
        if self.ios() == 0 {
            0.0
        } else {
            n as f64 / self.ios() as f64
        }
    }
}
