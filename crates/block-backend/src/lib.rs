//! Block backends behind a namespace. A [`Backend`] is opened once per I/O queue into a
//! [`BackendQueue`], which the queue's owner drives without locks: submit requests,
//! then reap completions (immediately for synchronous backends, later for
//! asynchronous ones, which expose a notifier).
#![forbid(unsafe_code)]

mod file;
mod null;
mod ram;

use std::fmt::Debug;
use std::os::fd::BorrowedFd;

use guest_mem::{GuestMemory, MemError};

pub use file::FileBackend;
pub use null::NullBackend;
pub use ram::RamBackend;

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

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("range {offset:#x}+{len:#x} is outside the backend (size {size:#x})")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("guest memory: {0}")]
    Memory(#[from] MemError),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("no space left on the backend")]
    NoSpace,
    #[error("short transfer: {done} of {len} bytes")]
    Short { done: u64, len: u64 },
    #[error("operation not supported by this backend")]
    Unsupported,
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendInfo {
    /// A short description for logs ("ram", "null", "file:disk.img").
    pub kind: String,
    pub size: u64,
    /// The backend has a volatile write cache that Flush (or FUA) must drain.
    pub volatile_cache: bool,
    pub discard: bool,
    /// Discarded ranges read back as zeroes.
    pub discard_zeroes: bool,
    pub write_zeroes: bool,
}

/// A block device behind a namespace.
pub trait Backend: Send + Sync + Debug {
    fn info(&self) -> BackendInfo;
    /// Opens a queue for one I/O queue owner.
    fn open_queue(&self) -> std::io::Result<Box<dyn BackendQueue>>;
}

/// One queue of a backend, owned by one thread.
pub trait BackendQueue: Send + Debug {
    /// Starts a request. Failures are reported as completions, never here.
    fn submit(&mut self, mem: &GuestMemory, req: Request);
    /// Moves finished requests into `out`; returns how many were added.
    fn reap(&mut self, out: &mut Vec<Completion>) -> usize;
    /// Requests submitted and not yet reaped.
    fn in_flight(&self) -> usize;
    /// A file descriptor that becomes readable when completions are ready, for
    /// backends that complete asynchronously.
    fn notifier(&self) -> Option<BorrowedFd<'_>> {
        None
    }
}

/// Checks `offset..offset+len` against `size`.
pub fn check_range(offset: u64, len: u64, size: u64) -> Result<(), BackendError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(BackendError::OutOfRange { offset, len, size }),
    }
}

/// A queue for synchronous backends: `submit` runs the request through `exec` at
/// once and parks its completion for the next `reap`.
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
}

impl<B: SyncExec> BackendQueue for SyncQueue<B> {
    fn submit(&mut self, mem: &GuestMemory, mut req: Request) {
        let result = self.backend.exec(mem, &mut req);
        self.done.push(Completion { tag: req.tag, result, data: req.data });
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

/// Walks the segments of a guest buffer, calling `f(segment, offset_in_transfer)`.
pub fn for_each_segment(
    segs: &[Segment],
    mut f: impl FnMut(&Segment, u64) -> Result<(), BackendError>,
) -> Result<(), BackendError> {
    let mut off = 0;
    for s in segs {
        f(s, off)?;
        off += s.len();
    }
    Ok(())
}
