//! The metrics endpoint: a small HTTP/1.1 server on one thread (`vnvme-metrics`)
//! that answers `GET /metrics` (and `HEAD`) with what a source closure returns.
//!
//! Only loopback TCP addresses and UNIX sockets (owner-only) are served: the
//! metrics tell namespaces, backends and I/O rates, and there is no TLS or
//! authentication here; a proxy in front does that for remote scrapes.
//!
//! Bounds, so that a local client, careless or hostile, costs little: one request
//! per connection (`Connection: close`); a request head of at most [`MAX_HEAD`]
//! bytes that must be whole within [`DEADLINE`] of the connection being accepted;
//! a reply that must be taken within [`DEADLINE`]; at most [`MAX_CONNECTIONS`]
//! connections at once (more are answered 503 and closed). Requests carry no body
//! (GET and HEAD); anything after the head is read and dropped. Log lines a peer
//! can cause are rate-limited.
//!
//! All connections are served by `poll(2)` on nonblocking sockets in the one
//! thread: the seccomp sandbox installed after start-up refuses `clone`, and
//! `FIONBIO`, so sockets are made nonblocking with `fcntl`. The thread calls the
//! source itself; a scrape waits for the device thread as long as the source lets
//! it, and other connections wait with it.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use tracing::debug;
use vfio_user_server::fds::set_blocking;
use vfio_user_server::socket_file::SocketFile;

use super::render::CONTENT_TYPE;

/// Largest request head (request line and headers).
pub const MAX_HEAD: usize = 8 << 10;
/// A request head must be whole, and the reply gone, within this.
pub const DEADLINE: Duration = Duration::from_secs(5);
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 8;

/// What a scrape is made from: the exposition text, or why there is none now.
pub type Source = Box<dyn Fn() -> Result<String, String> + Send>;

/// Where `--metrics` listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetricsAddr {
    /// A loopback address.
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl FromStr for MetricsAddr {
    type Err = String;

    /// `127.0.0.1:9464`, `[::1]:9464`, `localhost:9464`, `unix:/run/m.sock` or
    /// `/run/m.sock`. A TCP address that is not loopback is refused, saying why.
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a path, e.g. unix:/run/vnvme/metrics.sock".into());
            }
            return Ok(MetricsAddr::Unix(path.into()));
        }
        if s.starts_with('/') {
            return Ok(MetricsAddr::Unix(s.into()));
        }
        let addr = match s.strip_prefix("localhost:") {
            // Not through the resolver: localhost is loopback by definition (RFC 6761),
            // whatever a hosts file or DNS might say.
            Some(port) => SocketAddr::from((
                Ipv4Addr::LOCALHOST,
                port.parse::<u16>().map_err(|_| format!("{port:?} is not a port number"))?,
            )),
            None => s.parse().map_err(|_| {
                format!(
                    "{s:?} is not a metrics address: 127.0.0.1:PORT, [::1]:PORT, localhost:PORT, \
                     unix:PATH or an absolute PATH"
                )
            })?,
        };
        check_loopback(&addr)?;
        Ok(MetricsAddr::Tcp(addr))
    }
}

impl MetricsAddr {
    /// The socket file, for a UNIX socket.
    pub fn unix_path(&self) -> Option<&Path> {
        match self {
            MetricsAddr::Unix(p) => Some(p),
            MetricsAddr::Tcp(_) => None,
        }
    }
}

impl fmt::Display for MetricsAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetricsAddr::Tcp(a) => write!(f, "{a}"),
            MetricsAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// Refuses an address other hosts could reach.
fn check_loopback(addr: &SocketAddr) -> Result<(), String> {
    if addr.ip().to_canonical().is_loopback() {
        return Ok(());
    }
    Err(format!(
        "{addr} is not a loopback address: the metrics show workload details (namespaces, \
         backends, I/O rates) and are served without TLS or authentication, so only on \
         loopback or a UNIX socket; put a proxy in front for remote scrapes"
    ))
}

