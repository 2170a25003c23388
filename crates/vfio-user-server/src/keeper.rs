//! Outliving the serving process: when it dies (a crash, the OOM killer, `kill
//! -9`), the client keeps its connection and a new process stands in.
//!
//! A keeper process (vnvme's `serve --restart-on-crash`) starts the serving process
//! and holds, for as long as it runs, what the client has handed the device: a
//! duplicate of the client's connection and of the listening socket, the DMA
//! regions' memory, the interrupt eventfds, the doorbell page and kick, the PCI
//! config space and MSI-X table. The serving process journals them to the keeper
//! ([`Journal`]) whenever they change: after VERSION, DMA_MAP and DMA_UNMAP,
//! SET_IRQS, a device reset, a write to config space, to the MSI-X table or to CC,
//! and when a client comes or goes; the entry goes before the reply, so what a
//! client was told is done is in the journal. A Format NVM that changed a
//! namespace's format is journaled with the next message (`Journal::format_epoch`);
//! what the caller adds ([`Device::journal_extra`]: vnvme's namespaces and QoS)
//! goes when the caller says. None of these is on the I/O path:
//! an I/O command costs the journal one flag test.
//!
//! Since the keeper holds the connection, the client sees no hang-up when the
//! serving process dies. The keeper starts another, hands it the last entry
//! ([`Kept::hand_back`]: the hand-over's framing and two phases, `handover`), and
//! the new process restores the PCI function from it. The controller's state (its
//! queues, the commands in flight) died with the old process; the new controller
//! stands in for it as one with Controller Fatal Status
//! (`Controller::stand_in_after_crash`): the host's next timeout reads CSTS.CFS
//! and resets the controller, and its multipath layer retries what timed out on
//! another path meanwhile.
//!
//! What the dead process had read from the client and not answered is not lost:
//! the client's connection keeps what it receives in memory the keeper holds
//! (`vfio_user::rx`), and the descriptors that came with it go to the keeper as
//! they arrive, before their messages are handled. The keeper hands the stand-in
//! the stream from the first message not answered (or from where the last entry
//! says what the messages did is kept, whichever is later) to the last byte read,
//! with those descriptors; the stand-in answers those messages first, and reads
//! the rest of a message half read. A message is marked answered just before its
//! reply goes, so no reply goes twice; what is lost is a reply the process was
//! killed between marking and sending (a few instructions), or between a journal
//! entry and the reply it came before.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use tracing::{debug, warn};
use vfio_user::Connection;
use zerocopy::FromBytes;

use crate::device::Device;
use crate::handover::{
    await_ready, recv_saved_after, send, send_saved, DeviceSaved, PartialSaved, Parts, MSG_ENDING,
    MSG_HANDED_TO, MSG_RX_FDS, MSG_TAKEOVER,
};
use crate::transfer::hex;
pub use crate::transfer::Journal;
use vfio_user::socket::FdGroup;

/// The most bytes of state a journal entry may have (it holds no controller state:
/// config space, MSI-X table and DMA regions, a few KiB).
pub const JOURNAL_LIMIT: usize = 4 << 20;

impl Device {
    /// Journals to a keeper from now on (the first entry goes at once).
    pub fn keep_with(&mut self, j: Journal) {
        self.journal.current = Some(j);
        self.write_journal();
    }

    /// Makes the memory a client's connection keeps what it receives in, so that a
    /// stand-in answers what this process read and did not (see the module's doc).
    /// Call it before entering a sandbox, which would not allow it.
    pub fn prepare_keeping(&mut self) -> io::Result<()> {
        self.journal.rx_memory = Some(vfio_user::rx::kept_memory()?);
        Ok(())
    }

    /// The memory a client's connection keeps what it receives in, if made (for
    /// checks of what it holds: `vfio_user::rx::unanswered`).
    pub fn kept_memory(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.journal.rx_memory.as_ref().map(std::os::fd::AsFd::as_fd)
    }

