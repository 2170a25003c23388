//! Guest physical memory, mapped into this process: the only crate that touches raw
//! guest memory.
//!
//! A [`GuestMemory`] is an immutable snapshot of the guest's address map: a sorted set
//! of regions, each a guest physical range backed by an mmap of anonymous memory or of
//! a file descriptor (a memfd the VMM shares with us). Every access is bounds checked
//! against the map and fails with [`MemError`] instead of touching memory outside it.
//! Mappings are reference counted, so a region removed from the map (vfio-user
//! DMA_UNMAP) stays mapped until the last snapshot that holds it is dropped: a worker
//! in the middle of a transfer never sees its memory vanish.
//!
//! The guest may write its memory at any time, including while we read it. Copies
//! therefore go through a local buffer and callers validate what they copied, never
//! the guest's live bytes; the shadow doorbell protocol uses [`GuestMemory::load_u32`]
//! and [`GuestMemory::store_u32`], which are single atomic accesses.

mod dirty;
pub mod fragile;
mod mmap;

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

use zerocopy::{FromBytes, Immutable, IntoBytes};

pub use dirty::{dirty_log_bytes, LogBudgetExceeded, DIRTY_LOG_BUDGET, DIRTY_PAGE, LOG_BLOCK};
pub use mmap::Mapping;

/// Why a guest memory access failed.
#[derive(Debug, thiserror::Error, Clone)]
pub enum MemError {
    /// Some part of `[gpa, gpa + len)` is not backed by any region.
    #[error("guest range {gpa:#x}+{len:#x} is not mapped")]
    Unmapped { gpa: u64, len: u64 },
    /// An atomic access was not naturally aligned.
    #[error("guest address {gpa:#x} is not {align}-byte aligned")]
    Misaligned { gpa: u64, align: u64 },
    /// A new region overlaps an existing one.
    #[error("region {gpa:#x}+{len:#x} overlaps an existing region")]
    Overlap { gpa: u64, len: u64 },
    /// A region is empty or its end overflows the address space.
    #[error("region {gpa:#x}+{len:#x} is invalid")]
    InvalidRegion { gpa: u64, len: u64 },
    /// mmap failed.
    #[error("mmap of {len:#x} bytes failed: {source}")]
    Map { len: u64, source: Arc<std::io::Error> },
    /// The memory behind `[gpa, gpa + len)` is gone: its file shrank under the
    /// mapping (a fragile one, see `fragile`). What was read may be zeroes; what was
    /// written went nowhere.
    #[error("guest range {gpa:#x}+{len:#x} is gone: the file behind it shrank")]
    Lost { gpa: u64, len: u64 },
}

impl From<MemError> for std::io::Error {
    fn from(e: MemError) -> Self {
        std::io::Error::other(e)
    }
}

/// One guest physical range and where it lives in this process.
#[derive(Clone, Debug)]
struct Region {
    gpa: u64,
    len: u64,
    map: Arc<Mapping>,
    /// Offset of `gpa` within `map`.
    map_offset: u64,
}

impl Region {
    fn end(&self) -> u64 {
        self.gpa + self.len
    }
}

/// A piece of guest memory as this process sees it: a host address and a length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostRange {
    pub ptr: *mut u8,
    pub len: usize,
}

// A HostRange is an address, not access: dereferencing it is unsafe and its users
// document why the memory is alive and theirs to touch at that moment.
// SAFETY: sending an address grants no access.
unsafe impl Send for HostRange {}

/// One region of a [`GuestMemory`], as [`GuestMemory::region_sources`] reports it.
#[derive(Clone, Copy, Debug)]
pub struct RegionSource<'a> {
    pub gpa: u64,
    pub len: u64,
    /// Host address of the region's first byte.
    pub host: *mut u8,
    /// The descriptor backing the region and the offset of its first byte in it.
    pub fd: Option<(BorrowedFd<'a>, u64)>,
}

/// A snapshot of the guest's physical memory map. Cheap to clone.
///
/// The regions are kept sorted in chunks of at most [`CHUNK`], each shared between
/// snapshots, so adding or removing a region copies one chunk and the chunk list,
/// not the whole map: a VMM that maps memory in thousands of small pieces pays
/// about `n / CHUNK + CHUNK` reference-count updates per map, not `n`. A lookup is
/// two binary searches (one over chunks, one inside a chunk); a VM's usual handful of
/// regions sits in one chunk.
#[derive(Clone, Debug, Default)]
pub struct GuestMemory {
    table: Arc<Table>,
}

/// Most regions in one chunk of a [`GuestMemory`]'s table.
pub const CHUNK: usize = 64;

