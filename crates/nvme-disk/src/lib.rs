//! The nvme:// block backend: a namespace of another NVMe controller, reached through
//! the userspace driver.
//!
//! [`NvmeBackend`] serves that namespace as a [`block_backend::Backend`]. Over
//! vfio-user it is one vnvme in front of another (or of any vfio-user NVMe server);
//! over kernel VFIO it is a real NVMe device bound to `vfio-pci`. The driver
//! (`nvme-driver`) knows nothing of block backends; this crate is the adapter between
//! the two, as OpenVMM keeps `disk_nvme` apart from its NVMe driver.
//!
//! # URI
//!
//! ```text
//! nvme:///abs/path/vnvme.sock[?OPTS]     a vfio-user socket (absolute path)
//! nvme://./relative.sock[?OPTS]          a vfio-user socket, relative to the cwd
//! nvme://0000:01:00.0[?OPTS]             a PCI function bound to vfio-pci
//!
//! OPTS, joined with '&':
//!   ns=N           namespace ID downstream                    (default 1)
//!   queues=N       I/O queue pairs to create downstream       (default 4)
//!   depth=N        entries per downstream queue, 2..=4096     (default 128)
//!   doorbells=M    vfio-user doorbells: trapped, sync, eventfd, mapped (default:
//!                  eventfd when the server offers it, else trapped)
//!   poll=0|1       1: completions are polled, no interrupts   (default 0)
//!   timeout=SECS   bound on bring-up waits and socket I/O     (default 30)
//! ```
//!
//! # Queue ownership
//!
//! [`NvmeBackend::open`] brings the downstream controller up and creates every I/O
//! queue pair at once (`queues=`). Each [`Backend::open_queue`] takes one pair out of
//! the backend for the caller's thread, which then drives it without locks; dropping
//! the queue waits (bounded) for its downstream commands and gives the pair back. A
//! vnvme front controller opens one queue per I/O worker per namespace plus one for
//! its admin side (flush at shutdown, Format), so `queues=` must be at least
//! workers + 1; asking for more than exist is an error that says so.
//!
//! # Splitting and statuses
//!
//! Byte offsets and lengths must be multiples of the downstream LBA size (reported as
//! [`BackendInfo::block_size`]); anything else completes with an `InvalidInput` I/O
//! error. Reads and writes longer than the downstream MDTS (or 65536 blocks, or a
//! quarter of the queue's DMA pool) go down as several commands; Write Zeroes and
//! deallocation are split at their own limits (WZSL, DMRSL, the NLB field). The
//! front request completes when its last piece does, with the first error seen:
//! a downstream status becomes [`BackendError::Nvme`] with its type, code and DNR bit
//! passed through; a transport failure, a vanished device or Controller Fatal Status
//! becomes [`BackendError::NotReady`] for every request in flight and every later one.
//! When the downstream queue is full, pieces wait in a per-queue backlog (in order)
//! and go down as completions free slots.
//!
//! # Zero copy
//!
//! A front request's data pages live in the front's guest memory. When a request
//! arrives with a [`GuestMemory`] snapshot whose map this backend has not seen
//! ([`GuestMemory::same_map`] against the last one), every region of it is offered to
//! the transport ([`DeviceHandle::map_external`]): vfio-user DMA-maps the
//! region's own file descriptor (QEMU gives the front memfd RAM, so the downstream
//! server maps the very same pages), kernel VFIO maps the host address through the
//! IOMMU. The table of mapped regions is shared by all queues of the backend (a
//! mutex, taken only when the map changes); each queue keeps the view it last used.
//! A region stays mapped while any view holds it — the current one, a queue's cached
//! one, or an in-flight command's — and is unmapped when the last goes, so a region
//! that left the guest's map is never unmapped under a command still using it.
//!
//! Downstream PRPs then point straight into guest memory (PRP lists live in the
//! queue's DMA pool). A piece falls back to a bounce buffer in the driver's DMA
//! memory, copied with [`GuestMemory::read`]/[`GuestMemory::write`], when it cannot
//! be described that way: a region that could not be shared (anonymous memory over
//! vfio-user, no-IOMMU VFIO), segments that break the PRP rules (every segment but
//! the first must start on a page boundary and every one but the last must end on
//! one; the first must be dword aligned), SGL bit-bucket segments, and host buffers
//! ([`DataBuf::Host`]). [`NvmeBackend::stats`] counts bytes moved each way.
//!
//! # IOVA layout
//!
//! The transport owns the device's address space. vfio-user: DMA memory (queues,
//! pools) from 4 GiB, external guest RAM from 1 TiB (`EXTERNAL_IOVA_BASE`), each
//! mapping 2 MiB aligned and followed by a 2 MiB hole; IOVAs are never reused. Kernel
//! VFIO: one bump allocator from 4 GiB for both, so everything stays inside the
//! IOMMU's address width.
//!
//! # Completion notification
//!
//! With interrupts (the default), [`BackendQueue::notifier`] is an epoll descriptor
//! that contains the downstream CQ's MSI-X eventfd while requests are in flight (and
//! nothing while the queue is idle, so a late interrupt cannot keep an idle owner
//! awake); `reap` resets the eventfd, then drains the CQ. With `poll=1` there is no
//! notifier and the owner polls `reap`. A watcher thread per backend notices a
//! vfio-user server that goes away (socket hang-up) at once, and polls CSTS once a
//! second while requests are in flight (Controller Fatal Status, a device that reads
//! all ones); either way every busy queue is woken and fails its requests with
//! `NotReady` rather than hanging.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use block_backend::{
    Backend, BackendError, BackendInfo, BackendQueue, Completion, DataBuf, Op, Request, Segment,
    SegmentCursor, SegmentMark,
};
use guest_mem::GuestMemory;
use nvme_spec::identify::{dlfeat, oncs, vwc};
use nvme_spec::nvm::{DatasetManagementCmd, DsmRange, FlushCmd, ReadWriteCmd, WriteZeroesCmd};
use nvme_spec::opcode::nvm as op;
use rustix::event::{epoll, poll, PollFd, PollFlags, Timespec};
use tracing::{debug, info, warn};
use zerocopy::IntoBytes;

use nvme_driver::prp;
use nvme_driver::vfio::{normalize_bdf, KernelVfioTransport};
use nvme_driver::Completion as DrvCompletion;
use nvme_driver::{
    new_eventfd, CompletionMode, DeviceHandle, DmaBuf, DoorbellMode, DriverError, DriverOptions, IoQueue,
    NvmeDriver, Transport, VfioUserOptions, VfioUserTransport,
};

// ---- options and URI

/// The URI grammar, for command-line help.
pub const URI_SYNTAX: &str = "\
nvme:///abs/path.sock[?OPTS]   namespace of a vfio-user NVMe server (socket path; also nvme://./rel.sock)
nvme://DDDD:BB:DD.F[?OPTS]     namespace of a PCI NVMe device bound to vfio-pci
  OPTS (joined with &): ns=N (1), queues=N (4; a vnvme front needs workers + 1),
  depth=N (128 entries per queue), doorbells=trapped|sync|eventfd|mapped (trapped),
  poll=0|1 (0: interrupts), timeout=SECS (30)";

/// Where the downstream controller is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NvmeTarget {
    /// A vfio-user server's socket.
    VfioUser(PathBuf),
    /// A PCI function bound to vfio-pci (normalized `DDDD:BB:DD.F`).
    Pci(String),
    /// A transport the caller built ([`NvmeBackend::with_transport`]), described.
    Other(String),
}

