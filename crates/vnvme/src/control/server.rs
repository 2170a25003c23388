//! The control socket: requests framed by line, served by the service's one bounded
//! socket server ([`crate::endpoint`]) with the bounds of `control` (size, deadline,
//! idle time, connection count), each answered through `methods`.

use std::io;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::Arc;

use serde_json::Value;
use tracing::{debug, info};

use super::methods::Context;
use super::{
    code, reply_err, RpcError, IDLE_LIMIT, MAX_BATCH, MAX_CONNECTIONS, MAX_REQUEST, REQUEST_DEADLINE,
};
use crate::endpoint::{Answer, Bounds, Listener, Protocol, Stream};

/// Binds the control socket at `path`, nonblocking and owner-only (0600), replacing
/// a stale socket file; refuses a path another server is listening on, or a file
/// that is not a socket.
pub fn bind(path: &Path) -> io::Result<(UnixListener, vfio_user_server::socket_file::SocketFile)> {
    crate::unix_socket::bind_owner_only(path)
}

/// The control socket's bounds.
const BOUNDS: Bounds = Bounds {
    max_request: MAX_REQUEST,
    deadline: REQUEST_DEADLINE,
    idle: Some(IDLE_LIMIT),
    connections: MAX_CONNECTIONS,
    // A client that sends without reading what we answer.
    max_pending: 4 * MAX_REQUEST,
};

/// Starts the control thread (`vnvme-control`) serving `listener`.
pub fn spawn(listener: UnixListener, ctx: Arc<Context>) -> io::Result<std::thread::JoinHandle<()>> {
    crate::endpoint::spawn("vnvme-control", Listener::Unix(listener), JsonLines { ctx }, BOUNDS)
}

/// JSON-RPC 2.0, one request (or batch) per line.
struct JsonLines {
    ctx: Arc<Context>,
}

/// An error reply as a line.
fn error_line(e: &RpcError) -> Vec<u8> {
    let mut out = reply_err(&Value::Null, e).to_string().into_bytes();
    out.push(b'\n');
    out
}

impl Protocol for JsonLines {
    fn name(&self) -> &'static str {
        "control"
    }

    fn frame(&self, buf: &[u8]) -> Option<usize> {
        buf.iter().position(|&b| b == b'\n').map(|end| end + 1)
    }

    fn answer(&mut self, line: &[u8], stream: &Stream) -> Answer {
        let line = &line[..line.len() - 1];
        if let Some(params) = handover_request(line) {
            // The connection is the new process's: it carries the hand-over from
            // here on (vfio-user framing, descriptors).
            if let Stream::Unix(s) = stream {
                if let Ok(stream) = s.try_clone() {
                    if crate::upgrade::hand_over(&self.ctx.running(), stream, &params) {
                        // The listener is the new process's now; this one exits in a
                        // moment and must not take a connection.
                        loop {
                            std::thread::park();
                        }
                    }
                }
            }
            return Answer::Close;
        }
        let preparing = is_request(line, "upgrade.prepare");
        if preparing {
            // A takeover begins: a keeper learns of its process now, before that
            // process opens anything (if this one dies, it waits for that one).
            if let Stream::Unix(s) = stream {
                if let Ok(c) = rustix::net::sockopt::socket_peercred(s) {
                    let pid = c.pid.as_raw_nonzero().get() as u32;
                    let _ = self.ctx.jobs.run(crate::control::JOB_LIMIT, move |d| d.journal_takeover(pid));
                }
            }
        }
        let reply = answer(line, &self.ctx);
        if preparing {
            vfio_user_server::server::kill_point("old:prepared");
        }
        match reply {
            Some(reply) => {
                let mut out = reply.to_string().into_bytes();
                out.push(b'\n');
                Answer::Reply(out)
            }
            None => Answer::Nothing,
        }
    }

    fn too_large(&self, max: usize) -> Vec<u8> {
        error_line(&RpcError::new(code::INVALID_REQUEST, format!("request over {max} bytes")))
    }

    fn truncated(&self) -> Option<Vec<u8>> {
        // A line without its newline: the client has gone, there is no one to tell.
        None
    }

    fn busy(&self, open: usize) -> Vec<u8> {
        error_line(&RpcError::new(
            code::BUSY,
            format!("too many control connections: {open} are open already; close one and try again"),
        ))
    }
}

/// The params of an `upgrade.handover` request line (the one request that takes its
/// connection over; `vnvme takeover` sends it alone on a connection of its own).
fn handover_request(line: &[u8]) -> Option<Value> {
    let v: Value = serde_json::from_slice(line).ok()?;
    (v.get("jsonrpc")?.as_str()? == "2.0" && v.get("method")?.as_str()? == "upgrade.handover")
        .then(|| v.get("params").cloned().unwrap_or(Value::Null))
}

/// Whether `line` is a request for `method` (alone, not in a batch).
fn is_request(line: &[u8], method: &str) -> bool {
    serde_json::from_slice::<Value>(line)
        .ok()
        .is_some_and(|v| v.get("method").and_then(Value::as_str) == Some(method))
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
