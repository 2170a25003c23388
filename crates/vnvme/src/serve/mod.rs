//! `vnvme serve`: the controller as a vfio-user device.

use crate::logging::say;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nvme_ctrl::qos::QosGroup;
use nvme_ctrl::{Controller, ControllerConfig, NamespaceConfig, PollMode, StatsSnapshot};
use vfio_user_server::socket_file::SocketFile;
use vfio_user_server::{server, Device, EventFdInterrupts};

use crate::sandbox;

mod args;
mod takeover;

use args::{
    check, controller_config, device_options, lock_policy, max_namespaces, poll_mode, resolve_workers,
};
pub use args::{ServeArgs, Switch, INLINE_UP_TO_CPUS};
pub use takeover::takeover;

pub fn run(mut a: ServeArgs) -> Result<(), Box<dyn std::error::Error>> {
    use crate::keeper::Role;
    let role = a.restart_on_crash.then(crate::keeper::role).transpose()?;
    // Before any thread starts: they inherit the blocked signals.
    let keeper = matches!(role, Some(Role::Keeper));
    let stop = crate::signals::install(if keeper {
        crate::signals::Role::Keeper
    } else {
        crate::signals::Role::Serve
    })?;
    let (serving, standin) = match role {
        Some(Role::Keeper) => {
            check(&a)?;
            return crate::keeper::run(stop);
        }
        Some(Role::Serving(s)) => (Some(s), None),
        Some(Role::StandIn(s)) => (None, Some(s)),
        None => (None, None),
    };
    no_core_if_dying_on_purpose();
    let workers_defaulted = resolve_workers(&mut a);
    check(&a)?;
    // Checked before anything is opened or said: a path that is not a stats file
    // of ours (an image, say) is refused, never replaced.
    let stats_file = claim_stats_file(&a, Vec::new())?;
    let drop_to = a.user.as_deref().map(sandbox::DropTo::lookup).transpose()?;
    let max_namespaces = max_namespaces(&a)?;
    // Standing in for a process that died: the keeper's journal has the device,
    // and the namespaces and QoS groups as the operator last left them.
    let mut journal = standin.map(vfio_user_server::handover::Handover::receive).transpose()?;
    let kept = journal.as_ref().and_then(crate::handed::Journaled::from_journal);
    let locks = lock_policy(&a, Vec::new());
    let (namespaces, groups) = match (journal.as_mut(), &kept) {
        (Some(h), Some(k)) => (kept_namespaces(h, k, &a, drop_to.as_ref(), &locks), k.groups()),
        _ => {
            let mut namespaces = Vec::new();
            for (i, spec) in a.namespaces.iter().enumerate() {
                let nsid = i as u32 + 1;
                let opened = spec
                    .check_operator_size()
                    .and_then(|()| spec.open(Some(nsid), &locks))
                    .map_err(|e| format!("--ns {}: {}", spec.text, crate::nsspec::with_fix(e)))?;
                namespaces.push(Ns { nsid, text: spec.text.clone(), opened });
            }
            (namespaces, Default::default())
        }
    };
    let fixed: Vec<u32> = namespaces.iter().map(|n| n.nsid).collect();
    let pool = a.pool.as_ref().map(|p| p.open(a.cntlid, &fixed, &locks)).transpose()?;
    let cfg = ControllerConfig {
        namespaces: namespaces
            .iter()
            .map(|n| NamespaceConfig { nsid: Some(n.nsid), ..n.opened.config() })
            .collect(),
        pool,
        ..controller_config(&a, max_namespaces)
    };
    let irqs = Arc::new(EventFdInterrupts::new(cfg.msix_vectors));
    let mut ctrl = Controller::new(cfg, guest_mem::GuestMemory::empty(), irqs.clone())?;
    for n in kept.iter().flat_map(|k| &k.namespaces) {
        let set = crate::handed::group_of(n, &groups)
            .and_then(|g| g.map_or(Ok(()), |g| ctrl.set_qos(n.nsid, Some(g)).map_err(|e| e.to_string())));
        if let Err(e) = set {
            say!("vnvme: namespace {}: its QoS limits from before the crash: {e}; left out", n.nsid);
        }
    }
    let poll = poll_mode(&a);
    if let Some(h) = journal.as_mut() {
        ctrl.set_doorbell_kick(h.take(h.saved.kick)?)?;
    }
    ctrl.spawn_workers(a.worker_count(), poll)?;
    raise_fd_limit();
    // Every socket file bound from here on is removed again if the start fails.
    let mut sockets = Sockets::default();
    let (dev, listener) = match journal.as_mut() {
        Some(h) => {
            let dev = Device::restore(ctrl, irqs, device_options(&a), h)?;
            let l = h.saved.listener.ok_or("the keeper's journal has no listening socket")?;
            sockets.0.push(SocketFile::adopt(&a.socket).map_err(|e| format!("--socket {e}"))?);
            // The socket is the keeper's listener's: a stand-in whose start fails
            // leaves it (and what it bound) for the next one.
            sockets.1 = true;
            (dev, UnixListener::from(h.take(l)?))
        }
        None => {
            let dev = Device::new(ctrl, irqs, device_options(&a))?;
            let (listener, file) = server::bind(&a.socket).map_err(|e| format!("--socket {e}"))?;
            sockets.0.push(file);
            (dev, listener)
        }
    };
    let control = match &a.control {
        Some(p) => {
            let (l, file) = crate::control::server::bind(p).map_err(|e| format!("--control {e}"))?;
            sockets.0.push(file);
            Some(l)
        }
        None => None,
    };
    let metrics = match &a.metrics {
        Some(m) => {
            let (l, file) = crate::metrics::http::bind(m).map_err(|e| format!("--metrics {m}: {e}"))?;
            sockets.0.extend(file);
            Some(l)
        }
        None => None,
    };
    let mut argv: Vec<String> = std::env::args().collect();
    if workers_defaulted {
        // The count this host's default gave is handed on as given, so an upgrade
        // keeps it even where the new process would default otherwise.
        argv.extend(["--workers".to_string(), a.worker_count().to_string()]);
    }
    // The client's connection, and what the dead process had read from it and not
    // answered (the keeper hands it over), which this one answers first.
    let client = match journal.as_mut() {
        Some(h) => match h.saved.client.map(|i| h.take(i)).transpose()? {
            Some(c) => Some((UnixStream::from(c), h.take_partial()?)),
            None => None,
        },
        None => None,
    };
    let running = Running {
        stats_file: stats_file.clone(),
        argv,
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
        groups: groups.clone(),
        takeover: None,
        sockets,
    };
    let mut started = running.start().inspect_err(|_| {
        // A start that failed leaves no stats file it made.
        if let Some(f) = &stats_file {
            f.discard_if_new();
        }
    })?;
    // Serving: the socket files are this process's to remove at its end.
    started.sockets.1 = false;
    let keeper = match (serving, journal) {
        (Some(s), _) => Some(s),
        (None, Some(h)) => {
            let s = h.ready_keeping()?;
            say!(
                "vnvme: standing in for a serving process that died ({}); vnvme keeper holds the device",
                if client.is_some() {
                    "the client stays connected: its guest hears of a Persistent Internal Error and resets the controller"
                } else {
                    "no client was connected"
                }
            );
            Some(s)
        }
        _ => None,
    };
    if let Some(s) = keeper {
        let j = vfio_user_server::keeper::Journal::new(s, &started.listener)?;
        started.dev.keep_with(j);
        let specs = started.namespaces.iter().map(|n| (n.nsid, n.text.clone())).collect();
        crate::handed::journal(&mut started.dev, &specs, &groups);
    }
    started.serve(client)
}

