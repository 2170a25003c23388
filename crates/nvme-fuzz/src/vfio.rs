//! Fuzzing what a VMM controls: input bytes decode to a sequence of vfio-user messages
//! (mostly valid command numbers, typed payloads with at most one field mutated, bogus
//! header flags, and file descriptors of every kind), fed to the vfio-user server's
//! [`Device`] in process: straight into [`Device::handle`], or, for some inputs, through
//! a real socket into [`server::serve_client`] on its own thread.
//!
//! Each run builds its device from the input (0, 1 or 2 I/O workers; trapped, eventfd
//! or mapped doorbells) and its own pool of descriptors: sealed and unsealed memfds,
//! eventfds (one blocking and full), the two ends of a pipe whose buffer is full, a
//! socket, a regular file and `/dev/null`. A driver-like bring-up (VERSION, DMA_MAP of
//! a memfd, MSI-X eventfds, the controller enabled through BAR0 with its queues in that
//! memory) lets the other messages reach the I/O path, where DMA map changes,
//! SET_IRQS and resets then race the workers.
//!
//! Checked after every message: the device answered (no panic), an error carries a
//! non-zero errno, and the message did not block. Checked after a socket session: it
//! ends once the client hangs up (a session that does not is a hang, reported as a
//! finding). Checked after a run, when [`set_check_fd_leaks`] is on: the process has
//! as many descriptors open as before it.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arbitrary::Unstructured;
use block_backend::RamBackend;
use guest_mem::GuestMemory;
use nvme_ctrl::{Controller, ControllerConfig, NamespaceConfig, PollMode};
use nvme_spec::admin::{CreateIoCqCmd, CreateIoSqCmd, DoorbellBufferConfigCmd, IdentifyCmd};
use nvme_spec::nvm::ReadWriteCmd;
use nvme_spec::regs::{doorbell_offset, offset, Aqa, Cc, DoorbellKind};
use nvme_spec::Sqe;
use rustix::event::{eventfd, EventfdFlags};
use rustix::fs::{MemfdFlags, OFlags, SealFlags};
use vfio_user::proto::*;
use vfio_user::version::{self, Capabilities};
use vfio_user::{Command, Connection, Header, Message};
use vfio_user_server::device::Reply;
use vfio_user_server::doorbells::DOORBELL_PAGE;
use vfio_user_server::{server, Device, DeviceOptions, DoorbellMode, EventFdInterrupts};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::IntoBytes;

/// Longest one message may take in [`Device::handle`]: anything that blocks on a
/// client's descriptor (a full pipe, a full blocking eventfd) would take forever.
const MESSAGE_LIMIT: Duration = Duration::from_secs(3);
/// How long a socket session may go on once the client has hung up.
const SESSION_LIMIT: Duration = Duration::from_secs(10);
/// Most messages a run sends (bring-up sequences count as one).
const MAX_MESSAGES: usize = 48;

/// Where the bring-up maps its guest memory, and how much.
const GUEST_IOVA: u64 = 0x4000_0000;
const GUEST_LEN: u64 = 256 << 10;
const ADMIN_SQ: u64 = 0x0000;
const ADMIN_CQ: u64 = 0x1000;
const IO_SQ: u64 = 0x2000;
const IO_CQ: u64 = 0x3000;
const DATA: u64 = 0x4000;
const DATA_PAGES: u64 = 16;
const IDENTIFY: u64 = 0x14000;
const SHADOW: u64 = 0x15000;
const EVENTIDX: u64 = 0x16000;
const ADMIN_ENTRIES: u16 = 16;
const IO_ENTRIES: u16 = 64;
/// Size of the small memfds and the regular file in the pool.
const SMALL_FILE: u64 = 64 << 10;
const PAGE: u64 = 4096;

static CHECK_FD_LEAKS: AtomicBool = AtomicBool::new(false);

/// Makes every run check that it closed all it opened. Only meaningful while nothing
/// else in the process opens or closes descriptors (the fuzz runner; one test).
pub fn set_check_fd_leaks(on: bool) {
    CHECK_FD_LEAKS.store(on, Ordering::Relaxed);
}

/// What vfio-user runs did, summed.
#[derive(Clone, Debug, Default)]
pub struct VfioStats {
    pub runs: u64,
    pub socket_runs: u64,
    pub worker_runs: u64,
    pub messages: u64,
    pub ok_replies: u64,
    pub error_replies: u64,
    pub bringups: u64,
    pub io_bursts: u64,
    pub fds_sent: u64,
    /// Doorbells rung as a VMM's guest would without a trap: stores into the mapped
    /// doorbell page, signals of the ioeventfd kick.
    pub page_doorbells: u64,
    pub kicks: u64,
    /// What the controllers did (how deep the runs got).
    pub admin_commands: u64,
    pub io_commands: u64,
    pub interrupts: u64,
}

