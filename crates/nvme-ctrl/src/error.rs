//! Why a command failed, and the one place that turns it into an NVMe status.

use block_backend::{BackendError, SegmentError};
use guest_mem::MemError;
use nvme_spec::Status;

/// Everything that can go wrong while executing a command. Handlers return these;
/// [`CommandError::status`] maps each to the status the spec names.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("opcode {0:#04x} is not supported")]
    InvalidOpcode(u8),
    #[error("invalid field: {0}")]
    InvalidField(&'static str),
    #[error("namespace {0} is not valid for this command")]
    InvalidNamespace(u32),
    #[error("command sequence error: {0}")]
    Sequence(&'static str),
    #[error("guest memory access failed: {0}")]
    Memory(#[from] MemError),
    /// The data pointer's segments do not fit the transfer (never from a PRP or SGL
    /// walk, which produce exactly the transfer length).
    #[error("data transfer: {0}")]
    Transfer(SegmentError),
    #[error("a PRP entry has an offset where the spec forbids one ({0:#x})")]
    PrpOffset(u64),
    #[error("SGL segment descriptor invalid: {0}")]
    SglSegment(&'static str),
    #[error("SGL has too many descriptors or an empty segment")]
    SglDescriptorCount,
    #[error("SGL data length {sgl} does not match the transfer length {xfer}")]
    SglLength { sgl: u64, xfer: u64 },
    #[error("SGL descriptor type {0:#x} is not supported here")]
    SglType(u8),
    #[error("SGL descriptor uses an offset sub type")]
    SglOffset,
    #[error("LBA range {slba}+{nlb} is outside the namespace")]
    LbaOutOfRange { slba: u64, nlb: u64 },
    #[error("transfer of {0} bytes exceeds MDTS")]
    TooLarge(u64),
    /// A Copy past MSSRL, MCL or MSRC.
    #[error("copy exceeds a limit: {0}")]
    CopyLimit(&'static str),
    /// The engine's commands hold as many host buffers as it allows (Compare,
    /// Verify, Copy): the command is to be retried.
    #[error("{0} bytes of host buffer wanted, the engine's budget is in use")]
    HostBuffersBusy(u64),
    #[error("backend failed (write: {write}): {source}")]
    Backend { write: bool, source: BackendError },
    /// The backend did not finish the command within the namespace's timeout.
    #[error("backend did not answer within {ms} ms")]
    TimedOut { ms: u64 },
    /// The command's SQ was deleted (or the controller reset) while its backend
    /// still held it, and the teardown bound ran out.
    #[error("aborted: its queue was deleted while the backend still held it")]
    SqDeleted,
    /// A block's protection information failed a check the command asked for.
    #[error("protection information check failed: {0:?}")]
    Protection(nvme_spec::pi::PiError),
    /// The command's protection information fields cannot go together, or with
    /// the namespace's format.
    #[error("invalid protection information: {0}")]
    InvalidProtection(&'static str),
    /// A status already decided by the handler (queue management and features, whose
    /// errors are named per field by the spec).
    #[error("{0:?}")]
    Status(Status),
}

impl CommandError {
    /// The completion status for this error (DNR set where retrying cannot help).
    pub fn status(&self) -> Status {
        match self {
            CommandError::InvalidOpcode(_) => Status::INVALID_OPCODE.with_dnr(),
            CommandError::InvalidField(_) => Status::INVALID_FIELD.with_dnr(),
            CommandError::InvalidNamespace(_) => Status::INVALID_NAMESPACE.with_dnr(),
            CommandError::Sequence(_) => Status::COMMAND_SEQUENCE_ERROR.with_dnr(),
            CommandError::Memory(_) | CommandError::Transfer(_) => Status::DATA_TRANSFER_ERROR.with_dnr(),
            CommandError::PrpOffset(_) => Status::PRP_OFFSET_INVALID.with_dnr(),
            CommandError::SglSegment(_) => Status::INVALID_SGL_SEGMENT_DESCRIPTOR.with_dnr(),
            CommandError::SglDescriptorCount => Status::INVALID_SGL_DESCRIPTOR_COUNT.with_dnr(),
            CommandError::SglLength { .. } => Status::DATA_SGL_LENGTH_INVALID.with_dnr(),
            CommandError::SglType(_) => Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr(),
            CommandError::SglOffset => Status::SGL_OFFSET_INVALID.with_dnr(),
            CommandError::LbaOutOfRange { .. } => Status::LBA_OUT_OF_RANGE.with_dnr(),
            CommandError::TooLarge(_) => Status::INVALID_FIELD.with_dnr(),
            CommandError::CopyLimit(_) => Status::COMMAND_SIZE_LIMIT_EXCEEDED.with_dnr(),
            // Without DNR: the host retries once other commands gave their buffers back.
            CommandError::HostBuffersBusy(_) => Status::COMMAND_INTERRUPTED,
            CommandError::Backend { write, source } => backend_status(*write, source),
            CommandError::Protection(e) => e.status(),
            CommandError::InvalidProtection(_) => Status::INVALID_PROTECTION_INFORMATION.with_dnr(),
            // Internal Error without DNR: Linux retries it (nvme_max_retries times),
            // then fails the I/O with EIO, so a stall that clears goes unseen and a
            // dead backend fails cleanly instead of waiting for the host's own timeout.
            CommandError::TimedOut { .. } => Status::INTERNAL_ERROR,
            // Base "Command Aborted due to SQ Deletion", the status the spec names.
            CommandError::SqDeleted => Status::ABORT_SQ_DELETION,
            CommandError::Status(s) => *s,
        }
    }
}

impl From<SegmentError> for CommandError {
    /// A guest memory fault is the same [`CommandError::Memory`] whichever walk met it.
    fn from(e: SegmentError) -> Self {
        match e {
            SegmentError::Memory(m) => CommandError::Memory(m),
            e => CommandError::Transfer(e),
        }
    }
}

/// The status for a failed backend request; `write` is true for requests that change
/// the medium (writes, write zeroes, deallocation, flush).
pub fn backend_status(write: bool, e: &BackendError) -> Status {
    match e {
        BackendError::OutOfRange { .. } => Status::LBA_OUT_OF_RANGE.with_dnr(),
        BackendError::Memory(_) => Status::DATA_TRANSFER_ERROR.with_dnr(),
        BackendError::NoSpace => Status::CAPACITY_EXCEEDED.with_dnr(),
        BackendError::Unsupported => Status::INVALID_OPCODE.with_dnr(),
        // Media errors: the host may retry, so no DNR.
        BackendError::Io(_) | BackendError::Short { .. } if write => Status::WRITE_FAULT,
        BackendError::Io(_) | BackendError::Short { .. } => Status::UNRECOVERED_READ_ERROR,
        // Storage unreachable: the host may retry once it is back (no DNR).
        BackendError::NotReady(_) => Status::NAMESPACE_NOT_READY,
        BackendError::ReadOnly if write => Status::NAMESPACE_WRITE_PROTECTED.with_dnr(),
        BackendError::ReadOnly => Status::INTERNAL_ERROR,
        &BackendError::Nvme { sct, sc, dnr } => {
            let s = Status::from_parts(sct, sc);
            if dnr {
                s.with_dnr()
            } else {
                s
            }
        }
    }
}

/// The Command Retry Delay a failed command's status carries when the host enabled
/// Advanced Command Retry (`config::RETRY_DELAYS` has the times): 1 when the storage
/// is unreachable, 2 after a backend timeout, 0 otherwise (success, DNR, and errors
/// a retry at once may clear).
pub(crate) fn retry_delay(status: Status) -> u8 {
    if status.dnr() {
        return 0;
    }
    match status.code() {
        Status::NAMESPACE_NOT_READY => 1,
        Status::INTERNAL_ERROR => 2,
        _ => 0,
    }
}

pub type CmdResult<T = ()> = Result<T, CommandError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delays_go_to_what_waiting_may_clear() {
        let gone = backend_status(false, &BackendError::NotReady("reconnecting".into()));
        assert_eq!(retry_delay(gone), 1);
        assert_eq!(retry_delay(CommandError::TimedOut { ms: 30_000 }.status()), 2);
        assert_eq!(retry_delay(Status::UNRECOVERED_READ_ERROR), 0);
        assert_eq!(retry_delay(Status::INTERNAL_ERROR.with_dnr()), 0);
        assert_eq!(retry_delay(Status::SUCCESS), 0);
    }

    #[test]
    fn a_guest_fault_in_a_segment_copy_is_a_memory_error() {
        let fault = MemError::Unmapped { gpa: 0x1000, len: 8 };
        assert!(matches!(CommandError::from(SegmentError::Memory(fault)), CommandError::Memory(_)));
        let short = CommandError::from(SegmentError::Length { covered: 4, len: 8 });
        assert!(matches!(short, CommandError::Transfer(_)));
        assert_eq!(short.status(), Status::DATA_TRANSFER_ERROR.with_dnr());
    }
}
