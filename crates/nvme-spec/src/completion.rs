//! Completion Queue Entry (Base §4.2, Figure 97 "Common Completion Queue Entry Layout").

use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::status::Status;

/// A 16-byte completion queue entry as it sits in guest memory.
///
/// The phase tag is bit 0 of `status`; the rest of that field is the
/// [`Status`] shifted left by one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct Cqe {
    /// Command specific (DW0).
    pub dw0: U32,
    /// Command specific (DW1).
    pub dw1: U32,
    /// SQ Head Pointer.
    pub sqhd: U16,
    /// SQ Identifier.
    pub sqid: U16,
    /// Command Identifier.
    pub cid: U16,
    /// Status field (15:1) and Phase Tag (0).
    pub status: U16,
}

const _: () = assert!(core::mem::size_of::<Cqe>() == crate::CQE_SIZE);

impl Cqe {
    pub fn phase(&self) -> bool {
        self.status.get() & 1 != 0
    }
    pub fn status(&self) -> Status {
        Status::from_raw(self.status.get() >> 1)
    }
    /// Dword 3: CID in 15:0, phase and status in 31:16. The controller writes this
    /// dword last, on its own, because it carries the phase tag.
    pub fn dw3(&self) -> u32 {
        self.cid.get() as u32 | ((self.status.get() as u32) << 16)
    }
}
