//! Logging of what this process writes into a mapping, for live migration: a VMM
//! that copies guest memory to another host while the device runs asks (vfio-user
//! DMA logging) which pages the device wrote since it last asked, and copies those
//! again.
//!
//! Each [`Mapping`](crate::Mapping) carries a [`DirtyLog`]: one bit per
//! [`DIRTY_PAGE`] of the mapping, kept sparse, so the log costs what the device
//! writes rather than what the client maps: a table with one entry per
//! [`LOG_BLOCK`] of the mapping (8 bytes per 128 MiB, allocated when logging first
//! starts), and a 4 KiB leaf of bits for each block, allocated when the device
//! first writes there. Everything the logs of the process hold is counted against
//! [`DIRTY_LOG_BUDGET`]: a start whose table does not fit is refused
//! ([`LogBudgetExceeded`], which a transport turns into ENOMEM), and a block whose
//! leaf does not fit is marked written whole, so past the budget a report says
//! more than was written, never less. Every
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

use std::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The logging granularity, in bytes.
pub const DIRTY_PAGE: u64 = 4096;
const SHIFT: u32 = DIRTY_PAGE.trailing_zeros();

/// Words in a leaf (4 KiB), and the pages one covers.
const LEAF_WORDS: usize = 512;
const LEAF_PAGES: u64 = LEAF_WORDS as u64 * 64;
/// The guest memory one leaf of bits covers: 128 MiB.
pub const LOG_BLOCK: u64 = LEAF_PAGES * DIRTY_PAGE;

/// Most bytes the dirty logs of this process may hold (tables and leaves): a table
/// costs 8 bytes per 128 MiB mapped (64 MiB covers 1 PiB), a leaf 4 KiB per 128
/// MiB the device wrote into.
pub const DIRTY_LOG_BUDGET: usize = 64 << 20;

/// The bytes logs may hold, and hold now: one for the process; tests make their own.
#[derive(Debug)]
pub(crate) struct Budget {
    limit: usize,
    held: AtomicUsize,
}

impl Budget {
    pub(crate) const fn new(limit: usize) -> Self {
        Budget { limit, held: AtomicUsize::new(0) }
    }

    /// Takes `n` bytes, if they are there.
    fn reserve(&self, n: usize) -> bool {
        let fits = |h: usize| h.checked_add(n).filter(|&t| t <= self.limit);
        self.held.fetch_update(Ordering::AcqRel, Ordering::Acquire, fits).is_ok()
    }

    fn release(&self, n: usize) {
        self.held.fetch_sub(n, Ordering::AcqRel);
    }

    fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }
}

/// The process's budget ([`DIRTY_LOG_BUDGET`]).
static PROCESS: Budget = Budget::new(DIRTY_LOG_BUDGET);

/// Bytes the dirty logs of this process hold now (tables and leaves).
pub fn dirty_log_bytes() -> usize {
    PROCESS.held()
}

/// A log could not start: its table would take the budget past
/// [`DIRTY_LOG_BUDGET`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the dirty log of {mapped} bytes of guest memory needs {needed} bytes, and the process's dirty \
     logs may hold {limit} ({held} held now)"
)]
pub struct LogBudgetExceeded {
    pub mapped: u64,
    pub needed: usize,
    pub held: usize,
    pub limit: usize,
}

type Leaf = [AtomicU64; LEAF_WORDS];

/// The leaf of a block written whole (the budget had no room for its own): every
/// page reads dirty, and nothing writes or clears it.
static WHOLE: Leaf = [const { AtomicU64::new(u64::MAX) }; LEAF_WORDS];

fn whole() -> *mut Leaf {
    std::ptr::from_ref(&WHOLE).cast_mut()
}

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
    /// One entry per block: null (nothing written since the start), a leaf this log
    /// allocated, or [`WHOLE`]. Allocated at the first start.
    table: OnceLock<Box<[AtomicPtr<Leaf>]>>,
    pages: u64,
    budget: &'static Budget,
    /// Budget bytes this log holds.
    held: AtomicUsize,
}

impl DirtyLog {
    pub(crate) fn new(len: u64) -> Self {
        Self::with_budget(len, &PROCESS)
    }

