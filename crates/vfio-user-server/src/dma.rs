//! The guest memory the client has shared with DMA_MAP, turned into a
//! [`GuestMemory`] map. Regions passed without a file descriptor are remembered (so
//! unmaps match) but are not reachable: we never use DMA_READ/DMA_WRITE messages,
//! which QEMU serves from its main loop and which would deadlock against a vCPU
//! waiting on us.
//!
//! Memory the client could shrink under our mapping (a memfd without F_SEAL_SHRINK,
//! as SPDK's initiator sends; a regular file, as QEMU's memory-backend-file on
//! hugetlbfs is) would turn the next access into SIGBUS. Such a region is mapped
//! fragile (`guest_mem::fragile`): a fault there is survived, the access reads
//! zeroes or writes nowhere and fails ([`guest_mem::MemError::Lost`]), and the
//! command that made it ends with the spec's error. Sealed memory (QEMU's
//! memory-backend-memfd, sealed by default) needs none of this. Descriptors that
//! are not memory at all (eventfds, sockets, pipes) are refused.
//!
//! Read-only regions (QEMU maps ROMs without DMA_MAP_FLAG_WRITE) are not reachable
//! either: a guest memory map has no per-region permissions, so a controller write
//! aimed at one (a completion queue placed in ROM) would hit a PROT_READ mapping and
//! kill the server with SIGSEGV. An NVMe controller only ever reads guest ROM as the
//! source of a Write command, which no driver does.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use guest_mem::{GuestMemory, Mapping};

use crate::fds::FdKind;

#[derive(Debug)]
struct Region {
    size: u64,
    map: Option<Arc<Mapping>>,
}

/// Why a DMA map or unmap was refused.
#[derive(Debug, thiserror::Error)]
pub enum DmaError {
    #[error("region {0:#x}+{1:#x} overlaps an existing mapping")]
    Overlap(u64, u64),
    #[error("region {0:#x}+{1:#x} is empty or wraps")]
    Invalid(u64, u64),
    #[error("no mapping at {0:#x}+{1:#x}")]
    NotFound(u64, u64),
    #[error("cannot mmap the region: {0}")]
    Map(#[from] guest_mem::MemError),
    #[error("too many DMA regions (limit {0})")]
    TooMany(usize),
    #[error("file range {offset:#x}+{size:#x} extends past the end of the file ({file_len:#x} bytes)")]
    BeyondFile { offset: u64, size: u64, file_len: u64 },
    #[error(
        "guest memory that could shrink under the server (no F_SEAL_SHRINK) and no room to guard \
         another such region ({0} at once): seal it (QEMU: memory-backend-memfd, sealed by default)"
    )]
    Unguarded(usize),
    #[error("the descriptor is {0}, not memory")]
    NotMemory(String),
    #[error("DMA logging: {0}")]
    LogBudget(#[from] guest_mem::LogBudgetExceeded),
}

/// Guest memory taken out of the DMA map. A request in flight (an io_uring read, a
/// downstream controller's DMA, a bounce buffer waiting to be copied back) holds its
/// own reference to the mapping it uses, so the memory stays mapped here until the
/// last one ends; this tells when that has happened, which is when the protocol lets
/// us answer DMA_UNMAP (vfio-user.rst: the server must stop using the memory first).
#[derive(Debug, Default)]
#[must_use = "the unmap is not finished until nothing uses the memory"]
pub struct Released(Vec<Arc<Mapping>>);

impl Released {
    /// How many of the released regions something besides `self` still uses.
    pub fn in_use(&self) -> usize {
        self.0.iter().filter(|m| Arc::strong_count(m) > 1).count()
    }
}

/// The DMA map of one client: every region by address, and the reachable ones as a
/// guest memory snapshot kept up to date map by map (O(log n) to find overlaps, a
/// chunk copy to update the snapshot; nothing is rebuilt from scratch).
#[derive(Debug, Default)]
pub struct DmaRegions {
    regions: BTreeMap<u64, Region>,
    mem: GuestMemory,
    /// Most regions at once (see [`dma_map_budget`]); 0 means [`MAX_DMA_MAPS`].
    limit: usize,
    /// DMA logging is on (migration): regions mapped meanwhile log too.
    logging: bool,
}

