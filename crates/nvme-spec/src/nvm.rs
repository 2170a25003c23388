//! Typed views of NVM command set I/O commands (NVM §3).

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::Sqe;

/// Read, Write, Compare, Verify, Write Zeroes and Write Uncorrectable share the
/// SLBA / NLB / control layout (NVM §3.2.6 Read, §3.2.8 Write, §3.2.1 Compare,
/// §3.2.9 Write Zeroes, §3.2.7 Verify).
#[derive(Clone, Copy, Debug)]
pub struct ReadWrite<'a>(pub &'a Sqe);

impl ReadWrite<'_> {
    /// Starting LBA.
    pub fn slba(&self) -> u64 {
        self.0.cdw10.get() as u64 | ((self.0.cdw11.get() as u64) << 32)
    }
    /// Number of Logical Blocks, 0's based.
    pub fn nlb_z(&self) -> u16 {
        self.0.cdw12.get() as u16
    }
    /// Number of logical blocks.
    pub fn nlb(&self) -> u32 {
        self.nlb_z() as u32 + 1
    }
    /// Force Unit Access.
    pub fn fua(&self) -> bool {
        self.0.cdw12.get() & (1 << 30) != 0
    }
    /// Limited Retry.
    pub fn lr(&self) -> bool {
        self.0.cdw12.get() & (1 << 31) != 0
    }
    /// Protection Information field (PRINFO, 29:26).
    pub fn prinfo(&self) -> u8 {
        ((self.0.cdw12.get() >> 26) & 0xf) as u8
    }
    /// Write Zeroes: Deallocate (bit 25).
    pub fn deac(&self) -> bool {
        self.0.cdw12.get() & (1 << 25) != 0
    }
    /// Directive Type (23:20).
    pub fn dtype(&self) -> u8 {
        ((self.0.cdw12.get() >> 20) & 0xf) as u8
    }
}

/// Dataset Management (NVM §3.2.3).
#[derive(Clone, Copy, Debug)]
pub struct DatasetManagement<'a>(pub &'a Sqe);

impl DatasetManagement<'_> {
    /// Number of Ranges, 0's based.
    pub fn nr_z(&self) -> u8 {
        self.0.cdw10.get() as u8
    }
    pub fn ranges(&self) -> usize {
        self.nr_z() as usize + 1
    }
    /// Attribute – Deallocate.
    pub fn ad(&self) -> bool {
        self.0.cdw11.get() & (1 << 2) != 0
    }
    /// Attribute – Integral Dataset for Write.
    pub fn idw(&self) -> bool {
        self.0.cdw11.get() & (1 << 1) != 0
    }
    /// Attribute – Integral Dataset for Read.
    pub fn idr(&self) -> bool {
        self.0.cdw11.get() & 1 != 0
    }
}

/// One Dataset Management range (NVM Figure "Dataset Management – Range Definition").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct DsmRange {
    pub context_attributes: U32,
    /// Length in logical blocks (not 0's based).
    pub nlb: U32,
    pub slba: U64,
}

const _: () = assert!(core::mem::size_of::<DsmRange>() == 16);

/// The most ranges one Dataset Management command can carry.
pub const DSM_MAX_RANGES: usize = 256;
