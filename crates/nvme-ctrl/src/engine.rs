//! The I/O engine: owns I/O completion and submission queues, their backend queues and
//! their interrupt state, and moves commands through them.
//!
//! An engine has one owner and takes no locks on its hot path. The controller drives
//! one engine inline today; a transport with worker threads gives each thread its own
//! engine and the queues assigned to it (see `vnvme-q*` threads in the vfio-user
//! server). Everything the admin side asks of an engine is a method call here.

use std::sync::Arc;

use block_backend::{BackendError, BackendQueue, Completion, DataBuf, Op, Segment};
use guest_mem::GuestMemory;
use nvme_spec::aer::{error_info, AsyncEvent, EventType};
use nvme_spec::log::{critical_warning, lid};
use nvme_spec::regs::DoorbellKind;
use nvme_spec::{Cqe, Sqe, Status};
use tracing::warn;
use zerocopy::little_endian::{U16, U32};

use crate::doorbell::ShadowBuffers;
use crate::events::Events;
use crate::interrupt::{Clock, Coalescing, InterruptSink, VectorState};
use crate::namespace::Namespace;
use crate::queue::{CompletionQueue, SubmissionQueue};
use crate::stats::Stats;

/// Shared, read-mostly context an engine is built with.
#[derive(Clone, Debug)]
pub struct EngineContext {
    pub namespaces: Arc<[Arc<Namespace>]>,
    pub irq: Arc<dyn InterruptSink>,
    pub clock: Arc<dyn Clock>,
    pub stats: Arc<Stats>,
    pub events: Arc<Events>,
    pub max_qid: u16,
    pub vectors: u16,
    /// CAP.DSTRD.
    pub dstrd: u8,
    /// Some namespace's backend deallocates natively: Dataset Management is in ONCS.
    pub dsm: bool,
    /// Some namespace's backend writes zeroes natively: Write Zeroes is in ONCS.
    pub write_zeroes: bool,
    /// Set by any engine that hit a fault it cannot report per command; the controller
    /// turns it into CSTS.CFS.
    pub fatal: Arc<std::sync::atomic::AtomicBool>,
}

/// What an in-flight command does when its backend requests finish.
#[derive(Debug)]
pub(crate) enum Finish {
    /// Complete with the collected status.
    Plain,
    /// Compare the data read (a host buffer) with these guest segments.
    Compare(Vec<Segment>),
}

/// A command whose backend requests have not all completed.
#[derive(Debug)]
pub(crate) struct InFlight {
    pub sqid: u16,
    pub cid: u16,
    pub nsid: u32,
    pub slba: u64,
    /// Backend requests still outstanding.
    pub remaining: u32,
    pub status: Status,
    /// What the backend requests do (all of one command's requests do the same).
    pub op: Op,
    pub finish: Finish,
}

impl InFlight {
    /// A command about to hand `remaining` requests doing `op` to a backend.
    pub(crate) fn new(
        sqid: u16,
        cid: u16,
        nsid: u32,
        slba: u64,
        op: Op,
        remaining: u32,
        finish: Finish,
    ) -> Self {
        InFlight { sqid, cid, nsid, slba, remaining, status: Status::SUCCESS, op, finish }
    }
}

/// Why the engine cannot go on: the controller sets Controller Fatal Status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fatal(pub String);

/// The I/O side of a controller.
#[derive(Debug)]
pub struct IoEngine {
    pub(crate) ctx: EngineContext,
    pub(crate) mem: GuestMemory,
    sqs: Vec<Option<SubmissionQueue>>,
    cqs: Vec<Option<CompletionQueue>>,
    /// Identifiers of existing SQs, ascending: the arbitration order.
    active_sqs: Vec<u16>,
    rr_next: usize,
    shadow: Option<ShadowBuffers>,
    /// One backend queue per namespace, indexed by nsid - 1.
    pub(crate) backends: Vec<Box<dyn BackendQueue>>,
    inflight: Vec<Option<InFlight>>,
    free_tags: Vec<u32>,
    pub(crate) reaped: Vec<Completion>,
    pub(crate) seg_pool: Vec<Vec<Segment>>,
    /// A doorbell page mapped into the guest (BAR0 0x1000..), polled for doorbell
    /// values the guest stores with no exit; addressed by BAR0 offset.
    doorbell_page: Option<GuestMemory>,
    /// Last value seen in each doorbell page slot: [sq tail, cq head] per queue.
    page_seen: Vec<[u32; 2]>,
    /// Admin commands fetched from SQ 0, for the admin side to execute.
    pub(crate) admin_inbox: Vec<Sqe>,
    vectors: Vec<VectorState>,
    pub(crate) coalescing: Coalescing,
    /// Arbitration Burst: commands taken from one SQ per turn (None = no limit).
    pub(crate) burst: Option<u32>,
    pub(crate) page_size: u64,
    pub(crate) mdts_bytes: u64,
    /// Volatile Write Cache enabled (writes need not be durable until Flush).
    pub(crate) write_cache: bool,
    /// When false, a poller is spinning and EventIdx is left stale so the host does
    /// not ring; when true, emptied SQs re-arm EventIdx.
    pub arm_eventidx: bool,
    fatal: Option<Fatal>,
}

