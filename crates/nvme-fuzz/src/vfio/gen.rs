//! Messages from the input: the lenient reader, typed templates, mutations, headers.

use std::fs::File;
use std::os::fd::OwnedFd;

use arbitrary::Unstructured;
use nvme_spec::regs::offset;
use vfio_user::proto::*;
use vfio_user::version::{self, Capabilities};
use vfio_user::{Command, Header};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::IntoBytes;

use std::os::unix::fs::FileExt;

use vfio_user_server::doorbells::DOORBELL_PAGE;

use super::fds::{FdPool, KINDS};
use super::layout::*;

/// The input, read leniently: past its end every value is zero.
pub(super) struct Input<'a>(pub(super) Unstructured<'a>);

impl Input<'_> {
    pub(super) fn u8(&mut self) -> u8 {
        self.0.arbitrary().unwrap_or(0)
    }
    pub(super) fn u16(&mut self) -> u16 {
        self.0.arbitrary().unwrap_or(0)
    }
    pub(super) fn u32(&mut self) -> u32 {
        self.0.arbitrary().unwrap_or(0)
    }
    pub(super) fn u64(&mut self) -> u64 {
        self.0.arbitrary().unwrap_or(0)
    }
    /// One of `n` choices.
    pub(super) fn pick(&mut self, n: usize) -> usize {
        self.u8() as usize % n
    }
    /// True with probability about `k`/16.
    pub(super) fn chance(&mut self, k: u8) -> bool {
        self.u8() % 16 < k
    }
    pub(super) fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.u8()).collect()
    }
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// One message as the client sends it.
pub(super) struct Outgoing {
    pub(super) header: Header,
    pub(super) payload: Vec<u8>,
    pub(super) fds: Vec<OwnedFd>,
    /// Socket runs only: the header's size is this instead of the true size.
    pub(super) bad_size: Option<u32>,
    /// A doorbell write (BAR0 offset, value), which the direct path may deliver the
    /// way the doorbell mode allows instead: `via` chooses.
    pub(super) doorbell: Option<(u64, u32)>,
    pub(super) via: u8,
    /// Guest memory stores (offset in the guest memfd, bytes) the client makes just
    /// before it sends this message: the whole session is decoded up front, and a
    /// queue entry or shadow value must not appear before its turn.
    pub(super) writes: Vec<(u64, Vec<u8>)>,
    /// Socket runs only: where the message's bytes are cut into separate writes
    /// (offsets into header and payload, ascending), and whether the client pauses
    /// before each further piece, so pieces arrive in separate reads, apart in time.
    pub(super) cuts: Vec<usize>,
    pub(super) pause: bool,
}

impl Outgoing {
    pub(super) fn new(cmd: Command, payload: impl Into<Vec<u8>>, fds: Vec<OwnedFd>) -> Self {
        Outgoing {
            header: Header { command: U16::new(cmd as u16), ..Default::default() },
            payload: payload.into(),
            fds,
            bad_size: None,
            doorbell: None,
            via: 0,
            writes: Vec::new(),
            cuts: Vec::new(),
            pause: false,
        }
    }

    /// Makes this message's guest memory stores.
    pub(super) fn store(&self, guest: &File) {
        for (off, b) in &self.writes {
            let _ = guest.write_at(b, *off);
        }
    }
}
/// An address: mostly in or near the bring-up's map, sometimes anything.
pub(super) fn address(inp: &mut Input) -> u64 {
    match inp.pick(5) {
        0 => GUEST_IOVA,
        1 => GUEST_IOVA + (inp.u16() as u64 % (GUEST_LEN / PAGE)) * PAGE,
        2 => (inp.u32() as u64) << 12,
        3 => u64::MAX - (inp.u8() as u64) * PAGE,
        _ => inp.u64(),
    }
}

pub(super) fn length(inp: &mut Input) -> u64 {
    match inp.pick(7) {
        0 => PAGE,
        1 => GUEST_LEN,
        2 => (1 + inp.u8() as u64) * PAGE,
        3 => 0,
        // Sparse memory: the whole of it, or blocks of the dirty log's size.
        4 => SPARSE_LEN >> inp.pick(4),
        5 => (1 + inp.u8() as u64) * guest_mem::LOG_BLOCK,
        _ => inp.u64(),
    }
}

