//! `vnvme serve` as an operator meets it, across processes: its socket never costs
//! the operator a file, a second server is refused without ending a `--once` server,
//! and SIGTERM or SIGINT (`systemctl stop`, Ctrl-C) stop it cleanly under the
//! sandbox: the client's session ends as if it had disconnected, the summary line
//! and the stats file are written, its socket files are removed, and it exits 0.

mod common;

use std::process::Command;

use common::{opts, Server};
use nvme_driver::{CompletionMode, DoorbellMode};
use test_util::pattern;

const VNVME: &str = env!("CARGO_BIN_EXE_vnvme");

/// `vnvme serve ARGS` that must fail at once: its exit status and stderr (a server
/// that starts instead is killed after a while and fails the test).
fn serve_refused(args: &[&str]) -> (i32, String) {
    let out = common::output_within(
        Command::new(VNVME).arg("serve").args(args),
        std::time::Duration::from_secs(30),
    );
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// issue 32: `--socket` at an ordinary file refuses, naming it, and the file is left
/// as it was (it was deleted and replaced by the socket); a missing directory is
/// named with the fix.
#[test]
fn a_socket_path_that_is_not_a_socket_is_refused_and_left_alone() {
    let dir = common::temp_dir("socket-path");
    let file = dir.join("disk.img");
    let data = pattern(42, 4096);
    std::fs::write(&file, &data).unwrap();
    for opt in ["--socket", "--control"] {
        let mut args = vec!["--ns", "ram:16M"];
        let sock = dir.join("s.sock");
        if opt == "--control" {
            args.extend(["--socket", sock.to_str().unwrap()]);
        }
        args.extend([opt, file.to_str().unwrap()]);
        let (code, err) = serve_refused(&args);
        assert_eq!(code, 1, "{opt}: {err}");
        assert!(err.contains("disk.img exists and is not a socket"), "{opt}: {err}");
        assert_eq!(std::fs::read(&file).unwrap(), data, "{opt}: the file was changed");
        assert!(!sock.exists(), "{opt}: a refused start leaves no socket");
    }
    let missing = dir.join("no/such/dir/s.sock");
    let (code, err) = serve_refused(&["--ns", "ram:16M", "--socket", missing.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("no/such/dir") && err.contains("create it first"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// issue 32: a second server on a live socket is refused, and its check of the
/// socket does not count as the `--once` server's one client: that one still
/// serves the VMM that comes after, and then exits 0.
#[test]
fn a_second_server_is_refused_without_ending_a_once_server() {
    let mut first = Server::start_with(&["--ns", "ram:16M", "--once"]);
    let (code, err) = serve_refused(&["--ns", "ram:16M", "--socket", first.socket.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("is in use"), "{err}");
    // The one client: it is served, and the server ends after it.
    common::still_serving(&mut first);
    let st = first.wait_exit().expect("a --once server exits after its client");
    assert!(st.success(), "{st}");
    assert!(first.log().contains("not counted as a client"), "{}", first.log());
}

/// issue 32: SIGTERM and SIGINT stop the server cleanly under the sandbox, with a
/// client doing I/O: exit 0, the stop and the final summary logged, the stats file
/// written with every command the client completed, and every socket file removed.
#[test]
fn sigterm_and_sigint_stop_the_server_cleanly_under_the_sandbox() {
    for (sig, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGINT, "SIGINT")] {
        let dir = common::temp_dir("stop");
        let ctl = dir.join("c.sock");
        let metrics = dir.join("m.sock");
        let mut s = Server::start_in(
            &dir,
            "s",
            &[
                "--ns",
                "ram:32M",
                "--control",
                ctl.to_str().unwrap(),
                "--metrics",
                &format!("unix:{}", metrics.display()),
            ],
        )
        .owning_dir();
        assert!(s.log_shows("sandbox on"), "{}", s.log());
        let mut d = s.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Polling));
        let data = pattern(7, 4096);
        for lba in 0..64 {
            d.write(1, lba * 8, &data).unwrap();
        }
        s.signal(sig);
        let st = s.wait_exit().unwrap_or_else(|| panic!("{name}: the server did not stop\n{}", s.log()));
        assert!(st.success(), "{name}: {st}\n{}", s.log());
        let log = s.log();
        assert!(log.contains(&format!("stopped by {name}")), "{name}: {log}");
        assert!(log.contains("I/O commands"), "{name}: the summary line: {log}");
        let stats: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&s.stats).unwrap()).unwrap();
        assert!(stats["io_commands"].as_u64().unwrap() >= 64, "{name}: {stats}");
        for p in [&s.socket, &ctl, &metrics] {
            assert!(!p.exists(), "{name}: {} was left behind", p.display());
        }
        assert!(!log.contains("cannot remove"), "{name}: {log}");
        drop(d);
    }
}

/// issue 32: under `systemctl stop` the server has usually changed user (`--user`,
/// as the unit in contrib/systemd runs it): SIGTERM still stops it cleanly and
/// writes the stats file, its sockets in a directory that user may write are
/// removed, and one in a directory it may not (root's /run/vnvme) is named at start
/// as staying, with no error at the end. A stats file that user could not write
/// fails the start, naming the fix, instead of the end.
#[test]
fn a_server_that_changed_user_stops_cleanly_and_names_the_sockets_it_cannot_remove() {
    use std::os::unix::fs::PermissionsExt;
    if !nix::unistd::geteuid().is_root() {
        test_util::skip("--user needs the test to run as root");
        return;
    }
    let Ok(Some(nobody)) = nix::unistd::User::from_name("nobody") else {
        test_util::skip("no user named nobody on this machine");
        return;
    };
    // The server's own directory (socket, stats file) belongs to the user; the
    // control socket goes in one of root's.
    let dir = common::temp_dir("user-stop");
    std::os::unix::fs::chown(&dir, Some(nobody.uid.as_raw()), Some(nobody.gid.as_raw())).unwrap();
    let roots = common::temp_dir("user-stop-root");
    std::fs::set_permissions(&roots, std::fs::Permissions::from_mode(0o755)).unwrap();
    let ctl = roots.join("c.sock");
    let mut s = Server::start_in(
        &dir,
        "s",
        &["--ns", "ram:16M", "--user", "nobody", "--control", ctl.to_str().unwrap()],
    )
    .owning_dir();
    assert!(s.log_shows("sandbox on"), "{}", s.log());
    assert!(s.log().contains("running as nobody"), "{}", s.log());
    let stays = format!("{} stays when this server ends", ctl.display());
    assert!(s.log().contains(&stays), "the socket in root's directory is named at start:\n{}", s.log());
    assert!(!s.log().contains(&format!("{} stays", s.socket.display())), "{}", s.log());
    let mut d = s.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Polling));
    d.write(1, 0, &pattern(3, 4096)).unwrap();
    s.signal(libc::SIGTERM);
    let st = s.wait_exit().unwrap_or_else(|| panic!("the server did not stop\n{}", s.log()));
    assert!(st.success(), "{st}\n{}", s.log());
    let log = s.log();
    assert!(log.contains("stopped by SIGTERM") && log.contains("I/O commands"), "{log}");
    assert!(!log.contains("cannot remove"), "no error at the end: {log}");
    let stats: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&s.stats).unwrap()).unwrap();
    assert!(stats["io_commands"].as_u64().unwrap() >= 1, "the last stats write, as nobody: {stats}");
    assert!(!s.socket.exists(), "the socket in the user's directory was left behind");
    assert!(ctl.exists(), "the socket in root's directory stays, as the start-up line said");
    drop(d);

    // A stats file in root's directory: refused at start.
    let sock = dir.join("t.sock");
    let stats = roots.join("stats.json");
    let (code, err) = serve_refused(&[
        "--ns",
        "ram:16M",
        "--user",
        "nobody",
        "--socket",
        sock.to_str().unwrap(),
        "--stats-file",
        stats.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("as --user nobody") && err.contains("writable by that user"), "{err}");
    assert!(!sock.exists(), "a refused start leaves no socket");
    assert!(!stats.exists(), "a refused start leaves no stats file it made");
    let _ = std::fs::remove_dir_all(&roots);
}

