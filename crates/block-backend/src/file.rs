//! A plain file backend: positioned reads and writes through a bounce buffer, flush as
//! fdatasync, deallocation and zeroing with fallocate where the file system has it.
//! Synchronous: the right tool for memory file systems (tmpfs), where a copy is all
//! an I/O is, and a simple reference everywhere else; the io_uring backend is the
//! fast path for files on devices.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use guest_mem::GuestMemory;
use rustix::fs::FallocateFlags;

use crate::{
    check_range, Backend, BackendError, BackendInfo, BackendQueue, DataBuf, Op, Request, SegmentCursor,
    SyncExec, SyncQueue,
};

/// A namespace stored in a regular file (or a block device opened as one).
#[derive(Clone, Debug)]
pub struct FileBackend {
    file: Arc<File>,
    path: PathBuf,
    size: Arc<AtomicU64>,
    /// fallocate punch hole works (deallocated ranges read as zeroes).
    punch: bool,
    /// fallocate zero range works.
    zero_range: bool,
    /// copy_file_range works within it (a regular file).
    copy: bool,
}

impl FileBackend {
    /// Opens `path`; with `create_size`, creates it (or extends it) to that size.
    pub fn open(path: &Path, create_size: Option<u64>) -> std::io::Result<Self> {
        Self::open_locked(path, create_size, None)
    }

    /// [`FileBackend::open`], the open file locked as `lock` says before anything
    /// is done to it.
    pub fn open_locked(
        path: &Path,
        create_size: Option<u64>,
        lock: Option<&file_lock::Request>,
    ) -> std::io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create_size.is_some())
            .truncate(false)
            .open(path)?;
        crate::lock_file(&file, path, lock)?;
        if let Some(want) = create_size {
            if file.metadata()?.len() < want {
                file.set_len(want)?;
            }
        }
        Self::from_file(file, path)
    }

    /// A backend over `file`, opened read-write by the caller (`path` names it
    /// in messages).
    pub fn from_file(file: File, path: &Path) -> std::io::Result<Self> {
        let size = file.metadata()?.len();
        if size == 0 {
            return Err(std::io::Error::other(format!(
                "{} is empty; give a size to create it",
                path.display()
            )));
        }
        let (punch, zero_range) = probe_fallocate(&file, size);
        let copy = crate::copy_works(&file);
        let size = Arc::new(AtomicU64::new(size));
        Ok(FileBackend { file: Arc::new(file), path: path.to_path_buf(), size, punch, zero_range, copy })
    }
}

impl Backend for FileBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            kind: format!("file:{}", self.path.display()),
            size: self.size.load(Ordering::Acquire),
            // Writes land in the page cache until fdatasync: a volatile cache.
            volatile_cache: true,
            discard: self.punch,
            discard_zeroes: self.punch,
            write_zeroes: self.punch || self.zero_range,
            copy: self.copy,
            block_size: 1,
            ..Default::default()
        }
    }
    fn open_queue(&self) -> std::io::Result<Box<dyn BackendQueue>> {
        Ok(Box::new(SyncQueue::new(FileQueue { be: self.clone(), bounce: Vec::new() })))
    }
    fn resize(&self, bytes: u64) -> std::io::Result<()> {
        crate::resize_file(&self.file, bytes)?;
        self.size.store(bytes, Ordering::Release);
        Ok(())
    }
    fn data_end(&self, from: u64) -> std::io::Result<Option<u64>> {
        crate::file_data_end(&self.file, from, self.size.load(Ordering::Acquire))
    }
}

#[derive(Debug)]
struct FileQueue {
    be: FileBackend,
    bounce: Vec<u8>,
}

impl FileQueue {
    fn short(done: usize, len: u64) -> BackendError {
        BackendError::Short { done: done as u64, len }
    }
}