/// A DEVICE_FEATURE for migration or DMA logging, with plausible arguments (the
/// states, starts, stops and reports a VMM sends), as `struct
/// vfio_user_device_feature` with its payload.
pub(super) fn feature(inp: &mut Input) -> Vec<u8> {
    const GET: u32 = 1 << 16;
    const SET: u32 = 1 << 17;
    const PROBE: u32 = 1 << 18;
    let (flags, data): (u32, Vec<u8>) = match inp.pick(8) {
        // MIG_DEVICE_STATE: RUNNING, STOP, STOP_COPY, RESUMING, or anything.
        0..=2 => {
            let state = if inp.chance(13) { [2u32, 1, 3, 4][inp.pick(4)] } else { inp.u32() % 10 };
            (SET | DEVICE_FEATURE_MIG_DEVICE_STATE, [state.to_le_bytes(), (-1i32).to_le_bytes()].concat())
        }
        // DMA_LOGGING_START with a few ranges.
        3 | 4 => {
            let page: u64 = if inp.chance(13) { 4096 << inp.pick(4) } else { inp.u64() };
            let n = inp.pick(4) as u32;
            let mut d = page.to_le_bytes().to_vec();
            d.extend_from_slice(&n.to_le_bytes());
            d.extend_from_slice(&0u32.to_le_bytes());
            for _ in 0..n {
                d.extend_from_slice(&address(inp).to_le_bytes());
                d.extend_from_slice(&length(inp).to_le_bytes());
            }
            (SET | DEVICE_FEATURE_DMA_LOGGING_START, d)
        }
        5 => (SET | DEVICE_FEATURE_DMA_LOGGING_STOP, Vec::new()),
        // DMA_LOGGING_REPORT: a range, a unit, and room for the bitmap.
        6 => {
            let (iova, len) = (address(inp), length(inp));
            let page: u64 = if inp.chance(13) { 4096 << inp.pick(8) } else { inp.u64() };
            let d = [iova.to_le_bytes(), len.to_le_bytes(), page.to_le_bytes()].concat();
            (GET | DEVICE_FEATURE_DMA_LOGGING_REPORT, d)
        }
        _ => ([GET, SET, PROBE | GET, PROBE | SET][inp.pick(4)] | (inp.u32() % 10), {
            let n = inp.pick(24);
            inp.bytes(n)
        }),
    };
    let room = if flags & GET != 0 && inp.chance(12) { 1 << inp.pick(21) } else { 0u32 };
    let mut v = (8 + data.len() as u32).saturating_add(room).to_le_bytes().to_vec();
    v.extend_from_slice(&flags.to_le_bytes());
    v.extend_from_slice(&data);
    v
}

/// Some descriptors: mostly none or one, of any kind.
pub(super) fn fds(inp: &mut Input, pool: &FdPool, default: usize) -> Vec<OwnedFd> {
    let n = match inp.pick(8) {
        0..=4 => default,
        5 => 0,
        6 => 1 + inp.pick(3),
        _ => inp.pick(20),
    };
    (0..n).map(|_| pool.dup(KINDS[inp.pick(KINDS.len())])).collect()
}

/// A region offset: mostly registers and doorbells, sometimes anywhere.
pub(super) fn region_offset(inp: &mut Input, region: u32) -> u64 {
    match (region, inp.pick(4)) {
        (REGION_BAR0, 0) => DOORBELL_PAGE + (inp.u8() as u64 % 64) * 4,
        (REGION_BAR0, 1) => [offset::CC, offset::CSTS, offset::AQA, offset::ASQ, offset::ACQ][inp.pick(5)],
        (_, 3) => inp.u64(),
        _ => inp.u16() as u64 % 0x2000,
    }
}

pub(super) fn region(inp: &mut Input) -> u32 {
    match inp.pick(8) {
        0..=3 => REGION_BAR0,
        4 => REGION_BAR4,
        5 | 6 => REGION_CONFIG,
        _ => inp.u32() % (NUM_REGIONS + 2),
    }
}

