//! The one submit path and the one reap path, over any [`Bar0`]: every way a test
//! host sends a command ends in [`Doorbells::sq_push`], every way it consumes
//! completions in [`Doorbells::cq_pop`], and both update their doorbell through
//! [`Doorbells::update`] (the mock host and the vfio-user test host both use them). Command identifiers are the facades' business
//! (a queue pair recycles a fixed set, a queue created on its own hands out fresh
//! ones); the ring positions, the memory ordering and the doorbell rule live here.
//!
//! Ordering, both directions in guest memory shared with the controller, which may
//! run on I/O worker threads:
//! - SQ: the entry is written, then a release fence, then the new tail is published
//!   (shadow slot or register). Pairs with the controller's acquire of the tail
//!   (`nvme_ctrl::doorbell`): a worker that sees the tail sees the entry.
//! - CQ: the controller writes dwords 0-2, a release fence, then dword 3 with the
//!   phase tag (`nvme_ctrl::queue::cq`). The host reads dword 3 with an acquire load
//!   and only then the whole entry, so a phase tag that says "new" guarantees the rest
//!   is new too. Both former reap paths needed this; one had an extra
//!   `fence(Acquire)` after the load and the other relied on the load alone. The load
//!   is enough (`GuestMemory::load_u32` is `Acquire`), which is what this path does.

use std::sync::atomic::{fence, Ordering};

use nvme_spec::regs::{doorbell_offset, need_event, DoorbellKind};
use nvme_spec::{Cqe, Sqe, CQE_SIZE, SQE_SIZE};

use guest_mem::GuestMemory;

use crate::bar::Bar0;
use crate::{HostDbbuf, MockHost};

/// Host side of a submission queue ring: where it is and the tail the host wrote.
#[derive(Clone, Copy, Debug)]
pub struct SqRing {
    pub qid: u16,
    pub base: u64,
    pub size: u32,
    pub tail: u32,
}

/// Host side of a completion queue ring: where it is, the head the host consumed to,
/// and the phase tag a new entry carries.
#[derive(Clone, Copy, Debug)]
pub struct CqRing {
    pub qid: u16,
    pub base: u64,
    pub size: u32,
    pub head: u32,
    pub phase: bool,
}

impl SqRing {
    pub fn new(qid: u16, base: u64, size: u32) -> Self {
        SqRing { qid, base, size, tail: 0 }
    }
}

impl CqRing {
    pub fn new(qid: u16, base: u64, size: u32) -> Self {
        CqRing { qid, base, size, head: 0, phase: true }
    }
}

/// How a host updates its doorbells: through the shadow buffer when it sent Doorbell
/// Buffer Config, else registers; `dstrd` is CAP.DSTRD.
#[derive(Clone, Copy, Debug, Default)]
pub struct Doorbells {
    pub dbbuf: Option<HostDbbuf>,
    pub dstrd: u8,
}

impl Doorbells {
    /// Updates a doorbell the way Linux's `nvme_dbbuf_update_and_check_event` does:
    /// with shadow doorbells, store the new value in the shadow slot, full barrier,
    /// read EventIdx, and write the register only if the update crossed it. The admin
    /// queue never uses the shadow buffer. Returns true if the register was written
    /// (a trapped write, which is what wakes a real device).
    pub fn update<B: Bar0 + ?Sized>(
        &self,
        mem: &GuestMemory,
        bar: &mut B,
        qid: u16,
        kind: DoorbellKind,
        v: u32,
    ) -> bool {
        if let (Some(b), true) = (self.dbbuf, qid != 0) {
            let off = doorbell_offset(qid, kind, self.dstrd);
            let old = mem.load_u32(b.shadow + off).expect("shadow");
            mem.store_u32(b.shadow + off, v).expect("shadow");
            // Pairs with the controller's fence between publishing EventIdx and
            // re-reading the shadow slot (nvme_ctrl::doorbell).
            fence(Ordering::SeqCst);
            let ei = mem.load_u32(b.eventidx + off).expect("eventidx");
            if !need_event(ei as u16, v as u16, old as u16) {
                return false;
            }
        }
        bar.ring(self.dstrd, qid, kind, v);
        true
    }