impl std::fmt::Display for NvmeTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NvmeTarget::VfioUser(p) => write!(f, "vfio-user {}", p.display()),
            NvmeTarget::Pci(b) => write!(f, "PCI {b}"),
            NvmeTarget::Other(d) => f.write_str(d),
        }
    }
}

/// Everything an `nvme://` URI says ([`NvmeBackendOptions::parse`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvmeBackendOptions {
    pub target: NvmeTarget,
    /// Namespace ID on the downstream controller.
    pub nsid: u32,
    /// I/O queue pairs created downstream: one per [`Backend::open_queue`].
    pub queues: u16,
    /// Entries per downstream I/O queue (commands in flight: one less).
    pub depth: u16,
    /// How doorbells reach a vfio-user server.
    pub doorbells: DoorbellMode,
    /// `doorbells` was not chosen: try eventfd doorbells first (one kick straight to
    /// the server's worker instead of a socket message through its main thread) and
    /// fall back to `doorbells` when the server does not offer them.
    pub auto_doorbells: bool,
    /// Poll for completions instead of taking interrupts (no notifier).
    pub poll: bool,
    /// Bound on bring-up waits and on each socket read or write.
    pub timeout: Duration,
}

impl NvmeBackendOptions {
    pub const DEFAULT_QUEUES: u16 = 4;
    pub const DEFAULT_DEPTH: u16 = 128;
    pub const MAX_DEPTH: u16 = 4096;

    /// Options with every default for `target`.
    pub fn new(target: NvmeTarget) -> Self {
        NvmeBackendOptions {
            target,
            nsid: 1,
            queues: Self::DEFAULT_QUEUES,
            depth: Self::DEFAULT_DEPTH,
            doorbells: DoorbellMode::Trapped,
            auto_doorbells: true,
            poll: false,
            timeout: Duration::from_secs(30),
        }
    }

    /// Parses an `nvme://` URI (grammar in the module documentation).
    pub fn parse(uri: &str) -> Result<Self, UriError> {
        let err = |msg: String| UriError { uri: uri.to_string(), msg };
        let rest = uri.strip_prefix("nvme://").ok_or_else(|| {
            err("must start with nvme:// (nvme:///path/to.sock or nvme://0000:01:00.0)".into())
        })?;
        let (target, query) = match rest.split_once('?') {
            Some((t, q)) => (t, Some(q)),
            None => (rest, None),
        };
        let target = if target.is_empty() {
            return Err(err("no target: give a vfio-user socket (nvme:///path/to.sock, nvme://./rel.sock) \
                 or a PCI address (nvme://0000:01:00.0)"
                .into()));
        } else if target.starts_with('/') || target.starts_with("./") || target.starts_with("../") {
            NvmeTarget::VfioUser(PathBuf::from(target))
        } else {
            match normalize_bdf(target) {
                Ok(b) => NvmeTarget::Pci(b),
                Err(_) => {
                    return Err(err(format!(
                        "target {target:?} is neither a socket path (absolute, or starting with ./) \
                         nor a PCI address like 0000:01:00.0"
                    )))
                }
            }
        };
        let mut o = NvmeBackendOptions::new(target);
        let mut seen: Vec<&str> = Vec::new();
        for kv in query.unwrap_or_default().split('&').filter(|s| !s.is_empty()) {
            let (k, v) =
                kv.split_once('=').ok_or_else(|| err(format!("option {kv:?} has no value (KEY=VALUE)")))?;
            if seen.contains(&k) {
                return Err(err(format!("option {k} given twice")));
            }
            seen.push(k);
            let num = |lo: u64, hi: u64| -> Result<u64, UriError> {
                v.parse::<u64>()
                    .ok()
                    .filter(|n| (lo..=hi).contains(n))
                    .ok_or_else(|| err(format!("{k}={v}: expected a number in {lo}..={hi}")))
            };
            match k {
                "ns" => o.nsid = num(1, 0xffff_fffe)? as u32,
                "queues" => o.queues = num(1, 1024)? as u16,
                "depth" => o.depth = num(2, Self::MAX_DEPTH as u64)? as u16,
                "doorbells" => {
                    if !matches!(o.target, NvmeTarget::VfioUser(_)) {
                        return Err(err("doorbells= applies to vfio-user sockets only".into()));
                    }
                    o.doorbells = v.parse().map_err(|e: String| err(format!("doorbells={v}: {e}")))?;
                    o.auto_doorbells = false;
                }
                "poll" => {
                    o.poll = match v {
                        "0" | "off" | "false" => false,
                        "1" | "on" | "true" => true,
                        _ => return Err(err(format!("poll={v}: expected 0 or 1"))),
                    }
                }
                "timeout" => o.timeout = Duration::from_secs(num(1, 3600)?),
                _ => {
                    return Err(err(format!(
                        "unknown option {k:?} (known: ns, queues, depth, doorbells, poll, timeout)"
                    )))
                }
            }
        }
        Ok(o)
    }
}

impl FromStr for NvmeBackendOptions {
    type Err = UriError;
    fn from_str(s: &str) -> Result<Self, UriError> {
        Self::parse(s)
    }
}

/// A malformed `nvme://` URI.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad nvme:// URI {uri:?}: {msg}")]
pub struct UriError {
    pub uri: String,
    pub msg: String,
}

/// Why [`NvmeBackend::open`] failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Uri(#[from] UriError),
    /// The transport could not be set up (socket, VFIO device).
    #[error("{target}: {source}")]
    Connect { target: NvmeTarget, source: io::Error },
    /// The controller did not come up.
    #[error("{target}: controller bring-up failed: {source}")]
    Driver { target: NvmeTarget, source: DriverError },
    /// The namespace is not active on the controller.
    #[error("{target}: namespace {nsid} does not exist (active namespaces: {available})")]
    NoNamespace { target: NvmeTarget, nsid: u32, available: String },
    /// The controller or namespace cannot be used this way.
    #[error("{target}: {msg}")]
    Unsupported { target: NvmeTarget, msg: String },
}

