//! One writer per file: every file vnvme writes (an image, a zone state file, a
//! metadata file, a subsystem's shared state file, a pool's data files, the stats
//! file) is locked for as long as it is open, and a second writer is refused with
//! the holder named.
//!
//! The locks are open file description locks (`F_OFD_SETLK`): they belong to the
//! open file, not to the process, so they last exactly as long as the file is
//! open (a descriptor passed to another process keeps them, a process that dies
//! leaves none behind), and two opens of one file in one process exclude each
//! other as two processes do. [`lock`] puts them on the caller's own open file:
//! there is no guard to keep, the file is the guard.
//!
//! The layout is QEMU's (its file driver's `locking=`, since 2.10), so QEMU refuses
//! an image vnvme serves and vnvme one that QEMU runs: one byte per permission a
//! user of the file *has* (from byte 100) and one per permission it *does not let
//! others have* (from byte 200), each held as a shared (read) lock, so holders
//! never block each other's locking; a conflict is a lock another open file holds
//! on a byte this user needs free, found with `F_OFD_GETLK`. Taking the locks
//! first and looking second means two users starting at the same instant both see
//! each other: both are refused, neither writes.
//!
//! Beyond QEMU's bytes, a vnvme holder also locks one byte that names it (process,
//! what the file is to it, which namespace), so a refusal can say who holds the
//! file; and a writer that shares on purpose (the controllers of one subsystem)
//! locks one byte for its group, so only that group's writers share. Holders that
//! are not vnvme (QEMU) are named by the processes that have the file open.
#![forbid(unsafe_code)]

use std::fmt;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::MetadataExt;

use nix::fcntl::{fcntl, FcntlArg};

/// Where the bytes a user holds for each permission it has begin (QEMU's layout).
const PERM_BASE: i64 = 100;
/// Where the bytes a user holds for each permission it does not share begin.
const SHARED_BASE: i64 = 200;
/// Where the bytes that name a vnvme holder are: one per (pid, role, namespace).
const HOLDER_BASE: i64 = 1 << 48;
/// How many of them there are: a 22-bit pid, an 8-bit role, a 16-bit namespace.
const HOLDER_SPAN: i64 = 1 << 46;
/// Where the bytes of the groups of writers that share on purpose are.
const GROUP_BASE: i64 = 1 << 47;
/// How many groups there are (a group is a hash of its name).
const GROUP_SPAN: i64 = 1 << 32;
/// The most holders a refusal names.
const MAX_NAMED: usize = 4;

/// The permissions of QEMU's layout, as their bit numbers (the byte's offset
/// from a base).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Perm {
    /// Reading the file and trusting what is read.
    ConsistentRead = 0,
    Write = 1,
    /// Writes that leave the data as it was.
    WriteUnchanged = 2,
    Resize = 3,
}

impl Perm {
    const ALL: [Perm; 4] = [Perm::ConsistentRead, Perm::Write, Perm::WriteUnchanged, Perm::Resize];
}

/// How a file is used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Read only: shared with other readers; no one may write while it is held.
    Read,
    /// The only writer: no other writer and no reader that refuses writers.
    Write,
    /// One of a group of writers that share the file on purpose (the controllers
    /// of one subsystem, named by the group): a writer of another group, or an
    /// only writer, is refused.
    SharedWrite { group: String },
}

impl Mode {
    /// The permissions it has.
    fn uses(&self) -> &'static [Perm] {
        match self {
            Mode::Read => &[Perm::ConsistentRead],
            Mode::Write | Mode::SharedWrite { .. } => &Perm::ALL,
        }
    }

    /// The permissions it does not let others have.
    fn unshares(&self) -> &'static [Perm] {
        match self {
            Mode::Read | Mode::Write => &[Perm::Write, Perm::Resize],
            Mode::SharedWrite { .. } => &[],
        }
    }

    /// Its group's byte, for a writer that shares.
    fn group(&self) -> Option<i64> {
        match self {
            Mode::SharedWrite { group } => Some(GROUP_BASE + group_hash(group)),
            _ => None,
        }
    }
}