/// The namespaces a stand-in serves: those of `kept`, the journal's, each opened
/// again from its `--ns` text (a RAM namespace on the memory the keeper held, at
/// its size then). One that cannot be opened is left out and said so: the guest,
/// which resets a stand-in, finds it gone rather than losing the whole controller.
///
/// The journal comes from a process a hostile VMM may have taken over, and this
/// one opens namespaces before it drops to `--user` and into its sandbox: it opens
/// nothing the dead process could not have opened itself ([`may_reopen`]).
fn kept_namespaces(
    h: &mut vfio_user_server::handover::Handover,
    kept: &crate::handed::Journaled,
    a: &ServeArgs,
    user: Option<&sandbox::DropTo>,
    locks: &file_lock::Policy,
) -> Vec<Ns> {
    let mut namespaces = Vec::new();
    for n in &kept.namespaces {
        let opened = (|| -> Result<crate::nsspec::Opened, String> {
            let mut spec: crate::nsspec::NsSpec = n.spec.parse()?;
            // A RAM namespace too: one no operator asked for is not served.
            let rights = may_reopen(&spec, a)?;
            if !matches!(spec.kind, crate::nsspec::Kind::Ram) {
                let nsid = Some(n.nsid);
                return match rights {
                    Rights::Operator => spec.open(nsid, locks).map_err(crate::nsspec::with_fix),
                    // Added with ns.add by a process running as --user: with that
                    // user's rights, as it was then.
                    Rights::User => {
                        let u = user.ok_or("--user was given and not found")?;
                        u.with_rights(|| spec.open(nsid, locks))
                            .map_err(|e| e.to_string())?
                            .map_err(crate::nsspec::with_fix)
                    }
                };
            }
            spec.size = n.size.or(spec.size);
            let mut take =
                |i: Option<usize>| i.map(|i| h.take_extra(i)).transpose().map_err(|e| e.to_string());
            let fds = crate::nsspec::Kept { data: take(n.memory)?, meta: take(n.meta_memory)? };
            spec.open_with(fds, Some(n.nsid), locks).map_err(crate::nsspec::with_fix)
        })();
        match opened {
            Ok(opened) => namespaces.push(Ns { nsid: n.nsid, text: n.spec.clone(), opened }),
            Err(e) => say!(
                "vnvme: namespace {} ({}), served before the crash, cannot be opened again: {e}; the stand-in \
                 serves without it",
                n.nsid, n.spec
            ),
        }
    }
    namespaces
}