    /// With a keeper, has `conn` (a new client's) keep what it receives where the
    /// keeper can hand it to a stand-in: that memory, for the journal.
    pub(crate) fn keep_received(&self, conn: &mut Connection) -> Option<OwnedFd> {
        self.journal.current.as_ref()?;
        let Some(memory) = self.journal.rx_memory.as_ref() else {
            warn!("no receive memory was prepared: what the client sends is not kept for a stand-in");
            return None;
        };
        match conn.keep_received(memory).and_then(|()| memory.try_clone()) {
            Ok(fd) => Some(fd),
            Err(e) => {
                warn!("what the client sends is not kept for a stand-in: {e}");
                None
            }
        }
    }

    /// Whether this device journals to a keeper.
    pub fn is_kept(&self) -> bool {
        self.journal.current.is_some()
    }

    /// It had a keeper, and the keeper is gone: a crash of this process now ends
    /// the client's session.
    pub fn keeper_lost(&self) -> bool {
        self.journal.lost
    }

    /// The journal's connection, for the server loop to watch: the keeper's end
    /// hangs up when the keeper dies.
    pub(crate) fn journal_fd(&self) -> Option<std::os::fd::RawFd> {
        self.journal.current.as_ref().map(|j| std::os::fd::AsRawFd::as_raw_fd(j.conn.stream()))
    }

    /// The keeper hung up (it died or was killed): this process serves on without
    /// one. Said once, as an error: the operator has lost what `--restart-on-crash`
    /// gave, until the server is started again.
    pub(crate) fn keeper_gone(&mut self) {
        if self.journal.current.take().is_some() {
            self.journal.lost = true;
            tracing::error!(
                "the keeper is gone (it died or was killed): this process serves on, but nothing stands \
                 in for it if it dies now (the client's session would end); start the server again to be \
                 kept"
            );
        }
    }

    /// Something journaled changed: the next [`Self::write_journal`] writes an entry.
    pub(crate) fn journal_changed(&mut self) {
        if let Some(j) = self.journal.current.as_mut() {
            j.due = true;
        }
    }

    /// What the caller keeps with every entry from now on (replacing what it kept
    /// before), with its descriptors: a stand-in finds them in
    /// [`DeviceSaved::extra`](crate::handover::DeviceSaved) and `extra_fds`.
    /// Journaled now, before the operator who changed them is answered.
    pub fn journal_extra(&mut self, extra: serde_json::Value, fds: Vec<OwnedFd>) {
        let Some(j) = self.journal.current.as_mut() else { return };
        j.extra = extra;
        j.extra_fds = fds;
        self.journal_now();
    }

    /// An operator changed what a stand-in keeps (the ANA states): journaled now,
    /// before the operator is answered.
    pub fn journal_now(&mut self) {
        self.journal_changed();
        self.write_journal();
    }

    /// A client came (`Some`: its connection, and the memory the connection keeps
    /// what it receives in) or went (`None`): journaled now.
    pub(crate) fn journal_client(&mut self, client: Option<(&UnixStream, Option<OwnedFd>)>) {
        let Some(j) = self.journal.current.as_mut() else { return };
        let (stream, rx) = client.unzip();
        match stream.map(UnixStream::try_clone).transpose() {
            Ok(c) => j.client = c,
            Err(e) => warn!("cannot keep the client's connection for the keeper: {e}"),
        }
        (j.client_rx, j.rx_through) = (rx.flatten(), 0);
        self.journal_now();
    }

    /// What the client's messages did, through stream offset `at`, goes into the
    /// next entry (a stand-in does not do it again).
    pub(crate) fn journal_through(&mut self, at: u64) {
        if let Some(j) = self.journal.current.as_mut() {
            j.rx_through = at;
        }
    }

    /// Descriptors the client sent, to the keeper before their messages are
    /// handled: a stand-in answers those messages with them. A keeper that does not
    /// take them is given up, as for an entry.
    pub(crate) fn journal_rx_fds(&mut self, groups: Vec<FdGroup>) {
        let Some(j) = self.journal.current.as_mut() else { return };
        for (start, end, fds) in groups {
            let mut range = start.to_le_bytes().to_vec();
            range.extend_from_slice(&end.to_le_bytes());
            if let Err(e) = send(&mut j.conn, MSG_RX_FDS, &range, &fds) {
                return self.keeper_refused("the client's descriptors", e);
            }
        }
    }

