//! The server loop: listen on a UNIX socket, serve one client at a time, and survive
//! clients that disconnect, send garbage or stall.
//!
//! A client is untrusted. A message that has begun to arrive must complete within
//! [`ServeOptions::deadline`] (QEMU's own 5 s by default) of its first byte, and a
//! reply must leave within it; a client that breaks either is evicted with a log
//! line saying why, the device is reset and the next client is served. Reading
//! never waits: the thread takes what has arrived and goes back to its other work
//! (in inline mode, the guest's I/O queues) until more comes or the deadline of the
//! message in progress is up.
//!
//! A client that connects while another is being served waits in a queue of one,
//! for at most the deadline: if the current client leaves by then (a VMM
//! reconnecting, whose old connection is still closing), it is served next;
//! otherwise its connection is closed and the log says why. Any further client
//! meanwhile is refused at once. Nobody waits unseen in the listen backlog.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};

use std::path::Path;
use std::sync::Arc;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use std::time::{Duration, Instant};

use nvme_ctrl::runtime::idle::{sleep_timeout_ms, IdleLoop, Next, NotifierWatch, WakeTimer};
use nvme_ctrl::PollMode;
use tracing::{debug, info, warn};
use vfio_user::proto::{Header, MsgFlags};
use vfio_user::socket::Partial;
use vfio_user::{Connection, Message, ProtoError};
use zerocopy::little_endian::U32;
use zerocopy::IntoBytes;

use crate::device::{Device, Reply};
use crate::fds::set_blocking;
use crate::jobs::DeviceJobs;
use crate::socket_file::SocketFile;

/// How the server treats its clients.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// How long a message may take to arrive once begun, and a reply to leave.
    pub deadline: Duration,
    /// Work other threads hand this one (a control socket): run between messages,
    /// and between clients.
    pub jobs: Option<Arc<DeviceJobs>>,
    /// Asked once the server is to stop (SIGTERM, SIGINT): the client being served
    /// leaves as if it had disconnected (its commands complete or fail, the device
    /// is reset) and [`serve_from`] returns.
    pub stop: Option<Arc<Stop>>,
    /// Fault injection, for the tests of a crash: die at a chosen message.
    pub die_on: Option<DieOn>,
}

/// Fault injection for the tests of a crash (`--restart-on-crash`): the process
/// aborts (SIGABRT) the moment it has read a chosen message, before it handles it,
/// as a crash there would: the `nth` message of a command (counted from the
/// process's start), or the message with a given ID (in every process that reads
/// it: a message that crashes whoever handles it).
#[derive(Clone, Debug)]
pub struct DieOn {
    at: DieAt,
    seen: Arc<std::sync::atomic::AtomicU32>,
}

#[derive(Clone, Copy, Debug)]
enum DieAt {
    Nth { command: u16, nth: u32 },
    Id(u16),
}

impl DieOn {
    /// At the `nth` message of `command`.
    pub fn new(command: u16, nth: u32) -> Self {
        DieOn { at: DieAt::Nth { command, nth }, seen: Arc::default() }
    }

    /// At the message with ID `msg_id`.
    pub fn at_id(msg_id: u16) -> Self {
        DieOn { at: DieAt::Id(msg_id), seen: Arc::default() }
    }

    fn check(&self, h: &vfio_user::Header) {
        let (command, id) = (h.command.get(), h.msg_id.get());
        let now = match self.at {
            DieAt::Nth { command: c, nth } => {
                c == command && self.seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 == nth
            }
            DieAt::Id(i) => i == id,
        };
        if now {
            warn!(command, msg_id = id, "dying on purpose at this message (fault injection)");
            // abort: a signal to itself, which a sandbox allows (no other kill).
            std::process::abort();
        }
    }
}

/// Fault injection for the upgrade tests: with `VNVME_TEST_KILL_AT=NAME` in its
/// environment, a process SIGKILLs itself when it reaches the point called NAME
/// (the hand-over's steps: `old:*` in the process handing over, `new:*` in the one
/// taking over), as a kill from outside landing there would. Says so first. Only
/// in a build with the `fault-injection` feature (the tests'); elsewhere nothing.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn kill_point(_name: &str) {}

