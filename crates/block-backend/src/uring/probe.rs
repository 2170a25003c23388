//! What the storage can do, asked once at open: a block device's sysfs queue
//! attributes, the fallocate modes a file system takes, and whether the kernel knows
//! the block discard command. Each probe changes nothing on the storage.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use io_uring::{opcode, types, IoUring};

use super::sys;

/// A block device's `queue/<name>` attribute in sysfs (a partition's lives in its
/// parent disk's directory).
pub(super) fn queue_attr(rdev: u64, name: &str) -> Option<String> {
    let (maj, min) = (libc::major(rdev), libc::minor(rdev));
    let dir = format!("/sys/dev/block/{maj}:{min}");
    [format!("{dir}/queue/{name}"), format!("{dir}/../queue/{name}")]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_string())
}

/// What fallocate can do on a regular file (see [`crate::file::probe_fallocate`]).
pub(super) fn probe_file_caps(fd: BorrowedFd<'_>, size: u64) -> Caps {
    let (punch, zero_range) = crate::file::probe_fallocate(fd, size);
    Caps { punch, zero_range, discard_cmd: false }
}

/// Asks the block layer to discard an empty range at offset 0: a kernel that knows
/// `BLOCK_URING_CMD_DISCARD` rejects only the range (EINVAL), an older one the whole
/// command (EOPNOTSUPP). Nothing is discarded either way.
pub(super) fn probe_discard_cmd(fd: BorrowedFd<'_>) -> bool {
    let probe = || -> io::Result<bool> {
        let mut ring = IoUring::new(2)?;
        let mut p = io_uring::Probe::new();
        ring.submitter().register_probe(&mut p)?;
        if !p.is_supported(opcode::UringCmd16::CODE) {
            return Ok(false);
        }
        let e = opcode::UringCmd16::new(types::Fd(fd.as_raw_fd()), sys::BLOCK_URING_CMD_DISCARD)
            .addr(Some(0))
            .build()
            .user_data(0);
        // The command carries no pointers (start and length are plain numbers), and the
        // descriptor outlives the ring, which is waited on below.
        // SAFETY: the entry holds no pointers and the ring is drained below.
        unsafe { ring.submission().push(&e) }.map_err(io::Error::other)?;
        ring.submit_and_wait(1)?;
        let res = ring.completion().next().map(|c| c.result());
        Ok(matches!(res, Some(r) if r == 0 || r == -libc::EINVAL))
    };
    probe().unwrap_or(false)
}

/// What the fallocate family can do here, probed at open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Caps {
    /// `PUNCH_HOLE|KEEP_SIZE`: a hole in a file; zero-and-unmap on a block device.
    pub(super) punch: bool,
    /// `ZERO_RANGE`.
    pub(super) zero_range: bool,
    /// `BLOCK_URING_CMD_DISCARD` on a block device.
    pub(super) discard_cmd: bool,
}
