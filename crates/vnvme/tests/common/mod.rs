//! Helpers for the cross-process vfio-user tests: a `vnvme serve` child process, raw
//! message helpers for malformed input, memfds and eventfds.

#![allow(dead_code)]

pub mod nvme_host;

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use vfio_user::client::Client;
use vfio_user::proto::{Header, MsgFlags, HEADER_SIZE};
use vfio_user::{Connection, Message};
use zerocopy::little_endian::{U16, U32};
use zerocopy::IntoBytes;

/// How long any single wait in these tests may take before the test fails.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// A `vnvme serve` child process on a socket in its own temporary directory. Killed
/// (and its directory removed) on drop; if the test is failing, its log is printed.
#[derive(Debug)]
pub struct Server {
    child: Child,
    dir: PathBuf,
    pub socket: PathBuf,
}

impl Server {
    /// Starts `vnvme serve --socket DIR/s.sock --ns ram:16M` and waits (bounded) for
    /// the socket to appear.
    pub fn start() -> Server {
        Self::start_with(&[])
    }

    /// As [`Server::start`], with extra command-line arguments.
    pub fn start_with(extra: &[&str]) -> Server {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "vnvme-proto-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temporary directory");
        let socket = dir.join("s.sock");
        let log = File::create(dir.join("server.log")).expect("create server log");
        let child = Command::new(env!("CARGO_BIN_EXE_vnvme"))
            .args(["--log", "info", "serve", "--socket"])
            .arg(&socket)
            .args(["--ns", "ram:16M"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn vnvme serve");
        let mut s = Server { child, dir, socket };
        let deadline = Instant::now() + TIMEOUT;
        while !s.socket.exists() {
            if let Some(st) = s.child.try_wait().expect("wait for vnvme") {
                panic!("vnvme serve exited early ({st}):\n{}", s.log());
            }
            assert!(Instant::now() < deadline, "socket did not appear within {TIMEOUT:?}:\n{}", s.log());
            std::thread::sleep(Duration::from_millis(10));
        }
        s
    }

    /// Open file descriptors and memory mappings of the server process.
    pub fn resources(&self) -> (usize, usize) {
        let pid = self.child.id();
        if std::env::var_os("VNVME_TEST_DEBUG_FDS").is_some() {
            for e in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
                eprintln!("fd {:?} -> {:?}", e.file_name(), std::fs::read_link(e.path()));
            }
        }
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0);
        let maps =
            std::fs::read_to_string(format!("/proc/{pid}/maps")).map(|m| m.lines().count()).unwrap_or(0);
        (fds, maps)
    }

    /// The server's stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// Panics with the server log if the process has exited.
    pub fn assert_alive(&mut self) {
        if let Some(st) = self.child.try_wait().expect("wait for vnvme") {
            panic!("vnvme serve died ({st}):\n{}", self.log());
        }
    }

    /// A negotiated client. The server serves one client at a time, so connecting
    /// right after another client closed waits until the server has cleaned up.
    pub fn client(&mut self) -> Client {
        self.assert_alive();
        let s = self.stream();
        Client::from_stream(s).unwrap_or_else(|e| panic!("VERSION failed: {e}\n{}", self.log()))
    }

    /// A connected socket with read/write timeouts, nothing sent yet.
    pub fn stream(&mut self) -> UnixStream {
        self.assert_alive();
        // The socket file appears at bind(), a moment before listen(): until then a
        // connect is refused.
        let deadline = Instant::now() + TIMEOUT;
        let s = loop {
            match UnixStream::connect(&self.socket) {
                Ok(s) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => panic!("connect to the server: {e}\n{}", self.log()),
            }
        };
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        s.set_write_timeout(Some(TIMEOUT)).unwrap();
        s
    }

    /// A raw connection that has negotiated VERSION (for malformed follow-ups).
    pub fn raw_negotiated(&mut self) -> Connection {
        let mut c = Connection::new(self.stream());
        let r = request(&mut c, 1, vfio_user::Command::Version as u16, &[&version_payload()], &[]);
        assert!(!is_error(&r), "VERSION refused: errno {}", r.header.error.get());
        c
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("---- vnvme serve log ----\n{}-------------------------", self.log());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Our own minimal VERSION payload (major 0, minor 0, a few capabilities).
pub fn version_payload() -> Vec<u8> {
    let caps = vfio_user::version::Capabilities { max_msg_fds: Some(16), ..Default::default() };
    vfio_user::version::encode(0, 0, &caps)
}

/// Header of a command message (`size` is filled in by `Connection::send`).
pub fn header(id: u16, cmd: u16, flags: u32) -> Header {
    Header { msg_id: U16::new(id), command: U16::new(cmd), flags: U32::new(flags), ..Default::default() }
}

/// Sends one command and returns the next message, which must be its reply.
pub fn request(c: &mut Connection, id: u16, cmd: u16, parts: &[&[u8]], fds: &[RawFd]) -> Message {
    c.send(header(id, cmd, MsgFlags::COMMAND), parts, fds).expect("send");
    let m = c.recv().unwrap_or_else(|e| panic!("no reply to command {cmd} (id {id}): {e}"));
    assert!(MsgFlags(m.header.flags.get()).is_reply(), "expected a reply, got {:?}", m.header);
    assert_eq!(m.header.msg_id.get(), id, "reply to the wrong message");
    assert_eq!(m.header.command.get(), cmd, "reply names another command");
    m
}

pub fn is_error(m: &Message) -> bool {
    MsgFlags(m.header.flags.get()).is_error()
}

/// Sends one command that must fail; returns the errno of its error reply, which must
/// be non-zero (QEMU reads errno 0 as success) and carry no payload.
pub fn expect_error(c: &mut Connection, id: u16, cmd: u16, parts: &[&[u8]], fds: &[RawFd]) -> u32 {
    let m = request(c, id, cmd, parts, fds);
    assert!(is_error(&m), "command {cmd} (id {id}) unexpectedly succeeded");
    assert_ne!(m.header.error.get(), 0, "error reply with errno 0");
    assert_eq!(m.header.size.get() as usize, HEADER_SIZE, "an error reply is only a header");
    m.header.error.get()
}

/// True if the peer closes `s` (EOF) within the timeout; reads and discards anything
/// the peer sends first.
pub fn closed_by_peer(s: &mut UnixStream) -> bool {
    let deadline = Instant::now() + TIMEOUT;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return false
            }
            Err(e) => panic!("read: {e}"),
        }
    }
    false
}