/// A bound, nonblocking listening socket.
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    /// Another descriptor of the listening socket (for a process taking over).
    pub fn try_clone_fd(&self) -> io::Result<std::os::fd::OwnedFd> {
        match self {
            Listener::Tcp(l) => l.try_clone().map(Into::into),
            Listener::Unix(l) => l.try_clone().map(Into::into),
        }
    }

    /// Where it listens (with the port the system chose for port 0).
    pub fn local_addr(&self) -> io::Result<MetricsAddr> {
        match self {
            Listener::Tcp(l) => l.local_addr().map(MetricsAddr::Tcp),
            Listener::Unix(l) => l
                .local_addr()?
                .as_pathname()
                .map(|p| MetricsAddr::Unix(p.to_owned()))
                .ok_or_else(|| io::Error::other("unnamed UNIX socket")),
        }
    }

    /// The next connection, made nonblocking.
    fn accept(&self) -> io::Result<Stream> {
        let s = match self {
            Listener::Tcp(l) => Stream::Tcp(l.accept()?.0),
            Listener::Unix(l) => Stream::Unix(l.accept()?.0),
        };
        set_blocking(&s, false)?;
        Ok(s)
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Listener::Tcp(l) => l.as_fd(),
            Listener::Unix(l) => l.as_fd(),
        }
    }
}

/// Binds the metrics socket, nonblocking: a loopback TCP address, or a UNIX socket
/// created owner-only (0600) that replaces a stale socket file.
pub fn bind(addr: &MetricsAddr) -> io::Result<(Listener, Option<SocketFile>)> {
    match addr {
        MetricsAddr::Tcp(a) => {
            check_loopback(a).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            let l = TcpListener::bind(a)?;
            set_blocking(&l, false)?;
            Ok((Listener::Tcp(l), None))
        }
        MetricsAddr::Unix(p) => {
            crate::unix_socket::bind_owner_only(p).map(|(l, f)| (Listener::Unix(l), Some(f)))
        }
    }
}

/// Starts the metrics thread (`vnvme-metrics`) serving `listener` until the process
/// ends; each scrape calls `source` on that thread.
pub fn spawn(listener: Listener, source: Source) -> io::Result<JoinHandle<()>> {
    spawn_with(listener, source, Limits::DEFAULT)
}

/// The bounds one server keeps (tests shorten the deadline).
#[derive(Clone, Copy, Debug)]
struct Limits {
    head: usize,
    deadline: Duration,
    connections: usize,
}

impl Limits {
    const DEFAULT: Limits = Limits { head: MAX_HEAD, deadline: DEADLINE, connections: MAX_CONNECTIONS };
}

fn spawn_with(listener: Listener, source: Source, limits: Limits) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name("vnvme-metrics".into()).spawn(move || serve(&listener, &*source, limits))
}

/// An accepted connection's socket.
#[derive(Debug)]
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Unix(s) => s.shutdown(how),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Tcp(s) => s.as_fd(),
            Stream::Unix(s) => s.as_fd(),
        }
    }
}

/// Where a connection is in its one exchange.
#[derive(Debug)]
enum Phase {
    /// Reading the request head (what has come so far).
    Head(Vec<u8>),
    /// Writing the reply, `sent` bytes of it so far.
    Reply { out: Vec<u8>, sent: usize },
    /// The reply is out and our side shut down; reading until the client closes.
    /// Closing a socket with unread input makes the kernel reset the connection,
    /// which can destroy a reply the client has not read yet (RFC 9112 §9.6).
    Drain,
}

#[derive(Debug)]
struct Conn {
    stream: Stream,
    phase: Phase,
    /// When this phase must be over.
    due: Instant,
}

/// How long the listener rests after an accept error other than "no one waiting"
/// (e.g. out of descriptors), rather than waking the loop again at once.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

