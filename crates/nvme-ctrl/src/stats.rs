//! Counters the controller keeps: what the benchmarks and the guest tests read to
//! show shadow doorbells at work.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters, shared with whoever wants to read them (Relaxed: they are statistics).
#[derive(Debug, Default)]
pub struct Stats {
    /// Doorbell register writes that reached the controller (trapped MMIO writes).
    pub doorbell_writes: AtomicU64,
    /// Trapped doorbell writes to I/O queues only.
    pub io_doorbell_writes: AtomicU64,
    /// Of those, writes to I/O completion queue head doorbells. With shadow doorbells
    /// the controller keeps CQ EventIdx one entry behind the head, so a host following
    /// the EventIdx rule writes these about once per queue wrap.
    pub io_cq_doorbell_writes: AtomicU64,
    /// Interrupts signalled.
    pub interrupts: AtomicU64,
    /// Admin commands completed.
    pub admin_commands: AtomicU64,
    /// I/O commands completed.
    pub io_commands: AtomicU64,
    /// Shadow doorbell reads.
    pub shadow_reads: AtomicU64,
    /// EventIdx re-arms that found new work after the fence (the race the re-read closes).
    pub eventidx_races: AtomicU64,
    /// Commands that completed with an error status.
    pub errors: AtomicU64,
    /// Read commands completed.
    pub read_commands: AtomicU64,
    /// Write commands completed.
    pub write_commands: AtomicU64,
    /// Commands that failed with a media error.
    pub media_errors: AtomicU64,
    /// Backend requests that failed (any reason).
    pub backend_errors: AtomicU64,
    /// Commands completed with an error because their backend did not answer in time
    /// (the namespace's timeout, or the bound on a queue's teardown).
    pub timeouts: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
}

/// A plain copy of [`Stats`] at one moment (serialised with the counters' names as
/// keys: the stats file and the control socket show it so).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StatsSnapshot {
    pub doorbell_writes: u64,
    pub io_doorbell_writes: u64,
    pub io_cq_doorbell_writes: u64,
    pub interrupts: u64,
    pub admin_commands: u64,
    pub io_commands: u64,
    pub shadow_reads: u64,
    pub eventidx_races: u64,
    pub errors: u64,
    pub read_commands: u64,
    pub write_commands: u64,
    pub media_errors: u64,
    pub backend_errors: u64,
    pub timeouts: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

impl Stats {
    pub fn snapshot(&self) -> StatsSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            doorbell_writes: g(&self.doorbell_writes),
            io_doorbell_writes: g(&self.io_doorbell_writes),
            io_cq_doorbell_writes: g(&self.io_cq_doorbell_writes),
            interrupts: g(&self.interrupts),
            admin_commands: g(&self.admin_commands),
            io_commands: g(&self.io_commands),
            shadow_reads: g(&self.shadow_reads),
            eventidx_races: g(&self.eventidx_races),
            errors: g(&self.errors),
            read_commands: g(&self.read_commands),
            write_commands: g(&self.write_commands),
            media_errors: g(&self.media_errors),
            backend_errors: g(&self.backend_errors),
            timeouts: g(&self.timeouts),
            bytes_read: g(&self.bytes_read),
            bytes_written: g(&self.bytes_written),
        }
    }

    /// Sets every counter to a saved value (a restored controller).
    pub(crate) fn restore(&self, s: &StatsSaved) {
        let set = |c: &AtomicU64, v: u64| c.store(v, Ordering::Relaxed);
        set(&self.doorbell_writes, s.doorbell_writes);
        set(&self.io_doorbell_writes, s.io_doorbell_writes);
        set(&self.io_cq_doorbell_writes, s.io_cq_doorbell_writes);
        set(&self.interrupts, s.interrupts);
        set(&self.admin_commands, s.admin_commands);
        set(&self.io_commands, s.io_commands);
        set(&self.shadow_reads, s.shadow_reads);
        set(&self.eventidx_races, s.eventidx_races);
        set(&self.errors, s.errors);
        set(&self.read_commands, s.read_commands);
        set(&self.write_commands, s.write_commands);
        set(&self.media_errors, s.media_errors);
        set(&self.backend_errors, s.backend_errors);
        set(&self.timeouts, s.timeouts);
        set(&self.bytes_read, s.bytes_read);
        set(&self.bytes_written, s.bytes_written);
    }

    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

