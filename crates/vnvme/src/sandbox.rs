//! The device process's sandbox: once `vnvme serve` has started up (namespaces'
//! backends opened, I/O worker threads and their backend queues created, the socket
//! bound, the stats file written once), it can drop to an unprivileged user and then
//! confines every thread to a seccomp-bpf allowlist of the system calls serving needs.
//!
//! What a hostile guest or VMM that took over the process is left with: its open
//! descriptors and the calls below. It cannot start programs (no execve, no clone:
//! the threads exist by then), open sockets or connect anywhere (no socket, connect,
//! bind), trace or signal other processes (no ptrace, process_vm_*, kill; tgkill only
//! to itself), map executable memory (mmap and mprotect without PROT_EXEC), or open
//! paths, except to rewrite the stats file and, with `--pool`, the pool's files
//! (below, and the limits after the table).
//!
//! The filter is built with rust-vmm's `seccompiler` and installed with TSYNC on
//! every thread of the process at once (workers, the stats writer, the `nvme://`
//! health watcher); it sets no_new_privs first. Threads created later inherit it.
//!
//! A call outside the allowlist fails with EPERM rather than killing the process:
//! "refused", as an access-control check would refuse it. Every caller already
//! handles errors, so a call we forgot to allow shows up as a logged error naming
//! the operation (and `--sandbox off` confirms it), not as a SIGSYS with no message;
//! and a compromised process gains nothing from an error it can see. `strace -f`
//! shows each refused call as `-1 EPERM`.
//!
//! The allowlist, collected with `strace -f` of `vnvme serve` after start-up in every
//! mode (doorbells trapped, eventfd and mapped; workers and inline; each backend):
//!
//! | who                          | needs                                                        |
//! |------------------------------|--------------------------------------------------------------|
//! | every mode                   | read write readv writev close; recvmsg recvfrom sendmsg sendto accept4 shutdown; setsockopt (SOL_SOCKET SO_RCVTIMEO/SO_SNDTIMEO only); epoll_create1 epoll_ctl epoll_(p)wait (p)poll; eventfd2 timerfd_*; mmap mprotect (never PROT_EXEC) munmap mremap madvise brk; futex sched_yield sched_getaffinity; clock_gettime clock_nanosleep nanosleep restart_syscall getrandom; fstat statx newfstatat lseek; fcntl (F_GETFD F_SETFD F_GETFL F_SETFL F_DUPFD_CLOEXEC F_GET_SEALS F_OFD_SETLK F_OFD_GETLK: the locks on the files it writes); readlink(at) (the descriptor-kind check reads /proc/self/fd links); thread start and exit (set_robust_list rseq sigaltstack rt_sigprocmask rt_sigtimedwait (the signal thread) rt_sigaction (SIGSEGV and SIGBUS only: a fault's handler making it fatal) prctl PR_SET_NAME/PR_GET_AUXV gettid getpid exit exit_group rt_sigreturn; tgkill on itself, for abort) |
//! | doorbells trapped/eventfd/mapped | nothing more: the ioeventfds, the doorbell page memfd and the interrupt eventfds exist or arrive as descriptors |
//! | `ram:`                       | ftruncate and fallocate (its memory is a memfd: resized, and holes punched where the guest discards) |
//! | `null:`                      | nothing more                                                 |
//! | reservations (`resv=`)       | flock pread64 pwrite64 fdatasync ftruncate (the shared state file: locked, read and written in place, synced, sized) |
//! | metadata (`ms=`, `meta=`)     | pread64 pwrite64 fdatasync fallocate ftruncate (its metadata file or memfd: read and written in place, holes punched, emptied by a Format) |
//! | `file:` (both engines)       | pread64 pwrite64 preadv pwritev fsync fdatasync fallocate copy_file_range |
//! | `file:` on io_uring          | io_uring_enter (rings are set up at start-up; no io_uring_setup or io_uring_register) |
//! | `nvme:///path.sock`          | nothing more: its connection, queues and DMA memory are set up at start-up; a client's memory is passed on with sendmsg |
//! | `nvme://BDF` (kernel VFIO)   | ioctl: VFIO_DEVICE_SET_IRQS, VFIO_DEVICE_RESET, VFIO_IOMMU_MAP_DMA, VFIO_IOMMU_UNMAP_DMA only (a client's memory is mapped for the device as it arrives) |
//! | `--pool`                     | openat (read-write, or creating a new file) and unlinkat (no flags) only with the pool directory's descriptor (held open since the start), flock, ftruncate and the `file:` calls: namespaces made, opened and deleted there, its state file locked, read and written |
//! | `--stats-file`               | openat with exactly O_RDWR\|O_CREAT\|O_EXCL\|O_CLOEXEC (a new file, never one that exists) and rename(at) (the file is replaced atomically twice a second) |
//! | its sockets                  | unlinkat with the descriptor of a socket's own directory (held open since the bind) and no flags: at its end the server removes the socket files it bound, if still its own |
//! | `nbd://`                     | socket (AF_UNIX, AF_INET, AF_INET6, SOCK_STREAM only), connect, getsockopt, setsockopt TCP_NODELAY: a lost connection to the NBD server is made again (to the address resolved at start-up; no name lookups) |
//! | `rbd:`                       | librados' threads: socket (AF_UNIX, AF_INET, AF_INET6, SOCK_STREAM only), connect, getsockopt getsockname getpeername, setsockopt (TCP_NODELAY, SO_KEEPALIVE, SO_RCVBUF, SO_SNDBUF, SO_PRIORITY, IP_TOS, IPV6_TCLASS), pipe2, uname, epoll_create, and new threads: clone only with CLONE_THREAD; clone3 (whose flags seccomp cannot read) fails ENOSYS through a second filter, so the C library falls back to clone. A new process, execve, datagram sockets stay refused |
//! | `--control`                  | memfd_create (adding a `ram:` namespace), what adding a `file:` namespace needs on either engine: openat (any flags), ftruncate, statfs fstatfs, io_uring_setup io_uring_register, and the `file:` calls above; and what `nbd://` needs, so an NBD export can be added (to an address: a host name would need a resolver, which is refused). `nvme://` cannot be added under the sandbox (its driver needs more) |
//!
//! Limits, stated plainly:
//! - seccomp cannot read path arguments: with `--stats-file` the process may create
//!   and replace files wherever its user may write, with `--control` open any
//!   file its user may open, and with `--pool` open, create or remove any file its
//!   user may (an absolute name, or `..`, is not held to the pool's directory by
//!   the descriptor check). `--user` bounds that (and every
//!   other path the process can reach); so does leaving `--stats-file` off.
//! - io_uring operations are not system calls: an io_uring backend's ring could be
//!   given any opcode (an open, a socket) without seccomp seeing it. Registering ring
//!   restrictions (IORING_REGISTER_RESTRICTIONS) in the backend would close this.
//! - kernel-VFIO `nvme://` could not be exercised here (no device): its entries come
//!   from reading the transport's code; no-IOMMU mode lets the device DMA anywhere,
//!   which no sandbox contains.
//! - Dropping to a user leaves the process non-dumpable (the kernel's doing), which
//!   also keeps same-user processes from ptracing it; reading its own `/proc/self/fd`
//!   links still works, as the kernel lets a process see its own descriptors.

