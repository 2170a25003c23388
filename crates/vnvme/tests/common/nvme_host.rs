//! `NvmeOverVfioUser`: a minimal NVMe host that drives the served controller across the
//! socket the way a guest driver would, with nothing but raw register writes
//! (REGION_WRITE to BAR0) and a memfd shared through DMA_MAP that holds the queues and
//! data buffers. Deliberately independent of the `nvme-driver` crate: its rings and
//! its bring-up are the test kit's (`test_kit::ring`, `test_kit::bar`), over a
//! [`Bar0`] that is the socket.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use guest_mem::GuestMemory;
use nvme_spec::admin::{CreateIoCqCmd, CreateIoSqCmd, IdentifyCmd};
use nvme_spec::identify::{cns, flbas, IdentifyNamespace};
use nvme_spec::nvm::ReadWriteCmd;
use nvme_spec::regs::{doorbell_offset, offset, Cap, DoorbellKind};
use nvme_spec::{Cqe, Sqe};
use test_kit::bar::{self, AdminQueue, Bar0};
use test_kit::{CqRing, Doorbells, SqRing};
use vfio_user::client::Client;
use vfio_user::proto::{IRQ_INDEX_MSIX, REGION_BAR0};

use test_util::memfd::memfd;

use super::{TestEventFd, TIMEOUT};

/// IOVA of the shared memfd.
pub const IOVA: u64 = 0x4000_0000;
/// Size of the shared memfd.
pub const MEM_SIZE: u64 = 4 << 20;
const ASQ: u64 = IOVA;
const ACQ: u64 = IOVA + 0x1000;
const IO_SQ: u64 = IOVA + 0x10000;
const IO_CQ: u64 = IOVA + 0x20000;
const ID_BUF: u64 = IOVA + 0x30000;
/// Data buffers: one 4 KiB page per slot.
const DATA: u64 = IOVA + 0x100000;
pub const SLOTS: u16 = 512;
pub const PAGE: u64 = 4096;
const ADMIN_DEPTH: u16 = 32;
/// MSI-X vector of the I/O completion queue.
pub const IO_VECTOR: u16 = 1;

/// A queue pair: an SQ and the CQ of the same identifier.
#[derive(Debug)]
struct Queue {
    sq: SqRing,
    cq: CqRing,
}

impl Queue {
    fn new(qid: u16, sq: u64, cq: u64, depth: u16) -> Self {
        Queue { sq: SqRing::new(qid, sq, depth as u32), cq: CqRing::new(qid, cq, depth as u32) }
    }

    fn none() -> Self {
        Queue::new(0, 0, 0, 2)
    }

    fn depth(&self) -> u16 {
        self.sq.size as u16
    }
}

/// BAR0 over the socket: REGION_READ and REGION_WRITE; a wait is a short sleep.
#[derive(Debug)]
struct SocketBar<'a>(&'a mut Client);

impl Bar0 for SocketBar<'_> {
    fn read(&mut self, off: u64, out: &mut [u8]) {
        self.0.region_read(REGION_BAR0, off, out).expect("BAR0 read");
    }
    fn write(&mut self, off: u64, data: &[u8]) {
        self.0.region_write(REGION_BAR0, off, data).expect("BAR0 write");
    }
    fn pause(&mut self) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Pauses of 1 ms a wait for CSTS.RDY may take.
const READY_PAUSES: u32 = TIMEOUT.as_millis() as u32;

/// The host side of one controller, over one vfio-user connection.
#[derive(Debug)]
pub struct NvmeOverVfioUser {
    pub client: Client,
    _fd: OwnedFd,
    /// Our view of the shared memory, addressed by IOVA.
    pub mem: GuestMemory,
    dstrd: u8,
    admin: Queue,
    io: Queue,
    next_cid: u16,
    /// Logical block size of namespace 1 (from Identify Namespace).
    pub lba_size: u64,
    /// The namespace reads and writes go to (1 unless a test changes it).
    pub nsid: u32,
    /// Eventfd wired to the I/O queue's MSI-X vector, if interrupts were asked for.
    pub irq: Option<TestEventFd>,
}