impl From<OpenError> for io::Error {
    fn from(e: OpenError) -> Self {
        let kind = match &e {
            OpenError::Uri(_) => io::ErrorKind::InvalidInput,
            OpenError::Connect { source, .. } => source.kind(),
            OpenError::NoNamespace { .. } => io::ErrorKind::NotFound,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

// ---- statistics

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    commands: AtomicU64,
    split_requests: AtomicU64,
    zero_copy_bytes: AtomicU64,
    zero_copy_commands: AtomicU64,
    bounce_bytes: AtomicU64,
    bounce_commands: AtomicU64,
    errors: AtomicU64,
    not_ready: AtomicU64,
    regions_mapped: AtomicU64,
    regions_unmapped: AtomicU64,
    map_failures: AtomicU64,
    backlogged: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// A snapshot of an [`NvmeBackend`]'s counters (all queues together).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvmeBackendStats {
    /// Requests submitted by the front.
    pub requests: u64,
    /// Commands sent downstream.
    pub commands: u64,
    /// Requests that went down as more than one command.
    pub split_requests: u64,
    /// Read/write bytes whose downstream PRPs pointed straight at the front's memory.
    pub zero_copy_bytes: u64,
    pub zero_copy_commands: u64,
    /// Read/write bytes copied through a bounce buffer in the driver's DMA memory.
    pub bounce_bytes: u64,
    pub bounce_commands: u64,
    /// Downstream commands that completed with an error status.
    pub errors: u64,
    /// Requests failed with `NotReady` (downstream gone or fatal).
    pub not_ready: u64,
    /// Guest memory regions mapped into / unmapped from the downstream device.
    pub regions_mapped: u64,
    pub regions_unmapped: u64,
    /// Regions the transport failed to map (they are bounced instead).
    pub map_failures: u64,
    /// Requests that had to wait for a free downstream slot or DMA buffer.
    pub backlogged: u64,
}

/// A cloneable handle on a backend's counters, readable while the backend is owned
/// elsewhere (behind `Arc<dyn Backend>`).
#[derive(Clone, Debug)]
pub struct NvmeStatsHandle(Arc<Counters>);

impl NvmeStatsHandle {
    pub fn snapshot(&self) -> NvmeBackendStats {
        let c = &self.0;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        NvmeBackendStats {
            requests: g(&c.requests),
            commands: g(&c.commands),
            split_requests: g(&c.split_requests),
            zero_copy_bytes: g(&c.zero_copy_bytes),
            zero_copy_commands: g(&c.zero_copy_commands),
            bounce_bytes: g(&c.bounce_bytes),
            bounce_commands: g(&c.bounce_commands),
            errors: g(&c.errors),
            not_ready: g(&c.not_ready),
            regions_mapped: g(&c.regions_mapped),
            regions_unmapped: g(&c.regions_unmapped),
            map_failures: g(&c.map_failures),
            backlogged: g(&c.backlogged),
        }
    }
}

// ---- health: a dead downstream fails everything, and wakes whoever waits

#[derive(Debug, Default)]
struct Health {
    dead: OnceLock<String>,
    /// Duplicates of every queue's interrupt eventfd, to wake sleeping owners.
    wakers: Mutex<Vec<OwnedFd>>,
    /// Queues with requests in flight (the watcher checks CSTS only then).
    busy: AtomicUsize,
}

impl Health {
    fn dead(&self) -> Option<&str> {
        self.dead.get().map(String::as_str)
    }

    fn declare_dead(&self, why: String) {
        if self.dead.set(why).is_ok() {
            warn!("nvme backend: downstream controller unusable: {}", self.dead().unwrap_or_default());
            for fd in lock(&self.wakers).iter() {
                let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The thread that notices a downstream that went away while nobody talks to it.
#[derive(Debug)]
struct Watcher {
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    fn spawn(device: DeviceHandle, health: Arc<Health>) -> io::Result<Self> {
        let stop = new_eventfd()?;
        let stop2 = stop.try_clone()?;
        let hangup = device.hangup_fd()?;
        let thread = std::thread::Builder::new()
            .name("nvme-backend-watch".into())
            .spawn(move || watch(device, hangup, stop2, health))?;
        Ok(Watcher { stop, thread: Some(thread) })
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = rustix::io::write(&self.stop, &1u64.to_ne_bytes());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn watch(device: DeviceHandle, hangup: Option<OwnedFd>, stop: OwnedFd, health: Arc<Health>) {
    let tick = Timespec { tv_sec: 1, tv_nsec: 0 };
    while health.dead().is_none() {
        let mut fds = vec![PollFd::new(&stop, PollFlags::IN)];
        if let Some(h) = &hangup {
            fds.push(PollFd::new(h, PollFlags::RDHUP));
        }
        if let Err(e) = poll(&mut fds, Some(&tick)) {
            if e != rustix::io::Errno::INTR {
                warn!("nvme backend watcher: poll: {e}");
                std::thread::sleep(Duration::from_secs(1));
            }
            continue;
        }
        if !fds[0].revents().is_empty() {
            return;
        }
        let gone = PollFlags::HUP | PollFlags::RDHUP | PollFlags::ERR;
        if fds.get(1).is_some_and(|f| f.revents().intersects(gone)) {
            health.declare_dead("the vfio-user server closed the connection".into());
            return;
        }
        drop(fds);
        if health.busy.load(Ordering::SeqCst) > 0 {
            match device.csts() {
                Err(e) => health.declare_dead(format!("transport: {e}")),
                Ok(c) if c.0 == u32::MAX => {
                    health.declare_dead("the device is gone (CSTS reads all ones)".into())
                }
                Ok(c) if c.cfs() => health.declare_dead(format!("Controller Fatal Status (CSTS {:#x})", c.0)),
                Ok(_) => {}
            }
        }
    }
}

// ---- zero-copy mappings

/// A region is known by its guest address, length and host address: the same region
/// in a later snapshot has all three unchanged.
type RegionKey = (u64, u64, usize);

/// One guest memory region mapped into the downstream device; unmapped on drop.
#[derive(Debug)]
struct Mapped {
    iova: u64,
    len: u64,
    device: DeviceHandle,
    stats: Arc<Counters>,
}

impl Drop for Mapped {
    fn drop(&mut self) {
        match self.device.unmap_external(self.iova, self.len) {
            Ok(()) => bump(&self.stats.regions_unmapped, 1),
            Err(e) => debug!(iova = format_args!("{:#x}", self.iova), "unmapping guest memory: {e}"),
        }
    }
}

#[derive(Debug)]
struct ViewRegion {
    gpa: u64,
    len: u64,
    map: Option<Arc<Mapped>>,
}

/// How the device reaches the regions of one guest memory snapshot.
#[derive(Debug)]
struct MemView {
    mem: GuestMemory,
    /// In guest address order.
    regions: Vec<ViewRegion>,
}

impl MemView {
    /// The device address of `gpa` and the bytes from there to the end of its region.
    fn translate(&self, gpa: u64) -> Option<(u64, u64)> {
        let i = self.regions.partition_point(|r| r.gpa <= gpa).checked_sub(1)?;
        let r = &self.regions[i];
        let into = gpa - r.gpa;
        (into < r.len).then_some(())?;
        Some((r.map.as_ref()?.iova + into, r.len - into))
    }
}

#[derive(Debug, Default)]
struct MapTable {
    last: Option<Arc<MemView>>,
    /// Every mapping still alive somewhere, for reuse by later snapshots.
    live: Vec<(RegionKey, Weak<Mapped>)>,
    /// Regions the transport could not share (not retried while they exist).
    failed: Vec<RegionKey>,
}

// ---- the backend

#[derive(Debug)]
struct Shared {
    target: NvmeTarget,
    nsid: u32,
    lba: u64,
    info: BackendInfo,
    /// Most bytes per downstream Read or Write.
    max_rw: u64,
    /// Most blocks per Write Zeroes / per deallocated range.
    max_wz: u64,
    max_dsm: u64,
    total_queues: usize,
    free: Mutex<Vec<IoQueue>>,
    device: DeviceHandle,
    maps: Mutex<MapTable>,
    stats: Arc<Counters>,
    health: Arc<Health>,
    poll: bool,
    /// Bound on waiting for a dropped queue's commands.
    timeout: Duration,
    watcher: Mutex<Option<Watcher>>,
    driver: Mutex<Option<NvmeDriver>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        drop(lock(&self.watcher).take());
        lock(&self.maps).last = None;
        if let Some(d) = lock(&self.driver).take() {
            if self.health.dead().is_none() {
                if let Err(e) = d.shutdown() {
                    debug!("{}: shutdown: {e}", self.target);
                }
            }
        }
    }
}

impl Shared {
    /// The view for `mem`, mapping its regions if this map is new.
    fn view_for(&self, mem: &GuestMemory) -> Arc<MemView> {
        let mut t = lock(&self.maps);
        if let Some(v) = t.last.as_ref().filter(|v| v.mem.same_map(mem)) {
            return v.clone();
        }
        t.live.retain(|(_, w)| w.strong_count() > 0);
        let keys: Vec<RegionKey> = mem.region_sources().map(|s| (s.gpa, s.len, s.host as usize)).collect();
        t.failed.retain(|k| keys.contains(k));
        let mut regions = Vec::with_capacity(keys.len());
        for key @ (gpa, len, _) in keys {
            let reuse = t.live.iter().find(|(k, _)| *k == key).and_then(|(_, w)| w.upgrade());
            let map = if reuse.is_some() {
                reuse
            } else if t.failed.contains(&key) {
                None
            } else {
                match self.device.map_external(mem, gpa, len) {
                    Ok(Some(iova)) => {
                        bump(&self.stats.regions_mapped, 1);
                        let m = Arc::new(Mapped {
                            iova,
                            len,
                            device: self.device.clone(),
                            stats: self.stats.clone(),
                        });
                        t.live.push((key, Arc::downgrade(&m)));
                        Some(m)
                    }
                    Ok(None) => {
                        t.failed.push(key);
                        None
                    }
                    Err(e) => {
                        warn!(
                            gpa = format_args!("{gpa:#x}"),
                            len, "{}: cannot share guest memory, copying instead: {e}", self.target
                        );
                        bump(&self.stats.map_failures, 1);
                        t.failed.push(key);
                        None
                    }
                }
            };
            regions.push(ViewRegion { gpa, len, map });
        }
        let v = Arc::new(MemView { mem: mem.clone(), regions });
        t.last = Some(v.clone());
        v
    }
}

/// A namespace of another NVMe controller as a block backend (module documentation).
#[derive(Debug)]
pub struct NvmeBackend {
    shared: Arc<Shared>,
}

/// Largest read/write per command when the controller reports no MDTS.
const NO_MDTS_CHUNK: u64 = 2 << 20;

impl NvmeBackend {
    /// Opens the namespace an `nvme://` URI names.
    pub fn open(uri: &str) -> Result<Self, OpenError> {
        Self::open_with(NvmeBackendOptions::parse(uri)?)
    }

    /// Opens the namespace `opts` names.
    pub fn open_with(opts: NvmeBackendOptions) -> Result<Self, OpenError> {
        let target = opts.target.clone();
        let connect = |source| OpenError::Connect { target: target.clone(), source };
        if let (NvmeTarget::VfioUser(p), true) = (&opts.target, opts.auto_doorbells) {
            let eventfd =
                VfioUserOptions { doorbells: DoorbellMode::EventFd, socket_timeout: Some(opts.timeout) };
            let first = VfioUserTransport::connect(p, eventfd).map_err(connect).and_then(|t| {
                let o = NvmeBackendOptions { doorbells: DoorbellMode::EventFd, ..opts.clone() };
                Self::with_transport(Box::new(t), o)
            });
            match first {
                Ok(b) => return Ok(b),
                Err(e) => {
                    debug!("{}: eventfd doorbells not available ({e}); using {:?}", target, opts.doorbells)
                }
            }
        }
        let transport: Box<dyn Transport> = match &opts.target {
            NvmeTarget::VfioUser(p) => Box::new(
                VfioUserTransport::connect(
                    p,
                    VfioUserOptions { doorbells: opts.doorbells, socket_timeout: Some(opts.timeout) },
                )
                .map_err(connect)?,
            ),
            NvmeTarget::Pci(bdf) => Box::new(KernelVfioTransport::open(bdf).map_err(connect)?),
            NvmeTarget::Other(d) => {
                return Err(connect(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{d}: no transport to open (use NvmeBackend::with_transport)"),
                )))
            }
        };
        Self::with_transport(transport, opts)
    }

    /// Opens namespace `opts.nsid` of the controller behind `transport` (the target in
    /// `opts` is only used in messages, e.g. [`NvmeTarget::Other`]): for transports
    /// built by the caller, such as the in-process one.
    pub fn with_transport(
        transport: Box<dyn Transport>,
        opts: NvmeBackendOptions,
    ) -> Result<Self, OpenError> {
        let target = opts.target.clone();
        let driver_err = |source| OpenError::Driver { target: target.clone(), source };
        let unsupported = |msg: String| OpenError::Unsupported { target: target.clone(), msg };
        // Bounce buffers come from each queue's pool: 64 KiB per slot, 4..32 MiB.
        let pool_bytes = (opts.depth as u64 * (64 << 10)).clamp(4 << 20, 32 << 20);
        let dopts = DriverOptions {
            io_queues: opts.queues,
            queue_size: opts.depth,
            shadow_doorbells: true,
            completion: if opts.poll { CompletionMode::Polling } else { CompletionMode::Interrupts },
            pool_bytes,
            timeout: opts.timeout,
        };
        let mut driver = NvmeDriver::new(transport, dopts).map_err(driver_err)?;
        let Some(ns) = driver.namespace(opts.nsid).cloned() else {
            let available: Vec<String> = driver.namespaces().iter().map(|n| n.nsid.to_string()).collect();
            return Err(OpenError::NoNamespace {
                target,
                nsid: opts.nsid,
                available: if available.is_empty() { "none".into() } else { available.join(", ") },
            });
        };
        let lba = ns.lba_size();
        if lba == 0 || !lba.is_power_of_two() {
            return Err(unsupported(format!("namespace {}: unusable LBA size {lba}", opts.nsid)));
        }
        if ns.id.current_lbaf().ms.get() != 0 {
            return Err(unsupported(format!(
                "namespace {}: formats with metadata are not supported",
                opts.nsid
            )));
        }
        let ctrl = driver.controller().clone();
        // The NVM command set limits, if the controller can tell (NVMe 2.0).
        let nvm = driver.identify_nvm_controller().ok();
        let oncs = ctrl.id.oncs.get();
        let mps = 12 + ctrl.cap.mpsmin() as u32;
        let wz_bytes =
            nvm.as_ref().filter(|n| n.wzsl > 0).and_then(|n| 1u64.checked_shl(n.wzsl as u32 + mps));
        let dsm_blocks = nvm.as_ref().map(|n| n.dmrsl.get() as u64).filter(|&b| b > 0);
        let info = BackendInfo {
            kind: format!("nvme:{target} ns {}", opts.nsid),
            size: ns.size_bytes(),
            block_size: lba as u32,
            volatile_cache: ctrl.id.vwc & vwc::PRESENT != 0,
            discard: oncs & oncs::DSM != 0,
            discard_zeroes: ns.id.dlfeat & dlfeat::READ_BEHAVIOR_MASK == dlfeat::READ_ZEROES,
            discard_max: dsm_blocks.map_or(0, |b| b * lba),
            write_zeroes: oncs & oncs::WRITE_ZEROES != 0,
            write_zeroes_max: wz_bytes.unwrap_or(0),
        };
        let max_rw =
            ctrl.mdts_bytes.unwrap_or(NO_MDTS_CHUNK).min(65536 * lba).min(pool_bytes / 4) / lba * lba;
        if max_rw == 0 {
            return Err(unsupported(format!("an LBA of {lba} bytes exceeds the largest transfer (MDTS)")));
        }
        let max_wz = wz_bytes.map_or(65536, |b| (b / lba).clamp(1, 65536));
        let max_dsm = dsm_blocks.unwrap_or(u32::MAX as u64).min(u32::MAX as u64);
        let queues = driver.take_queues();
        if queues.len() < opts.queues as usize {
            warn!("{target}: the controller granted {} of {} I/O queue pairs", queues.len(), opts.queues);
        }
        let health = Arc::new(Health::default());
        for q in &queues {
            if let Some(fd) = q.interrupt_fd() {
                lock(&health.wakers).push(fd.try_clone_to_owned().map_err(|e| driver_err(e.into()))?);
            }
        }
        let device = driver.device_handle();
        let watcher = Watcher::spawn(device.clone(), health.clone()).map_err(|e| driver_err(e.into()))?;
        info!(
            "{target}: namespace {} ({} blocks of {lba} bytes), {} queue pair(s) of {} entries, {}; \
             {} bytes per command",
            opts.nsid,
            ns.blocks(),
            queues.len(),
            opts.depth,
            if opts.poll { "polled" } else { "interrupts" },
            max_rw
        );
        let total_queues = queues.len();
        Ok(NvmeBackend {
            shared: Arc::new(Shared {
                target,
                nsid: opts.nsid,
                lba,
                info,
                max_rw,
                max_wz,
                max_dsm,
                total_queues,
                free: Mutex::new(queues),
                device,
                maps: Mutex::new(MapTable::default()),
                stats: Arc::new(Counters::default()),
                health,
                poll: opts.poll,
                timeout: opts.timeout,
                watcher: Mutex::new(Some(watcher)),
                driver: Mutex::new(Some(driver)),
            }),
        })
    }

    /// The backend's counters now.
    pub fn stats(&self) -> NvmeBackendStats {
        self.stats_handle().snapshot()
    }

    /// A handle on the counters that outlives borrowing the backend.
    pub fn stats_handle(&self) -> NvmeStatsHandle {
        NvmeStatsHandle(self.shared.stats.clone())
    }

    /// Most bytes one downstream Read or Write carries (longer requests are split).
    pub fn max_transfer(&self) -> u64 {
        self.shared.max_rw
    }

    /// Why the downstream controller is unusable, once it is.
    pub fn dead(&self) -> Option<String> {
        self.shared.health.dead().map(str::to_string)
    }

    /// The transport's one-line description.
    pub fn describe(&self) -> String {
        self.shared.device.describe()
    }
}

impl Backend for NvmeBackend {
    fn info(&self) -> BackendInfo {
        self.shared.info.clone()
    }

    fn stats_line(&self) -> Option<String> {
        let s = self.stats();
        Some(format!(
            "{} requests as {} downstream commands ({} split); zero copy {} bytes in {} commands, \
             bounced {} bytes in {} commands; {} regions mapped, {} map failures; {} errors, {} not ready",
            s.requests,
            s.commands,
            s.split_requests,
            s.zero_copy_bytes,
            s.zero_copy_commands,
            s.bounce_bytes,
            s.bounce_commands,
            s.regions_mapped,
            s.map_failures,
            s.errors,
            s.not_ready
        ))
    }

    fn open_queue(&self) -> io::Result<Box<dyn BackendQueue>> {
        let s = &self.shared;
        let mut q = lock(&s.free).pop().ok_or_else(|| {
            io::Error::other(format!(
                "{}: all {} downstream I/O queue pair(s) are in use; raise queues= in the nvme:// URI \
                 (a vnvme front opens one per I/O worker plus one for its admin side: workers + 1)",
                s.target, s.total_queues
            ))
        })?;
        if let Err(e) = q.set_deferred_doorbell(true) {
            lock(&s.free).push(q);
            return Err(io::Error::other(e));
        }
        let notifier = match (s.poll, q.interrupt_fd().is_some()) {
            (false, true) => {
                Some(Notifier { epoll: epoll::create(epoll::CreateFlags::CLOEXEC)?, armed: false })
            }
            _ => None,
        };
        let depth = q.depth() as usize;
        Ok(Box::new(NvmeQueue {
            q: Some(q),
            shared: s.clone(),
            notifier,
            view: None,
            reqs: Vec::new(),
            free_reqs: Vec::new(),
            pieces: (0..depth).map(|_| None).collect(),
            pieces_in_flight: 0,
            backlog: VecDeque::new(),
            done: Vec::new(),
            in_flight: 0,
            comps: Vec::new(),
            segs: Vec::new(),
            scratch: Vec::new(),
            dead: false,
            busy: false,
        }))
    }
}

// ---- a queue

/// The owner's wake-up descriptor: an epoll set holding the downstream interrupt
/// eventfd while requests are in flight.
#[derive(Debug)]
struct Notifier {
    epoll: OwnedFd,
    armed: bool,
}

#[derive(Debug)]
struct Req {
    tag: u64,
    op: Op,
    offset: u64,
    len: u64,
    data: DataBuf,
    mem: GuestMemory,
    /// Units handed downstream so far (bytes; Flush has one unit).
    next: u64,
    end: u64,
    /// Where `next` lies in the guest segments.
    seg: SegmentMark,
    /// Pieces sent and not yet completed.
    outstanding: u32,
    pieces: u32,
    error: Option<BackendError>,
}

#[derive(Debug)]
struct Piece {
    req: usize,
    /// Byte range of the request this piece moves.
    off: u64,
    len: u64,
    seg: SegmentMark,
    /// A bounced read: copy the returned buffer into the request's data.
    copy_back: bool,
    /// Keeps the guest memory the PRPs point into mapped (zero copy).
    _view: Option<Arc<MemView>>,
}

enum Step {
    Sent,
    /// No downstream slot or DMA buffer now: retry when completions free some.
    Blocked,
    Failed(BackendError),
}

#[derive(Debug)]
struct NvmeQueue {
    /// Always `Some` until drop hands the pair back.
    q: Option<IoQueue>,
    shared: Arc<Shared>,
    notifier: Option<Notifier>,
    /// The view of the last guest memory snapshot seen.
    view: Option<Arc<MemView>>,
    reqs: Vec<Option<Req>>,
    free_reqs: Vec<usize>,
    /// By command identifier.
    pieces: Vec<Option<Piece>>,
    pieces_in_flight: usize,
    /// Requests with pieces still to send, in arrival order.
    backlog: VecDeque<usize>,
    done: Vec<Completion>,
    /// Requests submitted and not yet reaped.
    in_flight: usize,
    comps: Vec<DrvCompletion>,
    segs: Vec<(u64, u64)>,
    scratch: Vec<u8>,
    dead: bool,
    /// Counted in `Health::busy` (requests in flight).
    busy: bool,
}

fn invalid(msg: String) -> BackendError {
    BackendError::Io(io::Error::new(io::ErrorKind::InvalidInput, msg))
}

/// NLB, 0's based, of a chunk of `blocks` (1..=65536: `max_rw` and `max_wz` say so).
fn nlb_z(blocks: u64) -> u16 {
    debug_assert!((1..=65536).contains(&blocks));
    (blocks - 1) as u16
}

/// Bytes staged per copy between guest memory and a bounce buffer.
const STAGE: usize = 64 << 10;

impl NvmeQueue {
    fn q(&mut self) -> &mut IoQueue {
        self.q.as_mut().expect("queue present until drop")
    }

    /// The queue has requests in flight: the interrupt eventfd joins the notifier,
    /// and the watcher keeps an eye on the controller.
    fn arm(&mut self) {
        if self.busy {
            return;
        }
        self.busy = true;
        self.shared.health.busy.fetch_add(1, Ordering::SeqCst);
        let Some(n) = self.notifier.as_mut() else { return };
        let Some(fd) = self.q.as_ref().and_then(IoQueue::interrupt_fd) else { return };
        match epoll::add(&n.epoll, fd, epoll::EventData::new_u64(0), epoll::EventFlags::IN) {
            Ok(()) => n.armed = true,
            Err(e) => warn!("nvme backend: cannot watch the interrupt eventfd: {e}"),
        }
    }

    /// The queue went idle: the notifier is emptied, so an interrupt that arrives
    /// after the last completion was reaped cannot keep the owner awake.
    fn disarm(&mut self) {
        if !self.busy {
            return;
        }
        self.busy = false;
        self.shared.health.busy.fetch_sub(1, Ordering::SeqCst);
        let Some(n) = self.notifier.as_mut().filter(|n| n.armed) else { return };
        if let Some(fd) = self.q.as_ref().and_then(IoQueue::interrupt_fd) {
            let _ = epoll::delete(&n.epoll, fd);
        }
        n.armed = false;
    }

    fn finish(&mut self, r: usize) {
        let Some(req) = self.reqs[r].take() else { return };
        self.free_reqs.push(r);
        if matches!(req.error, Some(BackendError::NotReady(_))) {
            bump(&self.shared.stats.not_ready, 1);
        }
        if req.pieces > 1 {
            bump(&self.shared.stats.split_requests, 1);
        }
        self.done.push(Completion { tag: req.tag, result: req.error.map_or(Ok(()), Err), data: req.data });
    }

    /// Stops sending pieces of request `r` and records `e` (unless it already failed);
    /// it completes once its outstanding pieces have.
    fn fail_req(&mut self, r: usize, e: BackendError) {
        let Some(req) = self.reqs[r].as_mut() else { return };
        req.error.get_or_insert(e);
        req.next = req.end;
        if req.outstanding == 0 {
            self.finish(r);
        }
    }

    /// The downstream is gone: every request fails with NotReady, now and later.
    fn fail_all(&mut self, why: &str) {
        self.dead = true;
        for p in self.pieces.iter_mut().filter_map(Option::take) {
            if let Some(req) = self.reqs[p.req].as_mut() {
                req.outstanding -= 1;
            }
        }
        self.pieces_in_flight = 0;
        self.backlog.clear();
        for r in 0..self.reqs.len() {
            self.fail_req(r, BackendError::NotReady(why.to_string()));
        }
    }

    fn transport_failed(&mut self, e: impl std::fmt::Display) {
        self.shared.health.declare_dead(format!("transport: {e}"));
        let why = self.shared.health.dead().unwrap_or("transport failure").to_string();
        self.fail_all(&why);
    }

    /// Checks a request before anything goes downstream.
    fn check(&self, req: &Request) -> Result<(), BackendError> {
        let lba = self.shared.lba;
        if req.op != Op::Flush && (!req.offset.is_multiple_of(lba) || !req.len.is_multiple_of(lba)) {
            return Err(invalid(format!(
                "range {:#x}+{:#x} is not in whole {lba}-byte blocks of the downstream namespace",
                req.offset, req.len
            )));
        }
        if matches!(req.op, Op::Read | Op::Write { .. }) {
            let write = req.op != Op::Read;
            match &req.data {
                DataBuf::None => return Err(invalid("a read or write without a buffer".into())),
                DataBuf::Host(v) if (v.len() as u64) < req.len => {
                    return Err(invalid(format!("{}-byte buffer for {} bytes", v.len(), req.len)))
                }
                DataBuf::Host(_) => {}
                DataBuf::Guest(segs) => {
                    if segs.iter().map(Segment::len).sum::<u64>() != req.len {
                        return Err(invalid("segment lengths do not add up to the request".into()));
                    }
                    if write && segs.iter().any(|s| matches!(s, Segment::Discard { .. })) {
                        return Err(invalid("a bit bucket in a write".into()));
                    }
                }
            }
        }
        Ok(())
    }

    /// Sends the next piece of request `r` downstream.
    fn send_piece(&mut self, r: usize) -> Step {
        if self.pieces_in_flight >= self.pieces.len() {
            return Step::Blocked;
        }
        let sh = &*self.shared;
        let lba = sh.lba;
        let req = self.reqs[r].as_ref().expect("live request");
        let (off, seg) = (req.next, req.seg);
        let mut view = None;
        let mut copy_back = false;
        let (sqe, data, aux, n) = match req.op {
            Op::Flush => (FlushCmd { nsid: sh.nsid }.to_sqe(), None, None, 1),
            Op::WriteZeroes { deallocate } => {
                let n = (req.len - off).min(sh.max_wz * lba);
                let slba = (req.offset + off) / lba;
                let wz = WriteZeroesCmd {
                    nsid: sh.nsid,
                    slba,
                    nlb_z: nlb_z(n / lba),
                    deac: deallocate,
                    fua: false,
                };
                (wz.to_sqe(), None, None, n)
            }
            Op::Discard => {
                let n = (req.len - off).min(sh.max_dsm * lba);
                let range = DsmRange::new((req.offset + off) / lba, (n / lba) as u32);
                let list = match self.q.as_ref().expect("queue").alloc_buf(16) {
                    Ok(b) => b,
                    Err(e) => return self.no_buffer(e),
                };
                if let Err(e) = list.write_at(0, range.as_bytes()) {
                    return Step::Failed(e.into());
                }
                let mut s =
                    DatasetManagementCmd { nsid: sh.nsid, nr_z: 0, ad: true, ..Default::default() }.to_sqe();
                s.set_prps(list.iova(), 0);
                (s, None, Some(list), n)
            }
            Op::Read | Op::Write { .. } => {
                let n = (req.len - off).min(sh.max_rw);
                let (opcode, fua) = match req.op {
                    Op::Write { fua } => (op::WRITE, fua),
                    _ => (op::READ, false),
                };
                let rw = ReadWriteCmd {
                    nsid: sh.nsid,
                    slba: (req.offset + off) / lba,
                    nlb_z: nlb_z(n / lba),
                    fua,
                    lr: false,
                };
                let mut sqe = rw.to_sqe(opcode);
                let pool = self.q.as_ref().expect("queue").pool().clone();
                // Zero copy when every byte is in shared memory and fits PRP rules.
                if let DataBuf::Guest(segs) = &req.data {
                    if self.view.as_ref().is_none_or(|v| !v.mem.same_map(&req.mem)) {
                        self.view = Some(sh.view_for(&req.mem));
                    }
                    let v = self.view.as_ref().expect("just set");
                    if translate(v, segs, seg, n, &mut self.segs) && prp::segments_fit(&self.segs) {
                        view = Some(v.clone());
                    }
                }
                if view.is_some() {
                    let p = match prp::build_segments(&pool, &self.segs) {
                        Ok(p) => p,
                        Err(e) => return self.no_buffer(e),
                    };
                    sqe.set_prps(p.prp1, p.prp2);
                    (sqe, None, p.list, n)
                } else {
                    let buf = match pool.alloc(n) {
                        Ok(b) => b,
                        Err(e) => return self.no_buffer(e),
                    };
                    if opcode == op::WRITE {
                        if let Err(e) = stage_in(&req.data, &req.mem, off, seg, &buf, &mut self.scratch) {
                            return Step::Failed(e);
                        }
                    } else {
                        copy_back = true;
                    }
                    let p = match prp::build(&pool, buf.iova(), n) {
                        Ok(p) => p,
                        Err(e) => return self.no_buffer(e),
                    };
                    sqe.set_prps(p.prp1, p.prp2);
                    (sqe, Some(buf), p.list, n)
                }
            }
        };
        let cid = match self.q.as_mut().expect("queue").submit_sqe(sqe, data, aux) {
            Ok(cid) => cid,
            Err(DriverError::QueueFull(_)) => return Step::Blocked,
            Err(e) => return Step::Failed(BackendError::Io(io::Error::other(e))),
        };
        let req = self.reqs[r].as_mut().expect("live request");
        let next_seg = match &req.data {
            DataBuf::Guest(segs) if n > 0 && matches!(req.op, Op::Read | Op::Write { .. }) => {
                let mut cur = SegmentCursor::resume(segs, seg);
                cur.advance(n).map(|()| cur.mark())
            }
            _ => Ok(seg),
        };
        req.next += n;
        match next_seg {
            Ok(m) => req.seg = m,
            // `check` made the segments add up to the request, so they cannot end
            // first; if they did, the request fails rather than send the wrong bytes.
            Err(e) => {
                req.error.get_or_insert(e.into());
                req.next = req.end;
            }
        }
        req.outstanding += 1;
        req.pieces += 1;
        let rw = matches!(req.op, Op::Read | Op::Write { .. });
        let zero_copy = view.is_some();
        self.pieces[cid as usize] = Some(Piece { req: r, off, len: n, seg, copy_back, _view: view });
        self.pieces_in_flight += 1;
        let st = &sh.stats;
        bump(&st.commands, 1);
        if zero_copy {
            bump(&st.zero_copy_bytes, n);
            bump(&st.zero_copy_commands, 1);
        } else if rw {
            bump(&st.bounce_bytes, n);
            bump(&st.bounce_commands, 1);
        }
        Step::Sent
    }

    /// A DMA buffer could not be had: wait for completions to free one, unless none
    /// are coming.
    fn no_buffer(&self, e: DriverError) -> Step {
        match e {
            DriverError::PoolExhausted(_) if self.pieces_in_flight > 0 => Step::Blocked,
            e => Step::Failed(BackendError::Io(io::Error::other(e))),
        }
    }

    /// Sends pieces of request `r` until it is all sent or something blocks.
    fn drive(&mut self, r: usize) -> bool {
        loop {
            match self.reqs[r].as_ref() {
                Some(req) if req.next < req.end => {}
                _ => return true,
            }
            match self.send_piece(r) {
                Step::Sent => {}
                Step::Blocked => return false,
                Step::Failed(e) => {
                    self.fail_req(r, e);
                    return true;
                }
            }
        }
    }

    /// Sends backlogged pieces in order while there is room.
    fn pump(&mut self) {
        while let Some(&r) = self.backlog.front() {
            if !self.drive(r) {
                return;
            }
            self.backlog.pop_front();
        }
    }

    fn complete_piece(&mut self, c: DrvCompletion) {
        let Some(p) = self.pieces.get_mut(c.cid as usize).and_then(Option::take) else {
            debug!(cid = c.cid, "nvme backend: completion for no piece of ours ignored");
            return;
        };
        self.pieces_in_flight -= 1;
        let Some(req) = self.reqs[p.req].as_mut() else { return };
        req.outstanding -= 1;
        let err = if !c.status.is_success() {
            bump(&self.shared.stats.errors, 1);
            let s = c.status;
            Some(BackendError::Nvme { sct: s.sct(), sc: s.sc(), dnr: s.dnr() })
        } else if p.copy_back {
            match &c.buf {
                Some(buf) => {
                    stage_out(&mut req.data, &req.mem, p.off, p.len, p.seg, buf, &mut self.scratch).err()
                }
                None => Some(invalid("a read completed without its buffer".into())),
            }
        } else {
            None
        };
        if let Some(e) = err {
            req.error.get_or_insert(e);
            req.next = req.end;
        }
        if req.outstanding == 0 && req.next >= req.end {
            self.finish(p.req);
        }
    }

    fn ring(&mut self) {
        if let Err(e) = self.q().ring_sq() {
            self.transport_failed(e);
        }
    }

    /// Fails everything if another queue or the watcher found the downstream gone.
    fn check_health(&mut self) {
        if !self.dead {
            if let Some(why) = self.shared.health.dead() {
                let why = why.to_string();
                self.fail_all(&why);
            }
        }
    }

    /// Takes every completion the downstream CQ holds; returns how many.
    fn poll_cq(&mut self) -> usize {
        let mut comps = std::mem::take(&mut self.comps);
        let n = match self.q().poll_completions(&mut comps) {
            Ok(n) => {
                for c in comps.drain(..) {
                    self.complete_piece(c);
                }
                n
            }
            Err(e) => {
                comps.clear();
                self.transport_failed(e);
                0
            }
        };
        self.comps = comps;
        n
    }
}

/// The device addresses of `n` bytes of `segs` from `at`, merged where contiguous,
/// into `out`; false if any byte is outside shared memory or in a bit bucket.
fn translate(view: &MemView, segs: &[Segment], at: SegmentMark, n: u64, out: &mut Vec<(u64, u64)>) -> bool {
    out.clear();
    let mut covered = 0;
    for (_, piece) in SegmentCursor::resume(segs, at).pieces(n) {
        let Segment::Guest { gpa, len } = piece else { return false };
        let (mut a, mut left) = (gpa, len);
        while left > 0 {
            let Some((iova, room)) = view.translate(a) else { return false };
            let k = room.min(left);
            match out.last_mut() {
                Some(last) if last.0 + last.1 == iova => last.1 += k,
                _ => out.push((iova, k)),
            }
            a += k;
            left -= k;
        }
        covered += len;
    }
    covered == n
}

/// Copies `buf.len()` bytes of the request's data from byte `off` (mark `seg`)
/// into a bounce buffer.
fn stage_in(
    data: &DataBuf,
    mem: &GuestMemory,
    off: u64,
    seg: SegmentMark,
    buf: &DmaBuf,
    scratch: &mut Vec<u8>,
) -> Result<(), BackendError> {
    let n = buf.len();
    match data {
        DataBuf::Host(v) => buf.write_at(0, &v[off as usize..(off + n) as usize])?,
        DataBuf::Guest(segs) => {
            let mut cur = SegmentCursor::resume(segs, seg);
            copy_chunks(n, scratch, |at, part| {
                cur.read_into(mem, part)?;
                Ok(buf.write_at(at, part)?)
            })?;
        }
        DataBuf::None => return Err(invalid("no data buffer".into())),
    }
    Ok(())
}

/// Copies a bounced read's `len` bytes into the request's data at byte `off`; the
/// bytes that fall in bit buckets are dropped.
fn stage_out(
    data: &mut DataBuf,
    mem: &GuestMemory,
    off: u64,
    len: u64,
    seg: SegmentMark,
    buf: &DmaBuf,
    scratch: &mut Vec<u8>,
) -> Result<(), BackendError> {
    match data {
        DataBuf::Host(v) => buf.read_at(0, &mut v[off as usize..(off + len) as usize])?,
        DataBuf::Guest(segs) => {
            let mut cur = SegmentCursor::resume(segs, seg);
            copy_chunks(len, scratch, |at, part| {
                buf.read_at(at, part)?;
                Ok(cur.write_from(mem, part)?)
            })?
        }
        DataBuf::None => return Err(invalid("no data buffer".into())),
    }
    Ok(())
}

/// Runs `f(offset, staging slice)` over `len` bytes in chunks of at most [`STAGE`].
fn copy_chunks(
    len: u64,
    scratch: &mut Vec<u8>,
    mut f: impl FnMut(u64, &mut [u8]) -> Result<(), BackendError>,
) -> Result<(), BackendError> {
    if scratch.len() < STAGE {
        scratch.resize(STAGE, 0);
    }
    let mut at = 0;
    while at < len {
        let k = (len - at).min(STAGE as u64) as usize;
        f(at, &mut scratch[..k])?;
        at += k as u64;
    }
    Ok(())
}

impl BackendQueue for NvmeQueue {
    fn submit(&mut self, mem: &GuestMemory, req: Request) {
        self.in_flight += 1;
        self.arm();
        bump(&self.shared.stats.requests, 1);
        self.check_health();
        let early = if self.dead {
            Some(BackendError::NotReady(self.shared.health.dead().unwrap_or("downstream gone").to_string()))
        } else {
            self.check(&req).err()
        };
        let end = match req.op {
            Op::Flush => 1,
            _ => req.len,
        };
        if early.is_some() || end == 0 {
            if matches!(early, Some(BackendError::NotReady(_))) {
                bump(&self.shared.stats.not_ready, 1);
            }
            self.done.push(Completion { tag: req.tag, result: early.map_or(Ok(()), Err), data: req.data });
            return;
        }
        let r = Req {
            tag: req.tag,
            op: req.op,
            offset: req.offset,
            len: req.len,
            data: req.data,
            mem: mem.clone(),
            next: 0,
            end,
            seg: SegmentMark::default(),
            outstanding: 0,
            pieces: 0,
            error: None,
        };
        let r = match self.free_reqs.pop() {
            Some(i) => {
                self.reqs[i] = Some(r);
                i
            }
            None => {
                self.reqs.push(Some(r));
                self.reqs.len() - 1
            }
        };
        if self.backlog.is_empty() && self.drive(r) {
            return;
        }
        bump(&self.shared.stats.backlogged, 1);
        self.backlog.push_back(r);
        self.pump();
    }

    fn commit(&mut self) {
        if !self.dead {
            self.ring();
        }
    }

    fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        self.check_health();
        if !self.dead {
            // The interrupt eventfd is reset only when the CQ has nothing new, then
            // the CQ is looked at once more (a completion posted in between has its
            // interrupt after the reset): owners that call reap in a loop do not pay
            // a system call per look, and a level-triggered owner never sleeps on a
            // completion. A completion found without resetting may leave the eventfd
            // set: one spare wake-up, which finds nothing, resets it and sleeps.
            if self.poll_cq() == 0 && self.notifier.is_some() && self.q().clear_interrupt() {
                self.poll_cq();
            }
            if !self.dead {
                self.pump();
                self.ring();
            }
        }
        let n = self.done.len();
        self.in_flight -= n;
        out.append(&mut self.done);
        if self.in_flight == 0 {
            self.disarm();
        }
        n
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn notifier(&self) -> Option<BorrowedFd<'_>> {
        self.notifier.as_ref().map(|n| n.epoll.as_fd())
    }
}

impl Drop for NvmeQueue {
    fn drop(&mut self) {
        // Commands still downstream may be moving guest memory: let them finish
        // (bounded) before the pair goes back to the backend.
        let deadline = Instant::now() + self.shared.timeout;
        if !self.dead {
            self.ring();
        }
        while self.pieces_in_flight > 0 && !self.dead && Instant::now() < deadline {
            self.check_health();
            if !self.dead && self.poll_cq() == 0 {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        self.in_flight = 0;
        self.disarm();
        let Some(mut q) = self.q.take() else { return };
        if self.pieces_in_flight == 0 && !self.dead {
            q.clear_interrupt();
            lock(&self.shared.free).push(q);
        } else {
            warn!(
                "{}: a dropped queue still has {} command(s) downstream; its queue pair is retired",
                self.shared.target, self.pieces_in_flight
            );
            // Kept with the driver so the memory it may still reach outlives it.
            if let Some(d) = lock(&self.shared.driver).as_mut() {
                d.return_queue(q);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_parse_with_defaults_and_options() {
        let o = NvmeBackendOptions::parse("nvme:///run/vnvme.sock").unwrap();
        assert_eq!(o.target, NvmeTarget::VfioUser("/run/vnvme.sock".into()));
        assert_eq!((o.nsid, o.queues, o.depth, o.poll), (1, 4, 128, false));
        assert_eq!(o.doorbells, DoorbellMode::Trapped);
        let o = NvmeBackendOptions::parse("nvme://./a.sock?ns=2&queues=8&depth=64&doorbells=eventfd&poll=1")
            .unwrap();
        assert_eq!(o.target, NvmeTarget::VfioUser("./a.sock".into()));
        assert_eq!((o.nsid, o.queues, o.depth, o.poll), (2, 8, 64, true));
        assert_eq!(o.doorbells, DoorbellMode::EventFd);
        let o = NvmeBackendOptions::parse("nvme://01:00.0?timeout=5").unwrap();
        assert_eq!(o.target, NvmeTarget::Pci("0000:01:00.0".into()));
        assert_eq!(o.timeout, Duration::from_secs(5));
    }

    #[test]
    fn bad_uris_name_the_offending_part() {
        let e = |u: &str| NvmeBackendOptions::parse(u).unwrap_err().to_string();
        assert!(e("file:///x").contains("must start with nvme://"), "{}", e("file:///x"));
        assert!(e("nvme://").contains("no target"));
        assert!(e("nvme://?ns=1").contains("no target"));
        assert!(e("nvme://relative.sock").contains("\"relative.sock\""));
        assert!(e("nvme:///a.sock?ns=0").contains("ns=0"));
        assert!(e("nvme:///a.sock?ns=x").contains("ns=x"));
        assert!(e("nvme:///a.sock?depth=1").contains("depth=1"));
        assert!(e("nvme:///a.sock?queues=0").contains("queues=0"));
        assert!(e("nvme:///a.sock?doorbells=carrier-pigeon").contains("doorbells=carrier-pigeon"));
        assert!(e("nvme:///a.sock?poll=maybe").contains("poll=maybe"));
        assert!(e("nvme:///a.sock?colour=blue").contains("unknown option \"colour\""));
        assert!(e("nvme:///a.sock?ns").contains("\"ns\" has no value"));
        assert!(e("nvme:///a.sock?ns=1&ns=2").contains("ns given twice"));
        assert!(e("nvme://0000:01:00.0?doorbells=mapped").contains("vfio-user sockets only"));
    }

    #[test]
    fn seg_cursor_walks_segments() {
        let segs = [
            Segment::Guest { gpa: 0x1000, len: 0x200 },
            Segment::Discard { len: 0x100 },
            Segment::Guest { gpa: 0x9000, len: 0x1000 },
        ];
        // A piece's mark, kept across pieces, resumes where the last piece ended.
        let mut c = SegmentCursor::new(&segs);
        c.advance(0x250).unwrap();
        let mark = c.mark();
        let mut c = SegmentCursor::resume(&segs, mark);
        assert_eq!(c.offset(), 0x250);
        c.advance(0xb0).unwrap();
        assert_eq!(c.pieces(1).next(), Some((0x300, Segment::Guest { gpa: 0x9000, len: 1 })));
        // Empty segments are stepped over.
        let holes = [
            Segment::Guest { gpa: 0, len: 0 },
            Segment::Guest { gpa: 0x1000, len: 0x10 },
            Segment::Discard { len: 0 },
        ];
        let n: u64 = SegmentCursor::new(&holes).pieces(0x10).map(|(_, p)| p.len()).sum();
        assert_eq!(n, 0x10);
        let mut end = SegmentCursor::new(&holes);
        end.advance(0x10).unwrap();
        assert!(end.advance(1).is_err(), "nothing past the end");
        let mut c = SegmentCursor::new(&segs);
        c.advance(0x100).unwrap();
        let seen: Vec<_> = c.pieces(0x300).collect();
        assert_eq!(
            seen,
            vec![
                (0x100, Segment::Guest { gpa: 0x1100, len: 0x100 }),
                (0x200, Segment::Discard { len: 0x100 }),
                (0x300, Segment::Guest { gpa: 0x9000, len: 0x100 }),
            ]
        );
    }
}
