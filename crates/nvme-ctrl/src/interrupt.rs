//! Interrupt delivery and coalescing (Base §5.1.25.1.8, §5.1.25.1.9).
//!
//! The controller only says "signal vector N"; the transport owns MSI-X table masking,
//! pending bits and the eventfd (KVM irqfd) behind each vector.

use std::fmt::Debug;
use std::time::Instant;

/// Where interrupts go. Implemented by each transport.
pub trait InterruptSink: Send + Sync + Debug {
    /// Signals MSI-X vector `vector` (or the single MSI/INTx interrupt, which the
    /// transport maps from any vector).
    fn signal(&self, vector: u16);
}

/// Monotonic time, injectable so tests can drive coalescing timers by hand.
pub trait Clock: Send + Sync + Debug {
    /// Nanoseconds since an arbitrary fixed point.
    fn now_ns(&self) -> u64;
}

/// The host's monotonic clock.
#[derive(Debug)]
pub struct MonotonicClock(Instant);

impl Default for MonotonicClock {
    fn default() -> Self {
        MonotonicClock(Instant::now())
    }
}

impl MonotonicClock {
    /// A clock that reads `ns` now: a controller restored from saved state
    /// continues the saved one's time (`ControllerState::clock_ns`), so times kept
    /// relative to it (since reset, since creation) stay right.
    pub fn starting_at(ns: u64) -> Self {
        let now = Instant::now();
        MonotonicClock(now.checked_sub(std::time::Duration::from_nanos(ns)).unwrap_or(now))
    }
}

impl Clock for MonotonicClock {
    fn now_ns(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

/// Interrupt Coalescing state for one vector.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct VectorState {
    /// Completions posted since the last interrupt on this vector.
    pending: u32,
    /// When the oldest of those was posted.
    since_ns: u64,
    /// Interrupt Vector Configuration: Coalescing Disable.
    pub coalescing_disabled: bool,
}

/// Coalescing parameters (Interrupt Coalescing feature).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Coalescing {
    /// Aggregation Threshold, 0's based.
    pub thr_z: u8,
    /// Aggregation Time in 100 µs units; 0 means no delay, i.e. no coalescing.
    pub time: u8,
}

impl Coalescing {
    fn active(&self) -> bool {
        self.time != 0
    }
    fn deadline(&self, since_ns: u64) -> u64 {
        since_ns + self.time as u64 * 100_000
    }
}

impl VectorState {
    /// Records `n` new completions; returns true when the vector should fire now.
    /// The admin vector (0) is never coalesced (Base §5.1.25.1.8).
    pub fn post(&mut self, vector: u16, n: u32, c: Coalescing, now_ns: u64) -> bool {
        if self.pending == 0 {
            self.since_ns = now_ns;
        }
        self.pending += n;
        if vector == 0 || self.coalescing_disabled || !c.active() {
            return true;
        }
        self.pending > c.thr_z as u32 || now_ns >= c.deadline(self.since_ns)
    }

    /// True if a timer-driven interrupt is due.
    pub fn due(&self, c: Coalescing, now_ns: u64) -> bool {
        self.pending > 0 && now_ns >= c.deadline(self.since_ns)
    }

    /// When this vector must fire at the latest, if completions are waiting.
    pub fn deadline(&self, c: Coalescing) -> Option<u64> {
        (self.pending > 0).then(|| c.deadline(self.since_ns))
    }

    pub fn fired(&mut self) {
        self.pending = 0;
    }

    /// Clears what is pending; true if anything was (its interrupt is then due now).
    pub fn take_pending(&mut self) -> bool {
        std::mem::take(&mut self.pending) > 0
    }
}

/// An engine's interrupt side: one coalescing state per vector, and the CQs that
/// received completions since their last interrupt decision.
#[derive(Debug)]
pub(crate) struct Interrupts {
    vectors: Vec<VectorState>,
    /// CQs with completions posted since their last decision, each once.
    noted: Vec<u16>,
    /// Some vector holds coalesced completions: only then do the timers and the
    /// deadline look at the vectors.
    waiting: bool,
}

impl Interrupts {
    pub fn new(vectors: u16) -> Self {
        Interrupts {
            vectors: vec![VectorState::default(); vectors as usize],
            noted: Vec::new(),
            waiting: false,
        }
    }