/// How many commands one `poll` takes at most, so a busy guest cannot starve the
/// caller's other work (admin queue, timers).
const POLL_BUDGET: u32 = 512;

impl IoEngine {
    pub fn new(ctx: EngineContext, mem: GuestMemory) -> std::io::Result<Self> {
        let backends = ctx.namespaces.iter().map(|ns| ns.backend.open_queue()).collect::<Result<_, _>>()?;
        let n = ctx.max_qid as usize + 1;
        Ok(IoEngine {
            sqs: (0..n).map(|_| None).collect(),
            cqs: (0..n).map(|_| None).collect(),
            active_sqs: Vec::new(),
            rr_next: 0,
            shadow: None,
            backends,
            inflight: Vec::new(),
            free_tags: Vec::new(),
            reaped: Vec::new(),
            seg_pool: Vec::new(),
            admin_inbox: Vec::new(),
            doorbell_page: None,
            page_seen: vec![[0; 2]; n],
            vectors: vec![VectorState::default(); ctx.vectors as usize],
            coalescing: Coalescing::default(),
            burst: None,
            page_size: 4096,
            mdts_bytes: 1 << 20,
            write_cache: true,
            arm_eventidx: true,
            fatal: None,
            mem,
            ctx,
        })
    }

    pub fn set_memory(&mut self, mem: GuestMemory) {
        self.mem = mem;
    }

    /// The reason the engine stopped, if it hit a fault it cannot report per command.
    pub fn fatal(&self) -> Option<&Fatal> {
        self.fatal.as_ref()
    }

    fn set_fatal(&mut self, why: String) {
        warn!(target: "vnvme::guest", "controller fatal: {why}");
        if self.fatal.is_none() {
            self.fatal = Some(Fatal(why));
        }
        self.ctx.fatal.store(true, std::sync::atomic::Ordering::Release);
    }

    // ---- queue management (called by the admin side after it validated the command)

    pub fn sq_exists(&self, qid: u16) -> bool {
        self.sqs.get(qid as usize).is_some_and(|q| q.is_some())
    }

    pub fn cq_exists(&self, qid: u16) -> bool {
        self.cqs.get(qid as usize).is_some_and(|q| q.is_some())
    }

    /// Number of SQs posting to CQ `qid`.
    pub fn cq_users(&self, qid: u16) -> u32 {
        self.cqs.get(qid as usize).and_then(|q| q.as_ref()).map_or(0, |q| q.sq_count)
    }

    pub fn create_cq(&mut self, qid: u16, base: u64, size: u32, ien: bool, iv: u16) {
        self.cqs[qid as usize] = Some(CompletionQueue::new(qid, base, size, ien, iv));
        self.clear_page_slot(qid, DoorbellKind::CqHead);
        self.init_shadow_slots(qid, DoorbellKind::CqHead, 0);
    }

    pub fn create_sq(&mut self, qid: u16, cqid: u16, base: u64, size: u32) {
        self.sqs[qid as usize] = Some(SubmissionQueue::new(qid, cqid, base, size));
        self.clear_page_slot(qid, DoorbellKind::SqTail);
        if let Some(cq) = self.cqs[cqid as usize].as_mut() {
            cq.sq_count += 1;
        }
        let pos = self.active_sqs.partition_point(|&q| q < qid);
        self.active_sqs.insert(pos, qid);
        self.init_shadow_slots(qid, DoorbellKind::SqTail, 0);
    }

    /// Deletes an SQ after every command fetched from it has completed (Base §5.2.4
    /// Delete I/O Submission Queue: the Delete completes after outstanding commands are completed or aborted).
    pub fn delete_sq(&mut self, qid: u16) {
        let mut spins = 0u32;
        while self.sqs[qid as usize].as_ref().is_some_and(|q| q.in_flight > 0) {
            self.reap();
            spins += 1;
            if spins.is_multiple_of(1024) {
                std::thread::yield_now();
            }
        }
        if let Some(sq) = self.sqs[qid as usize].take() {
            if let Some(cq) = self.cqs[sq.cqid as usize].as_mut() {
                cq.sq_count -= 1;
            }
        }
        self.active_sqs.retain(|&q| q != qid);
    }

    /// Queue parameters, for the admin side's checks.
    pub fn sq_info(&self, qid: u16) -> Option<(u16, u32)> {
        self.sqs.get(qid as usize)?.as_ref().map(|q| (q.cqid, q.in_flight))
    }

    pub fn delete_cq(&mut self, qid: u16) {
        self.cqs[qid as usize] = None;
    }

