//! Identify Namespace for the NVM Command Set (CNS 00h): the namespace structure,
//! its LBA formats, and the bit masks and FLBAS encoding its fields hold.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use super::IDENTIFY_DATA_SIZE;

/// LBA Format data structure (NVM, Figure "LBA Format Data Structure, NVM Command Set").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct LbaFormat {
    /// Metadata Size in bytes per logical block.
    pub ms: U16,
    /// LBA Data Size, log2 bytes (9 = 512 B, 12 = 4 KiB); 0 = format not supported.
    pub lbads: u8,
    /// Relative Performance in bits 1:0 (0 = best .. 3 = degraded).
    pub rp: u8,
}

const _: () = assert!(core::mem::size_of::<LbaFormat>() == 4);

impl LbaFormat {
    pub fn new(lbads: u8, ms: u16) -> Self {
        LbaFormat { ms: U16::new(ms), lbads, rp: 0 }
    }
    /// Logical block data size in bytes (0 if the format is unused).
    pub fn block_size(&self) -> u64 {
        if self.lbads == 0 || self.lbads >= 64 {
            0
        } else {
            1 << self.lbads
        }
    }
}

/// Identify Namespace data structure for the NVM Command Set (CNS 00h; NVM,
/// Figure "Identify Namespace Data Structure, NVM Command Set").
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct IdentifyNamespace {
    /// Namespace Size in logical blocks.
    pub nsze: U64,
    /// Namespace Capacity in logical blocks.
    pub ncap: U64,
    /// Namespace Utilization in logical blocks.
    pub nuse: U64,
    /// Namespace Features, see [`nsfeat`].
    pub nsfeat: u8,
    /// Number of LBA Formats, 0's based.
    pub nlbaf: u8,
    /// Formatted LBA Size, see [`flbas`].
    pub flbas: u8,
    /// Metadata Capabilities.
    pub mc: u8,
    /// End-to-end Data Protection Capabilities.
    pub dpc: u8,
    /// End-to-end Data Protection Type Settings.
    pub dps: u8,
    /// Namespace Multi-path I/O and Namespace Sharing Capabilities.
    pub nmic: u8,
    /// Reservation Capabilities.
    pub rescap: u8,
    /// Format Progress Indicator.
    pub fpi: u8,
    /// Deallocate Logical Block Features, see [`dlfeat`].
    pub dlfeat: u8,
    /// Namespace Atomic Write Unit Normal, 0's based.
    pub nawun: U16,
    /// Namespace Atomic Write Unit Power Fail, 0's based.
    pub nawupf: U16,
    /// Namespace Atomic Compare & Write Unit, 0's based.
    pub nacwu: U16,
    /// Namespace Atomic Boundary Size Normal.
    pub nabsn: U16,
    /// Namespace Atomic Boundary Offset.
    pub nabo: U16,
    /// Namespace Atomic Boundary Size Power Fail.
    pub nabspf: U16,
    /// Namespace Optimal I/O Boundary, logical blocks.
    pub noiob: U16,
    /// NVM Capacity in bytes (128-bit little-endian).
    pub nvmcap: [u8; 16],
    /// Namespace Preferred Write Granularity, 0's based.
    pub npwg: U16,
    /// Namespace Preferred Write Alignment, 0's based.
    pub npwa: U16,
    /// Namespace Preferred Deallocate Granularity, 0's based.
    pub npdg: U16,
    /// Namespace Preferred Deallocate Alignment, 0's based.
    pub npda: U16,
    /// Namespace Optimal Write Size, 0's based.
    pub nows: U16,
    /// Maximum Single Source Range Length (Copy).
    pub mssrl: U16,
    /// Maximum Copy Length.
    pub mcl: U32,
    /// Maximum Source Range Count, 0's based.
    pub msrc: u8,
    /// Key Per I/O Status.
    pub kpios: u8,
    /// Number of Unique Attribute LBA Formats.
    pub nulbaf: u8,
    pub rsvd83: u8,
    /// Key Per I/O Data Access Alignment and Granularity.
    pub kpiodaag: U32,
    pub rsvd88: [u8; 4],
    /// ANA Group Identifier.
    pub anagrpid: U32,
    pub rsvd96: [u8; 3],
    /// Namespace Attributes (bit 0 = write protected).
    pub nsattr: u8,
    /// NVM Set Identifier.
    pub nvmsetid: U16,
    /// Endurance Group Identifier.
    pub endgid: U16,
    /// Namespace Globally Unique Identifier.
    pub nguid: [u8; 16],
    /// IEEE Extended Unique Identifier.
    pub eui64: [u8; 8],
    /// LBA Format 0..=63 support.
    pub lbaf: [LbaFormat; 64],
    pub rsvd384: [u8; 3328],
    /// Vendor Specific.
    pub vs: [u8; 384],
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<IdentifyNamespace>() == IDENTIFY_DATA_SIZE);
    assert!(offset_of!(IdentifyNamespace, nsfeat) == 24);
    assert!(offset_of!(IdentifyNamespace, nlbaf) == 25);
    assert!(offset_of!(IdentifyNamespace, flbas) == 26);
    assert!(offset_of!(IdentifyNamespace, dlfeat) == 33);
    assert!(offset_of!(IdentifyNamespace, noiob) == 46);
    assert!(offset_of!(IdentifyNamespace, nvmcap) == 48);
    assert!(offset_of!(IdentifyNamespace, npwg) == 64);
    assert!(offset_of!(IdentifyNamespace, mssrl) == 74);
    assert!(offset_of!(IdentifyNamespace, nulbaf) == 82);
    assert!(offset_of!(IdentifyNamespace, anagrpid) == 92);
    assert!(offset_of!(IdentifyNamespace, nsattr) == 99);
    assert!(offset_of!(IdentifyNamespace, nguid) == 104);
    assert!(offset_of!(IdentifyNamespace, eui64) == 120);
    assert!(offset_of!(IdentifyNamespace, lbaf) == 128);
    assert!(offset_of!(IdentifyNamespace, vs) == 3712);
};

