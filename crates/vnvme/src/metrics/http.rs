//! The metrics endpoint: a small HTTP/1.1 server on one thread (`vnvme-metrics`)
//! that answers `GET /metrics` (and `HEAD`) with what a source closure returns.
//!
//! Only loopback TCP addresses and UNIX sockets (owner-only) are served: the
//! metrics tell namespaces, backends and I/O rates, and there is no TLS or
//! authentication here; a proxy in front does that for remote scrapes.
//!
//! Served by the service's one bounded socket server ([`crate::endpoint`]): one
//! request per connection (`Connection: close`), a request head of at most
//! [`MAX_HEAD`] bytes that must be whole within [`DEADLINE`] of the connection being
//! accepted, a reply that must be taken within [`DEADLINE`], at most
//! [`MAX_CONNECTIONS`] connections at once (more are answered 503 and closed).
//! Requests carry no body (GET and HEAD); anything after the head is read and
//! dropped. The server's thread calls the source itself; a scrape waits for the
//! device thread as long as the source lets it, and other connections wait with it.

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::debug;
use vfio_user_server::fds::set_blocking;
use vfio_user_server::socket_file::SocketFile;

pub use crate::endpoint::Listener;
use crate::endpoint::{Answer, Bounds, Protocol, Stream};

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

/// Where a listener listens (with the port the system chose for port 0).
pub fn local_addr(l: &Listener) -> io::Result<MetricsAddr> {
    match l {
        Listener::Tcp(l) => l.local_addr().map(MetricsAddr::Tcp),
        Listener::Unix(l) => l
            .local_addr()?
            .as_pathname()
            .map(|p| MetricsAddr::Unix(p.to_owned()))
            .ok_or_else(|| io::Error::other("unnamed UNIX socket")),
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
    spawn_with(listener, source, BOUNDS)
}

/// The endpoint's bounds (tests shorten the deadline).
const BOUNDS: Bounds = Bounds {
    max_request: MAX_HEAD,
    deadline: DEADLINE,
    idle: None,
    connections: MAX_CONNECTIONS,
    // One reply per connection, whatever its size.
    max_pending: usize::MAX,
};

fn spawn_with(listener: Listener, source: Source, bounds: Bounds) -> io::Result<JoinHandle<()>> {
    crate::endpoint::spawn("vnvme-metrics", listener, Http { source }, bounds)
}

/// HTTP/1.1, one GET or HEAD per connection.
struct Http {
    source: Source,
}

impl Protocol for Http {
    fn name(&self) -> &'static str {
        "metrics"
    }

    fn frame(&self, buf: &[u8]) -> Option<usize> {
        head_end(buf)
    }

    fn answer(&mut self, head: &[u8], _: &Stream) -> Answer {
        Answer::Last(answer(head, &*self.source))
    }

    fn too_large(&self, max: usize) -> Vec<u8> {
        response(Status::TooLarge, TEXT, format!("request head over {max} bytes\n").as_bytes(), false)
    }

    fn truncated(&self) -> Option<Vec<u8>> {
        Some(response(Status::BadRequest, TEXT, b"incomplete request head\n", false))
    }

    fn busy(&self, _: usize) -> Vec<u8> {
        response(Status::Unavailable, TEXT, b"too many metrics connections\n", false)
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
