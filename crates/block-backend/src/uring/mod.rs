//! The fast file and block-device backend: asynchronous I/O through io_uring.
//!
//! Design, briefly:
//! - **One ring per queue.** Every [`Backend::open_queue`] creates its own
//!   `io_uring` instance with the backing file registered (fixed file 0; fixed file 1
//!   is a second, buffered descriptor used in direct mode, see below) and an eventfd
//!   registered for completions, which [`BackendQueue::notifier`] exposes. `submit`
//!   only fills the submission ring, `commit` makes one `io_uring_enter` for the
//!   batch, `reap` drains the eventfd and then the completion ring. Nothing waits. At
//!   most `queue_depth` requests are with the kernel at once; the rest wait in an
//!   overflow list and go in as completions free room.
//! - **Zero copy when aligned, bounce otherwise.** Reads and writes are
//!   `readv`/`writev` straight into guest memory (via [`GuestMemory::host_ranges`](guest_mem::GuestMemory::host_ranges),
//!   with a clone of the map kept in the request until its completion is reaped). In
//!   O_DIRECT mode that needs every buffer address aligned to the file's memory
//!   alignment and every length to its offset alignment (statx `STATX_DIOALIGN`, else
//!   the device's logical block size, else 512); a request whose buffers break that, or
//!   that needs more than `IOV_MAX` vectors, goes through an aligned bounce buffer
//!   from a per-queue pool, copied in at submit and out at reap. A request whose
//!   *offset or length* is misaligned cannot be fixed by a bounce buffer, so it uses
//!   the buffered descriptor (the kernel keeps page cache and direct I/O coherent).
//!   SGL bit buckets read into a per-queue scratch buffer that nobody ever reads.
//!   Registered (fixed) buffers are not used: guest memory changes with every
//!   DMA map, and the bounce path is the slow path anyway.
//! - **Durability.** Flush is `IORING_OP_FSYNC` with `FSYNC_DATASYNC`; a FUA write
//!   carries `RWF_DSYNC` (a block device turns it into a FUA write). A regular file
//!   and anything opened buffered has a volatile cache; a block device opened
//!   O_DIRECT has one if its sysfs `queue/write_cache` says "write back".
//! - **Discard and write zeroes**, probed at open, run as `IORING_OP_FALLOCATE`:
//!   files punch holes (`PUNCH_HOLE|KEEP_SIZE`, probed past EOF where it changes
//!   nothing; holes read back as zeroes) and zero with `ZERO_RANGE`. Where a file
//!   system can punch but not zero (tmpfs), Write Zeroes punches and then, unless the
//!   host allowed deallocation, preallocates the range again (`fallocate(KEEP_SIZE)`).
//!   Block devices zero with `ZERO_RANGE` (Write Zeroes, the kernel falls back to
//!   writing zero pages), zero-and-unmap with `PUNCH_HOLE|KEEP_SIZE` where the device
//!   supports Write Zeroes, and discard with the block io_uring command
//!   `BLOCK_URING_CMD_DISCARD` (Linux 6.12+), limits from sysfs. Without support,
//!   `discard` / `write_zeroes` are advertised false; Write Zeroes then writes zero
//!   buffers, and Discard (advisory) completes successfully without doing anything.
//! - **Vanishing storage.** A read that hits EOF checks whether the file shrank
//!   (→ [`BackendError::NotReady`](crate::BackendError::NotReady)); Flush, and reap at most once a second, check
//!   whether the file was unlinked, after which every request fails as not ready.
//!
//! Layout: this file holds the backend (open, the shared per-backend state and the
//! tunables below); `probe` asks what the storage can do, `queue` is the per-queue
//! ring (submit, commit, reap, drop), `plan` builds a request (descriptor, zero copy
//! or bounce, fallocate mode), `request` runs one in flight step by step, `buf` holds
//! the aligned buffers and vector lists, and `sys` the system calls outside the ring.

mod buf;
mod limits;
mod plan;
mod probe;
mod queue;
mod request;
mod shared;
mod sys;

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use tracing::warn;

use self::limits::MAX_QUEUE_DEPTH;
use self::probe::{probe_discard_cmd, probe_file_caps, queue_attr, Caps};
use self::queue::UringQueue;
use self::shared::{Layout, Shared, Synced};
use crate::{Backend, BackendInfo, BackendQueue};

/// Whether to open the backing storage with O_DIRECT.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DirectMode {
    /// O_DIRECT when the file system or device allows it, else buffered (with a warning).
    #[default]
    Auto,
    /// O_DIRECT or fail.
    On,
    /// Through the page cache.
    Off,
}

impl FromStr for DirectMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(DirectMode::Auto),
            "on" | "true" | "yes" | "1" => Ok(DirectMode::On),
            "off" | "false" | "no" | "0" => Ok(DirectMode::Off),
            _ => Err(format!("invalid direct mode {s:?} (expected auto, on or off)")),
        }
    }
}

