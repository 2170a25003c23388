//! Where I/O queues live, and how controller-wide changes reach every engine.
//! Without workers every queue is in the controller's own engine (inline mode, the
//! in-process host). With workers, each CQ (and every SQ posting to it) lives in one
//! worker's engine, chosen by CQ id; the admin queue stays with the controller. The
//! controller keeps its own book of which queues exist, so admin commands are
//! validated without asking a worker.

use std::collections::BTreeMap;

use nvme_spec::regs::DoorbellKind;

use crate::controller::Controller;
use crate::doorbell::ShadowBuffers;
use crate::engine::IoEngine;
use crate::runtime::workers::Worker;

/// Which I/O queues exist.
#[derive(Debug, Default)]
pub(crate) struct QueueBook {
    /// CQ id -> number of SQs posting to it.
    cqs: BTreeMap<u16, u32>,
    /// SQ id -> its CQ id.
    sqs: BTreeMap<u16, u16>,
}

impl QueueBook {
    /// True while no I/O queue exists.
    pub(crate) fn is_empty(&self) -> bool {
        self.cqs.is_empty() && self.sqs.is_empty()
    }
}

impl Controller {
    fn worker_for_cq(&self, cqid: u16) -> Option<&Worker> {
        self.runtime.worker_for_cq(cqid)
    }

    /// The counters of every queue that exists now (the admin queue first), each
    /// with the worker that owns its CQ.
    pub fn queue_snapshots(&self) -> Vec<crate::QueueSnapshot> {
        let stats = &self.engine.ctx.queue_stats;
        let mut qids: Vec<u16> = self.book.cqs.keys().chain(self.book.sqs.keys()).copied().collect();
        qids.sort_unstable();
        qids.dedup();
        let ready = self.lifecycle() != crate::Lifecycle::Disabled;
        ready
            .then_some(0)
            .into_iter()
            .chain(qids)
            .filter_map(|q| {
                let owner = self.worker_for_cq(self.book.sqs.get(&q).copied().unwrap_or(q)).map(|w| w.index);
                stats.get(q as usize).map(|s| s.snapshot(q, owner))
            })
            .collect()
    }

    /// Runs `f` on every engine: the controller's own and each worker's.
    pub(crate) fn on_all_engines(&mut self, f: impl Fn(&mut IoEngine) + Clone + Send + 'static) {
        f(&mut self.engine);
        for w in self.runtime.workers() {
            let g = f.clone();
            w.call(move |e| g(e));
        }
    }

    pub(crate) fn io_cq_exists(&self, qid: u16) -> bool {
        self.book.cqs.contains_key(&qid)
    }

    pub(crate) fn io_sq_exists(&self, qid: u16) -> bool {
        self.book.sqs.contains_key(&qid)
    }

    pub(crate) fn io_cq_users(&self, qid: u16) -> u32 {
        self.book.cqs.get(&qid).copied().unwrap_or(0)
    }

    pub(crate) fn io_create_cq(&mut self, qid: u16, base: u64, size: u32, ien: bool, iv: u16) {
        self.book.cqs.insert(qid, 0);
        match self.worker_for_cq(qid) {
            Some(w) => w.call(move |e| e.create_cq(qid, base, size, ien, iv)),
            None => self.engine.create_cq(qid, base, size, ien, iv),
        }
    }

    pub(crate) fn io_create_sq(&mut self, qid: u16, cqid: u16, base: u64, size: u32) {
        self.book.sqs.insert(qid, cqid);
        *self.book.cqs.entry(cqid).or_default() += 1;
        match self.worker_for_cq(cqid) {
            Some(w) => w.call(move |e| e.create_sq(qid, cqid, base, size)),
            None => self.engine.create_sq(qid, cqid, base, size),
        }
    }

    /// A saved CQ put back where the routing puts it (`state.rs`).
    pub(crate) fn io_restore_cq(&mut self, c: (crate::state::CqState, Vec<nvme_spec::Cqe>)) {
        self.book.cqs.insert(c.0.qid, 0);
        match self.worker_for_cq(c.0.qid) {
            Some(w) => w.call(move |e| e.install_queues(&[], &[c])),
            None => self.engine.install_queues(&[], &[c]),
        }
    }

    /// A saved SQ put back with its CQ (checked: the CQ is there).
    pub(crate) fn io_restore_sq(&mut self, q: crate::state::SqState) {
        let (qid, cqid) = (q.qid, q.cqid);
        self.book.sqs.insert(qid, cqid);
        *self.book.cqs.entry(cqid).or_default() += 1;
        match self.worker_for_cq(cqid) {
            Some(w) => w.call(move |e| e.install_queues(&[q], &[])),
            None => self.engine.install_queues(&[q], &[]),
        }
    }

    pub(crate) fn io_delete_sq(&mut self, qid: u16) {
        let Some(cqid) = self.book.sqs.remove(&qid) else { return };
        if let Some(n) = self.book.cqs.get_mut(&cqid) {
            *n = n.saturating_sub(1);
        }
        match self.worker_for_cq(cqid) {
            Some(w) => w.call(move |e| e.delete_sq(qid)),
            None => self.engine.delete_sq(qid),
        }
    }

    pub(crate) fn io_delete_cq(&mut self, qid: u16) {
        self.book.cqs.remove(&qid);
        match self.worker_for_cq(qid) {
            Some(w) => w.call(move |e| e.delete_cq(qid)),
            None => self.engine.delete_cq(qid),
        }
    }

    /// Routes a trapped doorbell write to the engine that owns the queue.
    pub(crate) fn io_doorbell(&mut self, qid: u16, kind: DoorbellKind, value: u32) {
        let cqid = match kind {
            DoorbellKind::SqTail => self.book.sqs.get(&qid).copied(),
            DoorbellKind::CqHead => self.book.cqs.contains_key(&qid).then_some(qid),
        };
        match cqid.and_then(|c| self.worker_for_cq(c)) {
            Some(w) => w.doorbell(qid, kind, value),
            // Admin queue, inline mode, or a queue that does not exist (the engine
            // raises Invalid Doorbell Register).
            None => self.engine.doorbell(qid, kind, value),
        }
    }

    pub(crate) fn io_attach_shadow(&mut self, b: ShadowBuffers) {
        self.on_all_engines(move |e| e.attach_shadow(b));
    }

    pub(crate) fn io_set_vector_coalescing_disabled(&mut self, iv: u16, cd: bool) {
        self.on_all_engines(move |e| e.set_vector_coalescing_disabled(iv, cd));
    }

    pub(crate) fn io_apply_settings(&mut self) {
        let s = self.settings();
        self.on_all_engines(move |e| e.apply_settings(s));
    }

    /// Controller Level Reset of the data path: every queue goes.
    pub(crate) fn io_reset(&mut self) {
        self.book = QueueBook::default();
        // One bound for the whole controller, not one per engine.
        let deadline = crate::engine::Deadline::teardown(&*self.clock);
        self.on_all_engines(move |e| e.reset_by(deadline));
    }
}
