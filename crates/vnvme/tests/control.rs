//! The control socket of `vnvme serve --control`, across processes: every method
//! through `vnvme ctl` and through raw JSON-RPC, the socket's mode, and a hostile
//! client (garbage, oversized and stalled requests, batches, too many connections)
//! that gets errors while the device keeps serving I/O. The sandbox is on.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::Shutdown;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{opts, Server};
use nvme_driver::{CompletionMode, DoorbellMode, IoCommand, IoQueue};
use serde_json::Value;
use test_util::pattern;

fn start(extra: &[&str]) -> (Server, PathBuf) {
    let dir = common::temp_dir("control");
    let ctl = dir.join("c.sock");
    let mut args = vec!["--control", ctl.to_str().unwrap()];
    args.extend_from_slice(extra);
    let s = Server::start_in(&dir, "s", &args).owning_dir();
    let deadline = Instant::now() + common::TIMEOUT;
    while !ctl.exists() {
        assert!(Instant::now() < deadline, "no control socket:\n{}", s.log());
        std::thread::sleep(Duration::from_millis(10));
    }
    (s, ctl)
}

/// `vnvme ctl --control PATH --json ARGS...`: the parsed result, or the error text.
fn ctl(path: &Path, args: &[&str]) -> Result<Value, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_vnvme"))
        .arg("ctl")
        .arg("--control")
        .arg(path)
        .arg("--json")
        .args(args)
        .output()
        .expect("run vnvme ctl");
    if out.status.success() {
        Ok(serde_json::from_slice(&out.stdout).expect("ctl --json prints JSON"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A raw connection: lines out, lines in.
struct Raw {
    s: UnixStream,
    r: BufReader<UnixStream>,
}

impl Raw {
    fn new(path: &Path) -> Raw {
        let s = UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(common::TIMEOUT)).unwrap();
        Raw { r: BufReader::new(s.try_clone().unwrap()), s }
    }

    fn send(&mut self, line: &str) {
        self.s.write_all(line.as_bytes()).unwrap();
        self.s.write_all(b"\n").unwrap();
    }

    fn recv(&mut self) -> Value {
        let mut l = String::new();
        self.r.read_line(&mut l).unwrap();
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("reply {l:?}: {e}"))
    }

    fn call(&mut self, line: &str) -> Value {
        self.send(line);
        self.recv()
    }

    /// True if the server closed the connection (bounded wait).
    fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.r.read(&mut b), Ok(0)) || matches!(self.s.read(&mut b), Ok(0) | Err(_))
    }
}

fn error_code(v: &Value) -> i64 {
    v["error"]["code"].as_i64().unwrap_or_else(|| panic!("not an error: {v}"))
}

