//! What an engine does with doorbells: trapped writes and mapped-page values
//! validated and applied, Doorbell Buffer Config attached to live queues, shadow
//! tails and heads read. The memory-ordering protocol itself is in crate::doorbell.
use guest_mem::GuestMemory;
use nvme_spec::aer::{error_info, AsyncEvent, EventType};
use nvme_spec::log::lid;
use nvme_spec::regs::DoorbellKind;

use super::IoEngine;
use crate::doorbell::ShadowBuffers;
use crate::stats::Count;

impl IoEngine {
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
        if let Some(old) = self.doorbells.shadow() {
            // Replacing buffers in use: the host's latest values are in the old ones.
            // Pick them up, then carry them into the new slots.
            for qid in self.queues.active_sqs().to_vec() {
                self.refresh_sq_tail(qid, old);
            }
            for qid in 0..=self.io.ctx.max_qid {
                if self.queues.cq(qid).is_some() {
                    self.refresh_cq_head(qid);
                }
            }
            self.doorbells.set_shadow(Some(buffers));
            for qid in 0..=self.io.ctx.max_qid {
                if let Some(t) = self.queues.sq(qid).map(|q| q.tail) {
                    self.init_shadow_slots(qid, DoorbellKind::SqTail, t);
                }
                if let Some(h) = self.queues.cq(qid).map(|q| q.head) {
                    self.init_shadow_slots(qid, DoorbellKind::CqHead, h);
                }
            }
            return;
        }
        self.doorbells.set_shadow(Some(buffers));
        for qid in 0..=self.io.ctx.max_qid {
            if let Some(sq) = self.queues.sq(qid) {
                let (tail, size, rung) = (sq.tail, sq.size, sq.rung && qid != 0);
                let adopt = match buffers.load(&self.io.mem, qid, DoorbellKind::SqTail) {
                    // Never adopt a value behind our own tail: that is a stale or zeroed
                    // slot, and adopting it would fetch old entries as new commands.
                    Ok(v) => rung && v < size && v >= tail,
                    Err(_) => false,
                };
                let head = sq.head;
                self.queues.sq_mut(qid).expect("exists").arm.forget();
                if adopt {
                    // Leave the host's value; EventIdx = what we consumed.
                    if let Err(e) = buffers.publish(&self.io.mem, qid, DoorbellKind::SqTail, head) {
                        self.set_fatal(format!("shadow doorbell buffer inaccessible: {e}"));
                    }
                } else {
                    self.init_shadow_slots(qid, DoorbellKind::SqTail, tail);
                }
            }
            if let Some(cq) = self.queues.cq(qid) {
                let head = cq.head;
                let adopt = match buffers.load(&self.io.mem, qid, DoorbellKind::CqHead) {
                    Ok(v) => qid != 0 && cq.valid_head(v),
                    Err(_) => false,
                };
                if adopt {
                    self.refresh_cq_head(qid);
                    let h = self.queues.cq(qid).expect("exists").head;
                    let ei = self.cq_idle_eventidx(qid, h);
                    if let Err(e) = buffers.publish(&self.io.mem, qid, DoorbellKind::CqHead, ei) {
                        self.set_fatal(format!("shadow doorbell buffer inaccessible: {e}"));
                    }
                } else {
                    self.init_shadow_slots(qid, DoorbellKind::CqHead, head);
                }
            }
        }
    }

    pub fn shadow(&self) -> Option<ShadowBuffers> {
        self.doorbells.shadow()
    }

    /// The buffers of a restored state, as they were: nothing is written to guest
    /// memory (the slots there are the live ones; `resume` publishes EventIdx).
    pub(crate) fn restore_shadow(&mut self, buffers: ShadowBuffers) {
        self.doorbells.set_shadow(Some(buffers));
    }

    pub(crate) fn init_shadow_slots(&mut self, qid: u16, kind: DoorbellKind, v: u32) {
        let Some(b) = self.doorbells.shadow() else { return };
        let ei = match kind {
            DoorbellKind::SqTail => v,
            DoorbellKind::CqHead => self.cq_idle_eventidx(qid, v),
        };
        if kind == DoorbellKind::SqTail {
            if let Some(sq) = self.queues.sq_mut(qid) {
                sq.arm.forget();
            }
        }
        let r =
            b.store_shadow(&self.io.mem, qid, kind, v).and_then(|_| b.publish(&self.io.mem, qid, kind, ei));
        if let Err(e) = r {
            self.set_fatal(format!("shadow doorbell buffer became inaccessible: {e}"));
        }
    }

    /// The CQ EventIdx when the controller needs no ring: one entry behind the head.
    pub(crate) fn cq_idle_eventidx(&self, qid: u16, head: u32) -> u32 {
        let size = self.queues.cq(qid).map_or(1, |q| q.size);
        (head + size - 1) % size
    }

    // ---- doorbells

    /// A trapped doorbell register write for I/O queue `qid`.
    pub fn doorbell(&mut self, qid: u16, kind: DoorbellKind, value: u32) {
        self.io.work.counts.add(Count::DoorbellWrites, 1);
        if qid != 0 {
            self.io.work.counts.add(Count::IoDoorbellWrites, 1);
            if kind == DoorbellKind::CqHead {
                self.io.work.counts.add(Count::IoCqDoorbellWrites, 1);
            }
        }
        if let Some(q) = self.io.ctx.queue_stats.get(qid as usize) {
            let c = if kind == DoorbellKind::SqTail { &q.sq_doorbell_writes } else { &q.cq_doorbell_writes };
            crate::stats::QueueStats::bump(c, 1);
        }
        self.apply_doorbell(qid, kind, value);
    }

    /// Uses a mapped doorbell page (or stops using one).
    pub fn set_doorbell_page(&mut self, page: Option<GuestMemory>) {
        self.doorbells.set_page(page);
    }

    /// Picks up a value the guest stored in the mapped doorbell page, as if it had been
    /// a trapped write (without counting it as one). With shadow doorbells the shadow
    /// slot is the source for I/O queues, but the admin queue's value only ever
    /// arrives here (hosts never write its shadow slot).
    #[inline]
    pub(crate) fn sync_page(&mut self, qid: u16, kind: DoorbellKind) {
        if !self.doorbells.page_mapped() || (self.doorbells.shadow().is_some() && qid != 0) {
            return;
        }
        if let Some(v) = self.doorbells.take_new(qid, kind) {
            self.apply_doorbell(qid, kind, v);
        }
    }

    pub(crate) fn apply_doorbell(&mut self, qid: u16, kind: DoorbellKind, value: u32) {
        let (exists, valid) = match kind {
            // With shadow doorbells an I/O queue's tail may already be newer than this
            // (late) register value, so only the ring bounds apply to it; the shadow
            // value gets the full check when it is read.
            DoorbellKind::SqTail => match self.queues.sq(qid) {
                Some(sq) if self.doorbells.shadow().is_some() && qid != 0 => (true, value < sq.size),
                Some(sq) => (true, sq.valid_tail(value)),
                None => (false, false),
            },
            // Likewise a late CQ head register write may be older than the head already
            // taken from the shadow slot.
            DoorbellKind::CqHead => match self.queues.cq(qid) {
                Some(cq) if self.doorbells.shadow().is_some() && qid != 0 => (true, value < cq.size),
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
        if let (0, Some(b)) = (qid, self.doorbells.shadow()) {
            if let Err(e) = b.store_shadow(&self.io.mem, 0, kind, value) {
                self.set_fatal(format!("shadow doorbell buffer inaccessible: {e}"));
                return;
            }
        }
        // With shadow doorbells the shadow slot already holds this value or a newer
        // one (the host writes it first), so the trapped value only wakes us up.
        if self.doorbells.shadow().is_some() && qid != 0 {
            match kind {
                DoorbellKind::SqTail => self.queues.sq_mut(qid).expect("checked").rung = true,
                // The host rang because it made room we asked for. Drain here rather
                // than only when servicing an SQ: the CQ may have no SQ left.
                DoorbellKind::CqHead => {
                    if self.queues.cq(qid).is_some_and(|cq| !cq.overflow.is_empty()) {
                        self.drain_overflow(qid);
                    }
                }
            }
            return;
        }
        match kind {
            DoorbellKind::SqTail => {
                let sq = self.queues.sq_mut(qid).expect("checked");
                sq.tail = value;
                sq.rung = true;
            }
            DoorbellKind::CqHead => {
                self.queues.cq_mut(qid).expect("checked").head = value;
                self.drain_overflow(qid);
            }
        }
    }

    pub(crate) fn doorbell_error(&mut self, info: u8, qid: u16, kind: DoorbellKind, value: u32) {
        log_limit::limited_warn!(target: "vnvme::guest", %kind, qid, value, "invalid doorbell write (event info {info:#x})");
        self.io.ctx.events.raise(AsyncEvent {
            kind: EventType::ErrorStatus,
            info,
            log_page: lid::ERROR_INFORMATION,
        });
    }

    /// Reads SQ `qid`'s shadow tail. False if it is invalid (the event is raised and
    /// the queue is left alone until the host writes a valid value).
    pub(crate) fn refresh_sq_tail(&mut self, qid: u16, b: ShadowBuffers) -> bool {
        self.io.work.counts.add(Count::ShadowReads, 1);
        match b.load(&self.io.mem, qid, DoorbellKind::SqTail) {
            Ok(t) => {
                let sq = self.queues.sq_mut(qid).expect("exists");
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
    pub(crate) fn bad_shadow_tail(&mut self, qid: u16, t: u32) {
        let sq = self.queues.sq_mut(qid).expect("exists");
        if sq.reported_bad_tail.replace(t) != Some(t) {
            self.doorbell_error(error_info::INVALID_DOORBELL_WRITE_VALUE, qid, DoorbellKind::SqTail, t);
        }
    }

    /// Refreshes CQ `qid`'s head from its shadow slot.
    pub(crate) fn refresh_cq_head(&mut self, qid: u16) {
        self.sync_page(qid, DoorbellKind::CqHead);
        let Some(b) = self.doorbells.shadow() else { return };
        self.io.work.counts.add(Count::ShadowReads, 1);
        match b.load(&self.io.mem, qid, DoorbellKind::CqHead) {
            Ok(h) => {
                let cq = self.queues.cq_mut(qid).expect("exists");
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
}
