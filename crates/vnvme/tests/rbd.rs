//! `vnvme serve` on Ceph RBD images, across processes, with the sandbox on, against a
//! real single-node cluster (scripts/ceph-cluster.sh: one monitor, one OSD on
//! memstore, cephx, the client a user with `profile rbd` caps): the userspace driver
//! writes at QD 16 on two workers, reads back, flushes, writes zeroes and
//! deallocates, and `rbd export` (Ceph's own tool) finds the data in the image; the
//! whole cluster stopped and started under a running vnvme is reconnected to (new
//! connections and threads under the sandbox); an image grown through the control
//! socket shows its new size; a missing image, a missing pool and an unreachable
//! cluster fail the start-up, naming what failed, within a bound; a cluster gone mid-run
//! makes commands fail Namespace Not Ready (not hang), and they succeed once it is back,
//! and a server stopped while it is gone ends within the hold's bounds; a snapshot is
//! served read-only.

mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{opts, temp_dir, Server};
use nvme_driver::{CompletionMode, DoorbellMode, IoCommand, IoQueue, LbaRange};
use test_servers::ceph::{cluster, Cluster};
use test_util::pattern;

/// One test at a time: one of them stops and starts the shared cluster.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Writes `n` blocks of 4 KiB at QD 16 from `first_lba` (every fifth FUA), then
/// reads them back.
fn write_read_verify(q: &mut IoQueue, first_lba: u64, n: u64, seed: u64) {
    let mut cids = std::collections::HashMap::new();
    for i in 0..n {
        let buf = q.alloc_buf(4096).unwrap();
        buf.write_at(0, &pattern(seed ^ i, 4096)).unwrap();
        let cid = q
            .submit(IoCommand::Write { nsid: 1, slba: first_lba + i * 8, nlb: 8, buf, fua: i % 5 == 0 })
            .unwrap();
        cids.insert(cid, i);
        if cids.len() == 16 || i == n - 1 {
            let mut done = Vec::new();
            while done.len() < cids.len() {
                q.wait_completions(&mut done).unwrap();
            }
            assert!(
                done.iter().all(|c| c.status.is_success()),
                "writes: {:?}",
                done.iter().map(|c| c.status).collect::<Vec<_>>()
            );
            cids.clear();
        }
    }
    let mut got = vec![0u8; 4096];
    for i in 0..n {
        q.read(1, first_lba + i * 8, &mut got).unwrap();
        assert!(got == pattern(seed ^ i, 4096), "block {i} reads back different");
    }
}

/// Starts the cluster when dropped (a test that stopped it may fail first).
struct StartOnDrop<'a>(&'a Cluster);

impl Drop for StartOnDrop<'_> {
    fn drop(&mut self) {
        self.0.start();
    }
}

fn start(ceph: &Cluster, dir: &std::path::Path, image: &str, extra: &[&str]) -> Server {
    let ns = ceph.ns(image);
    let mut args = vec!["--ns", ns.as_str()];
    args.extend_from_slice(extra);
    Server::start_in_env(dir, "s", &args, &ceph.env)
}

#[test]
fn io_on_an_rbd_image_with_two_workers_and_its_data_in_the_image() {
    let _one = serial();
    let Some(ceph) = cluster() else { return };
    let dir = temp_dir("rbd-io");
    ceph.create_image("io", "64M");
    let server = start(ceph, &dir, "io", &["--workers", "2"]);
    assert!(server.log_shows("sandbox on"), "{}", server.log());
    let mut d = server.driver(DoorbellMode::Trapped, opts(2, true, CompletionMode::Interrupts));
    let ns = d.namespaces()[0].clone();
    assert_eq!(ns.size_bytes(), 64 << 20, "the namespace has the image's size");
    let id = d.identify(0x01, 0).unwrap();
    let oncs = u16::from_le_bytes([id[520], id[521]]);
    let vwc = id[525];
    assert!(vwc & 1 == 1, "librbd's cache: a volatile write cache");
    assert!(oncs & nvme_spec::identify::oncs::WRITE_ZEROES != 0, "Ceph 16 has rbd_aio_write_zeroes");
    assert!(oncs & nvme_spec::identify::oncs::DSM != 0, "discard");
    write_read_verify(d.queue(1).unwrap(), 0, 64, 1);
    write_read_verify(d.queue(2).unwrap(), 8192, 64, 2);
    d.flush(1).expect("flush");
    // Write Zeroes over written blocks reads back zeroes; Deallocate completes.
    d.write_zeroes(1, 8, 16, false).expect("write zeroes");
    let mut got = vec![1u8; 8192];
    d.read(1, 8, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 0), "write zeroes read back non-zero");
    d.deallocate(1, &[LbaRange { slba: 8192 + 64 * 8, nlb: 64 }]).expect("deallocate");
    d.flush(1).expect("flush");
    // Ceph's own tool finds what the guest wrote: block 30 of the first pass.
    let img = ceph.read_image("io", 30 * 4096, 4096, &dir);
    assert!(img == pattern(1 ^ 30, 4096), "rbd export shows different data at block 30");
    drop(d);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cluster_restarted_under_a_running_server_is_reconnected_to_under_the_sandbox() {
    let _one = serial();
    let Some(ceph) = cluster() else { return };
    let dir = temp_dir("rbd-restart");
    ceph.create_image("restart", "32M");
    let server = start(ceph, &dir, "restart", &["--workers", "1"]);
    let mut d = server.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Interrupts));
    write_read_verify(d.queue(1).unwrap(), 0, 32, 3);
    d.flush(1).unwrap();
    // Monitor and OSD go away and come back (same addresses; the OSD keeps its
    // data): librados makes new connections, and maybe threads, under the filter.
    ceph.restart();
    let t = Instant::now();
    write_read_verify(d.queue(1).unwrap(), 4096, 32, 4);
    let mut got = vec![0u8; 4096];
    d.read(1, 0, &mut got).unwrap();
    assert!(got == pattern(3, 4096), "data written before the restart reads back different");
    eprintln!("I/O resumed {:?} after the cluster restarted", t.elapsed());
    assert!(!server.log().contains("panicked"), "{}", server.log());
    drop(d);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `vnvme ctl --control PATH ARGS...`: exit status and output.
