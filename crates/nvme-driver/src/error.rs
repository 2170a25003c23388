//! The driver's errors.
#![forbid(unsafe_code)]

use nvme_spec::Status;

/// Why a driver operation failed.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The transport failed (socket, ioctl, mmap).
    #[error("transport: {0}")]
    Transport(#[from] std::io::Error),
    /// Host-side access to DMA memory failed (a driver bug if it happens).
    #[error("DMA memory: {0}")]
    Memory(#[from] guest_mem::MemError),
    /// A command completed with an error status.
    #[error("{op} failed with NVMe status {status:?}")]
    Nvme { op: &'static str, status: Status },
    /// The controller did not reach the state we waited for in time.
    #[error("timed out after {ms} ms waiting for {what}")]
    Timeout { what: &'static str, ms: u64 },
    /// The controller reported Controller Fatal Status.
    #[error("controller fatal status (CSTS {csts:#x})")]
    ControllerFatal { csts: u32 },
    /// The controller cannot be driven the way this driver drives it.
    #[error("unsupported controller: {0}")]
    Unsupported(String),
    /// An argument was out of range.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// Every command identifier of the queue is in use.
    #[error("queue {0} is full")]
    QueueFull(u16),
    /// The queue does not exist or was taken out of the driver.
    #[error("no I/O queue {0} in this driver")]
    NoQueue(u16),
    /// The DMA buffer pool has no room for the request.
    #[error("DMA pool exhausted ({0} bytes requested)")]
    PoolExhausted(u64),
}

impl DriverError {
    /// The NVMe status, if the error is a failed command.
    pub fn status(&self) -> Option<Status> {
        match self {
            DriverError::Nvme { status, .. } => Some(*status),
            _ => None,
        }
    }
}

pub type Result<T, E = DriverError> = std::result::Result<T, E>;
