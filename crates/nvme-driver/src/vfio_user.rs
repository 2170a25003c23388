//! The vfio-user transport: the driver as a vfio-user *client* of an emulated device
//! (`vnvme serve`, or any vfio-user server), the way QEMU's `vfio-user-pci` is one.
//!
//! - Registers: REGION_READ / REGION_WRITE on BAR0 (waiting for each reply).
//! - DMA memory: a memfd per allocation, mapped here and shared with DMA_MAP at an
//!   IOVA from a bump allocator (2 MiB aligned chunks, a 2 MiB hole after each so an
//!   overrun faults instead of landing in the next region).
//! - External memory ([`Transport::map_external`], zero copy for the `nvme://`
//!   backend): DMA_MAP of the region's own file descriptor at an IOVA from a separate
//!   window ([`EXTERNAL_IOVA_BASE`]); DMA_UNMAP when it is no longer used.
//! - Interrupts: MSI-X eventfds installed with DEVICE_SET_IRQS.
//! - Hang-up: a second handle on the socket reports the server going away.
//! - Doorbells, by [`DoorbellMode`]:
//!   - `Trapped`: a posted REGION_WRITE (No_reply), like QEMU's default.
//!   - `Sync`: a REGION_WRITE that waits for the server's reply.
//!   - `Mapped`: the server offers BAR0 as mmap-able with a sparse-mmap area over the
//!     doorbells; we map it and a doorbell is a plain store into the page.
//!   - `EventFd`: the server hands out an ioeventfd per doorbell
//!     (DEVICE_GET_REGION_IO_FDS); a doorbell is a signal on it and the value travels
//!     in the shadow doorbell buffer (so shadow doorbells are required).
//!
//! A mode the server does not offer fails at connect with a message saying so.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use guest_mem::{GuestMemory, Mapping};
use nvme_spec::regs::offset::DOORBELL_BASE;
use rustix::fs::{fcntl_add_seals, ftruncate, memfd_create, MemfdFlags, SealFlags};
use tracing::{debug, info};
use vfio_user::client::{Client, ClientError};
use vfio_user::proto::*;
use vfio_user::Command;
use zerocopy::little_endian::U32;
use zerocopy::{FromBytes, IntoBytes};

use crate::dirty::GuestCopy;
use crate::transport::{new_eventfd, pci_command, DirectDoorbell, DmaRegion, Transport};

/// How doorbell writes reach the server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DoorbellMode {
    /// Posted REGION_WRITE messages (No_reply): the server handles them in order.
    #[default]
    Trapped,
    /// REGION_WRITE messages that wait for the server's reply.
    Sync,
    /// An ioeventfd per doorbell (DEVICE_GET_REGION_IO_FDS); needs shadow doorbells.
    EventFd,
    /// Stores into BAR0's doorbell page, mmapped from the server (sparse mmap).
    Mapped,
}

impl DoorbellMode {
    /// The mode as its command-line word.
    pub fn name(self) -> &'static str {
        match self {
            DoorbellMode::Trapped => "trapped",
            DoorbellMode::Sync => "sync",
            DoorbellMode::EventFd => "eventfd",
            DoorbellMode::Mapped => "mapped",
        }
    }
}

impl std::fmt::Display for DoorbellMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DoorbellMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "trapped" => DoorbellMode::Trapped,
            "sync" => DoorbellMode::Sync,
            "eventfd" => DoorbellMode::EventFd,
            "mapped" => DoorbellMode::Mapped,
            _ => return Err(format!("unknown doorbell mode {s:?} (trapped, sync, eventfd, mapped)")),
        })
    }
}

/// Connection options.
#[derive(Clone, Copy, Debug)]
pub struct VfioUserOptions {
    pub doorbells: DoorbellMode,
    /// Longest a socket read or write may block (a dead server fails requests
    /// instead of hanging the driver). None: forever.
    pub socket_timeout: Option<Duration>,
}

impl Default for VfioUserOptions {
    fn default() -> Self {
        VfioUserOptions { doorbells: DoorbellMode::Trapped, socket_timeout: Some(Duration::from_secs(30)) }
    }
}

