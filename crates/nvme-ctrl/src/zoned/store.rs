//! A zoned namespace's zone state kept in a file beside its data, so a restart (a
//! crash, SIGKILL, an upgrade) finds every zone as it was.
//!
//! Layout (little-endian; docs/zoned.md has it for operators):
//!
//! ```text
//! 0    8  magic "VNVMEZNS"
//! 8    4  version (1)
//! 12   4  reserved
//! 16   8  zone size, bytes
//! 24   8  zone capacity, bytes
//! 32   8  number of zones
//! 40  24  reserved
//! 64 + 16 * i: zone i
//!      8  bytes written from the zone's start (its write pointer)
//!      1  state (the Zone Descriptor's ZS value)
//!      7  reserved
//! ```
//!
//! A zone's record is written (into the page cache: a SIGKILL loses nothing) each
//! time its state or pointer changes, before the command that changed it completes;
//! a Flush makes the file durable with the data.
//!
//! A zone state file is made on purpose only: the opener that created it (O_EXCL)
//! says so with [`made_new`], and only then is an empty file written with every
//! zone empty. An existing file that is empty (emptied, or its maker died before
//! writing it), cut short or foreign is refused: taken for a new one, it would
//! report every zone of written data empty and let the guest write over it.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::Mutex;

use nvme_spec::zns::ZoneState;

const MAGIC: &[u8; 8] = b"VNVMEZNS";
const VERSION: u32 = 1;
const HEADER: u64 = 64;
const RECORD: u64 = 16;

/// Why a zone state file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ZoneFileError {
    #[error("zone state file: {0}")]
    Io(#[from] std::io::Error),
    #[error("zone state file: not one (no \"VNVMEZNS\" at its start): give a new path, or remove it")]
    NotOurs,
    #[error(
        "zone state file: it is empty, not a new one (one is made where none exists): it was emptied, or the \
         process making it died. Every zone's write pointer was in it: restore it from a copy; or remove it \
         to start with every zone empty, knowing the data written in zones is then written over"
    )]
    Empty,
    #[error(
        "zone state file: it is {have} bytes, cut short ({want} hold {zones} zones): restore it from a copy"
    )]
    Short { have: u64, want: u64, zones: u32 },
    #[error("zone state file: version {0}, this vnvme reads version {VERSION}")]
    Version(u32),
    #[error(
        "zone state file: recorded for {have}, the namespace has {want}: give the options it was made \
         with, or remove the file to start with every zone empty"
    )]
    Layout { have: String, want: String },
    #[error("zone state file: zone {zone} has a state ({state:#x}) or pointer ({written}) no zone can have")]
    Record { zone: u32, state: u8, written: u64 },
}

#[derive(Debug)]
pub(super) struct ZoneFile {
    file: File,
    /// The first write or sync error, logged once: the state then lives on in
    /// memory, and every Flush fails (the state on disk is not what it says).
    failed: bool,
}

/// Files made new by this process and not yet opened (by device and inode).
static MADE: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

/// Says `file` was just created (empty, with O_EXCL) to be a zone state file: its
/// first [`ZoneFile::open`] writes it with every zone empty. An empty file no one
/// said this of is refused.
pub fn made_new(file: &File) -> std::io::Result<()> {
    let m = file.metadata()?;
    MADE.lock().unwrap_or_else(|p| p.into_inner()).push((m.dev(), m.ino()));
    Ok(())
}

/// Whether `m` is a file [`made_new`] was said of and not yet opened (and so
/// forgets it).
fn take_made(m: &std::fs::Metadata) -> bool {
    let mut made = MADE.lock().unwrap_or_else(|p| p.into_inner());
    let before = made.len();
    made.retain(|&k| k != (m.dev(), m.ino()));
    made.len() != before
}

fn layout(zone_size: u64, zone_capacity: u64, zones: u64) -> String {
    format!("{zones} zones of {zone_size} bytes, {zone_capacity} writable")
}

/// What a zone state file holds: the layout it was made for, and each zone's
/// state and bytes written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZoneFileView {
    pub zone_size: u64,
    pub zone_capacity: u64,
    pub zones: Vec<(ZoneState, u64)>,
}

/// Reads a zone state file whole, for a look at it (`vnvme inspect zones`): what
/// a server starting on it would refuse (empty, cut short, foreign, a record no
/// zone can have) is refused the same way.
pub fn read(file: &File) -> Result<ZoneFileView, ZoneFileError> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Err(ZoneFileError::Empty);
    }
    parse(file, len, None)
}