    /// The keeper did not take `what`: this process serves on without one.
    fn keeper_refused(&mut self, what: &str, e: io::Error) {
        self.journal.current = None;
        self.journal.lost = true;
        warn!(
            "the keeper did not take {what} ({e}): serving on without one (a crash of this process now \
             ends the client's session)"
        );
    }

    /// The device was handed over to process `pid` (an upgrade): the keeper
    /// watches that process from now on.
    pub(crate) fn journal_handed_to(&mut self, pid: u32) {
        if let Some(j) = self.journal.current.as_mut() {
            if let Err(e) = send(&mut j.conn, MSG_HANDED_TO, &pid.to_le_bytes(), &[]) {
                warn!("the keeper was not told of the hand-over to pid {pid}: {e}");
            }
        }
    }

    /// A takeover by process `pid` is under way (an upgrade): if this process dies
    /// now, the keeper waits for that one (it takes the device over, or ends)
    /// before it stands in.
    pub fn journal_takeover(&mut self, pid: u32) {
        if let Some(j) = self.journal.current.as_mut() {
            if let Err(e) = send(&mut j.conn, MSG_TAKEOVER, &pid.to_le_bytes(), &[]) {
                warn!("the keeper was not told of the takeover by pid {pid}: {e}");
            }
        }
    }

    /// This process ends on its own (a stop, `--once`): the keeper restarts
    /// nothing.
    pub fn journal_end(&mut self) {
        if let Some(mut j) = self.journal.current.take() {
            let _ = send(&mut j.conn, MSG_ENDING, &[], &[]);
        }
    }

    pub(crate) fn journal_due(&self) -> bool {
        self.journal.current.as_ref().is_some_and(|j| j.due || j.format_epoch != self.ctrl.format_epoch())
    }

    /// Writes an entry if one is due. A keeper that does not take it is given up
    /// (logged): the device serves on, without one.
    pub(crate) fn write_journal(&mut self) {
        let Some(mut j) = self.journal.current.take() else { return };
        let format_epoch = self.ctrl.format_epoch();
        if !j.due && j.format_epoch == format_epoch {
            self.journal.current = Some(j);
            return;
        }
        let extra_fds = match j.extra_fds.iter().map(|f| f.try_clone()).collect::<io::Result<Vec<_>>>() {
            Ok(fds) => fds,
            Err(e) => {
                // Kept for the next entry: this one goes without what the caller added.
                warn!("cannot journal what the server keeps for a stand-in ({e}): journaling without it");
                Vec::new()
            }
        };
        let extra =
            if extra_fds.len() == j.extra_fds.len() { j.extra.clone() } else { serde_json::Value::Null };
        let parts = Parts {
            controller: None,
            quiesced_at_ns: 0,
            client: j.client.as_ref(),
            partial: None,
            client_rx: j.client_rx.as_ref(),
            rx_through: j.rx_through,
            listener: Some(&j.listener),
            extra,
            extra_fds,
        };
        match self.saved(parts).and_then(|(saved, fds)| send_saved(&mut j.conn, &saved, &fds).map(|()| saved))
        {
            Ok(saved) => {
                debug!(
                    dma_regions = saved.dma.len(),
                    client = saved.client.is_some(),
                    "journaled to the keeper"
                );
                (j.due, j.format_epoch) = (false, format_epoch);
                self.journal.current = Some(j);
            }
            Err(e) => self.keeper_refused("the journal", e),
        }
    }
}

/// The keeper's copy of the last journal entry: the state and its descriptors,
/// and the descriptors the client sent since (`MSG_RX_FDS`).
#[derive(Debug)]
pub struct Kept {
    pub saved: DeviceSaved,
    fds: Vec<OwnedFd>,
    rx_fds: Vec<FdGroup>,
}