    pub(crate) fn with_budget(len: u64, budget: &'static Budget) -> Self {
        DirtyLog {
            on: AtomicBool::new(false),
            table: OnceLock::new(),
            pages: len.div_ceil(DIRTY_PAGE),
            budget,
            held: AtomicUsize::new(0),
        }
    }

    /// The table, allocated (within the budget) if it is not yet.
    fn table_or_alloc(&self) -> Result<&[AtomicPtr<Leaf>], LogBudgetExceeded> {
        if let Some(t) = self.table.get() {
            return Ok(t);
        }
        let blocks = self.pages.div_ceil(LEAF_PAGES) as usize;
        let needed = blocks * size_of::<AtomicPtr<Leaf>>();
        if !self.budget.reserve(needed) {
            let (mapped, held, limit) = (self.pages * DIRTY_PAGE, self.budget.held(), self.budget.limit);
            return Err(LogBudgetExceeded { mapped, needed, held, limit });
        }
        let mut ours = false;
        let t = self.table.get_or_init(|| {
            ours = true;
            (0..blocks).map(|_| AtomicPtr::new(std::ptr::null_mut())).collect()
        });
        if ours {
            self.held.fetch_add(needed, Ordering::AcqRel);
        } else {
            self.budget.release(needed);
        }
        Ok(t)
    }

    /// Starts logging with every page clean. Starting again while on keeps what is
    /// logged (a client repeating itself loses nothing).
    pub(crate) fn start(&self) -> Result<(), LogBudgetExceeded> {
        let table = self.table_or_alloc()?;
        if !self.on.load(Ordering::Acquire) {
            for e in table {
                let p = e.load(Ordering::Acquire);
                if p == whole() {
                    e.store(std::ptr::null_mut(), Ordering::Release);
                } else if let Some(leaf) = self.leaf_at(p) {
                    leaf.iter().for_each(|w| w.store(0, Ordering::Relaxed));
                }
            }
            if !self.on.swap(true, Ordering::SeqCst) {
                LOGGING.fetch_add(1, Ordering::SeqCst);
            }
        }
        Ok(())
    }

    pub(crate) fn stop(&self) {
        if self.on.swap(false, Ordering::SeqCst) {
            LOGGING.fetch_sub(1, Ordering::SeqCst);
        }
    }

    pub(crate) fn is_on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// A leaf this log allocated, from its table entry (None: null or [`WHOLE`]).
    fn leaf_at(&self, p: *mut Leaf) -> Option<&Leaf> {
        if p.is_null() || p == whole() {
            return None;
        }
        // A leaf in the table was allocated by `leaf_for` with Box::into_raw and is
        // freed only by Drop, which has `&mut self`: while `&self` lives it does.
        // SAFETY: non-null, not WHOLE, so a live leaf of this log.
        Some(unsafe { &*p })
    }

