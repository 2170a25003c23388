//! Listening UNIX sockets only their owner may connect to: the control socket and
//! the metrics endpoint both say what the server does and (control) change it.

use std::io;
use std::os::unix::net::UnixListener;
use std::path::Path;

use vfio_user_server::socket_file::SocketFile;

/// Binds a nonblocking listening socket at `path`, owner-only (0600). A socket
/// file nobody listens on (left by a server that died) is replaced; a path another
/// server listens on, or a file that is not a socket, is refused
/// ([`SocketFile::bind`]).
pub fn bind_owner_only(path: &Path) -> io::Result<(UnixListener, SocketFile)> {
    let (l, file) = SocketFile::bind(path, Some(0o600))?;
    // fcntl rather than std's FIONBIO ioctl, which the sandbox refuses (this runs
    // before it, but one way for every socket is easier to check).
    vfio_user_server::fds::set_blocking(&l, false)?;
    Ok((l, file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_only_replaces_stale_and_refuses_busy_and_non_sockets() {
        let dir = std::env::temp_dir().join(format!("vnvme-unix-socket-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("s.sock");
        let (l, _) = bind_owner_only(&p).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        let busy = bind_owner_only(&p).unwrap_err();
        assert_eq!(busy.kind(), io::ErrorKind::AddrInUse, "{busy}");
        drop(l);
        bind_owner_only(&p).expect("a stale socket file is replaced");

        let f = dir.join("plain");
        std::fs::write(&f, b"keep me").unwrap();
        bind_owner_only(&f).unwrap_err();
        assert_eq!(std::fs::read(&f).unwrap(), b"keep me");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
