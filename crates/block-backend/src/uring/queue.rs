//! One queue: a ring with the backing file registered, its eventfd, and the
//! requests in flight. `submit` fills the submission ring, `commit` makes one
//! `io_uring_enter`, `reap` drains the eventfd, then the completion ring; requests
//! beyond the queue depth wait in `pending`. Dropping a queue waits for every SQE
//! the kernel still holds.
//!
//! The requests are block_backend's in-flight core in its direct mode (`Requests<Run>`,
//! slot = SQE user data): each SQE pushed is a piece sent, each CQE a piece landed.
//! Revoke (`BackendQueue::revoke`): a request waiting for room in the ring never
//! reaches the kernel and completes at once; one whose SQE the kernel holds and
//! whose vectors point into guest memory cannot be stopped (`Some(false)`: the
//! kernel may still move its data, and the request's `GuestMemory` keeps the
//! mappings alive until the CQE); any other (through a bounce buffer, into a host
//! buffer, or moving no data) completes at once with NotReady, and its slot, bounce
//! buffer, vectors and buffers stay held until its CQE, which is swallowed.

use std::collections::VecDeque;
use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use guest_mem::{GuestMemory, HostRange};
use io_uring::IoUring;
use tracing::{error, warn};

use super::buf::{fill_zero_iov, AlignedBuf, IoVec};
use super::limits::{BOUNCE_KEEP_MAX, BOUNCE_POOL_MAX, BUF_ALIGN, REMOVAL_CHECK_PERIOD, TRASH_CHUNK};
use super::request::{Outcome, Run};
use super::shared::Shared;
use super::sys;
use crate::{Admit, BackendError, BackendQueue, Completion, Landed, Op, Request, Requests, Revoked};

/// One queue: a ring, its eventfd, and the requests in flight.
pub(super) struct UringQueue {
    pub(super) sh: Arc<Shared>,
    ring: IoUring,
    /// The eventfd the ring signals on every completion.
    event: File,
    /// The eventfd may be readable although the completion ring is empty: a
    /// completion was taken after the last drain (or we kicked it). When false and
    /// the ring is empty, reap skips the read.
    event_dirty: bool,
    /// Requests by slot, as SQE user data names them (the in-flight core, direct
    /// mode).
    reqs: Requests<Run>,
    /// Requests waiting for room in the ring (new ones beyond the depth, and
    /// resubmissions after a partial transfer).
    pending: VecDeque<usize>,
    /// SQEs pushed and not yet completed.
    in_kernel: u32,
    /// Scratch buffer SGL bit buckets read into; the kernel writes it, nobody reads it.
    pub(super) trash: Option<AlignedBuf>,
    bounce_pool: Vec<AlignedBuf>,
    /// The vectors of each slot's SQEs. A slot's are left alone while it is held
    /// (until its CQE, even for a request given up on), and reused by the slot's next
    /// request.
    iovs: Vec<Vec<IoVec>>,
    /// The vectors of the request being planned, traded for its slot's once it has
    /// one.
    pub(super) iov: Vec<IoVec>,
    pub(super) ranges: Vec<HostRange>,
    cqes: Vec<(u64, i32)>,
    last_check: Instant,
}

