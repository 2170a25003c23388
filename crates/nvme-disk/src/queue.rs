//! A queue: one downstream I/O queue pair driven by the thread that opened it, without
//! locks. It keeps the front's requests and the downstream commands ("pieces") each
//! became, fails everything with `NotReady` once the downstream is gone, and on drop
//! waits (bounded) for its commands before it gives the pair back.
//!
//! The requests are block_backend's in-flight core in its direct mode
//! (`Requests<Split>`): each command submitted is a piece sent, each completion a
//! piece landed. Revoke (`BackendQueue::revoke`): a request with a zero-copy piece
//! downstream cannot be stopped (`Some(false)`: the device may still move its data;
//! the piece's `MemView` keeps the guest memory DMA-mapped until it completes); any
//! other completes at once with NotReady and sends no more pieces, and its slot stays
//! held until its bounced pieces complete (their DMA buffers are the driver's until
//! then), whose answers are swallowed.
//!
//! - `submit`: checking a request, splitting it into downstream commands (zero copy
//!   or bounced), the backlog of pieces waiting for a slot, ringing the doorbell.
//! - `complete`: the notifier, reaping the downstream CQ, finishing pieces.

mod complete;
mod submit;

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use block_backend::{
    Admit, BackendError, BackendQueue, Completion, Op, Request, Requests, Revoked, SegmentMark,
};
use guest_mem::GuestMemory;
use nvme_driver::Completion as DrvCompletion;
use nvme_driver::IoQueue;
use rustix::event::epoll;
use tracing::warn;

use crate::lock;
use crate::map::MemView;
use crate::shared::Shared;
use crate::stats::bump;

/// The owner's wake-up descriptor: an epoll set holding the downstream interrupt
/// eventfd while requests are in flight.
#[derive(Debug)]
struct Notifier {
    epoll: OwnedFd,
    armed: bool,
}

/// What the queue keeps for a front request in flight, in its slot of the in-flight
/// core (whose `Pending` holds the tag, the range, the data, the guest memory, the
/// first error and the pieces downstream): how far it has been split.
#[derive(Debug)]
struct Split {
    /// Units handed downstream so far (bytes; Flush has one unit).
    next: u64,
    end: u64,
    /// Where `next` lies in the guest segments.
    seg: SegmentMark,
    /// Pieces sent in all.
    pieces: u32,
}

/// One downstream command of a request.
#[derive(Debug)]
struct Piece {
    req: usize,
    /// Byte range of the request this piece moves.
    off: u64,
    len: u64,
    seg: SegmentMark,
    /// A bounced read: copy the returned buffer into the request's data.
    copy_back: bool,
    /// Keeps the guest memory the PRPs point into mapped (zero copy).
    _view: Option<Arc<MemView>>,
}

/// What became of an attempt to send a piece.
enum Step {
    Sent,
    /// No downstream slot or DMA buffer now: retry when completions free some.
    Blocked,
    Failed(BackendError),
}

/// One downstream I/O queue pair, owned by the thread that opened it.
#[derive(Debug)]
pub(crate) struct NvmeQueue {
    /// Always `Some` until drop hands the pair back.
    q: Option<IoQueue>,
    shared: Arc<Shared>,
    notifier: Option<Notifier>,
    /// The view of the last guest memory snapshot seen.
    view: Option<Arc<MemView>>,
    /// Front requests by slot (the in-flight core, direct mode).
    reqs: Requests<Split>,
    /// By command identifier.
    pieces: Vec<Option<Piece>>,
    pieces_in_flight: usize,
    /// Requests with pieces still to send, in arrival order.
    backlog: VecDeque<usize>,
    comps: Vec<DrvCompletion>,
    segs: Vec<(u64, u64)>,
    scratch: Vec<u8>,
    dead: bool,
    /// Counted in `Health::busy` (requests in flight).
    busy: bool,
}

impl NvmeQueue {
    /// A queue over `q`, a pair taken from the backend (given back on drop).
    pub(crate) fn new(q: IoQueue, shared: Arc<Shared>) -> io::Result<Self> {
        let notifier = match (shared.queues.poll, q.interrupt_fd().is_some()) {
            (false, true) => {
                Some(Notifier { epoll: epoll::create(epoll::CreateFlags::CLOEXEC)?, armed: false })
            }
            _ => None,
        };
        let depth = q.depth() as usize;
        Ok(NvmeQueue {
            q: Some(q),
            shared,
            notifier,
            view: None,
            reqs: Requests::direct(),
            pieces: (0..depth).map(|_| None).collect(),
            pieces_in_flight: 0,
            backlog: VecDeque::new(),
            comps: Vec::new(),
            segs: Vec::new(),
            scratch: Vec::new(),
            dead: false,
            busy: false,
        })
    }

    fn q(&mut self) -> &mut IoQueue {
        self.q.as_mut().expect("queue present until drop")
    }

    /// Counts how a request ended (`pieces` sent; NotReady or not).
    fn count_end(&self, pieces: u32, not_ready: bool) {
        if not_ready {
            bump(&self.shared.stats.not_ready, 1);
        }
        if pieces > 1 {
            bump(&self.shared.stats.split_requests, 1);
        }
    }

    fn finish(&mut self, r: usize) {
        let Some(req) = self.reqs.get(r) else { return };
        self.count_end(req.wire.pieces, matches!(req.error(), Some(BackendError::NotReady(_))));
        self.reqs.finish(r);
    }

