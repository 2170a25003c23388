//! Whether the cluster answers. An RBD image has no connection of its own to lose
//! (librados reconnects and retries by itself, for as long as the hold), so an
//! outage shows as time: a queue with requests at librbd and no answer for
//! [`STALL`] is waiting for the cluster; a request that fails Not Ready (librados
//! gave up when the hold ran out) makes the storage gone until one succeeds. What
//! the queues see goes into the image's [`StorageTracker`]; the report adds the
//! stalls going on now.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use block_backend::{StorageReport, StorageState, StorageTracker};

/// How long a queue's requests may go unanswered before it counts as waiting.
pub(crate) const STALL: Duration = Duration::from_secs(1);

/// What an image's queues saw of the cluster.
#[derive(Debug)]
pub(crate) struct Liveness {
    tracker: StorageTracker,
    queues: Mutex<Vec<Weak<Progress>>>,
    epoch: Instant,
    /// A queue closed while its last answer was Not Ready: closing the image will
    /// wait for the cluster too.
    closed_gone: AtomicBool,
}

/// One queue's requests at librbd, and when it last heard from the cluster (ns
/// since the epoch: the last answer, or the request that made it busy).
#[derive(Debug, Default)]
struct Progress {
    outstanding: AtomicU64,
    last_ns: AtomicU64,
}

/// A queue's side: its progress, and whether its last answer was Not Ready.
#[derive(Debug)]
pub(crate) struct Watch {
    live: Arc<Liveness>,
    progress: Arc<Progress>,
    gone: bool,
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness {
            tracker: StorageTracker::default(),
            queues: Mutex::new(Vec::new()),
            epoch: Instant::now(),
            closed_gone: AtomicBool::new(false),
        }
    }
}

impl Liveness {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// A queue's watch.
    pub(crate) fn watch(self: &Arc<Self>) -> Watch {
        let progress = Arc::new(Progress::default());
        let mut qs = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        qs.retain(|w| w.strong_count() > 0);
        qs.push(Arc::downgrade(&progress));
        Watch { live: self.clone(), progress, gone: false }
    }

    /// Whether a queue closed with the cluster gone (its last answer Not Ready).
    pub(crate) fn closed_gone(&self) -> bool {
        self.closed_gone.load(Ordering::Relaxed)
    }

    /// The storage report: what the queues recorded, and the stalls going on now.
    pub(crate) fn report(&self) -> StorageReport {
        let mut r = self.tracker.report();
        let now = self.now_ns();
        let qs = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        for p in qs.iter().filter_map(Weak::upgrade) {
            let n = p.outstanding.load(Ordering::Relaxed);
            if n > 0 && now.saturating_sub(p.last_ns.load(Ordering::Relaxed)) >= STALL.as_nanos() as u64 {
                r.waiting += n;
                if r.state == StorageState::Up {
                    r.state = StorageState::Waiting;
                }
            }
        }
        r
    }
}

impl Watch {
    /// A request went to librbd.
    pub(crate) fn sent(&self) {
        if self.progress.outstanding.fetch_add(1, Ordering::Relaxed) == 0 {
            self.progress.last_ns.store(self.live.now_ns(), Ordering::Relaxed);
        }
    }

    /// librbd answered a request: Not Ready (the hold ran out) or anything else.
    pub(crate) fn answered(&mut self, not_ready: bool) {
        let now = self.live.now_ns();
        let gap =
            Duration::from_nanos(now.saturating_sub(self.progress.last_ns.swap(now, Ordering::Relaxed)));
        let _ = self
            .progress
            .outstanding
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        let t = &self.live.tracker;
        match (not_ready, self.gone) {
            (true, false) => {
                t.lost();
                t.gave_up(gap);
                self.gone = true;
            }
            (true, true) => {}
            (false, true) => {
                t.revived();
                self.gone = false;
            }
            (false, false) if gap >= STALL => {
                // A stall that ended: the cluster answered again.
                t.lost();
                t.back(gap);
            }
            (false, false) => {}
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if self.gone {
            self.live.closed_gone.store(true, Ordering::Relaxed);
        }
        self.live.tracker.closed(if self.gone { StorageState::Gone } else { StorageState::Up });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stalls_and_failures_past_the_hold_are_outages() {
        // An epoch 10 s back, so a stall can be set up by moving `last_ns` back.
        let epoch = Instant::now().checked_sub(Duration::from_secs(10)).expect("10 s of uptime");
        let live = Arc::new(Liveness { epoch, ..Liveness::default() });
        let mut w = live.watch();
        assert_eq!(live.report().state, StorageState::Up);
        w.sent();
        w.sent();
        // Answered within the stall bound: no outage.
        w.answered(false);
        assert_eq!(live.report().outages, 0);
        // No answer for longer than the bound: waiting, both requests counted.
        w.sent();
        w.progress.last_ns.store(0, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(5));
        let stalled_since = live.now_ns();
        w.progress
            .last_ns
            .store(stalled_since.saturating_sub(STALL.as_nanos() as u64 + 1), Ordering::Relaxed);
        let r = live.report();
        assert_eq!((r.state, r.waiting), (StorageState::Waiting, 2), "{r:?}");
        // The cluster answers: one outage of more than the bound, up again.
        w.answered(false);
        let r = live.report();
        assert_eq!((r.state, r.outages, r.outages_past_hold), (StorageState::Up, 1, 0), "{r:?}");
        assert!(r.outage_ms_sum >= STALL.as_millis() as u64);
        // librados gives up (Not Ready): gone until a request succeeds.
        w.answered(true);
        assert_eq!(live.report().state, StorageState::Gone);
        assert_eq!(live.report().outages_past_hold, 1);
        w.sent();
        w.answered(false);
        assert_eq!(live.report().state, StorageState::Up);
        drop(w);
        assert_eq!(live.report().state, StorageState::Up);
        assert!(!live.closed_gone(), "closed with the cluster answering");
        let mut w = live.watch();
        w.sent();
        w.answered(true);
        drop(w);
        assert!(live.closed_gone(), "closed after a Not Ready answer");
    }
}
