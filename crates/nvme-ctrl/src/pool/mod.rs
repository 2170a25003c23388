//! The namespace pool (issue 31 item 4): capacity an operator sets aside in a
//! directory, out of which hosts create and delete namespaces and attach them to
//! the subsystem's controllers (Namespace Management and Attachment), and so
//! may an operator (`vnvme ctl ns.create` and the rest).
//!
//! Every controller of the subsystem is its own process, so the pool is shared
//! the way reservations are: a state file in the directory (`pool.state`,
//! [`crate::shared_file`]) holds the capacity, the controllers, and each
//! namespace with the controllers it is attached to; each namespace's data is
//! a file beside it (`ns-<NSID>-<NGUID>.img`, sparse, made at its creation and
//! removed at its deletion). A command changes the state under the file's lock and
//! completes once it is written; each controller looks at the state's counter
//! whenever its admin side runs (one load) and, when it moved, attaches and
//! detaches its namespaces to match, raising Namespace Attribute Changed
//! ([`crate::Controller`]'s `sync_pool`).
//!
//! The files are opened relative to the directory's descriptor, held from the
//! start, so the sandbox can allow opening and removing files in that directory
//! alone (by the descriptor; see vnvme's sandbox).

mod state;

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use block_backend::{Backend, FileBackend};
use nvme_spec::Status;
use rustix::fs::{Mode, OFlags};

use crate::shared_file::{SharedFile, UpdateError};
/// How the pool's files are locked (its state file and data files).
pub use file_lock::Policy as LockPolicy;
pub use state::{NewNamespace, PoolNamespace, PoolState, MAX_POOL_CONTROLLERS, MAX_POOL_NAMESPACES};

/// The state file's name in the pool's directory.
pub const STATE_FILE: &str = "pool.state";

/// The data file of the pool's namespace `nsid` with NGUID `nguid`: a namespace
/// deleted and made again at its NSID has a file of its own, so a controller
/// still following the old one never opens the new one's data.
pub fn data_file(nsid: u32, nguid: &[u8; 16]) -> String {
    let tag: String = nguid[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("ns-{nsid}-{tag}.img")
}

/// One controller's open of a namespace pool.
pub struct NamespacePool {
    path: PathBuf,
    /// The directory, held open: every file is opened relative to it.
    dir: OwnedFd,
    file: SharedFile<PoolState>,
    cntlid: u16,
    /// How its files are locked: shared by the subsystem's controllers.
    locks: file_lock::Policy,
}

impl std::fmt::Debug for NamespacePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamespacePool").field("path", &self.path).field("cntlid", &self.cntlid).finish()
    }
}

impl NamespacePool {
    /// Opens the pool in directory `path` (made if it does not exist) as
    /// controller `cntlid`, whose operator gave it the NSIDs `fixed`. A new pool
    /// needs its `capacity` in bytes; an existing one keeps its own, and a
    /// different one given is refused (it cannot shrink under its namespaces;
    /// say so rather than pick one). Its state file and data files are locked as
    /// `locks` says (shared by the controllers of one subsystem).
    pub fn open(
        path: &Path,
        capacity: Option<u64>,
        cntlid: u16,
        fixed: &[u32],
        locks: &file_lock::Policy,
    ) -> Result<Self, String> {
        let ctx = |what: &str, e: std::io::Error| format!("namespace pool {}: {what}: {e}", path.display());
        std::fs::create_dir_all(path).map_err(|e| ctx("cannot make the directory", e))?;
        let dir = rustix::fs::open(path, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| ctx("cannot open the directory", e.into()))?;
        let lock = locks.shared(file_lock::Role::PoolState, None);
        let (state, made) = open_state_file(&dir, path, &lock)?;
        let file = SharedFile::<PoolState>::open(state)
            .map_err(|e| format!("namespace pool {}: {STATE_FILE}: {e}", path.display()))?;
        if made {
            tracing::info!(path = %path.display(), "namespace pool made (a new {STATE_FILE})");
        }
        update_or_say(&file, |s| {
            s.settle_capacity(capacity)?;
            s.join(cntlid, fixed)
        })
        .map_err(|e| format!("namespace pool {}: {e}", path.display()))?;
        Ok(NamespacePool { path: path.to_path_buf(), dir, file, cntlid, locks: locks.clone() })
    }

