//! A pool of DMA buffers carved out of one [`DmaRegion`]: page-granular, first fit,
//! freed when the [`DmaBuf`] is dropped.
//!
//! A command owns its data buffer (and its PRP list or range list) from submission to
//! completion, so the host never touches memory the device is transferring.
#![forbid(unsafe_code)]

use std::sync::{Arc, Mutex};

use guest_mem::{GuestMemory, MemError};

use crate::error::{DriverError, Result};
use crate::transport::DmaRegion;

/// The memory page size the driver programs (CC.MPS = 0).
pub const PAGE: u64 = 4096;

#[derive(Debug)]
struct PoolInner {
    region: DmaRegion,
    /// Free runs as (first page, pages), sorted and never adjacent.
    free: Mutex<Vec<(u64, u64)>>,
}

/// A page allocator over one DMA region. Cloning shares the pool.
#[derive(Clone, Debug)]
pub struct DmaPool {
    inner: Arc<PoolInner>,
}

impl DmaPool {
    /// A pool over all of `region` (its IOVA must be page aligned).
    pub fn new(region: DmaRegion) -> Result<Self> {
        if !region.iova.is_multiple_of(PAGE) || region.len < PAGE {
            return Err(DriverError::Invalid(format!(
                "DMA region {:#x}+{:#x} is not page aligned",
                region.iova, region.len
            )));
        }
        let pages = region.len / PAGE;
        Ok(DmaPool { inner: Arc::new(PoolInner { region, free: Mutex::new(vec![(0, pages)]) }) })
    }

    /// Bytes the pool manages.
    pub fn capacity(&self) -> u64 {
        self.inner.region.len / PAGE * PAGE
    }

    /// The host view of the pool's memory (addressed by IOVA).
    pub fn mem(&self) -> &GuestMemory {
        &self.inner.region.mem
    }

    /// Bytes currently free.
    pub fn free_bytes(&self) -> u64 {
        self.lock().iter().map(|&(_, n)| n).sum::<u64>() * PAGE
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(u64, u64)>> {
        self.inner.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A page-aligned buffer of `len` bytes (rounded up to whole pages). Its contents
    /// are whatever the last user left.
    pub fn alloc(&self, len: u64) -> Result<DmaBuf> {
        let pages = len.max(1).div_ceil(PAGE);
        let first = {
            let mut free = self.lock();
            let i = free.iter().position(|&(_, n)| n >= pages).ok_or(DriverError::PoolExhausted(len))?;
            let (start, n) = free[i];
            if n == pages {
                free.remove(i);
            } else {
                free[i] = (start + pages, n - pages);
            }
            start
        };
        Ok(DmaBuf { iova: self.inner.region.iova + first * PAGE, len, pages, pool: self.inner.clone() })
    }
}

impl PoolInner {
    fn release(&self, first: u64, pages: u64) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let i = free.partition_point(|&(s, _)| s < first);
        free.insert(i, (first, pages));
        // Merge with the next run, then with the previous one.
        if i + 1 < free.len() && free[i].0 + free[i].1 == free[i + 1].0 {
            free[i].1 += free[i + 1].1;
            free.remove(i + 1);
        }
        if i > 0 && free[i - 1].0 + free[i - 1].1 == free[i].0 {
            free[i - 1].1 += free[i].1;
            free.remove(i);
        }
    }
}

/// A buffer in DMA memory: the device reaches it at [`DmaBuf::iova`], the host
/// through bounds-checked copies. Returned to its pool on drop.
#[derive(Debug)]
pub struct DmaBuf {
    iova: u64,
    len: u64,
    pages: u64,
    pool: Arc<PoolInner>,
}

impl DmaBuf {
    /// The device's address of byte 0.
    pub fn iova(&self) -> u64 {
        self.iova
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The host view of the pool's memory (addressed by IOVA).
    pub fn mem(&self) -> &GuestMemory {
        &self.pool.region.mem
    }

    fn check(&self, off: u64, n: usize) -> Result<u64, MemError> {
        match off.checked_add(n as u64) {
            Some(end) if end <= self.len => Ok(self.iova + off),
            _ => Err(MemError::Unmapped { gpa: self.iova.wrapping_add(off), len: n as u64 }),
        }
    }

    /// Copies `data` into the buffer at `off`.
    pub fn write_at(&self, off: u64, data: &[u8]) -> Result<(), MemError> {
        self.mem().write(self.check(off, data.len())?, data)
    }

    /// Copies from the buffer at `off` into `out`.
    pub fn read_at(&self, off: u64, out: &mut [u8]) -> Result<(), MemError> {
        self.mem().read(self.check(off, out.len())?, out)
    }

    /// Fills the whole buffer with `byte`.
    pub fn fill(&self, byte: u8) -> Result<(), MemError> {
        self.mem().fill(self.iova, self.len, byte)
    }

    /// The buffer's contents.
    pub fn to_vec(&self) -> Result<Vec<u8>, MemError> {
        let mut v = vec![0u8; self.len as usize];
        self.read_at(0, &mut v)?;
        Ok(v)
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        let first = (self.iova - self.pool.region.iova) / PAGE;
        self.pool.release(first, self.pages);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(pages: u64) -> DmaPool {
        let iova = 0x10_0000;
        let mem = GuestMemory::anonymous(&[(iova, pages * PAGE)]).unwrap();
        DmaPool::new(DmaRegion { iova, len: pages * PAGE, mem }).unwrap()
    }

    #[test]
    fn alloc_free_and_coalesce() {
        let p = pool(8);
        let a = p.alloc(1).unwrap();
        let b = p.alloc(PAGE * 3).unwrap();
        let c = p.alloc(PAGE + 1).unwrap();
        assert_eq!((a.iova(), b.iova(), c.iova()), (0x10_0000, 0x10_1000, 0x10_4000));
        assert!(p.alloc(3 * PAGE).is_err(), "only 2 pages left");
        drop(b);
        let d = p.alloc(2 * PAGE).unwrap();
        assert_eq!(d.iova(), 0x10_1000, "first fit");
        drop((a, c, d));
        assert_eq!(p.free_bytes(), 8 * PAGE);
        assert_eq!(p.alloc(8 * PAGE).unwrap().iova(), 0x10_0000, "runs merged back into one");
    }

    #[test]
    fn buffer_access_is_bounded() {
        let p = pool(2);
        let b = p.alloc(100).unwrap();
        b.write_at(90, &[1; 10]).unwrap();
        assert!(b.write_at(91, &[1; 10]).is_err());
        let mut out = [0u8; 10];
        b.read_at(90, &mut out).unwrap();
        assert_eq!(out, [1; 10]);
        assert!(b.read_at(u64::MAX, &mut out).is_err());
    }
}
