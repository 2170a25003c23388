//! DMA memory for the device: a memfd mapped into this process and, in IOMMU mode,
//! mapped for the device at an IOVA from the bump allocator; in no-IOMMU mode, 2 MiB
//! huge pages whose physical addresses come from `/proc/self/pagemap`.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use guest_mem::{GuestMemory, Mapping};
use tracing::debug;
use vfio_bindings::bindings::vfio::{
    vfio_iommu_type1_dma_map, vfio_iommu_type1_dma_unmap, VFIO_DMA_MAP_FLAG_READ, VFIO_DMA_MAP_FLAG_WRITE,
};

use super::ioctl::{argsz, ioctl_ptr, VFIO_IOMMU_MAP_DMA, VFIO_IOMMU_UNMAP_DMA};
use super::pagemap::translate;
use super::{ctx, invalid, last_error, KernelVfioTransport, HUGE_PAGE, PAGE};
use crate::transport::DmaRegion;

/// `MFD_HUGE_2MB`: log2(2 MiB) << MFD_HUGE_SHIFT.
const MFD_HUGE_2MB: libc::c_uint = 21 << 26;

/// One DMA buffer handed out by `dma_alloc`.
#[derive(Debug)]
pub(super) struct DmaMapping {
    pub(super) iova: u64,
    pub(super) size: u64,
    /// Shared with the `DmaRegion`'s memory map, so the memory outlives the transport
    /// if the driver still holds it; only the device's access ends at drop.
    _map: Arc<Mapping>,
    /// Whether the IOMMU has a mapping to remove (not in no-IOMMU mode).
    pub(super) in_iommu: bool,
}

pub(super) const fn align_up(v: u64, a: u64) -> Option<u64> {
    match v.checked_add(a - 1) {
        Some(x) => Some(x & !(a - 1)),
        None => None,
    }
}

fn memfd(name: &std::ffi::CStr, flags: libc::c_uint, len: u64) -> io::Result<OwnedFd> {
    // SAFETY: memfd_create with a valid NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), flags | libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(last_error("memfd_create"));
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    File::from(fd.try_clone()?)
        .set_len(len)
        .map_err(|e| ctx(e, format_args!("sizing DMA memory to {len} bytes")))?;
    Ok(fd)
}

impl KernelVfioTransport {
    pub(super) fn dma_alloc_iommu(&mut self, len: u64) -> io::Result<DmaRegion> {
        let size = align_up(len, PAGE).ok_or_else(|| invalid("DMA length overflows"))?;
        let fd = memfd(c"vnvme-vfio-dma", 0, size)?;
        let map = Arc::new(Mapping::from_fd(fd.as_fd(), 0, size, true)?);
        // Large buffers start on a 2 MiB boundary so the IOMMU can use large pages.
        let align = if size >= HUGE_PAGE { HUGE_PAGE } else { PAGE };
        let iova = align_up(self.next_iova, align)
            .filter(|i| i.checked_add(size).is_some())
            .ok_or_else(|| io::Error::other("IOVA space exhausted"))?;
        let (vaddr, _) = map.as_raw();
        let mut m = vfio_iommu_type1_dma_map {
            argsz: argsz::<vfio_iommu_type1_dma_map>(),
            flags: VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE,
            vaddr: vaddr as u64,
            iova,
            size,
        };
        // `m` is a live vfio_iommu_type1_dma_map of the size argsz names; the range it
        // names is our own mapping, kept alive by `self.dma` until unmapped.
        // SAFETY: a live argument, and a range that stays mapped until unmapped here.
        unsafe { ioctl_ptr(&self.container, VFIO_IOMMU_MAP_DMA, &mut m, "VFIO_IOMMU_MAP_DMA") }.map_err(
            |e| {
                if e.raw_os_error() == Some(libc::ENOMEM) {
                    ctx(e, "pinning DMA memory (raise the locked-memory limit, ulimit -l)")
                } else {
                    e
                }
            },
        )?;
        self.next_iova = iova + size;
        self.dma.push(DmaMapping { iova, size, _map: map.clone(), in_iommu: true });
        let mem = GuestMemory::empty().with_region(iova, size, map, 0)?;
        debug!(iova = format_args!("{iova:#x}"), size, "DMA memory mapped through the IOMMU");
        Ok(DmaRegion { iova, len: size, mem })
    }

