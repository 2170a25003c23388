//! What a backend whose storage can go away and come back (a network server, a
//! cluster) reports of it: whether it is there, how many commands wait for it, and
//! how long its outages lasted. The queues record what they see in a
//! [`StorageTracker`] their backend shares; [`Backend::storage`](crate::Backend::storage)
//! reads it as a [`StorageReport`] for metrics and the control socket.

use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (seconds) of the outage-duration buckets; the last bucket has none.
pub const OUTAGE_BOUNDS_S: [f64; 8] = [0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0];

/// Where a backend's storage is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StorageState {
    /// Reachable.
    #[default]
    Up,
    /// Lost: commands wait (the hold) while the backend gets it back.
    Waiting,
    /// Lost for longer than the hold: commands fail (Namespace Not Ready) until it
    /// is back.
    Gone,
}

impl StorageState {
    pub fn name(self) -> &'static str {
        match self {
            StorageState::Up => "up",
            StorageState::Waiting => "waiting",
            StorageState::Gone => "gone",
        }
    }
}

/// One look at a backend's storage.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StorageReport {
    /// The worst of its queues' states.
    pub state: StorageState,
    /// Commands waiting for the storage now.
    pub waiting: u64,
    /// Outages so far (a queue's connection lost), and those that outlasted the hold.
    pub outages: u64,
    pub outages_past_hold: u64,
    /// Outages by how long they lasted (until the storage was back, or the hold ran
    /// out): counts per bucket of [`OUTAGE_BOUNDS_S`] plus one past the last bound;
    /// and their sum.
    pub outage_buckets: [u64; OUTAGE_BOUNDS_S.len() + 1],
    pub outage_ms_sum: u64,
}

/// What a backend's queues record of its storage; shared by them, read by the
/// backend's [`Backend::storage`](crate::Backend::storage).
#[derive(Debug, Default)]
pub struct StorageTracker {
    queues_waiting: AtomicU32,
    queues_gone: AtomicU32,
    waiting: AtomicI64,
    outages: AtomicU64,
    outages_past_hold: AtomicU64,
    buckets: [AtomicU64; OUTAGE_BOUNDS_S.len() + 1],
    outage_ms_sum: AtomicU64,
}

impl StorageTracker {
    /// A queue lost its storage: its commands wait.
    pub fn lost(&self) {
        self.outages.fetch_add(1, Ordering::Relaxed);
        self.queues_waiting.fetch_add(1, Ordering::Relaxed);
    }

    /// A waiting queue has its storage back after `lasted`.
    pub fn back(&self, lasted: Duration) {
        self.queues_waiting.fetch_sub(1, Ordering::Relaxed);
        self.record(lasted);
    }

    /// A waiting queue's hold ran out after `lasted`: its commands fail until the
    /// storage is back ([`StorageTracker::revived`]).
    pub fn gave_up(&self, lasted: Duration) {
        self.queues_waiting.fetch_sub(1, Ordering::Relaxed);
        self.queues_gone.fetch_add(1, Ordering::Relaxed);
        self.outages_past_hold.fetch_add(1, Ordering::Relaxed);
        self.record(lasted);
    }

    /// A queue whose storage was gone has it back.
    pub fn revived(&self) {
        self.queues_gone.fetch_sub(1, Ordering::Relaxed);
    }

    /// A queue in `state` closed (its namespace removed, the server stopping): it
    /// no longer counts.
    pub fn closed(&self, state: StorageState) {
        match state {
            StorageState::Up => {}
            StorageState::Waiting => {
                self.queues_waiting.fetch_sub(1, Ordering::Relaxed);
            }
            StorageState::Gone => {
                self.queues_gone.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// `delta` more (or fewer) commands wait for the storage.
    pub fn waiting(&self, delta: i64) {
        self.waiting.fetch_add(delta, Ordering::Relaxed);
    }

    fn record(&self, lasted: Duration) {
        let s = lasted.as_secs_f64();
        let i = OUTAGE_BOUNDS_S.iter().position(|&b| s <= b).unwrap_or(OUTAGE_BOUNDS_S.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.outage_ms_sum.fetch_add(lasted.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn report(&self) -> StorageReport {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let state = if self.queues_gone.load(Ordering::Relaxed) > 0 {
            StorageState::Gone
        } else if self.queues_waiting.load(Ordering::Relaxed) > 0 {
            StorageState::Waiting
        } else {
            StorageState::Up
        };
        StorageReport {
            state,
            waiting: self.waiting.load(Ordering::Relaxed).max(0) as u64,
            outages: g(&self.outages),
            outages_past_hold: g(&self.outages_past_hold),
            outage_buckets: std::array::from_fn(|i| g(&self.buckets[i])),
            outage_ms_sum: g(&self.outage_ms_sum),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_follows_the_queues_through_an_outage() {
        let t = StorageTracker::default();
        assert_eq!(t.report(), StorageReport::default());
        t.lost();
        t.waiting(3);
        let r = t.report();
        assert_eq!((r.state, r.waiting, r.outages), (StorageState::Waiting, 3, 1));
        t.waiting(-3);
        t.back(Duration::from_millis(2100));
        let r = t.report();
        assert_eq!((r.state, r.waiting, r.outage_ms_sum), (StorageState::Up, 0, 2100));
        assert_eq!(r.outage_buckets[4], 1, "2.1 s falls in the (2, 5] s bucket");
        t.lost();
        t.gave_up(Duration::from_secs(25));
        let r = t.report();
        assert_eq!((r.state, r.outages, r.outages_past_hold), (StorageState::Gone, 2, 1));
        assert_eq!(r.outage_buckets[6], 1, "25 s falls in the (10, 30] s bucket");
        t.revived();
        assert_eq!(t.report().state, StorageState::Up);
    }
}