/// First IOVA handed out; 0 stays unused so a zero address is never valid.
const IOVA_BASE: u64 = 1 << 32;
const CHUNK: u64 = 2 << 20;
/// First IOVA of memory shared with [`Transport::map_external`] (another device's
/// guest RAM): a window of its own, 1 TiB up, far above anything `dma_alloc` hands out
/// from 4 GiB, so the two can never meet.
pub const EXTERNAL_IOVA_BASE: u64 = 1 << 40;

/// `VFIO_USER_IO_FD_FLAG_DATAMATCH`: the eventfd fires only for writes of `datamatch`.
const IO_FD_FLAG_DATAMATCH: u32 = 1 << 0;

/// A vfio-user connection to an NVMe PCI function.
#[derive(Debug)]
pub struct VfioUserTransport {
    client: Client,
    path: PathBuf,
    bar0_size: u64,
    mode: DoorbellMode,
    next_iova: u64,
    dma_bytes: u64,
    /// BAR0 doorbell page(s), mapped, addressed by BAR0 offset (Mapped mode).
    mapped: Option<GuestMemory>,
    /// ioeventfds by BAR0 offset, with their datamatch value (EventFd mode).
    io_fds: HashMap<u64, (Arc<File>, Option<u64>)>,
    /// Next IOVA for external memory (bump allocated from [`EXTERNAL_IOVA_BASE`]).
    next_external: u64,
    /// A second handle on the socket, for hang-up detection.
    hangup: Option<UnixStream>,
    /// Every DMA map made (IOVA, size, descriptor, offset): replayed on the server
    /// a live migration moves the device to.
    maps: Vec<(u64, u64, OwnedFd, u64)>,
    /// This process's own mappings of the regions `dma_alloc` made, by IOVA (their
    /// writes are logged during a migration's memory copy).
    local: Vec<(u64, Arc<Mapping>)>,
    /// A migration's memory copy under way (`start_memory_copy`).
    copy: Option<GuestCopy>,
    /// The MSI-X eventfds given to the server (duplicates), for the same.
    irq_fds: Vec<OwnedFd>,
}

/// What a live migration did ([`VfioUserTransport::migrate`]).
#[derive(Clone, Debug)]
pub struct MigrationReport {
    /// From the source's stop to the destination's start: the device does nothing
    /// meanwhile.
    pub downtime: std::time::Duration,
    /// Bytes of device state moved.
    pub bytes: usize,
    /// After [`VfioUserTransport::start_memory_copy`]: the memory copy's figures.
    pub memory: Option<crate::dirty::CopyReport>,
    pub from: PathBuf,
    pub to: PathBuf,
}

/// Bytes of migration data per MIG_DATA_READ / _WRITE.
const MIG_CHUNK: u32 = 256 << 10;

fn set_state(c: &mut Client, state: u32) -> io::Result<()> {
    let mut p = 16u32.to_le_bytes().to_vec();
    p.extend_from_slice(&(DEVICE_FEATURE_SET | DEVICE_FEATURE_MIG_DEVICE_STATE).to_le_bytes());
    p.extend_from_slice(&state.to_le_bytes());
    p.extend_from_slice(&(-1i32).to_le_bytes());
    c.request(Command::DeviceFeature, &[&p], &[]).map_err(client_err)?;
    Ok(())
}

fn read_all_state(c: &mut Client) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let mut p = (8 + MIG_CHUNK).to_le_bytes().to_vec();
        p.extend_from_slice(&MIG_CHUNK.to_le_bytes());
        let r = c.request(Command::MigDataRead, &[&p], &[]).map_err(client_err)?;
        let n = r.payload.get(4..8).map(|b| u32::from_le_bytes(b.try_into().expect("4"))).unwrap_or(0);
        let data =
            r.payload.get(8..8 + n as usize).ok_or_else(|| io::Error::other("short MIG_DATA_READ reply"))?;
        out.extend_from_slice(data);
        if n < MIG_CHUNK {
            return Ok(out);
        }
        if out.len() > 64 << 20 {
            return Err(io::Error::other("the source's migration data does not end"));
        }
    }
}