/// With whose rights a stand-in opens a namespace again.
#[derive(Debug, PartialEq, Eq)]
enum Rights {
    /// The operator's own `--ns`: as at any start.
    Operator,
    /// Added with `ns.add` by a process that ran as `--user`: with that user's.
    User,
}

/// Whether a stand-in may open `spec` again, and with whose rights (a RAM
/// namespace's are moot: its memory is the keeper's): the operator's own `--ns`,
/// or one the dead process could have added itself (it had a control socket and
/// its sandbox allowed that kind), opened with the rights that process had.
fn may_reopen(spec: &crate::nsspec::NsSpec, a: &ServeArgs) -> Result<Rights, String> {
    if a.namespaces.iter().any(|o| o.text == spec.text) {
        return Ok(Rights::Operator);
    }
    if a.control.is_none() {
        return Err("not an --ns of this server's, which has no control socket to add one with".into());
    }
    if a.sandbox == Switch::On {
        // librados' threads are allowed where an --ns is an rbd: volume.
        #[cfg(feature = "rbd")]
        let rbd = a.namespaces.iter().any(|o| matches!(o.kind, crate::nsspec::Kind::Rbd(_)));
        #[cfg(not(feature = "rbd"))]
        let rbd = false;
        spec.may_add(&sandbox::Needs { control: true, rbd, ..Default::default() })?;
    }
    Ok(if a.user.is_some() { Rights::User } else { Rights::Operator })
}

/// A namespace as served: its NSID, its `--ns` text and its backend.
struct Ns {
    nsid: u32,
    text: String,
    opened: crate::nsspec::Opened,
}

/// A process that took a device over.
struct Takeover {
    stderr: std::os::fd::OwnedFd,
    old_pid: u32,
}

