//! The RAM backend's storage: a memfd mapped shared, in fixed chunks, each behind
//! its own mutex. A chunk is "allocated" once written; one never written reads as
//! zeroes without touching the mapping (a read fault on a shared memfd page would
//! allocate it). Freeing a chunk punches a hole, giving the memory back.
//!
//! The memfd is what makes the disk outlive the process: a server handing itself
//! over (an upgrade) passes the descriptor, and the new process maps the same pages
//! ([`MemStore::from_fd`]), learning which chunks hold data from the file's holes.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard};

use rustix::fs::{FallocateFlags, MemfdFlags, SeekFrom};
use rustix::mm::{MapFlags, ProtFlags};

/// Bytes per chunk: the unit of allocation and locking.
pub(crate) const CHUNK: u64 = 1 << 20;

/// A memfd of `slots.len()` chunks, mapped read-write.
#[derive(Debug)]
pub(crate) struct MemStore {
    fd: OwnedFd,
    base: NonNull<u8>,
    len: usize,
    /// Per chunk: allocated (written since it was last freed).
    slots: Vec<Mutex<bool>>,
}

// The mapping is owned by the store and only reached through `Slot`, which holds the
// chunk's mutex for as long as the slice it hands out lives.
// SAFETY: moving the store moves sole ownership of the mapping (see above).
unsafe impl Send for MemStore {}
// SAFETY: shared access to a chunk's bytes is serialized by the chunk's mutex.
unsafe impl Sync for MemStore {}

/// One chunk, locked.
pub(crate) struct Slot<'a> {
    allocated: MutexGuard<'a, bool>,
    store: &'a MemStore,
    idx: usize,
}

fn chunks(size: u64) -> usize {
    size.div_ceil(CHUNK) as usize
}

fn map(fd: &OwnedFd, len: usize) -> io::Result<NonNull<u8>> {
    if len == 0 {
        return Ok(NonNull::dangling());
    }
    // SAFETY: a new shared mapping of a file we hold, at an address the kernel picks.
    let p = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED | MapFlags::NORESERVE,
            fd,
            0,
        )?
    };
    Ok(NonNull::new(p.cast()).expect("mmap does not return null"))
}

fn unmap(base: NonNull<u8>, len: usize) {
    if len > 0 {
        // No slice into the mapping outlives the store: slots borrow it.
        // SAFETY: `base..base+len` is a mapping this store made, no longer referenced.
        let _ = unsafe { rustix::mm::munmap(base.as_ptr().cast(), len) };
    }
}

impl MemStore {
    /// A new store of `size` bytes (rounded up to whole chunks), all unallocated.
    pub(crate) fn new(size: u64) -> io::Result<Self> {
        let fd = rustix::fs::memfd_create("vnvme-ram", MemfdFlags::CLOEXEC)?;
        Self::over(fd, size, false)
    }

    /// The store an earlier process kept in `fd` (see the module comment): chunks
    /// holding any data count as allocated. The file is grown if it is shorter.
    pub(crate) fn from_fd(fd: OwnedFd, size: u64) -> io::Result<Self> {
        let st = rustix::fs::fstat(&fd)?;
        if (st.st_mode & libc::S_IFMT) != libc::S_IFREG {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a RAM namespace's memory must be a memfd",
            ));
        }
        Self::over(fd, size, true)
    }

    fn over(fd: OwnedFd, size: u64, scan: bool) -> io::Result<Self> {
        let n = chunks(size);
        let len =
            usize::try_from(n as u64 * CHUNK).map_err(|_| io::Error::other("RAM namespace too large"))?;
        rustix::fs::ftruncate(&fd, len as u64)?;
        let base = map(&fd, len)?;
        let mut slots = Vec::with_capacity(n);
        for i in 0..n {
            let allocated = scan && has_data(&fd, i as u64 * CHUNK)?;
            slots.push(Mutex::new(allocated));
        }
        Ok(MemStore { fd, base, len, slots })
    }

    /// The memfd (for a hand-over).
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub(crate) fn chunks(&self) -> usize {
        self.slots.len()
    }

    /// Locks chunk `idx` (which must exist).
    pub(crate) fn lock(&self, idx: usize) -> Slot<'_> {
        let allocated = self.slots[idx].lock().unwrap_or_else(|p| p.into_inner());
        Slot { allocated, store: self, idx }
    }

    /// Resizes to `size` bytes (whole chunks). Exclusive: no slot is held.
    pub(crate) fn resize(&mut self, size: u64) -> io::Result<()> {
        let n = chunks(size);
        let len =
            usize::try_from(n as u64 * CHUNK).map_err(|_| io::Error::other("RAM namespace too large"))?;
        if len == self.len {
            return Ok(());
        }
        // Shrinking drops the pages past the end; growing adds holes.
        rustix::fs::ftruncate(&self.fd, len as u64)?;
        let base = map(&self.fd, len)?;
        unmap(self.base, self.len);
        self.base = base;
        self.len = len;
        self.slots.resize_with(n, || Mutex::new(false));
        Ok(())
    }
}

impl Drop for MemStore {
    fn drop(&mut self) {
        unmap(self.base, self.len);
    }
}

/// Whether the memfd holds data anywhere in the chunk at `off`.
fn has_data(fd: &OwnedFd, off: u64) -> io::Result<bool> {
    match rustix::fs::seek(fd, SeekFrom::Data(off)) {
        Ok(at) => Ok(at < off + CHUNK),
        // ENXIO: no data at or past `off`.
        Err(rustix::io::Errno::NXIO) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

impl Slot<'_> {
    /// The chunk's bytes, if it was written.
    pub(crate) fn data(&mut self) -> Option<&mut [u8]> {
        (*self.allocated).then(|| self.bytes())
    }

    /// The chunk's bytes, allocating it (zeroes) if need be.
    pub(crate) fn alloc(&mut self) -> &mut [u8] {
        *self.allocated = true;
        self.bytes()
    }

    /// Gives the chunk's memory back: it reads as zeroes again.
    pub(crate) fn free(&mut self) {
        if !*self.allocated {
            return;
        }
        let off = self.idx as u64 * CHUNK;
        let flags = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
        if rustix::fs::fallocate(&self.store.fd, flags, off, CHUNK).is_err() {
            // Without hole punching the chunk stays allocated, zeroed.
            self.bytes().fill(0);
            return;
        }
        *self.allocated = false;
    }

    fn bytes(&mut self) -> &mut [u8] {
        let off = self.idx * CHUNK as usize;
        // The chunk lies inside the mapping (slots and mapping are resized together,
        // under the caller's exclusive lock), and this slot holds the chunk's mutex for
        // as long as the returned borrow of `self` lives.
        // SAFETY: in bounds, and no other reference to these bytes exists (above).
        unsafe { std::slice::from_raw_parts_mut(self.store.base.as_ptr().add(off), CHUNK as usize) }
    }
}
