//! The null backend: writes are dropped, reads return zeroes, or (in the
//! benchmark mode [`NullBackend::untouched`], like Linux's null_blk and SPDK's
//! null bdev) leave the read buffer as it was, so that the controller and its
//! transport can be measured without the cost of writing the data.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use guest_mem::GuestMemory;

use crate::{
    check_range, Backend, BackendError, BackendInfo, BackendQueue, DataBuf, Op, Request, SegmentCursor,
    SyncExec, SyncQueue,
};

/// A backend of `size` bytes that stores nothing.
#[derive(Clone, Debug)]
pub struct NullBackend {
    size: Arc<AtomicU64>,
    /// Reads write zeroes into the buffer (false: they leave it untouched).
    fill: bool,
}

impl NullBackend {
    /// Reads return zeroes.
    pub fn new(size: u64) -> Self {
        NullBackend { size: Arc::new(AtomicU64::new(size)), fill: true }
    }

    /// Reads complete without touching the buffer: the guest reads back whatever its
    /// memory held. For measuring the controller alone; never what a guest's disk
    /// should do.
    pub fn untouched(size: u64) -> Self {
        NullBackend { fill: false, ..NullBackend::new(size) }
    }
}

impl Backend for NullBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            kind: if self.fill { "null" } else { "null (reads untouched)" }.into(),
            size: self.size.load(Ordering::Relaxed),
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
        self.size.store(bytes, Ordering::Relaxed);
        Ok(())
    }
    fn data_end(&self, _from: u64) -> std::io::Result<Option<u64>> {
        Ok(None)
    }
}

impl SyncExec for NullBackend {
    fn exec(&mut self, mem: &GuestMemory, req: &mut Request) -> Result<(), BackendError> {
        check_range(req.offset, req.len, self.size.load(Ordering::Relaxed))?;
        if req.op == Op::Read && self.fill {
            match &mut req.data {
                DataBuf::Guest(segs) => SegmentCursor::for_transfer(segs, req.len)?.fill(mem, req.len, 0)?,
                DataBuf::Host(buf) => buf.fill(0),
                DataBuf::None | DataBuf::Within(_) => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fill_zeroes_unless_untouched() {
        for (backend, want) in [(NullBackend::new(1 << 20), 0u8), (NullBackend::untouched(1 << 20), 0xa5)] {
            let mut q = backend.clone();
            let mem = GuestMemory::empty();
            let mut req = Request {
                op: Op::Read,
                offset: 4096,
                len: 512,
                data: DataBuf::Host(vec![0xa5; 512]),
                tag: 0,
            };
            q.exec(&mem, &mut req).expect("read");
            let DataBuf::Host(buf) = &req.data else { panic!("the buffer went away") };
            assert!(buf.iter().all(|&b| b == want), "{}: {:x?}", backend.info().kind, &buf[..8]);
        }
    }
}
