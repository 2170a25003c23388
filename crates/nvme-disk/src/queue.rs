//! A queue: one downstream I/O queue pair driven by the thread that opened it, without
//! locks. It keeps the front's requests and the downstream commands ("pieces") each
//! became, fails everything with `NotReady` once the downstream is gone, and on drop
//! waits (bounded) for its commands before it gives the pair back.
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

use block_backend::{BackendError, BackendQueue, Completion, DataBuf, Op, Request, SegmentMark};
use guest_mem::GuestMemory;
use nvme_driver::Completion as DrvCompletion;
use nvme_driver::IoQueue;
use rustix::event::epoll;
use tracing::warn;

use crate::backend::Shared;
use crate::lock;
use crate::map::MemView;
use crate::stats::bump;

/// The owner's wake-up descriptor: an epoll set holding the downstream interrupt
/// eventfd while requests are in flight.
#[derive(Debug)]
struct Notifier {
    epoll: OwnedFd,
    armed: bool,
}

/// A front request while it is in flight.
#[derive(Debug)]
struct Req {
    tag: u64,
    op: Op,
    offset: u64,
    len: u64,
    data: DataBuf,
    mem: GuestMemory,
    /// Units handed downstream so far (bytes; Flush has one unit).
    next: u64,
    end: u64,
    /// Where `next` lies in the guest segments.
    seg: SegmentMark,
    /// Pieces sent and not yet completed.
    outstanding: u32,
    pieces: u32,
    error: Option<BackendError>,
    /// Given up on by the owner (`revoke`): no more pieces, no copy back.
    revoked: bool,
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
    reqs: Vec<Option<Req>>,
    free_reqs: Vec<usize>,
    /// By command identifier.
    pieces: Vec<Option<Piece>>,
    pieces_in_flight: usize,
    /// Requests with pieces still to send, in arrival order.
    backlog: VecDeque<usize>,
    done: Vec<Completion>,
    /// Requests submitted and not yet reaped.
    in_flight: usize,
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
        let notifier = match (shared.poll, q.interrupt_fd().is_some()) {
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
            reqs: Vec::new(),
            free_reqs: Vec::new(),
            pieces: (0..depth).map(|_| None).collect(),
            pieces_in_flight: 0,
            backlog: VecDeque::new(),
            done: Vec::new(),
            in_flight: 0,
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

    fn finish(&mut self, r: usize) {
        let Some(req) = self.reqs[r].take() else { return };
        self.free_reqs.push(r);
        if matches!(req.error, Some(BackendError::NotReady(_))) {
            bump(&self.shared.stats.not_ready, 1);
        }
        if req.pieces > 1 {
            bump(&self.shared.stats.split_requests, 1);
        }
        self.done.push(Completion { tag: req.tag, result: req.error.map_or(Ok(()), Err), data: req.data });
    }

    /// Stops sending pieces of request `r` and records `e` (unless it already failed);
    /// it completes once its outstanding pieces have.
    fn fail_req(&mut self, r: usize, e: BackendError) {
        let Some(req) = self.reqs[r].as_mut() else { return };
        req.error.get_or_insert(e);
        req.next = req.end;
        if req.outstanding == 0 {
            self.finish(r);
        }
    }

    /// The downstream is gone: every request fails with NotReady, now and later.
    fn fail_all(&mut self, why: &str) {
        self.dead = true;
        for p in self.pieces.iter_mut().filter_map(Option::take) {
            if let Some(req) = self.reqs[p.req].as_mut() {
                req.outstanding -= 1;
            }
        }
        self.pieces_in_flight = 0;
        self.backlog.clear();
        for r in 0..self.reqs.len() {
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
        self.in_flight += 1;
        self.arm();
        bump(&self.shared.stats.requests, 1);
        self.check_health();
        let early = if self.dead {
            Some(BackendError::NotReady(self.shared.health.dead().unwrap_or("downstream gone").to_string()))
        } else {
            self.check(&req).err()
        };
        let end = match req.op {
            Op::Flush => 1,
            _ => req.len,
        };
        if early.is_some() || end == 0 {
            if matches!(early, Some(BackendError::NotReady(_))) {
                bump(&self.shared.stats.not_ready, 1);
            }
            self.done.push(Completion { tag: req.tag, result: early.map_or(Ok(()), Err), data: req.data });
            return;
        }
        let r = Req {
            tag: req.tag,
            op: req.op,
            offset: req.offset,
            len: req.len,
            data: req.data,
            mem: mem.clone(),
            next: 0,
            end,
            seg: SegmentMark::default(),
            outstanding: 0,
            pieces: 0,
            error: None,
            revoked: false,
        };
        let r = match self.free_reqs.pop() {
            Some(i) => {
                self.reqs[i] = Some(r);
                i
            }
            None => {
                self.reqs.push(Some(r));
                self.reqs.len() - 1
            }
        };
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
        if self.done.iter().any(|c| c.tag == tag) {
            return Some(true);
        }
        let r = self.reqs.iter().position(|q| q.as_ref().is_some_and(|q| q.tag == tag))?;
        // A piece whose PRPs point into guest memory is the downstream device's to
        // finish: it cannot be stopped from here.
        if self.pieces.iter().flatten().any(|p| p.req == r && p._view.is_some()) {
            return Some(false);
        }
        self.backlog.retain(|&b| b != r);
        let req = self.reqs[r].as_mut().expect("found");
        req.revoked = true;
        self.fail_req(r, BackendError::NotReady("given up on before it finished".into()));
        Some(true)
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
        let n = self.done.len();
        self.in_flight -= n;
        out.append(&mut self.done);
        if self.in_flight == 0 {
            self.disarm();
        }
        n
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn notifier(&self) -> Option<BorrowedFd<'_>> {
        self.notifier.as_ref().map(|n| n.epoll.as_fd())
    }
}

impl Drop for NvmeQueue {
    fn drop(&mut self) {
        // Commands still downstream may be moving guest memory: let them finish
        // (bounded) before the pair goes back to the backend.
        let deadline = Instant::now() + self.shared.timeout;
        if !self.dead {
            self.ring();
        }
        while self.pieces_in_flight > 0 && !self.dead && Instant::now() < deadline {
            self.check_health();
            if !self.dead && self.poll_cq() == 0 {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        self.in_flight = 0;
        self.disarm();
        let Some(mut q) = self.q.take() else { return };
        if self.pieces_in_flight == 0 && !self.dead {
            q.clear_interrupt();
            lock(&self.shared.free).push(q);
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
