//! End-to-end data protection (NVM Command Set §5.3): the guard checksums of the
//! protection information formats, and the 8-byte (16-bit guard) and 16-byte
//! (64-bit guard, no storage tag: a 48-bit reference tag) protection information
//! tuples.
//!
//! The 16-bit guard is CRC-16 T10-DIF (polynomial 8BB7h, initial value 0, not
//! reflected); the 64-bit guard is CRC-64/NVME (polynomial AD93D23594C93659h,
//! reflected, initial value and final XOR all ones). Both are table driven, the
//! tables built at compile time. Protection information fields are big-endian on
//! the medium, unlike every other NVMe structure.

/// CRC-16 T10-DIF of `data`: the 16-bit guard of one logical block.
pub fn crc16_t10dif(data: &[u8]) -> u16 {
    crc16_t10dif_update(0, data)
}

/// CRC-16 T10-DIF continued over `data` from `crc` (a block given in pieces).
pub fn crc16_t10dif_update(crc: u16, data: &[u8]) -> u16 {
    data.iter().fold(crc, |crc, &b| (crc << 8) ^ CRC16_TABLE[((crc >> 8) as u8 ^ b) as usize])
}

/// CRC-64/NVME of `data`: the 64-bit guard of one logical block.
pub fn crc64_nvme(data: &[u8]) -> u64 {
    !crc64_nvme_update(!0, data)
}

/// CRC-64/NVME continued over `data` from the raw (not yet inverted) value `crc`;
/// start from `!0` and invert the end, as [`crc64_nvme`] does.
pub fn crc64_nvme_update(crc: u64, data: &[u8]) -> u64 {
    data.iter().fold(crc, |crc, &b| (crc >> 8) ^ CRC64_TABLE[(crc as u8 ^ b) as usize])
}

const CRC16_POLY: u16 = 0x8bb7;
/// CRC-64/NVME's polynomial, bit-reversed for the reflected algorithm.
const CRC64_POLY_REFLECTED: u64 = 0x9a6c_9329_ac4b_c9b5;

const CRC16_TABLE: [u16; 256] = {
    let mut t = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = (i as u16) << 8;
        let mut k = 0;
        while k < 8 {
            c = if c & 0x8000 != 0 { (c << 1) ^ CRC16_POLY } else { c << 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

const CRC64_TABLE: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u64;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ CRC64_POLY_REFLECTED } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// The protection information of one logical block in the 16-bit guard format
/// (8 bytes, NVM Figure "Protection Information Format, 16b Guard"), as values;
/// [`Pi16::to_bytes`] and [`Pi16::from_bytes`] give its big-endian form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Pi16 {
    /// CRC-16 T10-DIF of the block's data.
    pub guard: u16,
    /// Application Tag (FFFFh in every byte with the reference tag: checks disabled).
    pub app_tag: u16,
    /// Reference Tag: the block's LBA (types 1 and 2, low 32 bits) or opaque (type 3).
    pub ref_tag: u32,
}

impl Pi16 {
    pub fn to_bytes(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[..2].copy_from_slice(&self.guard.to_be_bytes());
        b[2..4].copy_from_slice(&self.app_tag.to_be_bytes());
        b[4..].copy_from_slice(&self.ref_tag.to_be_bytes());
        b
    }

    pub fn from_bytes(b: [u8; 8]) -> Self {
        Pi16 {
            guard: u16::from_be_bytes([b[0], b[1]]),
            app_tag: u16::from_be_bytes([b[2], b[3]]),
            ref_tag: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
        }
    }
}

/// The protection information of one logical block in the 64-bit guard format
/// with no storage tag (16 bytes, NVM Figure "Protection Information Format, 64b
/// Guard", STS 0): the 48 bits of Storage and Reference Space are the reference tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Pi64 {
    /// CRC-64/NVME of the block's data.
    pub guard: u64,
    pub app_tag: u16,
    /// Reference Tag, 48 bits: the block's LBA (types 1 and 2, low 48 bits) or opaque.
    pub ref_tag: u64,
}

impl Pi64 {
    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.guard.to_be_bytes());
        b[8..10].copy_from_slice(&self.app_tag.to_be_bytes());
        b[10..].copy_from_slice(&self.ref_tag.to_be_bytes()[2..]);
        b
    }

    pub fn from_bytes(b: [u8; 16]) -> Self {
        let mut r = [0u8; 8];
        r[2..].copy_from_slice(&b[10..]);
        Pi64 {
            guard: u64::from_be_bytes(b[..8].try_into().expect("8 bytes")),
            app_tag: u16::from_be_bytes([b[8], b[9]]),
            ref_tag: u64::from_be_bytes(r),
        }
    }
}