    /// Drops every I/O queue (controller reset), letting in-flight requests finish.
    pub fn reset(&mut self) {
        for qid in self.active_sqs.clone() {
            self.delete_sq(qid);
        }
        if self.doorbell_page.is_some() {
            for qid in 0..=self.ctx.max_qid {
                self.clear_page_slot(qid, DoorbellKind::SqTail);
                self.clear_page_slot(qid, DoorbellKind::CqHead);
            }
        }
        for q in self.cqs.iter_mut() {
            *q = None;
        }
        self.shadow = None;
        self.vectors.iter_mut().for_each(|v| *v = VectorState::default());
        self.coalescing = Coalescing::default();
        self.burst = None;
        self.arm_eventidx = true;
        self.fatal = None;
    }

    pub fn set_vector_coalescing_disabled(&mut self, iv: u16, disabled: bool) {
        if let Some(v) = self.vectors.get_mut(iv as usize) {
            v.coalescing_disabled = disabled;
        }
    }

    pub fn vector_coalescing_disabled(&self, iv: u16) -> bool {
        self.vectors.get(iv as usize).is_some_and(|v| v.coalescing_disabled)
    }

    // ---- shadow doorbells

    /// Attaches Doorbell Buffer Config buffers to every existing I/O queue.
    ///
    /// For each queue the shadow slot either already holds the host's current value
    /// or stale bytes. Linux 6.1 restarts its I/O queues after a reset *before* it
    /// sends Doorbell Buffer Config, writing shadow tails (and ringing only on the
    /// first submission, since EventIdx reads 0): there the shadow slot is newer than
    /// anything we trapped, and overwriting it would strand those commands. So a
    /// queue the host has already rung adopts a valid shadow value; any other queue
    /// gets our value written into its slot, so a zeroed or stale buffer is never
    /// read as new work. EventIdx is then published for each queue.
    pub fn attach_shadow(&mut self, buffers: ShadowBuffers) {
        if let Some(old) = self.shadow {
            // Replacing buffers in use: the host's latest values are in the old ones.
            // Pick them up, then carry them into the new slots.
            for qid in self.active_sqs.clone() {
                self.refresh_sq_tail(qid, old);
            }
            for qid in 0..=self.ctx.max_qid {
                if self.cqs[qid as usize].is_some() {
                    self.refresh_cq_head(qid);
                }
            }
            self.shadow = Some(buffers);
            for qid in 0..=self.ctx.max_qid {
                if let Some(t) = self.sqs[qid as usize].as_ref().map(|q| q.tail) {
                    self.init_shadow_slots(qid, DoorbellKind::SqTail, t);
                }
                if let Some(h) = self.cqs[qid as usize].as_ref().map(|q| q.head) {
                    self.init_shadow_slots(qid, DoorbellKind::CqHead, h);
                }
            }
            return;
        }
        self.shadow = Some(buffers);
        for qid in 0..=self.ctx.max_qid {
            if let Some(sq) = self.sqs[qid as usize].as_ref() {
                let (tail, size, rung) = (sq.tail, sq.size, sq.rung && qid != 0);
                let adopt = match buffers.load(&self.mem, qid, DoorbellKind::SqTail) {
                    // Never adopt a value behind our own tail: that is a stale or zeroed
                    // slot, and adopting it would fetch old entries as new commands.
                    Ok(v) => rung && v < size && v >= tail,
                    Err(_) => false,
                };
                let head = sq.head;
                self.sqs[qid as usize].as_mut().expect("exists").eventidx = None;
                if adopt {
                    // Leave the host's value; EventIdx = what we consumed.
                    if let Err(e) = buffers.publish(&self.mem, qid, DoorbellKind::SqTail, head) {
                        self.set_fatal(format!("shadow doorbell buffer inaccessible: {e}"));
                    }
                } else {
                    self.init_shadow_slots(qid, DoorbellKind::SqTail, tail);
                }
            }
            if let Some(cq) = self.cqs[qid as usize].as_ref() {
                let head = cq.head;
                let adopt = match buffers.load(&self.mem, qid, DoorbellKind::CqHead) {
                    Ok(v) => qid != 0 && cq.valid_head(v),
                    Err(_) => false,
                };
                if adopt {
                    self.refresh_cq_head(qid);
                    let h = self.cqs[qid as usize].as_ref().expect("exists").head;
                    let ei = self.cq_idle_eventidx(qid, h);
                    if let Err(e) = buffers.publish(&self.mem, qid, DoorbellKind::CqHead, ei) {
                        self.set_fatal(format!("shadow doorbell buffer inaccessible: {e}"));
                    }
                } else {
                    self.init_shadow_slots(qid, DoorbellKind::CqHead, head);
                }
            }
        }
    }

    pub fn shadow(&self) -> Option<ShadowBuffers> {
        self.shadow
    }

