//! The control socket's thread: accepts connections, frames requests by line with
//! the bounds of `control` (size, deadline, idle time, connection count), answers
//! each through `methods`, and never lets one connection hold up another for longer
//! than a request takes.

use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use serde_json::Value;
use tracing::{debug, info};

use super::methods::Context;
use super::{
    code, reply_err, RpcError, IDLE_LIMIT, MAX_BATCH, MAX_CONNECTIONS, MAX_REQUEST, REQUEST_DEADLINE,
};

/// Binds the control socket at `path`, nonblocking and owner-only (0600), replacing
/// a stale socket file; refuses a path another server is listening on, or a file
/// that is not a socket.
pub fn bind(path: &Path) -> io::Result<(UnixListener, vfio_user_server::socket_file::SocketFile)> {
    crate::unix_socket::bind_owner_only(path)
}

/// Starts the control thread (`vnvme-control`) serving `listener`.
pub fn spawn(listener: UnixListener, ctx: Arc<Context>) -> io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("vnvme-control".into()).spawn(move || serve(listener, &ctx))
}

/// One connection.
#[derive(Debug)]
struct Conn {
    stream: UnixStream,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    /// When the first byte of the request being read arrived.
    begun: Option<Instant>,
    /// When the reply waiting in `out` was first tried.
    writing: Option<Instant>,
    last: Instant,
    /// Close once `out` is written.
    closing: bool,
}

fn serve(listener: UnixListener, ctx: &Context) {
    let mut conns: Vec<Conn> = Vec::new();
    loop {
        let now = Instant::now();
        let wait = next_wake(&conns, now);
        let mut fds = Vec::with_capacity(conns.len() + 1);
        fds.push(PollFd::new(&listener, PollFlags::IN));
        for c in &conns {
            let mut f = PollFlags::IN;
            if !c.out.is_empty() {
                f |= PollFlags::OUT;
            }
            fds.push(PollFd::new(&c.stream, f));
        }
        let ts = Timespec { tv_sec: wait.as_secs() as i64, tv_nsec: wait.subsec_nanos() as i64 };
        match poll(&mut fds, Some(&ts)) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                log_limit::limited_warn!(target: "vnvme::control", "control socket poll failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        }
        let ready: Vec<PollFlags> = fds.iter().map(|f| f.revents()).collect();
        drop(fds);
        for (i, r) in ready.iter().enumerate().skip(1).rev() {
            let c = &mut conns[i - 1];
            let keep = if r.intersects(PollFlags::ERR | PollFlags::NVAL) {
                false
            } else {
                let mut keep = true;
                if r.intersects(PollFlags::IN | PollFlags::HUP) {
                    keep = read(c, ctx);
                }
                if keep && !c.out.is_empty() {
                    keep = flush(c);
                }
                keep
            };
            if !keep {
                conns.swap_remove(i - 1);
            }
        }
        if ready[0].contains(PollFlags::IN) {
            accept(&listener, &mut conns);
        }
        expire(&mut conns, Instant::now());
    }
}

/// How long the poll may wait: until the earliest deadline or idle limit.
fn next_wake(conns: &[Conn], now: Instant) -> Duration {
    let mut t = IDLE_LIMIT;
    for c in conns {
        for due in [
            c.begun.map(|b| b + REQUEST_DEADLINE),
            c.writing.map(|w| w + REQUEST_DEADLINE),
            Some(c.last + IDLE_LIMIT),
        ]
        .into_iter()
        .flatten()
        {
            t = t.min(due.saturating_duration_since(now));
        }
    }
    t.max(Duration::from_millis(1))
}

fn accept(listener: &UnixListener, conns: &mut Vec<Conn>) {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                if conns.len() >= MAX_CONNECTIONS {
                    log_limit::limited_warn!(
                        target: "vnvme::control",
                        "control connection refused: {MAX_CONNECTIONS} are open already"
                    );
                    continue;
                }
                if vfio_user_server::fds::set_blocking(&stream, false).is_err() {
                    continue;
                }
                debug!(target: "vnvme::control", "control connection opened");
                let now = Instant::now();
                conns.push(Conn {
                    stream,
                    inbuf: Vec::new(),
                    out: Vec::new(),
                    begun: None,
                    writing: None,
                    last: now,
                    closing: false,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                log_limit::limited_warn!(target: "vnvme::control", "control socket accept failed: {e}");
                return;
            }
        }
    }
}

