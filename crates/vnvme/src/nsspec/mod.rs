//! Parsing namespace specifications given on the command line, and opening them.
//!
//! ```text
//! ram:SIZE[:OPT...]               RAM, zero filled
//! null:SIZE[:OPT...]              reads return zeroes, writes are dropped; with
//!                                 reads=untouched (benchmarks only) reads leave
//!                                 the guest's buffer as it was
//! file:PATH[:SIZE][:OPT...]       a regular file (created or extended to SIZE) or a
//!                                 block device, on io_uring
//! nvme://...                      a namespace of another NVMe controller, through the
//!                                 userspace driver (see `vnvme serve --help`)
//! nbd://HOST[:PORT]/EXPORT[:OPT...]  an export of an NBD server (qemu-nbd, nbdkit, ...)
//! nbd+unix:///EXPORT?socket=PATH[:OPT...]
//! rbd:POOL[/NAMESPACE]/IMAGE[@SNAP][:OPT...]
//!                                 a Ceph RBD image (librbd); OPT also conf=PATH,
//!                                 id=USER, keyring=PATH
//!
//! OPT: lba=512|4096        LBA size (default: 512, or the backend's block size)
//!      direct=auto|on|off  file: O_DIRECT (auto: when the file system allows it;
//!                          on: refused where it cannot be had: engine=sync, or
//!                          engine=auto on tmpfs and ramfs)
//!      readonly=on|off     file: served write protected (Identify NSATTR; Linux
//!                          makes the disk read-only), opened read-only and locked
//!                          shared: other servers may read it too, none write it
//!      engine=auto|uring|sync  file: io_uring, or plain pread/pwrite; auto (the
//!                          default) picks pread/pwrite on tmpfs and ramfs (memory:
//!                          io_uring would hand every request to a kernel worker
//!                          thread there) and io_uring everywhere else
//!      fault=RULE          inject failures (repeatable), RULE = OP/ERROR[/lba=S+N]
//!                          [/after=N][/count=N][/delay=MS], e.g. fault=read/eio/lba=2048+8;
//!                          ERROR hang never completes; OP/delay=MS only delays
//!      timeout=T           commands the backend has not finished after T (30s by
//!                          default; ms or s; 0 or off: never) complete with an error
//!      ana=G               its ANA group, 1 to 32 (default 1): a controller of a
//!                          subsystem (--cntlid) reports and enforces each group's
//!                          state (ana.set; docs/subsystems.md)
//!      resv=PATH           reservations (Register, Acquire, Release, Report) kept
//!                          in the state file PATH: give every controller of the
//!                          subsystem the same one (created if absent; kept
//!                          across restarts)
//!      hold=T              nbd:// and rbd: only: how long commands wait for storage
//!                          that went away (a reconnect, a cluster that does not
//!                          answer) before they fail Not Ready (25s by default, or
//!                          5/6 of a shorter timeout; shorter than the timeout)
//!
//! Any kind can be zoned: zoned=SIZE, zone-cap=, max-open=, max-active=,
//! zone-state= (see `zonespec`); or have metadata and protection information:
//! ms=8|16|64, pi=0|1|2|3, guard=16|64, pil=first|last, meta=PATH (see `metaspec`).
//!
//! A URI kind (nbd://, nvme://) takes its options after the URI, each as `:NAME=VALUE`
//! with a NAME above: they are read from the end, so a URI keeps its own colons.
//! ```

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use nvme_ctrl::DEFAULT_COMMAND_TIMEOUT;

use crate::sandbox::Needs;
pub use crate::units::{human_size, parse_size};
use crate::zonespec::ZoneSpec;

use block_backend::{DirectMode, FaultRule};

mod open;
pub use open::{with_fix, Kept, Opened};

/// The memory file system `path` is on (or would be created on), by name: tmpfs or
/// ramfs; None on any other (or when it cannot be told).
fn memory_fs(path: &std::path::Path) -> Option<&'static str> {
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    const RAMFS_MAGIC: u64 = 0x8584_58f6;
    // The file may not exist yet: ask about the directory it will be in.
    let probe = if path.exists() {
        path
    } else {
        path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."))
    };
    match rustix::fs::statfs(probe).ok()?.f_type as u64 {
        TMPFS_MAGIC => Some("tmpfs"),
        RAMFS_MAGIC => Some("ramfs"),
        _ => None,
    }
}

