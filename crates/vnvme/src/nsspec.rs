//! Parsing namespace specifications given on the command line.

use std::str::FromStr;
use std::sync::Arc;

use block_backend::{Backend, FileBackend, NullBackend, RamBackend};

/// `ram:SIZE[:lba=512|4096]`, `null:SIZE[:...]` or `file:PATH:SIZE[:...]`.
#[derive(Clone, Debug)]
pub struct NsSpec {
    pub kind: Kind,
    pub size: u64,
    /// LBA format index: 0 = 512 B, 1 = 4 KiB.
    pub lba_format: u8,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Ram,
    Null,
    /// A file (created at the given size if it does not exist).
    File(std::path::PathBuf),
}

impl NsSpec {
    pub fn backend(&self) -> std::io::Result<Arc<dyn Backend>> {
        Ok(match &self.kind {
            Kind::Ram => Arc::new(RamBackend::new(self.size)),
            Kind::Null => Arc::new(NullBackend::new(self.size)),
            Kind::File(p) => Arc::new(
                FileBackend::open(p, Some(self.size))
                    .map_err(|e| std::io::Error::other(format!("{}: {e}", p.display())))?,
            ),
        })
    }
}

/// Parses sizes like `512`, `64K`, `64M`, `2G`, `1T` (binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let mul = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("unknown size suffix {c:?} in {s:?} (use K, M, G or T)")),
            };
            (&s[..i], mul)
        }
        _ => (s, 1),
    };
    let n: u64 = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    n.checked_mul(mul).ok_or_else(|| format!("size {s:?} overflows"))
}

impl FromStr for NsSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = s.split(':');
        let kind = match parts.next().unwrap_or_default() {
            "ram" => Kind::Ram,
            "null" => Kind::Null,
            "file" => Kind::File(
                parts.next().filter(|p| !p.is_empty()).ok_or("file needs a path: file:PATH:SIZE")?.into(),
            ),
            k => return Err(format!("unknown namespace kind {k:?} (expected ram, null or file)")),
        };
        let size = parse_size(parts.next().ok_or("missing size, e.g. ram:64M")?)?;
        let mut lba_format = 0;
        for opt in parts {
            match opt.split_once('=') {
                Some(("lba", "512")) => lba_format = 0,
                Some(("lba", "4096")) => lba_format = 1,
                _ => return Err(format!("unknown namespace option {opt:?} (expected lba=512 or lba=4096)")),
            }
        }
        let lba = if lba_format == 0 { 512 } else { 4096 };
        if size == 0 || size % lba != 0 {
            return Err(format!("namespace size {size} is not a non-zero multiple of the {lba}-byte LBA"));
        }
        Ok(NsSpec { kind, size, lba_format })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs_and_rejects_bad_ones() {
        let n: NsSpec = "ram:64M".parse().unwrap();
        assert_eq!((n.kind, n.size, n.lba_format), (Kind::Ram, 64 << 20, 0));
        let n: NsSpec = "null:1G:lba=4096".parse().unwrap();
        assert_eq!((n.kind, n.size, n.lba_format), (Kind::Null, 1 << 30, 1));
        assert!("disk:1G".parse::<NsSpec>().is_err());
        assert!("ram".parse::<NsSpec>().is_err());
        assert!("ram:1000".parse::<NsSpec>().is_err(), "not a multiple of 512");
        assert!("ram:1M:lba=1024".parse::<NsSpec>().is_err());
        assert!("ram:12Q".parse::<NsSpec>().is_err());
        let n: NsSpec = "file:disk.img:8M".parse().unwrap();
        assert_eq!(n.kind, Kind::File("disk.img".into()));
        assert!("file::8M".parse::<NsSpec>().is_err());
    }
}