    /// The submit path: writes `sqe` (its command identifier already set) at the tail
    /// of `sq`, advances the tail and updates the tail doorbell. Returns whether the
    /// doorbell register was written. Never waits for the device. The caller checks
    /// for room (a full ring would look empty).
    pub fn sq_push<B: Bar0 + ?Sized>(
        &self,
        mem: &GuestMemory,
        bar: &mut B,
        sq: &mut SqRing,
        sqe: &Sqe,
    ) -> bool {
        sq.write(mem, sqe);
        self.update(mem, bar, sq.qid, DoorbellKind::SqTail, sq.tail)
    }

    /// The reap path: consumes up to `max` new entries of `cq`, then updates its head
    /// doorbell once (Linux rings it once per interrupt or poll pass). Returns the
    /// entries and whether the doorbell register was written. Never waits.
    pub fn cq_pop<B: Bar0 + ?Sized>(
        &self,
        mem: &GuestMemory,
        bar: &mut B,
        cq: &mut CqRing,
        max: usize,
    ) -> (Vec<Cqe>, bool) {
        let mut out = Vec::new();
        while out.len() < max {
            let Some(c) = cq.take(mem) else { break };
            out.push(c);
        }
        let rang = !out.is_empty() && self.update(mem, bar, cq.qid, DoorbellKind::CqHead, cq.head);
        (out, rang)
    }
}

impl SqRing {
    /// Writes `sqe` at the tail and advances it, the entry visible before the tail
    /// is published (Linux: wmb in the doorbell path; pairs with the controller's
    /// acquire load of the tail it is told about). No doorbell.
    pub fn write(&mut self, mem: &GuestMemory, sqe: &Sqe) {
        mem.write_obj(self.base + self.tail as u64 * SQE_SIZE as u64, sqe).expect("sq");
        self.tail = (self.tail + 1) % self.size;
        fence(Ordering::Release);
    }
}

impl CqRing {
    /// The next new entry, if the controller posted one; the head moves past it. No
    /// doorbell.
    pub fn take(&mut self, mem: &GuestMemory) -> Option<Cqe> {
        let addr = self.base + self.head as u64 * CQE_SIZE as u64;
        // The acquire load of the dword with the phase tag pairs with the
        // controller's release fence before it writes that dword
        // (nvme_ctrl::queue::cq): dwords 0-2 read below are the new entry's.
        let dw3 = mem.load_u32(addr + 12).expect("cq");
        if ((dw3 >> 16) & 1 != 0) != self.phase {
            return None;
        }
        let c = mem.read_obj(addr).expect("cq");
        self.head += 1;
        if self.head == self.size {
            self.head = 0;
            self.phase = !self.phase;
        }
        Some(c)
    }
}

impl MockHost {
    /// How this host updates doorbells now.
    pub fn doorbells(&self) -> Doorbells {
        Doorbells { dbbuf: self.dbbuf, dstrd: self.dstrd }
    }

    /// [`Doorbells::update`] on this host's controller.
    pub fn update_doorbell(&mut self, qid: u16, kind: DoorbellKind, v: u32) -> bool {
        self.doorbells().update(&self.mem, &mut self.ctrl, qid, kind, v)
    }

    /// [`Doorbells::sq_push`] on this host's controller.
    pub fn sq_push(&mut self, sq: &mut SqRing, sqe: &Sqe) -> bool {
        self.doorbells().sq_push(&self.mem, &mut self.ctrl, sq, sqe)
    }

    /// [`Doorbells::cq_pop`] on this host's controller.
    pub fn cq_pop(&mut self, cq: &mut CqRing, max: usize) -> (Vec<Cqe>, bool) {
        self.doorbells().cq_pop(&self.mem, &mut self.ctrl, cq, max)
    }
}
