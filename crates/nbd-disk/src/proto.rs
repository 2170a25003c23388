//! The NBD protocol's wire format (the NBD project's doc/proto.md): the fixed newstyle
//! handshake, option requests and replies, transmission requests, and simple and
//! structured replies. Everything on the wire is big-endian. Encoders and decoders
//! only; no I/O here.

/// "NBDMAGIC": the first 8 bytes a server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": newstyle negotiation, and the magic of every option request.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// The magic of every option reply.
pub const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flags (server) and client flags.
pub mod hflag {
    pub const FIXED_NEWSTYLE: u16 = 1 << 0;
    pub const NO_ZEROES: u16 = 1 << 1;
}

/// Options.
pub mod opt {
    pub const ABORT: u32 = 2;
    pub const GO: u32 = 7;
    pub const STRUCTURED_REPLY: u32 = 8;
}

/// Option reply types (errors have bit 31 set).
pub mod rep {
    pub const ACK: u32 = 1;
    pub const INFO: u32 = 3;
    pub const ERR_BIT: u32 = 1 << 31;
    pub const ERR_UNSUP: u32 = ERR_BIT | 1;
    pub const ERR_POLICY: u32 = ERR_BIT | 2;
    pub const ERR_INVALID: u32 = ERR_BIT | 3;
    pub const ERR_PLATFORM: u32 = ERR_BIT | 4;
    pub const ERR_TLS_REQD: u32 = ERR_BIT | 5;
    pub const ERR_UNKNOWN: u32 = ERR_BIT | 6;
    pub const ERR_SHUTDOWN: u32 = ERR_BIT | 7;
    pub const ERR_BLOCK_SIZE_REQD: u32 = ERR_BIT | 8;
    pub const ERR_TOO_BIG: u32 = ERR_BIT | 9;

    /// A name for an error reply type, for messages.
    pub fn error_name(t: u32) -> &'static str {
        match t {
            ERR_UNSUP => "unsupported option",
            ERR_POLICY => "refused by the server's policy",
            ERR_INVALID => "invalid option data",
            ERR_PLATFORM => "not available on the server's platform",
            ERR_TLS_REQD => "the server requires TLS",
            ERR_UNKNOWN => "no such export",
            ERR_SHUTDOWN => "the server is shutting down",
            ERR_BLOCK_SIZE_REQD => "the server requires block size negotiation",
            ERR_TOO_BIG => "request too big",
            _ => "error",
        }
    }
}

/// Information types in NBD_OPT_GO.
pub mod info {
    pub const EXPORT: u16 = 0;
    pub const BLOCK_SIZE: u16 = 3;
}

/// Transmission flags of an export.
pub mod tflag {
    pub const HAS_FLAGS: u16 = 1 << 0;
    pub const READ_ONLY: u16 = 1 << 1;
    pub const SEND_FLUSH: u16 = 1 << 2;
    pub const SEND_FUA: u16 = 1 << 3;
    pub const SEND_TRIM: u16 = 1 << 5;
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
}

/// Transmission commands.
pub mod cmd {
    pub const READ: u16 = 0;
    pub const WRITE: u16 = 1;
    pub const DISC: u16 = 2;
    pub const FLUSH: u16 = 3;
    pub const TRIM: u16 = 4;
    pub const WRITE_ZEROES: u16 = 6;
}

/// Command flags.
pub mod cflag {
    pub const FUA: u16 = 1 << 0;
    pub const NO_HOLE: u16 = 1 << 1;
}

/// Structured reply chunk types and flags.
pub mod chunk {
    pub const FLAG_DONE: u16 = 1 << 0;
    pub const NONE: u16 = 0;
    pub const OFFSET_DATA: u16 = 1;
    pub const OFFSET_HOLE: u16 = 2;
    pub const ERROR_BIT: u16 = 1 << 15;
    pub const ERROR: u16 = ERROR_BIT | 1;
    pub const ERROR_OFFSET: u16 = ERROR_BIT | 2;
}

/// The largest string (export name) the protocol allows.
pub const MAX_STRING: usize = 4096;

/// An option request: header and data.
pub fn option(option: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(16 + data.len());
    v.extend_from_slice(&IHAVEOPT.to_be_bytes());
    v.extend_from_slice(&option.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

/// NBD_OPT_GO's data for `name`, asking for the block size constraints.
pub fn go_data(name: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + name.len());
    v.extend_from_slice(&(name.len() as u32).to_be_bytes());
    v.extend_from_slice(name.as_bytes());
    v.extend_from_slice(&1u16.to_be_bytes());
    v.extend_from_slice(&info::BLOCK_SIZE.to_be_bytes());
    v
}

/// An option reply's header: the option it answers, its type and data length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionReply {
    pub option: u32,
    pub kind: u32,
    pub len: u32,
}

impl OptionReply {
    pub const SIZE: usize = 20;

    pub fn parse(b: &[u8; Self::SIZE]) -> Result<Self, String> {
        let magic = u64::from_be_bytes(b[0..8].try_into().expect("8 bytes"));
        if magic != REPLY_MAGIC {
            return Err(format!("option reply magic {magic:#x}, want {REPLY_MAGIC:#x}"));
        }
        Ok(OptionReply {
            option: u32::from_be_bytes(b[8..12].try_into().expect("4")),
            kind: u32::from_be_bytes(b[12..16].try_into().expect("4")),
            len: u32::from_be_bytes(b[16..20].try_into().expect("4")),
        })
    }
}