#[test]
fn every_method_through_vnvme_ctl() {
    // One worker, whatever this host's default, so stats.get has a worker to show.
    let (mut server, c) = start(&["--ns", "ram:32M", "--workers", "1"]);
    let mode = std::fs::metadata(&c).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "owner-only");

    let info = ctl(&c, &["ctrl.info"]).unwrap();
    assert_eq!(info["serial"], "VNVME0001");
    assert_eq!(info["max_namespaces"], 32);
    assert_eq!(info["namespaces"], 1);
    assert_eq!(info["state"], "disabled");
    assert_eq!(info["client_connected"], false);
    assert_eq!(info["sandbox"], true);
    // The build is named the same way everywhere an operator looks.
    let commit = info["commit"].as_str().expect("commit in ctrl.info");
    assert!(!commit.is_empty(), "{info}");
    let v = std::process::Command::new(env!("CARGO_BIN_EXE_vnvme")).arg("--version").output().unwrap();
    let v = String::from_utf8(v.stdout).unwrap();
    let named = format!("vnvme {} (commit {commit}", info["vnvme"].as_str().unwrap());
    // A test build (the fault-injection feature) says so after the commit.
    let test_build = ", with fault injection: a test build, not for serving";
    assert!(v.trim() == format!("{named})") || v.trim() == format!("{named}{test_build})"), "{v}");
    assert!(server.log().contains(&format!("{} (pid ", v.trim())), "the first log line names the build");

    let img = server.dir.join("data.img");
    let added = ctl(&c, &["ns.add", &format!("file:{}:8M", img.display())]).unwrap();
    assert_eq!((added["nsid"].as_u64(), added["size"].as_u64()), (Some(2), Some(8 << 20)), "{added}");
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 8 << 20, "created by the server, under the sandbox");
    let added = ctl(&c, &["ns.add", "ram:4M:lba=4096", "7"]).unwrap();
    assert_eq!((added["nsid"].as_u64(), added["lba_size"].as_u64()), (Some(7), Some(4096)));
    let list = ctl(&c, &["ns.list"]).unwrap();
    let ids: Vec<u64> =
        list["namespaces"].as_array().unwrap().iter().map(|n| n["nsid"].as_u64().unwrap()).collect();
    assert_eq!(ids, vec![1, 2, 7]);
    assert_eq!(list["namespaces"][2]["spec"], "ram:4M:lba=4096");

    let r = ctl(&c, &["ns.resize", "2", "16M"]).unwrap();
    assert_eq!((r["old_size"].as_u64(), r["size"].as_u64()), (Some(8 << 20), Some(16 << 20)));
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 16 << 20, "the file grew");
    // No client: nothing is in use, no force needed.
    ctl(&c, &["ns.remove", "7"]).unwrap();

    let e = ctl(&c, &["ns.remove", "7"]).unwrap_err();
    assert!(e.contains("there is no namespace 7") && e.contains("-32000"), "{e}");
    let e = ctl(&c, &["ns.add", "ram:1M", "99"]).unwrap_err();
    assert!(e.contains("outside 1..=32"), "{e}");
    let e = ctl(&c, &["ns.add", "disk:1G"]).unwrap_err();
    assert!(e.contains("unknown namespace kind") && e.contains("-32602"), "{e}");
    let e = ctl(&c, &["ns.add", "nvme:///nowhere.sock?ns=1"]).unwrap_err();
    assert!(e.contains("sandbox forbids") && e.contains("-32002"), "{e}");
    let e = ctl(&c, &["ns.list", "verbose=1"]).unwrap_err();
    assert!(e.contains("unknown parameter `verbose`") && e.contains("-32602"), "{e}");
    let e = ctl(&c, &["nope"]).unwrap_err();
    assert!(e.contains("-32601"), "{e}");

    let stats = ctl(&c, &["stats.get"]).unwrap();
    assert_eq!(stats["controller"]["io_commands"], 0);
    assert_eq!(stats["workers"].as_array().map(Vec::len), Some(1));
    // Adaptive polling (the default) reports its judge.
    let poll = &stats["adaptive_poll"];
    assert!(["spin", "sleep"].contains(&poll["choice"].as_str().unwrap_or("")), "{poll}");
    assert!(poll["epochs"].is_u64() && poll["changes"].is_u64(), "{poll}");
    let l = ctl(&c, &["log.set", "info,vnvme::control=debug"]).unwrap();
    assert_eq!(l["previous"], "info");
    assert_eq!(ctl(&c, &["ctrl.info"]).unwrap()["log_filter"], "info,vnvme::control=debug");
    assert!(ctl(&c, &["log.set", "info,=="]).unwrap_err().contains("bad filter"));
    assert!(server.log().contains("control request done method=\"ns.add\""), "changes are logged");
    server.assert_alive();
}