/// Waits (bounded) until the server's log shows `needle`.
fn log_shows_within(s: &Server, needle: &str) {
    let deadline = std::time::Instant::now() + common::TIMEOUT;
    while !s.log().contains(needle) {
        assert!(std::time::Instant::now() < deadline, "the log never showed {needle:?}:\n{}", s.log());
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// issue 49: every other signal a host may send has its outcome, none of them a
/// lost disk. HUP (a closed terminal), USR2, ALRM, PROF, XFSZ and the terminal's
/// TSTP, TTIN and TTOU are said and ignored: the server serves on, its guest's
/// I/O untouched. USR1 reports the counters and writes the stats file now. QUIT
/// stops cleanly, as TERM does.
#[test]
fn every_signal_has_its_outcome_and_none_drops_the_disk() {
    let dir = common::temp_dir("signals");
    let ctl = dir.join("c.sock");
    let mut s =
        Server::start_in(&dir, "s", &["--ns", "ram:16M", "--control", ctl.to_str().unwrap()]).owning_dir();
    let mut d = s.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Polling));
    let data = pattern(9, 4096);
    d.write(1, 0, &data).unwrap();
    for (sig, name) in [
        (libc::SIGHUP, "SIGHUP"),
        (libc::SIGUSR2, "SIGUSR2"),
        (libc::SIGALRM, "SIGALRM"),
        (libc::SIGPROF, "SIGPROF"),
        (libc::SIGXFSZ, "SIGXFSZ"),
        (libc::SIGTSTP, "SIGTSTP"),
        (libc::SIGTTIN, "SIGTTIN"),
        (libc::SIGTTOU, "SIGTTOU"),
    ] {
        s.signal(sig);
        log_shows_within(&s, &format!("{name} ignored"));
        assert!(!s.child_exited(), "{name} ended the server:\n{}", s.log());
        let mut got = vec![0u8; 4096];
        d.read(1, 0, &mut got).unwrap_or_else(|e| panic!("after {name}: {e}\n{}", s.log()));
        assert_eq!(got, data, "after {name}");
    }
    assert!(s.log().contains("SIGHUP ignored: nothing to reload"), "{}", s.log());
    // USR1: a report, and the stats file written at once with what was done.
    let _ = std::fs::remove_file(&s.stats);
    s.signal(libc::SIGUSR1);
    // One write, and a read after each of the eight signals.
    log_shows_within(&s, "SIGUSR1: 9 I/O commands");
    log_shows_within(&s, "written");
    let stats: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&s.stats).unwrap()).unwrap();
    assert_eq!(stats["io_commands"], 9, "{stats}");
    drop(d);
    s.signal(libc::SIGQUIT);
    let st = s.wait_exit().unwrap_or_else(|| panic!("SIGQUIT: the server did not stop\n{}", s.log()));
    assert!(st.success(), "{st}\n{}", s.log());
    assert!(s.log().contains("stopped by SIGQUIT"), "{}", s.log());
    assert!(!s.socket.exists() && !ctl.exists(), "its sockets were left behind");
}

