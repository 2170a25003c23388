//! The one bounded socket server under the service's endpoints (the control socket
//! and the metrics endpoint): a thread that serves every connection by `poll(2)` on
//! nonblocking sockets, and a [`Protocol`] that says where a request ends and what
//! to answer.
//!
//! Bounds, so that a local client, careless or hostile, costs little and never holds
//! up another for longer than a request takes:
//! - at most [`Bounds::connections`] at once; one more is answered with the
//!   protocol's "busy" reply and closed;
//! - a request of at most [`Bounds::max_request`] bytes, whole within
//!   [`Bounds::deadline`] of its first byte (of the accept, for a protocol with one
//!   request per connection), an absolute deadline that more bytes do not extend;
//! - a reply taken within the deadline of its first byte being queued, and at most
//!   [`Bounds::max_pending`] bytes of replies waiting for a client that sends
//!   without reading;
//! - between requests, a connection may be idle for [`Bounds::idle`] (`None`: one
//!   request per connection);
//! - a connection closed by us is shut for writing first and drained until the
//!   client closes or the deadline passes: closing over unread input resets the
//!   connection (RST over TCP, ECONNRESET over a UNIX socket), which can destroy a
//!   reply the client has not read yet (RFC 9112 §9.6).
//!
//! Log lines a peer can cause are rate-limited. Sockets are made nonblocking with
//! `fcntl`: the seccomp sandbox installed after start-up refuses `FIONBIO`, and
//! `clone`, so one thread serves them all.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use tracing::debug;
use vfio_user_server::fds::set_blocking;

/// A bound, nonblocking listening socket.
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    /// Another descriptor of the listening socket (for a process taking over).
    pub fn try_clone_fd(&self) -> io::Result<OwnedFd> {
        match self {
            Listener::Tcp(l) => l.try_clone().map(Into::into),
            Listener::Unix(l) => l.try_clone().map(Into::into),
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

/// An accepted connection's socket.
#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
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

/// The limits one server keeps.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Largest request, its terminator included.
    pub max_request: usize,
    /// A request must be whole, a reply taken, and a closing connection drained,
    /// each within this of its start.
    pub deadline: Duration,
    /// How long a connection may wait between requests; `None`: one request per
    /// connection, whole within the deadline of the accept.
    pub idle: Option<Duration>,
    /// Connections served at once.
    pub connections: usize,
    /// Reply bytes that may wait for a client that does not read them.
    pub max_pending: usize,
}

/// What to do with one whole request.
#[derive(Debug)]
pub enum Answer {
    /// Send this.
    Reply(Vec<u8>),
    /// Send nothing (a notification).
    Nothing,
    /// Send this, then close (for a protocol with one request per connection,
    /// every reply is the last).
    Last(Vec<u8>),
    /// Close at once: the protocol has taken the connection (a clone of its socket),
    /// or will not serve it.
    Close,
}

/// A request–reply protocol the server frames and answers.
pub trait Protocol {
    /// Names the endpoint in logs ("control", "metrics").
    fn name(&self) -> &'static str;
    /// The length of the first whole request in `buf`, its terminator included;
    /// `None` while it is not whole.
    fn frame(&self, buf: &[u8]) -> Option<usize>;
    /// What to do with one whole request (as [`Protocol::frame`] cut it).
    fn answer(&mut self, request: &[u8], stream: &Stream) -> Answer;
    /// The reply to a request over the size bound (the connection closes after it).
    fn too_large(&self, max: usize) -> Vec<u8>;
    /// The reply to a request its client stopped sending halfway (it shut its side).
    fn truncated(&self) -> Option<Vec<u8>>;
    /// The reply to a connection over the cap, `open` being the cap.
    fn busy(&self, open: usize) -> Vec<u8>;
}

/// Starts a thread named `thread` serving `listener` with `protocol` until the
/// process ends.
pub fn spawn<P: Protocol + Send + 'static>(
    thread: &str,
    listener: Listener,
    protocol: P,
    bounds: Bounds,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(thread.into())
        .spawn(move || Server::new(listener, protocol, bounds).run())
}

