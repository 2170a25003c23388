//! Handing a live device to another process (an upgrade): everything a client and
//! its guest can observe moves, so neither notices.
//!
//! The old process quiesces the controller (`nvme_ctrl::state`), and sends the new
//! one, over a UNIX connection the new one opened (the control socket), the device's
//! state as JSON ([`DeviceSaved`]) and duplicates of every descriptor it needs: the
//! client's connection, the listening socket, the interrupt eventfds, the guest
//! memory regions, the doorbell page and the doorbell kick eventfd, plus whatever
//! the caller adds (`extra`, `extra_fds`). The new process rebuilds the device from
//! them ([`Device::restore`]) and says READY; the old one answers GO and exits
//! without touching the client again. If the new process fails (it says so, or
//! goes away, or is silent for [`READY_WAIT`]), the old one resumes and serves on.
//! Two phases, so that the two never both serve: the new process starts serving
//! only after GO, and the old one never resumes after sending it.
//!
//! Framing: vfio-user's (`vfio_user::Connection`), with private command numbers;
//! descriptors go [`MAX_FDS`] to a message.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::Duration;

use nvme_ctrl::Controller;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};
use vfio_user::proto::Header;
use vfio_user::socket::MAX_FDS;
use vfio_user::{Connection, ProtoError};
use zerocopy::little_endian::U16;

use crate::device::{Device, DeviceOptions};
use crate::doorbells::{DoorbellMode, DoorbellPage};
use crate::irq::EventFdInterrupts;
pub use crate::transfer::HandoverRequest;
use crate::transfer::{hex, unhex};

/// The version of [`DeviceSaved`] this build writes and reads.
pub const HANDOVER_VERSION: u32 = 1;

/// How long the old process waits (quiesced: the guest's I/O stalls meanwhile) for
/// the new one to restore everything and say READY. The new process opens what
/// takes time (backends) before it asks for the hand-over, so this is generous.
pub const READY_WAIT: Duration = Duration::from_secs(10);

const MSG_STATE: u16 = 0xf100;
const MSG_STATE_END: u16 = 0xf101;
const MSG_FDS: u16 = 0xf102;
const MSG_READY: u16 = 0xf103;
const MSG_FAILED: u16 = 0xf104;
const MSG_GO: u16 = 0xf105;
/// Journal (`keeper`): the device was handed over to the process whose PID follows.
pub(crate) const MSG_HANDED_TO: u16 = 0xf106;
/// Journal: the serving process ends on its own (a stop, `--once`): no restart.
pub(crate) const MSG_ENDING: u16 = 0xf107;
/// Journal: duplicates of descriptors the client sent, with the stream range of the
/// read that brought them (two u64s), before the messages they came with are handled.
pub(crate) const MSG_RX_FDS: u16 = 0xf108;
/// Journal: a takeover by the process whose PID follows is under way (an upgrade
/// asked for): if this process dies, the keeper waits for that one to take the
/// device over or end, before it stands in.
pub(crate) const MSG_TAKEOVER: u16 = 0xf109;
/// Most bytes of state JSON per message.
const CHUNK: usize = 512 << 10;