#[test]
fn a_namespace_added_under_a_connected_host_takes_its_io_and_removed_refuses_it() {
    let (mut server, c) = start(&["--ns", "ram:16M"]);
    let mut h = common::nvme_host::NvmeOverVfioUser::new(server.client());
    h.bring_up(16, false);
    assert_eq!(ctl(&c, &["ctrl.info"]).unwrap()["client_connected"], true);
    assert_eq!(ctl(&c, &["ctrl.info"]).unwrap()["state"], "ready");
    ctl(&c, &["ns.add", "ram:8M"]).unwrap();
    h.nsid = 2;
    // Under I/O, removing it needs force (the guest's commands would fail).
    let busy = std::sync::atomic::AtomicBool::new(true);
    let e = std::thread::scope(|s| {
        let remove = s.spawn(|| {
            let r = ctl(&c, &["ns.remove", "2"]);
            busy.store(false, std::sync::atomic::Ordering::Relaxed);
            r
        });
        let mut seed = 5;
        while busy.load(std::sync::atomic::Ordering::Relaxed) {
            h.write_read_verify(8, 4, seed);
            seed = seed.wrapping_add(1);
        }
        remove.join().unwrap()
    })
    .unwrap_err();
    assert!(e.contains("namespace 2 is in use") && e.contains("ns.remove 2 force"), "{e}");
    ctl(&c, &["ns.remove", "2", "force"]).unwrap();
    h.queue_rw(false, 0, 0);
    h.ring_io(false);
    let st = h.reap_io(1)[0].status();
    assert_eq!(st.code(), nvme_spec::Status::INVALID_NAMESPACE.code(), "removed: {st:?}");
    h.nsid = 1;
    h.write_read_verify(0, 4, 6);
    server.assert_alive();
}

/// One 4 KiB write of `data` at `slba` of `nsid`, waited for.
fn write(q: &mut IoQueue, nsid: u32, slba: u64, data: &[u8]) -> nvme_spec::Status {
    let buf = q.alloc_buf(4096).unwrap();
    buf.write_at(0, data).unwrap();
    q.submit(IoCommand::Write { nsid, slba, nlb: 8, buf, fua: false }).unwrap();
    let mut done = Vec::new();
    while done.is_empty() {
        q.wait_completions(&mut done).unwrap();
    }
    done.remove(0).status
}

/// One 4 KiB read at `slba` of `nsid`, waited for: its status and data.
fn read(q: &mut IoQueue, nsid: u32, slba: u64) -> (nvme_spec::Status, Vec<u8>) {
    let buf = q.alloc_buf(4096).unwrap();
    q.submit(IoCommand::Read { nsid, slba, nlb: 8, buf }).unwrap();
    let mut done = Vec::new();
    while done.is_empty() {
        q.wait_completions(&mut done).unwrap();
    }
    let c = done.remove(0);
    let st = c.status;
    let mut back = vec![0u8; 4096];
    if let Ok(Some(b)) = c.into_result() {
        b.read_at(0, &mut back).unwrap();
    }
    (st, back)
}

/// Writes and reads back through the driver until told to stop; counts failures.
fn io_loop(q: &mut IoQueue, stop: &AtomicBool) -> (u64, u64) {
    let (mut ok, mut bad) = (0, 0);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let data = pattern(n, 4096);
        let slba = (n % 512) * 8;
        let w = write(q, 1, slba, &data);
        let (r, back) = read(q, 1, slba);
        if w.is_success() && r.is_success() && back == data {
            ok += 1;
        } else {
            bad += 1;
        }
        n += 1;
    }
    (ok, bad)
}

