//! The options that give a namespace metadata and end-to-end protection
//! (`ms=`, `pi=`, `pil=`, `meta=`), and opening the file its metadata is kept in.
//!
//! ```text
//! ms=8|16|64        bytes of metadata per block it starts with (8 or 16 with
//!                   lba=512 (16: the 64-bit guard); 8, 16 or 64 with
//!                   lba=4096); the host can Format NVM to any format with
//!                   metadata from then on
//! pi=0|1|2|3        protection information type it starts with (needs ms=)
//! guard=16|64       its guard: CRC-16 T10-DIF in an 8-byte tuple (default), or
//!                   CRC-64/NVME in a 16-byte tuple with a 48-bit reference tag
//!                   (needs ms=16)
//! pil=first|last    where the protection information tuple sits in the
//!                   metadata (default: last)
//! mset=0|1          1: the metadata travels inline after each block's data
//!                   (extended LBAs) instead of in a separate buffer (default 0)
//! meta=PATH         the file its metadata is kept in (default for a regular
//!                   file: PATH.meta beside it; ram: keeps it in memory, null:
//!                   keeps none; other kinds must name one). Given alone, it
//!                   offers the formats with metadata without starting in one.
//! ```
//!
//! The file's layout is in docs/metadata.md.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

use nvme_ctrl::{MetaFile, MetadataConfig};

use crate::zonespec::{beside, open_kept_file, StateHome};

/// The option names, for a URI kind's option list.
pub const OPTIONS: [&str; 6] = ["ms", "pi", "guard", "pil", "mset", "meta"];

/// A namespace's metadata options.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetaSpec {
    /// Metadata bytes per block of the starting format (0: none).
    pub ms: u16,
    /// Protection information type (0: none).
    pub pi: u8,
    /// `guard=64`: the formats whose protection information has the 64-bit guard.
    pub guard64: bool,
    /// `pil=`: Some(true) for the first bytes of the metadata.
    pub first: Option<bool>,
    /// `mset=1`: extended LBAs.
    pub extended: bool,
    /// `meta=`.
    pub path: Option<PathBuf>,
}

impl MetaSpec {
    /// Takes `name=value` if it is one of [`OPTIONS`] (Ok(false): not one).
    pub fn set_option(this: &mut Option<MetaSpec>, name: &str, value: &str) -> Result<bool, String> {
        if !OPTIONS.contains(&name) {
            return Ok(false);
        }
        let m = this.get_or_insert_with(Default::default);
        match name {
            "ms" => {
                m.ms = match value {
                    "0" => 0,
                    "8" => 8,
                    "16" => 16,
                    "64" => 64,
                    _ => return Err(format!("ms={value}: metadata is 8, 16 or 64 bytes per block")),
                }
            }
            "pi" => {
                m.pi = match value {
                    "0" | "1" | "2" | "3" => value.parse().expect("a digit"),
                    _ => return Err(format!("pi={value}: the protection information type is 0, 1, 2 or 3")),
                }
            }
            "guard" => {
                m.guard64 = match value {
                    "16" => false,
                    "64" => true,
                    _ => {
                        return Err(format!(
                            "guard={value}: the guard is 16 (CRC-16 T10-DIF) or 64 (CRC-64/NVME) bits"
                        ))
                    }
                }
            }
            "mset" => {
                m.extended = match value {
                    "0" => false,
                    "1" => true,
                    _ => {
                        return Err(format!(
                            "mset={value}: 0 (a separate buffer) or 1 (inline, extended LBAs)"
                        ))
                    }
                }
            }
            "pil" => {
                m.first = Some(match value {
                    "first" => true,
                    "last" => false,
                    _ => return Err(format!("pil={value}: expected first or last")),
                })
            }
            _ => m.path = Some(PathBuf::from(value)),
        }
        Ok(true)
    }

    /// What no single option shows: a type without metadata for it, a format that
    /// does not exist.
    pub fn checked(&self, lba_format: Option<u8>) -> Result<(), String> {
        if self.pi != 0 && self.ms < 8 {
            return Err(format!(
                "pi={}: protection information needs metadata: give ms=8 (or 16, 64)",
                self.pi
            ));
        }
        if self.extended && self.ms == 0 {
            return Err("mset=1: metadata inline needs metadata: give ms=8 (or 16, 64)".into());
        }
        if self.first.is_some() && self.pi == 0 {
            return Err("pil=: where the protection information sits means nothing without pi=1|2|3".into());
        }
        if self.guard64 && self.ms != 16 {
            return Err("guard=64: the 64-bit guard's formats have 16 bytes of metadata: give ms=16".into());
        }
        // Without lba=, the block size is the backend's: checked when it is opened.
        if self.ms > 0 && lba_format.is_some() && self.format_index(lba_format).is_none() {
            return Err(format!(
                "ms={} with {}-byte blocks: the formats with metadata are 512+8, 4096+8, 4096+16 and \
                 4096+64, and with guard=64 512+16 and 4096+16",
                self.ms,
                if lba_format == Some(1) { 4096 } else { 512 }
            ));
        }
        Ok(())
    }

    /// The LBA format index it starts in, for blocks of format `lba_format` (0 or 1).
    pub fn format_index(&self, lba_format: Option<u8>) -> Option<u8> {
        let shift = if lba_format == Some(1) { 12 } else { 9 };
        let guard = if self.guard64 { nvme_spec::pi::Guard::Crc64 } else { nvme_spec::pi::Guard::Crc16 };
        nvme_ctrl::format_index(shift, self.ms, guard)
    }

