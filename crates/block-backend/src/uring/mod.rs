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
//!   `readv`/`writev` straight into guest memory (via [`GuestMemory::host_ranges`],
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
//!   (→ [`BackendError::NotReady`]); Flush, and reap at most once a second, check
//!   whether the file was unlinked, after which every request fails as not ready.

mod sys;

use std::collections::VecDeque;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use guest_mem::{GuestMemory, HostRange};
use io_uring::{opcode, squeue, types, IoUring};
use tracing::{error, warn};

use crate::{
    check_range, Backend, BackendError, BackendInfo, BackendQueue, Completion, DataBuf, Op, Request, Segment,
    SegmentCursor,
};

/// The most vectors one readv/writev takes (Linux UIO_MAXIOV).
const IOV_MAX: usize = 1024;
/// Alignment of every buffer this backend allocates (bounce, zeroes, scratch).
const BUF_ALIGN: usize = 4096;
/// Size of the shared zero buffer that emulated Write Zeroes writes from.
const ZERO_CHUNK: usize = 256 << 10;
/// Size of the per-queue scratch buffer that SGL bit buckets read into.
const TRASH_CHUNK: usize = 64 << 10;
/// Bounce buffers kept per queue, and the largest one kept.
const BOUNCE_POOL_MAX: usize = 16;
const BOUNCE_KEEP_MAX: usize = 4 << 20;
/// How often reap checks whether the backing file was unlinked.
const REMOVAL_CHECK_PERIOD: Duration = Duration::from_secs(1);
/// Retries of a request the kernel answered with EAGAIN or EINTR.
const MAX_RETRIES: u8 = 16;
/// The largest ring the kernel accepts without clamping.
const MAX_QUEUE_DEPTH: u32 = 32768;
/// Fixed-file slots: the main descriptor and the buffered one (the main one again
/// when the main one is buffered already).
const FD_MAIN: u32 = 0;
const FD_BUFFERED: u32 = 1;

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
    /// [`BackendError::ReadOnly`].
    pub read_only: bool,
}

impl Default for UringOptions {
    fn default() -> Self {
        UringOptions { direct: DirectMode::Auto, queue_depth: 128, create_size: None, read_only: false }
    }
}

/// A namespace stored in a regular file or a block device, driven through io_uring.
#[derive(Clone, Debug)]
pub struct UringBackend {
    sh: Arc<Shared>,
}

/// What the fallocate family can do here, probed at open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Caps {
    /// `PUNCH_HOLE|KEEP_SIZE`: a hole in a file; zero-and-unmap on a block device.
    punch: bool,
    /// `ZERO_RANGE`.
    zero_range: bool,
    /// `BLOCK_URING_CMD_DISCARD` on a block device.
    discard_cmd: bool,
}

/// What every queue of a backend shares.
#[derive(Debug)]
struct Shared {
    path: PathBuf,
    file: File,
    /// A descriptor without O_DIRECT, for requests whose offset or length the direct
    /// one cannot take. Only in direct mode.
    buffered: Option<File>,
    size: u64,
    direct: bool,
    /// Direct I/O alignment of buffer addresses and of offsets/lengths (1 if buffered).
    mem_align: u64,
    off_align: u64,
    block_dev: bool,
    /// A block device's logical block size (1 for files): fallocate and discard on a
    /// block device need ranges in whole blocks.
    lbs: u64,
    read_only: bool,
    caps: Caps,
    queue_depth: u32,
    info: BackendInfo,
    /// The file was unlinked: every request fails.
    removed: AtomicBool,
    /// Zeroes that emulated Write Zeroes writes from (allocated on first use).
    zeroes: OnceLock<AlignedBuf>,
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
                    file = open_file(path, &opts, DirectMode::Off)?.0;
                    direct = false;
                }
            }
        }
        let buffered = if direct { Some(reopen_buffered(&file, path, opts.read_only)?) } else { None };

        let mut info = BackendInfo { size, block_size: 1, volatile_cache: true, ..Default::default() };
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
                size,
                direct,
                mem_align,
                off_align,
                block_dev,
                lbs,
                read_only: opts.read_only,
                caps,
                queue_depth: opts.queue_depth,
                info,
                removed: AtomicBool::new(false),
                zeroes: OnceLock::new(),
            }),
        })
    }

    /// True if the storage was opened with O_DIRECT.
    pub fn is_direct(&self) -> bool {
        self.sh.direct
    }

    /// True if the storage is a block device (rather than a regular file).
    pub fn is_block_device(&self) -> bool {
        self.sh.block_dev
    }

    /// Direct I/O alignment as `(memory, offset)` in bytes; `(1, 1)` when buffered.
    pub fn alignment(&self) -> (u64, u64) {
        (self.sh.mem_align, self.sh.off_align)
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

/// A block device's `queue/<name>` attribute in sysfs (a partition's lives in its
/// parent disk's directory).
fn queue_attr(rdev: u64, name: &str) -> Option<String> {
    let (maj, min) = (libc::major(rdev), libc::minor(rdev));
    let dir = format!("/sys/dev/block/{maj}:{min}");
    [format!("{dir}/queue/{name}"), format!("{dir}/../queue/{name}")]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_string())
}