/// Parses a zone state file of `len` bytes, which must be of the layout `expect`
/// gives (zone size, capacity, count) if it gives one.
fn parse(file: &File, len: u64, expect: Option<(u64, u64, u32)>) -> Result<ZoneFileView, ZoneFileError> {
    let mut h = [0u8; HEADER as usize];
    let got = file.read_at(&mut h, 0)?;
    if got < MAGIC.len() || &h[..8] != MAGIC {
        return Err(ZoneFileError::NotOurs);
    }
    let word = |at: usize| u64::from_le_bytes(h[at..at + 8].try_into().expect("8 bytes"));
    let (zone_size, zone_capacity, zones) = (word(16), word(24), word(32));
    // A count no file could hold (a damaged header) is a file cut short.
    let count = u32::try_from(zones).unwrap_or(u32::MAX);
    let short =
        |count: u32| ZoneFileError::Short { have: len, want: HEADER + count as u64 * RECORD, zones: count };
    if (got as u64) < HEADER {
        return Err(short(expect.map_or(count, |e| e.2)));
    }
    let version = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(ZoneFileError::Version(version));
    }
    if let Some((size, cap, n)) = expect {
        let (have, want) = (layout(zone_size, zone_capacity, zones), layout(size, cap, n as u64));
        if have != want {
            return Err(ZoneFileError::Layout { have, want });
        }
    }
    if len < HEADER + zones.saturating_mul(RECORD) {
        return Err(short(count));
    }
    let mut raw = vec![0u8; (zones * RECORD) as usize];
    file.read_exact_at(&mut raw, HEADER)?;
    let mut out = Vec::with_capacity(zones as usize);
    for (zone, r) in raw.chunks_exact(RECORD as usize).enumerate() {
        let written = u64::from_le_bytes(r[..8].try_into().expect("8 bytes"));
        let state = ZoneState::from_raw(r[8]);
        let bad = || ZoneFileError::Record { zone: zone as u32, state: r[8], written };
        let state = state.ok_or_else(bad)?;
        if written > zone_capacity
            || !written.is_multiple_of(512)
            || (state == ZoneState::Empty && written != 0)
        {
            return Err(bad());
        }
        out.push((state, written));
    }
    Ok(ZoneFileView { zone_size, zone_capacity, zones: out })
}

impl ZoneFile {
    /// Opens `file` for `count` zones of `cfg`'s layout: a new file ([`made_new`])
    /// is written with every zone empty; an existing one must be whole and hold
    /// the same layout.
    /// Returns each zone's recorded state and bytes written.
    pub(super) fn open(
        file: File,
        zone_size: u64,
        zone_capacity: u64,
        count: u32,
    ) -> Result<(ZoneFile, Vec<(ZoneState, u64)>), ZoneFileError> {
        let meta = file.metadata()?;
        let len = meta.len();
        let made = take_made(&meta);
        let f = ZoneFile { file, failed: false };
        if len == 0 && !made {
            return Err(ZoneFileError::Empty);
        }
        if len == 0 {
            let mut h = [0u8; HEADER as usize];
            h[..8].copy_from_slice(MAGIC);
            h[8..12].copy_from_slice(&VERSION.to_le_bytes());
            h[16..24].copy_from_slice(&zone_size.to_le_bytes());
            h[24..32].copy_from_slice(&zone_capacity.to_le_bytes());
            h[32..40].copy_from_slice(&(count as u64).to_le_bytes());
            let mut all = h.to_vec();
            for _ in 0..count {
                let mut r = [0u8; RECORD as usize];
                r[8] = ZoneState::Empty as u8;
                all.extend_from_slice(&r);
            }
            f.file.write_all_at(&all, 0)?;
            f.file.sync_data()?;
            return Ok((f, vec![(ZoneState::Empty, 0); count as usize]));
        }
        let view = parse(&f.file, len, Some((zone_size, zone_capacity, count)))?;
        Ok((f, view.zones))
    }

    /// Records zone `zi`'s state and pointer.
    pub(super) fn save(&mut self, zi: u32, state: ZoneState, written: u64) {
        let mut r = [0u8; RECORD as usize];
        r[..8].copy_from_slice(&written.to_le_bytes());
        r[8] = state as u8;
        if let Err(e) = self.file.write_all_at(&r, HEADER + zi as u64 * RECORD) {
            if !self.failed {
                self.failed = true;
                tracing::error!("cannot record zone {zi}'s state ({e}): a restart will not find it as it is");
            }
        }
    }

    /// Makes the file durable; fails if an earlier record could not be written.
    pub(super) fn sync(&self) -> std::io::Result<()> {
        if self.failed {
            return Err(std::io::Error::other("an earlier zone record could not be written"));
        }
        self.file.sync_data()
    }

    /// [`ZoneFile::sync`] for one durable write: a failure is logged once and
    /// remembered.
    pub(super) fn sync_or_remember(&mut self) {
        if let Err(e) = self.sync() {
            if !self.failed {
                self.failed = true;
                tracing::error!(
                    "cannot make the zone state file durable ({e}): a power loss may lose pointers"
                );
            }
        }
    }
}