/// Everything set up: serve until the end.
struct Running {
    /// `--stats-file`, claimed.
    stats_file: Option<Arc<crate::stats_file::StatsFile>>,
    /// The socket files this server bound (or took over): removed at its end if they
    /// are still its own. First, so a start that fails removes them while their
    /// listeners are still open.
    sockets: Sockets,
    a: ServeArgs,
    /// `--workers` was not given: this host's default settled it.
    workers_defaulted: bool,
    argv: Vec<String>,
    exe: PathBuf,
    namespaces: Vec<Ns>,
    dev: Device,
    listener: UnixListener,
    control: Option<UnixListener>,
    metrics: Option<crate::metrics::http::Listener>,
    poll: PollMode,
    drop_to: Option<sandbox::DropTo>,
    groups: std::collections::BTreeMap<String, Arc<QosGroup>>,
    takeover: Option<Takeover>,
}

/// Socket files this server bound: removed when dropped (the end, or a start that
/// failed) if they are still its own, unless kept (`.1`: another process serves
/// them, or has not let go of them yet).
#[derive(Debug, Default)]
struct Sockets(Vec<SocketFile>, bool);

impl Sockets {
    fn dir_fds(&self) -> impl Iterator<Item = i32> + '_ {
        self.0.iter().map(|f| f.dir_fd())
    }

    /// After a change of user: a socket whose directory that user may not write
    /// cannot be removed at the end. Say so now, once, and do not try then (the file
    /// stays; the next `serve` on the path replaces a stale socket).
    fn forget_unremovable(&mut self, user: &str) {
        self.0.retain(|f| {
            if f.removable() {
                return true;
            }
            say!(
                "vnvme: {} stays when this server ends: its directory is not writable by --user {user} (the \
                 next vnvme serve on it replaces a stale socket; or give the directory to that user)",
                f.path().display()
            );
            false
        });
    }
}

impl Drop for Sockets {
    fn drop(&mut self) {
        if self.1 {
            return;
        }
        for f in &self.0 {
            match f.remove() {
                Ok(true) => {}
                Ok(false) => say!(
                    "vnvme: {} is no longer the socket this server bound: left as it is",
                    f.path().display()
                ),
                Err(e) => say!("vnvme: cannot remove {}: {e}", f.path().display()),
            }
        }
    }
}

/// Each DMA region keeps a descriptor: lift the soft limit before the device sizes
/// its DMA map budget from it.
fn raise_fd_limit() {
    if let Err(e) = vfio_user_server::dma::raise_fd_limit() {
        say!("vnvme: cannot raise the descriptor limit ({e}); DMA regions stay fewer");
    }
}