impl Default for IdentifyNamespace {
    fn default() -> Self {
        Self::new_zeroed()
    }
}

impl IdentifyNamespace {
    /// The LBA format selected by FLBAS.
    pub fn current_lbaf(&self) -> LbaFormat {
        self.lbaf[flbas::format_index(self.flbas) as usize & 63]
    }
}

/// The NVM Command Set's I/O Command Set specific Identify Namespace structure
/// (CNS 05h, CSI 00h; NVM Figure "I/O Command Set Specific Identify Namespace Data
/// Structure"): what the host needs for the extended LBA formats, chiefly each
/// format's protection information format (ELBAF). A host reads it where Identify
/// Controller CTRATT.ELBAS is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct IdentifyNamespaceNvm {
    /// Logical Block Storage Tag Mask.
    pub lbstm: U64,
    /// Protection Information Capabilities (bit 0: 16b Guard with a storage tag
    /// mask, bit 1: storage tag check read support).
    pub pic: u8,
    pub rsvd9: [u8; 3],
    /// Extended LBA Format 0..=63 ([`elbaf`]): beside LBAF of the same index.
    pub elbaf: [U32; 64],
    pub rsvd268: [u8; 3828],
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<IdentifyNamespaceNvm>() == IDENTIFY_DATA_SIZE);
    assert!(offset_of!(IdentifyNamespaceNvm, pic) == 8);
    assert!(offset_of!(IdentifyNamespaceNvm, elbaf) == 12);
};

impl Default for IdentifyNamespaceNvm {
    fn default() -> Self {
        Self::new_zeroed()
    }
}

/// Namespace Multi-path I/O and Namespace Sharing Capabilities (NMIC) bits.
pub mod nmic {
    /// The namespace may be attached to two or more controllers of the subsystem.
    pub const SHARED: u8 = 1 << 0;
}

/// Namespace Attributes (NSATTR).
pub mod nsattr {
    /// Write Protected: the namespace takes no writes (Base 2.1 §5.1.13.2.1;
    /// Linux makes its block device read-only).
    pub const WRITE_PROTECTED: u8 = 1 << 0;
}

/// An Extended LBA Format's fields.
pub mod elbaf {
    /// Storage Tag Size (bits 6:0).
    pub const STS_MASK: u32 = 0x7f;
    /// Protection Information Format (bits 8:7): 0 16b, 1 32b, 2 64b Guard.
    pub const PIF_SHIFT: u32 = 7;

    /// The ELBAF of a format with `sts` storage tag bits and guard format `pif`.
    pub const fn new(sts: u8, pif: u8) -> u32 {
        (sts as u32 & STS_MASK) | ((pif as u32 & 3) << PIF_SHIFT)
    }

    /// Its Protection Information Format.
    pub const fn pif(v: u32) -> u8 {
        ((v >> PIF_SHIFT) & 3) as u8
    }
}