impl fmt::Debug for UringQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UringQueue")
            .field("path", &self.sh.path)
            .field("in_flight", &self.in_flight())
            .field("in_kernel", &self.in_kernel)
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl UringQueue {
    pub(super) fn new(sh: Arc<Shared>) -> io::Result<Self> {
        let ring = IoUring::new(sh.queue_depth)?;
        let main = sh.file.as_raw_fd();
        let buffered = sh.buffered.as_ref().map_or(main, |f| f.as_raw_fd());
        ring.submitter().register_files(&[main, buffered])?;
        let event = File::from(sys::eventfd()?);
        ring.submitter().register_eventfd(event.as_raw_fd())?;
        let align = sh.layout.mem_align as usize;
        Ok(UringQueue {
            sh,
            ring,
            event,
            event_dirty: false,
            reqs: Requests::direct(),
            pending: VecDeque::new(),
            in_kernel: 0,
            trash: Some(AlignedBuf::new(TRASH_CHUNK, align)),
            bounce_pool: Vec::new(),
            iovs: Vec::new(),
            iov: Vec::new(),
            ranges: Vec::new(),
            cqes: Vec::new(),
            last_check: Instant::now(),
        })
    }

    /// Makes the notifier readable, so an owner asleep on it comes to reap a
    /// completion that did not come from the kernel.
    fn kick(&mut self) {
        let _ = (&self.event).write(&1u64.to_ne_bytes());
        self.event_dirty = true;
    }

    fn drain_event(&self) {
        let mut b = [0u8; 8];
        let _ = (&self.event).read(&mut b);
    }

    /// Checks whether the backing file was unlinked (and says so once).
    pub(super) fn check_removed(&self) -> bool {
        if self.sh.removed.load(Ordering::Relaxed) {
            return true;
        }
        match self.sh.file.metadata() {
            Ok(m) if m.nlink() == 0 => {
                if !self.sh.removed.swap(true, Ordering::Relaxed) {
                    error!(path = %self.sh.path.display(), "backend file was removed; failing every request");
                }
                true
            }
            _ => false,
        }
    }

    pub(super) fn get_bounce(&mut self, len: usize) -> AlignedBuf {
        let fit =
            self.bounce_pool.iter().enumerate().filter(|(_, b)| b.cap >= len).min_by_key(|(_, b)| b.cap);
        match fit.map(|(i, _)| i) {
            Some(i) => self.bounce_pool.swap_remove(i),
            None => AlignedBuf::new(
                len.next_multiple_of(BUF_ALIGN).max(BUF_ALIGN),
                self.sh.layout.mem_align as usize,
            ),
        }
    }

    pub(super) fn put_bounce(&mut self, b: AlignedBuf) {
        if self.bounce_pool.len() < BOUNCE_POOL_MAX && b.cap <= BOUNCE_KEEP_MAX {
            self.bounce_pool.push(b);
        }
    }

    /// Takes back what a finished request's run held.
    fn release(&mut self, run: Run) {
        if let Some(b) = run.bounce {
            self.put_bounce(b);
        }
    }

    /// Gives slot `idx` the vectors just planned. A bounced transfer's one vector is
    /// copied (what it was planned in keeps its room, grown by however many pieces
    /// the transfer had); any other list is traded for the slot's old one, the next
    /// request's to plan in. A slot's list so holds at most IOV_MAX vectors' room.
    fn trade_iov(&mut self, idx: usize, bounced: bool) {
        if self.iovs.len() <= idx {
            self.iovs.resize_with(idx + 1, Vec::new);
        }
        let slot = &mut self.iovs[idx];
        if bounced {
            slot.clear();
            slot.extend_from_slice(&self.iov);
        } else {
            std::mem::swap(slot, &mut self.iov);
        }
    }

    /// Gathers a bounced write's data into its bounce buffer.
    fn gather(&mut self, idx: usize) -> Result<(), BackendError> {
        let p = self.reqs.get_mut(idx).expect("admitted");
        let Some(mut b) = p.wire.bounce.take() else { return Ok(()) };
        let copied = p.copy_out(0, b.slice_mut(p.len as usize));
        p.wire.bounce = Some(b);
        copied
    }

    /// Moves waiting requests into the submission ring while fewer than the queue
    /// depth are with the kernel.
    fn fill(&mut self) {
        while self.in_kernel < self.sh.queue_depth {
            let Some(&idx) = self.pending.front() else { break };
            let Some(p) = self.reqs.get_mut(idx) else {
                self.pending.pop_front();
                continue;
            };
            let entry = p.wire.entry(p.offset, idx, &self.iovs[idx]);
            // Everything the entry points at lives until its CQE is reaped, revoked or
            // not (the core holds a revoked request's slot until its last piece lands,
            // and hands the slot to no other request meanwhile): the vector array
            // (`iovs[idx]`, the slot's, not touched while the SQE is out; growing `iovs`
            // moves no list's array), the request's bounce buffer, a host buffer (the
            // request's data), the guest mappings (the request's `GuestMemory`, which
            // revoke does not drop while a zero-copy SQE is out), and the per-queue
            // scratch and shared zero buffers, which outlive the ring (Drop waits for
            // every SQE).
            // SAFETY: every buffer the entry names outlives its completion, as listed above.
            let pushed = unsafe { self.ring.submission().push(&entry) }.is_ok();
            if !pushed {
                // The submission ring is full: hand it to the kernel and try again.
                if self.ring.submit().is_err() {
                    break;
                }
                // SAFETY: as above.
                if unsafe { self.ring.submission().push(&entry) }.is_err() {
                    break;
                }
            }
            self.pending.pop_front();
            self.in_kernel += 1;
            p.sent(p.wire.zero_copy);
        }
    }

    /// One io_uring_enter for whatever sits in the submission ring.
    fn flush(&mut self) {
        if self.ring.submission().is_empty() {
            return;
        }
        loop {
            match self.ring.submit() {
                Ok(_) => return,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => {
                    // The entries stay in the ring: retry on the next reap, which the
                    // kick makes sure happens.
                    if !matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY)) {
                        warn!(path = %self.sh.path.display(), "io_uring submit failed: {e}");
                    }
                    self.kick();
                    return;
                }
            }
        }
    }

    /// The error for a read that found EOF before its end.
    fn eof_error(&self, done: u64, len: u64) -> BackendError {
        let now = if self.sh.layout.block_dev {
            sys::blk_size(self.sh.file.as_fd()).ok()
        } else {
            self.sh.file.metadata().ok().map(|m| m.len())
        };
        match now {
            Some(now) if now < self.sh.size() => BackendError::NotReady(format!(
                "backend file truncated to {now} bytes (namespace has {})",
                self.sh.size()
            )),
            _ => BackendError::Short { done, len },
        }
    }

    fn on_cqe(&mut self, idx: usize, res: i32) {
        self.in_kernel = self.in_kernel.saturating_sub(1);
        let zero_copy = self.reqs.get(idx).is_some_and(|p| p.wire.zero_copy);
        let p = match self.reqs.landed(idx, zero_copy) {
            Landed::Live(p) => p,
            Landed::Swallowed { freed } => {
                // Given up on while the kernel held it: it completed then.
                if let Some(run) = freed {
                    self.release(run);
                }
                return;
            }
            Landed::Unknown => {
                warn!("io_uring completion for unknown slot {idx}");
                return;
            }
        };
        match p.wire.on_result(p.len, res, &mut self.iovs[idx]) {
            Outcome::Again => self.pending.push_back(idx),
            Outcome::Done(result) => self.finish(idx, result),
            Outcome::Eof { done, len } => {
                let e = self.eof_error(done, len);
                self.finish(idx, Err(e));
            }
            Outcome::MoreZeroes => {
                let zeroes = self.zero_addr();
                let p = self.reqs.get(idx).expect("live slot");
                fill_zero_iov(&mut self.iovs[idx], zeroes, p.len - p.wire.done);
                self.pending.push_back(idx);
            }
        }
    }

    fn finish(&mut self, idx: usize, result: Result<(), BackendError>) {
        let Some(p) = self.reqs.get_mut(idx) else { return };
        match result {
            Ok(()) => {
                let (dsync, fsync) = p.wire.durability();
                let count = |c: &std::sync::atomic::AtomicU64, on: bool| {
                    if on {
                        c.fetch_add(1, Ordering::Relaxed);
                    }
                };
                count(&self.sh.synced.dsync_writes, dsync);
                count(&self.sh.synced.fsyncs, fsync);
            }
            Err(e) => p.fail(e),
        }
        if p.op == Op::Read && !p.failed() {
            // A bounced read: its data out of the bounce buffer.
            if let Some(b) = p.wire.bounce.take() {
                let copied = p.copy_in(0, p.len, Some(b.slice(p.len as usize)));
                p.wire.bounce = Some(b);
                if let Err(e) = copied {
                    p.fail(e);
                }
            }
        }
        // Its bounce buffer back to the pool, then the request out.
        let bounce = p.wire.bounce.take();
        self.reqs.finish(idx);
        if let Some(b) = bounce {
            self.put_bounce(b);
        }
    }
}