use std::collections::BTreeMap;
use std::io;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};

/// `prctl(PR_GET_AUXV)` (Linux 6.4; not in every libc crate yet): reads the process's
/// own auxiliary vector.
const PR_GET_AUXV: u64 = 0x4155_5856;

/// What runs after start-up, beyond what every mode needs: each adds its own calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Needs {
    /// A `file:` namespace, on either engine.
    pub file: bool,
    /// A `file:` namespace on the io_uring engine.
    pub uring: bool,
    /// An `nvme://` namespace on a PCI function bound to vfio-pci.
    pub kernel_vfio: bool,
    /// `--stats-file`: the counters are rewritten (create, write, rename).
    pub stats_file: bool,
    /// `--control`: namespaces may be added and resized later, so what opening,
    /// creating and resizing a `file:` namespace on either engine needs.
    pub control: bool,
    /// An `nbd://` namespace: a lost connection is made again (stream sockets and
    /// connect, TCP_NODELAY).
    pub nbd: bool,
    /// A `ram:` namespace: its memfd is resized and has holes punched.
    pub ram: bool,
    /// A namespace with a metadata store (a file or a memfd): read and written in
    /// place, synced, holes punched, emptied by a Format.
    pub meta: bool,
    /// A namespace with a reservation state file: locked, read and written in
    /// place, synced, sized.
    pub resv: bool,
    /// An `rbd:` namespace: librados' own threads keep running (messenger, timers,
    /// finishers), open connections to OSDs and monitors as they need them, and start
    /// threads.
    pub rbd: bool,
    /// The namespace pool's directory (held open, `O_PATH`): its namespaces' files
    /// are created, opened and removed relative to it, and alone there.
    pub pool_dir: Option<i32>,
    /// The directories (held open, `O_PATH`) of the sockets this server bound: at
    /// its end it removes its own socket files there with `unlinkat`, allowed in
    /// these directories alone (see `vfio_user_server::socket_file`).
    pub socket_dirs: [Option<i32>; 3],
}

