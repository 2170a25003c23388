//! When an idle queue owner spins and when it sleeps.
//!
//! An owner of queues (an I/O worker, or the server's own thread when there are no
//! workers) that runs out of work can either sleep, with EventIdx re-armed so the
//! host rings the next doorbell, or keep looking at the shadow doorbells with
//! EventIdx left stale, so the host does not ring at all. Spinning saves the host a
//! trapped doorbell write and the owner a wake-up, and costs CPU time for as long as
//! the queues stay empty.
//!
//! [`SpinPolicy`] makes that choice per idle period in [`PollMode::Adaptive`]:
//!
//! - It keeps a running average of the *gap*: how long an idle period lasts until
//!   new work shows up, whether the owner spun through it or slept through it. It
//!   spins only when the average gap is short ([`MAX_SPIN`] at most), and then for
//!   one and a half times the gap, so most new work lands inside the spin.
//! - It watches for contention: over each window of [`WINDOW`] spins it compares
//!   the wall time spun with the CPU time the thread got. If a quarter or more went
//!   to other threads, spinning is taking a CPU others want (on a small host, often
//!   a vCPU). A short preemption, say by a VMM thread injecting an interrupt, costs
//!   a spin little and is not counted against it; a CPU-bound neighbour is. The
//!   policy then stops spinning for a number of idle periods that doubles each time
//!   it happens again (up to [`MAX_BACKOFF`] periods), and starts at
//!   [`MIN_BACKOFF`] again after a window that ran mostly undisturbed.
//!
//! - It spins politely ([`PoliteSpin`]): every [`YIELD_EVERY`] it yields the CPU, so
//!   a thread that became runnable on the spinner's CPU (a vCPU, the VMM's thread
//!   injecting an interrupt) waits for it a few microseconds at most, whatever the
//!   scheduler's preemption rules. Measured with a TCG guest on 2 host cores:
//!   without yielding, adaptive polling lost 9 and 16 % to not polling at QD 4 (two
//!   runs); yielding every 5 µs it was ahead at QD 1 and 4 and level at QD 16.
//!
//! So a busy host and long gaps both lead to plain sleeping, which is what
//! [`PollMode::Off`] does: adaptive polling costs at most a short spin now and then
//! over not polling.
//!
//! Whether spinning pays at all is judged apart, for the whole controller, from the
//! process's CPU time per command with and without it ([`super::judge`]): in the
//! epochs the judge says sleep, the budget is zero.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::judge::SpinJudge;

/// How queue owners wait for work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PollMode {
    /// Re-arm EventIdx and sleep as soon as there is no work.
    Off,
    /// Spin while new work tends to arrive soon and the CPU is not contended.
    #[default]
    Adaptive,
    /// Never sleep; EventIdx stays stale. Needed for doorbell pages mapped into the
    /// guest, whose stores produce no notification.
    Always,
}

impl PollMode {
    /// The name `--poll` takes.
    pub fn name(self) -> &'static str {
        match self {
            PollMode::Off => "off",
            PollMode::Adaptive => "adaptive",
            PollMode::Always => "always",
        }
    }
}

impl std::fmt::Display for PollMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for PollMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(PollMode::Off),
            "adaptive" => Ok(PollMode::Adaptive),
            "always" => Ok(PollMode::Always),
            _ => Err(format!("unknown poll mode {s:?} (expected off, adaptive or always)")),
        }
    }
}

/// The longest an adaptive owner spins in one idle period.
pub const MAX_SPIN: Duration = Duration::from_micros(200);
/// Idle periods without spinning after the first contended spin.
pub const MIN_BACKOFF: u32 = 16;
/// The most idle periods without spinning after repeated contention.
pub const MAX_BACKOFF: u32 = 4096;
/// Spins per contention window.
pub const WINDOW: u32 = 16;
/// A window counts as contended when the thread lost this share of it (1/N) or more.
const LOST_SHARE: u64 = 4;
/// The gap average moves by 1/GAP_WEIGHT of each new sample.
const GAP_WEIGHT: u64 = 8;

