//! DMA memory for the device: a memfd mapped into this process and, in IOMMU mode,
//! mapped for the device at an IOVA from the bump allocator; in no-IOMMU mode, 2 MiB
//! huge pages whose physical addresses come from `/proc/self/pagemap`.

use std::fs::File;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use guest_mem::Mapping;

use super::ioctl::{ctx, last_error};

/// `MFD_HUGE_2MB`: log2(2 MiB) << MFD_HUGE_SHIFT.
pub(super) const MFD_HUGE_2MB: libc::c_uint = 21 << 26;

/// One DMA buffer handed out by `dma_alloc`.
#[derive(Debug)]
pub(super) struct DmaMapping {
    pub(super) iova: u64,
    pub(super) size: u64,
    /// Shared with the `DmaRegion`'s memory map, so the memory outlives the transport
    /// if the driver still holds it; only the device's access ends at drop.
    pub(super) _map: Arc<Mapping>,
    /// Whether the IOMMU has a mapping to remove (not in no-IOMMU mode).
    pub(super) in_iommu: bool,
}

pub(super) const fn align_up(v: u64, a: u64) -> Option<u64> {
    match v.checked_add(a - 1) {
        Some(x) => Some(x & !(a - 1)),
        None => None,
    }
}

pub(super) fn memfd(name: &std::ffi::CStr, flags: libc::c_uint, len: u64) -> io::Result<OwnedFd> {
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use guest_mem::GuestMemory;

    use super::*;
    use crate::vfio::pagemap::translate;
    use crate::vfio::{HUGE_PAGE, IOVA_BASE, PAGE};

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
