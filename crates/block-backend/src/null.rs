//! The null backend: writes are dropped, reads return zeroes.

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
}

impl NullBackend {
    pub fn new(size: u64) -> Self {
        NullBackend { size: Arc::new(AtomicU64::new(size)) }
    }
}

impl Backend for NullBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            kind: "null".into(),
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
        if req.op == Op::Read {
            match &mut req.data {
                DataBuf::Guest(segs) => SegmentCursor::for_transfer(segs, req.len)?.fill(mem, req.len, 0)?,
                DataBuf::Host(buf) => buf.fill(0),
                DataBuf::None => {}
            }
        }
        Ok(())
    }
}