/// The device as handed over. Descriptors are indexes into the list sent with it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeviceSaved {
    pub version: u32,
    /// CLOCK_MONOTONIC (ns) when the old process stopped fetching commands: the new
    /// one reports the stall from it.
    pub quiesced_at_ns: u64,
    /// None in a keeper's journal (`keeper`): the controller's state died with its
    /// process, and the one restored from the journal stands in for it.
    pub controller: Option<nvme_ctrl::ControllerState>,
    /// CC as the host last wrote it (what a stand-in controller keeps).
    #[serde(default)]
    pub cc: u32,
    /// The ANA states set on this controller (what a stand-in controller keeps).
    #[serde(default)]
    pub ana: Option<nvme_ctrl::ana::AnaSaved>,
    /// The namespaces' formats as the host last chose them (what a stand-in keeps).
    #[serde(default)]
    pub formats: Vec<(u32, nvme_ctrl::FormatState)>,
    /// AQA, ASQ and ACQ as the host last wrote them (where a stand-in finds the
    /// host's outstanding Asynchronous Event Request).
    #[serde(default)]
    pub admin_queues: Option<(u32, u64, u64)>,
    /// The client had negotiated VERSION.
    pub negotiated: bool,
    /// PCI config space, as hex.
    pub config: String,
    /// The MSI-X table (BAR4 up to the PBA), as hex.
    pub bar4: String,
    pub msix_enabled: bool,
    /// Each MSI-X vector's eventfd, if set.
    pub msix: Vec<Option<usize>>,
    pub intx: Option<usize>,
    pub dma: Vec<DmaSaved>,
    /// "trapped", "eventfd" or "mapped".
    pub doorbells: String,
    /// The doorbell page's memfd (mapped doorbells).
    pub page: Option<usize>,
    /// The doorbell kick eventfd (the client may hold it: eventfd doorbells).
    pub kick: usize,
    /// The client's connection, if one was being served.
    pub client: Option<usize>,
    /// The start of a message the client had begun to send, if any: it moves with
    /// the connection (the client cannot tell), its deadline still running.
    #[serde(default)]
    pub client_partial: Option<PartialSaved>,
    /// A keeper's journal: the memory the client's connection keeps what it
    /// receives in (`vfio_user::rx`), and the stream offset through which what the
    /// client's messages did is in this entry. The keeper hands a stand-in what it
    /// holds from there on as `client_partial` (`keeper`).
    #[serde(default)]
    pub client_rx: Option<usize>,
    #[serde(default)]
    pub client_rx_through: u64,
    /// The listening socket.
    pub listener: Option<usize>,
    /// What the caller added (vnvme: its arguments, namespaces, QoS).
    pub extra: serde_json::Value,
    pub extra_fds: Vec<usize>,
}

/// [`vfio_user::socket::Partial`] as handed over: descriptors are indexes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PartialSaved {
    /// The bytes, as hex.
    pub bytes: String,
    /// How long before the hand-over its first byte was seen (ns).
    pub age_ns: u64,
    /// Descriptor groups with the stream range (from the first byte) of the read
    /// that brought each.
    pub fds: Vec<(u64, u64, Vec<usize>)>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DmaSaved {
    pub iova: u64,
    pub size: u64,
    /// The region's memory (absent: a region without a descriptor, or one not
    /// mapped here because it is read-only).
    pub fd: Option<usize>,
    pub offset: u64,
}

fn proto(e: ProtoError) -> io::Error {
    match e {
        ProtoError::Io(e) => e,
        e => io::Error::other(e.to_string()),
    }
}

pub(crate) fn send(conn: &mut Connection, cmd: u16, payload: &[u8], fds: &[OwnedFd]) -> io::Result<()> {
    let h = Header { command: U16::new(cmd), ..Default::default() };
    let raw: Vec<_> = fds.iter().map(|f| f.as_raw_fd()).collect();
    conn.send(h, &[payload], &raw).map_err(proto)
}

impl Device {
    /// The device an earlier process handed over (`handover`): `ctrl` is a new
    /// controller over the same configuration and namespaces (its doorbell kick
    /// already the handed-over one, its workers started); this restores the PCI
    /// function, the client's interrupts and memory, then the controller's state,
    /// quiesced: call `ctrl.resume()` once the old process has let go.
    pub fn restore(
        ctrl: Controller,
        irqs: Arc<EventFdInterrupts>,
        opts: DeviceOptions,
        h: &mut Handover,
    ) -> std::io::Result<Self> {
        let bad = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
        let s = h.saved.clone();
        if s.doorbells != opts.doorbells.name() {
            return Err(bad(format!(
                "doorbells were {}, this server is set for {}",
                s.doorbells,
                opts.doorbells.name()
            )));
        }
        let mut ctrl = ctrl;
        let bar0_len = ctrl.bar0_len();
        let page = match s.page {
            Some(i) => {
                let p = DoorbellPage::from_fd(h.take(i)?, bar0_len)?;
                ctrl.set_doorbell_page(Some(p.mem.clone()))?;
                Some(p)
            }
            None if opts.doorbells == DoorbellMode::Mapped => {
                return Err(bad("no doorbell page handed over".into()))
            }
            None => None,
        };
        let mut d = Device::new(ctrl, irqs, DeviceOptions { doorbells: DoorbellMode::Trapped, ..opts })?;
        d.doorbells = opts.doorbells;
        d.page = page;
        d.config.restore(&unhex(&s.config)?).map_err(bad)?;
        let bar4 = unhex(&s.bar4)?;
        if bar4.len() != d.bar4.len() {
            return Err(bad(format!("MSI-X table of {} bytes, want {}", bar4.len(), d.bar4.len())));
        }
        d.bar4 = bar4;
        let mut msix = Vec::new();
        for v in &s.msix {
            msix.push(v.map(|i| h.take(i)).transpose()?);
        }
        d.irqs.set_msix(0, msix).map_err(bad)?;
        d.irqs.set_intx(s.intx.map(|i| h.take(i)).transpose()?);
        d.irqs.set_msix_enabled(s.msix_enabled);
        for r in &s.dma {
            let fd = r.fd.map(|i| h.take(i)).transpose()?;
            let writable = fd.is_some();
            d.dma
                .map(r.iova, r.size, fd, r.offset, writable)
                .map_err(|e| bad(format!("DMA region {:#x}: {e}", r.iova)))?;
        }
        d.ctrl.set_memory(d.dma.memory());
        // Restored quiesced: nothing is fetched until the old process has let go
        // (`Controller::resume` after GO). Were this process to fail before that,
        // the old one resumes from where it stopped, and a command fetched here
        // would run twice.
        match &s.controller {
            Some(c) => {
                d.ctrl.quiesce(std::time::Duration::from_secs(1)).map_err(|e| bad(e.to_string()))?;
                d.ctrl.restore_state(c).map_err(|e| bad(e.to_string()))?;
            }
            None => {
                let admin = s.admin_queues.map(|(aqa, asq, acq)| nvme_ctrl::AdminQueues { aqa, asq, acq });
                d.ctrl.restore_formats(&s.formats);
                d.ctrl.stand_in_after_crash(s.cc, admin, s.ana.as_ref())
            }
        }
        d.negotiated = s.negotiated;
        Ok(d)
    }

