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
        test_util::skip("service_files: systemd-analyze is not installed (Debian: systemd)");
        return;
    };
    assert!(out.status.success());
    let dir = common::temp_dir("unit");
    // The instance, with the binary this build made in place of the installed path.
    let unit = UNIT.replace("/usr/bin/vnvme", env!("CARGO_BIN_EXE_vnvme"));
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
        .replace("/usr/bin/vnvme", env!("CARGO_BIN_EXE_vnvme"))
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

/// The libvirt domain in docs/USAGE.md validates against libvirt's own schema, and its
/// QEMU device argument is the vfio-user-pci device the guest tests use.
#[test]
fn the_documented_libvirt_domain_is_valid() {
    let doc = include_str!("../../../docs/USAGE.md");
    let start = doc.find("<!-- libvirt-domain-example -->").expect("docs/USAGE.md marks its libvirt example");
    let rest = &doc[start..];
    let xml = &rest[rest.find("```xml\n").expect("an xml block") + 7..];
    let xml = &xml[..xml.find("```").expect("the block ends")];
    // The device argument: JSON for vfio-user-pci on a UNIX socket, on a root port.
    let arg = xml
        .lines()
        .find_map(|l| {
            l.trim().strip_prefix("<qemu:arg value='{").map(|v| format!("{{{}", v.trim_end_matches("'/>")))
        })
        .expect("a -device argument");
    let dev: serde_json::Value = serde_json::from_str(&arg).expect("the -device argument is JSON");
    assert_eq!(dev["driver"], "vfio-user-pci");
    assert_eq!(dev["socket"]["type"], "unix");
    assert!(
        xml.contains("<source type='memfd'/>") && xml.contains("<access mode='shared'/>"),
        "shared memfd memory"
    );

    let fetch = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/lib/libvirt-schemas.sh"))
        .stderr(Stdio::piped())
        .output()
        .expect("run libvirt-schemas.sh");
    if !fetch.status.success() {
        let why = String::from_utf8_lossy(&fetch.stderr);
        test_util::skip(&format!(
            "service_files: libvirt's schemas could not be fetched ({}); the documented domain XML is not validated",
            why.lines().last().unwrap_or("no reason given")
        ));
        return;
    }
    let root = PathBuf::from(String::from_utf8_lossy(&fetch.stdout).trim());
    let dir = common::temp_dir("libvirt");
    let file = dir.join("domain.xml");
    std::fs::write(&file, xml).unwrap();
    let out = Command::new(root.join("usr/bin/xmllint"))
        .args(["--noout", "--relaxng"])
        .arg(root.join("usr/share/libvirt/schemas/domain.rng"))
        .arg(&file)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "libvirt's domain schema refuses the documented example:\n{text}\n{xml}");
    let _ = std::fs::remove_dir_all(&dir);
}