impl Needs {
    /// What either needs.
    pub fn union(self, o: Needs) -> Needs {
        Needs {
            file: self.file || o.file,
            uring: self.uring || o.uring,
            kernel_vfio: self.kernel_vfio || o.kernel_vfio,
            stats_file: self.stats_file || o.stats_file,
            control: self.control || o.control,
            nbd: self.nbd || o.nbd,
            rbd: self.rbd || o.rbd,
            ram: self.ram || o.ram,
            meta: self.meta || o.meta,
            resv: self.resv || o.resv,
            pool_dir: self.pool_dir.or(o.pool_dir),
            socket_dirs: if self.socket_dirs.iter().any(Option::is_some) {
                self.socket_dirs
            } else {
                o.socket_dirs
            },
        }
    }

    /// What the allowlist adds to every mode's, for people: "file:, io_uring,
    /// --stats-file" (or "nothing more").
    pub fn describe(&self) -> String {
        let parts: Vec<&str> = [
            (self.file, "file:"),
            (self.uring, "io_uring"),
            (self.kernel_vfio, "kernel VFIO"),
            (self.ram, "ram:"),
            (self.meta, "metadata"),
            (self.resv, "reservations"),
            (self.pool_dir.is_some(), "the namespace pool"),
            (self.nbd, "nbd://"),
            (self.rbd, "rbd:"),
            (self.stats_file, "--stats-file"),
            (self.control, "--control"),
            (self.socket_dirs.iter().any(Option::is_some), "removing its sockets at the end"),
        ]
        .into_iter()
        .filter_map(|(on, what)| on.then_some(what))
        .collect();
        if parts.is_empty() {
            "nothing more than every mode needs".into()
        } else {
            parts.join(", ")
        }
    }
}

/// One condition on argument `arg` (its low 32 bits: every argument checked here is
/// an int or a flag word).
fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> SeccompCondition {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).expect("argument index below 6")
}

fn rule(conds: Vec<SeccompCondition>) -> SeccompRule {
    SeccompRule::new(conds).expect("a rule has conditions")
}

/// Argument `arg` equals one of `values` (one rule each: the rules of a call are ORed).
fn one_of(arg: u8, values: &[u64]) -> Vec<SeccompRule> {
    values.iter().map(|&v| rule(vec![cond(arg, SeccompCmpOp::Eq, v)])).collect()
}