    /// Records `fixed` as the NSIDs this controller's operator gave it (every one
    /// of them, replacing what it said before); refused if one is the pool's.
    pub fn claim(&self, fixed: &[u32]) -> Result<(), String> {
        update_or_say(&self.file, |s| s.join(self.cntlid, fixed))
    }

    /// The pool's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory's descriptor (the sandbox allows opening files under it).
    pub fn dir_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.dir)
    }

    /// This controller's ID.
    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }

    /// The state as it is now.
    pub fn state(&self) -> Arc<PoolState> {
        self.file.current()
    }

    /// True once per change of the state (since the last call).
    pub(crate) fn changed_since_last_look(&self) -> bool {
        self.file.changed_since_last_look()
    }

    /// Creates a namespace with its data file; returns its NSID (at most `nn`).
    pub fn create(&self, n: NewNamespace, nn: u32) -> Result<u32, Status> {
        let nguid = new_nguid();
        self.update(|s| {
            let nsid = s.create(n, nn, nguid)?;
            let bytes = s.namespaces[&nsid].bytes();
            let name = data_file(nsid, &nguid);
            self.make_data_file(&name, bytes).map_err(|e| {
                log_limit::limited_warn!(target: "vnvme::backend", nsid, "namespace pool: cannot make {name}: {e}");
                Status::INTERNAL_ERROR
            })?;
            Ok(nsid)
        })
    }

    /// Deletes namespace `nsid` (every one of the pool's for FFFFFFFFh) and its
    /// data; returns the NSIDs deleted.
    pub fn delete(&self, nsid: u32) -> Result<Vec<u32>, Status> {
        self.update(|s| {
            let nsids: Vec<u32> =
                if nsid == nvme_spec::NSID_ALL { s.namespaces.keys().copied().collect() } else { vec![nsid] };
            let mut names = Vec::with_capacity(nsids.len());
            for &n in &nsids {
                names.push(data_file(n, &s.delete(n)?.nguid));
            }
            // The files go under the lock, once the state no longer names them.
            for name in names {
                if let Err(e) = rustix::fs::unlinkat(&self.dir, name.as_str(), rustix::fs::AtFlags::empty()) {
                    log_limit::limited_warn!(target: "vnvme::backend", "namespace pool: cannot remove {name}: {e}");
                }
            }
            Ok(nsids)
        })
    }

    /// Attaches namespace `nsid` to the controllers `ids`.
    pub fn attach(&self, nsid: u32, ids: &[u16]) -> Result<(), Status> {
        self.update(|s| s.attach(nsid, ids))
    }

    /// Forgets controller `cntlid` ([`PoolState::forget`]); not this one, which is
    /// running. Returns the namespaces detached from it.
    pub fn forget(&self, cntlid: u16) -> Result<Vec<u32>, Status> {
        if cntlid == self.cntlid {
            return Err(Status::INVALID_FIELD);
        }
        self.update(|s| s.forget(cntlid))
    }

    /// Detaches namespace `nsid` from the controllers `ids`.
    pub fn detach(&self, nsid: u32, ids: &[u16]) -> Result<(), Status> {
        self.update(|s| s.detach(nsid, ids))
    }

    /// Records namespace `nsid`'s new LBA format (a Format NVM through this
    /// controller); every other controller it is attached to takes it up.
    pub fn format(&self, nsid: u32, lba_format: u8) -> Result<(), Status> {
        self.update(|s| s.format(nsid, lba_format))
    }

    /// Records the format a host chose for the operator's namespace `nsid`; every
    /// other controller that has that NSID takes it up.
    pub fn format_fixed(&self, nsid: u32, f: crate::lba_format::FormatState) -> Result<(), Status> {
        self.update(|s| s.format_fixed(nsid, f))
    }

    /// The backend of the pool's namespace `nsid` with NGUID `nguid` (its data
    /// file).
    pub fn open_backend(&self, nsid: u32, nguid: &[u8; 16]) -> std::io::Result<Arc<dyn Backend>> {
        let name = data_file(nsid, nguid);
        let fd = rustix::fs::openat(&self.dir, name.as_str(), OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())?;
        let (file, path) = (File::from(fd), self.path.join(name));
        block_backend::lock_file(
            &file,
            &path,
            Some(&self.locks.shared(file_lock::Role::PoolData, Some(nsid))),
        )?;
        Ok(Arc::new(FileBackend::from_file(file, &path)?))
    }

    /// Makes a new namespace's data file: a new file, never one that exists (its
    /// name is new; a file by that name is someone else's).
    fn make_data_file(&self, name: &str, bytes: u64) -> std::io::Result<()> {
        let fd = rustix::fs::openat(
            &self.dir,
            name,
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        File::from(fd).set_len(bytes)
    }

    fn update<T>(&self, f: impl FnOnce(&mut PoolState) -> Result<T, Status>) -> Result<T, Status> {
        self.file.update(f).map_err(|e| match e {
            UpdateError::Rules(s) => s,
            UpdateError::Store(e) => {
                log_limit::limited_warn!(target: "vnvme::backend", "namespace pool: {e}");
                Status::INTERNAL_ERROR
            }
        })
    }
}

