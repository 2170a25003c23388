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
//! finding); a quarter of the socket sessions run under a keeper (`kept`), whose
//! receive memory must then hold no whole message unanswered. Checked after a run, when [`set_check_fd_leaks`] is on: the process has
//! as many descriptors open as before it.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arbitrary::Unstructured;
use block_backend::RamBackend;
use guest_mem::GuestMemory;
use nvme_ctrl::{Controller, ControllerConfig, NamespaceConfig, PollMode};
use vfio_user::proto::*;
use vfio_user::{Command, Connection, Message};
use vfio_user_server::device::Reply;
use vfio_user_server::{server, Device, DeviceOptions, DoorbellMode, EventFdInterrupts};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::IntoBytes;

mod driver;
mod fds;
mod gen;
mod kept;
mod layout;

use driver::*;
use fds::*;
use gen::*;
use layout::*;

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
    /// Sparse memory mapped and logged: maps, a DMA logging start, reports.
    pub log_sequences: u64,
    /// Socket messages sent in pieces (cut at every byte, or at a few places).
    pub cut_messages: u64,
    /// Socket sessions under a keeper (`kept`).
    pub kept_runs: u64,
    /// What the controllers did (how deep the runs got).
    pub admin_commands: u64,
    pub io_commands: u64,
    pub interrupts: u64,
}

impl VfioStats {
    pub fn line(&self) -> String {
        format!(
            "{} runs ({} over a socket, {} of them kept, {} with workers), {} messages ({} ok, {} refused, {} sent \
             in pieces), {} bring-ups, {} I/O bursts, {} sparse-memory logging sequences, {} fds \
             passed, {} doorbells through the mapped page and {} kicks; the controllers ran {} admin \
             and {} I/O commands and sent {} interrupts",
            self.runs,
            self.socket_runs,
            self.kept_runs,
            self.worker_runs,
            self.messages,
            self.ok_replies,
            self.error_replies,
            self.cut_messages,
            self.bringups,
            self.io_bursts,
            self.log_sequences,
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
        // Every dirty log went with its mapping.
        let held = guest_mem::dirty_log_bytes();
        assert_eq!(held, 0, "dirty logs hold {held} bytes after the run");
    }
}

/// This process's resident memory, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1));
    kib.and_then(|k| k.parse::<u64>().ok()).unwrap_or(0) << 10
}

/// How much a run that maps and logs sparse memory may add to the process's
/// resident memory: the dirty logs' whole budget, and room for the rest of a run.
const SPARSE_RSS_LIMIT: u64 = guest_mem::DIRTY_LOG_BUDGET as u64 + (32 << 20);