/// What a file is to the vnvme process that holds it (named in refusals).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Role {
    /// A namespace's data: an image file or a block device.
    Data = 1,
    /// A zoned namespace's write pointers.
    ZoneState = 2,
    /// A namespace's metadata.
    Metadata = 3,
    /// A namespace's reservations, shared by a subsystem's controllers.
    Reservations = 4,
    /// A namespace pool's state file.
    PoolState = 5,
    /// The data of a namespace of a pool.
    PoolData = 6,
    /// The stats file.
    Stats = 7,
    /// A file of results written once (`vnvme perf --json`).
    Output = 8,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 8] = [
        Role::Data,
        Role::ZoneState,
        Role::Metadata,
        Role::Reservations,
        Role::PoolState,
        Role::PoolData,
        Role::Stats,
        Role::Output,
    ];

    fn from_u8(v: u8) -> Option<Role> {
        Role::ALL.into_iter().find(|r| *r as u8 == v)
    }

    /// What the file is, in a sentence ("its data", "its zone state").
    pub fn describe(self) -> &'static str {
        match self {
            Role::Data => "data",
            Role::ZoneState => "zone state file",
            Role::Metadata => "metadata file",
            Role::Reservations => "reservation state file",
            Role::PoolState => "namespace pool's state file",
            Role::PoolData => "data (a namespace pool's)",
            Role::Stats => "stats file",
            Role::Output => "results file",
        }
    }
}

/// A lock to take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub mode: Mode,
    pub role: Role,
    /// The namespace the file belongs to, if any.
    pub nsid: Option<u32>,
    /// Processes whose hold is no conflict: the process an upgrade takes over
    /// from, which holds every file until it exits.
    pub accept: Vec<u32>,
    /// Every vnvme holder's hold is no conflict: a migration's destination shares
    /// the files with its source (a holder that is not vnvme is refused still).
    pub share_with_vnvme: bool,
}

impl Request {
    /// The only writer of the file, as `role` of namespace `nsid`.
    pub fn write(role: Role, nsid: Option<u32>) -> Self {
        Request { mode: Mode::Write, role, nsid, accept: Vec::new(), share_with_vnvme: false }
    }

    fn accepts(&self, h: &Holder) -> bool {
        self.share_with_vnvme || self.accept.contains(&h.pid)
    }
}

/// How one process locks the files it serves: shared with a group of writers
/// (the controllers of its subsystem) or not, and whose hold is no conflict.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// The group its writers share files with (None: it is their only writer).
    pub group: Option<String>,
    /// See [`Request::accept`].
    pub accept: Vec<u32>,
    /// See [`Request::share_with_vnvme`].
    pub share_with_vnvme: bool,
}

impl Policy {
    /// A file the group shares, as `role` of namespace `nsid`.
    pub fn shared(&self, role: Role, nsid: Option<u32>) -> Request {
        let mode = match &self.group {
            Some(g) => Mode::SharedWrite { group: g.clone() },
            None => Mode::Write,
        };
        Request { mode, role, nsid, accept: self.accept.clone(), share_with_vnvme: self.share_with_vnvme }
    }

    /// A file read and never written, as `role` of namespace `nsid`: shared with
    /// other readers, and no one writes it meanwhile.
    pub fn reader(&self, role: Role, nsid: Option<u32>) -> Request {
        Request {
            mode: Mode::Read,
            role,
            nsid,
            accept: self.accept.clone(),
            share_with_vnvme: self.share_with_vnvme,
        }
    }

    /// A file only this process may write, whatever its group: one whose state
    /// it keeps in memory too (a zoned namespace's write pointers).
    pub fn only(&self, role: Role, nsid: Option<u32>) -> Request {
        Request {
            mode: Mode::Write,
            role,
            nsid,
            accept: self.accept.clone(),
            share_with_vnvme: self.share_with_vnvme,
        }
    }
}

/// A vnvme process that holds a file, as its byte names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub role: Option<Role>,
    pub nsid: Option<u32>,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.pid == std::process::id() {
            write!(f, "this process")?;
        } else {
            write!(f, "vnvme pid {}", self.pid)?;
        }
        match (self.nsid, self.role) {
            (Some(n), Some(r)) => write!(f, " (namespace {n}'s {})", r.describe()),
            (None, Some(Role::Data)) => write!(f, " (a namespace's data)"),
            (None, Some(r)) => write!(f, " (its {})", r.describe()),
            _ => Ok(()),
        }
    }
}

/// Why a file is in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conflict {
    /// Another user writes it (or may), and this one needs to be the only writer.
    Written,
    /// Another user reads it and lets no one write it (or is its only writer).
    Guarded,
    /// Writers of another group share it.
    OtherGroup,
}

/// A file held by someone else, and who.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InUse {
    pub conflict: Conflict,
    /// The vnvme holders (at most a few).
    pub holders: Vec<Holder>,
    /// Other processes that have the file open (pid, command name), when no
    /// vnvme holder is named: QEMU, or another program that locks as it does.
    pub others: Vec<(u32, String)>,
}

impl InUse {
    /// Whether every holder is named and its process has exited.
    pub fn holders_exited(&self) -> bool {
        self.others.is_empty() && !self.holders.is_empty() && self.holders.iter().all(|h| !alive(h.pid))
    }

