//! Block backends behind a namespace. A [`Backend`] is opened once per I/O queue into a
//! [`BackendQueue`], which the queue's owner drives without locks: submit requests,
//! then reap completions (immediately for synchronous backends, later for
//! asynchronous ones, which expose a notifier).
#![deny(unsafe_code)]

mod fault;
mod file;
mod inflight;
#[allow(unsafe_code)]
mod memstore;
mod null;
mod ram;
mod segments;
mod storage;
#[allow(unsafe_code)]
mod uring;

use std::fmt::Debug;
use std::os::fd::BorrowedFd;

use guest_mem::{GuestMemory, MemError};

pub use fault::{FaultBackend, FaultError, FaultOp, FaultRule};
pub use file::FileBackend;
pub use inflight::{Admit, Landed, Pending, Requests, Revoked};
pub use null::NullBackend;
pub use ram::RamBackend;
pub use segments::{Pieces, SegmentCursor, SegmentError, SegmentMark};
pub use storage::{StorageReport, StorageState, StorageTracker, OUTAGE_BOUNDS_S};
pub use uring::{DirectMode, UringBackend, UringOptions};

/// Where one piece of a transfer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Segment {
    /// Guest memory at `gpa`.
    Guest { gpa: u64, len: u64 },
    /// Bytes the host does not want (an SGL Bit Bucket): read and discarded.
    Discard { len: u64 },
}

impl Segment {
    pub fn len(&self) -> u64 {
        match *self {
            Segment::Guest { len, .. } | Segment::Discard { len } => len,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The buffer a request moves data between the backend and.
#[derive(Debug)]
pub enum DataBuf {
    /// No data (flush, discard, write zeroes).
    None,
    /// Guest memory, as a list of segments whose lengths add up to the request length.
    Guest(Vec<Segment>),
    /// A host buffer: filled by reads (compare, verify), consumed by writes.
    Host(Vec<u8>),
    /// [`Op::Copy`]'s source: the backend's own bytes from this offset. Here rather
    /// than in the op, so every other request's op stays a byte or two.
    Within(u64),
}

/// What a request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    /// Write; with `fua`, the data is durable when the request completes.
    Write {
        fua: bool,
    },
    /// Make every completed write durable.
    Flush,
    /// Zero the range; `deallocate` allows unmapping it.
    WriteZeroes {
        deallocate: bool,
    },
    /// Deallocate the range (contents afterwards read as zeroes if
    /// [`BackendInfo::discard_zeroes`]).
    Discard,
    /// Copy to this range the same length of the backend's own bytes from the
    /// offset its data names ([`DataBuf::Within`]; the two do not overlap), inside
    /// the storage: only where [`BackendInfo::copy`] says so. With `fua`, durable
    /// when the request completes.
    Copy {
        fua: bool,
    },
}

/// For logs: `read`, `write`, `write (FUA)`, `flush`, `write zeroes`, `write zeroes
/// (deallocate)`, `discard`.
impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Op::Read => "read",
            Op::Write { fua: false } => "write",
            Op::Write { fua: true } => "write (FUA)",
            Op::Flush => "flush",
            Op::WriteZeroes { deallocate: false } => "write zeroes",
            Op::WriteZeroes { deallocate: true } => "write zeroes (deallocate)",
            Op::Discard => "discard",
            Op::Copy { fua: false } => "copy",
            Op::Copy { fua: true } => "copy (FUA)",
        })
    }
}

/// One request on a backend queue.
#[derive(Debug)]
pub struct Request {
    /// Returned unchanged in the completion.
    pub tag: u64,
    pub op: Op,
    /// Byte offset into the backend.
    pub offset: u64,
    /// Byte length.
    pub len: u64,
    pub data: DataBuf,
}

/// Why a request failed. The controller maps each to the NVMe status that fits
/// (Base "Generic Command Status" and "Media and Data Integrity Errors").
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("range {offset:#x}+{len:#x} is outside the backend (size {size:#x})")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("guest memory: {0}")]
    Memory(#[from] MemError),
    /// A media error or an I/O error with no better class (EIO and the rest).
    #[error("I/O error: {0}")]
    Io(std::io::Error),
    /// The storage is full (ENOSPC, EDQUOT).
    #[error("no space left on the backend")]
    NoSpace,
    /// Fewer bytes moved than asked, with no error to say why (a file shrunk under us).
    #[error("short transfer: {done} of {len} bytes")]
    Short { done: u64, len: u64 },
    #[error("operation not supported by this backend")]
    Unsupported,
    /// The storage is unreachable: the file was removed, the device vanished, the
    /// downstream controller is down. Retrying later may work.
    #[error("backend not ready: {0}")]
    NotReady(String),
    /// The storage refuses writes (EROFS, or permission lost).
    #[error("backend is read-only")]
    ReadOnly,
    /// A status from a downstream NVMe controller (nvme://), passed through.
    #[error("downstream NVMe status: type {sct:#x} code {sc:#04x}{}", if *dnr { " (DNR)" } else { "" })]
    Nvme { sct: u8, sc: u8, dnr: bool },
}

