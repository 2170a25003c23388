//! A state file every controller of a subsystem shares (the reservations of a
//! namespace, the namespace pool): a header page (magic, version, and the change
//! counter each process maps and reads atomically), then the state as
//! length-prefixed JSON from byte 4096. Updates hold the file's exclusive lock
//! (flock, between processes; a process-wide mutex per file, within one); a
//! reload holds it shared. A change is in the file before the update returns;
//! every other process sees it at its next look (one load of the counter).
//!
//! A state file is made on purpose only: [`initialize`] writes a new (empty)
//! one's header and default state, which the opener that created it calls; an
//! open of one that is empty (emptied, or made by a process that died before it
//! wrote it), cut short or foreign is refused, never taken for a new one (an
//! emptied reservation file would drop a fence; an emptied pool file, every
//! namespace). The header page is mapped fragile (`guest_mem::fragile`): a file
//! truncated or replaced under a running server leaves this open broken (said,
//! once), its last good state kept for reports, every check and update failing,
//! and the process serving on, never faulting.
//!
//! A state is rewritten in place, so a write cut short (the writing process
//! killed between two pages of it, or the power lost before they all reached the
//! disk) would leave it torn. Each update therefore writes the new state first as
//! an intent record past the state's room ([`INTENT_AT`]: length, CRC-64 and the
//! JSON; made durable first where the state must be), then in place, then clears
//! the intent. A state that reads torn is taken from a whole intent record, and
//! the next update writes it in place again. Readers of the version before this
//! one read the same place and format, so controllers of two builds still share
//! the file during an upgrade.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
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
/// Where the intent record is: past the most the state can take, page aligned.
const INTENT_AT: u64 = DATA_AT + MAX_DATA as u64 + 4096;
/// Where the CRC-64 of the state in place is (in the header page; a build before
/// this one neither writes nor reads it).
const CRC_AT: u64 = 72;

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
    #[error(
        "it is empty: not a new state file (one is made where none exists) and no state; it was emptied or \
         cut short, or the process making it died. Restore it from a copy; or remove it to start anew, \
         knowing what it held is gone"
    )]
    Empty,
    #[error("it is {0} bytes, cut short (a state file is at least {DATA_AT} bytes and whole): restore it from a copy")]
    Short(u64),
    #[error("it shrank or was replaced while this server used it: {0}")]
    Lost(String),
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

/// How long an open waits for the process that made an empty state file to
/// write it (the two race at a subsystem's first start).
const MADE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Writes a new state file's header and default state: for the process that has
/// just created `file` (empty, with O_EXCL: only its creator calls this). A file
/// that is not empty is left as it is.
pub fn initialize<S: SharedState>(file: &File) -> Result<(), StoreError> {
    let threads = inode_lock(file)?;
    let _t = threads.lock().unwrap_or_else(|p| p.into_inner());
    let _l = Locked::new(file, true)?;
    if file.metadata()?.len() != 0 {
        return Ok(());
    }
    let mut head = vec![0u8; DATA_AT as usize];
    head[..8].copy_from_slice(S::MAGIC);
    head[8..12].copy_from_slice(&VERSION.to_le_bytes());
    file.write_all_at(&head, 0)?;
    write_state(file, &S::default(), true)
}

/// One open of a shared state file.
pub struct SharedFile<S> {
    file: File,
    /// The header page, mapped shared: the change counter at [`COUNTER_AT`].
    header: GuestMemory,
    /// The same mapping, asked whether a fault made it lost.
    map: Arc<Mapping>,
    /// Why this open no longer trusts the file, once it does not.
    broken: OnceLock<String>,
    /// Where the file was when opened, and its identity, to see it replaced
    /// (None: not a file with a path, e.g. a memfd).
    place: Option<(std::path::PathBuf, (u64, u64))>,
    /// When [`SharedFile::changed_since_last_look`] last looked for that (ms
    /// since the first open in this process).
    looked_ms: AtomicU64,
    /// The state as of a counter value (the last one tried, read well or not).
    cache: RwLock<(u32, Arc<S>)>,
    /// The counter when [`SharedFile::changed_since_last_look`] was last asked.
    seen: AtomicU32,
    /// Held over each update and reload (see [`Locked`]).
    threads: Arc<Mutex<()>>,
}

