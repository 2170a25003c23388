//! The stats file (`--stats-file`): the counters as one JSON object, replaced
//! twice a second by a new file renamed over it, so a reader never sees half of
//! one.
//!
//! It never costs an operator a file. The path is checked before the server says
//! it serves: its directory must exist, and a file already there must be a stats
//! file of vnvme's (a JSON object that says so) that no one else writes, never an
//! image or anything else, whoever serves it. Each file it writes is locked while
//! it is the current one (`file_lock`, role "stats file"), so a second server
//! given the same path is refused with this one named, and a path that is some
//! namespace's file is refused by that namespace's lock. Before each rename the
//! file at the path must still be the one it wrote last: one put there by someone
//! else is left alone, and the server stops writing (with a line that says why).

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::logging::say;

/// The key that marks a stats file as vnvme's.
const MARK: &str = "vnvme_stats";
/// The most an existing stats file may hold to be taken for one.
const MAX_BYTES: u64 = 4 << 20;

/// A claimed stats file.
#[derive(Debug)]
pub struct StatsFile {
    path: PathBuf,
    /// The file at the path as last written (or found), locked; None before the
    /// first write of a new one, and after it was taken from us.
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    current: Option<File>,
    /// This process made the file (it was not there).
    created: bool,
    /// Someone else's file is at the path now: nothing more is written.
    lost: bool,
}