/// See the other [`kill_point`]: this is the one that acts.
#[cfg(feature = "fault-injection")]
pub fn kill_point(name: &str) {
    static AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    if AT.get_or_init(|| std::env::var("VNVME_TEST_KILL_AT").ok()).as_deref() != Some(name) {
        return;
    }
    let line = format!("vnvme: killed at {name} (fault injection: VNVME_TEST_KILL_AT)\n");
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    // A signal to this thread (tgkill, which a sandbox allows): SIGKILL takes the
    // whole process.
    let _ =
        nix::sys::pthread::pthread_kill(nix::sys::pthread::pthread_self(), nix::sys::signal::Signal::SIGKILL);
}

/// A request to stop, from anywhere, a signal handler included: [`Stop::request`]
/// is a store and an eventfd write, both async-signal-safe.
#[derive(Debug)]
pub struct Stop {
    requested: std::sync::atomic::AtomicBool,
    fd: EventFd,
}

impl Stop {
    pub fn new() -> io::Result<Self> {
        Ok(Stop { requested: false.into(), fd: EventFd::new(vmm_sys_util::eventfd::EFD_NONBLOCK)? })
    }

    /// Asks every loop watching this to stop.
    pub fn request(&self) {
        self.requested.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = self.fd.write(1);
    }

    pub fn is_requested(&self) -> bool {
        self.requested.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Readable once stop is requested (never read: it stays so for every loop).
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions { deadline: DEFAULT_DEADLINE, jobs: None, stop: None, die_on: None }
    }
}

fn stopping(opts: &ServeOptions) -> bool {
    opts.stop.as_ref().is_some_and(|s| s.is_requested())
}

/// QEMU's own limit on a vfio-user reply (hw/vfio-user: 5 s).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(5);

/// Serves `device` to clients connecting on `listener`, one after another, until
/// `max_clients` have come and gone (None: forever).
pub fn serve(
    listener: &UnixListener,
    device: &mut Device,
    max_clients: Option<usize>,
    opts: &ServeOptions,
) -> io::Result<()> {
    serve_from(listener, device, None, max_clients, opts)
}

/// [`serve`], starting with `first` if given: the client a device was handed over
/// with (`handover`), already past VERSION and set up.
///
/// Returns early, leaving the client untouched, once the device has been handed
/// over to another process ([`Device::handed_over`]).
pub fn serve_from(
    listener: &UnixListener,
    device: &mut Device,
    mut first: Option<(UnixStream, Partial)>,
    max_clients: Option<usize>,
    opts: &ServeOptions,
) -> io::Result<()> {
    // Clients that sent at least one message: a connection closed before its first
    // (another server checking whether the socket is in use) is not one.
    let mut served = 0;
    let mut connections = 0;
    let mut waiting: Option<Waiting> = None;
    loop {
        if max_clients.is_some_and(|m| served >= m) || stopping(opts) {
            if let Some(w) = waiting.take() {
                refuse(w.stream, "the server is stopping");
            }
            return Ok(());
        }
        let (stream, partial) = match (first.take(), waiting.take()) {
            (Some(s), _) => s,
            (None, Some(w)) => (w.stream, Partial::default()),
            (None, None) => match accept(listener, device, opts)? {
                Some(s) => (s, Partial::default()),
                None => return Ok(()),
            },
        };
        connections += 1;
        info!(client = connections, "client connected");
        let mut traffic = Traffic::new(device);
        let r = session(stream, partial, device, Some((listener, &mut waiting)), opts, &mut traffic);
        if device.handed_over() {
            // The new process serves this client now; one waiting for its turn is
            // refused (it reconnects, as it would to a busy server).
            if let Some(w) = waiting.take() {
                refuse(w.stream, "the server was handed over to a new process");
            }
            return Ok(());
        }
        let t = traffic.summary(device);
        let stop = if stopping(opts) { "; the server is stopping" } else { "" };
        match r {
            Ok(()) if traffic.received == 0 => {
                info!(
                    client = connections,
                    "connection closed before its first message, not counted as a client{stop}"
                )
            }
            Ok(()) => info!(client = connections, "client disconnected ({t}){stop}"),
            Err(e @ ProtoError::Deadline { .. }) => warn!(client = connections, "client evicted: {e} ({t})"),
            Err(e) => warn!(client = connections, "client dropped: {e} ({t})"),
        }
        if traffic.received > 0 {
            served += 1;
        }
        device.disconnect();
        device.journal_client(None);
    }
}