/// A transmission request header (28 bytes); WRITE data follows it.
pub fn request(flags: u16, kind: u16, cookie: u64, offset: u64, len: u32) -> [u8; 28] {
    let mut b = [0u8; 28];
    b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..24].copy_from_slice(&offset.to_be_bytes());
    b[24..28].copy_from_slice(&len.to_be_bytes());
    b
}

/// The start of a reply: a simple one (16 bytes, then the data of a successful
/// READ) or a structured chunk (20 bytes, then `len` bytes of payload).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyHeader {
    Simple { error: u32, cookie: u64 },
    Chunk { flags: u16, kind: u16, cookie: u64, len: u32 },
}

impl ReplyHeader {
    /// Bytes of header to have before [`ReplyHeader::parse`] can tell: the magic.
    pub const MAGIC_LEN: usize = 4;

    /// The header's full length for the magic at the start of `b`.
    pub fn len_for(b: &[u8]) -> Result<usize, String> {
        match u32::from_be_bytes(b[..4].try_into().expect("4 bytes")) {
            SIMPLE_REPLY_MAGIC => Ok(16),
            STRUCTURED_REPLY_MAGIC => Ok(20),
            m => Err(format!("reply magic {m:#x}: the stream is out of step")),
        }
    }

    /// Parses a whole header (16 or 20 bytes, as [`ReplyHeader::len_for`] said).
    pub fn parse(b: &[u8]) -> Result<Self, String> {
        let u32at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().expect("4"));
        let u16at = |i: usize| u16::from_be_bytes(b[i..i + 2].try_into().expect("2"));
        let u64at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().expect("8"));
        match (u32at(0), b.len()) {
            (SIMPLE_REPLY_MAGIC, 16) => Ok(ReplyHeader::Simple { error: u32at(4), cookie: u64at(8) }),
            (STRUCTURED_REPLY_MAGIC, 20) => {
                Ok(ReplyHeader::Chunk { flags: u16at(4), kind: u16at(6), cookie: u64at(8), len: u32at(16) })
            }
            (m, n) => Err(format!("reply header of {n} bytes with magic {m:#x}")),
        }
    }
}

/// An NBD error number as the errno it stands for (they share values).
pub fn error_name(e: u32) -> &'static str {
    match e {
        1 => "EPERM",
        5 => "EIO",
        12 => "ENOMEM",
        22 => "EINVAL",
        28 => "ENOSPC",
        75 => "EOVERFLOW",
        95 => "ENOTSUP",
        108 => "ESHUTDOWN",
        _ => "error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_options_encode_big_endian() {
        let r = request(cflag::FUA, cmd::WRITE, 0x0102_0304_0506_0708, 0x1000, 4096);
        assert_eq!(&r[0..4], &[0x25, 0x60, 0x95, 0x13]);
        assert_eq!(&r[4..8], &[0, 1, 0, 1]);
        assert_eq!(&r[8..16], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&r[16..24], &[0, 0, 0, 0, 0, 0, 0x10, 0]);
        assert_eq!(&r[24..28], &[0, 0, 0x10, 0]);
        let o = option(opt::GO, &go_data("disk"));
        assert_eq!(&o[0..8], b"IHAVEOPT");
        assert_eq!(&o[8..12], &[0, 0, 0, 7]);
        assert_eq!(&o[12..16], &[0, 0, 0, 12]);
        assert_eq!(&o[16..], &[0, 0, 0, 4, b'd', b'i', b's', b'k', 0, 1, 0, 3]);
    }

    #[test]
    fn replies_parse_and_wrong_magic_is_refused() {
        let mut s = Vec::new();
        s.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        s.extend_from_slice(&5u32.to_be_bytes());
        s.extend_from_slice(&9u64.to_be_bytes());
        assert_eq!(ReplyHeader::len_for(&s).unwrap(), 16);
        assert_eq!(ReplyHeader::parse(&s).unwrap(), ReplyHeader::Simple { error: 5, cookie: 9 });
        let mut c = Vec::new();
        c.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
        c.extend_from_slice(&chunk::FLAG_DONE.to_be_bytes());
        c.extend_from_slice(&chunk::OFFSET_DATA.to_be_bytes());
        c.extend_from_slice(&7u64.to_be_bytes());
        c.extend_from_slice(&520u32.to_be_bytes());
        assert_eq!(
            ReplyHeader::parse(&c).unwrap(),
            ReplyHeader::Chunk { flags: chunk::FLAG_DONE, kind: chunk::OFFSET_DATA, cookie: 7, len: 520 }
        );
        assert!(ReplyHeader::len_for(&[0, 0, 0, 0]).is_err());
        let mut r = [0u8; OptionReply::SIZE];
        r[0..8].copy_from_slice(&REPLY_MAGIC.to_be_bytes());
        r[8..12].copy_from_slice(&opt::GO.to_be_bytes());
        r[12..16].copy_from_slice(&rep::ACK.to_be_bytes());
        assert_eq!(OptionReply::parse(&r).unwrap(), OptionReply { option: opt::GO, kind: rep::ACK, len: 0 });
        r[0] = 1;
        assert!(OptionReply::parse(&r).is_err());
    }
}