impl BackendError {
    /// Classifies an OS error number.
    pub fn from_errno(errno: i32) -> Self {
        std::io::Error::from_raw_os_error(errno).into()
    }
}

impl From<std::io::Error> for BackendError {
    fn from(e: std::io::Error) -> Self {
        match e.raw_os_error() {
            Some(libc::ENOSPC | libc::EDQUOT) => BackendError::NoSpace,
            Some(libc::EROFS | libc::EPERM | libc::EACCES) => BackendError::ReadOnly,
            Some(libc::ENODEV | libc::ENXIO | libc::ESTALE | libc::ENOMEDIUM | libc::ENOTCONN) => {
                BackendError::NotReady(e.to_string())
            }
            Some(libc::EOPNOTSUPP) => BackendError::Unsupported,
            _ => BackendError::Io(e),
        }
    }
}

/// A finished request.
#[derive(Debug)]
pub struct Completion {
    pub tag: u64,
    pub result: Result<(), BackendError>,
    /// The request's buffer, handed back (a filled host buffer for reads into one).
    pub data: DataBuf,
}

/// What a backend can do, asked once when a namespace is created.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendInfo {
    /// A short description for logs ("ram", "null", "file:disk.img").
    pub kind: String,
    pub size: u64,
    /// The smallest unit the backend transfers: request offsets and lengths are
    /// multiples of it, so the namespace's LBA size must be too (1 = any).
    pub block_size: u32,
    /// The backend has a volatile write cache that Flush (or FUA) must drain.
    pub volatile_cache: bool,
    /// Deallocation is supported (Dataset Management AD, Write Zeroes DEAC).
    pub discard: bool,
    /// Discarded ranges read back as zeroes.
    pub discard_zeroes: bool,
    /// The largest single discard in bytes (0: no limit beyond the namespace).
    pub discard_max: u64,
    /// Write Zeroes is done by the storage itself (fallocate, BLKZEROOUT, a
    /// downstream Write Zeroes) rather than by writing zero buffers.
    pub write_zeroes: bool,
    /// The largest single write-zeroes in bytes (0: no limit).
    pub write_zeroes_max: u64,
    /// [`Op::Copy`] is done by the storage (copy_file_range: a reflink, or a copy
    /// inside the kernel), the data never passing through our memory.
    pub copy: bool,
    /// It takes no writes (a file opened read-only, a snapshot): the namespace
    /// says it is write protected (Identify Namespace NSATTR bit 0).
    pub read_only: bool,
}

/// Whether copy_file_range works within `file`: a regular file, on a kernel and file
/// system that take it (an empty copy checks both without moving anything).
pub(crate) fn copy_works(file: &std::fs::File) -> bool {
    let regular = file.metadata().is_ok_and(|m| m.is_file());
    regular && rustix::fs::copy_file_range(file, Some(&mut 0), file, Some(&mut 0), 0).is_ok()
}

/// Copies `len` bytes at `src` of `file` to `dst` inside the kernel
/// (copy_file_range: a reflink where the file system shares extents); the two
/// ranges must not overlap. Where the kernel refuses the copy itself (a file system
/// or a system call filter that does not take it), the rest goes through a buffer
/// of ours instead, read and written in place.
pub(crate) fn copy_within(file: &std::fs::File, src: u64, dst: u64, len: u64) -> Result<(), BackendError> {
    use rustix::io::Errno;
    let (mut from, mut to, mut done) = (src, dst, 0u64);
    while done < len {
        let want = usize::try_from(len - done).unwrap_or(usize::MAX);
        match rustix::fs::copy_file_range(file, Some(&mut from), file, Some(&mut to), want) {
            Ok(0) => return Err(BackendError::Short { done, len }),
            Ok(n) => done += n as u64,
            Err(Errno::INTR) => {}
            Err(e @ (Errno::XDEV | Errno::INVAL | Errno::OPNOTSUPP | Errno::NOSYS | Errno::PERM)) => {
                static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
                if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!("copy_file_range refused ({e}): Copy goes through a buffer (said once)");
                }
                return copy_through_buffer(file, src + done, dst + done, len - done);
            }
            Err(e) => return Err(std::io::Error::from(e).into()),
        }
    }
    Ok(())
}

