//! Driver-like sequences: the bring-up that lets other messages reach the I/O path.

use nvme_spec::admin::{CreateIoCqCmd, CreateIoSqCmd, DoorbellBufferConfigCmd, IdentifyCmd};
use nvme_spec::nvm::ReadWriteCmd;
use nvme_spec::regs::{doorbell_offset, offset, DoorbellKind};
use nvme_spec::Sqe;
use test_kit::bar::{AdminQueue, Bar0};
use vfio_user::proto::*;
use vfio_user::version::{self, Capabilities};
use vfio_user::Command;
use zerocopy::little_endian::{U32, U64};
use zerocopy::IntoBytes;

use vfio_user_server::doorbells::DOORBELL_PAGE;

use super::fds::{FdKind, FdPool};
use super::gen::{Input, Outgoing};
use super::layout::*;

/// What the driver-like sequences know of the controller they brought up.
#[derive(Default)]
pub(super) struct Driver {
    pub(super) admin_tail: u16,
    pub(super) io_tail: u16,
    pub(super) cid: u16,
    pub(super) dstrd: u8,
    /// Shadow doorbells are configured: tails and heads go there too.
    pub(super) dbbuf: bool,
    /// Guest memory stores for the next doorbell message to carry.
    pub(super) pending: Vec<(u64, Vec<u8>)>,
}

pub(super) fn region_write(region: u32, off: u64, data: &[u8]) -> Outgoing {
    let a =
        RegionAccess { offset: U64::new(off), region: U32::new(region), count: U32::new(data.len() as u32) };
    let mut p = a.as_bytes().to_vec();
    p.extend_from_slice(data);
    Outgoing::new(Command::RegionWrite, p, Vec::new())
}

pub(super) fn bar0_write32(off: u64, v: u32) -> Outgoing {
    region_write(REGION_BAR0, off, &v.to_le_bytes())
}

/// BAR0 as the messages that reach it: each write becomes a REGION_WRITE. The
/// fuzzer sends and never waits, so reads are answered as by a controller that
/// follows CC.EN at once.
struct Recorder<'a> {
    out: &'a mut Vec<Outgoing>,
    cc: u32,
}

impl Bar0 for Recorder<'_> {
    fn read(&mut self, off: u64, out: &mut [u8]) {
        out.fill(0);
        if off == offset::CSTS {
            out[0] = (self.cc & 1) as u8;
        }
    }
    fn write(&mut self, off: u64, data: &[u8]) {
        if off == offset::CC {
            self.cc = u32::from_le_bytes(data.try_into().unwrap_or_default());
        }
        self.out.push(region_write(REGION_BAR0, off, data));
    }
    fn pause(&mut self) {}
}

impl Driver {
    /// A doorbell write, carrying the guest memory stores made since the last one.
    pub(super) fn doorbell(&mut self, qid: u16, kind: DoorbellKind, v: u16) -> Outgoing {
        let off = doorbell_offset(qid, kind, self.dstrd);
        let mut m = bar0_write32(DOORBELL_PAGE + off, v as u32);
        m.doorbell = Some((DOORBELL_PAGE + off, v as u32));
        m.writes = std::mem::take(&mut self.pending);
        m
    }

    /// The host's half of shadow doorbells (Base §5.2.5): the value goes to the
    /// shadow buffer whether or not a doorbell write follows.
    pub(super) fn shadow(&mut self, qid: u16, kind: DoorbellKind, v: u16) {
        if self.dbbuf && qid != 0 {
            let off = SHADOW + doorbell_offset(qid, kind, self.dstrd);
            self.pending.push((off, (v as u32).to_le_bytes().to_vec()));
        }
    }

    /// Writes `sqe` at the tail of queue `qid` in guest memory; the doorbell message
    /// that publishes it.
    pub(super) fn submit(&mut self, qid: u16, mut sqe: Sqe) -> Outgoing {
        self.cid = self.cid.wrapping_add(1);
        sqe.set_cid(self.cid);
        let (base, tail, entries) = match qid {
            0 => (ADMIN_SQ, &mut self.admin_tail, ADMIN_ENTRIES),
            _ => (IO_SQ, &mut self.io_tail, IO_ENTRIES),
        };
        let slot = base + *tail as u64 * 64;
        *tail = (*tail + 1) % entries;
        let t = *tail;
        self.pending.push((slot, sqe.as_bytes().to_vec()));
        self.shadow(qid, DoorbellKind::SqTail, t);
        self.doorbell(qid, DoorbellKind::SqTail, t)
    }