/// How long the listener rests after an accept error other than "no one waiting"
/// (e.g. out of descriptors), rather than waking the loop again at once.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Where a connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading requests and answering them.
    Open,
    /// No more requests: writing what is owed, then shutting our side.
    Closing,
    /// Our side is shut; reading until the client closes (since when).
    Draining(Instant),
}

#[derive(Debug)]
struct Conn {
    stream: Stream,
    /// What has come of the next request.
    inbuf: Vec<u8>,
    /// Replies not yet taken, `sent` bytes of the first already gone.
    out: Vec<u8>,
    sent: usize,
    state: State,
    /// When the first byte of the request being read came (the accept, for one
    /// request per connection).
    reading: Option<Instant>,
    /// When the reply waiting in `out` was queued.
    writing: Option<Instant>,
    /// The last time anything moved.
    last: Instant,
}

impl Conn {
    /// When this connection must next have moved on, and why not if it has not.
    fn due(&self, b: &Bounds) -> (Instant, &'static str) {
        let mut due = (self.last + b.idle.unwrap_or(b.deadline), "idle");
        let mut at = |t: Option<Instant>, why| {
            if let Some(t) = t.map(|t| t + b.deadline) {
                if t < due.0 || due.1 == "idle" {
                    due = (t, why);
                }
            }
        };
        at(self.reading, "a request did not arrive whole within the deadline");
        at(self.writing, "the client did not read its reply within the deadline");
        if let State::Draining(since) = self.state {
            at(Some(since), "drained");
        }
        due
    }

    fn pending(&self) -> bool {
        self.sent < self.out.len()
    }
}

struct Server<P> {
    listener: Listener,
    protocol: P,
    bounds: Bounds,
    conns: Vec<Conn>,
    accept_paused: Option<Instant>,
}

impl<P: Protocol> Server<P> {
    fn new(listener: Listener, protocol: P, bounds: Bounds) -> Self {
        Server { listener, protocol, bounds, conns: Vec::new(), accept_paused: None }
    }

    fn run(mut self) {
        loop {
            self.turn();
        }
    }