    /// The leaf to mark block `b` in, allocated if the budget allows. None: the
    /// block is written whole (marking it changes nothing).
    fn leaf_for(&self, table: &[AtomicPtr<Leaf>], b: usize) -> Option<&Leaf> {
        let e = &table[b];
        let p = e.load(Ordering::Acquire);
        if !p.is_null() {
            return self.leaf_at(p);
        }
        let size = size_of::<Leaf>();
        if !self.budget.reserve(size) {
            // Past the budget: this block reports whole until the next start.
            let _ = e.compare_exchange(std::ptr::null_mut(), whole(), Ordering::AcqRel, Ordering::Acquire);
            budget_warning();
            return self.leaf_at(e.load(Ordering::Acquire));
        }
        let new = Box::into_raw(Box::new([const { AtomicU64::new(0) }; LEAF_WORDS]));
        match e.compare_exchange(std::ptr::null_mut(), new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                self.held.fetch_add(size, Ordering::AcqRel);
                self.leaf_at(new)
            }
            Err(other) => {
                // Another thread installed one first: ours was never shared.
                // SAFETY: `new` came from Box::into_raw just above and was not stored.
                drop(unsafe { Box::from_raw(new) });
                self.budget.release(size);
                self.leaf_at(other)
            }
        }
    }

    /// Marks the pages under `[off, off + len)` of the mapping.
    pub(crate) fn mark(&self, off: u64, len: u64) {
        if len == 0 || self.pages == 0 || !self.on.load(Ordering::Acquire) {
            return;
        }
        let Some(table) = self.table.get() else { return };
        let first = off >> SHIFT;
        let last = ((off + len - 1) >> SHIFT).min(self.pages - 1);
        let mut p = first;
        while p <= last {
            let block = (p / LEAF_PAGES) as usize;
            let block_last = ((block as u64 + 1) * LEAF_PAGES - 1).min(last);
            if let Some(leaf) = self.leaf_for(table, block) {
                let mut q = p;
                while q <= block_last {
                    let word = ((q % LEAF_PAGES) / 64) as usize;
                    let lo = q % 64;
                    let hi = (block_last - (q - lo)).min(63);
                    leaf[word].fetch_or(bit_range(lo, hi + 1), Ordering::AcqRel);
                    q += hi - lo + 1;
                }
            }
            p = block_last + 1;
        }
    }

    /// Reports the dirty pages touching `[off, off + len)` of the mapping (their
    /// indexes, in order) and clears those that lie wholly inside it: a page only
    /// partly inside stays marked for a report that covers the rest. A block
    /// written whole reports every page and stays so until the next start.
    pub(crate) fn take(&self, off: u64, len: u64, mut f: impl FnMut(u64)) {
        let Some(table) = self.table.get() else { return };
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
            let block = (p / LEAF_PAGES) as usize;
            let block_last = ((block as u64 + 1) * LEAF_PAGES - 1).min(last);
            let entry = table[block].load(Ordering::Acquire);
            if entry == whole() {
                (p..=block_last).for_each(&mut f);
            } else if let Some(leaf) = self.leaf_at(entry) {
                let mut q = p;
                while q <= block_last {
                    let word = &leaf[((q % LEAF_PAGES) / 64) as usize];
                    let lo = q % 64;
                    let hi = (block_last - (q - lo)).min(63);
                    let span = bit_range(lo, hi + 1);
                    let base = q - lo;
                    let within = |x: u64| x.clamp(base, base + 64) - base;
                    let clear = span & bit_range(within(whole_first), within(whole_end));
                    // Look before clearing: a word with nothing in the range is
                    // not written (so a report over clean memory commits nothing).
                    let mut seen = word.load(Ordering::Acquire) & span;
                    if seen & clear != 0 {
                        seen = word.fetch_and(!clear, Ordering::AcqRel) & span;
                    }
                    let mut rest = seen;
                    while rest != 0 {
                        let b = rest.trailing_zeros() as u64;
                        f(base + b);
                        rest &= rest - 1;
                    }
                    q += hi - lo + 1;
                }
            }
            p = block_last + 1;
        }
    }
}

