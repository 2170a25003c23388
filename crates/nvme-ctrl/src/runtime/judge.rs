//! Whether adaptive polling spins at all: chosen by what it costs the whole process.
//!
//! A spin saves a wake-up, and the cost of a wake-up is spread over threads and
//! system calls no single owner sees: the server thread that receives the doorbell
//! the guest rang because EventIdx was armed, the eventfd that forwards it, the
//! worker's epoll wait. What an owner can measure of it alone (its own thread's CPU
//! clock across a sleep) was a third of the real figure on the 2-core development
//! host. So the choice is made on the one figure that counts everything: the
//! process's CPU time per command.
//!
//! [`SpinJudge`] cuts time into epochs of [`EPOCH`]. In each, every adaptive owner
//! of the controller follows one regime: *spin* (the per-owner [`SpinPolicy`]
//! decides the budget, as before) or *sleep* (no spinning: what `--poll off` does).
//! At the end of an epoch the process CPU time and the commands completed give that
//! regime's cost per command. Most epochs run the regime found cheaper; one every
//! `explore` epochs runs the other for a shorter [`EXPLORE_EPOCH`], to notice when
//! the guest's pace or the host's load changes which one is cheaper. An exploration that confirms the choice
//! doubles the interval (from [`MIN_EXPLORE`] up to [`MAX_EXPLORE`] epochs), so a
//! settled choice costs at most one epoch in [`MAX_EXPLORE`] + 1 run the dearer
//! way; one that finds the other regime cheaper by more than [`MARGIN_PCT`] % swaps
//! the choice and starts over at [`MIN_EXPLORE`]. An epoch of the choice with fewer
//! than [`MIN_COMMANDS`] commands (under 1,280 commands/s) says nothing and is not
//! counted: a nearly idle device costs about the same either way, and the choice
//! stays as it is. An exploration that short goes on for another [`EXPLORE_EPOCH`],
//! adding up, until it has seen enough commands; after [`MAX_EXPLORE_WINDOWS`]
//! windows it is given up unjudged and the choice runs again.
//!
//! The judge starts in the sleep regime (the cheaper one whenever the guest is
//! slower than a wake-up) and explores spinning as soon as one sleep epoch has been
//! judged.
//!
//! [`SpinPolicy`]: super::poll::SpinPolicy

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::stats::Stats;

/// How long one epoch of the chosen regime lasts.
pub const EPOCH: Duration = Duration::from_millis(50);
/// How long an exploration lasts: shorter, since exploring the dearer regime is what
/// the judge pays for its choice (a spin epoch beside a TCG guest at QD 1 burns a
/// whole CPU).
pub const EXPLORE_EPOCH: Duration = Duration::from_millis(20);
/// An epoch with fewer commands than this is not judged.
pub const MIN_COMMANDS: u64 = 64;
/// Epochs between explorations, after a change of choice.
pub const MIN_EXPLORE: u32 = 4;
/// The most epochs between explorations, once the choice has been confirmed often
/// (6.4 s): an exploration of the dearer regime then costs 20 ms of it in 6.4 s.
pub const MAX_EXPLORE: u32 = 128;
/// An explored regime must be this much cheaper (per cent) to become the choice.
pub const MARGIN_PCT: u64 = 10;
/// An exploration that has not seen [`MIN_COMMANDS`] after this many of its
/// windows (the guest slowed down or went idle meanwhile) is given up.
pub const MAX_EXPLORE_WINDOWS: u32 = 10;

/// The two ways adaptive owners can wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Regime {
    /// Sleep as soon as there is no work.
    Sleep,
    /// Spin for the budget each owner's policy grants.
    Spin,
}

impl Regime {
    fn other(self) -> Regime {
        match self {
            Regime::Sleep => Regime::Spin,
            Regime::Spin => Regime::Sleep,
        }
    }

    fn index(self) -> usize {
        match self {
            Regime::Sleep => 0,
            Regime::Spin => 1,
        }
    }

    /// The regime's name in logs, `stats.get` and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Regime::Sleep => "sleep",
            Regime::Spin => "spin",
        }
    }
}

/// What the judge knows, for logs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The regime judged cheaper.
    pub choice: Regime,
    /// The regime of the epoch running now (the choice, or the other one being explored).
    pub running: Regime,
    /// The last cost per command measured for each regime (nanoseconds; sleep, spin).
    pub cost_ns: [Option<u64>; 2],
    /// Epochs judged.
    pub epochs: u64,
    /// Explorations that changed the choice.
    pub changes: u64,
}

impl Verdict {
    /// The last cost per command measured for `r` (nanoseconds).
    pub fn cost(&self, r: Regime) -> Option<u64> {
        self.cost_ns[r.index()]
    }

