//! The I/O facade: queue pairs (submit, reap, run one command to completion, read
//! and write blocks), queues created one at a time (several SQs on one CQ, CQs
//! smaller than their SQs, CQs without interrupts), doorbell updates that report
//! whether they trapped, raw shadow-buffer access, and SQE builders.
//!
//! Only the methods that wait for a completion ([`MockHost::io_cmd`],
//! [`MockHost::write_blocks`], [`MockHost::read_blocks`]) and the queue creation
//! (an admin command) run the device; submitting and reaping never do, so tests
//! decide when the device runs, which is what lets them model a device that only
//! wakes on a trapped doorbell write.

use std::collections::BTreeSet;

use nvme_spec::admin::{CreateIoCqCmd, CreateIoSqCmd, DeleteIoCqCmd, DeleteIoSqCmd};
use nvme_spec::command::Psdt;
use nvme_spec::nvm::ReadWriteCmd;
use nvme_spec::opcode::nvm as iop;
use nvme_spec::regs::{doorbell_offset, DoorbellKind};
use nvme_spec::sgl::SglDescriptor;
use nvme_spec::{Cqe, Sqe, Status, CQE_SIZE, SQE_SIZE};

use crate::ring::{CqRing, SqRing};
use crate::{HostError, HostQueue, MockHost, PAGE};

/// Host side of an I/O submission queue created on its own (see [`MockHost::new_io_sq`]),
/// handing out fresh command identifiers.
#[derive(Debug)]
pub struct HostSq {
    pub ring: SqRing,
    pub cqid: u16,
    /// The controller's head as the host last learnt it (SQ Head Pointer of a CQE).
    pub head: u32,
    next_cid: u16,
    /// Command identifiers submitted and not yet completed.
    pub in_flight: BTreeSet<u16>,
}

impl HostSq {
    /// The host may not fill the last slot: a full ring would look empty.
    pub fn is_full(&self) -> bool {
        (self.ring.tail + 1) % self.ring.size == self.head
    }

    /// Records the completion of `cqe` (which must come from this SQ): frees its
    /// identifier and learns the head. Returns false for an identifier that was not
    /// in flight (a duplicate or invented completion).
    pub fn complete(&mut self, cqe: &Cqe) -> bool {
        assert_eq!(cqe.sqid.get(), self.ring.qid, "completion routed to the wrong SQ");
        self.head = u32::from(cqe.sqhd.get());
        self.in_flight.remove(&cqe.cid.get())
    }
}

impl MockHost {
    /// Create I/O Completion Queue `qid` of `size` entries (physically contiguous).
    pub fn new_io_cq(&mut self, qid: u16, size: u32, ien: bool, iv: u16) -> Result<CqRing, HostError> {
        let base = self.alloc.alloc_pages((size as u64 * CQE_SIZE as u64).div_ceil(PAGE));
        let qsize_z = (size - 1) as u16;
        self.admin_ok(CreateIoCqCmd { qid, qsize_z, base, pc: true, ien, iv }.to_sqe())?;
        Ok(CqRing::new(qid, base, size))
    }

    /// Create I/O Submission Queue `qid` of `size` entries posting to CQ `cqid`.
    pub fn new_io_sq(&mut self, qid: u16, cqid: u16, size: u32) -> Result<HostSq, HostError> {
        let base = self.alloc.alloc_pages((size as u64 * SQE_SIZE as u64).div_ceil(PAGE));
        let qsize_z = (size - 1) as u16;
        self.admin_ok(CreateIoSqCmd { qid, qsize_z, base, pc: true, cqid, ..Default::default() }.to_sqe())?;
        Ok(HostSq {
            ring: SqRing::new(qid, base, size),
            cqid,
            head: 0,
            next_cid: 0,
            in_flight: BTreeSet::new(),
        })
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
    /// the queue is full as far as the host knows. Does not run the device.
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
        let rang = self.sq_push(&mut sq.ring, &sqe);
        sq.in_flight.insert(cid);
        Some((cid, rang))
    }

    /// Consumes up to `max` new entries of `cq`, then updates its head doorbell once.
    /// Returns the entries and whether the doorbell trapped. Does not run the device.
    pub fn pop_cqes(&mut self, cq: &mut CqRing, max: usize) -> (Vec<Cqe>, bool) {
        self.cq_pop(cq, max)
    }

    // ---- queue pairs (and the admin queue, qid 0)

    fn queue_mut(&mut self, qid: u16) -> &mut HostQueue {
        if qid == 0 {
            self.admin.as_mut().expect("enabled")
        } else {
            &mut self.io[qid as usize - 1]
        }
    }

    /// Writes one command into SQ `qid` (0 is the admin queue) and updates the tail
    /// doorbell. Returns its command identifier and whether the doorbell trapped, or
    /// None if the queue is full. Does not run the device.
    pub fn submit_counted(&mut self, qid: u16, mut sqe: Sqe) -> Option<(u16, bool)> {
        let q = self.queue_mut(qid);
        let cid = q.take_cid()?;
        sqe.set_cid(cid);
        let mut sq = q.sq;
        let rang = self.sq_push(&mut sq, &sqe);
        self.queue_mut(qid).sq = sq;
        Some((cid, rang))
    }

    /// As [`MockHost::submit_counted`], without saying whether the doorbell trapped.
    pub fn submit(&mut self, qid: u16, sqe: Sqe) -> Option<u16> {
        self.submit_counted(qid, sqe).map(|(cid, _)| cid)
    }