    fn init_shadow_slots(&mut self, qid: u16, kind: DoorbellKind, v: u32) {
        let Some(b) = self.shadow else { return };
        let ei = match kind {
            DoorbellKind::SqTail => v,
            DoorbellKind::CqHead => self.cq_idle_eventidx(qid, v),
        };
        if kind == DoorbellKind::SqTail {
            if let Some(sq) = self.sqs[qid as usize].as_mut() {
                sq.eventidx = None;
            }
        }
        let r = b.store_shadow(&self.mem, qid, kind, v).and_then(|_| b.publish(&self.mem, qid, kind, ei));
        if let Err(e) = r {
            self.set_fatal(format!("shadow doorbell buffer became inaccessible: {e}"));
        }
    }

    /// The CQ EventIdx when the controller needs no ring: one entry behind the head.
    fn cq_idle_eventidx(&self, qid: u16, head: u32) -> u32 {
        let size = self.cqs[qid as usize].as_ref().map_or(1, |q| q.size);
        (head + size - 1) % size
    }

    // ---- doorbells

    /// A trapped doorbell register write for I/O queue `qid`.
    pub fn doorbell(&mut self, qid: u16, kind: DoorbellKind, value: u32) {
        Stats::add(&self.ctx.stats.doorbell_writes, 1);
        if qid != 0 {
            Stats::add(&self.ctx.stats.io_doorbell_writes, 1);
            if kind == DoorbellKind::CqHead {
                Stats::add(&self.ctx.stats.io_cq_doorbell_writes, 1);
            }
        }
        self.apply_doorbell(qid, kind, value);
    }

    /// Uses a mapped doorbell page (or stops using one).
    pub fn set_doorbell_page(&mut self, page: Option<GuestMemory>) {
        self.doorbell_page = page;
        self.page_seen.iter_mut().for_each(|s| *s = [0; 2]);
    }

    fn page_slot(&self, qid: u16, kind: DoorbellKind) -> u64 {
        nvme_spec::regs::offset::DOORBELL_BASE + nvme_spec::regs::doorbell_offset(qid, kind, self.ctx.dstrd)
    }

    /// Picks up a value the guest stored in the mapped doorbell page, as if it had been
    /// a trapped write (without counting it as one). With shadow doorbells the shadow
    /// slot is the source for I/O queues, but the admin queue's value only ever
    /// arrives here (hosts never write its shadow slot).
    fn sync_page(&mut self, qid: u16, kind: DoorbellKind) {
        let Some(page) = &self.doorbell_page else { return };
        if self.shadow.is_some() && qid != 0 {
            return;
        }
        let Ok(v) = page.load_u32(self.page_slot(qid, kind)) else { return };
        let seen = &mut self.page_seen[qid as usize][kind as usize];
        if *seen == v {
            return;
        }
        *seen = v;
        self.apply_doorbell(qid, kind, v);
    }

    /// Zeroes a queue's doorbell page slot (queue created or controller reset), so a
    /// value left by an earlier queue is not read as new work.
    fn clear_page_slot(&mut self, qid: u16, kind: DoorbellKind) {
        let slot = self.page_slot(qid, kind);
        if let Some(page) = &self.doorbell_page {
            let _ = page.store_u32(slot, 0);
        }
        if let Some(s) = self.page_seen.get_mut(qid as usize) {
            s[kind as usize] = 0;
        }
    }

    fn apply_doorbell(&mut self, qid: u16, kind: DoorbellKind, value: u32) {
        let (exists, valid) = match kind {
            // With shadow doorbells an I/O queue's tail may already be newer than this
            // (late) register value, so only the ring bounds apply to it; the shadow
            // value gets the full check when it is read.
            DoorbellKind::SqTail => match self.sqs.get(qid as usize).and_then(|q| q.as_ref()) {
                Some(sq) if self.shadow.is_some() && qid != 0 => (true, value < sq.size),
                Some(sq) => (true, sq.valid_tail(value)),
                None => (false, false),
            },
            // Likewise a late CQ head register write may be older than the head already
            // taken from the shadow slot.
            DoorbellKind::CqHead => match self.cqs.get(qid as usize).and_then(|q| q.as_ref()) {
                Some(cq) if self.shadow.is_some() && qid != 0 => (true, value < cq.size),
                Some(cq) => (true, cq.valid_head(value)),
                None => (false, false),
            },
        };
        if !exists {
            self.doorbell_error(error_info::INVALID_DOORBELL_REGISTER, qid, kind, value);
            return;
        }
        if !valid {
            self.doorbell_error(error_info::INVALID_DOORBELL_WRITE_VALUE, qid, kind, value);
            return;
        }
        // Hosts never write the admin queue's shadow slots: copy the trapped value there
        // so the shadow is right for every queue (see doorbell.rs).
        if let (0, Some(b)) = (qid, self.shadow) {
            if let Err(e) = b.store_shadow(&self.mem, 0, kind, value) {
                self.set_fatal(format!("shadow doorbell buffer inaccessible: {e}"));
                return;
            }
        }
        // With shadow doorbells the shadow slot already holds this value or a newer
        // one (the host writes it first), so the trapped value only wakes us up.
        if self.shadow.is_some() && qid != 0 {
            match kind {
                DoorbellKind::SqTail => self.sqs[qid as usize].as_mut().expect("checked").rung = true,
                // The host rang because it made room we asked for. Drain here rather
                // than only when servicing an SQ: the CQ may have no SQ left.
                DoorbellKind::CqHead => {
                    if self.cqs[qid as usize].as_ref().is_some_and(|cq| !cq.overflow.is_empty()) {
                        self.drain_overflow(qid);
                    }
                }
            }
            return;
        }
        match kind {
            DoorbellKind::SqTail => {
                let sq = self.sqs[qid as usize].as_mut().expect("checked");
                sq.tail = value;
                sq.rung = true;
            }
            DoorbellKind::CqHead => {
                self.cqs[qid as usize].as_mut().expect("checked").head = value;
                self.drain_overflow(qid);
            }
        }
    }