impl NvmeOverVfioUser {
    /// Shares a fresh memfd with the server (DMA_MAP at [`IOVA`]).
    pub fn new(client: Client) -> Self {
        Self::with_memfd(client, memfd(MEM_SIZE))
    }

    /// Shares `fd` (a sealed memfd of at least [`MEM_SIZE`] bytes) with the server.
    pub fn with_memfd(mut client: Client, fd: OwnedFd) -> Self {
        client.dma_map(IOVA, MEM_SIZE, Some(fd.as_fd()), 0).expect("DMA_MAP of the host memfd");
        let mem =
            GuestMemory::empty().with_fd_region(IOVA, MEM_SIZE, fd.as_fd(), 0, true).expect("map memfd");
        let mut h = NvmeOverVfioUser {
            client,
            _fd: fd,
            mem,
            dstrd: 0,
            admin: Queue::none(),
            io: Queue::none(),
            next_cid: 1,
            lba_size: 512,
            nsid: 1,
            irq: None,
        };
        h.dstrd = Cap(h.read64(offset::CAP)).dstrd();
        h
    }

    fn bar(&mut self) -> SocketBar<'_> {
        SocketBar(&mut self.client)
    }

    pub fn read32(&mut self, off: u64) -> u32 {
        self.bar().read32(off)
    }

    pub fn read64(&mut self, off: u64) -> u64 {
        self.bar().read64(off)
    }

    pub fn write32(&mut self, off: u64, v: u32) {
        self.bar().write32(off, v)
    }

    pub fn write64(&mut self, off: u64, v: u64) {
        self.bar().write64(off, v)
    }

    /// Waits (bounded) for CSTS.RDY to become `ready`; fails on CSTS.CFS.
    pub fn wait_ready(&mut self, ready: bool) {
        if let Err(csts) = bar::wait_ready(&mut self.bar(), ready, READY_PAUSES) {
            panic!("CSTS.RDY did not become {ready} within {TIMEOUT:?} (CSTS {csts:#x})");
        }
    }

    /// CC.EN = 0 through a register write; waits for CSTS.RDY = 0.
    pub fn disable(&mut self) {
        self.write32(offset::CC, 0);
        self.wait_ready(false);
    }

    /// Controller bring-up from whatever state it is in, as Linux does it
    /// (`test_kit::bar::enable`): disable, program AQA/ASQ/ACQ, set CC.EN with
    /// 64-byte SQEs and 16-byte CQEs, wait for CSTS.RDY.
    pub fn enable(&mut self) {
        // Stopped before its queues' memory is cleared under it.
        self.disable();
        self.mem.fill(IOVA, DATA - IOVA, 0).unwrap();
        let admin = AdminQueue { asq: ASQ, acq: ACQ, entries: ADMIN_DEPTH };
        if let Err(csts) = bar::enable(&mut self.bar(), admin, READY_PAUSES) {
            panic!("the controller did not become ready within {TIMEOUT:?} (CSTS {csts:#x})");
        }
        self.admin = Queue::new(0, ASQ, ACQ, ADMIN_DEPTH);
        self.io = Queue::none();
    }

    /// Full bring-up: enable, Identify Namespace 1, and one I/O queue pair of `depth`
    /// entries (with an MSI-X eventfd on [`IO_VECTOR`] if `interrupts`).
    pub fn bring_up(&mut self, depth: u16, interrupts: bool) {
        self.enable();
        let mut id = IdentifyCmd { nsid: 1, cns: cns::NAMESPACE, ..Default::default() }.to_sqe();
        id.set_prps(ID_BUF, 0);
        let c = self.admin(id);
        assert!(c.status().is_success(), "Identify Namespace: {:?}", c.status());
        let ns: IdentifyNamespace = self.mem.read_obj(ID_BUF).unwrap();
        let fmt = ns.lbaf[flbas::format_index(ns.flbas) as usize];
        self.lba_size = 1 << fmt.lbads;
        assert!(ns.nsze.get() > 0);

        if interrupts {
            let e = TestEventFd::new();
            self.client.set_irq_eventfds(IRQ_INDEX_MSIX, IO_VECTOR as u32, &[e.fd()]).expect("SET_IRQS");
            self.irq = Some(e);
        }
        let qsize_z = depth - 1;
        let cq = CreateIoCqCmd { qid: 1, qsize_z, base: IO_CQ, pc: true, ien: interrupts, iv: IO_VECTOR };
        let c = self.admin(cq.to_sqe());
        assert!(c.status().is_success(), "Create I/O CQ: {:?}", c.status());
        let sq = CreateIoSqCmd { qid: 1, qsize_z, base: IO_SQ, pc: true, cqid: 1, ..Default::default() };
        let c = self.admin(sq.to_sqe());
        assert!(c.status().is_success(), "Create I/O SQ: {:?}", c.status());
        self.io = Queue::new(1, IO_SQ, IO_CQ, depth);
    }

    fn doorbell(&self, qid: u16, kind: DoorbellKind) -> u64 {
        offset::DOORBELL_BASE + doorbell_offset(qid, kind, self.dstrd)
    }

    fn cid(&mut self) -> u16 {
        let c = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1).max(1);
        c
    }

    /// Writes `s` at the tail of `q` (no doorbell). Returns the command identifier.
    fn push(mem: &GuestMemory, q: &mut Queue, mut s: Sqe, cid: u16) -> u16 {
        s.set_cid(cid);
        q.sq.write(mem, &s);
        cid
    }

    /// How this host updates doorbells: registers only (no Doorbell Buffer Config).
    fn doorbells(&self) -> Doorbells {
        Doorbells { dbbuf: None, dstrd: self.dstrd }
    }

    /// Runs one admin command to completion.
    pub fn admin(&mut self, s: Sqe) -> Cqe {
        let cid = self.admin_submit(s);
        let c = self.admin_wait();
        assert_eq!(c.cid.get(), cid, "admin completion for another command");
        c
    }

    /// Submits an admin command and rings the doorbell; returns its identifier.
    pub fn admin_submit(&mut self, mut s: Sqe) -> u16 {
        s.set_cid(self.cid());
        let (mem, d) = (&self.mem, self.doorbells());
        d.sq_push(mem, &mut SocketBar(&mut self.client), &mut self.admin.sq, &s);
        s.cid()
    }

    /// Waits (bounded) for the next admin completion and acknowledges it.
    pub fn admin_wait(&mut self) -> Cqe {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let (mem, d) = (&self.mem, self.doorbells());
            let (mut got, _) = d.cq_pop(mem, &mut SocketBar(&mut self.client), &mut self.admin.cq, 1);
            if let Some(c) = got.pop() {
                return c;
            }
            assert!(Instant::now() < deadline, "no admin completion within {TIMEOUT:?}");
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Host address of data slot `slot`.
    pub fn slot(slot: u16) -> u64 {
        assert!(slot < SLOTS);
        DATA + slot as u64 * PAGE
    }

    /// Queues (without ringing) a one-page write of slot `slot` to the page-sized block
    /// run starting at LBA `lba`. Returns the command identifier.
    pub fn queue_rw(&mut self, write: bool, slot: u16, lba: u64) -> u16 {
        self.queue_rw_at(write, Self::slot(slot), lba)
    }

    /// Queues (without ringing) a one-page read or write of the page at host
    /// address `buf` (anywhere the client has DMA-mapped, page aligned).
    pub fn queue_rw_at(&mut self, write: bool, buf: u64, lba: u64) -> u16 {
        let rw = ReadWriteCmd {
            nsid: self.nsid,
            slba: lba,
            nlb_z: (PAGE / self.lba_size - 1) as u16,
            ..Default::default()
        };
        let mut s = if write { rw.write() } else { rw.read() };
        s.set_prps(buf, 0);
        let cid = self.cid();
        Self::push(&self.mem, &mut self.io, s, cid)
    }

    /// Rings the I/O submission queue doorbell, posted (no reply) or not.
    pub fn ring_io(&mut self, posted: bool) {
        let off = self.doorbell(self.io.sq.qid, DoorbellKind::SqTail);
        let tail = self.io.sq.tail.to_le_bytes();
        if posted {
            self.client.region_write_posted(REGION_BAR0, off, &tail).expect("posted doorbell");
        } else {
            self.client.region_write(REGION_BAR0, off, &tail).expect("doorbell");
        }
    }

    /// Waits (bounded) for `n` I/O completions and acknowledges them.
    pub fn reap_io(&mut self, n: usize) -> Vec<Cqe> {
        let deadline = Instant::now() + TIMEOUT;
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            match self.io.cq.take(&self.mem) {
                Some(c) => out.push(c),
                None => {
                    assert!(Instant::now() < deadline, "only {} of {n} I/O completions arrived", out.len());
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        }
        let head = self.io.cq.head;
        self.write32(self.doorbell(self.io.cq.qid, DoorbellKind::CqHead), head);
        out
    }

    /// Writes `data` (one page per slot) starting at `lba` and reads it back through
    /// other slots, checking every completion and byte.
    pub fn write_read_verify(&mut self, lba: u64, pages: u16, seed: u8) {
        assert!(pages * 2 <= SLOTS && pages < self.io.depth());
        let blocks = PAGE / self.lba_size;
        for p in 0..pages {
            let buf: Vec<u8> = (0..PAGE).map(|i| (i as u8).wrapping_mul(7) ^ seed ^ p as u8).collect();
            self.mem.write(Self::slot(p), &buf).unwrap();
            self.queue_rw(true, p, lba + p as u64 * blocks);
        }
        self.ring_io(false);
        for c in self.reap_io(pages as usize) {
            assert!(c.status().is_success(), "write failed: {:?}", c.status());
        }
        for p in 0..pages {
            self.mem.fill(Self::slot(pages + p), PAGE, 0xee).unwrap();
            self.queue_rw(false, pages + p, lba + p as u64 * blocks);
        }
        self.ring_io(false);
        for c in self.reap_io(pages as usize) {
            assert!(c.status().is_success(), "read failed: {:?}", c.status());
        }
        for p in 0..pages {
            let mut got = vec![0u8; PAGE as usize];
            self.mem.read(Self::slot(pages + p), &mut got).unwrap();
            let want: Vec<u8> = (0..PAGE).map(|i| (i as u8).wrapping_mul(7) ^ seed ^ p as u8).collect();
            assert!(got == want, "page {p} read back differs from what was written");
        }
    }

    /// Writes one page at `lba` from slot 0, checking the completion.
    pub fn write_page(&mut self, lba: u64, data: &[u8]) {
        self.mem.write(Self::slot(0), data).unwrap();
        self.queue_rw(true, 0, lba);
        self.ring_io(false);
        let c = self.reap_io(1);
        assert!(c[0].status().is_success(), "write: {:?}", c[0].status());
    }

    /// Reads one page at `lba` through slot 1, checking the completion.
    pub fn read_page(&mut self, lba: u64) -> Vec<u8> {
        self.mem.fill(Self::slot(1), PAGE, 0xee).unwrap();
        self.queue_rw(false, 1, lba);
        self.ring_io(false);
        let c = self.reap_io(1);
        assert!(c[0].status().is_success(), "read: {:?}", c[0].status());
        let mut got = vec![0u8; PAGE as usize];
        self.mem.read(Self::slot(1), &mut got).unwrap();
        got
    }
}
