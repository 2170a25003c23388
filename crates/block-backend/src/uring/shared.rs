//! What every queue of an io_uring backend shares: the file, how it must be
//! addressed, and the counters all queues add to.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

use super::buf::AlignedBuf;
use super::probe::Caps;
use crate::BackendInfo;

/// How requests must be shaped for the file: O_DIRECT and its alignments, block
/// device or file, what the fallocate family can do.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    pub(super) direct: bool,
    /// Direct I/O alignment of buffer addresses and of offsets/lengths (1 if buffered).
    pub(super) mem_align: u64,
    pub(super) off_align: u64,
    pub(super) block_dev: bool,
    /// A block device's logical block size (1 for files): fallocate and discard on a
    /// block device need ranges in whole blocks.
    pub(super) lbs: u64,
    pub(super) read_only: bool,
    pub(super) caps: Caps,
}

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) path: PathBuf,
    pub(super) file: File,
    /// A descriptor without O_DIRECT, for requests whose offset or length the direct
    /// one cannot take. Only in direct mode.
    pub(super) buffered: Option<File>,
    /// Bytes (a resize changes it).
    pub(super) size: AtomicU64,
    pub(super) layout: Layout,
    pub(super) queue_depth: u32,
    pub(super) info: BackendInfo,
    /// The file was unlinked: every request fails.
    pub(super) removed: AtomicBool,
    /// Zeroes that emulated Write Zeroes writes from (allocated on first use).
    pub(super) zeroes: OnceLock<AlignedBuf>,
    /// What the guest's durability asked for, as it reached the file.
    pub(super) synced: Synced,
}

/// Writes the kernel completed with RWF_DSYNC (FUA), and fdatasyncs (Flush).
#[derive(Debug, Default)]
pub(super) struct Synced {
    pub(super) dsync_writes: AtomicU64,
    pub(super) fsyncs: AtomicU64,
}

impl Shared {
    /// The size now.
    pub(super) fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }
}