/// What fallocate can do on a regular file (see [`crate::file::probe_fallocate`]).
fn probe_file_caps(fd: BorrowedFd<'_>, size: u64) -> Caps {
    let (punch, zero_range) = crate::file::probe_fallocate(fd, size);
    Caps { punch, zero_range, discard_cmd: false }
}

/// Asks the block layer to discard an empty range at offset 0: a kernel that knows
/// `BLOCK_URING_CMD_DISCARD` rejects only the range (EINVAL), an older one the whole
/// command (EOPNOTSUPP). Nothing is discarded either way.
fn probe_discard_cmd(fd: BorrowedFd<'_>) -> bool {
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

// ---- buffers

/// A zero-initialised buffer whose start is aligned to [`BUF_ALIGN`] (or more).
struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    cap: usize,
}

impl AlignedBuf {
    fn new(cap: usize, align: usize) -> Self {
        let align = align.max(BUF_ALIGN);
        let raw = vec![0u8; cap + align];
        let start = raw.as_ptr().align_offset(align);
        AlignedBuf { raw, start, cap }
    }
    /// The address of the first byte, for the kernel. The heap block never moves.
    fn addr(&self) -> usize {
        self.raw.as_ptr() as usize + self.start
    }
    fn slice(&self, n: usize) -> &[u8] {
        &self.raw[self.start..self.start + n]
    }
    fn slice_mut(&mut self, n: usize) -> &mut [u8] {
        &mut self.raw[self.start..self.start + n]
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AlignedBuf({} bytes at {:#x})", self.cap, self.addr())
    }
}

/// One I/O vector, laid out exactly like `struct iovec` but made of plain numbers,
/// so requests holding them stay `Send`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct IoVec {
    base: usize,
    len: usize,
}

const _: () = assert!(std::mem::size_of::<IoVec>() == std::mem::size_of::<libc::iovec>());
const _: () = assert!(std::mem::align_of::<IoVec>() == std::mem::align_of::<libc::iovec>());

/// Drops the first `n` bytes of a vector list (after a partial transfer).
fn advance(iov: &mut Vec<IoVec>, mut n: usize) {
    let mut k = 0;
    while k < iov.len() && n >= iov[k].len {
        n -= iov[k].len;
        k += 1;
    }
    iov.drain(..k);
    if n > 0 {
        if let Some(first) = iov.first_mut() {
            first.base += n;
            first.len -= n;
        }
    }
}

/// Appends vectors covering `len` bytes of a buffer `chunk` bytes long at `base`,
/// reusing it as often as needed.
fn push_repeated(iov: &mut Vec<IoVec>, base: usize, chunk: usize, mut len: u64) {
    while len > 0 {
        let n = (chunk as u64).min(len) as usize;
        iov.push(IoVec { base, len: n });
        len -= n as u64;
    }
}

// ---- requests

/// One step of a request, one SQE at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Read,
    Write {
        flags: i32,
    },
    /// Writes zeroes from the shared zero buffer (Write Zeroes without fallocate).
    WriteZeroBufs,
    Fsync,
    /// `optional`: an EOPNOTSUPP answer is fine (the preallocation after a punch).
    Fallocate {
        mode: i32,
        offset: u64,
        len: u64,
        optional: bool,
    },
    DiscardCmd {
        offset: u64,
        len: u64,
    },
}

#[derive(Debug)]
struct Slot {
    tag: u64,
    data: DataBuf,
    /// Keeps guest mappings alive while the kernel may touch them, and is what
    /// bounced reads are copied out through.
    mem: GuestMemory,
    offset: u64,
    len: u64,
    step: Step,
    next: Option<Step>,
    /// Fixed-file index.
    fd: u32,
    /// Bytes moved so far by the current read/write step.
    done: u64,
    /// What the next read/write SQE transfers (advanced after partial transfers).
    iov: Vec<IoVec>,
    bounce: Option<AlignedBuf>,
    /// A read through `bounce`: copy out on success.
    copy_out: bool,
    retries: u8,
}

