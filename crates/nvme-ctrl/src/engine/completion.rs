//! Completions: post CQEs (holding them back while a CQ is full), and signal
//! interrupts as coalescing allows.
use nvme_spec::regs::DoorbellKind;
use nvme_spec::{Cqe, Status};
use zerocopy::little_endian::{U16, U32};

use super::{IoEngine, Origin};
use crate::stats::{Count, QueueStats};

impl IoEngine {
    /// Stops counting a fetched command as in flight without completing it (an
    /// Asynchronous Event Request parked until an event arrives).
    pub(crate) fn release(&mut self, sqid: u16) {
        if let Some(sq) = self.queues.sq_mut(sqid) {
            sq.in_flight = sq.in_flight.saturating_sub(1);
        }
    }

    /// Completes a command earlier [`IoEngine::release`]d.
    pub(crate) fn complete_deferred(&mut self, sqid: u16, cid: u16, status: Status, dw0: u32) {
        if let Some(sq) = self.queues.sq_mut(sqid) {
            sq.in_flight += 1;
            self.complete(Origin::bare(sqid, cid), status, dw0);
        }
    }

    /// Posts the completion of command `at`.
    #[inline]
    pub(crate) fn complete(&mut self, at: Origin, status: Status, dw0: u32) {
        self.complete_wide(at, status, dw0 as u64)
    }

    /// [`IoEngine::complete`] with a 64-bit result in Dwords 0 and 1 (Zone Append's
    /// LBA).
    pub(crate) fn complete_wide(&mut self, at: Origin, status: Status, result: u64) {
        let Origin { sqid, cid, nsid, slba } = at;
        // None: the queue is gone (or the command was orphaned by its teardown).
        let status = if status.is_success() { status } else { self.io.settings().retry_delayed(status) };
        let Some(sq) = self.queues.sq_mut(sqid) else { return };
        sq.in_flight = sq.in_flight.saturating_sub(1);
        let cqe = Cqe {
            dw0: U32::new(result as u32),
            dw1: U32::new((result >> 32) as u32),
            sqhd: U16::new(sq.head as u16),
            sqid: U16::new(sqid),
            cid: U16::new(cid),
            status: U16::new(status.raw() << 1),
        };
        let cqid = sq.cqid;
        if sqid == 0 {
            self.io.work.counts.add(Count::AdminCommands, 1);
        } else {
            self.io.work.counts.add(Count::IoCommands, 1);
        }
        if !status.is_success() {
            self.io.work.counts.add(Count::Errors, 1);
            self.io.ctx.events.record_error(sqid, cid, status, nsid, slba);
        }
        self.post(cqid, cqe);
    }

