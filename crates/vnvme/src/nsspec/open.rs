//! Opening what a `--ns` names: its backend and the files beside it (zone state,
//! metadata, reservations), each locked as the server's policy says, and the LBA
//! format settled.

use std::sync::Arc;
use std::time::Duration;

use block_backend::{
    Backend, DirectMode, FaultBackend, FileBackend, NullBackend, RamBackend, UringBackend, UringOptions,
};
use nvme_ctrl::NamespaceConfig;

use super::{human_size, memory_fs, Engine, Kind, NsSpec, NullReads};
use crate::sandbox::Needs;
use crate::zonespec::StateHome;

/// What an earlier process kept of a `ram:` namespace (an upgrade): the memory its
/// data is in, and its metadata's.
#[derive(Debug, Default)]
pub struct Kept {
    pub data: Option<std::os::fd::OwnedFd>,
    pub meta: Option<std::os::fd::OwnedFd>,
}

/// An opened namespace: its backend and LBA format.
#[derive(Debug)]
pub struct Opened {
    pub backend: Arc<dyn Backend>,
    pub lba_format: u8,
    /// What the backend does after start-up, for the sandbox's allowlist.
    pub needs: Needs,
    pub timeout: Option<Duration>,
    /// A zoned namespace's layout, its state file open.
    pub zoned: Option<nvme_ctrl::zoned::ZonedConfig>,
    /// Its metadata store, open, and starting protection settings.
    pub metadata: Option<nvme_ctrl::MetadataConfig>,
    pub ana_group: Option<u32>,
    /// Its reservation state file, open.
    pub reservations: Option<Arc<std::fs::File>>,
}

impl Opened {
    /// What the controller attaches.
    pub fn config(&self) -> NamespaceConfig {
        NamespaceConfig {
            timeout: self.timeout,
            zoned: self.zoned.clone(),
            metadata: self.metadata.clone(),
            ana_group: self.ana_group,
            reservations: self.reservations.clone(),
            ..NamespaceConfig::new(self.backend.clone(), self.lba_format)
        }
    }
}

impl NsSpec {
    /// Opens the backend and settles the LBA format; every file it writes is
    /// locked as `locks` says, as namespace `nsid`'s (if known yet).
    pub fn open(&self, nsid: Option<u32>, locks: &file_lock::Policy) -> std::io::Result<Opened> {
        self.open_with(Kept::default(), nsid, locks)
    }

