//! An upgrade under a keeper survives a SIGKILL of either process at any step of
//! the hand-over (issue 49): whoever dies when, exactly one process serves the
//! device afterwards, on the VMM's connection, with the guest's data; or the old
//! process serves on. Each step is a named point where the process kills itself
//! (`VNVME_TEST_KILL_AT`, fault injection, not timing): in the old process (`old:`,
//! started with it in its environment) and in the new one (`new:`, which `vnvme
//! ctl upgrade` starts with its own), every point in turn, in a loop.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::nvme_host::NvmeOverVfioUser;
use common::{Server, TIMEOUT};
use nvme_spec::regs::{offset, Csts};

const VNVME: &str = env!("CARGO_BIN_EXE_vnvme");

/// Every step of the hand-over, in order.
const POINTS: [&str; 13] = [
    "old:prepared",
    "new:prepared",
    "new:opened",
    "old:handover-asked",
    "old:quiesced",
    "old:sent",
    "new:received",
    "new:built",
    "new:started",
    "old:ready",
    "old:handed",
    "old:go",
    "new:ready",
];

/// Rounds of every point.
const ROUNDS: usize = 2;

fn page(seed: u8) -> Vec<u8> {
    (0..4096u32).map(|i| (i as u8).wrapping_mul(29) ^ seed).collect()
}

/// The processes serving (or taking over) the device in `dir`, other than the
/// keeper: every live vnvme process whose command line names the directory.
fn servers_of(dir: &Path, keeper: u32) -> Vec<u32> {
    let needle = dir.display().to_string();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == keeper {
            continue;
        }
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let live = stat.rsplit_once(')').is_some_and(|(_, r)| !r.trim_start().starts_with(['Z', 'X']));
        if live && cmd.contains(&needle) && (cmd.contains(" serve ") || cmd.contains(" takeover ")) {
            out.push(pid);
        }
    }
    out
}

/// `ctrl.info`'s pid, if the control socket answers.
fn answering(control: &Path) -> Option<u32> {
    let out = Command::new(VNVME)
        .args(["ctl", "--json", "--timeout", "2s", "--control"])
        .arg(control)
        .arg("ctrl.info")
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    v["pid"].as_u64().map(|p| p as u32)
}

/// Kills every process serving or taking over in its directory when dropped
/// (the test's end, or its failure: a failed point leaves nothing running).
struct Reaper(std::path::PathBuf);

impl Drop for Reaper {
    fn drop(&mut self) {
        for pid in servers_of(&self.0, 0) {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
        }
    }
}

fn one_kill(point: &str, round: usize) {
    let dir = common::temp_dir(&format!("upgrade-kill-{}", point.replace(':', "-")));
    let _reaper = Reaper(dir.clone());
    let control = dir.join("c.sock");
    let img = format!("file:{}:16M", dir.join("d.img").display());
    let old_env: Vec<(String, String)> = point
        .starts_with("old:")
        .then(|| ("VNVME_TEST_KILL_AT".to_string(), point.to_string()))
        .into_iter()
        .collect();
    let mut s = Server::start_in_env(
        &dir,
        "s",
        &["--ns", &img, "--restart-on-crash", "--control", control.to_str().unwrap()],
        &old_env,
    )
    .owning_dir();
    let keeper = s.pid();
    let deadline = Instant::now() + TIMEOUT;
    while answering(&control).is_none() {
        assert!(Instant::now() < deadline, "{point}: no control socket\n{}", s.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let old = answering(&control).unwrap();
    let mut h = NvmeOverVfioUser::new(s.client());
    h.bring_up(8, false);
    let a = page(round as u8);
    h.write_page(16, &a);

    let mut up = Command::new(VNVME);
    up.args(["ctl", "--json", "--control"]).arg(&control).arg("upgrade");
    if point.starts_with("new:") {
        up.env("VNVME_TEST_KILL_AT", point);
    }
    let out = common::output_within(&mut up, TIMEOUT * 3);
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));

    // Settled: one process serves, the one the control socket answers from.
    let deadline = Instant::now() + TIMEOUT * 2;
    let serving = loop {
        let live = servers_of(&dir, keeper);
        if let Some(p) = answering(&control) {
            if live == [p] {
                break p;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{point} (round {round}): not exactly one process serving: {live:?} (old {old})\nupgrade: {said}\n{}",
            s.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // (The new process writes to the upgrade command's stderr until it serves.)
    let killed = format!("killed at {point}");
    assert!(
        s.log().contains(&killed) || said.contains(&killed),
        "{point}: the kill was not reached\nupgrade: {said}\n{}",
        s.log()
    );
    assert!(!s.child_exited(), "{point}: the keeper ended\n{}", s.log());
    // What `vnvme ctl upgrade` said is what happened.
    if !out.status.success() {
        let truth = if serving == old {
            format!("the running server (pid {old}) serves on")
        } else {
            format!("pid {serving} serves the device now")
        };
        assert!(said.contains(&truth), "{point}: the upgrade said {said:?}, not {truth:?}\n{}", s.log());
    }
    // The VMM's connection is alive: answered by whoever serves; a stand-in says
    // it is not the controller the host enabled, and the host brings it up again.
    let csts = h.read32(offset::CSTS);
    if csts & Csts::CFS != 0 || csts & Csts::RDY == 0 {
        h.bring_up(8, false);
    }
    assert_eq!(h.read_page(16), a, "{point}: a page written before the upgrade\n{}", s.log());
    let b = page(round as u8 ^ 0x55);
    h.write_page(24, &b);
    assert_eq!(h.read_page(24), b, "{point}: a page written after");
    eprintln!("{point} (round {round}): pid {serving} serves (old {old}); upgrade said: {}", said.trim());
    drop(h);
    let _ = Command::new("kill").arg("-9").arg(keeper.to_string()).status();
    let _ = Command::new("kill").arg("-9").arg(serving.to_string()).status();
    s.kill_hard();
}

#[test]
fn a_sigkill_at_any_step_of_an_upgrade_leaves_one_process_serving() {
    if !common::fault_injection() {
        return;
    }
    for round in 0..ROUNDS {
        for point in POINTS {
            one_kill(point, round);
        }
    }
}
