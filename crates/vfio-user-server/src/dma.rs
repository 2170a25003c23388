//! The guest memory the client has shared with DMA_MAP, turned into a
//! [`GuestMemory`] map. Regions passed without a file descriptor are remembered (so
//! unmaps match) but are not reachable: we never use DMA_READ/DMA_WRITE messages,
//! which QEMU serves from its main loop and which would deadlock against a vCPU
//! waiting on us.

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
}

/// The DMA map of one client.
#[derive(Debug, Default)]
pub struct DmaRegions {
    regions: BTreeMap<u64, Region>,
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
            Some(fd) => Some(Arc::new(Mapping::from_fd(fd.as_fd(), offset, size, writable)?)),
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
