//! An engine's queue table: its SQs and CQs by identifier, the lists of those that
//! exist (what loops over them walk, in ascending order), and the round-robin turn
//! among the SQs (arbitration, Base §3.4.4).
//!
//! Creating or deleting a queue through the table keeps the lists in step; nothing
//! else writes them. Which SQs post to which CQ is the controller's book
//! (`runtime::routing`), the one record the admin side validates against.

use crate::queue::{CompletionQueue, SubmissionQueue};

#[derive(Debug)]
pub(crate) struct QueueTable {
    sqs: Vec<Option<SubmissionQueue>>,
    cqs: Vec<Option<CompletionQueue>>,
    /// Identifiers of existing SQs, ascending: the arbitration order.
    active_sqs: Vec<u16>,
    /// Identifiers of existing CQs, ascending.
    active_cqs: Vec<u16>,
    /// Where the next round-robin turn starts in `active_sqs`.
    turn: usize,
}

impl QueueTable {
    /// Room for queue identifiers 0..=`max_qid`, none created.
    pub fn new(max_qid: u16) -> Self {
        let n = max_qid as usize + 1;
        QueueTable {
            sqs: (0..n).map(|_| None).collect(),
            cqs: (0..n).map(|_| None).collect(),
            active_sqs: Vec::new(),
            active_cqs: Vec::new(),
            turn: 0,
        }
    }

    #[inline]
    pub fn sq(&self, qid: u16) -> Option<&SubmissionQueue> {
        self.sqs.get(qid as usize).and_then(Option::as_ref)
    }

    #[inline]
    pub fn sq_mut(&mut self, qid: u16) -> Option<&mut SubmissionQueue> {
        self.sqs.get_mut(qid as usize).and_then(Option::as_mut)
    }

    #[inline]
    pub fn cq(&self, qid: u16) -> Option<&CompletionQueue> {
        self.cqs.get(qid as usize).and_then(Option::as_ref)
    }

    #[inline]
    pub fn cq_mut(&mut self, qid: u16) -> Option<&mut CompletionQueue> {
        self.cqs.get_mut(qid as usize).and_then(Option::as_mut)
    }

    /// Puts CQ `qid` in place (replacing one of that identifier).
    pub fn insert_cq(&mut self, qid: u16, cq: CompletionQueue) {
        self.cqs[qid as usize] = Some(cq);
        if let Err(pos) = self.active_cqs.binary_search(&qid) {
            self.active_cqs.insert(pos, qid);
        }
    }

    /// Puts SQ `qid` in place.
    pub fn insert_sq(&mut self, qid: u16, sq: SubmissionQueue) {
        self.sqs[qid as usize] = Some(sq);
        if let Err(pos) = self.active_sqs.binary_search(&qid) {
            self.active_sqs.insert(pos, qid);
        }
    }

    /// Takes SQ `qid` out.
    pub fn remove_sq(&mut self, qid: u16) -> Option<SubmissionQueue> {
        let sq = self.sqs.get_mut(qid as usize)?.take()?;
        self.active_sqs.retain(|&q| q != qid);
        Some(sq)
    }

    pub fn remove_cq(&mut self, qid: u16) {
        if let Some(c) = self.cqs.get_mut(qid as usize) {
            *c = None;
        }
        self.active_cqs.retain(|&q| q != qid);
    }

    /// Every CQ gone (SQs are removed one by one first).
    pub fn clear_cqs(&mut self) {
        self.cqs.iter_mut().for_each(|q| *q = None);
        self.active_cqs.clear();
    }

    /// Existing SQs, ascending.
    #[inline]
    pub fn active_sqs(&self) -> &[u16] {
        &self.active_sqs
    }

    /// Existing CQs, ascending.
    #[inline]
    pub fn active_cqs(&self) -> &[u16] {
        &self.active_cqs
    }

    /// The SQ whose round-robin turn it is, moving the turn on.
    #[inline]
    pub fn next_in_turn(&mut self) -> Option<u16> {
        if self.active_sqs.is_empty() {
            return None;
        }
        if self.turn >= self.active_sqs.len() {
            self.turn = 0;
        }
        let qid = self.active_sqs[self.turn];
        self.turn += 1;
        Some(qid)
    }

    /// The SQ whose turn comes next (saved with the state).
    pub fn upcoming(&self) -> Option<u16> {
        self.active_sqs.get(self.turn % self.active_sqs.len().max(1)).copied()
    }

    /// Makes SQ `qid` the next in turn (a restore).
    pub fn set_upcoming(&mut self, qid: u16) {
        self.turn = self.active_sqs.iter().position(|&x| x == qid).unwrap_or(0);
    }

    /// Existing SQs, ascending, with their identifiers.
    pub fn sqs(&self) -> impl Iterator<Item = (u16, &SubmissionQueue)> {
        self.sqs.iter().enumerate().filter_map(|(i, q)| q.as_ref().map(|q| (i as u16, q)))
    }

    /// Existing CQs, ascending, with their identifiers.
    pub fn cqs(&self) -> impl Iterator<Item = (u16, &CompletionQueue)> {
        self.cqs.iter().enumerate().filter_map(|(i, q)| q.as_ref().map(|q| (i as u16, q)))
    }
}