    /// VERSION, DMA_MAP of the guest memfd, MSI-X eventfds, bus mastering, the
    /// controller enabled with its admin queue in that memory, then Identify and one
    /// I/O queue pair.
    pub(super) fn bring_up(&mut self, pool: &FdPool, vectors: u32, dbbuf: bool) -> Vec<Outgoing> {
        *self = Driver { dstrd: self.dstrd, ..Default::default() };
        self.pending.push((0, vec![0u8; (IO_CQ + PAGE) as usize]));
        self.pending.push((SHADOW, vec![0u8; (2 * PAGE) as usize]));
        let caps = Capabilities::default();
        let map = DmaMap {
            argsz: U32::new(size_of::<DmaMap>() as u32),
            flags: U32::new(DMA_MAP_FLAG_READ | DMA_MAP_FLAG_WRITE),
            offset: U64::new(0),
            address: U64::new(GUEST_IOVA),
            size: U64::new(GUEST_LEN),
        };
        let n = vectors.min(4);
        let irqs = SetIrqs {
            argsz: U32::new(size_of::<SetIrqs>() as u32),
            flags: U32::new(IRQ_SET_DATA_EVENTFD | IRQ_SET_ACTION_TRIGGER),
            index: U32::new(IRQ_INDEX_MSIX),
            start: U32::new(0),
            count: U32::new(n),
        };
        let mut v = vec![
            Outgoing::new(Command::Version, version::encode(version::MAJOR, version::MINOR, &caps), vec![]),
            Outgoing::new(Command::DmaMap, map.as_bytes(), vec![pool.dup(FdKind::Guest)]),
            Outgoing::new(
                Command::DeviceSetIrqs,
                irqs.as_bytes(),
                (0..n).map(|_| pool.new_eventfd()).collect(),
            ),
            // Command register: memory space and bus master; MSI-X Enable.
            region_write(REGION_CONFIG, 4, &6u16.to_le_bytes()),
            region_write(REGION_CONFIG, 0x52, &0x8000u16.to_le_bytes()),
        ];
        // The register half of the bring-up is the test kit's, as every test host's.
        let admin =
            AdminQueue { asq: GUEST_IOVA + ADMIN_SQ, acq: GUEST_IOVA + ADMIN_CQ, entries: ADMIN_ENTRIES };
        let ready = test_kit::bar::enable(&mut Recorder { out: &mut v, cc: 0 }, admin, 0);
        debug_assert!(ready.is_ok(), "a recorded bring-up always reads ready");
        let mut id = IdentifyCmd { cns: nvme_spec::identify::cns::CONTROLLER, ..Default::default() }.to_sqe();
        id.set_prps(GUEST_IOVA + IDENTIFY, 0);
        v.push(self.submit(0, id));
        if dbbuf {
            let cfg = DoorbellBufferConfigCmd {
                shadow_doorbell: GUEST_IOVA + SHADOW,
                eventidx: GUEST_IOVA + EVENTIDX,
            };
            v.push(self.submit(0, cfg.to_sqe()));
            self.dbbuf = true;
        }
        let cq = CreateIoCqCmd {
            qid: 1,
            qsize_z: IO_ENTRIES - 1,
            base: GUEST_IOVA + IO_CQ,
            pc: true,
            ien: true,
            iv: 1 % n.max(1) as u16,
        };
        v.push(self.submit(0, cq.to_sqe()));
        let sq = CreateIoSqCmd {
            qid: 1,
            qsize_z: IO_ENTRIES - 1,
            base: GUEST_IOVA + IO_SQ,
            pc: true,
            cqid: 1,
            ..Default::default()
        };
        v.push(self.submit(0, sq.to_sqe()));
        v.push(self.doorbell(0, DoorbellKind::CqHead, self.admin_tail));
        // What a VMM asks before it maps the doorbell page or wires ioeventfds.
        let info = RegionInfo { argsz: U32::new(256), index: U32::new(REGION_BAR0), ..Default::default() };
        v.push(Outgoing::new(Command::DeviceGetRegionInfo, info.as_bytes(), vec![]));
        let io = RegionIoFds { argsz: U32::new(4096), index: U32::new(REGION_BAR0), ..Default::default() };
        v.push(Outgoing::new(Command::DeviceGetRegionIoFds, io.as_bytes(), vec![]));
        v
    }

    /// Reads and writes on I/O queue 1, then the CQ head as if all had completed.
    pub(super) fn io_burst(&mut self, inp: &mut Input) -> Vec<Outgoing> {
        let n = 1 + inp.pick(8);
        let mut v = Vec::new();
        for _ in 0..n {
            let page = inp.u64() % DATA_PAGES;
            let rw = ReadWriteCmd {
                nsid: 1,
                slba: inp.u16() as u64 % 1024,
                nlb_z: inp.u8() as u16 % 8,
                ..Default::default()
            };
            let mut sqe = if inp.chance(8) { rw.write() } else { rw.read() };
            sqe.set_prps(
                GUEST_IOVA + DATA + page * PAGE,
                GUEST_IOVA + DATA + ((page + 1) % DATA_PAGES) * PAGE,
            );
            let db = self.submit(1, sqe);
            // Batch the doorbells now and then, as a driver under load does: the
            // stores then go with the next doorbell.
            if inp.chance(12) {
                v.push(db);
            } else {
                self.pending = db.writes;
            }
        }
        v.push(self.doorbell(1, DoorbellKind::SqTail, self.io_tail));
        self.shadow(1, DoorbellKind::CqHead, self.io_tail);
        v.push(self.doorbell(1, DoorbellKind::CqHead, self.io_tail));
        for m in &mut v {
            // Without shadow doorbells a kick carries no value: a VMM would not wire
            // ioeventfds then, so neither do we.
            m.via = match inp.u8() {
                b if !self.dbbuf && b % 3 == 1 => 2,
                b => b,
            };
        }
        v
    }
}