    /// What an operator's `--ns` (or `ns.add`) must not do silently: give a size to a
    /// `file:` that exists with another size. A size creates a file that does not
    /// exist yet; an existing one is used as it is, and neither grown nor shrunk
    /// behind the operator's back. (A process taking over from another opens the
    /// files as they are now: `ns.resize` may have changed them since.)
    pub fn check_operator_size(&self) -> std::io::Result<()> {
        let (Kind::File(p), Some(want)) = (&self.kind, self.size) else { return Ok(()) };
        let Ok(meta) = std::fs::metadata(p) else { return Ok(()) };
        use std::os::unix::fs::FileTypeExt;
        let have = if meta.file_type().is_block_device() {
            let f = std::fs::File::open(p)?;
            std::io::Seek::seek(&mut &f, std::io::SeekFrom::End(0))?
        } else {
            meta.len()
        };
        if have == want {
            return Ok(());
        }
        Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{} is {have} bytes, not {want}: a size is for creating a file that does not exist \
                 yet. To use it as it is, leave the size out (file:{}); to change its size, resize \
                 it first (truncate -s, or vnvme ctl ns.resize on a running server)",
                p.display(),
                p.display()
            ),
        ))
    }

    /// [`NsSpec::open`]; a `ram:` namespace takes the memory an earlier process kept
    /// its data (and metadata) in (an upgrade), if given.
    pub fn open_with(
        &self,
        kept: Kept,
        nsid: Option<u32>,
        locks: &file_lock::Policy,
    ) -> std::io::Result<Opened> {
        use file_lock::Role;
        let memory = kept.data;
        // A lock's refusal names the file already.
        let ctx = |what: &str, e: std::io::Error| match e.kind() {
            std::io::ErrorKind::ResourceBusy => e,
            _ => std::io::Error::new(e.kind(), format!("{what}: {e}")),
        };
        let mut needs = Needs::default();
        let backend: Arc<dyn Backend> = match &self.kind {
            Kind::Ram => {
                needs.ram = true;
                let size = self.size.expect("parsed with a size");
                let ram = match memory {
                    Some(fd) => RamBackend::from_fd(fd, size),
                    None => RamBackend::create(size),
                };
                Arc::new(ram.map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!(
                            "cannot set aside {} of memory ({e}): a ram: namespace keeps its data in this \
                             process's memory; give a smaller size, or use a file: namespace",
                            human_size(size)
                        ),
                    )
                })?)
            }
            Kind::Null(reads) => {
                let size = self.size.expect("parsed with a size");
                Arc::new(match reads {
                    NullReads::Zeroes => NullBackend::new(size),
                    NullReads::Untouched => NullBackend::untouched(size),
                })
            }
            Kind::File(p)
                if self.file.direct == DirectMode::On && self.file.engine.resolve(p) == Engine::Sync =>
            {
                // What engine=auto picks on a memory file system does no O_DIRECT:
                // refused, rather than served through the page cache unasked.
                let fs = memory_fs(p).unwrap_or("a memory file system");
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "{}: direct=on, but the file is on {fs}, which keeps files in memory: there is \
                         no device beneath it for O_DIRECT to reach, and vnvme serves files there with \
                         pread/pwrite. Leave out direct=on, or put the image on a disk's file system",
                        p.display()
                    ),
                ));
            }
            // Read-only on io_uring, which can open read-only (engine=auto picks it
            // on a memory file system too).
            Kind::File(p) => {
                match if self.file.read_only { Engine::Uring } else { self.file.engine.resolve(p) } {
                    Engine::Uring | Engine::Auto => {
                        (needs.file, needs.uring) = (true, true);
                        let lock = if self.file.read_only {
                            locks.reader(Role::Data, nsid)
                        } else {
                            locks.shared(Role::Data, nsid)
                        };
                        let opts = UringOptions {
                            direct: self.file.direct,
                            create_size: self.size,
                            read_only: self.file.read_only,
                            lock: Some(lock),
                            ..Default::default()
                        };
                        Arc::new(UringBackend::open(p, opts).map_err(|e| ctx(&p.display().to_string(), e))?)
                    }
                    Engine::Sync => {
                        needs.file = true;
                        let lock = locks.shared(Role::Data, nsid);
                        let be = FileBackend::open_locked(p, self.size, Some(&lock));
                        Arc::new(be.map_err(|e| ctx(&p.display().to_string(), e))?)
                    }
                }
            }
            Kind::Nbd(uri) => {
                needs.nbd = true;
                Arc::new(nbd_disk::NbdBackend::open_with(uri, nbd_disk::NbdOptions { hold: self.hold() })?)
            }
            #[cfg(feature = "rbd")]
            Kind::Rbd(spec) => {
                needs.rbd = true;
                // librados waits for the cluster as long as the hold, and gives up
                // (ETIMEDOUT: Namespace Not Ready) when it runs out, before the
                // command's timeout: an OSD failover is waited through.
                let spec = rbd_disk::RbdSpec { op_timeout: Some(self.hold()), ..spec.clone() };
                Arc::new(rbd_disk::RbdBackend::open(&spec)?)
            }
            Kind::Nvme(uri) => {
                needs.kernel_vfio = nvme_disk::NvmeBackendOptions::parse(uri)
                    .is_ok_and(|o| matches!(o.target, nvme_disk::NvmeTarget::Pci(_)));
                Arc::new(
                    nvme_disk::NvmeBackend::open(uri)
                        .map_err(|e| std::io::Error::other(format!("{uri}: {e}")))?,
                )
            }
        };
        let info = backend.info();
        let lba_format = match self.lba_format {
            Some(f) => f,
            // The smallest LBA that is a multiple of the backend's block size.
            None if info.block_size > 512 => 1,
            None => 0,
        };
        let lba = if lba_format == 0 { 512 } else { 4096 };
        // Metadata starts the namespace in a format with it (lba= picked its block size).
        let lba_format = match &self.meta {
            Some(m) if m.ms > 0 => m.format_index(Some(lba_format)).ok_or_else(|| {
                std::io::Error::other(format!("ms={} does not go with {lba}-byte blocks", m.ms))
            })?,
            _ => lba_format,
        };
        if info.size < lba || !info.size.is_multiple_of(lba) {
            return Err(std::io::Error::other(format!(
                "{}: size {} is not a non-zero multiple of the {lba}-byte LBA",
                info.kind, info.size
            )));
        }
        let backend = if self.faults.is_empty() {
            backend
        } else {
            let rules = self.faults.iter().cloned().map(|r| r.lba_size(lba)).collect();
            Arc::new(FaultBackend::new(backend, rules))
        };
        let home = || match &self.kind {
            Kind::File(p) if std::fs::metadata(p).is_ok_and(|m| m.is_file()) => StateHome::Beside(p),
            Kind::File(_) => StateHome::Required("on a block device"),
            Kind::Ram | Kind::Null(_) => StateHome::Memory,
            _ => StateHome::Required("on storage outside this host"),
        };
        // A zoned namespace's write pointers live in this process's memory too:
        // its state file has one writer, whatever the subsystem.
        let zoned = match &self.zoned {
            Some(z) => Some(z.open(home(), &locks.only(Role::ZoneState, nsid))?),
            None => None,
        };
        needs.meta = self.meta.is_some();
        needs.resv = self.shared.resv.is_some();
        let reservations = match &self.shared.resv {
            Some(p) => Some(Arc::new(open_resv_file(p, &locks.shared(Role::Reservations, nsid))?)),
            None => None,
        };
        let metadata = match &self.meta {
            // A null: namespace keeps no metadata, as it keeps no data.
            Some(m) if matches!(self.kind, Kind::Null(_)) => {
                Some(m.open(StateHome::Nowhere, None, &locks.shared(Role::Metadata, nsid))?)
            }
            Some(m) => Some(m.open(home(), kept.meta, &locks.shared(Role::Metadata, nsid))?),
            None => None,
        };
        Ok(Opened {
            backend,
            lba_format,
            needs,
            timeout: self.timeout,
            zoned,
            metadata,
            ana_group: self.shared.ana_group,
            reservations,
        })
    }

    /// A short description for logs.
    pub fn describe(&self) -> String {
        match &self.kind {
            Kind::Ram => format!("ram {}", self.size.unwrap_or(0)),
            Kind::Null(NullReads::Zeroes) => format!("null {}", self.size.unwrap_or(0)),
            Kind::Null(NullReads::Untouched) => format!("null {} (reads untouched)", self.size.unwrap_or(0)),
            Kind::File(p) => format!("file {} (engine {})", p.display(), self.file.engine.name()),
            Kind::Nvme(u) | Kind::Nbd(u) => u.clone(),
            #[cfg(feature = "rbd")]
            Kind::Rbd(r) => r.to_string(),
        }
    }
}