/// The most descriptor groups a keeper holds for messages not yet answered: a
/// client sends a few at a time (a burst of DMA_MAPs), each group bounded by
/// `MAX_FDS`; a serving process that sends more (taken over by a hostile client)
/// has the oldest dropped.
const RX_FD_GROUPS: usize = 64;

impl Kept {
    /// A client was connected at the last entry.
    pub fn has_client(&self) -> bool {
        self.saved.client.is_some()
    }

    /// The client's connection's kept receive memory.
    fn rx(&self) -> Option<&OwnedFd> {
        self.saved.client_rx.and_then(|i| self.fds.get(i))
    }

    /// Takes over what the previous entry, `prev`, holds of the client's
    /// descriptors, if it is the same connection (the same socket; the receive
    /// memory serves one connection after another).
    pub fn follow(&mut self, prev: Option<Kept>) {
        let id = |k: &Kept| {
            k.rx()?;
            let client = k.saved.client.and_then(|i| k.fds.get(i))?;
            rustix::fs::fstat(client).ok().map(|st| (st.st_dev, st.st_ino))
        };
        if let Some(p) = prev.filter(|p| id(p).is_some() && id(p) == id(self)) {
            self.rx_fds = p.rx_fds;
            self.prune();
        }
    }

    /// Descriptors the client sent, to be handed to a stand-in with the messages
    /// they came with if those are not answered.
    pub fn add_rx_fds(&mut self, group: FdGroup) {
        self.rx_fds.push(group);
        self.prune();
    }

    /// Drops what came with messages answered since, and the oldest beyond the bound.
    fn prune(&mut self) {
        let answered = self.rx().and_then(|f| vfio_user::rx::answered_through(f).ok());
        if let Some(at) = answered {
            self.rx_fds.retain(|(_, end, _)| *end > at);
        }
        if self.rx_fds.len() > RX_FD_GROUPS {
            let over = self.rx_fds.len() - RX_FD_GROUPS;
            warn!("more than {RX_FD_GROUPS} groups of the client's descriptors outstanding: the oldest {over} dropped");
            self.rx_fds.drain(..over);
        }
    }

    /// The entry as a stand-in takes it: what the dead process had received and
    /// not answered becomes the start of the client's stream (`client_partial`),
    /// with the descriptors that came with it; the stand-in keeps its own receive
    /// memory. Duplicates: the keeper keeps its own.
    ///
    /// A message that the last stand-in was handed first and died on before it
    /// answered it (`last`) is not handed again: its reply is lost, as before this
    /// hand-over existed, rather than every stand-in dying on it in turn until the
    /// keeper gives up.
    fn for_stand_in(&self, last: &mut LastHanded) -> io::Result<(DeviceSaved, Vec<OwnedFd>)> {
        let mut saved = self.saved.clone();
        let mut fds = self.fds.iter().map(OwnedFd::try_clone).collect::<io::Result<Vec<_>>>()?;
        saved.client_rx = None;
        let Some(rx) = self.rx() else { return Ok((saved, fds)) };
        match vfio_user::rx::unanswered(rx, self.saved.client_rx_through) {
            Ok((mut from, mut bytes)) => {
                if let Some(first) = last.0.take().filter(|f| bytes.starts_with(f)) {
                    let h = vfio_user::Header::read_from_prefix(&first).map(|(h, _)| h).unwrap_or_default();
                    warn!(
                        command = h.command.get(),
                        msg_id = h.msg_id.get(),
                        "a stand-in died on the first message it was handed, before answering it: the next \
                         is not handed it (its reply is lost)"
                    );
                    bytes.drain(..first.len());
                    from += first.len() as u64;
                }
                last.0 = first_message(&bytes);
                if bytes.is_empty() {
                    return Ok((saved, fds));
                }
                let mut groups = Vec::new();
                for (s, e, group) in self.rx_fds.iter().filter(|(_, e, _)| *e > from) {
                    let mut idx = Vec::new();
                    for f in group {
                        fds.push(f.try_clone()?);
                        idx.push(fds.len() - 1);
                    }
                    groups.push((s.saturating_sub(from), e - from, idx));
                }
                debug!(
                    bytes = bytes.len(),
                    descriptor_groups = groups.len(),
                    "handing the stand-in what was not answered"
                );
                saved.client_partial = Some(PartialSaved { bytes: hex(&bytes), age_ns: 0, fds: groups });
            }
            Err(e) => warn!(
                "what the dead process had received cannot be read ({e}): requests it had read and not \
                 answered go unanswered"
            ),
        }
        Ok((saved, fds))
    }
}

