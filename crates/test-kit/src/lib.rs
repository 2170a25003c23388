//! A mock host that drives an [`nvme_ctrl::Controller`] the way Linux's nvme driver
//! (drivers/nvme/host/pci.c) does, over mock guest memory in this process.
//!
//! It initialises the controller (disable, program the admin queue, enable, wait for
//! RDY), identifies it, sets the number of queues, creates I/O queue pairs, sends
//! Doorbell Buffer Config *after* the queues exist, and then runs I/O. With shadow
//! doorbells it writes each new tail or head into the shadow buffer and writes the
//! doorbell register only when the EventIdx rule says so; without, every update is a
//! register write. The device side runs when the host waits ([`MockHost::process`]),
//! as an I/O thread would.
//!
//! Tests, the fuzz target and the microbenchmark are all built on this.
#![forbid(unsafe_code)]

mod admin_helpers;
pub mod io_helpers;
mod irq;

use std::collections::VecDeque;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use guest_mem::GuestMemory;
use nvme_ctrl::{Clock, Controller, ControllerConfig};
use nvme_spec::admin::{
    CreateIoCqCmd, CreateIoSqCmd, DoorbellBufferConfigCmd, GetFeaturesCmd, GetLogPageCmd, IdentifyCmd,
    SetFeaturesCmd,
};
use nvme_spec::features::{fid, NumberOfQueues};
use nvme_spec::identify::cns;
use nvme_spec::nvm::ReadWriteCmd;
use nvme_spec::opcode::nvm as iop;
use nvme_spec::regs::{doorbell_offset, need_event, offset, Aqa, Cap, Cc, Csts, DoorbellKind};
use nvme_spec::{Cqe, Sqe, Status, CQE_SIZE, SQE_SIZE};

pub use irq::{CountingIrq, ManualClock};

/// Memory page size the host uses (CC.MPS = 0).
pub const PAGE: u64 = 4096;

/// Where the mock host keeps things in guest memory.
#[derive(Debug)]
pub struct Allocator {
    next: u64,
    end: u64,
}

impl Allocator {
    /// Allocates `len` bytes aligned to `align` (a power of two).
    pub fn alloc(&mut self, len: u64, align: u64) -> u64 {
        let at = self.next.next_multiple_of(align);
        assert!(at + len <= self.end, "mock guest memory exhausted");
        self.next = at + len;
        at
    }
    pub fn alloc_pages(&mut self, n: u64) -> u64 {
        self.alloc(n * PAGE, PAGE)
    }
}

/// Host-side state of one queue pair.
#[derive(Debug)]
pub struct HostQueue {
    pub qid: u16,
    pub sq_base: u64,
    pub cq_base: u64,
    pub size: u32,
    pub sq_tail: u32,
    pub cq_head: u32,
    pub phase: bool,
    /// Command identifiers free for use.
    free_cids: VecDeque<u16>,
}

impl HostQueue {
    fn new(qid: u16, sq_base: u64, cq_base: u64, size: u32) -> Self {
        // One slot is always empty in a full ring: size - 1 commands at most.
        let free_cids = (0..(size - 1) as u16).collect();
        HostQueue { qid, sq_base, cq_base, size, sq_tail: 0, cq_head: 0, phase: true, free_cids }
    }
    pub fn outstanding(&self) -> u32 {
        (self.size - 1).saturating_sub(self.free_cids.len() as u32)
    }
}

/// Shadow doorbell buffers on the host side.
#[derive(Clone, Copy, Debug)]
pub struct HostDbbuf {
    pub shadow: u64,
    pub eventidx: u64,
}

/// Options for [`MockHost::init`].
#[derive(Clone, Copy, Debug)]
pub struct InitOptions {
    pub io_queues: u16,
    /// Entries per I/O queue.
    pub queue_size: u32,
    pub admin_queue_size: u32,
    /// Send Doorbell Buffer Config and use shadow doorbells (if OACS bit 8 is set).
    pub shadow_doorbells: bool,
    /// Interrupt vector per I/O CQ (qid % vectors), like Linux's one vector per queue.
    pub interrupts: bool,
}