    /// One phrase for logs.
    pub fn describe(&self) -> String {
        let cost = |r: Regime| self.cost(r).map_or("not measured".into(), |n| format!("{n} ns"));
        format!(
            "adaptive polling chose to {} ({} epochs judged, {} changes); CPU per command: sleeping {}, spinning {}",
            self.choice.name(),
            self.epochs,
            self.changes,
            cost(Regime::Sleep),
            cost(Regime::Spin)
        )
    }
}

/// The bookkeeping of epochs, apart from clocks (so it can be tested with any figures).
#[derive(Clone, Debug)]
pub(crate) struct Judging {
    running: Regime,
    choice: Regime,
    /// Process CPU time and commands completed when the running epoch started.
    start: Option<(Duration, u64)>,
    /// Cost per command (ns) by regime: the choice's a running average over the
    /// epochs that ran it, the other's from its last exploration.
    cost: [Option<u64>; 2],
    explore_every: u32,
    explore_in: u32,
    /// Windows the running exploration has lasted so far.
    explore_windows: u32,
    epochs: u64,
    changes: u64,
}

impl Default for Judging {
    fn default() -> Self {
        Judging {
            running: Regime::Sleep,
            choice: Regime::Sleep,
            start: None,
            cost: [None, None],
            explore_every: MIN_EXPLORE,
            explore_in: 0,
            explore_windows: 0,
            epochs: 0,
            changes: 0,
        }
    }
}

impl Judging {
    /// The epoch in progress ended with the process at `cpu` and `commands`:
    /// judges it and returns the regime of the next one.
    pub fn epoch_over(&mut self, cpu: Duration, commands: u64) -> Regime {
        if let Some((cpu0, n0)) = self.start {
            let n = commands.saturating_sub(n0);
            if n < MIN_COMMANDS {
                if !self.exploring() {
                    // Too idle to say anything: carry on as is.
                    self.start = Some((cpu, commands));
                    return self.running;
                }
                self.explore_windows += 1;
                if self.explore_windows < MAX_EXPLORE_WINDOWS {
                    // An exploration adds up its windows until it has enough.
                    return self.running;
                }
                // Given up: back to the choice, the next exploration in due course.
                self.explore_windows = 0;
                self.explore_in = self.explore_every;
                self.start = Some((cpu, commands));
                self.running = self.choice;
                return self.running;
            }
            let per = (cpu.saturating_sub(cpu0).as_nanos() / u128::from(n)) as u64;
            self.judge(per);
            self.explore_windows = 0;
        }
        self.start = Some((cpu, commands));
        // The choice is measured first; then the other regime is explored.
        let measured = self.cost[self.choice.index()].is_some();
        self.running =
            if measured && (self.cost[self.choice.other().index()].is_none() || self.explore_in == 0) {
                self.explore_in = self.explore_every;
                self.choice.other()
            } else {
                self.explore_in = self.explore_in.saturating_sub(1);
                self.choice
            };
        self.running
    }

    /// Records the running epoch's cost per command (ns).
    fn judge(&mut self, per: u64) {
        self.epochs += 1;
        let r = self.running;
        if r == self.choice {
            let c = &mut self.cost[r.index()];
            *c = Some(c.map_or(per, |old| (old + per) / 2));
            return;
        }
        // An exploration ended.
        self.cost[r.index()] = Some(per);
        let chosen = self.cost[self.choice.index()];
        if chosen.is_some_and(|c| per * 100 < c * (100 - MARGIN_PCT)) {
            self.choice = r;
            self.changes += 1;
            self.explore_every = MIN_EXPLORE;
        } else {
            self.explore_every = (self.explore_every * 2).min(MAX_EXPLORE);
        }
        self.explore_in = self.explore_every;
    }

    /// Forgets the running epoch's start: its counters jumped (a controller state
    /// restored under it), so the next epoch end only starts a new one.
    pub fn restart_epoch(&mut self) {
        self.start = None;
    }

    /// The running epoch explores the regime not chosen.
    pub fn exploring(&self) -> bool {
        self.running != self.choice
    }

    /// What the judge knows now.
    pub fn verdict(&self) -> Verdict {
        Verdict {
            choice: self.choice,
            running: self.running,
            cost_ns: self.cost,
            epochs: self.epochs,
            changes: self.changes,
        }
    }
}

/// One per controller, shared by all its adaptive owners (module documentation).
#[derive(Debug)]
pub struct SpinJudge {
    origin: Instant,
    /// Owners may spin in the running epoch.
    spin: AtomicBool,
    /// When the running epoch ends (ns since `origin`).
    epoch_end_ns: AtomicU64,
    stats: Arc<Stats>,
    judging: Mutex<Judging>,
}