/// The pool's state file in `dir` (at `path`), locked as `lock` says: the one
/// there, or a new one (true) made where there is none. A directory that holds
/// namespaces' data files and no state file lost its state: refused, rather than
/// a new, empty pool made over them (their NSIDs given out again).
fn open_state_file(dir: &OwnedFd, path: &Path, lock: &file_lock::Request) -> Result<(File, bool), String> {
    let fail = |e: std::io::Error| format!("namespace pool {}: {STATE_FILE}: {e}", path.display());
    let rw = OFlags::RDWR | OFlags::CLOEXEC;
    let (fd, made) = match rustix::fs::openat(dir, STATE_FILE, rw, Mode::empty()) {
        Ok(fd) => (fd, false),
        Err(rustix::io::Errno::NOENT) => {
            let orphans: Vec<String> = std::fs::read_dir(path)
                .map_err(fail)?
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with("ns-") && n.ends_with(".img"))
                .collect();
            if let Some(one) = orphans.first() {
                return Err(format!(
                    "namespace pool {}: {} namespace data file(s) ({one}, ...) and no {STATE_FILE}: the pool's \
                     state is lost. Restore {STATE_FILE} from a copy; or move the data files away to start an \
                     empty pool",
                    path.display(),
                    orphans.len()
                ));
            }
            let new = rw | OFlags::CREATE | OFlags::EXCL;
            match rustix::fs::openat(dir, STATE_FILE, new, Mode::from_raw_mode(0o600)) {
                Ok(fd) => (fd, true),
                // Made by another controller just now: its.
                Err(rustix::io::Errno::EXIST) => (
                    rustix::fs::openat(dir, STATE_FILE, rw, Mode::empty()).map_err(|e| fail(e.into()))?,
                    false,
                ),
                Err(e) => return Err(fail(e.into())),
            }
        }
        Err(e) => return Err(fail(e.into())),
    };
    let file = File::from(fd);
    block_backend::lock_file(&file, &path.join(STATE_FILE), Some(lock))
        .map_err(|e| format!("namespace pool {}: {e}", path.display()))?;
    if made {
        crate::shared_file::initialize::<PoolState>(&file)
            .map_err(|e| fail(std::io::Error::other(e.to_string())))?;
    }
    Ok((file, made))
}

/// An operator's change to the pool (not a host's command): refused with why.
fn update_or_say(
    file: &SharedFile<PoolState>,
    f: impl FnOnce(&mut PoolState) -> Result<(), String>,
) -> Result<(), String> {
    let mut why = String::new();
    file.update(|s| {
        f(s).map_err(|e| {
            why = e;
            Status::INVALID_FIELD
        })
    })
    .map_err(|e| match e {
        UpdateError::Rules(_) => why,
        UpdateError::Store(e) => e.to_string(),
    })
}

/// A fresh NGUID (random; the clock if the kernel gives no randomness).
fn new_nguid() -> [u8; 16] {
    let mut b = [0u8; 16];
    if rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).map_or(true, |n| n < 16) {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        b = (t.as_nanos() ^ (std::process::id() as u128) << 96).to_le_bytes();
    }
    b
}
