//! How `vnvme perf` ends before its runtime: on Ctrl-C (SIGINT) with the results
//! measured so far, printed and written, marked as interrupted, exit 130; and at
//! once, saying why, when the controller reports Controller Fatal Status (a server
//! under --restart-on-crash killed under it: its stand-in reports it), not after the
//! 60 s command timeout.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::Server;

/// `vnvme perf` on `socket` for a long runtime, its output in `dir`.
fn perf(socket: &Path, dir: &Path, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_vnvme"))
        .args(["perf", "--socket"])
        .arg(socket)
        .args(["--rw", "randrw", "--bs", "4k", "--qd", "4", "--runtime", "120s"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("perf.out")).unwrap())
        .stderr(std::fs::File::create(dir.join("perf.err")).unwrap())
        .spawn()
        .expect("spawn vnvme perf")
}

/// Waits for `child` (bounded by `limit`: a hang fails the test); its exit status
/// and how long it took from `since`.
fn exit_within(child: &mut Child, limit: Duration, since: Instant, dir: &Path) -> (Option<i32>, Duration) {
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return (st.code(), since.elapsed());
        }
        if since.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("vnvme perf still running {limit:?} later:\n{}", read(dir, "perf.err"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_default()
}

/// Waits until the server has counted some I/O (the load is running).
fn load_running(s: &Server) {
    s.stats_after(100);
}

fn signal(pid: u32, sig: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(pid as i32).expect("a pid");
    // A process gone already (ESRCH) is what a kill wanted.
    let _ = rustix::process::kill_process(pid, sig);
}

#[test]
fn ctrl_c_prints_and_writes_the_results_so_far_and_exits_130() {
    let s = Server::start();
    let json = s.dir.join("perf.json");
    let mut p = perf(&s.socket, &s.dir, &["--json", json.to_str().unwrap()]);
    load_running(&s);
    let t0 = Instant::now();
    signal(p.id(), rustix::process::Signal::INT);
    let (code, took) = exit_within(&mut p, Duration::from_secs(10), t0, &s.dir);
    let (out, err) = (read(&s.dir, "perf.out"), read(&s.dir, "perf.err"));
    assert_eq!(code, Some(130), "{out}\n{err}");
    assert!(took < Duration::from_secs(3), "stopping took {took:?}");
    assert!(out.contains("INTERRUPTED by SIGINT after"), "{out}");
    assert!(out.contains("IOPS") && !out.contains("(0 I/Os"), "{out}");
    assert!(
        err.contains("stopped by SIGINT") && err.contains("the results are for the time it ran"),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["results"]["interrupted_by"], "SIGINT");
    assert!(v["results"]["ios"].as_u64().unwrap() > 0, "{v}");
    assert!(v["results"]["elapsed_s"].as_f64().unwrap() < 60.0, "{v}");
}

/// The serving process under a keeper, SIGKILLed while perf runs: its stand-in
/// reports Controller Fatal Status and completes none of perf's commands.
#[test]
fn perf_stops_at_once_on_controller_fatal_status() {
    let s = Server::start_with(&["--restart-on-crash"]);
    let _children = KeeperChildren(s.pid());
    let mut p = perf(&s.socket, &s.dir, &[]);
    load_running(&s);
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", s.pid())).unwrap();
    let serving: u32 = children.split_whitespace().next().expect("a serving process").parse().unwrap();
    let t0 = Instant::now();
    signal(serving, rustix::process::Signal::KILL);
    // The command timeout is 60 s: well within it, and with the stand-in's start.
    let (code, took) = exit_within(&mut p, Duration::from_secs(20), t0, &s.dir);
    let (out, err) = (read(&s.dir, "perf.out"), read(&s.dir, "perf.err"));
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(err.contains("Controller Fatal Status"), "{err}");
    assert!(out.contains("IOPS"), "the results so far are printed:\n{out}");
    assert!(took < Duration::from_secs(10), "perf took {took:?} to stop:\n{err}\n{}", s.log());
}

/// Kills a keeper, then its children (its stand-in), when dropped: the keeper
/// first, so that it starts no other.
struct KeeperChildren(u32);

impl Drop for KeeperChildren {
    fn drop(&mut self) {
        let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.0));
        signal(self.0, rustix::process::Signal::KILL);
        for pid in children.unwrap_or_default().split_whitespace().filter_map(|p| p.parse().ok()) {
            signal(pid, rustix::process::Signal::KILL);
        }
    }
}
