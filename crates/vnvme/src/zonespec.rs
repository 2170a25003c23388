//! The options that make a namespace zoned (`zoned=SIZE` and its companions), and
//! opening the file its zone state is kept in.
//!
//! ```text
//! zoned=SIZE        a zoned namespace (Zoned Namespace Command Set) of SIZE zones:
//!                   a power of two of at least 4K; a size given with it (ram:,
//!                   null:, a file to create) must be a whole number of zones,
//!                   and a size the backend has (a file, a device) is used up to
//!                   the whole zones that fit
//! zone-cap=SIZE     writable bytes per zone (default: the zone size)
//! max-open=N        most zones open at once (default: no limit)
//! max-active=N      most zones open or closed at once (default: no limit)
//! zone-state=PATH   the file the zones' state and write pointers are kept in
//!                   (default for a regular file: PATH.zones beside it; ram: and
//!                   null: keep it in memory; other kinds must name one)
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nvme_ctrl::zoned::ZonedConfig;

use crate::units::{human_size, parse_size};

/// The option names, for a URI kind's option list.
pub const OPTIONS: [&str; 5] = ["zoned", "zone-cap", "max-open", "max-active", "zone-state"];

/// A zoned namespace's options.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ZoneSpec {
    pub zone_size: Option<u64>,
    pub zone_cap: Option<u64>,
    pub max_open: u32,
    pub max_active: u32,
    pub state: Option<PathBuf>,
}

/// Where a namespace kind keeps its zone state when `zone-state=` is not given.
#[derive(Debug)]
pub enum StateHome<'a> {
    /// Beside this regular file (`PATH.zones`).
    Beside(&'a Path),
    /// In memory: the data does not outlive the process either.
    Memory,
    /// Not kept at all (a `null:` namespace keeps no data either).
    Nowhere,
    /// Nowhere by default: the operator must name a file.
    Required(&'static str),
}

impl ZoneSpec {
    /// Takes `name=value` if it is one of [`OPTIONS`] (Ok(false): not a zone option).
    pub fn set_option(this: &mut Option<ZoneSpec>, name: &str, value: &str) -> Result<bool, String> {
        if !OPTIONS.contains(&name) {
            return Ok(false);
        }
        let z = this.get_or_insert_with(Default::default);
        let count = |v: &str| v.parse::<u32>().map_err(|_| format!("{name}={v}: expected a number of zones"));
        match name {
            "zoned" => z.zone_size = Some(parse_size(value)?),
            "zone-cap" => z.zone_cap = Some(parse_size(value)?),
            "max-open" => z.max_open = count(value)?,
            "max-active" => z.max_active = count(value)?,
            _ => z.state = Some(PathBuf::from(value)),
        }
        Ok(true)
    }

    /// What no single option shows: companions without `zoned=`, the layout, and
    /// `size` (the size the operator gave the namespace, if any) against the zones:
    /// a size given is served as given or refused, never cut down to whole zones.
    pub fn checked(&self, size: Option<u64>) -> Result<(), String> {
        let Some(zone_size) = self.zone_size else {
            return Err("zone-cap=, max-open=, max-active= and zone-state= are for a zoned namespace: \
                        give its zone size too (zoned=SIZE, e.g. zoned=64M)"
                .into());
        };
        let cfg = self.layout(zone_size);
        // A size the backend has is checked when it is opened.
        cfg.check(zone_size)?;
        match size {
            Some(size) if !size.is_multiple_of(zone_size) => Err(not_whole_zones(size, zone_size)),
            _ => Ok(()),
        }
    }

    fn layout(&self, zone_size: u64) -> ZonedConfig {
        ZonedConfig {
            zone_size,
            zone_capacity: self.zone_cap.unwrap_or(zone_size),
            max_open: self.max_open,
            max_active: self.max_active,
            state_file: None,
        }
    }

    /// The controller's configuration, with its state file opened (created if new):
    /// `zone-state=`, or where `home` says; its state file locked as `lock` says.
    pub fn open(&self, home: StateHome<'_>, lock: &file_lock::Request) -> std::io::Result<ZonedConfig> {
        let mut cfg = self.layout(self.zone_size.expect("checked at parse"));
        let path = match (&self.state, home) {
            (Some(p), _) => Some(p.clone()),
            (None, StateHome::Beside(data)) => Some(beside(data, ".zones")),
            (None, StateHome::Memory | StateHome::Nowhere) => None,
            (None, StateHome::Required(why)) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "a zoned namespace {why} needs zone-state=PATH: where its write pointers are kept"
                    ),
                ))
            }
        };
        if let Some(p) = path {
            cfg.state_file = Some(Arc::new(open_zone_state(&p, lock)?));
        }
        Ok(cfg)
    }
}

/// Why `size` cannot be a namespace of `zone_size` zones, and the sizes that can.
fn not_whole_zones(size: u64, zone_size: u64) -> String {
    let up = size.div_ceil(zone_size) * zone_size;
    let down = size / zone_size * zone_size;
    let sizes = if down > 0 { format!("{} or {}", spec_size(down), spec_size(up)) } else { spec_size(up) };
    // The largest zone size that divides `size` (zones are powers of two).
    let zone = 1u64 << size.trailing_zeros().min(63);
    let smaller =
        if zone >= 4096 { format!(" (zoned={} divides it)", spec_size(zone)) } else { String::new() };
    format!(
        "{} is not a whole number of {} zones: give a size that is (e.g. {sizes}), or a smaller zone \
         size{smaller}",
        human_size(size),
        human_size(zone_size)
    )
}

