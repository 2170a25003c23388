//! The load: one thread per I/O queue, each owning its queue and keeping `qd`
//! commands in flight until the deadline (or a signal, or an error such as the
//! controller's fatal status), then the threads' results summed.

use std::time::{Duration, Instant};

use super::args::PerfArgs;
use super::histogram::Histogram;
use super::knobs::Workload;
use nvme_driver::{IoCommand, IoQueue, QueueStats};

/// Where the random patterns go: xorshift64*, seeded per queue so two queues do not
/// walk the same blocks, and cheap enough not to show in a QD 1 run.
struct Offsets(u64);

impl Offsets {
    fn new(seed: u64) -> Self {
        // Zero is xorshift's fixed point: the low bit keeps the state off it.
        Offsets(seed ^ 0x9e37_79b9_7f4a_7c15 | 1)
    }

    /// Uniform enough in `0..n` (`n` > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

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
    /// --verify: reads checked, and mismatches among them.
    verified: u64,
    mismatches: u64,
    /// Blocks read back and checked at the end.
    read_back: u64,
}

/// --verify's bookkeeping for one queue's share of the namespace: each slot (one
/// `bs` block) by its index in the share.
struct Verify {
    /// The generation last written and acknowledged (0: not written this run, or a
    /// write failed: unknown).
    gens: Vec<u32>,
    /// A command is in flight (a read racing a write could see either).
    busy: Vec<bool>,
    lba: u64,
    scratch: Vec<u8>,
    /// What a read brought back (reused).
    got: Vec<u8>,
}

const MAGIC: &[u8; 8] = b"VNVMEVFY";

impl Verify {
    fn new(share: u64, lba: u64, bs: u64) -> Self {
        Verify {
            gens: vec![0; share as usize],
            busy: vec![false; share as usize],
            lba,
            scratch: vec![0; bs as usize],
            got: vec![0; bs as usize],
        }
    }

    /// The contents of `slba`'s block at generation `gen`.
    fn pattern(&mut self, slba: u64, gen: u32) -> &[u8] {
        for (i, unit) in self.scratch.chunks_mut(self.lba as usize).enumerate() {
            let lba = slba + i as u64;
            unit.fill((lba as u8) ^ (gen as u8) ^ 0x5a);
            unit[..8].copy_from_slice(MAGIC);
            unit[8..16].copy_from_slice(&lba.to_le_bytes());
            unit[16..20].copy_from_slice(&gen.to_le_bytes());
        }
        &self.scratch
    }

    /// Checks what a read of `slba` brought back against generation `gen`.
    fn check(&mut self, slba: u64, gen: u32, got: &[u8]) -> Result<(), String> {
        if got == self.pattern(slba, gen) {
            return Ok(());
        }
        let i = got
            .chunks(self.lba as usize)
            .zip(self.scratch.chunks(self.lba as usize))
            .position(|(a, b)| a != b);
        let i = i.unwrap_or(0);
        let unit = &got[i * self.lba as usize..][..20];
        let found = if &unit[..8] == MAGIC {
            format!(
                "LBA {} generation {}",
                u64::from_le_bytes(unit[8..16].try_into().expect("8")),
                u32::from_le_bytes(unit[16..20].try_into().expect("4"))
            )
        } else {
            format!("no header ({:02x?}...)", &unit[..8])
        };
        Err(format!("verify: LBA {} should hold generation {gen}, holds {found}", slba + i as u64))
    }
}

/// What a command in flight was, for --verify: (slot, generation, write).
type Pending = Option<(u64, u32, bool)>;

/// How long the commands in flight get to land after a signal stopped the load
/// (they take microseconds; a device that stopped answering is not waited for).
const DRAIN_AFTER_SIGNAL: Duration = Duration::from_secs(1);

/// Held (shared) by each queue thread for one round of submitting and reaping; a
/// migration takes it exclusively to pause them between rounds, as a VMM pauses
/// vCPUs, so nothing here writes DMA memory while the device moves.
pub(super) type Pause = std::sync::RwLock<()>;

