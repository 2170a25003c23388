//! `vnvme serve --restart-on-crash`: the controller outlives its process.
//!
//! The command's process becomes the keeper: it starts the serving process (the
//! same binary and arguments), holds what the VMM handed the device as the serving
//! process journals it (`vfio_user_server::keeper`), and if the serving process
//! dies (killed by a signal, or exiting with a failure once it had served), starts
//! another that stands in for it on the same client connection. The VMM never sees
//! its socket close; the guest hears of a Persistent Internal Error (and reads Controller Fatal Status)
//! and resets it (docs/subsystems.md: "A controller's process dies").
//!
//! The keeper serves nothing and reads only its own child's journal: the socket it
//! listens on (abstract, named for its PID) takes one connection per child, and
//! only from that child's PID. It stops when the serving process ends on its own
//! (exit 0: a stop, `--once`, an upgrade's hand-over), passes SIGTERM, SIGINT and
//! SIGQUIT (as SIGTERM) and SIGUSR1 on to it, ignores SIGHUP (`signals`), and gives up after [`MAX_RESTARTS`] restarts within [`RESTART_WINDOW`].

use crate::logging::say;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags};
use vfio_user_server::keeper::{JournalEvent, JournalReader, Kept};

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
/// How long a stand-in may take to restore the device once it has the journal
/// (its namespaces open then: the journal says which).
const READY_WAIT: Duration = REPORT_WAIT;

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
    set_link_from_env(&name);
    let addr =
        SocketAddr::from_abstract_name(name.as_bytes()).map_err(|e| format!("{NAME_ENV}={name}: {e}"))?;
    let stream = UnixStream::connect_addr(&addr)
        .map_err(|e| format!("cannot reach the keeper that started this process ({NAME_ENV}={name}): {e}"))?;
    Ok(if std::env::var_os(STANDIN_ENV).is_some() { Role::StandIn(stream) } else { Role::Serving(stream) })
}

/// This serving process's keeper, if it has one: its socket's name, PID, and how
/// many serving processes it had started to stand in for others before this one.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Link {
    pub name: String,
    pub pid: u32,
    pub restarts: u32,
}

static LINK: std::sync::OnceLock<Link> = std::sync::OnceLock::new();

/// The keeper this process reports to (set by [`role`], or by [`adopt`] after an
/// upgrade): what `ctrl.info` shows, and what an upgrade passes on.
pub fn link() -> Option<&'static Link> {
    LINK.get()
}

/// A process that took a device over from one with a keeper (an upgrade) reports
/// to that keeper: it watches this process from now on.
pub fn adopt(l: Link) -> Result<UnixStream, String> {
    let addr = SocketAddr::from_abstract_name(l.name.as_bytes()).map_err(|e| e.to_string())?;
    let s = UnixStream::connect_addr(&addr)
        .map_err(|e| format!("cannot reach the keeper (pid {}) of the process taken over: {e}", l.pid))?;
    let _ = LINK.set(l);
    Ok(s)
}

fn set_link_from_env(name: &str) {
    let restarts = std::env::var(STANDIN_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let pid = rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get() as u32);
    let _ = LINK.set(Link { name: name.to_string(), pid, restarts });
}

/// The process serving under the keeper: its child, or one it adopted (the
/// process an upgrade handed the device to, watched through a pidfd).
enum Serving {
    Child(Child),
    Adopted { pid: u32, fd: std::os::fd::OwnedFd },
}

impl Serving {
    fn pid(&self) -> u32 {
        match self {
            Serving::Child(c) => c.id(),
            Serving::Adopted { pid, .. } => *pid,
        }
    }

    fn has_exited(&mut self) -> bool {
        match self {
            Serving::Child(c) => matches!(c.try_wait(), Ok(Some(_))),
            Serving::Adopted { fd, .. } => {
                let mut fds = [PollFd::new(fd, PollFlags::IN)];
                matches!(poll(&mut fds, Some(&timespec(Duration::ZERO))), Ok(n) if n > 0)
            }
        }
    }