    fn doorbell_error(&mut self, info: u8, qid: u16, kind: DoorbellKind, value: u32) {
        warn!(target: "vnvme::guest", ?kind, qid, value, "invalid doorbell write (event info {info:#x})");
        self.ctx.events.raise(AsyncEvent {
            kind: EventType::ErrorStatus,
            info,
            log_page: lid::ERROR_INFORMATION,
        });
    }

    // ---- the data path

    /// Does whatever work is ready: reaps backend completions, fetches and starts new
    /// commands (round robin with the arbitration burst), posts completions and
    /// signals interrupts. Returns true if it did anything.
    pub fn poll(&mut self) -> bool {
        if self.fatal.is_some() {
            return false;
        }
        let mut progress = self.reap();
        let mut budget = POLL_BUDGET;
        let mut idle_turns = 0;
        while budget > 0 && !self.active_sqs.is_empty() && idle_turns < self.active_sqs.len() {
            if self.rr_next >= self.active_sqs.len() {
                self.rr_next = 0;
            }
            let qid = self.active_sqs[self.rr_next];
            self.rr_next += 1;
            let limit = self.burst.unwrap_or(u32::MAX).min(budget);
            let n = self.service_sq(qid, limit);
            if n == 0 {
                idle_turns += 1;
            } else {
                idle_turns = 0;
                budget -= n;
                progress = true;
            }
            if self.fatal.is_some() {
                return true;
            }
        }
        progress |= self.reap();
        self.signal_interrupts();
        progress
    }

    /// Fetches and starts up to `limit` commands from one SQ. Returns how many.
    fn service_sq(&mut self, qid: u16, limit: u32) -> u32 {
        let Some(sq) = self.sqs[qid as usize].as_ref() else { return 0 };
        let cqid = sq.cqid;
        // Back-pressure: while the CQ has completions waiting for room, fetch nothing.
        if self.cqs[cqid as usize].as_ref().is_some_and(|cq| !cq.overflow.is_empty()) {
            self.drain_overflow(cqid);
            if self.cqs[cqid as usize].as_ref().is_some_and(|cq| !cq.overflow.is_empty()) {
                return 0;
            }
        }
        self.sync_page(qid, DoorbellKind::SqTail);
        if let Some(b) = self.shadow {
            if !self.refresh_sq_tail(qid, b) {
                return 0;
            }
        }
        let mut done = 0;
        loop {
            while done < limit {
                let sq = self.sqs[qid as usize].as_mut().expect("exists");
                if sq.is_empty() {
                    break;
                }
                let sqe = match sq.fetch(&self.mem) {
                    Ok(s) => s,
                    Err(e) => {
                        self.set_fatal(format!("cannot fetch from SQ {qid}: {e}"));
                        return done;
                    }
                };
                sq.in_flight += 1;
                done += 1;
                if qid == 0 {
                    self.admin_inbox.push(sqe);
                } else {
                    self.execute(qid, sqe);
                }
            }
            if done >= limit || !self.arm_eventidx {
                return done;
            }
            // Empty: re-arm EventIdx, then look again (see doorbell.rs).
            let Some(b) = self.shadow else { return done };
            let head = self.sqs[qid as usize].as_ref().expect("exists").head;
            Stats::add(&self.ctx.stats.shadow_reads, 1);
            match b.rearm(&self.mem, qid, DoorbellKind::SqTail, head) {
                Ok(t) if t == head => return done,
                Ok(t) if self.sqs[qid as usize].as_ref().expect("exists").valid_tail(t) => {
                    Stats::add(&self.ctx.stats.eventidx_races, 1);
                    let sq = self.sqs[qid as usize].as_mut().expect("exists");
                    sq.tail = t;
                    sq.reported_bad_tail = None;
                }
                Ok(t) => {
                    self.bad_shadow_tail(qid, t);
                    return done;
                }
                Err(e) => {
                    self.set_fatal(format!("shadow doorbell buffer inaccessible: {e}"));
                    return done;
                }
            }
        }
    }