#[derive(Debug, Default)]
struct Table {
    /// Sorted by address, none empty, chunks in address order.
    chunks: Vec<Arc<[Region]>>,
    /// The first address of each chunk.
    starts: Vec<u64>,
    /// One-chunk maps: the index of the region the last lookup found. Only a hint
    /// (any value is safe, a stale one costs a search); the data path's accesses fall
    /// mostly in one region, so most lookups end here without a search.
    hint: AtomicUsize,
}

impl Table {
    /// The index of the chunk that holds or would hold `gpa`.
    fn chunk_for(&self, gpa: u64) -> usize {
        self.starts.partition_point(|&s| s <= gpa).saturating_sub(1)
    }

    fn iter(&self) -> impl Iterator<Item = &Region> + '_ {
        self.chunks.iter().flat_map(|c| c.iter())
    }

    /// A table with chunk `i` replaced by `regions` (split when too long, dropped
    /// when empty).
    fn with_chunk(&self, i: usize, regions: Vec<Region>) -> Table {
        let mut chunks = self.chunks.clone();
        let mut starts = self.starts.clone();
        let pieces: Vec<Arc<[Region]>> = regions.chunks(CHUNK).map(Arc::from).collect();
        if i < chunks.len() {
            chunks.remove(i);
            starts.remove(i);
        }
        for (k, p) in pieces.into_iter().enumerate() {
            starts.insert(i + k, p[0].gpa);
            chunks.insert(i + k, p);
        }
        Table { chunks, starts, hint: AtomicUsize::new(0) }
    }
}

impl GuestMemory {
    /// A map with no memory at all: every access fails.
    pub fn empty() -> Self {
        Self::default()
    }

    /// Anonymous, zero-filled memory for each `(gpa, len)` range: what tests and the
    /// in-process benchmark use as guest RAM.
    pub fn anonymous(ranges: &[(u64, u64)]) -> Result<Self, MemError> {
        let mut mem = Self::empty();
        for &(gpa, len) in ranges {
            let map = Mapping::anonymous(len)?;
            mem = mem.with_region(gpa, len, Arc::new(map), 0)?;
        }
        Ok(mem)
    }

    /// A new snapshot with `[gpa, gpa+len)` backed by `fd` at `offset`
    /// (vfio-user DMA_MAP with a file descriptor).
    pub fn with_fd_region(
        &self,
        gpa: u64,
        len: u64,
        fd: BorrowedFd<'_>,
        offset: u64,
        writable: bool,
    ) -> Result<Self, MemError> {
        let map = Mapping::from_fd(fd, offset, len, writable)?;
        self.with_region(gpa, len, Arc::new(map), 0)
    }

    /// A new snapshot with `[gpa, gpa+len)` backed by `map` starting at `map_offset`.
    pub fn with_region(
        &self,
        gpa: u64,
        len: u64,
        map: Arc<Mapping>,
        map_offset: u64,
    ) -> Result<Self, MemError> {
        let end = gpa.checked_add(len).ok_or(MemError::InvalidRegion { gpa, len })?;
        if len == 0 || map_offset.checked_add(len).is_none_or(|e| e > map.len()) {
            return Err(MemError::InvalidRegion { gpa, len });
        }
        // The only regions that can overlap: the last one starting before `end`.
        let t = &self.table;
        let i = t.chunk_for(gpa);
        let before = t.chunk_for(end - 1);
        if let Some(r) = t.chunks.get(before).and_then(|c| c.iter().rev().find(|r| r.gpa < end)) {
            if gpa < r.end() {
                return Err(MemError::Overlap { gpa, len });
            }
        }
        let mut v: Vec<Region> = t.chunks.get(i).map_or_else(Vec::new, |c| c.to_vec());
        let at = v.partition_point(|r| r.gpa < gpa);
        v.insert(at, Region { gpa, len, map, map_offset });
        Ok(GuestMemory { table: Arc::new(t.with_chunk(i, v)) })
    }

    /// A new snapshot without the region that starts at `gpa` with length `len`.
    /// Returns `None` if no region matches exactly.
    pub fn without_region(&self, gpa: u64, len: u64) -> Option<Self> {
        let t = &self.table;
        let i = t.chunk_for(gpa);
        let c = t.chunks.get(i)?;
        let idx = c.iter().position(|r| r.gpa == gpa && r.len == len)?;
        let mut v = c.to_vec();
        v.remove(idx);
        Some(GuestMemory { table: Arc::new(t.with_chunk(i, v)) })
    }