fn serve(listener: &Listener, source: &dyn Fn() -> Result<String, String>, lim: Limits) {
    let mut conns: Vec<Conn> = Vec::new();
    let mut accept_paused: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if accept_paused.is_some_and(|t| now >= t) {
            accept_paused = None;
        }
        let wake = conns.iter().map(|c| c.due).chain(accept_paused).min();
        let ts = wake.map(|w| {
            let d = w.saturating_duration_since(now).max(Duration::from_millis(1));
            Timespec { tv_sec: d.as_secs() as i64, tv_nsec: d.subsec_nanos() as i64 }
        });
        let mut fds = Vec::with_capacity(conns.len() + 1);
        let listen = if accept_paused.is_some() { PollFlags::empty() } else { PollFlags::IN };
        fds.push(PollFd::new(listener, listen));
        for c in &conns {
            let f = if matches!(c.phase, Phase::Reply { .. }) { PollFlags::OUT } else { PollFlags::IN };
            fds.push(PollFd::new(&c.stream, f));
        }
        match poll(&mut fds, ts.as_ref()) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                log_limit::limited_warn!(target: "vnvme::metrics", "metrics socket poll failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        }
        let ready: Vec<PollFlags> = fds.iter().map(|f| f.revents()).collect();
        drop(fds);
        // Backwards, so that swap_remove moves only connections already seen.
        for i in (0..conns.len()).rev() {
            let r = ready[i + 1];
            if !r.is_empty() && !step(&mut conns[i], r, source, lim) {
                conns.swap_remove(i);
            }
        }
        if ready[0].contains(PollFlags::IN) && !accept(listener, &mut conns, lim) {
            accept_paused = Some(Instant::now() + ACCEPT_PAUSE);
        }
        let now = Instant::now();
        conns.retain(|c| !expired(c, now, lim));
    }
}

