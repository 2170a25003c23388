//! State files fail safe (issue 49), across processes: a reservation state file
//! (`resv=`) or a pool's `pool.state` is made only where none exists; one that is
//! empty, cut short or foreign is refused at start, never taken for a new one; a
//! pool directory with data files and no state is refused. Truncated, emptied or
//! replaced under running servers, the file is caught: each server says so, the
//! commands that depend on it fail (Internal Error), and the server still answers
//! its client, its control socket and SIGTERM.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{opts, Server};
use nvme_driver::{CompletionMode, DoorbellMode};

const VNVME: &str = env!("CARGO_BIN_EXE_vnvme");

/// `vnvme serve ARGS` in `dir`: refused (exit 1), the message saying `needles`.
fn refused(dir: &Path, args: &[&str], needles: &[&str]) {
    let out = common::output_within(
        Command::new(VNVME).current_dir(dir).args(["serve", "--socket", "r.sock"]).args(args),
        common::TIMEOUT,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: the message does not say {n:?}:\n{err}");
    }
    assert!(!dir.join("r.sock").exists(), "a refused start leaves no socket");
}

fn ctl(control: &Path, args: &[&str]) -> Result<serde_json::Value, String> {
    let out = Command::new(VNVME)
        .arg("ctl")
        .arg("--control")
        .arg(control)
        .arg("--json")
        .args(args)
        .output()
        .unwrap();
    if out.status.success() {
        Ok(serde_json::from_slice(&out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn wait_for(what: &str, s: &Server, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + common::TIMEOUT;
    while !done() {
        assert!(Instant::now() < deadline, "{what}:\n{}", s.log());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Stops `s` with SIGTERM, which it must still obey: exit 0.
fn stops(mut s: Server) {
    s.signal(libc::SIGTERM);
    let st = s.wait_exit().unwrap_or_else(|| panic!("SIGTERM did not stop it\n{}", s.log()));
    assert!(st.success(), "{st}\n{}", s.log());
}

#[test]
fn a_reservation_state_file_is_made_on_purpose_and_caught_when_it_goes() {
    for damage in ["empty", "cut", "replace"] {
        let dir = common::temp_dir(&format!("state-resv-{damage}"));
        let resv = dir.join("r.resv");
        let ns = format!("ram:16M:resv={}", resv.display());
        let args = |cntlid: &'static str, control: &Path| {
            vec![
                "--ns".to_string(),
                ns.clone(),
                "--cntlid".into(),
                cntlid.into(),
                "--control".into(),
                control.display().to_string(),
            ]
        };
        let (c1, c2) = (dir.join("c1.ctl"), dir.join("c2.ctl"));
        let a1 = args("1", &c1);
        let s1 = Server::start_in(&dir, "s1", &a1.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(
            s1.log().contains("reservation state file") && s1.log().contains("made (new"),
            "{}",
            s1.log()
        );
        let a2 = args("2", &c2);
        let s2 = Server::start_in(&dir, "s2", &a2.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(
            !s2.log().contains("made (new"),
            "the second controller opens the first one's:\n{}",
            s2.log()
        );
        let mut d2 = s2.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Polling));
        d2.write(1, 0, &[5u8; 4096]).unwrap();
        match damage {
            "empty" => std::fs::File::create(&resv).map(drop).unwrap(),
            // Below the state, the change counter's page left.
            "cut" => std::fs::OpenOptions::new().write(true).open(&resv).unwrap().set_len(100).unwrap(),
            _ => {
                std::fs::write(dir.join("other"), vec![0u8; 8192]).unwrap();
                std::fs::rename(dir.join("other"), &resv).unwrap();
            }
        }
        // A command that depends on it: refused as Internal Error once the server
        // sees the file gone (at once when its counter's page went; at its next
        // look, within a second, when it was cut below its state or replaced).
        let s1_log = |s: &Server| s.log().contains("what depends on it fails");
        wait_for("the server did not see its state file go", &s2, || {
            let failed = d2.write(1, 0, &[6u8; 4096]).is_err();
            failed && s1_log(&s2)
        });
        let mut d1 = s1.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Polling));
        wait_for("the other controller did not see it go", &s1, || {
            d1.read(1, 0, &mut [0u8; 4096]).is_err() && s1_log(&s1)
        });
        // Both still answer their control socket, and stop on SIGTERM.
        for c in [&c1, &c2] {
            ctl(c, &["ctrl.info"]).unwrap_or_else(|e| panic!("{damage}: {e}\n{}\n{}", s1.log(), s2.log()));
        }
        drop((d1, d2));
        stops(s1);
        stops(s2);
        // Started again on what is left: refused, not made new (a replaced file is
        // whatever was put there: here, not a state file).
        let needle = match damage {
            "empty" => "it is empty",
            "cut" => "100 bytes, cut short",
            _ => "not a reservation state file",
        };
        refused(&dir, &["--ns", &ns, "--cntlid", "1"], &[&resv.display().to_string(), needle]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_pool_state_file_is_made_on_purpose_and_caught_when_it_goes() {
    let dir = common::temp_dir("state-pool");
    let pool = dir.join("pool");
    let spec = format!("{}:64M", pool.display());
    let control = dir.join("c.ctl");
    let s = Server::start_in(
        &dir,
        "s",
        &["--ns", "ram:4M", "--cntlid", "1", "--pool", &spec, "--control", control.to_str().unwrap()],
    );
    ctl(&control, &["ns.create", "8M"]).unwrap_or_else(|e| panic!("{e}\n{}", s.log()));
    // Truncated under the running server: it says so, refuses pool changes, and
    // serves on.
    std::fs::OpenOptions::new().write(true).open(pool.join("pool.state")).unwrap().set_len(0).unwrap();
    wait_for("ns.create after the truncation still worked", &s, || {
        ctl(&control, &["ns.create", "8M"]).is_err()
    });
    wait_for("the server did not say", &s, || s.log().contains("what depends on it fails"));
    ctl(&control, &["ctrl.info"]).unwrap();
    stops(s);
    // Emptied: refused at start, the namespace's data file left where it is.
    refused(&dir, &["--ns", "ram:4M", "--cntlid", "1", "--pool", &spec], &["pool.state", "it is empty"]);
    // Gone, with the namespace's data file still there: its state is lost.
    std::fs::remove_file(pool.join("pool.state")).unwrap();
    refused(
        &dir,
        &["--ns", "ram:4M", "--cntlid", "1", "--pool", &spec],
        &["no pool.state", "the pool's state is lost"],
    );
    let data: Vec<_> = std::fs::read_dir(&pool).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(data.len(), 1, "the data file is kept: {data:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_zone_state_file_is_made_on_purpose_and_refused_when_emptied_or_cut() {
    let dir = common::temp_dir("state-zones");
    let img = dir.join("z.img");
    let zones = dir.join("z.img.zones");
    let spec = format!("file:{}:4M:zoned=1M", img.display());
    let s = Server::start_in(&dir, "s", &["--ns", &spec]);
    assert!(s.log().contains("none was there; made a new one"), "{}", s.log());
    let mut d = s.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Polling));
    d.write(1, 0, &[7u8; 4096]).unwrap();
    drop(d);
    stops(s);
    let kept = std::fs::read(&zones).unwrap();
    let image = std::fs::read(&img).unwrap();
    // Cut short, then emptied: refused, neither file touched.
    for (len, says) in [(kept.len() as u64 - 8, "cut short"), (0, "it is empty, not a new one")] {
        std::fs::OpenOptions::new().write(true).open(&zones).unwrap().set_len(len).unwrap();
        refused(&dir, &["--ns", &spec], &["zone state", says]);
        assert_eq!(std::fs::metadata(&zones).unwrap().len(), len, "{says}: the state file was changed");
        assert_eq!(std::fs::read(&img).unwrap(), image, "{says}: the image was changed");
    }
    // Put back as it was: served, the zone written where it was.
    std::fs::write(&zones, &kept).unwrap();
    let s = Server::start_in(&dir, "s2", &["--ns", &spec]);
    assert!(!s.log().contains("made a new one"), "{}", s.log());
    stops(s);
    let _ = std::fs::remove_dir_all(&dir);
}
