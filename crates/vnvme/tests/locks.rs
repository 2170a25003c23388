//! One writer per file, across processes (issue 49): every file a server writes
//! is locked while it serves it, and a second writer, in another process or the
//! same, is refused before it touches anything, with the holder named. Sharing
//! is where it is the design: the controllers of one subsystem, a takeover, a
//! migration's destination (`--incoming`). QEMU's own tools honour the same
//! locks, both ways.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Server;

const VNVME: &str = env!("CARGO_BIN_EXE_vnvme");

/// Runs `vnvme ARGS` in `dir`, bounded: (exit status, stderr). One still running
/// after the bound (it started serving instead of refusing) fails the test.
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
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("vnvme {args:?} did not refuse: still running after {:?}", common::TIMEOUT);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().expect("output");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Every file in `dir` (but the servers' logs) with its bytes.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && p.extension().is_none_or(|e| e != "log" && e != "json"))
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect();
    v.sort();
    v
}

/// `vnvme serve ARGS` (a socket of its own) is refused: exit 1, the message says
/// each of `needles`, and nothing in `dir` was created, changed or removed.
fn refused(dir: &Path, args: &[&str], needles: &[&str]) {
    let before = snapshot(dir);
    // (The running servers' own files come and go: their logs, stats files and
    // the stats files' temporary names.)
    let names = |d: &Path| {
        let mut n: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.') && !n.ends_with(".log") && !n.ends_with(".json"))
            .collect();
        n.sort();
        n
    };
    let names_before = names(dir);
    let mut all = vec!["serve", "--socket", "refused.sock"];
    all.extend_from_slice(args);
    let (code, err) = run_in(dir, &all);
    assert_eq!(code, 1, "vnvme {all:?}: exit {code}:\n{err}");
    for n in needles {
        assert!(err.contains(n), "vnvme {all:?}: the message does not say {n:?}:\n{err}");
    }
    assert_eq!(names(dir), names_before, "vnvme {all:?} created or removed a file");
    assert!(snapshot(dir) == before, "vnvme {all:?} changed a file");
}

