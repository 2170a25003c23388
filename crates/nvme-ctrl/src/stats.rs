//! Counters the controller keeps: what the benchmarks and the guest tests read to
//! show shadow doorbells at work.

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

/// A plain copy of [`Stats`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