impl<S: SharedState> std::fmt::Debug for SharedFile<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(S::WHAT)
            .field("counter", &self.counter())
            .field("broken", &self.broken())
            .finish_non_exhaustive()
    }
}

impl<S: SharedState> SharedFile<S> {
    /// Opens `file` (read-write) as a state file, which it must already be (see
    /// [`initialize`]): an empty one is waited for a moment (its maker may be
    /// writing it), then refused.
    pub fn open(file: File) -> Result<Self, StoreError> {
        let threads = inode_lock(&file)?;
        let deadline = std::time::Instant::now() + MADE_WAIT;
        let (t, l) = loop {
            let t = threads.lock().unwrap_or_else(|p| p.into_inner());
            let l = Locked::new(&file, true)?;
            if file.metadata()?.len() != 0 {
                break (t, l);
            }
            drop((l, t));
            if std::time::Instant::now() >= deadline {
                return Err(StoreError::Empty);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let len = file.metadata()?.len();
        let mut head = [0u8; 12];
        if len >= 12 {
            file.read_exact_at(&mut head, 0)?;
        }
        if len < 12 || &head[..8] != S::MAGIC {
            return Err(StoreError::NotOurs(S::WHAT));
        }
        let v = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
        if v != VERSION {
            return Err(StoreError::Version(S::WHAT, v));
        }
        if len < DATA_AT + 4 {
            return Err(StoreError::Short(len));
        }
        // The header mapped, then the state and the counter read under one lock:
        // they go together.
        let map = Mapping::from_fd_fragile(std::os::fd::AsFd::as_fd(&file), 0, DATA_AT, true)
            .map_err(|e| StoreError::Map(e.to_string()))?;
        let map = Arc::new(map);
        let header = GuestMemory::empty()
            .with_region(0, DATA_AT, map.clone(), 0)
            .map_err(|e| StoreError::Map(e.to_string()))?;
        let state = read_state::<S>(&file)?;
        let c = header.load_u32(COUNTER_AT).map_err(|e| StoreError::Map(e.to_string()))?;
        drop(l);
        drop(t);
        let place = place_of(&file);
        Ok(SharedFile {
            file,
            header,
            map,
            broken: OnceLock::new(),
            place,
            looked_ms: AtomicU64::new(elapsed_ms()),
            cache: RwLock::new((c, Arc::new(state))),
            seen: AtomicU32::new(c.wrapping_sub(1)),
            threads,
        })
    }

    /// Why this open no longer trusts its file, if it does not: it shrank under
    /// it (its header's mapping faulted) or its state stopped reading whole.
    #[inline]
    pub fn broken(&self) -> Option<&str> {
        self.broken.get().map(String::as_str)
    }

    /// Whether the file is still whole and the one at its path: cut below its
    /// state's room, or replaced (or removed, and so read by no controller started
    /// since: updating it would split the subsystem's state in two), it is not.
    fn still_in_place(&self) -> bool {
        let len = self.file.metadata().map(|m| m.len()).unwrap_or(0);
        if len < DATA_AT + 4 {
            self.break_off(StoreError::Lost(format!("it was cut to {len} bytes")).to_string());
            return false;
        }
        let Some((path, id)) = &self.place else { return true };
        let here = std::fs::metadata(path).map(|m| {
            use std::os::unix::fs::MetadataExt;
            (m.dev(), m.ino())
        });
        if here.as_ref().is_ok_and(|h| h == id) {
            return true;
        }
        self.break_off(
            StoreError::Lost(format!("{} is no longer this file (replaced or removed)", path.display()))
                .to_string(),
        );
        false
    }

    /// [`SharedFile::still_in_place`], once a second at most (a clock read
    /// otherwise: the per-command check calls it).
    #[inline]
    fn look_now_and_then(&self) {
        let now = elapsed_ms();
        let last = self.looked_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= 1000
            && self.broken.get().is_none()
            && self.looked_ms.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            self.still_in_place();
        }
    }

    /// Stops trusting the file, saying why once.
    #[cold]
    fn break_off(&self, why: String) {
        if self.broken.set(why).is_ok() {
            let at = self.place.as_ref().map_or(String::new(), |(p, _)| format!(" {}", p.display()));
            tracing::error!(
                target: "vnvme::backend",
                "{}{at}: {}: what depends on it fails from now on (the server serves on; restore the file and \
                 restart this server)",
                S::WHAT,
                self.broken().unwrap_or_default()
            );
        }
    }

    /// The change counter (one load), or None once the file is not trusted.
    #[inline]
    fn counter(&self) -> Option<u32> {
        let c = self.header.load_u32(COUNTER_AT).unwrap_or(0);
        if self.map.lost() {
            self.break_off(
                StoreError::Lost("its header page is gone (truncated under it)".into()).to_string(),
            );
        }
        self.broken.get().is_none().then_some(c)
    }

    /// The state as it is now (one atomic load when nothing changed).
    #[inline]
    pub fn current(&self) -> Arc<S> {
        self.with_current(|_, arc| arc.clone())
    }

    /// `f` of the state as it is now, borrowed: a command's check takes no
    /// reference (no shared count moving on every command of every worker).
    #[inline]
    /// Once the file is not trusted ([`SharedFile::broken`]), the last state read
    /// well.
    pub fn with_current<T>(&self, f: impl FnOnce(&S, &Arc<S>) -> T) -> T {
        self.look_now_and_then();
        let c = self.counter();
        {
            let g = self.cache.read().unwrap_or_else(|p| p.into_inner());
            if c.is_none_or(|c| g.0 == c) {
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
            Ok((Some(c), s)) => *g = (c, Arc::new(s)),
            Ok((None, _)) => {}
            // Read under the lock, a state that does not read whole is no writer's
            // half-done work (a torn one is taken from its intent): the file was
            // damaged under us. What was last read good stays for reports.
            Err(e) => self.break_off(e.to_string()),
        }
        g.1.clone()
    }

    /// Runs `f` on the state under the exclusive lock; writes it back and moves
    /// the counter if it changed (a state the rules would not read back is never
    /// written). Where the state asks for it ([`SharedState::durable`]), the write
    /// is durable before the update returns.
    pub(crate) fn update<T>(
        &self,
        f: impl FnOnce(&mut S) -> Result<T, nvme_spec::Status>,
    ) -> Result<T, UpdateError> {
        let r = {
            let _t = self.threads.lock().unwrap_or_else(|p| p.into_inner());
            let _l = Locked::new(&self.file, true).map_err(|e| UpdateError::Store(e.into()))?;
            if self.counter().is_none() || !self.still_in_place() {
                return Err(UpdateError::Store(StoreError::Lost(self.broken().unwrap_or_default().into())));
            }
            let mut s = match read_state::<S>(&self.file) {
                Ok(s) => s,
                Err(e) => {
                    self.break_off(e.to_string());
                    return Err(UpdateError::Store(e));
                }
            };
            let before = s.clone();
            let r = f(&mut s).map_err(UpdateError::Rules)?;
            let mut c = self.counter().unwrap_or(0);
            let changed = s != before;
            if changed {
                s.check().map_err(|e| UpdateError::Store(StoreError::Damaged(e)))?;
                // The counter first: a process that dies writing leaves the others
                // reading the file again (behind the lock it let go of), never
                // holding on to the state before a change that reached the file.
                c = c.wrapping_add(1);
                let moved = self.header.store_u32(COUNTER_AT, c);
                moved.map_err(|e| UpdateError::Store(StoreError::Map(e.to_string())))?;
                write_state(&self.file, &s, s.durable()).map_err(UpdateError::Store)?;
            }
            *self.cache.write().unwrap_or_else(|p| p.into_inner()) = (c, Arc::new(s));
            r
        };
        Ok(r)
    }

    /// True once per move of the counter (since the last call).
    pub(crate) fn changed_since_last_look(&self) -> bool {
        // A load when nothing moved (the admin side asks on every run); nothing
        // moves once the file is not trusted.
        self.look_now_and_then();
        let Some(c) = self.counter() else { return false };
        if self.seen.load(Ordering::Acquire) == c {
            return false;
        }
        self.seen.swap(c, Ordering::AcqRel) != c
    }
}

/// Milliseconds since the first call in this process.
fn elapsed_ms() -> u64 {
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64
}

/// Where `file` is, if it is a regular file at a path (read back from the
/// process's descriptor table), with its identity.
fn place_of(file: &File) -> Option<(std::path::PathBuf, (u64, u64))> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let m = file.metadata().ok().filter(|m| m.is_file())?;
    let path = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()?;
    let at = std::fs::metadata(&path).ok()?;
    ((at.dev(), at.ino()) == (m.dev(), m.ino())).then(|| (path, (m.dev(), m.ino())))
}

/// The state in place, or, if that reads torn (its CRC does not match, or it
/// does not parse), the intent record an update left whole (it was written
/// first). A state in place that parses but whose CRC does not match, with no
/// intent, was written by a build before this one (it kept no CRC): taken.
fn read_state<S: SharedState>(file: &File) -> Result<S, StoreError> {
    let in_place = read_in_place(file);
    if let Ok((s, true)) = in_place {
        return Ok(s);
    }
    if let Some(s) = read_intent(file) {
        log_limit::limited_warn!(
            target: "vnvme::backend",
            "{}: the state reads torn: taken from the update's intent record",
            S::WHAT
        );
        return Ok(s);
    }
    in_place.map(|(s, _)| s)
}

/// The state in place, and whether its CRC matches.
fn read_in_place<S: SharedState>(file: &File) -> Result<(S, bool), StoreError> {
    let mut len = [0u8; 4];
    file.read_exact_at(&mut len, DATA_AT)?;
    let len = u32::from_le_bytes(len);
    if len > MAX_DATA {
        return Err(StoreError::Damaged(format!("a state of {len} bytes")));
    }
    let mut data = vec![0u8; len as usize];
    file.read_exact_at(&mut data, DATA_AT + 4)?;
    let mut crc = [0u8; 8];
    file.read_exact_at(&mut crc, CRC_AT)?;
    let whole = u64::from_le_bytes(crc) == nvme_spec::pi::crc64_nvme(&data);
    let s: S = serde_json::from_slice(&data).map_err(|e| StoreError::Damaged(e.to_string()))?;
    s.check().map_err(StoreError::Damaged)?;
    Ok((s, whole))
}

/// The intent record's state, if there is a whole one (its CRC matches).
fn read_intent<S: SharedState>(file: &File) -> Option<S> {
    let mut head = [0u8; 12];
    file.read_exact_at(&mut head, INTENT_AT).ok()?;
    let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
    if len == 0 || len > MAX_DATA {
        return None;
    }
    let mut data = vec![0u8; len as usize];
    file.read_exact_at(&mut data, INTENT_AT + 12).ok()?;
    if nvme_spec::pi::crc64_nvme(&data) != u64::from_le_bytes(head[4..].try_into().expect("8 bytes")) {
        return None;
    }
    let s: S = serde_json::from_slice(&data).ok()?;
    s.check().ok()?;
    Some(s)
}

/// Writes `s`: as the intent record (durable first if `sync`), in place, then
/// the intent cleared. A state file of the version before this one gains the
/// intent's room as a hole.
fn write_state<S: SharedState>(file: &File, s: &S, sync: bool) -> Result<(), StoreError> {
    let data = serde_json::to_vec(s).map_err(|e| StoreError::Damaged(e.to_string()))?;
    if data.len() > MAX_DATA as usize {
        return Err(StoreError::Damaged(format!("a state of {} bytes", data.len())));
    }
    let mut intent = Vec::with_capacity(12 + data.len());
    intent.extend_from_slice(&(data.len() as u32).to_le_bytes());
    intent.extend_from_slice(&nvme_spec::pi::crc64_nvme(&data).to_le_bytes());
    intent.extend_from_slice(&data);
    file.write_all_at(&intent, INTENT_AT)?;
    if sync {
        file.sync_data()?;
    }
    let mut out = Vec::with_capacity(4 + data.len());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(&data);
    file.write_all_at(&out, DATA_AT)?;
    file.write_all_at(&nvme_spec::pi::crc64_nvme(&data).to_le_bytes(), CRC_AT)?;
    if sync {
        // Durable before the intent goes, or a disk that reorders writes could
        // lose the state torn with no intent left to take it from.
        file.sync_data()?;
    }
    // Only the length goes (not made durable: an intent left over holds the same
    // state): a cleared intent is one of length 0.
    file.write_all_at(&0u32.to_le_bytes(), INTENT_AT)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Counted {
        value: u64,
        /// Enough bytes that a state spans several pages, as a torn write tears.
        padding: String,
    }

    impl SharedState for Counted {
        const MAGIC: &'static [u8; 8] = b"vnvmeTST";
        const WHAT: &'static str = "test state file";
        fn check(&self) -> Result<(), String> {
            (self.value != 13).then_some(()).ok_or_else(|| "13 is not a value the rules make".into())
        }
        fn durable(&self) -> bool {
            true
        }
    }

    fn file(name: &str) -> (std::path::PathBuf, File) {
        let p = std::env::temp_dir().join(format!("vnvme-shared-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let f =
            std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&p).unwrap();
        (p, f)
    }

    /// A new state file, as its maker makes it.
    fn made(f: File) -> SharedFile<Counted> {
        initialize::<Counted>(&f).unwrap();
        SharedFile::open(f).unwrap()
    }

    fn reopen(p: &std::path::Path) -> SharedFile<Counted> {
        let f = std::fs::OpenOptions::new().read(true).write(true).open(p).unwrap();
        SharedFile::open(f).unwrap()
    }

    fn state(value: u64) -> Counted {
        Counted { value, padding: "x".repeat(10_000 + value as usize * 100) }
    }

    /// What an update that died half way through its in-place write leaves: the
    /// whole intent record, and the state in place torn after `keep` bytes.
    fn die_writing(f: &File, s: &Counted, keep: usize) {
        let data = serde_json::to_vec(s).unwrap();
        let mut intent = (data.len() as u32).to_le_bytes().to_vec();
        intent.extend_from_slice(&nvme_spec::pi::crc64_nvme(&data).to_le_bytes());
        intent.extend_from_slice(&data);
        f.write_all_at(&intent, INTENT_AT).unwrap();
        let mut out = (data.len() as u32).to_le_bytes().to_vec();
        out.extend_from_slice(&data[..keep]);
        f.write_all_at(&out, DATA_AT).unwrap();
    }

    #[test]
    fn a_state_torn_in_place_is_taken_from_the_intent_and_written_again() {
        let (p, f) = file("torn");
        let one = made(f);
        one.update(|s| {
            *s = state(5);
            Ok(())
        })
        .unwrap();
        let raw = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
        die_writing(&raw, &state(9), 5000);
        assert!(!matches!(read_in_place::<Counted>(&raw), Ok((_, true))), "torn in place");
        let two = reopen(&p);
        assert_eq!(two.current().value, 9, "the intent's state");
        // The next update builds on it and leaves the file whole again.
        two.update(|s| {
            s.value += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(read_in_place::<Counted>(&raw).unwrap().0.value, 10);
        assert!(read_intent::<Counted>(&raw).is_none(), "the intent cleared");
        assert_eq!(one.current().value, 10, "the first open follows");
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn a_tear_that_still_parses_is_caught_by_the_crc() {
        let (p, f) = file("mix");
        let one = made(f);
        one.update(|s| {
            *s = state(5);
            Ok(())
        })
        .unwrap();
        // The same length and shape: torn half way, the JSON in place is whole,
        // half new and half old, a state no one wrote.
        let new = Counted { value: 5, padding: "y".repeat(state(5).padding.len()) };
        let raw = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
        die_writing(&raw, &new, 6000);
        let (mixed, whole) = read_in_place::<Counted>(&raw).unwrap();
        assert!(mixed.padding.contains('x') && mixed.padding.contains('y') && !whole);
        assert_eq!(reopen(&p).current().padding, new.padding, "the intent's, not the mix");
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn a_torn_intent_leaves_the_state_in_place() {
        let (p, f) = file("torn-intent");
        let one = made(f);
        one.update(|s| {
            *s = state(7);
            Ok(())
        })
        .unwrap();
        let raw = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
        // An intent whose write was cut short: its CRC does not match.
        let data = serde_json::to_vec(&state(8)).unwrap();
        let mut intent = (data.len() as u32).to_le_bytes().to_vec();
        intent.extend_from_slice(&nvme_spec::pi::crc64_nvme(&data).to_le_bytes());
        intent.extend_from_slice(&data[..100]);
        raw.write_all_at(&intent, INTENT_AT).unwrap();
        assert_eq!(reopen(&p).current().value, 7);
        // A state torn in place with no whole intent is refused, not guessed.
        die_writing(&raw, &state(8), 5000);
        raw.write_all_at(&[0xff; 8], INTENT_AT + 4).unwrap();
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
        assert!(matches!(SharedFile::<Counted>::open(f), Err(StoreError::Damaged(_))));
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn a_file_of_the_version_before_reads_and_is_updated() {
        // As the build before wrote it: the state in place, nothing past it.
        let (p, f) = file("before");
        let mut head = vec![0u8; DATA_AT as usize];
        head[..8].copy_from_slice(Counted::MAGIC);
        head[8..12].copy_from_slice(&VERSION.to_le_bytes());
        f.write_all_at(&head, 0).unwrap();
        let data = serde_json::to_vec(&state(3)).unwrap();
        let mut out = (data.len() as u32).to_le_bytes().to_vec();
        out.extend_from_slice(&data);
        f.write_all_at(&out, DATA_AT).unwrap();
        let one = made(f);
        assert_eq!(one.current().value, 3);
        one.update(|s| {
            s.value = 4;
            Ok(())
        })
        .unwrap();
        // Where the build before reads it.
        let raw = std::fs::File::open(&p).unwrap();
        assert_eq!(read_in_place::<Counted>(&raw).unwrap().0.value, 4);
        let _ = std::fs::remove_file(&p);
    }

    /// issue 49: a state file is made on purpose only; one that is empty, cut
    /// short or foreign is refused, never taken for a new one.
    #[test]
    fn an_empty_short_or_foreign_file_is_refused_not_made_new() {
        let (p, f) = file("empty");
        let t = std::time::Instant::now();
        assert!(matches!(SharedFile::<Counted>::open(f), Err(StoreError::Empty)));
        assert!(t.elapsed() >= MADE_WAIT, "its maker was waited for");
        let (_, f) = file("empty");
        made(f);
        let raw = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
        raw.set_len(DATA_AT).unwrap();
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
        assert!(matches!(SharedFile::<Counted>::open(f), Err(StoreError::Short(4096))));
        raw.set_len(6).unwrap();
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
        assert!(matches!(SharedFile::<Counted>::open(f), Err(StoreError::NotOurs(_))));
        let _ = std::fs::remove_file(&p);
    }

    /// issue 49: a state file truncated (or emptied) under a running open leaves
    /// it broken: the last state read well is kept for reports, every update
    /// fails, nothing faults, and the counter no longer moves.
    #[test]
    fn a_file_truncated_under_an_open_breaks_it_without_a_fault() {
        for len in [0, 100, DATA_AT] {
            let (p, f) = file(&format!("truncated-{len}"));
            let one = made(f);
            one.update(|s| {
                *s = state(5);
                Ok(())
            })
            .unwrap();
            assert!(one.broken().is_none());
            std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(len).unwrap();
            // What a command's check reads: the last good state, and the mark.
            assert_eq!(one.current().value, 5, "len {len}");
            let r = one.update(|s| {
                s.value = 6;
                Ok(())
            });
            assert!(matches!(r, Err(UpdateError::Store(_))), "len {len}: an update after it");
            assert!(one.broken().is_some(), "len {len}");
            assert!(!one.changed_since_last_look(), "len {len}");
            let _ = std::fs::remove_file(&p);
        }
    }

    /// issue 49: a state file replaced under a running open (another file moved
    /// over its path) is one no controller started since would read: updating the
    /// old one would split the state in two, so the open breaks off.
    #[test]
    fn a_file_replaced_under_an_open_breaks_it() {
        let (p, f) = file("replaced");
        let one = made(f);
        let (q, g) = file("replacement");
        made(g);
        std::fs::rename(&q, &p).unwrap();
        let r = one.update(|s| {
            s.value = 7;
            Ok(())
        });
        assert!(matches!(r, Err(UpdateError::Store(StoreError::Lost(_)))), "{r:?}");
        assert!(one.broken().unwrap().contains("replaced or removed"), "{:?}", one.broken());
        let _ = std::fs::remove_file(&p);
    }
}