    /// Whether every holder is named, and is accepted by `req` or has exited.
    fn holders_exited_or(&self, req: &Request) -> bool {
        self.others.is_empty()
            && self.holders.iter().any(|h| !req.accepts(h))
            && self.holders.iter().all(|h| req.accepts(h) || !alive(h.pid))
    }

    /// Whether every holder is this process.
    pub fn only_this_process(&self) -> bool {
        !self.holders.is_empty()
            && self.others.is_empty()
            && self.holders.iter().all(|h| h.pid == std::process::id())
    }
}

impl fmt::Display for InUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.conflict {
            Conflict::Written => "in use by a writer",
            Conflict::Guarded => "in use, and its user lets no one else write it",
            Conflict::OtherGroup => "shared by the controllers of another subsystem",
        };
        write!(f, "{what}: ")?;
        if !self.holders.is_empty() {
            let names: Vec<String> = self.holders.iter().map(Holder::to_string).collect();
            write!(f, "{}", names.join("; "))?;
            if self.holders_exited() {
                write!(
                    f,
                    ", which has exited, yet its files are still open (the kernel has not closed them)"
                )?;
            }
            return Ok(());
        }
        if self.others.is_empty() {
            return write!(f, "a process this one cannot see (another user's, or in another PID namespace)");
        }
        let names: Vec<String> =
            self.others.iter().map(|(pid, comm)| format!("pid {pid} ({comm})")).collect();
        write!(f, "{} (not vnvme: QEMU, or a program that locks images as it does)", names.join(", "))
    }
}

/// Why a lock was not taken.
#[derive(Debug)]
pub enum LockError {
    /// Someone else holds the file.
    InUse(InUse),
    /// The file system (or the sandbox) refused the lock calls themselves.
    Unsupported(std::io::Error),
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockError::InUse(u) => u.fmt(f),
            LockError::Unsupported(e) => write!(f, "cannot be locked ({e})"),
        }
    }
}

impl std::error::Error for LockError {}

/// Locks the open file `file` (open for reading: the locks are read locks) as
/// `req` says, for as long as it stays open (its last descriptor, in any
/// process, closed). On a conflict nothing of this call's
/// stays locked. Locking the same open file again changes nothing that was held.
///
/// A holder whose process has exited can still hold a file for a moment: an
/// io_uring ring's files are released by the kernel after the process is gone.
/// Such a hold is waited out (up to [`EXITED_WAIT`]).
pub fn lock(file: &impl AsFd, req: &Request) -> Result<(), LockError> {
    let file = file.as_fd();
    let deadline = std::time::Instant::now() + EXITED_WAIT;
    loop {
        match lock_once(file, req) {
            Err(LockError::InUse(u)) if u.holders_exited_or(req) && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            r => return r,
        }
    }
}

/// How long a hold of a process that has exited is waited out.
pub const EXITED_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn lock_once(file: BorrowedFd<'_>, req: &Request) -> Result<(), LockError> {
    let mut held = Vec::new();
    for p in req.mode.uses() {
        held.push(PERM_BASE + *p as i64);
    }
    for p in req.mode.unshares() {
        held.push(SHARED_BASE + *p as i64);
    }
    held.extend(req.mode.group());
    held.push(HOLDER_BASE + holder_value(std::process::id(), req.role, req.nsid));
    for &b in &held {
        set(file, libc::F_RDLCK, b, 1).map_err(LockError::Unsupported)?;
    }
    match conflict(file, req) {
        Ok(None) => Ok(()),
        Ok(Some(c)) => {
            for &b in &held {
                let _ = set(file, libc::F_UNLCK, b, 1);
            }
            Err(LockError::InUse(c))
        }
        Err(e) => {
            for &b in &held {
                let _ = set(file, libc::F_UNLCK, b, 1);
            }
            Err(LockError::Unsupported(e))
        }
    }
}

/// The vnvme holders of `file` other than this open of it (at most a few).
pub fn holders(file: &impl AsFd) -> std::io::Result<Vec<Holder>> {
    let file = file.as_fd();
    let mut out = Vec::new();
    let mut from = HOLDER_BASE;
    while out.len() < MAX_NAMED {
        let Some(start) = probe(file, from, HOLDER_BASE + HOLDER_SPAN - from)? else { break };
        out.push(decode_holder(start - HOLDER_BASE));
        from = start + 1;
    }
    Ok(out)
}