/// Reads what the connection has sent and answers every complete request. False
/// when the connection is done.
fn read(c: &mut Conn, ctx: &Context) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match c.stream.read(&mut buf) {
            Ok(0) => {
                // The client is done sending: what it is owed goes out if it can.
                let _ = flush(c);
                return false;
            }
            Ok(n) => {
                c.last = Instant::now();
                c.begun.get_or_insert(c.last);
                c.inbuf.extend_from_slice(&buf[..n]);
                while let Some(end) = c.inbuf.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = c.inbuf.drain(..=end).collect();
                    if let Some(params) = handover_request(&line) {
                        // The connection is the new process's: it carries the
                        // hand-over from here on (vfio-user framing, descriptors).
                        if let Ok(stream) = c.stream.try_clone() {
                            if crate::upgrade::hand_over(ctx, stream, &params) {
                                // The listener is the new process's now; this one
                                // exits in a moment and must not take a connection.
                                loop {
                                    std::thread::park();
                                }
                            }
                        }
                        return false;
                    }
                    if let Some(reply) = answer(&line[..line.len() - 1], ctx) {
                        c.out.extend_from_slice(reply.to_string().as_bytes());
                        c.out.push(b'\n');
                    }
                }
                c.begun = (!c.inbuf.is_empty()).then_some(c.last);
                if c.inbuf.len() > MAX_REQUEST {
                    log_limit::limited_warn!(
                        target: "vnvme::control",
                        "control request over {MAX_REQUEST} bytes: connection closed"
                    );
                    let e = RpcError::new(code::INVALID_REQUEST, format!("request over {MAX_REQUEST} bytes"));
                    c.out.extend_from_slice(reply_err(&Value::Null, &e).to_string().as_bytes());
                    c.out.push(b'\n');
                    c.inbuf.clear();
                    c.begun = None;
                    c.closing = true;
                    return flush(c);
                }
                if c.out.len() > 4 * MAX_REQUEST {
                    // A client that sends without reading what we answer.
                    log_limit::limited_warn!(
                        target: "vnvme::control",
                        "control client does not read its replies: connection closed"
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

/// Writes what is waiting. False when the connection is done.
fn flush(c: &mut Conn) -> bool {
    while !c.out.is_empty() {
        match c.stream.write(&c.out) {
            Ok(0) => return false,
            Ok(n) => {
                c.out.drain(..n);
                c.last = Instant::now();
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                c.writing.get_or_insert_with(Instant::now);
                return true;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    c.writing = None;
    !c.closing
}

/// Closes connections past a deadline or idle too long.
fn expire(conns: &mut Vec<Conn>, now: Instant) {
    conns.retain(|c| {
        let why = if c.begun.is_some_and(|b| now >= b + REQUEST_DEADLINE) {
            "a request did not arrive whole within the deadline"
        } else if c.writing.is_some_and(|w| now >= w + REQUEST_DEADLINE) {
            "the client did not read its reply within the deadline"
        } else if now >= c.last + IDLE_LIMIT {
            "idle"
        } else {
            return true;
        };
        if why == "idle" {
            debug!(target: "vnvme::control", "control connection closed: idle");
        } else {
            log_limit::limited_warn!(target: "vnvme::control", "control connection closed: {why}");
        }
        false
    });
}

/// The params of an `upgrade.handover` request line (the one request that takes its
/// connection over; `vnvme takeover` sends it alone on a connection of its own).
fn handover_request(line: &[u8]) -> Option<Value> {
    let v: Value = serde_json::from_slice(line).ok()?;
    (v.get("jsonrpc")?.as_str()? == "2.0" && v.get("method")?.as_str()? == "upgrade.handover")
        .then(|| v.get("params").cloned().unwrap_or(Value::Null))
}

/// The reply to one request line (None for a notification, which gets none).
fn answer(line: &[u8], ctx: &Context) -> Option<Value> {
    let v: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => {
            return Some(reply_err(&Value::Null, &RpcError::new(code::PARSE_ERROR, format!("not JSON: {e}"))))
        }
    };
    match v {
        Value::Array(batch) if batch.is_empty() => {
            Some(reply_err(&Value::Null, &RpcError::new(code::INVALID_REQUEST, "empty batch")))
        }
        Value::Array(batch) if batch.len() > MAX_BATCH => Some(reply_err(
            &Value::Null,
            &RpcError::new(
                code::INVALID_REQUEST,
                format!("batch of {} requests (at most {MAX_BATCH})", batch.len()),
            ),
        )),
        Value::Array(batch) => {
            let replies: Vec<Value> = batch.iter().filter_map(|r| one(r, ctx)).collect();
            (!replies.is_empty()).then_some(Value::Array(replies))
        }
        other => one(&other, ctx),
    }
}

/// Checks and runs one request object.
fn one(req: &Value, ctx: &Context) -> Option<Value> {
    let invalid = |why: &str| Some(reply_err(&Value::Null, &RpcError::new(code::INVALID_REQUEST, why)));
    let Some(obj) = req.as_object() else { return invalid("a request is a JSON object") };
    let id = obj.get("id").cloned();
    if id.as_ref().is_some_and(|i| !matches!(i, Value::Number(_) | Value::String(_) | Value::Null)) {
        return invalid("id must be a number, a string or null");
    }
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Some(reply_err(
            id.as_ref().unwrap_or(&Value::Null),
            &RpcError::new(code::INVALID_REQUEST, "\"jsonrpc\": \"2.0\" is required"),
        ));
    }
    let Some(method) = obj.get("method").and_then(Value::as_str) else {
        return Some(reply_err(
            id.as_ref().unwrap_or(&Value::Null),
            &RpcError::new(code::INVALID_REQUEST, "method must be a string"),
        ));
    };
    let params = obj.get("params").cloned().unwrap_or(Value::Null);
    let request = match method {
        "upgrade" => Err(RpcError::new(
            code::METHOD_NOT_FOUND,
            "upgrade is run by `vnvme ctl upgrade`, which starts the new process (docs/UPGRADE.md)",
        )),
        _ => super::api::Request::parse(method, &params),
    };
    let changes = request.as_ref().is_ok_and(|r| r.changes_state());
    let result = request.and_then(|r| super::methods::call(ctx, r));
    match &result {
        Ok(_) if changes => info!(target: "vnvme::control", method, %params, "control request done"),
        Err(e) => {
            debug!(target: "vnvme::control", method, code = e.code, "control request failed: {}", e.message)
        }
        _ => {}
    }
    // A notification (no id) gets no reply, whatever happened.
    let id = id?;
    Some(match result {
        Ok(v) => super::reply_ok(&id, v),
        Err(e) => reply_err(&id, &e),
    })
}
