//! The mock host's state and the Linux bring-up: guest memory and its allocator,
//! BAR0 register access, the queues the host created, and `nvme_reset_work`'s
//! sequence (enable, Identify, Number of Queues, queue pairs, Doorbell Buffer Config).

use std::collections::VecDeque;
use std::sync::Arc;

use guest_mem::GuestMemory;
use nvme_ctrl::{Clock, Controller, ControllerConfig};
use nvme_spec::admin::{CreateIoCqCmd, CreateIoSqCmd, DoorbellBufferConfigCmd};
use nvme_spec::features::{fid, NumberOfQueues};
use nvme_spec::identify::cns;
use nvme_spec::regs::{offset, Cap, Csts, DoorbellKind};
use nvme_spec::{Status, CQE_SIZE, SQE_SIZE};

use crate::bar::{AdminQueue, Bar0};
use crate::irq::CountingIrq;
use crate::ring::{CqRing, SqRing};

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

/// Host-side state of one queue pair (an SQ posting to the CQ of the same
/// identifier), with a fixed set of command identifiers it recycles.
#[derive(Debug)]
pub struct HostQueue {
    pub qid: u16,
    pub sq: SqRing,
    pub cq: CqRing,
    /// Command identifiers free for use.
    free_cids: VecDeque<u16>,
}

impl HostQueue {
    pub(crate) fn new(qid: u16, sq_base: u64, cq_base: u64, size: u32) -> Self {
        // One slot is always empty in a full ring: size - 1 commands at most.
        let free_cids = (0..(size - 1) as u16).collect();
        HostQueue { qid, sq: SqRing::new(qid, sq_base, size), cq: CqRing::new(qid, cq_base, size), free_cids }
    }

    /// Entries in each ring.
    pub fn size(&self) -> u32 {
        self.sq.size
    }

    pub fn outstanding(&self) -> u32 {
        (self.size() - 1).saturating_sub(self.free_cids.len() as u32)
    }

    /// Takes a free command identifier (None: as many commands as the ring holds are
    /// outstanding).
    pub(crate) fn take_cid(&mut self) -> Option<u16> {
        self.free_cids.pop_front()
    }

    /// Returns the identifier of a reaped completion to the free set (once, whatever
    /// the controller posted).
    pub(crate) fn release_cid(&mut self, cid: u16) {
        if !self.free_cids.contains(&cid) {
            self.free_cids.push_back(cid);
        }
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
        self.ctrl.ring(self.dstrd, qid, kind, v);
    }

    /// Lets the device run until it has nothing left to do.
    pub fn process(&mut self) {
        while self.ctrl.process() {}
    }

    // ---- initialisation, as nvme_reset_work does it

    /// Disables, programs the admin queue and enables the controller.
    pub fn enable(&mut self, admin_size: u32) -> Result<(), HostError> {
        self.io.clear();
        self.dbbuf = None;
        let asq = self.alloc.alloc_pages((admin_size as u64 * SQE_SIZE as u64).div_ceil(PAGE));
        let acq = self.alloc.alloc_pages((admin_size as u64 * CQE_SIZE as u64).div_ceil(PAGE));
        // The controller is in this process: each change is done when the register
        // write returns, so nothing is waited for.
        let admin = AdminQueue { asq, acq, entries: admin_size as u16 };
        crate::bar::enable(&mut self.ctrl, admin, 0).map_err(HostError::NotReady)?;
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
}