/// One message from a typed template (most fields plausible).
pub(super) fn templated(inp: &mut Input, pool: &FdPool) -> Outgoing {
    const CMDS: [Command; 17] = [
        Command::Version,
        Command::DmaMap,
        Command::DmaUnmap,
        Command::DeviceGetInfo,
        Command::DeviceGetRegionInfo,
        Command::DeviceGetRegionIoFds,
        Command::DeviceGetIrqInfo,
        Command::DeviceSetIrqs,
        Command::RegionRead,
        Command::RegionWrite,
        Command::DmaRead,
        Command::DmaWrite,
        Command::DeviceReset,
        Command::RegionWriteMulti,
        Command::DeviceFeature,
        Command::MigDataRead,
        Command::MigDataWrite,
    ];
    let cmd = CMDS[inp.pick(CMDS.len())];
    let argsz = |inp: &mut Input, size: usize| match inp.pick(6) {
        0 => 0,
        1 => inp.u32(),
        2 => size as u32 + 4096,
        _ => size as u32,
    };
    let (payload, fds): (Vec<u8>, Vec<OwnedFd>) = match cmd {
        Command::Version => {
            let caps = Capabilities {
                max_msg_fds: inp.chance(4).then(|| inp.u32()),
                max_data_xfer_size: inp.chance(4).then(|| inp.u32()),
                max_dma_maps: inp.chance(4).then(|| inp.u32()),
                pgsizes: inp.chance(4).then(|| inp.u64()),
                migration: None,
            };
            let major = if inp.chance(14) { version::MAJOR } else { inp.u16() };
            (version::encode(major, inp.u16(), &caps), fds(inp, pool, 0))
        }
        Command::DmaMap => {
            let m = DmaMap {
                argsz: U32::new(argsz(inp, size_of::<DmaMap>())),
                flags: U32::new(if inp.chance(13) { 3 } else { inp.u32() & 0xf }),
                offset: U64::new(if inp.chance(12) { 0 } else { length(inp) }),
                address: U64::new(address(inp)),
                size: U64::new(length(inp)),
            };
            (m.as_bytes().to_vec(), fds(inp, pool, 1))
        }
        Command::DmaUnmap => {
            let u = DmaUnmap {
                argsz: U32::new(argsz(inp, size_of::<DmaUnmap>())),
                flags: U32::new(if inp.chance(3) { DMA_UNMAP_FLAG_ALL } else { inp.u32() & inp.u32() & 7 }),
                address: U64::new(address(inp)),
                size: U64::new(length(inp)),
            };
            (u.as_bytes().to_vec(), fds(inp, pool, 0))
        }
        Command::DeviceGetInfo => {
            let d = DeviceInfo { argsz: U32::new(argsz(inp, size_of::<DeviceInfo>())), ..Default::default() };
            (d.as_bytes().to_vec(), fds(inp, pool, 0))
        }
        Command::DeviceGetRegionInfo => {
            let r = RegionInfo {
                argsz: U32::new(argsz(inp, size_of::<RegionInfo>() + 32)),
                index: U32::new(region(inp)),
                ..Default::default()
            };
            (r.as_bytes().to_vec(), fds(inp, pool, 0))
        }
        Command::DeviceGetRegionIoFds => {
            let r = RegionIoFds {
                argsz: U32::new(argsz(inp, 4096)),
                index: U32::new(region(inp)),
                ..Default::default()
            };
            (r.as_bytes().to_vec(), fds(inp, pool, 0))
        }
        Command::DeviceGetIrqInfo => {
            let r = IrqInfo {
                argsz: U32::new(argsz(inp, size_of::<IrqInfo>())),
                index: U32::new(inp.u32() % (NUM_IRQ_INDICES + 1)),
                ..Default::default()
            };
            (r.as_bytes().to_vec(), fds(inp, pool, 0))
        }
        Command::DeviceSetIrqs => {
            let data = [IRQ_SET_DATA_NONE, IRQ_SET_DATA_BOOL, IRQ_SET_DATA_EVENTFD][inp.pick(3)];
            let action = [IRQ_SET_ACTION_MASK, IRQ_SET_ACTION_UNMASK, IRQ_SET_ACTION_TRIGGER][inp.pick(3)];
            let flags = if inp.chance(14) { data | action } else { inp.u32() };
            let index = if inp.chance(10) { IRQ_INDEX_MSIX } else { inp.u32() % (NUM_IRQ_INDICES + 1) };
            let start = if inp.chance(12) { inp.u32() % 4 } else { inp.u32() };
            let count = if inp.chance(12) { inp.u32() % 5 } else { inp.u32() };
            let s = SetIrqs {
                argsz: U32::new(argsz(inp, size_of::<SetIrqs>())),
                flags: U32::new(flags),
                index: U32::new(index),
                start: U32::new(start),
                count: U32::new(count),
            };
            let mut p = s.as_bytes().to_vec();
            if data == IRQ_SET_DATA_BOOL {
                p.extend(inp.bytes(count.min(64) as usize));
            }
            let fds = if data == IRQ_SET_DATA_EVENTFD && inp.chance(10) {
                (0..count.min(8)).map(|_| pool.new_eventfd()).collect()
            } else {
                fds(inp, pool, 0)
            };
            (p, fds)
        }
        Command::RegionRead | Command::RegionWrite => {
            let region = region(inp);
            let count = match inp.pick(6) {
                0..=2 => 4,
                3 => 8,
                4 => 1 << inp.pick(4),
                _ => inp.u32() % 9000,
            };
            let a = RegionAccess {
                offset: U64::new(region_offset(inp, region)),
                region: U32::new(region),
                count: U32::new(count),
            };
            let mut p = a.as_bytes().to_vec();
            if cmd == Command::RegionWrite {
                let n = if inp.chance(14) { count.min(8192) as usize } else { inp.pick(64) };
                p.extend(inp.bytes(n));
            }
            (p, fds(inp, pool, 0))
        }
        Command::DeviceReset => (Vec::new(), fds(inp, pool, 0)),
        Command::DeviceFeature if inp.chance(13) => (feature(inp), fds(inp, pool, 0)),
        _ => {
            let n = inp.pick(64);
            (inp.bytes(n), fds(inp, pool, 0))
        }
    };
    let mut m = Outgoing::new(cmd, payload, fds);
    mutate_payload(inp, &mut m.payload);
    m
}