/// Namespace Features (NSFEAT) bits.
pub mod nsfeat {
    /// Thin provisioning.
    pub const THIN_PROVISIONING: u8 = 1 << 0;
    /// NAWUN, NAWUPF and NACWU are defined for this namespace.
    pub const NSABP: u8 = 1 << 1;
    /// Deallocated or Unwritten Logical Block error supported.
    pub const DAE: u8 = 1 << 2;
    /// NGUID and EUI64 are never reused.
    pub const UIDREUSE: u8 = 1 << 3;
    /// NPWG, NPWA, NPDG, NPDA and NOWS are defined.
    pub const OPTPERF: u8 = 1 << 4;
}

/// Deallocate Logical Block Features (DLFEAT) bits.
pub mod dlfeat {
    /// Read behavior of deallocated blocks, bits 2:0.
    pub const READ_BEHAVIOR_MASK: u8 = 0b111;
    /// Deallocated blocks read as all zeroes.
    pub const READ_ZEROES: u8 = 0b001;
    /// Deallocated blocks read as all ones.
    pub const READ_ONES: u8 = 0b010;
    /// Write Zeroes supports the Deallocate bit.
    pub const WRITE_ZEROES_DEALLOC: u8 = 1 << 3;
    /// The guard field of deallocated blocks holds the CRC of the data read.
    pub const GUARD_CRC: u8 = 1 << 4;
}

/// Metadata Capabilities (MC) bits.
pub mod mc {
    /// Metadata may be transferred as part of an extended data LBA.
    pub const EXTENDED: u8 = 1 << 0;
    /// Metadata may be transferred in a separate buffer (MPTR).
    pub const SEPARATE: u8 = 1 << 1;
}

/// End-to-end Data Protection Capabilities (DPC) bits.
pub mod dpc {
    pub const TYPE1: u8 = 1 << 0;
    pub const TYPE2: u8 = 1 << 1;
    pub const TYPE3: u8 = 1 << 2;
    /// Protection information may be the first bytes of the metadata.
    pub const FIRST: u8 = 1 << 3;
    /// Protection information may be the last bytes of the metadata.
    pub const LAST: u8 = 1 << 4;
}

/// End-to-end Data Protection Type Settings (DPS): the type in bits 2:0 (0: none),
/// bit 3 set when the protection information is the metadata's first bytes.
pub mod dps {
    pub const TYPE_MASK: u8 = 0b111;
    pub const FIRST: u8 = 1 << 3;
}

/// Formatted LBA Size (FLBAS) encoding.
pub mod flbas {
    /// Metadata is transferred at the end of the data LBA (extended LBA).
    pub const EXTENDED_METADATA: u8 = 1 << 4;

    /// LBA format index: bits 3:0 are the low nibble, bits 6:5 the high two bits.
    pub const fn format_index(flbas: u8) -> u8 {
        (flbas & 0x0f) | ((flbas >> 1) & 0x30)
    }

    /// The FLBAS value selecting format `index` (0..=63).
    pub const fn from_index(index: u8, extended_metadata: bool) -> u8 {
        let ext = if extended_metadata { EXTENDED_METADATA } else { 0 };
        (index & 0x0f) | ((index & 0x30) << 1) | ext
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flbas_index() {
        assert_eq!(flbas::format_index(0x00), 0);
        assert_eq!(flbas::format_index(0x0f), 15);
        assert_eq!(flbas::format_index(0x10 | 0x03), 3);
        assert_eq!(flbas::format_index(0x20), 16);
        assert_eq!(flbas::format_index(0x60 | 0x0f), 63);
        for i in 0..64 {
            assert_eq!(flbas::format_index(flbas::from_index(i, true)), i);
            assert_eq!(flbas::from_index(i, true) & flbas::EXTENDED_METADATA, flbas::EXTENDED_METADATA);
        }
    }

    #[test]
    fn namespace_layout() {
        let mut ns = IdentifyNamespace::new_zeroed();
        ns.nsze = U64::new(0x1000);
        ns.nlbaf = 1;
        ns.flbas = flbas::from_index(1, false);
        ns.dlfeat = dlfeat::READ_ZEROES | dlfeat::WRITE_ZEROES_DEALLOC;
        ns.lbaf[0] = LbaFormat::new(9, 0);
        ns.lbaf[1] = LbaFormat::new(12, 8);
        ns.eui64 = [1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(ns.current_lbaf().block_size(), 4096);
        let b = ns.as_bytes();
        assert_eq!(&b[0..8], &[0, 0x10, 0, 0, 0, 0, 0, 0]);
        assert_eq!(b[25], 1);
        assert_eq!(b[26], 1);
        assert_eq!(b[33], 0b1001);
        assert_eq!(&b[120..128], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[128..136], &[0, 0, 9, 0, 8, 0, 12, 0]);
    }
}
