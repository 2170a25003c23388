//! What moves a device between processes (an upgrade's hand-over, `handover`) or
//! hosts (a live migration, `migration`), as the device holds it between messages:
//! a hand-over a job asked for, the migration state machine's state and stream,
//! the journal to a keeper (`keeper`), and the hex its bytes travel as.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

use vfio_user::proto::{
    MIG_STATE_ERROR, MIG_STATE_RESUMING, MIG_STATE_RUNNING, MIG_STATE_STOP, MIG_STATE_STOP_COPY,
};

/// A hand-over the server thread is asked to do (from a job): the new process's
/// connection, and what the caller adds.
#[derive(Debug)]
pub struct HandoverRequest {
    pub stream: UnixStream,
    pub extra: serde_json::Value,
    pub extra_fds: Vec<OwnedFd>,
    /// How long the quiesce may wait for commands in flight.
    pub quiesce: Duration,
    /// Told the outcome (true: handed over, GO sent). A thread that shares a
    /// listener with the new process (the control socket's) waits for it without
    /// accepting, and never accepts again once handed over: otherwise it could take
    /// a connection meant for the new process and close it as this one exits.
    pub done: Option<std::sync::mpsc::Sender<bool>>,
}

/// How long the serving process waits for its keeper to take a journal entry
/// before it gives the keeper up and serves on without one (`keeper`).
const JOURNAL_WAIT: Duration = Duration::from_secs(2);

/// The serving process's end of the journal.
#[derive(Debug)]
pub struct Journal {
    pub(crate) conn: vfio_user::Connection,
    pub(crate) listener: UnixListener,
    /// Something journaled has changed since the last entry.
    pub(crate) due: bool,
    /// The controller's format epoch at the last entry: a Format NVM since makes
    /// one due.
    pub(crate) format_epoch: u64,
    /// The client being served (a duplicate of its connection).
    pub(crate) client: Option<UnixStream>,
    /// The memory its connection keeps what it receives in (`vfio_user::rx`), and
    /// the stream offset through which what its messages did is in the last entry.
    pub(crate) client_rx: Option<OwnedFd>,
    pub(crate) rx_through: u64,
    /// What the caller keeps with each entry ([`crate::Device::journal_extra`]):
    /// vnvme's namespaces and QoS, and their descriptors.
    pub(crate) extra: serde_json::Value,
    pub(crate) extra_fds: Vec<OwnedFd>,
}

impl Journal {
    /// A journal to the keeper on `stream`, holding `listener` (the socket clients
    /// connect to) among what it keeps.
    pub fn new(stream: UnixStream, listener: &UnixListener) -> io::Result<Journal> {
        Ok(Journal {
            conn: vfio_user::Connection::with_deadline(stream, JOURNAL_WAIT)?,
            listener: listener.try_clone()?,
            due: true,
            format_epoch: 0,
            client: None,
            client_rx: None,
            rx_through: 0,
            extra: serde_json::Value::Null,
            extra_fds: Vec::new(),
        })
    }
}

/// A device's journal to its keeper, if it has one.
#[derive(Debug, Default)]
pub(crate) struct JournalSlot {
    pub(crate) current: Option<Journal>,
    /// It had a keeper, which is gone (died, killed, or stopped taking entries).
    pub(crate) lost: bool,
    /// The memory a client's connection keeps what it receives in
    /// (`vfio_user::rx`), made before the sandbox.
    pub(crate) rx_memory: Option<OwnedFd>,
}

/// `enum vfio_device_mig_state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum MigState {
    Error = MIG_STATE_ERROR,
    Stop = MIG_STATE_STOP,
    Running = MIG_STATE_RUNNING,
    StopCopy = MIG_STATE_STOP_COPY,
    Resuming = MIG_STATE_RESUMING,
}

/// For logs: the state's name in the vfio-user protocol, e.g. `STOP_COPY`.
impl std::fmt::Display for MigState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MigState::Error => "ERROR",
            MigState::Stop => "STOP",
            MigState::Running => "RUNNING",
            MigState::StopCopy => "STOP_COPY",
            MigState::Resuming => "RESUMING",
        })
    }
}

impl MigState {
    pub(crate) fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            MIG_STATE_ERROR => MigState::Error,
            MIG_STATE_STOP => MigState::Stop,
            MIG_STATE_RUNNING => MigState::Running,
            MIG_STATE_STOP_COPY => MigState::StopCopy,
            MIG_STATE_RESUMING => MigState::Resuming,
            _ => return None,
        })
    }
}

/// The migration side of a device.
#[derive(Debug)]
pub struct MigrationState {
    pub state: MigState,
    /// STOP_COPY: the stream, and how much the client has read.
    pub(crate) out: Vec<u8>,
    pub(crate) read: usize,
    /// RESUMING: what the client has written.
    pub(crate) inbuf: Vec<u8>,
}

impl Default for MigrationState {
    fn default() -> Self {
        MigrationState { state: MigState::Running, out: Vec::new(), read: 0, inbuf: Vec::new() }
    }
}

/// `b` as lowercase hex digits.
pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The bytes hex digits `s` stand for. What a client or an older process sent:
/// anything else than pairs of hex digits is refused (a multi-byte character is
/// not cut through).
pub(crate) fn unhex(s: &str) -> io::Result<Vec<u8>> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "bad hex in a saved device state");
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return Err(bad());
    }
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_what_is_not_hex() {
        let b = [0u8, 0x7f, 0xff, 0x10];
        assert_eq!(unhex(&hex(&b)).unwrap(), b);
        assert!(unhex("0").is_err());
        assert!(unhex("0g").is_err());
        // From a hostile client: a multi-byte character across a byte's two digits
        // is refused, not sliced through (which would panic).
        assert!(unhex("a\u{e9}b").is_err());
    }
}
