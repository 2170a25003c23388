//! Helpers for the cross-process vfio-user tests: a `vnvme serve` child process, raw
//! message helpers for malformed input, memfds and eventfds.

#![allow(dead_code)]

pub mod nvme_host;
pub mod protocol;

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
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// Whether the vnvme under test obeys the tests' fault injection variables
/// (`VNVME_TEST_*`: built with the `fault-injection` feature, which scripts/test.sh
/// turns on and no release build has). If not, the calling test is reported
/// skipped, with the command that runs it.
pub fn fault_injection() -> bool {
    let out = Command::new(env!("CARGO_BIN_EXE_vnvme")).arg("--version").output().expect("vnvme --version");
    if String::from_utf8_lossy(&out.stdout).contains("with fault injection") {
        return true;
    }
    test_util::skip(
        "vnvme was built without the fault-injection feature, which this test needs: \
         cargo test -p vnvme --features fault-injection (scripts/test.sh does)",
    );
    false
}

/// A fresh temporary directory for one test.
pub fn temp_dir(tag: &str) -> PathBuf {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "vnvme-{tag}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temporary directory");
    dir
}

/// A `vnvme serve` child process. Killed on drop (its directory removed too when the
/// server made it); if the test is failing, its log is printed.
#[derive(Debug)]
pub struct Server {
    child: Child,
    pub dir: PathBuf,
    pub socket: PathBuf,
    /// The `--stats-file` the server rewrites twice a second.
    pub stats: PathBuf,
    owns_dir: bool,
    log_name: String,
}

impl Server {
    /// Starts `vnvme serve --ns ram:16M` in a new temporary directory and waits
    /// (bounded) for its socket.
    pub fn start() -> Server {
        Self::start_with(&["--ns", "ram:16M"])
    }

    /// Starts a server in a new temporary directory (removed on drop) with extra
    /// arguments; `--ns ram:64M` unless they name namespaces.
    pub fn start_with(extra: &[&str]) -> Server {
        let mut s = Server::start_in(&temp_dir("serve"), "s", extra);
        s.owns_dir = true;
        s
    }

    /// Starts a server in `dir` (kept on drop), its socket, stats and log files
    /// named after `name`.
    pub fn start_in(dir: &std::path::Path, name: &str, extra: &[&str]) -> Server {
        Self::start_in_env(dir, name, extra, &[])
    }

    /// [`Server::start_in`] with variables added to the server's environment (what
    /// loading librbd needs, for an `rbd:` namespace).
    pub fn start_in_env(
        dir: &std::path::Path,
        name: &str,
        extra: &[&str],
        env: &[(String, String)],
    ) -> Server {
        let socket = dir.join(format!("{name}.sock"));
        let stats = dir.join(format!("{name}-stats.json"));
        let log_name = format!("{name}.log");
        let log = File::create(dir.join(&log_name)).expect("create server log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vnvme"));
        cmd.args(["--log", "info", "serve", "--socket"]).arg(&socket).arg("--stats-file").arg(&stats);
        if !extra.contains(&"--ns") {
            cmd.args(["--ns", "ram:64M"]);
        }
        let child = cmd
            .args(extra)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn vnvme serve");
        let mut s = Server { child, dir: dir.to_path_buf(), socket, stats, owns_dir: false, log_name };
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

    /// Removes the server's directory when it is dropped (a directory made for it
    /// alone by its caller).
    pub fn owning_dir(mut self) -> Server {
        self.owns_dir = true;
        self
    }

