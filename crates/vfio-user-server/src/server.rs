//! The server loop: listen on a UNIX socket, serve one client at a time, and survive
//! clients that disconnect or send garbage.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};

use std::path::Path;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use std::time::Duration;

use nvme_ctrl::runtime::idle::{sleep_timeout_ms, IdleLoop, Next, WakeTimer};
use nvme_ctrl::{LogLimit, PollMode};
use tracing::{debug, info, warn};
use vfio_user::proto::{Header, MsgFlags};
use vfio_user::{Connection, ProtoError};
use zerocopy::little_endian::U32;

use crate::device::{Device, Reply};

/// Serves `device` to clients connecting on `listener`, one after another, until
/// `max_clients` have come and gone (None: forever).
pub fn serve(listener: &UnixListener, device: &mut Device, max_clients: Option<usize>) -> io::Result<()> {
    let mut served = 0;
    loop {
        if max_clients.is_some_and(|m| served >= m) {
            return Ok(());
        }
        let (stream, _) = listener.accept()?;
        served += 1;
        info!(client = served, "client connected");
        match serve_client(stream, device) {
            Ok(()) => info!(client = served, "client disconnected"),
            Err(e) => warn!(client = served, "client dropped: {e}"),
        }
        device.disconnect();
    }
}

/// Binds `path`, replacing a stale socket file left by an earlier run.
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    if path.exists() {
        match UnixStream::connect(path) {
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{} is in use by another server", path.display()),
                ))
            }
            Err(_) => std::fs::remove_file(path)?,
        }
    }
    UnixListener::bind(path)
}

/// Requests refused with an errno: a broken client can send them in a loop.
static REFUSED: LogLimit = LogLimit::new();

// What woke the server loop (epoll data).
const SOCKET: u64 = 0;
const EVENTS: u64 = 1;
const TIMER: u64 = 2;
const KICK: u64 = 3;
const NOTIFIER: u64 = 4;

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
    let epoll = Epoll::new()?;
    epoll.ctl(
        ControlOperation::Add,
        stream.as_raw_fd(),
        EpollEvent::new(EventSet::IN | EventSet::HANG_UP, SOCKET),
    )?;
    let events = device.event_fd();
    epoll.ctl(ControlOperation::Add, events.as_raw_fd(), EpollEvent::new(EventSet::IN, EVENTS))?;
    let mut inline = device.ctrl.inline_poll().map(|mode| Inline::new(mode, &epoll, device)).transpose()?;
    let mut conn = Connection::new(stream);
    let mut ready = [EpollEvent::default(); 8];
    let admin_tick = device.admin_poll_interval().map_or(-1, |d| d.as_millis().max(1) as i32);
    loop {
        let timeout = match inline.as_mut() {
            Some(i) => i.timeout(device),
            None => admin_tick,
        };
        let n = match epoll.wait(timeout, &mut ready) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        let mut socket_ready = false;
        for ev in &ready[..n] {
            match ev.data() {
                SOCKET => socket_ready = true,
                EVENTS => {
                    let _ = events.read();
                    device.ctrl.process();
                }
                TIMER => {
                    if let Some(i) = inline.as_mut() {
                        i.timer_fired();
                    }
                }
                // Doorbell kick and backend notifiers: `Inline::run` below.
                _ => {}
            }
        }
        if socket_ready && !handle_message(&mut conn, device)? {
            return Ok(());
        }
        match inline.as_mut() {
            Some(i) => i.run(device),
            // Admin poll tick (mapped doorbells: the admin doorbell is not trapped).
            None if n == 0 => {
                device.ctrl.process();
            }
            None => {}
        }
    }
}

/// Receives one message and answers it. False when the client has gone.
fn handle_message(conn: &mut Connection, device: &mut Device) -> Result<bool, ProtoError> {
    let msg = match conn.recv() {
        Ok(m) => m,
        Err(ProtoError::Closed) => return Ok(false),
        Err(e) => return Err(e),
    };
    let h = msg.header;
    let flags = MsgFlags(h.flags.get());
    if flags.is_reply() {
        warn!(msg_id = h.msg_id.get(), "unexpected reply from the client ignored");
        return Ok(true);
    }
    let no_reply = flags.no_reply();
    let cmd = h.command.get();
    let reply = match device.handle(msg) {
        Ok(r) => r,
        Err(e) => {
            if let Some(n) = REFUSED.hit() {
                warn!(target: "vnvme::client", cmd, errno = e.errno(), "request refused ({n} so far): {e}");
            }
            Reply::Err(e.errno())
        }
    };
    if no_reply {
        if let Reply::Err(errno) = reply {
            debug!(cmd, errno, "the refused request was posted: no error reply");
        }
        return Ok(true);
    }
    let mut rh = Header { msg_id: h.msg_id, command: h.command, ..Default::default() };
    match reply {
        Reply::Ok(payload, fds) => {
            rh.flags = U32::new(MsgFlags::REPLY);
            let raw = Device::raw_fds(&fds);
            conn.send(rh, &[&payload], &raw)?;
        }
        Reply::Err(errno) => {
            rh.flags = U32::new(MsgFlags::REPLY | MsgFlags::ERROR);
            rh.error = U32::new(errno as u32);
            conn.send(rh, &[], &[])?;
        }
    }
    Ok(true)
}

/// The queue-owning half of the loop in inline mode: [`serve_client`] asks it how
/// long to wait, and lets it step the controller's idle loop after every wake-up.
struct Inline {
    idle: IdleLoop,
    timer: WakeTimer,
    /// The last step said sleep: the next wait blocks.
    asleep: bool,
}

/// The longest an inline spin goes without looking at the socket (with EventIdx
/// stale the guest rings no I/O doorbell, so messages are rare while spinning).
const SPIN_SLICE: Duration = Duration::from_micros(20);

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
        for fd in notifiers {
            epoll.ctl(ControlOperation::Add, fd, EpollEvent::new(EventSet::IN, NOTIFIER))?;
        }
        debug!(?mode, "inline mode: this thread runs the I/O queues");
        Ok(Inline { idle: IdleLoop::new(mode), timer, asleep: false })
    }

    /// How long the next epoll wait may block (ms; -1 forever, 0 not at all).
    fn timeout(&mut self, device: &mut Device) -> i32 {
        if !self.asleep {
            return 0;
        }
        self.timer.arm(device.ctrl.next_deadline(), device.ctrl.clock_now_ns());
        sleep_timeout_ms(device.ctrl.inline_needs_polling())
    }

    fn timer_fired(&mut self) {
        self.timer.disarm();
    }

    /// Steps the idle loop: runs the controller and spins for at most a slice.
    fn run(&mut self, device: &mut Device) {
        let worked = device.take_progress();
        self.asleep = self.idle.step(&mut device.ctrl, worked, SPIN_SLICE, || false) == Next::Sleep;
    }
}

impl Drop for Inline {
    fn drop(&mut self) {
        let mode = self.idle.mode();
        info!("inline queues (poll {mode:?}): {}", self.idle.stats().describe(mode));
    }
}