impl SpinJudge {
    /// A judge counting the commands of `stats` against the process's CPU time: it
    /// assumes one controller per process (`vnvme serve`); in a process running
    /// several, or a load generator beside the controller (`vnvme perf
    /// --in-process`), every CPU second is charged to this controller's commands.
    pub fn new(stats: Arc<Stats>) -> Self {
        SpinJudge {
            origin: Instant::now(),
            spin: AtomicBool::new(false),
            epoch_end_ns: AtomicU64::new(0),
            stats,
            judging: Mutex::new(Judging::default()),
        }
    }

    /// Asked by an adaptive owner as an idle period starts: whether it may spin.
    /// Costs an atomic load or two; the owner that finds the epoch over judges it
    /// (another that finds the judging under way goes on with the old regime).
    pub fn may_spin(&self, now: Instant) -> bool {
        let t = now.saturating_duration_since(self.origin).as_nanos() as u64;
        if t >= self.epoch_end_ns.load(Ordering::Relaxed) {
            self.end_epoch(t);
        }
        self.spin.load(Ordering::Relaxed)
    }

    fn end_epoch(&self, t: u64) {
        let mut j = match self.judging.try_lock() {
            Ok(j) => j,
            // Busy: another owner is judging the epoch.
            Err(std::sync::TryLockError::WouldBlock) => return,
            // A panic elsewhere while holding it: the figures are still usable.
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        };
        if t < self.epoch_end_ns.load(Ordering::Relaxed) {
            return; // another owner judged it meanwhile
        }
        let next = j.epoch_over(process_cpu_time(), self.stats.io_commands());
        self.spin.store(next == Regime::Spin, Ordering::Relaxed);
        let length = if j.exploring() { EXPLORE_EPOCH } else { EPOCH };
        self.epoch_end_ns.store(t + length.as_nanos() as u64, Ordering::Relaxed);
    }

    /// The regime of the running epoch as it stands (a load; an epoch that is over
    /// is judged by the next [`Self::may_spin`], not here).
    pub fn spinning(&self) -> bool {
        self.spin.load(Ordering::Relaxed)
    }

    /// What the judge knows now.
    pub fn verdict(&self) -> Verdict {
        self.lock().verdict()
    }

