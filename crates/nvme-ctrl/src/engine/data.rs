//! The data path: fetch commands round robin, hand them to the backends, reap what
//! the backends finished.
use block_backend::{Completion, DataBuf, Op, Segment};
use guest_mem::GuestMemory;
use nvme_spec::regs::DoorbellKind;
use std::sync::Arc;

use nvme_spec::{Sqe, Status};
use tracing::warn;

use super::{Finish, InFlight, IoEngine, Origin, EXPIRY_POLLS, POLL_BUDGET};
use crate::doorbell::Rearm;
use crate::qos::QosGroup;
use crate::stats::{Count, QueueStats};

impl IoEngine {
    // ---- the data path

    /// Does whatever work is ready: reaps backend completions, fetches and starts new
    /// commands (round robin with the arbitration burst), posts completions and
    /// signals interrupts. Returns true if it did anything.
    pub fn poll(&mut self) -> bool {
        if self.fatal.is_some() {
            return false;
        }
        self.adopt_memory();
        self.io.work.poll_now_ns = None;
        self.io.work.done_now_ns = None;
        let mut progress = self.reap();
        progress |= self.release_held();
        let mut budget = POLL_BUDGET;
        let mut idle_turns = 0;
        // A polling engine pauses once per round of turns in which an I/O queue had
        // work, before the next round reads those doorbells again (doorbell::gap): once
        // per round, so many busy queues are not each a pause.
        let gap = self.pauses_between_looks();
        let (mut round_left, mut round_found) = (self.queues.active_sqs().len(), false);
        while budget > 0 && idle_turns < self.queues.active_sqs().len() {
            let Some(qid) = self.queues.next_in_turn() else { break };
            let limit = self.io.settings.burst().unwrap_or(u32::MAX).min(budget);
            let n = self.service_sq(qid, limit);
            if n == 0 {
                idle_turns += 1;
            } else {
                idle_turns = 0;
                budget -= n;
                progress = true;
                round_found |= qid != 0;
            }
            if self.fatal.is_some() {
                return true;
            }
            round_left = round_left.saturating_sub(1);
            if round_left == 0 {
                if gap && round_found && budget > 0 {
                    // What the host may be waiting for goes out first.
                    self.signal_interrupts();
                    self.io.work.counts.add(Count::DoorbellPauses, 1);
                    crate::doorbell::gap::pause();
                }
                (round_left, round_found) = (self.queues.active_sqs().len(), false);
            }
        }
        progress |= self.reap();
        // Expiry is looked at when idle, and now and then when busy (timeout.rs).
        self.polls_since_expiry += 1;
        if !progress || self.polls_since_expiry >= EXPIRY_POLLS {
            progress |= self.expire_overdue();
        }
        self.signal_interrupts();
        progress
    }

    /// Whether a round that found work pauses before the next (doorbell::gap):
    /// only a polling engine reading its doorbells from memory the host writes.
    pub(crate) fn pauses_between_looks(&self) -> bool {
        !self.arm_eventidx && (self.doorbells.page_mapped() || self.doorbells.shadow().is_some())
    }