    /// Reads SQ `qid`'s shadow tail. False if it is invalid (the event is raised and
    /// the queue is left alone until the host writes a valid value).
    fn refresh_sq_tail(&mut self, qid: u16, b: ShadowBuffers) -> bool {
        Stats::add(&self.ctx.stats.shadow_reads, 1);
        match b.load(&self.mem, qid, DoorbellKind::SqTail) {
            Ok(t) => {
                let sq = self.sqs[qid as usize].as_mut().expect("exists");
                if sq.valid_tail(t) {
                    sq.tail = t;
                    sq.reported_bad_tail = None;
                    true
                } else {
                    self.bad_shadow_tail(qid, t);
                    false
                }
            }
            Err(e) => {
                self.set_fatal(format!("shadow doorbell buffer inaccessible: {e}"));
                false
            }
        }
    }

    /// SQ `qid`'s shadow tail holds `t`, which it may not: report it once (the
    /// queue is left alone until the host writes a valid value).
    fn bad_shadow_tail(&mut self, qid: u16, t: u32) {
        let sq = self.sqs[qid as usize].as_mut().expect("exists");
        if sq.reported_bad_tail.replace(t) != Some(t) {
            self.doorbell_error(error_info::INVALID_DOORBELL_WRITE_VALUE, qid, DoorbellKind::SqTail, t);
        }
    }

    /// Refreshes CQ `qid`'s head from its shadow slot.
    fn refresh_cq_head(&mut self, qid: u16) {
        self.sync_page(qid, DoorbellKind::CqHead);
        let Some(b) = self.shadow else { return };
        Stats::add(&self.ctx.stats.shadow_reads, 1);
        match b.load(&self.mem, qid, DoorbellKind::CqHead) {
            Ok(h) => {
                let cq = self.cqs[qid as usize].as_mut().expect("exists");
                if cq.valid_head(h) {
                    cq.head = h;
                    cq.reported_bad_head = None;
                } else if cq.reported_bad_head.replace(h) != Some(h) {
                    self.doorbell_error(
                        error_info::INVALID_DOORBELL_WRITE_VALUE,
                        qid,
                        DoorbellKind::CqHead,
                        h,
                    );
                }
            }
            Err(e) => self.set_fatal(format!("shadow doorbell buffer inaccessible: {e}")),
        }
    }

    /// Allocates a tag for an in-flight command.
    pub(crate) fn track(&mut self, f: InFlight) -> u64 {
        match self.free_tags.pop() {
            Some(t) => {
                self.inflight[t as usize] = Some(f);
                t as u64
            }
            None => {
                self.inflight.push(Some(f));
                (self.inflight.len() - 1) as u64
            }
        }
    }

    /// Moves finished backend requests to their commands; completes commands whose
    /// requests are all done.
    fn reap(&mut self) -> bool {
        let mut any = !self.reaped.is_empty();
        for i in 0..self.backends.len() {
            if self.backends[i].in_flight() > 0 {
                self.backends[i].commit();
                any |= self.backends[i].reap(&mut self.reaped) > 0;
            }
        }
        let mut reaped = std::mem::take(&mut self.reaped);
        for c in reaped.drain(..) {
            self.backend_done(c);
        }
        self.reaped = reaped;
        any
    }

    fn backend_done(&mut self, c: Completion) {
        let tag = c.tag as usize;
        let Some(f) = self.inflight.get_mut(tag).and_then(|f| f.as_mut()) else {
            warn!("backend completion for unknown tag {tag}");
            return;
        };
        f.remaining -= 1;
        let mut failed = None;
        match &c.result {
            Err(e) if f.status.is_success() => {
                f.status = crate::error::backend_status(!matches!(f.op, Op::Read), e);
                failed = Some((f.nsid, f.slba, f.op, f.status));
            }
            Err(_) => {}
            Ok(()) => {
                if let (Finish::Compare(segs), DataBuf::Host(buf)) = (&f.finish, &c.data) {
                    if f.status.is_success() {
                        f.status = match compare(&self.mem, segs, buf) {
                            Ok(true) => Status::SUCCESS,
                            Ok(false) => Status::COMPARE_FAILURE.with_dnr(),
                            Err(_) => Status::DATA_TRANSFER_ERROR.with_dnr(),
                        };
                    }
                }
            }
        }
        let done = f.remaining == 0;
        if let (Some((nsid, slba, op, status)), Err(e)) = (failed, &c.result) {
            self.backend_failed(nsid, slba, op, status, e);
        }
        if let DataBuf::Guest(mut v) = c.data {
            v.clear();
            self.seg_pool.push(v);
        }
        if done {
            let f = self.inflight[tag].take().expect("present");
            self.free_tags.push(tag as u32);
            if let Finish::Compare(mut v) = f.finish {
                v.clear();
                self.seg_pool.push(v);
            }
            self.complete(f.sqid, f.cid, f.status, 0, f.nsid, f.slba);
        }
    }

