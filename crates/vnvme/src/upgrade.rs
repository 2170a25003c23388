//! Upgrading a running server under its guest (docs/UPGRADE.md).
//!
//! `vnvme ctl upgrade` starts `vnvme takeover --control PATH` (by default the
//! binary the server was started from, so a replaced binary is picked up), which:
//!
//! 1. asks the running server for its configuration (`upgrade.prepare`: its
//!    original arguments, every namespace's `--ns` text by NSID, QoS groups, the
//!    log filter) and opens the namespaces' backends (files, NBD, RBD: whatever
//!    may take time), while the old process still serves;
//! 2. asks it to hand over (`upgrade.handover`, on a connection of its own): the
//!    old process quiesces the controller and sends the device's state and
//!    descriptors (`vfio_user_server::handover`), adding the RAM namespaces'
//!    memory, the control and metrics listeners and its stderr;
//! 3. builds the controller over the same namespaces, restores the device, says
//!    READY, and once the old process answers GO (it exits, touching nothing),
//!    serves the very connection the VMM has open.
//!
//! A failure anywhere before GO leaves the old process serving; the new one exits
//! with the reason on the terminal of `vnvme ctl upgrade`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvme_ctrl::qos::QosGroup;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use vfio_user_server::handover::{self, HandoverRequest};

use crate::control::{code, RpcError};
use crate::handed::{push, saved_namespaces, GroupSaved, NsSaved};

/// What `upgrade.prepare` and `upgrade.handover` read of the running server.
pub struct Running<'a> {
    pub jobs: &'a vfio_user_server::jobs::DeviceJobs,
    /// The `--ns` text each namespace was made from, by NSID.
    pub specs: &'a std::sync::Mutex<BTreeMap<u32, String>>,
    /// Named QoS groups.
    pub groups: &'a std::sync::Mutex<BTreeMap<String, Arc<QosGroup>>>,
    pub source: &'a Source,
}

/// How long the old process may take to quiesce (commands in flight finish).
pub const QUIESCE_LIMIT: Duration = Duration::from_secs(5);

/// What a running server keeps so that it can hand itself over.
#[derive(Debug)]
pub struct Source {
    /// The arguments the server was first started with (carried through upgrades).
    pub argv: Vec<String>,
    /// The binary it was started from (a later upgrade's default).
    pub exe: PathBuf,
    pub control: Option<UnixListener>,
    pub metrics: Option<OwnedFd>,
}

/// The configuration `upgrade.prepare` answers with.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Prepared {
    pub argv: Vec<String>,
    pub exe: PathBuf,
    /// NSID -> the `--ns` text.
    pub namespaces: BTreeMap<u32, String>,
    pub groups: Vec<GroupSaved>,
    pub log_filter: String,
    pub pid: u32,
}

/// What vnvme adds to the device's hand-over (`DeviceSaved::extra`). Descriptors
/// are indexes into `DeviceSaved::extra_fds`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Extra {
    pub prepared: Prepared,
    pub namespaces: Vec<NsSaved>,
    pub control: Option<usize>,
    pub metrics: Option<usize>,
    pub stderr: usize,
    /// The keeper of the process handing over (`--restart-on-crash`): the new
    /// process reports to it.
    #[serde(default)]
    pub keeper: Option<crate::keeper::Link>,
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `upgrade.prepare`: what a new process needs to open before it takes over.
pub fn prepare(r: &Running<'_>) -> Result<Value, RpcError> {
    let namespaces = lock(r.specs).clone();
    if let Some((nsid, spec)) = namespaces.iter().find(|(_, s)| s.starts_with("nvme://")) {
        return Err(RpcError::new(
            code::NOT_PERMITTED,
            format!(
                "namespace {nsid} ({spec}) is an nvme:// downstream, whose controller serves one client: it \
                 cannot be handed to a new process (remove it first)"
            ),
        ));
    }
    let groups = lock(r.groups).values().map(|g| GroupSaved::from(&**g)).collect();
    let p = Prepared {
        argv: r.source.argv.clone(),
        exe: r.source.exe.clone(),
        namespaces,
        groups,
        log_filter: crate::logging::filter(),
        pid: std::process::id(),
    };
    serde_json::to_value(p).map_err(|e| RpcError::new(code::INTERNAL_ERROR, e.to_string()))
}