impl Running {
    /// Everything before serving that can fail: the stats, control and metrics
    /// threads, the user drop, the sandbox.
    fn start(self) -> Result<Started, Box<dyn std::error::Error>> {
        let Running {
            stats_file,
            a,
            workers_defaulted,
            argv,
            exe,
            namespaces,
            mut dev,
            listener,
            control,
            metrics,
            poll,
            drop_to,
            groups,
            takeover,
            mut sockets,
        } = self;
        let stop = crate::signals::install(crate::signals::Role::Serve)?;
        let stats = dev.ctrl.stats_handle();
        {
            // SIGUSR1: the counters now, in the log and the stats file.
            let (stats, file) = (stats.clone(), stats_file.clone());
            crate::signals::on_report(move || {
                let s = stats.snapshot();
                say!("vnvme: SIGUSR1: {}", summary(&s));
                if let Some(f) = &file {
                    match f.write(&s) {
                        Ok(()) => say!("vnvme: SIGUSR1: {} written", f.path().display()),
                        Err(e) => say!("vnvme: SIGUSR1: --stats-file {}: {e}", f.path().display()),
                    }
                }
            });
        }
        say!("vnvme {} (pid {})", crate::version::VERSION, std::process::id());
        for n in &namespaces {
            let bi = n.opened.backend.info();
            let f = nvme_ctrl::LBA_FORMATS[n.opened.lba_format as usize];
            let meta = match (&n.opened.metadata, f.ms) {
                (Some(m), ms) if ms > 0 => match m.dps & 7 {
                    0 => format!(" + {ms} bytes of metadata"),
                    t => format!(
                        " + {ms} bytes of metadata, protection information type {t} ({}-bit guard)",
                        if f.guard == nvme_spec::pi::Guard::Crc64 { 64 } else { 16 }
                    ),
                },
                (Some(_), _) => ", formats with metadata offered".into(),
                (None, _) => String::new(),
            };
            say!(
                "vnvme: namespace {}: {} ({} bytes, {}-byte LBAs{meta}, write cache {}, discard {}, write zeroes {})",
                n.nsid,
                bi.kind,
                // As served (a zoned one: its whole zones), not the backend's.
                dev.ctrl.namespace(n.nsid).map_or(bi.size, |ns| ns.size()),
                1u32 << f.shift,
                if bi.volatile_cache { "volatile" } else { "none" },
                if bi.discard { "yes" } else { "no" },
                if bi.write_zeroes { "native" } else { "no" },
            );
        }
        say!(
            "vnvme: serving {} namespace(s) on {} ({}, --poll {}, --doorbells {}, {} queue pairs, \
             up to {} DMA regions)",
            namespaces.len(),
            a.socket.display(),
            match (a.worker_count(), workers_defaulted) {
                (0, false) => "inline: no workers".to_string(),
                (0, true) =>
                    format!("inline: no workers, the default with {} usable CPUs or fewer", INLINE_UP_TO_CPUS),
                (n, _) => format!("{n} worker(s)"),
            },
            poll,
            a.doorbells.name(),
            a.queues,
            dev.dma_region_limit()
        );
        if let Some(id) = a.cntlid {
            say!(
                "vnvme: controller {id} of subsystem nqn.2024-01.io.vnvme:{} (the other controllers: \
                 their own vnvme serve, the same --serial and storage); namespaces shared",
                a.serial
            );
        }
        if let Some(p) = dev.ctrl.pool() {
            let st = p.state();
            let here: Vec<String> = st
                .namespaces
                .iter()
                .filter(|(_, n)| n.attached.contains(&p.cntlid()))
                .map(|(nsid, _)| nsid.to_string())
                .collect();
            say!(
                "vnvme: namespace pool {}: {} of {} allocated, {} namespace(s), attached here: {} \
                 (Namespace Management and Attachment; vnvme ctl pool.info)",
                p.path().display(),
                crate::units::human_size(st.capacity - st.unallocated()),
                crate::units::human_size(st.capacity),
                st.namespaces.len(),
                if here.is_empty() { "none".to_string() } else { here.join(", ") }
            );
        }
        if let Some(f) = a.fdp {
            say!(
                "vnvme: flexible data placement: endurance group 1, {} reclaim unit handle(s) of {} reclaim units",
                f.ruhs,
                crate::units::human_size(f.ru_size)
            );
        }
        if let Some(file) = stats_file.clone() {
            // Once now, with the rights it will be written with (--user's): a path
            // that user cannot write fails the start before anything is made
            // (taking over, the client is ours already: say so and go on).
            let first = match &drop_to {
                Some(u) => u.with_rights(|| file.write(&stats.snapshot())).and_then(|r| r).map_err(|e| {
                    format!("as --user {}: {e} (the file is replaced by a rename: its directory must be writable by that user)", u.name())
                }),
                None => file.write(&stats.snapshot()).map_err(|e| e.to_string()),
            };
            if let Err(e) = first {
                let e = format!("--stats-file {}: {e}", file.path().display());
                if takeover.is_none() {
                    return Err(e.into());
                }
                say!("vnvme: {e}");
            }
            let stats = stats.clone();
            std::thread::Builder::new().name("vnvme-stats".into()).spawn(move || loop {
                let _ = file.write(&stats.snapshot());
                std::thread::sleep(Duration::from_millis(500));
            })?;
        }
        let jobs = vfio_user_server::jobs::DeviceJobs::new()?;
        let metrics_fd = metrics.as_ref().map(|m| m.try_clone_fd()).transpose()?;
        // What the sandbox allows beyond every mode's calls: decided once, here, and
        // both installed below and consulted by ns.add.
        let mut needs = namespaces.iter().fold(sandbox::Needs::default(), |n, o| n.union(o.opened.needs));
        needs.stats_file = a.stats_file.is_some();
        needs.control = a.control.is_some();
        needs.pool_dir = dev.ctrl.pool().map(|p| std::os::fd::AsRawFd::as_raw_fd(&p.dir_fd()));
        if let (Some(path), Some(listener)) = (&a.control, control) {
            let specs = namespaces.iter().map(|n| (n.nsid, n.text.clone())).collect();
            let ctx = crate::control::methods::Context {
                jobs: jobs.clone(),
                stats: stats.clone(),
                facts: facts(&a, poll, &dev, &exe),
                specs: std::sync::Mutex::new(specs),
                sandbox: (a.sandbox == Switch::On).then_some(needs),
                groups: std::sync::Mutex::new(groups),
                started: std::time::Instant::now(),
                // No one's hold is accepted any more: a process this one took over
                // from has exited by the time a namespace can be added.
                locks: lock_policy(&a, Vec::new()),
                upgrade: crate::upgrade::Source {
                    argv,
                    exe,
                    control: Some(listener.try_clone()?),
                    metrics: metrics_fd,
                },
            };
            crate::control::server::spawn(listener, Arc::new(ctx))?;
            say!(
                "vnvme: control socket on {} (vnvme ctl --control {} ctrl.info)",
                path.display(),
                path.display()
            );
        }
        if let Some(listener) = metrics {
            let shown = match crate::metrics::http::local_addr(&listener)? {
                crate::metrics::http::MetricsAddr::Tcp(a) => format!("http://{a}/metrics"),
                crate::metrics::http::MetricsAddr::Unix(p) => format!("{} (GET /metrics)", p.display()),
            };
            let (jobs, stats, serial, started) =
                (jobs.clone(), stats.clone(), a.serial.clone(), std::time::Instant::now());
            let source: crate::metrics::http::Source = Box::new(move || {
                let stats = stats.clone();
                let serial = serial.clone();
                let scrape = jobs
                    .run(crate::control::JOB_LIMIT, move |d| {
                        crate::metrics::collect(d, &stats, &serial, started)
                    })
                    .map_err(|e| e.to_string())?;
                Ok(crate::metrics::render::render(&scrape))
            });
            crate::metrics::http::spawn(listener, source)?;
            say!("vnvme: Prometheus metrics on {shown}");
        }
        if let Some(u) = &drop_to {
            u.apply()?;
            say!("vnvme: running as {}", u.describe());
            sockets.forget_unremovable(u.name());
            if let Some(f) = &stats_file {
                // Written again as that user, or the writes from here to the end
                // (the last one included) would fail.
                f.write(&stats.snapshot()).map_err(|e| {
                    format!(
                        "--stats-file {}: as --user {}: {e} (the file is replaced by a rename: its \
                         directory must be writable by that user)",
                        f.path().display(),
                        u.name()
                    )
                })?;
            }
        }
        // Under a keeper: the memory a client's connection keeps what it receives in
        // (a stand-in answers what this process read and did not), made while
        // memfd_create is allowed.
        if a.restart_on_crash {
            if let Err(e) = dev.prepare_keeping() {
                say!("vnvme: the receive memory for a stand-in: {e}; a request read when this process dies goes unanswered");
            }
        }
        if a.sandbox == Switch::On {
            for (slot, fd) in needs.socket_dirs.iter_mut().zip(sockets.dir_fds()) {
                *slot = Some(fd);
            }
            sandbox::install(&needs)?;
            say!("vnvme: sandbox on: seccomp allowlist and no_new_privs; beyond every mode's calls, those of {}", needs.describe());
        } else {
            say!("vnvme: sandbox off: every system call allowed (--sandbox off is for debugging)");
        }
        let jobs = (a.control.is_some() || a.metrics.is_some()).then_some(jobs);
        Ok(Started { a, namespaces, dev, listener, stats, stats_file, jobs, sockets, stop })
    }
}

