//! Completions: the notifier an owner sleeps on (the downstream interrupt eventfd,
//! in an epoll set only while requests are in flight), reaping the downstream CQ, and
//! finishing each piece — a downstream status passed through, a bounced read copied
//! back, the request completed when its last piece is.

use std::sync::atomic::Ordering;

use block_backend::Landed;
use nvme_driver::Completion as DrvCompletion;
use nvme_driver::IoQueue;
use rustix::event::epoll;
use tracing::{debug, warn};

use super::NvmeQueue;
use crate::bounce::stage_out;
use crate::error::{downstream_status, invalid};
use crate::stats::bump;

impl NvmeQueue {
    /// The queue has requests in flight: the interrupt eventfd joins the notifier,
    /// and the watcher keeps an eye on the controller.
    pub(super) fn arm(&mut self) {
        if self.busy {
            return;
        }
        self.busy = true;
        self.shared.health.busy.fetch_add(1, Ordering::SeqCst);
        let Some(n) = self.notifier.as_mut() else { return };
        let Some(fd) = self.q.as_ref().and_then(IoQueue::interrupt_fd) else { return };
        match epoll::add(&n.epoll, fd, epoll::EventData::new_u64(0), epoll::EventFlags::IN) {
            Ok(()) => n.armed = true,
            Err(e) => warn!("nvme backend: cannot watch the interrupt eventfd: {e}"),
        }
    }

    /// The queue went idle: the notifier is emptied, so an interrupt that arrives
    /// after the last completion was reaped cannot keep the owner awake.
    pub(super) fn disarm(&mut self) {
        if !self.busy {
            return;
        }
        self.busy = false;
        self.shared.health.busy.fetch_sub(1, Ordering::SeqCst);
        let Some(n) = self.notifier.as_mut().filter(|n| n.armed) else { return };
        if let Some(fd) = self.q.as_ref().and_then(IoQueue::interrupt_fd) {
            let _ = epoll::delete(&n.epoll, fd);
        }
        n.armed = false;
    }

    /// Takes every completion the downstream CQ holds; returns how many.
    pub(super) fn poll_cq(&mut self) -> usize {
        let mut comps = std::mem::take(&mut self.comps);
        let n = match self.q().poll_completions(&mut comps) {
            Ok(n) => {
                for c in comps.drain(..) {
                    self.complete_piece(c);
                }
                n
            }
            Err(e) => {
                comps.clear();
                self.transport_failed(e);
                0
            }
        };
        self.comps = comps;
        n
    }

    fn complete_piece(&mut self, c: DrvCompletion) {
        let Some(p) = self.pieces.get_mut(c.cid as usize).and_then(Option::take) else {
            debug!(cid = c.cid, "nvme backend: completion for no piece of ours ignored");
            return;
        };
        self.pieces_in_flight -= 1;
        // A request given up on completed then: this answer is swallowed.
        let Landed::Live(req) = self.reqs.landed(p.req, p._view.is_some()) else { return };
        let err = if !c.status.is_success() {
            bump(&self.shared.stats.errors, 1);
            Some(downstream_status(c.status))
        } else if p.copy_back {
            match &c.buf {
                Some(buf) => stage_out(req, p.off, p.len, p.seg, buf, &mut self.scratch).err(),
                None => Some(invalid("a read completed without its buffer".into())),
            }
        } else {
            None
        };
        if let Some(e) = err {
            req.fail(e);
            req.wire.next = req.wire.end;
        }
        if req.at_device() == 0 && req.wire.next >= req.wire.end {
            self.finish(p.req);
        }
    }
}
