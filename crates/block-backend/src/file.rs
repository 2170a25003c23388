//! A plain file backend: positioned reads and writes through a bounce buffer, flush as
//! fdatasync. Synchronous and simple on purpose; the io_uring backend replaces it on
//! the fast path.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use guest_mem::GuestMemory;

use crate::{
    check_range, Backend, BackendError, BackendInfo, BackendQueue, DataBuf, Op, Request, Segment, SyncExec,
    SyncQueue,
};

/// A namespace stored in a regular file (or a block device opened as one).
#[derive(Clone, Debug)]
pub struct FileBackend {
    file: Arc<File>,
    path: PathBuf,
    size: u64,
}

impl FileBackend {
    /// Opens `path`; with `create_size`, creates it (or extends it) to that size.
    pub fn open(path: &Path, create_size: Option<u64>) -> std::io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create_size.is_some())
            .truncate(false)
            .open(path)?;
        let mut size = file.metadata()?.len();
        if let Some(want) = create_size {
            if size < want {
                file.set_len(want)?;
                size = want;
            }
        }
        if size == 0 {
            return Err(std::io::Error::other(format!(
                "{} is empty; give a size to create it",
                path.display()
            )));
        }
        Ok(FileBackend { file: Arc::new(file), path: path.to_path_buf(), size })
    }
}

impl Backend for FileBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            kind: format!("file:{}", self.path.display()),
            size: self.size,
            // Writes land in the page cache until fdatasync: a volatile cache.
            volatile_cache: true,
            discard: false,
            discard_zeroes: false,
            // Zeroes are written as buffers: not worth advertising.
            write_zeroes: false,
            block_size: 1,
            ..Default::default()
        }
    }
    fn open_queue(&self) -> std::io::Result<Box<dyn BackendQueue>> {
        Ok(Box::new(SyncQueue::new(FileQueue { be: self.clone(), bounce: Vec::new() })))
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
        check_range(req.offset, req.len, self.be.size)?;
        let f = &self.be.file;
        match req.op {
            Op::Read => {
                self.bounce.resize(req.len as usize, 0);
                f.read_exact_at(&mut self.bounce, req.offset)?;
                match &mut req.data {
                    DataBuf::Host(b) => b[..self.bounce.len()].copy_from_slice(&self.bounce),
                    DataBuf::Guest(segs) => {
                        let mut off = 0usize;
                        for s in segs.iter() {
                            if let Segment::Guest { gpa, len } = *s {
                                mem.write(gpa, &self.bounce[off..off + len as usize])?;
                            }
                            off += s.len() as usize;
                        }
                    }
                    DataBuf::None => {}
                }
            }
            Op::Write { fua } => {
                self.bounce.resize(req.len as usize, 0);
                match &req.data {
                    DataBuf::Host(b) => self.bounce.copy_from_slice(&b[..req.len as usize]),
                    DataBuf::Guest(segs) => {
                        let mut off = 0usize;
                        for s in segs.iter() {
                            if let Segment::Guest { gpa, len } = *s {
                                mem.read(gpa, &mut self.bounce[off..off + len as usize])?;
                            }
                            off += s.len() as usize;
                        }
                    }
                    DataBuf::None => return Err(Self::short(0, req.len)),
                }
                f.write_all_at(&self.bounce, req.offset)?;
                if fua {
                    f.sync_data()?;
                }
            }
            Op::Flush => f.sync_data()?,
            Op::WriteZeroes { .. } | Op::Discard => {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let mut raw = vec![0u8; 4096];
        std::fs::File::open(&path).unwrap().read_exact_at(&mut raw, 8192).unwrap();
        assert_eq!(raw, vec![7u8; 4096]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