/// A server that is set up: it serves until the end.
struct Started {
    a: ServeArgs,
    namespaces: Vec<Ns>,
    dev: Device,
    listener: UnixListener,
    stats: Arc<nvme_ctrl::Stats>,
    stats_file: Option<Arc<crate::stats_file::StatsFile>>,
    jobs: Option<Arc<vfio_user_server::jobs::DeviceJobs>>,
    sockets: Sockets,
    stop: Arc<server::Stop>,
}

impl Started {
    /// Serves, starting with `first` (a client taken over, and the start of a message
    /// it had begun to send) if given.
    fn serve(
        self,
        first: Option<(UnixStream, vfio_user_server::Partial)>,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let Started { a, namespaces, mut dev, listener, stats, stats_file, jobs, mut sockets, stop } = self;
        let r = server::serve_from(
            &listener,
            &mut dev,
            first,
            if a.once { Some(1) } else { None },
            &server::ServeOptions { deadline: a.client_deadline, jobs, stop: Some(stop), die_on: die_on() },
        );
        let s = stats.snapshot();
        if dev.handed_over() {
            // The new process serves the socket, the stats file and the client now.
            sockets.1 = true;
            say!("vnvme: handed over to a new process; this one exits ({})", summary(&s));
            return r.map_err(Into::into);
        }
        // Ending on its own: a keeper restarts nothing (after an error it does).
        if r.is_ok() {
            dev.journal_end();
        }
        if let Some(sig) = crate::signals::stopped_by() {
            say!("vnvme: stopped by {sig}: the client's session ended as if it had disconnected");
        }
        say!("vnvme: {}", summary(&s));
        for w in dev.ctrl.workers() {
            say!("vnvme: {}", w.stats_line());
        }
        if let Some(j) = dev.ctrl.spin_judge() {
            say!("vnvme: {}", j.verdict().describe());
        }
        for n in &namespaces {
            if let Some(line) = n.opened.backend.stats_line() {
                say!("vnvme: namespace {}: {line}", n.nsid);
            }
        }
        if let Some(f) = &stats_file {
            f.write(&stats.snapshot())?;
        }
        drop(sockets);
        r.map_err(Into::into)
    }
}