/// [`copy_within`]'s fallback: positioned reads and writes through 128 KiB.
fn copy_through_buffer(file: &std::fs::File, src: u64, dst: u64, len: u64) -> Result<(), BackendError> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; len.min(128 << 10) as usize];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], src + done)?;
        file.write_all_at(&buf[..n], dst + done)?;
        done += n as u64;
    }
    Ok(())
}

/// A block device behind a namespace.
pub trait Backend: Send + Sync + Debug {
    fn info(&self) -> BackendInfo;
    /// Opens a queue for one I/O queue owner.
    fn open_queue(&self) -> std::io::Result<Box<dyn BackendQueue>>;
    /// A one-line account of the backend's own counters, for logs (none by default).
    fn stats_line(&self) -> Option<String> {
        None
    }
    /// Changes the size to `bytes` (a namespace resized under a running guest).
    /// Queues already open see the new size for requests submitted afterwards.
    fn resize(&self, bytes: u64) -> std::io::Result<()> {
        let _ = bytes;
        Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "this backend's size is fixed"))
    }
    /// Where the data stored at or beyond `from` ends, or None if nothing is stored
    /// there (all of it reads as never written): what a shrink to `from` would lose.
    /// Backends that cannot tell say the data reaches their end.
    fn data_end(&self, from: u64) -> std::io::Result<Option<u64>> {
        let size = self.info().size;
        Ok((size > from).then_some(size))
    }
    /// What another process needs to take the backend over with its data (an
    /// upgrade), when that is more than reopening it: the RAM backend's memory.
    fn handover_fd(&self) -> Option<std::io::Result<std::os::fd::OwnedFd>> {
        None
    }
    /// Whether its storage is there, what waits for it and how long it was away,
    /// for backends whose storage can go away and come back (none by default).
    fn storage(&self) -> Option<StorageReport> {
        None
    }
}

/// One queue of a backend, owned by one thread.
pub trait BackendQueue: Send + Debug {
    /// Starts a request (or queues it until [`BackendQueue::commit`]). Failures are
    /// reported as completions, never here.
    fn submit(&mut self, mem: &GuestMemory, req: Request);
    /// Whether [`BackendQueue::run_now`] runs requests to their end (a synchronous
    /// queue). Asked once, when the queue is opened, so owners can skip the call on
    /// queues that would only hand the request back.
    fn runs_now(&self) -> bool {
        false
    }
    /// Runs `req` to its end inside the call and returns its result (Some), which
    /// then never goes through `reap`; its buffer stays in `req`. Or leaves `req`
    /// untouched and returns None (the default), for [`BackendQueue::submit`].
    /// Borrowed, not moved: a request run now is not copied in and out.
    fn run_now(&mut self, _mem: &GuestMemory, _req: &mut Request) -> Option<Result<(), BackendError>> {
        None
    }
    /// Hands every request queued by `submit` to the storage. The queue's owner calls
    /// it after each batch of submissions (before it reaps or sleeps), so a backend
    /// can start a batch with one system call. Backends that start requests in
    /// `submit` need not implement it.
    fn commit(&mut self) {}
    /// Moves finished requests into `out`; returns how many were added.
    fn reap(&mut self, out: &mut Vec<Completion>) -> usize;
    /// Requests submitted and not yet reaped.
    fn in_flight(&self) -> usize;
    /// A file descriptor that becomes readable when completions are ready, for
    /// backends that complete asynchronously. The owner watches it (level
    /// triggered) while requests are in flight and calls `reap` when it fires;
    /// `reap` drains it, so it stops being readable once everything ready is reaped.
    fn notifier(&self) -> Option<BorrowedFd<'_>> {
        None
    }
    /// True if only polling finds this queue's next completions, so its owner must
    /// not sleep for long: by default, requests are in flight and there is no
    /// notifier. A queue that holds requests back on a timer (fault injection's
    /// `delay=`) says so while it holds them.
    fn needs_polling(&self) -> bool {
        self.in_flight() > 0 && self.notifier().is_none()
    }
    /// Makes sure request `tag` no longer reads or writes guest memory, if this
    /// queue holds it and can: the caller may then tell the guest the command is
    /// over, and the guest may reuse its buffers at once. The request still
    /// completes (with an error if it was stopped), so its tag comes back. None:
    /// this queue does not hold `tag`; Some(false): it does and cannot stop it (the
    /// data may still move, e.g. a direct read the kernel is doing).
    fn revoke(&mut self, tag: u64) -> Option<bool> {
        let _ = tag;
        Some(false)
    }
    /// The guest's memory map changed (regions mapped or unmapped); `mem` is the new
    /// one. A queue that keeps state derived from an older map (the `nvme://` backend's
    /// downstream DMA maps) lets go of it here, so that memory the guest took away is
    /// released as soon as the requests using it end. Requests in flight keep the map
    /// they were submitted with.
    fn memory_changed(&mut self, _mem: &GuestMemory) {}
}