/// Refuses a mapping of a regular file (a memfd, a hugetlbfs or tmpfs file) that
/// reaches past its end: mmap would succeed, and the first access there would kill
/// the server with SIGBUS. (A client that shrinks the file after mapping can still do
/// that; QEMU never does.) Other kinds of file (device memory) have no length to check.
fn check_file_range(fd: &OwnedFd, offset: u64, size: u64) -> Result<(), DmaError> {
    let unreadable = |e| DmaError::Map(guest_mem::MemError::Map { len: size, source: Arc::new(e) });
    let meta = std::fs::File::from(fd.try_clone().map_err(unreadable)?).metadata().map_err(unreadable)?;
    if meta.file_type().is_file() && offset.checked_add(size).is_none_or(|end| end > meta.len()) {
        return Err(DmaError::BeyondFile { offset, size, file_len: meta.len() });
    }
    Ok(())
}

/// Most simultaneous DMA regions we ever accept.
pub const MAX_DMA_MAPS: usize = 65535;

/// Descriptors and memory mappings kept back for everything else the process does
/// (sockets, eventfds, backends, io_uring rings, the doorbell page).
const RESERVE: usize = 1024;

/// How many DMA regions this process can hold at once: each keeps a descriptor
/// (for zero-copy re-export) and a memory mapping, so the budget is the smaller of
/// the descriptor limit and the kernel's per-process mapping limit
/// (`vm.max_map_count`), less a reserve, and at most [`MAX_DMA_MAPS`]. This is what
/// VERSION advertises as `max_dma_maps` and what DMA_MAP enforces (ENOSPC past it).
pub fn dma_map_budget() -> usize {
    let nofile = rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(u64::MAX);
    let maps = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(65530);
    let budget = nofile.min(maps).saturating_sub(RESERVE as u64);
    (budget as usize).clamp(1, MAX_DMA_MAPS)
}

/// Raises the soft descriptor limit to the hard one (the default soft limit of 1024
/// would cap a VM at about a thousand DMA regions). Returns the new soft limit.
pub fn raise_fd_limit() -> std::io::Result<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut l = getrlimit(Resource::Nofile);
    if l.current != l.maximum {
        l.current = l.maximum;
        setrlimit(Resource::Nofile, l)?;
    }
    Ok(l.current.unwrap_or(u64::MAX))
}

/// A DMA region as handed to another process.
#[derive(Debug)]
pub struct ExportedRegion {
    pub iova: u64,
    pub size: u64,
    /// For a region mapped here: a duplicate of its descriptor, and the file offset.
    pub source: Option<(OwnedFd, u64)>,
}

impl DmaRegions {
    /// An empty map that holds at most `limit` regions.
    pub fn with_limit(limit: usize) -> Self {
        DmaRegions { limit: limit.clamp(1, MAX_DMA_MAPS), ..Default::default() }
    }

    /// Whether a region's descriptor is memory we may map, and whether it could
    /// shrink under us (module documentation).
    fn check_kind(&self, fd: &OwnedFd) -> Result<bool, DmaError> {
        let kind = FdKind::of(fd);
        match kind {
            _ if kind.cannot_shrink() => Ok(false),
            FdKind::Memfd { .. } | FdKind::File { .. } => Ok(true),
            FdKind::EventFd | FdKind::Other(_) => Err(DmaError::NotMemory(kind.to_string())),
        }
    }

    /// Most regions at once.
    pub fn limit(&self) -> usize {
        if self.limit == 0 {
            MAX_DMA_MAPS
        } else {
            self.limit
        }
    }

    pub fn map(
        &mut self,
        iova: u64,
        size: u64,
        fd: Option<OwnedFd>,
        offset: u64,
        writable: bool,
    ) -> Result<(), DmaError> {
        let end = iova.checked_add(size).filter(|_| size > 0).ok_or(DmaError::Invalid(iova, size))?;
        // The only region that can overlap: the last one starting before `end`.
        if self.regions.range(..end).next_back().is_some_and(|(&a, r)| iova < a + r.size) {
            return Err(DmaError::Overlap(iova, size));
        }
        if self.regions.len() >= self.limit() {
            return Err(DmaError::TooMany(self.limit()));
        }
        let map = match fd {
            Some(_) if !writable => None,
            Some(fd) => {
                let may_shrink = self.check_kind(&fd)?;
                check_file_range(&fd, offset, size)?;
                let m = if may_shrink {
                    Mapping::from_fd_fragile(fd.as_fd(), offset, size, true)
                        .map_err(|_| DmaError::Unguarded(guest_mem::fragile::SLOTS))?
                } else {
                    Mapping::from_fd(fd.as_fd(), offset, size, true)?
                };
                Some(Arc::new(m))
            }
            None => None,
        };
        if let Some(m) = &map {
            if self.logging {
                m.start_dirty_log()?;
            }
            self.mem = self.mem.with_region(iova, size, m.clone(), 0).expect("overlaps were refused above");
        }
        self.regions.insert(iova, Region { size, map });
        Ok(())
    }

