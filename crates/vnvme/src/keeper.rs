//! `vnvme serve --restart-on-crash`: the controller outlives its process.
//!
//! The command's process becomes the keeper: it starts the serving process (the
//! same binary and arguments), holds what the VMM handed the device as the serving
//! process journals it (`vfio_user_server::keeper`), and if the serving process
//! dies (killed by a signal, or exiting with a failure once it had served), starts
//! another that stands in for it on the same client connection. The VMM never sees
//! its socket close; the guest sees its controller report Controller Fatal Status
//! and resets it (docs/subsystems.md: "A controller's process dies").
//!
//! The keeper serves nothing and reads only its own child's journal: the socket it
//! listens on (abstract, named for its PID) takes one connection per child, and
//! only from that child's PID. It stops when the serving process ends on its own
//! (exit 0: a stop, `--once`, an upgrade's hand-over), forwards SIGTERM and SIGINT
//! to it, and gives up after [`MAX_RESTARTS`] restarts within [`RESTART_WINDOW`].

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags};
use vfio_user_server::keeper::{JournalReader, Kept};

/// The abstract socket name a serving process reports to.
const NAME_ENV: &str = "VNVME_KEEPER";
/// Set for a process that stands in for one that died: how many the keeper has
/// started so far.
const STANDIN_ENV: &str = "VNVME_KEEPER_STANDIN";

/// Restarts allowed within [`RESTART_WINDOW`] before the keeper gives up (a
/// process that dies as soon as it stands in would otherwise loop).
pub const MAX_RESTARTS: usize = 5;
pub const RESTART_WINDOW: Duration = Duration::from_secs(60);
/// How long a new serving process may take to report (its namespaces open first).
const REPORT_WAIT: Duration = Duration::from_secs(120);
/// How long a stand-in may take to restore the device once it has the journal.
const READY_WAIT: Duration = Duration::from_secs(30);

/// What this process is, under `--restart-on-crash`.
pub enum Role {
    /// The command as the operator ran it: keep a serving process.
    Keeper,
    /// A serving process: journal to the keeper on this connection.
    Serving(UnixStream),
    /// A serving process standing in for one that died: the journal comes first.
    StandIn(UnixStream),
}

/// Which role this process has (from the environment the keeper set).
pub fn role() -> Result<Role, String> {
    let Ok(name) = std::env::var(NAME_ENV) else { return Ok(Role::Keeper) };
    let addr =
        SocketAddr::from_abstract_name(name.as_bytes()).map_err(|e| format!("{NAME_ENV}={name}: {e}"))?;
    let stream = UnixStream::connect_addr(&addr)
        .map_err(|e| format!("cannot reach the keeper that started this process ({NAME_ENV}={name}): {e}"))?;
    Ok(if std::env::var_os(STANDIN_ENV).is_some() { Role::StandIn(stream) } else { Role::Serving(stream) })
}

/// What `ctrl.info` says of this serving process's keeper (None: it has none).
pub fn facts() -> Option<crate::control::reply::KeeperFacts> {
    std::env::var_os(NAME_ENV)?;
    let restarts = std::env::var(STANDIN_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    Some(crate::control::reply::KeeperFacts {
        pid: rustix::process::getppid()?.as_raw_nonzero().get() as u32,
        restarts,
    })
}

/// Runs the keeper until the serving process ends for good.
pub fn run() -> Result<(), Box<dyn std::error::Error>> {
    let stop = crate::signals::stop_on_signals()?;
    let exe = std::env::current_exe()?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let name = format!("vnvme-keeper-{}-{:x}", std::process::id(), now.tv_nsec);
    let listener = UnixListener::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes())?)?;
    let mut kept: Option<Kept> = None;
    let mut restarts: Vec<Instant> = Vec::new();
    let mut restarts_total = 0u32;
    eprintln!(
        "vnvme keeper (pid {}): serving process restarted if it dies (--restart-on-crash; at most {MAX_RESTARTS} \
         restarts in {}s)",
        std::process::id(),
        RESTART_WINDOW.as_secs()
    );
    loop {
        let standin = kept.is_some();
        let mut cmd = Command::new(&exe);
        cmd.args(&args).env(NAME_ENV, &name);
        if standin {
            cmd.env(STANDIN_ENV, (restarts_total).to_string());
        } else {
            cmd.env_remove(STANDIN_ENV);
        }
        let mut child = cmd.spawn().map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
        // The entry a stand-in starts from stays the keeper's until the new
        // process journals its own (it may die before it does).
        let from = kept.take();
        let served = watch(&mut child, &listener, from.as_ref(), &mut kept, &stop);
        if kept.is_none() {
            kept = from;
        }
        let status = child.wait()?;
        if stop.is_requested() {
            eprintln!("vnvme keeper: stopped; the serving process {}", describe(status));
            return exit_as(status);
        }
        if status.success() {
            eprintln!(
                "vnvme keeper: the serving process (pid {}) ended on its own (exit 0: a stop, --once, or an \
                 upgrade's hand-over to a process the keeper does not watch); the keeper ends",
                child.id()
            );
            return Ok(());
        }
        let Some(k) = kept.as_ref() else {
            return Err(format!("the serving process {} before it served", describe(status)).into());
        };
        if !served && !standin {
            return Err(format!("the serving process {} before it served", describe(status)).into());
        }
        restarts.retain(|t| t.elapsed() < RESTART_WINDOW);
        if restarts.len() >= MAX_RESTARTS {
            return Err(format!(
                "the serving process {} and was restarted {MAX_RESTARTS} times in {}s: giving up",
                describe(status),
                RESTART_WINDOW.as_secs()
            )
            .into());
        }
        restarts.push(Instant::now());
        restarts_total += 1;
        eprintln!(
            "vnvme keeper: the serving process (pid {}) {}; starting another to stand in for it ({})",
            child.id(),
            describe(status),
            if k.has_client() {
                "the client stays connected; its guest sees Controller Fatal Status and resets the controller"
            } else {
                "no client was connected"
            }
        );
    }
}