impl Slot {
    fn new(tag: u64, mem: &GuestMemory, offset: u64, len: u64, step: Step) -> Self {
        Slot {
            tag,
            data: DataBuf::None,
            mem: mem.clone(),
            offset,
            len,
            step,
            next: None,
            fd: FD_MAIN,
            done: 0,
            iov: Vec::new(),
            bounce: None,
            copy_out: false,
            retries: 0,
        }
    }

    fn entry(&self, idx: usize) -> squeue::Entry {
        let fd = types::Fixed(self.fd);
        let iov = self.iov.as_ptr().cast::<libc::iovec>();
        let n = self.iov.len() as u32;
        let off = self.offset + self.done;
        let e = match self.step {
            Step::Read => opcode::Readv::new(fd, iov, n).offset(off).build(),
            Step::Write { flags } => opcode::Writev::new(fd, iov, n).offset(off).rw_flags(flags).build(),
            Step::WriteZeroBufs => opcode::Writev::new(fd, iov, n).offset(off).build(),
            Step::Fsync => opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build(),
            Step::Fallocate { mode, offset, len, .. } => {
                opcode::Fallocate::new(fd, len).offset(offset).mode(mode).build()
            }
            Step::DiscardCmd { offset, len } => {
                let mut cmd = [0u8; 16];
                cmd[..8].copy_from_slice(&len.to_ne_bytes());
                opcode::UringCmd16::new(fd, sys::BLOCK_URING_CMD_DISCARD).addr(Some(offset)).cmd(cmd).build()
            }
        };
        e.user_data(idx as u64)
    }
}

/// What to do with a slot after a completion.
#[derive(Debug)]
enum Outcome {
    /// Send the (next part of the) request again.
    Again,
    /// Point the vectors at zeroes for the rest, then send it again.
    MoreZeroes,
    /// A read found the end of the file before its end.
    Eof {
        done: u64,
        len: u64,
    },
    Done(Result<(), BackendError>),
}

impl Slot {
    /// Takes in one completion result.
    fn on_result(&mut self, res: i32) -> Outcome {
        if res < 0 {
            let errno = -res;
            if matches!(errno, libc::EAGAIN | libc::EINTR) && self.retries < MAX_RETRIES {
                self.retries += 1;
                return Outcome::Again;
            }
            let optional = matches!(self.step, Step::Fallocate { optional: true, .. });
            if !(optional && errno == libc::EOPNOTSUPP) {
                return Outcome::Done(Err(BackendError::from_errno(errno)));
            }
        } else if matches!(self.step, Step::Read | Step::Write { .. } | Step::WriteZeroBufs) {
            let n = (res as u64).min(self.len - self.done);
            if n == 0 {
                let (done, len) = (self.done, self.len);
                return match self.step {
                    Step::Read => Outcome::Eof { done, len },
                    _ => Outcome::Done(Err(BackendError::Short { done, len })),
                };
            }
            self.done += n;
            if self.done < self.len {
                // A partial transfer: send the rest.
                advance(&mut self.iov, n as usize);
                return match (self.iov.is_empty(), self.step) {
                    (false, _) => Outcome::Again,
                    (true, Step::WriteZeroBufs) => Outcome::MoreZeroes,
                    (true, _) => Outcome::Done(Err(BackendError::Short { done: self.done, len: self.len })),
                };
            }
        }
        match self.next.take() {
            Some(next) => {
                self.step = next;
                self.done = 0;
                self.retries = 0;
                Outcome::Again
            }
            None => Outcome::Done(Ok(())),
        }
    }
}

/// Points a zero-writing request's vectors at the shared zero buffer, for as much of
/// the `rest` as one writev takes.
fn fill_zero_iov(iov: &mut Vec<IoVec>, zeroes: usize, rest: u64) {
    iov.clear();
    push_repeated(iov, zeroes, ZERO_CHUNK, rest.min((ZERO_CHUNK * IOV_MAX) as u64));
}

fn removed_error() -> BackendError {
    BackendError::NotReady("backend file was removed".into())
}

fn invalid(msg: String) -> BackendError {
    BackendError::Io(io::Error::new(io::ErrorKind::InvalidInput, msg))
}

