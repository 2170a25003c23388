//! The control socket: `vnvme serve --control PATH` answers JSON-RPC 2.0 requests on
//! a UNIX stream socket created owner-only, and `vnvme ctl` speaks it.
//!
//! Framing: one JSON value per line (a request object, or a batch array of at most
//! [`MAX_BATCH`]), answered by one line. A request may be at most [`MAX_REQUEST`]
//! bytes; once its first byte has arrived the rest must come within
//! [`REQUEST_DEADLINE`], and the reply must leave within the same deadline, or the
//! connection is closed with a log line. At most [`MAX_CONNECTIONS`] connections at
//! once; one idle for [`IDLE_LIMIT`] is closed. Malformed input gets a JSON-RPC
//! error and never reaches the device. docs/CONTROL.md documents every method.
//!
//! Threads: `server` runs on a thread of its own (started before the sandbox goes
//! on), reads what it can from shared state (counters, the log filter) and hands
//! what needs the device (namespaces, QoS, controller state) to the vfio-user server
//! thread as jobs (`vfio_user_server::jobs`), waiting for each at most
//! [`JOB_LIMIT`].

pub mod api;
pub mod client;
pub mod methods;
pub mod reply;
pub mod server;

use std::time::Duration;

use serde_json::{json, Value};

/// Largest request line.
pub const MAX_REQUEST: usize = 64 << 10;
/// Requests in one batch.
pub const MAX_BATCH: usize = 16;
/// A request begun must be complete, and a reply gone, within this.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// A connection with nothing to say for this long is closed.
pub const IDLE_LIMIT: Duration = Duration::from_secs(60);
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 16;
/// How long a request waits for the device thread.
pub const JOB_LIMIT: Duration = Duration::from_secs(10);

/// JSON-RPC 2.0 error codes (the spec's, then ours in its server range).
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
    /// The request was valid but the operation failed (e.g. no free NSID).
    pub const FAILED: i64 = -32000;
    /// The device thread did not take the request in time.
    pub const BUSY: i64 = -32001;
    /// The operation is not possible in this configuration (e.g. under the sandbox).
    pub const NOT_PERMITTED: i64 = -32002;
}

/// A JSON-RPC error.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        RpcError { code, message: message.into() }
    }

    pub fn params(message: impl Into<String>) -> Self {
        Self::new(code::INVALID_PARAMS, message)
    }

    pub fn failed(message: impl std::fmt::Display) -> Self {
        Self::new(code::FAILED, message.to_string())
    }
}

/// A success reply to request `id`.
pub fn reply_ok(id: &Value, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

/// An error reply to request `id` (null when it could not be read).
pub fn reply_err(id: &Value, e: &RpcError) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": e.code, "message": e.message } })
}