/// The reservation state file at `p`, locked as `lock` says: the one there,
/// whole (checked now, named in what is said), or a new one made where there is
/// none (said). One that is empty, cut short or foreign is refused: taken for a
/// new one, it would drop the fences it held.
fn open_resv_file(p: &std::path::Path, lock: &file_lock::Request) -> std::io::Result<std::fs::File> {
    use std::io::ErrorKind;
    let what = |e: &dyn std::fmt::Display| format!("reservation state file {}: {e}", p.display());
    let open = || std::fs::OpenOptions::new().read(true).write(true).open(p);
    let (f, made) = match open() {
        Ok(f) => (f, false),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            match std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(p) {
                Ok(f) => (f, true),
                // Made by another controller just now.
                Err(e) if e.kind() == ErrorKind::AlreadyExists => (open()?, false),
                Err(e) => return Err(std::io::Error::new(e.kind(), what(&e))),
            }
        }
        Err(e) => return Err(std::io::Error::new(e.kind(), what(&e))),
    };
    block_backend::lock_file(&f, p, Some(lock))
        .map_err(|e| std::io::Error::new(e.kind(), format!("reservation state file {e}")))?;
    if made {
        nvme_ctrl::reservation::initialize(&f).map_err(|e| std::io::Error::other(what(&e)))?;
        crate::logging::say!(
            "vnvme: reservation state file {} made (new: no registrants, no reservation)",
            p.display()
        );
    } else {
        let check = f.try_clone().map_err(|e| std::io::Error::other(what(&e)))?;
        nvme_ctrl::reservation::ResvFile::open(check)
            .map_err(|e| std::io::Error::new(ErrorKind::InvalidData, what(&e)))?;
    }
    Ok(f)
}

/// An error opening a namespace as an operator reads it: a file another writer
/// holds says how to go on.
pub fn with_fix(e: std::io::Error) -> String {
    if e.kind() != std::io::ErrorKind::ResourceBusy {
        return e.to_string();
    }
    format!(
        "{e}. One writer per file: stop the one that holds it, or serve the file from one server \
         (the same file twice in one server is refused too); the controllers of one subsystem \
         share their files on purpose: give each --cntlid and the same --serial"
    )
}
