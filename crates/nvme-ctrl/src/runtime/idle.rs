//! The idle loop: what an owner of queues does between bursts of work.
//!
//! Every owner of queues, an I/O worker thread ([`super::workers`]) or the server's
//! own thread in inline mode, drives one [`IdleLoop`]. The owner calls
//! [`IdleLoop::step`] after every wake-up and whenever the step asked to be called
//! again; the step runs the queues and moves between three phases:
//!
//! - **busy**: a run did work; run again at once;
//! - **spinning**: no work, and the [`SpinPolicy`] granted a budget: keep running the
//!   queues with EventIdx left stale, so the host does not ring, until work shows up
//!   or the budget is spent. A step spins at most one `slice`, so an owner that also
//!   listens to something only a system call can see (the vfio-user socket) gets to
//!   look at it between slices;
//! - **asleep**: the budget is spent (or was zero). The step re-arms EventIdx and
//!   runs the queues once more before it answers [`Next::Sleep`]. That last look
//!   closes the wake-up race: a host that wrote a shadow tail while EventIdx was
//!   stale decided not to ring, and only a look after the re-arm finds that work
//!   (the fence pairing is in `doorbell.rs`). With polling off every run is armed,
//!   and an armed run that finds nothing has made that look itself, so the step
//!   sleeps without another. Adaptive polling in an epoch its judge gave to
//!   sleeping ([`super::judge`]) runs the same way: a stale run there would only
//!   add a run, and a system call, before every sleep. A wake-up that brings no
//!   work leaves the owner asleep without spinning again.
//!
//! The owner keeps what is its own: how it sleeps (epoll on its eventfds, or on the
//! socket too), its mailbox, and the handshake that makes a message sent to a
//! sleeping worker wake it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vmm_sys_util::timerfd::TimerFd;

use super::judge::SpinJudge;
use super::poll::{PoliteSpin, PollMode, SpinClock, SpinPolicy, SpinStats};
use crate::engine::IoEngine;

/// The queues an idle loop runs: an I/O engine, or a controller in inline mode.
pub trait Queues {
    /// Does all work that is ready. True if it did anything.
    fn run(&mut self) -> bool;
    /// Whether runs publish EventIdx for queues they find empty (so the host rings
    /// the next doorbell) or leave it stale (so it does not).
    fn set_arm_eventidx(&mut self, arm: bool);
}

/// What the owner does after a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Step again without sleeping (after a look at the owner's other sources).
    Run,
    /// EventIdx is armed and the last run found nothing: sleep until a notification.
    Sleep,
}

/// A spin phase in progress.
#[derive(Clone, Copy, Debug)]
struct Spinning {
    clock: SpinClock,
    budget: Duration,
}

/// The busy → spin → re-arm → look again → sleep state machine (module docs).
#[derive(Debug)]
pub struct IdleLoop {
    policy: SpinPolicy,
    /// When the queues last ran out of work (None: they have work).
    idle_since: Option<Instant>,
    spin: Option<Spinning>,
    /// EventIdx is armed and nothing was found since: a wake-up without work sleeps again.
    asleep: bool,
    /// The last step's runs found work.
    found: bool,
}

impl IdleLoop {
    pub fn new(mode: PollMode) -> Self {
        Self::judged(mode, None)
    }

    /// An idle loop whose spinning `judge` allows or not (see [`super::judge`]).
    pub fn judged(mode: PollMode, judge: Option<Arc<SpinJudge>>) -> Self {
        IdleLoop {
            policy: SpinPolicy::judged(mode, judge),
            idle_since: None,
            spin: None,
            asleep: false,
            found: false,
        }
    }

    pub fn mode(&self) -> PollMode {
        self.policy.mode()
    }

    /// Whether the last [`Self::step`] found work in the queues (not counting the
    /// owner's own): an owner may step again at once, the queues being busy.
    pub fn found_work(&self) -> bool {
        self.found
    }

    /// The spin counters so far.
    pub fn stats(&self) -> &SpinStats {
        &self.policy.stats
    }