/// Takes every waiting connection; refuses those over the limit. False after an
/// accept error that calls for a pause.
fn accept(listener: &Listener, conns: &mut Vec<Conn>, lim: Limits) -> bool {
    loop {
        match listener.accept() {
            Ok(mut stream) => {
                if conns.len() >= lim.connections {
                    log_limit::limited_warn!(
                        target: "vnvme::metrics",
                        "metrics connection refused: {} are open already",
                        lim.connections
                    );
                    // One try, without waiting: a fresh socket's buffer takes it.
                    let busy = response(Status::Unavailable, TEXT, b"too many metrics connections\n", false);
                    let _ = stream.write(&busy);
                    // What the client sent already is read before the close (a few KiB
                    // at most, without waiting): closing over unread data resets the
                    // connection (RST over TCP, ECONNRESET over a UNIX socket), and the
                    // client would see that instead of the 503.
                    let mut sink = [0u8; 1024];
                    for _ in 0..4 {
                        if !matches!(stream.read(&mut sink), Ok(n) if n > 0) {
                            break;
                        }
                    }
                    continue;
                }
                debug!(target: "vnvme::metrics", "metrics connection opened");
                conns.push(Conn {
                    stream,
                    phase: Phase::Head(Vec::new()),
                    due: Instant::now() + lim.deadline,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
            // Gone before we took it, or a signal: nothing to pause for.
            Err(e) if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted) => {}
            Err(e) => {
                log_limit::limited_warn!(target: "vnvme::metrics", "metrics socket accept failed: {e}");
                return false;
            }
        }
    }
}

/// Moves a connection on after poll reported `r` for it. False when it is done.
fn step(c: &mut Conn, r: PollFlags, source: &dyn Fn() -> Result<String, String>, lim: Limits) -> bool {
    if r.intersects(PollFlags::ERR | PollFlags::NVAL) {
        return false;
    }
    match &mut c.phase {
        Phase::Head(buf) => match read_head(&mut c.stream, buf, lim.head) {
            HeadRead::More => true,
            HeadRead::Closed => {
                debug!(target: "vnvme::metrics", "metrics connection closed before a request");
                false
            }
            HeadRead::Whole(len) => {
                let out = answer(&buf[..len], source);
                reply(c, out, lim)
            }
            HeadRead::TooLarge => {
                log_limit::limited_warn!(
                    target: "vnvme::metrics",
                    "metrics request head over {} bytes: answered 431",
                    lim.head
                );
                let why = format!("request head over {} bytes\n", lim.head);
                reply(c, response(Status::TooLarge, TEXT, why.as_bytes(), false), lim)
            }
            HeadRead::Truncated => {
                log_limit::limited_warn!(
                    target: "vnvme::metrics",
                    "metrics client closed its side within a request head: answered 400"
                );
                reply(c, response(Status::BadRequest, TEXT, b"incomplete request head\n", false), lim)
            }
        },
        Phase::Reply { .. } => write_out(c, lim),
        Phase::Drain => drain(&mut c.stream),
    }
}

/// What reading a request head came to.
#[derive(Debug, PartialEq)]
enum HeadRead {
    /// Not whole yet; wait for more.
    More,
    /// Whole: the head is the first `usize` bytes (with its blank line).
    Whole(usize),
    TooLarge,
    /// The client closed without sending anything.
    Closed,
    /// The client closed its side within the head.
    Truncated,
}

/// Reads what has arrived of a request head into `buf`, never past `max + 1` bytes.
fn read_head(stream: &mut impl Read, buf: &mut Vec<u8>, max: usize) -> HeadRead {
    let mut chunk = [0u8; 4096];
    loop {
        let room = (max + 1 - buf.len()).min(chunk.len());
        match stream.read(&mut chunk[..room]) {
            Ok(0) if buf.is_empty() => return HeadRead::Closed,
            Ok(0) => return HeadRead::Truncated,
            Ok(n) => {
                // A blank line may straddle two reads: look from a little before.
                let from = buf.len().saturating_sub(3);
                buf.extend_from_slice(&chunk[..n]);
                match head_end(&buf[from..]) {
                    Some(end) if from + end <= max => return HeadRead::Whole(from + end),
                    Some(_) => return HeadRead::TooLarge,
                    None if buf.len() > max => return HeadRead::TooLarge,
                    None => {}
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return HeadRead::More,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return HeadRead::Closed,
        }
    }
}

/// The length of the head in `b` up to and including the blank line that ends it
/// (CRLF CRLF, or bare LFs, which RFC 9112 §2.2 lets a server accept).
fn head_end(b: &[u8]) -> Option<usize> {
    (0..b.len()).find_map(|i| {
        let rest = &b[i..];
        if rest.starts_with(b"\n\n") {
            Some(i + 2)
        } else if rest.starts_with(b"\n\r\n") {
            Some(i + 3)
        } else {
            None
        }
    })
}

/// Starts writing `out` as the connection's reply. False when the connection is done.
fn reply(c: &mut Conn, out: Vec<u8>, lim: Limits) -> bool {
    c.phase = Phase::Reply { out, sent: 0 };
    c.due = Instant::now() + lim.deadline;
    write_out(c, lim)
}

/// Writes what it can of the reply; once all of it is out, shuts our side and
/// moves to [`Phase::Drain`]. False when the connection is done.
fn write_out(c: &mut Conn, lim: Limits) -> bool {
    let Phase::Reply { out, sent } = &mut c.phase else { return true };
    while *sent < out.len() {
        match c.stream.write(&out[*sent..]) {
            Ok(0) => return false,
            Ok(n) => *sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    if c.stream.shutdown(Shutdown::Write).is_err() {
        return false;
    }
    c.phase = Phase::Drain;
    c.due = Instant::now() + lim.deadline;
    drain(&mut c.stream)
}

/// Reads and drops what the client still sends, a bounded amount per wake-up.
/// False once it has closed.
fn drain(stream: &mut impl Read) -> bool {
    let mut chunk = [0u8; 4096];
    for _ in 0..16 {
        match stream.read(&mut chunk) {
            Ok(0) => return false,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

/// Whether a connection is past its deadline (and so closed, with a reason logged).
fn expired(c: &Conn, now: Instant, lim: Limits) -> bool {
    if now < c.due {
        return false;
    }
    match &c.phase {
        Phase::Head(buf) => log_limit::limited_warn!(
            target: "vnvme::metrics",
            "metrics connection closed: no whole request within {:?} ({} bytes came)",
            lim.deadline,
            buf.len()
        ),
        Phase::Reply { out, sent } => log_limit::limited_warn!(
            target: "vnvme::metrics",
            "metrics connection closed: the client took {sent} of {} reply bytes within {:?}",
            out.len(),
            lim.deadline
        ),
        // The reply is out; the client only kept its side open.
        Phase::Drain => debug!(target: "vnvme::metrics", "metrics connection closed after the reply"),
    }
    true
}

/// The HTTP statuses this server answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Ok,
    BadRequest,
    NotFound,
    MethodNotAllowed,
    TooLarge,
    Unavailable,
}

impl Status {
    fn line(self) -> &'static str {
        match self {
            Status::Ok => "200 OK",
            Status::BadRequest => "400 Bad Request",
            Status::NotFound => "404 Not Found",
            Status::MethodNotAllowed => "405 Method Not Allowed",
            Status::TooLarge => "431 Request Header Fields Too Large",
            Status::Unavailable => "503 Service Unavailable",
        }
    }
}

/// The `Content-Type` of the server's own messages.
const TEXT: &str = "text/plain; charset=utf-8";

/// What `GET /` says.
const HINT: &[u8] = b"vnvme: Prometheus metrics are at /metrics\n";

/// A whole response: status line, headers, then the body unless `head_only`
/// (`Content-Length` is the body's either way, as HEAD requires).
fn response(status: Status, content_type: &str, body: &[u8], head_only: bool) -> Vec<u8> {
    let allow = if status == Status::MethodNotAllowed { "Allow: GET, HEAD\r\n" } else { "" };
    let mut out = format!(
        "HTTP/1.1 {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        status.line(),
        body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(body);
    }
    out
}

/// The response to one request head.
fn answer(head: &[u8], source: &dyn Fn() -> Result<String, String>) -> Vec<u8> {
    let req = match parse(head) {
        Ok(r) => r,
        Err(why) => {
            log_limit::limited_warn!(target: "vnvme::metrics", "malformed metrics request: {why}");
            return response(Status::BadRequest, TEXT, format!("{why}\n").as_bytes(), false);
        }
    };
    let head_only = req.method == "HEAD";
    let known = matches!(req.path, "/" | "/metrics");
    if !known {
        return response(Status::NotFound, TEXT, b"not found: the metrics are at /metrics\n", head_only);
    }
    if !matches!(req.method, "GET" | "HEAD") {
        return response(Status::MethodNotAllowed, TEXT, b"only GET and HEAD\n", false);
    }
    if req.path == "/" {
        return response(Status::Ok, TEXT, HINT, head_only);
    }
    // A panicking source must not take the endpoint down with it.
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(source)) {
        Ok(Ok(text)) => response(Status::Ok, CONTENT_TYPE, text.as_bytes(), head_only),
        Ok(Err(why)) => {
            debug!(target: "vnvme::metrics", "metrics unavailable: {why}");
            response(Status::Unavailable, TEXT, format!("{why}\n").as_bytes(), head_only)
        }
        Err(_) => response(Status::Unavailable, TEXT, b"collecting the metrics failed\n", head_only),
    }
}

/// What this server reads of a request.
#[derive(Debug, PartialEq)]
struct Request<'a> {
    method: &'a str,
    /// The target's path, without a query.
    path: &'a str,
}

/// Reads a request head (RFC 9112 §3): `METHOD SP TARGET SP HTTP/1.x`, then header
/// lines of `name: value`. Header values are not used.
fn parse(head: &[u8]) -> Result<Request<'_>, &'static str> {
    let text = std::str::from_utf8(head).map_err(|_| "the request head is not UTF-8")?;
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let line = lines.next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("the request line is not METHOD TARGET HTTP/1.1");
    };
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if method.is_empty() || !method.bytes().all(tchar) {
        return Err("the method is not a token");
    }
    if !matches!(version, "HTTP/1.0" | "HTTP/1.1") {
        return Err("only HTTP/1.0 and HTTP/1.1 are served");
    }
    if !target.starts_with('/') || target.bytes().any(|b| b.is_ascii_control()) {
        return Err("the request target is not an absolute path");
    }
    for l in lines.take_while(|l| !l.is_empty()) {
        match l.split_once(':') {
            Some((name, _)) if !name.is_empty() && name.bytes().all(tchar) => {}
            _ => return Err("a header line is not NAME: VALUE"),
        }
    }
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    Ok(Request { method, path })
}

#[cfg(test)]
mod tests;
