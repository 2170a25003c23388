//! The RAM backend: a sparse in-memory disk shared by all queues.
//!
//! Storage is a memfd split into fixed chunks (`memstore`), each behind its own mutex
//! and allocated on first write, so a large namespace costs nothing until used and
//! queues on different chunks never contend. Unallocated chunks read as zeroes;
//! discarding a whole chunk frees it. The memfd can be handed to another process (an
//! upgrade), which keeps the data.

use std::os::fd::OwnedFd;
use std::sync::{Arc, RwLock};

use guest_mem::GuestMemory;

use crate::memstore::{MemStore, Slot, CHUNK};
use crate::{
    check_range, Backend, BackendError, BackendInfo, BackendQueue, DataBuf, Op, Request, SegmentCursor,
    SyncExec, SyncQueue,
};

/// The chunks and the size they hold; a resize changes both under the write lock, so
/// a request sees one size for its whole run.
#[derive(Debug)]
struct Store {
    inner: RwLock<Inner>,
}

#[derive(Debug)]
struct Inner {
    size: u64,
    mem: MemStore,
}

/// An in-memory disk.
#[derive(Clone, Debug)]
pub struct RamBackend {
    store: Arc<Store>,
}

impl RamBackend {
    /// A disk of `size` bytes, all zeroes. Panics only if no memfd can be made (see
    /// [`RamBackend::create`]).
    pub fn new(size: u64) -> Self {
        Self::create(size).expect("a memfd for a RAM disk")
    }

    /// A disk of `size` bytes, all zeroes, in a memfd of its own.
    pub fn create(size: u64) -> std::io::Result<Self> {
        Ok(Self::with(size, MemStore::new(size)?))
    }

    /// The disk an earlier process kept in `fd` ([`RamBackend::memory_fd`]), of
    /// `size` bytes: an upgrade keeps a RAM namespace's data.
    pub fn from_fd(fd: OwnedFd, size: u64) -> std::io::Result<Self> {
        Ok(Self::with(size, MemStore::from_fd(fd, size)?))
    }

    fn with(size: u64, mem: MemStore) -> Self {
        RamBackend { store: Arc::new(Store { inner: RwLock::new(Inner { size, mem }) }) }
    }

    /// A descriptor of the memory holding the data, for another process to take
    /// over ([`RamBackend::from_fd`]).
    pub fn memory_fd(&self) -> std::io::Result<OwnedFd> {
        self.store.read().mem.fd().try_clone_to_owned()
    }

    /// Reads `buf.len()` bytes at `offset` (for tests and checks from the host side).
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), BackendError> {
        self.store.walk(
            offset,
            buf.len() as u64,
            |slot, coff, boff, n| {
                match slot.data() {
                    Some(c) => buf[boff..boff + n].copy_from_slice(&c[coff..coff + n]),
                    None => buf[boff..boff + n].fill(0),
                }
                Ok(())
            },
            false,
        )
    }
}

impl Store {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Visits `[offset, offset+len)` chunk by chunk: `f(chunk, offset_in_chunk,
    /// offset_in_transfer, n)`. With `alloc`, missing chunks are allocated first.
    /// Fails without visiting anything if the range is outside the store.
    fn walk(
        &self,
        offset: u64,
        len: u64,
        mut f: impl FnMut(&mut Slot<'_>, usize, usize, usize) -> Result<(), BackendError>,
        alloc: bool,
    ) -> Result<(), BackendError> {
        let inner = self.read();
        check_range(offset, len, inner.size)?;
        let mut done = 0u64;
        while done < len {
            let pos = offset + done;
            let idx = (pos / CHUNK) as usize;
            let coff = pos % CHUNK;
            let n = (CHUNK - coff).min(len - done);
            let mut slot = inner.mem.lock(idx);
            if alloc {
                slot.alloc();
            }
            f(&mut slot, coff as usize, done as usize, n as usize)?;
            done += n;
        }
        Ok(())
    }

    fn zero(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        self.walk(
            offset,
            len,
            |slot, coff, _, n| {
                if n == CHUNK as usize {
                    slot.free();
                } else if let Some(c) = slot.data() {
                    c[coff..coff + n].fill(0);
                }
                Ok(())
            },
            false,
        )
    }

    fn resize(&self, bytes: u64) -> std::io::Result<()> {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        if bytes < inner.size {
            // What lies past the new end must read as zeroes if the store grows again.
            let idx = (bytes / CHUNK) as usize;
            if idx < inner.mem.chunks() {
                let mut slot = inner.mem.lock(idx);
                if let Some(c) = slot.data() {
                    c[(bytes % CHUNK) as usize..].fill(0);
                }
            }
        }
        inner.mem.resize(bytes)?;
        inner.size = bytes;
        Ok(())
    }

    /// Where written data at or past `from` ends (an allocated chunk counts whole,
    /// but for the part of the first one before `from`).
    fn data_end(&self, from: u64) -> Option<u64> {
        let inner = self.read();
        let first = (from / CHUNK) as usize;
        let last = (first..inner.mem.chunks()).rev().find(|&i| {
            let mut slot = inner.mem.lock(i);
            let start = if i == first { (from % CHUNK) as usize } else { 0 };
            slot.data().is_some_and(|c| c[start..].iter().any(|&b| b != 0))
        })?;
        Some(((last as u64 + 1) * CHUNK).min(inner.size))
    }
}

impl Backend for RamBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            kind: "ram".into(),
            size: self.store.read().size,
            volatile_cache: false,
            discard: true,
            discard_zeroes: true,
            write_zeroes: true,
            block_size: 1,
            ..Default::default()
        }
    }
    fn open_queue(&self) -> std::io::Result<Box<dyn BackendQueue>> {
        Ok(Box::new(SyncQueue::new(self.clone())))
    }
    fn resize(&self, bytes: u64) -> std::io::Result<()> {
        self.store.resize(bytes)
    }
    fn handover_fd(&self) -> Option<std::io::Result<OwnedFd>> {
        Some(self.memory_fd())
    }
    fn data_end(&self, from: u64) -> std::io::Result<Option<u64>> {
        Ok(self.store.data_end(from))
    }
}