/// The allowlist for `needs`: system call number -> the rules under which it is
/// allowed (an empty list: always).
pub fn rules(needs: &Needs) -> BTreeMap<i64, Vec<SeccompRule>> {
    use libc::*;
    let mut m: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    let mut allow = |calls: &[c_long]| {
        for &c in calls {
            m.insert(c, Vec::new());
        }
    };
    // Messages, descriptors the peer hands us, eventfds and timers.
    allow(&[SYS_read, SYS_write, SYS_readv, SYS_writev, SYS_close]);
    allow(&[SYS_recvmsg, SYS_recvfrom, SYS_sendmsg, SYS_sendto, SYS_accept4, SYS_shutdown]);
    allow(&[SYS_epoll_create1, SYS_epoll_ctl, SYS_epoll_pwait, SYS_ppoll]);
    allow(&[SYS_eventfd2, SYS_timerfd_create, SYS_timerfd_settime, SYS_timerfd_gettime]);
    // Memory (executable mappings are refused below), threads and time.
    allow(&[SYS_munmap, SYS_mremap, SYS_madvise, SYS_brk]);
    allow(&[SYS_futex, SYS_sched_yield, SYS_sched_getaffinity, SYS_getrandom]);
    allow(&[SYS_clock_gettime, SYS_clock_nanosleep, SYS_nanosleep]);
    // An interrupted sleep resumes through restart_syscall: io_uring's task work
    // interrupts a thread that sleeps while its requests complete (refused, the sleep
    // failed with EPERM and std panicked).
    allow(&[SYS_restart_syscall]);
    allow(&[SYS_set_robust_list, SYS_rseq, SYS_sigaltstack, SYS_rt_sigprocmask, SYS_rt_sigreturn]);
    // The signal thread's sigwait (`signals`).
    allow(&[SYS_rt_sigtimedwait]);
    allow(&[SYS_gettid, SYS_getpid, SYS_exit, SYS_exit_group]);
    // Inspecting descriptors: fstat, seals, and the /proc/self/fd link of a client's
    // interrupt descriptor.
    allow(&[SYS_fstat, SYS_newfstatat, SYS_statx, SYS_lseek, SYS_readlinkat]);
    #[cfg(target_arch = "x86_64")]
    allow(&[SYS_epoll_wait, SYS_poll, SYS_readlink]);
    if needs.file || needs.control {
        allow(&[SYS_pread64, SYS_pwrite64, SYS_preadv, SYS_pwritev, SYS_fsync, SYS_fdatasync]);
        // Copy inside a file (copy_file_range); ns.add under --control may add one.
        allow(&[SYS_fallocate, SYS_copy_file_range]);
    }
    if needs.ram || needs.control {
        allow(&[SYS_ftruncate, SYS_fallocate]);
    }
    if needs.meta {
        allow(&[SYS_pread64, SYS_pwrite64, SYS_fdatasync, SYS_fallocate, SYS_ftruncate]);
    }
    if needs.resv || needs.control {
        allow(&[SYS_flock, SYS_pread64, SYS_pwrite64, SYS_fdatasync, SYS_ftruncate]);
    }
    if needs.pool_dir.is_some() {
        // Its state file (locked, read and written in place, synced, sized) and
        // its namespaces' files (the file: calls, made to their size).
        allow(&[SYS_flock, SYS_pread64, SYS_pwrite64, SYS_preadv, SYS_pwritev, SYS_fsync, SYS_fdatasync]);
        allow(&[SYS_fallocate, SYS_copy_file_range, SYS_ftruncate]);
    }
    if needs.uring || needs.control {
        allow(&[SYS_io_uring_enter]);
    }
    if needs.nbd || needs.control {
        allow(&[SYS_connect, SYS_getsockopt]);
    }
    if needs.control {
        // Opening a namespace's file (any path the user may open: see the header),
        // sizing it, asking its file system (tmpfs or not), and its io_uring rings.
        allow(&[
            SYS_memfd_create,
            SYS_openat,
            SYS_ftruncate,
            SYS_statfs,
            SYS_fstatfs,
            SYS_io_uring_setup,
            SYS_io_uring_register,
        ]);
    }
    if needs.stats_file {
        allow(&[SYS_renameat, SYS_renameat2]);
        #[cfg(target_arch = "x86_64")]
        allow(&[SYS_rename]);
    }

    if needs.nbd || needs.control {
        // Reconnecting to the NBD server (or, with --control, reaching one to add): a stream socket of the families a server
        // address can have (TCP: a non-blocking connect, polled, its SO_ERROR read).
        let stream = |domain: c_int| {
            rule(vec![
                cond(0, SeccompCmpOp::Eq, domain as u64),
                cond(1, SeccompCmpOp::MaskedEq(0xf), SOCK_STREAM as u64),
            ])
        };
        m.insert(SYS_socket, vec![stream(AF_UNIX), stream(AF_INET), stream(AF_INET6)]);
    }
    let no_exec = || vec![rule(vec![cond(2, SeccompCmpOp::MaskedEq(PROT_EXEC as u64), 0)])];
    m.insert(SYS_mmap, no_exec());
    m.insert(SYS_mprotect, no_exec());
    // And the open file description locks every file it writes is held with
    // (taken and probed by ns.add, and by each new stats file).
    let fcntl_cmds =
        [F_GETFD, F_SETFD, F_GETFL, F_SETFL, F_DUPFD_CLOEXEC, F_GET_SEALS, F_OFD_SETLK, F_OFD_GETLK];
    m.insert(SYS_fcntl, one_of(1, &fcntl_cmds.map(|c| c as u64)));
    let mut sockopts: Vec<SeccompRule> = [SO_RCVTIMEO, SO_SNDTIMEO]
        .iter()
        .map(|&o| {
            rule(vec![cond(1, SeccompCmpOp::Eq, SOL_SOCKET as u64), cond(2, SeccompCmpOp::Eq, o as u64)])
        })
        .collect();
    if needs.nbd || needs.control {
        sockopts.push(rule(vec![
            cond(1, SeccompCmpOp::Eq, IPPROTO_TCP as u64),
            cond(2, SeccompCmpOp::Eq, TCP_NODELAY as u64),
        ]));
    }
    m.insert(SYS_setsockopt, sockopts);
    // A thread names itself as it starts (the workers may still be starting); rustix
    // reads its own auxiliary vector lazily (vDSO lookup) on first use.
    m.insert(SYS_prctl, one_of(0, &[PR_SET_NAME as u64, PR_GET_AUXV]));
    // abort() signals its own process; no other.
    m.insert(SYS_tgkill, one_of(0, &[std::process::id() as u64]));
    // A fault's handler puts the default action back so the fault is fatal (the
    // runtime's for SIGSEGV, guest-mem's for a SIGBUS outside a mapping of a file
    // that may shrink): refused, the faulting access was retried forever, a
    // crashed server spinning at 100 % instead of dying (and being stood in for).
    m.insert(SYS_rt_sigaction, one_of(0, &[SIGSEGV as u64, SIGBUS as u64]));
    // At its end the server removes the socket files it bound: a name in one of
    // their directories, never a directory.
    // And a deleted namespace's file in the pool's directory.
    let dirs: Vec<SeccompRule> = needs
        .socket_dirs
        .iter()
        .chain(std::iter::once(&needs.pool_dir))
        .flatten()
        .map(|&fd| rule(vec![cond(0, SeccompCmpOp::Eq, fd as u64), cond(2, SeccompCmpOp::Eq, 0)]))
        .collect();
    if !dirs.is_empty() {
        m.insert(SYS_unlinkat, dirs);
    }

    if !needs.control {
        let mut opens = Vec::new();
        if needs.stats_file {
            // A new temporary file (never one that exists), which replaces the stats file.
            opens.extend(one_of(2, &[(O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC) as u64]));
        }
        if let Some(fd) = needs.pool_dir {
            // A namespace's file opened, or made, relative to the pool's directory,
            // in the two ways the pool does. seccomp sees the descriptor, not the
            // name: an absolute name or `..` would still leave the directory (see
            // the header).
            // rustix adds O_LARGEFILE to every open (the kernel's value, which the
            // C library's headers give as 0 on 64-bit): either way is allowed.
            let large = rustix::fs::OFlags::LARGEFILE.bits() as u64;
            for flags in [O_RDWR | O_CLOEXEC, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC] {
                opens.push(rule(vec![
                    cond(0, SeccompCmpOp::Eq, fd as u64),
                    cond(2, SeccompCmpOp::MaskedEq(!large & 0xffff_ffff), flags as u64),
                ]));
            }
        }
        if !opens.is_empty() {
            m.insert(SYS_openat, opens);
        }
    }
    if needs.kernel_vfio {
        m.insert(SYS_ioctl, one_of(1, &nvme_driver::vfio::RUNTIME_IOCTLS));
    }
    if needs.rbd {
        // librados' threads: connections to monitors and OSDs as they come and go
        // (stream sockets, TCP options the messenger sets, its own address), the
        // threads it starts (threads only: clone must carry CLONE_THREAD; clone3,
        // whose flags seccomp cannot read, is answered ENOSYS by `clone3_fallback` so
        // the C library falls back to clone), and the pipes its event loops use.
        let stream = |domain: c_int| {
            rule(vec![
                cond(0, SeccompCmpOp::Eq, domain as u64),
                cond(1, SeccompCmpOp::MaskedEq(0xf), SOCK_STREAM as u64),
            ])
        };
        m.insert(SYS_socket, vec![stream(AF_UNIX), stream(AF_INET), stream(AF_INET6)]);
        for c in
            [SYS_connect, SYS_getsockopt, SYS_getsockname, SYS_getpeername, SYS_pipe2, SYS_clone3, SYS_uname]
        {
            m.insert(c, Vec::new());
        }
        // A new client (an rbd: namespace added through --control) makes its event
        // loops with the old epoll_create.
        #[cfg(target_arch = "x86_64")]
        m.insert(SYS_epoll_create, Vec::new());
        m.insert(
            SYS_clone,
            vec![rule(vec![cond(0, SeccompCmpOp::MaskedEq(CLONE_THREAD as u64), CLONE_THREAD as u64)])],
        );
        let opt = |level: c_int, name: c_int| {
            rule(vec![cond(1, SeccompCmpOp::Eq, level as u64), cond(2, SeccompCmpOp::Eq, name as u64)])
        };
        let sockopts = m.entry(SYS_setsockopt).or_default();
        if !sockopts.is_empty() {
            sockopts.extend([
                opt(IPPROTO_TCP, TCP_NODELAY),
                opt(SOL_SOCKET, SO_KEEPALIVE),
                opt(SOL_SOCKET, SO_RCVBUF),
                opt(SOL_SOCKET, SO_SNDBUF),
                opt(SOL_SOCKET, SO_PRIORITY),
                opt(IPPROTO_IP, IP_TOS),
                opt(IPPROTO_IPV6, IPV6_TCLASS),
            ]);
        }
    }
    m
}