    /// Takes the region at `iova` out of the map. Its memory stays mapped in this
    /// process while any request still uses it: the caller waits on the returned
    /// [`Released`] before it tells the client the unmap is done.
    pub fn unmap(&mut self, iova: u64, size: u64) -> Result<Released, DmaError> {
        match self.regions.get(&iova) {
            Some(r) if r.size == size => {
                if r.map.is_some() {
                    self.mem =
                        self.mem.without_region(iova, size).expect("reachable regions are in the snapshot");
                }
                let r = self.regions.remove(&iova).expect("found above");
                Ok(Released(r.map.into_iter().collect()))
            }
            _ => Err(DmaError::NotFound(iova, size)),
        }
    }

    /// Takes every region out of the map (see [`DmaRegions::unmap`]); logging
    /// stops.
    pub fn clear(&mut self) -> Released {
        self.stop_logging();
        self.mem = GuestMemory::empty();
        Released(std::mem::take(&mut self.regions).into_values().filter_map(|r| r.map).collect())
    }

    pub fn len(&self) -> usize {
        self.regions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    /// Every region for a hand-over.
    pub fn export(&self) -> std::io::Result<Vec<ExportedRegion>> {
        self.regions
            .iter()
            .map(|(&iova, r)| {
                let src = match r.map.as_ref().and_then(|m| m.source()) {
                    Some((fd, off)) => Some((fd.try_clone_to_owned()?, off)),
                    None => None,
                };
                Ok(ExportedRegion { iova, size: r.size, source: src })
            })
            .collect()
    }

    /// Starts logging what the device writes into every reachable region, and into
    /// regions mapped later, all clean at first (vfio-user DMA_LOGGING_START; we
    /// always log everything, which the protocol allows). A second start keeps what
    /// is logged. Refused, with nothing started, if the logs would not fit their
    /// budget (`guest_mem::DIRTY_LOG_BUDGET`); while logging, a map whose log does
    /// not fit is refused the same way.
    pub fn start_logging(&mut self) -> Result<(), DmaError> {
        let was = self.logging;
        for m in self.regions.values().filter_map(|r| r.map.as_ref()) {
            if let Err(e) = m.start_dirty_log() {
                if !was {
                    self.stop_logging();
                }
                return Err(e.into());
            }
        }
        self.logging = true;
        Ok(())
    }

    /// DMA_LOGGING_STOP.
    pub fn stop_logging(&mut self) {
        self.logging = false;
        for m in self.regions.values().filter_map(|r| r.map.as_ref()) {
            m.stop_dirty_log();
        }
    }

    pub fn logging(&self) -> bool {
        self.logging
    }

    /// DMA_LOGGING_REPORT: a bitmap of `[iova, iova + len)` in units of
    /// `page_size` (a power of two), bit `i` of word `i / 64` for the unit at
    /// `iova + i * page_size`, set if the device wrote any of it since the last
    /// report; reported pages are clean afterwards. Holes and regions without
    /// memory report clean. The caller bounds `len / page_size`.
    pub fn report(&self, iova: u64, len: u64, page_size: u64) -> Result<Vec<u64>, DmaError> {
        let end = iova.checked_add(len).filter(|_| len > 0).ok_or(DmaError::Invalid(iova, len))?;
        if !page_size.is_power_of_two() {
            return Err(DmaError::Invalid(iova, len));
        }
        let units = len.div_ceil(page_size);
        let mut bitmap = vec![0u64; units.div_ceil(64) as usize];
        let first = self.regions.range(..=iova).next_back().map_or(iova, |(&a, _)| a);
        for (&a, r) in self.regions.range(first..end) {
            let Some(m) = r.map.as_ref() else { continue };
            let lo = a.max(iova);
            let hi = (a + r.size).min(end);
            if lo >= hi {
                continue;
            }
            m.take_dirty(lo - a, hi - lo, |off| {
                // The logged page, clipped to the report, in report units.
                let p_lo = (a + off).max(iova);
                let p_hi = (a + off + guest_mem::DIRTY_PAGE).min(end);
                for u in (p_lo - iova) / page_size..=(p_hi - 1 - iova) / page_size {
                    bitmap[(u / 64) as usize] |= 1 << (u % 64);
                }
            });
        }
        Ok(bitmap)
    }

    /// The reachable part of the map as a guest memory snapshot.
    pub fn memory(&self) -> GuestMemory {
        self.mem.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(tag: &str, len: u64) -> OwnedFd {
        let p = std::env::temp_dir().join(format!("vnvme-dma-{tag}-{}", std::process::id()));
        let f = std::fs::File::options().read(true).write(true).create(true).truncate(true).open(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        f.set_len(len).unwrap();
        f.into()
    }

    #[test]
    fn mappings_past_the_end_of_the_file_are_refused() {
        let mut d = DmaRegions::default();
        let e = d.map(0x10000, 0x2000, Some(file("eof1", 0x1000)), 0, true).unwrap_err();
        assert!(matches!(e, DmaError::BeyondFile { file_len: 0x1000, .. }), "{e}");
        let e = d.map(0x10000, 0x1000, Some(file("eof2", 0x1000)), 0x1000, true).unwrap_err();
        assert!(matches!(e, DmaError::BeyondFile { .. }), "{e}");
        assert!(d.map(0x10000, 0x1000, Some(file("eof3", 0x2000)), 0x1000, true).is_ok());
        assert_eq!(d.memory().size(), 0x1000);
    }

    /// issue 50: memory that could shrink (an unsealed memfd, as SPDK's initiator
    /// sends; a regular file) is mapped, guarded: truncated by the client, an
    /// access to it fails (Lost) instead of killing the server with SIGBUS.
    /// Descriptors that are not memory are refused.
    #[test]
    fn memory_that_could_shrink_is_mapped_guarded() {
        use rustix::fs::{fcntl_add_seals, ftruncate, memfd_create, MemfdFlags, SealFlags};
        let memfd = |seal: bool| -> OwnedFd {
            let fd = memfd_create("t", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
            ftruncate(&fd, 0x2000).unwrap();
            if seal {
                fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).unwrap();
            }
            fd
        };
        let mut d = DmaRegions::default();
        let ev: OwnedFd = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
        assert!(matches!(d.map(0x10000, 0x1000, Some(ev), 0, true), Err(DmaError::NotMemory(_))));
        assert!(d.is_empty(), "refusals keep nothing");
        d.map(0x10000, 0x2000, Some(memfd(true)), 0, true).unwrap();
        let unsealed = memfd(false);
        let client_end = unsealed.try_clone().unwrap();
        d.map(0x20000, 0x2000, Some(unsealed), 0, true).unwrap();
        d.map(0x30000, 0x1000, Some(file("guarded", 0x1000)), 0, true).unwrap();
        assert_eq!(d.memory().size(), 0x5000);
        let mem = d.memory().clone();
        mem.write(0x21000, &[7u8; 64]).unwrap();
        // The client shrinks it under the mapping: the next access fails, the
        // process lives, and the other regions serve on.
        ftruncate(&client_end, 0).unwrap();
        let mut buf = [0u8; 64];
        assert!(matches!(mem.read(0x21000, &mut buf), Err(guest_mem::MemError::Lost { .. })));
        assert!(matches!(mem.load_u32(0x20000), Err(guest_mem::MemError::Lost { .. })));
        mem.write(0x10000, &[1u8; 64]).unwrap();
        mem.read(0x10000, &mut buf).unwrap();
        assert_eq!(buf, [1u8; 64]);
    }

    #[test]
    fn the_region_budget_is_enforced_and_follows_the_process_limits() {
        let mut d = DmaRegions::with_limit(2);
        d.map(0x10000, 0x1000, Some(file("lim1", 0x1000)), 0, true).unwrap();
        d.map(0x20000, 0x1000, None, 0, true).unwrap();
        assert!(matches!(d.map(0x30000, 0x1000, None, 0, true), Err(DmaError::TooMany(2))));
        assert_eq!(d.unmap(0x20000, 0x1000).unwrap().in_use(), 0, "a region without memory is never in use");
        d.map(0x30000, 0x1000, None, 0, true).unwrap();
        let budget = dma_map_budget();
        let nofile =
            rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(u64::MAX);
        assert!((1..=MAX_DMA_MAPS).contains(&budget) && budget as u64 <= nofile, "budget {budget}");
    }

    #[test]
    fn read_only_regions_are_remembered_but_unreachable() {
        let mut d = DmaRegions::default();
        d.map(0x10000, 0x1000, Some(file("ro", 0x1000)), 0, false).unwrap();
        assert_eq!(d.len(), 1);
        assert!(d.memory().check_range(0x10000, 1).is_err(), "a controller write there would fault");
        assert!(matches!(d.map(0x10000, 0x1000, None, 0, true), Err(DmaError::Overlap(..))));
        assert_eq!(d.unmap(0x10000, 0x1000).unwrap().in_use(), 0);
        assert!(d.is_empty());
    }

    /// vfio-user.rst DMA logging: only pages written while logging, in the report's
    /// units, whatever its page size, and each report starts from clean.
    #[test]
    fn the_dirty_report_covers_what_was_written_in_the_units_asked() {
        let mut d = DmaRegions::default();
        d.map(0x100000, 0x10000, Some(file("log1", 0x10000)), 0, true).unwrap();
        let mem = d.memory();
        mem.write(0x100000, &[1; 16]).unwrap();
        d.start_logging().unwrap();
        d.map(0x200000, 0x4000, Some(file("log2", 0x4000)), 0, true).unwrap();
        d.map(0x300000, 0x1000, None, 0, true).unwrap();
        let mem = d.memory();
        mem.write(0x101ff8, &[1; 16]).unwrap(); // pages 1 and 2 of the first region
        mem.store_u32(0x203000, 1).unwrap(); // page 3 of the one mapped since
        let all = d.report(0x100000, 0x104000, 0x1000).unwrap();
        assert_eq!(all.len(), 0x104 / 64 + 1);
        let set: Vec<u64> =
            (0..0x104u64).filter(|&u| all[(u / 64) as usize] & (1 << (u % 64)) != 0).collect();
        assert_eq!(set, vec![1, 2, 0x103]);
        assert!(d.report(0x100000, 0x104000, 0x1000).unwrap().iter().all(|&w| w == 0), "cleared");
        // Coarser units than the log: any dirty page sets its unit.
        mem.write(0x10f000, &[1]).unwrap();
        assert_eq!(d.report(0x100000, 0x10000, 0x8000).unwrap(), vec![0b10]);
        // Finer units: each logged page sets all of its units.
        mem.write(0x100000, &[1]).unwrap();
        assert_eq!(d.report(0x100000, 0x2000, 0x800).unwrap(), vec![0b11]);
        assert!(d.report(0x100000, 0, 0x1000).is_err());
        assert!(d.report(0x100000, 0x1000, 0x1800).is_err(), "not a power of two");
        assert!(d.report(u64::MAX - 10, 0x1000, 0x1000).is_err());
        d.stop_logging();
        mem.write(0x100000, &[1]).unwrap();
        d.start_logging().unwrap();
        assert!(d.report(0x100000, 0x10000, 0x1000).unwrap().iter().all(|&w| w == 0), "restarted clean");
        let _ = d.clear();
        assert!(!d.logging());
    }

    /// vfio-user.rst DMA_UNMAP: the server must stop using the memory before it replies;
    /// `Released` says when nothing does.
    #[test]
    fn released_memory_is_in_use_while_an_older_snapshot_holds_it() {
        let mut d = DmaRegions::default();
        d.map(0x10000, 0x1000, Some(file("rel1", 0x1000)), 0, true).unwrap();
        d.map(0x20000, 0x1000, Some(file("rel2", 0x1000)), 0, true).unwrap();
        let in_flight = d.memory(); // what a request submitted before the unmap holds
        let released = d.unmap(0x10000, 0x1000).unwrap();
        assert_eq!(released.in_use(), 1);
        assert!(d.memory().check_range(0x10000, 1).is_err(), "new work cannot reach it");
        assert!(in_flight.check_range(0x10000, 1).is_ok(), "the request still can");
        drop(in_flight);
        assert_eq!(released.in_use(), 0);
        let held = d.memory();
        let all = d.clear();
        assert_eq!(all.in_use(), 1);
        drop(held);
        assert_eq!(all.in_use(), 0);
    }
}
