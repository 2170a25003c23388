//! An engine's queues in a saved controller state: what it saves of each, and how
//! checked saved queues are put back.

use nvme_spec::regs::DoorbellKind;
use nvme_spec::Cqe;
use zerocopy::IntoBytes;

use super::IoEngine;
use crate::queue::{CompletionQueue, CqState, SqState, SubmissionQueue};
use crate::saved::hex;
use crate::stats::QueueSnapshot;

impl IoEngine {
    /// This engine's queues, as saved.
    pub(crate) fn save_queues(&self) -> (Vec<SqState>, Vec<CqState>) {
        let sqs = self
            .queues
            .sqs()
            .map(|(qid, q)| SqState {
                qid,
                cqid: q.cqid,
                base: q.base,
                size: q.size,
                head: q.head,
                tail: q.tail,
                eventidx: q.arm.published(),
                page_seen: self.doorbells.seen(qid, DoorbellKind::SqTail),
            })
            .collect();
        let cqs = self
            .queues
            .cqs()
            .map(|(qid, q)| CqState {
                qid,
                base: q.base,
                size: q.size,
                head: q.head,
                tail: q.tail,
                phase: q.phase,
                ien: q.irq.ien,
                iv: q.irq.iv,
                overflow: q.overflow.iter().map(|c| hex(c.as_bytes())).collect(),
                waiting_for_space: q.waiting_for_space,
                page_seen: self.doorbells.seen(qid, DoorbellKind::CqHead),
            })
            .collect();
        (sqs, cqs)
    }

    /// Each queue's counters that moved (the counters are shared by every engine).
    pub(crate) fn save_queue_stats(&self) -> Vec<QueueSnapshot> {
        self.io
            .ctx
            .queue_stats
            .iter()
            .enumerate()
            .map(|(qid, q)| q.snapshot(qid as u16, None))
            .filter(|q| *q != QueueSnapshot { qid: q.qid, ..Default::default() })
            .collect()
    }

    /// Saved queue counters put back (checked: no queue beyond this controller's).
    pub(crate) fn restore_queue_stats(&self, saved: &[QueueSnapshot]) {
        for q in saved {
            if let Some(c) = self.io.ctx.queue_stats.get(q.qid as usize) {
                c.restore(q);
            }
        }
    }

    /// Puts checked saved queues in place as they were (`queue::saved::check`):
    /// nothing is written to guest memory (the shadow slots and EventIdx there are
    /// the live ones). Each CQ comes with its decoded overflow.
    pub(crate) fn install_queues(&mut self, sqs: &[SqState], cqs: &[(CqState, Vec<Cqe>)]) {
        for (c, overflow) in cqs {
            let mut q = CompletionQueue::new(c.base, c.size, c.ien, c.iv);
            (q.head, q.tail, q.phase, q.waiting_for_space) = (c.head, c.tail, c.phase, c.waiting_for_space);
            q.overflow.extend(overflow.iter().copied());
            self.queues.insert_cq(c.qid, q);
            self.doorbells.restore_seen(c.qid, DoorbellKind::CqHead, c.page_seen);
        }
        for s in sqs {
            // EventIdx is published again here (`resume`): what the saved process
            // last published need not be what guest memory holds any more.
            let mut q = SubmissionQueue::new(s.cqid, s.base, s.size);
            (q.head, q.tail) = (s.head, s.tail);
            self.queues.insert_sq(s.qid, q);
            self.doorbells.restore_seen(s.qid, DoorbellKind::SqTail, s.page_seen);
        }
    }
}
