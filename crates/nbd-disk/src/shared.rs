//! What a backend's queues share: where the server is and what its export is.

use crate::handshake::{Export, Target};
use crate::uri::NbdUri;

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) uri: NbdUri,
    /// What the URI resolved to at open: reconnects make no name lookups.
    pub(crate) target: Target,
    pub(crate) export: Export,
    /// Most bytes per READ or WRITE command, and per TRIM or WRITE_ZEROES.
    pub(crate) max_payload: u64,
    pub(crate) max_other: u64,
    /// The export's size in bytes, as the handshake reported it.
    pub(crate) size: u64,
    /// How long commands wait for a lost connection (`NbdOptions::hold`).
    pub(crate) hold: std::time::Duration,
    /// What the queues saw of the server: outages, commands waiting.
    pub(crate) storage: block_backend::StorageTracker,
}
