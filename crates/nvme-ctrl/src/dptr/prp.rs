//! Physical Region Page entries and PRP Lists (Base §4.3.1).
//!
//! A PRP entry is a 64-bit guest physical address of a memory page (CC.MPS sized).
//! Bits 1:0 are always zero (Figure "PRP Entry Layout"); the bits below the page size
//! form an offset that only the first PRP entry of a command (PRP1) and a PRP List
//! pointer in the command (PRP2) may use. Every other entry, in the command or in a
//! PRP List, has offset 0h.
//!
//! PRP2 is, depending on how many memory page boundaries the transfer crosses:
//! - none: unused (reserved);
//! - exactly one: the second data page;
//! - more than one: a PRP List pointer. The list is an array of 8-byte entries that
//!   runs from PRP2 to the end of its memory page; if the transfer needs more entries
//!   than fit, the last entry of the page points to the next PRP List page instead of
//!   data, and so on.
//!
//! Data pages are not checked against guest memory here (the copy does that); the
//! lists themselves are read here and a failure to read one is a Data Transfer Error.

use block_backend::Segment;
use guest_mem::GuestMemory;

use crate::error::{CmdResult, CommandError};

/// Size of one PRP entry in a PRP List.
const ENTRY_SIZE: u64 = 8;

/// How many PRP List entries are read from guest memory per access.
const BATCH_ENTRIES: usize = 256;

/// Appends to `out` the guest segments of a `len`-byte transfer described by PRP1/PRP2.
///
/// `page_size` is the memory page size the host configured in CC.MPS (a power of two,
/// at least 4 KiB). Physically contiguous pages are merged into one segment. On error
/// `out` is left as it was.
///
/// Errors (Base §4.3.1):
/// - [`CommandError::PrpOffset`]: PRP1 is not dword aligned, PRP2 used as a data
///   pointer has an offset, PRP2 used as a PRP List pointer is not qword aligned, or
///   a PRP List entry (data page or next-list pointer) has an offset;
/// - [`CommandError::Memory`]: a PRP List could not be read from guest memory.
pub fn prp_segments(
    mem: &GuestMemory,
    prp1: u64,
    prp2: u64,
    len: u64,
    page_size: u64,
    out: &mut Vec<Segment>,
) -> CmdResult<()> {
    debug_assert!(page_size.is_power_of_two() && page_size >= 4096, "bad page size");
    let start = out.len();
    let mut walk = Walk { out, start, page_size, mask: page_size - 1 };
    let result = walk.run(mem, prp1, prp2, len);
    if result.is_err() {
        out.truncate(start);
    }
    result
}

/// The state of one PRP walk.
struct Walk<'a> {
    out: &'a mut Vec<Segment>,
    /// Segments before this index were in `out` before the walk: never merged into.
    start: usize,
    page_size: u64,
    /// `page_size - 1`: the offset bits of an entry.
    mask: u64,
}

