//! The guest memory the client has shared with DMA_MAP, turned into a
//! [`GuestMemory`] map. Regions passed without a file descriptor are remembered (so
//! unmaps match) but are not reachable: we never use DMA_READ/DMA_WRITE messages,
//! which QEMU serves from its main loop and which would deadlock against a vCPU
//! waiting on us.
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
}

/// The DMA map of one client.
#[derive(Debug, Default)]
pub struct DmaRegions {
    regions: BTreeMap<u64, Region>,
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

/// Most simultaneous DMA regions we accept (we advertise `max_dma_maps`).
pub const MAX_DMA_MAPS: usize = 65535;

impl DmaRegions {
    pub fn map(
        &mut self,
        iova: u64,
        size: u64,
        fd: Option<OwnedFd>,
        offset: u64,
        writable: bool,
    ) -> Result<(), DmaError> {
        let end = iova.checked_add(size).filter(|_| size > 0).ok_or(DmaError::Invalid(iova, size))?;
        if self.regions.iter().any(|(&a, r)| iova < a + r.size && a < end) {
            return Err(DmaError::Overlap(iova, size));
        }
        if self.regions.len() >= MAX_DMA_MAPS {
            return Err(DmaError::TooMany(MAX_DMA_MAPS));
        }
        let map = match fd {
            Some(_) if !writable => None,
            Some(fd) => {
                check_file_range(&fd, offset, size)?;
                Some(Arc::new(Mapping::from_fd(fd.as_fd(), offset, size, true)?))
            }
            None => None,
        };
        self.regions.insert(iova, Region { size, map });
        Ok(())
    }

    pub fn unmap(&mut self, iova: u64, size: u64) -> Result<(), DmaError> {
        match self.regions.get(&iova) {
            Some(r) if r.size == size => {
                self.regions.remove(&iova);
                Ok(())
            }
            _ => Err(DmaError::NotFound(iova, size)),
        }
    }

    pub fn clear(&mut self) {
        self.regions.clear();
    }

    pub fn len(&self) -> usize {
        self.regions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    /// The reachable part of the map as a guest memory snapshot.
    pub fn memory(&self) -> GuestMemory {
        let mut mem = GuestMemory::empty();
        for (&iova, r) in &self.regions {
            if let Some(m) = &r.map {
                mem = mem.with_region(iova, r.size, m.clone(), 0).expect("regions never overlap");
            }
        }
        mem
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

    #[test]
    fn read_only_regions_are_remembered_but_unreachable() {
        let mut d = DmaRegions::default();
        d.map(0x10000, 0x1000, Some(file("ro", 0x1000)), 0, false).unwrap();
        assert_eq!(d.len(), 1);
        assert!(d.memory().check_range(0x10000, 1).is_err(), "a controller write there would fault");
        assert!(matches!(d.map(0x10000, 0x1000, None, 0, true), Err(DmaError::Overlap(..))));
        d.unmap(0x10000, 0x1000).unwrap();
        assert!(d.is_empty());
    }
}
