//! What only the bench knows about a run: the source and toolchain it was built from and
//! when and how it ran. The machine it ran on (CPU, cores, kernel) is described by the
//! report, scripts/bench-doorbells.py, through scripts/lib/vnvme_report.py like every
//! other benchmark's.

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct Facts {
    pub crate_version: &'static str,
    /// `git rev-parse --short HEAD`, or "unknown".
    pub git_commit: String,
    /// `rustc --version` of the toolchain cargo runs under (the one that built us).
    pub rustc: String,
    pub profile: String,
    pub date_utc: String,
    /// The run's folder name: the UTC start time without ':' characters.
    pub run_id: String,
    pub command_line: Vec<String>,
}

impl Facts {
    pub fn detect() -> Facts {
        let (date_utc, run_id) = utc_now();
        Facts {
            crate_version: env!("CARGO_PKG_VERSION"),
            git_commit: output("git", &["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "--short", "HEAD"])
                .unwrap_or_else(|| "unknown".into()),
            rustc: output(&std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()), &["--version"])
                .unwrap_or_else(|| "unknown".into()),
            profile: profile(),
            date_utc,
            run_id,
            // The program by its file name only: no machine paths in the results.
            command_line: std::env::args()
                .enumerate()
                .map(|(i, a)| if i == 0 { a.rsplit('/').next().unwrap_or(&a).to_string() } else { a })
                .collect(),
        }
    }
}

/// The first line a command prints, if it runs and succeeds.
fn output(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?;
    let line = s.lines().next()?.trim();
    (out.status.success() && !line.is_empty()).then(|| line.to_string())
}

/// Cargo does not tell a bench its profile; what the binary was built with does.
fn profile() -> String {
    let dir = std::env::current_exe()
        .ok()
        .and_then(|p| Some(p.parent()?.parent()?.file_name()?.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "?".into());
    let kind = if cfg!(debug_assertions) {
        "debug assertions ON (not optimized like `cargo bench`)"
    } else {
        "optimized, debug assertions off"
    };
    format!("{kind}; binary in target/{dir}/ (`cargo bench` uses the bench profile)")
}

/// The current time as "2025-11-21 05:50:00 UTC" and "2025-11-21T05-50-00Z".
fn utc_now() -> (String, String) {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let (h, mi, s) = (rem / 3600, rem / 60 % 60, rem % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's days_from_civil inverse).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        format!("{y:04}-{m:02}-{d:02} {h:02}:{mi:02}:{s:02} UTC"),
        format!("{y:04}-{m:02}-{d:02}T{h:02}-{mi:02}-{s:02}Z"),
    )
}
