//! Rate limits for log lines a peer can cause: a leaf crate, so the controller, the
//! vfio-user server and the service's sockets share one rule.
//!
//! A guest or a VMM that misbehaves in a loop must not be able to fill the log (or
//! spend our time formatting lines). Each class of such lines gets a [`LogLimit`]:
//! the first [`LogLimit::FULL`] occurrences are logged, then one in
//! [`LogLimit::EVERY`], each line saying how many there have been so far.

use std::sync::atomic::{AtomicU64, Ordering};

#[doc(hidden)]
pub use tracing;

/// Counts occurrences of one kind of peer-caused event and says which to log.
#[derive(Debug, Default)]
pub struct LogLimit {
    seen: AtomicU64,
}

impl LogLimit {
    /// Occurrences logged in full before thinning starts.
    pub const FULL: u64 = 16;
    /// After that, one occurrence in this many is logged.
    pub const EVERY: u64 = 1000;

    pub const fn new() -> Self {
        LogLimit { seen: AtomicU64::new(0) }
    }

    /// Counts one occurrence; `Some(n)` (the count so far) when this one is logged.
    pub fn hit(&self) -> Option<u64> {
        let n = self.seen.fetch_add(1, Ordering::Relaxed) + 1;
        (n <= Self::FULL || n.is_multiple_of(Self::EVERY)).then_some(n)
    }

    /// Occurrences so far.
    pub fn count(&self) -> u64 {
        self.seen.load(Ordering::Relaxed)
    }
}

/// `tracing::warn!` for a line a guest or VMM can cause: each call site gets its own
/// [`LogLimit`], and every line carries `occurrences`, the count so far.
///
/// ```text
/// limited_warn!(target: "vnvme::guest", qid, "invalid doorbell write");
/// ```
#[macro_export]
macro_rules! limited_warn {
    (target: $target:expr, $($rest:tt)+) => {{
        static LIMIT: $crate::LogLimit = $crate::LogLimit::new();
        if let Some(occurrences) = LIMIT.hit() {
            $crate::tracing::warn!(target: $target, occurrences, $($rest)+);
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_sixteen_then_one_in_a_thousand() {
        let l = LogLimit::new();
        let logged: Vec<u64> = (0..5000).filter_map(|_| l.hit()).collect();
        let mut want: Vec<u64> = (1..=16).collect();
        want.extend([1000, 2000, 3000, 4000, 5000]);
        assert_eq!(logged, want);
        assert_eq!(l.count(), 5000);
    }
}
