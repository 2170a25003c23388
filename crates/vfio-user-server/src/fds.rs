//! What a client's file descriptor is, checked before it is used or kept.
//!
//! The client is untrusted. An interrupt descriptor that is not an eventfd (a pipe
//! whose buffer fills, a socket nobody reads) would block the thread that signals
//! it; guest memory whose file can shrink under our mapping would kill the process
//! with SIGBUS at the next access. So every descriptor is classified on arrival and
//! refused with an errno when it is not what the message says.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use rustix::fs::{FileType, OFlags, SealFlags};
pub use vfio_user::socket::cloexec_from;

/// What kind of object a descriptor refers to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FdKind {
    EventFd,
    /// A memfd (`memfd_create`), with its seals.
    Memfd {
        seals: SealFlags,
    },
    /// A regular file on a file system (tmpfs, hugetlbfs, a disk), with its seals
    /// where the file system has them.
    File {
        seals: Option<SealFlags>,
    },
    /// Anything else: what `/proc/self/fd` calls it.
    Other(String),
}

impl FdKind {
    /// The kernel's name for a descriptor (`anon_inode:[eventfd]`, `/memfd:guest-ram
    /// (deleted)`, a path, `pipe:[123]`).
    fn link(fd: BorrowedFd<'_>) -> String {
        std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|e| format!("unreadable ({e})"))
    }

    pub fn of(fd: impl AsFd) -> FdKind {
        let fd = fd.as_fd();
        let link = Self::link(fd);
        if link == "anon_inode:[eventfd]" {
            return FdKind::EventFd;
        }
        match rustix::fs::fstat(fd) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => {
                let seals = rustix::fs::fcntl_get_seals(fd).ok();
                match (link.starts_with("/memfd:"), seals) {
                    (true, Some(seals)) => FdKind::Memfd { seals },
                    (_, seals) => FdKind::File { seals },
                }
            }
            _ => FdKind::Other(link),
        }
    }

    /// True if the file cannot shrink: nothing mapped from it can turn into SIGBUS.
    pub fn cannot_shrink(&self) -> bool {
        match self {
            FdKind::Memfd { seals } | FdKind::File { seals: Some(seals) } => {
                seals.contains(SealFlags::SHRINK)
            }
            _ => false,
        }
    }
}

impl std::fmt::Display for FdKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FdKind::EventFd => write!(f, "an eventfd"),
            FdKind::Memfd { seals } if seals.contains(SealFlags::SHRINK) => {
                write!(f, "a memfd sealed against shrinking")
            }
            FdKind::Memfd { .. } => write!(f, "a memfd without F_SEAL_SHRINK"),
            FdKind::File { .. } => write!(f, "a regular file"),
            FdKind::Other(link) => write!(f, "{link}"),
        }
    }
}

/// Makes a client's eventfd non-blocking, so a full counter can never stall the
/// thread that signals it. The flag lives in the open file description, which the
/// client shares; QEMU creates its eventfds non-blocking already.
pub fn set_nonblocking(fd: impl AsFd) -> std::io::Result<()> {
    set_blocking(fd, false)
}

/// Sets or clears O_NONBLOCK with fcntl (std's `set_nonblocking` uses the FIONBIO
/// ioctl, which the sandbox refuses).
pub fn set_blocking(fd: impl AsFd, blocking: bool) -> std::io::Result<()> {
    let fd = fd.as_fd();
    let flags = rustix::fs::fcntl_getfl(fd)?;
    let want = if blocking { flags - OFlags::NONBLOCK } else { flags | OFlags::NONBLOCK };
    if want != flags {
        rustix::fs::fcntl_setfl(fd, want)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::MemfdFlags;

    #[test]
    fn descriptors_are_told_apart() {
        let ev = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
        assert_eq!(FdKind::of(&ev), FdKind::EventFd);

        let m = rustix::fs::memfd_create(c"t", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        assert!(matches!(FdKind::of(&m), FdKind::Memfd { .. }));
        assert!(!FdKind::of(&m).cannot_shrink());
        rustix::fs::fcntl_add_seals(&m, SealFlags::SHRINK | SealFlags::GROW).unwrap();
        assert!(FdKind::of(&m).cannot_shrink());

        let (r, _w) = std::io::pipe().unwrap();
        assert!(matches!(FdKind::of(&r), FdKind::Other(l) if l.starts_with("pipe:")));

        let f = tempfile_fd();
        assert!(matches!(FdKind::of(&f), FdKind::File { .. }));
        assert!(!FdKind::of(&f).cannot_shrink());
    }

    fn tempfile_fd() -> std::fs::File {
        let p = std::env::temp_dir().join(format!("vnvme-fds-{}", std::process::id()));
        let f = std::fs::File::options().read(true).write(true).create(true).truncate(true).open(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        f
    }

    #[test]
    fn eventfds_become_nonblocking() {
        let ev = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
        set_nonblocking(&ev).unwrap();
        assert!(rustix::fs::fcntl_getfl(&ev).unwrap().contains(OFlags::NONBLOCK));
    }
}
