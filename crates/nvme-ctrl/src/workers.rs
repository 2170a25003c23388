//! I/O worker threads. Each worker (`vnvme-q<N>`) owns one [`IoEngine`] and the queue
//! pairs assigned to it, and runs it without locks. Everything else reaches a worker
//! through its mailbox: trapped doorbell writes (cheap, fire and forget) and control
//! calls (a closure run on the worker's engine, with the caller waiting for the
//! result). A sleeping worker is woken through an eventfd.
//!
//! # Polling
//!
//! - [`PollMode::Off`]: when the engine finds no work it re-arms EventIdx (the host
//!   rings on its next submission) and sleeps until a doorbell, a control call or a
//!   coalescing timer wakes it.
//! - [`PollMode::Adaptive`]: after the last work it may keep polling with EventIdx
//!   left stale (so the host does not ring at all) before it re-arms and sleeps; the
//!   [`SpinPolicy`] decides how long, from the gaps between bursts of work and from
//!   whether spinning takes a CPU another thread wanted.
//! - [`PollMode::Always`]: never sleeps; EventIdx stays stale. For doorbell pages mapped
//!   into the guest, which produce no notification at all.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvme_spec::regs::DoorbellKind;
use tracing::{debug, warn};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::timerfd::TimerFd;

use crate::engine::IoEngine;

pub use crate::poll::PollMode;
use crate::poll::{PoliteSpin, SpinPolicy, SpinStats};

type Call = Box<dyn FnOnce(&mut IoEngine) + Send>;

enum Msg {
    Doorbell(u16, DoorbellKind, u32),
    Call(Call),
    Stop,
}

/// Per-worker counters, readable from any thread.
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Times the worker went to sleep.
    pub sleeps: AtomicU64,
    /// Wake-up eventfd writes (doorbells or calls that found it asleep).
    pub wakeups: AtomicU64,
    /// Spin phases that found new work before the budget ran out.
    pub spin_hits: AtomicU64,
    /// Spin phases that ran out.
    pub spin_misses: AtomicU64,
    /// Windows of spins during which other threads took too much of the worker's CPU.
    pub spin_contended: AtomicU64,
    /// Nanoseconds spent spinning.
    pub spin_ns: AtomicU64,
    /// Nanoseconds of those during which other threads had the worker's CPU.
    pub spin_lost_ns: AtomicU64,
}

struct Shared {
    wake: EventFd,
    sleeping: AtomicBool,
    /// Messages sent and not yet taken (so a worker about to sleep can see them).
    pending: AtomicUsize,
    stats: WorkerStats,
}

/// A handle to one worker thread.
pub struct Worker {
    tx: mpsc::Sender<Msg>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    pub index: usize,
    /// How the worker waits when idle.
    pub mode: PollMode,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("index", &self.index).finish_non_exhaustive()
    }
}