/// `n` bytes as the command line writes sizes (`128M`), in the largest unit that
/// divides it.
fn spec_size(n: u64) -> String {
    for (unit, shift) in [("T", 40), ("G", 30), ("M", 20), ("K", 10)] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

/// Opens (creating it if new, never truncating) a file a namespace keeps its state
/// in beside its data (`what` names it in errors), locked as `lock` says before
/// it is used.
pub fn open_kept_file(p: &Path, what: &str, lock: &file_lock::Request) -> std::io::Result<std::fs::File> {
    let ctx = |e: std::io::Error| std::io::Error::new(e.kind(), format!("{what} {e}"));
    let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(p);
    let f = f.map_err(|e| ctx(std::io::Error::new(e.kind(), format!("{}: {e}", p.display()))))?;
    block_backend::lock_file(&f, p, Some(lock)).map_err(ctx)?;
    Ok(f)
}

/// Opens a zone state file, locked as `lock` says: one that exists as it is (an
/// empty or damaged one is refused when read); where none exists, a new one,
/// made (O_EXCL) and said to be new, so that its first reader writes it with every
/// zone empty.
fn open_zone_state(p: &Path, lock: &file_lock::Request) -> std::io::Result<std::fs::File> {
    let ctx = |e: std::io::Error| std::io::Error::new(e.kind(), format!("zone state {}: {e}", p.display()));
    match std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(p) {
        Ok(f) => {
            block_backend::lock_file(&f, p, Some(lock)).map_err(ctx)?;
            nvme_ctrl::zoned::state_file_made_new(&f).map_err(ctx)?;
            tracing::info!("zone state {}: none was there; made a new one, every zone empty", p.display());
            Ok(f)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => open_kept_file(p, "zone state", lock),
        Err(e) => Err(ctx(e)),
    }
}

/// `DATA.SUFFIX`: where a file kept beside a namespace's data goes by default.
pub fn beside(data: &Path, suffix: &str) -> PathBuf {
    let mut p = data.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_companions_need_zoned() {
        let mut z = None;
        assert!(!ZoneSpec::set_option(&mut z, "lba", "4096").unwrap());
        assert!(z.is_none());
        assert!(ZoneSpec::set_option(&mut z, "max-open", "4").unwrap());
        assert!(z.as_ref().unwrap().checked(None).unwrap_err().contains("zoned=SIZE"));
        ZoneSpec::set_option(&mut z, "zoned", "64M").unwrap();
        ZoneSpec::set_option(&mut z, "zone-cap", "48M").unwrap();
        let z = z.unwrap();
        z.checked(None).unwrap();
        assert_eq!((z.zone_size, z.zone_cap, z.max_open), (Some(64 << 20), Some(48 << 20), 4));
        let mut bad = None;
        ZoneSpec::set_option(&mut bad, "zoned", "48M").unwrap();
        assert!(bad.unwrap().checked(None).unwrap_err().contains("power of two"));
        assert!(ZoneSpec::set_option(&mut None, "max-open", "x").is_err());
    }

    /// issue 49: ram:100M:zoned=64M served 64 MiB, the one whole zone that fit.
    #[test]
    fn a_size_given_is_a_whole_number_of_zones_or_refused() {
        let z = ZoneSpec { zone_size: Some(64 << 20), ..Default::default() };
        z.checked(Some(128 << 20)).unwrap();
        let e = z.checked(Some(100 << 20)).unwrap_err();
        for needle in
            ["100 MiB is not a whole number of 64 MiB zones", "e.g. 64M or 128M", "zoned=4M divides it"]
        {
            assert!(e.contains(needle), "{needle:?} missing from: {e}");
        }
        // Less than one zone: only the larger size; a size no zone divides: no zone.
        let e = z.checked(Some(10 << 20)).unwrap_err();
        assert!(e.contains("(e.g. 64M)") && e.contains("zoned=2M divides it"), "{e}");
        let e = ZoneSpec { zone_size: Some(4096), ..Default::default() }.checked(Some(6144)).unwrap_err();
        assert!(e.ends_with("(e.g. 4K or 8K), or a smaller zone size"), "{e}");
    }

    #[test]
    fn the_state_file_goes_beside_a_file_or_must_be_named() {
        let z = ZoneSpec { zone_size: Some(1 << 20), ..Default::default() };
        let dir = std::env::temp_dir().join(format!("vnvme-zonespec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lock = file_lock::Request::write(file_lock::Role::ZoneState, Some(1));
        let cfg = z.open(StateHome::Beside(&dir.join("disk.img")), &lock).unwrap();
        assert!(cfg.state_file.is_some());
        assert!(dir.join("disk.img.zones").exists());
        assert!(z.open(StateHome::Memory, &lock).unwrap().state_file.is_none());
        let e = z.open(StateHome::Required("on nbd://"), &lock).unwrap_err();
        assert!(e.to_string().contains("zone-state=PATH"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