/// The guard a format's protection information has (Extended LBA Format PIF).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Guard {
    /// 16b Guard: CRC-16 T10-DIF, 8-byte tuple, 32-bit reference tag.
    #[default]
    Crc16,
    /// 64b Guard: CRC-64/NVME, 16-byte tuple, 48-bit reference tag (no storage tag).
    Crc64,
}

impl Guard {
    /// Its Protection Information Format value (ELBAF bits 8:7).
    pub const fn pif(self) -> u8 {
        match self {
            Guard::Crc16 => 0,
            Guard::Crc64 => 2,
        }
    }

    /// Bytes of its protection information tuple.
    pub const fn tuple_size(self) -> usize {
        match self {
            Guard::Crc16 => 8,
            Guard::Crc64 => 16,
        }
    }

    /// The bits a reference tag has.
    pub const fn ref_mask(self) -> u64 {
        match self {
            Guard::Crc16 => 0xffff_ffff,
            Guard::Crc64 => 0xffff_ffff_ffff,
        }
    }

    /// The running guard CRC of a block's `data`, not yet finished (the guard goes
    /// on over metadata bytes before the tuple: [`PiLayout::guard`]).
    #[inline]
    pub fn data_crc(self, data: &[u8]) -> u64 {
        match self {
            Guard::Crc16 => crc16_t10dif(data) as u64,
            Guard::Crc64 => crc64_nvme_update(!0, data),
        }
    }

    /// A command's initial or expected reference tag: Dword 14, and for the 64-bit
    /// guard bits 47:32 in Dword 3 bits 15:0 (the storage tag, 0 bits here, would
    /// sit above them).
    pub const fn command_ref_tag(self, cdw14: u32, cdw3: u32) -> u64 {
        match self {
            Guard::Crc16 => cdw14 as u64,
            Guard::Crc64 => cdw14 as u64 | ((cdw3 & 0xffff) as u64) << 32,
        }
    }
}

/// One block's protection information as values, of either guard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PiTuple {
    pub guard: u64,
    pub app_tag: u16,
    pub ref_tag: u64,
}

/// The Protection Information field of Read, Write, Compare, Verify and Write
/// Zeroes (PRINFO, Dword 12 bits 29:26).
pub mod prinfo {
    /// Protection Information Action: the controller inserts (writes) or strips
    /// (reads) the protection information.
    pub const PRACT: u8 = 1 << 3;
    /// Check the guard field.
    pub const PRCHK_GUARD: u8 = 1 << 2;
    /// Check the application tag field.
    pub const PRCHK_APP: u8 = 1 << 1;
    /// Check the reference tag field.
    pub const PRCHK_REF: u8 = 1 << 0;
    pub const PRCHK_MASK: u8 = 0b111;
}

/// Protection information types (DPS bits 2:0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PiType {
    /// Reference tag: the low bits of the block's LBA.
    Type1,
    /// Reference tag: the command's initial reference tag plus the block's index.
    Type2,
    /// Reference tag: opaque, not incremented.
    Type3,
}

impl PiType {
    /// The type DPS bits 2:0 name (None: no protection information, or a reserved value).
    pub fn from_dps(dps: u8) -> Option<PiType> {
        match dps & 0b111 {
            1 => Some(PiType::Type1),
            2 => Some(PiType::Type2),
            3 => Some(PiType::Type3),
            _ => None,
        }
    }
    pub fn dps_value(self) -> u8 {
        match self {
            PiType::Type1 => 1,
            PiType::Type2 => 2,
            PiType::Type3 => 3,
        }
    }
}

/// Which check a block's protection information failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PiError {
    Guard,
    AppTag,
    RefTag,
}

impl PiError {
    /// The completion status of a failed check (Media and Data Integrity Errors,
    /// End-to-end Guard / Application Tag / Reference Tag Check Error), DNR set.
    pub fn status(self) -> crate::Status {
        match self {
            PiError::Guard => crate::Status::END_TO_END_GUARD_CHECK_ERROR,
            PiError::AppTag => crate::Status::END_TO_END_APPLICATION_TAG_CHECK_ERROR,
            PiError::RefTag => crate::Status::END_TO_END_REFERENCE_TAG_CHECK_ERROR,
        }
        .with_dnr()
    }
}