impl Default for InitOptions {
    fn default() -> Self {
        InitOptions {
            io_queues: 4,
            queue_size: 256,
            admin_queue_size: 32,
            shadow_doorbells: true,
            interrupts: true,
        }
    }
}

/// Why a host operation failed.
#[derive(Debug)]
pub enum HostError {
    /// The controller did not become ready (CSTS.CFS or RDY never set).
    NotReady(u32),
    /// A command completed with an error status.
    Command(Status),
    /// A command produced no completion.
    NoCompletion,
}

/// The mock host.
#[derive(Debug)]
pub struct MockHost {
    pub ctrl: Controller,
    pub mem: GuestMemory,
    pub alloc: Allocator,
    pub irq: Arc<CountingIrq>,
    pub admin: Option<HostQueue>,
    /// I/O queue pairs, index = qid - 1.
    pub io: Vec<HostQueue>,
    pub dbbuf: Option<HostDbbuf>,
    pub dstrd: u8,
    /// A scratch page for admin data transfers.
    pub admin_buf: u64,
}

impl MockHost {
    /// A host with `mem_bytes` of guest memory at guest physical address 0.
    pub fn new(cfg: ControllerConfig, mem_bytes: u64) -> Self {
        Self::build(cfg, mem_bytes, None)
    }

    /// As [`MockHost::new`] with a controller clock the test controls.
    pub fn with_clock(cfg: ControllerConfig, mem_bytes: u64, clock: Arc<dyn Clock>) -> Self {
        Self::build(cfg, mem_bytes, Some(clock))
    }

    fn build(cfg: ControllerConfig, mem_bytes: u64, clock: Option<Arc<dyn Clock>>) -> Self {
        let mem = GuestMemory::anonymous(&[(0, mem_bytes)]).expect("guest memory");
        let irq = Arc::new(CountingIrq::new(cfg.msix_vectors));
        let dstrd = cfg.dstrd;
        let ctrl = match clock {
            Some(c) => Controller::with_clock(cfg, mem.clone(), irq.clone(), c),
            None => Controller::new(cfg, mem.clone(), irq.clone()),
        }
        .expect("controller");
        // Page 0 stays unused so address 0 is never a valid buffer.
        let mut alloc = Allocator { next: PAGE, end: mem_bytes };
        let admin_buf = alloc.alloc_pages(64);
        MockHost { ctrl, mem, alloc, irq, admin: None, io: Vec::new(), dbbuf: None, dstrd, admin_buf }
    }

    // ---- registers

    pub fn read32(&self, off: u64) -> u32 {
        let mut b = [0u8; 4];
        self.ctrl.mmio_read(off, &mut b);
        u32::from_le_bytes(b)
    }
    pub fn read64(&self, off: u64) -> u64 {
        let mut b = [0u8; 8];
        self.ctrl.mmio_read(off, &mut b);
        u64::from_le_bytes(b)
    }
    pub fn write32(&mut self, off: u64, v: u32) {
        self.ctrl.mmio_write(off, &v.to_le_bytes());
    }
    pub fn write64(&mut self, off: u64, v: u64) {
        self.ctrl.mmio_write(off, &v.to_le_bytes());
    }
    pub fn csts(&self) -> Csts {
        Csts(self.read32(offset::CSTS))
    }
    pub fn cap(&self) -> Cap {
        Cap(self.read64(offset::CAP))
    }

    /// Writes doorbell `kind` of queue `qid` in BAR0 (a trapped write).
    pub fn ring(&mut self, qid: u16, kind: DoorbellKind, v: u32) {
        let off = offset::DOORBELL_BASE + doorbell_offset(qid, kind, self.dstrd);
        self.write32(off, v);
    }

    /// Lets the device run until it has nothing left to do.
    pub fn process(&mut self) {
        while self.ctrl.process() {}
    }