    /// Consumes up to `max` new completions of CQ `qid` (0 is the admin queue),
    /// freeing their command identifiers, then updates the CQ head doorbell once.
    /// Returns them and whether the doorbell trapped. Does not run the device.
    pub fn reap_some(&mut self, qid: u16, max: usize) -> (Vec<Cqe>, bool) {
        let mut cq = self.queue_mut(qid).cq;
        let (out, rang) = self.cq_pop(&mut cq, max);
        let q = self.queue_mut(qid);
        q.cq = cq;
        for c in &out {
            q.release_cid(c.cid.get());
        }
        (out, rang)
    }

    /// Every new completion of CQ `qid` (see [`MockHost::reap_some`]).
    pub fn reap_queue(&mut self, qid: u16) -> Vec<Cqe> {
        self.reap_some(qid, usize::MAX).0
    }

    /// Number of commands submitted to queue `qid` and not yet reaped.
    pub fn outstanding(&self, qid: u16) -> u32 {
        if qid == 0 {
            self.admin.as_ref().map_or(0, |q| q.outstanding())
        } else {
            self.io[qid as usize - 1].outstanding()
        }
    }

    /// Runs one command on I/O queue `qid` to completion (bounded: 10 s, which only a
    /// lost completion exceeds; with worker threads the completion comes from another
    /// thread, so the wait is in time, not in calls).
    pub fn io_cmd(&mut self, qid: u16, sqe: Sqe) -> Cqe {
        let cid = self.submit(qid, sqe).expect("queue has room");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut spins = 0u32;
        while std::time::Instant::now() < deadline {
            self.process();
            if let Some(c) = self.reap_queue(qid).into_iter().find(|c| c.cid.get() == cid) {
                return c;
            }
            spins += 1;
            if spins > 1000 {
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
        }
        panic!("no completion for cid {cid} on queue {qid}");
    }

    /// A Read or Write SQE for `nlb` blocks at `slba` of `nsid`, its data the `len`
    /// bytes at `buf` (`data`: contiguous guest memory), described with PRPs (a PRP
    /// list built in `list` when it spans more than two pages).
    pub fn rw_sqe(&mut self, opcode: u8, nsid: u32, slba: u64, nlb: u32, data: (u64, u64)) -> Sqe {
        let (buf, len) = data;
        let nlb_z = u16::try_from(nlb - 1).expect("NLB is a 16-bit field");
        let mut s = ReadWriteCmd { nsid, slba, nlb_z, ..Default::default() }.to_sqe(opcode);
        let (prp1, prp2) = self.build_prps(buf, len);
        s.set_prps(prp1, prp2);
        s
    }

    /// PRP1/PRP2 for a contiguous buffer, allocating a PRP list when needed.
    pub fn build_prps(&mut self, buf: u64, len: u64) -> (u64, u64) {
        let first = PAGE - (buf % PAGE);
        if len <= first {
            return (buf, 0);
        }
        if len <= first + PAGE {
            return (buf, buf + first);
        }
        let pages: Vec<u64> = {
            let mut v = Vec::new();
            let mut p = buf + first;
            while p < buf + len {
                v.push(p);
                p += PAGE;
            }
            v
        };
        // One list page holds 512 entries; chain further pages through the last one.
        let per = (PAGE / 8) as usize;
        let nlists = if pages.len() <= per { 1 } else { (pages.len() - 1).div_ceil(per - 1) };
        let lists = self.alloc.alloc_pages(nlists as u64);
        let mut idx = 0;
        for l in 0..nlists {
            let base = lists + l as u64 * PAGE;
            let remaining = pages.len() - idx;
            let take = if remaining <= per { remaining } else { per - 1 };
            for j in 0..take {
                self.mem.write(base + j as u64 * 8, &pages[idx + j].to_le_bytes()).expect("prp list");
            }
            idx += take;
            if idx < pages.len() {
                self.mem.write(base + (per as u64 - 1) * 8, &(base + PAGE).to_le_bytes()).expect("prp list");
            }
        }
        (buf, lists)
    }

    /// Writes `data` to `nsid` at `slba` through queue `qid`.
    pub fn write_blocks(&mut self, qid: u16, nsid: u32, slba: u64, lba_size: u32, data: &[u8]) -> Status {
        let buf = self.alloc.alloc(data.len() as u64, PAGE);
        self.mem.write(buf, data).expect("buf");
        let nlb = (data.len() / lba_size as usize) as u32;
        let s = self.rw_sqe(iop::WRITE, nsid, slba, nlb, (buf, data.len() as u64));
        self.io_cmd(qid, s).status()
    }

    /// Reads `nlb` blocks from `nsid` at `slba` through queue `qid`.
    pub fn read_blocks(
        &mut self,
        qid: u16,
        nsid: u32,
        slba: u64,
        nlb: u32,
        lba_size: u32,
    ) -> (Status, Vec<u8>) {
        let len = nlb as u64 * lba_size as u64;
        let buf = self.alloc.alloc(len, PAGE);
        let s = self.rw_sqe(iop::READ, nsid, slba, nlb, (buf, len));
        let st = self.io_cmd(qid, s).status();
        let mut v = vec![0u8; len as usize];
        self.mem.read(buf, &mut v).expect("buf");
        (st, v)
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