    /// A snapshot holding only the region that contains `gpa` (None if no region
    /// does): for a user that needs one region kept alive (an IOMMU mapping of it)
    /// without keeping every other region of this map alive as well.
    pub fn only_region_at(&self, gpa: u64) -> Option<Self> {
        let r = self.region_for(gpa)?;
        Some(Self::empty().with_region(r.gpa, r.len, r.map.clone(), r.map_offset).expect("one valid region"))
    }

    /// The regions, as `(gpa, len)`, in address order.
    pub fn regions(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.table.iter().map(|r| (r.gpa, r.len))
    }

    /// Where each region lives: its host address and, for fd-backed regions, the
    /// descriptor and offset, so a backend can hand the same memory to another device
    /// (zero copy). The host addresses stay valid while `self` (or any clone) lives.
    pub fn region_sources(&self) -> impl Iterator<Item = RegionSource<'_>> + '_ {
        self.table.iter().map(|r| RegionSource {
            gpa: r.gpa,
            len: r.len,
            host: r.map.ptr_at(r.map_offset),
            fd: r.map.source().map(|(fd, off)| (fd, off + r.map_offset)),
        })
    }

    /// True if both snapshots share the same region list (nothing mapped or unmapped
    /// in between), so state derived from one is still valid for the other.
    pub fn same_map(&self, other: &GuestMemory) -> bool {
        Arc::ptr_eq(&self.table, &other.table)
    }

    /// Appends the host address ranges behind `[gpa, gpa+len)` to `out` (merging
    /// pieces that happen to be contiguous), for I/O the kernel performs directly
    /// on guest memory (io_uring, O_DIRECT). Fails without appending anything if any
    /// part is unmapped. The pointers stay valid while `self` (or a clone) lives; the
    /// caller that dereferences them, or lets the kernel do so, must keep one alive
    /// until the I/O is over.
    pub fn host_ranges(&self, gpa: u64, len: u64, out: &mut Vec<HostRange>) -> Result<(), MemError> {
        let start = out.len();
        self.for_each_chunk(gpa, len, |ptr, n, _| {
            if out.len() > start {
                let last = out.last_mut().expect("non-empty");
                if last.ptr.wrapping_add(last.len) == ptr {
                    last.len += n;
                    return;
                }
            }
            out.push(HostRange { ptr, len: n });
        })
    }

    /// Total bytes mapped.
    pub fn size(&self) -> u64 {
        self.table.iter().map(|r| r.len).sum()
    }

    /// The region holding `gpa`. Inlined: the usual lookup, a one-chunk map whose
    /// last found region holds `gpa` again, is a few loads and compares on the data
    /// path, without a call.
    #[inline]
    fn region_for(&self, gpa: u64) -> Option<&Region> {
        let t = &self.table;
        if t.chunks.len() == 1 {
            if let Some(r) = t.chunks[0].get(t.hint.load(Ordering::Relaxed)) {
                if r.gpa <= gpa && gpa < r.end() {
                    return Some(r);
                }
            }
        }
        self.region_search(gpa)
    }

    /// [`Self::region_for`] when the hint missed: a search.
    #[inline(never)]
    fn region_search(&self, gpa: u64) -> Option<&Region> {
        let t = &self.table;
        // Most maps are one chunk (a VM's handful of regions): no search over chunks.
        if t.chunks.len() == 1 {
            let c = &t.chunks[0];
            let idx = c.partition_point(|r| r.gpa <= gpa).checked_sub(1)?;
            let r = c.get(idx)?;
            if gpa < r.end() {
                t.hint.store(idx, Ordering::Relaxed);
                return Some(r);
            }
            return None;
        }
        let c = t.chunks.get(t.chunk_for(gpa))?;
        let idx = c.partition_point(|r| r.gpa <= gpa);
        let r = c.get(idx.checked_sub(1)?)?;
        (gpa < r.end()).then_some(r)
    }

    /// Splits `[gpa, gpa+len)` into pieces that each lie in one region, calling `f`
    /// with the host pointer and length of each, after checking the whole range first.
    fn for_each_chunk(
        &self,
        gpa: u64,
        len: u64,
        mut f: impl FnMut(*mut u8, usize, usize),
    ) -> Result<(), MemError> {
        self.each_chunk(gpa, len, false, &mut f)
    }

    /// [`Self::for_each_chunk`] for a write: each piece is marked dirty once `f`
    /// has written it (see `dirty`).
    fn for_each_chunk_written(
        &self,
        gpa: u64,
        len: u64,
        mut f: impl FnMut(*mut u8, usize, usize),
    ) -> Result<(), MemError> {
        self.each_chunk(gpa, len, true, &mut f)
    }

