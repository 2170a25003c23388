//! QoS: IOPS and bytes-per-second limits (total, read, write), each with a burst, as
//! QEMU's throttle groups offer them. A [`QosGroup`] holds one set of limits and may
//! be shared by several namespaces; its limits can change while commands flow.
//!
//! Each limit is a GCRA bucket (the generic cell rate algorithm, a token bucket kept
//! as one number): the "theoretical arrival time" `tat` moves forward by a command's
//! cost (1 s / rate per command, or bytes x 1 s / rate), and a command may start
//! while `tat - tolerance <= now`, the tolerance being the burst's worth of time. So a
//! bucket is one atomic that any engine updates with a compare-and-swap: no lock, no
//! system call (the engine's clock reading of its poll is reused), and nothing at all
//! for a namespace without limits (the engine keeps `None` for it).
//!
//! A command that may not start yet is held back by its engine (`engine::throttle`)
//! until the moment the buckets name, in order, and counted in the namespace's
//! `throttled_*` statistics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::stats::OpClass;

/// One limit: `rate` per second (commands or bytes), and how much may go at once
/// above that rate after an idle spell (0: a tenth of a second's worth).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limit {
    pub rate: u64,
    pub burst: u64,
}

impl Limit {
    /// The burst in effect: as given, or a tenth of the rate (at least 1).
    pub fn burst(&self) -> u64 {
        if self.burst > 0 {
            self.burst
        } else {
            (self.rate / 10).max(1)
        }
    }
}

/// A set of limits; None: no limit of that kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QosLimits {
    pub iops: Option<Limit>,
    pub read_iops: Option<Limit>,
    pub write_iops: Option<Limit>,
    pub bps: Option<Limit>,
    pub read_bps: Option<Limit>,
    pub write_bps: Option<Limit>,
}

/// For logs: `iops=2000/s (burst 200) bps_wr=20971520/s (burst 2097152)`, or `none`.
impl std::fmt::Display for QosLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const NAMES: [&str; 6] = ["iops", "iops_rd", "iops_wr", "bps", "bps_rd", "bps_wr"];
        let mut any = false;
        for (name, l) in NAMES.iter().zip(self.all()) {
            if let Some(l) = l {
                write!(f, "{}{name}={}/s (burst {})", if any { " " } else { "" }, l.rate, l.burst())?;
                any = true;
            }
        }
        if !any {
            f.write_str("none")?;
        }
        Ok(())
    }
}

impl QosLimits {
    /// True if no limit is set.
    pub fn is_empty(&self) -> bool {
        self.all().iter().all(Option::is_none)
    }

    fn all(&self) -> [Option<Limit>; 6] {
        [self.iops, self.read_iops, self.write_iops, self.bps, self.read_bps, self.write_bps]
    }

    /// Checks every rate is usable (1 to 10^12 per second).
    pub fn check(&self) -> Result<(), String> {
        for l in self.all().into_iter().flatten() {
            if l.rate == 0 || l.rate > 1_000_000_000_000 {
                return Err(format!("a rate must be 1..=10^12 per second, not {}", l.rate));
            }
        }
        Ok(())
    }
}

/// One GCRA bucket.
#[derive(Debug, Default)]
struct Bucket {
    /// Nanoseconds per unit, as a 32.32 fixed-point number (0: no limit).
    ns_per_unit_q32: AtomicU64,
    /// The burst's worth of time, in nanoseconds.
    tolerance_ns: AtomicU64,
    /// Theoretical arrival time (controller clock, ns).
    tat: AtomicU64,
}

impl Bucket {
    fn set(&self, l: Option<Limit>) {
        match l {
            None => self.ns_per_unit_q32.store(0, Ordering::Relaxed),
            Some(l) => {
                let q = ((1_000_000_000u128 << 32) / l.rate as u128).max(1);
                // B commands may go at once: the first, and B - 1 more ahead of time.
                let tol = ((l.burst() - 1) as u128 * q) >> 32;
                self.tolerance_ns.store(tol.min(u64::MAX as u128) as u64, Ordering::Relaxed);
                self.ns_per_unit_q32.store(q.min(u64::MAX as u128) as u64, Ordering::Relaxed);
            }
        }
    }

    /// The cost of `units` in nanoseconds, or None without a limit.
    fn cost(&self, units: u64) -> Option<u64> {
        let q = self.ns_per_unit_q32.load(Ordering::Relaxed);
        (q != 0).then(|| ((units as u128 * q as u128) >> 32).min(u64::MAX as u128) as u64)
    }

    /// How long from `now` until this bucket lets a command start (0: now).
    fn wait(&self, now: u64) -> u64 {
        let tat = self.tat.load(Ordering::Relaxed);
        tat.saturating_sub(self.tolerance_ns.load(Ordering::Relaxed)).saturating_sub(now)
    }