/// The buffer a read or write moves data between the store and, positioned at the
/// next byte of the transfer: chunks are visited in order, so a guest buffer's cursor
/// simply moves on.
enum Target<'a> {
    None,
    Host(&'a mut [u8]),
    Guest(SegmentCursor<'a>),
}

/// One piece of a walk over the chunks: where it starts in its chunk and in the
/// request's buffer, and its length.
#[derive(Clone, Copy, Debug)]
struct Piece {
    coff: usize,
    boff: usize,
    n: usize,
}

impl<'a> Target<'a> {
    fn new(data: &'a mut DataBuf, len: u64) -> Result<Self, BackendError> {
        Ok(match data {
            DataBuf::None | DataBuf::Within(_) => Target::None,
            DataBuf::Host(buf) => Target::Host(buf),
            DataBuf::Guest(segs) => Target::Guest(SegmentCursor::for_transfer(segs, len)?),
        })
    }

    /// Copies between one chunk and the buffer. `to_chunk` is the direction.
    fn copy(
        &mut self,
        mem: &GuestMemory,
        slot: &mut Slot<'_>,
        p: Piece,
        to_chunk: bool,
    ) -> Result<(), BackendError> {
        let Piece { coff, boff, n } = p;
        match self {
            Target::None => {}
            Target::Host(buf) => match (to_chunk, slot.data()) {
                (true, Some(c)) => c[coff..coff + n].copy_from_slice(&buf[boff..boff + n]),
                (false, Some(c)) => buf[boff..boff + n].copy_from_slice(&c[coff..coff + n]),
                (false, None) => buf[boff..boff + n].fill(0),
                (true, None) => unreachable!("writes allocate"),
            },
            Target::Guest(cur) => match (to_chunk, slot.data()) {
                _ if cur.offset() != boff as u64 => unreachable!("chunks are visited in order"),
                (true, Some(c)) => cur.read_into(mem, &mut c[coff..coff + n])?,
                (false, Some(c)) => cur.write_from(mem, &c[coff..coff + n])?,
                (false, None) => cur.fill(mem, n as u64, 0)?,
                (true, None) => unreachable!("writes allocate"),
            },
        }
        Ok(())
    }
}

impl SyncExec for RamBackend {
    fn exec(&mut self, mem: &GuestMemory, req: &mut Request) -> Result<(), BackendError> {
        match req.op {
            Op::Read | Op::Write { .. } => {
                let write = req.op != Op::Read;
                let mut target = Target::new(&mut req.data, req.len)?;
                self.store.walk(
                    req.offset,
                    req.len,
                    |c, coff, boff, n| target.copy(mem, c, Piece { coff, boff, n }, write),
                    write,
                )
            }
            Op::Flush => Ok(()),
            Op::WriteZeroes { .. } | Op::Discard => self.store.zero(req.offset, req.len),
            // Not offered (BackendInfo::copy): a Copy reads and writes here.
            Op::Copy { .. } => Err(BackendError::Unsupported),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Segment;

    fn run(q: &mut Box<dyn BackendQueue>, mem: &GuestMemory, req: Request) -> Result<(), BackendError> {
        q.submit(mem, req);
        let mut out = Vec::new();
        assert_eq!(q.reap(&mut out), 1);
        out.pop().unwrap().result
    }

    #[test]
    fn write_read_across_chunks_and_segments() {
        let mem = GuestMemory::anonymous(&[(0, 4 << 20)]).unwrap();
        let be = RamBackend::new(8 << 20);
        let mut q = be.open_queue().unwrap();
        let pattern: Vec<u8> = (0..(2 << 20) as u32).map(|i| (i * 7 + 3) as u8).collect();
        mem.write(0x1000, &pattern[..0x3000]).unwrap();
        mem.write(0x100000, &pattern[0x3000..]).unwrap();
        let segs = vec![
            Segment::Guest { gpa: 0x1000, len: 0x3000 },
            Segment::Guest { gpa: 0x100000, len: (2 << 20) - 0x3000 },
        ];
        let off = CHUNK - 0x2000; // straddles chunks 0, 1 and 2
        run(
            &mut q,
            &mem,
            Request {
                tag: 1,
                op: Op::Write { fua: false },
                offset: off,
                len: 2 << 20,
                data: DataBuf::Guest(segs),
            },
        )
        .unwrap();
        let mut back = vec![0u8; 2 << 20];
        be.read_at(off, &mut back).unwrap();
        assert!(back == pattern);
        mem.fill(0x200000, 2 << 20, 0xff).unwrap();
        let segs =
            vec![Segment::Discard { len: 0x800 }, Segment::Guest { gpa: 0x200000, len: (2 << 20) - 0x800 }];
        run(
            &mut q,
            &mem,
            Request { tag: 2, op: Op::Read, offset: off, len: 2 << 20, data: DataBuf::Guest(segs) },
        )
        .unwrap();
        let mut got = vec![0u8; (2 << 20) - 0x800];
        mem.read(0x200000, &mut got).unwrap();
        assert!(got[..] == pattern[0x800..]);
    }

    #[test]
    fn zeroes_and_range_checks() {
        let mem = GuestMemory::anonymous(&[(0, 0x10000)]).unwrap();
        let be = RamBackend::new(3 * CHUNK + 512);
        let mut q = be.open_queue().unwrap();
        run(
            &mut q,
            &mem,
            Request {
                tag: 1,
                op: Op::Write { fua: true },
                offset: 0,
                len: 512,
                data: DataBuf::Host(vec![9; 512]),
            },
        )
        .unwrap();
        run(
            &mut q,
            &mem,
            Request {
                tag: 2,
                op: Op::Write { fua: false },
                offset: 3 * CHUNK,
                len: 512,
                data: DataBuf::Host(vec![5; 512]),
            },
        )
        .unwrap();
        run(
            &mut q,
            &mem,
            Request {
                tag: 3,
                op: Op::WriteZeroes { deallocate: false },
                offset: 256,
                len: 256,
                data: DataBuf::None,
            },
        )
        .unwrap();
        let mut b = [0u8; 512];
        be.read_at(0, &mut b).unwrap();
        assert_eq!(&b[..256], &[9; 256][..]);
        assert_eq!(&b[256..], &[0; 256][..]);
        be.read_at(3 * CHUNK, &mut b).unwrap();
        assert_eq!(b, [5; 512]);
        let r = run(
            &mut q,
            &mem,
            Request {
                tag: 4,
                op: Op::Read,
                offset: 3 * CHUNK,
                len: 1024,
                data: DataBuf::Host(vec![0; 1024]),
            },
        );
        assert!(matches!(r, Err(BackendError::OutOfRange { .. })));
        let r = run(
            &mut q,
            &mem,
            Request {
                tag: 5,
                op: Op::Read,
                offset: 0,
                len: 512,
                data: DataBuf::Guest(vec![Segment::Guest { gpa: 0x20000, len: 512 }]),
            },
        );
        assert!(matches!(r, Err(BackendError::Memory(_))));
    }

    #[test]
    fn malformed_segments_are_refused_and_store_nothing() {
        let mem = GuestMemory::anonymous(&[(0, 0x10000)]).unwrap();
        mem.fill(0, 0x10000, 0xab).unwrap();
        let be = RamBackend::new(CHUNK);
        let mut q = be.open_queue().unwrap();
        let invalid = |r: Result<(), BackendError>| matches!(r, Err(BackendError::Io(ref e)) if e.kind() == std::io::ErrorKind::InvalidInput);
        let cases = [
            // A bit bucket holds no data to write.
            vec![Segment::Guest { gpa: 0x1000, len: 256 }, Segment::Discard { len: 256 }],
            // Segments that fall short of, or run past, the request.
            vec![Segment::Guest { gpa: 0x1000, len: 256 }],
            vec![Segment::Guest { gpa: 0x1000, len: 1024 }],
        ];
        for (tag, segs) in cases.into_iter().enumerate() {
            let write = Op::Write { fua: false };
            let req = Request { tag: tag as u64, op: write, offset: 0, len: 512, data: DataBuf::Guest(segs) };
            let r = run(&mut q, &mem, req);
            assert!(invalid(r), "case {tag}");
        }
        let mut b = [0u8; 512];
        be.read_at(0, &mut b).unwrap();
        assert_eq!(b, [0; 512]);
        let segs = vec![Segment::Guest { gpa: 0x1000, len: 256 }];
        let r = run(
            &mut q,
            &mem,
            Request { tag: 9, op: Op::Read, offset: 0, len: 512, data: DataBuf::Guest(segs) },
        );
        assert!(invalid(r));
        assert_eq!(mem.read_obj::<u8>(0x1000).unwrap(), 0xab, "nothing read into the guest");
    }

    #[test]
    fn resize_grows_and_shrinks_and_data_end_says_what_a_shrink_loses() {
        let be = RamBackend::new(CHUNK + 4096);
        let mut q = be.open_queue().unwrap();
        let mem = GuestMemory::empty();
        let write = |q: &mut Box<dyn BackendQueue>, offset: u64| {
            let data = DataBuf::Host(vec![0x5a; 512]);
            run(q, &mem, Request { tag: 0, op: Op::Write { fua: false }, offset, len: 512, data })
        };
        write(&mut q, CHUNK).unwrap();
        assert_eq!(be.data_end(CHUNK).unwrap(), Some(CHUNK + 4096), "data at the very start of the range");
        assert_eq!(be.data_end(CHUNK + 512).unwrap(), None, "nothing written past it");
        assert!(write(&mut q, 3 * CHUNK).is_err(), "past the end");
        be.resize(4 * CHUNK).unwrap();
        assert_eq!(be.info().size, 4 * CHUNK);
        write(&mut q, 3 * CHUNK).expect("an open queue sees the new size");
        // Shrink into the middle of a written chunk, then grow again: what lay past
        // the shrunk end reads as zeroes.
        be.resize(CHUNK + 256).unwrap();
        assert!(write(&mut q, 3 * CHUNK).is_err(), "past the new end");
        be.resize(2 * CHUNK).unwrap();
        let mut b = [0u8; 512];
        be.read_at(CHUNK, &mut b).unwrap();
        assert!(b[..256].iter().all(|&x| x == 0x5a) && b[256..].iter().all(|&x| x == 0), "{b:?}");
        assert_eq!(be.data_end(0).unwrap(), Some(2 * CHUNK));
    }

    #[test]
    fn another_process_takes_the_data_over_through_the_memfd() {
        let mem = GuestMemory::anonymous(&[(0, 0x10000)]).unwrap();
        let be = RamBackend::new(4 * CHUNK);
        let mut q = be.open_queue().unwrap();
        for (tag, off, byte) in [(1, 0, 3u8), (2, 2 * CHUNK + 4096, 7), (3, 3 * CHUNK, 9)] {
            let data = DataBuf::Host(vec![byte; 4096]);
            run(&mut q, &mem, Request { tag, op: Op::Write { fua: false }, offset: off, len: 4096, data })
                .unwrap();
        }
        // A whole chunk discarded is given back: the new owner sees a hole there.
        let discard = Request { tag: 4, op: Op::Discard, offset: 3 * CHUNK, len: CHUNK, data: DataBuf::None };
        run(&mut q, &mem, discard).unwrap();
        let taken = RamBackend::from_fd(be.memory_fd().unwrap(), 4 * CHUNK).unwrap();
        {
            let inner = taken.store.read();
            let allocated: Vec<bool> = (0..4).map(|i| inner.mem.lock(i).data().is_some()).collect();
            assert_eq!(allocated, [true, false, true, false]);
        }
        let mut b = vec![0u8; 4096];
        taken.read_at(2 * CHUNK + 4096, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 7));
        taken.read_at(0, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 3));
        taken.read_at(3 * CHUNK, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0));
        // Both see each other's writes: one memory.
        let mut q2 = taken.open_queue().unwrap();
        let data = DataBuf::Host(vec![0xee; 512]);
        run(&mut q2, &mem, Request { tag: 5, op: Op::Write { fua: false }, offset: CHUNK, len: 512, data })
            .unwrap();
        let mut b = vec![0u8; 512];
        be.store.read().mem.lock(1).alloc();
        be.read_at(CHUNK, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0xee));
    }
}
