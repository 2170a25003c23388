//! What every signal a host sends does to `vnvme serve` (a server, a stand-in, a
//! takeover once it serves) and to its `--restart-on-crash` keeper. None of them
//! drops a guest's disk by accident: the stop signals stop cleanly, the rest are
//! reported or ignored with a line saying so (docs/USAGE.md, "Signals").
//!
//! | signal                          | serve                                        | keeper                          |
//! |---------------------------------|----------------------------------------------|---------------------------------|
//! | TERM, INT, QUIT                 | clean stop: the client's session ends as on a disconnect, summary, stats file, sockets removed, exit 0 | passed to the serving process; the keeper ends with it |
//! | HUP                             | ignored, said (nothing to reload: changes go through the control socket; `systemctl reload` is not offered) | ignored, said |
//! | USR1                            | a report: the summary line, and the stats file written now | passed to the serving process |
//! | USR2 ALRM VTALRM PROF IO PWR XCPU STKFLT | ignored, said                       | ignored, said                   |
//! | TSTP TTIN TTOU                  | ignored, said (a terminal does not stop a server; SIGSTOP does, and the guest's I/O waits) | ignored, said |
//! | PIPE XFSZ                       | ignored: the write that raised it fails instead (EPIPE; EFBIG, an error status to the guest) | ignored |
//! | KILL                            | dies (under a keeper, a stand-in takes over) | dies; the serving process serves on, unkept, and says so |
//! | SEGV BUS ILL FPE ABRT SYS TRAP  | a crash, as any program's                    | the same                        |
//!
//! The signals handled are blocked in every thread (the mask is set before the
//! first thread starts, and threads inherit it) and taken one at a time by a
//! thread of their own with `sigwait`, so what they do runs as ordinary code:
//! logging, writing the stats file, signalling the serving process.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, OnceLock};

use nix::sys::signal::{SigSet, Signal};
use vfio_user_server::server::Stop;

use crate::logging::say;

/// Which process this is, for what a signal does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Serve,
    Keeper,
}

struct Installed {
    stop: Arc<Stop>,
    role: Role,
    /// What USR1 does (set once the process can report).
    report: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

static INSTALLED: OnceLock<Installed> = OnceLock::new();
/// The signal that asked for the stop (0: none yet).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

/// Stop: a clean stop (a keeper passes it on).
const STOPS: [Signal; 3] = [Signal::SIGTERM, Signal::SIGINT, Signal::SIGQUIT];
/// Said and ignored. XFSZ blocked fails the write that would raise it (EFBIG)
/// instead (it stays pending on the writing thread, where no one takes it); PIPE
/// is ignored by the Rust runtime already (EPIPE).
const IGNORED: [Signal; 13] = [
    Signal::SIGXFSZ,
    Signal::SIGHUP,
    Signal::SIGUSR2,
    Signal::SIGALRM,
    Signal::SIGVTALRM,
    Signal::SIGPROF,
    Signal::SIGIO,
    Signal::SIGPWR,
    Signal::SIGXCPU,
    Signal::SIGSTKFLT,
    Signal::SIGTSTP,
    Signal::SIGTTIN,
    Signal::SIGTTOU,
];

/// Takes the process's signals over as `role` and returns the stop they ask
/// for. Call before any thread starts (once per process; later calls return
/// the same stop).
pub fn install(role: Role) -> std::io::Result<Arc<Stop>> {
    if let Some(i) = INSTALLED.get() {
        return Ok(i.stop.clone());
    }
    let mut set = SigSet::empty();
    for s in STOPS.iter().chain(&IGNORED).chain([&Signal::SIGUSR1]) {
        set.add(*s);
    }
    set.thread_block().map_err(std::io::Error::from)?;
    let installed = INSTALLED.get_or_init(|| Installed {
        stop: Arc::new(Stop::new().expect("an eventfd")),
        role,
        report: OnceLock::new(),
    });
    std::thread::Builder::new().name("vnvme-signals".into()).spawn(move || loop {
        match set.wait() {
            Ok(sig) => take(installed, sig),
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                say!("vnvme: waiting for signals failed ({e}): signals are no longer handled");
                return;
            }
        }
    })?;
    Ok(installed.stop.clone())
}

/// Sets what USR1 does (once): a report, or (a keeper) passing it on.
pub fn on_report(f: impl Fn() + Send + Sync + 'static) {
    if let Some(i) = INSTALLED.get() {
        let _ = i.report.set(Box::new(f));
    }
}

/// What signal `sig` does here.
fn take(i: &Installed, sig: Signal) {
    let who = match i.role {
        Role::Serve => "vnvme",
        Role::Keeper => "vnvme keeper",
    };
    if STOPS.contains(&sig) {
        let _ = SIGNAL.compare_exchange(0, sig as i32, Ordering::SeqCst, Ordering::SeqCst);
        if !i.stop.is_requested() {
            say!(
                "{who}: {sig}: stopping{}",
                if i.role == Role::Keeper { " (the serving process is asked to stop first)" } else { "" }
            );
        }
        i.stop.request();
        return;
    }
    if sig == Signal::SIGUSR1 {
        match i.report.get() {
            Some(f) => f(),
            None => say!("{who}: SIGUSR1: nothing to report yet (still starting)"),
        }
        return;
    }
    let why = match sig {
        Signal::SIGHUP => {
            "nothing to reload (changes go through the control socket, vnvme ctl; a new binary through vnvme ctl \
             upgrade)"
        }
        Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU => {
            "a terminal does not stop a server (SIGSTOP does; its guest's I/O then waits)"
        }
        _ => "it asks nothing of a server",
    };
    say!("{who}: {sig} ignored: {why}; serving on (SIGTERM stops it)");
}

/// The signal that stopped the server, by name (None: it was not stopped by one).
pub fn stopped_by() -> Option<&'static str> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        libc::SIGTERM => Some("SIGTERM"),
        libc::SIGINT => Some("SIGINT"),
        libc::SIGQUIT => Some("SIGQUIT"),
        _ => Some("a signal"),
    }
}