impl Walk<'_> {
    fn run(&mut self, mem: &GuestMemory, prp1: u64, prp2: u64, len: u64) -> CmdResult<()> {
        if len == 0 {
            return Ok(());
        }
        // PRP1 may carry an offset into its page, but bits 1:0 are always zero.
        if prp1 & 0x3 != 0 {
            return Err(CommandError::PrpOffset(prp1));
        }
        let first = len.min(self.page_size - (prp1 & self.mask));
        self.push(prp1, first);
        let mut remaining = len - first;
        if remaining == 0 {
            // The transfer does not cross a page boundary: PRP2 is reserved.
            return Ok(());
        }
        if remaining <= self.page_size {
            // Exactly one page boundary crossed: PRP2 is the second data page.
            self.data_page(prp2, &mut remaining)?;
            debug_assert_eq!(remaining, 0);
            return Ok(());
        }
        // More than one boundary: PRP2 is a PRP List pointer. It may have an offset
        // (the list starts there), but the entries it points to are qwords and the
        // last one must end at the page boundary, so it has to be qword aligned.
        if prp2 & (ENTRY_SIZE - 1) != 0 {
            return Err(CommandError::PrpOffset(prp2));
        }
        self.walk_lists(mem, prp2, remaining)
    }

    /// Consumes the PRP Lists starting at `list` until `remaining` bytes are covered.
    ///
    /// Each list page contributes at least one data page except possibly the first
    /// (whose pointer may sit in the page's last slot), and next-list pointers are
    /// page aligned, so every further page holds `page_size / 8 - 1 >= 511` data
    /// entries: the loop runs at most `remaining / page_size / 511 + 2` times and
    /// reads at most one entry per data page plus one per list page, whatever the
    /// guest put in the lists (a list that chains to itself just repeats pages).
    fn walk_lists(&mut self, mem: &GuestMemory, mut list: u64, mut remaining: u64) -> CmdResult<()> {
        let mut buf = [0u8; BATCH_ENTRIES * ENTRY_SIZE as usize];
        loop {
            let slots = (self.page_size - (list & self.mask)) / ENTRY_SIZE;
            let needed = remaining.div_ceil(self.page_size);
            // When more entries are needed than the page has slots, the last slot is
            // a pointer to the next PRP List page.
            let chained = needed > slots;
            let count = if chained { slots } else { needed };
            let mut next = None;
            let mut index = 0u64;
            while index < count {
                let batch = (count - index).min(BATCH_ENTRIES as u64);
                let bytes = &mut buf[..(batch * ENTRY_SIZE) as usize];
                mem.read(list + index * ENTRY_SIZE, bytes)?;
                for raw in bytes.chunks_exact(ENTRY_SIZE as usize) {
                    let entry = u64::from_le_bytes(raw.try_into().expect("8-byte chunk"));
                    if chained && index == count - 1 {
                        next = Some(entry);
                    } else {
                        self.data_page(entry, &mut remaining)?;
                    }
                    index += 1;
                }
            }
            let Some(next) = next else {
                debug_assert_eq!(remaining, 0);
                return Ok(());
            };
            // A PRP List pointer inside a list is not "in the command": offset 0h.
            if next & self.mask != 0 {
                return Err(CommandError::PrpOffset(next));
            }
            list = next;
        }
    }

    /// Adds the page at `entry` (which must have offset 0h) for up to one page of
    /// the `remaining` bytes.
    fn data_page(&mut self, entry: u64, remaining: &mut u64) -> CmdResult<()> {
        if entry & self.mask != 0 {
            return Err(CommandError::PrpOffset(entry));
        }
        let n = (*remaining).min(self.page_size);
        self.push(entry, n);
        *remaining -= n;
        Ok(())
    }

    /// Appends `gpa..gpa+len`, extending the previous segment of this walk when the
    /// two are contiguous.
    fn push(&mut self, gpa: u64, len: u64) {
        if self.out.len() > self.start {
            if let Some(Segment::Guest { gpa: last, len: last_len }) = self.out.last_mut() {
                if last.checked_add(*last_len) == Some(gpa) {
                    *last_len += len;
                    return;
                }
            }
        }
        self.out.push(Segment::Guest { gpa, len });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 4096;

    fn mem() -> GuestMemory {
        GuestMemory::anonymous(&[(0, 1 << 20)]).unwrap()
    }

    fn write_list(mem: &GuestMemory, gpa: u64, entries: &[u64]) {
        let bytes: Vec<u8> = entries.iter().flat_map(|e| e.to_le_bytes()).collect();
        mem.write(gpa, &bytes).unwrap();
    }

    /// Runs a walk and checks the invariants every successful walk must keep.
    fn segs(mem: &GuestMemory, prp1: u64, prp2: u64, len: u64, page: u64) -> Vec<Segment> {
        let mut out = Vec::new();
        prp_segments(mem, prp1, prp2, len, page, &mut out).unwrap();
        assert_eq!(out.iter().map(Segment::len).sum::<u64>(), len, "lengths add up");
        assert!(out.iter().all(|s| !s.is_empty()), "no empty segments");
        out
    }

    fn err(mem: &GuestMemory, prp1: u64, prp2: u64, len: u64, page: u64) -> CommandError {
        let mut out = vec![Segment::Discard { len: 7 }];
        let e = prp_segments(mem, prp1, prp2, len, page, &mut out).unwrap_err();
        assert_eq!(out, vec![Segment::Discard { len: 7 }], "out restored on error");
        e
    }

    fn g(gpa: u64, len: u64) -> Segment {
        Segment::Guest { gpa, len }
    }

    #[test]
    fn spec_4_3_1_zero_length_transfer_has_no_segments() {
        let m = mem();
        assert!(segs(&m, 0x1003, 0x5, 0, PAGE).is_empty(), "nothing is validated");
    }

    #[test]
    fn spec_4_3_1_prp1_with_offset_in_one_page_ignores_prp2() {
        let m = mem();
        assert_eq!(segs(&m, 0x1204, 0xdead_beef, 0x100, PAGE), vec![g(0x1204, 0x100)]);
    }

    #[test]
    fn spec_4_3_1_transfer_ending_at_page_boundary_ignores_prp2() {
        let m = mem();
        assert_eq!(segs(&m, 0x1800, 0x123, 0x800, PAGE), vec![g(0x1800, 0x800)]);
        assert_eq!(segs(&m, 0x1000, 0x123, PAGE, PAGE), vec![g(0x1000, PAGE)]);
    }

    #[test]
    fn spec_4_3_1_two_pages_use_prp2_as_data_pointer() {
        let m = mem();
        assert_eq!(segs(&m, 0x1000, 0x8000, 2 * PAGE, PAGE), vec![g(0x1000, PAGE), g(0x8000, PAGE)]);
        // With an offset in PRP1 the second page gets the rest.
        assert_eq!(segs(&m, 0x1e00, 0x8000, 0x400, PAGE), vec![g(0x1e00, 0x200), g(0x8000, 0x200)]);
        // Data pages need not be in guest memory: the copy checks them.
        assert_eq!(
            segs(&m, 0x7000_0000, 0x9000_0000, 2 * PAGE, PAGE),
            vec![g(0x7000_0000, PAGE), g(0x9000_0000, PAGE)]
        );
    }

    #[test]
    fn spec_4_3_1_prp2_data_pointer_with_offset_is_invalid() {
        let m = mem();
        assert!(matches!(err(&m, 0x1000, 0x8010, 2 * PAGE, PAGE), CommandError::PrpOffset(0x8010)));
    }

    #[test]
    fn spec_4_3_1_prp1_not_dword_aligned_is_invalid() {
        let m = mem();
        for prp1 in [0x1001, 0x1002, 0x1003] {
            assert!(matches!(err(&m, prp1, 0, 16, PAGE), CommandError::PrpOffset(p) if p == prp1));
        }
    }

    #[test]
    fn spec_4_3_1_prp_list_of_several_entries() {
        let m = mem();
        write_list(&m, 0x2000, &[0x10000, 0x30000, 0x20000]);
        assert_eq!(
            segs(&m, 0x5800, 0x2000, 0x800 + 2 * PAGE + 0x100, PAGE),
            vec![g(0x5800, 0x800), g(0x10000, PAGE), g(0x30000, PAGE), g(0x20000, 0x100)]
        );
        // Two page boundaries crossed from an offset PRP1 already needs a list.
        write_list(&m, 0x3000, &[0x40000, 0x50000]);
        assert_eq!(
            segs(&m, 0x6200, 0x3000, 2 * PAGE, PAGE),
            vec![g(0x6200, 0xe00), g(0x40000, PAGE), g(0x50000, 0x200)]
        );
    }

    #[test]
    fn spec_4_3_1_prp_list_pointer_may_have_offset() {
        let m = mem();
        write_list(&m, 0x2100, &[0x10000, 0x20000]);
        assert_eq!(
            segs(&m, 0x5000, 0x2100, 3 * PAGE, PAGE),
            vec![g(0x5000, PAGE), g(0x10000, PAGE), g(0x20000, PAGE)]
        );
    }

    #[test]
    fn spec_4_3_1_prp_list_pointer_not_qword_aligned_is_invalid() {
        let m = mem();
        assert!(matches!(err(&m, 0x5000, 0x2004, 3 * PAGE, PAGE), CommandError::PrpOffset(0x2004)));
    }

    #[test]
    fn spec_4_3_1_prp_list_entry_with_offset_is_invalid() {
        let m = mem();
        write_list(&m, 0x2000, &[0x10000, 0x20008]);
        assert!(matches!(err(&m, 0x5000, 0x2000, 3 * PAGE, PAGE), CommandError::PrpOffset(0x20008)));
        // Even an entry only needed for a few bytes.
        write_list(&m, 0x2000, &[0x10000, 0x20000, 0x30004]);
        assert!(matches!(err(&m, 0x5000, 0x2000, 3 * PAGE + 4, PAGE), CommandError::PrpOffset(0x30004)));
    }

    #[test]
    fn spec_4_3_1_chained_prp_list_at_end_of_page() {
        let m = mem();
        // The list starts two entries before the end of its page: one data entry,
        // then the pointer to the next list page.
        write_list(&m, 0x2ff0, &[0x10000, 0x4000]);
        write_list(&m, 0x4000, &[0x30000, 0x50000]);
        assert_eq!(
            segs(&m, 0x5000, 0x2ff0, 4 * PAGE, PAGE),
            vec![g(0x5000, PAGE), g(0x10000, PAGE), g(0x30000, PAGE), g(0x50000, PAGE)]
        );
        // A list pointer in the very last slot of its page chains at once.
        write_list(&m, 0x6ff8, &[0x4000]);
        assert_eq!(
            segs(&m, 0x5000, 0x6ff8, 3 * PAGE, PAGE),
            vec![g(0x5000, PAGE), g(0x30000, PAGE), g(0x50000, PAGE)]
        );
    }

    #[test]
    fn spec_4_3_1_chained_prp_list_over_full_pages() {
        let m = mem();
        // 1 page in PRP1, then 511 + 511 + 10 data pages over three list pages.
        let data = |i: u64| 0x1_0000_0000 + i * 2 * PAGE; // never contiguous
        let mut n = 0;
        for (list, next) in [(0x10000u64, Some(0x20000u64)), (0x20000, Some(0x30000)), (0x30000, None)] {
            let mut entries: Vec<u64> = Vec::new();
            let count = if next.is_some() { 511 } else { 10 };
            for _ in 0..count {
                entries.push(data(n));
                n += 1;
            }
            entries.extend(next);
            write_list(&m, list, &entries);
        }
        let len = (1 + n) * PAGE;
        let out = segs(&m, 0x5000, 0x10000, len, PAGE);
        assert_eq!(out.len() as u64, 1 + n);
        for i in 0..n {
            assert_eq!(out[1 + i as usize], g(data(i), PAGE));
        }
    }

    #[test]
    fn spec_4_3_1_last_list_slot_is_data_when_it_completes_the_transfer() {
        let m = mem();
        // Exactly two entries fit before the page end and exactly two are needed.
        write_list(&m, 0x2ff0, &[0x10000, 0x4000]);
        assert_eq!(
            segs(&m, 0x5000, 0x2ff0, 3 * PAGE, PAGE),
            vec![g(0x5000, PAGE), g(0x10000, PAGE), g(0x4000, PAGE)]
        );
    }

    #[test]
    fn spec_4_3_1_next_prp_list_pointer_with_offset_is_invalid() {
        let m = mem();
        write_list(&m, 0x2ff0, &[0x10000, 0x4008]);
        assert!(matches!(err(&m, 0x5000, 0x2ff0, 4 * PAGE, PAGE), CommandError::PrpOffset(0x4008)));
    }

    #[test]
    fn spec_4_3_1_prp_list_outside_guest_memory_is_data_transfer_error() {
        let m = mem();
        assert!(matches!(err(&m, 0x5000, 0x20_0000, 3 * PAGE, PAGE), CommandError::Memory(_)));
        // A list that runs off the end of guest memory in the middle of a page.
        let short = GuestMemory::anonymous(&[(0, 0x2800)]).unwrap();
        assert!(matches!(err(&short, 0x5000, 0x27f8, 3 * PAGE, PAGE), CommandError::Memory(_)));
        // A chained list page outside guest memory.
        write_list(&m, 0x2ff8, &[0x4000_0000]);
        assert!(matches!(err(&m, 0x5000, 0x2ff8, 3 * PAGE, PAGE), CommandError::Memory(_)));
        // A list pointer at the top of the address space.
        assert!(matches!(err(&m, 0x5000, u64::MAX - 7, 3 * PAGE, PAGE), CommandError::Memory(_)));
    }

    #[test]
    fn spec_4_3_1_prp_list_chaining_to_itself_terminates() {
        let m = mem();
        // Every list page's last entry points back at the same page: the walk is
        // bounded by the transfer length and just repeats the same data pages.
        let mut entries: Vec<u64> = (0..511).map(|i| 0x8000_0000 + i * PAGE).collect();
        entries.push(0x10000);
        write_list(&m, 0x10000, &entries);
        let len = 8 << 20;
        let out = segs(&m, 0x5000, 0x10000, len, PAGE);
        // The 511 pages are contiguous, so each pass over the list is one segment.
        assert_eq!(out[1], g(0x8000_0000, 511 * PAGE));
        assert_eq!(out.len() as u64, 1 + (len / PAGE - 1).div_ceil(511));
    }

    #[test]
    fn spec_4_3_1_contiguous_pages_coalesce() {
        let m = mem();
        write_list(&m, 0x2000, &[0x6000, 0x7000, 0x8000, 0x20000, 0x21000]);
        assert_eq!(
            segs(&m, 0x5200, 0x2000, 0xe00 + 4 * PAGE + 0x10, PAGE),
            vec![g(0x5200, 0xe00 + 3 * PAGE), g(0x20000, PAGE + 0x10)]
        );
        assert_eq!(segs(&m, 0x5000, 0x6000, 2 * PAGE, PAGE), vec![g(0x5000, 2 * PAGE)]);
    }

    #[test]
    fn spec_4_3_1_appends_without_merging_into_existing_segments() {
        let m = mem();
        let mut out = vec![g(0x4000, PAGE)];
        prp_segments(&m, 0x5000, 0, 0x10, PAGE, &mut out).unwrap();
        assert_eq!(out, vec![g(0x4000, PAGE), g(0x5000, 0x10)]);
    }

    #[test]
    fn spec_4_3_1_64k_memory_pages() {
        const BIG: u64 = 64 * 1024;
        let m = GuestMemory::anonymous(&[(0, 4 << 20)]).unwrap();
        // One page with an offset: 64 KiB pages hold much more.
        assert_eq!(segs(&m, 0x1_1000, 0x7, 0xf000, BIG), vec![g(0x1_1000, 0xf000)]);
        // Two pages: PRP2 must be 64 KiB aligned.
        assert!(matches!(err(&m, 0x1_0000, 0x3_1000, 2 * BIG, BIG), CommandError::PrpOffset(0x3_1000)));
        assert_eq!(segs(&m, 0x1_8000, 0x5_0000, BIG, BIG), vec![g(0x1_8000, 0x8000), g(0x5_0000, 0x8000)]);
        // A list whose entries are 64 KiB pages; 0x1000-aligned entries are invalid.
        write_list(&m, 0x2_0000, &[0x10_0000, 0x30_0000, 0x20_0000]);
        assert_eq!(
            segs(&m, 0x1_0000, 0x2_0000, 4 * BIG, BIG),
            vec![g(0x1_0000, BIG), g(0x10_0000, BIG), g(0x30_0000, BIG), g(0x20_0000, BIG)]
        );
        write_list(&m, 0x2_0000, &[0x10_0000, 0x30_1000]);
        assert!(matches!(err(&m, 0x1_0000, 0x2_0000, 3 * BIG, BIG), CommandError::PrpOffset(0x30_1000)));
        // Chaining at the end of a 64 KiB list page.
        write_list(&m, 0x2_fff8, &[0x4_0000]);
        write_list(&m, 0x4_0000, &[0x10_0000, 0x11_0000]);
        assert_eq!(segs(&m, 0x1_0000, 0x2_fff8, 3 * BIG, BIG), vec![g(0x1_0000, BIG), g(0x10_0000, 2 * BIG)]);
    }
}
