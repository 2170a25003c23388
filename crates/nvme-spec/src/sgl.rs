//! Scatter Gather List descriptors (Base §4.3.2).

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// SGL Descriptor Type (Base Figure 117), bits 7:4 of the identifier byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SglType {
    DataBlock,
    BitBucket,
    Segment,
    LastSegment,
    KeyedDataBlock,
    TransportDataBlock,
    Other(u8),
}

/// SGL Descriptor Sub Type (Base Figure 118): 0h address, 1h offset, 2h transport specific.
pub const SGL_SUBTYPE_ADDRESS: u8 = 0x0;
pub const SGL_SUBTYPE_OFFSET: u8 = 0x1;

/// A 16-byte SGL descriptor (Base Figure 116). For Data Block, Segment and Last Segment
/// descriptors `addr` is an address and `len` a byte count; Bit Bucket uses only `len`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct SglDescriptor {
    pub addr: U64,
    pub len: U32,
    pub rsvd: [u8; 3],
    /// SGL Identifier: type in 7:4, sub type in 3:0.
    pub id: u8,
}

const _: () = assert!(core::mem::size_of::<SglDescriptor>() == 16);

impl SglDescriptor {
    pub fn new(kind: SglType, addr: u64, len: u32) -> Self {
        let t = match kind {
            SglType::DataBlock => 0,
            SglType::BitBucket => 1,
            SglType::Segment => 2,
            SglType::LastSegment => 3,
            SglType::KeyedDataBlock => 4,
            SglType::TransportDataBlock => 5,
            SglType::Other(v) => v & 0xf,
        };
        SglDescriptor { addr: U64::new(addr), len: U32::new(len), rsvd: [0; 3], id: t << 4 }
    }
    pub fn kind(&self) -> SglType {
        match self.id >> 4 {
            0 => SglType::DataBlock,
            1 => SglType::BitBucket,
            2 => SglType::Segment,
            3 => SglType::LastSegment,
            4 => SglType::KeyedDataBlock,
            5 => SglType::TransportDataBlock,
            v => SglType::Other(v),
        }
    }
    pub fn subtype(&self) -> u8 {
        self.id & 0xf
    }
}