/// How often a spinning thread yields its CPU.
pub const YIELD_EVERY: Duration = Duration::from_micros(5);

/// The pause of a spin loop: a CPU relax hint, and a yield every [`YIELD_EVERY`].
#[derive(Debug)]
pub struct PoliteSpin {
    last_yield: Instant,
}

impl PoliteSpin {
    /// A spin that began at `now`.
    pub fn starting(now: Instant) -> Self {
        PoliteSpin { last_yield: now }
    }

    /// Call once per spin-loop iteration, with the time the loop just read.
    pub fn pause(&mut self, now: Instant) {
        if now.duration_since(self.last_yield) >= YIELD_EVERY {
            std::thread::yield_now();
            self.last_yield = Instant::now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// What one spin phase found, for [`SpinPolicy::after_spin`].
#[derive(Clone, Copy, Debug)]
pub struct Spin {
    /// Work showed up before the budget ran out.
    pub found: bool,
    /// Wall time spun.
    pub wall: Duration,
    /// CPU time the thread got meanwhile.
    pub cpu: Duration,
}

/// A spin phase being timed (see [`SpinPolicy::start_spin`]).
#[derive(Clone, Copy, Debug)]
pub struct SpinClock {
    start: Instant,
    /// The thread's CPU time at the start, when the policy needs it.
    cpu: Option<Duration>,
}

impl SpinClock {
    /// Wall time since the phase started.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// When the phase started.
    pub fn started(&self) -> Instant {
        self.start
    }
}

/// Counters of one policy.
#[derive(Clone, Copy, Debug, Default)]
pub struct SpinStats {
    /// Spin phases that found work.
    pub hits: u64,
    /// Spin phases that ran out.
    pub misses: u64,
    /// Windows of spins that lost too much CPU time to other threads.
    pub contended: u64,
    /// Nanoseconds spun.
    pub spin_ns: u64,
    /// Nanoseconds of those during which other threads had the CPU (measured in
    /// adaptive mode only).
    pub lost_ns: u64,
}

impl SpinStats {
    /// The counters as one log phrase; the preempted share only where it is measured.
    pub fn describe(&self, mode: PollMode) -> String {
        let mut d = format!(
            "spins {} hit, {} missed, {} contended windows; spun {} ms",
            self.hits,
            self.misses,
            self.contended,
            self.spin_ns / 1_000_000
        );
        if mode == PollMode::Adaptive {
            d += &format!(", {} ms of it preempted", self.lost_ns / 1_000_000);
        }
        d
    }
}

/// Decides the spin budget of each idle period (see the module documentation).
#[derive(Clone, Debug)]
pub struct SpinPolicy {
    mode: PollMode,
    /// Average gap in nanoseconds; starts at the cap, so spinning starts small.
    gap_ns: u64,
    /// Idle periods left without spinning.
    backoff_left: u32,
    /// The next backoff length.
    backoff: u32,
    /// The current contention window: spins, wall and lost nanoseconds.
    window: (u32, u64, u64),
    /// Whether spinning pays at all, judged for the whole controller (adaptive mode;
    /// none: the budget alone decides).
    judge: Option<Arc<SpinJudge>>,
    pub stats: SpinStats,
}

impl SpinPolicy {
    pub fn new(mode: PollMode) -> Self {
        SpinPolicy {
            mode,
            gap_ns: MAX_SPIN.as_nanos() as u64,
            backoff_left: 0,
            backoff: MIN_BACKOFF,
            window: (0, 0, 0),
            judge: None,
            stats: SpinStats::default(),
        }
    }

    /// A policy that spins only in the epochs `judge` allows it (adaptive mode).
    pub fn judged(mode: PollMode, judge: Option<Arc<SpinJudge>>) -> Self {
        SpinPolicy { judge, ..SpinPolicy::new(mode) }
    }

    pub fn mode(&self) -> PollMode {
        self.mode
    }

    /// Adaptive mode in an epoch its judge gave to sleeping: the owner then waits
    /// as `--poll off` does, EventIdx armed on every run. The regime as it stands
    /// (a load); [`Self::judge_allows_spin`] or [`Self::budget`] end an epoch that is over.
    pub fn sleep_regime(&self) -> bool {
        self.mode == PollMode::Adaptive && self.judge.as_ref().is_some_and(|j| !j.spinning())
    }

    /// Asks the judge (ending its epoch if that is over) whether spinning is
    /// allowed now. False without a judge.
    pub fn judge_allows_spin(&self) -> bool {
        self.judge.as_ref().is_some_and(|j| j.may_spin(Instant::now()))
    }

    /// The spin budget for the idle period starting now (`Duration::MAX`: forever).
    pub fn budget(&mut self) -> Duration {
        match self.mode {
            PollMode::Off => Duration::ZERO,
            PollMode::Always => Duration::MAX,
            PollMode::Adaptive => {
                if self.judge.as_ref().is_some_and(|j| !j.may_spin(Instant::now())) {
                    return Duration::ZERO;
                }
                if self.backoff_left > 0 {
                    self.backoff_left -= 1;
                    return Duration::ZERO;
                }
                let cap = MAX_SPIN.as_nanos() as u64;
                if self.gap_ns > cap {
                    return Duration::ZERO;
                }
                Duration::from_nanos((self.gap_ns * 3 / 2).min(cap))
            }
        }
    }

    /// Starts timing a spin phase. Only adaptive polling acts on contention, so only
    /// it reads the thread's CPU clock (a system call at each end of the phase).
    pub fn start_spin(&self) -> SpinClock {
        let cpu = (self.mode == PollMode::Adaptive).then(thread_cpu_time);
        SpinClock { start: Instant::now(), cpu }
    }

    /// Ends a spin phase started with [`Self::start_spin`] and records it.
    pub fn end_spin(&mut self, c: SpinClock, found: bool) {
        let wall = c.start.elapsed();
        let cpu = c.cpu.map_or(wall, |t| thread_cpu_time().saturating_sub(t));
        self.after_spin(Spin { found, wall, cpu });
    }

    /// Records a spin phase.
    pub fn after_spin(&mut self, s: Spin) {
        let wall = s.wall.as_nanos() as u64;
        let lost = wall.saturating_sub(s.cpu.as_nanos() as u64);
        self.stats.spin_ns += wall;
        self.stats.lost_ns += lost;
        if s.found {
            self.stats.hits += 1;
        } else {
            self.stats.misses += 1;
        }
        if self.mode != PollMode::Adaptive {
            return;
        }
        let w = &mut self.window;
        *w = (w.0 + 1, w.1 + wall, w.2 + lost);
        if w.0 < WINDOW {
            return;
        }
        let (_, wall, lost) = std::mem::take(w);
        if wall > 0 && lost * LOST_SHARE >= wall {
            self.stats.contended += 1;
            self.backoff_left = self.backoff;
            self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        } else {
            self.backoff = MIN_BACKOFF;
        }
    }

    /// Records how long an idle period lasted until new work arrived (spun or slept).
    pub fn work_after(&mut self, gap: Duration) {
        let g = (gap.as_nanos() as u64).min(10 * MAX_SPIN.as_nanos() as u64);
        self.gap_ns = self.gap_ns - self.gap_ns / GAP_WEIGHT + g / GAP_WEIGHT;
    }
}

/// CPU time of the calling thread.
pub fn thread_cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn off_never_spins_and_always_never_stops() {
        let mut p = SpinPolicy::new(PollMode::Off);
        p.work_after(us(1));
        assert_eq!(p.budget(), Duration::ZERO);
        let mut p = SpinPolicy::new(PollMode::Always);
        p.after_spin(Spin { found: true, wall: us(100), cpu: us(1) });
        assert_eq!(p.budget(), Duration::MAX);
    }

    #[test]
    fn short_gaps_earn_a_spin_of_one_and_a_half_gaps() {
        let mut p = SpinPolicy::new(PollMode::Adaptive);
        for _ in 0..100 {
            p.work_after(us(40));
        }
        let b = p.budget();
        assert!(b >= us(58) && b <= us(61), "budget {b:?}");
    }

    #[test]
    fn long_gaps_mean_no_spinning_and_the_budget_is_capped() {
        let mut p = SpinPolicy::new(PollMode::Adaptive);
        for _ in 0..100 {
            p.work_after(us(5000));
        }
        assert_eq!(p.budget(), Duration::ZERO);
        for _ in 0..100 {
            p.work_after(us(180));
        }
        assert_eq!(p.budget(), MAX_SPIN);
    }

    /// Feeds one window of spins that each lost `lost` of `wall` microseconds.
    fn window(p: &mut SpinPolicy, wall: u64, lost: u64) {
        for _ in 0..WINDOW {
            p.after_spin(Spin { found: true, wall: us(wall), cpu: us(wall - lost) });
        }
    }

    #[test]
    fn contention_backs_off_for_a_doubling_number_of_periods() {
        let mut p = SpinPolicy::new(PollMode::Adaptive);
        for _ in 0..100 {
            p.work_after(us(10));
        }
        assert!(p.budget() > Duration::ZERO);
        // A window that lost half its spinning to other threads.
        window(&mut p, 20, 10);
        assert_eq!(p.stats.contended, 1);
        for _ in 0..MIN_BACKOFF {
            assert_eq!(p.budget(), Duration::ZERO);
        }
        assert!(p.budget() > Duration::ZERO);
        window(&mut p, 20, 15);
        for _ in 0..2 * MIN_BACKOFF {
            assert_eq!(p.budget(), Duration::ZERO);
        }
        assert!(p.budget() > Duration::ZERO);
        // An undisturbed window resets the backoff length.
        window(&mut p, 20, 0);
        window(&mut p, 20, 20);
        for _ in 0..MIN_BACKOFF {
            assert_eq!(p.budget(), Duration::ZERO);
        }
        assert!(p.budget() > Duration::ZERO);
        assert_eq!(p.stats.contended, 3);
        assert_eq!(p.stats.hits, 4 * WINDOW as u64);
        assert_eq!(p.stats.lost_ns, (10 + 15 + 20) * 1000 * WINDOW as u64);
    }

    #[test]
    fn short_preemptions_are_not_contention() {
        let mut p = SpinPolicy::new(PollMode::Adaptive);
        for _ in 0..100 {
            p.work_after(us(100));
        }
        // One spin of the window mostly lost (an interrupt injection, say), the rest clean.
        p.after_spin(Spin { found: false, wall: us(150), cpu: us(50) });
        for _ in 1..WINDOW {
            p.after_spin(Spin { found: true, wall: us(150), cpu: us(140) });
        }
        assert_eq!(p.stats.contended, 0);
        assert!(p.budget() > Duration::ZERO);
        assert_eq!((p.stats.hits, p.stats.misses), (WINDOW as u64 - 1, 1));
    }

    #[test]
    fn spin_clock_times_a_phase_and_reads_the_cpu_clock_only_when_adaptive() {
        for mode in [PollMode::Adaptive, PollMode::Always] {
            let mut p = SpinPolicy::new(mode);
            let c = p.start_spin();
            assert_eq!(c.cpu.is_some(), mode == PollMode::Adaptive);
            while c.elapsed() < Duration::from_millis(2) {
                std::hint::spin_loop();
            }
            p.end_spin(c, true);
            assert_eq!(p.stats.hits, 1);
            assert!(p.stats.spin_ns >= 2_000_000 && p.stats.lost_ns <= p.stats.spin_ns);
            if mode == PollMode::Always {
                assert_eq!(p.stats.lost_ns, 0);
            }
            assert_eq!(p.stats.describe(mode).contains("preempted"), mode == PollMode::Adaptive);
        }
    }

    #[test]
    fn thread_cpu_time_advances_while_working() {
        let a = thread_cpu_time();
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(5) {
            std::hint::spin_loop();
        }
        assert!(thread_cpu_time() > a);
    }
}