impl std::ops::Sub for StatsSnapshot {
    type Output = StatsSnapshot;
    fn sub(self, o: StatsSnapshot) -> StatsSnapshot {
        StatsSnapshot {
            doorbell_writes: self.doorbell_writes - o.doorbell_writes,
            io_doorbell_writes: self.io_doorbell_writes - o.io_doorbell_writes,
            io_cq_doorbell_writes: self.io_cq_doorbell_writes - o.io_cq_doorbell_writes,
            interrupts: self.interrupts - o.interrupts,
            admin_commands: self.admin_commands - o.admin_commands,
            io_commands: self.io_commands - o.io_commands,
            shadow_reads: self.shadow_reads - o.shadow_reads,
            eventidx_races: self.eventidx_races - o.eventidx_races,
            errors: self.errors - o.errors,
            read_commands: self.read_commands - o.read_commands,
            write_commands: self.write_commands - o.write_commands,
            media_errors: self.media_errors - o.media_errors,
            backend_errors: self.backend_errors - o.backend_errors,
            timeouts: self.timeouts - o.timeouts,
            bytes_read: self.bytes_read - o.bytes_read,
            bytes_written: self.bytes_written - o.bytes_written,
        }
    }
}

/// Upper bounds, in nanoseconds, of the command latency histogram's buckets (10 µs to
/// 10 s, 1-2.5-5 steps); a last bucket holds everything above.
pub const LATENCY_BOUNDS_NS: [u64; 19] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// Buckets of the latency histogram: one per bound and one above.
pub const LATENCY_BUCKETS: usize = LATENCY_BOUNDS_NS.len() + 1;

/// The kinds of command a namespace counts apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpClass {
    Read,
    Write,
    Flush,
    /// Everything else (Write Zeroes, Dataset Management, Compare, Verify).
    Other,
}

impl OpClass {
    /// How a namespace counts an I/O command of `opcode`.
    #[inline]
    pub(crate) fn of(opcode: u8) -> Self {
        use nvme_spec::opcode::nvm as op;
        match opcode {
            op::READ => OpClass::Read,
            op::WRITE => OpClass::Write,
            op::FLUSH => OpClass::Flush,
            _ => OpClass::Other,
        }
    }
}

/// Counters of one kind of command on one namespace. Several engines complete
/// commands of one namespace, so they are shared atomics; each kind has its own
/// cache line, so readers and writers of different kinds do not collide.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct OpStats {
    pub commands: AtomicU64,
    pub bytes: AtomicU64,
    /// Commands completed with an error status.
    pub errors: AtomicU64,
    /// From fetch to completion posted, per bucket of [`LATENCY_BOUNDS_NS`].
    pub latency: [AtomicU64; LATENCY_BUCKETS],
    pub latency_sum_ns: AtomicU64,
}

/// A copy of [`OpStats`]; `latency` per bucket (not cumulative).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OpSnapshot {
    pub commands: u64,
    pub bytes: u64,
    pub errors: u64,
    pub latency: [u64; LATENCY_BUCKETS],
    pub latency_sum_ns: u64,
}

impl OpStats {
    /// Counts one command that moved `bytes` and took `latency_ns`.
    pub(crate) fn record(&self, bytes: u64, latency_ns: u64, ok: bool) {
        self.commands.fetch_add(1, Ordering::Relaxed);
        if bytes > 0 {
            self.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        if !ok {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        let b = LATENCY_BOUNDS_NS.partition_point(|&bound| bound < latency_ns);
        self.latency[b].fetch_add(1, Ordering::Relaxed);
        self.latency_sum_ns.fetch_add(latency_ns, Ordering::Relaxed);
    }

    /// Sets every counter to a saved value (a restored controller).
    pub(crate) fn restore(&self, s: &OpSnapshot) {
        let set = |c: &AtomicU64, v: u64| c.store(v, Ordering::Relaxed);
        set(&self.commands, s.commands);
        set(&self.bytes, s.bytes);
        set(&self.errors, s.errors);
        self.latency.iter().zip(s.latency).for_each(|(c, v)| set(c, v));
        set(&self.latency_sum_ns, s.latency_sum_ns);
    }

    pub fn snapshot(&self) -> OpSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        OpSnapshot {
            commands: g(&self.commands),
            bytes: g(&self.bytes),
            errors: g(&self.errors),
            latency: std::array::from_fn(|i| g(&self.latency[i])),
            latency_sum_ns: g(&self.latency_sum_ns),
        }
    }
}

/// What one namespace counts: commands, bytes, errors and latency by kind, and the
/// time its commands spent held back by QoS.
#[derive(Debug, Default)]
pub struct NsStats {
    pub read: OpStats,
    pub write: OpStats,
    pub flush: OpStats,
    pub other: OpStats,
    /// Commands QoS held back, and the nanoseconds they waited in all.
    pub throttled_commands: AtomicU64,
    pub throttled_ns: AtomicU64,
}

impl NsStats {
    pub(crate) fn of(&self, class: OpClass) -> &OpStats {
        match class {
            OpClass::Read => &self.read,
            OpClass::Write => &self.write,
            OpClass::Flush => &self.flush,
            OpClass::Other => &self.other,
        }
    }