/// The protection information of a namespace's format: its type, its guard, and
/// where its tuple sits in each block's `ms` bytes of metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PiLayout {
    pub ty: PiType,
    pub guard: Guard,
    /// Metadata bytes per block (the tuple's size or more).
    pub ms: usize,
    /// The first bytes of the metadata (DPS bit 3), else the last.
    pub first: bool,
}

/// What a command says about its blocks' tags (Dwords 14 and 15, and 3 for the
/// 64-bit guard's reference tag).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PiTags {
    /// The first block's reference tag: expected (reads) or initial (writes).
    pub ref_tag: u64,
    pub app_tag: u16,
    /// Which application tag bits are checked.
    pub app_mask: u16,
}

impl PiLayout {
    /// Bytes of its protection information tuple.
    #[inline]
    pub fn size(&self) -> usize {
        self.guard.tuple_size()
    }

    /// Where the protection information starts in a block's metadata.
    pub fn offset(&self) -> usize {
        if self.first {
            0
        } else {
            self.ms - self.size()
        }
    }

    /// The running guard CRC of a block's data ([`Guard::data_crc`]).
    #[inline]
    pub fn data_crc(&self, data: &[u8]) -> u64 {
        self.guard.data_crc(data)
    }

    /// The guard of a block whose data's running CRC is `data_crc` and whose
    /// metadata is `meta`: the CRC goes on over the metadata bytes before the
    /// protection information (none when it comes first).
    pub fn guard(&self, data_crc: u64, meta: &[u8]) -> u64 {
        let before = &meta[..self.offset()];
        match self.guard {
            Guard::Crc16 => crc16_t10dif_update(data_crc as u16, before) as u64,
            Guard::Crc64 => !crc64_nvme_update(data_crc, before),
        }
    }

    /// The reference tag of block `i` of a command whose first block's is `first`.
    pub fn ref_tag(&self, first: u64, i: u32) -> u64 {
        match self.ty {
            PiType::Type3 => first & self.guard.ref_mask(),
            PiType::Type1 | PiType::Type2 => first.wrapping_add(i as u64) & self.guard.ref_mask(),
        }
    }

    /// The reference tag type 1 gives the block at `lba`: its low 32 or 48 bits.
    pub fn lba_ref_tag(&self, lba: u64) -> u64 {
        lba & self.guard.ref_mask()
    }

    /// The protection information in a block's metadata `meta` (its `ms` bytes).
    pub fn read(&self, meta: &[u8]) -> PiTuple {
        let o = self.offset();
        match self.guard {
            Guard::Crc16 => {
                let p = Pi16::from_bytes(meta[o..o + 8].try_into().expect("8 bytes"));
                PiTuple { guard: p.guard as u64, app_tag: p.app_tag, ref_tag: p.ref_tag as u64 }
            }
            Guard::Crc64 => {
                let p = Pi64::from_bytes(meta[o..o + 16].try_into().expect("16 bytes"));
                PiTuple { guard: p.guard, app_tag: p.app_tag, ref_tag: p.ref_tag }
            }
        }
    }

    /// Puts `pi` into a block's metadata `meta`, in this format's form.
    pub fn write(&self, pi: PiTuple, meta: &mut [u8]) {
        let o = self.offset();
        match self.guard {
            Guard::Crc16 => {
                let p = Pi16 { guard: pi.guard as u16, app_tag: pi.app_tag, ref_tag: pi.ref_tag as u32 };
                meta[o..o + 8].copy_from_slice(&p.to_bytes());
            }
            Guard::Crc64 => {
                let p = Pi64 {
                    guard: pi.guard,
                    app_tag: pi.app_tag,
                    ref_tag: pi.ref_tag & self.guard.ref_mask(),
                };
                meta[o..o + 16].copy_from_slice(&p.to_bytes());
            }
        }
    }

    /// Writes the protection information of a block into its metadata `meta`:
    /// the guard over `data_crc` and the bytes before it, the tags of block `i`.
    pub fn generate(&self, data_crc: u64, tags: PiTags, i: u32, meta: &mut [u8]) {
        let pi = PiTuple {
            guard: self.guard(data_crc, meta),
            app_tag: tags.app_tag,
            ref_tag: self.ref_tag(tags.ref_tag, i),
        };
        self.write(pi, meta);
    }

    /// True if the checks of a block are disabled by its tags: an application tag
    /// of FFFFh (types 1 and 2), with a reference tag of all ones (type 3).
    pub fn escaped(&self, pi: PiTuple) -> bool {
        pi.app_tag == 0xffff && (self.ty != PiType::Type3 || pi.ref_tag == self.guard.ref_mask())
    }

