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
        self.post(m, false);
    }

    /// Queues `m`, and wakes the worker if it sleeps, unless `lazy` and the worker
    /// said it needs no CQ head (see [`Worker::doorbell`]).
    fn post(&self, m: Msg, lazy: bool) {
        let pending = self.shared.pending.fetch_add(1, Ordering::SeqCst) + 1;
        if self.tx.send(m).is_err() {
            self.shared.pending.fetch_sub(1, Ordering::SeqCst);
            warn!(worker = self.index, "worker is gone; message dropped");
            return;
        }
        if wakes(&self.shared, lazy, pending) {
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
        self.post(Msg::Doorbell(qid, kind, value), kind == DoorbellKind::CqHead);
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
            "worker {} (--poll {}): slept {} times; {}",
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

/// The sender's half of the sleep handshake, after its message is queued and
/// counted (`pending`, the count with it): whether the worker must be woken.
///
/// Every load comes after the message was counted, and pairs with the worker's
/// stores before its last look at `pending` (`run`: `cq_waiting`, then `sleeping`,
/// then `pending`): either the worker's look counts this message, or these loads see
/// it asleep, and see whether it waits for CQ room. Deciding laziness before
/// counting the message (as this once did) let a worker that began to wait for CQ
/// room go to sleep between the two, with the CQ head doorbell that would let its
/// completions in left in the mailbox: a lost wake-up.
fn wakes(shared: &Shared, lazy: bool, pending: usize) -> bool {
    if !shared.sleeping.load(Ordering::SeqCst) {
        return false;
    }
    !lazy || pending > LAZY_DOORBELLS || shared.cq_waiting.load(Ordering::SeqCst)
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
        sleeper.timer.arm(engine.next_deadline(), engine.io.ctx.clock.now_ns());
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

#[cfg(test)]
mod tests {
    //! The sleep handshake between a worker and whoever sends it a message, in every
    //! interleaving of the two sides' steps ([`crate::interleave`]). The atomics are
    //! SeqCst on both sides, so interleavings of whole steps are every behaviour.

    use super::LAZY_DOORBELLS;
    use crate::interleave::{explore, Choices};

    /// How the sender decides whether a CQ head doorbell may wait in the mailbox.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Order {
        /// Count the message, then look at `sleeping` and `cq_waiting` (`wakes`).
        CountThenLook,
        /// Look at `cq_waiting` first, then count it (the order this once had).
        LookThenCount,
    }

    #[derive(Debug, Default)]
    struct State {
        pending: usize,
        sleeping: bool,
        cq_waiting: bool,
        /// The wake-up eventfd was written.
        woken: bool,
        /// The worker went to sleep (its last look found the mailbox empty).
        asleep: bool,
        /// The worker saw the message before sleeping.
        took: bool,
    }

    /// One worker about to sleep (`waits_for_room`: some CQ of its has completions
    /// waiting) and one sender of a doorbell (`lazy`: a CQ head). Fails if the
    /// worker sleeps unwoken while the message is one it needed.
    fn execute(ch: &mut Choices, order: Order, lazy: bool, waits_for_room: bool) -> Result<(), String> {
        let mut s = State::default();
        let (mut w_pc, mut s_pc) = (0, 0);
        let mut sender_lazy = lazy;
        let mut saw_sleeping = false;
        // Three steps each: the worker's stores and its last look; the sender's
        // count and its two looks (in one order or the other).
        const STEPS: usize = 3;
        while w_pc < STEPS || s_pc < STEPS {
            let worker = w_pc < STEPS && (s_pc == STEPS || ch.flip());
            if worker {
                match w_pc {
                    0 => s.cq_waiting = waits_for_room,
                    1 => s.sleeping = true,
                    _ => {
                        if s.pending > 0 {
                            s.sleeping = false;
                            s.took = true;
                        } else {
                            s.asleep = true;
                        }
                    }
                }
                w_pc += 1;
                continue;
            }
            match (order, s_pc) {
                (Order::CountThenLook, 0) => s.pending += 1,
                (Order::CountThenLook, 1) => saw_sleeping = s.sleeping,
                (Order::CountThenLook, _) => {
                    let wake = saw_sleeping && (!lazy || s.pending > LAZY_DOORBELLS || s.cq_waiting);
                    s.woken |= wake;
                }
                (Order::LookThenCount, 0) => sender_lazy = lazy && !s.cq_waiting,
                (Order::LookThenCount, 1) => s.pending += 1,
                (Order::LookThenCount, _) => s.woken |= s.sleeping && !sender_lazy,
            }
            s_pc += 1;
        }
        let needed = !lazy || waits_for_room;
        if s.asleep && !s.woken && needed {
            return Err(format!("lost wake-up: {s:?}"));
        }
        if s.asleep && !s.woken && s.took {
            return Err(format!("impossible: {s:?}"));
        }
        Ok(())
    }

    #[test]
    fn a_message_the_worker_needs_always_wakes_it() {
        for (lazy, room) in [(false, false), (false, true), (true, false), (true, true)] {
            let r = explore(1000, |ch| execute(ch, Order::CountThenLook, lazy, room))
                .unwrap_or_else(|f| panic!("lazy {lazy} waits for room {room}: {f}"));
            assert_eq!(r.executions, 20, "every interleaving of 3 + 3 steps");
        }
    }

    #[test]
    fn deciding_laziness_before_counting_the_message_loses_a_wake_up() {
        let f = explore(1000, |ch| execute(ch, Order::LookThenCount, true, true))
            .expect_err("the old order loses the CQ head doorbell");
        assert!(f.message.contains("lost wake-up"), "{f}");
        // It was right for SQ doorbells, which were never lazy.
        explore(1000, |ch| execute(ch, Order::LookThenCount, false, true)).unwrap();
    }
}
