//! Interrupt and clock doubles for the mock host.

use std::sync::atomic::{AtomicU64, Ordering};

use nvme_ctrl::{Clock, InterruptSink};

/// Counts interrupts per vector.
#[derive(Debug)]
pub struct CountingIrq {
    per_vector: Vec<AtomicU64>,
}

impl CountingIrq {
    pub fn new(vectors: u16) -> Self {
        CountingIrq { per_vector: (0..vectors).map(|_| AtomicU64::new(0)).collect() }
    }
    pub fn count(&self, vector: u16) -> u64 {
        self.per_vector.get(vector as usize).map_or(0, |c| c.load(Ordering::Relaxed))
    }
    pub fn total(&self) -> u64 {
        self.per_vector.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

impl InterruptSink for CountingIrq {
    fn signal(&self, vector: u16) {
        match self.per_vector.get(vector as usize) {
            Some(c) => {
                c.fetch_add(1, Ordering::Relaxed);
            }
            None => panic!("interrupt on vector {vector}, which does not exist"),
        }
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Default)]
pub struct ManualClock {
    ns: AtomicU64,
}

impl ManualClock {
    pub fn advance_us(&self, us: u64) {
        self.ns.fetch_add(us * 1000, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.ns.load(Ordering::Relaxed)
    }
}

/// A clock that moves a fixed step each time the controller reads it: its time is a
/// count of the controller's own steps, so a wait that ends at a deadline ends after
/// the same clock time on a fast machine and a loaded one, and a test checks a
/// bound on it without timing anything.
#[derive(Debug)]
pub struct SteppingClock {
    ns: AtomicU64,
    step_ns: u64,
}

impl SteppingClock {
    pub fn new(step: std::time::Duration) -> Self {
        SteppingClock { ns: AtomicU64::new(0), step_ns: step.as_nanos() as u64 }
    }

    /// The time now, without moving it.
    pub fn peek(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.ns.load(Ordering::Relaxed))
    }
}

impl Clock for SteppingClock {
    fn now_ns(&self) -> u64 {
        self.ns.fetch_add(self.step_ns, Ordering::Relaxed)
    }
}