    /// `written`: `f` writes, and each piece is marked dirty once written, if
    /// logging is on by then (see `dirty`).
    fn each_chunk(
        &self,
        gpa: u64,
        len: u64,
        written: bool,
        f: &mut impl FnMut(*mut u8, usize, usize),
    ) -> Result<(), MemError> {
        let end = gpa.checked_add(len).ok_or(MemError::Unmapped { gpa, len })?;
        // The usual case, one lookup: the whole range lies in one region.
        if let Some(r) = self.region_for(gpa).filter(|r| end <= r.end()) {
            if len > 0 {
                let off = r.map_offset + (gpa - r.gpa);
                f(r.map.ptr_at(off), len as usize, 0);
                if r.map.lost() {
                    return Err(MemError::Lost { gpa, len });
                }
                if written && dirty::logging_after_write() {
                    r.map.mark_dirty(off, len);
                }
            }
            return Ok(());
        }
        // Check first, so a failed access has no partial effect.
        let err = MemError::Unmapped { gpa, len };
        let mut cur = gpa;
        while cur < end {
            let r = self.region_for(cur).ok_or(err.clone())?;
            cur = r.end().min(end);
        }
        let mut cur = gpa;
        let mut done = 0usize;
        let mut lost = false;
        while cur < end {
            let r = self.region_for(cur).expect("checked above");
            let n = (r.end().min(end) - cur) as usize;
            let off = r.map_offset + (cur - r.gpa);
            f(r.map.ptr_at(off), n, done);
            lost |= r.map.lost();
            if written && dirty::logging_after_write() {
                r.map.mark_dirty(off, n as u64);
            }
            done += n;
            cur += n as u64;
        }
        if lost {
            return Err(MemError::Lost { gpa, len });
        }
        Ok(())
    }

    /// Checks that `[gpa, gpa+len)` is entirely mapped.
    pub fn check_range(&self, gpa: u64, len: u64) -> Result<(), MemError> {
        let err = || MemError::Unmapped { gpa, len };
        let end = gpa.checked_add(len).ok_or_else(err)?;
        // The usual case, one lookup: the whole range lies in one region.
        if self.region_for(gpa).is_some_and(|r| end <= r.end()) {
            return Ok(());
        }
        let mut cur = gpa;
        while cur < end {
            cur = self.region_for(cur).ok_or_else(err)?.end().min(end);
        }
        Ok(())
    }