impl SyncExec for FileQueue {
    fn exec(&mut self, mem: &GuestMemory, req: &mut Request) -> Result<(), BackendError> {
        check_range(req.offset, req.len, self.be.size.load(Ordering::Acquire))?;
        let f = &self.be.file;
        match req.op {
            Op::Read => {
                // Segments that do not add up to the request fail before any I/O.
                if let DataBuf::Guest(segs) = &req.data {
                    SegmentCursor::for_transfer(segs, req.len)?;
                }
                self.bounce.resize(req.len as usize, 0);
                f.read_exact_at(&mut self.bounce, req.offset)?;
                match &mut req.data {
                    DataBuf::Host(b) => b[..self.bounce.len()].copy_from_slice(&self.bounce),
                    DataBuf::Guest(segs) => SegmentCursor::new(segs).write_from(mem, &self.bounce)?,
                    DataBuf::None | DataBuf::Within(_) => {}
                }
            }
            Op::Write { fua } => {
                self.bounce.resize(req.len as usize, 0);
                match &req.data {
                    DataBuf::Host(b) => self.bounce.copy_from_slice(&b[..req.len as usize]),
                    DataBuf::Guest(segs) => {
                        SegmentCursor::for_transfer(segs, req.len)?.read_into(mem, &mut self.bounce)?
                    }
                    DataBuf::None | DataBuf::Within(_) => return Err(Self::short(0, req.len)),
                }
                f.write_all_at(&self.bounce, req.offset)?;
                if fua {
                    f.sync_data()?;
                }
            }
            Op::Flush => f.sync_data()?,
            Op::Copy { fua } => {
                let DataBuf::Within(src) = req.data else { return Err(BackendError::Unsupported) };
                check_range(src, req.len, self.be.size.load(Ordering::Acquire))?;
                crate::copy_within(f, src, req.offset, req.len)?;
                if fua {
                    f.sync_data()?;
                }
            }
            Op::Discard if self.be.punch => punch(f, req.offset, req.len)?,
            // Deallocation is advisory: without hole punching there is nothing to do.
            Op::Discard => {}
            Op::WriteZeroes { .. } if self.be.zero_range => rustix::fs::fallocate(
                &**f,
                FallocateFlags::ZERO_RANGE | FallocateFlags::KEEP_SIZE,
                req.offset,
                req.len,
            )
            .map_err(std::io::Error::from)?,
            Op::WriteZeroes { deallocate } if self.be.punch => {
                punch(f, req.offset, req.len)?;
                if !deallocate {
                    // Allocate the range again, so later writes there cannot fail for space.
                    let _ = rustix::fs::fallocate(&**f, FallocateFlags::KEEP_SIZE, req.offset, req.len);
                }
            }
            Op::WriteZeroes { .. } => {
                const CHUNK: u64 = 1 << 20;
                self.bounce.clear();
                self.bounce.resize(CHUNK.min(req.len) as usize, 0);
                let mut done = 0;
                while done < req.len {
                    let n = (req.len - done).min(CHUNK) as usize;
                    f.write_all_at(&self.bounce[..n], req.offset + done)?;
                    done += n as u64;
                }
            }
        }
        Ok(())
    }
}

/// What fallocate can do on a regular file of `size` bytes: (punch hole, zero
/// range). Probed past the end, where nothing changes: punching there frees nothing,
/// and the block zeroing preallocates beyond the end is punched again at once.
pub(crate) fn probe_fallocate(fd: impl std::os::fd::AsFd, size: u64) -> (bool, bool) {
    const PROBE: u64 = 4096;
    let past = size.next_multiple_of(PROBE) + PROBE;
    let probe = |flags| rustix::fs::fallocate(&fd, flags | FallocateFlags::KEEP_SIZE, past, PROBE).is_ok();
    let punch = probe(FallocateFlags::PUNCH_HOLE);
    let zero_range = probe(FallocateFlags::ZERO_RANGE);
    if zero_range && punch {
        probe(FallocateFlags::PUNCH_HOLE);
    }
    (punch, zero_range)
}