/// One `--ns` argument.
#[derive(Clone, Debug)]
pub struct NsSpec {
    /// What it was parsed from.
    pub text: String,
    pub kind: Kind,
    /// Size for RAM and null namespaces, and the size to create a file at.
    pub size: Option<u64>,
    /// LBA format index (0 = 512 B, 1 = 4 KiB); `None` picks the smallest the
    /// backend supports.
    pub lba_format: Option<u8>,
    /// How a `file:` namespace's file is opened and driven.
    pub file: FileOptions,
    pub faults: Vec<FaultRule>,
    /// Command timeout (None: never).
    pub timeout: Option<Duration>,
    /// How long commands wait for storage that went away (`hold=`; None: the default).
    pub hold: Option<Duration>,
    /// A zoned namespace's options (None: the NVM command set).
    pub zoned: Option<crate::zonespec::ZoneSpec>,
    /// Metadata and protection options (None: formats without metadata only).
    pub meta: Option<crate::metaspec::MetaSpec>,
    /// What it has as a namespace of a subsystem of several controllers.
    pub shared: SharedSpec,
}

/// How a `file:` namespace's file is opened and driven.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileOptions {
    /// `direct=`: O_DIRECT or the page cache.
    pub direct: DirectMode,
    /// `engine=`: io_uring or pread/pwrite.
    pub engine: Engine,
    /// `readonly=on`: served write protected, the file opened read-only.
    pub read_only: bool,
}

/// A namespace's options as one of a subsystem's, shared by its controllers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SharedSpec {
    /// Its ANA group (`ana=G`; None: group 1), reported with --cntlid.
    pub ana_group: Option<u32>,
    /// Its reservation state file (`resv=PATH`; None: no reservations), the
    /// same for every controller of the subsystem.
    pub resv: Option<PathBuf>,
}

/// How long commands wait for an nbd:// or rbd: namespace's storage to come back by
/// default: a daemon restart, an OSD failover; below the 30 s a Linux guest gives a
/// command before it aborts it and resets the controller.
pub const DEFAULT_HOLD: Duration = Duration::from_secs(25);

/// Options a URI kind takes after its URI (`:NAME=VALUE`).
const URI_OPTIONS: [&str; 16] = [
    "lba",
    "ana",
    "resv",
    "fault",
    "timeout",
    "hold",
    "zoned",
    "zone-cap",
    "max-open",
    "max-active",
    "zone-state",
    "ms",
    "pi",
    "pil",
    "mset",
    "meta",
];

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Ram,
    /// Reads return zeroes (`Zeroes`) or complete without writing the buffer.
    Null(NullReads),
    /// A regular file or a block device.
    File(PathBuf),
    /// `nvme://` URI, handed to the userspace driver.
    Nvme(String),
    /// `nbd://` or `nbd+unix://` URI: an export of an NBD server.
    Nbd(String),
    /// `rbd:`: a Ceph RBD image.
    #[cfg(feature = "rbd")]
    Rbd(rbd_disk::RbdSpec),
}

impl Kind {
    /// The backend says the size (a size in the spec is optional or refused).
    fn sized_by_backend(&self) -> bool {
        match self {
            Kind::File(_) => true,
            #[cfg(feature = "rbd")]
            Kind::Rbd(_) => true,
            _ => false,
        }
    }

    /// The options only this kind takes, for error messages.
    /// The kind waits (`hold=`) for storage that goes away and comes back.
    fn waits_for_storage(&self) -> bool {
        match self {
            Kind::Nbd(_) => true,
            #[cfg(feature = "rbd")]
            Kind::Rbd(_) => true,
            _ => false,
        }
    }

    fn own_options(&self) -> &'static str {
        match self {
            Kind::File(_) => ", direct=, engine=, readonly=",
            Kind::Null(_) => ", reads=",
            #[cfg(feature = "rbd")]
            Kind::Rbd(_) => ", conf=, id=, keyring=",
            _ => "",
        }
    }
}