/// One queue: a ring, its eventfd, and the requests in flight.
struct UringQueue {
    sh: Arc<Shared>,
    ring: IoUring,
    /// The eventfd the ring signals on every completion.
    event: File,
    /// The eventfd may be readable although the completion ring is empty: a
    /// completion was taken after the last drain (or we kicked it). When false and
    /// the ring is empty, reap skips the read.
    event_dirty: bool,
    /// Requests by ring user_data; `free` lists the empty slots.
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    used: usize,
    /// Requests waiting for room in the ring (new ones beyond the depth, and
    /// resubmissions after a partial transfer).
    pending: VecDeque<usize>,
    /// SQEs pushed and not yet completed.
    in_kernel: u32,
    /// Finished requests waiting for reap.
    done: Vec<Completion>,
    /// Scratch buffer SGL bit buckets read into; the kernel writes it, nobody reads it.
    trash: Option<AlignedBuf>,
    bounce_pool: Vec<AlignedBuf>,
    iov_pool: Vec<Vec<IoVec>>,
    ranges: Vec<HostRange>,
    cqes: Vec<(u64, i32)>,
    last_check: Instant,
}

impl fmt::Debug for UringQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UringQueue")
            .field("path", &self.sh.path)
            .field("in_flight", &self.in_flight())
            .field("in_kernel", &self.in_kernel)
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl UringQueue {
    fn new(sh: Arc<Shared>) -> io::Result<Self> {
        let ring = IoUring::new(sh.queue_depth)?;
        let main = sh.file.as_raw_fd();
        let buffered = sh.buffered.as_ref().map_or(main, |f| f.as_raw_fd());
        ring.submitter().register_files(&[main, buffered])?;
        let event = File::from(sys::eventfd()?);
        ring.submitter().register_eventfd(event.as_raw_fd())?;
        let align = sh.mem_align as usize;
        Ok(UringQueue {
            sh,
            ring,
            event,
            event_dirty: false,
            slots: Vec::new(),
            free: Vec::new(),
            used: 0,
            pending: VecDeque::new(),
            in_kernel: 0,
            done: Vec::new(),
            trash: Some(AlignedBuf::new(TRASH_CHUNK, align)),
            bounce_pool: Vec::new(),
            iov_pool: Vec::new(),
            ranges: Vec::new(),
            cqes: Vec::new(),
            last_check: Instant::now(),
        })
    }

    /// Completes a request without the kernel, and makes the notifier readable so an
    /// owner asleep on it comes to reap.
    fn finish_now(&mut self, tag: u64, result: Result<(), BackendError>, data: DataBuf) {
        self.done.push(Completion { tag, result, data });
        self.kick();
    }

    fn kick(&mut self) {
        let _ = (&self.event).write(&1u64.to_ne_bytes());
        self.event_dirty = true;
    }

    fn drain_event(&self) {
        let mut b = [0u8; 8];
        let _ = (&self.event).read(&mut b);
    }

    /// Checks whether the backing file was unlinked (and says so once).
    fn check_removed(&self) -> bool {
        if self.sh.removed.load(Ordering::Relaxed) {
            return true;
        }
        match self.sh.file.metadata() {
            Ok(m) if m.nlink() == 0 => {
                if !self.sh.removed.swap(true, Ordering::Relaxed) {
                    error!(path = %self.sh.path.display(), "backend file was removed; failing every request");
                }
                true
            }
            _ => false,
        }
    }

    fn take_iov(&mut self) -> Vec<IoVec> {
        self.iov_pool.pop().unwrap_or_default()
    }

    fn get_bounce(&mut self, len: usize) -> AlignedBuf {
        let fit =
            self.bounce_pool.iter().enumerate().filter(|(_, b)| b.cap >= len).min_by_key(|(_, b)| b.cap);
        match fit.map(|(i, _)| i) {
            Some(i) => self.bounce_pool.swap_remove(i),
            None => {
                AlignedBuf::new(len.next_multiple_of(BUF_ALIGN).max(BUF_ALIGN), self.sh.mem_align as usize)
            }
        }
    }

    fn put_bounce(&mut self, b: AlignedBuf) {
        if self.bounce_pool.len() < BOUNCE_POOL_MAX && b.cap <= BOUNCE_KEEP_MAX {
            self.bounce_pool.push(b);
        }
    }

    /// True if the direct descriptor can take a transfer at `offset` of `len` bytes.
    fn direct_ok(&self, offset: u64, len: u64) -> bool {
        !self.sh.direct || (offset.is_multiple_of(self.sh.off_align) && len.is_multiple_of(self.sh.off_align))
    }

    /// Turns a request into a slot (`None`: it is already done).
    fn plan(&mut self, mem: &GuestMemory, req: &mut Request) -> Result<Option<Slot>, BackendError> {
        if self.sh.removed.load(Ordering::Relaxed) {
            return Err(removed_error());
        }
        let (offset, len) = (req.offset, req.len);
        let tag = req.tag;
        let new = move |step| Slot::new(tag, mem, offset, len, step);
        let fallocate = |mode, offset, len| Step::Fallocate { mode, offset, len, optional: false };
        let keep = libc::FALLOC_FL_KEEP_SIZE;
        let punch = libc::FALLOC_FL_PUNCH_HOLE | keep;
        let zero_range = libc::FALLOC_FL_ZERO_RANGE | keep;
        match req.op {
            Op::Flush => {
                if self.check_removed() {
                    return Err(removed_error());
                }
                Ok(Some(new(Step::Fsync)))
            }
            Op::Read | Op::Write { .. } => {
                check_range(offset, len, self.sh.size)?;
                if req.op != Op::Read && self.sh.read_only {
                    return Err(BackendError::ReadOnly);
                }
                if len == 0 {
                    return Ok(None);
                }
                self.plan_rw(mem, req).map(Some)
            }
            Op::Discard => {
                check_range(offset, len, self.sh.size)?;
                if self.sh.read_only {
                    return Err(BackendError::ReadOnly);
                }
                if !self.sh.info.discard || len == 0 {
                    // Advisory, and not advertised: nothing to do.
                    return Ok(None);
                }
                if !self.sh.block_dev {
                    return Ok(Some(new(fallocate(punch, offset, len))));
                }
                // A device discards whole logical blocks only: keep the ones inside.
                let start = offset.next_multiple_of(self.sh.lbs);
                let end = (offset + len) / self.sh.lbs * self.sh.lbs;
                if start >= end {
                    return Ok(None);
                }
                let step = if self.sh.caps.discard_cmd {
                    Step::DiscardCmd { offset: start, len: end - start }
                } else {
                    fallocate(punch, start, end - start)
                };
                Ok(Some(new(step)))
            }
            Op::WriteZeroes { deallocate } => {
                check_range(offset, len, self.sh.size)?;
                if self.sh.read_only {
                    return Err(BackendError::ReadOnly);
                }
                if len == 0 {
                    return Ok(None);
                }
                let caps = self.sh.caps;
                let mut next = None;
                let step = if self.sh.block_dev {
                    let whole = offset.is_multiple_of(self.sh.lbs) && len.is_multiple_of(self.sh.lbs);
                    if !whole || !caps.zero_range {
                        None
                    } else if deallocate && caps.punch {
                        Some(fallocate(punch, offset, len))
                    } else {
                        Some(fallocate(zero_range, offset, len))
                    }
                } else if deallocate && caps.punch {
                    Some(fallocate(punch, offset, len))
                } else if caps.zero_range {
                    Some(fallocate(zero_range, offset, len))
                } else if caps.punch {
                    // tmpfs: punch (zeroes), then allocate the range again.
                    next = Some(Step::Fallocate { mode: keep, offset, len, optional: true });
                    Some(fallocate(punch, offset, len))
                } else {
                    None
                };
                match step {
                    Some(step) => {
                        let mut slot = new(step);
                        slot.next = next;
                        Ok(Some(slot))
                    }
                    None => Ok(Some(self.plan_zero_write(mem, req))),
                }
            }
        }
    }

    /// Write Zeroes by writing zero buffers.
    fn plan_zero_write(&mut self, mem: &GuestMemory, req: &Request) -> Slot {
        let mut slot = Slot::new(req.tag, mem, req.offset, req.len, Step::WriteZeroBufs);
        slot.fd = if self.direct_ok(req.offset, req.len) { FD_MAIN } else { FD_BUFFERED };
        slot.iov = self.take_iov();
        fill_zero_iov(&mut slot.iov, self.zero_addr(), req.len);
        slot
    }

    /// The shared zero buffer's address (allocated on first use).
    fn zero_addr(&self) -> usize {
        self.sh.zeroes.get_or_init(|| AlignedBuf::new(ZERO_CHUNK, self.sh.mem_align as usize)).addr()
    }

    fn plan_rw(&mut self, mem: &GuestMemory, req: &mut Request) -> Result<Slot, BackendError> {
        let write = req.op != Op::Read;
        let len = req.len;
        let direct_ok = self.direct_ok(req.offset, len);
        let align = (self.sh.direct && direct_ok).then_some((self.sh.mem_align, self.sh.off_align));
        let step = match req.op {
            Op::Write { fua: true } => Step::Write { flags: libc::RWF_DSYNC },
            Op::Write { fua: false } => Step::Write { flags: 0 },
            _ => Step::Read,
        };
        let mut slot = Slot::new(req.tag, mem, req.offset, len, step);
        slot.fd = if direct_ok { FD_MAIN } else { FD_BUFFERED };
        slot.iov = self.take_iov();
        let trash = self.trash.as_ref().map_or(0, |t| t.addr());
        let straight =
            straight_iov(mem, &mut req.data, len, write, align, trash, &mut self.ranges, &mut slot.iov);
        let straight = match straight {
            Ok(s) => s,
            Err(e) => {
                self.recycle_iov(std::mem::take(&mut slot.iov));
                return Err(e);
            }
        };
        if !straight {
            let n = len as usize;
            let mut b = self.get_bounce(n);
            if write {
                if let Err(e) = copy_in(mem, &req.data, b.slice_mut(n)) {
                    self.put_bounce(b);
                    self.recycle_iov(std::mem::take(&mut slot.iov));
                    return Err(e);
                }
            }
            slot.iov.clear();
            slot.iov.push(IoVec { base: b.addr(), len: n });
            slot.bounce = Some(b);
            slot.copy_out = !write;
        }
        Ok(slot)
    }

    fn recycle_iov(&mut self, mut iov: Vec<IoVec>) {
        iov.clear();
        if self.iov_pool.len() < 64 {
            self.iov_pool.push(iov);
        }
    }

    fn alloc_slot(&mut self, slot: Slot) -> usize {
        self.used += 1;
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        }
    }

    /// Moves waiting requests into the submission ring while fewer than the queue
    /// depth are with the kernel.
    fn fill(&mut self) {
        while self.in_kernel < self.sh.queue_depth {
            let Some(&idx) = self.pending.front() else { break };
            let Some(slot) = self.slots[idx].as_ref() else {
                self.pending.pop_front();
                continue;
            };
            let entry = slot.entry(idx);
            // Everything the entry points at lives in the slot until its CQE is reaped:
            // the vector array (`slot.iov`, not touched while the SQE is out), the
            // bounce buffer, a host buffer (`slot.data`), the guest mappings
            // (`slot.mem` keeps them mapped), and the per-queue scratch and shared zero
            // buffers, which outlive the ring (Drop waits for every SQE).
            // SAFETY: every buffer the entry names outlives its completion, as listed above.
            let pushed = unsafe { self.ring.submission().push(&entry) }.is_ok();
            if !pushed {
                // The submission ring is full: hand it to the kernel and try again.
                if self.ring.submit().is_err() {
                    break;
                }
                // SAFETY: as above.
                if unsafe { self.ring.submission().push(&entry) }.is_err() {
                    break;
                }
            }
            self.pending.pop_front();
            self.in_kernel += 1;
        }
    }

    /// One io_uring_enter for whatever sits in the submission ring.
    fn flush(&mut self) {
        if self.ring.submission().is_empty() {
            return;
        }
        loop {
            match self.ring.submit() {
                Ok(_) => return,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => {
                    // The entries stay in the ring: retry on the next reap, which the
                    // kick makes sure happens.
                    if !matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY)) {
                        warn!(path = %self.sh.path.display(), "io_uring submit failed: {e}");
                    }
                    self.kick();
                    return;
                }
            }
        }
    }

    /// The error for a read that found EOF before its end.
    fn eof_error(&self, done: u64, len: u64) -> BackendError {
        let now = if self.sh.block_dev {
            sys::blk_size(self.sh.file.as_fd()).ok()
        } else {
            self.sh.file.metadata().ok().map(|m| m.len())
        };
        match now {
            Some(now) if now < self.sh.size => BackendError::NotReady(format!(
                "backend file truncated to {now} bytes (namespace has {})",
                self.sh.size
            )),
            _ => BackendError::Short { done, len },
        }
    }

    fn on_cqe(&mut self, idx: usize, res: i32) {
        self.in_kernel = self.in_kernel.saturating_sub(1);
        let Some(slot) = self.slots.get_mut(idx).and_then(Option::as_mut) else {
            warn!("io_uring completion for unknown slot {idx}");
            return;
        };
        match slot.on_result(res) {
            Outcome::Again => self.pending.push_back(idx),
            Outcome::Done(result) => self.finish(idx, result),
            Outcome::Eof { done, len } => {
                let e = self.eof_error(done, len);
                self.finish(idx, Err(e));
            }
            Outcome::MoreZeroes => {
                let zeroes = self.zero_addr();
                let slot = self.slots[idx].as_mut().expect("live slot");
                fill_zero_iov(&mut slot.iov, zeroes, slot.len - slot.done);
                self.pending.push_back(idx);
            }
        }
    }

    fn finish(&mut self, idx: usize, mut result: Result<(), BackendError>) {
        let Some(mut slot) = self.slots[idx].take() else { return };
        self.free.push(idx);
        self.used -= 1;
        if let Some(b) = slot.bounce.take() {
            if result.is_ok() && slot.copy_out {
                result = copy_out(&slot.mem, &mut slot.data, b.slice(slot.len as usize));
            }
            self.put_bounce(b);
        }
        self.recycle_iov(std::mem::take(&mut slot.iov));
        self.done.push(Completion { tag: slot.tag, result, data: slot.data });
    }
}