fn drive(
    mut q: IoQueue,
    a: &PerfArgs,
    lba: u64,
    blocks: u64,
    deadline: Instant,
    pause: &Pause,
) -> (IoQueue, ThreadResult) {
    let mut r = ThreadResult::default();
    let nlb = (a.bs / lba) as u32;
    let slots = (blocks / nlb as u64).max(1);
    // Each queue works its own share of the namespace for sequential patterns.
    let share = (slots / a.queues as u64).max(1);
    let mut seq = (q.qid() as u64 - 1) * share;
    let mut rng = Offsets::new((q.qid() as u64) << 32);
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
    // --verify: queue i of n takes slots i, i + n, i + 2n, ...: no two queues share a block.
    let stride = a.queues as u64;
    let first = q.qid() as u64 - 1;
    let mine = slots.saturating_sub(first).div_ceil(stride).max(1);
    let mut verify = a.verify.then(|| Verify::new(mine, lba, a.bs));
    let mut pending: Vec<Pending> = vec![None; q.depth() as usize + 1];
    let mut done = Vec::with_capacity(a.qd as usize);
    let mut inflight = 0usize;
    let mut drain_until = None;
    loop {
        let _round = pause.read().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let signalled = super::interrupt::received().is_some();
        let stop = now >= deadline || signalled;
        while !stop && inflight < a.qd as usize {
            let Some(buf) = bufs.pop() else { break };
            let mut slot = if a.rw.random() {
                rng.below(slots)
            } else {
                seq = (seq + 1) % slots;
                seq
            };
            let read = match a.rw {
                Workload::RandRead | Workload::Read => true,
                Workload::RandWrite | Workload::Write => false,
                Workload::RandRw => rng.below(100) < a.mix as u64,
            };
            let mut tag = None;
            if let Some(v) = verify.as_mut() {
                // This queue's slots only; one with a write in flight is left alone.
                let mut i = (slot / stride) % mine;
                let mut tries = 0;
                while v.busy[i as usize] || i * stride + first >= slots {
                    i = (i + 1) % mine;
                    tries += 1;
                    if tries > mine {
                        break;
                    }
                }
                if tries > mine {
                    bufs.push(buf);
                    break;
                }
                slot = i * stride + first;
                let gen = if read { v.gens[i as usize] } else { v.gens[i as usize].wrapping_add(1).max(1) };
                v.busy[i as usize] = true;
                if !read {
                    let data = v.pattern(slot * nlb as u64, gen);
                    if let Err(e) = buf.write_at(0, data) {
                        r.errors += 1;
                        r.first_error.get_or_insert(e.to_string());
                    }
                }
                tag = Some((i, gen, !read));
            }
            let slba = slot * nlb as u64;
            let cmd = if read {
                IoCommand::Read { nsid: a.nsid, slba, nlb, buf }
            } else {
                IoCommand::Write { nsid: a.nsid, slba, nlb, buf, fua: false }
            };
            let t0 = Instant::now();
            match q.submit(cmd) {
                Ok(cid) => {
                    started[cid as usize] = t0;
                    pending[cid as usize] = tag;
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
        let reaped = if signalled {
            if now >= *drain_until.get_or_insert(now + DRAIN_AFTER_SIGNAL) {
                break;
            }
            q.poll_completions(&mut done)
        } else {
            q.wait_completions(&mut done)
        };
        if let Err(e) = reaped {
            r.errors += 1;
            r.first_error.get_or_insert(e.to_string());
            break;
        }
        if done.is_empty() {
            std::thread::yield_now();
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
                r.first_error.get_or_insert(c.status.to_string());
            }
            if let (Some(v), Some((i, gen, write))) = (verify.as_mut(), pending[c.cid as usize].take()) {
                let slba = (i * stride + first) * nlb as u64;
                v.busy[i as usize] = false;
                if write {
                    // A failed write leaves the block unknown.
                    v.gens[i as usize] = if ok { gen } else { 0 };
                } else if ok && gen > 0 {
                    r.verified += 1;
                    if let Some(b) = &c.buf {
                        check(v, &mut r, b, slba, gen);
                    }
                }
            }
            if let Some(b) = c.buf {
                bufs.push(b);
            }
        }
    }
    if let Some(v) = verify.as_mut() {
        if r.errors == 0 && super::interrupt::received().is_none() {
            read_back(&mut q, a, v, &mut r, |i| (i * stride + first) * nlb as u64);
        }
    }
    r.stats = q.stats();
    (q, r)
}

/// Checks a read's buffer against generation `gen` of block `slba`.
fn check(v: &mut Verify, r: &mut ThreadResult, b: &nvme_driver::DmaBuf, slba: u64, gen: u32) {
    let mut got = std::mem::take(&mut v.got);
    let res = b.read_at(0, &mut got).map_err(|e| e.to_string()).and_then(|()| v.check(slba, gen, &got));
    v.got = got;
    if let Err(e) = res {
        r.mismatches += 1;
        r.errors += 1;
        r.first_error.get_or_insert(e);
    }
}

/// --verify's last pass: reads every block written this run back and checks it
/// (`slba_of`: the first LBA of this queue's `i`-th slot).
fn read_back(
    q: &mut IoQueue,
    a: &PerfArgs,
    v: &mut Verify,
    r: &mut ThreadResult,
    slba_of: impl Fn(u64) -> u64,
) {
    let mut got = vec![0u8; a.bs as usize];
    for i in 0..v.gens.len() {
        let gen = v.gens[i];
        if gen == 0 {
            continue;
        }
        let slba = slba_of(i as u64);
        if let Err(e) = q.read(a.nsid, slba, &mut got) {
            r.errors += 1;
            r.first_error.get_or_insert(format!("verify read-back of LBA {slba}: {e}"));
            return;
        }
        r.read_back += 1;
        if let Err(e) = v.check(slba, gen, &got) {
            r.mismatches += 1;
            r.errors += 1;
            r.first_error.get_or_insert(e);
        }
    }
}

/// Runs `drive` on every queue, each on its own thread (`perf-q<qid>`), until
/// `deadline`; hands back the queues with their results.
pub(super) fn run(
    queues: Vec<IoQueue>,
    a: &PerfArgs,
    lba: u64,
    blocks: u64,
    deadline: Instant,
    pause: &Pause,
) -> Vec<(IoQueue, ThreadResult)> {
    std::thread::scope(|s| {
        let hs: Vec<_> = queues
            .into_iter()
            .map(|q| {
                std::thread::Builder::new()
                    .name(format!("perf-q{}", q.qid()))
                    .spawn_scoped(s, move || {
                        let r = drive(q, a, lba, blocks, deadline, pause);
                        super::measure::thread_finishing();
                        r
                    })
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
    /// --verify: reads checked during the run, blocks read back at the end, and
    /// mismatches (also counted in `errors`).
    pub verified: u64,
    pub read_back: u64,
    pub mismatches: u64,
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
            t.verified += r.verified;
            t.read_back += r.read_back;
            t.mismatches += r.mismatches;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_accepts_the_block_it_wrote_and_names_what_it_found_instead() {
        let mut v = Verify::new(4, 512, 4096);
        let good = v.pattern(80, 3).to_vec();
        assert!(v.check(80, 3, &good).is_ok());
        // An older generation, another block's data, a torn block, zeroes.
        let old = v.pattern(80, 2).to_vec();
        assert!(v.check(80, 3, &old).unwrap_err().contains("LBA 80 generation 2"));
        let other = v.pattern(160, 3).to_vec();
        assert!(v.check(80, 3, &other).unwrap_err().contains("holds LBA 160 generation 3"));
        let mut torn = good.clone();
        torn[512 * 5 + 100] ^= 1;
        assert!(v.check(80, 3, &torn).unwrap_err().contains("LBA 85 should hold"));
        assert!(v.check(80, 3, &[0u8; 4096]).unwrap_err().contains("no header"));
    }
}