fn client_err(e: ClientError) -> io::Error {
    match e {
        ClientError::Io(e) => e,
        e => io::Error::other(e),
    }
}

impl VfioUserTransport {
    /// Connects to the server at `socket`, negotiates the protocol, checks that the
    /// device is a PCI function with BAR0, enables memory decoding and bus mastering
    /// with INTx off ([`pci_command`]), and sets up the doorbell mode.
    pub fn connect(socket: &Path, opts: VfioUserOptions) -> io::Result<Self> {
        let stream = UnixStream::connect(socket)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", socket.display())))?;
        stream.set_read_timeout(opts.socket_timeout)?;
        stream.set_write_timeout(opts.socket_timeout)?;
        let hangup = stream.try_clone().ok();
        let mut client = Client::from_stream(stream).map_err(client_err)?;
        let info = client.device_info().map_err(client_err)?;
        if info.flags.get() & DEVICE_FLAGS_PCI == 0 || info.num_regions.get() <= REGION_CONFIG {
            return Err(io::Error::other(format!(
                "{}: not a PCI device (device flags {:#x}, {} regions; a PCI device has flag {DEVICE_FLAGS_PCI:#x} \
                 and at least {} regions)",
                socket.display(),
                info.flags.get(),
                info.num_regions.get(),
                REGION_CONFIG + 1
            )));
        }
        let (bar0, bar0_caps, bar0_fd) = client.region_info(REGION_BAR0).map_err(client_err)?;
        if bar0.size.get() <= DOORBELL_BASE + 8 {
            return Err(io::Error::other(format!("BAR0 of {} bytes has no doorbells", bar0.size.get())));
        }
        let mut t = VfioUserTransport {
            client,
            path: socket.to_owned(),
            bar0_size: bar0.size.get(),
            mode: opts.doorbells,
            next_iova: IOVA_BASE,
            dma_bytes: 0,
            mapped: None,
            io_fds: HashMap::new(),
            next_external: EXTERNAL_IOVA_BASE,
            hangup,
            maps: Vec::new(),
            local: Vec::new(),
            copy: None,
            irq_fds: Vec::new(),
        };
        let cmd = t.config_read16(pci_command::OFFSET)?;
        t.config_write16(pci_command::OFFSET, cmd | pci_command::DRIVER)?;
        match opts.doorbells {
            DoorbellMode::Trapped | DoorbellMode::Sync => {}
            DoorbellMode::Mapped => t.map_doorbells(&bar0, &bar0_caps, bar0_fd)?,
            DoorbellMode::EventFd => t.get_io_fds()?,
        }
        info!(socket = %socket.display(), mode = %opts.doorbells, bar0 = t.bar0_size, "vfio-user device connected");
        Ok(t)
    }

    /// The device's PCI Command register, as the driver left it ([`pci_command`]).
    pub fn pci_command(&mut self) -> io::Result<u16> {
        self.config_read16(pci_command::OFFSET)
    }

    fn config_read16(&mut self, off: u64) -> io::Result<u16> {
        let mut b = [0u8; 2];
        self.client.region_read(REGION_CONFIG, off, &mut b).map_err(client_err)?;
        Ok(u16::from_le_bytes(b))
    }

    fn config_write16(&mut self, off: u64, v: u16) -> io::Result<()> {
        self.client.region_write(REGION_CONFIG, off, &v.to_le_bytes()).map_err(client_err)
    }