/// Builds vectors straight onto the request's buffers. Returns `Ok(false)` when a
/// bounce buffer is needed instead: some piece breaks the direct-I/O alignment
/// `align` (memory, length), or there are more than IOV_MAX pieces.
#[allow(clippy::too_many_arguments)]
fn straight_iov(
    mem: &GuestMemory,
    data: &mut DataBuf,
    len: u64,
    write: bool,
    align: Option<(u64, u64)>,
    trash: usize,
    ranges: &mut Vec<HostRange>,
    iov: &mut Vec<IoVec>,
) -> Result<bool, BackendError> {
    let (ma, oa) = align.unwrap_or((1, 1));
    let fits = |base: usize, n: usize| (base as u64).is_multiple_of(ma) && (n as u64).is_multiple_of(oa);
    let mut straight = true;
    match data {
        DataBuf::Host(v) => {
            if (v.len() as u64) < len {
                if write {
                    return Err(invalid(format!("host buffer of {} bytes for a {len}-byte write", v.len())));
                }
                v.resize(len as usize, 0);
            }
            let base = v.as_mut_ptr() as usize;
            straight &= fits(base, len as usize);
            iov.push(IoVec { base, len: len as usize });
        }
        DataBuf::Guest(segs) => {
            let mut total = 0u64;
            for s in segs.iter() {
                match *s {
                    Segment::Guest { gpa, len } => {
                        ranges.clear();
                        mem.host_ranges(gpa, len, ranges)?;
                        for r in ranges.iter() {
                            straight &= fits(r.ptr as usize, r.len);
                            iov.push(IoVec { base: r.ptr as usize, len: r.len });
                        }
                    }
                    Segment::Discard { len } => {
                        if write {
                            return Err(invalid("bit bucket in a write".into()));
                        }
                        straight &= trash != 0 && len.is_multiple_of(oa);
                        push_repeated(iov, trash, TRASH_CHUNK, len);
                    }
                }
                total += s.len();
            }
            if total != len {
                return Err(invalid(format!("segments cover {total} bytes of a {len}-byte transfer")));
            }
        }
        DataBuf::None => {
            if write {
                return Err(BackendError::Short { done: 0, len });
            }
            // A read nobody wants the data of (Verify): into the scratch buffer.
            straight &= trash != 0 && len.is_multiple_of(oa);
            push_repeated(iov, trash, TRASH_CHUNK, len);
        }
    }
    Ok(straight && iov.len() <= IOV_MAX)
}

