//! The file of a listening UNIX socket, as a server owns it: bound only where no
//! other file is (a stale socket of a server that died is replaced; a live one, or
//! anything that is not a socket, is refused, and nothing is deleted), and removed
//! at the end only if it is still the one this server bound.
//!
//! Removing works under the sandbox too: the socket's directory is held open
//! (`O_PATH`), and the sandbox lets `unlinkat` act in that directory alone
//! ([`SocketFile::dir_fd`]).

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags};

/// A socket file this process bound.
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
    dir: OwnedFd,
    name: OsString,
    /// The file's identity when bound: whoever replaced it since owns the new one.
    /// (An inode number is reused once its file is gone, but ours stays allocated
    /// while it is linked somewhere or its listening socket is open, which holds
    /// it: call [`SocketFile::remove`] before closing the listener.)
    dev: u64,
    ino: u64,
}

/// Why a socket could not be bound, with the path and what to do.
fn refused(kind: io::ErrorKind, msg: String) -> io::Error {
    io::Error::new(kind, msg)
}

impl SocketFile {
    /// Binds a listening socket at `path` (`mode`: the file's permission bits, set
    /// with no moment in which others may connect; None: as the umask leaves them).
    ///
    /// An existing file at `path` is replaced only if it is a socket nobody listens
    /// on. Whether anyone listens is found by connecting and closing at once, without
    /// a word: a server of ours does not count such a connection as a client (a
    /// `--once` server goes on waiting for its one).
    pub fn bind(path: &Path, mode: Option<u32>) -> io::Result<(UnixListener, SocketFile)> {
        let shown = path.display();
        let (parent, name) = match (path.parent(), path.file_name()) {
            (Some(p), Some(n)) => (if p.as_os_str().is_empty() { Path::new(".") } else { p }, n.to_owned()),
            _ => return Err(refused(io::ErrorKind::InvalidInput, format!("{shown}: not a path to a file"))),
        };
        let dir = rustix::fs::open(parent, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| {
                let e = io::Error::from(e);
                refused(
                    e.kind(),
                    format!(
                        "{shown}: its directory {} cannot be used ({e}); create it first",
                        parent.display()
                    ),
                )
            })?;
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                return Err(refused(
                    io::ErrorKind::AlreadyExists,
                    format!("{shown} exists and is not a socket: left as it is; choose another path"),
                ));
            }
            if UnixStream::connect(path).is_ok() {
                return Err(refused(
                    io::ErrorKind::AddrInUse,
                    format!("{shown} is in use: another server listens on it (stop it first, or choose another path)"),
                ));
            }
            // A socket file nobody listens on: a server that died left it.
            rustix::fs::unlinkat(&dir, &name, AtFlags::empty()).map_err(|e| {
                let e = io::Error::from(e);
                refused(e.kind(), format!("{shown}: cannot replace the stale socket file ({e})"))
            })?;
        }
        let bound = match mode {
            Some(m) => {
                // Created under a umask that leaves only `m`'s bits, then made sure of.
                let old = rustix::process::umask(Mode::from_bits_truncate(!m & 0o777));
                let b = UnixListener::bind(path);
                rustix::process::umask(old);
                b
            }
            None => UnixListener::bind(path),
        };
        let listener = bound.map_err(|e| refused(e.kind(), format!("{shown}: cannot bind ({e})")))?;
        if let Some(m) = mode {
            std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(m))?;
        }
        let meta = std::fs::symlink_metadata(path)?;
        let file = SocketFile { path: path.to_owned(), dir, name, dev: meta.dev(), ino: meta.ino() };
        Ok((listener, file))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory the socket is in, held open: the sandbox lets `unlinkat` act
    /// there (and only there) so the socket can be removed at the end.
    pub fn dir_fd(&self) -> RawFd {
        self.dir.as_raw_fd()
    }

    /// Whether this process may remove names in the socket's directory (write and
    /// search permission, for its user now).
    pub fn removable(&self) -> bool {
        use rustix::fs::Access;
        rustix::fs::accessat(&self.dir, ".", Access::WRITE_OK | Access::EXEC_OK, AtFlags::EACCESS).is_ok()
    }

    /// Removes the socket file if it is still the one this process bound. Ok(false):
    /// it is gone, or another file is there now (left alone). Call it while the
    /// listener is still open (see the identity above).
    pub fn remove(&self) -> io::Result<bool> {
        match rustix::fs::statat(&self.dir, &self.name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if st.st_dev == self.dev && st.st_ino == self.ino => {
                rustix::fs::unlinkat(&self.dir, &self.name, AtFlags::empty())?;
                Ok(true)
            }
            Ok(_) => Ok(false),
            Err(rustix::io::Errno::NOENT) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// A file taken over from another process (an upgrade): the file at `path` now,
    /// which this process will remove at its end.
    pub fn adopt(path: &Path) -> io::Result<SocketFile> {
        let (parent, name) = match (path.parent(), path.file_name()) {
            (Some(p), Some(n)) => (if p.as_os_str().is_empty() { Path::new(".") } else { p }, n.to_owned()),
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{}: not a path", path.display()),
                ))
            }
        };
        let dir =
            rustix::fs::open(parent, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
        let meta = std::fs::symlink_metadata(path)?;
        Ok(SocketFile { path: path.to_owned(), dir, name, dev: meta.dev(), ino: meta.ino() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vnvme-socket-file-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_file_that_is_not_a_socket_is_never_replaced() {
        let d = dir("plain");
        let p = d.join("disk.img");
        std::fs::write(&p, b"an operator's data").unwrap();
        let e = SocketFile::bind(&p, None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert!(e.to_string().contains("disk.img exists and is not a socket"), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"an operator's data");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_live_socket_is_refused_a_stale_one_replaced_and_only_our_own_removed() {
        let d = dir("live");
        let p = d.join("s.sock");
        let (l, f) = SocketFile::bind(&p, Some(0o600)).unwrap();
        let e = SocketFile::bind(&p, None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}");
        // Someone moves the socket aside, and another server binds the path: the
        // file there is that server's, which the first never removes.
        std::fs::rename(&p, d.join("moved.sock")).unwrap();
        let (_l2, f2) = SocketFile::bind(&p, None).unwrap();
        assert!(!f.remove().unwrap(), "another server's socket is left alone");
        assert!(p.exists());
        assert!(f2.remove().unwrap());
        assert!(!p.exists());
        // A stale socket (nobody listens) is replaced.
        drop(l);
        std::fs::rename(d.join("moved.sock"), &p).unwrap();
        let (_l3, f3) = SocketFile::bind(&p, None).unwrap();
        assert!(f3.remove().unwrap());
        // A missing directory is named, with the fix.
        let e = SocketFile::bind(&d.join("no/such/dir/s.sock"), None).unwrap_err();
        assert!(e.to_string().contains("create it first"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
