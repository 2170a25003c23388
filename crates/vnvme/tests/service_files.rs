//! The files that run vnvme as a service, exercised: the systemd unit template
//! (contrib/systemd/vnvme@.service) passes `systemd-analyze verify`, and its
//! ExecStart command line, with the instance's paths put in a temporary directory,
//! starts a server whose vfio-user, control and metrics sockets all answer.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const UNIT: &str = include_str!("../../../contrib/systemd/vnvme@.service");

/// The ExecStart line of the unit, continuation lines joined.
fn exec_start() -> String {
    let joined = UNIT.replace("\\\n", " ");
    let line = joined.lines().find(|l| l.starts_with("ExecStart=")).expect("an ExecStart line");
    line.trim_start_matches("ExecStart=").to_string()
}

#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    let Ok(out) = Command::new("systemd-analyze").arg("--version").output() else {
        common::skip("service_files: systemd-analyze is not installed (Debian: systemd)");
        return;
    };
    assert!(out.status.success());
    let dir = common::temp_dir("unit");
    // The instance, with the binary this build made in place of the installed path.
    let unit = UNIT.replace("/usr/local/bin/vnvme", env!("CARGO_BIN_EXE_vnvme"));
    let path = dir.join("vnvme@vm1.service");
    std::fs::write(&path, unit).unwrap();
    let out = Command::new("systemd-analyze").args(["verify", "--man=no"]).arg(&path).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    // The configuration file is the operator's; every other complaint is ours.
    let complaints: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(complaints.is_empty() && out.status.success(), "systemd-analyze verify:\n{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_units_command_line_starts_a_server_with_every_socket() {
    let dir = common::temp_dir("unit-run");
    let run = dir.to_str().unwrap();
    let line = exec_start()
        .replace("/usr/local/bin/vnvme", env!("CARGO_BIN_EXE_vnvme"))
        .replace("/run/vnvme", run)
        .replace("%i", "vm1")
        .replace("$VNVME_NS", "--ns ram:16M")
        .replace("$VNVME_ARGS", "--workers 1");
    let words: Vec<&str> = line.split_whitespace().collect();
    let log = std::fs::File::create(dir.join("serve.log")).unwrap();
    let mut child = Command::new(words[0])
        .args(&words[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start the unit's command");
    let sock = |n: &str| -> PathBuf { dir.join(format!("vm1.{n}")) };
    let deadline = Instant::now() + common::TIMEOUT;
    while !(sock("sock").exists() && sock("ctl").exists() && sock("metrics").exists()) {
        if let Some(st) = child.try_wait().unwrap() {
            panic!("exited {st}:\n{}", std::fs::read_to_string(dir.join("serve.log")).unwrap());
        }
        assert!(Instant::now() < deadline, "sockets did not appear");
        std::thread::sleep(Duration::from_millis(20));
    }
    // vfio-user: VERSION negotiates.
    vfio_user::client::Client::connect(&sock("sock")).expect("the vfio-user socket answers");
    // Control: ctrl.info.
    let mut c = UnixStream::connect(sock("ctl")).unwrap();
    c.set_read_timeout(Some(common::TIMEOUT)).unwrap();
    c.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ctrl.info\"}\n").unwrap();
    let mut reply = String::new();
    let mut b = [0u8; 4096];
    while !reply.contains('\n') {
        let n = c.read(&mut b).unwrap();
        assert!(n > 0, "control socket closed");
        reply.push_str(&String::from_utf8_lossy(&b[..n]));
    }
    assert!(reply.contains("\"serial\""), "{reply}");
    // Metrics: an HTTP GET over the UNIX socket.
    let mut m = UnixStream::connect(sock("metrics")).unwrap();
    m.set_read_timeout(Some(common::TIMEOUT)).unwrap();
    m.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut body = String::new();
    m.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.1 200") && body.contains("vnvme_io_commands_total"), "{body}");
    let log = std::fs::read_to_string(dir.join("serve.log")).unwrap();
    assert!(log.lines().any(|l| l.starts_with('{')), "--log-format json writes JSON lines:\n{log}");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