/// With `rbd:`, a second filter: clone3 fails with ENOSYS (its flags live in memory,
/// where seccomp cannot check CLONE_THREAD), so glibc's pthread_create falls back to
/// clone, which the allowlist checks. Everything else passes to the allowlist.
fn clone3_fallback() -> io::Result<BpfProgram> {
    let arch = std::env::consts::ARCH.try_into().map_err(seccomp_err)?;
    let rules = BTreeMap::from([(libc::SYS_clone3, Vec::new())]);
    let f = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::ENOSYS as u32), arch)
        .map_err(seccomp_err)?;
    f.try_into().map_err(seccomp_err)
}

/// The compiled filter: the allowlist for `needs`, everything else refused with EPERM.
pub fn filter(needs: &Needs) -> io::Result<BpfProgram> {
    let arch = std::env::consts::ARCH.try_into().map_err(seccomp_err)?;
    let f = SeccompFilter::new(
        rules(needs),
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
        arch,
    )
    .map_err(seccomp_err)?;
    f.try_into().map_err(seccomp_err)
}

/// Sets no_new_privs and installs the allowlist for `needs` on every thread of the
/// process. Irreversible.
pub fn install(needs: &Needs) -> io::Result<()> {
    let prog = filter(needs)?;
    if needs.rbd {
        // First (installing a filter is itself refused once the allowlist is in):
        // both filters run on every call, and an ERRNO from either wins over ALLOW.
        seccompiler::apply_filter_all_threads(&clone3_fallback()?).map_err(seccomp_err)?;
    }
    seccompiler::apply_filter_all_threads(&prog).map_err(seccomp_err)
}