/// Waits for the next client, running jobs meanwhile. None: the device was handed
/// over to another process meanwhile, or the server is to stop.
fn accept(
    listener: &UnixListener,
    device: &mut Device,
    opts: &ServeOptions,
) -> io::Result<Option<UnixStream>> {
    let epoll = Epoll::new()?;
    epoll.ctl(ControlOperation::Add, listener.as_raw_fd(), EpollEvent::new(EventSet::IN, LISTENER))?;
    if let Some(j) = &opts.jobs {
        epoll.ctl(ControlOperation::Add, j.fd(), EpollEvent::new(EventSet::IN, JOBS))?;
    }
    if let Some(s) = &opts.stop {
        epoll.ctl(ControlOperation::Add, s.fd(), EpollEvent::new(EventSet::IN, STOP))?;
    }
    watch_keeper(&epoll, device)?;
    let mut ready = [EpollEvent::default(); 4];
    loop {
        // State shared with other controllers (a namespace pool) is followed with
        // no client too: what a host or operator attaches elsewhere is here when
        // the next client comes.
        let tick = device.admin_poll_interval().map_or(-1, |d| d.as_millis().max(1) as i32);
        let n = match epoll.wait(tick, &mut ready) {
            Ok(0) => {
                device.run_controller();
                continue;
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        for ev in &ready[..n] {
            match (ev.data(), &opts.jobs) {
                (JOBS, Some(jobs)) => {
                    jobs.run_pending(device);
                    if device.hand_over_if_asked(None, Some(listener)) {
                        return Ok(None);
                    }
                }
                (STOP, _) => return Ok(None),
                (KEEPER, _) => keeper_gone(&epoll, device),
                _ => {}
            }
        }
        if ready[..n].iter().any(|ev| ev.data() == LISTENER) {
            // Readable means a connection is queued, but it may have gone again.
            set_blocking(listener, false)?;
            let accepted = listener.accept();
            set_blocking(listener, true)?;
            match accepted {
                Ok((s, _)) => {
                    set_blocking(&s, true)?;
                    return Ok(Some(s));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Binds `path` ([`SocketFile::bind`]: a stale socket file is replaced, a live one
/// or any other file refused and left as it is).
pub fn bind(path: &Path) -> io::Result<(UnixListener, SocketFile)> {
    SocketFile::bind(path, None)
}

/// Wakes the loop on `epoll` when the keeper hangs up (`--restart-on-crash`): only
/// hang-ups, since the keeper sends nothing once the process serves.
fn watch_keeper(epoll: &Epoll, device: &Device) -> io::Result<()> {
    if let Some(fd) = device.journal_fd() {
        epoll.ctl(
            ControlOperation::Add,
            fd,
            EpollEvent::new(EventSet::HANG_UP | EventSet::READ_HANG_UP, KEEPER),
        )?;
    }
    Ok(())
}

/// The keeper hung up: stop watching it (a hang-up stays readable) and serve on
/// without one.
fn keeper_gone(epoll: &Epoll, device: &mut Device) {
    if let Some(fd) = device.journal_fd() {
        let _ = epoll.ctl(ControlOperation::Delete, fd, EpollEvent::default());
    }
    device.keeper_gone();
}

// What woke the server loop (epoll data).
const SOCKET: u64 = 0;
const EVENTS: u64 = 1;
const TIMER: u64 = 2;
const KICK: u64 = 3;
const NOTIFIER: u64 = 4;
const LISTENER: u64 = 5;
const JOBS: u64 = 6;
const STOP: u64 = 7;
const KEEPER: u64 = 8;

/// Handles one client's messages until it disconnects. Protocol errors in a message
/// are answered with an error reply; only a broken stream ends the session. Between
/// messages the loop also wakes when an I/O worker raises an asynchronous event, so
/// the admin side can complete an Asynchronous Event Request without waiting for the
/// guest's next register access.
///
/// In inline mode (a controller without workers) this thread also owns the I/O
/// queues: it wakes for the doorbell kick eventfd, backend completions and
/// coalescing timers as well, and spins between bursts of work as the controller's
/// [`PollMode`] says (see [`nvme_ctrl::runtime::idle`]).
pub fn serve_client(stream: UnixStream, device: &mut Device) -> Result<(), ProtoError> {
    session(stream, Partial::default(), device, None, &ServeOptions::default(), &mut Traffic::new(device))
}

/// What one client's session exchanged, for the line logged when it ends: whether
/// messages stopped arriving (a stalled guest or VMM) or one went unanswered (a
/// stalled server), and what the guest's controller was doing meanwhile.
struct Traffic {
    since: Instant,
    received: u64,
    answered: u64,
    posted: u64,
    refused: u64,
    /// The last message's command.
    last_cmd: Option<u16>,
    /// When the socket last woke the loop (read once per wake-up, not per message).
    last_readable: Option<Instant>,
    /// Admin and I/O commands counted before the session, so its own are told apart.
    commands_before: (u64, u64),
}

impl Traffic {
    fn new(device: &Device) -> Self {
        let s = device.ctrl.stats();
        Traffic {
            since: Instant::now(),
            received: 0,
            answered: 0,
            posted: 0,
            refused: 0,
            last_cmd: None,
            last_readable: None,
            commands_before: (s.admin_commands, s.io_commands),
        }
    }

    fn summary(&self, device: &Device) -> String {
        let s = device.ctrl.stats();
        // A migration restored mid-session sets the counters to the source's, which
        // may be below where they stood when the session began.
        let (admin, io) = (s.admin_commands, s.io_commands);
        let restored = admin < self.commands_before.0 || io < self.commands_before.1;
        let (admin, io) =
            (admin.saturating_sub(self.commands_before.0), io.saturating_sub(self.commands_before.1));
        let last = match (self.last_cmd, self.last_readable) {
            (Some(cmd), Some(at)) => {
                format!(
                    "last message command {cmd}, socket last readable {} ms before the end",
                    at.elapsed().as_millis()
                )
            }
            _ => "no message".to_string(),
        };
        format!(
            "{:.1} s; {} messages received, {} answered, {} posted, {} refused; {last}; \
             NVMe commands: {admin} admin, {io} I/O{}",
            self.since.elapsed().as_secs_f64(),
            self.received,
            self.answered,
            self.posted,
            self.refused,
            if restored { " (counters restored from a migration stream during the session)" } else { "" },
        )
    }
}

/// A client that connected while another was being served.
#[derive(Debug)]
struct Waiting {
    stream: UnixStream,
    since: Instant,
}

/// [`serve_client`], with a listener whose new clients wait in `waiting` (a queue of
/// one, bounded by the deadline) or are refused. `partial`: the start of a message
/// the client had begun to send to the process this one took over from.
fn session(
    stream: UnixStream,
    partial: Partial,
    device: &mut Device,
    mut queue: Option<(&UnixListener, &mut Option<Waiting>)>,
    opts: &ServeOptions,
    traffic: &mut Traffic,
) -> Result<(), ProtoError> {
    let epoll = Epoll::new()?;
    if let Some((l, _)) = &queue {
        epoll.ctl(ControlOperation::Add, l.as_raw_fd(), EpollEvent::new(EventSet::IN, LISTENER))?;
    }
    epoll.ctl(
        ControlOperation::Add,
        stream.as_raw_fd(),
        EpollEvent::new(EventSet::IN | EventSet::HANG_UP | EventSet::READ_HANG_UP, SOCKET),
    )?;
    let events = device.event_fd();
    epoll.ctl(ControlOperation::Add, events.as_raw_fd(), EpollEvent::new(EventSet::IN, EVENTS))?;
    if let Some(j) = &opts.jobs {
        epoll.ctl(ControlOperation::Add, j.fd(), EpollEvent::new(EventSet::IN, JOBS))?;
    }
    if let Some(s) = &opts.stop {
        epoll.ctl(ControlOperation::Add, s.fd(), EpollEvent::new(EventSet::IN, STOP))?;
    }
    watch_keeper(&epoll, device)?;
    let mut inline = device.ctrl.inline_poll().map(|mode| Inline::new(mode, &epoll, device)).transpose()?;
    let mut conn = Connection::with_deadline(stream, opts.deadline)?;
    // Kept, what the client sends is kept where the keeper can hand it to a
    // stand-in, from the first byte (`keeper`).
    let rx = device.keep_received(&mut conn);
    if !partial.bytes.is_empty() {
        info!(
            bytes = partial.bytes.len(),
            descriptor_groups = partial.fds.len(),
            "what the client sent the process before this one and was not answered or not read whole there: \
             answered here first"
        );
    }
    conn.preload(partial)?;
    device.journal_client(Some((conn.stream(), rx)));
    // Where the descriptors not yet sent to the keeper begin.
    let mut fds_from = 0;
    // Whole messages handed over (a stand-in's: those the dead process had not
    // answered) are answered before anything is read.
    answer_buffered(&mut conn, device, traffic, &mut fds_from, opts.die_on.as_ref())?;
    let mut ready = [EpollEvent::default(); 8];
    loop {
        // A message that has begun must be complete by its deadline: evict the
        // client then, and wake for it meanwhile.
        let pending = conn.pending_deadline();
        if pending.is_some_and(|until| Instant::now() >= until) {
            return Err(conn.late());
        }
        let admin_tick = device.admin_poll_interval().map_or(-1, |d| d.as_millis().max(1) as i32);
        let mut timeout = match inline.as_mut() {
            Some(i) => i.timeout(device, &epoll),
            None => admin_tick,
        };
        if admin_tick >= 0 && (timeout < 0 || timeout > admin_tick) {
            timeout = admin_tick;
        }
        if let Some((_, Some(w))) = &queue {
            let left = opts.deadline.saturating_sub(w.since.elapsed()).as_millis() as i32 + 1;
            timeout = if timeout < 0 { left } else { timeout.min(left) };
        }
        if let Some(until) = pending {
            let left = until.saturating_duration_since(Instant::now()).as_millis() as i32 + 1;
            timeout = if timeout < 0 { left } else { timeout.min(left) };
        }
        let n = match epoll.wait(timeout, &mut ready) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        let mut socket_ready = false;
        let mut listener_ready = false;
        let mut client_leaving = false;
        for ev in &ready[..n] {
            match ev.data() {
                SOCKET => {
                    socket_ready = true;
                    client_leaving = ev.event_set().intersects(EventSet::HANG_UP | EventSet::READ_HANG_UP);
                }
                EVENTS => {
                    let _ = events.read();
                    device.run_controller();
                }
                TIMER => {
                    if let Some(i) = inline.as_mut() {
                        i.timer_fired();
                    }
                }
                LISTENER => listener_ready = true,
                // The server is to stop: the client leaves as if it had hung up.
                STOP => return Ok(()),
                JOBS => {
                    if let Some(j) = &opts.jobs {
                        j.run_pending(device);
                    }
                }
                KEEPER => keeper_gone(&epoll, device),
                // Doorbell kick and backend notifiers: `Inline::run` below.
                _ => {}
            }
        }
        // What has arrived, with one read that never waits (more than one message
        // usually comes with it: each whole one is handled; the start of the next
        // stays buffered, its deadline running).
        if socket_ready {
            traffic.last_readable = Some(Instant::now());
            match conn.fill() {
                Ok(_) => {}
                Err(ProtoError::Closed) => return Ok(()),
                Err(e) => return Err(e),
            }
            answer_buffered(&mut conn, device, traffic, &mut fds_from, opts.die_on.as_ref())?;
        }
        // A hand-over (asked for by a job) between whole messages; the start of one
        // that has begun goes with the connection.
        let listener = queue.as_ref().map(|(l, _)| *l);
        if device.hand_over_if_asked(Some(&conn), listener) {
            return Ok(());
        }
        if let Some((l, waiting)) = queue.as_mut() {
            queue_or_refuse(l, waiting, listener_ready && !client_leaving, opts.deadline);
        }
        match inline.as_mut() {
            Some(i) => i.run(device),
            // Admin poll tick (mapped doorbells: the admin doorbell is not trapped;
            // an erasing Format in progress).
            None if n == 0 || device.ctrl.admin_busy() => {
                device.ctrl.process();
            }
            None => {}
        }
    }
}

/// Takes clients that connect while another is being served: the first waits (up to
/// `limit`) to be served next, others are refused at once; a waiter whose time is
/// up is refused. `pending`: the listener has a connection queued (and our client
/// is not just leaving, in which case the backlog is where it should wait).
fn queue_or_refuse(listener: &UnixListener, waiting: &mut Option<Waiting>, pending: bool, limit: Duration) {
    if waiting.as_ref().is_some_and(|w| w.since.elapsed() >= limit) {
        let w = waiting.take().expect("checked");
        refuse(w.stream, "it waited the deadline for another client to leave");
    }
    if !pending {
        return;
    }
    // Readable means a connection is queued, but it may have gone again: don't block.
    let _ = set_blocking(listener, false);
    let accepted = listener.accept();
    let _ = set_blocking(listener, true);
    let Ok((stream, _)) = accepted else { return };
    if waiting.is_none() {
        debug!("a client connected while another is being served: it waits up to {limit:?}");
        *waiting = Some(Waiting { stream, since: Instant::now() });
    } else {
        refuse(stream, "another client is being served and one is already waiting");
    }
}

/// Closes a client's connection, with a (rate-limited) log line saying why.
fn refuse(stream: UnixStream, why: &str) {
    log_limit::limited_warn!(target: "vnvme::client", "refused a client: {why}");
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// Answers every whole message read; the descriptors that came with them go to the
/// keeper first, if there is one (`fds_from`: where those not yet sent begin).
fn answer_buffered(
    conn: &mut Connection,
    device: &mut Device,
    traffic: &mut Traffic,
    fds_from: &mut u64,
    die_on: Option<&DieOn>,
) -> Result<(), ProtoError> {
    if device.is_kept() && conn.has_fds_from(*fds_from) {
        match conn.fds_read_from(*fds_from) {
            Ok((groups, next)) => {
                device.journal_rx_fds(groups);
                *fds_from = next;
            }
            Err(e) => warn!("the client's descriptors are not kept for a stand-in: {e}"),
        }
    }
    while let Some(msg) = conn.next_message()? {
        if let Some(d) = die_on {
            d.check(&msg.header);
        }
        handle_message(conn, msg, device, traffic)?;
    }
    // The doorbells those messages wrote, at once.
    device.after_reply();
    Ok(())
}

/// Answers one message.
fn handle_message(
    conn: &mut Connection,
    mut msg: Message,
    device: &mut Device,
    traffic: &mut Traffic,
) -> Result<(), ProtoError> {
    let h = msg.header;
    traffic.received += 1;
    traffic.last_cmd = Some(h.command.get());
    let flags = MsgFlags(h.flags.get());
    if flags.is_reply() {
        log_limit::limited_warn!(target: "vnvme::client", msg_id = h.msg_id.get(), "unexpected reply from the client ignored");
        conn.answered();
        return Ok(());
    }
    let no_reply = flags.no_reply();
    let cmd = h.command.get();
    let reply = match device.handle(&mut msg) {
        Ok(r) => r,
        Err(e) => {
            log_limit::limited_warn!(target: "vnvme::client", cmd, errno = e.errno(), "request refused: {e}");
            traffic.refused += 1;
            Reply::Err(e.errno())
        }
    };
    // What the client is told is done is journaled first (`keeper`), then the
    // message is marked answered: a stand-in answers neither it nor what the
    // journal holds again.
    if device.journal_due() {
        device.journal_through(conn.taken_through());
        device.write_journal();
    }
    conn.answered();
    // The next message's payload goes into this one's buffer: no allocation per message.
    conn.recycle(msg.payload);
    if no_reply {
        traffic.posted += 1;
        if let Reply::Err(errno) = reply {
            debug!(cmd, errno, "the refused request was posted: no error reply");
        }
        return Ok(());
    }
    let mut rh = Header { msg_id: h.msg_id, command: h.command, ..Default::default() };
    match reply {
        Reply::Ok(payload, fds) => {
            rh.flags = U32::new(MsgFlags::REPLY);
            let raw = Device::raw_fds(&fds);
            conn.send(rh, &[&payload], &raw)?;
        }
        Reply::Access(a) => {
            rh.flags = U32::new(MsgFlags::REPLY);
            conn.send(rh, &[a.as_bytes()], &[])?;
        }
        Reply::Err(errno) => {
            rh.flags = U32::new(MsgFlags::REPLY | MsgFlags::ERROR);
            rh.error = U32::new(errno as u32);
            conn.send(rh, &[], &[])?;
        }
    }
    traffic.answered += 1;
    Ok(())
}

/// The queue-owning half of the loop in inline mode: [`serve_client`] asks it how
/// long to wait, and lets it step the controller's idle loop after every wake-up.
struct Inline {
    idle: IdleLoop,
    timer: WakeTimer,
    /// The last step said sleep: the next wait blocks.
    asleep: bool,
    notifiers: NotifierWatch,
}

/// The longest an inline spin goes without looking at the socket (with EventIdx
/// stale the guest rings no I/O doorbell, so messages are rare while spinning).
const SPIN_SLICE: Duration = Duration::from_micros(20);

/// How many more runs that find work an inline step takes before the socket is
/// looked at again.
const BUSY_RUNS: u32 = 8;

impl Inline {
    fn new(mode: PollMode, epoll: &Epoll, device: &Device) -> io::Result<Self> {
        let timer = WakeTimer::new()?;
        epoll.ctl(ControlOperation::Add, timer.fd(), EpollEvent::new(EventSet::IN, TIMER))?;
        let (kick, notifiers) = device.ctrl.inline_wake_fds();
        // The kick is shared and never drained: edge triggered.
        epoll.ctl(
            ControlOperation::Add,
            kick,
            EpollEvent::new(EventSet::IN | EventSet::EDGE_TRIGGERED, KICK),
        )?;
        let mut watch = NotifierWatch::new(NOTIFIER);
        watch.sync(epoll, device.ctrl.inline_notifier_generation(), || notifiers)?;
        debug!(%mode, "inline mode: this thread runs the I/O queues");
        let idle = IdleLoop::judged(mode, device.ctrl.spin_judge());
        Ok(Inline { idle, timer, asleep: false, notifiers: watch })
    }

    /// How long the next epoll wait may block (ms; -1 forever, 0 not at all).
    fn timeout(&mut self, device: &mut Device, epoll: &Epoll) -> i32 {
        if !self.asleep {
            return 0;
        }
        // Namespaces added or removed since the last wait bring or take notifiers.
        let generation = device.ctrl.inline_notifier_generation();
        if let Err(e) = self.notifiers.sync(epoll, generation, || device.ctrl.inline_wake_fds().1) {
            warn!("cannot watch a backend's notifier ({e}): its completions are seen only when something else wakes this thread");
        }
        self.timer.arm(device.ctrl.next_deadline(), device.ctrl.clock_now_ns());
        sleep_timeout_ms(device.ctrl.inline_needs_polling())
    }

    fn timer_fired(&mut self) {
        self.timer.fired();
    }

    /// Steps the idle loop: runs the controller and spins for at most a slice.
    fn run(&mut self, device: &mut Device) {
        // The socket was looked at just before this (the wait that led here).
        let looked = Instant::now();
        let worked = device.take_progress();
        let mut next = self.idle.step(&mut device.ctrl, worked, SPIN_SLICE, || false);
        if next == Next::Run && self.idle.mode() == PollMode::Off {
            // Polling off, a step that found work asks for one more run before
            // sleeping: take it now, not after an epoll_wait that cannot block (a
            // system call per command at QD 1). A message that arrives meanwhile is
            // seen by the wait that follows; busy or not, the socket is looked at
            // every second run. No message was handled in between: no owner's work.
            next = self.idle.step(&mut device.ctrl, false, SPIN_SLICE, || false);
        }
        // Queues that keep finding work run again before the socket is looked at (an
        // epoll_wait per run was a twentieth of a busy poller's time), at most
        // BUSY_RUNS more times, and never spinning: a run that finds nothing goes back
        // to the socket first.
        let mut runs = 0;
        while next == Next::Run && self.idle.found_work() && runs < BUSY_RUNS {
            next = self.idle.step(&mut device.ctrl, false, Duration::ZERO, || false);
            runs += 1;
        }
        // Polling, queues that just ran dry spin on until a slice has passed since the
        // socket was looked at, rather than go back to it at once: at QD 1 a run
        // after each command finds nothing (the host has not seen the completion yet),
        // and an epoll_wait there, one per command, was in the path of the next
        // doorbell. Messages wait no longer than a spin already lets them.
        if self.idle.mode() != PollMode::Off {
            while next == Next::Run {
                let since = looked.elapsed();
                if since >= SPIN_SLICE {
                    break;
                }
                next = self.idle.step(&mut device.ctrl, false, SPIN_SLICE - since, || false);
            }
        }
        self.asleep = next == Next::Sleep;
    }
}

impl Drop for Inline {
    fn drop(&mut self) {
        let mode = self.idle.mode();
        info!("inline queues (--poll {mode}): {}", self.idle.stats().describe(mode));
    }
}