/// Gathers a write's data into a bounce buffer.
fn copy_in(mem: &GuestMemory, data: &DataBuf, buf: &mut [u8]) -> Result<(), BackendError> {
    match data {
        DataBuf::Host(v) => buf.copy_from_slice(&v[..buf.len()]),
        // `straight_iov` checked that the segments add up to the request.
        DataBuf::Guest(segs) => SegmentCursor::new(segs).read_into(mem, buf)?,
        DataBuf::None => buf.fill(0),
    }
    Ok(())
}

/// Scatters a read's data from a bounce buffer.
fn copy_out(mem: &GuestMemory, data: &mut DataBuf, buf: &[u8]) -> Result<(), BackendError> {
    match data {
        DataBuf::Host(v) => v[..buf.len()].copy_from_slice(buf),
        DataBuf::Guest(segs) => SegmentCursor::new(segs).write_from(mem, buf)?,
        DataBuf::None => {}
    }
    Ok(())
}

impl BackendQueue for UringQueue {
    fn submit(&mut self, mem: &GuestMemory, mut req: Request) {
        match self.plan(mem, &mut req) {
            Ok(Some(mut slot)) => {
                slot.data = std::mem::replace(&mut req.data, DataBuf::None);
                let idx = self.alloc_slot(slot);
                self.pending.push_back(idx);
                self.fill();
            }
            Ok(None) => self.finish_now(req.tag, Ok(()), req.data),
            Err(e) => self.finish_now(req.tag, Err(e), req.data),
        }
    }