fn seccomp_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("seccomp: {e}"))
}

/// A user to drop to, looked up (and the privilege to do so checked) before anything
/// is opened, so a mistake fails at once.
#[derive(Debug)]
pub struct DropTo(nix::unistd::User);

impl DropTo {
    /// Looks `name` up; refuses unless the process runs as root.
    pub fn lookup(name: &str) -> io::Result<DropTo> {
        if !nix::unistd::geteuid().is_root() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "--user {name}: only root can change user (start vnvme serve as root, or omit --user)"
                ),
            ));
        }
        match nix::unistd::User::from_name(name) {
            Ok(Some(u)) => Ok(DropTo(u)),
            Ok(None) => Err(io::Error::new(io::ErrorKind::NotFound, format!("--user {name}: no such user"))),
            Err(e) => Err(io::Error::other(format!("--user {name}: {e}"))),
        }
    }

    /// Changes every thread to the user's uid, gid and supplementary groups (glibc
    /// applies set*id to all threads), and checks root cannot be regained.
    pub fn apply(&self) -> io::Result<()> {
        use nix::unistd::{initgroups, setgid, setuid, Uid};
        let u = &self.0;
        let ctx = |what: &str, e: nix::Error| io::Error::other(format!("--user {}: {what}: {e}", u.name));
        let name = std::ffi::CString::new(u.name.as_str()).map_err(io::Error::other)?;
        initgroups(&name, u.gid).map_err(|e| ctx("initgroups", e))?;
        setgid(u.gid).map_err(|e| ctx("setgid", e))?;
        setuid(u.uid).map_err(|e| ctx("setuid", e))?;
        if !u.uid.is_root() && setuid(Uid::from_raw(0)).is_ok() {
            return Err(io::Error::other(format!("--user {}: root could be regained", u.name)));
        }
        Ok(())
    }

    /// Runs `f` on this thread with this user's rights (its effective uid and gid
    /// and its groups), then root's again: what a process running as the user
    /// could open, `f` can, and nothing more. This thread only (the system calls
    /// themselves, not the C library's, which change every thread); the real and
    /// saved ids stay root, which is how root comes back.
    pub fn with_rights<T>(&self, f: impl FnOnce() -> T) -> io::Result<T> {
        use rustix::process::{Gid, Uid};
        use rustix::thread::{set_thread_groups, set_thread_res_gid, set_thread_res_uid};
        let u = &self.0;
        let ctx =
            |what: &str, e: rustix::io::Errno| io::Error::other(format!("--user {}: {what}: {e}", u.name));
        let name = std::ffi::CString::new(u.name.as_str()).map_err(io::Error::other)?;
        let theirs: Vec<Gid> = nix::unistd::getgrouplist(&name, u.gid)
            .map_err(io::Error::other)?
            .iter()
            .map(|g| Gid::from_raw(g.as_raw()))
            .collect();
        let ours: Vec<Gid> = nix::unistd::getgroups()
            .map_err(io::Error::other)?
            .iter()
            .map(|g| Gid::from_raw(g.as_raw()))
            .collect();
        set_thread_groups(&theirs).map_err(|e| ctx("setgroups", e))?;
        let became = set_thread_res_gid(None, Gid::from_raw(u.gid.as_raw()), None)
            .and_then(|()| set_thread_res_uid(None, Uid::from_raw(u.uid.as_raw()), None));
        let r = became.is_ok().then(f);
        // Back to root, whatever happened: every step, each failure said.
        let back = set_thread_res_uid(None, Uid::ROOT, None)
            .and_then(|()| set_thread_res_gid(None, Gid::ROOT, None))
            .and_then(|()| set_thread_groups(&ours));
        back.map_err(|e| ctx("taking root's rights back", e))?;
        became.map_err(|e| ctx("taking its rights", e))?;
        Ok(r.expect("ran"))
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The user's name, uid and gid, for the log.
    pub fn describe(&self) -> String {
        format!("{} (uid {}, gid {})", self.0.name, self.0.uid, self.0.gid)
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    /// Set in the child process that [`a_forbidden_system_call_is_refused`] starts.
    const PROBE: &str = "VNVME_SANDBOX_PROBE";

    /// `r` failed with EPERM: the filter refused the call.
    fn refused<T: std::fmt::Debug>(what: &str, r: Result<T, impl Into<io::Error>>) {
        match r.map_err(Into::into) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => println!("refused: {what}"),
            other => panic!("{what}: expected EPERM from the sandbox, got {other:?}"),
        }
    }

    /// The child's half: installs the serving allowlist on this process (the test
    /// binary, started only for this), then tries what it must refuse and what it must
    /// still allow. Does nothing in an ordinary test run.
    #[test]
    fn probe_in_child() {
        if std::env::var_os(PROBE).is_none() {
            return;
        }
        install(&Needs::default()).expect("install the filter");
        refused("execve", nix::unistd::execv(c"/bin/true", &[c"true"]));
        refused("clone (a new thread)", std::thread::Builder::new().spawn(|| ()));
        refused("socket(AF_INET)", std::net::UdpSocket::bind("127.0.0.1:0"));
        refused("socket(AF_UNIX)", std::os::unix::net::UnixStream::connect("/nonexistent.sock"));
        refused("openat", std::fs::File::open("/etc/hostname"));
        refused("unlink", std::fs::remove_file("/nonexistent-vnvme-file"));
        refused("setuid", nix::unistd::setuid(nix::unistd::Uid::from_raw(0)));
        // What serving uses still works.
        let ev = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).expect("eventfd");
        rustix::io::write(&ev, &1u64.to_ne_bytes()).expect("eventfd write");
        let mut buf = [0u8; 8];
        rustix::io::read(&ev, &mut buf).expect("eventfd read");
        assert_eq!(u64::from_ne_bytes(buf), 1);
        println!("allowed: eventfd, read, write");
    }

    /// Set in the child process that [`with_rbd_threads_start_but_processes_do_not`]
    /// starts.
    const PROBE_RBD: &str = "VNVME_SANDBOX_PROBE_RBD";

    /// The child's half for `rbd:` (librados starts threads): a thread starts (clone3
    /// answered ENOSYS, the C library falls back to clone with CLONE_THREAD), while a
    /// new process (clone without CLONE_THREAD), execve and a datagram socket are
    /// still refused.
    #[test]
    fn probe_rbd_in_child() {
        if std::env::var_os(PROBE_RBD).is_none() {
            return;
        }
        install(&Needs { rbd: true, ..Default::default() }).expect("install the filters");
        let t = std::thread::Builder::new().spawn(|| 7).expect("a thread starts under the rbd filter");
        assert_eq!(t.join().unwrap(), 7);
        println!("allowed: a new thread");
        refused(
            "a new process (clone without CLONE_THREAD)",
            std::process::Command::new("/bin/true").spawn(),
        );
        refused("execve", nix::unistd::execv(c"/bin/true", &[c"true"]));
        refused("socket(AF_INET, SOCK_DGRAM)", std::net::UdpSocket::bind("127.0.0.1:0"));
    }

    #[test]
    fn with_rbd_threads_start_but_processes_do_not() {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "sandbox::tests::probe_rbd_in_child", "--nocapture", "--test-threads=1"])
            .env(PROBE_RBD, "1")
            .output()
            .expect("run the probe");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let all = format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        for what in [
            "refused: a new process",
            "refused: execve",
            "refused: socket(AF_INET, SOCK_DGRAM)",
            "allowed: a new thread",
        ] {
            assert!(stdout.contains(what), "{what}:\n{all}");
        }
        assert!(out.status.success(), "{all}");
    }

    #[test]
    fn a_forbidden_system_call_is_refused() {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "sandbox::tests::probe_in_child", "--nocapture", "--test-threads=1"])
            .env(PROBE, "1")
            .output()
            .expect("run the probe");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let all = format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        for what in ["execve", "clone", "socket(AF_INET)", "socket(AF_UNIX)", "openat", "unlink", "setuid"] {
            assert!(stdout.contains(&format!("refused: {what}")), "{what} not refused:\n{all}");
        }
        assert!(stdout.contains("allowed: eventfd"), "{all}");
        assert!(out.status.success(), "{all}");
    }

    #[test]
    fn each_mode_adds_only_its_calls() {
        let base = rules(&Needs::default());
        for forbidden in
            [libc::SYS_execve, libc::SYS_socket, libc::SYS_connect, libc::SYS_ptrace, libc::SYS_clone]
        {
            assert!(!base.contains_key(&forbidden), "syscall {forbidden}");
        }
        for extra in [libc::SYS_openat, libc::SYS_ioctl, libc::SYS_io_uring_enter, libc::SYS_pwrite64] {
            assert!(!base.contains_key(&extra), "syscall {extra} without a mode that needs it");
        }
        assert!(rules(&Needs { uring: true, ..Default::default() }).contains_key(&libc::SYS_io_uring_enter));
        assert!(rules(&Needs { file: true, ..Default::default() }).contains_key(&libc::SYS_pwrite64));
        assert!(rules(&Needs { file: true, ..Default::default() }).contains_key(&libc::SYS_copy_file_range));
        assert!(rules(&Needs { kernel_vfio: true, ..Default::default() }).contains_key(&libc::SYS_ioctl));
        assert!(rules(&Needs { stats_file: true, ..Default::default() }).contains_key(&libc::SYS_openat));
        assert!(rules(&Needs { control: true, ..Default::default() }).contains_key(&libc::SYS_io_uring_setup));
        assert!(rules(&Needs { nbd: true, ..Default::default() }).contains_key(&libc::SYS_connect));
        assert!(rules(&Needs { rbd: true, ..Default::default() }).contains_key(&libc::SYS_clone));
        assert!(rules(&Needs { ram: true, ..Default::default() }).contains_key(&libc::SYS_fallocate));
        let meta = rules(&Needs { meta: true, ..Default::default() });
        assert!([libc::SYS_pread64, libc::SYS_pwrite64, libc::SYS_ftruncate]
            .iter()
            .all(|c| meta.contains_key(c)));
        // unlinkat only with a socket's directory, one rule per directory.
        assert!(!rules(&Needs::default()).contains_key(&libc::SYS_unlinkat));
        let dirs = Needs { socket_dirs: [Some(7), None, Some(9)], ..Default::default() };
        assert_eq!(rules(&dirs)[&libc::SYS_unlinkat].len(), 2);
        // A pool: opening and removing relative to its directory only, and with
        // the stats file, that file's one way of opening too.
        let pool = Needs { pool_dir: Some(5), stats_file: true, ..Default::default() };
        let r = rules(&pool);
        assert_eq!((r[&libc::SYS_unlinkat].len(), r[&libc::SYS_openat].len()), (1, 3));
        assert!(r.contains_key(&libc::SYS_flock) && r.contains_key(&libc::SYS_pwrite64));
        assert!(rules(&Needs { pool_dir: Some(5), control: true, ..Default::default() })[&libc::SYS_openat]
            .is_empty());
        filter(&Needs {
            pool_dir: Some(5),
            file: true,
            uring: true,
            kernel_vfio: true,
            stats_file: true,
            control: true,
            nbd: true,
            rbd: true,
            ram: true,
            meta: true,
            resv: true,
            socket_dirs: [Some(3), Some(4), None],
        })
        .expect("compiles");
    }
}
