//! The descriptors a run hands the server: one of every kind a VMM could send.

use std::fs::File;
use std::os::fd::OwnedFd;

use rustix::event::{eventfd, EventfdFlags};
use rustix::fs::{MemfdFlags, OFlags, SealFlags};

use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;

use super::layout::*;

/// The kinds of descriptor a client may pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FdKind {
    /// The bring-up's guest memory: a sealed memfd of `GUEST_LEN`.
    Guest,
    SealedMemfd,
    UnsealedMemfd,
    EventFd,
    /// Blocking, its counter at the maximum: one more write would block forever.
    FullEventFd,
    PipeRead,
    /// Blocking, its buffer full.
    FullPipeWrite,
    Socket,
    File,
    DevNull,
    /// A sealed memfd of [`SPARSE_LEN`] bytes, nothing written: what a client that
    /// commits no memory maps to make the server commit some (DMA logging).
    Sparse,
}

pub(super) const KINDS: [FdKind; 11] = [
    FdKind::Guest,
    FdKind::SealedMemfd,
    FdKind::UnsealedMemfd,
    FdKind::EventFd,
    FdKind::FullEventFd,
    FdKind::PipeRead,
    FdKind::FullPipeWrite,
    FdKind::Socket,
    FdKind::File,
    FdKind::DevNull,
    FdKind::Sparse,
];

/// One descriptor of each kind, created per run; messages carry duplicates.
pub(super) struct FdPool {
    pub(super) fds: Vec<(FdKind, OwnedFd)>,
    /// The guest memory, for the driver-like sequences to write queues into.
    pub(super) guest: File,
    /// Keeps the socket pair's other end open.
    pub(super) _peer: UnixStream,
}

pub(super) fn memfd(len: u64, seal: bool) -> OwnedFd {
    let fd = rustix::fs::memfd_create("nvme-fuzz", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .expect("memfd_create");
    rustix::fs::ftruncate(&fd, len).expect("ftruncate memfd");
    if seal {
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .expect("seal memfd");
    }
    fd
}

impl FdPool {
    pub(super) fn new() -> FdPool {
        let guest = memfd(GUEST_LEN, true);
        let full_efd = eventfd(0, EventfdFlags::CLOEXEC).expect("eventfd");
        rustix::io::write(&full_efd, &(u64::MAX - 1).to_ne_bytes()).expect("fill eventfd");
        let (pr, pw) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).expect("pipe");
        // Fill the pipe without blocking, then make its write end blocking again.
        rustix::fs::fcntl_setfl(&pw, OFlags::NONBLOCK).expect("pipe non-blocking");
        let chunk = [0u8; 4096];
        while rustix::io::write(&pw, &chunk).is_ok() {}
        while rustix::io::write(&pw, &chunk[..1]).is_ok() {}
        rustix::fs::fcntl_setfl(&pw, OFlags::empty()).expect("pipe blocking");
        let (sock, peer) = UnixStream::pair().expect("socketpair");
        let file = tempfile_unlinked();
        let null = File::options().read(true).write(true).open("/dev/null").expect("open /dev/null");
        let fds = vec![
            (FdKind::Guest, guest.try_clone().expect("dup")),
            (FdKind::SealedMemfd, memfd(SMALL_FILE, true)),
            (FdKind::UnsealedMemfd, memfd(SMALL_FILE, false)),
            (FdKind::EventFd, eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).expect("eventfd")),
            (FdKind::FullEventFd, full_efd),
            (FdKind::PipeRead, pr),
            (FdKind::FullPipeWrite, pw),
            (FdKind::Socket, sock.into()),
            (FdKind::File, file.into()),
            (FdKind::DevNull, null.into()),
            (FdKind::Sparse, memfd(SPARSE_LEN, true)),
        ];
        FdPool { fds, guest: File::from(guest), _peer: peer }
    }

    pub(super) fn dup(&self, kind: FdKind) -> OwnedFd {
        let (_, fd) = self.fds.iter().find(|(k, _)| *k == kind).expect("every kind is in the pool");
        fd.try_clone().expect("dup")
    }

    /// A fresh non-blocking eventfd (interrupts the device may keep).
    pub(super) fn new_eventfd(&self) -> OwnedFd {
        eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).expect("eventfd")
    }
}

pub(super) fn tempfile_unlinked() -> File {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!(
        "nvme-fuzz-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let f = File::options().read(true).write(true).create_new(true).open(&path).expect("temp file");
    let _ = std::fs::remove_file(&path);
    f.set_len(SMALL_FILE).expect("size temp file");
    f
}
