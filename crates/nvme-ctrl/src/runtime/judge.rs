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
//! the choice and starts over at [`MIN_EXPLORE`]. Epochs with fewer than
//! [`MIN_COMMANDS`] commands say nothing and are not counted: an idle device costs
//! the same either way.
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
    /// Epochs judged, and how many of them changed the choice.
    pub epochs: u64,
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
pub struct Judging {
    running: Regime,
    choice: Regime,
    /// Process CPU time and commands completed when the running epoch started.
    start: Option<(Duration, u64)>,
    /// Cost per command (ns) by regime: the choice's a running average over the
    /// epochs that ran it, the other's from its last exploration.
    cost: [Option<u64>; 2],
    explore_every: u32,
    explore_in: u32,
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
                // Too idle to say anything: carry on as is.
                self.start = Some((cpu, commands));
                return self.running;
            }
            let per = (cpu.saturating_sub(cpu0).as_nanos() / u128::from(n)) as u64;
            self.judge(per);
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

    /// The running epoch explores the regime not chosen.
    pub fn exploring(&self) -> bool {
        self.running != self.choice
    }

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
        let Ok(mut j) = self.judging.try_lock() else { return };
        if t < self.epoch_end_ns.load(Ordering::Relaxed) {
            return; // another owner judged it meanwhile
        }
        let next = j.epoch_over(process_cpu_time(), self.stats.io_commands.load(Ordering::Relaxed));
        self.spin.store(next == Regime::Spin, Ordering::Relaxed);
        let length = if j.exploring() { EXPLORE_EPOCH } else { EPOCH };
        self.epoch_end_ns.store(t + length.as_nanos() as u64, Ordering::Relaxed);
    }

    pub fn verdict(&self) -> Verdict {
        self.judging.lock().unwrap_or_else(|p| p.into_inner()).verdict()
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
        // 4, 8, 16, 32, 64, then every 128: seven explorations in 400 epochs.
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
        stats.io_commands.fetch_add(1000, Ordering::Relaxed);
        assert!(!judge.may_spin(t0 + EPOCH / 2));
        // Past it, the sleep epoch is judged and spinning is explored next.
        assert!(judge.may_spin(t0 + EPOCH * 3 / 2));
        stats.io_commands.fetch_add(1000, Ordering::Relaxed);
        judge.may_spin(t0 + EPOCH * 3);
        let v = judge.verdict();
        assert_eq!(v.epochs, 2);
        assert!(v.cost_ns.iter().all(Option::is_some), "{v:?}");
        assert!(process_cpu_time() > Duration::ZERO);
    }
}