    /// Mapped mode: BAR0 must be MMAP-able with a sparse-mmap area over the doorbells.
    fn map_doorbells(
        &mut self,
        info: &RegionInfo,
        caps: &[u8],
        fd: Option<std::os::fd::OwnedFd>,
    ) -> io::Result<()> {
        let unsupported = |why: &str| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                format!("mapped doorbells: the server does not offer them ({why})"),
            )
        };
        let flags = info.flags.get();
        if flags & REGION_FLAG_MMAP == 0 {
            return Err(unsupported("BAR0 region info has no MMAP flag"));
        }
        let fd = fd.ok_or_else(|| unsupported("no file descriptor with BAR0's region info"))?;
        let areas =
            sparse_areas(info, caps).ok_or_else(|| unsupported("no sparse-mmap capability for BAR0"))?;
        let area = areas
            .iter()
            .find(|&&(o, s)| o <= DOORBELL_BASE && o + s >= DOORBELL_BASE + 0x1000)
            .ok_or_else(|| unsupported("no sparse-mmap area covers [0x1000, 0x2000)"))?;
        let map = Mapping::from_fd(fd.as_fd(), info.offset.get() + area.0, area.1, true)?;
        self.mapped = Some(GuestMemory::empty().with_region(area.0, area.1, Arc::new(map), 0)?);
        debug!(offset = area.0, size = area.1, "BAR0 doorbells mapped");
        Ok(())
    }

    /// EventFd mode: ask for BAR0's ioeventfds (again with the server's `argsz` if
    /// ours was too small for them all).
    fn get_io_fds(&mut self) -> io::Result<()> {
        let mut argsz = (size_of::<RegionIoFds>() + 1024 * size_of::<IoFdSubRegion>()) as u32;
        let (head, r) = loop {
            let req = RegionIoFds {
                argsz: U32::new(argsz),
                flags: U32::new(0),
                index: U32::new(REGION_BAR0),
                count: U32::new(0),
            };
            let r = self
                .client
                .request(Command::DeviceGetRegionIoFds, &[req.as_bytes()], &[])
                .map_err(client_err)?;
            let head: RegionIoFds =
                r.payload_as().ok_or_else(|| io::Error::other("short GET_REGION_IO_FDS reply"))?;
            if head.argsz.get() > argsz && argsz < (1 << 20) {
                argsz = head.argsz.get();
                continue;
            }
            break (head, r);
        };
        let fds: Vec<Arc<File>> = r.fds.into_iter().map(|f| Arc::new(File::from(f))).collect();
        let subs = r.payload.get(size_of::<RegionIoFds>()..).unwrap_or_default();
        for raw in subs.chunks_exact(size_of::<IoFdSubRegion>()).take(head.count.get() as usize) {
            let s = IoFdSubRegion::read_from_bytes(raw).expect("exact chunk");
            if s.kind.get() != 0 || s.size.get() != 4 {
                continue;
            }
            let Some(f) = fds.get(s.fd_index.get() as usize) else { continue };
            let dm = (s.flags.get() & IO_FD_FLAG_DATAMATCH != 0).then(|| s.datamatch.get());
            self.io_fds.insert(s.offset.get(), (f.clone(), dm));
        }
        if !self.io_fds.keys().any(|&o| o >= DOORBELL_BASE) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "eventfd doorbells: the server does not offer them (DEVICE_GET_REGION_IO_FDS for BAR0 \
                     returned {} sub-region(s), none an ioeventfd on a doorbell)",
                    head.count.get()
                ),
            ));
        }
        Ok(())
    }

    /// The doorbell mode in use.
    pub fn mode(&self) -> DoorbellMode {
        self.mode
    }

    fn read(&mut self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.client.region_read(REGION_BAR0, off, buf).map_err(client_err)
    }

    /// Live-migrates the device to the server at `dest` (vfio-user migration v2),
    /// the way a VMM does with its vCPUs paused: callers of this transport wait on
    /// its lock meanwhile. The destination gets the same DMA maps and interrupt
    /// eventfds; the source is stopped, its state read (STOP_COPY) and written to
    /// the destination (RESUMING), which then runs. From then on this transport
    /// talks to the destination; the source is left (it resets). Guest memory is
    /// shared by both servers (one host); after [`Self::start_memory_copy`] it is
    /// also copied through the logs and the copy checked (see [`crate::dirty`]).
    /// If anything fails
    /// before the destination runs, the source runs again and the error is returned.
    /// Trapped and sync doorbells only (mapped and eventfd doorbells are the
    /// source's own descriptors).
    /// See [`Transport::start_memory_copy`].
    pub fn start_memory_copy(&mut self) -> io::Result<()> {
        if self.copy.is_some() {
            return Ok(());
        }
        if !crate::dirty::offered(&mut self.client) {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "the server offers no DMA logging"));
        }
        crate::dirty::start(&mut self.client)?;
        match GuestCopy::start(&self.maps, self.local.clone()) {
            Ok(c) => self.copy = Some(c),
            Err(e) => {
                let _ = crate::dirty::stop(&mut self.client);
                return Err(e);
            }
        }
        Ok(())
    }

    pub fn migrate(&mut self, dest: &Path) -> io::Result<MigrationReport> {
        let mut copy = self.copy.take();
        let r = self.migrate_with(dest, &mut copy);
        if let (Err(_), Some(c)) = (&r, &copy) {
            // Failed before the copy was finished: logging off on both sides.
            c.stop_local();
            let _ = crate::dirty::stop(&mut self.client);
        }
        r
    }

    fn migrate_with(&mut self, dest: &Path, copy: &mut Option<GuestCopy>) -> io::Result<MigrationReport> {
        if !matches!(self.mode, DoorbellMode::Trapped | DoorbellMode::Sync) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("migration with {} doorbells (trapped or sync only)", self.mode),
            ));
        }
        // The source must offer STOP_COPY.
        let mut p = 8u32.to_le_bytes().to_vec();
        p.extend_from_slice(&(DEVICE_FEATURE_GET | DEVICE_FEATURE_MIGRATION).to_le_bytes());
        let r = self.client.request(Command::DeviceFeature, &[&p], &[]).map_err(|e| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                format!("the source does not migrate: {}", client_err(e)),
            )
        })?;
        let flags = r.payload.get(8..16).map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8")));
        if flags & 1 == 0 {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "the source does not offer STOP_COPY"));
        }
        // The destination, set up as this client's device, before anything stops.
        let stream = UnixStream::connect(dest)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dest.display())))?;
        let timeout = self.hangup.as_ref().and_then(|h| h.read_timeout().ok().flatten());
        stream.set_read_timeout(timeout)?;
        stream.set_write_timeout(timeout)?;
        let hangup = stream.try_clone().ok();
        let mut d = Client::from_stream(stream).map_err(client_err)?;
        let (bar0, _, _) = d.region_info(REGION_BAR0).map_err(client_err)?;
        if bar0.size.get() != self.bar0_size {
            return Err(io::Error::other(format!(
                "the destination's BAR0 is {:#x} bytes, the source's {:#x}",
                bar0.size.get(),
                self.bar0_size
            )));
        }
        for (iova, size, fd, off) in &self.maps {
            d.dma_map(*iova, *size, Some(fd.as_fd()), *off).map_err(client_err)?;
        }
        if !self.irq_fds.is_empty() {
            d.set_irq_eventfds(IRQ_INDEX_MSIX, 0, &self.irq_fds).map_err(client_err)?;
        }
        let t0 = std::time::Instant::now();
        let stopped = set_state(&mut self.client, MIG_STATE_STOP_COPY).and_then(|()| match copy.as_mut() {
            // Stopped, and the queues paused (the caller's part): what the logs
            // report since the full copy, then the check.
            Some(c) => {
                let r = c.finish(&mut self.client, &self.maps);
                let _ = crate::dirty::stop(&mut self.client);
                r
            }
            None => Ok(()),
        });
        if let Err(e) = stopped {
            let back = set_state(&mut self.client, MIG_STATE_RUNNING);
            return Err(io::Error::other(format!(
                "migration to {}: {e}{}",
                dest.display(),
                back.err().map(|b| format!("; and the source did not run again: {b}")).unwrap_or_default()
            )));
        }
        let moved = read_all_state(&mut self.client).and_then(|data| {
            set_state(&mut d, MIG_STATE_RESUMING)?;
            for chunk in data.chunks(MIG_CHUNK as usize) {
                let mut p = (8 + chunk.len() as u32).to_le_bytes().to_vec();
                p.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
                d.request(Command::MigDataWrite, &[&p, chunk], &[]).map_err(client_err)?;
            }
            set_state(&mut d, MIG_STATE_RUNNING)?;
            Ok(data.len())
        });
        let bytes = match moved {
            Ok(n) => n,
            Err(e) => {
                // The source runs on; the destination is dropped (it resets).
                let back = set_state(&mut self.client, MIG_STATE_RUNNING);
                return Err(io::Error::other(format!(
                    "migration to {} failed: {e}{}",
                    dest.display(),
                    back.err()
                        .map(|b| format!("; and the source did not run again: {b}"))
                        .unwrap_or_default()
                )));
            }
        };
        let memory = copy.take().map(|c| c.report);
        let downtime = t0.elapsed().saturating_sub(memory.map_or(Duration::ZERO, |m| m.check));
        // Stop the source for good before letting go of it (a reset follows).
        let _ = set_state(&mut self.client, MIG_STATE_STOP);
        let from = std::mem::replace(&mut self.path, dest.to_owned());
        self.client = d;
        self.hangup = hangup;
        info!(from = %from.display(), to = %dest.display(), downtime_ms = downtime.as_secs_f64() * 1e3, bytes, "device migrated");
        Ok(MigrationReport { downtime, bytes, memory, from, to: dest.to_owned() })
    }
}

