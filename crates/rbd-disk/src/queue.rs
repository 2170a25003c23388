//! One queue on the shared image: requests go to librbd as `rbd_aio_*` calls
//! through the safe layer (`crate::aio`, which owns what crosses the C boundary), and
//! librbd's callback (on a librbd thread) hands each result back through the queue's
//! inbox and eventfd. Safe code only.
#![forbid(unsafe_code)]

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex};

use block_backend::{Admit, BackendError, BackendQueue, Completion, Op, Request, Requests};
use guest_mem::GuestMemory;
use rustix::event::{eventfd, EventfdFlags};

use crate::aio::{self, Aio, Finished, Inbox};
use crate::ffi;
use crate::image::Image;

/// Read buffers kept for reuse, per queue.
const SPARE_BUFFERS: usize = 64;
/// Larger buffers are not kept.
const SPARE_MAX_BYTES: usize = 1 << 20;

/// What to hand librbd for a request.
#[derive(Clone, Copy, Debug)]
enum Issue {
    Read,
    Write,
    Flush,
    Discard,
    WriteZeroes,
}

#[derive(Debug)]
pub(crate) struct RbdQueue {
    image: Arc<Image>,
    inbox: Arc<Inbox>,
    /// The requests librbd holds, by the slot its callbacks name (block_backend's
    /// in-flight core: revoke, FUA as write then flush, data in and out).
    reqs: Requests<()>,
    /// Swapped with the inbox's list on reap, so neither side allocates.
    batch: Vec<Finished>,
    spare: Vec<Vec<u8>>,
    /// What this queue sees of the cluster (`crate::liveness`).
    watch: crate::liveness::Watch,
}

impl RbdQueue {
    pub(crate) fn new(image: Arc<Image>) -> std::io::Result<RbdQueue> {
        let event = eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?;
        let inbox = Arc::new(Inbox { done: Mutex::new(Vec::with_capacity(64)), event });
        Ok(RbdQueue {
            watch: image.liveness.watch(),
            image,
            inbox,
            reqs: Requests::default(),
            batch: Vec::with_capacity(64),
            spare: Vec::new(),
        })
    }

    fn buffer(&mut self, len: usize) -> Vec<u8> {
        match self.spare.pop() {
            Some(mut b) => {
                b.clear();
                b.resize(len, 0);
                b
            }
            None => vec![0; len],
        }
    }

    fn keep(&mut self, b: Vec<u8>) {
        if self.spare.len() < SPARE_BUFFERS && b.capacity() <= SPARE_MAX_BYTES && b.capacity() > 0 {
            self.spare.push(b);
        }
    }

    /// Hands request `slot` to librbd as `what`. An error means librbd did not take
    /// it (and holds nothing of it).
    fn call(&mut self, slot: usize, what: Issue) -> Result<(), BackendError> {
        let req = self.reqs.get(slot).expect("live request");
        let (offset, len) = (req.offset, req.len);
        let (aio, buf) = match what {
            Issue::Read => (Aio::Read { offset }, self.buffer(len as usize)),
            Issue::Write => {
                let mut buf = self.buffer(len as usize);
                let copied = self.reqs.get(slot).expect("live request").copy_out(0, &mut buf);
                if let Err(e) = copied {
                    self.keep(buf);
                    return Err(e);
                }
                (Aio::Write { offset }, buf)
            }
            Issue::Flush => (Aio::Flush, Vec::new()),
            Issue::Discard => (Aio::Discard { offset, len }, Vec::new()),
            Issue::WriteZeroes => (Aio::WriteZeroes { offset, len }, Vec::new()),
        };
        aio::submit(&self.image, &self.inbox, slot, aio, buf).map_err(|(e, buf)| {
            self.keep(buf);
            e
        })?;
        self.watch.sent();
        Ok(())
    }

    fn finish(&mut self, slot: usize, error: Option<BackendError>) {
        if let (Some(e), Some(req)) = (error, self.reqs.get_mut(slot)) {
            req.fail(e);
        }
        self.reqs.finish(slot);
    }

