//! The VFIO ioctls: their numbers, the two raw `ioctl` wrappers every call goes
//! through, and the argument structures that need building (region info, the
//! variable-length `VFIO_DEVICE_SET_IRQS` buffer).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};

use vfio_bindings::bindings::vfio::{vfio_irq_set, vfio_region_info, VFIO_BASE, VFIO_TYPE};

// ---- ioctl numbers (linux/vfio.h: `_IO(VFIO_TYPE, VFIO_BASE + n)`; bindgen does not
// translate the macros, so they are computed here and checked in the tests).

const fn vfio_io(n: u32) -> u64 {
    ((VFIO_TYPE as u64) << 8) | (VFIO_BASE + n) as u64
}
pub(super) const VFIO_GET_API_VERSION: u64 = vfio_io(0);
pub(super) const VFIO_CHECK_EXTENSION: u64 = vfio_io(1);
pub(super) const VFIO_SET_IOMMU: u64 = vfio_io(2);
pub(super) const VFIO_GROUP_GET_STATUS: u64 = vfio_io(3);
pub(super) const VFIO_GROUP_SET_CONTAINER: u64 = vfio_io(4);
pub(super) const VFIO_GROUP_GET_DEVICE_FD: u64 = vfio_io(6);
pub(super) const VFIO_DEVICE_GET_INFO: u64 = vfio_io(7);
pub(super) const VFIO_DEVICE_GET_REGION_INFO: u64 = vfio_io(8);
pub(super) const VFIO_DEVICE_GET_IRQ_INFO: u64 = vfio_io(9);
pub(super) const VFIO_DEVICE_SET_IRQS: u64 = vfio_io(10);
pub(super) const VFIO_DEVICE_RESET: u64 = vfio_io(11);
pub(super) const VFIO_IOMMU_MAP_DMA: u64 = vfio_io(13);
pub(super) const VFIO_IOMMU_UNMAP_DMA: u64 = vfio_io(14);

/// `ioctl(fd, req, value)` for requests that take an integer (or nothing).
pub(super) fn ioctl_val(fd: &impl AsRawFd, req: u64, value: libc::c_ulong, what: &str) -> io::Result<i32> {
    // These requests take their argument by value; the kernel reads no memory of ours
    // and writes none.
    // SAFETY: by-value requests touch no memory of ours.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req as libc::Ioctl, value) };
    if r < 0 {
        return Err(last_error(what));
    }
    Ok(r)
}

/// `ioctl(fd, req, arg)` for requests that read and/or write `*arg`.
///
/// # Safety
/// `arg` must point to memory that is valid, for the whole call, for every byte the
/// request reads or writes: the `argsz` the caller put in the structure (and for
/// variable-length requests the trailing data) must not exceed the allocation.
// SAFETY: callers uphold the contract above; the body only hands `arg` to the kernel.
pub(super) unsafe fn ioctl_ptr<T>(fd: &impl AsRawFd, req: u64, arg: *mut T, what: &str) -> io::Result<i32> {
    // SAFETY: the caller guarantees `arg` covers what the kernel accesses.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req as libc::Ioctl, arg) };
    if r < 0 {
        return Err(last_error(what));
    }
    Ok(r)
}

pub(super) fn argsz<T>() -> u32 {
    size_of::<T>() as u32
}

pub(super) fn region_info(device: &File, index: u32) -> io::Result<vfio_region_info> {
    let mut info = vfio_region_info { argsz: argsz::<vfio_region_info>(), index, ..Default::default() };
    // `info` is a live vfio_region_info and argsz says exactly its size, so the kernel
    // writes no capability data past it.
    // SAFETY: the kernel writes at most argsz bytes into `info`.
    unsafe { ioctl_ptr(device, VFIO_DEVICE_GET_REGION_INFO, &mut info, "VFIO_DEVICE_GET_REGION_INFO")? };
    Ok(info)
}

/// The VFIO_DEVICE_SET_IRQS argument: a `vfio_irq_set` header followed by one `i32` per
/// vector (the eventfds), as 32-bit words so the buffer is suitably aligned.
pub(super) fn irq_set_buffer(flags: u32, index: u32, start: u32, fds: &[RawFd]) -> Vec<u32> {
    const HDR: usize = size_of::<vfio_irq_set>();
    const _: () = assert!(HDR == 20 && align_of::<vfio_irq_set>() == 4);
    let mut words = vec![0u32; HDR / 4 + fds.len()];
    let hdr = vfio_irq_set {
        argsz: (HDR + 4 * fds.len()) as u32,
        flags,
        index,
        start,
        count: fds.len() as u32,
        data: Default::default(),
    };
    words[0..5].copy_from_slice(&[hdr.argsz, hdr.flags, hdr.index, hdr.start, hdr.count]);
    for (w, fd) in words[HDR / 4..].iter_mut().zip(fds) {
        *w = *fd as u32;
    }
    words
}

/// An error that keeps the OS error kind and says what was being done.
pub(super) fn ctx(e: io::Error, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

pub(super) fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.into())
}

pub(super) fn last_error(what: impl std::fmt::Display) -> io::Error {
    ctx(io::Error::last_os_error(), what)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfio_bindings::bindings::vfio::{
        VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE,
    };

    #[test]
    fn ioctl_numbers_match_linux_vfio_h() {
        // _IO(';', 100 + n) = 0x3b00 | (100 + n).
        assert_eq!(VFIO_GET_API_VERSION, 0x3b64);
        assert_eq!(VFIO_SET_IOMMU, 0x3b66);
        assert_eq!(VFIO_GROUP_GET_DEVICE_FD, 0x3b6a);
        assert_eq!(VFIO_DEVICE_GET_REGION_INFO, 0x3b6c);
        assert_eq!(VFIO_DEVICE_SET_IRQS, 0x3b6e);
        assert_eq!(VFIO_DEVICE_RESET, 0x3b6f);
        assert_eq!(VFIO_IOMMU_MAP_DMA, 0x3b71);
        assert_eq!(VFIO_IOMMU_UNMAP_DMA, 0x3b72);
    }

    #[test]
    fn irq_set_buffer_layout() {
        let b = irq_set_buffer(VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER, 2, 0, &[10, 11, 12]);
        assert_eq!(b, vec![32, 0x24, 2, 0, 3, 10, 11, 12]);
        let none = irq_set_buffer(VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER, 2, 0, &[]);
        assert_eq!(none, vec![20, 0x21, 2, 0, 0]);
    }
}