    /// Sets every counter to a saved value (a restored controller).
    pub(crate) fn restore(&self, s: &NsStatsSnapshot) {
        self.read.restore(&s.read);
        self.write.restore(&s.write);
        self.flush.restore(&s.flush);
        self.other.restore(&s.other);
        self.throttled_commands.store(s.throttled_commands, Ordering::Relaxed);
        self.throttled_ns.store(s.throttled_ns, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> NsStatsSnapshot {
        NsStatsSnapshot {
            read: self.read.snapshot(),
            write: self.write.snapshot(),
            flush: self.flush.snapshot(),
            other: self.other.snapshot(),
            throttled_commands: self.throttled_commands.load(Ordering::Relaxed),
            throttled_ns: self.throttled_ns.load(Ordering::Relaxed),
        }
    }
}

/// A copy of [`NsStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NsStatsSnapshot {
    pub read: OpSnapshot,
    pub write: OpSnapshot,
    pub flush: OpSnapshot,
    pub other: OpSnapshot,
    pub throttled_commands: u64,
    pub throttled_ns: u64,
}

/// What one I/O queue pair counts. Only the engine that owns the queue writes them
/// (a load and a store, no read-modify-write); anyone may read.
#[derive(Debug, Default)]
pub struct QueueStats {
    /// Commands fetched from the SQ.
    pub commands: AtomicU64,
    /// Trapped writes of the SQ tail and of the CQ head doorbell registers.
    pub sq_doorbell_writes: AtomicU64,
    pub cq_doorbell_writes: AtomicU64,
    /// Completions posted to the CQ, and interrupts signalled for it.
    pub completions: AtomicU64,
    pub interrupts: AtomicU64,
}

/// A copy of [`QueueStats`] with the queue it belongs to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueueSnapshot {
    pub qid: u16,
    /// The worker that owns the queue (None: the controller's own thread).
    pub worker: Option<usize>,
    pub commands: u64,
    pub sq_doorbell_writes: u64,
    pub cq_doorbell_writes: u64,
    pub completions: u64,
    pub interrupts: u64,
}

impl QueueStats {
    /// Adds `n` to a counter only its owner writes.
    pub(crate) fn bump(c: &AtomicU64, n: u64) {
        c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    /// Sets every counter to a saved value (a restored controller).
    pub(crate) fn restore(&self, s: &QueueSnapshot) {
        let set = |c: &AtomicU64, v: u64| c.store(v, Ordering::Relaxed);
        set(&self.commands, s.commands);
        set(&self.sq_doorbell_writes, s.sq_doorbell_writes);
        set(&self.cq_doorbell_writes, s.cq_doorbell_writes);
        set(&self.completions, s.completions);
        set(&self.interrupts, s.interrupts);
    }

    pub fn snapshot(&self, qid: u16, worker: Option<usize>) -> QueueSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        QueueSnapshot {
            qid,
            worker,
            commands: g(&self.commands),
            sq_doorbell_writes: g(&self.sq_doorbell_writes),
            cq_doorbell_writes: g(&self.cq_doorbell_writes),
            completions: g(&self.completions),
            interrupts: g(&self.interrupts),
        }
    }
}

/// The counters' part of a saved controller state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsSaved {
    pub doorbell_writes: u64,
    pub io_doorbell_writes: u64,
    pub io_cq_doorbell_writes: u64,
    pub interrupts: u64,
    pub admin_commands: u64,
    pub io_commands: u64,
    pub shadow_reads: u64,
    pub eventidx_races: u64,
    pub errors: u64,
    pub read_commands: u64,
    pub write_commands: u64,
    pub media_errors: u64,
    pub backend_errors: u64,
    pub timeouts: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

impl From<StatsSnapshot> for StatsSaved {
    fn from(s: StatsSnapshot) -> Self {
        StatsSaved {
            doorbell_writes: s.doorbell_writes,
            io_doorbell_writes: s.io_doorbell_writes,
            io_cq_doorbell_writes: s.io_cq_doorbell_writes,
            interrupts: s.interrupts,
            admin_commands: s.admin_commands,
            io_commands: s.io_commands,
            shadow_reads: s.shadow_reads,
            eventidx_races: s.eventidx_races,
            errors: s.errors,
            read_commands: s.read_commands,
            write_commands: s.write_commands,
            media_errors: s.media_errors,
            backend_errors: s.backend_errors,
            timeouts: s.timeouts,
            bytes_read: s.bytes_read,
            bytes_written: s.bytes_written,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_lands_in_the_bucket_its_bound_names() {
        let s = OpStats::default();
        for ns in [0, 10_000, 10_001, 999_999, 10_000_000_000, 10_000_000_001, u64::MAX / 2] {
            s.record(4096, ns, true);
        }
        let snap = s.snapshot();
        assert_eq!(snap.latency[0], 2, "<= 10 µs");
        assert_eq!(snap.latency[1], 1, "10 µs < x <= 25 µs");
        assert_eq!(snap.latency[6], 1, "500 µs < x <= 1 ms");
        assert_eq!(snap.latency[18], 1, "<= 10 s");
        assert_eq!(snap.latency[19], 2, "above");
        assert_eq!((snap.commands, snap.bytes, snap.errors), (7, 7 * 4096, 0));
    }
}
