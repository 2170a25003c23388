//! End-to-end data protection (NVM Command Set §5.3): the guard checksums of the
//! protection information formats and the 8-byte protection information tuple.
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
}