impl StatsFile {
    /// Checks `path` and takes it for this process: its directory exists, and a
    /// file there is a stats file of vnvme's that no one else writes (`locks`
    /// names whose hold is no conflict: the process a takeover takes over from).
    /// Nothing is created or changed.
    pub fn claim(path: &Path, locks: &file_lock::Policy) -> Result<StatsFile, String> {
        let fail = |why: String| format!("--stats-file {}: {why}", path.display());
        let dir = parent(path);
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(fail(format!("{} is not a directory", dir.display()))),
            Err(e) => {
                return Err(fail(format!(
                "its directory {} cannot be used ({e}): create it first, or give a path in an existing one",
                dir.display()
            )))
            }
        }
        let current = match File::open(path) {
            Ok(f) => {
                ours(&f).map_err(|why| {
                    fail(format!(
                        "{why}: it is not replaced by a stats file. Give a new path (or remove that file first, \
                         if it is not needed)"
                    ))
                })?;
                let lock = file_lock::Request { accept: locks.accept.clone(), ..stats_lock() };
                file_lock::lock(&f, &lock).map_err(|e| match e {
                    file_lock::LockError::InUse(u) => {
                        fail(format!("{u}: one writer per stats file; give each server its own path"))
                    }
                    file_lock::LockError::Unsupported(e) => fail(format!("cannot be locked ({e})")),
                })?;
                Some(f)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(fail(e.to_string())),
        };
        let created = current.is_none();
        Ok(StatsFile { path: path.to_path_buf(), state: Mutex::new(State { current, created, lost: false }) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `snapshot` as the stats file: a new file (this process's name for it
    /// beside the path, locked), renamed over the path if the path is still the
    /// file this process wrote last.
    pub fn write(&self, snapshot: &nvme_ctrl::StatsSnapshot) -> std::io::Result<()> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.lost {
            return Ok(());
        }
        let mut v = serde_json::to_value(snapshot).map_err(std::io::Error::other)?;
        if let Some(o) = v.as_object_mut() {
            o.insert(MARK.into(), 1.into());
        }
        let tmp = temporary(&self.path);
        let mut f = create_new(&tmp)?;
        let written = file_lock::lock(&f, &stats_lock())
            .map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(|()| writeln!(f, "{v}"));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        if let Some(why) = self.taken_from_us(&st) {
            let _ = std::fs::remove_file(&tmp);
            st.lost = true;
            st.current = None;
            say!("vnvme: --stats-file {}: {why}; this server writes it no more", self.path.display());
            return Ok(());
        }
        if let Err(e) = std::fs::rename(&tmp, &self.path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        st.current = Some(f);
        Ok(())
    }

    /// Why the file at the path is not this process's to replace any more, if it
    /// is not: another file was put there.
    fn taken_from_us(&self, st: &State) -> Option<String> {
        let at_path = match std::fs::metadata(&self.path) {
            Ok(m) => m,
            // Removed: writing a new one is what the operator would expect.
            Err(_) => return None,
        };
        let Some(mine) = st.current.as_ref().and_then(|f| f.metadata().ok()) else {
            // None written yet: the path was empty when claimed.
            return Some("a file appeared at the path after this server checked it".into());
        };
        if (mine.dev(), mine.ino()) == (at_path.dev(), at_path.ino()) {
            return None;
        }
        // (Under the sandbox a file cannot be opened for reading: it is someone
        // else's all the same.)
        let Ok(f) = File::open(&self.path) else { return Some("another file was put at its path".into()) };
        match file_lock::holders(&f) {
            Ok(h) if h.iter().any(|h| h.role == Some(file_lock::Role::Stats)) => {
                Some(format!("{} writes it now", h[0]))
            }
            _ => Some("another file was put at its path".into()),
        }
    }

    /// A start that failed leaves no stats file it made.
    pub fn discard_if_new(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.created && st.current.take().is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The lock a stats file is held with.
fn stats_lock() -> file_lock::Request {
    file_lock::Request::write(file_lock::Role::Stats, None)
}

/// A kind of file vnvme writes whole, as JSON: what it is called, and how one is
/// known.
#[derive(Clone, Copy, Debug)]
pub struct Kind {
    /// "a stats file of vnvme's".
    pub what: &'static str,
    /// Whether a JSON object is one.
    pub known: fn(&serde_json::Map<String, serde_json::Value>) -> bool,
}

/// The stats file: carries [`MARK`]; a build before the mark wrote the counters
/// alone, known by two of them.
const STATS: Kind = Kind {
    what: "a stats file of vnvme's",
    known: |o| o.contains_key(MARK) || (o.contains_key("io_commands") && o.contains_key("admin_commands")),
};

fn ours(f: &File) -> Result<(), String> {
    is(f, STATS)
}

/// Whether `f` is a file of `kind`: Err says what it is instead.
fn is(f: &File, kind: Kind) -> Result<(), String> {
    let m = f.metadata().map_err(|e| e.to_string())?;
    if !m.is_file() {
        return Err("it exists and is not a regular file".into());
    }
    if m.len() > MAX_BYTES {
        return Err(format!("it exists and is not {} ({})", kind.what, crate::units::human_size(m.len())));
    }
    let mut text = String::new();
    let parsed = f
        .take(MAX_BYTES)
        .read_to_string(&mut text)
        .ok()
        .and_then(|_| serde_json::from_str::<serde_json::Value>(&text).ok());
    match parsed.as_ref().and_then(|v| v.as_object()) {
        Some(o) if (kind.known)(o) => Ok(()),
        _ if m.len() == 0 => Err(format!("it exists and is empty, not {}", kind.what)),
        _ => Err(format!(
            "it exists and is not {} ({} of something else)",
            kind.what,
            crate::units::human_size(m.len())
        )),
    }
}

/// A JSON file written once, at the end of a run (`vnvme perf --json FILE`),
/// claimed before the run as the stats file is: its directory exists, a file
/// there is one of its kind that no one holds (never an image, whoever serves
/// it), and it is written by a new file renamed over the path, only while the
/// path is still what was claimed.
#[derive(Debug)]
pub struct JsonOutput {
    path: PathBuf,
    /// The file found there when claimed, held (locked) until replaced.
    found: Option<File>,
}

impl JsonOutput {
    /// Checks `path` (given with `flag`) for a file of `kind`; nothing is created
    /// or changed.
    pub fn claim(path: &Path, flag: &str, kind: Kind) -> Result<JsonOutput, String> {
        let fail = |why: String| format!("{flag} {}: {why}", path.display());
        let dir = parent(path);
        if !std::fs::metadata(dir).is_ok_and(|m| m.is_dir()) {
            return Err(fail(format!("its directory {} does not exist: create it first", dir.display())));
        }
        let found = match File::open(path) {
            Ok(f) => {
                is(&f, kind).map_err(|why| fail(format!("{why}: it is not replaced. Give a new path")))?;
                let lock = file_lock::Request::write(file_lock::Role::Output, None);
                file_lock::lock(&f, &lock).map_err(|e| fail(format!("{e}")))?;
                Some(f)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(fail(e.to_string())),
        };
        Ok(JsonOutput { path: path.to_path_buf(), found })
    }

    /// Writes `text`: a new file beside the path, renamed over it if the path is
    /// still what was claimed (absent, or the file found then).
    pub fn write(self, text: &str) -> std::io::Result<()> {
        let now = std::fs::metadata(&self.path).ok().map(|m| (m.dev(), m.ino()));
        let then = self.found.as_ref().and_then(|f| f.metadata().ok()).map(|m| (m.dev(), m.ino()));
        if now != then {
            return Err(std::io::Error::other(format!(
                "{} changed since it was checked (another file is there now): not replaced",
                self.path.display()
            )));
        }
        let tmp = temporary(&self.path);
        let mut f = create_new(&tmp)?;
        if let Err(e) = f.write_all(text.as_bytes()).and_then(|()| std::fs::rename(&tmp, &self.path)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(())
    }
}

/// The directory `path` is in.
fn parent(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// This process's temporary name for the next stats file: beside it (a rename
/// stays in one file system), hidden, with the pid (two processes write during an
/// upgrade).
fn temporary(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    parent(path).join(format!(".{name}.{}.tmp", std::process::id()))
}

/// Creates `tmp`, a new file; one by that name left by a process of this pid
/// that died mid-write is removed first if it is one of ours.
fn create_new(tmp: &Path) -> std::io::Result<File> {
    // Read as well as write: its lock is a read lock, which needs read access.
    let open = || std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(tmp);
    match open() {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let left = File::open(tmp)?;
            let empty = left.metadata().is_ok_and(|m| m.len() == 0);
            if !empty && ours(&left).is_err() {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("{} exists and is not a stats file of vnvme's", tmp.display()),
                ));
            }
            std::fs::remove_file(tmp)?;
            open()
        }
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vnvme-stats-file-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_file_that_is_not_a_stats_file_is_never_replaced() {
        let d = dir("foreign");
        let none = file_lock::Policy::default();
        for (name, bytes) in
            [("image", vec![7u8; 1 << 20]), ("empty", Vec::new()), ("json", b"{\"a\": 1}".to_vec())]
        {
            let p = d.join(name);
            std::fs::write(&p, &bytes).unwrap();
            let e = StatsFile::claim(&p, &none).unwrap_err();
            assert!(e.contains("not a stats file of vnvme's") && e.contains("Give a new path"), "{e}");
            assert_eq!(std::fs::read(&p).unwrap(), bytes, "{name} untouched");
        }
        let e = StatsFile::claim(&d.join("no/such/dir/s.json"), &none).unwrap_err();
        assert!(e.contains("no/such/dir") && e.contains("create it first"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn one_writer_per_stats_file_and_one_made_anew_is_taken() {
        let d = dir("writers");
        let p = d.join("s.json");
        let none = file_lock::Policy::default();
        let one = StatsFile::claim(&p, &none).unwrap();
        one.write(&nvme_ctrl::StatsSnapshot::default()).unwrap();
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(v[MARK], 1);
        // A second claim of the same path (another server) is refused; the
        // process taken over from is no conflict.
        let e = StatsFile::claim(&p, &none).unwrap_err();
        assert!(e.contains("this process (its stats file)") && e.contains("its own path"), "{e}");
        let accept = file_lock::Policy { accept: vec![std::process::id()], ..Default::default() };
        let two = StatsFile::claim(&p, &accept).unwrap();
        // The successor writes; the first sees it and stops, touching nothing.
        two.write(&nvme_ctrl::StatsSnapshot::default()).unwrap();
        let before = std::fs::metadata(&p).unwrap().ino();
        one.write(&nvme_ctrl::StatsSnapshot::default()).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().ino(), before, "the first no longer replaces it");
        // Someone else's file put at the path is left alone.
        std::fs::write(d.join("other"), b"an operator's").unwrap();
        std::fs::rename(d.join("other"), &p).unwrap();
        two.write(&nvme_ctrl::StatsSnapshot::default()).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"an operator's");
        let names: Vec<_> = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// The stats thread, the start-up write and the last write run at once: every
    /// write succeeds and the file always parses.
    #[test]
    fn writers_at_once_all_succeed() {
        let d = dir("race");
        let path = d.join("s.json");
        let file = std::sync::Arc::new(StatsFile::claim(&path, &file_lock::Policy::default()).unwrap());
        let writers: Vec<_> = (0..4)
            .map(|_| {
                let file = file.clone();
                std::thread::spawn(move || {
                    (0..300).filter(|_| file.write(&nvme_ctrl::StatsSnapshot::default()).is_err()).count()
                })
            })
            .collect();
        let failed: usize = writers.into_iter().map(|w| w.join().unwrap()).sum();
        assert_eq!(failed, 0, "writes that failed");
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert!(v.is_object());
        std::fs::remove_dir_all(&d).unwrap();
    }

    const RESULTS: Kind = Kind { what: "a results file", known: |o| o.contains_key("tool") };

    #[test]
    fn a_results_file_is_claimed_before_and_replaced_only_if_unchanged() {
        let d = dir("results");
        let p = d.join("r.json");
        // Absent: written.
        JsonOutput::claim(&p, "--json", RESULTS).unwrap().write("{\"tool\": 1}\n").unwrap();
        // One of its kind: replaced.
        let out = JsonOutput::claim(&p, "--json", RESULTS).unwrap();
        // Held while claimed: a second claim of it is refused.
        let e = JsonOutput::claim(&p, "--json", RESULTS).unwrap_err();
        assert!(e.contains("this process (its results file)"), "{e}");
        out.write("{\"tool\": 2}\n").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{\"tool\": 2}\n");
        // Something else: refused, untouched.
        std::fs::write(&p, b"a disk").unwrap();
        let e = JsonOutput::claim(&p, "--json", RESULTS).unwrap_err();
        assert!(e.contains("not a results file") && e.contains("Give a new path"), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"a disk");
        // Put there after the claim: left alone.
        std::fs::remove_file(&p).unwrap();
        let out = JsonOutput::claim(&p, "--json", RESULTS).unwrap();
        std::fs::write(&p, b"an operator's").unwrap();
        assert!(out.write("{}").is_err());
        assert_eq!(std::fs::read(&p).unwrap(), b"an operator's");
        let names: Vec<_> = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
