//! Where I/O queues live, and how controller-wide changes reach every engine.
//! Without workers every queue is in the controller's own engine (inline mode, the
//! in-process host). With workers, each CQ (and every SQ posting to it) lives in one
//! worker's engine, chosen by CQ id; the admin queue stays with the controller. The
//! runtime keeps its own book of which queues exist, so admin commands are
//! validated without asking a worker.
//!
//! Every call takes the controller's own engine (`local`): the one that holds the
//! admin queue, and every I/O queue in inline mode.

use std::collections::BTreeMap;

use nvme_spec::regs::DoorbellKind;

use super::Runtime;
use crate::doorbell::ShadowBuffers;
use crate::engine::{Deadline, IoEngine, Settings};
use crate::queue::{CompletionQueue, CqState, SqState};
use crate::stats::QueueSnapshot;

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

impl Runtime {
    /// True while no I/O queue exists.
    pub(crate) fn no_io_queues(&self) -> bool {
        self.book.is_empty()
    }

    /// The counters of every queue that exists now (the admin queue first if `ready`),
    /// each with the worker that owns its CQ.
    pub(crate) fn queue_snapshots(&self, local: &IoEngine, ready: bool) -> Vec<QueueSnapshot> {
        let stats = &local.io.ctx.queue_stats;
        let mut qids: Vec<u16> = self.book.cqs.keys().chain(self.book.sqs.keys()).copied().collect();
        qids.sort_unstable();
        qids.dedup();
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
    pub(crate) fn on_all_engines(
        &self,
        local: &mut IoEngine,
        f: impl Fn(&mut IoEngine) + Clone + Send + 'static,
    ) {
        f(local);
        for w in self.workers() {
            let g = f.clone();
            w.call(move |e| g(e));
        }
    }

    pub(crate) fn cq_exists(&self, qid: u16) -> bool {
        self.book.cqs.contains_key(&qid)
    }

    pub(crate) fn sq_exists(&self, qid: u16) -> bool {
        self.book.sqs.contains_key(&qid)
    }

    /// How many SQs post to CQ `qid`.
    pub(crate) fn cq_users(&self, qid: u16) -> u32 {
        self.book.cqs.get(&qid).copied().unwrap_or(0)
    }

    pub(crate) fn create_cq(&mut self, local: &mut IoEngine, qid: u16, cq: CompletionQueue) {
        self.book.cqs.insert(qid, 0);
        match self.worker_for_cq(qid) {
            Some(w) => w.call(move |e| e.create_cq(qid, cq)),
            None => local.create_cq(qid, cq),
        }
    }

    pub(crate) fn create_sq(&mut self, local: &mut IoEngine, qid: u16, cqid: u16, base: u64, size: u32) {
        self.book.sqs.insert(qid, cqid);
        *self.book.cqs.entry(cqid).or_default() += 1;
        match self.worker_for_cq(cqid) {
            Some(w) => w.call(move |e| e.create_sq(qid, cqid, base, size)),
            None => local.create_sq(qid, cqid, base, size),
        }
    }

    /// A saved CQ (with its decoded overflow) put back where the routing puts it.
    pub(crate) fn restore_cq(&mut self, local: &mut IoEngine, c: (CqState, Vec<nvme_spec::Cqe>)) {
        self.book.cqs.insert(c.0.qid, 0);
        match self.worker_for_cq(c.0.qid) {
            Some(w) => w.call(move |e| e.install_queues(&[], &[c])),
            None => local.install_queues(&[], &[c]),
        }
    }

    /// A saved SQ put back with its CQ (checked: the CQ is there).
    pub(crate) fn restore_sq(&mut self, local: &mut IoEngine, q: SqState) {
        let (qid, cqid) = (q.qid, q.cqid);
        self.book.sqs.insert(qid, cqid);
        *self.book.cqs.entry(cqid).or_default() += 1;
        match self.worker_for_cq(cqid) {
            Some(w) => w.call(move |e| e.install_queues(&[q], &[])),
            None => local.install_queues(&[q], &[]),
        }
    }

    pub(crate) fn delete_sq(&mut self, local: &mut IoEngine, qid: u16) {
        let Some(cqid) = self.book.sqs.remove(&qid) else { return };
        if let Some(n) = self.book.cqs.get_mut(&cqid) {
            *n = n.saturating_sub(1);
        }
        match self.worker_for_cq(cqid) {
            Some(w) => w.call(move |e| e.delete_sq(qid)),
            None => local.delete_sq(qid),
        }
    }

    pub(crate) fn delete_cq(&mut self, local: &mut IoEngine, qid: u16) {
        self.book.cqs.remove(&qid);
        match self.worker_for_cq(qid) {
            Some(w) => w.call(move |e| e.delete_cq(qid)),
            None => local.delete_cq(qid),
        }
    }

    /// Routes a trapped doorbell write to the engine that owns the queue.
    pub(crate) fn doorbell(&self, local: &mut IoEngine, qid: u16, kind: DoorbellKind, value: u32) {
        let cqid = match kind {
            DoorbellKind::SqTail => self.book.sqs.get(&qid).copied(),
            DoorbellKind::CqHead => self.book.cqs.contains_key(&qid).then_some(qid),
        };
        match cqid.and_then(|c| self.worker_for_cq(c)) {
            Some(w) => w.doorbell(qid, kind, value),
            // Admin queue, inline mode, or a queue that does not exist (the engine
            // raises Invalid Doorbell Register).
            None => local.doorbell(qid, kind, value),
        }
    }

    pub(crate) fn attach_shadow(&self, local: &mut IoEngine, b: ShadowBuffers) {
        self.on_all_engines(local, move |e| e.attach_shadow(b));
    }

    pub(crate) fn set_vector_coalescing_disabled(&self, local: &mut IoEngine, iv: u16, cd: bool) {
        self.on_all_engines(local, move |e| e.set_vector_coalescing_disabled(iv, cd));
    }

    pub(crate) fn apply_settings(&self, local: &mut IoEngine, s: Settings) {
        self.on_all_engines(local, move |e| e.apply_settings(s));
    }

    /// Controller Level Reset of the data path: every queue goes, all within
    /// `deadline` (one bound for the whole controller, not one per engine).
    pub(crate) fn reset(&mut self, local: &mut IoEngine, deadline: Deadline) {
        self.book = QueueBook::default();
        self.on_all_engines(local, move |e| e.reset_by(deadline));
    }
}
