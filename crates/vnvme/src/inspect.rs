//! `vnvme inspect`: what the files a namespace keeps beside its data hold, read
//! with the same code the server reads them with (never written; locked for
//! reading, so a server using them is named and refused rather than raced).

use std::fs::File;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use file_lock::{Mode, Request, Role};
use serde_json::json;

use crate::nsspec::{Kind, NsSpec};
use crate::zonespec::beside;

#[derive(Debug, Args)]
pub struct InspectArgs {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, Subcommand)]
enum What {
    /// Print a zone state file: its layout and each zone's state and write
    /// pointer, as JSON (`state`: the Zone Descriptor's ZS value; `written`:
    /// bytes from the zone's start).
    Zones {
        /// The file (`IMAGE.zones` beside a zoned file namespace, or its `zones=`).
        file: PathBuf,
    },
    /// Check a namespace's protection information against its data: for every
    /// block written, the guard against the block's data and (type 1) the
    /// reference tag against its LBA. Prints a JSON summary; exits 1 if a block is
    /// wrong.
    Pi {
        /// The namespace as `vnvme serve --ns` was given it (a `file:` namespace
        /// with `ms=` and `pi=`): its format and where its metadata is come from it.
        #[arg(long, value_name = "SPEC")]
        ns: String,
        /// Check only the blocks with this application tag (blocks whose tag is
        /// FFFFh, which turns checking off, are never checked).
        #[arg(long, value_name = "TAG", value_parser = parse_tag)]
        app_tag: Option<u16>,
    },
}

fn parse_tag(s: &str) -> std::result::Result<u16, String> {
    let v = match s.strip_prefix("0x") {
        Some(h) => u16::from_str_radix(h, 16),
        None => s.parse(),
    };
    v.map_err(|e| format!("an application tag is 0 to 65535 (or 0x0 to 0xffff): {e}"))
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

pub fn run(a: InspectArgs) -> Result<()> {
    match a.what {
        What::Zones { file } => zones(&file),
        What::Pi { ns, app_tag } => pi(&ns, app_tag),
    }
}

/// `path` opened for reading, under a reader's lock.
fn open_read(path: &Path, role: Role) -> Result<File> {
    let f = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let req = Request { mode: Mode::Read, role, nsid: None, accept: Vec::new(), share_with_vnvme: false };
    file_lock::lock(&f, &req).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(f)
}

fn zones(path: &Path) -> Result<()> {
    let f = open_read(path, Role::ZoneState)?;
    let v = nvme_ctrl::zoned::read_state_file(&f).map_err(|e| format!("{}: {e}", path.display()))?;
    let zones: Vec<_> = v.zones.iter().map(|&(s, w)| json!({"state": s as u8, "written": w})).collect();
    let out = json!({"zone_size": v.zone_size, "zone_capacity": v.zone_capacity, "zones": zones});
    println!("{out}");
    Ok(())
}

fn pi(spec: &str, app_tag: Option<u16>) -> Result<()> {
    let ns: NsSpec = spec.parse().map_err(|e| format!("--ns {spec}: {e}"))?;
    let Kind::File(data) = &ns.kind else {
        return Err(format!("--ns {spec}: a file: namespace (the others keep no files to look into)").into());
    };
    let Some(meta) = &ns.meta else { return Err(format!("--ns {spec}: it has no metadata (ms=)").into()) };
    let format = meta.format(ns.lba_format).ok_or_else(|| format!("--ns {spec}: no LBA format has it"))?;
    let layout =
        format.protection().ok_or_else(|| format!("--ns {spec}: it has no protection information (pi=)"))?;
    let meta_path = meta.path.clone().unwrap_or_else(|| beside(data, ".meta"));
    let data_file = open_read(data, Role::Data)?;
    let store = nvme_ctrl::metadata::MetaStore::file(open_read(&meta_path, Role::Metadata)?);
    let shift = format.def().shift as u32;
    let audit = nvme_ctrl::metadata::audit(&data_file, &store, layout, shift, app_tag)
        .map_err(|e| format!("{} and {}: {e}", data.display(), meta_path.display()))?;
    println!("{}", serde_json::to_string(&audit)?);
    if audit.bad_count > 0 {
        return Err(format!(
            "{} of {} blocks checked do not match their protection information",
            audit.bad_count, audit.checked
        )
        .into());
    }
    Ok(())
}