/// What the control socket reports about this server that never changes.
fn facts(a: &ServeArgs, poll: PollMode, dev: &Device, exe: &Path) -> crate::control::reply::Facts {
    crate::control::reply::Facts {
        vnvme: env!("CARGO_PKG_VERSION").into(),
        commit: crate::version::COMMIT.into(),
        serial: a.serial.clone(),
        cntlid: a.cntlid,
        pci_id: format!("{:04x}:{:04x}", a.pci_id.0, a.pci_id.1),
        socket: a.socket.clone(),
        io_queues: a.queues,
        workers: a.worker_count(),
        poll: poll.name().into(),
        doorbells: a.doorbells.name().into(),
        shadow_doorbells: !a.no_shadow_doorbells,
        sandbox: a.sandbox == Switch::On,
        client_deadline_ms: a.client_deadline.as_millis() as u64,
        max_dma_regions: dev.dma_region_limit(),
        pid: std::process::id(),
        exe: exe.to_path_buf(),
        log_format: crate::logging::format_name().into(),
        keeper: crate::keeper::link()
            .map(|l| crate::control::reply::KeeperFacts { pid: l.pid, restarts: l.restarts }),
    }
}

fn summary(s: &StatsSnapshot) -> String {
    let per = |n: u64| if s.io_commands == 0 { 0.0 } else { n as f64 / s.io_commands as f64 };
    format!(
        "{} I/O commands, {} admin; trapped I/O doorbell writes {} ({:.3}/cmd), interrupts {} ({:.3}/cmd)",
        s.io_commands,
        s.admin_commands,
        s.io_doorbell_writes,
        per(s.io_doorbell_writes),
        s.interrupts,
        per(s.interrupts)
    )
}

