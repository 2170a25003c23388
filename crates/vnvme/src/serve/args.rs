//! `vnvme serve`'s arguments, and what the server makes of them before it starts:
//! the controller's configuration, the device's options, the checks no single
//! option can make.

use std::path::PathBuf;

use nvme_ctrl::{ControllerConfig, PollMode};
use vfio_user_server::pci::PciIds;
use vfio_user_server::DeviceOptions;

use crate::nsspec::NsSpec;

/// `vnvme serve`'s arguments.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// UNIX socket path to listen on (a stale socket file is replaced).
    #[arg(long)]
    pub socket: PathBuf,
    /// A namespace (repeat for several): ram:SIZE, null:SIZE, file:PATH[:SIZE], nvme://..., nbd://... or rbd:...
    ///
    /// ram:SIZE          RAM, allocated on first write
    /// null:SIZE         reads return zeroes, writes are dropped; reads=untouched
    ///                   (for benchmarks of the controller alone, like null_blk)
    ///                   completes reads without writing the guest's buffer
    /// file:PATH[:SIZE]  a regular file (created or extended to SIZE) or a block
    ///                   device; io_uring with O_DIRECT when the file system allows
    ///                   it, pread/pwrite on tmpfs and ramfs
    /// nvme:///path/to/vfio-user.sock?ns=1, nvme://0000:01:00.0?ns=1
    ///                   a namespace of another NVMe controller through the
    ///                   userspace driver; query options ns, queues (at least
    ///                   workers + 1), depth, doorbells (default: eventfd when
    ///                   offered, else trapped), poll, timeout
    /// nbd://HOST[:PORT]/EXPORT, nbd+unix:///EXPORT?socket=PATH
    ///                   an export of an NBD server (qemu-nbd, qemu-storage-daemon,
    ///                   nbdkit); port 10809 by default, an empty EXPORT is the
    ///                   server's default; one connection per worker when the
    ///                   server allows several (multi-conn), else --workers 0;
    ///                   a lost connection is made again while commands wait (the
    ///                   hold, below), then they fail Namespace Not Ready and one
    ///                   tries the server again every second. The namespace has
    ///                   the export's size. Options follow the URI (:timeout=5s)
    /// rbd:POOL[/NAMESPACE]/IMAGE[@SNAP]
    ///                   a Ceph RBD image through librbd (loaded at start: librbd1
    ///                   installed, or VNVME_LIBRBD=PATH); options conf=PATH (else
    ///                   CEPH_CONF or /etc/ceph/ceph.conf), id=USER (default
    ///                   admin), keyring=PATH. The namespace has the image's size; a
    ///                   snapshot is read-only
    ///
    /// Options after the kind, each as :NAME=VALUE:
    ///   lba=512|4096             LBA size (default 512, or the backend's block size)
    ///   direct=auto|on|off       file: O_DIRECT
    ///   engine=auto|uring|sync   file: io_uring or pread/pwrite
    ///   fault=OP/ERROR[/lba=START+COUNT][/after=N][/count=N][/delay=MS]
    ///                            inject failures (repeatable); OP read, write, flush,
    ///                            discard or any; ERROR eio, enospc, short, gone, rofs,
    ///                            or hang (never completes); delay=MS completes MS ms
    ///                            late (OP/delay=MS: late but successful)
    ///   timeout=T                commands the backend has not finished after T
    ///                            (default 30s; ms or s; 0 or off: never) complete
    ///                            with Internal Error and the request is abandoned
    ///   hold=T                   nbd:// and rbd: only: how long commands wait for
    ///                            storage that went away (a reconnect; a cluster
    ///                            that does not answer) before they fail Namespace
    ///                            Not Ready (default 25s, or 5/6 of a shorter
    ///                            timeout; 0: fail at once). A guest that enabled Advanced
    ///                            Command Retry (Linux does) then waits 1 s before
    ///                            each of its retries
    ///   zoned=SIZE               a zoned namespace (NVMe ZNS) of SIZE zones (a power
    ///                            of two, at least 4K); with zone-cap=SIZE (writable
    ///                            bytes per zone, default all), max-open=N and
    ///                            max-active=N (default: no limit), zone-state=PATH
    ///                            (where write pointers are kept: by default
    ///                            FILE.zones beside a regular file, in memory for
    ///                            ram: and null:, required for other kinds)
    ///   ms=8|16|64               bytes of metadata per block (8 with 512-byte
    ///                            blocks; 8, 16 or 64 with lba=4096); with pi=1|2|3
    ///                            (end-to-end protection information type),
    ///                            guard=64 (with ms=16: CRC-64/NVME, 48-bit
    ///                            reference tags; default 16, CRC-16 T10-DIF),
    ///                            pil=first|last (where it sits, default last),
    ///                            mset=1 (metadata inline after each block's data:
    ///                            extended LBAs; default a separate buffer),
    ///                            meta=PATH (where metadata is kept: by default
    ///                            FILE.meta beside a regular file, in memory for
    ///                            ram:, nowhere for null:, required for other kinds;
    ///                            alone it offers the formats without starting in one)
    ///
    /// Examples: ram:1G  file:disk.img:8G:lba=4096  ram:64M:fault=read/eio/lba=2048+8
    ///           file:zns.img:4G:zoned=64M:max-open=14  file:db.img:16G:ms=8:pi=1
    #[arg(long = "ns", default_value = "ram:1G", verbatim_doc_comment)]
    pub namespaces: Vec<NsSpec>,
    /// I/O worker threads; each owns the queues assigned to it. 0: inline, the
    /// server's own thread runs every queue between messages (one thread hop less
    /// per doorbell, no parallelism). Default: 0 on a host with at most 2 usable
    /// CPUs (a worker could not run beside the vCPUs and the server thread anyway:
    /// inline took 20 % less CPU per I/O at QD 1 there), else 1. At most 64.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=64))]
    pub workers: Option<usize>,
    /// How idle workers wait: off (sleep until a doorbell), adaptive (spin, for an
    /// adapting budget, only while that costs less CPU per command than sleeping:
    /// both are measured in turn), always (spin).
    #[arg(long, default_value = "adaptive")]
    pub poll: PollMode,
    /// Most I/O queue pairs the controller offers (MSI-X vectors = this + 1), 1 to
    /// 511.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..=511))]
    pub queues: u16,
    /// Controller serial number (Identify SN: up to 20 printable ASCII characters).
    #[arg(long, default_value = "VNVME0001", value_parser = parse_serial)]
    pub serial: String,
    /// PCI vendor:device ID in hex.
    #[arg(long, default_value = "1b36:0010", value_parser = parse_pci_id)]
    pub pci_id: (u16, u16),
    /// Exit after the first client disconnects. A client is any connection that
    /// sends a message: a VMM, or `vnvme identify` / `vnvme perf` (each ends a
    /// --once server); a connection closed without one (another server checking
    /// whether the socket is in use) is not.
    #[arg(long)]
    pub once: bool,
    /// Serve from a child process, and if it dies (a crash, the OOM killer, kill -9)
    /// start another that takes the VMM's connection over: the VMM sees nothing, the
    /// guest sees a Persistent Internal Error event and resets the controller (with native
    /// multipath, I/O goes on through the other paths meanwhile). This process
    /// keeps the connection, the guest memory and interrupt descriptors meanwhile,
    /// and the namespaces, QoS and ANA states as `vnvme ctl` left them (with the
    /// memory of `ram:` namespaces); at most 5 restarts a minute.
    #[arg(long)]
    pub restart_on_crash: bool,
    /// Write the controller's counters (JSON) here twice a second and at exit
    /// (SIGTERM and SIGINT included: they stop the server cleanly).
    #[arg(long)]
    pub stats_file: Option<PathBuf>,
    /// How doorbell writes arrive: trapped (REGION_WRITE messages), eventfd (IO FDs
    /// offered for I/O queue doorbells; needs a guest using shadow doorbells) or
    /// mapped (doorbell page mapped into the guest; workers poll it).
    #[arg(long, default_value = "trapped")]
    pub doorbells: vfio_user_server::DoorbellMode,
    /// Do not offer Doorbell Buffer Config (OACS bit 8), so the guest writes every
    /// doorbell register: the baseline for measuring what shadow doorbells save.
    #[arg(long)]
    pub no_shadow_doorbells: bool,
    /// How long a vfio-user message may take to arrive once begun, and a reply to
    /// leave; a client that stalls longer is evicted and the device reset (e.g. 5s,
    /// 500ms).
    #[arg(long, default_value = "5s", value_parser = parse_deadline)]
    pub client_deadline: std::time::Duration,
    /// Accepted and ignored (kept for command lines that give it): guest memory the
    /// VMM could shrink under the server (a memfd without F_SEAL_SHRINK, as SPDK's
    /// initiator sends; a regular file, as QEMU's memory-backend-file on hugetlbfs
    /// is) is served by default now, each such region guarded: a VMM that shrinks
    /// it fails the commands that touch it, never the server.
    #[arg(long, hide = true)]
    pub allow_unsealed_memory: bool,
    /// After start-up, confine the process to a seccomp allowlist of the system calls
    /// serving needs (no_new_privs set; anything else fails with EPERM). off: for
    /// debugging only.
    #[arg(long, default_value = "on")]
    pub sandbox: Switch,
    /// After start-up (socket bound, namespaces opened, stats file written once),
    /// change to this user's uid, gid and groups. Needs root to start. The
    /// --stats-file's directory must be writable by that user; sockets in a
    /// directory it cannot write stay when the server ends (said at start).
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    /// Serve the control socket (JSON-RPC 2.0, owner-only) here: `vnvme ctl --control
    /// PATH METHOD` reads state and counters, adds, removes and resizes namespaces,
    /// sets QoS and the log filter (docs/CONTROL.md).
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Serve Prometheus metrics (text format over HTTP, GET /metrics) on a loopback
    /// TCP address (127.0.0.1:9464) or a UNIX socket (unix:/run/vnvme/vm1.metrics,
    /// created owner-only).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<crate::metrics::http::MetricsAddr>,
    /// Number of Namespaces the controller reports (Identify NN): room for
    /// namespaces added later through the control socket or made in the pool.
    /// Default: 32 with --control or --pool, else as many as --ns gives. 1 to 1024.
    #[arg(long, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<u32>::new().range(1..=nvme_ctrl::MAX_NAMESPACES as u64))]
    pub max_namespaces: Option<u32>,
    /// Offer Flexible Data Placement (NVMe TP4146): endurance group 1 with HANDLES
    /// reclaim unit handles (1 to 127), reclaim units of SIZE bytes (a multiple of
    /// 4 KiB; default 64M). Every namespace of the NVM command set has a placement
    /// handle for each; a write's Data Placement directive names the one it goes
    /// through (docs/fdp.md).
    #[arg(long, value_name = "HANDLES[:ru=SIZE]", value_parser = crate::fdpspec::parse)]
    pub fdp: Option<nvme_ctrl::FdpConfig>,
    /// Serve one controller of an NVM subsystem of several, with controller ID N
    /// (0 to 65519), each controller its own `vnvme serve` on its own socket, for a
    /// guest's multipath (docs/subsystems.md). Give every controller of the
    /// subsystem the same --serial (it names the subsystem and its namespaces'
    /// identifiers) and the same --ns storage, each its own --cntlid. Identify then
    /// says the subsystem may have several controllers (CMIC bit 1) and every
    /// namespace may be shared (NMIC bit 0).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(0..=nvme_ctrl::MAX_CNTLID as i64))]
    pub cntlid: Option<u16>,
    /// A namespace pool in directory DIR (made if absent) of SIZE bytes (e.g. 64G;
    /// needed when the pool is new, and it must match after): the guest creates,
    /// deletes, attaches and detaches namespaces in it (Namespace Management and
    /// Attachment; nvme create-ns, attach-ns), and so does `vnvme ctl ns.create`
    /// and the rest. Give every controller of the subsystem the same DIR; each
    /// namespace's data is a sparse file there (docs/subsystems.md).
    #[arg(long, value_name = "DIR[:SIZE]", value_parser = parse_pool)]
    pub pool: Option<PoolSpec>,
    /// This server is the destination of a live migration (as QEMU's -incoming):
    /// its namespaces' files are the source server's until the migration ends, and
    /// are shared with it (any vnvme server) rather than refused as in use. Every
    /// other server keeps to one writer per file (a second one on a file is
    /// refused, the holder named; docs/USAGE.md).
    #[arg(long)]
    pub incoming: bool,
}