/// Writes raw bytes (no framing checks at all).
pub fn write_raw(s: &mut UnixStream, bytes: &[u8]) {
    s.write_all(bytes).expect("raw write");
}

/// A header with an arbitrary size field, as bytes.
pub fn raw_header(id: u16, cmd: u16, size: u32) -> [u8; HEADER_SIZE] {
    let mut h = header(id, cmd, MsgFlags::COMMAND);
    h.size = U32::new(size);
    let mut b = [0u8; HEADER_SIZE];
    b.copy_from_slice(h.as_bytes());
    b
}

/// Whether the server still answers a client's DEVICE_GET_INFO.
pub fn still_serving(server: &mut Server) {
    let mut c = server.client();
    let info = c.device_info().unwrap_or_else(|e| panic!("server stopped serving: {e}\n{}", server.log()));
    assert_eq!(info.num_regions.get(), 9);
}

/// An anonymous shared-memory file of `len` bytes.
pub fn memfd(len: u64) -> OwnedFd {
    // SAFETY: memfd_create with a valid NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(c"vnvme-test-dma".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    File::from(fd.try_clone().unwrap()).set_len(len).expect("size the memfd");
    fd
}

/// A non-blocking eventfd, as the VMM would pass for an interrupt.
#[derive(Debug)]
pub struct TestEventFd(OwnedFd);

impl TestEventFd {
    pub fn new() -> Self {
        // SAFETY: eventfd with valid flags; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(fd >= 0, "eventfd: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        TestEventFd(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Reads and resets the counter (0 if it was never signalled).
    pub fn take(&self) -> u64 {
        let mut b = [0u8; 8];
        match (&File::from(self.0.try_clone().unwrap())).read(&mut b) {
            Ok(8) => u64::from_ne_bytes(b),
            Ok(n) => panic!("short eventfd read of {n} bytes"),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
            Err(e) => panic!("eventfd read: {e}"),
        }
    }

    /// Waits (bounded) until the eventfd has been signalled; returns the count.
    pub fn wait(&self, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        loop {
            let n = self.take();
            if n > 0 || Instant::now() >= deadline {
                return n;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}