fn ctl(path: &std::path::Path, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vnvme"))
        .arg("ctl")
        .arg("--control")
        .arg(path)
        .args(args)
        .output()
        .expect("run vnvme ctl");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[test]
fn an_image_grown_through_the_control_socket_and_one_added() {
    let _one = serial();
    let Some(ceph) = cluster() else { return };
    let dir = temp_dir("rbd-ctl");
    ceph.create_image("grow", "16M");
    ceph.create_image("added", "8M");
    let control = dir.join("c.sock");
    let server = start(ceph, &dir, "grow", &["--control", control.to_str().unwrap()]);
    while !control.exists() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let (ok, text) = ctl(&control, &["ns.resize", "1", "32M"]);
    assert!(ok, "ns.resize: {text}");
    let info = ceph.tool("rbd", &["info", "--format", "json", "rbd/grow"]);
    assert!(info.contains(&format!("\"size\":{}", 32u64 << 20)), "rbd info after the resize: {info}");
    // Another image, added under the sandbox (librados already runs).
    let (ok, text) = ctl(&control, &["ns.add", &ceph.ns("added")]);
    assert!(ok, "ns.add: {text}");
    let mut d = server.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Interrupts));
    let sizes: Vec<u64> = d.namespaces().iter().map(|n| n.size_bytes()).collect();
    assert_eq!(sizes, vec![32 << 20, 8 << 20], "namespace sizes");
    let data = pattern(5, 8192);
    d.write(2, 1000, &data).unwrap();
    let mut got = vec![0u8; 8192];
    d.read(2, 1000, &mut got).unwrap();
    assert!(got == data);
    drop(d);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `vnvme serve --ns SPEC` fails; returns its stderr. A start that neither fails