/// issue 49: the keeper of `--restart-on-crash` ignores HUP (a closed terminal
/// used to kill it, leaving the device unkept), passes USR1 on to the serving
/// process, and on TERM stops it and ends with it, the serving process never
/// told its keeper was lost.
#[test]
fn the_keeper_ignores_hup_passes_usr1_on_and_stops_with_its_serving_process() {
    let dir = common::temp_dir("keeper-signals");
    let ctl = dir.join("c.sock");
    let mut s = Server::start_in(
        &dir,
        "s",
        &["--ns", "ram:16M", "--control", ctl.to_str().unwrap(), "--restart-on-crash"],
    )
    .owning_dir();
    log_shows_within(&s, "control socket on");
    let info = |what: &str| {
        let out = Command::new(VNVME)
            .arg("ctl")
            .arg("--control")
            .arg(&ctl)
            .args(["--json", "ctrl.info"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let serving = info("before")["pid"].as_u64().unwrap();
    s.signal(libc::SIGHUP);
    log_shows_within(&s, "vnvme keeper: SIGHUP ignored");
    let after = info("after SIGHUP");
    assert_eq!(after["pid"].as_u64(), Some(serving), "the same serving process");
    assert_eq!(after["keeper"]["pid"].as_u64(), Some(s.pid() as u64), "still kept: {after}");
    assert!(!after["keeper_lost"].as_bool().unwrap_or(false), "{after}");
    s.signal(libc::SIGUSR1);
    log_shows_within(&s, &format!("SIGUSR1: passed to the serving process (pid {serving})"));
    log_shows_within(&s, "vnvme: SIGUSR1: 0 I/O commands");
    s.signal(libc::SIGTERM);
    let st = s.wait_exit().unwrap_or_else(|| panic!("the keeper did not stop\n{}", s.log()));
    assert!(st.success(), "{st}\n{}", s.log());
    assert!(
        !std::path::Path::new(&format!("/proc/{serving}/stat")).exists()
            || std::fs::read_to_string(format!("/proc/{serving}/stat")).unwrap_or_default().contains(") Z"),
        "the serving process ended with its keeper"
    );
    let log = s.log();
    assert!(log.contains("stopped by SIGTERM") && log.contains("vnvme keeper: stopped"), "{log}");
    assert!(!log.contains("the keeper is gone"), "the serving process read its keeper as lost: {log}");
}