    fn signal(&self, sig: rustix::process::Signal) {
        if let Some(p) = rustix::process::Pid::from_raw(self.pid() as i32) {
            let _ = rustix::process::kill_process(p, sig);
        }
    }

    /// Waits for its end: its exit status if it was the keeper's child.
    fn wait(self) -> std::io::Result<Option<ExitStatus>> {
        match self {
            Serving::Child(mut c) => c.wait().map(Some),
            Serving::Adopted { fd, .. } => {
                let mut fds = [PollFd::new(&fd, PollFlags::IN)];
                let _ = poll(&mut fds, None);
                Ok(None)
            }
        }
    }
}

/// What the keeper learned from one serving process's journal.
#[derive(Default)]
struct Watched {
    /// It journaled at least once.
    served: bool,
    /// It said it ends on its own.
    ending: bool,
    /// It handed the device over to this PID (an upgrade).
    handed_to: Option<u32>,
    /// A takeover by this PID was under way (an upgrade asked for).
    takeover: Option<u32>,
}

/// Runs the keeper until the serving process ends for good (or `stop`, asked
/// by a signal, which it passes on).
pub fn run(stop: std::sync::Arc<vfio_user_server::server::Stop>) -> Result<(), Box<dyn std::error::Error>> {
    // SIGUSR1 goes to the process serving now.
    let serving_pid = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    {
        let pid = serving_pid.clone();
        crate::signals::on_report(move || {
            match rustix::process::Pid::from_raw(pid.load(std::sync::atomic::Ordering::Relaxed) as i32) {
                Some(p) => {
                    say!("vnvme keeper: SIGUSR1: passed to the serving process (pid {})", p.as_raw_nonzero());
                    let _ = rustix::process::kill_process(p, rustix::process::Signal::USR1);
                }
                None => say!("vnvme keeper: SIGUSR1: no serving process yet"),
            }
        });
    }
    // It holds a duplicate of every descriptor the device holds (each DMA region's
    // among them), twice while an entry replaces the last.
    if let Err(e) = vfio_user_server::dma::raise_fd_limit() {
        say!("vnvme keeper: cannot raise the descriptor limit ({e}): a device with many DMA regions may not be kept");
    }
    let mut exe = std::env::current_exe()?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let name = format!("vnvme-keeper-{}-{:x}", std::process::id(), now.tv_nsec);
    let listener = UnixListener::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes())?)?;
    let mut kept: Option<Kept> = None;
    let mut restarts: Vec<Instant> = Vec::new();
    let mut restarts_total = 0u32;
    say!(
        "vnvme keeper (pid {}): serving process restarted if it dies (--restart-on-crash; at most {MAX_RESTARTS} \
         restarts in {}s)",
        std::process::id(),
        RESTART_WINDOW.as_secs()
    );
    let mut adopt: Option<u32> = None;
    // The adopted process is one an upgrade was under way to when the serving one
    // died: it has not said it took the device over.
    let mut tentative = false;
    // The first message the last stand-in was handed to answer.
    let mut last_handed = vfio_user_server::keeper::LastHanded::default();
    // When the last serving process was seen to end.
    let mut died_at = Instant::now();
    loop {
        let mut standin = kept.is_some() && adopt.is_none();
        let mut serving = match adopt.take() {
            Some(pid) => {
                let fd = rustix::process::Pid::from_raw(pid as i32).ok_or("no such process").and_then(|p| {
                    rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty())
                        .map_err(|_| "the process is gone")
                });
                match fd {
                    Ok(fd) => {
                        // Restarts run what the upgrade brought in.
                        if let Ok(e) = std::fs::read_link(format!("/proc/{pid}/exe")) {
                            exe = e;
                        }
                        if !std::mem::take(&mut tentative) {
                            say!("vnvme keeper: watching pid {pid} now (the device was handed over to it)");
                        }
                        Serving::Adopted { pid, fd }
                    }
                    Err(why) => {
                        say!("vnvme keeper: the device was handed over to pid {pid}, but {why}");
                        continue_or_end(&mut kept)?;
                        // A stand-in, handed the last entry as any other is (it
                        // waited for one in vain before, and timed out).
                        standin = kept.is_some();
                        spawn(&exe, &args, &name, standin.then_some(restarts_total))?
                    }
                }
            }
            None => spawn(&exe, &args, &name, standin.then_some(restarts_total))?,
        };
        serving_pid.store(serving.pid(), std::sync::atomic::Ordering::Relaxed);
        // The entry a stand-in starts from stays the keeper's until the new
        // process journals its own (it may die before it does).
        let from = kept.take();
        let from_entry = from.as_ref().filter(|_| standin).map(|k| (k, died_at));
        let w = watch(&mut serving, &listener, from_entry, &mut kept, &stop, &mut last_handed);
        if kept.is_none() {
            kept = from;
        }
        let pid = serving.pid();
        let status = serving.wait()?;
        died_at = Instant::now();
        let said = match status {
            Some(s) => describe(s),
            None if w.ending || w.handed_to.is_some() => "ended".into(),
            None => "died".into(),
        };
        if stop.is_requested() {
            say!("vnvme keeper: stopped; the serving process {said}");
            return status.map_or(Ok(()), exit_as);
        }
        if let Some(next) = w.handed_to {
            adopt = Some(next);
            continue;
        }
        // Died during an upgrade: the process taking over may hold the device
        // already (all but the old one's GO), or its files: it takes the device
        // over (and reports here), or ends; only then is a stand-in started.
        if let Some(next) =
            w.takeover.filter(|&t| !w.ending && !status.is_some_and(|s| s.success()) && alive(t))
        {
            say!(
                "vnvme keeper: the serving process (pid {pid}) {said} during an upgrade: waiting for pid {next}, \
                 which takes the device over or ends (then a stand-in starts)"
            );
            adopt = Some(next);
            tentative = true;
            continue;
        }
        if w.ending || status.is_some_and(|s| s.success()) {
            say!("vnvme keeper: the serving process (pid {pid}) ended on its own (a stop or --once); the keeper ends");
            return Ok(());
        }
        let Some(k) = kept.as_ref() else {
            return Err(format!("the serving process {said} before it served").into());
        };
        restarts.retain(|t| t.elapsed() < RESTART_WINDOW);
        if restarts.len() >= MAX_RESTARTS {
            return Err(format!(
                "the serving process {said} and was restarted {MAX_RESTARTS} times in {}s: giving up",
                RESTART_WINDOW.as_secs()
            )
            .into());
        }
        restarts.push(Instant::now());
        restarts_total += 1;
        say!(
            "vnvme keeper: the serving process (pid {pid}) {said}; starting another to stand in for it ({})",
            if k.has_client() {
                "the client stays connected; its guest hears of a Persistent Internal Error and resets the controller"
            } else {
                "no client was connected"
            }
        );
    }
}