/// The conflict `req` would have with the other holders of `file`, who are named.
fn conflict(file: BorrowedFd<'_>, req: &Request) -> std::io::Result<Option<InUse>> {
    let mut found = None;
    for p in req.mode.unshares() {
        if probe(file, PERM_BASE + *p as i64, 1)?.is_some() {
            found = Some(Conflict::Written);
            break;
        }
    }
    if found.is_none() {
        for p in req.mode.uses() {
            if probe(file, SHARED_BASE + *p as i64, 1)?.is_some() {
                found = Some(Conflict::Guarded);
                break;
            }
        }
    }
    if let (None, Some(mine)) = (found, req.mode.group()) {
        let before = probe(file, GROUP_BASE, mine - GROUP_BASE)?;
        let after = probe(file, mine + 1, GROUP_BASE + GROUP_SPAN - mine - 1)?;
        if before.is_some() || after.is_some() {
            found = Some(Conflict::OtherGroup);
        }
    }
    let Some(conflict) = found else { return Ok(None) };
    let holders = holders(&file)?;
    if !holders.is_empty() && holders.iter().all(|h| req.accepts(h)) {
        return Ok(None);
    }
    let others = if holders.is_empty() { openers(file) } else { Vec::new() };
    Ok(Some(InUse { conflict, holders, others }))
}

/// The program a process runs, by name: its command name, or, for a program run
/// through the dynamic loader (`ld-linux ... /path/qemu-nbd`, as a relocated
/// QEMU is), the program the loader runs.
fn program(proc_dir: &std::path::Path) -> String {
    let comm = std::fs::read_to_string(proc_dir.join("comm")).unwrap_or_default().trim().to_string();
    if !comm.starts_with("ld-linux") && !comm.starts_with("ld.so") {
        return comm;
    }
    let cmdline = std::fs::read(proc_dir.join("cmdline")).unwrap_or_default();
    let mut args = cmdline.split(|&b| b == 0).skip(1).map(|a| String::from_utf8_lossy(a).into_owned());
    while let Some(a) = args.next() {
        match a.as_str() {
            // The loader's options that take a value.
            "--library-path" | "--argv0" | "--preload" | "--audit" => {
                args.next();
            }
            _ if a.starts_with("--") => {}
            _ => return a.rsplit('/').next().unwrap_or(&a).to_string(),
        }
    }
    comm
}

/// Whether process `pid` exists and has not exited (a zombie, exited and not yet
/// reaped by its parent, has closed its descriptors).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "PID (COMM) STATE ...": the state follows the last ')'.
        Ok(stat) => stat.rsplit_once(')').is_none_or(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(e) => e.kind() != std::io::ErrorKind::NotFound,
    }
}

/// Sets (or clears, with `F_UNLCK`) this open file's lock of `len` bytes at `start`.
fn set(file: BorrowedFd<'_>, kind: libc::c_int, start: i64, len: i64) -> std::io::Result<()> {
    let fl = flock(kind, start, len);
    fcntl(file, FcntlArg::F_OFD_SETLK(&fl)).map(drop).map_err(std::io::Error::from)
}

/// The start of a lock another open file holds in `len` bytes at `start`, if any.
fn probe(file: BorrowedFd<'_>, start: i64, len: i64) -> std::io::Result<Option<i64>> {
    let mut fl = flock(libc::F_WRLCK, start, len);
    fcntl(file, FcntlArg::F_OFD_GETLK(&mut fl)).map_err(std::io::Error::from)?;
    Ok((fl.l_type != libc::F_UNLCK as libc::c_short).then_some(fl.l_start))
}

fn flock(kind: libc::c_int, start: i64, len: i64) -> libc::flock {
    libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: start,
        l_len: len,
        // An OFD lock request must give 0 here.
        l_pid: 0,
    }
}

/// The offset (from [`HOLDER_BASE`]) of the byte that names a holder.
fn holder_value(pid: u32, role: Role, nsid: Option<u32>) -> i64 {
    let nsid = nsid.map_or(0, |n| n.min(0xffff)) as i64;
    ((pid as i64 & 0x3f_ffff) << 24) | ((role as i64) << 16) | nsid
}

fn decode_holder(v: i64) -> Holder {
    let nsid = (v & 0xffff) as u32;
    Holder { pid: (v >> 24) as u32, role: Role::from_u8((v >> 16) as u8), nsid: (nsid != 0).then_some(nsid) }
}

/// A group's byte (from [`GROUP_BASE`]): FNV-1a of its name, 32 bits.
fn group_hash(name: &str) -> i64 {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    h as i64
}

/// The processes other than this one that have `file` open (at most a few), read
/// from /proc; none if /proc cannot be read (another user's processes, a sandbox).
fn openers(file: BorrowedFd<'_>) -> Vec<(u32, String)> {
    let Ok(st) = nix::sys::stat::fstat(file) else { return Vec::new() };
    let key = (st.st_dev, st.st_ino);
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else { return out };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == std::process::id() {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else { continue };
        let open =
            fds.flatten().any(|fd| std::fs::metadata(fd.path()).is_ok_and(|m| (m.dev(), m.ino()) == key));
        if open {
            out.push((pid, program(&p.path())));
            if out.len() == MAX_NAMED {
                break;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