/// Resizes the regular file behind a backend (a block device's size is not ours to
/// change).
pub(crate) fn resize_file(file: &std::fs::File, bytes: u64) -> std::io::Result<()> {
    if !file.metadata()?.file_type().is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "only a regular file can be resized (this is a block device)",
        ));
    }
    file.set_len(bytes)
}

/// [`Backend::data_end`] for a file of `size` bytes: data stored at or beyond
/// `from`, as the file system's SEEK_DATA tells (a sparse file's holes hold none).
pub(crate) fn file_data_end(file: &std::fs::File, from: u64, size: u64) -> std::io::Result<Option<u64>> {
    if from >= size {
        return Ok(None);
    }
    match rustix::fs::seek(file, rustix::fs::SeekFrom::Data(from)) {
        Ok(at) if at < size => Ok(Some(size)),
        Ok(_) => Ok(None),
        Err(rustix::io::Errno::NXIO) => Ok(None),
        // A file system without SEEK_DATA: assume the data reaches the end.
        Err(rustix::io::Errno::INVAL) => Ok(Some(size)),
        Err(e) => Err(e.into()),
    }
}

/// Locks the open file `file` (at `path`) as `lock` says, if it says: a file
/// someone else holds is refused (`ResourceBusy`, the holder named); a file
/// system that cannot lock is served unlocked, with a warning, as QEMU's
/// `locking=auto` does.
pub fn lock_file(
    file: &std::fs::File,
    path: &std::path::Path,
    lock: Option<&file_lock::Request>,
) -> std::io::Result<()> {
    let Some(req) = lock else { return Ok(()) };
    match file_lock::lock(file, req) {
        Ok(()) => Ok(()),
        Err(file_lock::LockError::InUse(u)) => {
            Err(std::io::Error::new(std::io::ErrorKind::ResourceBusy, format!("{} is {u}", path.display())))
        }
        Err(file_lock::LockError::Unsupported(e)) => {
            tracing::warn!(
                path = %path.display(),
                "cannot be locked ({e}): served without a lock, so nothing keeps a second writer out"
            );
            Ok(())
        }
    }
}

/// Checks `offset..offset+len` against `size`.
pub fn check_range(offset: u64, len: u64, size: u64) -> Result<(), BackendError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(BackendError::OutOfRange { offset, len, size }),
    }
}

/// A queue for synchronous backends: `run_now` runs the request through `exec` and
/// returns its completion; `submit` does the same and parks the completion for the
/// next `reap`.
#[derive(Debug, Default)]
pub struct SyncQueue<B> {
    backend: B,
    done: Vec<Completion>,
}

/// The synchronous part of a backend.
pub trait SyncExec: Send + Debug {
    fn exec(&mut self, mem: &GuestMemory, req: &mut Request) -> Result<(), BackendError>;
}

impl<B: SyncExec> SyncQueue<B> {
    pub fn new(backend: B) -> Self {
        SyncQueue { backend, done: Vec::new() }
    }

    #[inline]
    fn run(&mut self, mem: &GuestMemory, mut req: Request) -> Completion {
        let result = self.backend.exec(mem, &mut req);
        Completion { tag: req.tag, result, data: req.data }
    }
}

impl<B: SyncExec> BackendQueue for SyncQueue<B> {
    fn revoke(&mut self, tag: u64) -> Option<bool> {
        // Requests run to the end inside submit: one still here is only a parked
        // completion, done with guest memory.
        self.done.iter().any(|c| c.tag == tag).then_some(true)
    }
    fn submit(&mut self, mem: &GuestMemory, req: Request) {
        let c = self.run(mem, req);
        self.done.push(c);
    }
    fn runs_now(&self) -> bool {
        true
    }
    fn run_now(&mut self, mem: &GuestMemory, req: &mut Request) -> Option<Result<(), BackendError>> {
        Some(self.backend.exec(mem, req))
    }
    fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        let n = self.done.len();
        out.append(&mut self.done);
        n
    }
    fn in_flight(&self) -> usize {
        self.done.len()
    }
}
