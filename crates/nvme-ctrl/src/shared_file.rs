//! A state file every controller of a subsystem shares (the reservations of a
//! namespace, the namespace pool): a header page (magic, version, and the change
//! counter each process maps and reads atomically), then the state as
//! length-prefixed JSON from byte 4096. Updates hold the file's exclusive lock
//! (flock, between processes; a process-wide mutex per file, within one); a
//! reload holds it shared. A change is in the file before the update returns;
//! every other process sees it at its next look (one load of the counter).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};

use guest_mem::{GuestMemory, Mapping};
use rustix::fs::{flock, FlockOperation};

/// What a shared state file holds.
pub trait SharedState:
    serde::Serialize + serde::de::DeserializeOwned + Default + Clone + PartialEq + Send + Sync + 'static
{
    /// The first 8 bytes of its file.
    const MAGIC: &'static [u8; 8];
    /// What the file is, for messages ("reservation state file").
    const WHAT: &'static str;
    /// Why this state (as read, or about to be written) is not one the rules
    /// could have made.
    fn check(&self) -> Result<(), String>;
    /// Whether a change must be made durable (fdatasync) before the update returns.
    fn durable(&self) -> bool;
}

const VERSION: u32 = 1;
/// Where the change counter is (in the mapped header page).
const COUNTER_AT: u64 = 64;
/// Where the state's length, then its JSON, is.
const DATA_AT: u64 = 4096;
/// The most the state's JSON may take (far more than its bounds let it reach).
const MAX_DATA: u32 = 1 << 20;

/// Why a state file could not be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not a {0} (its header is not ours)")]
    NotOurs(&'static str),
    #[error("{0} version {1} (this build reads {VERSION})")]
    Version(&'static str, u32),
    #[error("the state in it is damaged: {0}")]
    Damaged(String),
    #[error("cannot map its header: {0}")]
    Map(String),
}

/// Why an update did not happen.
#[derive(Debug)]
pub(crate) enum UpdateError {
    /// The rules refused it, with this status.
    Rules(nvme_spec::Status),
    Store(StoreError),
}

/// The file's lock, held until dropped. flock excludes other open file
/// descriptions (other processes); within this process every open of the file
/// (a controller's workers, two namespaces given one file, a namespace removed
/// and added again) is kept apart by the file's process-wide mutex
/// ([`inode_lock`]), taken first, so two flocks of one process never overlap.
struct Locked<'a>(&'a File);

impl<'a> Locked<'a> {
    fn new(f: &'a File, exclusive: bool) -> std::io::Result<Self> {
        let op = if exclusive { FlockOperation::LockExclusive } else { FlockOperation::LockShared };
        flock(f, op)?;
        Ok(Locked(f))
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        let _ = flock(self.0, FlockOperation::Unlock);
    }
}

/// The process-wide mutex of the file `f` is (by device and inode).
fn inode_lock(f: &File) -> std::io::Result<Arc<Mutex<()>>> {
    use std::os::unix::fs::MetadataExt;
    /// Each file's mutex, by (device, inode), while some open of it lives.
    type Locks = Mutex<HashMap<(u64, u64), Weak<Mutex<()>>>>;
    static LOCKS: OnceLock<Locks> = OnceLock::new();
    let m = f.metadata()?;
    let mut all = LOCKS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    all.retain(|_, w| w.strong_count() > 0);
    let key = (m.dev(), m.ino());
    if let Some(l) = all.get(&key).and_then(Weak::upgrade) {
        return Ok(l);
    }
    let l = Arc::new(Mutex::new(()));
    all.insert(key, Arc::downgrade(&l));
    Ok(l)
}

/// One open of a shared state file.
pub struct SharedFile<S> {
    file: File,
    /// The header page, mapped shared: the change counter at [`COUNTER_AT`].
    header: GuestMemory,
    /// The state as of a counter value (the last one tried, read well or not).
    cache: RwLock<(u32, Arc<S>)>,
    /// The counter when [`SharedFile::changed_since_last_look`] was last asked.
    seen: AtomicU32,
    /// Held over each update and reload (see [`Locked`]).
    threads: Arc<Mutex<()>>,
}

impl<S: SharedState> std::fmt::Debug for SharedFile<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(S::WHAT).field("counter", &self.counter()).finish_non_exhaustive()
    }
}

impl<S: SharedState> SharedFile<S> {
    /// Opens `file` (read-write) as a state file: an empty one becomes a new
    /// state file holding the default state.
    pub fn open(file: File) -> Result<Self, StoreError> {
        let threads = inode_lock(&file)?;
        let t = threads.lock().unwrap_or_else(|p| p.into_inner());
        let l = Locked::new(&file, true)?;
        if file.metadata()?.len() == 0 {
            let mut head = vec![0u8; DATA_AT as usize];
            head[..8].copy_from_slice(S::MAGIC);
            head[8..12].copy_from_slice(&VERSION.to_le_bytes());
            file.write_all_at(&head, 0)?;
            write_state(&file, &S::default())?;
        }
        let mut head = [0u8; 12];
        file.read_exact_at(&mut head, 0).map_err(|_| StoreError::NotOurs(S::WHAT))?;
        if &head[..8] != S::MAGIC {
            return Err(StoreError::NotOurs(S::WHAT));
        }
        let v = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
        if v != VERSION {
            return Err(StoreError::Version(S::WHAT, v));
        }
        // The header mapped, then the state and the counter read under one lock:
        // they go together.
        let map = Mapping::from_fd(std::os::fd::AsFd::as_fd(&file), 0, DATA_AT, true)
            .map_err(|e| StoreError::Map(e.to_string()))?;
        let header = GuestMemory::empty()
            .with_region(0, DATA_AT, Arc::new(map), 0)
            .map_err(|e| StoreError::Map(e.to_string()))?;
        let state = read_state::<S>(&file)?;
        let c = header.load_u32(COUNTER_AT).map_err(|e| StoreError::Map(e.to_string()))?;
        drop(l);
        drop(t);
        Ok(SharedFile {
            file,
            header,
            cache: RwLock::new((c, Arc::new(state))),
            seen: AtomicU32::new(c.wrapping_sub(1)),
            threads,
        })
    }