    fn commit(&mut self) {
        self.fill();
        self.flush();
    }

    fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        // Drain first: a completion that lands after this still finds the eventfd
        // readable next time. The eventfd counts completions, so it can be readable
        // with the ring empty only if a completion was taken after the last drain.
        if self.event_dirty || !self.ring.completion().is_empty() {
            self.drain_event();
        }
        let mut cqes = std::mem::take(&mut self.cqes);
        cqes.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        self.event_dirty = !cqes.is_empty();
        for &(ud, res) in &cqes {
            self.on_cqe(ud as usize, res);
        }
        cqes.clear();
        self.cqes = cqes;
        if self.last_check.elapsed() >= REMOVAL_CHECK_PERIOD {
            self.last_check = Instant::now();
            self.check_removed();
        }
        // Resubmissions, and requests that waited for room.
        self.fill();
        self.flush();
        if !self.pending.is_empty() && self.in_kernel == 0 {
            // Nothing in the kernel will wake the owner: come back by ourselves.
            self.kick();
        }
        let n = self.done.len();
        out.append(&mut self.done);
        n
    }

    fn in_flight(&self) -> usize {
        self.used + self.done.len()
    }

    fn notifier(&self) -> Option<BorrowedFd<'_>> {
        Some(self.event.as_fd())
    }
}