/// `upgrade.handover` on `stream` (the new process's connection, taken from the
/// control server): hands the device over, or tells the new process why not.
/// Waits for the outcome; true once handed over (the caller, the control thread,
/// must not accept again: the listener is the new process's).
pub fn hand_over(r: &Running<'_>, stream: UnixStream, params: &Value) -> bool {
    match start_hand_over(r, &stream, params) {
        // Bounded by the job, the quiesce and the wait for the new process.
        Ok(done) => done
            .recv_timeout(crate::control::JOB_LIMIT + QUIESCE_LIMIT + handover::READY_WAIT)
            .unwrap_or(false),
        Err(why) => {
            tracing::warn!(target: "vnvme::upgrade", "upgrade refused: {why}");
            handover::refuse(stream, &why);
            false
        }
    }
}

fn start_hand_over(
    r: &Running<'_>,
    stream: &UnixStream,
    params: &Value,
) -> Result<std::sync::mpsc::Receiver<bool>, String> {
    let expect: Prepared = serde_json::from_value(params.get("prepared").cloned().unwrap_or(Value::Null))
        .map_err(|e| format!("upgrade.handover needs what upgrade.prepare answered: {e}"))?;
    let now: Prepared =
        serde_json::from_value(prepare(r).map_err(|e| e.message)?).map_err(|e| e.to_string())?;
    if now.namespaces != expect.namespaces {
        return Err("the namespaces changed since upgrade.prepare: try again".into());
    }
    let stream = stream.try_clone().map_err(|e| e.to_string())?;
    vfio_user_server::fds::set_blocking(&stream, true).map_err(|e| e.to_string())?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    let stderr = push(&mut fds, std::io::stderr().as_fd().try_clone_to_owned().map_err(|e| e.to_string())?);
    let control = match &r.source.control {
        Some(l) => Some(push(&mut fds, l.try_clone().map_err(|e| e.to_string())?.into())),
        None => None,
    };
    let metrics = match &r.source.metrics {
        Some(m) => Some(push(&mut fds, m.try_clone().map_err(|e| e.to_string())?)),
        None => None,
    };
    let specs = now.namespaces.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let r = r.jobs.run(crate::control::JOB_LIMIT, move |d| -> Result<(), String> {
        let namespaces = saved_namespaces(d, &specs, &mut fds, |_| true)?;
        let keeper = crate::keeper::link().cloned();
        let extra = Extra { prepared: now, namespaces, control, metrics, stderr, keeper };
        let extra = serde_json::to_value(extra).map_err(|e| e.to_string())?;
        d.request_handover(HandoverRequest {
            stream,
            extra,
            extra_fds: fds,
            quiesce: QUIESCE_LIMIT,
            done: Some(tx),
        });
        Ok(())
    });
    r.map_err(|e| e.to_string())??;
    Ok(rx)
}

/// `vnvme takeover`'s arguments.
#[derive(Debug, clap::Args)]
pub struct TakeoverArgs {
    /// The running server's control socket.
    #[arg(long)]
    pub control: PathBuf,
}

/// One JSON-RPC request on a new connection; the connection is returned (for the
/// answer, or a hand-over).
fn call(path: &Path, method: &str, params: Value) -> Result<UnixStream, String> {
    let stream =
        UnixStream::connect(path).map_err(|e| format!("cannot connect to {}: {e}", path.display()))?;
    stream.set_read_timeout(Some(Duration::from_secs(15))).map_err(|e| e.to_string())?;
    let req = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
    (&stream).write_all(format!("{req}\n").as_bytes()).map_err(|e| format!("{method}: {e}"))?;
    Ok(stream)
}

/// The server side of `vnvme takeover` up to serving: what the old process said.
pub struct Taken {
    pub prepared: Prepared,
    pub handover: handover::Handover,
    pub extra: Extra,
}

/// Step 1: the running server's configuration.
pub fn ask_prepare(control: &Path) -> Result<Prepared, String> {
    let stream = call(control, "upgrade.prepare", Value::Null)?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line).map_err(|e| format!("upgrade.prepare: {e}"))?;
    if line.is_empty() {
        return Err(
            "upgrade.prepare: the running server closed the connection without an answer (it died?)".into()
        );
    }
    let v: Value = serde_json::from_str(&line).map_err(|e| format!("upgrade.prepare: not JSON: {e}"))?;
    if let Some(e) = v.get("error") {
        return Err(format!("the running server refused: {}", e["message"].as_str().unwrap_or("?")));
    }
    serde_json::from_value(v["result"].clone()).map_err(|e| format!("upgrade.prepare: {e}"))
}

