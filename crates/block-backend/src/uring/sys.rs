//! The few system calls the io_uring backend makes outside the ring: block device
//! ioctls, statx for direct-I/O alignment and the eventfd. Each wrapper is the only
//! place its `unsafe` lives.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// The ioctl number encoding: the direction field's position and its "read" and
/// "none" values differ on a few architectures (3 direction bits at 29 instead of 2
/// at 30).
#[cfg(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
))]
const IOC: (u32, u32, u32) = (29, 2, 1); // (direction shift, read, none)
#[cfg(not(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
)))]
const IOC: (u32, u32, u32) = (30, 2, 0);

/// An ioctl number: direction, argument size, type and number.
const fn ioc(dir: u32, ty: u32, nr: u32, size: u32) -> u32 {
    (dir << IOC.0) | (size << 16) | (ty << 8) | nr
}

/// `BLKGETSIZE64` (`_IOR(0x12, 114, size_t)`): a block device's size in bytes.
const BLKGETSIZE64: u32 = ioc(IOC.1, 0x12, 114, 8);

/// `BLOCK_URING_CMD_DISCARD` (`_IO(0x12, 0)`): the io_uring command that discards a
/// byte range of a block device (Linux 6.12 and later).
pub(super) const BLOCK_URING_CMD_DISCARD: u32 = ioc(IOC.2, 0x12, 0, 0);

#[cfg(target_arch = "x86_64")]
const _: () = {
    assert!(BLKGETSIZE64 == 0x8008_1272);
    assert!(BLOCK_URING_CMD_DISCARD == 0x1200);
};

fn cvt(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The size of the block device behind `fd`, in bytes.
pub(super) fn blk_size(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut size: u64 = 0;
    // BLKGETSIZE64 writes one u64 through the pointer, which points at a live local of
    // that type; the descriptor is borrowed and open for the call.
    // SAFETY: the ioctl writes one u64 into a live local.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), BLKGETSIZE64 as _, &mut size as *mut u64) })?;
    Ok(size)
}

/// The logical block size of the block device behind `fd`.
pub(super) fn blk_logical_block_size(fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut lbs: libc::c_int = 0;
    // BLKSSZGET writes one int through the pointer, which points at a live local of
    // that type; the descriptor is borrowed and open for the call.
    // SAFETY: the ioctl writes one int into a live local.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), libc::BLKSSZGET, &mut lbs as *mut libc::c_int) })?;
    u32::try_from(lbs)
        .ok()
        .filter(|&v| v.is_power_of_two())
        .ok_or_else(|| io::Error::other(format!("block device reports a logical block size of {lbs}")))
}

/// What statx says about direct I/O on `fd`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum DioAlign {
    /// The kernel (or the file system) does not report it.
    Unknown,
    /// The file does not support direct I/O at all.
    Unsupported,
    /// Buffer addresses must be multiples of `mem`, file offsets and lengths of `offset`.
    Align { mem: u32, offset: u32 },
}

/// Direct-I/O alignment from statx(STATX_DIOALIGN), Linux 6.1 and later.
pub(super) fn dio_align(fd: BorrowedFd<'_>) -> DioAlign {
    // SAFETY: statx is plain old data; all zeroes is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // An empty path with AT_EMPTY_PATH makes statx describe `fd` itself; the path is a
    // valid C string and `stx` a live, writable statx buffer.
    // SAFETY: valid path, valid flags, and a live buffer of the right type.
    let r = unsafe {
        libc::statx(fd.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN, &mut stx)
    };
    if r != 0 || stx.stx_mask & libc::STATX_DIOALIGN == 0 {
        return DioAlign::Unknown;
    }
    if stx.stx_dio_mem_align == 0 || stx.stx_dio_offset_align == 0 {
        return DioAlign::Unsupported;
    }
    DioAlign::Align { mem: stx.stx_dio_mem_align, offset: stx.stx_dio_offset_align }
}

/// A non-blocking, close-on-exec eventfd.
pub(super) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers; the result is checked below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
