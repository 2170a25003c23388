//! The metrics server over loopback TCP and UNIX sockets: answers, bounds, refusals.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use super::*;

const BODY: &str = "# HELP vnvme_up Test.\n# TYPE vnvme_up gauge\nvnvme_up 1\n";

/// A UNIX socket path of its own in a directory of this test process.
fn unix_addr() -> MetricsAddr {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!("vnvme-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    MetricsAddr::Unix(dir.join(format!("m{}.sock", N.fetch_add(1, Ordering::Relaxed))))
}

fn tcp_addr() -> MetricsAddr {
    MetricsAddr::Tcp("127.0.0.1:0".parse().unwrap())
}

/// A test server's address; its UNIX socket file (and the directory, once
/// empty) goes when the test does. The thread runs until the process ends.
struct Served(MetricsAddr);

impl std::ops::Deref for Served {
    type Target = MetricsAddr;
    fn deref(&self) -> &MetricsAddr {
        &self.0
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let MetricsAddr::Unix(p) = &self.0 {
            let _ = std::fs::remove_file(p);
            let _ = p.parent().map(std::fs::remove_dir);
        }
    }
}

fn start(addr: MetricsAddr, lim: Bounds, source: Source) -> Served {
    // The socket file is the test's (its directory goes with it).
    let (l, _file) = bind(&addr).unwrap();
    let at = local_addr(&l).unwrap();
    spawn_with(l, source, lim).unwrap();
    Served(at)
}

fn serving(addr: MetricsAddr, lim: Bounds) -> Served {
    start(addr, lim, Box::new(|| Ok(BODY.to_owned())))
}

/// A client connection whose reads give up after 10 s.
fn connect(at: &MetricsAddr) -> Stream {
    let s = match at {
        MetricsAddr::Tcp(a) => Stream::Tcp(TcpStream::connect(a).unwrap()),
        MetricsAddr::Unix(p) => Stream::Unix(UnixStream::connect(p).unwrap()),
    };
    let t = Some(Duration::from_secs(10));
    match &s {
        Stream::Tcp(c) => c.set_read_timeout(t).unwrap(),
        Stream::Unix(c) => c.set_read_timeout(t).unwrap(),
    }
    s
}

/// Everything the server sends on `c` until it closes.
fn read_all(c: &mut Stream) -> String {
    let mut out = Vec::new();
    c.read_to_end(&mut out).expect("the server closes the connection");
    String::from_utf8(out).unwrap()
}

/// Sends `request` on a new connection; the whole response.
fn exchange(at: &MetricsAddr, request: &str) -> String {
    try_exchange(at, request).expect("the server answers and closes the connection")
}

/// [`exchange`], where the server may also refuse the connection: a request that
/// reaches it after the refusal was sent and the socket drained is reset.
fn try_exchange(at: &MetricsAddr, request: &str) -> io::Result<String> {
    let mut c = connect(at);
    c.write_all(request.as_bytes())?;
    let mut out = Vec::new();
    c.read_to_end(&mut out)?;
    Ok(String::from_utf8(out).unwrap())
}

fn header<'a>(resp: &'a str, name: &str) -> Option<&'a str> {
    let head = resp.split("\r\n\r\n").next()?;
    head.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
}

#[test]
fn addresses_parse_and_remote_ones_are_refused() {
    let tcp = |s: &str| MetricsAddr::Tcp(s.parse().unwrap());
    assert_eq!("127.0.0.1:9464".parse(), Ok(tcp("127.0.0.1:9464")));
    assert_eq!("[::1]:9464".parse(), Ok(tcp("[::1]:9464")));
    assert_eq!("localhost:9464".parse(), Ok(tcp("127.0.0.1:9464")));
    assert_eq!("127.1.2.3:1".parse(), Ok(tcp("127.1.2.3:1")));
    assert_eq!("unix:/run/m.sock".parse(), Ok(MetricsAddr::Unix("/run/m.sock".into())));
    assert_eq!("/run/m.sock".parse(), Ok(MetricsAddr::Unix("/run/m.sock".into())));
    for remote in ["0.0.0.0:9464", "[::]:9464", "192.0.2.1:9464", "[::ffff:192.0.2.1]:80"] {
        let e = remote.parse::<MetricsAddr>().unwrap_err();
        assert!(e.contains("not a loopback address") && e.contains("proxy"), "{remote}: {e}");
    }
    for bad in ["unix:", "localhost:x", "9464", "example.org:9464", ""] {
        assert!(bad.parse::<MetricsAddr>().is_err(), "{bad:?}");
    }
    assert_eq!(tcp("127.0.0.1:9464").to_string(), "127.0.0.1:9464");
    assert_eq!(MetricsAddr::Unix("/m".into()).to_string(), "unix:/m");
    let e = bind(&tcp("192.0.2.1:9464")).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "bind checks too: {e}");
}

#[test]
fn request_heads_are_read_strictly_enough() {
    let ok = |m, p| Ok(Request { method: m, path: p });
    assert_eq!(parse(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), ok("GET", "/metrics"));
    assert_eq!(parse(b"HEAD /metrics?x=1 HTTP/1.0\n\n"), ok("HEAD", "/metrics"));
    for bad in [
        &b"GET /metrics\r\n\r\n"[..],
        b"GET  /metrics HTTP/1.1\r\n\r\n",
        b"GET /metrics HTTP/2\r\n\r\n",
        b"GET metrics HTTP/1.1\r\n\r\n",
        b"G(T /metrics HTTP/1.1\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nno colon\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nbad name: x\r\n\r\n",
        b"GET /\xff HTTP/1.1\r\n\r\n",
    ] {
        assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
    }
    assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nrest"), Some(18));
    assert_eq!(head_end(b"GET / HTTP/1.1\n\nrest"), Some(16));
    assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n"), None);
}