    /// Back to power-on: nothing pending, no vector with coalescing disabled.
    pub fn reset(&mut self) {
        self.vectors.iter_mut().for_each(|v| *v = VectorState::default());
        self.noted.clear();
        self.waiting = false;
    }

    /// CQ `cqid` received its first completion since its last decision.
    #[inline]
    pub fn note(&mut self, cqid: u16) {
        self.noted.push(cqid);
    }

    pub fn set_coalescing_disabled(&mut self, iv: u16, disabled: bool) {
        if let Some(v) = self.vectors.get_mut(iv as usize) {
            v.coalescing_disabled = disabled;
        }
    }

    pub fn coalescing_disabled(&self, iv: u16) -> bool {
        self.vectors.get(iv as usize).is_some_and(|v| v.coalescing_disabled)
    }

    /// Decides each noted CQ's interrupt. `take(cqid)` hands over the CQ's
    /// completions not yet signalled and its vector (None: interrupts disabled), or
    /// None if there are none (the CQ was deleted since, or decided already);
    /// `fire(vector, cqid)` signals. `now` matters only to coalescing.
    #[inline]
    pub fn decide(
        &mut self,
        c: Coalescing,
        now: u64,
        mut take: impl FnMut(u16) -> Option<(u32, Option<u16>)>,
        mut fire: impl FnMut(u16, u16),
    ) {
        for &qid in &self.noted {
            let Some((n, Some(iv))) = take(qid) else { continue };
            if let Some(v) = self.vectors.get_mut(iv as usize) {
                if v.post(iv, n, c, now) {
                    v.fired();
                    fire(iv, qid);
                } else {
                    self.waiting = true;
                }
            }
        }
        self.noted.clear();
    }

    /// True while some CQ's decision is owed.
    #[inline]
    pub fn owed(&self) -> bool {
        !self.noted.is_empty()
    }

    /// Fires the coalesced interrupts whose aggregation time has passed.
    pub fn fire_due(&mut self, c: Coalescing, now: u64, mut fire: impl FnMut(u16)) {
        if !self.waiting {
            return;
        }
        let mut waiting = false;
        for (iv, v) in self.vectors.iter_mut().enumerate() {
            if v.due(c, now) {
                v.fired();
                fire(iv as u16);
            }
            waiting |= v.deadline(c).is_some();
        }
        self.waiting = waiting;
    }

    /// Fires every vector holding completions, due or not (a quiesce leaves none).
    pub fn flush(&mut self, mut fire: impl FnMut(u16)) {
        for (iv, v) in self.vectors.iter_mut().enumerate() {
            if v.take_pending() {
                fire(iv as u16);
            }
        }
        self.waiting = false;
    }

    /// When the earliest coalesced interrupt must fire.
    pub fn next_deadline(&self, c: Coalescing) -> Option<u64> {
        if !self.waiting {
            return None;
        }
        self.vectors.iter().filter_map(|v| v.deadline(c)).min()
    }

    /// Some vector holds coalesced completions.
    pub fn waiting(&self) -> bool {
        self.waiting
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_5_1_25_1_8_coalescing_threshold_and_time() {
        let c = Coalescing { thr_z: 3, time: 2 }; // 4 entries or 200 µs
        let mut v = VectorState::default();
        assert!(!v.post(1, 1, c, 0));
        assert!(!v.post(1, 2, c, 10));
        assert!(v.post(1, 1, c, 20), "4th completion reaches the threshold");
        v.fired();
        assert!(!v.post(1, 1, c, 1_000));
        assert_eq!(v.deadline(c), Some(201_000));
        assert!(!v.due(c, 200_999));
        assert!(v.due(c, 201_000));
    }

    #[test]
    fn admin_vector_and_disabled_vectors_are_not_coalesced() {
        let c = Coalescing { thr_z: 10, time: 10 };
        let mut v = VectorState::default();
        assert!(v.post(0, 1, c, 0));
        let mut v = VectorState { coalescing_disabled: true, ..Default::default() };
        assert!(v.post(5, 1, c, 0));
        let mut v = VectorState::default();
        assert!(v.post(5, 1, Coalescing { thr_z: 10, time: 0 }, 0), "time 0 means no delay");
    }
}
