//! Names the commit a binary was built from (`vnvme --version`, the `vnvme_info`
//! metric, the control socket's facts, the server's first log line), so an operator
//! can tell which build a running server is, before and after an upgrade.
//!
//! VNVME_COMMIT in the environment wins (a build from a source archive); otherwise
//! git is asked, and a tree with uncommitted changes is marked "-modified". Without
//! either the commit is "unknown".
use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=VNVME_COMMIT");
    let commit = match std::env::var("VNVME_COMMIT") {
        Ok(c) if !c.is_empty() => c,
        _ => from_git().unwrap_or_else(|| "unknown".into()),
    };
    println!("cargo:rustc-env=VNVME_COMMIT={commit}");
}

fn from_git() -> Option<String> {
    let id = git(&["rev-parse", "--short=12", "HEAD"])?;
    // Rebuild when HEAD moves: HEAD itself (a checkout), the branch it names (a
    // commit) and packed refs; the index, for the modified mark.
    // Only paths that exist: cargo counts a missing one as changed, every build.
    let watch = |p: PathBuf| {
        if p.exists() {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    };
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]).map(PathBuf::from) {
        for f in ["HEAD", "packed-refs", "index"] {
            watch(dir.join(f));
        }
        if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watch(dir.join(r));
        }
    }
    // And when any source changes, so the mark follows edits made after a commit.
    let top = git(&["rev-parse", "--show-toplevel"]).map(PathBuf::from)?;
    for f in ["crates", "Cargo.toml", "Cargo.lock"] {
        watch(top.join(f));
    }
    let modified = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(if modified { format!("{id}-modified") } else { id })
}
