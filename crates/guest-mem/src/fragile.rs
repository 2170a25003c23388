//! Mappings of files that may shrink under us, survived.
//!
//! A shared mapping of a file reads and writes the file's pages; once the file is
//! truncated below a page, touching that page raises SIGBUS, which kills the
//! process, or, once a seccomp filter refuses `rt_sigaction`, leaves it retrying
//! the faulting access forever (the runtime's handler could not put the default
//! action back). A file another process can truncate (a state file every
//! controller of a subsystem maps, an operator's `truncate -s 0`) must not be able
//! to do either: a mapping made [`Mapping::from_fd_fragile`](crate::Mapping) is
//! registered here, and a SIGBUS inside it is answered by mapping a private zero
//! page over the faulting page and marking the mapping lost. The access then goes
//! on, reading zeroes (or writing to memory no one sees), and its owner asks
//! [`Slot::lost`] after each access it relies on. A SIGBUS anywhere else is a crash
//! as before: the handler puts the default action back and returns, and the
//! access faults again, now fatally.
//!
//! The registry is a fixed table of slots, read by the handler without locks: a
//! slot holds a mapping's start and end from just after its mmap to just before its
//! munmap, so an address inside a live slot is inside a live mapping. A faulting
//! access holds a reference to its mapping, so the slot it hits cannot be freed
//! under the handler.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Once;

/// How many fragile mappings may exist at once: a state file each, and each DMA
/// region of a client's memory that could shrink (SPDK's memfds, a hugetlbfs file).
pub const SLOTS: usize = 4096;

struct Entry {
    start: AtomicUsize,
    end: AtomicUsize,
    lost: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Entry =
    Entry { start: AtomicUsize::new(0), end: AtomicUsize::new(0), lost: AtomicBool::new(false) };
static TABLE: [Entry; SLOTS] = [FREE; SLOTS];
static PAGE: AtomicUsize = AtomicUsize::new(4096);
static INSTALL: Once = Once::new();
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// Some fragile mapping was ever lost: the one flag every access reads (a static,
/// false but for a broken client), so that only then is its own mapping asked.
static ANY_LOST: AtomicBool = AtomicBool::new(false);

/// Whether any fragile mapping of this process was ever lost (a cheap test before
/// [`Slot::lost`]).
#[inline]
pub fn any_lost() -> bool {
    ANY_LOST.load(Ordering::Relaxed)
}

/// A fragile mapping's place in the table, freed on drop.
#[derive(Debug)]
pub struct Slot(usize);

impl Slot {
    /// Registers `[start, start + len)`; None if the table is full or the
    /// handler could not be installed (the mapping is then an ordinary one).
    pub(crate) fn register(start: usize, len: usize) -> Option<Slot> {
        install();
        if !INSTALLED.load(Ordering::Acquire) {
            return None;
        }
        for (i, e) in TABLE.iter().enumerate() {
            if e.start.compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                e.lost.store(false, Ordering::Release);
                e.end.store(start + len, Ordering::Release);
                e.start.store(start, Ordering::Release);
                return Some(Slot(i));
            }
        }
        None
    }

    /// Whether an access to the mapping faulted (its file shrank under it): what
    /// was read from it since may be zeroes, and what was written went nowhere.
    #[inline]
    pub fn lost(&self) -> bool {
        TABLE[self.0].lost.load(Ordering::Acquire)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let e = &TABLE[self.0];
        // Out of the handler's sight before the caller unmaps.
        e.start.store(usize::MAX, Ordering::Release);
        e.end.store(0, Ordering::Release);
        e.start.store(0, Ordering::Release);
    }
}

/// Installs the SIGBUS handler (once per process; before a seccomp filter that
/// refuses `rt_sigaction` is installed).
pub fn install() {
    INSTALL.call_once(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            PAGE.store(page as usize, Ordering::Relaxed);
        }
        // A zeroed sigaction with our handler, SA_SIGINFO for the address, and
        // SA_NODEFER so a second fault (another thread's) is taken too.
        // SAFETY: sigaction is plain data; zero is a valid empty mask and flags.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_sigbus as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
        // SAFETY: installs a handler that only reads atomics and calls mmap and
        // sigaction, both async-signal-safe system calls.
        let ok = unsafe { libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()) } == 0;
        INSTALLED.store(ok, Ordering::Release);
    });
}

extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo with SA_SIGINFO.
    let addr = unsafe { (*info).si_addr() } as usize;
    for e in &TABLE {
        let start = e.start.load(Ordering::Acquire);
        if start == 0 || start == usize::MAX || addr < start || addr >= e.end.load(Ordering::Acquire) {
            continue;
        }
        let page = PAGE.load(Ordering::Relaxed);
        let at = addr & !(page - 1);
        // A private zero page over the one that faulted: inside a live mapping of
        // ours (the faulting access holds it), which it replaces, page for page.
        // SAFETY: [at, at + page) lies within the registered mapping.
        let p = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            e.lost.store(true, Ordering::Release);
            ANY_LOST.store(true, Ordering::Release);
            return;
        }
        break;
    }
    // Not ours (or not recoverable): the default action, and the access faults
    // again, fatally, as if no handler had been here.
    // SAFETY: a zeroed sigaction is SIG_DFL with an empty mask.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use crate::Mapping;

    fn file(name: &str, len: u64) -> (std::path::PathBuf, std::fs::File) {
        let p = std::env::temp_dir().join(format!("guest-mem-fragile-{}-{name}", std::process::id()));
        let f =
            std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&p).unwrap();
        f.set_len(len).unwrap();
        (p, f)
    }

    fn read_u32(m: &Mapping, off: u64) -> u32 {
        // SAFETY: off + 4 <= len; the mapping is alive and readable.
        unsafe { std::ptr::read_volatile(m.ptr_at(off).cast::<u32>()) }
    }

    #[test]
    fn a_fragile_mapping_survives_its_file_shrinking() {
        let (p, f) = file("survives", 8192);
        std::os::unix::fs::FileExt::write_all_at(&f, &7u32.to_le_bytes(), 4096).unwrap();
        let m = Mapping::from_fd_fragile(f.as_fd(), 0, 8192, true).unwrap();
        assert_eq!(read_u32(&m, 4096), 7);
        assert!(!m.lost());
        f.set_len(0).unwrap();
        // Past the end now: zeroes, and said.
        assert_eq!(read_u32(&m, 4096), 0);
        assert!(m.lost());
        drop(m);
        // Its slot is free again, the next one starts whole.
        f.set_len(8192).unwrap();
        let again = Mapping::from_fd_fragile(f.as_fd(), 0, 8192, true).unwrap();
        assert!(!again.lost());
        std::fs::remove_file(&p).unwrap();
    }

    /// Outside a fragile mapping, a SIGBUS is the crash it always was.
    #[test]
    fn a_sigbus_anywhere_else_still_kills() {
        super::install();
        let (p, f) = file("kills", 8192);
        let m = Mapping::from_fd(f.as_fd(), 0, 8192, true).unwrap();
        f.set_len(0).unwrap();
        // SAFETY: the child only touches the mapping and exits; the parent waits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let none = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            // SAFETY: no core file from a crash made on purpose.
            unsafe { libc::setrlimit(libc::RLIMIT_CORE, &none) };
            let _ = read_u32(&m, 4096);
            // SAFETY: leaves the child at once, running nothing of the test's.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGBUS, "status {status:#x}");
        std::fs::remove_file(&p).unwrap();
    }
}