    /// The starting format (None: no LBA format has this metadata size and guard).
    pub fn format(&self, lba_format: Option<u8>) -> Option<nvme_ctrl::FormatState> {
        let lbaf = self.format_index(lba_format)?;
        Some(nvme_ctrl::FormatState { lbaf, dps: self.dps(), extended: self.extended })
    }

    /// Identify DPS of the starting format.
    pub fn dps(&self) -> u8 {
        match self.pi {
            0 => 0,
            t => t | if self.first == Some(true) { nvme_spec::identify::dps::FIRST } else { 0 },
        }
    }

    /// The controller's configuration, with the metadata file opened (created if
    /// new): `meta=`, or where `home` says; `kept` is the memory an earlier process
    /// kept a RAM namespace's metadata in (an upgrade). A file is locked as `lock`
    /// says.
    pub fn open(
        &self,
        home: StateHome<'_>,
        kept: Option<OwnedFd>,
        lock: &file_lock::Request,
    ) -> std::io::Result<MetadataConfig> {
        let file = match (&self.path, home) {
            (Some(p), _) => Some(open_kept_file(p, "metadata file", lock)?),
            (None, StateHome::Beside(data)) => {
                Some(open_kept_file(&beside(data, ".meta"), "metadata file", lock)?)
            }
            (None, StateHome::Memory) => match kept {
                Some(fd) => Some(std::fs::File::from(fd)),
                None => {
                    let store = MetaFile::memory()?;
                    return Ok(MetadataConfig { store, dps: self.dps(), extended: self.extended });
                }
            },
            (None, StateHome::Nowhere) => None,
            (None, StateHome::Required(why)) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("a namespace with metadata {why} needs meta=PATH: where its metadata is kept"),
                ))
            }
        };
        Ok(MetadataConfig { store: MetaFile(file.map(Arc::new)), dps: self.dps(), extended: self.extended })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(opts: &[(&str, &str)]) -> Result<Option<MetaSpec>, String> {
        let mut m = None;
        for (k, v) in opts {
            assert!(MetaSpec::set_option(&mut m, k, v)?);
        }
        Ok(m)
    }

    #[test]
    fn options_and_what_they_cannot_be() {
        let m = parse(&[("ms", "8"), ("pi", "1")]).unwrap().unwrap();
        assert_eq!((m.format_index(None), m.dps()), (Some(2), 1));
        assert_eq!(m.checked(None), Ok(()));
        let m = parse(&[("ms", "16"), ("pi", "3"), ("pil", "first")]).unwrap().unwrap();
        assert_eq!((m.format_index(Some(1)), m.dps()), (Some(4), 3 | 8));
        assert!(m.checked(Some(0)).unwrap_err().contains("4096+16"), "16 bytes with 512-byte blocks");
        assert!(parse(&[("pi", "1")]).unwrap().unwrap().checked(None).unwrap_err().contains("ms=8"));
        assert!(parse(&[("ms", "8"), ("pil", "first")]).unwrap().unwrap().checked(None).is_err());
        assert!(parse(&[("mset", "1")]).unwrap().unwrap().checked(None).unwrap_err().contains("ms=8"));
        assert!(parse(&[("ms", "8"), ("mset", "1")]).unwrap().unwrap().extended);
        assert!(parse(&[("ms", "12")]).unwrap_err().contains("8, 16 or 64"));
        // The 64-bit guard: 16 bytes of metadata, with 512- or 4096-byte blocks.
        let m = parse(&[("ms", "16"), ("pi", "1"), ("guard", "64")]).unwrap().unwrap();
        assert_eq!(
            (m.format_index(None), m.format_index(Some(1)), m.checked(Some(0))),
            (Some(6), Some(7), Ok(()))
        );
        assert!(parse(&[("ms", "8"), ("guard", "64")])
            .unwrap()
            .unwrap()
            .checked(None)
            .unwrap_err()
            .contains("ms=16"));
        assert!(parse(&[("guard", "32")]).unwrap_err().contains("16 (CRC-16"));
        assert!(parse(&[("pi", "4")]).unwrap_err().contains("0, 1, 2 or 3"));
        assert!(!MetaSpec::set_option(&mut None, "zoned", "1M").unwrap());
        // meta= alone: the formats are there, the namespace starts without.
        let m = parse(&[("meta", "/x/y.meta")]).unwrap().unwrap();
        assert_eq!((m.ms, m.checked(None)), (0, Ok(())));
    }

    #[test]
    fn the_file_goes_beside_the_data_or_where_it_is_told() {
        let dir = std::env::temp_dir().join(format!("vnvme-metaspec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let m = parse(&[("ms", "8")]).unwrap().unwrap();
        let lock = file_lock::Request::write(file_lock::Role::Metadata, Some(1));
        let c = m.open(StateHome::Beside(&dir.join("disk.img")), None, &lock).unwrap();
        assert!(c.store.0.is_some() && dir.join("disk.img.meta").exists());
        assert!(m.open(StateHome::Memory, None, &lock).unwrap().store.0.is_some());
        assert!(m.open(StateHome::Nowhere, None, &lock).unwrap().store.0.is_none());
        let e = m.open(StateHome::Required("on nbd://"), None, &lock).unwrap_err();
        assert!(e.to_string().contains("meta=PATH"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