/// Sparse mmap areas `(offset, size)` of a region, from its capability chain.
fn sparse_areas(info: &RegionInfo, caps: &[u8]) -> Option<Vec<(u64, u64)>> {
    if info.flags.get() & REGION_FLAG_CAPS == 0 {
        return None;
    }
    let head = size_of::<RegionInfo>();
    let mut off = info.cap_offset.get() as usize;
    for _ in 0..16 {
        let at = off.checked_sub(head)?;
        let (h, rest) = CapHeader::read_from_prefix(caps.get(at..)?).ok()?;
        if h.id.get() == CAP_SPARSE_MMAP {
            let (sh, mut rest) = SparseMmapHeader::read_from_prefix(rest).ok()?;
            let mut v = Vec::new();
            for _ in 0..sh.nr_areas.get().min(64) {
                let (a, r) = SparseMmapArea::read_from_prefix(rest).ok()?;
                v.push((a.offset.get(), a.size.get()));
                rest = r;
            }
            return Some(v);
        }
        if h.next.get() == 0 {
            return None;
        }
        off = h.next.get() as usize;
    }
    None
}

#[derive(Debug)]
struct MappedDoorbell {
    mem: GuestMemory,
    off: u64,
}

impl DirectDoorbell for MappedDoorbell {
    fn ring(&mut self, value: u32) -> io::Result<()> {
        // A release store: queue memory writes before it are visible first.
        Ok(self.mem.store_u32(self.off, value)?)
    }
}