/// `--pool DIR[:SIZE]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolSpec {
    pub dir: std::path::PathBuf,
    pub size: Option<u64>,
}

pub(super) fn parse_pool(s: &str) -> Result<PoolSpec, String> {
    let (dir, size) = match s.rsplit_once(':') {
        Some((d, z)) if !d.is_empty() => {
            (d, Some(crate::units::parse_size(z).map_err(|e| format!("{z:?}: the pool's size: {e}"))?))
        }
        _ => (s, None),
    };
    if dir.is_empty() {
        return Err("the pool's directory, e.g. /var/lib/vnvme/pool1:64G".into());
    }
    if size == Some(0) {
        return Err("a pool of 0 bytes holds nothing".into());
    }
    Ok(PoolSpec { dir: dir.into(), size })
}

impl PoolSpec {
    /// Opens it as this controller, which the operator gave the NSIDs `fixed`.
    pub(super) fn open(
        &self,
        cntlid: Option<u16>,
        fixed: &[u32],
        locks: &file_lock::Policy,
    ) -> Result<std::sync::Arc<nvme_ctrl::pool::NamespacePool>, String> {
        let p =
            nvme_ctrl::pool::NamespacePool::open(&self.dir, self.size, cntlid.unwrap_or(0), fixed, locks)?;
        Ok(std::sync::Arc::new(p))
    }
}