impl Drop for UringQueue {
    fn drop(&mut self) {
        // The kernel may still be moving data into guest memory or our buffers: wait
        // until it hands back every SQE it has.
        let _ = self.ring.submit();
        while self.in_kernel > 0 {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => {
                    error!(path = %self.sh.path.display(), "io_uring wait failed while closing a queue: {e}");
                    // Better to leak the buffers than to free memory the kernel may
                    // still write.
                    std::mem::forget(std::mem::take(&mut self.slots));
                    std::mem::forget(self.trash.take());
                    std::mem::forget(self.sh.clone());
                    return;
                }
            }
            let n = self.ring.completion().count();
            self.in_kernel = self.in_kernel.saturating_sub(n as u32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(parts: &[(usize, usize)]) -> Vec<IoVec> {
        parts.iter().map(|&(base, len)| IoVec { base, len }).collect()
    }

    #[test]
    fn advance_skips_whole_and_partial_vectors() {
        let mut iov = v(&[(0x1000, 100), (0x2000, 200), (0x3000, 300)]);
        advance(&mut iov, 0);
        assert_eq!(iov.len(), 3);
        advance(&mut iov, 150);
        assert_eq!(iov, v(&[(0x2000 + 50, 150), (0x3000, 300)]));
        advance(&mut iov, 150);
        assert_eq!(iov, v(&[(0x3000, 300)]));
        advance(&mut iov, 300);
        assert!(iov.is_empty());
    }

    #[test]
    fn repeated_buffers_cover_the_length() {
        let mut iov = Vec::new();
        push_repeated(&mut iov, 0x5000, 64, 150);
        assert_eq!(iov, v(&[(0x5000, 64), (0x5000, 64), (0x5000, 22)]));
        let mut iov = Vec::new();
        fill_zero_iov(&mut iov, 0x9000, (ZERO_CHUNK * IOV_MAX) as u64 * 3);
        assert_eq!(iov.len(), IOV_MAX, "one writev never takes more than IOV_MAX vectors");
    }

    #[test]
    fn aligned_buffers_are_aligned() {
        for align in [512, 4096, 8192] {
            let mut b = AlignedBuf::new(1000, align);
            assert_eq!(b.addr() % align, 0);
            assert_eq!(b.slice_mut(1000).len(), 1000);
        }
    }
}