impl Worker {
    /// Starts a worker thread that owns `engine`.
    /// `kick`, if given, is an eventfd shared by all workers (watched edge-triggered,
    /// so one write wakes every worker and nobody needs to drain it).
    pub fn spawn(
        index: usize,
        engine: IoEngine,
        mode: PollMode,
        kick: Option<Arc<EventFd>>,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            wake: EventFd::new(EFD_NONBLOCK)?,
            sleeping: AtomicBool::new(false),
            pending: AtomicUsize::new(0),
            stats: WorkerStats::default(),
        });
        let (tx, rx) = mpsc::channel();
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("vnvme-q{index}"))
            .spawn(move || run(engine, rx, s, mode, kick))?;
        Ok(Worker { tx, shared, thread: Some(thread), index, mode })
    }

    fn send(&self, m: Msg) {
        self.shared.pending.fetch_add(1, Ordering::SeqCst);
        if self.tx.send(m).is_err() {
            self.shared.pending.fetch_sub(1, Ordering::SeqCst);
            warn!(worker = self.index, "worker is gone; message dropped");
            return;
        }
        // Pairs with the worker's SeqCst store of `sleeping` before its last check
        // of `pending`: either it sees our message, or we see it asleep and wake it.
        if self.shared.sleeping.load(Ordering::SeqCst) {
            self.shared.stats.wakeups.fetch_add(1, Ordering::Relaxed);
            let _ = self.shared.wake.write(1);
        }
    }

    /// A trapped doorbell write for one of this worker's queues.
    pub fn doorbell(&self, qid: u16, kind: DoorbellKind, value: u32) {
        self.send(Msg::Doorbell(qid, kind, value));
    }

    /// Runs `f` on the worker's engine and returns its result.
    pub fn call<R: Send + 'static>(&self, f: impl FnOnce(&mut IoEngine) -> R + Send + 'static) -> R {
        let (rtx, rrx) = mpsc::sync_channel(1);
        self.send(Msg::Call(Box::new(move |e| {
            let _ = rtx.send(f(e));
        })));
        rrx.recv().expect("worker thread died")
    }

    pub fn stats(&self) -> &WorkerStats {
        &self.shared.stats
    }

    /// One line for logs: how the worker waited.
    pub fn stats_line(&self) -> String {
        let s = &self.shared.stats;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let spins = SpinStats {
            hits: get(&s.spin_hits),
            misses: get(&s.spin_misses),
            contended: get(&s.spin_contended),
            spin_ns: get(&s.spin_ns),
            lost_ns: get(&s.spin_lost_ns),
        };
        format!(
            "worker {} (poll {:?}): slept {} times; {}",
            self.index,
            self.mode,
            get(&s.sleeps),
            spins.describe(self.mode)
        )
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Copies a policy's counters where other threads can read them.
fn publish(stats: &WorkerStats, p: &SpinPolicy) {
    stats.spin_hits.store(p.stats.hits, Ordering::Relaxed);
    stats.spin_misses.store(p.stats.misses, Ordering::Relaxed);
    stats.spin_contended.store(p.stats.contended, Ordering::Relaxed);
    stats.spin_ns.store(p.stats.spin_ns, Ordering::Relaxed);
    stats.spin_lost_ns.store(p.stats.lost_ns, Ordering::Relaxed);
}

fn run(
    mut engine: IoEngine,
    rx: mpsc::Receiver<Msg>,
    shared: Arc<Shared>,
    mode: PollMode,
    kick: Option<Arc<EventFd>>,
) {
    let epoll = match Epoll::new() {
        Ok(e) => e,
        Err(e) => {
            warn!("worker cannot create epoll: {e}");
            return;
        }
    };
    let mut timer = TimerFd::new().ok();
    let _ =
        epoll.ctl(ControlOperation::Add, shared.wake.as_raw_fd_compat(), EpollEvent::new(EventSet::IN, 0));
    if let Some(t) = &timer {
        let _ = epoll.ctl(ControlOperation::Add, t.as_raw_fd_compat(), EpollEvent::new(EventSet::IN, 1));
    }
    if let Some(k) = &kick {
        let ev = EpollEvent::new(EventSet::IN | EventSet::EDGE_TRIGGERED, 2);
        let _ = epoll.ctl(ControlOperation::Add, k.as_raw_fd_compat(), ev);
    }
    // Asynchronous backends (io_uring, nvme://) signal finished requests here.
    for (i, fd) in engine.backend_notifiers().into_iter().enumerate() {
        if let Err(e) = epoll.ctl(ControlOperation::Add, fd, EpollEvent::new(EventSet::IN, 3 + i as u64)) {
            warn!("worker cannot watch a backend notifier: {e}");
        }
    }
    let mut policy = SpinPolicy::new(mode);
    let mut events = [EpollEvent::default(); 8];
    // When the engine last ran out of work (None: it has work).
    let mut idle_since: Option<Instant> = None;
    loop {
        // Mailbox first: doorbells and control calls.
        while let Ok(m) = rx.try_recv() {
            shared.pending.fetch_sub(1, Ordering::SeqCst);
            match m {
                Msg::Doorbell(q, k, v) => engine.doorbell(q, k, v),
                Msg::Call(f) => f(&mut engine),
                Msg::Stop => return,
            }
        }
        engine.arm_eventidx = mode == PollMode::Off;
        if engine.poll() {
            if let Some(t) = idle_since.take() {
                policy.work_after(t.elapsed());
            }
            continue;
        }
        let idle = *idle_since.get_or_insert_with(Instant::now);
        // Idle. Spin with EventIdx stale, so the host does not ring.
        let budget = policy.budget();
        if budget > Duration::ZERO {
            let clock = policy.start_spin();
            let mut found = false;
            let mut pause = PoliteSpin::new();
            while clock.elapsed() < budget {
                if shared.pending.load(Ordering::Acquire) > 0 || engine.poll() {
                    found = true;
                    break;
                }
                pause.pause();
            }
            policy.end_spin(clock, found);
            publish(&shared.stats, &policy);
            if found {
                policy.work_after(idle.elapsed());
                idle_since = None;
                continue;
            }
            if mode == PollMode::Always {
                continue;
            }
        }
        // Re-arm EventIdx and look once more (doorbell.rs explains why that closes the race).
        engine.arm_eventidx = true;
        if engine.poll() {
            policy.work_after(idle.elapsed());
            idle_since = None;
            continue;
        }
        shared.sleeping.store(true, Ordering::SeqCst);
        if shared.pending.load(Ordering::SeqCst) > 0 {
            shared.sleeping.store(false, Ordering::SeqCst);
            continue;
        }
        let mut timer_armed = false;
        if let (Some(t), Some(deadline)) = (timer.as_mut(), engine.next_deadline()) {
            let now = engine.ctx.clock.now_ns();
            let _ = t.reset(Duration::from_nanos(deadline.saturating_sub(now).max(1_000)), None);
            timer_armed = true;
        }
        shared.stats.sleeps.fetch_add(1, Ordering::Relaxed);
        // A backend that can only be polled gets looked at every millisecond.
        let timeout = if engine.backend_needs_polling() { 1 } else { -1 };
        match epoll.wait(timeout, &mut events) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                warn!("worker epoll_wait failed: {e}");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        shared.sleeping.store(false, Ordering::SeqCst);
        let _ = shared.wake.read();
        // Only a timer that was set needs clearing (a system call saved per sleep).
        if let Some(t) = timer.as_mut().filter(|_| timer_armed) {
            let _ = t.clear();
        }
        engine.fire_timers();
        debug!(target: "vnvme::worker", "woke");
    }
}

/// `AsRawFd` for the vmm-sys-util types, which implement it.
trait RawFdCompat {
    fn as_raw_fd_compat(&self) -> i32;
}

impl<T: std::os::fd::AsRawFd> RawFdCompat for T {
    fn as_raw_fd_compat(&self) -> i32 {
        self.as_raw_fd()
    }
}
