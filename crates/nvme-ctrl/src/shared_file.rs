//! A state file every controller of a subsystem shares (the reservations of a
//! namespace, the namespace pool): a header page (magic, version, and the change
//! counter each process maps and reads atomically), then the state as
//! length-prefixed JSON from byte 4096. Updates hold the file's exclusive lock
//! (flock, between processes; a process-wide mutex per file, within one); a
//! reload holds it shared. A change is in the file before the update returns;
//! every other process sees it at its next look (one load of the counter).
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
            write_state(&file, &S::default(), true)?;
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
    /// is durable before the update returns.
    pub(crate) fn update<T>(
        &self,
        f: impl FnOnce(&mut S) -> Result<T, nvme_spec::Status>,
    ) -> Result<T, UpdateError> {
        let r = {
            let _t = self.threads.lock().unwrap_or_else(|p| p.into_inner());
            let _l = Locked::new(&self.file, true).map_err(|e| UpdateError::Store(e.into()))?;
            let mut s = read_state::<S>(&self.file).map_err(UpdateError::Store)?;
            let before = s.clone();
            let r = f(&mut s).map_err(UpdateError::Rules)?;
            let mut c = self.counter();
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
        // A load when nothing moved (the admin side asks on every run).
        let c = self.counter();
        if self.seen.load(Ordering::Acquire) == c {
            return false;
        }
        self.seen.swap(c, Ordering::AcqRel) != c
    }
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
        let one = SharedFile::<Counted>::open(f).unwrap();
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
        let one = SharedFile::<Counted>::open(f).unwrap();
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
        let one = SharedFile::<Counted>::open(f).unwrap();
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
        let one = SharedFile::<Counted>::open(f).unwrap();
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
}