    /// librbd answered request `f.slot`.
    fn answered(&mut self, f: Finished) {
        let Finished { slot, ret, buf } = f;
        self.watch.answered(matches!(-ret as i32, libc::ETIMEDOUT | libc::ESHUTDOWN | libc::ENOTCONN));
        let Some(req) = self.reqs.get_mut(slot) else {
            self.keep(buf);
            return;
        };
        if ret < 0 {
            self.keep(buf);
            let e = match -ret as i32 {
                libc::ETIMEDOUT => BackendError::NotReady(format!(
                    "{}: the cluster did not answer in time (rados_osd_op_timeout)",
                    self.image.spec
                )),
                libc::ESHUTDOWN | libc::ENOTCONN => {
                    BackendError::NotReady(format!("{}: {}", self.image.spec, ffi::errno(ret as i64)))
                }
                _ => ffi::errno(ret as i64).into(),
            };
            self.finish(slot, Some(e));
            return;
        }
        let mut error = None;
        if req.op == Op::Read {
            // Dropped if the request was revoked.
            error = req.copy_in(0, buf.len() as u64, Some(&buf)).err();
        }
        if let Some(e) = error.take() {
            req.fail(e);
        }
        let flush_next = req.flush_now();
        self.keep(buf);
        if flush_next {
            // The write is done: now its flush (FUA as write then flush).
            if let Err(e) = self.call(slot, Issue::Flush) {
                self.finish(slot, Some(e));
            }
            return;
        }
        self.finish(slot, None);
    }
}

impl BackendQueue for RbdQueue {
    fn submit(&mut self, mem: &GuestMemory, req: Request) {
        let size = self.image.size();
        let checked = match req.op {
            Op::Flush => Ok(()),
            _ => block_backend::check_range(req.offset, req.len, size),
        }
        .and_then(|()| match req.op {
            Op::Write { .. } | Op::WriteZeroes { .. } | Op::Discard if self.image.spec.snap.is_some() => {
                Err(BackendError::ReadOnly)
            }
            // Not offered (BackendInfo::copy is false): it fails before it is issued.
            Op::Copy { .. } => Err(BackendError::Unsupported),
            _ => Ok(()),
        });
        let what = match req.op {
            Op::Read => Issue::Read,
            Op::Write { .. } | Op::Copy { .. } => Issue::Write,
            Op::Flush => Issue::Flush,
            Op::Discard => Issue::Discard,
            Op::WriteZeroes { .. } => Issue::WriteZeroes,
        };
        let nothing = req.op != Op::Flush && req.len == 0;
        // librbd has no FUA: a FUA write is a write, then a flush.
        if let Admit::Slot(slot) = self.reqs.admit(mem, req, checked.map(|()| (!nothing).then_some(())), true)
        {
            if let Err(e) = self.call(slot, what) {
                self.finish(slot, Some(e));
            }
        }
    }

    fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        // Drain the notifier first: a result arriving after this is signalled anew.
        let _ = rustix::io::read(&self.inbox.event, &mut [0u8; 8]);
        {
            let mut inbox = self.inbox.done.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::swap(&mut *inbox, &mut self.batch);
        }
        let mut batch = std::mem::take(&mut self.batch);
        for f in batch.drain(..) {
            self.answered(f);
        }
        self.batch = batch;
        self.reqs.reap(out)
    }

    fn in_flight(&self) -> usize {
        self.reqs.in_flight()
    }

    fn notifier(&self) -> Option<BorrowedFd<'_>> {
        Some(self.inbox.event.as_fd())
    }

    fn needs_polling(&self) -> bool {
        // Requests that failed or finished at submission wait here, unsignalled.
        self.reqs.has_done()
    }

    fn revoke(&mut self, tag: u64) -> Option<bool> {
        // Write data was copied at submission; read data is dropped on arrival.
        self.reqs.revoke(tag)
    }

    fn memory_changed(&mut self, _mem: &GuestMemory) {}
}
