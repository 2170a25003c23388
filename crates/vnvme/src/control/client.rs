//! The client side of the control socket: one JSON-RPC request and its answer,
//! for `vnvme ctl` and for `vnvme ctl upgrade`'s watch over the hand-over.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use serde_json::{json, Value};

/// Sends `method(params)` to the socket at `path` and returns the result, or the
/// error message.
pub fn request(
    path: &std::path::Path,
    method: &str,
    params: Value,
    timeout: Duration,
) -> Result<Value, String> {
    let stream =
        UnixStream::connect(path).map_err(|e| format!("cannot connect to {}: {e}", path.display()))?;
    stream.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    stream.set_write_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    // A socket timeout reads as EAGAIN ("Resource temporarily unavailable"): say
    // what it means for a control socket instead.
    let failed = |what: &str, e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => format!(
            "{}: no answer in {} (is the server stopped, e.g. with SIGSTOP, or is this not a vnvme \
             control socket?)",
            path.display(),
            spoken(timeout)
        ),
        _ => format!("{what}: {e}"),
    };
    let req = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
    let mut line = req.to_string();
    line.push('\n');
    (&stream).write_all(line.as_bytes()).map_err(|e| failed("sending the request", e))?;
    let mut reply = String::new();
    BufReader::new(&stream).read_line(&mut reply).map_err(|e| failed("reading the reply", e))?;
    if reply.is_empty() {
        return Err("the server closed the connection without answering".into());
    }
    let v: Value = serde_json::from_str(&reply).map_err(|e| format!("the reply is not JSON: {e}"))?;
    if let Some(e) = v.get("error") {
        let msg = e.get("message").and_then(Value::as_str).unwrap_or("(no message)");
        let code = e.get("code").and_then(Value::as_i64).unwrap_or(0);
        return Err(format!("{msg} (error {code})"));
    }
    v.get("result").cloned().ok_or_else(|| "the reply has neither result nor error".into())
}

/// A duration as a person says it: `3 s`, `1.5 s`, `300 ms`.
fn spoken(d: Duration) -> String {
    match d.as_millis() {
        ms if ms < 1000 => format!("{ms} ms"),
        ms if ms % 1000 == 0 => format!("{} s", ms / 1000),
        _ => format!("{:.1} s", d.as_secs_f64()),
    }
}