    /// Asks the server loop to hand the device over (it does so between messages,
    /// right after the job that calls this).
    pub fn request_handover(&mut self, r: HandoverRequest) {
        self.handover = Some(r);
    }

    /// The device was handed over: its process must exit without touching the
    /// client (no reset, no disconnect).
    pub fn handed_over(&self) -> bool {
        self.handed_over
    }

    /// Does a requested hand-over, if one is pending. Ok(true): handed over, stop
    /// serving. Ok(false) or an error (logged here): go on serving.
    pub(crate) fn hand_over_if_asked(
        &mut self,
        client: Option<&Connection>,
        listener: Option<&UnixListener>,
    ) -> bool {
        let Some(mut r) = self.handover.take() else { return false };
        let done = r.done.take();
        let ok = match self.hand_over(r, client, listener) {
            Ok(()) => {
                info!("handed over to the new process: this one exits");
                self.handed_over = true;
                true
            }
            Err(e) => {
                warn!("upgrade: hand-over failed, serving on: {e}");
                false
            }
        };
        if let Some(d) = done {
            let _ = d.send(ok);
        }
        ok
    }

    fn hand_over(
        &mut self,
        r: HandoverRequest,
        client: Option<&Connection>,
        listener: Option<&UnixListener>,
    ) -> io::Result<()> {
        let mut conn = Connection::with_deadline(r.stream, Duration::from_secs(10))?;
        // A keeper learns of the new process before it can hold anything of the
        // device's (it waits for it if this one dies now).
        if let Ok(p) = rustix::net::sockopt::socket_peercred(conn.stream()) {
            self.journal_takeover(p.pid.as_raw_nonzero().get() as u32);
        }
        crate::server::kill_point("old:handover-asked");
        // The migration state and the dirty log live in this process only.
        if self.mig.state != crate::transfer::MigState::Running || self.dma.logging() {
            let why = format!(
                "a live migration is in progress (migration state {}, DMA logging {}): upgrade after it",
                self.mig.state,
                if self.dma.logging() { "on" } else { "off" }
            );
            let _ = send(&mut conn, MSG_FAILED, why.as_bytes(), &[]);
            return Err(io::Error::other(why));
        }
        let quiesced_at_ns = monotonic_ns();
        if let Err(e) = self.ctrl.quiesce(r.quiesce) {
            let why = format!("the controller could not be quiesced: {e}");
            let _ = send(&mut conn, MSG_FAILED, why.as_bytes(), &[]);
            return Err(io::Error::other(why));
        }
        crate::server::kill_point("old:quiesced");
        let sent = client.map(Connection::partial).transpose().and_then(|partial| {
            let parts = Parts {
                controller: Some(self.ctrl.save_state()),
                quiesced_at_ns,
                client: client.map(Connection::stream),
                partial,
                client_rx: None,
                rx_through: 0,
                listener,
                extra: r.extra,
                extra_fds: r.extra_fds,
            };
            self.send_state(&mut conn, parts)
        });
        crate::server::kill_point("old:sent");
        let ready = sent.and_then(|()| {
            await_ready(&mut conn, READY_WAIT, |c| {
                crate::server::kill_point("old:ready");
                // A keeper watches the new process from here on (`keeper`).
                if let Ok(p) = rustix::net::sockopt::socket_peercred(c.stream()) {
                    self.journal_handed_to(p.pid.as_raw_nonzero().get() as u32);
                }
                crate::server::kill_point("old:handed");
            })
        });
        if ready.is_ok() {
            crate::server::kill_point("old:go");
        }
        // After GO this process never serves again, whatever happens; before it,
        // it serves on.
        if ready.is_err() {
            self.ctrl.resume();
        }
        ready
    }