/// nor serves within a minute (a hang on a cluster that does not answer) fails the
/// test.
fn start_fails(ceph: &Cluster, spec: &str) -> String {
    let dir = temp_dir("rbd-fail");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vnvme"));
    cmd.args(["serve", "--socket"])
        .arg(dir.join("s.sock"))
        .args(["--ns", spec])
        .envs(ceph.env.iter().map(|(k, v)| (k, v)));
    let out = common::output_within(&mut cmd, Duration::from_secs(60));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success(), "vnvme serve --ns {spec} started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_missing_image_pool_or_cluster_fails_the_start_naming_it() {
    let _one = serial();
    let Some(ceph) = cluster() else { return };
    let err = start_fails(ceph, &ceph.ns("nobody"));
    assert!(err.contains("no image \"nobody\" in pool \"rbd\""), "{err}");
    let err = start_fails(ceph, &ceph.ns("x").replacen("rbd:rbd/", "rbd:nopool/", 1));
    assert!(err.contains("no pool named \"nopool\""), "{err}");
    let err = start_fails(ceph, &format!("{}:keyring=/nonexistent/keyring", ceph.ns("x")));
    assert!(err.contains("cannot connect") || err.contains("keyring"), "{err}");
    // A configuration naming a monitor nobody listens on: an error at the connect
    // bound (10 s), not a hang.
    let dir = temp_dir("rbd-nomon");
    let conf = dir.join("ceph.conf");
    std::fs::write(&conf, "[global]\nmon_host = 127.0.0.1:9\nauth_client_required = cephx\n").unwrap();
    let spec = format!("rbd:rbd/x:conf={}:keyring={}", conf.display(), ceph.keyring().display());
    let err = start_fails(ceph, &spec);
    assert!(err.contains("cannot connect to the Ceph cluster as client.admin"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cluster_gone_mid_run_is_namespace_not_ready_then_serves_again() {
    let _one = serial();
    let Some(ceph) = cluster() else { return };
    let dir = temp_dir("rbd-gone");
    ceph.create_image("gone", "16M");
    // An 8 s command timeout and a 2 s hold: librados gives up after 2 s
    // (rados_osd_op_timeout), Namespace Not Ready before the timeout.
    let ns = format!("{}:timeout=8s:hold=2s", ceph.ns("gone"));
    let server = Server::start_in_env(&dir, "s", &["--ns", &ns, "--workers", "1"], &ceph.env);
    let mut d = server.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Interrupts));
    let data = pattern(11, 8192);
    d.write(1, 100, &data).unwrap();
    d.flush(1).unwrap();
    ceph.stop();
    // Whatever happens below, the cluster is started again for the other tests.
    let back = StartOnDrop(ceph);
    let mut got = vec![0u8; 8192];
    // A write to blocks never written (librbd may take it into its cache) and a
    // flush: one of them must reach the cluster, and fails Not Ready.
    let failed = d.write(1, 20000, &data).and_then(|()| d.flush(1));
    match failed {
        Err(nvme_driver::DriverError::Nvme { status, .. }) => assert_eq!(
            status.code(),
            nvme_spec::Status::NAMESPACE_NOT_READY.code(),
            "{status:?}\n{}",
            server.log()
        ),
        other => panic!("a write and flush with the cluster gone: {other:?}\n{}", server.log()),
    }
    drop(back);
    let t = Instant::now();
    loop {
        match d.read(1, 100, &mut got) {
            Ok(()) => break,
            Err(e) => {
                assert!(t.elapsed() < Duration::from_secs(60), "never came back: {e}\n{}", server.log())
            }
        }
    }
    assert!(got == data, "data flushed before the outage reads back different");
    // Stopped while the cluster is gone: closing the image cannot release its lock,
    // and librados gives up after the hold, so the server still ends, and says why
    // it took a while.
    ceph.stop();
    let back = StartOnDrop(ceph);
    assert!(
        d.write(1, 30000, &data).and_then(|()| d.flush(1)).is_err(),
        "a write and flush with the cluster gone"
    );
    drop(d);
    let mut server = server;
    let t = Instant::now();
    server.signal(libc::SIGTERM);
    let status = server.wait_exit();
    let took = t.elapsed();
    assert!(
        status.is_some_and(|s| s.success()),
        "SIGTERM with the cluster gone: {status:?}\n{}",
        server.log()
    );
    assert!(took < Duration::from_secs(20), "SIGTERM with the cluster gone: ended after {took:?}");
    assert!(
        server.log().contains("closing the image while the cluster is gone"),
        "no word of the slow close:\n{}",
        server.log()
    );
    drop(back);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_snapshot_is_served_read_only() {
    let _one = serial();
    let Some(ceph) = cluster() else { return };
    let dir = temp_dir("rbd-snap");
    // An image with known data (imported by Ceph's tool: no client of ours holds
    // the image's lock when the snapshot is taken), then its snapshot.
    let mut img = vec![0u8; 16 << 20];
    img[64 * 512..64 * 512 + 4096].copy_from_slice(&pattern(21, 4096));
    let file = dir.join("snapped.raw");
    std::fs::write(&file, &img).unwrap();
    ceph.create_image("snapped", "16M");
    ceph.tool("rbd", &["rm", "--no-progress", "rbd/snapped"]);
    ceph.tool("rbd", &["import", "--no-progress", file.to_str().unwrap(), "rbd/snapped"]);
    ceph.tool("rbd", &["snap", "create", "rbd/snapped@base"]);
    let ns = ceph.ns("snapped").replacen("rbd/snapped", "rbd/snapped@base", 1);
    let server = Server::start_in_env(&dir, "snap", &["--ns", &ns], &ceph.env);
    let mut d = server.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Interrupts));
    let mut got = vec![0u8; 4096];
    d.read(1, 64, &mut got).unwrap();
    assert!(got == pattern(21, 4096), "the snapshot reads back different");
    let id = d.identify(0x01, 0).unwrap();
    let oncs = u16::from_le_bytes([id[520], id[521]]);
    assert_eq!(oncs & nvme_spec::identify::oncs::DSM, 0, "no deallocate on a snapshot");
    match d.write(1, 64, &pattern(22, 4096)) {
        Err(nvme_driver::DriverError::Nvme { status, .. }) => {
            assert_eq!(status.code(), nvme_spec::Status::NAMESPACE_WRITE_PROTECTED.code(), "{status:?}")
        }
        other => panic!("a write to a snapshot: {other:?}"),
    }
    drop(d);
    drop(server);
    ceph.tool("rbd", &["snap", "purge", "rbd/snapped"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// issue 27: an OSD that stops answering for 4 s (SIGSTOPped, as a stalled OSD or
/// one being failed over does) under a write and a flush. With a hold longer than
/// the stall (8 s) they wait and succeed: librados is told to wait as long as the
/// hold. With a hold shorter than the stall (1 s) the flush fails Namespace Not
/// Ready when the hold runs out, not when the stall ends, and the namespace
/// serves again afterwards.
#[test]
fn a_stalled_osd_is_waited_for_within_the_hold() {
    let _one = serial();
    let Some(ceph) = cluster() else { return };
    let dir = temp_dir("rbd-stall");
    for (hold, waits) in [("8s", true), ("1s", false)] {
        let image = format!("stall{}", hold.trim_end_matches('s'));
        ceph.create_image(&image, "16M");
        let ns = format!("{}:timeout=12s:hold={hold}", ceph.ns(&image));
        let control = dir.join(format!("c{hold}.sock"));
        let server = Server::start_in_env(
            &dir,
            &format!("s{hold}"),
            &["--ns", &ns, "--workers", "1", "--control", control.to_str().unwrap()],
            &ceph.env,
        );
        while !control.exists() {
            std::thread::sleep(Duration::from_millis(10));
        }
        let storage = || -> serde_json::Value {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_vnvme"))
                .args(["ctl", "--control", control.to_str().unwrap(), "--json", "stats.get"])
                .output()
                .expect("vnvme ctl");
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stats.get answers JSON");
            v["namespaces"][0]["storage"].clone()
        };
        let mut d = server.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Interrupts));
        let data = pattern(13, 8192);
        d.write(1, 100, &data).unwrap();
        d.flush(1).unwrap();
        assert_eq!(storage()["state"], "up");
        let resume = ceph.pause_osd(Duration::from_secs(4));
        let t = Instant::now();
        let writer = std::thread::spawn(move || {
            let r = d.write(1, 200, &pattern(13, 8192)).and_then(|()| d.flush(1));
            (r, t.elapsed(), d)
        });
        if waits {
            // Past the stall bound (1 s) the namespace shows it waits.
            std::thread::sleep(Duration::from_millis(2500));
            let s = storage();
            assert!(
                s["state"] == "waiting" && s["waiting"].as_u64() >= Some(1),
                "hold={hold}: during the stall: {s}"
            );
        }
        let (r, took, mut d) = writer.join().unwrap();
        resume.join().unwrap();
        if waits {
            assert!(
                r.is_ok(),
                "hold={hold}: a write and flush through a 4 s OSD stall: {r:?}\n{}",
                server.log()
            );
            assert!(
                took >= Duration::from_secs(3),
                "hold={hold}: done in {took:?}, before the OSD answered again"
            );
            let s = storage();
            assert_eq!((s["state"].as_str(), s["outages_past_hold"].as_u64()), (Some("up"), Some(0)), "{s}");
            assert!(s["outages"].as_u64() >= Some(1) && s["outage_s"].as_f64() >= Some(3.0), "{s}");
        } else {
            match r {
                Err(nvme_driver::DriverError::Nvme { status, .. }) => assert_eq!(
                    status.code(),
                    nvme_spec::Status::NAMESPACE_NOT_READY.code(),
                    "{status:?}\n{}",
                    server.log()
                ),
                other => panic!(
                    "hold={hold}: a write and flush through a 4 s OSD stall: {other:?}\n{}",
                    server.log()
                ),
            }
            assert!(
                took < Duration::from_millis(3500),
                "hold={hold}: failed after {took:?}, not at the hold"
            );
            let s = storage();
            assert!(s["outages_past_hold"].as_u64() >= Some(1), "hold={hold}: {s}");
        }
        let mut got = vec![0u8; 8192];
        let t = Instant::now();
        while let Err(e) = d.read(1, 100, &mut got) {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "hold={hold}: the namespace never served again: {e}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(got == data, "hold={hold}: data written before the stall reads back different");
        // Idle past the stall bound: nothing waits, nothing is counted as waiting.
        std::thread::sleep(Duration::from_millis(1500));
        let s = storage();
        assert_eq!(
            (s["state"].as_str(), s["waiting"].as_u64()),
            (Some("up"), Some(0)),
            "hold={hold}: idle: {s}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
