//! Errors, and where each kind is decided: [`OpenError`] for opening, and the
//! [`BackendError`] a request completes with, mapped here (and only here) from what
//! the driver and the downstream controller report. A transport failure or a dead
//! downstream becomes [`BackendError::NotReady`] in `health` and `queue`, which
//! decide when the downstream is gone.

use std::io;

use block_backend::BackendError;
use nvme_driver::DriverError;
use nvme_spec::Status;

use crate::uri::{NvmeTarget, UriError};

/// Why [`crate::NvmeBackend::open`] failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Uri(#[from] UriError),
    /// The transport could not be set up (socket, VFIO device).
    #[error("{target}: {source}")]
    Connect { target: NvmeTarget, source: io::Error },
    /// The controller did not come up.
    #[error("{target}: controller bring-up failed: {source}")]
    Driver { target: NvmeTarget, source: DriverError },
    /// The namespace is not active on the controller.
    #[error("{target}: namespace {nsid} does not exist (active namespaces: {available})")]
    NoNamespace { target: NvmeTarget, nsid: u32, available: String },
    /// The controller or namespace cannot be used this way.
    #[error("{target}: {msg}")]
    Unsupported { target: NvmeTarget, msg: String },
}

impl From<OpenError> for io::Error {
    fn from(e: OpenError) -> Self {
        let kind = match &e {
            OpenError::Uri(_) => io::ErrorKind::InvalidInput,
            OpenError::Connect { source, .. } => source.kind(),
            OpenError::NoNamespace { .. } => io::ErrorKind::NotFound,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

/// A request the backend cannot carry out as given (not in whole blocks, a buffer
/// that does not match the request): `InvalidInput`, nothing sent downstream.
pub(crate) fn invalid(msg: String) -> BackendError {
    BackendError::Io(io::Error::new(io::ErrorKind::InvalidInput, msg))
}

/// A downstream command's error status, passed through: its type, code and DNR bit
/// unchanged, so the front reports what the downstream controller said.
pub(crate) fn downstream_status(s: Status) -> BackendError {
    BackendError::Nvme { sct: s.sct(), sc: s.sc(), dnr: s.dnr() }
}

/// The driver could not take a command (no DMA memory, a transport error while
/// submitting): an I/O error carrying the driver's.
pub(crate) fn driver_failed(e: DriverError) -> BackendError {
    BackendError::Io(io::Error::other(e))
}