/// on or off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    On,
    Off,
}

impl ServeArgs {
    /// `--workers`, or its default for this host (see the option's help; once
    /// [`resolve_workers`] ran, the count it settled).
    pub fn worker_count(&self) -> usize {
        self.workers.unwrap_or_else(default_workers)
    }
}

/// Settles `--workers` once, from this host's default when not given, so every
/// later use sees the same count. True when the default applied.
pub(super) fn resolve_workers(a: &mut ServeArgs) -> bool {
    let defaulted = a.workers.is_none();
    a.workers = Some(a.worker_count());
    defaulted
}

/// The most usable CPUs (affinity and cgroup quota counted) on which the default is
/// inline mode.
pub const INLINE_UP_TO_CPUS: usize = 2;

/// `--workers` when not given: inline on a small host, else one worker.
pub(super) fn default_workers() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    usize::from(cpus > INLINE_UP_TO_CPUS)
}

/// What the argument parser cannot see alone: options that do not go together.
pub(super) fn check(a: &ServeArgs) -> Result<(), Box<dyn std::error::Error>> {
    if a.doorbells == vfio_user_server::DoorbellMode::EventFd && a.no_shadow_doorbells {
        return Err("--doorbells eventfd needs shadow doorbells (an ioeventfd says that a doorbell was \
                    written, not its value, which is read from the guest's shadow buffer): leave out \
                    --no-shadow-doorbells, or use --doorbells trapped"
            .into());
    }
    // One path, one purpose: each socket, and the stats file, its own.
    let mut paths: Vec<(&str, &std::path::Path)> = vec![("--socket", a.socket.as_path())];
    paths.extend(a.control.as_deref().map(|p| ("--control", p)));
    paths.extend(a.metrics.as_ref().and_then(|m| m.unix_path()).map(|p| ("--metrics unix:", p)));
    paths.extend(a.stats_file.as_deref().map(|p| ("--stats-file", p)));
    let same = |x: &std::path::Path, y: &std::path::Path| {
        x == y || std::path::absolute(x).ok().zip(std::path::absolute(y).ok()).is_some_and(|(x, y)| x == y)
    };
    for (i, (f, p)) in paths.iter().enumerate() {
        if let Some((g, _)) = paths[..i].iter().find(|(_, q)| same(p, q)) {
            return Err(format!(
                "{g} and {f} are the same path ({}): each needs its own (e.g. vm1.sock, vm1.ctl, \
                 vm1.metrics, vm1-stats.json)",
                p.display()
            )
            .into());
        }
    }
    Ok(())
}