/// Waits for `child` to report, hands it `standin_from` if it stands in, and reads
/// its journal into `kept` until it ends (or the keeper is asked to stop, which it
/// passes on). True if the child journaled at least once.
fn watch(
    child: &mut Child,
    listener: &UnixListener,
    standin_from: Option<&Kept>,
    kept: &mut Option<Kept>,
    stop: &vfio_user_server::server::Stop,
) -> bool {
    let Some(stream) = accept_from(child, listener, stop) else { return false };
    let Ok(mut journal) = JournalReader::new(stream) else { return false };
    if let Some(k) = standin_from {
        if let Err(e) = journal.hand_back(k, READY_WAIT) {
            eprintln!("vnvme keeper: the new serving process did not take the device over: {e}");
            let _ = rustix::process::kill_process(pid_of(child), rustix::process::Signal::KILL);
            return false;
        }
    }
    let mut served = false;
    loop {
        if stop.is_requested() {
            pass_on_stop(child);
            return served;
        }
        let mut fds = [PollFd::new(journal.stream(), PollFlags::IN)];
        let readable = matches!(poll(&mut fds, Some(&timespec(Duration::from_millis(100)))), Ok(n) if n > 0);
        if readable {
            match journal.read() {
                Ok(k) => {
                    *kept = Some(k);
                    served = true;
                }
                // The child's end closed: it is ending (or gave its keeper up).
                Err(_) => return served,
            }
        } else if matches!(child.try_wait(), Ok(Some(_))) {
            return served;
        }
    }
}

/// The connection of `child` to the keeper's socket (others are refused), or None
/// if it ended first.
fn accept_from(
    child: &mut Child,
    listener: &UnixListener,
    stop: &vfio_user_server::server::Stop,
) -> Option<UnixStream> {
    let until = Instant::now() + REPORT_WAIT;
    while Instant::now() < until {
        if stop.is_requested() {
            pass_on_stop(child);
            return None;
        }
        if matches!(child.try_wait(), Ok(Some(_))) {
            return None;
        }
        let mut fds = [PollFd::new(listener, PollFlags::IN)];
        if !matches!(poll(&mut fds, Some(&timespec(Duration::from_millis(100)))), Ok(n) if n > 0) {
            continue;
        }
        let Ok((s, _)) = listener.accept() else { continue };
        match rustix::net::sockopt::socket_peercred(&s) {
            Ok(c) if c.pid == pid_of(child) => return Some(s),
            _ => eprintln!("vnvme keeper: refused a connection from a process other than the serving one"),
        }
    }
    eprintln!("vnvme keeper: the serving process did not report within {}s", REPORT_WAIT.as_secs());
    let _ = rustix::process::kill_process(pid_of(child), rustix::process::Signal::KILL);
    None
}

fn pass_on_stop(child: &Child) {
    let _ = rustix::process::kill_process(pid_of(child), rustix::process::Signal::TERM);
}

fn pid_of(child: &Child) -> rustix::process::Pid {
    rustix::process::Pid::from_raw(child.id() as i32).expect("a child's PID is positive")
}

fn timespec(d: Duration) -> rustix::time::Timespec {
    rustix::time::Timespec { tv_sec: d.as_secs() as i64, tv_nsec: d.subsec_nanos() as i64 }
}

/// "exited with status 1", "was killed by signal 9 (SIGKILL)".
fn describe(s: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(sig)) => format!(
            "was killed by signal {sig}{}",
            match sig {
                libc::SIGKILL => " (SIGKILL)",
                libc::SIGSEGV => " (SIGSEGV)",
                libc::SIGABRT => " (SIGABRT: a panic or an abort)",
                libc::SIGBUS => " (SIGBUS)",
                libc::SIGTERM => " (SIGTERM)",
                _ => "",
            }
        ),
        _ => "ended".into(),
    }
}

/// The keeper's own result for a serving process that ended as `s`.
fn exit_as(s: ExitStatus) -> Result<(), Box<dyn std::error::Error>> {
    if s.success() {
        Ok(())
    } else {
        Err(format!("the serving process {}", describe(s)).into())
    }
}