    /// Fetches and starts up to `limit` commands from one SQ. Returns how many.
    pub(crate) fn service_sq(&mut self, qid: u16, limit: u32) -> u32 {
        let Some(sq) = self.queues.sq(qid) else { return 0 };
        let cqid = sq.cqid;
        // Back-pressure: while the CQ has completions waiting for room, fetch nothing.
        if self.queues.cq(cqid).is_some_and(|cq| !cq.overflow.is_empty()) {
            self.drain_overflow(cqid);
            if self.queues.cq(cqid).is_some_and(|cq| !cq.overflow.is_empty()) {
                return 0;
            }
        }
        self.sync_page(qid, DoorbellKind::SqTail);
        if let Some(b) = self.doorbells.shadow() {
            // The admin SQ is always armed once empty (below), so a host that follows
            // EventIdx rings for its next command, and the trapped value is the tail
            // (doorbells.rs): an empty admin SQ armed at its head has nothing to read.
            let sq = self.queues.sq(qid).expect("exists");
            if qid == 0 && sq.is_empty() && sq.arm.is_at(sq.head) {
                return 0;
            }
            if !self.refresh_sq_tail(qid, b) {
                return 0;
            }
        }
        let mut done = 0;
        if self.quiesced {
            // New tails are recorded (above), nothing is fetched.
            return 0;
        }
        // Each command is read into this one place and run from it by reference.
        let mut sqe = <Sqe as zerocopy::FromZeros>::new_zeroed();
        loop {
            while done < limit {
                let sq = self.queues.sq_mut(qid).expect("exists");
                if sq.is_empty() {
                    break;
                }
                // Bounds on work in flight (docs/SECURITY.md): a queue holds at most
                // its size in fetched, unfinished commands, an engine MAX_IN_FLIGHT
                // tags; past either the entries wait in the ring until completions
                // (or timeouts) free room, and the next run fetches them.
                if sq.in_flight >= sq.size || self.io.work.commands.held() >= MAX_IN_FLIGHT {
                    return done;
                }
                // A host may have just been told of new memory and used it: look
                // for a newer map before reading the command (engine::memory).
                if self.io.ctx.memory.generation() != self.mem_generation {
                    self.adopt_memory();
                }
                let sq = self.queues.sq_mut(qid).expect("exists");
                if let Err(e) = sq.fetch_into(&self.io.mem, &mut sqe) {
                    self.set_fatal(format!("cannot fetch from SQ {qid}: {e}"));
                    return done;
                }
                sq.in_flight += 1;
                done += 1;
                if let Some(q) = self.io.ctx.queue_stats.get(qid as usize) {
                    QueueStats::bump(&q.commands, 1);
                }
                if qid == 0 {
                    self.admin_inbox.push(sqe);
                } else {
                    self.execute(qid, &sqe);
                }
            }
            // A poller leaves I/O queues unarmed so the host does not ring; the admin
            // queue is armed whenever it empties (hosts ring it anyway).
            if done >= limit || !(self.arm_eventidx || qid == 0) {
                return done;
            }
            // Empty: re-arm EventIdx, then look again (see doorbell.rs).
            let Some(b) = self.doorbells.shadow() else { return done };
            let sq = self.queues.sq_mut(qid).expect("exists");
            let head = sq.head;
            match sq.arm.rearm(&mut b.slots(&self.io.mem, qid, DoorbellKind::SqTail), head) {
                // Armed at this head already (and fenced then): the tail was read
                // again at the top of this call.
                Ok(Rearm::Unchanged) => return done,
                Ok(Rearm::Armed) => {
                    self.io.work.counts.add(Count::ShadowReads, 1);
                    return done;
                }
                Ok(Rearm::Moved(t)) if sq.valid_tail(t) => {
                    self.io.work.counts.add(Count::ShadowReads, 1);
                    self.io.work.counts.add(Count::EventidxRaces, 1);
                    sq.tail = t;
                    sq.reported_bad_tail = None;
                }
                Ok(Rearm::Moved(t)) => {
                    self.io.work.counts.add(Count::ShadowReads, 1);
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

    // ---- QoS (the throttle holds back what the limits do not let through yet)

    /// Makes namespace `nsid` draw from `group` (None: no limits).
    pub(crate) fn set_qos(&mut self, nsid: u32, group: Option<Arc<QosGroup>>) {
        self.throttle.set_group(nsid, group);
    }

    /// Lets a command just fetched start now (true), or holds it back (false).
    #[inline]
    pub(crate) fn qos_admits(&mut self, sqid: u16, sqe: &Sqe) -> bool {
        let ns = crate::namespace::lookup(&self.io.ctx.namespaces, sqe.nsid.get()).map(|n| &**n);
        let (clock, poll_now) = (&self.io.ctx.clock, &mut self.io.work.poll_now_ns);
        self.throttle.admit(sqid, sqe, ns, || *poll_now.get_or_insert_with(|| clock.now_ns()))
    }

    /// Starts held commands whose time has come (all of them while quiesced: a
    /// quiesce lets everything held back run now). True if any started.
    pub(crate) fn release_held(&mut self) -> bool {
        if self.throttle.held() == 0 {
            return false;
        }
        let clock = &self.io.ctx.clock;
        let now = *self.io.work.poll_now_ns.get_or_insert_with(|| clock.now_ns());
        let mut out = std::mem::take(&mut self.released);
        let namespaces = &self.io.ctx.namespaces;
        self.throttle.release(
            now,
            self.quiesced,
            |nsid| crate::namespace::lookup(namespaces, nsid),
            &mut out,
        );
        let started = !out.is_empty();
        for (sqid, sqe) in out.drain(..) {
            self.run(sqid, &sqe);
        }
        self.released = out;
        started
    }

    /// Completes, with `status`, the held commands `pick` chooses (by SQ and NSID).
    pub(crate) fn drop_held(&mut self, pick: impl Fn(u16, u32) -> bool, status: Status) {
        let mut out = Vec::new();
        self.throttle.take_where(pick, &mut out);
        for (sqid, sqe) in out {
            self.complete(Origin::of(sqid, &sqe, 0), status, 0);
        }
    }

    /// Commands QoS holds back.
    pub(crate) fn held(&self) -> usize {
        self.throttle.held()
    }

    /// Moves finished backend requests to their commands; completes commands whose
    /// requests are all done.
    pub(crate) fn reap(&mut self) -> bool {
        // Nothing at any backend: nothing to look for (the common case between
        // commands, which an idle engine polls several times per wake-up).
        if self.io.work.commands.empty()
            && self.io.work.reaped.is_empty()
            && !self.io.work.backends.retiring()
        {
            return false;
        }
        self.io.work.done_now_ns = None;
        let mut any = !self.io.work.reaped.is_empty();
        any |= self.io.work.backends.reap(&mut self.io.work.reaped);
        let mut reaped = std::mem::take(&mut self.io.work.reaped);
        for c in reaped.drain(..) {
            self.backend_done(c);
        }
        self.io.work.reaped = reaped;
        any
    }

    pub(crate) fn backend_done(&mut self, c: Completion) {
        let tag = c.tag as usize;
        // Already completed to the host: the late request only hands its tag back.
        // What it wrote into guest memory still counts for a migration's log.
        if self.io.work.commands.late(tag) {
            mark_written(&self.io.mem, &c.data);
            return;
        }
        let Some(f) = self.io.work.commands.running_mut(tag) else {
            warn!("backend completion for unknown tag {tag}");
            return;
        };
        f.remaining -= 1;
        let mut failed = None;
        match &c.result {
            Err(e) if f.status.is_success() => {
                f.status = crate::error::backend_status(!matches!(f.op, Op::Read), e);
                failed = Some((f.at.nsid, f.at.slba, f.op, f.status));
            }
            Err(_) => {}
            Ok(()) if f.status.is_success() => match (&f.finish, &c.data) {
                (Finish::Compare(segs), DataBuf::Host(buf)) => {
                    f.status = match crate::dptr::guest_equals(&self.io.mem, segs, buf) {
                        Ok(true) => Status::SUCCESS,
                        Ok(false) => Status::COMPARE_FAILURE.with_dnr(),
                        Err(_) => Status::DATA_TRANSFER_ERROR.with_dnr(),
                    };
                }
                // A command whose queue went away hands nothing to the host.
                (Finish::Meta(job), data) if f.at.sqid != super::timeout::ORPHAN => {
                    f.status = job.finish(&self.io.mem, data, f.at.nsid, f.at.slba)
                }
                _ => {}
            },
            Ok(()) => {}
        }
        let done = f.remaining == 0;
        let into_guest = matches!(f.op, Op::Read);
        let mut data = Some(c.data);
        // A Copy goes on to its next request (same tag, same deadline) while its
        // requests succeed.
        let mut next = None;
        if done && f.status.is_success() {
            if let Finish::Copy(job) = &mut f.finish {
                match job.advance(tag as u64, data.take().expect("taken once")) {
                    Ok(Some(req)) => {
                        f.op = req.op;
                        f.remaining = 1;
                        next = Some((f.at.nsid, req));
                    }
                    Ok(None) => {}
                    Err(status) => f.status = status,
                }
            }
        }
        if let (Some((nsid, slba, op, status)), Err(e)) = (failed, &c.result) {
            self.io.backend_failed(nsid, slba, op, status, e);
        }
        if let Some((nsid, req)) = next {
            self.io.backend_submit(nsid, req);
            return;
        }
        if let Some(data) = data {
            self.io.release_data(data, into_guest);
        }
        if done {
            let f = self.io.work.commands.finish(tag).expect("running above");
            self.count_done(&f);
            let mut result = 0;
            match f.finish {
                // Dword 0 of a failed Copy: the first source range not copied.
                Finish::Copy(job) => {
                    if let Some(w) = job.zone {
                        self.io.zone_written(f.at.nsid, w);
                    }
                    if !f.status.is_success() {
                        result = job.first_not_copied() as u64;
                    }
                }
                Finish::Compare(mut v) => {
                    v.clear();
                    self.io.work.seg_pool.push(v);
                }
                Finish::Zoned { write, append } => {
                    let shift = self.io.zone_written(f.at.nsid, write);
                    if append && f.status.is_success() {
                        result = write.offset >> shift;
                    }
                }
                Finish::Plain | Finish::Meta(_) => {}
            }
            self.complete_wide(f.at, f.status, result);
        }
    }

    /// Counts a command that ran at a backend on its namespace: kind, bytes, status,
    /// and the latency from its fetch to now (one clock read per reap).
    pub(crate) fn count_done(&mut self, f: &InFlight) {
        let clock = &self.io.ctx.clock;
        let now = *self.io.work.done_now_ns.get_or_insert_with(|| clock.now_ns());
        let t = f.tally;
        self.io.count_ns(
            f.at.nsid,
            t.class,
            t.bytes,
            now.saturating_sub(t.started_ns),
            f.status.is_success(),
        );
    }
}

/// Most commands one engine tracks at once (running, or abandoned after a timeout
/// until their backend returns): what a guest can make a worker hold.
pub(crate) const MAX_IN_FLIGHT: usize = 4096;

/// Most bytes of host buffers (Compare's and Verify's data, a Copy's range) the
/// commands of one engine hold at once, until their backend requests are back: what
/// a guest can make a worker allocate (MAX_IN_FLIGHT commands of MDTS each would be
/// 4 GiB). Past it a command completes Command Interrupted, which the host retries.
pub(crate) const HOST_BUFFER_BUDGET: u64 = 64 << 20;

/// Marks the guest memory a backend request wrote into (a read's data, however the
/// backend moved it: our copy, the kernel's io_uring read, a downstream device) for
/// a migration's DMA log, now that the write is over. Free unless logging is on.
#[inline]
pub(super) fn mark_written(mem: &GuestMemory, data: &DataBuf) {
    if !GuestMemory::logging_writes() {
        return;
    }
    if let DataBuf::Guest(segs) = data {
        for s in segs {
            if let Segment::Guest { gpa, len } = *s {
                mem.mark_dirty(gpa, len);
            }
        }
    }
}
