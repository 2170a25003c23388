//! SPDK's own tools against `vnvme serve --doorbells mapped` and nothing else
//! (issue 50): its vfio-user compliance test passes every case, and
//! `spdk_nvme_identify` and `spdk_nvme_perf` attach and run, with SPDK's memory
//! (a memfd without seals) served as any client's is.
//!
//! SPDK cannot be fetched by the project's own scripts (it is built from a source
//! snapshot: scripts/build-spdk-peer.sh), so this runs where `VNVME_SPDK` names a
//! built SPDK tree, and skips, saying so, elsewhere. `VNVME_SPDK_ARGS` adds the
//! tools' environment options (default `--no-huge -s 1024`; the compliance test
//! takes the build script's `--no-huge --mem-size 1024 --no-pci`).

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::Server;

/// The SPDK tree, or a skip.
fn spdk() -> Option<PathBuf> {
    match std::env::var_os("VNVME_SPDK").map(PathBuf::from) {
        Some(p) if p.join("build/bin/spdk_nvme_perf").exists() => Some(p),
        Some(p) => {
            test_util::skip(&format!("VNVME_SPDK={}: no build/bin/spdk_nvme_perf there", p.display()));
            None
        }
        None => {
            test_util::skip(
                "VNVME_SPDK is not set: no SPDK build to run SPDK's tools (scripts/build-spdk-peer.sh)",
            );
            None
        }
    }
}

fn run(cmd: &mut Command) -> String {
    let out = common::output_within(cmd, common::TIMEOUT * 3);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?}: {}\n{text}", out.status);
    text
}

#[test]
fn spdk_tools_attach_and_its_compliance_test_passes() {
    let Some(spdk) = spdk() else { return };
    let dir = common::temp_dir("spdk");
    let server = Server::start_in(&dir, "s", &["--ns", "ram:64M", "--doorbells", "mapped"]);
    // SPDK's client finds the socket as `cntrl` in the directory it is given.
    let at = dir.join("spdk");
    std::fs::create_dir(&at).unwrap();
    std::os::unix::fs::symlink(&server.socket, at.join("cntrl")).unwrap();
    let trid = format!("trtype:VFIOUSER traddr:{} subnqn:nqn.2024-01.io.vnvme:VNVME0001", at.display());
    let env_args = std::env::var("VNVME_SPDK_ARGS").unwrap_or_else(|_| "--no-huge -s 1024".into());
    let env_args: Vec<&str> = env_args.split_whitespace().collect();

    let compliance = run(Command::new(spdk.join("test/nvme/compliance/nvme_compliance")).args([
        "--no-huge",
        "--mem-size",
        "1024",
        "--no-pci",
        "-r",
        &trid,
    ]));
    let summary = compliance.lines().find(|l| l.trim_start().starts_with("tests")).unwrap_or_default();
    let n: Vec<u32> = summary.split_whitespace().skip(1).filter_map(|w| w.parse().ok()).collect();
    assert!(
        n.len() >= 4 && n[0] == n[2] && n[3] == 0,
        "compliance: {summary}\n{compliance}\n{}",
        server.log()
    );

    let id = run(Command::new(spdk.join("build/bin/spdk_nvme_identify")).args(&env_args).args(["-r", &trid]));
    assert!(id.contains("Serial Number:                         VNVME0001"), "{id}");
    let perf = run(Command::new(spdk.join("build/bin/spdk_nvme_perf"))
        .args(&env_args)
        .args(["-q", "16", "-o", "4096", "-w", "randread", "-t", "2", "-r", &trid]));
    assert!(perf.lines().any(|l| l.starts_with("Total")), "{perf}");
    eprintln!(
        "{summary}\n{}",
        perf.lines().filter(|l| l.starts_with("Total")).collect::<Vec<_>>().join("\n")
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