pub(super) fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
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
            80..=231 => vec![templated(inp, pool)],
            232..=239 => {
                stats.log_sequences += 1;
                log_sequence(inp, pool)
            }
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
    // A quarter of the socket sessions run under a keeper (`kept`).
    let kept = socket && inp.chance(4);
    let (mut dev, vectors) = device(&mut inp, stats);
    let ctrl_stats = dev.ctrl.stats_handle();
    let pool = FdPool::new();
    let logged = stats.log_sequences;
    let msgs = messages(&mut inp, &pool, vectors, socket, stats);
    let logged = stats.log_sequences > logged;
    let rss_before = if logged { rss() } else { 0 };
    stats.messages += msgs.len() as u64;
    stats.fds_sent += msgs.iter().map(|m| m.fds.len() as u64).sum::<u64>();
    if socket {
        stats.socket_runs += 1;
        let keeper = kept.then(|| {
            stats.kept_runs += 1;
            kept::Keeper::attach(&mut dev)
        });
        serve(dev, msgs, &pool.guest, stats, keeper.is_some());
        if let Some(k) = keeper {
            k.join();
        }
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
    if logged {
        // Terabytes of sparse memory mapped and logged commit no more than the logs'
        // budget (a bit per page of what is mapped would be 32 MiB per TiB).
        let grew = rss().saturating_sub(rss_before);
        assert!(grew < SPARSE_RSS_LIMIT, "logging sparse memory grew the process by {grew} bytes");
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
    let errno = match dev.handle(&mut Message { header: m.header, payload: m.payload, fds: m.fds }) {
        Ok(Reply::Ok(_, fds)) => {
            oob.keep(cmd, fds);
            None
        }
        Ok(Reply::Access(_)) => None,
        Ok(Reply::Err(e)) => Some(e),
        Err(e) => Some(e.errno()),
    };
    dev.after_reply();
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

/// Sends `m` cut where it says, its descriptors with the first piece; with `pause`
/// (and few pieces) each further piece follows a millisecond later, in a read of
/// its own.
fn send_in_pieces(conn: &mut Connection, m: &Outgoing) -> bool {
    let mut h = m.header;
    h.size = U32::new((HEADER_SIZE + m.payload.len()) as u32);
    let mut bytes = h.as_bytes().to_vec();
    bytes.extend_from_slice(&m.payload);
    let raw_fds: Vec<RawFd> = m.fds.iter().map(|f| f.as_fd().as_raw_fd()).collect();
    let pause = m.pause && m.cuts.len() <= 8;
    let mut from = 0;
    for (i, &to) in m.cuts.iter().chain(std::iter::once(&bytes.len())).enumerate() {
        if i > 0 && pause {
            std::thread::sleep(Duration::from_millis(1));
        }
        let fds: &[RawFd] = if i == 0 { &raw_fds } else { &[] };
        if conn.send_bytes(&bytes[from..to], fds).is_err() {
            return false;
        }
        from = to;
    }
    true
}

/// Sparse memory under DMA logging, as a client that commits none would send it:
/// maps of the sparse memfd (whole or in part), a start, reports over ranges of
/// it, and sometimes an unmap or a stop in between.
fn log_sequence(inp: &mut Input, pool: &FdPool) -> Vec<Outgoing> {
    const TIB: u64 = 1 << 40;
    let mut out = Vec::new();
    let maps = 1 + inp.pick(3) as u64;
    for i in 0..maps {
        let m = DmaMap {
            argsz: U32::new(size_of::<DmaMap>() as u32),
            flags: U32::new(DMA_MAP_FLAG_READ | DMA_MAP_FLAG_WRITE),
            offset: U64::new(0),
            address: U64::new((8 + 2 * i) * TIB),
            size: U64::new(SPARSE_LEN >> inp.pick(3)),
        };
        out.push(Outgoing::new(Command::DmaMap, m.as_bytes(), vec![pool.dup(FdKind::Sparse)]));
    }
    let feature = |flags: u32, data: &[u8], room: u32| {
        let mut v = (8 + data.len() as u32 + room).to_le_bytes().to_vec();
        v.extend_from_slice(&flags.to_le_bytes());
        v.extend_from_slice(data);
        Outgoing::new(Command::DeviceFeature, v, Vec::new())
    };
    let start = [4096u64.to_le_bytes(), [0u8; 8]].concat();
    out.push(feature((1 << 17) | DEVICE_FEATURE_DMA_LOGGING_START, &start, 0));
    for _ in 0..1 + inp.pick(3) {
        let iova = (8 + 2 * inp.pick(maps as usize) as u64) * TIB + inp.u16() as u64 * guest_mem::LOG_BLOCK;
        let len = (1 + inp.pick(64) as u64) << 28;
        let report = [iova.to_le_bytes(), len.to_le_bytes(), 4096u64.to_le_bytes()].concat();
        let room = (len / 4096 / 8) as u32 + 8;
        out.push(feature((1 << 16) | DEVICE_FEATURE_DMA_LOGGING_REPORT, &report, room));
        if inp.chance(3) {
            let u = DmaUnmap {
                argsz: U32::new(size_of::<DmaUnmap>() as u32),
                flags: U32::new(0),
                address: U64::new(8 * TIB),
                size: U64::new(SPARSE_LEN >> inp.pick(3)),
            };
            out.push(Outgoing::new(Command::DmaUnmap, u.as_bytes(), Vec::new()));
        }
    }
    if inp.chance(8) {
        out.push(feature((1 << 17) | DEVICE_FEATURE_DMA_LOGGING_STOP, &[], 0));
    }
    out
}

/// The session over a real socket: `serve_client` on a thread, the client's replies
/// drained on another, and the session must end soon after the client hangs up.
fn serve(mut dev: Device, msgs: Vec<Outgoing>, guest: &File, stats: &mut VfioStats, kept: bool) {
    let (client, server_end) = UnixStream::pair().expect("socketpair");
    let server = std::thread::Builder::new()
        .name("fuzz-vfio-server".into())
        .spawn(move || {
            let r = server::serve_client(server_end, &mut dev);
            if kept && r.is_ok() {
                kept::Keeper::check(&dev);
            }
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
            None if !m.cuts.is_empty() => {
                stats.cut_messages += 1;
                send_in_pieces(&mut conn, &m)
            }
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