/// At most one change to a payload: a byte, a truncation, or junk after it.
pub(super) fn mutate_payload(inp: &mut Input, p: &mut Vec<u8>) {
    match inp.pick(16) {
        0 | 1 if !p.is_empty() => {
            let i = inp.u16() as usize % p.len();
            p[i] = inp.u8();
        }
        2 => {
            let n = inp.u16() as usize % (p.len() + 1);
            p.truncate(n);
        }
        3 => {
            let n = inp.pick(32);
            p.extend(inp.bytes(n));
        }
        _ => {}
    }
}

/// Header fields: mostly a plain command, sometimes flags a client should not send.
pub(super) fn header_fields(inp: &mut Input, m: &mut Outgoing, id: u16, socket: bool) {
    m.header.msg_id = U16::new(if inp.chance(15) { id } else { inp.u16() });
    let flags = match inp.pick(16) {
        0 => MsgFlags::NO_REPLY,
        1 => MsgFlags::REPLY,
        2 => MsgFlags::ERROR,
        3 => MsgFlags::REPLY | MsgFlags::ERROR,
        4 => inp.u32(),
        _ => MsgFlags::COMMAND,
    };
    m.header.flags = U32::new(flags);
    if inp.chance(1) {
        m.header.error = U32::new(inp.u32());
    }
    if socket && inp.chance(4) {
        // Cut the message into pieces sent apart: at every byte, sometimes.
        let len = HEADER_SIZE + m.payload.len();
        m.cuts = match inp.pick(4) {
            0 => (1..len).collect(),
            _ => {
                let mut c: Vec<usize> =
                    (0..1 + inp.pick(4)).map(|_| 1 + inp.u16() as usize % len.max(2)).collect();
                c.sort_unstable();
                c.dedup();
                c.retain(|&x| x < len);
                c
            }
        };
        m.pause = inp.chance(4);
    }
    if socket && inp.pick(32) == 0 {
        let real = (HEADER_SIZE + m.payload.len()) as u32;
        m.bad_size = Some(match inp.pick(4) {
            0 => real.saturating_sub(1 + inp.pick(16) as u32),
            1 => real + 1 + inp.pick(64) as u32,
            2 => inp.u32() % HEADER_SIZE as u32,
            _ => inp.u32(),
        });
    }
}