/// The first message the keeper last handed a stand-in to answer (see
/// [`Kept`]'s hand-over): one the stand-in died on is not handed again.
#[derive(Debug, Default)]
pub struct LastHanded(Option<Vec<u8>>);

/// The first whole message of `bytes`, if there is one.
fn first_message(bytes: &[u8]) -> Option<Vec<u8>> {
    let (h, _) = vfio_user::Header::read_from_prefix(bytes).ok()?;
    let size = h.size.get() as usize;
    (vfio_user::proto::HEADER_SIZE..=bytes.len()).contains(&size).then(|| bytes[..size].to_vec())
}

/// What a serving process tells its keeper.
#[derive(Debug)]
pub enum JournalEvent {
    /// What a stand-in would need now.
    Entry(Box<Kept>),
    /// Descriptors the client sent (for [`Kept::add_rx_fds`]).
    RxFds(FdGroup),
    /// The device was handed over (an upgrade) to the process with this PID, which
    /// journals to the keeper next.
    HandedTo(u32),
    /// The process ends on its own: nothing to restart.
    Ending,
    /// A takeover by the process with this PID is under way (an upgrade).
    Takeover(u32),
}

/// The keeper's end of a serving process's journal.
#[derive(Debug)]
pub struct JournalReader {
    conn: Connection,
}

impl JournalReader {
    /// The journal on `stream` (a message once begun must be whole within 5 s).
    pub fn new(stream: UnixStream) -> io::Result<JournalReader> {
        Ok(JournalReader { conn: Connection::with_deadline(stream, Duration::from_secs(5))? })
    }

    pub fn stream(&self) -> &UnixStream {
        self.conn.stream()
    }

    /// Reads what comes next (call it once the stream is readable; Err at the
    /// serving process's end).
    pub fn read(&mut self) -> io::Result<JournalEvent> {
        let m = self.conn.recv().map_err(|e| io::Error::other(e.to_string()))?;
        match m.header.command.get() {
            MSG_HANDED_TO if m.payload.len() == 4 => {
                Ok(JournalEvent::HandedTo(u32::from_le_bytes(m.payload[..4].try_into().expect("4 bytes"))))
            }
            MSG_ENDING => Ok(JournalEvent::Ending),
            MSG_TAKEOVER if m.payload.len() == 4 => {
                Ok(JournalEvent::Takeover(u32::from_le_bytes(m.payload[..4].try_into().expect("4 bytes"))))
            }
            MSG_RX_FDS if m.payload.len() == 16 && !m.fds.is_empty() => {
                let at = |i: usize| u64::from_le_bytes(m.payload[i..i + 8].try_into().expect("8 bytes"));
                let (start, end) = (at(0), at(8));
                Ok(JournalEvent::RxFds((start, end.max(start), m.fds)))
            }
            _ => {
                let (mut saved, fds) = recv_saved_after(&mut self.conn, Some(m), JOURNAL_LIMIT)?;
                // A journal never carries a controller: the stand-in starts without one.
                saved.controller = None;
                Ok(JournalEvent::Entry(Box::new(Kept { saved, fds, rx_fds: Vec::new() })))
            }
        }
    }

    /// Hands `kept` to a new serving process (duplicates: the keeper keeps its own),
    /// and waits at most `wait` for it to say it is ready.
    pub fn hand_back(&mut self, kept: &Kept, wait: Duration, last: &mut LastHanded) -> io::Result<()> {
        let (saved, fds) = kept.for_stand_in(last)?;
        send_saved(&mut self.conn, &saved, &fds)?;
        await_ready(&mut self.conn, wait, |_| {})
    }
}