impl fmt::Display for DirectMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DirectMode::Auto => "auto",
            DirectMode::On => "on",
            DirectMode::Off => "off",
        })
    }
}

/// How to open a [`UringBackend`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UringOptions {
    /// O_DIRECT or the page cache.
    pub direct: DirectMode,
    /// Requests each queue keeps with the kernel at once (ring entries); more wait in
    /// an overflow list. 1..=32768.
    pub queue_depth: u32,
    /// Creates a regular file of this size, or extends a smaller one to it.
    pub create_size: Option<u64>,
    /// Opens read-only: writes, write zeroes and discards fail with
    /// [`BackendError::ReadOnly`](crate::BackendError::ReadOnly).
    pub read_only: bool,
    /// The lock the open file takes before anything is done to it (None: none).
    pub lock: Option<file_lock::Request>,
}

impl Default for UringOptions {
    fn default() -> Self {
        UringOptions {
            direct: DirectMode::Auto,
            queue_depth: 128,
            create_size: None,
            read_only: false,
            lock: None,
        }
    }
}

/// A namespace stored in a regular file or a block device, driven through io_uring.
#[derive(Clone, Debug)]
pub struct UringBackend {
    sh: Arc<Shared>,
}

impl UringBackend {
    /// Opens a regular file or a block device.
    pub fn open(path: &Path, opts: UringOptions) -> io::Result<Self> {
        if opts.queue_depth == 0 || opts.queue_depth > MAX_QUEUE_DEPTH {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("queue depth {} is outside 1..={MAX_QUEUE_DEPTH}", opts.queue_depth),
            ));
        }
        let (mut file, mut direct) = open_file(path, &opts, opts.direct)?;
        crate::lock_file(&file, path, opts.lock.as_ref())?;
        let meta = file.metadata()?;
        let block_dev = meta.file_type().is_block_device();
        if !block_dev && !meta.file_type().is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is neither a regular file nor a block device", path.display()),
            ));
        }
        let mut size = if block_dev { sys::blk_size(file.as_fd())? } else { meta.len() };
        if let Some(want) = opts.create_size {
            if size < want {
                if block_dev || opts.read_only {
                    return Err(io::Error::other(format!(
                        "{} has {size} bytes, fewer than the {want} asked for",
                        path.display()
                    )));
                }
                file.set_len(want)?;
                size = want;
            }
        }
        if size == 0 {
            return Err(io::Error::other(format!("{} is empty; give a size to create it", path.display())));
        }
        let lbs = if block_dev { u64::from(sys::blk_logical_block_size(file.as_fd())?) } else { 1 };

        let (mut mem_align, mut off_align) = (1, 1);
        if direct {
            match sys::dio_align(file.as_fd()) {
                sys::DioAlign::Align { mem, offset } => (mem_align, off_align) = (mem.into(), offset.into()),
                sys::DioAlign::Unknown => (mem_align, off_align) = (lbs.max(512), lbs.max(512)),
                sys::DioAlign::Unsupported if opts.direct == DirectMode::On => {
                    return Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!("{} does not support O_DIRECT", path.display()),
                    ));
                }
                sys::DioAlign::Unsupported => {
                    warn!(path = %path.display(), "O_DIRECT is not supported here; using the page cache");
                    // The lock goes with the open it was on: taken again on the new one.
                    drop(file);
                    file = open_file(path, &opts, DirectMode::Off)?.0;
                    crate::lock_file(&file, path, opts.lock.as_ref())?;
                    direct = false;
                }
            }
        }
        let buffered = if direct { Some(reopen_buffered(&file, path, opts.read_only)?) } else { None };

        let mut info = BackendInfo {
            size,
            block_size: 1,
            volatile_cache: true,
            read_only: opts.read_only,
            ..Default::default()
        };
        let mut caps = Caps::default();
        if block_dev {
            let rdev = meta.rdev();
            let attr = |name| queue_attr(rdev, name);
            let num = |name| attr(name).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
            if direct {
                // Only a device whose cache is write-through needs no flushes;
                // anything unknown is treated as volatile.
                info.volatile_cache = attr("write_cache").is_none_or(|s| s != "write through");
            }
            let discard_max = num("discard_max_bytes");
            let zeroes_max = num("write_zeroes_max_bytes");
            if !opts.read_only {
                caps.zero_range = true;
                caps.punch = zeroes_max > 0;
                caps.discard_cmd = discard_max > 0 && probe_discard_cmd(file.as_fd());
            }
            if caps.discard_cmd {
                (info.discard, info.discard_max) = (true, discard_max);
            } else if caps.punch {
                (info.discard, info.discard_max) = (true, zeroes_max);
            }
            // Discarded blocks of a device read back as whatever it likes.
            info.discard_zeroes = false;
            info.write_zeroes = zeroes_max > 0 && !opts.read_only;
            info.write_zeroes_max = zeroes_max;
        } else {
            if !opts.read_only {
                caps = probe_file_caps(file.as_fd(), size);
            }
            info.discard = caps.punch;
            info.discard_zeroes = caps.punch;
            info.write_zeroes = caps.punch || caps.zero_range;
        }
        // Copy inside the file (io_uring has no such operation: the queue runs it
        // in place, which a reflinking file system makes cheap).
        info.copy = !block_dev && !opts.read_only && crate::copy_works(&file);
        info.kind = if direct {
            format!("uring:{} (O_DIRECT, {mem_align} B align)", path.display())
        } else {
            format!("uring:{} (buffered)", path.display())
        };

        Ok(UringBackend {
            sh: Arc::new(Shared {
                path: path.to_path_buf(),
                file,
                buffered,
                size: AtomicU64::new(size),
                layout: Layout {
                    direct,
                    mem_align,
                    off_align,
                    block_dev,
                    lbs,
                    read_only: opts.read_only,
                    caps,
                },
                queue_depth: opts.queue_depth,
                info,
                removed: AtomicBool::new(false),
                zeroes: OnceLock::new(),
                synced: Synced::default(),
            }),
        })
    }

    /// True if the storage was opened with O_DIRECT.
    pub fn is_direct(&self) -> bool {
        self.sh.layout.direct
    }

    /// True if the storage is a block device (rather than a regular file).
    pub fn is_block_device(&self) -> bool {
        self.sh.layout.block_dev
    }

    /// Direct I/O alignment as `(memory, offset)` in bytes; `(1, 1)` when buffered.
    pub fn alignment(&self) -> (u64, u64) {
        (self.sh.layout.mem_align, self.sh.layout.off_align)
    }

    /// The path the backend was opened from.
    pub fn path(&self) -> &Path {
        &self.sh.path
    }
}