    /// Sends the device's state, `parts` with it, to the new process.
    fn send_state(&mut self, conn: &mut Connection, parts: Parts) -> io::Result<()> {
        let (saved, fds) = self.saved(parts)?;
        send_saved(conn, &saved, &fds)?;
        info!(
            queues = saved.controller.as_ref().map_or(0, |c| c.sqs.len()),
            dma_regions = saved.dma.len(),
            descriptors = fds.len(),
            client = saved.client.is_some(),
            "upgrade: state handed over, waiting for the new process"
        );
        Ok(())
    }

    /// The device's state with duplicates of its descriptors (indexes into the
    /// list returned with it).
    pub(crate) fn saved(&mut self, p: Parts) -> io::Result<(DeviceSaved, Vec<OwnedFd>)> {
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut add = |fd: OwnedFd| {
            fds.push(fd);
            fds.len() - 1
        };
        let (msix, intx, msix_enabled) = self.irqs.export()?;
        let msix = msix.into_iter().map(|f| f.map(&mut add)).collect();
        let intx = intx.map(&mut add);
        let mut dma = Vec::new();
        for crate::dma::ExportedRegion { iova, size, source } in self.dma.export()? {
            let (fd, offset) = match source {
                Some((fd, off)) => (Some(add(fd)), off),
                None => (None, 0),
            };
            dma.push(DmaSaved { iova, size, fd, offset });
        }
        let page = self.page.as_ref().map(|p| p.fd()).transpose()?.map(&mut add);
        let kick = add(self.ctrl.doorbell_kick()?);
        let client_partial = match p.partial {
            Some(p) if !p.bytes.is_empty() => Some(PartialSaved {
                bytes: hex(&p.bytes),
                age_ns: p.age.as_nanos() as u64,
                fds: p
                    .fds
                    .into_iter()
                    .map(|(s, e, fds)| (s, e, fds.into_iter().map(&mut add).collect()))
                    .collect(),
            }),
            _ => None,
        };
        let client = p.client.map(|c| c.try_clone().map(OwnedFd::from)).transpose()?.map(&mut add);
        let client_rx = p.client_rx.map(OwnedFd::try_clone).transpose()?.map(&mut add);
        let listener = p.listener.map(|l| l.try_clone().map(OwnedFd::from)).transpose()?.map(&mut add);
        let extra_fds = p.extra_fds.into_iter().map(&mut add).collect();
        let reg = |off: u64| {
            let mut v = [0u8; 8];
            self.ctrl.mmio_read(off, &mut v);
            u64::from_le_bytes(v)
        };
        use nvme_spec::regs::offset;
        let cc = (reg(offset::CC) as u32).to_le_bytes();
        let admin_queues = Some((reg(offset::AQA) as u32, reg(offset::ASQ), reg(offset::ACQ)));
        let saved = DeviceSaved {
            version: HANDOVER_VERSION,
            quiesced_at_ns: p.quiesced_at_ns,
            controller: p.controller,
            cc: u32::from_le_bytes(cc),
            ana: Some(self.ctrl.ana_saved()),
            formats: self.ctrl.formats_saved(),
            admin_queues,
            negotiated: self.negotiated,
            config: hex(self.config.bytes()),
            bar4: hex(&self.bar4),
            msix_enabled,
            msix,
            intx,
            dma,
            doorbells: self.doorbells.name().into(),
            page,
            kick,
            client,
            client_partial,
            client_rx,
            client_rx_through: p.rx_through,
            listener,
            extra: p.extra,
            extra_fds,
        };
        Ok((saved, fds))
    }
}

