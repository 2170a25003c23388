//! Logging of what this process writes into a mapping, for live migration: a VMM
//! that copies guest memory to another host while the device runs asks (vfio-user
//! DMA logging) which pages the device wrote since it last asked, and copies those
//! again.
//!
//! Each [`Mapping`](crate::Mapping) carries a [`DirtyLog`]: one bit per
//! [`DIRTY_PAGE`] of the mapping, allocated the first time logging starts. Every
//! write this crate performs ([`GuestMemory::write`](crate::GuestMemory::write),
//! `fill`, `store_u32`) marks the pages it touched after the bytes are in place;
//! memory written by someone else on our behalf (the kernel for an io_uring read,
//! a downstream device) is marked by whoever learns that the write is over, through
//! [`GuestMemory::mark_dirty`](crate::GuestMemory::mark_dirty).
//!
//! Marking after the write is what makes the log safe to read while writes go on:
//! a report that misses a mark clears nothing of it, so the next report has it.
//!
//! Whether to mark is decided after the write as well, behind a full fence
//! ([`logging_after_write`]). A writer that looked before writing could find
//! logging off, be overtaken by a start and the full copy that follows it, and then
//! write a page nobody copies again. With the fence, either the writer sees the
//! start (and marks), or its write was visible before the start, so the copy has it.
//! While no mapping in the process is logged, that is one fence and one relaxed
//! load of a process-wide counter.

use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The logging granularity, in bytes.
pub const DIRTY_PAGE: u64 = 4096;
const SHIFT: u32 = DIRTY_PAGE.trailing_zeros();

/// Mappings of this process that are logging now.
static LOGGING: AtomicUsize = AtomicUsize::new(0);

/// Whether a write that is over must be marked: whether any mapping in the process
/// is logging now. The fence orders the write before the look, and pairs with the
/// SeqCst read-modify-writes of [`DirtyLog::start`] (module docs).
#[inline]
pub(crate) fn logging_after_write() -> bool {
    fence(Ordering::SeqCst);
    LOGGING.load(Ordering::Relaxed) != 0
}

/// The dirty pages of one mapping.
#[derive(Debug)]
pub(crate) struct DirtyLog {
    on: AtomicBool,
    /// `pages` bits, allocated at the first start.
    bits: OnceLock<Box<[AtomicU64]>>,
    pages: u64,
}

impl DirtyLog {
    pub(crate) fn new(len: u64) -> Self {
        DirtyLog { on: AtomicBool::new(false), bits: OnceLock::new(), pages: len.div_ceil(DIRTY_PAGE) }
    }

