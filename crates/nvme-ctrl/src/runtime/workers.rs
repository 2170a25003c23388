//! I/O worker threads. Each worker (`vnvme-q<N>`) owns one [`IoEngine`] and the queue
//! pairs assigned to it, and runs it without locks. Everything else reaches a worker
//! through its mailbox: trapped doorbell writes (cheap, fire and forget) and control
//! calls (a closure run on the worker's engine, with the caller waiting for the
//! result). A sleeping worker is woken through an eventfd.
//!
//! Between bursts of work a worker drives the [`IdleLoop`] (spin as the poll mode
//! says, re-arm EventIdx, look again, sleep); a message in its mailbox ends a spin.
//! It sleeps in epoll on its wake-up eventfd, the shared doorbell kick, its backend
//! queues' notifiers and a timer for coalesced interrupts.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use nvme_spec::regs::DoorbellKind;
use tracing::{debug, warn};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::idle::{sleep_timeout_ms, IdleLoop, Next, NotifierWatch, WakeTimer};
use super::judge::SpinJudge;
pub use super::poll::PollMode;
use super::poll::SpinStats;
use crate::engine::IoEngine;

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
    /// Set by the worker before it sleeps: some CQ of its has completions waiting
    /// for room, so a CQ head doorbell must wake it. Otherwise a CQ head update can
    /// wait in the mailbox until something else wakes it (see `Worker::doorbell`).
    cq_waiting: AtomicBool,
    stats: WorkerStats,
}