/// What [`Device::saved`] adds to the device's own state.
pub(crate) struct Parts<'a> {
    pub controller: Option<nvme_ctrl::ControllerState>,
    pub quiesced_at_ns: u64,
    pub client: Option<&'a UnixStream>,
    pub partial: Option<vfio_user::socket::Partial>,
    /// A journal's: the client connection's kept receive memory, and how far the
    /// entry covers what the client's messages did.
    pub client_rx: Option<&'a OwnedFd>,
    pub rx_through: u64,
    pub listener: Option<&'a UnixListener>,
    pub extra: serde_json::Value,
    pub extra_fds: Vec<OwnedFd>,
}

/// Sends a device's state and its descriptors (the hand-over's framing).
pub(crate) fn send_saved(conn: &mut Connection, saved: &DeviceSaved, fds: &[OwnedFd]) -> io::Result<()> {
    let json = serde_json::to_vec(saved).map_err(io::Error::other)?;
    for chunk in json.chunks(CHUNK) {
        send(conn, MSG_STATE, chunk, &[])?;
    }
    send(conn, MSG_STATE_END, &(fds.len() as u64).to_le_bytes(), &[])?;
    for group in fds.chunks(MAX_FDS) {
        send(conn, MSG_FDS, &[], group)?;
    }
    Ok(())
}

/// Receives a device's state and its descriptors ([`send_saved`]): at most `limit`
/// bytes of state and as many descriptors as the state's own bound allows.
pub(crate) fn recv_saved(conn: &mut Connection, limit: usize) -> io::Result<(DeviceSaved, Vec<OwnedFd>)> {
    recv_saved_after(conn, None, limit)
}

/// [`recv_saved`] whose first message, `first`, was read already.
pub(crate) fn recv_saved_after(
    conn: &mut Connection,
    mut first: Option<vfio_user::Message>,
    limit: usize,
) -> io::Result<(DeviceSaved, Vec<OwnedFd>)> {
    let mut json = Vec::new();
    let count = loop {
        let m = match first.take() {
            Some(m) => m,
            None => conn.recv().map_err(proto)?,
        };
        match m.header.command.get() {
            MSG_STATE if json.len() + m.payload.len() <= limit => json.extend_from_slice(&m.payload),
            MSG_STATE => return Err(io::Error::other(format!("more than {limit} bytes of state"))),
            MSG_STATE_END if m.payload.len() == 8 => {
                break u64::from_le_bytes(m.payload[..8].try_into().expect("8 bytes")) as usize
            }
            MSG_FAILED => {
                return Err(io::Error::other(format!(
                    "the running server refused: {}",
                    String::from_utf8_lossy(&m.payload)
                )))
            }
            c => return Err(io::Error::other(format!("unexpected message {c:#x} during the hand-over"))),
        }
    };
    let saved: DeviceSaved = serde_json::from_slice(&json)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("the handed-over state: {e}")))?;
    if saved.version != HANDOVER_VERSION {
        return Err(io::Error::other(format!(
            "the running server hands over version {} state; this build takes version {HANDOVER_VERSION}",
            saved.version
        )));
    }
    // One descriptor per byte of state at most: each is named in it.
    if count > json.len() {
        return Err(io::Error::other(format!(
            "{count} descriptors announced with {} bytes of state",
            json.len()
        )));
    }
    let mut fds = Vec::with_capacity(count);
    while fds.len() < count {
        let m = conn.recv().map_err(proto)?;
        if m.header.command.get() != MSG_FDS || m.fds.is_empty() {
            return Err(io::Error::other("descriptors missing from the hand-over"));
        }
        fds.extend(m.fds);
    }
    if fds.len() != count {
        return Err(io::Error::other(format!("{} descriptors handed over, {count} announced", fds.len())));
    }
    Ok((saved, fds))
}

/// Sends READY to the process that handed a device over, and waits for its GO.
/// `UnexpectedEof`: it closed the connection without a word (it died, or it is
/// dying: whether it lives on is for the caller to find out).
pub(crate) fn say_ready(conn: &mut Connection) -> io::Result<()> {
    let gone = || io::Error::new(io::ErrorKind::UnexpectedEof, "the old process went away before GO");
    if let Err(e) = send(conn, MSG_READY, &[], &[]) {
        return Err(match e.kind() {
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => gone(),
            _ => e,
        });
    }
    let m = match conn.recv() {
        Ok(m) => m,
        Err(vfio_user::ProtoError::Closed) => return Err(gone()),
        Err(e) => return Err(proto(e)),
    };
    if m.header.command.get() != MSG_GO {
        return Err(io::Error::other(format!(
            "the old process did not let go{}",
            if m.header.command.get() == MSG_FAILED {
                format!(": {}", String::from_utf8_lossy(&m.payload))
            } else {
                String::new()
            }
        )));
    }
    Ok(())
}