fn punch(f: &File, offset: u64, len: u64) -> std::io::Result<()> {
    let flags = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
    rustix::fs::fallocate(f, flags, offset, len).map_err(std::io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Segment;

    #[test]
    fn file_round_trip_and_bounds() {
        let dir = std::env::temp_dir().join(format!("vnvme-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ns.img");
        let be = FileBackend::open(&path, Some(1 << 20)).unwrap();
        assert_eq!(be.info().size, 1 << 20);
        let mem = GuestMemory::anonymous(&[(0, 0x10000)]).unwrap();
        mem.write(0x1000, &[7u8; 4096]).unwrap();
        let mut q = be.open_queue().unwrap();
        let mut out = Vec::new();
        let segs = vec![Segment::Guest { gpa: 0x1000, len: 4096 }];
        q.submit(
            &mem,
            Request {
                tag: 1,
                op: Op::Write { fua: true },
                offset: 8192,
                len: 4096,
                data: DataBuf::Guest(segs),
            },
        );
        q.submit(
            &mem,
            Request { tag: 2, op: Op::Read, offset: 8192, len: 4096, data: DataBuf::Host(vec![0; 4096]) },
        );
        q.submit(
            &mem,
            Request {
                tag: 3,
                op: Op::Read,
                offset: (1 << 20) - 512,
                len: 1024,
                data: DataBuf::Host(vec![0; 1024]),
            },
        );
        q.reap(&mut out);
        assert!(out[0].result.is_ok());
        match &out[1].data {
            DataBuf::Host(b) => assert_eq!(b, &vec![7u8; 4096]),
            _ => panic!(),
        }
        assert!(matches!(out[2].result, Err(BackendError::OutOfRange { .. })));
        // Segments short of the request, or with a bit bucket to write, are refused
        // rather than writing stale bounce bytes.
        out.clear();
        for (tag, segs) in [
            vec![Segment::Guest { gpa: 0x1000, len: 2048 }],
            vec![Segment::Guest { gpa: 0x1000, len: 2048 }, Segment::Discard { len: 2048 }],
        ]
        .into_iter()
        .enumerate()
        {
            let op = Op::Write { fua: false };
            q.submit(
                &mem,
                Request { tag: tag as u64, op, offset: 8192, len: 4096, data: DataBuf::Guest(segs) },
            );
        }
        let segs = vec![Segment::Guest { gpa: 0x1000, len: 8192 }];
        q.submit(&mem, Request { tag: 2, op: Op::Read, offset: 8192, len: 4096, data: DataBuf::Guest(segs) });
        q.reap(&mut out);
        for c in &out {
            assert!(
                matches!(c.result, Err(BackendError::Io(ref e)) if e.kind() == std::io::ErrorKind::InvalidInput),
                "{c:?}"
            );
        }
        let mut raw = vec![0u8; 4096];
        std::fs::File::open(&path).unwrap().read_exact_at(&mut raw, 8192).unwrap();
        assert_eq!(raw, vec![7u8; 4096]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn copy_inside_the_file_with_copy_file_range() {
        let path = std::env::temp_dir().join(format!("vnvme-file-copy-{}.img", std::process::id()));
        let be = FileBackend::open(&path, Some(1 << 20)).unwrap();
        assert!(be.info().copy, "copy_file_range within a regular file");
        let mem = GuestMemory::anonymous(&[(0, 0x10000)]).unwrap();
        let mut q = be.open_queue().unwrap();
        let data: Vec<u8> = (0..65536u32).map(|i| (i * 7 + i / 256) as u8).collect();
        let w = Op::Write { fua: false };
        q.submit(&mem, Request { tag: 1, op: w, offset: 0, len: 65536, data: DataBuf::Host(data.clone()) });
        let cp = Op::Copy { fua: true };
        q.submit(
            &mem,
            Request { tag: 2, op: cp, offset: 512 << 10, len: 32768, data: DataBuf::Within(4096) },
        );
        // A source past the end fails, and moves nothing.
        let (bad, end) = (Op::Copy { fua: false }, DataBuf::Within((1 << 20) - 4096));
        q.submit(&mem, Request { tag: 3, op: bad, offset: 0, len: 8192, data: end });
        let mut out = Vec::new();
        q.reap(&mut out);
        assert!(out[0].result.is_ok() && out[1].result.is_ok(), "{out:?}");
        assert!(out[2].result.is_err());
        let mut back = vec![0u8; 32768];
        std::fs::File::open(&path).unwrap().read_exact_at(&mut back, 512 << 10).unwrap();
        assert_eq!(back, data[4096..4096 + 32768]);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_copy_the_kernel_refuses_goes_through_a_buffer() {
        let path = std::env::temp_dir().join(format!("vnvme-file-copybuf-{}.img", std::process::id()));
        let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        f.write_all_at(&data, 0).unwrap();
        // More than one buffer's worth, at odd offsets.
        crate::copy_through_buffer(&f, 1, 400_001, 299_999).unwrap();
        let mut back = vec![0u8; 299_999];
        f.read_exact_at(&mut back, 400_001).unwrap();
        assert_eq!(back, data[1..]);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn discard_and_write_zeroes_with_fallocate_where_the_file_system_has_it() {
        let mut dirs = vec![std::env::temp_dir()];
        if std::path::Path::new("/dev/shm").is_dir() {
            dirs.push("/dev/shm".into());
        }
        for dir in dirs {
            let path = dir.join(format!("vnvme-file-fa-{}.img", std::process::id()));
            let be = FileBackend::open(&path, Some(1 << 20)).unwrap();
            let info = be.info();
            let mem = GuestMemory::anonymous(&[(0, 0x10000)]).unwrap();
            let mut q = be.open_queue().unwrap();
            let mut out = Vec::new();
            let ones = vec![0xffu8; 16384];
            q.submit(
                &mem,
                Request {
                    tag: 1,
                    op: Op::Write { fua: false },
                    offset: 0,
                    len: 16384,
                    data: DataBuf::Host(ones),
                },
            );
            q.submit(&mem, Request { tag: 2, op: Op::Discard, offset: 0, len: 4096, data: DataBuf::None });
            let wz = Op::WriteZeroes { deallocate: false };
            q.submit(&mem, Request { tag: 3, op: wz, offset: 8192, len: 4096, data: DataBuf::None });
            q.submit(
                &mem,
                Request { tag: 4, op: Op::Read, offset: 0, len: 16384, data: DataBuf::Host(vec![7; 16384]) },
            );
            q.reap(&mut out);
            assert!(out.iter().all(|c| c.result.is_ok()), "{}: {:?}", dir.display(), out);
            let DataBuf::Host(back) = &out[3].data else { panic!("read buffer") };
            // Write zeroes always zeroes; discard does when it is advertised.
            assert!(back[8192..12288].iter().all(|&b| b == 0), "{}: write zeroes", dir.display());
            assert!(back[4096..8192].iter().all(|&b| b == 0xff) && back[12288..].iter().all(|&b| b == 0xff));
            if info.discard {
                assert!(
                    info.discard_zeroes && back[..4096].iter().all(|&b| b == 0),
                    "{}: discard",
                    dir.display()
                );
            }
            std::fs::remove_file(&path).unwrap();
        }
    }
}