impl VfioStats {
    pub fn line(&self) -> String {
        format!(
            "{} runs ({} over a socket, {} with workers), {} messages ({} ok, {} refused), \
             {} bring-ups, {} I/O bursts, {} fds passed, {} doorbells through the mapped page and \
             {} kicks; the controllers ran {} admin and {} I/O \
             commands and sent {} interrupts",
            self.runs,
            self.socket_runs,
            self.worker_runs,
            self.messages,
            self.ok_replies,
            self.error_replies,
            self.bringups,
            self.io_bursts,
            self.fds_sent,
            self.page_doorbells,
            self.kicks,
            self.admin_commands,
            self.io_commands,
            self.interrupts
        )
    }
}

/// Decodes `data` as a vfio-user session and runs it. Panics on a finding.
pub fn run_vfio_one(data: &[u8]) {
    run_vfio_counted(data, &mut VfioStats::default());
}

/// As [`run_vfio_one`], adding what the run did to `stats`.
pub fn run_vfio_counted(data: &[u8], stats: &mut VfioStats) {
    let before = CHECK_FD_LEAKS.load(Ordering::Relaxed).then(open_fds);
    run(data, stats);
    if let Some(before) = before {
        // Worker threads close their descriptors as they exit, just after the join.
        let start = Instant::now();
        let mut now = open_fds();
        while now > before && start.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_millis(5));
            now = open_fds();
        }
        assert!(now <= before, "descriptor leak: {before} open before the run, {now} after");
    }
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// The input, read leniently: past its end every value is zero.
struct Input<'a>(Unstructured<'a>);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        self.0.arbitrary().unwrap_or(0)
    }
    fn u16(&mut self) -> u16 {
        self.0.arbitrary().unwrap_or(0)
    }
    fn u32(&mut self) -> u32 {
        self.0.arbitrary().unwrap_or(0)
    }
    fn u64(&mut self) -> u64 {
        self.0.arbitrary().unwrap_or(0)
    }
    /// One of `n` choices.
    fn pick(&mut self, n: usize) -> usize {
        self.u8() as usize % n
    }
    /// True with probability about `k`/16.
    fn chance(&mut self, k: u8) -> bool {
        self.u8() % 16 < k
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.u8()).collect()
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The kinds of descriptor a client may pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FdKind {
    /// The bring-up's guest memory: a sealed memfd of `GUEST_LEN`.
    Guest,
    SealedMemfd,
    UnsealedMemfd,
    EventFd,
    /// Blocking, its counter at the maximum: one more write would block forever.
    FullEventFd,
    PipeRead,
    /// Blocking, its buffer full.
    FullPipeWrite,
    Socket,
    File,
    DevNull,
}

const KINDS: [FdKind; 10] = [
    FdKind::Guest,
    FdKind::SealedMemfd,
    FdKind::UnsealedMemfd,
    FdKind::EventFd,
    FdKind::FullEventFd,
    FdKind::PipeRead,
    FdKind::FullPipeWrite,
    FdKind::Socket,
    FdKind::File,
    FdKind::DevNull,
];

/// One descriptor of each kind, created per run; messages carry duplicates.
struct FdPool {
    fds: Vec<(FdKind, OwnedFd)>,
    /// The guest memory, for the driver-like sequences to write queues into.
    guest: File,
    /// Keeps the socket pair's other end open.
    _peer: UnixStream,
}