    fn counter(&self) -> u32 {
        self.header.load_u32(COUNTER_AT).unwrap_or(0)
    }

    /// The state as it is now (one atomic load when nothing changed).
    #[inline]
    pub fn current(&self) -> Arc<S> {
        self.with_current(|_, arc| arc.clone())
    }

    /// `f` of the state as it is now, borrowed: a command's check takes no
    /// reference (no shared count moving on every command of every worker).
    #[inline]
    pub fn with_current<T>(&self, f: impl FnOnce(&S, &Arc<S>) -> T) -> T {
        let c = self.counter();
        {
            let g = self.cache.read().unwrap_or_else(|p| p.into_inner());
            if g.0 == c {
                return f(&g.1, &g.1);
            }
        }
        let fresh = self.reload();
        f(&fresh, &fresh)
    }

    #[cold]
    fn reload(&self) -> Arc<S> {
        let _t = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        let fresh = Locked::new(&self.file, false).map_err(StoreError::Io).and_then(|_l| {
            let s = read_state::<S>(&self.file)?;
            Ok((self.counter(), s))
        });
        let mut g = self.cache.write().unwrap_or_else(|p| p.into_inner());
        match fresh {
            Ok((c, s)) => *g = (c, Arc::new(s)),
            Err(e) => {
                // Keep what was last read good, and say so once per change: the
                // next command does not read the file again for the same counter.
                g.0 = self.counter();
                log_limit::limited_warn!(target: "vnvme::backend", "{}: {e}", S::WHAT);
            }
        }
        g.1.clone()
    }

    /// Runs `f` on the state under the exclusive lock; writes it back and moves
    /// the counter if it changed (a state the rules would not read back is never
    /// written). Where the state asks for it ([`SharedState::durable`]), the write
    /// is made durable after the lock is let go (other controllers do not wait on
    /// the sync).
    pub(crate) fn update<T>(
        &self,
        f: impl FnOnce(&mut S) -> Result<T, nvme_spec::Status>,
    ) -> Result<T, UpdateError> {
        let (r, sync) = {
            let _t = self.threads.lock().unwrap_or_else(|p| p.into_inner());
            let _l = Locked::new(&self.file, true).map_err(|e| UpdateError::Store(e.into()))?;
            let mut s = read_state::<S>(&self.file).map_err(UpdateError::Store)?;
            let before = s.clone();
            let r = f(&mut s).map_err(UpdateError::Rules)?;
            let mut c = self.counter();
            let changed = s != before;
            if changed {
                s.check().map_err(|e| UpdateError::Store(StoreError::Damaged(e)))?;
                write_state(&self.file, &s).map_err(UpdateError::Store)?;
                c = c.wrapping_add(1);
                let moved = self.header.store_u32(COUNTER_AT, c);
                moved.map_err(|e| UpdateError::Store(StoreError::Map(e.to_string())))?;
            }
            let sync = changed && s.durable();
            *self.cache.write().unwrap_or_else(|p| p.into_inner()) = (c, Arc::new(s));
            (r, sync)
        };
        if sync {
            self.file.sync_data().map_err(|e| UpdateError::Store(e.into()))?;
        }
        Ok(r)
    }

    /// True once per move of the counter (since the last call).
    pub(crate) fn changed_since_last_look(&self) -> bool {
        // A load when nothing moved (the admin side asks on every run).
        let c = self.counter();
        if self.seen.load(Ordering::Acquire) == c {
            return false;
        }
        self.seen.swap(c, Ordering::AcqRel) != c
    }
}

fn read_state<S: SharedState>(file: &File) -> Result<S, StoreError> {
    let mut len = [0u8; 4];
    file.read_exact_at(&mut len, DATA_AT)?;
    let len = u32::from_le_bytes(len);
    if len > MAX_DATA {
        return Err(StoreError::Damaged(format!("a state of {len} bytes")));
    }
    let mut data = vec![0u8; len as usize];
    file.read_exact_at(&mut data, DATA_AT + 4)?;
    let s: S = serde_json::from_slice(&data).map_err(|e| StoreError::Damaged(e.to_string()))?;
    s.check().map_err(StoreError::Damaged)?;
    Ok(s)
}

fn write_state<S: SharedState>(file: &File, s: &S) -> Result<(), StoreError> {
    let data = serde_json::to_vec(s).map_err(|e| StoreError::Damaged(e.to_string()))?;
    let mut out = Vec::with_capacity(4 + data.len());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(&data);
    file.write_all_at(&out, DATA_AT)?;
    file.set_len(DATA_AT + out.len() as u64)?;
    Ok(())
}