    pub(super) fn iommu_unmap(&self, iova: u64, size: u64) -> io::Result<()> {
        let mut u = vfio_iommu_type1_dma_unmap {
            argsz: argsz::<vfio_iommu_type1_dma_unmap>(),
            iova,
            size,
            ..Default::default()
        };
        // `u` is a live vfio_iommu_type1_dma_unmap of the size argsz names (no dirty
        // bitmap requested, so no trailing data).
        // SAFETY: a live argument of exactly the size argsz names.
        unsafe { ioctl_ptr(&self.container, VFIO_IOMMU_UNMAP_DMA, &mut u, "VFIO_IOMMU_UNMAP_DMA") }?;
        Ok(())
    }

    pub(super) fn dma_alloc_noiommu(&mut self, len: u64) -> io::Result<DmaRegion> {
        let size = align_up(len, HUGE_PAGE).ok_or_else(|| invalid("DMA length overflows"))?;
        let fd = memfd(c"vnvme-vfio-dma", libc::MFD_HUGETLB | MFD_HUGE_2MB, size).map_err(|e| {
            ctx(
                e,
                "no-IOMMU DMA memory comes from 2 MiB huge pages: reserve some (/proc/sys/vm/nr_hugepages)",
            )
        })?;
        // A shared hugetlb mapping reserves its pages here, so a shortage fails now
        // rather than as SIGBUS on first touch.
        let map = Arc::new(Mapping::from_fd(fd.as_fd(), 0, size, true)?);
        let scratch = GuestMemory::empty().with_region(0, size, map.clone(), 0)?;
        scratch.fill(0, size, 0)?; // fault every huge page in
        let pagemap = File::open("/proc/self/pagemap").map_err(|e| ctx(e, "/proc/self/pagemap"))?;
        let (base, _) = map.as_raw();
        let phys0 = translate(&pagemap, base as u64)?;
        for i in 1..size / HUGE_PAGE {
            let p = translate(&pagemap, base as u64 + i * HUGE_PAGE)?;
            if p != phys0 + i * HUGE_PAGE {
                return Err(io::Error::other(format!(
                    "no-IOMMU mode: the {size}-byte DMA buffer is not physically contiguous; \
                     allocate at most {HUGE_PAGE} bytes at a time"
                )));
            }
        }
        self.dma.push(DmaMapping { iova: phys0, size, _map: map.clone(), in_iommu: false });
        let mem = GuestMemory::empty().with_region(phys0, size, map, 0)?;
        debug!(phys = format_args!("{phys0:#x}"), size, "no-IOMMU DMA memory");
        Ok(DmaRegion { iova: phys0, len: size, mem })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vfio::IOVA_BASE;

    #[test]
    fn pagemap_translation_of_our_own_memory() {
        let map = Mapping::anonymous(PAGE).unwrap();
        let (ptr, _) = map.as_raw();
        let scratch = GuestMemory::empty().with_region(0, PAGE, Arc::new(map), 0).unwrap();
        scratch.fill(0, PAGE, 0xaa).unwrap();
        let pagemap = File::open("/proc/self/pagemap").unwrap();
        match translate(&pagemap, ptr as u64 + 0x123) {
            Ok(phys) => assert_eq!(phys % PAGE, 0x123, "offset within the page survives"),
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}"),
        }
    }

    #[test]
    fn alignment_helpers() {
        assert_eq!(align_up(0, PAGE), Some(0));
        assert_eq!(align_up(1, PAGE), Some(PAGE));
        assert_eq!(align_up(IOVA_BASE + 1, HUGE_PAGE), Some(IOVA_BASE + HUGE_PAGE));
        assert_eq!(align_up(u64::MAX, PAGE), None);
    }
}
