//! Real NBD servers for tests: qemu-nbd (serving a qcow2 image) and nbdkit's memory
//! plugin, from Debian (scripts/fetch-nbd-servers.sh fetches and caches them). Each
//! server is a child process on a UNIX socket, killed when dropped. Without them (no
//! network for the fetch) [`servers`] reports a loud skip and returns None.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use test_util::skip;

/// The servers' bin directory (qemu-nbd, qemu-img, nbdkit), fetched once per
/// process; None, with the calling test's skip reported, when they cannot be had.
pub fn servers() -> Option<PathBuf> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/fetch-nbd-servers.sh");
        let out = Command::new("bash")
            .arg(script)
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| format!("nbd: cannot run {script}: {e}"))?;
        if !out.status.success() {
            let why = String::from_utf8_lossy(&out.stderr);
            return Err(format!(
                "nbd: qemu-nbd and nbdkit could not be fetched ({}): not tested against real NBD servers",
                why.lines().last().unwrap_or("no reason given")
            ));
        }
        // The script's standard output is the directory alone (its tools print to
        // stderr); the last line, should anything else ever get there.
        let stdout = String::from_utf8_lossy(&out.stdout);
        Ok(PathBuf::from(stdout.lines().last().unwrap_or_default().trim()))
    });
    match dir {
        Ok(d) => Some(d.clone()),
        Err(why) => {
            skip(why);
            None
        }
    }
}

/// A server process on a UNIX socket, killed on drop.
#[derive(Debug)]
pub struct NbdServer {
    child: Child,
    pub socket: PathBuf,
}

impl NbdServer {
    /// The URI of its default export.
    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    fn started(mut child: Child, socket: PathBuf) -> NbdServer {
        let t = Instant::now();
        while !socket.exists() {
            if let Ok(Some(st)) = child.try_wait() {
                panic!("the NBD server exited ({st}) before its socket appeared");
            }
            assert!(t.elapsed() < Duration::from_secs(20), "no socket at {}", socket.display());
            std::thread::sleep(Duration::from_millis(20));
        }
        NbdServer { child, socket }
    }

    /// nbdkit's memory plugin of `size` ("64M") on `socket`.
    pub fn nbdkit_memory(bin: &Path, socket: &Path, size: &str) -> NbdServer {
        let _ = std::fs::remove_file(socket);
        let child = Command::new(bin.join("nbdkit"))
            .args(["--foreground", "--exit-with-parent", "--unix"])
            .arg(socket)
            .arg(bin.join("../plugins/nbdkit-memory-plugin.so"))
            .arg(format!("size={size}"))
            .stdin(Stdio::null())
            .spawn()
            .expect("start nbdkit");
        Self::started(child, socket.to_path_buf())
    }

    /// qemu-nbd serving the qcow2 image `img` on `socket`, up to 8 clients, staying
    /// up when they leave.
    pub fn qemu_nbd(bin: &Path, img: &Path, socket: &Path) -> NbdServer {
        let _ = std::fs::remove_file(socket);
        let child = Command::new(bin.join("qemu-nbd"))
            .args(["--format", "qcow2", "--shared", "8", "--persistent", "--socket"])
            .arg(socket)
            .arg(img)
            .stdin(Stdio::null())
            .spawn()
            .expect("start qemu-nbd");
        Self::started(child, socket.to_path_buf())
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Creates a qcow2 image of `size` ("64M") at `img`.
pub fn qcow2(bin: &Path, img: &Path, size: &str) {
    let st = Command::new(bin.join("qemu-img"))
        .args(["create", "-q", "-f", "qcow2"])
        .arg(img)
        .arg(size)
        .status()
        .expect("run qemu-img");
    assert!(st.success(), "qemu-img create failed");
}
