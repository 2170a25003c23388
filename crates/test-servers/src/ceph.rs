//! A real Ceph cluster for tests: one monitor and one OSD (memstore) from Debian's
//! packages, started by scripts/ceph-cluster.sh in a private directory.
//!
//! [`cluster`] uses the cluster scripts/test.sh started (its directory in
//! `VNVME_TEST_CEPH_DIR`) or starts one for this test process, which a watcher stops
//! once the process has exited. Without Ceph (no network for the fetch) it reports a loud skip and
//! returns None.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use test_util::skip;

/// Set by scripts/test.sh: the directory of a running test cluster to share.
pub const CLUSTER_ENV: &str = "VNVME_TEST_CEPH_DIR";

/// The tools give up on a cluster that does not answer (librados waits 300 s to
/// authenticate, and forever for an OSD, by default).
const BOUNDED: &str = "--client_mount_timeout=20 --rados_mon_op_timeout=20 --rados_osd_op_timeout=30";

/// A running cluster and how to reach it.
#[derive(Debug)]
pub struct Cluster {
    /// The cluster's directory (ceph.conf, keyrings).
    pub dir: PathBuf,
    /// The Ceph tools (rbd, rados, ceph), acting as client.admin.
    pub bin: PathBuf,
    /// What a process that loads librbd needs in its environment (VNVME_LIBRBD,
    /// LD_LIBRARY_PATH): pass it to `vnvme serve`.
    pub env: Vec<(String, String)>,
    /// Started by this process (stopped once it has exited).
    pub owned: bool,
}