    /// Copies guest memory at `gpa` into `buf`.
    pub fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let dst = buf.as_mut_ptr();
        self.for_each_chunk(gpa, buf.len() as u64, |src, n, done| {
            // `src..src+n` lies inside a live mapping (checked by for_each_chunk, kept
            // alive by the Arc in `self`), and `dst+done..+n` lies inside `buf`. The
            // two cannot overlap: `buf` is a Rust allocation, never part of a guest
            // mapping handed out by this crate.
            // SAFETY: both ranges are live, in bounds and disjoint.
            unsafe { std::ptr::copy_nonoverlapping(src, dst.add(done), n) }
        })
    }

    /// Copies `buf` into guest memory at `gpa`.
    pub fn write(&self, gpa: u64, buf: &[u8]) -> Result<(), MemError> {
        let src = buf.as_ptr();
        self.for_each_chunk_written(gpa, buf.len() as u64, |dst, n, done| {
            // As in `read`, with source and destination swapped; writable mappings are
            // the only kind this crate creates for guest RAM (a read-only fd mapping
            // faults, which is the VMM's contract to avoid).
            // SAFETY: both ranges are live, in bounds, disjoint and writable where written.
            unsafe { std::ptr::copy_nonoverlapping(src.add(done), dst, n) }
        })
    }

    /// Fills `[gpa, gpa+len)` with `byte`.
    pub fn fill(&self, gpa: u64, len: u64, byte: u8) -> Result<(), MemError> {
        self.for_each_chunk_written(gpa, len, |dst, n, _| {
            // SAFETY: `dst..dst+n` lies inside a live, writable mapping (see `write`).
            unsafe { std::ptr::write_bytes(dst, byte, n) }
        })
    }

    /// Reads a plain-data object (an SQE, a PRP list entry, an SGL descriptor...).
    pub fn read_obj<T: FromBytes + IntoBytes>(&self, gpa: u64) -> Result<T, MemError> {
        let mut v = T::new_zeroed();
        self.read(gpa, v.as_mut_bytes())?;
        Ok(v)
    }

    /// Reads a small plain-data object (an SQE) into `out` with one lookup and a
    /// fixed-size copy the compiler inlines, where [`Self::read`]'s general copy calls
    /// libc; into the caller's place, so a command is not moved through a `Result`
    /// on its way. Falls back to the general copy when the object straddles regions.
    #[inline]
    pub fn read_small_into<T: FromBytes + IntoBytes>(&self, gpa: u64, out: &mut T) -> Result<(), MemError> {
        let size = std::mem::size_of::<T>() as u64;
        match self.region_for(gpa) {
            Some(r) if gpa.checked_add(size).is_some_and(|end| end <= r.end()) => {
                let src = r.map.ptr_at(r.map_offset + (gpa - r.gpa));
                // `src..src+size` lies inside a live mapping kept alive by `self`;
                // `out` is a distinct Rust object of `size` bytes, any bit pattern of
                // which is a valid `T` (FromBytes). A guest writing meanwhile gives a
                // torn value, as the general copy would: the caller validates it.
                // SAFETY: both ranges in bounds and disjoint, T: FromBytes.
                unsafe { std::ptr::copy_nonoverlapping(src, (out as *mut T).cast::<u8>(), size as usize) };
                if r.map.lost() {
                    return Err(MemError::Lost { gpa, len: size });
                }
                Ok(())
            }
            _ => self.read(gpa, out.as_mut_bytes()),
        }
    }

    /// [`Self::read_small_into`], returning the object.
    #[inline]
    pub fn read_small<T: FromBytes + IntoBytes>(&self, gpa: u64) -> Result<T, MemError> {
        let mut v = T::new_zeroed();
        self.read_small_into(gpa, &mut v)?;
        Ok(v)
    }

    /// Writes a plain-data object.
    pub fn write_obj<T: IntoBytes + Immutable>(&self, gpa: u64, v: &T) -> Result<(), MemError> {
        self.write(gpa, v.as_bytes())
    }

    fn atomic_u32(&self, gpa: u64) -> Result<(&AtomicU32, &Mapping), MemError> {
        if !gpa.is_multiple_of(4) {
            return Err(MemError::Misaligned { gpa, align: 4 });
        }
        let r = self.region_for(gpa).ok_or(MemError::Unmapped { gpa, len: 4 })?;
        if gpa + 4 > r.end() {
            return Err(MemError::Unmapped { gpa, len: 4 });
        }
        let ptr = r.map.ptr_at(r.map_offset + (gpa - r.gpa));
        if !(ptr as usize).is_multiple_of(4) {
            return Err(MemError::Misaligned { gpa, align: 4 });
        }
        // `ptr` is 4-byte aligned and the 4 bytes behind it lie in a live mapping owned
        // by `self` (through the region's Arc), so the reference lives no longer than
        // the mapping. AtomicU32 has the layout of u32 and any bit pattern is valid;
        // the guest's concurrent accesses are what atomics exist for.
        // SAFETY: aligned, in bounds, alive as long as the borrow of `self`.
        Ok((unsafe { &*(ptr as *const AtomicU32) }, &r.map))
    }

    /// Atomically loads a little-endian u32 with acquire ordering (shadow doorbells).
    pub fn load_u32(&self, gpa: u64) -> Result<u32, MemError> {
        let (a, map) = self.atomic_u32(gpa)?;
        let v = u32::from_le(a.load(Ordering::Acquire));
        if map.lost() {
            return Err(MemError::Lost { gpa, len: 4 });
        }
        Ok(v)
    }

    /// Writes `head` at `gpa`, then (release) the little-endian u32 `last` right
    /// after it, with one lookup: a completion entry whose last dword carries the
    /// phase tag, so a host polling it never sees a half-written entry.
    #[inline]
    pub fn write_then_publish_u32(&self, gpa: u64, head: &[u8; 12], last: u32) -> Result<(), MemError> {
        let in_one = self.region_for(gpa).filter(|r| gpa.checked_add(16).is_some_and(|e| e <= r.end()));
        let Some(r) = in_one else {
            self.write(gpa, head)?;
            std::sync::atomic::fence(Ordering::Release);
            return self.store_u32(gpa + 12, last);
        };
        let off = r.map_offset + (gpa - r.gpa);
        let dst = r.map.ptr_at(off);
        if !(dst as usize + 12).is_multiple_of(4) {
            return Err(MemError::Misaligned { gpa: gpa + 12, align: 4 });
        }
        // `dst..dst+16` lies inside a live, writable mapping owned by `self`, and
        // `dst+12` is 4-byte aligned (checked): the same access `write` and
        // `store_u32` make, with the lookup done once.
        // SAFETY: in bounds, alive for the borrow of `self`, aligned where atomic.
        unsafe {
            std::ptr::write_unaligned(dst as *mut [u8; 12], *head);
            (*(dst.add(12) as *const AtomicU32)).store(last.to_le(), Ordering::Release);
        }
        if r.map.lost() {
            return Err(MemError::Lost { gpa, len: 16 });
        }
        if dirty::logging_after_write() {
            r.map.mark_dirty(off, 16);
        }
        Ok(())
    }

    /// Atomically stores a little-endian u32 with release ordering (EventIdx, the
    /// completion dword that carries the phase tag).
    pub fn store_u32(&self, gpa: u64, v: u32) -> Result<(), MemError> {
        let (a, map) = self.atomic_u32(gpa)?;
        a.store(v.to_le(), Ordering::Release);
        if map.lost() {
            return Err(MemError::Lost { gpa, len: 4 });
        }
        self.mark_dirty(gpa, 4);
        Ok(())
    }

    /// Marks `[gpa, gpa+len)` as written by this process, for memory written other
    /// than through this type (the kernel's io_uring reads, a downstream device's
    /// DMA into [`Self::host_ranges`]): call it once the write is over. Parts not
    /// mapped are ignored. A no-op unless some mapping is logging (see `dirty`).
    #[inline]
    pub fn mark_dirty(&self, gpa: u64, len: u64) {
        if len != 0 && dirty::logging_after_write() {
            self.mark_dirty_logging(gpa, len);
        }
    }

    /// Whether any mapping in this process is logging writes now (see `dirty`): when
    /// not, marking is a no-op and callers can skip the work of finding what to mark.
    /// Ask once the write is over: the answer is ordered after it.
    #[inline]
    pub fn logging_writes() -> bool {
        dirty::logging_after_write()
    }

    #[cold]
    fn mark_dirty_logging(&self, gpa: u64, len: u64) {
        let end = gpa.saturating_add(len);
        let mut cur = gpa;
        while cur < end {
            let Some(r) = self.region_for(cur) else {
                // Skip to the next region, if any.
                let t = &self.table;
                let next = t.iter().map(|r| r.gpa).find(|&g| g > cur);
                match next {
                    Some(g) if g < end => {
                        cur = g;
                        continue;
                    }
                    _ => return,
                }
            };
            let n = r.end().min(end) - cur;
            r.map.mark_dirty(r.map_offset + (cur - r.gpa), n);
            cur += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_within_and_across_regions() {
        let mem = GuestMemory::anonymous(&[(0, 0x1000), (0x1000, 0x1000), (0x10000, 0x1000)]).unwrap();
        let data: Vec<u8> = (0..0x200u32).map(|i| i as u8).collect();
        mem.write(0xf00, &data).unwrap(); // spans two adjacent regions
        let mut back = vec![0u8; 0x200];
        mem.read(0xf00, &mut back).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn out_of_range_access_fails_without_partial_effect() {
        let mem = GuestMemory::anonymous(&[(0, 0x1000), (0x2000, 0x1000)]).unwrap();
        mem.fill(0, 0x1000, 0xaa).unwrap();
        // Crosses into the hole at 0x1000.
        assert!(matches!(mem.write(0xff0, &[0u8; 0x20]), Err(MemError::Unmapped { .. })));
        let mut b = [0u8; 0x10];
        mem.read(0xff0, &mut b).unwrap();
        assert_eq!(b, [0xaa; 0x10], "failed write must not write the mapped part");
        assert!(mem.read(u64::MAX - 3, &mut [0u8; 8]).is_err());
        assert!(mem.read(0x3000, &mut [0u8; 1]).is_err());
        assert!(mem.check_range(0x2000, 0x1000).is_ok());
        assert!(mem.check_range(0x2000, 0x1001).is_err());
    }

    #[test]
    fn atomics_check_alignment_and_bounds() {
        let mem = GuestMemory::anonymous(&[(0x1000, 0x1000)]).unwrap();
        mem.store_u32(0x1004, 0xdead_beef).unwrap();
        assert_eq!(mem.load_u32(0x1004).unwrap(), 0xdead_beef);
        let mut b = [0u8; 4];
        mem.read(0x1004, &mut b).unwrap();
        assert_eq!(u32::from_le_bytes(b), 0xdead_beef);
        assert!(matches!(mem.load_u32(0x1002), Err(MemError::Misaligned { .. })));
        assert!(mem.load_u32(0x2000).is_err());
        assert!(mem.load_u32(0xffc).is_err());
    }

    /// The data path's one-lookup accessors agree with the general ones, inside a
    /// region and across two, and fail where those fail.
    #[test]
    fn small_reads_and_published_entries_match_the_general_accessors() {
        let mem = GuestMemory::anonymous(&[(0, 0x1000), (0x1000, 0x1000), (0x3000, 0x1000)]).unwrap();
        let data: Vec<u8> = (0..0x2000u32).map(|i| (i * 7) as u8).collect();
        mem.write(0, &data).unwrap();
        for gpa in [0x40u64, 0xfe0, 0x1fc0] {
            let got: [u8; 64] = mem.read_small(gpa).unwrap();
            assert_eq!(&got[..], &data[gpa as usize..gpa as usize + 64], "at {gpa:#x}");
        }
        // Straddling the hole at 0x2000, or past the end of the address space.
        assert!(mem.read_small::<[u8; 64]>(0x1fe0).is_err());
        assert!(mem.read_small::<[u8; 64]>(u64::MAX - 8).is_err());

        let head: [u8; 12] = std::array::from_fn(|i| 0xa0 + i as u8);
        for gpa in [0x10u64, 0xff8] {
            mem.write_then_publish_u32(gpa, &head, 0x1234_5678).unwrap();
            let mut b = [0u8; 16];
            mem.read(gpa, &mut b).unwrap();
            assert_eq!(&b[..12], &head[..], "at {gpa:#x}");
            assert_eq!(mem.load_u32(gpa + 12).unwrap(), 0x1234_5678, "at {gpa:#x}");
        }
        assert!(matches!(mem.write_then_publish_u32(0x12, &head, 1), Err(MemError::Misaligned { .. })));
        // Past the mapped range: nothing is written at all.
        mem.fill(0x3ff0, 0x10, 0x55).unwrap();
        assert!(mem.write_then_publish_u32(0x3ff8, &head, 1).is_err());
        let mut b = [0u8; 8];
        mem.read(0x3ff8, &mut b).unwrap();
        assert_eq!(b, [0x55; 8]);
    }

    /// Thousands of regions added and removed in a scrambled order: the chunked table
    /// finds every region, refuses every overlap and keeps address order.
    #[test]
    fn many_regions_across_chunks_behave_like_one_sorted_list() {
        let map = Arc::new(Mapping::anonymous(4096).unwrap());
        let n = 5 * CHUNK as u64 + 7;
        // A permutation of 0..n: k * 7919 mod n (7919 is prime and does not divide n).
        let order: Vec<u64> = (0..n).map(|k| k * 7919 % n).collect();
        let mut mem = GuestMemory::empty();
        for &i in &order {
            mem = mem.with_region(i * 0x2000, 0x1000, map.clone(), 0).unwrap();
            assert!(matches!(
                mem.with_region(i * 0x2000 + 0x800, 0x1000, map.clone(), 0),
                Err(MemError::Overlap { .. })
            ));
        }
        assert!(mem.table.chunks.len() > 1);
        let listed: Vec<(u64, u64)> = mem.regions().collect();
        assert_eq!(listed, (0..n).map(|i| (i * 0x2000, 0x1000)).collect::<Vec<_>>());
        for i in 0..n {
            assert!(mem.check_range(i * 0x2000, 0x1000).is_ok(), "region {i}");
            assert!(mem.check_range(i * 0x2000 + 0x1000, 1).is_err(), "hole after {i}");
        }
        // Remove the even ones; the odd ones stay reachable.
        for &i in order.iter().filter(|&&i| i % 2 == 0) {
            mem = mem.without_region(i * 0x2000, 0x1000).unwrap();
        }
        for i in 0..n {
            assert_eq!(mem.check_range(i * 0x2000, 0x1000).is_ok(), i % 2 == 1, "region {i}");
        }
        assert_eq!(mem.size(), (n / 2) * 0x1000);
    }

    #[test]
    fn overlapping_regions_are_rejected_and_removal_works() {
        let mem = GuestMemory::anonymous(&[(0x1000, 0x2000)]).unwrap();
        let map = Arc::new(Mapping::anonymous(0x1000).unwrap());
        assert!(matches!(mem.with_region(0x2000, 0x1000, map.clone(), 0), Err(MemError::Overlap { .. })));
        assert!(mem.with_region(0x3000, 0x2000, map.clone(), 0).is_err(), "beyond the mapping");
        let m2 = mem.with_region(0x3000, 0x1000, map, 0).unwrap();
        assert_eq!(m2.size(), 0x3000);
        let m3 = m2.without_region(0x1000, 0x2000).unwrap();
        assert_eq!(m3.regions().collect::<Vec<_>>(), vec![(0x3000, 0x1000)]);
        assert!(m2.without_region(0x1000, 0x1000).is_none());
    }

    #[test]
    fn host_ranges_merge_within_a_region_and_split_across() {
        let mem = GuestMemory::anonymous(&[(0, 0x2000), (0x2000, 0x1000)]).unwrap();
        let mut out = Vec::new();
        mem.host_ranges(0x100, 0x200, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].len, 0x200);
        out.clear();
        // Two separate anonymous mappings: two ranges, lengths adding up.
        mem.host_ranges(0x1f00, 0x200, &mut out).unwrap();
        assert_eq!(out.iter().map(|r| r.len).sum::<usize>(), 0x200);
        assert!(out.len() <= 2);
        // Writing through the range is what reading through GuestMemory sees.
        mem.write(0x1f00, &[0xab; 0x100]).unwrap();
        let before = out.len();
        assert!(mem.host_ranges(0x2f00, 0x200, &mut out).is_err());
        assert_eq!(out.len(), before, "a failed lookup appends nothing");
        assert!(mem.same_map(&mem.clone()));
        assert!(!mem.same_map(&GuestMemory::anonymous(&[(0, 0x1000)]).unwrap()));
    }

    #[test]
    fn fd_regions_share_memory() {
        use std::os::fd::{AsFd, FromRawFd, OwnedFd};
        // SAFETY: memfd_create with a valid C string; the result is checked below.
        let fd = unsafe { libc::memfd_create(c"guest-mem-test".as_ptr(), 0) };
        assert!(fd >= 0);
        // SAFETY: `fd` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ftruncate on our own fd.
        assert_eq!(unsafe { libc::ftruncate(fd.as_fd().as_raw_fd_compat(), 0x4000) }, 0);
        let a = GuestMemory::empty().with_fd_region(0, 0x4000, fd.as_fd(), 0, true).unwrap();
        let b = GuestMemory::empty().with_fd_region(0x10000, 0x2000, fd.as_fd(), 0x2000, true).unwrap();
        a.write(0x2010, b"shared").unwrap();
        let mut buf = [0u8; 6];
        b.read(0x10010, &mut buf).unwrap();
        assert_eq!(&buf, b"shared");
        // The region remembers its descriptor and offset for re-export.
        let src: Vec<_> = b.region_sources().collect();
        assert_eq!(src.len(), 1);
        assert_eq!((src[0].gpa, src[0].len), (0x10000, 0x2000));
        assert_eq!(src[0].fd.map(|(_, off)| off), Some(0x2000));
    }

    /// Migration's DMA logging: every write path marks the pages it wrote, in the
    /// mapping that was written, once logging is on; reads mark nothing.
    #[test]
    fn writes_mark_their_pages_while_the_mapping_logs() {
        let a = Arc::new(Mapping::anonymous(0x4000).unwrap());
        let b = Arc::new(Mapping::anonymous(0x4000).unwrap());
        let mem = GuestMemory::empty()
            .with_region(0x10000, 0x4000, a.clone(), 0)
            .unwrap()
            .with_region(0x20000, 0x2000, b.clone(), 0x2000)
            .unwrap();
        let dirty = |m: &Mapping| {
            let mut v = Vec::new();
            m.take_dirty(0, m.len(), |off| v.push(off));
            v
        };
        mem.write(0x10000, &[1; 8]).unwrap();
        a.start_dirty_log().unwrap();
        b.start_dirty_log().unwrap();
        assert!(dirty(&a).is_empty(), "written before the start");
        mem.write(0x10ff0, &[1; 0x20]).unwrap(); // pages 0 and 1
        mem.fill(0x13000, 0x10, 0).unwrap(); // page 3
        mem.store_u32(0x20004, 7).unwrap(); // b, mapping offset 0x2004
        let mut buf = [0u8; 0x100];
        mem.read(0x12000, &mut buf).unwrap();
        mem.mark_dirty(0x13ff0, 0xd020); // a's page 3, the hole, b's pages 2 and 3
        assert_eq!(dirty(&a), vec![0, 0x1000, 0x3000]);
        assert_eq!(dirty(&b), vec![0x2000, 0x3000]);
        a.stop_dirty_log();
        mem.write(0x10000, &[1; 8]).unwrap();
        assert!(dirty(&a).is_empty(), "stopped");
        b.stop_dirty_log();
    }

    trait RawCompat {
        fn as_raw_fd_compat(&self) -> i32;
    }
    impl RawCompat for BorrowedFd<'_> {
        fn as_raw_fd_compat(&self) -> i32 {
            use std::os::fd::AsRawFd;
            self.as_raw_fd()
        }
    }
}