    pub(crate) fn post(&mut self, cqid: u16, cqe: Cqe) {
        let Some(cq) = self.queues.cq_mut(cqid) else { return };
        if let Some(q) = self.io.ctx.queue_stats.get(cqid as usize) {
            QueueStats::bump(&q.completions, 1);
        }
        // The usual case first: nothing waits and there is room.
        if cq.overflow.is_empty() && !cq.is_full() {
            match cq.post(&self.io.mem, cqe) {
                Ok(()) if cq.unsignalled == 1 => self.interrupts.note(cqid),
                Ok(()) => {}
                Err(e) => self.set_fatal(format!("cannot post to CQ {cqid}: {e}")),
            }
            return;
        }
        if !cq.overflow.is_empty() {
            cq.overflow.push_back(cqe);
            return;
        }
        if cq.is_full() {
            self.refresh_cq_head(cqid);
        }
        let cq = self.queues.cq_mut(cqid).expect("exists");
        if cq.is_full() {
            cq.overflow.push_back(cqe);
            self.drain_overflow(cqid);
            return;
        }
        if let Err(e) = cq.post(&self.io.mem, cqe) {
            self.set_fatal(format!("cannot post to CQ {cqid}: {e}"));
        } else if cq.unsignalled == 1 {
            self.interrupts.note(cqid);
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
    pub(crate) fn drain_overflow(&mut self, cqid: u16) {
        loop {
            self.refresh_cq_head(cqid);
            let Some(cq) = self.queues.cq_mut(cqid) else { return };
            while !cq.is_full() {
                let Some(cqe) = cq.overflow.pop_front() else { break };
                if let Err(e) = cq.post(&self.io.mem, cqe) {
                    self.set_fatal(format!("cannot post to CQ {cqid}: {e}"));
                    return;
                }
                if cq.unsignalled == 1 {
                    self.interrupts.note(cqid);
                }
            }
            let Some(b) = self.doorbells.shadow() else { return };
            let (head, size) = (cq.head, cq.size);
            if cq.overflow.is_empty() {
                if cq.waiting_for_space {
                    cq.waiting_for_space = false;
                    if let Err(e) =
                        b.publish(&self.io.mem, cqid, DoorbellKind::CqHead, (head + size - 1) % size)
                    {
                        self.set_fatal(format!("shadow doorbell buffer inaccessible: {e}"));
                    }
                }
                return;
            }
            cq.waiting_for_space = true;
            match b.rearm(&self.io.mem, cqid, DoorbellKind::CqHead, head) {
                Ok(h) if h != head && cq.valid_head(h) => {
                    self.io.work.counts.add(Count::EventidxRaces, 1);
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
    pub(crate) fn signal_interrupts(&mut self) {
        if !self.interrupts.owed() {
            return;
        }
        let coalescing = self.io.settings.coalescing();
        // The time only matters to coalescing (when the oldest completion waits from).
        let now = if coalescing.time != 0 { self.io.ctx.clock.now_ns() } else { 0 };
        let (queues, ctx, counts) = (&mut self.queues, &self.io.ctx, &self.io.work.counts);
        self.interrupts.decide(
            coalescing,
            now,
            |qid| {
                // Deleted (or deleted and created again) since: nothing, or nothing new.
                let cq = queues.cq_mut(qid)?;
                let n = std::mem::take(&mut cq.unsignalled);
                (n > 0).then_some((n, cq.irq.ien.then_some(cq.irq.iv)))
            },
            |iv, qid| {
                counts.add(Count::Interrupts, 1);
                if let Some(q) = ctx.queue_stats.get(qid as usize) {
                    QueueStats::bump(&q.interrupts, 1);
                }
                ctx.irq.signal(iv);
            },
        );
    }

    /// Some CQ has completions waiting for room (a CQ head update lets them in).
    pub(crate) fn cq_waiting(&self) -> bool {
        let q = &self.queues;
        q.active_cqs().iter().any(|&c| q.cq(c).is_some_and(|cq| !cq.overflow.is_empty()))
    }

    /// Fires coalesced interrupts whose aggregation time has passed.
    pub fn fire_timers(&mut self) {
        if !self.interrupts.waiting() {
            return;
        }
        let now = self.io.ctx.clock.now_ns();
        let (ctx, counts) = (&self.io.ctx, &self.io.work.counts);
        self.interrupts.fire_due(self.io.settings.coalescing(), now, |iv| {
            counts.add(Count::Interrupts, 1);
            ctx.irq.signal(iv);
        });
    }

    /// Signals every coalesced interrupt now (a quiesce leaves none pending).
    pub(crate) fn flush_interrupts(&mut self) {
        self.signal_interrupts();
        let (ctx, counts) = (&self.io.ctx, &self.io.work.counts);
        self.interrupts.flush(|iv| {
            counts.add(Count::Interrupts, 1);
            ctx.irq.signal(iv);
        });
    }

    /// The earliest time (clock ns) a coalesced interrupt must fire, a command may
    /// time out or a command QoS held back may start: a sleeping owner wakes then.
    pub fn next_deadline(&self) -> Option<u64> {
        let expiry = self.io.work.commands.next_expiry();
        let held = self.throttle.next_release();
        self.interrupts
            .next_deadline(self.io.settings.coalescing())
            .into_iter()
            .chain(expiry)
            .chain(held)
            .min()
    }
}