/// What a null namespace's reads do to the guest's buffer (`reads=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum NullReads {
    /// Fill it with zeroes: a disk that reads back zeroes (the default).
    #[default]
    Zeroes,
    /// Leave it as it was, as Linux's null_blk and SPDK's null bdev do: what a
    /// benchmark of the controller and its transport alone wants, never a disk.
    Untouched,
}

/// How a file namespace does its I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Engine {
    #[default]
    Auto,
    Uring,
    Sync,
}

impl Engine {
    /// The engine as its `engine=` word.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Auto => "auto",
            Engine::Uring => "uring",
            Engine::Sync => "sync",
        }
    }

    /// The engine `Auto` stands for at `path`: synchronous on memory file systems,
    /// whose files never wait for a device and have no non-blocking read path (so
    /// io_uring would queue every request to a kernel worker thread: a thread
    /// handoff per I/O for nothing), io_uring elsewhere.
    fn resolve(self, path: &std::path::Path) -> Engine {
        match self {
            Engine::Auto if memory_fs(path).is_some() => Engine::Sync,
            Engine::Auto => Engine::Uring,
            e => e,
        }
    }
}

/// A command timeout: `N[ms|s]` (a bare number is seconds), `0` or `off` for none.
fn parse_timeout(v: &str) -> Result<Option<Duration>, String> {
    if v == "off" {
        return Ok(None);
    }
    let (n, unit) = match v.strip_suffix("ms") {
        Some(n) => (n, Duration::from_millis(1)),
        None => (v.strip_suffix('s').unwrap_or(v), Duration::from_secs(1)),
    };
    let n: u32 = n.parse().map_err(|_| format!("timeout={v}: expected N[ms|s], 0 or off"))?;
    Ok((n > 0).then(|| unit * n))
}

impl FromStr for NsSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut spec = NsSpec {
            text: s.to_string(),
            kind: Kind::Ram,
            size: None,
            lba_format: None,
            file: FileOptions::default(),
            faults: Vec::new(),
            timeout: Some(DEFAULT_COMMAND_TIMEOUT),
            hold: None,
            zoned: None,
            meta: None,
            shared: SharedSpec::default(),
        };
        let uri_kind = s.starts_with("nvme://") || s.starts_with("nbd");
        let (head, opts) = if uri_kind { split_uri_options(s) } else { (s, "") };
        if head.starts_with("nvme://") {
            spec.kind = Kind::Nvme(head.to_string());
        } else if head.starts_with("nbd://") || head.starts_with("nbd+unix://") || head.starts_with("nbds") {
            head.parse::<nbd_disk::NbdUri>()?;
            spec.kind = Kind::Nbd(head.to_string());
        }
        if uri_kind {
            for opt in opts.split(':').filter(|o| !o.is_empty()) {
                spec.set_option(opt)?;
            }
            return spec.checked();
        }
        let mut parts = s.split(':').peekable();
        spec.kind = match parts.next().unwrap_or_default() {
            "ram" => Kind::Ram,
            "null" => Kind::Null(NullReads::Zeroes),
            #[cfg(feature = "rbd")]
            "rbd" => Kind::Rbd(rbd_disk::RbdSpec::parse_image(parts.next().unwrap_or_default())?),
            #[cfg(not(feature = "rbd"))]
            "rbd" => return Err("this vnvme was built without rbd: support (cargo feature \"rbd\")".into()),
            "file" => Kind::File(
                parts.next().filter(|p| !p.is_empty()).ok_or("file needs a path: file:PATH[:SIZE]")?.into(),
            ),
            k => {
                return Err(format!(
                    "unknown namespace kind {k:?} (expected ram, null, file, nvme:// or nbd://)"
                ))
            }
        };
        // The size: required for ram and null, optional for an existing file.
        match parts.peek() {
            Some(p) if !p.contains('=') => spec.size = Some(parse_size(parts.next().expect("peeked"))?),
            _ if spec.kind.sized_by_backend() => {}
            _ => return Err("missing size, e.g. ram:64M".into()),
        }
        for opt in parts {
            #[cfg(feature = "rbd")]
            if let (Kind::Rbd(r), Some((k, v))) = (&mut spec.kind, opt.split_once('=')) {
                if r.set_option(k, v)? {
                    continue;
                }
            }
            spec.set_option(opt)?;
        }
        spec.checked()
    }
}