    /// Charges `cost` nanoseconds at `now`.
    fn charge(&self, now: u64, cost: u64) {
        let mut tat = self.tat.load(Ordering::Relaxed);
        loop {
            let new = tat.max(now).saturating_add(cost);
            match self.tat.compare_exchange_weak(tat, new, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(t) => tat = t,
            }
        }
    }
}

/// Limits shared by the namespaces that use them.
#[derive(Debug, Default)]
pub struct QosGroup {
    /// A name for logs and the control socket (a namespace's own limits are named
    /// after it).
    pub name: String,
    limits: Mutex<QosLimits>,
    /// iops, read iops, write iops, bps, read bps, write bps.
    buckets: [Bucket; 6],
}

impl QosGroup {
    pub fn new(name: impl Into<String>, limits: QosLimits) -> Result<Self, String> {
        let g = QosGroup { name: name.into(), ..Default::default() };
        g.set_limits(limits)?;
        Ok(g)
    }

    /// Changes the limits; commands held back are re-timed at the engines' next look.
    pub fn set_limits(&self, limits: QosLimits) -> Result<(), String> {
        limits.check()?;
        for (b, l) in self.buckets.iter().zip(limits.all()) {
            b.set(l);
        }
        *self.limits.lock().unwrap_or_else(|p| p.into_inner()) = limits;
        Ok(())
    }

    pub fn limits(&self) -> QosLimits {
        *self.limits.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The buckets a command of `class` draws from, with its cost in units of each.
    fn draws(&self, class: OpClass, bytes: u64) -> [(&Bucket, u64); 4] {
        let [iops, riops, wiops, bps, rbps, wbps] = &self.buckets;
        let none = &self.buckets[0];
        match class {
            OpClass::Read => [(iops, 1), (riops, 1), (bps, bytes), (rbps, bytes)],
            OpClass::Write => [(iops, 1), (wiops, 1), (bps, bytes), (wbps, bytes)],
            // Flush and the rest count as commands, moving no bytes.
            _ => [(iops, 1), (none, 0), (none, 0), (none, 0)],
        }
    }

    /// Admits a command of `class` moving `bytes` at `now` (clock ns): charges the
    /// buckets and returns 0, or returns how many nanoseconds to wait first (nothing
    /// charged).
    pub fn admit(&self, class: OpClass, bytes: u64, now: u64) -> u64 {
        let draws = self.draws(class, bytes);
        let mut wait = 0;
        for (b, units) in draws {
            if units > 0 && b.cost(units).is_some() {
                wait = wait.max(b.wait(now));
            }
        }
        if wait > 0 {
            return wait;
        }
        for (b, units) in draws {
            if units > 0 {
                if let Some(c) = b.cost(units) {
                    b.charge(now, c);
                }
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs commands back to back for `secs` of simulated time; returns how many got
    /// through.
    fn run(g: &QosGroup, class: OpClass, bytes: u64, secs: u64) -> u64 {
        let (mut now, end, mut n) = (0u64, secs * 1_000_000_000, 0);
        while now < end {
            match g.admit(class, bytes, now) {
                0 => n += 1,
                w => now += w,
            }
        }
        n
    }

    #[test]
    fn an_iops_limit_holds_its_rate_after_the_burst() {
        let g = QosGroup::new(
            "t",
            QosLimits { iops: Some(Limit { rate: 2000, burst: 0 }), ..Default::default() },
        )
        .unwrap();
        let n = run(&g, OpClass::Read, 4096, 10);
        // 10 s at 2,000/s, plus the burst of 200 at the start.
        assert!((20_000..=20_201).contains(&n), "{n}");
    }

    #[test]
    fn a_bytes_limit_counts_bytes_and_only_its_direction() {
        let l = Limit { rate: 20 << 20, burst: 1 << 20 };
        let g = QosGroup::new("t", QosLimits { write_bps: Some(l), ..Default::default() }).unwrap();
        let n = run(&g, OpClass::Write, 64 << 10, 5);
        let bytes = n * (64 << 10);
        assert!((100 << 20..=(100 << 20) + (2 << 20)).contains(&bytes), "{bytes}");
        assert_eq!(g.admit(OpClass::Read, 1 << 30, 0), 0, "reads are not limited");
    }

    #[test]
    fn limits_change_live_and_bad_rates_are_refused() {
        let g =
            QosGroup::new("t", QosLimits { iops: Some(Limit { rate: 100, burst: 1 }), ..Default::default() })
                .unwrap();
        assert_eq!(g.admit(OpClass::Flush, 0, 0), 0);
        assert!(g.admit(OpClass::Flush, 0, 0) > 0, "over the limit");
        g.set_limits(QosLimits::default()).unwrap();
        assert_eq!(g.admit(OpClass::Flush, 0, 0), 0, "no limit any more");
        let bad = QosLimits { bps: Some(Limit { rate: 0, burst: 0 }), ..Default::default() };
        assert!(g.set_limits(bad).is_err());
    }
}