#[test]
fn a_hostile_control_client_gets_errors_and_io_goes_on() {
    let (mut server, c) = start(&["--ns", "ram:16M"]);
    let mut d = server.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Interrupts));
    let stop = Arc::new(AtomicBool::new(false));
    let io = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let q = d.queue(1).unwrap();
            io_loop(q, &stop)
        })
    };

    let mut r = Raw::new(&c);
    assert_eq!(error_code(&r.call("this is not json")), -32700);
    assert_eq!(error_code(&r.call("42")), -32600);
    assert_eq!(error_code(&r.call(r#"{"jsonrpc":"1.0","id":1,"method":"ns.list"}"#)), -32600);
    assert_eq!(error_code(&r.call(r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ns.list"}"#)), -32600);
    assert_eq!(error_code(&r.call(r#"{"jsonrpc":"2.0","id":2,"method":7}"#)), -32600);
    assert_eq!(error_code(&r.call(r#"{"jsonrpc":"2.0","id":3,"method":"ns.remove","params":[1]}"#)), -32602);
    // The server checks as strictly as ctl does: an unknown parameter, a missing one.
    let v = r.call(r#"{"jsonrpc":"2.0","id":3,"method":"ns.list","params":{"verbose":1}}"#);
    assert_eq!(error_code(&v), -32602);
    assert!(v["error"]["message"].as_str().unwrap().contains("unknown parameter `verbose`"), "{v}");
    let v = r.call(r#"{"jsonrpc":"2.0","id":3,"method":"ns.resize","params":{"nsid":1}}"#);
    assert!(v["error"]["message"].as_str().unwrap().contains("missing parameter `size`"), "{v}");
    assert_eq!(error_code(&r.call(r#"{"jsonrpc":"2.0","id":3,"method":"nope"}"#)), -32601);
    assert_eq!(
        error_code(&r.call(r#"{"jsonrpc":"2.0","id":4,"method":"ns.remove","params":{"nsid":-1}}"#)),
        -32602
    );
    assert_eq!(
        error_code(
            &r.call(r#"{"jsonrpc":"2.0","id":5,"method":"ns.resize","params":{"nsid":1,"size":"12Q"}}"#)
        ),
        -32602
    );
    assert_eq!(error_code(&r.call("[]")), -32600);
    let big: Vec<String> =
        (0..17).map(|i| format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"ns.list"}}"#)).collect();
    assert_eq!(error_code(&r.call(&format!("[{}]", big.join(",")))), -32600, "batch over 16");
    let two = r.call(
        r#"[{"jsonrpc":"2.0","id":"a","method":"ns.list"},{"jsonrpc":"2.0","id":"b","method":"nope"}]"#,
    );
    assert_eq!((two[0]["id"].as_str(), two[1]["id"].as_str()), (Some("a"), Some("b")));
    assert!(two[0]["result"]["namespaces"].is_array());
    assert_eq!(error_code(&two[1]), -32601);
    // A notification gets no reply: the next reply on the line is the next request's.
    r.send(r#"{"jsonrpc":"2.0","method":"log.set","params":{"filter":"info"}}"#);
    let v = r.call(r#"{"jsonrpc":"2.0","id":9,"method":"ctrl.info"}"#);
    assert_eq!((v["id"].as_u64(), v["result"]["log_filter"].as_str()), (Some(9), Some("info")));

    // Over 64 KiB without a newline: an error, then the connection closes.
    let mut big = Raw::new(&c);
    let _ = big.s.write_all(&vec![b'x'; 70 << 10]);
    assert_eq!(error_code(&big.recv()), -32600);
    assert!(big.closed(), "an oversized request closes the connection");
    // The server holds a connection it closed until the client closes too (or the
    // deadline passes), so that its last reply is not lost to a reset. Shut, not
    // just dropped: a process another test spawns at this moment holds a copy of
    // the descriptors until it execs, the connection stays open until then and
    // counts against the cap below; a shutdown ends it whoever holds a copy.
    big.s.shutdown(Shutdown::Both).unwrap();
    drop(big);

    // At most 16 connections: one more is told the server is busy and closed (r and
    // the stalled one below count too).
    let mut stalled = Raw::new(&c);
    stalled.s.write_all(br#"{"jsonrpc":"2.0","id":1,"#).unwrap();
    let mut extra: Vec<Raw> = (0..14).map(|_| Raw::new(&c)).collect();
    let mut refused = Raw::new(&c);
    let busy = refused.recv();
    assert_eq!(error_code(&busy), -32001, "the 17th connection is refused: {busy}");
    assert!(busy["error"]["message"].as_str().unwrap().contains("16 are open"), "{busy}");
    assert!(refused.closed(), "the 17th connection is closed");
    for e in &mut extra {
        assert!(e.call(r#"{"jsonrpc":"2.0","id":1,"method":"ns.list"}"#)["result"].is_object());
    }
    drop(extra);
    // A request begun and never finished: closed at the 5 s deadline (the read
    // waits up to TIMEOUT; the log says why it closed).
    assert!(stalled.closed(), "a stalled request closes its connection");
    assert!(server.log().contains("did not arrive whole"), "{}", server.log());

    stop.store(true, Ordering::Relaxed);
    let (ok, bad) = io.join().unwrap();
    assert!(ok > 0 && bad == 0, "I/O during the abuse: {ok} verified, {bad} failed");
    assert!(r.call(r#"{"jsonrpc":"2.0","id":10,"method":"ns.list"}"#)["result"].is_object());
    server.assert_alive();
}

/// Namespaces added and removed over and over while a host does verified I/O, in
/// inline mode (the server's thread runs the queues, and runs them again for each
/// asynchronous event a change raises): no command waits for a doorbell the host
/// was told it need not ring.
#[test]
fn namespaces_changed_under_io_in_inline_mode_never_strand_a_command() {
    let (mut server, c) = start(&["--ns", "ram:16M", "--workers", "0", "--poll", "adaptive"]);
    let mut d = server.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Interrupts));
    let stop = Arc::new(AtomicBool::new(false));
    let io = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let q = d.queue(1).unwrap();
            io_loop(q, &stop)
        })
    };
    let mut r = Raw::new(&c);
    let t = Instant::now();
    let mut changes = 0;
    while t.elapsed() < Duration::from_secs(3) {
        let v = r.call(r#"{"jsonrpc":"2.0","id":1,"method":"ns.add","params":{"spec":"ram:1M","nsid":2}}"#);
        assert!(v["result"].is_object(), "{v}");
        let v = r.call(r#"{"jsonrpc":"2.0","id":2,"method":"ns.remove","params":{"nsid":2}}"#);
        assert!(v["result"].is_object(), "{v}");
        changes += 2;
    }
    stop.store(true, Ordering::Relaxed);
    let (ok, bad) = io.join().unwrap();
    assert!(ok > 0 && bad == 0, "I/O during {changes} namespace changes: {ok} verified, {bad} failed");
    server.assert_alive();
}

#[test]
fn workers_default_to_inline_mode_on_a_host_with_two_cpus_or_fewer() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    // The start-up line comes a moment after the socket appears.
    let s = Server::start_with(&["--ns", "ram:16M"]);
    if cpus <= 2 {
        assert!(s.log_shows("inline: no workers, the default with 2 usable CPUs or fewer"), "{}", s.log());
    } else {
        assert!(s.log_shows("(1 worker(s)"), "{}", s.log());
    }
    let s = Server::start_with(&["--ns", "ram:16M", "--workers", "0"]);
    assert!(s.log_shows("(inline: no workers, --poll"), "{}", s.log());
}

/// zone.fail: the operator fails a zone of a zoned namespace under a connected host,
/// as a medium would; writes to it, then reads, are refused with the ZNS statuses,
/// and the other zones go on. Bad requests are refused naming why.
#[test]
fn zone_fail_makes_a_zone_read_only_then_offline() {
    use nvme_spec::Status;
    let (mut server, c) = start(&["--ns", "ram:8M:zoned=1M", "--ns", "ram:4M"]);
    let mut d = server.driver(DoorbellMode::Trapped, common::opts(1, true, CompletionMode::Polling));
    let q = d.queue(1).unwrap();
    assert_eq!(write(q, 1, 2048, &[5; 4096]), Status::SUCCESS);
    let r = ctl(&c, &["zone.fail", "1", "2048", "read-only"]).unwrap();
    assert_eq!((r["state"].as_str(), r["changed"].as_bool()), (Some("read-only"), Some(true)), "{r}");
    assert_eq!(ctl(&c, &["zone.fail", "1", "2048", "read-only"]).unwrap()["changed"], false);
    assert_eq!(write(q, 1, 2048 + 8, &[6; 4096]).code(), Status::ZONE_IS_READ_ONLY);
    assert_eq!(read(q, 1, 2048), (Status::SUCCESS, vec![5; 4096]));
    ctl(&c, &["zone.fail", "1", "2048", "offline"]).unwrap();
    assert_eq!(read(q, 1, 2048).0.code(), Status::ZONE_IS_OFFLINE);
    assert_eq!(write(q, 1, 4096, &[7; 4096]), Status::SUCCESS, "the next zone goes on");
    for (args, why) in [
        (["zone.fail", "2", "0", "offline"], "not zoned"),
        (["zone.fail", "1", "2049", "offline"], "not the start of a zone"),
        (["zone.fail", "1", "2048", "read-only"], "offline"),
        (["zone.fail", "1", "99999999", "offline"], "has no LBA"),
        (["zone.fail", "1", "0", "full"], "unknown variant"),
    ] {
        let e = ctl(&c, &args).unwrap_err();
        assert!(e.contains(why), "{args:?}: {e}");
    }
    assert!(server.log().contains("zone failed by the operator"), "logged");
    drop(d);
    server.assert_alive();
}

/// ana.set and ana.get: a controller of a subsystem puts its namespaces' ANA
/// groups in the states the operator asks, and a host's commands to a group it
/// cannot reach now fail with the path error; a controller alone refuses, saying
/// why. Bad states and groups are refused naming why.
#[test]
fn ana_set_takes_a_path_out_of_service_and_back() {
    use nvme_spec::Status;
    let (mut server, c) = start(&["--ns", "ram:4M", "--ns", "ram:4M:ana=2", "--cntlid", "3"]);
    let mut d = server.driver(DoorbellMode::Trapped, common::opts(1, true, CompletionMode::Polling));
    let q = d.queue(1).unwrap();
    let g = ctl(&c, &["ana.get"]).unwrap();
    assert_eq!(
        g["groups"],
        serde_json::json!([
            {"group": 1, "state": "optimized", "nsids": [1]},
            {"group": 2, "state": "optimized", "nsids": [2]},
        ])
    );
    let r = ctl(&c, &["ana.set", "inaccessible", "2"]).unwrap();
    assert_eq!((r["state"].as_str(), r["changed"].clone()), (Some("inaccessible"), serde_json::json!([2])));
    assert_eq!(write(q, 2, 0, &[1; 4096]).code(), Status::ASYMMETRIC_ACCESS_INACCESSIBLE);
    assert_eq!(write(q, 1, 0, &[1; 4096]), Status::SUCCESS, "group 1 goes on");
    ctl(&c, &["ana.set", "optimized"]).unwrap();
    assert_eq!(write(q, 2, 0, &[2; 4096]), Status::SUCCESS);
    for (args, why) in [
        (&["ana.set", "sideways"][..], "unknown variant"),
        (&["ana.set", "optimized", "33"][..], "outside 1..=32"),
    ] {
        let e = ctl(&c, args).unwrap_err();
        assert!(e.contains(why), "{args:?}: {e}");
    }
    assert!(server.log().contains("ANA state set"), "logged");
    drop(d);
    server.assert_alive();
    let (_alone, c) = start(&["--ns", "ram:4M"]);
    let e = ctl(&c, &["ana.set", "inaccessible"]).unwrap_err();
    assert!(e.contains("--cntlid"), "{e}");
    assert_eq!(ctl(&c, &["ana.get"]).unwrap()["groups"], serde_json::json!([]));
}

/// The namespace pool from `vnvme ctl` (issue 31 item 4), two controllers of one
/// subsystem over one pool directory, sandboxed: what one makes and attaches, the
/// other serves (the same data, through the files the sandbox lets each open in
/// the pool alone); detach and delete follow on both; refusals say why.
#[test]
fn the_pool_makes_attaches_and_deletes_namespaces_across_controllers() {
    let pool = common::temp_dir("pool");
    let spec = format!("{}:32M", pool.display());
    let (mut s1, c1) = start(&["--ns", "ram:4M", "--cntlid", "1", "--pool", &spec]);
    let (mut s2, c2) = start(&["--ns", "ram:4M", "--cntlid", "2", "--pool", &spec]);
    let made = ctl(&c1, &["ns.create", "8M"]).unwrap();
    assert_eq!((made["nsid"].as_u64(), made["done"].as_str()), (Some(2), Some("created")));
    let info = ctl(&c2, &["pool.info"]).unwrap();
    assert_eq!((info["capacity"].as_u64(), info["unallocated"].as_u64()), (Some(32 << 20), Some(24 << 20)));
    assert_eq!(info["controllers"], serde_json::json!([1, 2]));
    let r = ctl(&c1, &["ns.attach", "2", "1,2"]).unwrap();
    assert_eq!(r["attached"], serde_json::json!([1, 2]));
    let listed = |c: &Path| -> Vec<u64> {
        let l = ctl(c, &["ns.list"]).unwrap();
        l["namespaces"].as_array().unwrap().iter().map(|n| n["nsid"].as_u64().unwrap()).collect()
    };
    assert_eq!(listed(&c1), [1, 2], "attached here at once");
    let deadline = Instant::now() + common::TIMEOUT;
    while listed(&c2) != [1, 2] {
        assert!(Instant::now() < deadline, "controller 2 never attached it:\n{}", s2.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    {
        let mut d1 = s1.driver(DoorbellMode::Trapped, common::opts(1, true, CompletionMode::Polling));
        let mut d2 = s2.driver(DoorbellMode::Trapped, common::opts(1, true, CompletionMode::Polling));
        let data = pattern(31, 4096);
        assert_eq!(write(d1.queue(1).unwrap(), 2, 16, &data), nvme_spec::Status::SUCCESS);
        let (st, back) = read(d2.queue(1).unwrap(), 2, 16);
        assert!(
            st == nvme_spec::Status::SUCCESS && back == data,
            "{st:?}: written through 1, read through 2"
        );
    }
    let e = ctl(&c1, &["ns.remove", "2"]).unwrap_err();
    assert!(e.contains("ns.detach"), "{e}");
    let e = ctl(&c1, &["ns.create", "1G"]).unwrap_err();
    assert!(e.contains("capacity"), "{e}");
    let e = ctl(&c1, &["ns.attach", "2", "2"]).unwrap_err();
    assert!(e.contains("already attached"), "{e}");
    let e = ctl(&c1, &["ns.delete", "1"]).unwrap_err();
    assert!(e.contains("operator's namespace"), "{e}");
    ctl(&c2, &["ns.detach", "2"]).unwrap();
    assert_eq!(listed(&c2), [1]);
    assert_eq!(ctl(&c1, &["pool.info"]).unwrap()["namespaces"][0]["attached"], serde_json::json!([1]));
    ctl(&c2, &["ns.delete", "2"]).unwrap();
    let left: Vec<_> =
        std::fs::read_dir(&pool).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    assert_eq!(left, ["pool.state"], "its data goes");
    while listed(&c1) != [1] {
        assert!(Instant::now() < deadline, "controller 1 kept it:\n{}", s1.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    s1.assert_alive();
    s2.assert_alive();
    // Controller 2 stops for good: controller 1's operator forgets it, and the
    // namespace attached to it is detached.
    ctl(&c1, &["ns.create", "4M"]).unwrap();
    ctl(&c1, &["ns.attach", "2", "1,2"]).unwrap();
    s2.kill_hard();
    let e = ctl(&c1, &["pool.forget", "1"]).unwrap_err();
    assert!(e.contains("this one"), "{e}");
    let f = ctl(&c1, &["pool.forget", "2"]).unwrap();
    assert_eq!((f["cntlid"].as_u64(), f["detached"].clone()), (Some(2), serde_json::json!([2])), "{f}");
    let info = ctl(&c1, &["pool.info"]).unwrap();
    assert_eq!(info["controllers"], serde_json::json!([1]));
    assert_eq!(info["namespaces"][0]["attached"], serde_json::json!([1]));
    let e = ctl(&c1, &["pool.forget", "2"]).unwrap_err();
    assert!(e.contains("no controller 2"), "{e}");
    let (_alone, c) = start(&["--ns", "ram:4M"]);
    let e = ctl(&c, &["pool.info"]).unwrap_err();
    assert!(e.contains("--pool"), "{e}");
    let e = ctl(&c, &["pool.forget", "3"]).unwrap_err();
    assert!(e.contains("--pool"), "{e}");
    let _ = std::fs::remove_dir_all(&pool);
}

/// Namespace Management from the host on a sandboxed server without a control
/// socket: the pool's files are made, opened and removed through the sandbox's
/// pool rules alone (openat and unlinkat by the pool directory's descriptor, in
/// the ways the pool opens them).
#[test]
fn the_host_makes_and_deletes_pool_namespaces_under_the_sandbox_alone() {
    use nvme_spec::opcode::admin as aop;
    let dir = common::temp_dir("pool-sandbox");
    let pool = dir.join("pool");
    let spec = format!("{}:16M", pool.display());
    let mut s = Server::start_in(&dir, "s", &["--ns", "ram:4M", "--pool", &spec]).owning_dir();
    let mut d = s.driver(DoorbellMode::Trapped, common::opts(1, true, CompletionMode::Polling));
    // An admin command: `opcode`, Select `sel`, `nsid`, with a 4 KiB data buffer.
    let admin = |d: &mut nvme_driver::NvmeDriver, opcode: u8, sel: u32, nsid: u32, data: Option<&[u8]>| {
        let mut sqe = nvme_spec::Sqe::with_opcode(opcode);
        sqe.nsid = zerocopy::little_endian::U32::new(nsid);
        sqe.cdw10 = zerocopy::little_endian::U32::new(sel);
        let buf = data.map(|b| {
            let buf = d.admin_buf(4096).unwrap();
            buf.write_at(0, b).unwrap();
            sqe.set_prps(buf.iova(), 0);
            buf
        });
        d.admin_command(sqe, buf).unwrap_or_else(|e| panic!("{e}"))
    };
    let mut id = vec![0u8; 4096];
    id[..8].copy_from_slice(&2048u64.to_le_bytes());
    id[8..16].copy_from_slice(&2048u64.to_le_bytes());
    let c = admin(&mut d, aop::NAMESPACE_MANAGEMENT, 0, 0, Some(&id));
    assert_eq!((c.status, c.dw0), (nvme_spec::Status::SUCCESS, 2), "created under the sandbox");
    let mut list = vec![0u8; 4096];
    list[..2].copy_from_slice(&1u16.to_le_bytes());
    let c = admin(&mut d, aop::NAMESPACE_ATTACHMENT, 0, 2, Some(&list));
    assert_eq!(c.status, nvme_spec::Status::SUCCESS, "attached to controller 0");
    // A new bring-up finds it (this driver learns namespaces at its start).
    drop(d);
    let mut d = s.driver(DoorbellMode::Trapped, common::opts(1, true, CompletionMode::Polling));
    let data = pattern(5, 4096);
    let q = d.queue(1).unwrap();
    assert_eq!(write(q, 2, 8, &data), nvme_spec::Status::SUCCESS, "its file opened under the sandbox");
    assert!(read(q, 2, 8).1 == data);
    assert_eq!(
        admin(&mut d, aop::NAMESPACE_MANAGEMENT, 1, 2, None).status,
        nvme_spec::Status::SUCCESS,
        "deleted"
    );
    let left: Vec<_> =
        std::fs::read_dir(&pool).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    assert_eq!(left, ["pool.state"], "its file removed under the sandbox");
    drop(d);
    s.assert_alive();
    assert!(s.log().contains("sandbox on") && !s.log().contains("--control"), "{}", s.log());
}
