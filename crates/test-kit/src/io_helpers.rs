//! Helpers for the I/O test tier: queues created one at a time (several SQs on one
//! CQ, CQs smaller than their SQs, CQs without interrupts), commands submitted and
//! completions reaped without letting the device run, doorbell updates that report
//! whether they trapped, raw shadow-buffer access, and SQE builders.
//!
//! Nothing here calls [`MockHost::process`]: the tests decide when the device runs,
//! which is what lets them model a device that only wakes on a trapped doorbell
//! write.

use std::collections::BTreeSet;
use std::sync::atomic::{fence, Ordering};

use nvme_spec::admin::{CreateIoCqCmd, CreateIoSqCmd, DeleteIoCqCmd, DeleteIoSqCmd};
use nvme_spec::command::Psdt;
use nvme_spec::nvm::ReadWriteCmd;
use nvme_spec::regs::{doorbell_offset, DoorbellKind};
use nvme_spec::sgl::SglDescriptor;
use nvme_spec::{Cqe, Sqe, CQE_SIZE, SQE_SIZE};

use crate::{HostError, MockHost, PAGE};

/// Host side of an I/O submission queue created on its own (see [`MockHost::new_io_sq`]).
#[derive(Debug)]
pub struct HostSq {
    pub qid: u16,
    pub cqid: u16,
    pub base: u64,
    pub size: u32,
    pub tail: u32,
    /// The controller's head as the host last learnt it (SQ Head Pointer of a CQE).
    pub head: u32,
    next_cid: u16,
    /// Command identifiers submitted and not yet completed.
    pub in_flight: BTreeSet<u16>,
}

impl HostSq {
    /// The host may not fill the last slot: a full ring would look empty.
    pub fn is_full(&self) -> bool {
        (self.tail + 1) % self.size == self.head
    }

    /// Records the completion of `cqe` (which must come from this SQ): frees its
    /// identifier and learns the head. Returns false for an identifier that was not
    /// in flight (a duplicate or invented completion).
    pub fn complete(&mut self, cqe: &Cqe) -> bool {
        assert_eq!(cqe.sqid.get(), self.qid, "completion routed to the wrong SQ");
        self.head = u32::from(cqe.sqhd.get());
        self.in_flight.remove(&cqe.cid.get())
    }
}

/// Host side of an I/O completion queue created on its own.
#[derive(Debug)]
pub struct HostCq {
    pub qid: u16,
    pub base: u64,
    pub size: u32,
    pub head: u32,
    pub phase: bool,
}

impl MockHost {
    /// Create I/O Completion Queue `qid` of `size` entries (physically contiguous).
    pub fn new_io_cq(&mut self, qid: u16, size: u32, ien: bool, iv: u16) -> Result<HostCq, HostError> {
        let base = self.alloc.alloc_pages((size as u64 * CQE_SIZE as u64).div_ceil(PAGE));
        let qsize_z = (size - 1) as u16;
        self.admin_ok(CreateIoCqCmd { qid, qsize_z, base, pc: true, ien, iv }.to_sqe())?;
        Ok(HostCq { qid, base, size, head: 0, phase: true })
    }

    /// Create I/O Submission Queue `qid` of `size` entries posting to CQ `cqid`.
    pub fn new_io_sq(&mut self, qid: u16, cqid: u16, size: u32) -> Result<HostSq, HostError> {
        let base = self.alloc.alloc_pages((size as u64 * SQE_SIZE as u64).div_ceil(PAGE));
        let qsize_z = (size - 1) as u16;
        self.admin_ok(CreateIoSqCmd { qid, qsize_z, base, pc: true, cqid, ..Default::default() }.to_sqe())?;
        Ok(HostSq { qid, cqid, base, size, tail: 0, head: 0, next_cid: 0, in_flight: BTreeSet::new() })
    }

    /// Delete I/O Submission Queue `qid`; returns the completion whatever its status.
    pub fn remove_io_sq(&mut self, qid: u16) -> Result<Cqe, HostError> {
        self.admin_cmd(DeleteIoSqCmd { qid }.to_sqe())
    }

    /// Delete I/O Completion Queue `qid`; returns the completion whatever its status.
    pub fn remove_io_cq(&mut self, qid: u16) -> Result<Cqe, HostError> {
        self.admin_cmd(DeleteIoCqCmd { qid }.to_sqe())
    }

    /// Writes `sqe` into `sq` with a fresh command identifier and updates the tail
    /// doorbell. Returns the identifier and whether the doorbell trapped, or None if
    /// the queue is full as far as the host knows.
    pub fn push_sqe(&mut self, sq: &mut HostSq, mut sqe: Sqe) -> Option<(u16, bool)> {
        if sq.is_full() {
            return None;
        }
        let cid = loop {
            let c = sq.next_cid;
            sq.next_cid = sq.next_cid.wrapping_add(1);
            if !sq.in_flight.contains(&c) {
                break c;
            }
        };
        sqe.set_cid(cid);
        self.mem.write_obj(sq.base + sq.tail as u64 * SQE_SIZE as u64, &sqe).expect("sq");
        fence(Ordering::Release);
        sq.tail = (sq.tail + 1) % sq.size;
        sq.in_flight.insert(cid);
        let rang = self.update_doorbell(sq.qid, DoorbellKind::SqTail, sq.tail);
        Some((cid, rang))
    }

    /// Consumes up to `max` new entries of `cq`, then updates its head doorbell once.
    /// Returns the entries and whether the doorbell trapped.
    pub fn pop_cqes(&mut self, cq: &mut HostCq, max: usize) -> (Vec<Cqe>, bool) {
        let mut out = Vec::new();
        while out.len() < max {
            match self.peek_cqe(cq.base, cq.head, cq.phase) {
                Some(c) => out.push(c),
                None => break,
            }
            cq.head += 1;
            if cq.head == cq.size {
                cq.head = 0;
                cq.phase = !cq.phase;
            }
        }
        let rang = !out.is_empty() && self.update_doorbell(cq.qid, DoorbellKind::CqHead, cq.head);
        (out, rang)
    }

