//! The NBD block backend: a namespace whose blocks live on an NBD server (qemu-nbd,
//! qemu-storage-daemon, nbdkit, nbd-server), reached over TCP or a UNIX socket.
//!
//! ```text
//! nbd://HOST[:PORT][/EXPORT]          (port 10809 by default)
//! nbd+unix:///[EXPORT]?socket=PATH
//! ```
//!
//! - `proto`: the wire format. `uri`: the URIs. `handshake`: connecting and the fixed
//!   newstyle negotiation (structured replies, NBD_OPT_GO with block sizes).
//! - `queue`: one connection per backend queue in the transmission phase, without a
//!   thread per request.
//!
//! [`NbdBackend::open`] connects once to learn the export (its size, flags and block
//! sizes) and keeps that connection for the first queue. Every queue has a connection
//! of its own when the server allows several (CAN_MULTI_CONN); otherwise a Flush on
//! one connection would not cover writes sent on another, so the backend opens only
//! one queue and refuses more, saying why.
//!
//! What the guest sees follows the export: a volatile write cache if the server takes
//! Flush (SEND_FLUSH), FUA as NBD FUA (or a write then a flush), deallocation as TRIM
//! and Write Zeroes as NBD_CMD_WRITE_ZEROES when offered, and the export's minimum
//! block size as the backend's block size.
#![forbid(unsafe_code)]

pub mod handshake;
pub mod proto;
mod queue;
mod shared;
pub mod uri;

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use block_backend::{Backend, BackendInfo, BackendQueue};

pub use handshake::Export;
pub use uri::NbdUri;

use handshake::Stream;
use proto::tflag;
use shared::Shared;

/// How long connecting and the handshake may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long commands wait for a lost connection to come back by default: a daemon
/// restart takes a few seconds; below the 30 s a Linux guest waits for a command
/// (nvme_core.io_timeout) before it aborts it and resets the controller.
pub const DEFAULT_HOLD: Duration = Duration::from_secs(25);

/// How a backend behaves when its server goes away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NbdOptions {
    /// How long commands wait (kept, sent again on the new connection, in order)
    /// while the queue reconnects; past it they fail with NotReady and the export
    /// counts as gone until a connection succeeds again.
    pub hold: Duration,
}

impl Default for NbdOptions {
    fn default() -> Self {
        NbdOptions { hold: DEFAULT_HOLD }
    }
}

/// The transmission flags an operator cares about, as words.
fn flag_names(flags: u16) -> String {
    let names = [
        (tflag::READ_ONLY, "read-only"),
        (tflag::SEND_FLUSH, "flush"),
        (tflag::SEND_FUA, "fua"),
        (tflag::SEND_TRIM, "trim"),
        (tflag::SEND_WRITE_ZEROES, "write-zeroes"),
        (tflag::CAN_MULTI_CONN, "multi-conn"),
    ];
    let on: Vec<&str> = names.iter().filter(|(f, _)| flags & f != 0).map(|&(_, n)| n).collect();
    if on.is_empty() {
        "no optional commands".into()
    } else {
        on.join(" ")
    }
}

/// An NBD export as a block backend (crate documentation).
#[derive(Debug)]
pub struct NbdBackend {
    shared: Arc<Shared>,
    /// The connection the handshake made, for the first queue.
    first: Mutex<Option<Stream>>,
    queues_opened: AtomicU64,
}

impl NbdBackend {
    /// Connects to `uri` and learns the export. Fails, naming the server, when it is
    /// unreachable or refuses the export.
    pub fn open(uri: &str) -> io::Result<NbdBackend> {
        Self::open_with(uri, NbdOptions::default())
    }

    /// [`NbdBackend::open`] with `opts`.
    pub fn open_with(uri: &str, opts: NbdOptions) -> io::Result<NbdBackend> {
        let uri: NbdUri = uri.parse().map_err(|e: String| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let (stream, export, target) = handshake::open(&uri, CONNECT_TIMEOUT)?;
        tracing::info!(
            target: "vnvme::backend",
            %uri,
            "NBD export: {} bytes, blocks min {} preferred {} max {}, {} replies, {}",
            export.size,
            export.min_block,
            export.preferred_block,
            export.max_block,
            if export.structured { "structured" } else { "simple" },
            flag_names(export.flags),
        );
        let min = u64::from(export.min_block);
        let round = |n: u64| (n / min * min).max(min);
        let shared = Shared {
            uri,
            target,
            export,
            max_payload: round(u64::from(export.max_block).min(32 << 20)),
            max_other: round(u64::from(u32::MAX)),
            size: export.size,
            hold: opts.hold,
            storage: Default::default(),
        };
        Ok(NbdBackend {
            shared: Arc::new(shared),
            first: Mutex::new(Some(stream)),
            queues_opened: AtomicU64::new(0),
        })
    }

    /// What the server said of the export.
    pub fn export(&self) -> Export {
        self.shared.export
    }
}

impl Backend for NbdBackend {
    fn info(&self) -> BackendInfo {
        let e = &self.shared.export;
        BackendInfo {
            kind: format!("nbd:{}", self.shared.uri),
            size: self.shared.size,
            block_size: e.min_block,
            volatile_cache: e.has(tflag::SEND_FLUSH),
            discard: e.has(tflag::SEND_TRIM),
            // TRIM promises nothing about what reads return afterwards.
            discard_zeroes: false,
            discard_max: self.shared.max_other,
            write_zeroes: e.has(tflag::SEND_WRITE_ZEROES),
            write_zeroes_max: self.shared.max_other,
            // The NBD protocol has no copy: a Copy reads and writes.
            copy: false,
            // An export the server serves read-only.
            read_only: e.has(tflag::READ_ONLY),
        }
    }

    fn storage(&self) -> Option<block_backend::StorageReport> {
        Some(self.shared.storage.report())
    }

    fn open_queue(&self) -> io::Result<Box<dyn BackendQueue>> {
        let n = self.queues_opened.fetch_add(1, Ordering::Relaxed);
        let first = self.first.lock().unwrap_or_else(|p| p.into_inner()).take();
        let stream = match first {
            Some(s) => s,
            None if self.shared.export.has(tflag::CAN_MULTI_CONN) => {
                handshake::reopen(&self.shared.uri, &self.shared.target, CONNECT_TIMEOUT)?.0
            }
            None => {
                self.queues_opened.fetch_sub(1, Ordering::Relaxed);
                return Err(io::Error::other(format!(
                    "{}: the server does not allow several connections to the export (no CAN_MULTI_CONN), \
                     and a flush on one would not cover writes on another: one queue only ({n} open; \
                     serve it with --workers 0)",
                    self.shared.uri
                )));
            }
        };
        Ok(Box::new(queue::NbdQueue::new(self.shared.clone(), stream)?))
    }
}
