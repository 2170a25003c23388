//! An owned mmap: the one place guest-mem calls mmap and munmap.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use crate::dirty::DirtyLog;
use crate::MemError;

/// A shared mapping, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: *mut u8,
    len: u64,
    /// For fd mappings: a duplicate of the descriptor and the offset mapped, so the
    /// same memory can be handed on (a downstream vfio-user DMA_MAP, zero copy).
    source: Option<(OwnedFd, u64)>,
    /// What this process wrote here while a migration asked (see `dirty`).
    dirty: DirtyLog,
    /// Registered as fragile: a SIGBUS inside it is survived (see `fragile`).
    fragile: Option<crate::fragile::Slot>,
}

// The mapping is plain memory; all access goes through GuestMemory, whose accessors
// copy in and out (or use atomics), so sharing the pointer between threads is as safe
// as sharing the memory itself.
// SAFETY: the pointer may move between threads like the memory it names.
unsafe impl Send for Mapping {}
// SAFETY: see Send.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn map(len: u64, flags: i32, fd: i32, offset: u64, prot: i32) -> Result<Self, MemError> {
        let size = usize::try_from(len).map_err(|_| MemError::InvalidRegion { gpa: 0, len })?;
        if size == 0 {
            return Err(MemError::InvalidRegion { gpa: 0, len });
        }
        let off = libc::off_t::try_from(offset).map_err(|_| MemError::InvalidRegion { gpa: 0, len })?;
        // A fresh mapping at an address the kernel chooses; it cannot alias any Rust
        // object. The result is checked for MAP_FAILED.
        // SAFETY: a new mapping aliases nothing; failure is checked.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), size, prot, flags, fd, off) };
        if ptr == libc::MAP_FAILED {
            return Err(MemError::Map { len, source: Arc::new(std::io::Error::last_os_error()) });
        }
        Ok(Mapping { ptr: ptr.cast(), len, source: None, dirty: DirtyLog::new(len), fragile: None })
    }

    /// Private anonymous memory, zero filled, read-write.
    pub fn anonymous(len: u64) -> Result<Self, MemError> {
        Self::map(
            len,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    }

    /// A shared mapping of `len` bytes of `fd` from `offset`.
    pub fn from_fd(fd: BorrowedFd<'_>, offset: u64, len: u64, writable: bool) -> Result<Self, MemError> {
        let prot = if writable { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
        let mut m = Self::map(len, libc::MAP_SHARED, fd.as_raw_fd(), offset, prot)?;
        // Keep a duplicate for re-export; a failure here only loses that ability.
        m.source = fd.try_clone_to_owned().ok().map(|fd| (fd, offset));
        Ok(m)
    }

    /// [`Mapping::from_fd`] of a file that may shrink under us (another process,
    /// or an operator, can truncate it): an access past its end is survived
    /// instead of killing the process with SIGBUS, the page reading as zeroes from
    /// then on, and [`Mapping::lost`] says so. Without room in the table of such
    /// mappings (`fragile::SLOTS`) it fails rather than make one that is not.
    pub fn from_fd_fragile(
        fd: BorrowedFd<'_>,
        offset: u64,
        len: u64,
        writable: bool,
    ) -> Result<Self, MemError> {
        let mut m = Self::from_fd(fd, offset, len, writable)?;
        m.fragile =
            Some(crate::fragile::Slot::register(m.ptr as usize, m.len as usize).ok_or_else(|| {
                MemError::Map {
                    len,
                    source: Arc::new(std::io::Error::other(
                        "no room for another mapping of a file that may shrink, or no SIGBUS handler",
                    )),
                }
            })?);
        Ok(m)
    }

    /// Whether an access to this mapping faulted because its file shrank (only a
    /// fragile mapping's can): what was read since may be zeroes.
    #[inline]
    pub fn lost(&self) -> bool {
        // One load of a static on every access: only a process some of whose
        // fragile mappings was lost asks the mapping itself.
        crate::fragile::any_lost() && self.fragile.as_ref().is_some_and(|s| s.lost())
    }

    /// The descriptor this mapping was made from and the file offset of its first
    /// byte, if it was made from one.
    pub fn source(&self) -> Option<(BorrowedFd<'_>, u64)> {
        self.source.as_ref().map(|(fd, off)| (fd.as_fd(), *off))
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Starts logging the pages this process writes here, all clean at first (a
    /// second start while logging keeps what is logged). Refused if the log's table
    /// does not fit the process's budget ([`crate::DIRTY_LOG_BUDGET`]).
    pub fn start_dirty_log(&self) -> Result<(), crate::LogBudgetExceeded> {
        self.dirty.start()
    }

    /// Stops logging; what was logged is dropped at the next start.
    pub fn stop_dirty_log(&self) {
        self.dirty.stop();
    }

    /// Whether writes here are being logged.
    pub fn dirty_logging(&self) -> bool {
        self.dirty.is_on()
    }

    /// Calls `f` with the offset of each dirty [`DIRTY_PAGE`](crate::DIRTY_PAGE)
    /// touching `[off, off + len)`, in order, and clears the pages wholly inside it.
    pub fn take_dirty(&self, off: u64, len: u64, mut f: impl FnMut(u64)) {
        self.dirty.take(off, len, |p| f(p * crate::DIRTY_PAGE));
    }

    /// Marks `[off, off + len)` as written (a no-op while not logging).
    pub(crate) fn mark_dirty(&self, off: u64, len: u64) {
        self.dirty.mark(off, len);
    }

    /// Host address of byte `off` of the mapping. Callers check `off < len`.
    pub(crate) fn ptr_at(&self, off: u64) -> *mut u8 {
        debug_assert!(off < self.len);
        self.ptr.wrapping_add(off as usize)
    }

    /// The host address and length of the whole mapping, for handing to the kernel
    /// (io_uring buffers, VFIO DMA maps). The caller must not outlive `self`.
    pub fn as_raw(&self) -> (*mut u8, usize) {
        (self.ptr, self.len as usize)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // Out of the SIGBUS handler's table before the range can be reused.
        drop(self.fragile.take());
        // SAFETY: `ptr`/`len` came from a successful mmap and are unmapped once, here.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len as usize);
        }
    }
}