/// A file of `len` bytes of a pattern.
fn image(path: &Path, len: usize, seed: u8) -> PathBuf {
    std::fs::write(path, test_util::pattern(seed as u64, len)).unwrap();
    path.to_path_buf()
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

fn wait_for(path: &Path, s: &Server) {
    let deadline = Instant::now() + common::TIMEOUT;
    while !path.exists() {
        assert!(Instant::now() < deadline, "{} never appeared:\n{}", path.display(), s.log());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_second_writer_is_refused_whoever_and_wherever_it_is() {
    let dir = common::temp_dir("locks");
    image(&dir.join("a.img"), 4 << 20, 1);
    image(&dir.join("z.img"), 8 << 20, 2);
    image(&dir.join("m.img"), 4 << 20, 3);
    image(&dir.join("b.img"), 4 << 20, 4);
    let control = dir.join("a.ctl");
    let f = |name: &str, opts: &str| format!("file:{}{opts}", dir.join(name).display());
    let a = Server::start_in(
        &dir,
        "a",
        &[
            "--ns",
            &f("a.img", ""),
            "--ns",
            &f("z.img", ":zoned=1M"),
            "--ns",
            &f("m.img", ":ms=8"),
            "--control",
            control.to_str().unwrap(),
        ],
    );
    wait_for(&control, &a);
    let held = format!("vnvme pid {} (namespace 1's data)", a.pid());
    // Another server, by the same name or another.
    refused(&dir, &["--ns", "file:a.img"], &["a.img is in use by a writer", &held, "--cntlid"]);
    let abs = format!("file:{}", dir.join("a.img").display());
    refused(&dir, &["--ns", "ram:1M", "--ns", &abs], &[&held]);
    // Its zone state and metadata files, each given as another namespace's.
    let zones = format!("file:b.img:zoned=1M:zone-state={}", dir.join("z.img.zones").display());
    refused(&dir, &["--ns", &zones], &[&format!("vnvme pid {} (namespace 2's zone state file)", a.pid())]);
    refused(&dir, &["--ns", "file:b.img:ms=8:meta=m.img.meta"], &["(namespace 3's metadata file)"]);
    // Its stats file; an image as a stats file, whoever serves it.
    // (The test kit gives each server a stats file: NAME-stats.json.)
    refused(
        &dir,
        &["--ns", "ram:1M", "--stats-file", "a-stats.json"],
        &[&format!("vnvme pid {} (its stats file)", a.pid())],
    );
    refused(&dir, &["--ns", "ram:1M", "--stats-file", "b.img"], &["b.img", "not a stats file of vnvme's"]);
    // One server given one file twice (a relative and an absolute name).
    let b_abs = format!("file:{}", dir.join("b.img").display());
    refused(&dir, &["--ns", "file:b.img", "--ns", &b_abs], &["this process (namespace 1's data)"]);
    // ns.add, of a file it serves (and of one it does not: added).
    let e = ctl(&control, &["ns.add", &abs]).unwrap_err();
    assert!(e.contains("this process (namespace 1's data)"), "{e}");
    let e = ctl(&control, &["ns.add", &f("m.img.meta", "")]).unwrap_err();
    assert!(e.contains("this process (namespace 3's metadata file)"), "{e}");
    let added = ctl(&control, &["ns.add", &b_abs]).unwrap_or_else(|e| panic!("{e}\n{}", a.log()));
    let nsid = added["nsid"].as_u64().unwrap();
    // (Added without an NSID, it was opened before it had one.)
    refused(&dir, &["--ns", "file:b.img"], &[&format!("vnvme pid {} (a namespace's data)", a.pid())]);
    // Removed, the file is free: another server takes it.
    ctl(&control, &["ns.remove", &nsid.to_string(), "--force"])
        .or_else(|_| ctl(&control, &["ns.remove", &nsid.to_string()]))
        .unwrap_or_else(|e| panic!("{e}\n{}", a.log()));
    let b = Server::start_in(&dir, "b", &["--ns", &b_abs]);
    drop((a, b));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_controllers_of_one_subsystem_share_and_no_one_else() {
    let dir = common::temp_dir("locks-subsystem");
    image(&dir.join("s.img"), 4 << 20, 5);
    let ns = format!("file:{}:resv={}", dir.join("s.img").display(), dir.join("s.resv").display());
    let ns = ns.as_str();
    let c1 = Server::start_in(&dir, "c1", &["--ns", ns, "--cntlid", "1", "--serial", "SUBSYS-A"]);
    let c2 = Server::start_in(&dir, "c2", &["--ns", ns, "--cntlid", "2", "--serial", "SUBSYS-A"]);
    refused(
        &dir,
        &["--ns", ns, "--cntlid", "3", "--serial", "SUBSYS-B"],
        &["shared by the controllers of another subsystem", "vnvme pid"],
    );
    refused(&dir, &["--ns", "file:s.img"], &["in use by a writer"]);
    // Its reservation state file too, as another subsystem's.
    image(&dir.join("o.img"), 4 << 20, 6);
    refused(
        &dir,
        &["--ns", "file:o.img:resv=s.resv", "--cntlid", "1", "--serial", "SUBSYS-B"],
        &["reservation state file"],
    );
    drop((c1, c2));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_migration_destination_shares_only_when_it_says_so() {
    let dir = common::temp_dir("locks-migration");
    image(&dir.join("m.img"), 4 << 20, 7);
    let abs = format!("file:{}", dir.join("m.img").display());
    let src = Server::start_in(&dir, "src", &["--ns", &abs]);
    refused(&dir, &["--ns", "file:m.img"], &[&format!("vnvme pid {}", src.pid()), "in use by a writer"]);
    // tests/migration.rs moves a verified workload between two such servers.
    let dst = Server::start_in(&dir, "dst", &["--ns", &abs, "--incoming"]);
    drop((src, dst));
    let _ = std::fs::remove_dir_all(&dir);
}

/// After an upgrade the new process holds the files: a server started then is
/// refused with the new process named.
#[test]
fn after_an_upgrade_the_new_process_holds_the_files() {
    let dir = common::temp_dir("locks-upgrade");
    image(&dir.join("u.img"), 4 << 20, 8);
    let control = dir.join("u.ctl");
    let abs = format!("file:{}", dir.join("u.img").display());
    let s = Server::start_in(&dir, "s", &["--ns", &abs, "--control", control.to_str().unwrap()]);
    wait_for(&control, &s);
    let r = ctl(&control, &["upgrade"]).unwrap_or_else(|e| panic!("{e}\n{}", s.log()));
    let new = r["new_pid"].as_u64().unwrap();
    refused(&dir, &["--ns", "file:u.img"], &[&format!("vnvme pid {new} (namespace 1's data)")]);
    let _ = Command::new("kill").arg("-9").arg(new.to_string()).status();
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// QEMU's tools lock images as QEMU does: they refuse an image vnvme serves,
/// and vnvme refuses one qemu-nbd serves, naming it.
#[test]
fn qemu_and_vnvme_refuse_each_others_images() {
    let Some(bin) = test_servers::nbd::servers() else { return };
    let dir = common::temp_dir("locks-qemu");
    let img = image(&dir.join("q.img"), 4 << 20, 9);
    let s = Server::start_in(&dir, "s", &["--ns", &format!("file:{}", img.display())]);
    // Writing into it (`qemu-img info` takes no lock: it is no test).
    let src = image(&dir.join("src.img"), 4 << 20, 10);
    let out = Command::new(bin.join("qemu-img"))
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&src)
        .arg(&img)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("Failed to get \"write\" lock"), "qemu-img convert: {err}");
    assert_eq!(std::fs::read(&img).unwrap(), test_util::pattern(9, 4 << 20), "the image is untouched");
    drop(s);
    // qemu-nbd serving an image (read-write, raw; another one: the killed
    // server's files may take a moment to be let go of).
    let img = image(&dir.join("n.img"), 4 << 20, 11);
    let sock = dir.join("nbd.sock");
    let mut nbd = Command::new(bin.join("qemu-nbd"))
        .args(["-f", "raw", "-k"])
        .arg(&sock)
        .arg(&img)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + common::TIMEOUT;
    while !sock.exists() {
        assert!(Instant::now() < deadline, "qemu-nbd did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    let (code, err) = run_in(&dir, &["serve", "--socket", "r.sock", "--ns", "file:n.img"]);
    let _ = nbd.kill();
    let _ = nbd.wait();
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(&format!("pid {} (qemu-nbd)", nbd.id())) && err.contains("not vnvme"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// issue 49: a read-only namespace takes a shared lock: servers that only read an
/// image share it, and no one writes it meanwhile; a writer keeps readers out. The
/// namespace is write protected: a write fails Namespace Write Protected.
#[test]
fn readers_share_an_image_and_keep_writers_out() {
    use common::opts;
    use nvme_driver::{CompletionMode, DoorbellMode};
    let dir = common::temp_dir("locks-readers");
    let data = test_util::pattern(12, 4 << 20);
    std::fs::write(dir.join("r.img"), &data).unwrap();
    let ro = format!("file:{}:readonly=on", dir.join("r.img").display());
    let a = Server::start_in(&dir, "a", &["--ns", &ro]);
    let b = Server::start_in(&dir, "b", &["--ns", &ro]);
    refused(&dir, &["--ns", "file:r.img"], &["in use, and its user lets no one else write it", "vnvme pid"]);
    let mut d = a.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Polling));
    let mut got = vec![0u8; 4096];
    d.read(1, 8, &mut got).unwrap();
    assert_eq!(got, data[4096..8192]);
    let e = d.write(1, 0, &[1u8; 4096]).unwrap_err().to_string();
    assert!(e.contains("0x20") || e.to_lowercase().contains("write protected"), "{e}");
    drop(d);
    drop((a, b));
    assert_eq!(std::fs::read(dir.join("r.img")).unwrap(), data, "nothing was written");
    // A writer keeps readers out.
    let w = Server::start_in(&dir, "w", &["--ns", &format!("file:{}", dir.join("r.img").display())]);
    refused(
        &dir,
        &["--ns", "file:r.img:readonly=on"],
        &["in use by a writer", &format!("vnvme pid {}", w.pid())],
    );
    drop(w);
    let _ = std::fs::remove_dir_all(&dir);
}

/// issue 49: under `--restart-on-crash`, the stand-in for a killed serving
/// process opens its files again (the dead one's hold, io_uring's included, is
/// waited out) and holds them: another server is refused, the stand-in named.
#[test]
fn a_stand_in_holds_the_files_its_dead_process_held() {
    let dir = common::temp_dir("locks-standin");
    image(&dir.join("k.img"), 4 << 20, 13);
    let control = dir.join("k.ctl");
    let ns = format!("file:{}", dir.join("k.img").display());
    let s = Server::start_in(
        &dir,
        "s",
        &["--ns", &ns, "--restart-on-crash", "--control", control.to_str().unwrap()],
    );
    let pid_of = |not: u64| {
        let deadline = Instant::now() + common::TIMEOUT;
        loop {
            if let Some(p) =
                ctl(&control, &["ctrl.info"]).ok().and_then(|v| v["pid"].as_u64()).filter(|&p| p != not)
            {
                return p;
            }
            assert!(Instant::now() < deadline, "no serving process:\n{}", s.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let first = pid_of(0);
    let _ = Command::new("kill").arg("-9").arg(first.to_string()).status();
    let standin = pid_of(first);
    refused(&dir, &["--ns", "file:k.img"], &[&format!("vnvme pid {standin} (namespace 1's data)")]);
    let _ = Command::new("kill").arg("-9").arg(s.pid().to_string()).status();
    let _ = Command::new("kill").arg("-9").arg(standin.to_string()).status();
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}