    /// Checks block `i`'s protection information in `meta` against its data's
    /// running CRC and the command's tags, for the checks `prchk` (PRINFO bits 2:0)
    /// asks.
    pub fn check(&self, prchk: u8, data_crc: u64, meta: &[u8], tags: PiTags, i: u32) -> Result<(), PiError> {
        let pi = self.read(meta);
        if self.escaped(pi) {
            return Ok(());
        }
        if prchk & prinfo::PRCHK_GUARD != 0 && pi.guard != self.guard(data_crc, meta) {
            return Err(PiError::Guard);
        }
        if prchk & prinfo::PRCHK_APP != 0 && (pi.app_tag ^ tags.app_tag) & tags.app_mask != 0 {
            return Err(PiError::AppTag);
        }
        if prchk & prinfo::PRCHK_REF != 0 && pi.ref_tag != self.ref_tag(tags.ref_tag, i) {
            return Err(PiError::RefTag);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The catalogue check values: the CRC of the nine ASCII digits "123456789".
    const CHECK: &[u8] = b"123456789";

    #[test]
    fn crc16_t10dif_check_value() {
        assert_eq!(crc16_t10dif(CHECK), 0xd0db);
        assert_eq!(crc16_t10dif(&[]), 0);
        // In pieces, the same.
        assert_eq!(crc16_t10dif_update(crc16_t10dif(&CHECK[..4]), &CHECK[4..]), 0xd0db);
    }

    #[test]
    fn crc64_nvme_check_value() {
        assert_eq!(crc64_nvme(CHECK), 0xae8b_1486_0a79_9888);
        assert_eq!(crc64_nvme(&[]), 0);
        assert_eq!(
            !crc64_nvme_update(crc64_nvme_update(!0, &CHECK[..5]), &CHECK[5..]),
            0xae8b_1486_0a79_9888
        );
    }

    #[test]
    fn a_block_of_zeroes_and_one_of_ones() {
        // 4 KiB of zeroes: CRC-16 with initial value 0 over zeroes stays 0 (why
        // type 1 PI cannot tell an unwritten block of zeroes from a good one).
        assert_eq!(crc16_t10dif(&[0u8; 4096]), 0);
        assert_ne!(crc16_t10dif(&[0xffu8; 512]), crc16_t10dif(&[0xfeu8; 512]));
        assert_ne!(crc64_nvme(&[0u8; 4096]), 0);
    }

    #[test]
    fn pi16_is_big_endian() {
        let pi = Pi16 { guard: 0xd0db, app_tag: 0x1234, ref_tag: 0x0a0b_0c0d };
        assert_eq!(pi.to_bytes(), [0xd0, 0xdb, 0x12, 0x34, 0x0a, 0x0b, 0x0c, 0x0d]);
        assert_eq!(Pi16::from_bytes(pi.to_bytes()), pi);
    }

    #[test]
    fn pi64_is_big_endian_with_a_48_bit_reference_tag() {
        let pi = Pi64 { guard: 0x0102_0304_0506_0708, app_tag: 0x1234, ref_tag: 0x0a0b_0c0d_0e0f };
        assert_eq!(pi.to_bytes(), [1, 2, 3, 4, 5, 6, 7, 8, 0x12, 0x34, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f]);
        assert_eq!(Pi64::from_bytes(pi.to_bytes()), pi);
        // The command's tag: Dword 14 low, Dword 3 bits 15:0 high, the rest not ours.
        assert_eq!(Guard::Crc64.command_ref_tag(0x0c0d_0e0f, 0xffff_0a0b), 0x0a0b_0c0d_0e0f);
        assert_eq!(Guard::Crc16.command_ref_tag(0x0c0d_0e0f, 0xffff_0a0b), 0x0c0d_0e0f);
    }

    fn layout(ty: PiType, ms: usize, first: bool) -> PiLayout {
        PiLayout { ty, guard: Guard::Crc16, ms, first }
    }

    fn layout64(ty: PiType, ms: usize, first: bool) -> PiLayout {
        PiLayout { ty, guard: Guard::Crc64, ms, first }
    }

    #[test]
    fn generated_protection_information_checks_and_a_changed_byte_does_not() {
        let data = [0x5au8; 512];
        let tags = PiTags { ref_tag: 100, app_tag: 0x1234, app_mask: 0xffff };
        for l in [
            layout(PiType::Type1, 8, true),
            layout(PiType::Type2, 16, false),
            layout(PiType::Type3, 16, true),
            layout(PiType::Type1, 64, false),
            layout64(PiType::Type1, 16, true),
            layout64(PiType::Type2, 64, false),
            layout64(PiType::Type3, 16, false),
        ] {
            let crc = l.data_crc(&data);
            let ms = l.ms;
            let mut buf = [7u8; 64];
            let meta = &mut buf[..ms];
            l.generate(crc, tags, 3, meta);
            assert_eq!(l.check(prinfo::PRCHK_MASK, crc, meta, tags, 3), Ok(()), "{l:?}");
            // The other bytes of the metadata are left as they were.
            let o = l.offset();
            assert!(meta[..o].iter().chain(&meta[o + l.size()..]).all(|&b| b == 7), "{l:?}");
            let other_data = l.data_crc(&[0x5bu8; 512]);
            assert_eq!(l.check(prinfo::PRCHK_GUARD, other_data, meta, tags, 3), Err(PiError::Guard));
            let other = PiTags { app_tag: 0x1235, ..tags };
            assert_eq!(l.check(prinfo::PRCHK_APP, crc, meta, other, 3), Err(PiError::AppTag));
            // Only the bits the mask names are compared.
            let masked = PiTags { app_tag: 0x1235, app_mask: 0xfff0, ..tags };
            assert_eq!(l.check(prinfo::PRCHK_APP, crc, meta, masked, 3), Ok(()));
            // Not asked: not checked.
            assert_eq!(l.check(prinfo::PRCHK_REF, other_data, meta, other, 3), Ok(()));
            // Type 3 keeps one reference tag for every block; the others count up.
            let ref_ok = l.check(prinfo::PRCHK_REF, crc, meta, tags, 4);
            assert_eq!(ref_ok.is_ok(), l.ty == PiType::Type3, "{l:?}");
            if !l.first {
                // The guard covers the metadata bytes before the protection information.
                meta[0] ^= 1;
                assert_eq!(l.check(prinfo::PRCHK_GUARD, crc, meta, tags, 3), Err(PiError::Guard));
            }
        }
    }

    #[test]
    fn the_64_bit_guard_is_the_crc_64_of_the_data_and_its_tag_48_bits() {
        // Metadata that is only the tuple: the guard is CRC-64/NVME of the data, as
        // Linux's integrity layer computes it.
        let l = layout64(PiType::Type1, 16, false);
        let mut data = [0u8; 4096];
        data.iter_mut().enumerate().for_each(|(i, b)| *b = (i * 7) as u8);
        let mut meta = [0u8; 16];
        let tags = PiTags { ref_tag: 0xffff_ffff_ffff, app_tag: 1, app_mask: 0xffff };
        l.generate(l.data_crc(&data), tags, 1, &mut meta);
        let pi = Pi64::from_bytes(meta);
        assert_eq!(pi.guard, crc64_nvme(&data));
        // Block 1 of a command starting at the last 48-bit tag wraps to 0.
        assert_eq!(pi.ref_tag, 0);
        assert_eq!(l.lba_ref_tag(0x1_0000_0000_0005), 5);
    }

    #[test]
    fn all_ones_tags_disable_the_checks() {
        let tags = PiTags { ref_tag: 5, app_tag: 0, app_mask: 0xffff };
        let ones = [0xffu8; 16];
        for ty in [PiType::Type1, PiType::Type2, PiType::Type3] {
            assert_eq!(layout(ty, 8, true).check(prinfo::PRCHK_MASK, 0x1111, &ones[..8], tags, 0), Ok(()));
            assert_eq!(layout64(ty, 16, true).check(prinfo::PRCHK_MASK, 0x1111, &ones, tags, 0), Ok(()));
        }
        // Type 3 needs the reference tag all ones too; types 1 and 2 do not.
        let app_only = Pi16 { guard: 0, app_tag: 0xffff, ref_tag: 9 }.to_bytes();
        assert_eq!(layout(PiType::Type1, 8, true).check(prinfo::PRCHK_MASK, 1, &app_only, tags, 0), Ok(()));
        assert_eq!(
            layout(PiType::Type3, 8, true).check(prinfo::PRCHK_GUARD, 1, &app_only, tags, 0),
            Err(PiError::Guard)
        );
        // All 48 bits of the 64-bit guard's reference tag, not 32 of them.
        let low32 = Pi64 { guard: 0, app_tag: 0xffff, ref_tag: 0xffff_ffff }.to_bytes();
        assert_eq!(
            layout64(PiType::Type3, 16, true).check(prinfo::PRCHK_GUARD, 1, &low32, tags, 0),
            Err(PiError::Guard)
        );
    }
}