impl NsSpec {
    /// Whether this namespace may be added (`ns.add`) to a server whose sandbox was
    /// installed with `installed`: the one place that decides it, from the same
    /// needs the allowlist was built from. Err: why not, and the way out.
    pub fn may_add(&self, installed: &Needs) -> Result<(), String> {
        match &self.kind {
        Kind::Nvme(_) => Err("an nvme:// namespace needs a new connection, which the sandbox forbids: give it at \
                              start-up (--ns), or run with --sandbox off"
            .into()),
        #[cfg(feature = "rbd")]
        Kind::Rbd(_) if !installed.rbd => Err("an rbd: namespace runs librados' threads, which this server's \
                                               sandbox does not allow: start it with at least one rbd: \
                                               namespace (then more can be added), or with --sandbox off"
            .into()),
        Kind::Nbd(uri) if nbd_needs_resolver(uri) => Err("this nbd:// URI names its server by host name, and \
                                                          the sandbox allows no name lookups: give its address \
                                                          (nbd://192.0.2.7/EXPORT, nbd://[2001:db8::7]/EXPORT), \
                                                          or run with --sandbox off"
            .into()),
        // Opening, creating and sizing files, memfds and NBD connections: what
        // `control` allows.
        _ if installed.control => Ok(()),
        _ => Err("this server has no control socket allowance in its sandbox".into()),
    }
    }
}

/// Whether opening this `nbd://` URI needs a name lookup (its host is not an address).
fn nbd_needs_resolver(uri: &str) -> bool {
    match uri.parse::<nbd_disk::NbdUri>().map(|u| u.address) {
        Ok(nbd_disk::uri::Address::Tcp { host, .. }) => {
            host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>().is_err()
        }
        _ => false,
    }
}

impl NsSpec {
    /// Takes one `NAME=VALUE` option.
    fn set_option(&mut self, opt: &str) -> Result<(), String> {
        let spec = self;
        if let Some((k, v)) = opt.split_once('=') {
            if ZoneSpec::set_option(&mut spec.zoned, k, v)?
                || crate::metaspec::MetaSpec::set_option(&mut spec.meta, k, v)?
            {
                return Ok(());
            }
        }
        let is_file = matches!(spec.kind, Kind::File(_));
        match opt.split_once('=') {
            Some(("lba", "512")) => spec.lba_format = Some(0),
            Some(("lba", "4096")) => spec.lba_format = Some(1),
            Some(("lba", v)) => return Err(format!("lba={v}: the LBA size is 512 or 4096")),
            Some(("direct", v)) if is_file => {
                spec.file.direct = match v {
                    "auto" => DirectMode::Auto,
                    "on" => DirectMode::On,
                    "off" => DirectMode::Off,
                    _ => return Err(format!("direct={v}: expected auto, on or off")),
                }
            }
            Some(("readonly", v)) if is_file => {
                spec.file.read_only = match v {
                    "on" => true,
                    "off" => false,
                    _ => return Err(format!("readonly={v}: expected on or off")),
                }
            }
            Some(("engine", v)) if is_file => {
                spec.file.engine = match v {
                    "auto" => Engine::Auto,
                    "uring" => Engine::Uring,
                    "sync" => Engine::Sync,
                    _ => return Err(format!("engine={v}: expected auto, uring or sync")),
                }
            }
            Some(("reads", v)) if matches!(spec.kind, Kind::Null(_)) => {
                spec.kind = Kind::Null(match v {
                    "zeroes" => NullReads::Zeroes,
                    "untouched" => NullReads::Untouched,
                    _ => return Err(format!("reads={v}: expected zeroes or untouched")),
                })
            }
            Some(("fault", v)) => spec.faults.push(v.parse()?),
            Some(("resv", "")) => return Err("resv=PATH: the reservation state file's path".into()),
            Some(("resv", v)) => spec.shared.resv = Some(PathBuf::from(v)),
            Some(("ana", v)) => match v.parse::<u32>() {
                Ok(g) if (1..=nvme_ctrl::ana::MAX_GROUPS).contains(&g) => spec.shared.ana_group = Some(g),
                _ => return Err(format!("ana={v}: the ANA group is 1 to {}", nvme_ctrl::ana::MAX_GROUPS)),
            },
            Some(("timeout", v)) => spec.timeout = parse_timeout(v)?,
            // 0 or off: commands fail at once when the storage goes away.
            Some(("hold", v)) => spec.hold = Some(parse_timeout(v)?.unwrap_or(Duration::ZERO)),
            _ => {
                return Err(format!(
                "unknown namespace option {opt:?} (expected lba=, fault=, timeout=, ana=, resv=, zoned=, ms=, pi={}{})",
                if spec.kind.waits_for_storage() { ", hold=" } else { "" },
                spec.kind.own_options()
            ))
            }
        }
        Ok(())
    }