/// Step 2: the hand-over itself.
pub fn ask_handover(control: &Path, prepared: &Prepared) -> Result<Taken, String> {
    let stream = call(control, "upgrade.handover", json!({ "prepared": prepared }))?;
    let h = handover::Handover::receive(stream)
        .map_err(|e| format!("upgrade.handover: {e} (the running server went away, or refused)"))?;
    let extra: Extra = match serde_json::from_value(h.saved.extra.clone()) {
        Ok(x) => x,
        Err(e) => {
            let why = format!("the hand-over's vnvme part: {e}");
            h.failed(&why);
            return Err(why);
        }
    };
    Ok(Taken { prepared: prepared.clone(), handover: h, extra })
}

/// `vnvme ctl upgrade`'s arguments.
#[derive(Debug, Clone)]
pub struct UpgradeOptions {
    pub control: PathBuf,
    pub binary: Option<PathBuf>,
    pub timeout: Duration,
}

/// Who serves the device after an upgrade that did not happen, as the control
/// socket answers (waited for: a keeper's stand-in may be starting, its files let
/// go of by the kernel a moment after the dead process's end).
fn who_serves(o: &UpgradeOptions, old_pid: u64) -> String {
    let deadline = Instant::now() + file_lock::EXITED_WAIT + Duration::from_secs(20);
    loop {
        match crate::control::client::request(&o.control, "ctrl.info", Value::Null, Duration::from_secs(2)) {
            Ok(i) if i["pid"].as_u64() == Some(old_pid) => {
                return format!("the running server (pid {old_pid}) serves on")
            }
            Ok(i) => {
                return format!(
                    "the running server (pid {old_pid}) is gone: pid {} serves the device now (a keeper's \
                     stand-in: the guest resets the controller)",
                    i["pid"].as_u64().unwrap_or(0)
                )
            }
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => {
                return format!(
                    "the running server (pid {old_pid}) does not answer its control socket ({e}): see its log"
                )
            }
        }
    }
}

/// `vnvme ctl upgrade`: starts the new process and reports what happened. The old
/// server's `ctrl.info` is read key by key, not as this build's `reply::CtrlInfo`:
/// the server being replaced may be an older build that lacks a field.
pub fn ctl_upgrade(o: &UpgradeOptions) -> Result<Value, String> {
    let info = crate::control::client::request(&o.control, "ctrl.info", Value::Null, o.timeout)?;
    let old_pid = info["pid"].as_u64().unwrap_or(0);
    let binary = match &o.binary {
        Some(b) => b.clone(),
        None => PathBuf::from(info["exe"].as_str().ok_or("the server did not say which binary it runs")?),
    };
    let started = Instant::now();
    let mut cmd = std::process::Command::new(&binary);
    cmd.arg("takeover").arg("--control").arg(&o.control);
    cmd.env("VNVME_LOG", info["log_filter"].as_str().unwrap_or("warn"));
    if let Some(f) = info["log_format"].as_str() {
        cmd.env("VNVME_LOG_FORMAT", f);
    }
    cmd.env("NO_COLOR", "1");
    cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::piped());
    // Its own process group: a signal to this command's terminal does not reach it.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    // It becomes the server, for as long as the guest runs: it gets what the old
    // process hands it and the three standard streams, nothing this command
    // inherited from whoever ran it (a lock held by a script would be held for
    // good, and passed on at every upgrade).
    vfio_user_server::fds::cloexec_from(3)
        .map_err(|e| format!("cannot keep descriptors from the new process: {e}"))?;
    let mut child = cmd.spawn().map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
    let out = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(o.timeout + Duration::from_secs(30)).unwrap_or_default();
    let Some(report) = line.strip_prefix("ready ") else {
        // Its stdout closed: it is exiting (or it said nothing in time).
        let deadline = Instant::now() + Duration::from_secs(2);
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s.to_string(),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break "killed: it did not finish in time".into();
                }
            }
        };
        return Err(format!(
            "the new process ({}) did not take over ({status}); {}",
            binary.display(),
            who_serves(o, old_pid)
        ));
    };
    let report: Value = serde_json::from_str(report.trim()).unwrap_or(Value::Null);
    let new_pid = report["pid"].as_u64().unwrap_or(0);
    // The old process exits right after GO; wait until the control socket answers from
    // the new one.
    let deadline = Instant::now() + o.timeout;
    loop {
        match crate::control::client::request(&o.control, "ctrl.info", Value::Null, o.timeout) {
            Ok(i) if i["pid"].as_u64() == Some(new_pid) => break,
            _ if Instant::now() >= deadline => {
                return Err(format!(
                    "the new process (pid {new_pid}) took over but its control socket does not answer"
                ))
            }
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    Ok(json!({
        "old_pid": old_pid,
        "new_pid": new_pid,
        "binary": binary,
        "stall_ms": report["stall_ms"],
        "took_ms": started.elapsed().as_millis() as u64,
        "client": report["client"],
    }))
}
