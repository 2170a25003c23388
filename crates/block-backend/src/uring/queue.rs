//! One queue: a ring with the backing file registered, its eventfd, and the
//! requests in flight. `submit` fills the submission ring, `commit` makes one
//! `io_uring_enter`, `reap` drains the eventfd, then the completion ring; requests
//! beyond the queue depth wait in `pending`. Dropping a queue waits for every SQE
//! the kernel still holds.

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
use super::plan::copy_out;
use super::request::{Outcome, Slot};
use super::{sys, Shared, BOUNCE_KEEP_MAX, BOUNCE_POOL_MAX, BUF_ALIGN, REMOVAL_CHECK_PERIOD, TRASH_CHUNK};
use crate::{BackendError, BackendQueue, Completion, DataBuf, Request};

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
    /// Requests by ring user_data; `free` lists the empty slots.
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    used: usize,
    /// Requests waiting for room in the ring (new ones beyond the depth, and
    /// resubmissions after a partial transfer).
    pending: VecDeque<usize>,
    /// SQEs pushed and not yet completed.
    in_kernel: u32,
    /// Finished requests waiting for reap.
    done: Vec<Completion>,
    /// Scratch buffer SGL bit buckets read into; the kernel writes it, nobody reads it.
    pub(super) trash: Option<AlignedBuf>,
    bounce_pool: Vec<AlignedBuf>,
    iov_pool: Vec<Vec<IoVec>>,
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
        let align = sh.mem_align as usize;
        Ok(UringQueue {
            sh,
            ring,
            event,
            event_dirty: false,
            slots: Vec::new(),
            free: Vec::new(),
            used: 0,
            pending: VecDeque::new(),
            in_kernel: 0,
            done: Vec::new(),
            trash: Some(AlignedBuf::new(TRASH_CHUNK, align)),
            bounce_pool: Vec::new(),
            iov_pool: Vec::new(),
            ranges: Vec::new(),
            cqes: Vec::new(),
            last_check: Instant::now(),
        })
    }

    /// Completes a request without the kernel, and makes the notifier readable so an
    /// owner asleep on it comes to reap.
    fn finish_now(&mut self, tag: u64, result: Result<(), BackendError>, data: DataBuf) {
        self.done.push(Completion { tag, result, data });
        self.kick();
    }

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

    pub(super) fn take_iov(&mut self) -> Vec<IoVec> {
        self.iov_pool.pop().unwrap_or_default()
    }

    pub(super) fn get_bounce(&mut self, len: usize) -> AlignedBuf {
        let fit =
            self.bounce_pool.iter().enumerate().filter(|(_, b)| b.cap >= len).min_by_key(|(_, b)| b.cap);
        match fit.map(|(i, _)| i) {
            Some(i) => self.bounce_pool.swap_remove(i),
            None => {
                AlignedBuf::new(len.next_multiple_of(BUF_ALIGN).max(BUF_ALIGN), self.sh.mem_align as usize)
            }
        }
    }

    pub(super) fn put_bounce(&mut self, b: AlignedBuf) {
        if self.bounce_pool.len() < BOUNCE_POOL_MAX && b.cap <= BOUNCE_KEEP_MAX {
            self.bounce_pool.push(b);
        }
    }

    pub(super) fn recycle_iov(&mut self, mut iov: Vec<IoVec>) {
        iov.clear();
        if self.iov_pool.len() < 64 {
            self.iov_pool.push(iov);
        }
    }

    fn alloc_slot(&mut self, slot: Slot) -> usize {
        self.used += 1;
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        }
    }

    /// Moves waiting requests into the submission ring while fewer than the queue
    /// depth are with the kernel.
    fn fill(&mut self) {
        while self.in_kernel < self.sh.queue_depth {
            let Some(&idx) = self.pending.front() else { break };
            let Some(slot) = self.slots[idx].as_ref() else {
                self.pending.pop_front();
                continue;
            };
            let entry = slot.entry(idx);
            // Everything the entry points at lives in the slot until its CQE is reaped:
            // the vector array (`slot.iov`, not touched while the SQE is out), the
            // bounce buffer, a host buffer (`slot.data`), the guest mappings
            // (`slot.mem` keeps them mapped), and the per-queue scratch and shared zero
            // buffers, which outlive the ring (Drop waits for every SQE).
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
        let now = if self.sh.block_dev {
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
        let Some(slot) = self.slots.get_mut(idx).and_then(Option::as_mut) else {
            warn!("io_uring completion for unknown slot {idx}");
            return;
        };
        match slot.on_result(res) {
            Outcome::Again => self.pending.push_back(idx),
            Outcome::Done(result) => self.finish(idx, result),
            Outcome::Eof { done, len } => {
                let e = self.eof_error(done, len);
                self.finish(idx, Err(e));
            }
            Outcome::MoreZeroes => {
                let zeroes = self.zero_addr();
                let slot = self.slots[idx].as_mut().expect("live slot");
                fill_zero_iov(&mut slot.iov, zeroes, slot.len - slot.done);
                self.pending.push_back(idx);
            }
        }
    }

    fn finish(&mut self, idx: usize, mut result: Result<(), BackendError>) {
        let Some(mut slot) = self.slots[idx].take() else { return };
        if result.is_ok() {
            let (dsync, fsync) = slot.durability();
            let count = |c: &std::sync::atomic::AtomicU64, on: bool| {
                if on {
                    c.fetch_add(1, Ordering::Relaxed);
                }
            };
            count(&self.sh.dsync_writes, dsync);
            count(&self.sh.fsyncs, fsync);
        }
        self.free.push(idx);
        self.used -= 1;
        if slot.revoked {
            result = Err(BackendError::NotReady("given up on before it finished".into()));
            slot.data = DataBuf::None;
        }
        if let Some(b) = slot.bounce.take() {
            if result.is_ok() && slot.copy_out {
                result = copy_out(&slot.mem, &mut slot.data, b.slice(slot.len as usize));
            }
            self.put_bounce(b);
        }
        self.recycle_iov(std::mem::take(&mut slot.iov));
        self.done.push(Completion { tag: slot.tag, result, data: slot.data });
    }
}

impl BackendQueue for UringQueue {
    fn submit(&mut self, mem: &GuestMemory, mut req: Request) {
        match self.plan(mem, &mut req) {
            Ok(Some(mut slot)) => {
                slot.data = std::mem::replace(&mut req.data, DataBuf::None);
                let idx = self.alloc_slot(slot);
                self.pending.push_back(idx);
                self.fill();
            }
            Ok(None) => self.finish_now(req.tag, Ok(()), req.data),
            Err(e) => self.finish_now(req.tag, Err(e), req.data),
        }
    }

    fn commit(&mut self) {
        self.fill();
        self.flush();
    }

    fn revoke(&mut self, tag: u64) -> Option<bool> {
        if self.done.iter().any(|c| c.tag == tag) {
            return Some(true);
        }
        let idx = self.slots.iter().position(|s| s.as_ref().is_some_and(|s| s.tag == tag))?;
        let slot = self.slots[idx].as_mut().expect("found");
        // The kernel touches guest memory only through vectors into it: not when the
        // data goes through a bounce buffer, and not for steps that move none.
        let guest_io = slot.bounce.is_none() && matches!(slot.data, DataBuf::Guest(_));
        if let Some(p) = self.pending.iter().position(|&i| i == idx) {
            // Waiting for room in the ring, not in the kernel: it stops here.
            self.pending.remove(p);
            slot.revoked = true;
            self.finish(idx, Ok(()));
            self.kick();
            return Some(true);
        }
        if guest_io {
            return Some(false);
        }
        slot.revoked = true;
        slot.copy_out = false;
        Some(true)
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
        let n = self.done.len();
        out.append(&mut self.done);
        n
    }

    fn in_flight(&self) -> usize {
        self.used + self.done.len()
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
                    std::mem::forget(std::mem::take(&mut self.slots));
                    std::mem::forget(self.trash.take());
                    std::mem::forget(self.sh.clone());
                    return;
                }
            }
            let n = self.ring.completion().count();
            self.in_kernel = self.in_kernel.saturating_sub(n as u32);
        }
    }
}