    fn bits(&self) -> &[AtomicU64] {
        self.bits.get_or_init(|| (0..self.pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect())
    }

    /// Starts logging with every page clean. Starting again while on keeps what is
    /// logged (a client repeating itself loses nothing).
    pub(crate) fn start(&self) {
        let bits = self.bits();
        if !self.on.load(Ordering::Acquire) {
            for w in bits {
                w.store(0, Ordering::Relaxed);
            }
            if !self.on.swap(true, Ordering::SeqCst) {
                LOGGING.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    pub(crate) fn stop(&self) {
        if self.on.swap(false, Ordering::SeqCst) {
            LOGGING.fetch_sub(1, Ordering::SeqCst);
        }
    }

    pub(crate) fn is_on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// Marks the pages under `[off, off + len)` of the mapping.
    pub(crate) fn mark(&self, off: u64, len: u64) {
        if len == 0 || !self.on.load(Ordering::Acquire) {
            return;
        }
        let Some(bits) = self.bits.get() else { return };
        let first = off >> SHIFT;
        let last = ((off + len - 1) >> SHIFT).min(self.pages.saturating_sub(1));
        let mut p = first;
        while p <= last {
            let word = (p / 64) as usize;
            let lo = p % 64;
            let hi = (last - (p - lo)).min(63);
            bits[word].fetch_or(bit_range(lo, hi + 1), Ordering::AcqRel);
            p += hi - lo + 1;
        }
    }

    /// Reports the dirty pages touching `[off, off + len)` of the mapping (their
    /// indexes, in order) and clears those that lie wholly inside it: a page only
    /// partly inside stays marked for a report that covers the rest.
    pub(crate) fn take(&self, off: u64, len: u64, mut f: impl FnMut(u64)) {
        let Some(bits) = self.bits.get() else { return };
        if len == 0 || self.pages == 0 {
            return;
        }
        let first = off >> SHIFT;
        let last = ((off + len - 1) >> SHIFT).min(self.pages - 1);
        // Pages wholly inside the range.
        let whole_first = off.div_ceil(DIRTY_PAGE);
        let whole_end = ((off + len) >> SHIFT).min(self.pages); // exclusive
        let mut p = first;
        while p <= last {
            let word = (p / 64) as usize;
            let lo = p % 64;
            let hi = (last - (p - lo)).min(63);
            let span = bit_range(lo, hi + 1);
            let base = p - lo;
            let within = |x: u64| x.clamp(base, base + 64) - base;
            let clear = span & bit_range(within(whole_first), within(whole_end));
            let seen = if clear == 0 {
                bits[word].load(Ordering::Acquire)
            } else {
                bits[word].fetch_and(!clear, Ordering::AcqRel)
            } & span;
            let mut rest = seen;
            while rest != 0 {
                let b = rest.trailing_zeros() as u64;
                f(base + b);
                rest &= rest - 1;
            }
            p += hi - lo + 1;
        }
    }
}

/// Bits `[lo, hi)` of a word (`hi` at most 64).
fn bit_range(lo: u64, hi: u64) -> u64 {
    match hi.saturating_sub(lo) {
        0 => 0,
        64 => u64::MAX,
        n => ((1u64 << n) - 1) << lo,
    }
}

impl Drop for DirtyLog {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken(log: &DirtyLog, off: u64, len: u64) -> Vec<u64> {
        let mut v = Vec::new();
        log.take(off, len, |p| v.push(p));
        v
    }

    #[test]
    fn marks_are_kept_only_while_logging_and_a_report_clears_them() {
        let log = DirtyLog::new(200 * DIRTY_PAGE);
        log.mark(0, 1);
        assert!(taken(&log, 0, 200 * DIRTY_PAGE).is_empty(), "not logging: nothing kept");
        log.start();
        log.mark(DIRTY_PAGE - 1, 2); // straddles pages 0 and 1
        log.mark(63 * DIRTY_PAGE, 3 * DIRTY_PAGE); // 63, 64, 65: across a word
        log.mark(199 * DIRTY_PAGE + 5, 1 << 40); // runs past the end: clipped
        assert_eq!(taken(&log, 0, 200 * DIRTY_PAGE), vec![0, 1, 63, 64, 65, 199]);
        assert!(taken(&log, 0, 200 * DIRTY_PAGE).is_empty(), "a report clears");
        log.mark(0, 130 * DIRTY_PAGE);
        assert_eq!(taken(&log, 0, 200 * DIRTY_PAGE).len(), 130);
        log.stop();
        log.mark(0, 1);
        log.start();
        assert!(taken(&log, 0, 200 * DIRTY_PAGE).is_empty(), "a new start begins clean");
    }

    #[test]
    fn a_page_partly_outside_the_report_stays_marked() {
        let log = DirtyLog::new(4 * DIRTY_PAGE);
        log.start();
        log.mark(0, 4 * DIRTY_PAGE);
        // [0x800, 0x2800): pages 0 and 2 are partly inside, page 1 wholly.
        assert_eq!(taken(&log, 0x800, 0x2000), vec![0, 1, 2]);
        assert_eq!(taken(&log, 0, 4 * DIRTY_PAGE), vec![0, 2, 3]);
    }

    #[test]
    fn marks_from_many_threads_are_all_seen() {
        let log = std::sync::Arc::new(DirtyLog::new(4096 * DIRTY_PAGE));
        log.start();
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let log = log.clone();
                std::thread::spawn(move || {
                    for p in (t..4096).step_by(4) {
                        log.mark(p * DIRTY_PAGE, 1);
                    }
                })
            })
            .collect();
        let mut seen = Vec::new();
        for h in threads {
            h.join().unwrap();
        }
        log.take(0, 4096 * DIRTY_PAGE, |p| seen.push(p));
        assert_eq!(seen, (0..4096).collect::<Vec<_>>());
        assert!(logging_after_write());
        log.stop();
    }
}