    /// The entry at `index` of the CQ at `base` if its phase tag is `phase`.
    fn peek_cqe(&self, base: u64, index: u32, phase: bool) -> Option<Cqe> {
        let addr = base + index as u64 * CQE_SIZE as u64;
        let dw3 = self.mem.load_u32(addr + 12).expect("cq");
        if ((dw3 >> 16) & 1 != 0) != phase {
            return None;
        }
        fence(Ordering::Acquire);
        Some(self.mem.read_obj(addr).expect("cq"))
    }

    /// Like [`MockHost::submit`] on a queue pair, also saying whether the doorbell trapped.
    pub fn submit_counted(&mut self, qid: u16, mut sqe: Sqe) -> Option<(u16, bool)> {
        let q = &mut self.io[qid as usize - 1];
        let cid = q.free_cids.pop_front()?;
        sqe.set_cid(cid);
        let (base, tail, size) = (q.sq_base, q.sq_tail, q.size);
        q.sq_tail = (tail + 1) % size;
        let new_tail = q.sq_tail;
        self.mem.write_obj(base + tail as u64 * SQE_SIZE as u64, &sqe).expect("sq");
        fence(Ordering::Release);
        let rang = self.update_doorbell(qid, DoorbellKind::SqTail, new_tail);
        Some((cid, rang))
    }

    /// Like [`MockHost::reap_queue`] on a queue pair, but takes at most `max` entries and
    /// says whether the CQ head doorbell trapped.
    pub fn reap_some(&mut self, qid: u16, max: usize) -> (Vec<Cqe>, bool) {
        let mut out = Vec::new();
        loop {
            let q = &self.io[qid as usize - 1];
            if out.len() >= max {
                break;
            }
            let Some(c) = self.peek_cqe(q.cq_base, q.cq_head, q.phase) else { break };
            let q = &mut self.io[qid as usize - 1];
            q.cq_head += 1;
            if q.cq_head == q.size {
                q.cq_head = 0;
                q.phase = !q.phase;
            }
            if !q.free_cids.contains(&c.cid.get()) {
                q.free_cids.push_back(c.cid.get());
            }
            out.push(c);
        }
        let head = self.io[qid as usize - 1].cq_head;
        let rang = !out.is_empty() && self.update_doorbell(qid, DoorbellKind::CqHead, head);
        (out, rang)
    }

    /// Writes an admin command and rings the admin tail without running the device
    /// (for Asynchronous Event Requests, which complete later). Returns its identifier.
    pub fn admin_post(&mut self, mut sqe: Sqe) -> u16 {
        let q = self.admin.as_mut().expect("enabled");
        let cid = q.free_cids.pop_front().expect("admin cid");
        sqe.set_cid(cid);
        let (base, tail, size) = (q.sq_base, q.sq_tail, q.size);
        self.mem.write_obj(base + tail as u64 * SQE_SIZE as u64, &sqe).expect("sq");
        let q = self.admin.as_mut().expect("enabled");
        q.sq_tail = (tail + 1) % size;
        let t = q.sq_tail;
        self.ring(0, DoorbellKind::SqTail, t);
        cid
    }

    /// Trapped doorbell register writes so far (what would have woken the device).
    pub fn doorbell_writes(&self) -> u64 {
        self.ctrl.stats().doorbell_writes
    }

    /// The host's shadow doorbell slot of `qid`/`kind` (None without shadow doorbells).
    pub fn shadow_slot(&self, qid: u16, kind: DoorbellKind) -> Option<u32> {
        let b = self.dbbuf?;
        Some(self.mem.load_u32(b.shadow + doorbell_offset(qid, kind, self.dstrd)).expect("shadow"))
    }

    /// Overwrites a shadow doorbell slot without touching the register (a buggy or
    /// hostile host).
    pub fn set_shadow_slot(&mut self, qid: u16, kind: DoorbellKind, v: u32) {
        let b = self.dbbuf.expect("shadow doorbells");
        self.mem.store_u32(b.shadow + doorbell_offset(qid, kind, self.dstrd), v).expect("shadow");
    }

    /// The controller's EventIdx for `qid`/`kind` (None without shadow doorbells).
    pub fn eventidx_slot(&self, qid: u16, kind: DoorbellKind) -> Option<u32> {
        let b = self.dbbuf?;
        Some(self.mem.load_u32(b.eventidx + doorbell_offset(qid, kind, self.dstrd)).expect("eventidx"))
    }

    /// An I/O SQE addressed by SLBA/NLB with no data pointer (Write Zeroes, Verify,
    /// or a base to add one to). `nlb` is not 0's based.
    pub fn lba_sqe(opcode: u8, nsid: u32, slba: u64, nlb: u32) -> Sqe {
        ReadWriteCmd { nsid, slba, nlb_z: nlb.wrapping_sub(1) as u16, ..Default::default() }.to_sqe(opcode)
    }

    /// An I/O SQE addressed by SLBA/NLB whose data pointer is SGL Descriptor 1 `d`
    /// (PSDT 01b).
    pub fn sgl_sqe(opcode: u8, nsid: u32, slba: u64, nlb: u32, d: &SglDescriptor) -> Sqe {
        let mut s = Self::lba_sqe(opcode, nsid, slba, nlb);
        s.set_cdw0(opcode, 0, Psdt::SglMptrContiguous);
        s.set_sgl1(d);
        s
    }
}