/// `--serial`: what Identify's 20-byte SN field can hold.
pub(super) fn parse_serial(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(format!("{s:?}: a serial number is 1 to 20 printable ASCII characters"));
    }
    Ok(s.to_string())
}

/// `--client-deadline`: a duration above zero (a client must have some time).
pub(super) fn parse_deadline(s: &str) -> Result<std::time::Duration, String> {
    match crate::perf::parse_duration(s)? {
        d if d.is_zero() => Err(format!("{s}: the deadline must be above zero, e.g. 5s or 500ms")),
        d => Ok(d),
    }
}

pub(super) fn max_namespaces(a: &ServeArgs) -> Result<u32, Box<dyn std::error::Error>> {
    Ok(match a.max_namespaces {
        Some(n) if (n as usize) < a.namespaces.len() => {
            return Err(
                format!("--max-namespaces {n} is fewer than the {} --ns given", a.namespaces.len()).into()
            )
        }
        Some(n) => n,
        None if a.control.is_some() || a.pool.is_some() => {
            DEFAULT_MAX_NAMESPACES.max(a.namespaces.len() as u32)
        }
        None => 0,
    })
}

pub(super) fn controller_config(a: &ServeArgs, max_namespaces: u32) -> ControllerConfig {
    ControllerConfig {
        serial: a.serial.clone(),
        max_io_queues: a.queues,
        msix_vectors: a.queues + 1,
        shadow_doorbells: !a.no_shadow_doorbells,
        namespaces: Vec::new(),
        max_namespaces,
        fdp: a.fdp,
        subsystem: a.cntlid.map(|cntlid| nvme_ctrl::SubsystemConfig { cntlid }),
        ..Default::default()
    }
}

