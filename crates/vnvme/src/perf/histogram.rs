//! Latency histogram for `vnvme perf`.

/// A log-linear latency histogram (HDR-like): exact below 64 ns, then 32 buckets per
/// power of two (at most ~3 % relative error).
#[derive(Clone, Debug)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    sum: u128,
    max: u64,
}

const SUB: u32 = 5;

impl Default for Histogram {
    fn default() -> Self {
        Histogram { counts: vec![0; 64 + (64 - 6) * 32], total: 0, sum: 0, max: 0 }
    }
}

impl Histogram {
    fn index(v: u64) -> usize {
        if v < 64 {
            return v as usize;
        }
        let e = 63 - v.leading_zeros();
        64 + (e as usize - 6) * 32 + ((v >> (e - SUB)) as usize - 32)
    }

    /// The middle of bucket `i`.
    fn value(i: usize) -> u64 {
        if i < 64 {
            return i as u64;
        }
        let e = (i - 64) / 32 + 6;
        let m = ((i - 64) % 32 + 32) as u64;
        let lo = m << (e as u32 - SUB);
        lo + (1u64 << (e as u32 - SUB)) / 2
    }

    pub fn record(&mut self, ns: u64) {
        self.counts[Self::index(ns)] += 1;
        self.total += 1;
        self.sum += ns as u128;
        self.max = self.max.max(ns);
    }

    pub fn merge(&mut self, o: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.total += o.total;
        self.sum += o.sum;
        self.max = self.max.max(o.max);
    }

    /// The largest value recorded.
    pub fn max(&self) -> u64 {
        self.max
    }

    pub fn mean(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum as f64 / self.total as f64
        }
    }

    /// The value at quantile `q` (0..=1).
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::value(i).min(self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_are_close() {
        let mut h = Histogram::default();
        for v in 1..=100_000u64 {
            h.record(v * 10);
        }
        for (q, want) in [(0.5, 500_000.0), (0.99, 990_000.0), (0.999, 999_000.0)] {
            let got = h.quantile(q) as f64;
            assert!((got - want).abs() / want < 0.04, "q{q}: {got} vs {want}");
        }
        assert_eq!(h.quantile(1.0), 1_000_000);
        assert!((h.mean() - 500_005.0).abs() < 1.0);
        for v in [0u64, 1, 63, 64, 65, 1000, u64::MAX / 2, u64::MAX] {
            let i = Histogram::index(v);
            assert!(i < h.counts.len(), "{v}");
        }
    }
}
