//! The server loop: listen on a UNIX socket, serve one client at a time, and survive
//! clients that disconnect or send garbage.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};

use std::path::Path;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

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

/// Handles one client's messages until it disconnects. Protocol errors in a message
/// are answered with an error reply; only a broken stream ends the session. Between
/// messages the loop also wakes when an I/O worker raises an asynchronous event, so
/// the admin side can complete an Asynchronous Event Request without waiting for the
/// guest's next register access.
pub fn serve_client(stream: UnixStream, device: &mut Device) -> Result<(), ProtoError> {
    let epoll = Epoll::new()?;
    epoll.ctl(
        ControlOperation::Add,
        stream.as_raw_fd(),
        EpollEvent::new(EventSet::IN | EventSet::HANG_UP, 0),
    )?;
    let events = device.event_fd();
    epoll.ctl(ControlOperation::Add, events.as_raw_fd(), EpollEvent::new(EventSet::IN, 1))?;
    let mut conn = Connection::new(stream);
    let mut ready = [EpollEvent::default(); 2];
    let timeout = device.admin_poll_interval().map_or(-1, |d| d.as_millis().max(1) as i32);
    loop {
        let n = match epoll.wait(timeout, &mut ready) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        let mut socket_ready = false;
        for ev in &ready[..n] {
            if ev.data() == 1 {
                let _ = events.read();
                device.ctrl.process();
            } else {
                socket_ready = true;
            }
        }
        if n == 0 {
            // Admin poll tick (mapped doorbells: the admin doorbell is not trapped).
            device.ctrl.process();
            continue;
        }
        if !socket_ready {
            continue;
        }
        let msg = match conn.recv() {
            Ok(m) => m,
            Err(ProtoError::Closed) => return Ok(()),
            Err(e) => return Err(e),
        };
        let h = msg.header;
        let flags = MsgFlags(h.flags.get());
        if flags.is_reply() {
            warn!(msg_id = h.msg_id.get(), "unexpected reply from the client ignored");
            continue;
        }
        let no_reply = flags.no_reply();
        let cmd = h.command.get();
        let reply = match device.handle(msg) {
            Ok(r) => r,
            Err(e) => {
                debug!(cmd, "request failed: {e}");
                Reply::Err(e.errno())
            }
        };
        if no_reply {
            if let Reply::Err(errno) = reply {
                warn!(cmd, errno, "posted request failed (no reply was wanted)");
            }
            continue;
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
    }
}