#[derive(Debug)]
struct EventFdDoorbell {
    fd: Arc<File>,
    datamatch: Option<u64>,
}

impl EventFdDoorbell {
    fn signal(fd: &File, datamatch: Option<u64>, value: u32) -> io::Result<()> {
        if datamatch.is_some_and(|d| d != value as u64) {
            return Ok(());
        }
        (&*fd).write_all(&1u64.to_ne_bytes())
    }
}

impl DirectDoorbell for EventFdDoorbell {
    fn ring(&mut self, value: u32) -> io::Result<()> {
        Self::signal(&self.fd, self.datamatch, value)
    }
}

impl Transport for VfioUserTransport {
    fn read32(&mut self, off: u64) -> io::Result<u32> {
        let mut b = [0u8; 4];
        self.read(off, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn read64(&mut self, off: u64) -> io::Result<u64> {
        let mut b = [0u8; 8];
        self.read(off, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn write32(&mut self, off: u64, value: u32) -> io::Result<()> {
        self.client.region_write(REGION_BAR0, off, &value.to_le_bytes()).map_err(client_err)
    }

    fn write64(&mut self, off: u64, value: u64) -> io::Result<()> {
        self.client.region_write(REGION_BAR0, off, &value.to_le_bytes()).map_err(client_err)
    }

    fn doorbell(&mut self, off: u64, value: u32) -> io::Result<()> {
        if let Some(m) = &self.mapped {
            if m.check_range(off, 4).is_ok() {
                return Ok(m.store_u32(off, value)?);
            }
        }
        if let Some((fd, dm)) = self.io_fds.get(&off) {
            return EventFdDoorbell::signal(fd, *dm, value);
        }
        let v = value.to_le_bytes();
        match self.mode {
            DoorbellMode::Sync => self.client.region_write(REGION_BAR0, off, &v),
            _ => self.client.region_write_posted(REGION_BAR0, off, &v),
        }
        .map_err(client_err)
    }

    fn direct_doorbell(&mut self, off: u64) -> io::Result<Option<Box<dyn DirectDoorbell>>> {
        if let Some(m) = &self.mapped {
            if m.check_range(off, 4).is_ok() {
                return Ok(Some(Box::new(MappedDoorbell { mem: m.clone(), off })));
            }
        }
        Ok(self.io_fds.get(&off).map(|(fd, dm)| {
            Box::new(EventFdDoorbell { fd: fd.clone(), datamatch: *dm }) as Box<dyn DirectDoorbell>
        }))
    }

    fn doorbell_needs_shadow(&self) -> bool {
        self.mode == DoorbellMode::EventFd
    }

    fn dma_alloc(&mut self, len: u64) -> io::Result<DmaRegion> {
        let size = len.max(1).next_multiple_of(CHUNK);
        let fd = memfd_create("vnvme-driver-dma", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        ftruncate(&fd, size)?;
        // A server maps only memory that cannot shrink under it.
        fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        let map = Arc::new(Mapping::from_fd(fd.as_fd(), 0, size, true)?);
        let iova = self.next_iova;
        let mem = GuestMemory::empty().with_region(iova, size, map.clone(), 0)?;
        self.client.dma_map(iova, size, Some(fd.as_fd()), 0).map_err(client_err)?;
        if self.copy.is_some() {
            // Memory that appears mid-copy is not in it: the check would fail.
            map.start_dirty_log().map_err(io::Error::other)?;
        }
        self.local.push((iova, map));
        // Kept for a migration's destination.
        self.maps.push((iova, size, fd, 0));
        self.next_iova = iova + size + CHUNK;
        self.dma_bytes += size;
        debug!(iova = format_args!("{iova:#x}"), size, "DMA region shared");
        Ok(DmaRegion { iova, len: size, mem })
    }

    fn enable_interrupts(&mut self, n: u16) -> io::Result<Vec<OwnedFd>> {
        let info = self.client.irq_info(IRQ_INDEX_MSIX).map_err(client_err)?;
        if (n as u32) > info.count.get() {
            return Err(io::Error::other(format!(
                "{n} interrupt vectors wanted, the device has {} MSI-X vectors",
                info.count.get()
            )));
        }
        let fds = (0..n).map(|_| new_eventfd()).collect::<io::Result<Vec<_>>>()?;
        self.client.set_irq_eventfds(IRQ_INDEX_MSIX, 0, &fds).map_err(client_err)?;
        self.irq_fds = fds.iter().map(|f| f.try_clone()).collect::<io::Result<_>>()?;
        // MSI-X Enable in the capability's Message Control (what the kernel's vfio-pci
        // does for a VFIO user when it installs MSI-X eventfds).
        let mut cap = self.config_read16(0x34)? & 0xfc;
        for _ in 0..48 {
            if cap == 0 {
                break;
            }
            let id_next = self.config_read16(cap as u64)?;
            if id_next & 0xff == 0x11 {
                let mc = self.config_read16(cap as u64 + 2)?;
                self.config_write16(cap as u64 + 2, (mc | 0x8000) & !0x4000)?;
                break;
            }
            cap = (id_next >> 8) & 0xfc;
        }
        Ok(fds)
    }

    fn reset(&mut self) -> io::Result<()> {
        self.client.reset().map_err(client_err)
    }

    /// DMA_MAP of the region's own file descriptor: the server maps the very pages
    /// the range lives in. Needs an fd-backed region (a VMM's memfd RAM) and page
    /// alignment of the range and its file offset; anything else returns `None`.
    fn map_external(&mut self, mem: &GuestMemory, gpa: u64, len: u64) -> io::Result<Option<u64>> {
        const PAGE: u64 = 4096;
        let Some(src) = mem.region_sources().find(|r| r.gpa <= gpa && gpa - r.gpa < r.len) else {
            return Ok(None);
        };
        let Some((fd, off)) = src.fd else { return Ok(None) };
        let off = off + (gpa - src.gpa);
        let fits = len > 0 && len <= src.len - (gpa - src.gpa);
        if !fits || !gpa.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) || !off.is_multiple_of(PAGE) {
            return Ok(None);
        }
        let iova = self.next_external;
        let next = len
            .checked_next_multiple_of(CHUNK)
            .and_then(|l| iova.checked_add(l + CHUNK))
            .ok_or_else(|| io::Error::other("external IOVA window exhausted"))?;
        self.client.dma_map(iova, len, Some(fd), off).map_err(client_err)?;
        self.maps.push((iova, len, fd.try_clone_to_owned()?, off));
        self.next_external = next;
        debug!(
            gpa = format_args!("{gpa:#x}"),
            iova = format_args!("{iova:#x}"),
            len,
            "external memory shared"
        );
        Ok(Some(iova))
    }

    fn unmap_external(&mut self, iova: u64, len: u64) -> io::Result<()> {
        self.maps.retain(|m| m.0 != iova);
        self.client.dma_unmap(iova, len).map_err(client_err)
    }

    fn start_memory_copy(&mut self) -> io::Result<()> {
        VfioUserTransport::start_memory_copy(self)
    }

    fn migrate(&mut self, dest: &Path) -> io::Result<crate::transport::Migrated> {
        let r = VfioUserTransport::migrate(self, dest)?;
        Ok(crate::transport::Migrated { downtime: r.downtime, bytes: r.bytes, memory: r.memory })
    }

    fn hangup_fd(&self) -> io::Result<Option<OwnedFd>> {
        self.hangup.as_ref().map(|s| s.try_clone().map(OwnedFd::from)).transpose()
    }

    fn describe(&self) -> String {
        format!(
            "vfio-user {} (BAR0 {:#x}, doorbells {}, {} MiB DMA shared)",
            self.path.display(),
            self.bar0_size,
            self.mode,
            self.dma_bytes >> 20
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::little_endian::{U16, U64};

    #[test]
    fn sparse_mmap_capability_is_parsed() {
        let info = RegionInfo {
            argsz: U32::new(32 + 8 + 8 + 32),
            flags: U32::new(REGION_FLAG_READ | REGION_FLAG_WRITE | REGION_FLAG_MMAP | REGION_FLAG_CAPS),
            index: U32::new(0),
            cap_offset: U32::new(32),
            size: U64::new(0x4000),
            offset: U64::new(0),
        };
        let mut caps = Vec::new();
        caps.extend_from_slice(
            CapHeader { id: U16::new(CAP_SPARSE_MMAP), version: U16::new(1), next: U32::new(0) }.as_bytes(),
        );
        caps.extend_from_slice(SparseMmapHeader { nr_areas: U32::new(2), reserved: U32::new(0) }.as_bytes());
        caps.extend_from_slice(SparseMmapArea { offset: U64::new(0), size: U64::new(0x1000) }.as_bytes());
        caps.extend_from_slice(
            SparseMmapArea { offset: U64::new(0x1000), size: U64::new(0x1000) }.as_bytes(),
        );
        assert_eq!(sparse_areas(&info, &caps), Some(vec![(0, 0x1000), (0x1000, 0x1000)]));
        let mut no_caps = info;
        no_caps.flags.set(REGION_FLAG_MMAP);
        assert_eq!(sparse_areas(&no_caps, &caps), None);
        assert_eq!(sparse_areas(&info, &caps[..10]), None, "truncated capability");
    }
}
