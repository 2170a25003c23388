//! A test that cannot check what it is about on this machine (no NBD servers, no
//! Ceph, no /dev/vfio, no loop device) says so: [`skip`] writes `SKIP: reason` to
//! stderr (the stream itself, which the test harness does not capture) and one line
//! `binary::test<TAB>reason` to `$VNVME_SKIP_LOG`. scripts/test.sh counts each
//! test named there once, as skipped and not as passed (it returned early, so the
//! harness saw it pass).

use std::io::Write;

/// Reports that the calling test skips, and why. Call it once per test that
/// returns early; a test that skips for several reasons is still counted once.
pub fn skip(reason: &str) {
    let _ = writeln!(std::io::stderr(), "SKIP: {reason}");
    let Ok(path) = std::env::var("VNVME_SKIP_LOG") else { return };
    // The harness names each test's thread after the test; the binary tells two
    // tests of one name in different files apart.
    let bin = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let bin = bin.rsplit_once('-').map_or(bin.as_str(), |(name, _hash)| name).to_string();
    let test = std::thread::current().name().unwrap_or("main").to_string();
    let line = format!("{bin}::{test}\t{}\n", reason.replace(['\n', '\t'], " "));
    let f = std::fs::OpenOptions::new().create(true).append(true).open(&path);
    if let Err(e) = f.and_then(|mut f| f.write_all(line.as_bytes())) {
        let _ = writeln!(std::io::stderr(), "could not record the skip in {path}: {e}");
    }
}