/// Most CQ head doorbells that wait in a sleeping worker's mailbox without waking it.
pub const LAZY_DOORBELLS: usize = 64;

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
        judge: Option<Arc<SpinJudge>>,
        kick: Option<Arc<OwnedFd>>,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            wake: EventFd::new(EFD_NONBLOCK)?,
            sleeping: AtomicBool::new(false),
            pending: AtomicUsize::new(0),
            cq_waiting: AtomicBool::new(false),
            stats: WorkerStats::default(),
        });
        let sleeper = Sleeper::new(&engine, &shared, kick)?;
        let (tx, rx) = mpsc::channel();
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("vnvme-q{index}"))
            .spawn(move || run(engine, rx, s, IdleLoop::judged(mode, judge), sleeper))?;
        Ok(Worker { tx, shared, thread: Some(thread), index, mode })
    }

    fn send(&self, m: Msg) {
        self.send_and_wake(m, true);
    }

    /// Queues `m`; wakes the worker if it sleeps and `wake` says so.
    fn send_and_wake(&self, m: Msg, wake: bool) {
        self.shared.pending.fetch_add(1, Ordering::SeqCst);
        if self.tx.send(m).is_err() {
            self.shared.pending.fetch_sub(1, Ordering::SeqCst);
            warn!(worker = self.index, "worker is gone; message dropped");
            return;
        }
        // Pairs with the worker's SeqCst store of `sleeping` before its last check
        // of `pending`: either it sees our message, or we see it asleep and wake it.
        if wake && self.shared.sleeping.load(Ordering::SeqCst) {
            self.shared.stats.wakeups.fetch_add(1, Ordering::Relaxed);
            let _ = self.shared.wake.write(1);
        }
    }

    /// A trapped doorbell write for one of this worker's queues.
    ///
    /// A CQ head update matters to a worker only when it has completions to post:
    /// one asleep with nothing waiting for room takes it from the mailbox at its next
    /// wake-up (a completion, an SQ doorbell), before it posts anything, so it is not
    /// woken for it (trapped doorbells at QD 1: one wake-up per I/O instead of two).
    /// At most [`LAZY_DOORBELLS`] wait so: a host that only rings CQ heads cannot
    /// grow the mailbox.
    pub fn doorbell(&self, qid: u16, kind: DoorbellKind, value: u32) {
        let lazy = kind == DoorbellKind::CqHead
            && !self.shared.cq_waiting.load(Ordering::SeqCst)
            && self.shared.pending.load(Ordering::SeqCst) < LAZY_DOORBELLS;
        self.send_and_wake(Msg::Doorbell(qid, kind, value), !lazy);
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

/// Copies the idle loop's spin counters where other threads can read them.
fn publish(stats: &WorkerStats, s: &SpinStats) {
    stats.spin_hits.store(s.hits, Ordering::Relaxed);
    stats.spin_misses.store(s.misses, Ordering::Relaxed);
    stats.spin_contended.store(s.contended, Ordering::Relaxed);
    stats.spin_ns.store(s.spin_ns, Ordering::Relaxed);
    stats.spin_lost_ns.store(s.lost_ns, Ordering::Relaxed);
}

/// What a worker sleeps on (epoll data).
const WAKE: u64 = 0;
const TIMER: u64 = 1;
const KICK: u64 = 2;
const NOTIFIER: u64 = 3;

/// The descriptors a worker sleeps on, set up before its thread starts so a failure
/// is the caller's error rather than a worker that never runs.
struct Sleeper {
    epoll: Epoll,
    timer: WakeTimer,
    /// Held so the watched descriptor lives as long as the worker.
    _kick: Option<Arc<OwnedFd>>,
    notifiers: NotifierWatch,
}

impl Sleeper {
    fn new(engine: &IoEngine, shared: &Shared, kick: Option<Arc<OwnedFd>>) -> std::io::Result<Self> {
        let epoll = Epoll::new()?;
        let timer = WakeTimer::new()?;
        // Edge triggered and never read: every write is an edge (eventfd wakes its
        // waiters at each write), so a wake-up costs the worker no read system call.
        // The counter cannot overflow: one write per wake-up, 2^64 of them.
        let ev = EpollEvent::new(EventSet::IN | EventSet::EDGE_TRIGGERED, WAKE);
        epoll.ctl(ControlOperation::Add, shared.wake.as_raw_fd(), ev)?;
        epoll.ctl(ControlOperation::Add, timer.fd(), EpollEvent::new(EventSet::IN, TIMER))?;
        if let Some(k) = &kick {
            // Shared by every worker and never drained: edge triggered.
            let ev = EpollEvent::new(EventSet::IN | EventSet::EDGE_TRIGGERED, KICK);
            epoll.ctl(ControlOperation::Add, k.as_raw_fd(), ev)?;
        }
        // Asynchronous backends (io_uring, nvme://, nbd://) signal finished requests
        // here; namespaces added later bring theirs (`run` keeps the set in step).
        let mut notifiers = NotifierWatch::new(NOTIFIER);
        notifiers.sync(&epoll, engine.notifier_generation(), || engine.backend_notifiers())?;
        Ok(Sleeper { epoll, timer, _kick: kick, notifiers })
    }
}

fn run(
    mut engine: IoEngine,
    rx: mpsc::Receiver<Msg>,
    shared: Arc<Shared>,
    mut idle: IdleLoop,
    mut sleeper: Sleeper,
) {
    let mut events = [EpollEvent::default(); 8];
    loop {
        // Mailbox first: doorbells and control calls. `pending` is counted before a
        // message is queued and after it is taken, so zero means empty: no look into
        // the channel (the common case when the worker woke for work of its own).
        while shared.pending.load(Ordering::Acquire) > 0 {
            let Ok(m) = rx.try_recv() else { break };
            shared.pending.fetch_sub(1, Ordering::SeqCst);
            match m {
                Msg::Doorbell(q, k, v) => engine.doorbell(q, k, v),
                Msg::Call(f) => {
                    // Control calls (shadow buffers, queue creation) may touch memory
                    // the transport has just published.
                    engine.adopt_memory();
                    f(&mut engine)
                }
                Msg::Stop => return,
            }
        }
        // A worker has nothing else to watch while it spins but its mailbox, which
        // costs no system call: one step spins its whole budget.
        let next =
            idle.step(&mut engine, false, Duration::MAX, || shared.pending.load(Ordering::Acquire) > 0);
        publish(&shared.stats, idle.stats());
        if next == Next::Run {
            continue;
        }
        // Before `sleeping`: a CQ head doorbell must wake us if completions wait.
        shared.cq_waiting.store(engine.cq_waiting(), Ordering::SeqCst);
        // Pairs with `Worker::send`: either it sees us asleep and wakes us, or we see
        // its message here.
        shared.sleeping.store(true, Ordering::SeqCst);
        if shared.pending.load(Ordering::SeqCst) > 0 {
            shared.sleeping.store(false, Ordering::SeqCst);
            continue;
        }
        if let Err(e) = sleeper
            .notifiers
            .sync(&sleeper.epoll, engine.notifier_generation(), || engine.backend_notifiers())
        {
            warn!("worker cannot watch a backend's notifier ({e}): its completions are seen only when something else wakes this thread");
        }
        sleeper.timer.arm(engine.next_deadline(), engine.ctx.clock.now_ns());
        shared.stats.sleeps.fetch_add(1, Ordering::Relaxed);
        let n = match sleeper.epoll.wait(sleep_timeout_ms(engine.backend_needs_polling()), &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => 0,
            Err(e) => {
                warn!("worker epoll_wait failed: {e}");
                std::thread::sleep(Duration::from_millis(1));
                0
            }
        };
        shared.sleeping.store(false, Ordering::SeqCst);
        // Only the timer is read (the wake-up eventfd and the kick are edge
        // triggered), and only when it fired.
        if events[..n].iter().any(|ev| ev.data() == TIMER) {
            sleeper.timer.fired();
        }
        engine.fire_timers();
        debug!(target: "vnvme::worker", "woke");
    }
}