/// Logged once per process: a block past the budget reports whole.
fn budget_warning() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        tracing::warn!(
            "the dirty logs are at their budget: blocks of {LOG_BLOCK} bytes written from now on are \
             reported whole (a migration copies more than was written)"
        )
    });
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
        if let Some(table) = self.table.get() {
            for e in table.iter() {
                let p = e.load(Ordering::Acquire);
                if !p.is_null() && p != whole() {
                    // `&mut self`: no mark or report can hold the leaf now.
                    // SAFETY: a leaf this log allocated with Box::into_raw, freed once.
                    drop(unsafe { Box::from_raw(p) });
                }
            }
        }
        self.budget.release(self.held.load(Ordering::Acquire));
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
        log.start().unwrap();
        log.mark(DIRTY_PAGE - 1, 2); // straddles pages 0 and 1
        log.mark(63 * DIRTY_PAGE, 3 * DIRTY_PAGE); // 63, 64, 65: across a word
        log.mark(199 * DIRTY_PAGE + 5, 1 << 40); // runs past the end: clipped
        assert_eq!(taken(&log, 0, 200 * DIRTY_PAGE), vec![0, 1, 63, 64, 65, 199]);
        assert!(taken(&log, 0, 200 * DIRTY_PAGE).is_empty(), "a report clears");
        log.mark(0, 130 * DIRTY_PAGE);
        assert_eq!(taken(&log, 0, 200 * DIRTY_PAGE).len(), 130);
        log.stop();
        log.mark(0, 1);
        log.start().unwrap();
        assert!(taken(&log, 0, 200 * DIRTY_PAGE).is_empty(), "a new start begins clean");
    }

    #[test]
    fn a_page_partly_outside_the_report_stays_marked() {
        let log = DirtyLog::new(4 * DIRTY_PAGE);
        log.start().unwrap();
        log.mark(0, 4 * DIRTY_PAGE);
        // [0x800, 0x2800): pages 0 and 2 are partly inside, page 1 wholly.
        assert_eq!(taken(&log, 0x800, 0x2000), vec![0, 1, 2]);
        assert_eq!(taken(&log, 0, 4 * DIRTY_PAGE), vec![0, 2, 3]);
    }

    #[test]
    fn marks_from_many_threads_are_all_seen() {
        let log = std::sync::Arc::new(DirtyLog::new(4096 * DIRTY_PAGE));
        log.start().unwrap();
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

    /// A budget of its own, so tests that fill one do not starve the others.
    fn budget(limit: usize) -> &'static Budget {
        Box::leak(Box::new(Budget::new(limit)))
    }

    #[test]
    fn a_log_costs_what_is_written_not_what_is_mapped() {
        let b = budget(DIRTY_LOG_BUDGET);
        let log = DirtyLog::with_budget(2 << 40, b);
        log.start().unwrap();
        let table = (2u64 << 40) / LOG_BLOCK * 8;
        assert_eq!(b.held(), table as usize, "2 TiB mapped: a table of 8 bytes per 128 MiB");
        // Three blocks written: three leaves.
        log.mark(5 * DIRTY_PAGE, 1);
        log.mark(LOG_BLOCK + 7 * DIRTY_PAGE, 2 * DIRTY_PAGE);
        log.mark((2 << 40) - 1, 1);
        assert_eq!(b.held(), table as usize + 3 * 4096);
        let last = (2u64 << 40) / DIRTY_PAGE - 1;
        assert_eq!(taken(&log, 0, 2 << 40), vec![5, LEAF_PAGES + 7, LEAF_PAGES + 8, last]);
        // A report over clean memory allocates nothing; a restart keeps the leaves.
        assert!(taken(&log, 0, 2 << 40).is_empty());
        log.stop();
        log.start().unwrap();
        assert_eq!(b.held(), table as usize + 3 * 4096);
        drop(log);
        assert_eq!(b.held(), 0, "all of it given back");
    }

    #[test]
    fn past_the_budget_a_start_is_refused_and_a_block_reports_whole() {
        // Room for the table of 1 GiB (8 blocks, 64 bytes) and one leaf.
        let b = budget(64 + 4096);
        let big = DirtyLog::with_budget(1 << 40, b);
        let e = big.start().unwrap_err();
        assert_eq!((e.needed, e.limit), (65536, 64 + 4096), "{e}");
        assert!(e.to_string().contains("needs 65536 bytes"), "{e}");
        assert_eq!(b.held(), 0, "a refused start holds nothing");
        let log = DirtyLog::with_budget(1 << 30, b);
        log.start().unwrap();
        log.mark(3 * DIRTY_PAGE, 1); // block 0: its leaf
        log.mark(LOG_BLOCK + DIRTY_PAGE, 1); // block 1: no room, whole
        assert_eq!(b.held(), 64 + 4096);
        let got = taken(&log, 0, 1 << 30);
        assert_eq!(got[0], 3);
        assert_eq!(&got[1..], (LEAF_PAGES..2 * LEAF_PAGES).collect::<Vec<_>>(), "block 1 whole");
        // Whole until the next start, which begins clean.
        assert_eq!(taken(&log, LOG_BLOCK, LOG_BLOCK).len() as u64, LEAF_PAGES);
        log.stop();
        log.start().unwrap();
        assert!(taken(&log, 0, 1 << 30).is_empty());
        drop(log);
        assert_eq!(b.held(), 0);
    }
}
