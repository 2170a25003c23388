//! The actions that go around the driver: register writes and reads, CC toggles,
//! raw doorbell values, writes into shadow slots and rings, scribbles, memory map
//! changes and controller runs. Most of them taint the run (see the parent module).
use guest_mem::GuestMemory;
use nvme_spec::regs::{doorbell_offset, offset, Aqa, Cc, DoorbellKind};
use nvme_spec::{CQE_SIZE, SQE_SIZE};
use test_kit::PAGE;

use super::{Fuzzer, MAX_INITS, MEM_BYTES};
use crate::program::{
    CcOp, Doorbell, MemoryOp, Process, ReadReg, RegWrite, RingWrite, Scribble, ShadowWrite,
};

impl Fuzzer<'_> {
    // ---- registers

    pub(super) fn reg_write(&mut self, r: RegWrite) {
        let v = r.value;
        let (off, taints) = match r.reg % 12 {
            0 | 11 => (offset::CC, true),
            1 => (offset::AQA, true),
            2 => (offset::ASQ + 4 * (r.size as u64 >> 7), true),
            3 => (offset::ACQ + 4 * (r.size as u64 >> 7), true),
            4 => (offset::INTMS, false),
            5 => (offset::INTMC, false),
            6 => (offset::NSSR, false),
            7 => (
                [
                    offset::CAP,
                    offset::VS,
                    offset::CSTS,
                    offset::CMBLOC,
                    offset::CMBSZ,
                    offset::BPINFO,
                    offset::CRTO,
                ][(v >> 56) as usize % 7],
                false,
            ),
            8 => ((v >> 40) % offset::DOORBELL_BASE, true),
            9 => (offset::DOORBELL_BASE + (v >> 32) % 0x1000, true),
            _ => (v.rotate_left(17), true),
        };
        if taints {
            self.tainted = true;
        }
        let len = [4usize, 8, 4, 8, 1, 2, 3, 16][r.size as usize % 8];
        let mut data = [0u8; 16];
        data[..8].copy_from_slice(&v.to_le_bytes());
        self.h.ctrl.mmio_write(off, &data[..len]);
    }

    pub(super) fn read_reg(&mut self, r: ReadReg) {
        let off = if r.size & 0x80 != 0 { (r.off as u64) << 8 } else { r.off as u64 % 0x1100 };
        let len = [4usize, 8, 1, 2, 3, 16, 0, 4][r.size as usize % 8];
        let mut b = [0u8; 16];
        self.h.ctrl.mmio_read(off, &mut b[..len]);
    }

    pub(super) fn cc_op(&mut self, c: CcOp) {
        let cur = self.h.read32(offset::CC);
        match c.op % 8 {
            0 => {
                self.tainted = true;
                self.h.write32(offset::CC, 0);
            }
            1 => {
                self.tainted = true;
                self.h.write32(offset::CC, Cc::LINUX.with_en(true).0);
            }
            // Shutdown: completions posted while shutting down are real ones, and
            // nothing runs afterwards, so the host's view stays valid.
            2 => self.h.write32(offset::CC, cur | (1 << 14)),
            3 => self.h.write32(offset::CC, cur | (2 << 14)),
            4 => {
                self.tainted = true;
                self.h.write32(offset::CC, c.value | 1);
            }
            5 => self.reset_and_reenable(),
            6 => {
                if self.inits >= MAX_INITS {
                    self.stats.skipped += 1;
                    return;
                }
                self.inits += 1;
                self.forget_all();
                self.zero_next_allocations();
                self.tainted = self.h.enable(2 + c.value % 63).is_err();
                self.admin_reused = false;
            }
            _ => self.h.write32(offset::CC, cur & !(3 << 14)),
        }
    }

    /// A controller reset and re-enable on the same admin queue memory, as Linux's
    /// reset work does it: CC.EN = 0, clear the CQ, program the admin queue, enable.
    pub(super) fn reset_and_reenable(&mut self) {
        let Some(q) = self.h.admin.as_ref() else {
            self.stats.skipped += 1;
            return;
        };
        let (sq, cq, size) = (q.sq.base, q.cq.base, q.size());
        self.h.write32(offset::CC, 0);
        self.forget_all();
        self.admin_reused = true;
        self.h.io.clear();
        self.h.dbbuf = None;
        self.h.mem.fill(cq, size as u64 * CQE_SIZE as u64, 0).expect("admin CQ");
        self.h.mem.fill(sq, size as u64 * SQE_SIZE as u64, 0).expect("admin SQ");
        let q = self.h.admin.as_mut().expect("checked");
        q.sq.tail = 0;
        q.cq.head = 0;
        q.cq.phase = true;
        self.h.write32(offset::AQA, Aqa::new(size as u16 - 1, size as u16 - 1).0);
        self.h.write64(offset::ASQ, sq);
        self.h.write64(offset::ACQ, cq);
        self.h.write32(offset::CC, Cc::LINUX.0);
        self.h.write32(offset::CC, Cc::LINUX.with_en(true).0);
        let csts = self.h.csts();
        self.tainted = !csts.rdy() || csts.cfs();
    }

    // ---- doorbells and guest memory

    pub(super) fn doorbell(&mut self, d: Doorbell) {
        let kind = if d.kind & 1 == 0 { DoorbellKind::SqTail } else { DoorbellKind::CqHead };
        if d.kind & 0x10 != 0 {
            // A repeated ring of the host's current value: harmless, so not tainting.
            let qids = self.host_qids();
            if qids.is_empty() {
                self.stats.skipped += 1;
                return;
            }
            let qid = qids[d.qid as usize % qids.len()];
            let q = self.host_queue(qid).expect("listed");
            let v = if kind == DoorbellKind::SqTail { q.sq.tail } else { q.cq.head };
            self.h.ring(qid, kind, v);
            return;
        }
        self.tainted = true;
        let qid = if d.kind & 2 != 0 { d.qid } else { d.qid % (self.p.max_io_queues + 3) };
        let value = if d.kind & 0x20 != 0 { d.value } else { d.value % 80 };
        let extra = [0u64, 0, 0, 1, 2, 3, 4, 0x2000][(d.kind >> 2) as usize & 7];
        let off = offset::DOORBELL_BASE + doorbell_offset(qid, kind, self.p.dstrd) + extra;
        self.h.ctrl.mmio_write(off, &value.to_le_bytes());
    }

    pub(super) fn shadow_write(&mut self, s: ShadowWrite) {
        let Some(b) = self.h.dbbuf else {
            self.stats.skipped += 1;
            return;
        };
        let kind = if s.which & 1 == 0 { DoorbellKind::SqTail } else { DoorbellKind::CqHead };
        let eventidx = s.which & 2 != 0;
        // The controller never reads EventIdx, so inline only shadow stores break
        // agreement. A worker that sleeps until a doorbell is another matter: a stale
        // EventIdx tells the host not to ring, so the worker never looks.
        if !eventidx || self.p.workers {
            self.tainted = true;
        }
        let qid = s.qid % (self.p.max_io_queues + 2);
        let base = if eventidx { b.eventidx } else { b.shadow };
        let value = if s.which & 4 != 0 { s.value } else { s.value % 80 };
        let addr = base + doorbell_offset(qid, kind, self.p.dstrd);
        let _ = self.h.mem.store_u32(addr, value);
    }

    pub(super) fn ring_write(&mut self, r: RingWrite) {
        let qids = self.host_qids();
        if qids.is_empty() {
            self.stats.skipped += 1;
            return;
        }
        self.tainted = true;
        let q = self.host_queue(qids[r.queue as usize % qids.len()]).expect("listed");
        let (base, entry) = if r.which & 1 == 0 { (q.sq.base, SQE_SIZE) } else { (q.cq.base, CQE_SIZE) };
        let idx = r.index as u64 % q.size() as u64;
        let within = (r.which as u64 >> 1) % (entry as u64 / 16) * 16;
        let _ = self.h.mem.write(base + idx * entry as u64 + within, &r.bytes);
    }

    pub(super) fn scribble(&mut self, s: Scribble) {
        self.tainted = true;
        let addr = self.wild(s.addr) % MEM_BYTES;
        let len = (1 + s.len as u64 % 64).min(MEM_BYTES - addr);
        let bytes: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(s.seed).wrapping_add(s.seed)).collect();
        let _ = self.h.mem.write(addr, &bytes);
    }

    /// Changes the controller's memory map (vfio-user DMA unmap / map); the host
    /// keeps all of it.
    pub(super) fn memory_op(&mut self, m: MemoryOp) {
        let pages = MEM_BYTES / PAGE;
        let (a, b) = (m.a as u64 % pages, 1 + m.b as u64 % pages);
        let mut regions: Vec<(u64, u64)> = Vec::new();
        match m.op % 5 {
            0 => {}
            1 => {
                // A hole of b pages at page a.
                let end = (a + b).min(pages);
                regions.push((0, a));
                regions.push((end, pages - end));
            }
            2 => regions.push((0, a)),
            3 => {
                // Two pieces mapped at their own addresses, split at page a.
                regions.push((0, a));
                regions.push((a, pages - a));
            }
            _ => regions.push((0, pages)),
        }
        let mut mem = GuestMemory::empty();
        for (start, n) in regions.into_iter().filter(|r| r.1 > 0) {
            mem = mem.with_region(start * PAGE, n * PAGE, self.map.clone(), start * PAGE).expect("region");
        }
        self.memory_reduced = mem.size() != MEM_BYTES;
        self.h.ctrl.set_memory(mem);
    }

    pub(super) fn process(&mut self, p: Process) {
        if p.n & 0x80 != 0 {
            self.h.ctrl.set_arm_eventidx(p.n & 0x40 != 0);
        }
        self.run_device(1 + p.n as u32 % 8);
    }
}