    /// SIGKILL, now: no shutdown, no flush, no chance to finish anything.
    pub fn kill_hard(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether the server has exited (reaped, if so).
    pub fn child_exited(&mut self) -> bool {
        self.child.try_wait().expect("wait for vnvme").is_some()
    }

    /// Sends `signal` (e.g. libc::SIGTERM) to the server.
    pub fn signal(&self, signal: i32) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).expect("a pid");
        let sig = rustix::process::Signal::from_named_raw(signal).expect("a signal");
        rustix::process::kill_process(pid, sig).expect("signal the server");
    }

    /// Waits (bounded by [`TIMEOUT`]) for the server to exit by itself; None if it
    /// did not.
    pub fn wait_exit(&mut self) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(st) = self.child.try_wait().expect("wait for vnvme") {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A vfio-user transport to the server. The socket file appears at bind(), a
    /// moment before listen(), so a refused connection is retried (bounded).
    pub fn transport(
        &self,
        doorbells: nvme_driver::DoorbellMode,
    ) -> std::io::Result<nvme_driver::VfioUserTransport> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let opts = nvme_driver::VfioUserOptions { doorbells, socket_timeout: Some(TIMEOUT) };
            match nvme_driver::VfioUserTransport::connect(&self.socket, opts) {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                r => return r,
            }
        }
    }

    /// The userspace driver, connected over vfio-user and brought up.
    pub fn driver(
        &self,
        doorbells: nvme_driver::DoorbellMode,
        opts: nvme_driver::DriverOptions,
    ) -> nvme_driver::NvmeDriver {
        let t = self.transport(doorbells).unwrap_or_else(|e| panic!("connect: {e}\n{}", self.log()));
        nvme_driver::NvmeDriver::new(Box::new(t), opts)
            .unwrap_or_else(|e| panic!("bring-up: {e}\n{}", self.log()))
    }

    /// The server's counters once its I/O command count has reached `io_commands`
    /// (the stats file is rewritten twice a second; the wait is bounded).
    pub fn stats_after(&self, io_commands: u64) -> serde_json::Value {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Ok(s) = std::fs::read_to_string(&self.stats) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&s) {
                    if v["io_commands"].as_u64().unwrap_or(0) >= io_commands {
                        return v;
                    }
                }
            }
            assert!(Instant::now() < deadline, "server stats never reached {io_commands} I/O commands");
            std::thread::sleep(Duration::from_millis(50));
        }
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

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How many of the server's memory mappings and descriptors name `needle` (a
    /// memfd's name, as `/proc/PID/maps` and `/proc/PID/fd` show it).
    pub fn holds(&self, needle: &str) -> (usize, usize) {
        let pid = self.child.id();
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| {
                d.flatten()
                    .filter(|e| {
                        std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().contains(needle))
                    })
                    .count()
            })
            .unwrap_or(0);
        (maps.lines().filter(|l| l.contains(needle)).count(), fds)
    }

    /// The server's stderr so far.
    /// Whether the log comes to contain `needle` within the timeout (a server
    /// writes some lines, e.g. the sandbox's, a moment after its socket appears).
    pub fn log_shows(&self, needle: &str) -> bool {
        let deadline = Instant::now() + TIMEOUT;
        while !self.log().contains(needle) {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join(&self.log_name)).unwrap_or_default()
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
            eprintln!(
                "---- vnvme serve log ({}) ----\n{}-------------------------",
                self.log_name,
                self.log()
            );
        }
        if self.owns_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
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

/// Driver options for tests: `io_queues` pairs of 128 entries, bounded waits.
pub fn opts(
    io_queues: u16,
    shadow: bool,
    completion: nvme_driver::CompletionMode,
) -> nvme_driver::DriverOptions {
    nvme_driver::DriverOptions {
        io_queues,
        queue_size: 128,
        shadow_doorbells: shadow,
        completion,
        pool_bytes: 16 << 20,
        timeout: TIMEOUT,
    }
}

/// Runs `cmd` to its end like `Command::output`, but a process still running after
/// `limit` is killed and the test fails (a hang is a failure, not a wait forever).
#[allow(dead_code)]
pub fn output_within(cmd: &mut Command, limit: Duration) -> std::process::Output {
    let dir = temp_dir("output");
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(File::create(&out).expect("stdout file"))
        .stderr(File::create(&err).expect("stderr file"))
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            let e = std::fs::read_to_string(&err).unwrap_or_default();
            let _ = std::fs::remove_dir_all(&dir);
            panic!("{cmd:?} still running after {limit:?}: killed\n{e}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = std::process::Output {
        status,
        stdout: std::fs::read(&out).unwrap_or_default(),
        stderr: std::fs::read(&err).unwrap_or_default(),
    };
    let _ = std::fs::remove_dir_all(&dir);
    output
}