fn memfd(len: u64, seal: bool) -> OwnedFd {
    let fd = rustix::fs::memfd_create("nvme-fuzz", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .expect("memfd_create");
    rustix::fs::ftruncate(&fd, len).expect("ftruncate memfd");
    if seal {
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .expect("seal memfd");
    }
    fd
}

impl FdPool {
    fn new() -> FdPool {
        let guest = memfd(GUEST_LEN, true);
        let full_efd = eventfd(0, EventfdFlags::CLOEXEC).expect("eventfd");
        rustix::io::write(&full_efd, &(u64::MAX - 1).to_ne_bytes()).expect("fill eventfd");
        let (pr, pw) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).expect("pipe");
        // Fill the pipe without blocking, then make its write end blocking again.
        rustix::fs::fcntl_setfl(&pw, OFlags::NONBLOCK).expect("pipe non-blocking");
        let chunk = [0u8; 4096];
        while rustix::io::write(&pw, &chunk).is_ok() {}
        while rustix::io::write(&pw, &chunk[..1]).is_ok() {}
        rustix::fs::fcntl_setfl(&pw, OFlags::empty()).expect("pipe blocking");
        let (sock, peer) = UnixStream::pair().expect("socketpair");
        let file = tempfile_unlinked();
        let null = File::options().read(true).write(true).open("/dev/null").expect("open /dev/null");
        let fds = vec![
            (FdKind::Guest, guest.try_clone().expect("dup")),
            (FdKind::SealedMemfd, memfd(SMALL_FILE, true)),
            (FdKind::UnsealedMemfd, memfd(SMALL_FILE, false)),
            (FdKind::EventFd, eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).expect("eventfd")),
            (FdKind::FullEventFd, full_efd),
            (FdKind::PipeRead, pr),
            (FdKind::FullPipeWrite, pw),
            (FdKind::Socket, sock.into()),
            (FdKind::File, file.into()),
            (FdKind::DevNull, null.into()),
        ];
        FdPool { fds, guest: File::from(guest), _peer: peer }
    }

    fn dup(&self, kind: FdKind) -> OwnedFd {
        let (_, fd) = self.fds.iter().find(|(k, _)| *k == kind).expect("every kind is in the pool");
        fd.try_clone().expect("dup")
    }

    /// A fresh non-blocking eventfd (interrupts the device may keep).
    fn new_eventfd(&self) -> OwnedFd {
        eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).expect("eventfd")
    }
}

