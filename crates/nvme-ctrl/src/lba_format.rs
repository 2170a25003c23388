//! The LBA formats a namespace may be in (the table Identify Namespace lists),
//! the format one is in at an instant, and the rules of what fits: protection
//! settings for a format, a format's blocks for a backend.

use nvme_spec::pi::Guard;

/// One LBA format: the data size as log2, the metadata bytes per block, and the
/// guard its protection information has (if a type is chosen: Identify DPS).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LbaFormatDef {
    pub shift: u8,
    pub ms: u16,
    pub guard: Guard,
}

const fn lbaf(shift: u8, ms: u16) -> LbaFormatDef {
    LbaFormatDef { shift, ms, guard: Guard::Crc16 }
}

const fn lbaf64(shift: u8, ms: u16) -> LbaFormatDef {
    LbaFormatDef { shift, ms, guard: Guard::Crc64 }
}

/// The LBA formats, indexed as Identify Namespace LBAF lists them: the first
/// [`PLAIN_FORMATS`] without metadata (every namespace), then those with (a
/// namespace that can keep metadata, [`Namespace::meta`]); the last two carry the
/// 64-bit guard (Identify CNS 05h ELBAF says so).
pub const LBA_FORMATS: [LbaFormatDef; 8] = [
    lbaf(9, 0),
    lbaf(12, 0),
    lbaf(9, 8),
    lbaf(12, 8),
    lbaf(12, 16),
    lbaf(12, 64),
    lbaf64(9, 16),
    lbaf64(12, 16),
];

/// [`LBA_FORMATS`], a power of two long, so the data path's lookup by a masked
/// index needs no bounds check.
const FORMAT_TABLE: [LbaFormatDef; 8] = LBA_FORMATS;

/// How many of [`LBA_FORMATS`] have no metadata.
pub const PLAIN_FORMATS: usize = 2;

/// The index of the format of `2^shift`-byte blocks with `ms` bytes of metadata
/// and `guard` protection information.
pub fn format_index(shift: u8, ms: u16, guard: Guard) -> Option<u8> {
    LBA_FORMATS.iter().position(|f| *f == LbaFormatDef { shift, ms, guard }).map(|i| i as u8)
}

/// A namespace's format at one instant (also as a host chose it through another
/// controller, or before a crash: `admin::format::adopt` checks one from there).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FormatState {
    /// LBA format index.
    pub lbaf: u8,
    /// End-to-end Data Protection Type Settings (Identify DPS: the PI type, and
    /// bit 3 for the first bytes of the metadata).
    pub dps: u8,
    /// Metadata travels inline after each block's data (extended LBAs, FLBAS bit
    /// 4) rather than in a separate buffer.
    pub extended: bool,
}

impl FormatState {
    pub(crate) fn pack(self) -> u32 {
        self.lbaf as u32 | (self.dps as u32) << 8 | (self.extended as u32) << 16
    }

    pub(crate) fn unpack(v: u32) -> FormatState {
        FormatState { lbaf: v as u8, dps: (v >> 8) as u8, extended: v & 1 << 16 != 0 }
    }

    /// Its LBA format.
    #[inline]
    pub fn def(self) -> LbaFormatDef {
        FORMAT_TABLE[(self.lbaf & 7) as usize]
    }

    /// Its protection information (None: none).
    pub fn protection(self) -> Option<nvme_spec::pi::PiLayout> {
        let ty = nvme_spec::pi::PiType::from_dps(self.dps)?;
        let def = self.def();
        let (ms, guard) = (def.ms as usize, def.guard);
        let first = self.dps & nvme_spec::identify::dps::FIRST != 0;
        (ms >= guard.tuple_size()).then_some(nvme_spec::pi::PiLayout { ty, guard, ms, first })
    }
}

/// Why protection settings `dps` cannot go with format `f`, if they cannot: a
/// type needs metadata for its tuple (8 bytes, 16 with the 64-bit guard), bit 3
/// means nothing without a type, and no other bit is defined.
pub(crate) fn format_fits(f: LbaFormatDef, dps: u8) -> Result<(), &'static str> {
    use nvme_spec::identify::dps;
    if dps & !(dps::TYPE_MASK | dps::FIRST) != 0 || dps & dps::TYPE_MASK > 3 {
        return Err("protection information type 1, 2 or 3 only");
    }
    if dps & dps::TYPE_MASK != 0 && (f.ms as usize) < f.guard.tuple_size() {
        return Err("protection information needs metadata per block for its tuple (8 bytes, 16 with the 64-bit guard)");
    }
    if dps == dps::FIRST {
        return Err("a protection information location without a type");
    }
    Ok(())
}

/// True if `lba`-byte blocks work on a backend of `block_size` holding `size` bytes:
/// a multiple of its block size that divides its capacity.
pub(crate) fn lba_fits(lba: u64, block_size: u32, size: u64) -> bool {
    let bs = u64::from(block_size.max(1));
    lba.is_multiple_of(bs) && size.is_multiple_of(lba) && size >= lba
}