impl Backend for UringBackend {
    fn info(&self) -> BackendInfo {
        self.sh.info.clone()
    }
    fn open_queue(&self) -> io::Result<Box<dyn BackendQueue>> {
        Ok(Box::new(UringQueue::new(self.sh.clone())?))
    }
    fn resize(&self, bytes: u64) -> io::Result<()> {
        if self.sh.layout.block_dev {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a block device's size is not ours to change",
            ));
        }
        if !bytes.is_multiple_of(self.sh.layout.off_align) {
            return Err(io::Error::other(format!(
                "{bytes} bytes is not a multiple of the {}-byte direct I/O alignment",
                self.sh.layout.off_align
            )));
        }
        crate::resize_file(&self.sh.file, bytes)?;
        self.sh.size.store(bytes, Ordering::Release);
        Ok(())
    }
    fn data_end(&self, from: u64) -> io::Result<Option<u64>> {
        crate::file_data_end(&self.sh.file, from, self.sh.size())
    }
    fn stats_line(&self) -> Option<String> {
        let (d, f) = self.durability();
        Some(format!("{d} FUA writes (RWF_DSYNC) and {f} flushes (fdatasync) completed by the kernel"))
    }
}

impl UringBackend {
    /// Writes completed with RWF_DSYNC and fdatasyncs completed, by every queue.
    pub fn durability(&self) -> (u64, u64) {
        let s = &self.sh.synced;
        (s.dsync_writes.load(Ordering::Relaxed), s.fsyncs.load(Ordering::Relaxed))
    }
}

fn open_file(path: &Path, opts: &UringOptions, mode: DirectMode) -> io::Result<(File, bool)> {
    let open = |direct: bool| {
        let mut o = OpenOptions::new();
        o.read(true)
            .write(!opts.read_only)
            .create(opts.create_size.is_some() && !opts.read_only)
            .truncate(false);
        if direct {
            o.custom_flags(libc::O_DIRECT);
        }
        o.open(path)
    };
    match mode {
        DirectMode::Off => Ok((open(false)?, false)),
        DirectMode::On => Ok((open(true)?, true)),
        DirectMode::Auto => match open(true) {
            Ok(f) => Ok((f, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                warn!(path = %path.display(), "O_DIRECT open failed ({e}); using the page cache");
                Ok((open(false)?, false))
            }
            Err(e) => Err(e),
        },
    }
}

/// Opens the same file again without O_DIRECT (through /proc, so it is the same
/// inode even if the path changed meanwhile).
fn reopen_buffered(file: &File, path: &Path, read_only: bool) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(!read_only);
    let proc_path = format!("/proc/self/fd/{}", file.as_raw_fd());
    match o.open(&proc_path) {
        Ok(f) => Ok(f),
        Err(_) => o.open(path),
    }
}