    /// Stops sending pieces of request `r` and records `e` (unless it already failed);
    /// it completes once its pieces downstream have.
    fn fail_req(&mut self, r: usize, e: BackendError) {
        // A request given up on has completed; its held slot frees itself.
        let Some(req) = self.reqs.get_mut(r).filter(|q| !q.revoked()) else { return };
        req.fail(e);
        req.wire.next = req.wire.end;
        if req.at_device() == 0 {
            self.finish(r);
        }
    }

    /// The downstream is gone: every request fails with NotReady, now and later.
    fn fail_all(&mut self, why: &str) {
        self.dead = true;
        // Its commands will not complete: they are as good as landed.
        for p in self.pieces.iter_mut().filter_map(Option::take) {
            let _ = self.reqs.landed(p.req, p._view.is_some());
        }
        self.pieces_in_flight = 0;
        self.backlog.clear();
        for r in self.reqs.slots() {
            self.fail_req(r, BackendError::NotReady(why.to_string()));
        }
    }

    fn transport_failed(&mut self, e: impl std::fmt::Display) {
        self.shared.health.declare_dead(format!("transport: {e}"));
        let why = self.shared.health.dead().unwrap_or("transport failure").to_string();
        self.fail_all(&why);
    }

    /// Fails everything if another queue or the watcher found the downstream gone.
    fn check_health(&mut self) {
        if !self.dead {
            if let Some(why) = self.shared.health.dead() {
                let why = why.to_string();
                self.fail_all(&why);
            }
        }
    }
}

impl BackendQueue for NvmeQueue {
    fn submit(&mut self, mem: &GuestMemory, req: Request) {
        self.arm();
        bump(&self.shared.stats.requests, 1);
        self.check_health();
        let checked = if self.dead {
            Err(BackendError::NotReady(self.shared.health.dead().unwrap_or("downstream gone").to_string()))
        } else {
            self.check(&req)
        };
        if matches!(checked, Err(BackendError::NotReady(_))) {
            bump(&self.shared.stats.not_ready, 1);
        }
        let end = match req.op {
            Op::Flush => 1,
            _ => req.len,
        };
        let planned = checked
            .map(|()| (end > 0).then(|| Split { next: 0, end, seg: SegmentMark::default(), pieces: 0 }));
        // The wire has FUA (the command's FUA bit): a FUA write is not followed by a flush.
        let Admit::Slot(r) = self.reqs.admit(mem, req, planned, false) else { return };
        if self.backlog.is_empty() && self.drive(r) {
            return;
        }
        bump(&self.shared.stats.backlogged, 1);
        self.backlog.push_back(r);
        self.pump();
    }

    fn commit(&mut self) {
        if !self.dead {
            self.ring();
        }
    }

    fn revoke(&mut self, tag: u64) -> Option<bool> {
        // A piece whose PRPs point into guest memory is the downstream device's to
        // finish: the core refuses while one is out.
        match self.reqs.give_up(tag) {
            Revoked::Given { slot, freed } => {
                // No more of its pieces go down.
                self.backlog.retain(|&b| b != slot);
                let pieces = match freed {
                    Some(split) => split.pieces,
                    None => self.reqs.get(slot).map_or(0, |q| q.wire.pieces),
                };
                self.count_end(pieces, true);
                Some(true)
            }
            r => r.answer(),
        }
    }

    fn memory_changed(&mut self, mem: &GuestMemory) {
        // Our cached view may hold regions the guest took away: commands in flight
        // keep the view they use; the next submission takes the current one.
        self.view = None;
        self.shared.maps.follow(mem);
    }

    fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        self.check_health();
        if !self.dead {
            // The interrupt eventfd is reset only when the CQ has nothing new, then
            // the CQ is looked at once more (a completion posted in between has its
            // interrupt after the reset): owners that call reap in a loop do not pay
            // a system call per look, and a level-triggered owner never sleeps on a
            // completion. A completion found without resetting may leave the eventfd
            // set: one spare wake-up, which finds nothing, resets it and sleeps.
            if self.poll_cq() == 0 && self.notifier.is_some() && self.q().clear_interrupt() {
                self.poll_cq();
            }
            if !self.dead {
                self.pump();
                self.ring();
            }
        }
        let n = self.reqs.reap(out);
        if self.reqs.in_flight() == 0 {
            self.disarm();
        }
        n
    }

    fn in_flight(&self) -> usize {
        self.reqs.in_flight()
    }

    fn notifier(&self) -> Option<BorrowedFd<'_>> {
        self.notifier.as_ref().map(|n| n.epoll.as_fd())
    }
}

impl Drop for NvmeQueue {
    fn drop(&mut self) {
        // Commands still downstream may be moving guest memory: let them finish
        // (bounded) before the pair goes back to the backend.
        let deadline = Instant::now() + self.shared.queues.timeout;
        if !self.dead {
            self.ring();
        }
        while self.pieces_in_flight > 0 && !self.dead && Instant::now() < deadline {
            self.check_health();
            if !self.dead && self.poll_cq() == 0 {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        self.disarm();
        let Some(mut q) = self.q.take() else { return };
        if self.pieces_in_flight == 0 && !self.dead {
            q.clear_interrupt();
            self.shared.pairs.give_back(q);
        } else {
            warn!(
                "{}: a dropped queue still has {} command(s) downstream; its queue pair is retired",
                self.shared.target, self.pieces_in_flight
            );
            // Kept with the driver so the memory it may still reach outlives it.
            if let Some(d) = lock(&self.shared.driver).as_mut() {
                d.return_queue(q);
            }
        }
    }
}
