//! An erasing Format NVM in progress (`format.rs` drives it): which namespaces it
//! covers, how far it got, and the piece at the backend now.

use std::sync::Arc;

use crate::namespace::Namespace;

/// An erasing Format NVM in progress.
#[derive(Debug)]
pub(crate) struct FormatJob {
    /// The Format NVM command's identifier (it completes when the job ends).
    pub cid: u16,
    /// The LBA format the namespaces take when it ends.
    pub lbaf: u8,
    /// The protection settings (Identify DPS) they take with it.
    pub dps: u8,
    /// Metadata inline (MSET).
    pub extended: bool,
    pub targets: Vec<Arc<Namespace>>,
    /// The namespace being erased (index into `targets`) and the bytes done.
    pub at: usize,
    pub done: u64,
    pub piece: Option<Piece>,
}

impl FormatJob {
    /// True if the job formats namespace `nsid`.
    pub(crate) fn targets(&self, nsid: u32) -> bool {
        self.targets.iter().any(|n| n.nsid == nsid)
    }
}

/// The erase piece at the backend.
#[derive(Debug)]
pub(crate) struct Piece {
    /// Its request's tag on the admin backend queue.
    pub tag: u64,
    pub len: u64,
    /// Clock ns after which it has timed out (u64::MAX: never).
    pub expires_ns: u64,
}
