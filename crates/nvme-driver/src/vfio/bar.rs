//! BAR0 reached through an mmap of the device fd: bounds-checked, 32-bit volatile
//! accesses, and doorbells that share the mapping and ring without the transport.
//! When the kernel refuses the mmap, [`Bar0::Trapped`] says where pread/pwrite go.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use crate::transport::DirectDoorbell;

use super::ioctl::{invalid, last_error};

/// BAR0 mapped into this process.
pub(super) struct BarMapping {
    ptr: *mut u8,
    pub(super) len: usize,
}

// The mapping is device memory reached only through volatile 32-bit accesses at bounds-
// checked offsets; each access is independent, so any thread may do it.
// SAFETY: independent volatile accesses are safe from any thread.
unsafe impl Send for BarMapping {}
// SAFETY: see Send.
unsafe impl Sync for BarMapping {}

impl std::fmt::Debug for BarMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BarMapping").field("len", &self.len).finish_non_exhaustive()
    }
}

impl BarMapping {
    pub(super) fn map(device: &File, offset: u64, len: u64) -> io::Result<Self> {
        let size = usize::try_from(len).map_err(|_| invalid("BAR0 too large"))?;
        let off = libc::off_t::try_from(offset).map_err(|_| invalid("BAR0 offset too large"))?;
        // A fresh shared mapping of the device fd at an address the kernel picks; it
        // aliases no Rust object. The result is checked for MAP_FAILED.
        // SAFETY: a new mapping aliases nothing; failure is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                device.as_raw_fd(),
                off,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(last_error("mmap of BAR0"));
        }
        Ok(BarMapping { ptr: ptr.cast(), len: size })
    }

    pub(super) fn reg(&self, off: u64) -> io::Result<*mut u32> {
        let o = usize::try_from(off)
            .ok()
            .filter(|o| o.is_multiple_of(4) && o.checked_add(4).is_some_and(|e| e <= self.len));
        let o =
            o.ok_or_else(|| invalid(format!("BAR0 offset {off:#x} is unaligned or beyond {:#x}", self.len)))?;
        Ok(self.ptr.wrapping_add(o).cast())
    }

    pub(super) fn read32(&self, off: u64) -> io::Result<u32> {
        let p = self.reg(off)?;
        // `p` is 4-byte aligned and inside the live mapping (checked by `reg`); a
        // volatile read is how device registers must be read.
        // SAFETY: aligned, in bounds, and volatile.
        Ok(u32::from_le(unsafe { p.read_volatile() }))
    }

    pub(super) fn write32(&self, off: u64, v: u32) -> io::Result<()> {
        let p = self.reg(off)?;
        // SAFETY: as in `read32`; the mapping is writable (PROT_WRITE).
        unsafe { p.write_volatile(v.to_le()) };
        Ok(())
    }
}

impl Drop for BarMapping {
    fn drop(&mut self) {
        // `ptr`/`len` come from a successful mmap and are unmapped once, here; doorbell
        // writers share the mapping through an Arc, so none outlives it.
        // SAFETY: unmapped once, after its last user.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// How BAR0 is reached.
#[derive(Debug)]
pub(super) enum Bar0 {
    Mapped(Arc<BarMapping>),
    /// pread/pwrite on the device fd at this region offset.
    Trapped {
        offset: u64,
        size: u64,
    },
}

/// A doorbell in the BAR0 mapping, rung without the transport.
#[derive(Debug)]
pub(super) struct MappedDoorbell {
    pub(super) bar: Arc<BarMapping>,
    pub(super) off: u64,
}

impl DirectDoorbell for MappedDoorbell {
    fn ring(&mut self, value: u32) -> io::Result<()> {
        self.bar.write32(self.off, value)
    }
}