    /// One poll and what it reported.
    fn turn(&mut self) {
        let now = Instant::now();
        if self.accept_paused.is_some_and(|t| now >= t) {
            self.accept_paused = None;
        }
        let wake = self.conns.iter().map(|c| c.due(&self.bounds).0).chain(self.accept_paused).min();
        let ts = wake.map(|w| {
            let d = w.saturating_duration_since(now).max(Duration::from_millis(1));
            Timespec { tv_sec: d.as_secs() as i64, tv_nsec: d.subsec_nanos() as i64 }
        });
        let mut fds = Vec::with_capacity(self.conns.len() + 1);
        let listen = if self.accept_paused.is_some() { PollFlags::empty() } else { PollFlags::IN };
        fds.push(PollFd::new(&self.listener, listen));
        for c in &self.conns {
            let mut f = PollFlags::empty();
            if c.state != State::Closing || !c.pending() {
                f |= PollFlags::IN;
            }
            if c.pending() {
                f |= PollFlags::OUT;
            }
            fds.push(PollFd::new(&c.stream, f));
        }
        match poll(&mut fds, ts.as_ref()) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => return,
            Err(e) => {
                log_limit::limited_warn!(
                    target: "vnvme::endpoint",
                    "{} socket poll failed: {e}",
                    self.protocol.name()
                );
                std::thread::sleep(ACCEPT_PAUSE);
                return;
            }
        }
        let ready: Vec<PollFlags> = fds.iter().map(|f| f.revents()).collect();
        drop(fds);
        // Backwards, so that swap_remove moves only connections already seen.
        for i in (0..self.conns.len()).rev() {
            let r = ready[i + 1];
            if !r.is_empty() && !self.step(i, r) {
                self.conns.swap_remove(i);
            }
        }
        if ready[0].contains(PollFlags::IN) && !self.accept() {
            self.accept_paused = Some(Instant::now() + ACCEPT_PAUSE);
        }
        self.expire(Instant::now());
    }

    /// Takes every waiting connection; refuses those over the cap. False after an
    /// accept error that calls for a pause.
    fn accept(&mut self) -> bool {
        let name = self.protocol.name();
        loop {
            match self.listener.accept() {
                Ok(mut stream) => {
                    let cap = self.bounds.connections;
                    if self.conns.len() >= cap {
                        log_limit::limited_warn!(
                            target: "vnvme::endpoint",
                            "{name} connection refused: {cap} are open already"
                        );
                        // One try, without waiting: a fresh socket's buffer takes it.
                        let _ = stream.write(&self.protocol.busy(cap));
                        let _ = stream.shutdown(Shutdown::Write);
                        // What the client sent already is read before the close (a
                        // few KiB at most, without waiting), so that the close does
                        // not reset the connection over it and destroy the reply.
                        let mut sink = [0u8; 1024];
                        for _ in 0..4 {
                            if !matches!(stream.read(&mut sink), Ok(n) if n > 0) {
                                break;
                            }
                        }
                        continue;
                    }
                    debug!(target: "vnvme::endpoint", "{name} connection opened");
                    let now = Instant::now();
                    let one_shot = self.bounds.idle.is_none();
                    self.conns.push(Conn {
                        stream,
                        inbuf: Vec::new(),
                        out: Vec::new(),
                        sent: 0,
                        state: State::Open,
                        reading: one_shot.then_some(now),
                        writing: None,
                        last: now,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                // Gone before we took it, or a signal: nothing to pause for.
                Err(e)
                    if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted) => {}
                Err(e) => {
                    log_limit::limited_warn!(target: "vnvme::endpoint", "{name} socket accept failed: {e}");
                    return false;
                }
            }
        }
    }

    /// Moves connection `i` on after poll reported `r` for it. False when it is done.
    fn step(&mut self, i: usize, r: PollFlags) -> bool {
        if r.intersects(PollFlags::ERR | PollFlags::NVAL) {
            return false;
        }
        if r.intersects(PollFlags::IN | PollFlags::HUP) {
            let keep = match self.conns[i].state {
                State::Open => self.read(i),
                State::Closing => true,
                State::Draining(_) => drain(&mut self.conns[i].stream),
            };
            if !keep {
                return false;
            }
        }
        self.write(i)
    }

    /// Reads what the client sent and answers every whole request. False when the
    /// connection is done.
    fn read(&mut self, i: usize) -> bool {
        let (b, name) = (self.bounds, self.protocol.name());
        let mut chunk = [0u8; 4096];
        loop {
            let c = &mut self.conns[i];
            match c.stream.read(&mut chunk) {
                Ok(0) => {
                    // The client is done sending: what it is owed goes out if it can.
                    if !c.inbuf.is_empty() {
                        log_limit::limited_warn!(
                            target: "vnvme::endpoint",
                            "{name} client closed its side within a request ({} bytes came)",
                            c.inbuf.len()
                        );
                        c.inbuf.clear();
                        if let Some(reply) = self.protocol.truncated() {
                            queue(c, &reply);
                        }
                    } else if c.out.is_empty() && c.reading.is_some() {
                        debug!(target: "vnvme::endpoint", "{name} connection closed before a request");
                    }
                    c.state = State::Closing;
                    return true;
                }
                Ok(n) => {
                    c.last = Instant::now();
                    c.reading.get_or_insert(c.last);
                    c.inbuf.extend_from_slice(&chunk[..n]);
                    if !self.answer_whole(i) {
                        return false;
                    }
                    let c = &mut self.conns[i];
                    if c.state != State::Open {
                        return true;
                    }
                    if c.inbuf.len() > b.max_request {
                        log_limit::limited_warn!(
                            target: "vnvme::endpoint",
                            "{name} request over {} bytes: answered and closed",
                            b.max_request
                        );
                        let reply = self.protocol.too_large(b.max_request);
                        let c = &mut self.conns[i];
                        c.inbuf.clear();
                        c.reading = None;
                        queue(c, &reply);
                        c.state = State::Closing;
                        return true;
                    }
                    if c.out.len() > b.max_pending {
                        log_limit::limited_warn!(
                            target: "vnvme::endpoint",
                            "{name} client does not read its replies: connection closed"
                        );
                        return false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
    }

    /// Answers every whole request in connection `i`'s input. False when the
    /// connection is done.
    fn answer_whole(&mut self, i: usize) -> bool {
        let b = self.bounds;
        while self.conns[i].state == State::Open {
            let c = &mut self.conns[i];
            let Some(len) = self.protocol.frame(&c.inbuf) else { break };
            if len > b.max_request {
                // Whole, but too large: left for the size check.
                break;
            }
            let request: Vec<u8> = c.inbuf.drain(..len).collect();
            let answer = self.protocol.answer(&request, &c.stream);
            let c = &mut self.conns[i];
            c.reading = (!c.inbuf.is_empty()).then_some(c.last);
            match answer {
                Answer::Reply(r) => queue(c, &r),
                Answer::Nothing => {}
                Answer::Last(r) => {
                    queue(c, &r);
                    c.state = State::Closing;
                }
                Answer::Close => return false,
            }
            if b.idle.is_none() {
                c.state = State::Closing;
            }
        }
        true
    }

    /// Writes what it can of the replies; once a closing connection's are out,
    /// shuts our side and drains. False when the connection is done.
    fn write(&mut self, i: usize) -> bool {
        let c = &mut self.conns[i];
        while c.pending() {
            match c.stream.write(&c.out[c.sent..]) {
                Ok(0) => return false,
                Ok(n) => {
                    c.sent += n;
                    c.last = Instant::now();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        c.out.clear();
        c.sent = 0;
        c.writing = None;
        if c.state == State::Closing {
            if c.stream.shutdown(Shutdown::Write).is_err() {
                return false;
            }
            c.state = State::Draining(Instant::now());
            return drain(&mut c.stream);
        }
        true
    }

    /// Closes connections past a deadline or idle too long.
    fn expire(&mut self, now: Instant) {
        let (b, name) = (self.bounds, self.protocol.name());
        self.conns.retain(|c| {
            let (due, why) = c.due(&b);
            if now < due {
                return true;
            }
            match why {
                "idle" | "drained" => debug!(target: "vnvme::endpoint", "{name} connection closed: {why}"),
                _ => log_limit::limited_warn!(
                    target: "vnvme::endpoint",
                    "{name} connection closed: {why} ({} request bytes came, {} of {} reply bytes taken)",
                    c.inbuf.len(),
                    c.sent,
                    c.out.len()
                ),
            }
            false
        });
    }
}

/// Queues a reply; its deadline runs from the first byte queued.
fn queue(c: &mut Conn, reply: &[u8]) {
    if reply.is_empty() {
        return;
    }
    if !c.pending() {
        c.writing = Some(Instant::now());
    }
    c.out.extend_from_slice(reply);
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

#[cfg(test)]
mod tests {
    //! The server's own bounds, with a line protocol of its own: each line is
    //! answered by itself upper-cased, `BIG` by a mebibyte.

    use std::os::unix::net::UnixListener;

    use super::*;

    struct Upper;

    impl Protocol for Upper {
        fn name(&self) -> &'static str {
            "test"
        }
        fn frame(&self, buf: &[u8]) -> Option<usize> {
            buf.iter().position(|&b| b == b'\n').map(|e| e + 1)
        }
        fn answer(&mut self, line: &[u8], _: &Stream) -> Answer {
            match line {
                b"BIG\n" => Answer::Reply(vec![b'x'; 1 << 20]),
                b"QUIET\n" => Answer::Nothing,
                b"BYE\n" => Answer::Last(b"bye\n".to_vec()),
                _ => Answer::Reply(line.to_ascii_uppercase()),
            }
        }
        fn too_large(&self, _: usize) -> Vec<u8> {
            b"too large\n".to_vec()
        }
        fn truncated(&self) -> Option<Vec<u8>> {
            None
        }
        fn busy(&self, open: usize) -> Vec<u8> {
            format!("busy: {open}\n").into_bytes()
        }
    }

    const TEST: Bounds = Bounds {
        max_request: 64,
        deadline: Duration::from_millis(300),
        idle: Some(Duration::from_millis(300)),
        connections: 2,
        max_pending: 2 << 20,
    };

    /// A server on a fresh socket; a client connects to the path it returns.
    fn serve(bounds: Bounds) -> std::path::PathBuf {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("vnvme-endpoint-{}-{n}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let l = UnixListener::bind(&path).unwrap();
        set_blocking(&l, false).unwrap();
        spawn("test-endpoint", Listener::Unix(l), Upper, bounds).unwrap();
        path
    }

    /// A client whose reads give up after 10 s (a server that never closes fails).
    fn connect(path: &std::path::Path) -> UnixStream {
        let s = UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    /// Everything until the server closes (a reset ends it too).
    fn until_closed(s: &mut UnixStream) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return out,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return out,
                Err(e) => panic!("the server did not close the connection: {e}"),
            }
        }
    }

    #[test]
    fn pipelined_requests_are_answered_in_order_and_the_last_closes() {
        let path = serve(TEST);
        let mut c = connect(&path);
        c.write_all(b"one\nQUIET\ntwo\nBYE\nnot answered\n").unwrap();
        assert_eq!(until_closed(&mut c), b"ONE\nTWO\nbye\n");
    }

    #[test]
    fn a_request_over_the_bound_is_answered_and_closed() {
        let path = serve(TEST);
        let mut c = connect(&path);
        c.write_all(&[b'a'; 100]).unwrap();
        assert_eq!(until_closed(&mut c), b"too large\n");
    }

    #[test]
    fn idle_and_half_sent_connections_are_closed() {
        let path = serve(TEST);
        let mut idle = connect(&path);
        idle.write_all(b"hi\n").unwrap();
        assert_eq!(until_closed(&mut idle), b"HI\n", "idle after a reply: closed");
        let mut half = connect(&path);
        half.write_all(b"never ends").unwrap();
        assert_eq!(until_closed(&mut half), b"", "a request not whole by the deadline: closed");
    }

    #[test]
    fn one_connection_over_the_cap_is_told_and_closed() {
        let path =
            serve(Bounds { idle: Some(Duration::from_secs(60)), deadline: Duration::from_secs(60), ..TEST });
        let mut held: Vec<UnixStream> = (0..2).map(|_| connect(&path)).collect();
        for h in &mut held {
            h.write_all(b"x\n").unwrap();
            let mut b = [0u8; 2];
            h.read_exact(&mut b).unwrap();
        }
        let mut over = connect(&path);
        assert_eq!(until_closed(&mut over), b"busy: 2\n");
        // Shut, not just dropped: a process another test spawns meanwhile holds a
        // copy of the descriptor until it execs, keeping the connection open.
        let gone = held.pop().expect("two held");
        gone.shutdown(std::net::Shutdown::Both).unwrap();
        drop(gone);
        // The server may take the next client before it sees the close: try again.
        let served = (0..50).any(|_| {
            let mut c = connect(&path);
            c.write_all(b"again\n").unwrap();
            let mut b = [0u8; 6];
            c.read_exact(&mut b).is_ok() && &b == b"AGAIN\n" || {
                std::thread::sleep(Duration::from_millis(10));
                false
            }
        });
        assert!(served, "a slot given up is used again");
    }

    #[test]
    fn a_client_that_does_not_read_its_replies_is_closed() {
        let path =
            serve(Bounds { idle: Some(Duration::from_secs(60)), deadline: Duration::from_secs(60), ..TEST });
        let mut c = connect(&path);
        // Ten mebibytes asked for, none read: the server stops at its 2 MiB bound
        // (plus what the socket buffers hold) and closes.
        for _ in 0..10 {
            if c.write_all(b"BIG\n").is_err() {
                break;
            }
        }
        let got = until_closed(&mut c).len();
        assert!(got < 5 << 20, "{got} reply bytes for a client that never read");
    }
}
