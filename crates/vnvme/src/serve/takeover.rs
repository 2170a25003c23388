//! `vnvme takeover`: the new process of an upgrade (docs/UPGRADE.md), which opens
//! what takes time while the old one serves, takes the device over, and serves
//! once the old one has let go.

use crate::logging::say;
use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;

use nvme_ctrl::{Controller, ControllerConfig, NamespaceConfig};
use vfio_user_server::socket_file::SocketFile;
use vfio_user_server::{Device, EventFdInterrupts};

use super::args::{
    check, controller_config, device_options, lock_policy, max_namespaces, poll_mode, resolve_workers,
};
use super::{raise_fd_limit, Ns, Running, ServeArgs, Sockets, Takeover};
use crate::nsspec::NsSpec;
use crate::sandbox;

/// Whether process `pid`, whose end of a connection just closed, has exited: a
/// process being killed closes its descriptors a moment before it is seen to have
/// exited, so it is given a moment (bounded). Alive after that, it closed the
/// connection on purpose.
fn gone(pid: u32) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while crate::keeper::alive(pid) {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    true
}

/// `vnvme takeover`: takes a running server's device over (docs/UPGRADE.md).
/// `parse` reads the running server's command line (`vnvme serve`'s arguments from
/// the whole of it: the program's own parser).
pub fn takeover(
    t: crate::upgrade::TakeoverArgs,
    parse: fn(&[String]) -> Result<ServeArgs, String>,
) -> Result<(), Box<dyn std::error::Error>> {
    use crate::upgrade;
    // Before any thread starts: they inherit the blocked signals.
    crate::signals::install(crate::signals::Role::Serve)?;
    let prepared = upgrade::ask_prepare(&t.control)?;
    vfio_user_server::server::kill_point("new:prepared");
    let mut a = parse(&prepared.argv)?;
    let workers_defaulted = resolve_workers(&mut a);
    check(&a)?;
    let drop_to = a.user.as_deref().map(sandbox::DropTo::lookup).transpose()?;
    // What may take time (files, NBD and RBD connections) is opened while the old
    // process still serves; RAM namespaces come with their memory in the hand-over.
    // The old process holds every file until it exits: its hold is no conflict.
    let locks = lock_policy(&a, vec![prepared.pid]);
    let stats_file = super::claim_stats_file(&a, vec![prepared.pid])?;
    let mut early = std::collections::BTreeMap::new();
    for (&nsid, text) in &prepared.namespaces {
        let spec: NsSpec = text.parse().map_err(|e| format!("namespace {nsid}: {text:?}: {e}"))?;
        if !matches!(spec.kind, crate::nsspec::Kind::Ram) {
            let opened = spec.open(Some(nsid), &locks);
            early.insert(
                nsid,
                opened.map_err(|e| format!("namespace {nsid} ({text}): {}", crate::nsspec::with_fix(e)))?,
            );
        }
    }
    vfio_user_server::server::kill_point("new:opened");
    let max_namespaces = max_namespaces(&a)?;
    let poll = poll_mode(&a);
    raise_fd_limit();
    let mut taken = upgrade::ask_handover(&t.control, &prepared)?;
    vfio_user_server::server::kill_point("new:received");
    let built = (|| -> Result<Running, String> {
        let h = &mut taken.handover;
        let x = &taken.extra;
        let saved = h.saved.controller.clone().ok_or("the running server handed over no controller state")?;
        let groups = crate::handed::groups(&taken.prepared.groups)?;
        let mut namespaces = Vec::new();
        for n in &x.namespaces {
            let size = saved.namespaces.iter().find(|s| s.nsid == n.nsid).map(|s| s.size);
            let opened = match early.remove(&n.nsid) {
                Some(o) => o,
                None => {
                    let mut spec: NsSpec =
                        n.spec.parse().map_err(|e| format!("namespace {}: {e}", n.nsid))?;
                    // Its size now (it may have been resized), not as first given.
                    spec.size = size.or(spec.size);
                    let mut take = |i: Option<usize>| {
                        i.map(|i| h.take(h.saved.extra_fds[i])).transpose().map_err(|e| e.to_string())
                    };
                    let kept = crate::nsspec::Kept { data: take(n.memory)?, meta: take(n.meta_memory)? };
                    spec.open_with(kept, Some(n.nsid), &locks)
                        .map_err(|e| format!("namespace {}: {e}", n.nsid))?
                }
            };
            namespaces.push(Ns { nsid: n.nsid, text: n.spec.clone(), opened });
        }
        // The same namespaces at the same NSIDs, and what the host was told the
        // controller can do (ONCS, VWC), whatever the namespaces now imply.
        let fixed: Vec<u32> = namespaces.iter().map(|n| n.nsid).collect();
        let pool = a.pool.as_ref().map(|p| p.open(a.cntlid, &fixed, &locks)).transpose()?;
        let cfg = ControllerConfig {
            namespaces: namespaces
                .iter()
                .map(|n| NamespaceConfig { nsid: Some(n.nsid), ..n.opened.config() })
                .collect(),
            pool,
            capabilities: saved.capabilities,
            ..controller_config(&a, max_namespaces)
        };
        let irqs = Arc::new(EventFdInterrupts::new(cfg.msix_vectors));
        let clock = Arc::new(nvme_ctrl::MonotonicClock::starting_at(saved.clock_ns));
        let mut ctrl = Controller::with_clock(cfg, guest_mem::GuestMemory::empty(), irqs.clone(), clock)
            .map_err(|e| e.to_string())?;
        for n in &x.namespaces {
            if let Some(g) = crate::handed::group_of(n, &groups)? {
                ctrl.set_qos(n.nsid, Some(g)).map_err(|e| e.to_string())?;
            }
        }
        ctrl.set_doorbell_kick(h.take(h.saved.kick).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
        ctrl.spawn_workers(a.worker_count(), poll).map_err(|e| e.to_string())?;
        let dev = Device::restore(ctrl, irqs, device_options(&a), h).map_err(|e| e.to_string())?;
        let listener = match h.saved.listener {
            Some(i) => UnixListener::from(h.take(i).map_err(|e| e.to_string())?),
            None => return Err("no listening socket in the hand-over".into()),
        };
        let take = |h: &mut vfio_user_server::handover::Handover, i: usize| {
            h.take_extra(i).map_err(|e| e.to_string())
        };
        let control = x.control.map(|i| take(h, i).map(UnixListener::from)).transpose()?;
        let metrics = match x.metrics {
            Some(i) => {
                let fd = take(h, i)?;
                Some(match &a.metrics {
                    Some(crate::metrics::http::MetricsAddr::Unix(_)) => {
                        crate::metrics::http::Listener::Unix(UnixListener::from(fd))
                    }
                    _ => crate::metrics::http::Listener::Tcp(std::net::TcpListener::from(fd)),
                })
            }
            None => None,
        };
        // The socket files become this process's to remove at its end; not before
        // the old process has let go of them (a takeover that fails leaves them).
        let mut sockets = Sockets(Vec::new(), true);
        for p in std::iter::once(a.socket.as_path())
            .chain(a.control.as_deref())
            .chain(a.metrics.iter().filter_map(|m| m.unix_path()))
        {
            sockets.0.push(SocketFile::adopt(p).map_err(|e| format!("{}: {e}", p.display()))?);
        }
        let stderr = take(h, x.stderr)?;
        Ok(Running {
            stats_file,
            argv: taken.prepared.argv.clone(),
            exe: std::env::current_exe().unwrap_or_default(),
            a,
            workers_defaulted,
            namespaces,
            dev,
            listener,
            control,
            metrics,
            poll,
            drop_to,
            groups,
            takeover: Some(Takeover { stderr, old_pid: taken.prepared.pid }),
            sockets,
        })
    })();
    // Fault injection for the tests of the way back (a `fault-injection` build
    // only): the new process fails, or dies, after the old one has quiesced and
    // handed everything over.
    #[cfg(feature = "fault-injection")]
    let built = match std::env::var("VNVME_TEST_TAKEOVER_FAIL").as_deref() {
        Ok("refuse") => Err("injected failure (VNVME_TEST_TAKEOVER_FAIL=refuse)".to_string()),
        Ok("exit") => std::process::exit(70),
        _ => built,
    };
    let running = match built {
        Ok(r) => {
            vfio_user_server::server::kill_point("new:built");
            r
        }
        Err(why) => {
            taken.handover.failed(&why);
            return Err(format!("cannot take over: {why}; the running server serves on").into());
        }
    };
    // What the keeper's journal keeps of them, once this process reports to it.
    let kept_groups = running.groups.clone();
    let client = match taken.handover.saved.client {
        Some(i) => Some((UnixStream::from(taken.handover.take(i)?), taken.handover.take_partial()?)),
        None => None,
    };
    let quiesced_at = taken.handover.saved.quiesced_at_ns;
    // The old process's keeper watches this one from GO on; reached now, before
    // the sandbox (which allows no connect).
    let keeper = taken.extra.keeper.clone().and_then(|l| {
        crate::keeper::adopt(l)
            .map_err(|e| say!("vnvme: takeover: {e}; this process runs without a keeper"))
            .ok()
    });
    // Everything that can fail happens before READY, while the old process can still
    // serve on: the output moves to its stderr (its journal) now, as the sandbox
    // refuses dup2; the threads start, the user drops and the sandbox goes on. Only
    // `ctl` hears the final line, on the pipe that was stdout.
    let tk = running.takeover.as_ref().expect("set above");
    let (old_pid, to_ctl) = (tk.old_pid, std::os::fd::AsFd::as_fd(&std::io::stdout()).try_clone_to_owned()?);
    rustix::stdio::dup2_stderr(&tk.stderr)?;
    rustix::stdio::dup2_stdout(&tk.stderr)?;
    let mut started = match running.start() {
        Ok(s) => s,
        Err(e) => {
            let why = format!("the new process could not start serving: {e}");
            say!("vnvme: takeover: {why}; the running server serves on");
            taken.handover.failed(&why);
            return Err(why.into());
        }
    };
    vfio_user_server::server::kill_point("new:started");
    match taken.handover.ready() {
        Ok(()) => {}
        // The old process went away without its GO. Dead, it can serve no more,
        // and everything it had is here: this one serves (its keeper, told a
        // takeover by this process was under way, waits for it). Alive, it serves
        // on, and this one must not.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && gone(old_pid) => {
            say!("vnvme: takeover: the running server (pid {old_pid}) died before it let go: this process serves");
        }
        Err(e) => return Err(format!("the running server did not let go: {e}").into()),
    }
    vfio_user_server::server::kill_point("new:ready");
    // The old process has let go: the socket files are this one's to remove.
    started.sockets.1 = false;
    // From here on this process serves: the old one has exited or is exiting.
    started.dev.ctrl.resume();
    if let Some(s) = keeper {
        match vfio_user_server::keeper::Journal::new(s, &started.listener) {
            Ok(j) => {
                started.dev.keep_with(j);
                let specs = started.namespaces.iter().map(|n| (n.nsid, n.text.clone())).collect();
                crate::handed::journal(&mut started.dev, &specs, &kept_groups);
            }
            Err(e) => {
                say!("vnvme: takeover: the keeper's journal: {e}; this process runs without a keeper")
            }
        }
    }
    let stall_ms = (vfio_user_server::handover::monotonic_ns().saturating_sub(quiesced_at)) as f64 / 1e6;
    let has_client = client.is_some();
    let report = serde_json::json!({ "pid": std::process::id(), "stall_ms": stall_ms, "client": has_client });
    let _ = writeln!(std::fs::File::from(to_ctl), "ready {report}");
    say!(
        "vnvme {}: took over from pid {old_pid} ({}client connected; guest I/O stalled {stall_ms:.1} ms)",
        crate::version::VERSION,
        if has_client { "" } else { "no " }
    );
    started.serve(client)
}