fn tempfile_unlinked() -> File {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!(
        "nvme-fuzz-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let f = File::options().read(true).write(true).create_new(true).open(&path).expect("temp file");
    let _ = std::fs::remove_file(&path);
    f.set_len(SMALL_FILE).expect("size temp file");
    f
}

/// One message as the client sends it.
struct Outgoing {
    header: Header,
    payload: Vec<u8>,
    fds: Vec<OwnedFd>,
    /// Socket runs only: the header's size is this instead of the true size.
    bad_size: Option<u32>,
    /// A doorbell write (BAR0 offset, value), which the direct path may deliver the
    /// way the doorbell mode allows instead: `via` chooses.
    doorbell: Option<(u64, u32)>,
    via: u8,
    /// Guest memory stores (offset in the guest memfd, bytes) the client makes just
    /// before it sends this message: the whole session is decoded up front, and a
    /// queue entry or shadow value must not appear before its turn.
    writes: Vec<(u64, Vec<u8>)>,
}

impl Outgoing {
    fn new(cmd: Command, payload: impl Into<Vec<u8>>, fds: Vec<OwnedFd>) -> Self {
        Outgoing {
            header: Header { command: U16::new(cmd as u16), ..Default::default() },
            payload: payload.into(),
            fds,
            bad_size: None,
            doorbell: None,
            via: 0,
            writes: Vec::new(),
        }
    }

    /// Makes this message's guest memory stores.
    fn store(&self, guest: &File) {
        for (off, b) in &self.writes {
            let _ = guest.write_at(b, *off);
        }
    }
}

/// What the driver-like sequences know of the controller they brought up.
#[derive(Default)]
struct Driver {
    admin_tail: u16,
    io_tail: u16,
    cid: u16,
    dstrd: u8,
    /// Shadow doorbells are configured: tails and heads go there too.
    dbbuf: bool,
    /// Guest memory stores for the next doorbell message to carry.
    pending: Vec<(u64, Vec<u8>)>,
}

fn region_write(region: u32, off: u64, data: &[u8]) -> Outgoing {
    let a =
        RegionAccess { offset: U64::new(off), region: U32::new(region), count: U32::new(data.len() as u32) };
    let mut p = a.as_bytes().to_vec();
    p.extend_from_slice(data);
    Outgoing::new(Command::RegionWrite, p, Vec::new())
}

fn bar0_write32(off: u64, v: u32) -> Outgoing {
    region_write(REGION_BAR0, off, &v.to_le_bytes())
}

fn bar0_write64(off: u64, v: u64) -> Outgoing {
    region_write(REGION_BAR0, off, &v.to_le_bytes())
}

impl Driver {
    /// A doorbell write, carrying the guest memory stores made since the last one.
    fn doorbell(&mut self, qid: u16, kind: DoorbellKind, v: u16) -> Outgoing {
        let off = doorbell_offset(qid, kind, self.dstrd);
        let mut m = bar0_write32(DOORBELL_PAGE + off, v as u32);
        m.doorbell = Some((DOORBELL_PAGE + off, v as u32));
        m.writes = std::mem::take(&mut self.pending);
        m
    }

    /// The host's half of shadow doorbells (Base §5.2.5): the value goes to the
    /// shadow buffer whether or not a doorbell write follows.
    fn shadow(&mut self, qid: u16, kind: DoorbellKind, v: u16) {
        if self.dbbuf && qid != 0 {
            let off = SHADOW + doorbell_offset(qid, kind, self.dstrd);
            self.pending.push((off, (v as u32).to_le_bytes().to_vec()));
        }
    }

    /// Writes `sqe` at the tail of queue `qid` in guest memory; the doorbell message
    /// that publishes it.
    fn submit(&mut self, qid: u16, mut sqe: Sqe) -> Outgoing {
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
    fn bring_up(&mut self, pool: &FdPool, vectors: u32, dbbuf: bool) -> Vec<Outgoing> {
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
            bar0_write32(offset::CC, 0),
            bar0_write32(offset::AQA, Aqa::new(ADMIN_ENTRIES - 1, ADMIN_ENTRIES - 1).0),
            bar0_write64(offset::ASQ, GUEST_IOVA + ADMIN_SQ),
            bar0_write64(offset::ACQ, GUEST_IOVA + ADMIN_CQ),
            bar0_write32(offset::CC, Cc::LINUX.0),
            bar0_write32(offset::CC, Cc::LINUX.with_en(true).0),
        ];
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
    fn io_burst(&mut self, inp: &mut Input) -> Vec<Outgoing> {
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

/// An address: mostly in or near the bring-up's map, sometimes anything.
fn address(inp: &mut Input) -> u64 {
    match inp.pick(5) {
        0 => GUEST_IOVA,
        1 => GUEST_IOVA + (inp.u16() as u64 % (GUEST_LEN / PAGE)) * PAGE,
        2 => (inp.u32() as u64) << 12,
        3 => u64::MAX - (inp.u8() as u64) * PAGE,
        _ => inp.u64(),
    }
}

fn length(inp: &mut Input) -> u64 {
    match inp.pick(5) {
        0 => PAGE,
        1 => GUEST_LEN,
        2 => (1 + inp.u8() as u64) * PAGE,
        3 => 0,
        _ => inp.u64(),
    }
}

/// Some descriptors: mostly none or one, of any kind.
fn fds(inp: &mut Input, pool: &FdPool, default: usize) -> Vec<OwnedFd> {
    let n = match inp.pick(8) {
        0..=4 => default,
        5 => 0,
        6 => 1 + inp.pick(3),
        _ => inp.pick(20),
    };
    (0..n).map(|_| pool.dup(KINDS[inp.pick(KINDS.len())])).collect()
}

/// A region offset: mostly registers and doorbells, sometimes anywhere.
fn region_offset(inp: &mut Input, region: u32) -> u64 {
    match (region, inp.pick(4)) {
        (REGION_BAR0, 0) => DOORBELL_PAGE + (inp.u8() as u64 % 64) * 4,
        (REGION_BAR0, 1) => [offset::CC, offset::CSTS, offset::AQA, offset::ASQ, offset::ACQ][inp.pick(5)],
        (_, 3) => inp.u64(),
        _ => inp.u16() as u64 % 0x2000,
    }
}

fn region(inp: &mut Input) -> u32 {
    match inp.pick(8) {
        0..=3 => REGION_BAR0,
        4 => REGION_BAR4,
        5 | 6 => REGION_CONFIG,
        _ => inp.u32() % (NUM_REGIONS + 2),
    }
}

/// One message from a typed template (most fields plausible).
fn templated(inp: &mut Input, pool: &FdPool) -> Outgoing {
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
fn mutate_payload(inp: &mut Input, p: &mut Vec<u8>) {
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
fn header_fields(inp: &mut Input, m: &mut Outgoing, id: u16, socket: bool) {
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

/// The device a run is served by, as its first bytes choose.
fn device(inp: &mut Input, stats: &mut VfioStats) -> (Device, u32) {
    let workers = inp.pick(3);
    let doorbells = [DoorbellMode::Trapped, DoorbellMode::EventFd, DoorbellMode::Mapped][inp.pick(3)];
    let max_io_queues = 1 + inp.pick(4) as u16;
    let cfg = ControllerConfig {
        namespaces: vec![NamespaceConfig::new(Arc::new(RamBackend::new(1 << 20)), 0)],
        max_io_queues,
        msix_vectors: max_io_queues + 1,
        dstrd: 0,
        ..Default::default()
    };
    let irqs = Arc::new(EventFdInterrupts::new(cfg.msix_vectors));
    let vectors = cfg.msix_vectors as u32;
    let mut ctrl = Controller::new(cfg, GuestMemory::empty(), irqs.clone()).expect("controller");
    // A mapped doorbell page raises no notification: workers must poll it.
    let poll = if doorbells == DoorbellMode::Mapped { PollMode::Always } else { PollMode::Off };
    ctrl.spawn_workers(workers, poll).expect("spawn workers");
    if workers > 0 {
        stats.worker_runs += 1;
    }
    let dev = Device::new(ctrl, irqs, DeviceOptions { doorbells, ..Default::default() }).expect("device");
    (dev, vectors)
}

/// Decodes the whole session up front (the socket path sends it from another thread).
fn messages(
    inp: &mut Input,
    pool: &FdPool,
    vectors: u32,
    socket: bool,
    stats: &mut VfioStats,
) -> Vec<Outgoing> {
    let mut drv = Driver::default();
    let mut out = Vec::new();
    let mut id = 0u16;
    let mut n = 0;
    while n < MAX_MESSAGES && !(inp.is_empty() && n > 0) {
        // A fresh input starts with a bring-up more often than not, so most runs get deep.
        let op = inp.u8();
        let batch = match op {
            0..=159 if n == 0 => {
                stats.bringups += 1;
                drv.bring_up(pool, vectors, op & 1 != 0)
            }
            0..=15 => {
                stats.bringups += 1;
                drv.bring_up(pool, vectors, op & 1 != 0)
            }
            16..=79 => {
                stats.io_bursts += 1;
                drv.io_burst(inp)
            }
            80..=239 => vec![templated(inp, pool)],
            _ => {
                let cmd = if inp.chance(8) { inp.u16() % 24 } else { inp.u16() };
                let len = inp.pick(80);
                let mut m = Outgoing::new(Command::Version, inp.bytes(len), fds(inp, pool, 0));
                m.header.command = U16::new(cmd);
                vec![m]
            }
        };
        for mut m in batch {
            id = id.wrapping_add(1);
            header_fields(inp, &mut m, id, socket);
            out.push(m);
        }
        n += 1;
    }
    out
}

fn run(data: &[u8], stats: &mut VfioStats) {
    let mut inp = Input(Unstructured::new(data));
    stats.runs += 1;
    let socket = inp.chance(3);
    let (mut dev, vectors) = device(&mut inp, stats);
    let ctrl_stats = dev.ctrl.stats_handle();
    let pool = FdPool::new();
    let msgs = messages(&mut inp, &pool, vectors, socket, stats);
    stats.messages += msgs.len() as u64;
    stats.fds_sent += msgs.iter().map(|m| m.fds.len() as u64).sum::<u64>();
    if socket {
        stats.socket_runs += 1;
        serve(dev, msgs, &pool.guest, stats);
    } else {
        let mut oob = OutOfBand::default();
        for m in msgs {
            m.store(&pool.guest);
            if oob.deliver(&m, stats) {
                // The server loop's admin tick or kick would run the device now.
                run_device(&mut dev);
            } else {
                handle_one(&mut dev, m, stats, &mut oob);
            }
        }
        dev.disconnect();
    }
    let s = ctrl_stats.snapshot();
    stats.admin_commands += s.admin_commands;
    stats.io_commands += s.io_commands;
    stats.interrupts += s.interrupts;
}

/// What the device handed out for doorbells that bypass BAR0 traps: the mapped
/// doorbell page (`Mapped`) and the ioeventfd kick (`EventFd`).
#[derive(Default)]
struct OutOfBand {
    page: Option<File>,
    kick: Option<OwnedFd>,
}

impl OutOfBand {
    /// Delivers a doorbell message without a trap, if it is one, the device offered a
    /// way, and the input chose it. False: send the message.
    fn deliver(&self, m: &Outgoing, stats: &mut VfioStats) -> bool {
        let Some((off, v)) = m.doorbell else { return false };
        match (m.via % 3, &self.page, &self.kick) {
            // A guest's store into the mapped page: the device sees only the value.
            (0, Some(page), _) => {
                let _ = page.write_at(&v.to_le_bytes(), off);
                stats.page_doorbells += 1;
                true
            }
            // KVM signalling the ioeventfd: the value is in the shadow buffer, if any.
            (1, _, Some(kick)) => {
                let _ = rustix::io::write(kick, &1u64.to_ne_bytes());
                stats.kicks += 1;
                true
            }
            _ => false,
        }
    }

    fn keep(&mut self, cmd: u16, fds: Vec<OwnedFd>) {
        let Some(fd) = fds.into_iter().next() else { return };
        if cmd == Command::DeviceGetRegionInfo as u16 {
            self.page = Some(File::from(fd));
        } else if cmd == Command::DeviceGetRegionIoFds as u16 {
            self.kick = Some(fd);
        }
    }
}

/// One message straight into the device, then the admin side run as the server loop
/// would after a wake-up.
fn handle_one(dev: &mut Device, m: Outgoing, stats: &mut VfioStats, oob: &mut OutOfBand) {
    let cmd = m.header.command.get();
    let t = Instant::now();
    let errno = match dev.handle(Message { header: m.header, payload: m.payload, fds: m.fds }) {
        Ok(Reply::Ok(_, fds)) => {
            oob.keep(cmd, fds);
            None
        }
        Ok(Reply::Err(e)) => Some(e),
        Err(e) => Some(e.errno()),
    };
    match errno {
        None => stats.ok_replies += 1,
        Some(e) if e <= 0 => panic!("command {cmd}: an error reply with errno {e}"),
        Some(_) => stats.error_replies += 1,
    }
    run_device(dev);
    let took = t.elapsed();
    assert!(took < MESSAGE_LIMIT, "command {cmd} blocked the device for {took:?}");
}

fn run_device(dev: &mut Device) {
    for _ in 0..8 {
        if !dev.ctrl.process() {
            break;
        }
    }
}

/// The session over a real socket: `serve_client` on a thread, the client's replies
/// drained on another, and the session must end soon after the client hangs up.
fn serve(mut dev: Device, msgs: Vec<Outgoing>, guest: &File, stats: &mut VfioStats) {
    let (client, server_end) = UnixStream::pair().expect("socketpair");
    let server = std::thread::Builder::new()
        .name("fuzz-vfio-server".into())
        .spawn(move || {
            let _ = server::serve_client(server_end, &mut dev);
            dev.disconnect();
        })
        .expect("spawn server");
    let reader = client.try_clone().expect("dup client");
    reader.set_read_timeout(Some(SESSION_LIMIT)).expect("read timeout");
    let replies = std::thread::Builder::new()
        .name("fuzz-vfio-client".into())
        .spawn(move || {
            let mut conn = Connection::new(reader);
            let (mut ok, mut err) = (0u64, 0u64);
            while let Ok(m) = conn.recv() {
                let f = MsgFlags(m.header.flags.get());
                assert!(f.is_reply(), "the server sent a non-reply: {:?}", m.header);
                if f.is_error() {
                    assert_ne!(m.header.error.get(), 0, "an error reply without an errno: {:?}", m.header);
                    err += 1;
                } else {
                    ok += 1;
                }
            }
            (ok, err)
        })
        .expect("spawn client reader");
    client.set_write_timeout(Some(SESSION_LIMIT)).expect("write timeout");
    let mut raw = client.try_clone().expect("dup client");
    let mut conn = Connection::new(client);
    for m in msgs {
        m.store(guest);
        let sent = match m.bad_size {
            Some(size) => {
                let mut h = m.header;
                h.size = U32::new(size);
                let mut b = h.as_bytes().to_vec();
                b.extend_from_slice(&m.payload);
                raw.write_all(&b).is_ok()
            }
            None => {
                let raw_fds: Vec<RawFd> = m.fds.iter().map(|f| f.as_fd().as_raw_fd()).collect();
                conn.send(m.header, &[&m.payload], &raw_fds).is_ok()
            }
        };
        if !sent {
            // The server ended the session (a framing error): nothing more to say.
            break;
        }
    }
    let _ = raw.shutdown(std::net::Shutdown::Write);
    let hung_up = Instant::now();
    while !server.is_finished() {
        assert!(
            hung_up.elapsed() < SESSION_LIMIT,
            "hang: the vfio-user session did not end within {SESSION_LIMIT:?} of the client hanging up"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // A panic on the server thread is the finding; its hook already recorded where.
    if let Err(p) = server.join() {
        std::panic::resume_unwind(p);
    }
    drop(conn);
    drop(raw);
    let (ok, err) = replies.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
    stats.ok_replies += ok;
    stats.error_replies += err;
}