impl BackendQueue for UringQueue {
    fn submit(&mut self, mem: &GuestMemory, mut req: Request) {
        self.iov.clear();
        let planned = self.plan(mem, &mut req);
        let bounced = matches!(&planned, Ok(Some(r)) if r.bounce.is_some());
        let bounced_write = bounced && req.op != Op::Read;
        // The wire has FUA (RWF_DSYNC): a FUA write is not followed by a flush.
        match self.reqs.admit(mem, req, planned, false) {
            Admit::Slot(idx) => {
                self.trade_iov(idx, bounced);
                if bounced_write {
                    if let Err(e) = self.gather(idx) {
                        self.finish(idx, Err(e));
                        self.kick();
                        return;
                    }
                }
                self.pending.push_back(idx);
                self.fill();
            }
            Admit::Done => self.kick(),
        }
    }

    fn commit(&mut self) {
        self.fill();
        self.flush();
    }

    fn revoke(&mut self, tag: u64) -> Option<bool> {
        match self.reqs.give_up(tag) {
            Revoked::Given { slot, freed } => {
                if let Some(run) = freed {
                    // It was waiting for room in the ring: it never reaches the kernel.
                    if let Some(at) = self.pending.iter().position(|&i| i == slot) {
                        self.pending.remove(at);
                    }
                    self.release(run);
                }
                // Its completion waits for a reap.
                self.kick();
                Some(true)
            }
            r => r.answer(),
        }
    }

    fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        // Drain first: a completion that lands after this still finds the eventfd
        // readable next time. The eventfd counts completions, so it can be readable
        // with the ring empty only if a completion was taken after the last drain.
        if self.event_dirty || !self.ring.completion().is_empty() {
            self.drain_event();
        }
        let mut cqes = std::mem::take(&mut self.cqes);
        cqes.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        self.event_dirty = !cqes.is_empty();
        for &(ud, res) in &cqes {
            self.on_cqe(ud as usize, res);
        }
        cqes.clear();
        self.cqes = cqes;
        if self.last_check.elapsed() >= REMOVAL_CHECK_PERIOD {
            self.last_check = Instant::now();
            self.check_removed();
        }
        // Resubmissions, and requests that waited for room.
        self.fill();
        self.flush();
        if !self.pending.is_empty() && self.in_kernel == 0 {
            // Nothing in the kernel will wake the owner: come back by ourselves.
            self.kick();
        }
        self.reqs.reap(out)
    }

    fn in_flight(&self) -> usize {
        self.reqs.in_flight()
    }

    fn notifier(&self) -> Option<BorrowedFd<'_>> {
        Some(self.event.as_fd())
    }
}

impl Drop for UringQueue {
    fn drop(&mut self) {
        // The kernel may still be moving data into guest memory or our buffers: wait
        // until it hands back every SQE it has.
        let _ = self.ring.submit();
        while self.in_kernel > 0 {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => {
                    error!(path = %self.sh.path.display(), "io_uring wait failed while closing a queue: {e}");
                    // Better to leak the buffers than to free memory the kernel may
                    // still write.
                    std::mem::forget(std::mem::take(&mut self.reqs));
                    std::mem::forget(std::mem::take(&mut self.iovs));
                    std::mem::forget(self.trash.take());
                    std::mem::forget(self.sh.clone());
                    return;
                }
            }
            let n = self.ring.completion().count();
            self.in_kernel = self.in_kernel.saturating_sub(n as u32);
        }
        // Nothing is in flight: let go of the registered files now. A ring's
        // files are otherwise released by the kernel after its descriptor is
        // closed, in its own time, and the file's lock with them: a namespace
        // removed (or a server stopped) would hold its image for a moment more,
        // and refuse the next server that opens it.
        let _ = self.ring.submitter().unregister_files();
    }
}
