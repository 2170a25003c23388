//! A backend that remembers what reached it: every request's operation, offset and
//! length, in order. A test of durability (FUA, Flush) asks it, since data in RAM
//! or the page cache looks the same whether or not a flush ever happened.

use std::sync::{Arc, Mutex};

use block_backend::{Backend, BackendInfo, BackendQueue, Completion, DataBuf, Op, Request};
use guest_mem::GuestMemory;

/// One request as it reached the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    pub op: Op,
    pub offset: u64,
    pub len: u64,
    /// A Copy's source offset (its [`DataBuf::Within`]).
    pub from: Option<u64>,
}

/// Wraps a backend, reporting a volatile write cache (so the controller owes it
/// Flushes and FUA), and records every request any of its queues receives.
#[derive(Debug, Clone)]
pub struct RecordingBackend {
    inner: Arc<dyn Backend>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl RecordingBackend {
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        RecordingBackend { inner, seen: Arc::default() }
    }

    /// Everything received so far, and forgets it.
    pub fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut self.seen.lock().unwrap())
    }
}

impl Backend for RecordingBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo { volatile_cache: true, ..self.inner.info() }
    }
    fn open_queue(&self) -> std::io::Result<Box<dyn BackendQueue>> {
        Ok(Box::new(RecordingQueue { inner: self.inner.open_queue()?, seen: self.seen.clone() }))
    }
}

#[derive(Debug)]
struct RecordingQueue {
    inner: Box<dyn BackendQueue>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl BackendQueue for RecordingQueue {
    fn submit(&mut self, mem: &GuestMemory, req: Request) {
        let from = if let DataBuf::Within(src) = req.data { Some(src) } else { None };
        self.seen.lock().unwrap().push(Seen { op: req.op, offset: req.offset, len: req.len, from });
        self.inner.submit(mem, req)
    }
    fn commit(&mut self) {
        self.inner.commit()
    }
    fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        self.inner.reap(out)
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
}