fn script(name: &str) -> String {
    format!("{}/../../scripts/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// The test cluster, started once per process; None, with the calling test's skip
/// reported, when Ceph cannot be had or started.
pub fn cluster() -> Option<&'static Cluster> {
    static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
    match CLUSTER.get_or_init(start) {
        Ok(c) => Some(c),
        Err(why) => {
            skip(why);
            None
        }
    }
}

fn start() -> Result<Cluster, String> {
    let fail = |what: &str, out: &std::process::Output| {
        let why = String::from_utf8_lossy(&out.stderr);
        format!(
            "rbd: {what} ({}): not tested against a real Ceph cluster",
            why.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no reason given")
        )
    };
    let run =
        |what: &str, cmd: &mut Command| cmd.output().map_err(|e| format!("rbd: cannot run {what}: {e}"));
    let out = run("fetch-ceph.sh", Command::new("bash").arg(script("fetch-ceph.sh")).stderr(Stdio::piped()))?;
    if !out.status.success() {
        return Err(fail("Ceph could not be fetched", &out));
    }
    // The script's standard output is the directory alone; the last line, should
    // anything else ever get there.
    let bin = PathBuf::from(String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().trim());
    // What env.sh exports for a process that loads librbd.
    let out = run(
        "env.sh",
        Command::new("bash")
            .arg("-c")
            .arg(r#"source "$1" && printf '%s\n%s\n' "$VNVME_LIBRBD" "$LD_LIBRARY_PATH""#)
            .arg("-")
            .arg(bin.join("../env.sh")),
    )?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines();
    let env = vec![
        ("VNVME_LIBRBD".to_string(), lines.next().unwrap_or_default().to_string()),
        ("LD_LIBRARY_PATH".to_string(), lines.next().unwrap_or_default().to_string()),
    ];
    let (dir, owned) = match std::env::var_os(CLUSTER_ENV) {
        Some(d) => (PathBuf::from(d), false),
        None => (std::env::temp_dir().join(format!("vnvme-ceph-{}", std::process::id())), true),
    };
    let out = run(
        "ceph-cluster.sh",
        Command::new("bash")
            .arg(script("ceph-cluster.sh"))
            .arg("start")
            .arg(&dir)
            .stderr(Stdio::piped())
            .stdout(Stdio::null()),
    )?;
    if !out.status.success() {
        return Err(fail(&format!("the test cluster did not start in {}", dir.display()), &out));
    }
    if owned {
        // A watcher stops the cluster and removes its directory once this process
        // is gone, however it ends.
        let _ = Command::new("bash")
            .arg("-c")
            .arg(r#"while kill -0 "$1" 2>/dev/null; do sleep 1; done; bash "$2" stop "$3" >/dev/null 2>&1; rm -rf "$3""#)
            .arg("-")
            .arg(std::process::id().to_string())
            .arg(script("ceph-cluster.sh"))
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
    }
    Ok(Cluster { dir, bin, env, owned })
}

impl Cluster {
    /// Runs one of the Ceph tools as client.admin; panics with its output if it fails.
    pub fn tool(&self, tool: &str, args: &[&str]) -> String {
        let out = Command::new(self.bin.join(tool))
            .args(args)
            .env("CEPH_CONF", self.dir.join("ceph.conf"))
            .env("CEPH_ARGS", BOUNDED)
            .output()
            .unwrap_or_else(|e| panic!("run {tool}: {e}"));
        assert!(
            out.status.success(),
            "{tool} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Stops the whole cluster (monitor and OSD; the OSD saves its data) and starts
    /// it again on the same addresses.
    pub fn restart(&self) {
        self.stop();
        self.start();
    }

    /// Stops the monitor and the OSD (which saves its data).
    pub fn stop(&self) {
        self.run("stop");
    }

    /// Starts them again (same addresses), waiting until I/O works.
    pub fn start(&self) {
        self.run("start");
    }

    /// Stops the OSD answering for `d` (SIGSTOP, then SIGCONT: an OSD that stalls,
    /// as one being failed over does), from a thread of its own; join it to wait.
    pub fn pause_osd(&self, d: std::time::Duration) -> std::thread::JoinHandle<()> {
        let pid = std::fs::read_to_string(self.dir.join("run/osd.0.pid")).expect("osd.0 runs");
        let pid = pid.trim().to_string();
        let signal = |sig: &str| {
            let ok = Command::new("kill").args([sig, &pid]).status().is_ok_and(|s| s.success());
            assert!(ok, "kill {sig} {pid} (osd.0)");
        };
        signal("-STOP");
        std::thread::spawn(move || {
            std::thread::sleep(d);
            let ok = Command::new("kill").args(["-CONT", &pid]).status().is_ok_and(|s| s.success());
            assert!(ok, "kill -CONT {pid} (osd.0)");
        })
    }

    fn run(&self, cmd: &str) {
        let out = Command::new("bash")
            .arg(script("ceph-cluster.sh"))
            .arg(cmd)
            .arg(&self.dir)
            .output()
            .unwrap_or_else(|e| panic!("ceph-cluster.sh {cmd}: {e}"));
        assert!(out.status.success(), "ceph-cluster.sh {cmd}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Creates image `name` of `size` ("64M") in pool rbd, replacing one of that name.
    pub fn create_image(&self, name: &str, size: &str) {
        let _ = Command::new(self.bin.join("rbd"))
            .args(["rm", "--no-progress", &format!("rbd/{name}")])
            .env("CEPH_CONF", self.dir.join("ceph.conf"))
            .env("CEPH_ARGS", BOUNDED)
            .output();
        self.tool("rbd", &["create", "--size", size, &format!("rbd/{name}")]);
    }

    /// The `--ns` spec of image `name` in pool rbd, as the restricted user
    /// client.vnvme (caps: profile rbd).
    pub fn ns(&self, name: &str) -> String {
        format!(
            "rbd:rbd/{name}:conf={}:id=vnvme:keyring={}",
            self.dir.join("ceph.conf").display(),
            self.keyring().display()
        )
    }

    pub fn keyring(&self) -> PathBuf {
        self.dir.join("ceph.client.vnvme.keyring")
    }

    /// Reads `len` bytes at `offset` of image `name` through the rbd tool (export).
    pub fn read_image(&self, name: &str, offset: u64, len: usize, scratch: &Path) -> Vec<u8> {
        let file = scratch.join(format!("{name}.export"));
        let _ = std::fs::remove_file(&file);
        self.tool("rbd", &["export", "--no-progress", &format!("rbd/{name}"), file.to_str().unwrap()]);
        let all = std::fs::read(&file).expect("read the export");
        let _ = std::fs::remove_file(&file);
        all[offset as usize..offset as usize + len].to_vec()
    }
}