/// Every kind of exchange the server answers, on one transport.
fn answers(at: &MetricsAddr) {
    let r = exchange(at, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
    assert_eq!(header(&r, "Content-Type"), Some("text/plain; version=0.0.4; charset=utf-8"));
    assert_eq!(header(&r, "Content-Length"), Some(BODY.len().to_string().as_str()));
    assert_eq!(header(&r, "Connection"), Some("close"));
    assert!(r.ends_with(&format!("\r\n\r\n{BODY}")), "{r}");

    let r = exchange(at, "HEAD /metrics HTTP/1.1\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("\r\n\r\n"), "no body: {r}");
    assert_eq!(header(&r, "Content-Length"), Some(BODY.len().to_string().as_str()));

    let r = exchange(at, "GET / HTTP/1.0\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n") && r.contains("/metrics"), "{r}");
    let r = exchange(at, "GET /nothing HTTP/1.1\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 404 "), "{r}");
    let r = exchange(at, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 405 "), "{r}");
    assert_eq!(header(&r, "Allow"), Some("GET, HEAD"));
    let r = exchange(at, "HELLO\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 400 "), "{r}");

    // Sent in pieces, the way a slow client would.
    let mut c = connect(at);
    for piece in ["GET /met", "rics HTTP/1.1\r", "\n\r", "\n"] {
        c.write_all(piece.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(read_all(&mut c).starts_with("HTTP/1.1 200 OK\r\n"));
}

/// The size and time bounds, on one transport, with a short deadline.
fn bounds(at: &MetricsAddr, deadline: Duration) {
    // A head over the limit: refused and closed.
    let big = format!("GET /metrics HTTP/1.1\r\nX-Pad: {}\r\n\r\n", "a".repeat(MAX_HEAD));
    let r = exchange(at, &big);
    assert!(r.starts_with("HTTP/1.1 431 "), "{r}");

    // Half a request, then nothing: closed without a reply, and not before the
    // deadline (it runs from the accept, which comes after `t`). The client's read
    // gives up after 10 s, so a server that never closed fails the test.
    let t = Instant::now();
    let mut c = connect(at);
    c.write_all(b"GET /metrics HTT").unwrap();
    assert_eq!(read_all(&mut c), "", "closed without a reply");
    assert!(t.elapsed() >= deadline, "closed {:?} after the accept, before the deadline", t.elapsed());
}

/// Eight clients that stall hold every slot; a ninth is turned away at once, and
/// a slot given up is used again. The deadline must outlast the test.
fn crowd(at: &MetricsAddr) {
    let mut stalled: Vec<Stream> = (0..MAX_CONNECTIONS).map(|_| connect(at)).collect();
    for s in &mut stalled {
        s.write_all(b"GET /").unwrap();
    }
    let r = read_all(&mut connect(at));
    assert!(r.starts_with("HTTP/1.1 503 ") && r.contains("too many"), "{r}");
    drop(stalled.pop());
    // The server may see the new client before the old one's close: try again.
    let served = (0..50).any(|_| {
        let r = try_exchange(at, "GET /metrics HTTP/1.1\r\n\r\n").unwrap_or_default();
        r.starts_with("HTTP/1.1 200 ") || {
            std::thread::sleep(Duration::from_millis(10));
            false
        }
    });
    assert!(served, "a slot freed is used again");
}

const SHORT: Duration = Duration::from_millis(200);

fn short_limits() -> Bounds {
    Bounds { deadline: SHORT, ..BOUNDS }
}

#[test]
fn serves_over_a_unix_socket_owner_only() {
    let at = serving(unix_addr(), BOUNDS);
    let MetricsAddr::Unix(p) = &*at else { panic!("{}", *at) };
    assert_eq!(std::fs::metadata(p).unwrap().permissions().mode() & 0o777, 0o600);
    answers(&at);
}

#[test]
fn serves_over_loopback_tcp() {
    answers(&serving(tcp_addr(), BOUNDS));
}

#[test]
fn bounds_hold_over_a_unix_socket() {
    bounds(&serving(unix_addr(), short_limits()), SHORT);
    crowd(&serving(unix_addr(), BOUNDS));
}

#[test]
fn bounds_hold_over_loopback_tcp() {
    bounds(&serving(tcp_addr(), short_limits()), SHORT);
    crowd(&serving(tcp_addr(), BOUNDS));
}

#[test]
fn a_reply_not_taken_in_time_is_cut_off() {
    const LEN: usize = 8 << 20;
    let at = start(unix_addr(), short_limits(), Box::new(|| Ok("#".repeat(LEN))));
    let mut c = connect(&at);
    c.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    std::thread::sleep(SHORT * 3);
    // What was in the socket buffer arrives; then the connection ends.
    let mut got = Vec::new();
    let _ = c.read_to_end(&mut got);
    assert!(got.starts_with(b"HTTP/1.1 200 OK\r\n") && got.len() < LEN, "{} bytes", got.len());
}

#[test]
fn a_failing_source_is_503_with_its_message() {
    let at = start(unix_addr(), BOUNDS, Box::new(|| Err("the device thread is busy".into())));
    let r = exchange(&at, "GET /metrics HTTP/1.1\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 503 ") && r.ends_with("the device thread is busy\n"), "{r}");
    let at = start(unix_addr(), BOUNDS, Box::new(|| panic!("a bug in the source")));
    let r = exchange(&at, "GET /metrics HTTP/1.1\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 503 "), "{r}");
    let r = exchange(&at, "GET / HTTP/1.1\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 200 "), "the thread survives: {r}");
}
