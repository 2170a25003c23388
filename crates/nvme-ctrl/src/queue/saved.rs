//! The queues' part of a saved controller state, and its check.

use nvme_spec::Cqe;
use serde::{Deserialize, Serialize};
use zerocopy::FromBytes;

use crate::saved::{has_duplicates, unhex};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SqState {
    pub qid: u16,
    pub cqid: u16,
    pub base: u64,
    pub size: u32,
    pub head: u32,
    pub tail: u32,
    /// The EventIdx last published for it (None: not yet, or re-arm pending).
    pub eventidx: Option<u32>,
    /// The last value seen in the mapped doorbell page (doorbells mapped).
    #[serde(default)]
    pub page_seen: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CqState {
    pub qid: u16,
    pub base: u64,
    pub size: u32,
    pub head: u32,
    pub tail: u32,
    pub phase: bool,
    pub ien: bool,
    pub iv: u16,
    /// Completions waiting for room (the CQ was full), oldest first, each as 32 hex
    /// digits (the 16-byte entry, phase bit not yet set).
    pub overflow: Vec<String>,
    pub waiting_for_space: bool,
    #[serde(default)]
    pub page_seen: u32,
}

/// What saved queues must fit: this controller's limits and the saved registers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QueueBounds {
    /// The highest queue identifier this controller has.
    pub max_qid: u16,
    /// Entries an I/O queue may have (CAP.MQES + 1).
    pub io_entries: u32,
    /// Interrupt vectors this controller has.
    pub vectors: u16,
    /// The memory page size the saved controller ran with.
    pub page_size: u64,
    /// I/O queues granted (Number of Queues, 0's based).
    pub nsq_granted_z: u16,
    pub ncq_granted_z: u16,
    /// The admin queues as AQA, ASQ and ACQ describe them (base, entries of the SQ;
    /// base, entries of the CQ), if the controller was enabled; None: disabled, with
    /// no queue at all.
    pub admin: Option<((u64, u32), (u64, u32))>,
}

/// A CQ with its waiting completions decoded.
pub(crate) type CheckedCq = (CqState, Vec<Cqe>);

/// The queues: each within this controller's limits and its own, admin queues as
/// the registers say, every SQ on a CQ of the state. Returns the CQs with their
/// decoded overflow.
pub(crate) fn check(sqs: &[SqState], cqs: &[CqState], b: &QueueBounds) -> Result<Vec<CheckedCq>, String> {
    if has_duplicates(sqs.iter().map(|q| q.qid)) || has_duplicates(cqs.iter().map(|q| q.qid)) {
        return Err("a queue identifier twice".into());
    }
    let (admin_sq, admin_cq) = (sqs.iter().find(|q| q.qid == 0), cqs.iter().find(|q| q.qid == 0));
    match b.admin {
        None if !(sqs.is_empty() && cqs.is_empty()) => return Err("queues on a disabled controller".into()),
        None => {}
        Some(((asq, asqs), (acq, acqs))) => {
            let admin_ok = admin_sq.is_some_and(|q| q.base == asq && q.size == asqs && q.cqid == 0)
                && admin_cq.is_some_and(|q| q.base == acq && q.size == acqs && q.iv == 0);
            if !admin_ok {
                return Err("the admin queues are not the ones AQA, ASQ and ACQ describe".into());
            }
        }
    }
    let max_qid = b.max_qid;
    let limit = |qid: u16| if qid == 0 { 4096 } else { b.io_entries };
    let granted = |qid: u16, z: u16| qid == 0 || qid as u32 <= z as u32 + 1;
    let mut out = Vec::with_capacity(cqs.len());
    for c in cqs {
        let what = format!("CQ {}", c.qid);
        if c.qid > max_qid || !granted(c.qid, b.ncq_granted_z) {
            return Err(format!("{what}: beyond the queues granted (this controller has {max_qid})"));
        }
        if c.size < 2 || c.size > limit(c.qid) || c.head >= c.size || c.tail >= c.size {
            return Err(format!("{what}: size {} (head {}, tail {})", c.size, c.head, c.tail));
        }
        if !c.base.is_multiple_of(b.page_size) {
            return Err(format!("{what}: base {:#x} not page aligned", c.base));
        }
        if c.iv >= b.vectors {
            return Err(format!("{what}: vector {} beyond {}", c.iv, b.vectors));
        }
        let posting: u64 =
            sqs.iter().filter(|q| q.cqid == c.qid).map(|q| q.size.saturating_sub(1) as u64).sum();
        if c.overflow.len() as u64 > posting {
            return Err(format!("{what}: {} completions waiting, more than its SQs hold", c.overflow.len()));
        }
        let mut overflow = Vec::with_capacity(c.overflow.len());
        for e in &c.overflow {
            let b = unhex(e, 16).map_err(|why| format!("{what}: {why}"))?;
            overflow.push(Cqe::read_from_bytes(&b).map_err(|_| format!("{what}: CQE"))?);
        }
        out.push((c.clone(), overflow));
    }
    for q in sqs {
        let what = format!("SQ {}", q.qid);
        if q.qid > max_qid || !granted(q.qid, b.nsq_granted_z) {
            return Err(format!("{what}: beyond the queues granted (this controller has {max_qid})"));
        }
        if q.size < 2 || q.size > limit(q.qid) || q.head >= q.size || q.tail >= q.size {
            return Err(format!("{what}: size {} (head {}, tail {})", q.size, q.head, q.tail));
        }
        if !q.base.is_multiple_of(b.page_size) {
            return Err(format!("{what}: base {:#x} not page aligned", q.base));
        }
        if (q.qid == 0) != (q.cqid == 0) || !cqs.iter().any(|c| c.qid == q.cqid) {
            return Err(format!("{what} posts to CQ {}, which is not in the state", q.cqid));
        }
    }
    Ok(out)
}