    /// After a controller state was restored (upgrade, migration): the commands
    /// counter jumped, so the running epoch is not judged.
    pub fn restart_epoch(&self) {
        self.lock().restart_epoch();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Judging> {
        self.judging.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// CPU time of the whole process (every thread, including those that ended).
pub fn process_cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `epochs` epochs of `commands` each, costing `sleep` or `spin` ns per
    /// command by regime; returns the regimes run, in order.
    fn run(
        j: &mut Judging,
        clock: &mut (Duration, u64),
        epochs: usize,
        sleep: u64,
        spin: u64,
    ) -> Vec<Regime> {
        let mut ran = Vec::new();
        for _ in 0..epochs {
            let per = if j.running == Regime::Spin { spin } else { sleep };
            clock.0 += Duration::from_nanos(per * 1000);
            clock.1 += 1000;
            ran.push(j.running);
            j.epoch_over(clock.0, clock.1);
        }
        ran
    }

    fn start() -> (Judging, (Duration, u64)) {
        let mut j = Judging::default();
        assert_eq!(j.epoch_over(Duration::ZERO, 0), Regime::Sleep, "the first epoch sleeps");
        (j, (Duration::ZERO, 0))
    }

    #[test]
    fn a_slow_guest_settles_on_sleeping_and_explores_ever_more_rarely() {
        // A TCG guest at QD 1: spinning costs 2.5 times as much per command.
        let (mut j, mut c) = start();
        let ran = run(&mut j, &mut c, 400, 20_000, 50_000);
        let v = j.verdict();
        assert_eq!(v.choice, Regime::Sleep);
        assert_eq!(v.changes, 0);
        let spun = ran.iter().filter(|&&r| r == Regime::Spin).count();
        // After 8, 16, 32, 64, then every 128 epochs: six explorations in 400.
        assert!((5..=9).contains(&spun), "{spun} spin epochs");
        assert!(ran[280..].iter().filter(|&&r| r == Regime::Spin).count() <= 1);
        assert_eq!(v.cost_ns, [Some(20_000), Some(50_000)]);
        assert!(v.describe().contains("chose to sleep"), "{}", v.describe());
    }

    #[test]
    fn a_fast_guest_settles_on_spinning_and_a_change_of_pace_turns_it_back() {
        let (mut j, mut c) = start();
        // Spinning is cheaper (a guest that sends the next command within a few us).
        let ran = run(&mut j, &mut c, 100, 18_000, 7_000);
        assert_eq!(j.verdict().choice, Regime::Spin);
        assert!(ran[10..].iter().filter(|&&r| r == Regime::Spin).count() > 80);
        // The guest slows down: now spinning costs more, and the next exploration
        // of sleeping (at most MAX_EXPLORE epochs away) finds it.
        run(&mut j, &mut c, MAX_EXPLORE as usize + 2, 18_000, 40_000);
        let v = j.verdict();
        assert_eq!(v.choice, Regime::Sleep);
        assert_eq!(v.changes, 2);
    }

    #[test]
    fn costs_within_the_margin_do_not_flip_the_choice() {
        let (mut j, mut c) = start();
        run(&mut j, &mut c, 300, 10_000, 9_500);
        let v = j.verdict();
        assert_eq!(v.choice, Regime::Sleep, "5 % cheaper is inside the margin");
        assert_eq!(v.changes, 0);
    }

    #[test]
    fn an_exploration_adds_up_short_windows_and_gives_up_when_the_guest_goes_quiet() {
        let (mut j, mut c) = start();
        run(&mut j, &mut c, 1, 20_000, 50_000);
        assert!(j.exploring(), "spinning is explored after one sleep epoch");
        // 40 commands per 20 ms window (2,000 commands/s): two windows make one judgement.
        c.1 += 40;
        assert_eq!(j.epoch_over(c.0, c.1), Regime::Spin, "not enough yet: the exploration goes on");
        c.0 += Duration::from_micros(80 * 50);
        c.1 += 40;
        assert_eq!(j.epoch_over(c.0, c.1), Regime::Sleep, "judged on 80 commands, sleeping stays");
        assert_eq!(j.verdict().epochs, 2);
        // An exploration during which the guest goes quiet is given up, unjudged.
        let (mut j, mut c) = start();
        run(&mut j, &mut c, 1, 20_000, 50_000);
        let mut ran = Vec::new();
        for _ in 0..MAX_EXPLORE_WINDOWS {
            c.1 += 1;
            ran.push(j.epoch_over(c.0, c.1));
        }
        assert_eq!(ran.last(), Some(&Regime::Sleep), "{ran:?}");
        assert_eq!(ran.iter().filter(|&&r| r == Regime::Spin).count(), MAX_EXPLORE_WINDOWS as usize - 1);
        assert_eq!(j.verdict().epochs, 1, "only the first sleep epoch was judged");
        // And the judge goes on: a busy guest gets its exploration later.
        let ran = run(&mut j, &mut c, 2 * MAX_EXPLORE as usize, 20_000, 50_000);
        assert!(ran.contains(&Regime::Spin));
    }

    #[test]
    fn a_restored_state_does_not_make_an_epoch_look_free() {
        let (mut j, mut c) = start();
        run(&mut j, &mut c, 3, 20_000, 50_000);
        // The commands counter jumps by a million (restored), the CPU time does not.
        c.1 += 1_000_000;
        j.restart_epoch();
        j.epoch_over(c.0, c.1);
        run(&mut j, &mut c, 300, 20_000, 50_000);
        let v = j.verdict();
        assert_eq!(v.cost_ns, [Some(20_000), Some(50_000)], "no near-zero cost was recorded");
    }

    #[test]
    fn idle_epochs_judge_nothing() {
        let (mut j, _) = start();
        for i in 1..100u64 {
            // Ten commands per epoch: below MIN_COMMANDS.
            assert_eq!(j.epoch_over(Duration::from_millis(i), i * 10), Regime::Sleep);
        }
        let v = j.verdict();
        assert_eq!((v.epochs, v.cost_ns), (0, [None, None]));
    }

    #[test]
    fn the_judge_reads_the_process_clock_and_the_commands_once_an_epoch_is_over() {
        let stats = Arc::new(Stats::default());
        let judge = SpinJudge::new(stats.clone());
        let t0 = Instant::now();
        // The first question starts the first epoch: it sleeps.
        assert!(!judge.may_spin(t0));
        // Within the epoch nothing changes, whatever happens meanwhile.
        stats.add_io_commands(1000);
        assert!(!judge.may_spin(t0 + EPOCH / 2));
        // Past it, the sleep epoch is judged and spinning is explored next.
        assert!(judge.may_spin(t0 + EPOCH * 3 / 2));
        stats.add_io_commands(1000);
        judge.may_spin(t0 + EPOCH * 3);
        let v = judge.verdict();
        assert_eq!(v.epochs, 2);
        assert!(v.cost_ns.iter().all(Option::is_some), "{v:?}");
        assert!(process_cpu_time() > Duration::ZERO);
    }
}
