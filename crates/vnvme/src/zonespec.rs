//! The options that make a namespace zoned (`zoned=SIZE` and its companions), and
//! opening the file its zone state is kept in.
//!
//! ```text
//! zoned=SIZE        a zoned namespace (Zoned Namespace Command Set) of SIZE zones:
//!                   a power of two of at least 4K; the namespace is the whole
//!                   zones that fit
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

use crate::units::parse_size;

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

    /// What no single option shows: companions without `zoned=`, the layout.
    pub fn checked(&self) -> Result<(), String> {
        let Some(zone_size) = self.zone_size else {
            return Err("zone-cap=, max-open=, max-active= and zone-state= are for a zoned namespace: \
                        give its zone size too (zoned=SIZE, e.g. zoned=64M)"
                .into());
        };
        let cfg = self.layout(zone_size);
        // The namespace's own size is checked when it is opened.
        cfg.check(zone_size)
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
    /// `zone-state=`, or where `home` says.
    pub fn open(&self, home: StateHome<'_>) -> std::io::Result<ZonedConfig> {
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
            cfg.state_file = Some(Arc::new(open_kept_file(&p, "zone state")?));
        }
        Ok(cfg)
    }
}

/// Opens (creating it if new, never truncating) a file a namespace keeps its state
/// in beside its data (`what` names it in errors).
pub fn open_kept_file(p: &Path, what: &str) -> std::io::Result<std::fs::File> {
    let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(p);
    f.map_err(|e| std::io::Error::new(e.kind(), format!("{what} {}: {e}", p.display())))
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
        assert!(z.as_ref().unwrap().checked().unwrap_err().contains("zoned=SIZE"));
        ZoneSpec::set_option(&mut z, "zoned", "64M").unwrap();
        ZoneSpec::set_option(&mut z, "zone-cap", "48M").unwrap();
        let z = z.unwrap();
        z.checked().unwrap();
        assert_eq!((z.zone_size, z.zone_cap, z.max_open), (Some(64 << 20), Some(48 << 20), 4));
        let mut bad = None;
        ZoneSpec::set_option(&mut bad, "zoned", "48M").unwrap();
        assert!(bad.unwrap().checked().unwrap_err().contains("power of two"));
        assert!(ZoneSpec::set_option(&mut None, "max-open", "x").is_err());
    }

    #[test]
    fn the_state_file_goes_beside_a_file_or_must_be_named() {
        let z = ZoneSpec { zone_size: Some(1 << 20), ..Default::default() };
        let dir = std::env::temp_dir().join(format!("vnvme-zonespec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = z.open(StateHome::Beside(&dir.join("disk.img"))).unwrap();
        assert!(cfg.state_file.is_some());
        assert!(dir.join("disk.img.zones").exists());
        assert!(z.open(StateHome::Memory).unwrap().state_file.is_none());
        let e = z.open(StateHome::Required("on nbd://")).unwrap_err();
        assert!(e.to_string().contains("zone-state=PATH"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