    // ---- initialisation, as nvme_reset_work does it

    /// Disables, programs the admin queue and enables the controller.
    pub fn enable(&mut self, admin_size: u32) -> Result<(), HostError> {
        self.write32(offset::CC, 0);
        if self.csts().rdy() {
            return Err(HostError::NotReady(self.csts().0));
        }
        self.io.clear();
        self.dbbuf = None;
        let asq = self.alloc.alloc_pages((admin_size as u64 * SQE_SIZE as u64).div_ceil(PAGE));
        let acq = self.alloc.alloc_pages((admin_size as u64 * CQE_SIZE as u64).div_ceil(PAGE));
        self.write32(offset::AQA, Aqa::new(admin_size as u16 - 1, admin_size as u16 - 1).0);
        self.write64(offset::ASQ, asq);
        self.write64(offset::ACQ, acq);
        // Linux writes CC without EN first, then with EN.
        self.write32(offset::CC, Cc::LINUX.0);
        self.write32(offset::CC, Cc::LINUX.with_en(true).0);
        let csts = self.csts();
        if !csts.rdy() || csts.cfs() {
            return Err(HostError::NotReady(csts.0));
        }
        self.admin = Some(HostQueue::new(0, asq, acq, admin_size));
        Ok(())
    }

    /// The whole Linux bring-up: enable, Identify, Number of Queues, create queue
    /// pairs, then (optionally) Doorbell Buffer Config.
    pub fn init(&mut self, opts: InitOptions) -> Result<(), HostError> {
        self.enable(opts.admin_queue_size)?;
        let id = self.identify(cns::CONTROLLER, 0)?;
        let oacs = u16::from_le_bytes([id[256], id[257]]);
        let n = opts.io_queues - 1;
        self.set_feature(fid::NUMBER_OF_QUEUES, NumberOfQueues::new(n, n).0)?;
        for qid in 1..=opts.io_queues {
            self.create_queue_pair(qid, opts.queue_size, opts.interrupts)?;
        }
        if opts.shadow_doorbells && oacs & (1 << 8) != 0 {
            self.doorbell_buffer_config()?;
        }
        Ok(())
    }

    /// Creates I/O CQ and SQ `qid` with `size` entries.
    pub fn create_queue_pair(&mut self, qid: u16, size: u32, interrupts: bool) -> Result<(), HostError> {
        let cq = self.alloc.alloc_pages((size as u64 * CQE_SIZE as u64).div_ceil(PAGE));
        let sq = self.alloc.alloc_pages((size as u64 * SQE_SIZE as u64).div_ceil(PAGE));
        let qsize_z = (size - 1) as u16;
        self.admin_ok(CreateIoCqCmd { qid, qsize_z, base: cq, pc: true, ien: interrupts, iv: qid }.to_sqe())?;
        self.admin_ok(
            CreateIoSqCmd { qid, qsize_z, base: sq, pc: true, cqid: qid, ..Default::default() }.to_sqe(),
        )?;
        let q = HostQueue::new(qid, sq, cq, size);
        let idx = qid as usize - 1;
        if self.io.len() <= idx {
            self.io.resize_with(idx + 1, || HostQueue::new(0, 0, 0, 2));
        }
        self.io[idx] = q;
        Ok(())
    }

    /// Sends Doorbell Buffer Config with two fresh zeroed pages.
    pub fn doorbell_buffer_config(&mut self) -> Result<(), HostError> {
        let shadow = self.alloc.alloc_pages(1);
        let eventidx = self.alloc.alloc_pages(1);
        self.admin_ok(DoorbellBufferConfigCmd { shadow_doorbell: shadow, eventidx }.to_sqe())?;
        self.dbbuf = Some(HostDbbuf { shadow, eventidx });
        Ok(())
    }

    // ---- admin commands