    /// Runs `q` once and, if that finds nothing, spins for at most `slice` of the
    /// current spin budget. `worked` says the owner already did work since the last
    /// step (handling a transport message, say); `interrupted` is checked while
    /// spinning and ends the spin as if work had been found (a message for the owner).
    pub fn step(
        &mut self,
        q: &mut impl Queues,
        worked: bool,
        slice: Duration,
        mut interrupted: impl FnMut() -> bool,
    ) -> Next {
        let mode = self.policy.mode();
        // Polling off, or adaptive in an epoch given to sleeping (and not spinning
        // already): every run is armed, as `--poll off` runs them.
        let armed = mode == PollMode::Off || (self.spin.is_none() && self.policy.sleep_regime());
        q.set_arm_eventidx(armed);
        let ran = q.run();
        self.found = ran;
        // A run that found nothing with EventIdx armed has closed the wake-up race
        // itself (it re-armed every empty queue and looked again): no second look.
        let mut looked_armed = armed && !ran;
        let mut worked = ran | worked;
        if let Some(s) = self.spin.filter(|_| !worked) {
            looked_armed = false;
            let t = Instant::now();
            let end = s.budget.saturating_sub(t.duration_since(s.clock.started())).min(slice);
            let mut pause = PoliteSpin::starting(t);
            // One clock read per lap: the slice's end and the pause's yield share it.
            let mut now = t;
            while now.duration_since(t) < end {
                if interrupted() {
                    worked = true;
                    break;
                }
                if q.run() {
                    worked = true;
                    self.found = true;
                    break;
                }
                now = Instant::now();
                pause.pause(now);
            }
        }
        if worked {
            self.busy();
            if looked_armed {
                // The work was the owner's (a message it handled ran the queues), and
                // the armed run after it found nothing: asleep already, no third look.
                // An adaptive owner that only ever wakes this way would never ask the
                // judge: ask it here, so an epoch that turns to spinning is seen.
                if mode == PollMode::Adaptive && self.policy.judge_allows_spin() {
                    return Next::Run;
                }
                self.asleep = true;
                return Next::Sleep;
            }
            return Next::Run;
        }
        if self.asleep {
            // Back to sleep armed: a run outside the steps while the owner sleeps (an
            // admin event, a control call) must publish EventIdx for what it takes,
            // or the host, seeing EventIdx stale, rings no more.
            q.set_arm_eventidx(true);
            return Next::Sleep;
        }
        if mode != PollMode::Off {
            // How long idle periods last feeds the adaptive spin budget; with
            // polling off nothing reads it (and the clock is not free).
            self.idle_since.get_or_insert_with(Instant::now);
        }
        match self.spin {
            None => {
                let budget = self.policy.budget();
                if budget > Duration::ZERO {
                    self.spin = Some(Spinning { clock: self.policy.start_spin(), budget });
                    return Next::Run;
                }
            }
            Some(s) if s.clock.elapsed() < s.budget => return Next::Run,
            Some(s) => {
                self.spin = None;
                self.policy.end_spin(s.clock, false);
            }
        }
        // The wake-up race: re-arm, then look once more before sleeping.
        q.set_arm_eventidx(true);
        if !looked_armed && q.run() {
            self.busy();
            return Next::Run;
        }
        self.asleep = true;
        Next::Sleep
    }

    /// Work was found: end the spin (a hit) and the idle period.
    fn busy(&mut self) {
        if let Some(s) = self.spin.take() {
            self.policy.end_spin(s.clock, true);
        }
        if let Some(t) = self.idle_since.take() {
            self.policy.work_after(t.elapsed());
        }
        self.asleep = false;
    }
}

/// A worker's engine: it owns its queues outright.
impl Queues for IoEngine {
    fn run(&mut self) -> bool {
        self.poll()
    }
    fn set_arm_eventidx(&mut self, arm: bool) {
        self.arm_eventidx = arm;
    }
}

/// How long an owner about to sleep may block in epoll (ms; -1: until woken). A
/// backend with requests in flight and no notifier can only be polled, so it gets
/// looked at every millisecond.
pub fn sleep_timeout_ms(backend_needs_polling: bool) -> i32 {
    if backend_needs_polling {
        1
    } else {
        -1
    }
}