    /// Side effects of a failed backend request, besides its status: the log line,
    /// the SMART media error count and critical warnings (Base SMART / Health log:
    /// bit 2 for media and internal errors that degrade reliability, bit 3 when the
    /// storage became read-only), which raise a SMART / Health event when the host
    /// enabled it.
    fn backend_failed(&mut self, nsid: u32, slba: u64, op: Op, status: Status, e: &BackendError) {
        let n = self.ctx.stats.backend_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        // The first few failures in full, then one in a thousand: a dying disk must
        // not flood the log.
        if n <= 16 || n.is_multiple_of(1000) {
            warn!(
                target: "vnvme::backend",
                nsid, slba, ?op, status = format_args!("{:#x}", status.raw()),
                "backend request failed ({n} so far): {e}"
            );
        }
        let warning = match e {
            BackendError::Io(_) | BackendError::Short { .. } => {
                Stats::add(&self.ctx.stats.media_errors, 1);
                critical_warning::RELIABILITY
            }
            BackendError::NotReady(_) => critical_warning::RELIABILITY,
            BackendError::ReadOnly => critical_warning::READ_ONLY,
            _ => 0,
        };
        if warning != 0 {
            self.ctx.events.raise_critical_warning(warning);
        }
    }

    /// Stops counting a fetched command as in flight without completing it (an
    /// Asynchronous Event Request parked until an event arrives).
    pub(crate) fn release(&mut self, sqid: u16) {
        if let Some(sq) = self.sqs[sqid as usize].as_mut() {
            sq.in_flight = sq.in_flight.saturating_sub(1);
        }
    }

    /// Completes a command earlier [`IoEngine::release`]d.
    pub(crate) fn complete_deferred(&mut self, sqid: u16, cid: u16, status: Status, dw0: u32) {
        if let Some(sq) = self.sqs[sqid as usize].as_mut() {
            sq.in_flight += 1;
            self.complete(sqid, cid, status, dw0, 0, 0);
        }
    }

    /// Posts the completion of a command fetched from SQ `sqid`.
    pub(crate) fn complete(&mut self, sqid: u16, cid: u16, status: Status, dw0: u32, nsid: u32, slba: u64) {
        let Some(sq) = self.sqs[sqid as usize].as_mut() else { return };
        sq.in_flight = sq.in_flight.saturating_sub(1);
        let cqe = Cqe {
            dw0: U32::new(dw0),
            dw1: U32::new(0),
            sqhd: U16::new(sq.head as u16),
            sqid: U16::new(sqid),
            cid: U16::new(cid),
            status: U16::new(status.raw() << 1),
        };
        let cqid = sq.cqid;
        if sqid == 0 {
            Stats::add(&self.ctx.stats.admin_commands, 1);
        } else {
            Stats::add(&self.ctx.stats.io_commands, 1);
        }
        if !status.is_success() {
            Stats::add(&self.ctx.stats.errors, 1);
            self.ctx.events.record_error(sqid, cid, status, nsid, slba);
        }
        self.post(cqid, cqe);
    }

    fn post(&mut self, cqid: u16, cqe: Cqe) {
        let Some(cq) = self.cqs[cqid as usize].as_mut() else { return };
        if !cq.overflow.is_empty() {
            cq.overflow.push_back(cqe);
            return;
        }
        if cq.is_full() {
            self.refresh_cq_head(cqid);
        }
        let cq = self.cqs[cqid as usize].as_mut().expect("exists");
        if cq.is_full() {
            cq.overflow.push_back(cqe);
            self.drain_overflow(cqid);
            return;
        }
        if let Err(e) = cq.post(&self.mem, cqe) {
            self.set_fatal(format!("cannot post to CQ {cqid}: {e}"));
        }
    }