/// How this server locks the files it writes: alone, or (a controller of a
/// subsystem, `--cntlid`) shared with the subsystem's other controllers, which
/// `--serial` names; `accept` are processes whose hold is no conflict (the one a
/// takeover takes over from).
pub fn lock_policy(a: &ServeArgs, accept: Vec<u32>) -> file_lock::Policy {
    file_lock::Policy {
        group: a.cntlid.map(|_| format!("vnvme subsystem {}", a.serial)),
        accept,
        share_with_vnvme: a.incoming,
    }
}

/// A mapped doorbell page produces no notification: workers must poll it.
pub(super) fn poll_mode(a: &ServeArgs) -> PollMode {
    if a.doorbells == vfio_user_server::DoorbellMode::Mapped {
        if a.poll != PollMode::Always {
            crate::logging::say!(
                "vnvme: --doorbells mapped: workers poll always (the guest's doorbell stores do not notify)"
            );
        }
        PollMode::Always
    } else {
        a.poll
    }
}

pub(super) fn device_options(a: &ServeArgs) -> DeviceOptions {
    DeviceOptions {
        ids: PciIds { vendor: a.pci_id.0, device: a.pci_id.1, ..DeviceOptions::default().ids },
        doorbells: a.doorbells,
        // Within the client's patience: it must see the reply before its own deadline.
        release_wait: a.client_deadline.mul_f64(0.8),
    }
}

/// Namespaces a controller has room for with --control or --pool and no
/// --max-namespaces.
const DEFAULT_MAX_NAMESPACES: u32 = 32;

/// Parses `VVVV:DDDD` (hex).
pub(super) fn parse_pci_id(s: &str) -> Result<(u16, u16), String> {
    let (v, d) = s.split_once(':').ok_or("expected VENDOR:DEVICE in hex, e.g. 1b36:0010")?;
    let p = |x: &str| u16::from_str_radix(x, 16).map_err(|_| format!("bad hex id {x:?}"));
    Ok((p(v)?, p(d)?))
}