    /// Submits an admin command (always with a register write, as Linux does for the
    /// admin queue), lets the device run and returns its completion.
    pub fn admin_cmd(&mut self, mut sqe: Sqe) -> Result<Cqe, HostError> {
        let q = self.admin.as_mut().expect("enabled");
        let cid = q.free_cids.pop_front().expect("admin cid");
        sqe.set_cid(cid);
        let (base, tail, size) = (q.sq_base, q.sq_tail, q.size);
        self.mem.write_obj(base + tail as u64 * SQE_SIZE as u64, &sqe).expect("sq");
        let q = self.admin.as_mut().expect("enabled");
        q.sq_tail = (tail + 1) % size;
        let t = q.sq_tail;
        self.ring(0, DoorbellKind::SqTail, t);
        self.process();
        let mut got = None;
        for c in self.reap_queue(0) {
            if c.cid.get() == cid {
                got = Some(c);
            }
        }
        got.ok_or(HostError::NoCompletion)
    }

    /// Like [`MockHost::admin_cmd`], failing on an error status.
    pub fn admin_ok(&mut self, sqe: Sqe) -> Result<Cqe, HostError> {
        let c = self.admin_cmd(sqe)?;
        if c.status().is_success() {
            Ok(c)
        } else {
            Err(HostError::Command(c.status()))
        }
    }

    /// Identify into the admin buffer; returns the 4096 bytes.
    pub fn identify(&mut self, cns: u8, nsid: u32) -> Result<Vec<u8>, HostError> {
        let mut c = IdentifyCmd { nsid, cns, ..Default::default() }.to_sqe();
        c.set_prps(self.admin_buf, 0);
        self.admin_ok(c)?;
        let mut v = vec![0u8; 4096];
        self.mem.read(self.admin_buf, &mut v).expect("admin buf");
        Ok(v)
    }

    pub fn set_feature(&mut self, fid: u8, value: u32) -> Result<Cqe, HostError> {
        self.admin_ok(SetFeaturesCmd { fid, cdw11: value, ..Default::default() }.to_sqe())
    }

    pub fn get_feature(&mut self, fid: u8, cdw11: u32) -> Result<Cqe, HostError> {
        let mut c = GetFeaturesCmd { fid, cdw11, ..Default::default() }.to_sqe();
        c.set_prps(self.admin_buf, 0);
        self.admin_ok(c)
    }

    /// Get Log Page of `len` bytes (a multiple of 4) into the admin buffer.
    pub fn get_log(&mut self, lid: u8, nsid: u32, len: u32, rae: bool) -> Result<Vec<u8>, HostError> {
        if len as u64 > 2 * PAGE {
            panic!("mock host get_log supports up to 8 KiB");
        }
        let mut c = GetLogPageCmd { nsid, lid, rae, numd_z: len / 4 - 1, ..Default::default() }.to_sqe();
        c.set_prps(self.admin_buf, self.admin_buf + PAGE);
        self.admin_ok(c)?;
        let mut v = vec![0u8; len as usize];
        self.mem.read(self.admin_buf, &mut v).expect("admin buf");
        Ok(v)
    }

    // ---- I/O submission, the Linux way

    /// Updates a doorbell the way Linux's `nvme_dbbuf_update_and_check_event` does:
    /// with shadow doorbells, store the new value in the shadow slot, full barrier,
    /// read EventIdx, and write the register only if the update crossed it. The admin
    /// queue never uses the shadow buffer. Returns true if the register was written
    /// (a trapped write, which is what wakes a real device).
    pub fn update_doorbell(&mut self, qid: u16, kind: DoorbellKind, v: u32) -> bool {
        if let (Some(b), true) = (self.dbbuf, qid != 0) {
            let off = doorbell_offset(qid, kind, self.dstrd);
            let old = self.mem.load_u32(b.shadow + off).expect("shadow");
            self.mem.store_u32(b.shadow + off, v).expect("shadow");
            // Pairs with the controller's fence between publishing EventIdx and
            // re-reading the shadow slot (nvme_ctrl::doorbell).
            fence(Ordering::SeqCst);
            let ei = self.mem.load_u32(b.eventidx + off).expect("eventidx");
            if !need_event(ei as u16, v as u16, old as u16) {
                return false;
            }
        }
        self.ring(qid, kind, v);
        true
    }