/// Waits for the new process's READY (at most `wait`), runs `before_go`, and
/// answers GO. Err if it failed (its reason) or went away.
pub(crate) fn await_ready(
    conn: &mut Connection,
    wait: Duration,
    before_go: impl FnOnce(&Connection),
) -> io::Result<()> {
    conn.stream().set_read_timeout(Some(wait))?;
    match conn.recv() {
        Ok(m) if m.header.command.get() == MSG_READY => {
            before_go(conn);
            send(conn, MSG_GO, &[], &[])
        }
        Ok(m) if m.header.command.get() == MSG_FAILED => {
            Err(io::Error::other(format!("the new process failed: {}", String::from_utf8_lossy(&m.payload))))
        }
        Ok(m) => Err(io::Error::other(format!(
            "unexpected message {:#x} from the new process",
            m.header.command.get()
        ))),
        Err(e) => {
            // Said, so the new process never takes a silence for this one's death.
            let why = format!("no word from the new process: {e}");
            let _ = send(conn, MSG_FAILED, why.as_bytes(), &[]);
            Err(io::Error::other(why))
        }
    }
}

/// CLOCK_MONOTONIC now, in ns (the same clock in every process on the host).
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Tells a process that asked for a hand-over why there is none.
pub fn refuse(stream: UnixStream, why: &str) {
    if let Ok(mut conn) = Connection::with_deadline(stream, Duration::from_secs(5)) {
        let _ = send(&mut conn, MSG_FAILED, why.as_bytes(), &[]);
    }
}

/// What a new process received from the old one.
#[derive(Debug)]
pub struct Handover {
    pub saved: DeviceSaved,
    fds: Vec<Option<OwnedFd>>,
    conn: Connection,
}

impl Handover {
    /// Receives the state and descriptors on `stream` (the old process's end).
    pub fn receive(stream: UnixStream) -> io::Result<Handover> {
        let mut conn = Connection::with_deadline(stream, Duration::from_secs(30))?;
        let (saved, fds) = recv_saved(&mut conn, usize::MAX)?;
        Ok(Handover { saved, fds: fds.into_iter().map(Some).collect(), conn })
    }

    /// Takes descriptor `i` (each once).
    pub fn take(&mut self, i: usize) -> io::Result<OwnedFd> {
        self.fds.get_mut(i).and_then(Option::take).ok_or_else(|| {
            io::Error::other(format!("descriptor {i} missing or taken twice in the hand-over"))
        })
    }

    /// The start of a message the client had begun to send, with its descriptors
    /// (empty if none).
    pub fn take_partial(&mut self) -> io::Result<vfio_user::socket::Partial> {
        let Some(p) = self.saved.client_partial.take() else { return Ok(Default::default()) };
        let mut fds = Vec::with_capacity(p.fds.len());
        for (s, e, idx) in p.fds {
            let group = idx.into_iter().map(|i| self.take(i)).collect::<io::Result<Vec<_>>>()?;
            fds.push((s, e, group));
        }
        Ok(vfio_user::socket::Partial { bytes: unhex(&p.bytes)?, fds, age: Duration::from_nanos(p.age_ns) })
    }

    /// Takes descriptor `i` of what the caller added (`extra_fds`), each once.
    pub fn take_extra(&mut self, i: usize) -> io::Result<OwnedFd> {
        let at =
            self.saved.extra_fds.get(i).copied().ok_or_else(|| {
                io::Error::other(format!("added descriptor {i} missing from the hand-over"))
            })?;
        self.take(at)
    }

    /// Everything is restored: tell the old process, and wait (bounded) for its GO.
    /// Only after Ok may this process serve.
    pub fn ready(mut self) -> io::Result<()> {
        say_ready(&mut self.conn)
    }

    /// [`Self::ready`], keeping the connection (a keeper's: the journal goes on
    /// over it).
    pub fn ready_keeping(mut self) -> io::Result<UnixStream> {
        say_ready(&mut self.conn)?;
        self.conn.stream().try_clone()
    }

    /// Restoring failed: tell the old process, which resumes.
    pub fn failed(mut self, why: &str) {
        let _ = send(&mut self.conn, MSG_FAILED, why.as_bytes(), &[]);
    }
}
