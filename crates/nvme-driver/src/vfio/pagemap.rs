//! Virtual to physical translation through `/proc/self/pagemap`, for no-IOMMU mode
//! where the device sees physical addresses.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use super::ioctl::ctx;

/// Why a virtual address could not be translated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PagemapError {
    /// The page is not resident.
    NotPresent,
    /// The entry hides its frame number (the reader lacks CAP_SYS_ADMIN).
    Hidden,
}

/// Byte offset of the pagemap entry (8 bytes per base page) for `vaddr`.
pub fn pagemap_offset(vaddr: u64, page_size: u64) -> u64 {
    vaddr / page_size * 8
}

/// The physical address of `vaddr` from its pagemap entry: bit 63 present, bits 54:0
/// the page frame number (Documentation/admin-guide/mm/pagemap.rst).
pub fn pagemap_phys(entry: u64, vaddr: u64, page_size: u64) -> Result<u64, PagemapError> {
    if entry >> 63 == 0 {
        return Err(PagemapError::NotPresent);
    }
    let pfn = entry & ((1 << 55) - 1);
    if pfn == 0 {
        return Err(PagemapError::Hidden);
    }
    Ok(pfn * page_size + vaddr % page_size)
}

/// Physical address of one resident virtual address of this process.
pub(super) fn translate(pagemap: &File, vaddr: u64) -> io::Result<u64> {
    // SAFETY: sysconf has no memory effects.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    let mut e = [0u8; 8];
    pagemap.read_exact_at(&mut e, pagemap_offset(vaddr, page)).map_err(|e| ctx(e, "/proc/self/pagemap"))?;
    pagemap_phys(u64::from_le_bytes(e), vaddr, page).map_err(|why| match why {
        PagemapError::NotPresent => io::Error::other(format!("page at {vaddr:#x} is not resident")),
        PagemapError::Hidden => io::Error::new(
            io::ErrorKind::PermissionDenied,
            "/proc/self/pagemap hides physical addresses: no-IOMMU mode needs CAP_SYS_ADMIN",
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pagemap_entries_decode_to_physical_addresses() {
        let page = 4096;
        assert_eq!(pagemap_offset(0, page), 0);
        assert_eq!(pagemap_offset(0x7fff_1234_5678, page), 0x7_fff1_2345 * 8);
        let present = 1u64 << 63;
        assert_eq!(pagemap_phys(present | 0x1234, 0x7000_0abc, page), Ok(0x1234 * page + 0xabc));
        // Bits 55-62 are flags (soft-dirty, exclusive, file/shared, ...), not PFN.
        assert_eq!(pagemap_phys(present | (1 << 55) | (1 << 61) | 0x10, 0x1, page), Ok(0x10 * page + 1));
        assert_eq!(pagemap_phys(0x1234, 0, page), Err(PagemapError::NotPresent));
        assert_eq!(pagemap_phys(present, 0, page), Err(PagemapError::Hidden));
    }
}