    /// What no single option shows: sizes against the LBA, the hold against the
    /// timeout, options the kind does not take.
    fn checked(self) -> Result<Self, String> {
        let spec = self;
        if spec.file.read_only {
            if spec.size.is_some() {
                return Err(
                    "readonly=on serves a file as it is: leave the size out (a size creates a file)".into()
                );
            }
            if spec.zoned.is_some() || spec.meta.is_some() {
                return Err(
                    "readonly=on does not go with zoned= or metadata (ms=, pi=, meta=): their state is \
                            written"
                        .into(),
                );
            }
            if spec.file.engine == Engine::Sync {
                return Err("readonly=on needs the io_uring engine: leave out engine=sync".into());
            }
        }
        if let Some(z) = &spec.zoned {
            z.checked(spec.size)?;
        }
        if let Some(m) = &spec.meta {
            m.checked(spec.lba_format)?;
            if spec.zoned.is_some() {
                return Err("a zoned namespace cannot have metadata (ms=, pi=, meta=) yet".into());
            }
        }
        #[cfg(feature = "rbd")]
        if matches!(spec.kind, Kind::Rbd(_)) && spec.size.is_some() {
            return Err("rbd: the namespace has the image's size; give none (resize the image with \
                        `rbd resize` or `vnvme ctl ns.resize`)"
                .into());
        }
        if let Some(size) = spec.size {
            let lba = if spec.lba_format == Some(1) { 4096 } else { 512 };
            if size == 0 || size % lba != 0 {
                return Err(format!(
                    "namespace size {size} is not a non-zero multiple of the {lba}-byte LBA"
                ));
            }
        }
        if spec.file.direct == DirectMode::On && spec.file.engine == Engine::Sync {
            return Err("direct=on: engine=sync reads and writes through the page cache; for O_DIRECT give \
                        engine=uring (or engine=auto on a disk's file system), or leave out direct=on"
                .into());
        }
        if let Some(h) = spec.hold {
            if !spec.kind.waits_for_storage() {
                return Err("hold=: only nbd:// and rbd: namespaces wait for storage that went away".into());
            }
            if spec.timeout.is_some_and(|t| h >= t) {
                return Err(format!(
                    "hold={h:?} is not shorter than timeout={:?}: a command would time out while it waits",
                    spec.timeout.unwrap_or_default()
                ));
            }
        }
        Ok(spec)
    }

    /// How long commands wait for storage that went away: `hold=`, or the default
    /// (five sixths of the timeout, at most 25 s).
    pub fn hold(&self) -> Duration {
        self.hold.unwrap_or_else(|| self.timeout.map_or(DEFAULT_HOLD, |t| (t * 5 / 6).min(DEFAULT_HOLD)))
    }
}

/// `s` split into the URI and the options after it: trailing `:NAME=VALUE` pieces
/// whose NAME is one of [`URI_OPTIONS`] (so the URI's own colons, a port or a path,
/// stay in the URI).
fn split_uri_options(s: &str) -> (&str, &str) {
    let mut end = s.len();
    while let Some(i) = s[..end].rfind(':') {
        let piece = &s[i + 1..end];
        let named = piece.split_once('=').is_some_and(|(k, _)| URI_OPTIONS.contains(&k));
        if !named {
            break;
        }
        end = i;
    }
    (&s[..end], s.get(end + 1..).unwrap_or(""))
}

#[cfg(test)]
mod tests;