    fn queue_mut(&mut self, qid: u16) -> &mut HostQueue {
        if qid == 0 {
            self.admin.as_mut().expect("enabled")
        } else {
            &mut self.io[qid as usize - 1]
        }
    }

    /// Writes one command into SQ `qid` and updates the tail doorbell. Returns its
    /// command identifier, or None if the queue is full.
    pub fn submit(&mut self, qid: u16, mut sqe: Sqe) -> Option<u16> {
        let q = self.queue_mut(qid);
        let cid = q.free_cids.pop_front()?;
        sqe.set_cid(cid);
        let (base, tail, size) = (q.sq_base, q.sq_tail, q.size);
        q.sq_tail = (tail + 1) % size;
        let new_tail = q.sq_tail;
        self.mem.write_obj(base + tail as u64 * SQE_SIZE as u64, &sqe).expect("sq");
        // The entry must be visible before the tail (Linux: wmb in the doorbell path).
        fence(Ordering::Release);
        self.update_doorbell(qid, DoorbellKind::SqTail, new_tail);
        Some(cid)
    }

    /// Consumes every new completion of CQ `qid`, then updates the CQ head doorbell
    /// once (Linux rings it once per interrupt / poll pass).
    pub fn reap_queue(&mut self, qid: u16) -> Vec<Cqe> {
        let mut out = Vec::new();
        let mem = self.mem.clone();
        let q = self.queue_mut(qid);
        loop {
            let addr = q.cq_base + q.cq_head as u64 * CQE_SIZE as u64;
            let dw3 = mem.load_u32(addr + 12).expect("cq");
            if ((dw3 >> 16) & 1 != 0) != q.phase {
                break;
            }
            let cqe: Cqe = mem.read_obj(addr).expect("cq");
            q.cq_head += 1;
            if q.cq_head == q.size {
                q.cq_head = 0;
                q.phase = !q.phase;
            }
            let cid = cqe.cid.get();
            if !q.free_cids.contains(&cid) {
                q.free_cids.push_back(cid);
            }
            out.push(cqe);
        }
        if !out.is_empty() {
            let head = q.cq_head;
            self.update_doorbell(qid, DoorbellKind::CqHead, head);
        }
        out
    }

    /// Number of commands submitted to queue `qid` and not yet reaped.
    pub fn outstanding(&self, qid: u16) -> u32 {
        if qid == 0 {
            self.admin.as_ref().map_or(0, |q| q.outstanding())
        } else {
            self.io[qid as usize - 1].outstanding()
        }
    }

    /// Runs one command on I/O queue `qid` to completion.
    pub fn io_cmd(&mut self, qid: u16, sqe: Sqe) -> Cqe {
        let cid = self.submit(qid, sqe).expect("queue has room");
        for _ in 0..1000 {
            self.process();
            if let Some(c) = self.reap_queue(qid).into_iter().find(|c| c.cid.get() == cid) {
                return c;
            }
        }
        panic!("no completion for cid {cid} on queue {qid}");
    }

    /// A Read or Write SQE for `nlb` blocks at `slba` of `nsid`, data at `buf`
    /// (contiguous guest memory) described with PRPs (a PRP list built in `list`
    /// when it spans more than two pages).
    pub fn rw_sqe(&mut self, opcode: u8, nsid: u32, slba: u64, nlb: u32, buf: u64, len: u64) -> Sqe {
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
        let s = self.rw_sqe(iop::WRITE, nsid, slba, nlb, buf, data.len() as u64);
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
        let s = self.rw_sqe(iop::READ, nsid, slba, nlb, buf, len);
        let st = self.io_cmd(qid, s).status();
        let mut v = vec![0u8; len as usize];
        self.mem.read(buf, &mut v).expect("buf");
        (st, v)
    }
}
