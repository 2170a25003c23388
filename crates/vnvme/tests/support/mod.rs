//! Shared by the cross-process tests: a `vnvme serve` child in a temporary directory,
//! a driver connected to it, and deterministic data.
#![allow(dead_code)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nvme_driver::{DoorbellMode, DriverOptions, NvmeDriver, VfioUserOptions, VfioUserTransport};

pub const TIMEOUT: Duration = Duration::from_secs(20);

/// A fresh temporary directory for one test (removed by [`Server`] unless kept).
pub fn temp_dir(tag: &str) -> PathBuf {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "vnvme-{tag}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temporary directory");
    dir
}

/// A `vnvme serve` child with a stats file. Killed on drop.
pub struct Server {
    pub child: Child,
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub stats: PathBuf,
    /// Remove `dir` on drop.
    pub owns_dir: bool,
    log_name: String,
}

impl Server {
    /// Starts a server in its own new directory (removed on drop), on `ram:64M`
    /// unless `extra` names namespaces.
    pub fn start(extra: &[&str]) -> Server {
        let mut s = Server::start_in(&temp_dir("driver"), "s", extra);
        s.owns_dir = true;
        s
    }

    /// Starts a server in `dir` (kept on drop), with socket, stats and log files
    /// named after `name`.
    pub fn start_in(dir: &Path, name: &str, extra: &[&str]) -> Server {
        let socket = dir.join(format!("{name}.sock"));
        let stats = dir.join(format!("{name}-stats.json"));
        let log_name = format!("{name}.log");
        let log = File::create(dir.join(&log_name)).expect("server log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vnvme"));
        cmd.args(["--log", "info", "serve", "--socket"]).arg(&socket).arg("--stats-file").arg(&stats);
        if !extra.contains(&"--ns") {
            cmd.args(["--ns", "ram:64M"]);
        }
        let child = cmd
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn vnvme serve");
        let mut s = Server { child, dir: dir.to_path_buf(), socket, stats, owns_dir: false, log_name };
        let deadline = Instant::now() + TIMEOUT;
        while !s.socket.exists() {
            if let Some(st) = s.child.try_wait().expect("wait") {
                panic!("vnvme serve exited early ({st}):\n{}", s.log());
            }
            assert!(Instant::now() < deadline, "no socket within {TIMEOUT:?}:\n{}", s.log());
            std::thread::sleep(Duration::from_millis(10));
        }
        s
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join(&self.log_name)).unwrap_or_default()
    }

    pub fn driver(&self, doorbells: DoorbellMode, opts: DriverOptions) -> NvmeDriver {
        let t = VfioUserTransport::connect(
            &self.socket,
            VfioUserOptions { doorbells, socket_timeout: Some(TIMEOUT) },
        )
        .unwrap_or_else(|e| panic!("connect: {e}\n{}", self.log()));
        NvmeDriver::new(Box::new(t), opts).unwrap_or_else(|e| panic!("bring-up: {e}\n{}", self.log()))
    }

    /// The server's counters once its I/O command count has reached `io_commands`
    /// (the stats file is rewritten twice a second; the wait is bounded).
    pub fn stats_after(&self, io_commands: u64) -> serde_json::Value {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Ok(s) = std::fs::read_to_string(&self.stats) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&s) {
                    if v["io_commands"].as_u64().unwrap_or(0) >= io_commands {
                        return v;
                    }
                }
            }
            assert!(Instant::now() < deadline, "server stats never reached {io_commands} I/O commands");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL, now: no shutdown, no flush, no chance to finish anything.
    pub fn kill_hard(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("---- vnvme serve log ({}) ----\n{}", self.log_name, self.log());
        }
        if self.owns_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Deterministic pseudo-random bytes (xorshift64*).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        v.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Driver options for tests: `io_queues` pairs of 128 entries, bounded waits.
pub fn opts(io_queues: u16, shadow: bool, completion: nvme_driver::CompletionMode) -> DriverOptions {
    DriverOptions {
        io_queues,
        queue_size: 128,
        shadow_doorbells: shadow,
        completion,
        pool_bytes: 16 << 20,
        timeout: TIMEOUT,
    }
}