/// `--stats-file`, claimed for this process (`accept`: processes whose hold is
/// no conflict).
fn claim_stats_file(
    a: &ServeArgs,
    accept: Vec<u32>,
) -> Result<Option<Arc<crate::stats_file::StatsFile>>, String> {
    let locks = lock_policy(a, accept);
    Ok(a.stats_file
        .as_ref()
        .map(|p| crate::stats_file::StatsFile::claim(p, &locks))
        .transpose()?
        .map(Arc::new))
}

/// Fault injection for the crash tests, under a keeper only:
/// `VNVME_TEST_DIE_ON=COMMAND:N` has the first serving process abort when it has
/// read the N-th vfio-user message of that command number (a stand-in never does);
/// `VNVME_TEST_DIE_ON=id:ID` has every process abort when it reads the message with
/// that ID (a message that crashes whoever handles it). It leaves no core file
/// (RLIMIT_CORE 0, set while the sandbox still allows it).
/// Only in a build with the `fault-injection` feature (the tests').
#[cfg(not(feature = "fault-injection"))]
fn die_on() -> Option<server::DieOn> {
    None
}

#[cfg(feature = "fault-injection")]
fn die_on() -> Option<server::DieOn> {
    let v = std::env::var("VNVME_TEST_DIE_ON").ok()?;
    let link = crate::keeper::link()?;
    match v.split_once(':')? {
        ("id", id) => Some(server::DieOn::at_id(id.parse().ok()?)),
        (c, n) if link.restarts == 0 => Some(server::DieOn::new(c.parse().ok()?, n.parse().ok()?)),
        _ => None,
    }
}

/// [`die_on`]'s process dumps no core.
fn no_core_if_dying_on_purpose() {
    if cfg!(feature = "fault-injection") && std::env::var_os("VNVME_TEST_DIE_ON").is_some() {
        let none = rustix::process::Rlimit { current: Some(0), maximum: Some(0) };
        let _ = rustix::process::setrlimit(rustix::process::Resource::Core, none);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> ServeArgs {
        let argv: Vec<String> = ["vnvme", "serve", "--socket", "/run/x.sock", "--ns", "file:/srv/a.img:1G"]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect();
        crate::parse_serve(&argv).unwrap()
    }

    /// A journal names what the dead process served; a stand-in opens again only
    /// what that process could have opened itself.
    #[test]
    fn a_stand_in_opens_again_only_what_the_dead_process_could_have() {
        let spec = |t: &str| t.parse::<crate::nsspec::NsSpec>().unwrap();
        let control = ["--control", "/run/x.ctl"];
        let user = [&control[..], &["--user", "nobody"]].concat();
        assert_eq!(
            may_reopen(&spec("file:/srv/a.img:1G"), &args(&[])),
            Ok(Rights::Operator),
            "the operator's --ns"
        );
        assert_eq!(may_reopen(&spec("file:/srv/a.img:1G"), &args(&user)), Ok(Rights::Operator));
        let e = may_reopen(&spec("file:/etc/shadow"), &args(&[])).unwrap_err();
        assert!(e.contains("no control socket"), "{e}");
        let e = may_reopen(&spec("ram:1T"), &args(&[])).unwrap_err();
        assert!(e.contains("no control socket"), "memory no operator asked for: {e}");
        assert_eq!(
            may_reopen(&spec("file:/srv/b.img"), &args(&control)),
            Ok(Rights::Operator),
            "ns.add, same rights"
        );
        assert_eq!(may_reopen(&spec("file:/srv/b.img"), &args(&user)), Ok(Rights::User), "ns.add as --user");
        let e = may_reopen(&spec("nvme://0000:01:00.0"), &args(&control)).unwrap_err();
        assert!(e.contains("sandbox"), "a kind the sandbox never let ns.add open: {e}");
        let off = [&control[..], &["--sandbox", "off"]].concat();
        assert_eq!(may_reopen(&spec("nvme://0000:01:00.0"), &args(&off)), Ok(Rights::Operator));
    }
}
