//! Bad input through the command line, as an operator types it: each case must fail
//! at once with the exit status clap or vnvme gives (2: the arguments; 1: what they
//! name), a message that names the bad value and says what to do, and nothing
//! created, changed or deleted in the directory it ran in.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const VNVME: &str = env!("CARGO_BIN_EXE_vnvme");

/// Runs `vnvme ARGS` in `dir`, bounded: (exit status, stderr). A command still
/// running after the bound (it started serving instead of refusing) is killed and
/// fails the test.
fn run_in(dir: &Path, args: &[&str]) -> (i32, String) {
    let mut child = Command::new(VNVME)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run vnvme");
    let deadline = Instant::now() + common::TIMEOUT;
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("vnvme {args:?} did not refuse: it was still running after {:?}", common::TIMEOUT);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().expect("output");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The directory's entries, each file's bytes with it.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let bytes = if p.is_file() { std::fs::read(&p).unwrap() } else { Vec::new() };
            (p.file_name().unwrap().to_string_lossy().into_owned(), bytes)
        })
        .collect();
    v.sort();
    v
}

#[test]
fn every_bad_input_names_the_value_and_the_fix_and_changes_nothing() {
    let dir = common::temp_dir("cli-errors");
    let keep = test_util::pattern(11, 8 << 20);
    std::fs::write(dir.join("keep.img"), &keep).unwrap();
    // A reservation state file an operator emptied: refused, never made anew.
    std::fs::write(dir.join("empty.resv"), b"").unwrap();
    // A socket something listens on and never answers (a stopped server, or not
    // a control socket at all).
    let _quiet = std::os::unix::net::UnixListener::bind(dir.join("quiet.sock")).unwrap();
    // A file on tmpfs, which has no O_DIRECT to give.
    let shm = format!("/dev/shm/vnvme-cli-errors-{}.img", std::process::id());
    let shm_direct = format!("file:{shm}:16M:direct=on");
    let before = snapshot(&dir);
    // (arguments, exit status, what the message must contain)
    let cases: &[(&[&str], i32, &[&str])] = &[
        (&["serve", "--socket", "s.sock", "--queues", "0"], 2, &["'0'", "--queues", "1..=511"]),
        // `vnvme inspect` reads only: a file that is not one is refused, never made.
        (&["inspect", "zones", "keep.img"], 1, &["keep.img", "not one (no \"VNVMEZNS\""]),
        (&["inspect", "zones", "empty.resv"], 1, &["empty.resv", "it is empty"]),
        (&["inspect", "pi", "--ns", "ram:64M:ms=8:pi=1"], 1, &["a file: namespace"]),
        (&["inspect", "pi", "--ns", "file:keep.img:8M"], 1, &["it has no metadata (ms=)"]),
        (&["inspect", "pi", "--ns", "file:keep.img:8M:ms=8"], 1, &["no protection information (pi=)"]),
        (&["inspect", "pi", "--ns", "file:keep.img:8M:ms=8:pi=1"], 1, &["keep.img.meta", "No such file"]),
        (
            &["inspect", "pi", "--ns", "file:keep.img:8M:ms=8:pi=1", "--app-tag", "0x10000"],
            2,
            &["0 to 65535"],
        ),
        (&["serve", "--socket", "s.sock", "--workers", "65"], 2, &["'65'", "--workers", "0..=64"]),
        (
            &["serve", "--socket", "s.sock", "--serial", "a-serial-far-too-long-for-nvme"],
            2,
            &["1 to 20 printable ASCII"],
        ),
        (&["serve", "--socket", "s.sock", "--client-deadline", "0"], 2, &["--client-deadline", "positive"]),
        (&["serve", "--socket", "s.sock", "--max-namespaces", "0"], 2, &["--max-namespaces", "1..=1024"]),
        (
            &["serve", "--socket", "s.sock", "--poll", "sometimes"],
            2,
            &["sometimes", "off, adaptive or always"],
        ),
        (&["serve", "--socket", "s.sock", "--ns", "disk:1G"], 2, &["\"disk\"", "expected ram, null, file"]),
        (&["serve", "--socket", "s.sock", "--ns", "ram:12Q"], 2, &["'Q'", "K, M, G or T"]),
        (&["serve", "--socket", "s.sock", "--ns", "ram"], 2, &["missing size", "ram:64M"]),
        (&["serve", "--socket", "s.sock", "--ns", "ram:1M:hold=5s"], 2, &["hold=", "only nbd:// and rbd:"]),
        (
            &["serve", "--socket", "s.sock", "--ns", "nbd://192.0.2.7/disk:hold=30s"],
            2,
            &["hold=30s", "not shorter than timeout=30s"],
        ),
        (&["serve", "--socket", "s.sock", "--metrics", "10.0.0.1:9464"], 2, &["10.0.0.1:9464", "loopback"]),
        (&["serve", "--socket", "s.sock", "--ns", "ram:100T"], 1, &["ram:100T", "100 TiB", "smaller size"]),
        (
            &["serve", "--socket", "s.sock", "--ns", "file:keep.img:16M"],
            1,
            &["keep.img is 8388608 bytes, not 16777216", "leave the size out"],
        ),
        (
            &["serve", "--socket", "s.sock", "--doorbells", "eventfd", "--no-shadow-doorbells"],
            1,
            &["--doorbells eventfd needs shadow doorbells", "leave out --no-shadow-doorbells"],
        ),
        (&["serve", "--socket", "keep.img"], 1, &["keep.img exists and is not a socket", "another path"]),
        (&["serve", "--socket", "no/such/dir/s.sock"], 1, &["no/such/dir", "create it first"]),
        (
            &["serve", "--socket", "s.sock", "--control", "keep.img"],
            1,
            &["--control", "keep.img exists and is not a socket"],
        ),
        (
            &["serve", "--socket", "s.sock", "--control", "./s.sock"],
            1,
            &["--socket and --control are the same path", "each needs its own"],
        ),
        (
            &["serve", "--socket", "s.sock", "--ns", "ram:1M", "--stats-file", "keep.img"],
            1,
            &["--stats-file keep.img", "not a stats file of vnvme's (8 MiB", "Give a new path"],
        ),
        (
            &["serve", "--socket", "s.sock", "--stats-file", "no/such/dir/s.json"],
            1,
            &["--stats-file no/such/dir/s.json", "no/such", "create it first"],
        ),
        (
            &["serve", "--socket", "s.sock", "--ns", "file:keep.img", "--ns", "file:./keep.img"],
            1,
            &["keep.img is in use by a writer: this process (namespace 1's data)", "One writer per file"],
        ),
        (
            &["serve", "--socket", "s.sock", "--ns", "ram:1M:resv=empty.resv", "--cntlid", "1"],
            1,
            &["reservation state file empty.resv", "it is empty", "Restore it from a copy"],
        ),
        (
            &["serve", "--socket", "s.sock", "--ns", "file:keep.img:16M:readonly=on"],
            2,
            &["readonly=on serves a file as it is", "leave the size out"],
        ),
        (
            &["serve", "--socket", "s.sock", "--ns", "file:keep.img:readonly=yes"],
            2,
            &["readonly=yes", "on or off"],
        ),
        (&["perf", "--socket", "s.sock", "--nsid", "0"], 2, &["'0'", "--nsid"]),
        (
            &["perf", "--socket", "missing.sock", "--json", "keep.img"],
            1,
            &["--json keep.img", "not a vnvme perf results file (8 MiB", "Give a new path"],
        ),
        (
            &["perf", "--socket", "missing.sock", "--json", "no/such/r.json"],
            1,
            &["--json no/such/r.json", "create it first"],
        ),
        (&["identify", "--socket", "missing.sock"], 1, &["missing.sock"]),
        (&["ctl", "--control", "missing.sock", "ctrl.info"], 1, &["missing.sock"]),
        (
            &["serve", "--socket", "s.sock", "--ns", "ram:100M:zoned=64M"],
            2,
            &["ram:100M:zoned=64M", "100 MiB is not a whole number of 64 MiB zones", "128M", "smaller zone"],
        ),
        (
            &["serve", "--socket", "s.sock", "--ns", &shm_direct],
            1,
            &[&shm, "direct=on", "tmpfs", "Leave out direct=on", "disk's file system"],
        ),
        (
            &["serve", "--socket", "s.sock", "--ns", "file:keep.img:direct=on:engine=sync"],
            2,
            &["direct=on", "engine=sync", "engine=uring", "leave out direct=on"],
        ),
        (
            &["ctl", "--timeout", "1s", "--control", "quiet.sock", "ctrl.info"],
            1,
            &["quiet.sock: no answer in 1 s", "SIGSTOP", "not a vnvme control socket"],
        ),
        (
            &["ctl", "--control", "quiet.sock", "qos.set", "group=", "iops=100"],
            1,
            &["group \"\"", "needs a name", "group=tenant-a"],
        ),
    ];
    for (args, code, needles) in cases {
        let (got, err) = run_in(&dir, args);
        assert_eq!(got, *code, "vnvme {args:?}: exit status {got}, wanted {code}:\n{err}");
        for n in *needles {
            assert!(err.contains(n), "vnvme {args:?}: the message does not say {n:?}:\n{err}");
        }
        assert!(!err.contains(" { ") && !err.contains("Os {"), "vnvme {args:?}: Rust debug output:\n{err}");
        assert_eq!(snapshot(&dir), before, "vnvme {args:?} changed the directory");
        assert!(!Path::new(&shm).exists(), "vnvme {args:?} created {shm}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `vnvme serve --help` states the hold, the timeout and the retry delay as they
/// are (their behaviour is pinned by the nbd, rbd, nsspec and controller tests).
#[test]
fn serve_help_states_the_hold_timeout_and_retry_delay() {
    let out = Command::new(VNVME).args(["serve", "--help"]).output().expect("vnvme serve --help");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for needle in [
        "timeout=T",
        "(default 30s",
        "hold=T",
        "nbd:// and rbd: only",
        "(default 25s, or 5/6 of a shorter",
        "Advanced",
        "waits 1 s before",
        "Options follow the URI (:timeout=5s)",
    ] {
        assert!(help.contains(needle), "serve --help does not say {needle:?}:\n{help}");
    }
}