/// The timer that wakes a sleeping owner when something falls due: a coalesced
/// interrupt, or a command's timeout.
///
/// It costs no system call per sleep in the usual case: a timer already set for an
/// earlier (or the same) time is left alone, and a timer is only cleared when it
/// fired. A timer left set for a deadline that went away wakes the owner once for
/// nothing, which costs less than clearing it every time.
#[derive(Debug)]
pub struct WakeTimer {
    fd: TimerFd,
    /// The clock time (ns) the timer is set to fire at, if set.
    armed_at: Option<u64>,
}

impl WakeTimer {
    pub fn new() -> std::io::Result<Self> {
        Ok(WakeTimer { fd: TimerFd::new()?, armed_at: None })
    }

    /// The descriptor to watch (readable when the timer fires).
    pub fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.fd.as_raw_fd()
    }

    /// Before sleeping: make sure the timer fires by `deadline` (clock ns, from
    /// `next_deadline`), if any.
    pub fn arm(&mut self, deadline: Option<u64>, now_ns: u64) {
        let Some(d) = deadline else { return };
        if self.armed_at.is_some_and(|a| a <= d) {
            return;
        }
        let _ = self.fd.reset(Duration::from_nanos(d.saturating_sub(now_ns).max(1_000)), None);
        self.armed_at = Some(d);
    }

    /// The timer's descriptor was readable: it fired. Clears it.
    pub fn fired(&mut self) {
        if self.armed_at.take().is_some() {
            let _ = self.fd.clear();
        }
    }
}

/// The backend notifiers an owner's epoll set watches (level triggered, under one
/// token), kept in step with its engine: a namespace added or removed while the
/// owner runs brings or takes a notifier. [`NotifierWatch::sync`] costs a comparison
/// when nothing changed.
#[derive(Debug)]
pub struct NotifierWatch {
    token: u64,
    /// The engine's notifier generation last synced to (None: never).
    generation: Option<u64>,
    fds: Vec<std::os::fd::RawFd>,
}

impl NotifierWatch {
    pub fn new(token: u64) -> Self {
        NotifierWatch { token, generation: None, fds: Vec::new() }
    }