/// A handed-over device whose new process could not be watched: serve it again
/// from the journal (a stand-in), or end if there is none.
fn continue_or_end(kept: &mut Option<Kept>) -> Result<(), String> {
    if kept.is_none() {
        return Err("nothing to serve from: the keeper ends".into());
    }
    Ok(())
}

fn spawn(exe: &Path, args: &[String], name: &str, standin: Option<u32>) -> Result<Serving, String> {
    let mut cmd = Command::new(exe);
    cmd.args(args).env(NAME_ENV, name);
    match standin {
        Some(n) => cmd.env(STANDIN_ENV, n.to_string()),
        None => cmd.env_remove(STANDIN_ENV),
    };
    cmd.spawn().map(Serving::Child).map_err(|e| format!("cannot start {}: {e}", exe.display()))
}

/// Waits for the serving process to report, hands it `standin_from` if it stands
/// in, and reads its journal into `kept` until it ends (or the keeper is asked to
/// stop, which it passes on).
fn watch(
    serving: &mut Serving,
    listener: &UnixListener,
    standin_from: Option<(&Kept, Instant)>,
    kept: &mut Option<Kept>,
    stop: &vfio_user_server::server::Stop,
    last_handed: &mut vfio_user_server::keeper::LastHanded,
) -> Watched {
    let mut w = Watched::default();
    let Some(stream) = accept_from(serving, listener, stop) else { return w };
    let Ok(mut journal) = JournalReader::new(stream) else { return w };
    if let Some((k, died)) = standin_from {
        if let Err(e) = journal.hand_back(k, READY_WAIT, last_handed) {
            say!("vnvme keeper: the new serving process did not take the device over: {e}");
            serving.signal(rustix::process::Signal::KILL);
            return w;
        }
        say!(
            "vnvme keeper: the stand-in (pid {}) serves the device {:.1} ms after the death was seen",
            serving.pid(),
            died.elapsed().as_secs_f64() * 1e3
        );
    }
    loop {
        if stop.is_requested() {
            serving.signal(rustix::process::Signal::TERM);
            // The journal stays open until it has stopped: its end closing first
            // would read to it as its keeper lost.
            while !serving.has_exited() {
                std::thread::sleep(Duration::from_millis(10));
            }
            return w;
        }
        let mut fds = [PollFd::new(journal.stream(), PollFlags::IN)];
        let readable = matches!(poll(&mut fds, Some(&timespec(Duration::from_millis(100)))), Ok(n) if n > 0);
        if readable {
            match journal.read() {
                Ok(JournalEvent::Entry(mut k)) => {
                    k.follow(kept.take());
                    *kept = Some(*k);
                    w.served = true;
                }
                Ok(JournalEvent::RxFds(group)) => {
                    if let Some(k) = kept.as_mut() {
                        k.add_rx_fds(group);
                    }
                }
                Ok(JournalEvent::HandedTo(pid)) => w.handed_to = Some(pid),
                Ok(JournalEvent::Takeover(pid)) => w.takeover = Some(pid),
                Ok(JournalEvent::Ending) => w.ending = true,
                // The serving end closed: it is ending (or gave its keeper up).
                Err(_) => return w,
            }
        } else if serving.has_exited() {
            return w;
        }
    }
}