    /// Posts completions that were waiting for room in CQ `cqid`, as many as fit.
    ///
    /// While some still wait (and shadow doorbells are on), CQ EventIdx is re-armed at
    /// the head just read, so the host's next consumption rings, and the shadow head is
    /// read again after the fence in case that consumption already happened (see
    /// doorbell.rs). The re-arm follows *every* partial drain: an EventIdx left at an
    /// older head can fall outside the host's next head update, which then does not
    /// ring, stranding the waiting completions. Each further lap of the loop starts
    /// from a head the host moved, so it posts at least one entry: the loop ends.
    fn drain_overflow(&mut self, cqid: u16) {
        loop {
            self.refresh_cq_head(cqid);
            let Some(cq) = self.cqs[cqid as usize].as_mut() else { return };
            while !cq.is_full() {
                let Some(cqe) = cq.overflow.pop_front() else { break };
                if let Err(e) = cq.post(&self.mem, cqe) {
                    self.set_fatal(format!("cannot post to CQ {cqid}: {e}"));
                    return;
                }
            }
            let Some(b) = self.shadow else { return };
            let (head, size) = (cq.head, cq.size);
            if cq.overflow.is_empty() {
                if cq.waiting_for_space {
                    cq.waiting_for_space = false;
                    if let Err(e) = b.publish(&self.mem, cqid, DoorbellKind::CqHead, (head + size - 1) % size)
                    {
                        self.set_fatal(format!("shadow doorbell buffer inaccessible: {e}"));
                    }
                }
                return;
            }
            cq.waiting_for_space = true;
            match b.rearm(&self.mem, cqid, DoorbellKind::CqHead, head) {
                Ok(h) if h != head && cq.valid_head(h) => {
                    Stats::add(&self.ctx.stats.eventidx_races, 1);
                }
                // Unchanged (the host will ring), or invalid (reported by the refresh).
                Ok(_) => return,
                Err(e) => {
                    self.set_fatal(format!("shadow doorbell buffer inaccessible: {e}"));
                    return;
                }
            }
        }
    }

    /// Signals each vector whose CQs received entries, subject to coalescing.
    fn signal_interrupts(&mut self) {
        let now = self.ctx.clock.now_ns();
        for i in 0..self.cqs.len() {
            let Some(cq) = self.cqs[i].as_mut() else { continue };
            if cq.unsignalled == 0 {
                continue;
            }
            let n = std::mem::take(&mut cq.unsignalled);
            if !cq.ien {
                continue;
            }
            let iv = cq.iv;
            if let Some(v) = self.vectors.get_mut(iv as usize) {
                if v.post(iv, n, self.coalescing, now) {
                    v.fired();
                    Stats::add(&self.ctx.stats.interrupts, 1);
                    self.ctx.irq.signal(iv);
                }
            }
        }
    }

    /// Fires coalesced interrupts whose aggregation time has passed.
    pub fn fire_timers(&mut self) {
        let now = self.ctx.clock.now_ns();
        let c = self.coalescing;
        for (iv, v) in self.vectors.iter_mut().enumerate() {
            if v.due(c, now) {
                v.fired();
                Stats::add(&self.ctx.stats.interrupts, 1);
                self.ctx.irq.signal(iv as u16);
            }
        }
    }

    /// The earliest time (clock ns) a coalesced interrupt must fire.
    pub fn next_deadline(&self) -> Option<u64> {
        self.vectors.iter().filter_map(|v| v.deadline(self.coalescing)).min()
    }

    /// True if commands fetched from a queue are still with a backend.
    pub fn backend_busy(&self) -> bool {
        self.inflight.iter().any(|f| f.is_some())
    }

    /// Closes this engine's backend queues: the controller's own engine, once workers
    /// own every I/O queue, so a backend with a limited number of queues (nvme://)
    /// or a cost per queue (an io_uring ring) spends them on the workers only.
    pub(crate) fn close_backends(&mut self) {
        self.backends.clear();
    }

    /// The descriptors of backend queues that complete asynchronously: the owner
    /// sleeps on them (level triggered) alongside its doorbells.
    pub fn backend_notifiers(&self) -> Vec<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.backends.iter().filter_map(|b| b.notifier().map(|fd| fd.as_raw_fd())).collect()
    }

    /// True if a backend queue with requests in flight has no notifier, so only
    /// polling finds its completions: the owner must not sleep for long.
    pub fn backend_needs_polling(&self) -> bool {
        self.backends.iter().any(|b| b.in_flight() > 0 && b.notifier().is_none())
    }

    /// True if commands are in flight in the backends or SQs hold unfetched entries.
    pub fn busy(&self) -> bool {
        self.inflight.iter().any(|f| f.is_some())
            || self.active_sqs.iter().any(|&q| self.sqs[q as usize].as_ref().is_some_and(|s| !s.is_empty()))
    }
}

fn compare(mem: &GuestMemory, segs: &[Segment], data: &[u8]) -> Result<bool, guest_mem::MemError> {
    let mut off = 0usize;
    let mut chunk = vec![0u8; 4096];
    for s in segs {
        if let Segment::Guest { gpa, len } = *s {
            let mut done = 0u64;
            while done < len {
                let n = (len - done).min(chunk.len() as u64) as usize;
                mem.read(gpa + done, &mut chunk[..n])?;
                if chunk[..n] != data[off..off + n] {
                    return Ok(false);
                }
                off += n;
                done += n as u64;
            }
        } else {
            off += s.len() as usize;
        }
    }
    Ok(true)
}

/// The command a submission queue entry carries, for logs; `opcode` prints its name
/// ([`nvme_spec::opcode::AdminOpcode`] or [`nvme_spec::opcode::NvmOpcode`]).
pub(crate) fn describe(opcode: impl std::fmt::Display, sqe: &Sqe) -> String {
    format!("{opcode} cid {} nsid {}", sqe.cid(), sqe.nsid.get())
}