    /// Before sleeping: if the notifiers changed since the last call (`generation`
    /// differs), re-registers them all (`fds` is called only then). A descriptor
    /// number may have been reused by a new backend, so every old one is removed
    /// and every current one added. An error names the first that could not be
    /// added; the others are watched, and the next change tries again.
    pub fn sync(
        &mut self,
        epoll: &vmm_sys_util::epoll::Epoll,
        generation: u64,
        fds: impl FnOnce() -> Vec<std::os::fd::RawFd>,
    ) -> std::io::Result<()> {
        use vmm_sys_util::epoll::{ControlOperation, EpollEvent, EventSet};
        if self.generation == Some(generation) {
            return Ok(());
        }
        for fd in self.fds.drain(..) {
            // Already gone if its backend queue was closed.
            let _ = epoll.ctl(ControlOperation::Delete, fd, EpollEvent::default());
        }
        // One that cannot be watched is reported once (per change), not at every sleep.
        let mut first_err = None;
        for fd in fds() {
            match epoll.ctl(ControlOperation::Add, fd, EpollEvent::new(EventSet::IN, self.token)) {
                Ok(()) => self.fds.push(fd),
                Err(e) => first_err = first_err.or(Some(e)),
            }
        }
        self.generation = Some(generation);
        first_err.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Queues whose work shows up at chosen times. `hidden` models commands the host
    /// queued while EventIdx was stale: only a run with EventIdx armed finds them.
    #[derive(Default)]
    struct Fake {
        armed: bool,
        ready: u32,
        hidden: u32,
        /// (armed, found work) of every run.
        runs: Vec<(bool, bool)>,
        /// The run (counting from 1) that finds work of its own.
        found_at_run: Option<usize>,
    }

    impl Queues for Fake {
        fn run(&mut self) -> bool {
            if self.armed && self.hidden > 0 {
                self.ready += std::mem::take(&mut self.hidden);
            }
            let found = self.ready > 0 || self.found_at_run == Some(self.runs.len() + 1);
            self.ready = 0;
            self.runs.push((self.armed, found));
            found
        }
        fn set_arm_eventidx(&mut self, arm: bool) {
            self.armed = arm;
        }
    }

    const FOREVER: Duration = Duration::MAX;

    /// Steps until the loop says sleep (bounded).
    fn until_sleep(l: &mut IdleLoop, q: &mut Fake) -> usize {
        for n in 1..10_000 {
            if l.step(q, false, FOREVER, || false) == Next::Sleep {
                return n;
            }
        }
        panic!("never slept");
    }

    #[test]
    fn found_work_is_the_queues_work_not_the_owners() {
        for mode in [PollMode::Off, PollMode::Adaptive, PollMode::Always] {
            let mut l = IdleLoop::new(mode);
            let mut q = Fake { ready: 1, ..Fake::default() };
            assert_eq!(l.step(&mut q, false, FOREVER, || false), Next::Run, "{mode:?}");
            assert!(l.found_work(), "{mode:?}: the run found a command");
            // The owner's own work (a message it handled) makes the loop run again,
            // but the queues had nothing: an owner stepping again at once would spin.
            l.step(&mut q, true, Duration::ZERO, || false);
            assert!(!l.found_work(), "{mode:?}: only the owner worked");
            if mode == PollMode::Off {
                continue;
            }
            // Work that shows up during a spin (the fifth run: the spin's third lap) is
            // found by it.
            let mut l = IdleLoop::new(mode);
            let mut q = Fake { found_at_run: Some(5), ..Fake::default() };
            let mut steps = 0;
            while q.runs.len() < 5 && steps < 10 {
                l.step(&mut q, false, FOREVER, || false);
                steps += 1;
            }
            assert_eq!(q.runs.last(), Some(&(false, true)), "{mode:?}");
            assert!(l.found_work(), "{mode:?}: {:?}", q.runs);
        }
    }

    #[test]
    fn work_found_by_the_look_after_rearming_is_run_before_sleeping() {
        for mode in [PollMode::Off, PollMode::Adaptive] {
            let mut l = IdleLoop::new(mode);
            let mut q = Fake { hidden: 1, ..Fake::default() };
            // Adaptive: a spin phase with EventIdx stale never sees the hidden work;
            // the armed look after it does, and the loop runs instead of sleeping.
            until_sleep(&mut l, &mut q);
            assert_eq!(q.hidden, 0, "{mode:?}");
            assert!(q.runs.iter().any(|&(armed, found)| armed && found), "{mode:?}: {:?}", q.runs);
            // It slept only after an armed run found nothing.
            assert_eq!(q.runs.last(), Some(&(true, false)), "{mode:?}");
        }
    }

    #[test]
    fn off_sleeps_after_the_owners_work_when_the_armed_run_finds_nothing_more() {
        // Inline mode: the message handler ran the queues (the owner's work); the
        // step's armed run finds nothing more, and the owner sleeps without a second
        // step. Work that run finds keeps it awake.
        let mut l = IdleLoop::new(PollMode::Off);
        let mut q = Fake::default();
        assert_eq!(l.step(&mut q, true, FOREVER, || false), Next::Sleep);
        assert_eq!(q.runs, [(true, false)]);
        q.ready = 1;
        assert_eq!(l.step(&mut q, true, FOREVER, || false), Next::Run);
        // Adaptive: the run was stale, so the step does not sleep on it.
        let mut l = IdleLoop::new(PollMode::Adaptive);
        let mut q = Fake::default();
        assert_eq!(l.step(&mut q, true, FOREVER, || false), Next::Run);
    }

    #[test]
    fn adaptive_spins_with_eventidx_stale_then_sleeps_armed() {
        let mut l = IdleLoop::new(PollMode::Adaptive);
        let mut q = Fake::default();
        until_sleep(&mut l, &mut q);
        let stale = q.runs.iter().filter(|r| !r.0).count();
        assert!(stale > 1, "it spun: {} stale runs", stale);
        assert_eq!(q.runs.last(), Some(&(true, false)));
        assert_eq!((l.stats().hits, l.stats().misses), (0, 1));
    }

    /// A judge over fresh counters, in its first epoch (sleeping), and the counters.
    fn sleeping_judge() -> (Arc<crate::stats::Stats>, Arc<super::super::judge::SpinJudge>) {
        let stats = Arc::new(crate::stats::Stats::default());
        (stats.clone(), Arc::new(super::super::judge::SpinJudge::new(stats)))
    }

    /// Runs made with EventIdx stale: more than one means the owner spun.
    fn stale_runs(q: &Fake) -> usize {
        q.runs.iter().filter(|r| !r.0).count()
    }

    #[test]
    fn adaptive_spins_only_in_the_epochs_its_judge_allows() {
        use super::super::judge::EPOCH;
        // A judge in its first epoch: sleeping. The owner never spins, and runs as
        // `--poll off` does: one armed run that found nothing, and sleep.
        let (stats, judge) = sleeping_judge();
        let mut l = IdleLoop::judged(PollMode::Adaptive, Some(judge.clone()));
        let mut q = Fake::default();
        until_sleep(&mut l, &mut q);
        assert_eq!(l.stats().spin_ns, 0);
        assert_eq!(q.runs, [(true, false)]);
        // The owner's own work (a message that ran the queues), then an armed run
        // that finds nothing more: asleep at once, no second step.
        let mut q = Fake::default();
        assert_eq!(l.step(&mut q, true, FOREVER, || false), Next::Sleep);
        assert_eq!(q.runs, [(true, false)]);
        // That epoch is judged (as if 75 ms had gone by with 1000 commands): the next
        // explores spinning, and the owner spins before it sleeps.
        stats.add_io_commands(1000);
        assert!(judge.may_spin(Instant::now() + EPOCH * 3 / 2));
        let mut l = IdleLoop::judged(PollMode::Adaptive, Some(judge));
        let mut q = Fake::default();
        until_sleep(&mut l, &mut q);
        assert!(stale_runs(&q) > 1, "it spun: {:?}", q.runs);
        assert_eq!(l.stats().misses, 1);
    }

    #[test]
    fn an_owner_that_only_wakes_for_its_own_work_still_sees_the_judge_turn_to_spinning() {
        use super::super::judge::EPOCH;
        // Inline mode at queue depth 1: every command comes with a message the owner
        // handles, and every step after it finds nothing more. Such an owner never
        // starts an idle period of its own, so the step after its work asks the judge.
        let (stats, judge) = sleeping_judge();
        let mut l = IdleLoop::judged(PollMode::Adaptive, Some(judge.clone()));
        let mut q = Fake::default();
        assert_eq!(l.step(&mut q, true, FOREVER, || false), Next::Sleep);
        // The sleeping epoch is over (1000 commands in it): the judge explores
        // spinning, and the step after the owner's next work stays awake to spin.
        stats.add_io_commands(1000);
        std::thread::sleep(EPOCH * 3 / 2);
        assert_eq!(l.step(&mut q, true, FOREVER, || false), Next::Run);
        assert!(judge.spinning());
        until_sleep(&mut l, &mut q);
        assert!(stale_runs(&q) > 1, "it spun: {:?}", q.runs);
    }

    #[test]
    fn off_never_spins() {
        let mut l = IdleLoop::new(PollMode::Off);
        let mut q = Fake::default();
        assert_eq!(until_sleep(&mut l, &mut q), 1);
        assert!(q.runs.iter().all(|r| r.0));
        assert_eq!(l.stats().spin_ns, 0);
    }

    #[test]
    fn off_sleeps_after_one_armed_run_that_found_nothing() {
        // Every run is armed with polling off: the one that finds nothing has already
        // looked after re-arming, and the step sleeps without running again.
        let mut l = IdleLoop::new(PollMode::Off);
        let mut q = Fake { ready: 1, ..Fake::default() };
        assert_eq!(l.step(&mut q, false, FOREVER, || false), Next::Run);
        assert_eq!(l.step(&mut q, false, FOREVER, || false), Next::Sleep);
        assert_eq!(q.runs, [(true, true), (true, false)]);
        // Work only an armed look finds (queued as EventIdx was being published) is
        // found by that one run.
        q.hidden = 1;
        assert_eq!(l.step(&mut q, false, FOREVER, || false), Next::Run);
        assert_eq!(q.runs.last(), Some(&(true, true)));
    }

    #[test]
    fn a_wakeup_without_work_sleeps_again_without_spinning() {
        let mut l = IdleLoop::new(PollMode::Adaptive);
        let mut q = Fake::default();
        until_sleep(&mut l, &mut q);
        let (before, spun) = (q.runs.len(), l.stats().spin_ns);
        assert_eq!(l.step(&mut q, false, FOREVER, || false), Next::Sleep);
        assert_eq!(q.runs.len(), before + 1, "one run, no spin");
        assert_eq!(l.stats().spin_ns, spun);
        // New work wakes it up and ends the idle period.
        q.ready = 1;
        assert_eq!(l.step(&mut q, false, FOREVER, || false), Next::Run);
        assert_eq!(q.runs.last(), Some(&(false, true)));
        assert!(l.idle_since.is_none() && !l.asleep);
    }

    #[test]
    fn an_owner_asleep_stays_armed_after_a_wakeup_without_work() {
        // Inline mode runs the controller outside the steps too (an asynchronous
        // event, a control call): if a wake-up without work left EventIdx stale, such
        // a run would take the host's commands without publishing EventIdx, and the
        // host would never ring again.
        let mut l = IdleLoop::new(PollMode::Adaptive);
        let mut q = Fake::default();
        until_sleep(&mut l, &mut q);
        for _ in 0..3 {
            assert_eq!(l.step(&mut q, false, FOREVER, || false), Next::Sleep);
            assert!(q.armed, "asleep, EventIdx is armed");
        }
    }

    #[test]
    fn a_message_ends_a_spin_as_a_hit() {
        let mut l = IdleLoop::new(PollMode::Always);
        let mut q = Fake::default();
        // The first empty step starts the spin phase, the next spins.
        assert_eq!(l.step(&mut q, false, FOREVER, || false), Next::Run);
        let mut polls = 0;
        assert_eq!(
            l.step(&mut q, false, FOREVER, || {
                polls += 1;
                polls == 100
            }),
            Next::Run
        );
        assert_eq!(l.stats().hits, 1);
        assert!(q.runs.iter().all(|r| !r.0), "always never arms EventIdx");
    }

    #[test]
    fn a_spin_slice_hands_back_before_the_budget_is_spent() {
        let mut l = IdleLoop::new(PollMode::Always);
        let mut q = Fake::default();
        assert_eq!(l.step(&mut q, false, Duration::from_micros(50), || false), Next::Run);
        // Each step returns (a slice that kept the core would never hand back).
        test_util::bounded("ten spin slices", || {
            for _ in 0..10 {
                assert_eq!(l.step(&mut q, false, Duration::from_micros(50), || false), Next::Run);
            }
        });
        assert_eq!(l.stats().hits + l.stats().misses, 0, "still the same spin phase");
        // Work reported by the owner ends it as a hit.
        assert_eq!(l.step(&mut q, true, Duration::from_micros(50), || false), Next::Run);
        assert_eq!(l.stats().hits, 1);
    }

    #[test]
    fn the_wake_timer_is_set_only_for_an_earlier_deadline_and_cleared_only_when_it_fired() {
        let mut t = WakeTimer::new().unwrap();
        t.arm(None, 0);
        assert_eq!(t.armed_at, None);
        t.arm(Some(50_000_000), 0);
        assert_eq!(t.armed_at, Some(50_000_000));
        t.arm(Some(80_000_000), 0);
        assert_eq!(t.armed_at, Some(50_000_000), "a later deadline leaves the earlier wake");
        t.arm(Some(1_000_000), 0);
        assert_eq!(t.armed_at, Some(1_000_000), "an earlier one moves it");
        // It fires (after 1 ms), and `fired` forgets it.
        assert_eq!(t.fd.wait().unwrap(), 1);
        t.fired();
        assert_eq!(t.armed_at, None);
    }
}