/// The connection of the serving process to the keeper's socket (others are
/// refused), or None if it ended first.
fn accept_from(
    serving: &mut Serving,
    listener: &UnixListener,
    stop: &vfio_user_server::server::Stop,
) -> Option<UnixStream> {
    let until = Instant::now() + REPORT_WAIT;
    while Instant::now() < until {
        if stop.is_requested() {
            serving.signal(rustix::process::Signal::TERM);
            return None;
        }
        if serving.has_exited() {
            return None;
        }
        let mut fds = [PollFd::new(listener, PollFlags::IN)];
        if !matches!(poll(&mut fds, Some(&timespec(Duration::from_millis(100)))), Ok(n) if n > 0) {
            continue;
        }
        let Ok((s, _)) = listener.accept() else { continue };
        match rustix::net::sockopt::socket_peercred(&s) {
            Ok(c) if c.pid.as_raw_nonzero().get() as u32 == serving.pid() => return Some(s),
            _ => say!("vnvme keeper: refused a connection from a process other than the serving one"),
        }
    }
    say!("vnvme keeper: the serving process did not report within {}s", REPORT_WAIT.as_secs());
    serving.signal(rustix::process::Signal::KILL);
    None
}

/// Whether process `pid` exists and has not exited (a zombie, exited and not yet
/// reaped, has). When /proc cannot be read (a sandbox), it is taken as alive.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(')').is_none_or(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(e) => e.kind() != std::io::ErrorKind::NotFound,
    }
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
