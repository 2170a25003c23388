//! `NvmeOverVfioUser`: a minimal NVMe host that drives the served controller across the
//! socket the way a guest driver would, with nothing but raw register writes
//! (REGION_WRITE to BAR0) and a memfd shared through DMA_MAP that holds the queues and
//! data buffers. Deliberately independent of the `nvme-driver` crate.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use guest_mem::GuestMemory;
use nvme_spec::admin::{CreateIoCqCmd, CreateIoSqCmd, IdentifyCmd};
use nvme_spec::identify::{cns, flbas, IdentifyNamespace};
use nvme_spec::nvm::ReadWriteCmd;
use nvme_spec::regs::{doorbell_offset, offset, Aqa, Cap, Cc, Csts, DoorbellKind};
use nvme_spec::{Cqe, Sqe};
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

#[derive(Debug, Default)]
struct Queue {
    qid: u16,
    sq: u64,
    cq: u64,
    depth: u16,
    sq_tail: u16,
    cq_head: u16,
    phase: bool,
}

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
            admin: Queue::default(),
            io: Queue::default(),
            next_cid: 1,
            lba_size: 512,
            nsid: 1,
            irq: None,
        };
        h.dstrd = Cap(h.read64(offset::CAP)).dstrd();
        h
    }

    pub fn read32(&mut self, off: u64) -> u32 {
        let mut b = [0u8; 4];
        self.client.region_read(REGION_BAR0, off, &mut b).expect("BAR0 read");
        u32::from_le_bytes(b)
    }

    pub fn read64(&mut self, off: u64) -> u64 {
        let mut b = [0u8; 8];
        self.client.region_read(REGION_BAR0, off, &mut b).expect("BAR0 read");
        u64::from_le_bytes(b)
    }

    pub fn write32(&mut self, off: u64, v: u32) {
        self.client.region_write(REGION_BAR0, off, &v.to_le_bytes()).expect("BAR0 write");
    }

    pub fn write64(&mut self, off: u64, v: u64) {
        self.client.region_write(REGION_BAR0, off, &v.to_le_bytes()).expect("BAR0 write");
    }

    fn csts(&mut self) -> Csts {
        Csts(self.read32(offset::CSTS))
    }

    /// Waits (bounded) for CSTS.RDY to become `ready`; fails on CSTS.CFS.
    pub fn wait_ready(&mut self, ready: bool) {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let c = self.csts();
            assert!(!c.cfs(), "controller fatal status (CSTS {:#x})", c.0);
            if c.rdy() == ready {
                return;
            }
            assert!(Instant::now() < deadline, "CSTS.RDY did not become {ready} (CSTS {:#x})", c.0);
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// CC.EN = 0 through a register write; waits for CSTS.RDY = 0.
    pub fn disable(&mut self) {
        self.write32(offset::CC, 0);
        self.wait_ready(false);
    }

    /// Controller bring-up from whatever state it is in: disable, program AQA/ASQ/ACQ,
    /// set CC.EN with 64-byte SQEs and 16-byte CQEs, wait for CSTS.RDY.
    pub fn enable(&mut self) {
        self.disable();
        self.mem.fill(IOVA, DATA - IOVA, 0).unwrap();
        self.write32(offset::AQA, Aqa::new(ADMIN_DEPTH - 1, ADMIN_DEPTH - 1).0);
        self.write64(offset::ASQ, ASQ);
        self.write64(offset::ACQ, ACQ);
        self.write32(offset::CC, Cc::LINUX.with_en(true).0);
        self.wait_ready(true);
        self.admin =
            Queue { qid: 0, sq: ASQ, cq: ACQ, depth: ADMIN_DEPTH, phase: true, ..Default::default() };
        self.io = Queue::default();
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
        self.io = Queue { qid: 1, sq: IO_SQ, cq: IO_CQ, depth, phase: true, ..Default::default() };
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
        mem.write_obj(q.sq + q.sq_tail as u64 * 64, &s).unwrap();
        q.sq_tail = (q.sq_tail + 1) % q.depth;
        cid
    }

    /// Takes the next completion of `q` if the controller has posted one.
    fn pop(mem: &GuestMemory, q: &mut Queue) -> Option<Cqe> {
        let at = q.cq + q.cq_head as u64 * 16;
        // Dword 3 carries the phase tag and is written last: load it first (acquire),
        // then the rest of the entry.
        let dw3 = mem.load_u32(at + 12).unwrap();
        if (dw3 >> 16) & 1 != q.phase as u32 {
            return None;
        }
        let c: Cqe = mem.read_obj(at).unwrap();
        q.cq_head += 1;
        if q.cq_head == q.depth {
            q.cq_head = 0;
            q.phase = !q.phase;
        }
        Some(c)
    }

    /// Runs one admin command to completion.
    pub fn admin(&mut self, s: Sqe) -> Cqe {
        let cid = self.admin_submit(s);
        let c = self.admin_wait();
        assert_eq!(c.cid.get(), cid, "admin completion for another command");
        c
    }

    /// Submits an admin command and rings the doorbell; returns its identifier.
    pub fn admin_submit(&mut self, s: Sqe) -> u16 {
        let cid = self.cid();
        Self::push(&self.mem, &mut self.admin, s, cid);
        let tail = self.admin.sq_tail as u32;
        self.write32(self.doorbell(0, DoorbellKind::SqTail), tail);
        cid
    }

    /// Waits (bounded) for the next admin completion and acknowledges it.
    pub fn admin_wait(&mut self) -> Cqe {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(c) = Self::pop(&self.mem, &mut self.admin) {
                let head = self.admin.cq_head as u32;
                self.write32(self.doorbell(0, DoorbellKind::CqHead), head);
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
        let off = self.doorbell(self.io.qid, DoorbellKind::SqTail);
        let tail = (self.io.sq_tail as u32).to_le_bytes();
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
            match Self::pop(&self.mem, &mut self.io) {
                Some(c) => out.push(c),
                None => {
                    assert!(Instant::now() < deadline, "only {} of {n} I/O completions arrived", out.len());
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        }
        let head = self.io.cq_head as u32;
        self.write32(self.doorbell(self.io.qid, DoorbellKind::CqHead), head);
        out
    }

    /// Writes `data` (one page per slot) starting at `lba` and reads it back through
    /// other slots, checking every completion and byte.
    pub fn write_read_verify(&mut self, lba: u64, pages: u16, seed: u8) {
        assert!(pages * 2 <= SLOTS && pages < self.io.depth);
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
}
