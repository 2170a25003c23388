//! The vfio-user device: answers one client's messages for the NVMe PCI function.
//! It owns the controller, the config space, the MSI-X table storage, the DMA map and
//! the interrupt eventfds; the server loop feeds it messages.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvme_ctrl::Controller;
use tracing::{debug, info};
use vfio_user::proto::*;
use vfio_user::version::{self, Capabilities, Migration};
use vfio_user::{Command, Message};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, IntoBytes};

use crate::dma::{dma_map_budget, DmaError, DmaRegions, Released};
use crate::doorbells::{DoorbellMode, DoorbellPage, DOORBELL_PAGE, DOORBELL_PAGE_LEN};
use crate::fds::{self, FdKind};
use crate::irq::EventFdInterrupts;
use crate::pci::{ConfigSpace, PciIds, PBA_OFFSET};

/// Largest REGION_READ/WRITE we accept (we advertise it as `max_data_xfer_size`).
pub const MAX_XFER: u32 = 1 << 20;

/// What the server sends back for one message.
#[derive(Debug)]
pub enum Reply {
    /// A successful reply with this payload and these file descriptors.
    Ok(Vec<u8>, Vec<OwnedFd>),
    /// A REGION_WRITE's reply: its head echoed, built on the stack (a posted write,
    /// the doorbell path, drops it unsent).
    Access(RegionAccess),
    /// An error reply carrying errno.
    Err(i32),
}

impl Reply {
    fn ok(payload: impl Into<Vec<u8>>) -> Self {
        Reply::Ok(payload.into(), Vec::new())
    }
}

/// Why a message was refused, mapped to an errno for the reply.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("malformed {0:?} message: {1}")]
    Malformed(Command, &'static str),
    #[error("{0}")]
    Invalid(String),
    #[error("DMA: {0}")]
    Dma(#[from] DmaError),
    #[error("command {0} is not supported")]
    Unsupported(u16),
    #[error("VERSION must come first")]
    NoVersion,
    #[error("{0}")]
    Busy(String),
    #[error("{0}")]
    NoSpace(String),
    #[error(
        "DMA_UNMAP {address:#x}+{size:#x}: {left} region(s) still in use by requests after {waited:?} \
         (a backend that does not answer); the memory stays mapped here until they end"
    )]
    StillInUse { address: u64, size: u64, left: usize, waited: Duration },
}

impl DeviceError {
    pub fn errno(&self) -> i32 {
        match self {
            DeviceError::Malformed(..) | DeviceError::Invalid(_) => libc::EINVAL,
            DeviceError::Dma(DmaError::Overlap(..)) => libc::EEXIST,
            DeviceError::Dma(DmaError::NotFound(..)) => libc::ENOENT,
            DeviceError::Dma(DmaError::Map(_)) => libc::EFAULT,
            DeviceError::Dma(DmaError::Invalid(..)) => libc::EINVAL,
            DeviceError::Dma(DmaError::TooMany(_)) => libc::ENOSPC,
            DeviceError::Dma(DmaError::BeyondFile { .. }) => libc::EINVAL,
            DeviceError::Dma(DmaError::Unguarded(_)) => libc::EPERM,
            DeviceError::Dma(DmaError::NotMemory(_)) => libc::EINVAL,
            DeviceError::Dma(DmaError::LogBudget(_)) => libc::ENOMEM,
            DeviceError::Unsupported(_) => libc::ENOTSUP,
            DeviceError::NoVersion => libc::EPROTO,
            DeviceError::StillInUse { .. } | DeviceError::Busy(_) => libc::EBUSY,
            DeviceError::NoSpace(_) => libc::ENOSPC,
        }
    }
}

/// [`DeviceOptions::release_wait`] by default: 4/5 of QEMU's 5 s reply timeout.
pub const DEFAULT_RELEASE_WAIT: Duration = Duration::from_secs(4);

/// Options for the PCI function.
#[derive(Clone, Copy, Debug)]
pub struct DeviceOptions {
    pub ids: PciIds,
    pub doorbells: DoorbellMode,
    /// How long DMA_UNMAP (and a client leaving) waits for requests still using the
    /// memory to end. Past it the unmap is answered EBUSY; the memory stays mapped in
    /// this process until the last of them ends. Keep it below the client's own reply
    /// timeout (QEMU: 5 s).
    pub release_wait: Duration,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        DeviceOptions {
            // Red Hat's vendor ID with QEMU's NVMe device ID is what guests expect of an
            // emulated NVMe function; override it with `vnvme serve --pci-id`.
            ids: PciIds {
                vendor: 0x1b36,
                device: 0x0010,
                subsystem_vendor: 0x1af4,
                subsystem: 0x1100,
                revision: 2,
            },
            doorbells: DoorbellMode::Trapped,
            release_wait: DEFAULT_RELEASE_WAIT,
        }
    }
}

/// One NVMe PCI function served over vfio-user.
#[derive(Debug)]
pub struct Device {
    pub ctrl: Controller,
    /// Written by the controller's event notifier; the server loop polls it.
    events: Arc<EventFd>,
    pub(crate) config: ConfigSpace,
    ids: PciIds,
    bar0_len: u64,
    pub(crate) bar4: Vec<u8>,
    pub(crate) irqs: Arc<EventFdInterrupts>,
    pub(crate) dma: DmaRegions,
    pub(crate) negotiated: bool,
    pub(crate) doorbells: DoorbellMode,
    pub(crate) page: Option<DoorbellPage>,
    /// A register write ran the controller and it did some work (see `take_progress`).
    progress: bool,
    /// A doorbell was written and the controller has not run since: it runs once the
    /// write is answered ([`Device::after_reply`]).
    doorbell_pending: bool,
    release_wait: Duration,
    /// A hand-over asked for by a job (`handover`).
    pub(crate) handover: Option<crate::transfer::HandoverRequest>,
    /// Handed over: the process exits without touching the client.
    pub(crate) handed_over: bool,
    /// vfio-user live migration (`migration`).
    pub(crate) mig: crate::transfer::MigrationState,
    /// The keeper this device journals to, if it has one (`keeper`).
    pub(crate) journal: crate::transfer::JournalSlot,
}

const BAR4_LEN: u64 = 0x2000;

/// The MSI-X table as a reset leaves it: every vector masked (PCI Local Bus 3.0
/// §6.8.2.9: Vector Control's Mask bit resets to 1), addresses and data zero.
fn msix_table_at_power_on(vectors: u16) -> Vec<u8> {
    let mut t = vec![0u8; PBA_OFFSET as usize];
    for v in 0..vectors as usize {
        t[v * 16 + 12] = 1;
    }
    t
}

impl Device {
    pub fn new(ctrl: Controller, irqs: Arc<EventFdInterrupts>, opts: DeviceOptions) -> std::io::Result<Self> {
        let events = Arc::new(EventFd::new(EFD_NONBLOCK)?);
        let e = events.clone();
        ctrl.set_event_notifier(Box::new(move || {
            let _ = e.write(1);
        }));
        let bar0_len = ctrl.bar0_len();
        let mut ctrl = ctrl;
        let page = match opts.doorbells {
            DoorbellMode::Mapped => {
                let p = DoorbellPage::new(bar0_len)?;
                ctrl.set_doorbell_page(Some(p.mem.clone()))?;
                Some(p)
            }
            _ => None,
        };
        let vectors = irqs.vectors() as u16;
        let config = ConfigSpace::new(opts.ids, bar0_len, BAR4_LEN, vectors);
        Ok(Device {
            ctrl,
            events,
            config,
            ids: opts.ids,
            bar0_len,
            bar4: msix_table_at_power_on(vectors),
            irqs,
            dma: DmaRegions::with_limit(dma_map_budget()),
            negotiated: false,
            doorbells: opts.doorbells,
            page,
            progress: false,
            doorbell_pending: false,
            release_wait: opts.release_wait,
            handover: None,
            handed_over: false,
            mig: Default::default(),
            journal: Default::default(),
        })
    }

    /// How often the server loop must run the admin side without a message: the
    /// admin doorbell is not trapped in `Mapped` mode, and an erasing Format moves on
    /// only when the admin side runs.
    pub fn admin_poll_interval(&self) -> Option<Duration> {
        if self.page.is_some() || self.ctrl.admin_busy() {
            Some(Duration::from_millis(1))
        } else {
            // Reservations shared with other controllers: their changes may owe
            // this one a notification.
            self.ctrl.shares_state().then_some(Duration::from_millis(20))
        }
    }

    /// Runs the controller outside a message (an asynchronous event was raised); what
    /// it did counts as progress, as a register write's does.
    pub fn run_controller(&mut self) {
        self.progress |= self.ctrl.process();
    }

    /// Runs the controller for doorbells written by the messages just handled.
    ///
    /// A doorbell write is answered before the controller acts on it, as a posted
    /// write to hardware is: a client that waits for the reply to every write (Cloud
    /// Hypervisor, QEMU with `x-no-posted-writes=on`) holds its vCPU only for the
    /// message's round trip, not for the commands the doorbell starts as well.
    /// Doorbell writes that arrive together (one read of the socket brings several
    /// at a queue depth above 1) run the controller once, after the last: the server
    /// loop calls this when it has handled what it read. Any other message runs it
    /// first ([`Device::handle`]), so the order of effects is the order of messages.
    pub fn after_reply(&mut self) {
        if std::mem::take(&mut self.doorbell_pending) {
            self.progress |= self.ctrl.process();
        }
    }

    /// True if the controller did work while handling messages since the last call
    /// (inline mode counts it as the end of an idle period).
    pub fn take_progress(&mut self) -> bool {
        std::mem::take(&mut self.progress)
    }

    /// True while a client is connected and has negotiated VERSION.
    pub fn client_connected(&self) -> bool {
        self.negotiated
    }

    /// The eventfd the controller signals when an asynchronous event is raised.
    pub fn event_fd(&self) -> Arc<EventFd> {
        self.events.clone()
    }

    /// Forgets the client: DMA maps and interrupt eventfds go, the controller is reset
    /// (vfio-user.rst: a disconnect drops maps and IRQs; our next client is a new VM).
    pub fn disconnect(&mut self) {
        // Reset first, so no worker is still using queues in memory we are about to
        // unmap (that would read as a guest fault and set Controller Fatal Status).
        self.power_on();
        // After the reset: a stopped device (a migration's source) must not run the
        // queues it had before the client left.
        self.migration_reset();
        let released = self.dma.clear();
        self.ctrl.set_memory(self.dma.memory());
        let left = self.wait_released(&released);
        if left > 0 {
            log_limit::limited_warn!(
                target: "vnvme::backend",
                "the client left with {left} of its memory region(s) still in use by requests \
                 after {:?} (a backend that does not answer): they stay mapped until those end",
                self.release_wait
            );
        }
        self.irqs.clear_msix();
        self.irqs.set_intx(None);
        self.negotiated = false;
    }

    /// Puts the whole PCI function back in its power-on state, as a function-level
    /// reset does: the controller, config space (command register, MSI-X Enable and
    /// Function Mask, BARs) and the MSI-X table and PBA. Interrupt eventfds stay
    /// installed (the client owns them and re-sends what it wants after a reset);
    /// with MSI-X off, interrupts go to INTx again.
    pub(crate) fn power_on(&mut self) {
        self.ctrl.device_reset();
        let vectors = self.irqs.vectors() as u16;
        self.config = ConfigSpace::new(self.ids, self.bar0_len, BAR4_LEN, vectors);
        self.bar4 = msix_table_at_power_on(vectors);
        self.irqs.set_msix_enabled(false);
    }

    /// Handles one message. Descriptors it keeps are taken out of `msg`; the caller
    /// may reuse the payload's buffer afterwards.
    pub fn handle(&mut self, msg: &mut Message) -> Result<Reply, DeviceError> {
        let cmd_raw = msg.header.command.get();
        // Doorbells written before this message take effect before it; a region
        // write decides for itself, since one more doorbell write may wait with them
        // (see `after_reply`).
        if cmd_raw != Command::RegionWrite as u16 {
            self.after_reply();
        }
        let cmd = Command::from_u16(cmd_raw).ok_or(DeviceError::Unsupported(cmd_raw))?;
        if cmd != Command::Version && !self.negotiated {
            return Err(DeviceError::NoVersion);
        }
        if matches!(
            cmd,
            Command::Version
                | Command::DmaMap
                | Command::DmaUnmap
                | Command::DeviceSetIrqs
                | Command::DeviceReset
        ) {
            // What a process standing in after a crash needs of it (`keeper`).
            self.journal_changed();
        }
        match cmd {
            Command::Version => self.version(msg),
            Command::DmaMap => self.dma_map(msg),
            Command::DmaUnmap => self.dma_unmap(msg),
            Command::DeviceGetInfo => self.get_info(msg),
            Command::DeviceGetRegionInfo => self.region_info(msg),
            Command::DeviceGetRegionIoFds => self.region_io_fds(msg),
            Command::DeviceGetIrqInfo => self.irq_info(msg),
            Command::DeviceSetIrqs => self.set_irqs(msg),
            Command::RegionRead => self.region_read(msg),
            Command::RegionWrite => self.region_write(msg),
            Command::DeviceFeature => self.device_feature(msg),
            Command::MigDataRead => self.mig_data_read(msg),
            Command::MigDataWrite => self.mig_data_write(msg),
            Command::DeviceReset => {
                info!("device reset requested by the client");
                // Reset first: a stopped device resumes with no queues to fetch from.
                self.power_on();
                self.migration_reset();
                Ok(Reply::ok(Vec::new()))
            }
            other => Err(DeviceError::Unsupported(other as u16)),
        }
    }

    fn version(&mut self, msg: &Message) -> Result<Reply, DeviceError> {
        let (major, minor, caps) = version::decode(&msg.payload).map_err(DeviceError::Invalid)?;
        if major != version::MAJOR {
            return Err(DeviceError::Invalid(format!(
                "client speaks vfio-user {major}.{minor}, we speak 0.0"
            )));
        }
        let ours = Capabilities {
            max_msg_fds: Some(vfio_user::socket::MAX_FDS as u32),
            max_data_xfer_size: Some(MAX_XFER),
            max_dma_maps: Some(self.dma.limit() as u32),
            pgsizes: Some(4096),
            migration: caps.migration.as_ref().map(|m| Migration { pgsize: m.pgsize, max_bitmap_size: None }),
        };
        self.negotiated = true;
        info!(client_caps = %caps, "vfio-user version negotiated");
        Ok(Reply::ok(version::encode(version::MAJOR, version::MINOR, &ours)))
    }

    fn dma_map(&mut self, msg: &mut Message) -> Result<Reply, DeviceError> {
        let m: DmaMap = msg.payload_as().ok_or(DeviceError::Malformed(Command::DmaMap, "short payload"))?;
        let flags = m.flags.get();
        if flags & !(DMA_MAP_FLAG_READ | DMA_MAP_FLAG_WRITE) != 0 {
            return Err(DeviceError::Invalid(format!("DMA_MAP flags {flags:#x}")));
        }
        if msg.fds.len() > 1 {
            return Err(DeviceError::Malformed(Command::DmaMap, "more than one file descriptor"));
        }
        let fd = std::mem::take(&mut msg.fds).into_iter().next();
        let has_fd = fd.is_some();
        self.dma.map(m.address.get(), m.size.get(), fd, m.offset.get(), flags & DMA_MAP_FLAG_WRITE != 0)?;
        self.ctrl.grow_memory(self.dma.memory());
        debug!(iova = format_args!("{:#x}", m.address.get()), size = m.size.get(), has_fd, "DMA map");
        Ok(Reply::ok(Vec::new()))
    }

    fn dma_unmap(&mut self, msg: &Message) -> Result<Reply, DeviceError> {
        let u: DmaUnmap =
            msg.payload_as().ok_or(DeviceError::Malformed(Command::DmaUnmap, "short payload"))?;
        let released = if u.flags.get() & DMA_UNMAP_FLAG_ALL != 0 {
            self.dma.clear()
        } else {
            self.dma.unmap(u.address.get(), u.size.get())?
        };
        // Every engine adopts the new map before this returns, so no new command can
        // reach the memory; then we wait for the requests that already do.
        self.ctrl.set_memory(self.dma.memory());
        let left = self.wait_released(&released);
        if left > 0 {
            return Err(DeviceError::StillInUse {
                address: u.address.get(),
                size: u.size.get(),
                left,
                waited: self.release_wait,
            });
        }
        Ok(Reply::ok(msg.payload[..size_of::<DmaUnmap>()].to_vec()))
    }

    /// Waits until no request uses `released` memory any more, for at most
    /// [`DeviceOptions::release_wait`]; returns how many regions are still in use.
    /// In inline mode this thread owns the queues, so it runs them while it waits (the
    /// requests it waits for complete only when it reaps them).
    fn wait_released(&mut self, released: &Released) -> usize {
        let deadline = Instant::now() + self.release_wait;
        let mut pause = Duration::from_micros(20);
        loop {
            let left = released.in_use();
            if left == 0 || Instant::now() >= deadline {
                return left;
            }
            if self.ctrl.inline_poll().is_some() {
                self.progress |= self.ctrl.process();
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    fn get_info(&mut self, msg: &Message) -> Result<Reply, DeviceError> {
        let _: DeviceInfo =
            msg.payload_as().ok_or(DeviceError::Malformed(Command::DeviceGetInfo, "short payload"))?;
        let info = DeviceInfo {
            argsz: U32::new(size_of::<DeviceInfo>() as u32),
            flags: U32::new(DEVICE_FLAGS_PCI | DEVICE_FLAGS_RESET),
            num_regions: U32::new(NUM_REGIONS),
            num_irqs: U32::new(NUM_IRQ_INDICES),
        };
        Ok(Reply::ok(info.as_bytes()))
    }

    fn region_size(&self, index: u32) -> Option<(u64, u32)> {
        let rw = REGION_FLAG_READ | REGION_FLAG_WRITE;
        Some(match index {
            REGION_BAR0 => (self.bar0_len, rw),
            REGION_BAR4 => (BAR4_LEN, rw),
            REGION_CONFIG => (crate::pci::CONFIG_SIZE as u64, rw),
            i if i < NUM_REGIONS => (0, 0),
            _ => return None,
        })
    }

    fn region_info(&mut self, msg: &Message) -> Result<Reply, DeviceError> {
        let req: RegionInfo =
            msg.payload_as().ok_or(DeviceError::Malformed(Command::DeviceGetRegionInfo, "short payload"))?;
        let index = req.index.get();
        let (size, flags) =
            self.region_size(index).ok_or_else(|| DeviceError::Invalid(format!("region index {index}")))?;
        let mut info = RegionInfo {
            argsz: U32::new(size_of::<RegionInfo>() as u32),
            flags: U32::new(flags),
            index: U32::new(index),
            cap_offset: U32::new(0),
            size: U64::new(size),
            offset: U64::new(0),
        };
        let Some(page) = self.page.as_ref().filter(|_| index == REGION_BAR0) else {
            return Ok(Reply::ok(info.as_bytes()));
        };
        // BAR0 with its doorbell page mappable: one sparse-mmap area.
        let mut caps = Vec::new();
        caps.extend_from_slice(
            CapHeader { id: CAP_SPARSE_MMAP.into(), version: 1.into(), next: U32::new(0) }.as_bytes(),
        );
        caps.extend_from_slice(SparseMmapHeader { nr_areas: U32::new(1), reserved: U32::new(0) }.as_bytes());
        caps.extend_from_slice(
            SparseMmapArea { offset: U64::new(DOORBELL_PAGE), size: U64::new(DOORBELL_PAGE_LEN) }.as_bytes(),
        );
        let need = (size_of::<RegionInfo>() + caps.len()) as u32;
        info.argsz.set(need);
        info.flags.set(flags | REGION_FLAG_MMAP);
        if req.argsz.get() < need {
            // Too small for the capabilities: the client asks again with `need`. No
            // CAPS flag here: QEMU rejects CAPS with a cap_offset outside the reply.
            return Ok(Reply::ok(info.as_bytes()));
        }
        info.flags.set(flags | REGION_FLAG_MMAP | REGION_FLAG_CAPS);
        info.cap_offset.set(size_of::<RegionInfo>() as u32);
        let mut payload = info.as_bytes().to_vec();
        payload.extend_from_slice(&caps);
        let fd = page.fd().map_err(|e| DeviceError::Invalid(e.to_string()))?;
        Ok(Reply::Ok(payload, vec![fd]))
    }

    fn region_io_fds(&mut self, msg: &Message) -> Result<Reply, DeviceError> {
        let req: RegionIoFds =
            msg.payload_as().ok_or(DeviceError::Malformed(Command::DeviceGetRegionIoFds, "short payload"))?;
        let index = req.index.get();
        self.region_size(index).ok_or_else(|| DeviceError::Invalid(format!("region index {index}")))?;
        let mut reply = RegionIoFds {
            argsz: U32::new(size_of::<RegionIoFds>() as u32),
            flags: U32::new(0),
            index: U32::new(index),
            count: U32::new(0),
        };
        if index != REGION_BAR0 || self.doorbells != DoorbellMode::EventFd {
            return Ok(Reply::ok(reply.as_bytes()));
        }
        // Every I/O queue doorbell, never the admin queue's: hosts do not use shadow
        // doorbells for it, so its values must arrive as trapped writes.
        let dstrd = self.ctrl.cap().dstrd();
        let max_qid = (self.irqs.vectors() as u16).saturating_sub(1);
        let mut subs = Vec::new();
        for qid in 1..=max_qid {
            for kind in [nvme_spec::regs::DoorbellKind::SqTail, nvme_spec::regs::DoorbellKind::CqHead] {
                let off = DOORBELL_PAGE + nvme_spec::regs::doorbell_offset(qid, kind, dstrd);
                if off + 4 > self.bar0_len {
                    continue;
                }
                subs.push(IoFdSubRegion { offset: U64::new(off), size: U64::new(4), ..Default::default() });
            }
        }
        let need = (size_of::<RegionIoFds>() + subs.len() * size_of::<IoFdSubRegion>()) as u32;
        reply.argsz.set(need);
        reply.count.set(subs.len() as u32);
        if req.argsz.get() < need {
            return Ok(Reply::ok(reply.as_bytes()));
        }
        let mut payload = reply.as_bytes().to_vec();
        for s in &subs {
            payload.extend_from_slice(s.as_bytes());
        }
        let fd = self.ctrl.doorbell_kick().map_err(|e| DeviceError::Invalid(e.to_string()))?;
        Ok(Reply::Ok(payload, vec![fd]))
    }

    fn irq_count(&self, index: u32) -> Option<(u32, u32)> {
        Some(match index {
            IRQ_INDEX_INTX => (1, IRQ_INFO_EVENTFD | IRQ_INFO_MASKABLE | IRQ_INFO_AUTOMASKED),
            IRQ_INDEX_MSI => (0, IRQ_INFO_EVENTFD),
            IRQ_INDEX_MSIX => (self.irqs.vectors() as u32, IRQ_INFO_EVENTFD),
            IRQ_INDEX_ERR => (1, IRQ_INFO_EVENTFD),
            IRQ_INDEX_REQ => (0, IRQ_INFO_EVENTFD),
            _ => return None,
        })
    }

    fn irq_info(&mut self, msg: &Message) -> Result<Reply, DeviceError> {
        let req: IrqInfo =
            msg.payload_as().ok_or(DeviceError::Malformed(Command::DeviceGetIrqInfo, "short payload"))?;
        let index = req.index.get();
        let (count, flags) =
            self.irq_count(index).ok_or_else(|| DeviceError::Invalid(format!("IRQ index {index}")))?;
        let info = IrqInfo {
            argsz: U32::new(size_of::<IrqInfo>() as u32),
            flags: U32::new(flags),
            index: U32::new(index),
            count: U32::new(count),
        };
        Ok(Reply::ok(info.as_bytes()))
    }

    fn set_irqs(&mut self, msg: &mut Message) -> Result<Reply, DeviceError> {
        let s: SetIrqs =
            msg.payload_as().ok_or(DeviceError::Malformed(Command::DeviceSetIrqs, "short payload"))?;
        let (flags, index, start, count) = (s.flags.get(), s.index.get(), s.start.get(), s.count.get());
        let data = flags & (IRQ_SET_DATA_NONE | IRQ_SET_DATA_BOOL | IRQ_SET_DATA_EVENTFD);
        let action = flags & (IRQ_SET_ACTION_MASK | IRQ_SET_ACTION_UNMASK | IRQ_SET_ACTION_TRIGGER);
        if data.count_ones() != 1 || action.count_ones() != 1 || flags & !0x3f != 0 {
            return Err(DeviceError::Invalid(format!("SET_IRQS flags {flags:#x}")));
        }
        let (max, _) =
            self.irq_count(index).ok_or_else(|| DeviceError::Invalid(format!("IRQ index {index}")))?;
        if start.checked_add(count).is_none_or(|e| e > max) && !(count == 0 && data == IRQ_SET_DATA_NONE) {
            return Err(DeviceError::Invalid(format!("IRQs {start}+{count} beyond {max} of index {index}")));
        }
        if data != IRQ_SET_DATA_EVENTFD && !msg.fds.is_empty() {
            return Err(DeviceError::Malformed(
                Command::DeviceSetIrqs,
                "file descriptors without DATA_EVENTFD",
            ));
        }
        // Only eventfds, made non-blocking, are ever signalled: anything else could
        // block the signalling thread. A refused message keeps none of its fds.
        for fd in &msg.fds {
            match FdKind::of(fd) {
                FdKind::EventFd => fds::set_nonblocking(fd).map_err(|e| {
                    DeviceError::Invalid(format!("cannot make an interrupt eventfd non-blocking: {e}"))
                })?,
                other => {
                    return Err(DeviceError::Invalid(format!(
                        "interrupt descriptor is {other}, not an eventfd"
                    )))
                }
            }
        }
        match (index, action, data) {
            (IRQ_INDEX_MSIX, IRQ_SET_ACTION_TRIGGER, IRQ_SET_DATA_EVENTFD) => {
                let fds: Vec<Option<OwnedFd>> = if msg.fds.is_empty() {
                    (0..count).map(|_| None).collect()
                } else if msg.fds.len() == count as usize {
                    std::mem::take(&mut msg.fds).into_iter().map(Some).collect()
                } else {
                    return Err(DeviceError::Malformed(
                        Command::DeviceSetIrqs,
                        "fd count differs from count",
                    ));
                };
                self.irqs.set_msix(start as usize, fds).map_err(DeviceError::Invalid)?;
                self.irqs.set_intx(None);
                debug!(start, count, "MSI-X eventfds set");
            }
            (IRQ_INDEX_MSIX, IRQ_SET_ACTION_TRIGGER, IRQ_SET_DATA_NONE) if count == 0 => {
                self.irqs.clear_msix()
            }
            (IRQ_INDEX_INTX, IRQ_SET_ACTION_TRIGGER, IRQ_SET_DATA_EVENTFD) => {
                self.irqs.set_intx(std::mem::take(&mut msg.fds).into_iter().next());
            }
            (IRQ_INDEX_INTX, IRQ_SET_ACTION_TRIGGER, IRQ_SET_DATA_NONE) => self.irqs.set_intx(None),
            (_, IRQ_SET_ACTION_TRIGGER, IRQ_SET_DATA_NONE | IRQ_SET_DATA_BOOL) if index == IRQ_INDEX_MSIX => {
                // Software trigger (loopback tests): fire the vectors.
                for v in start..start + count {
                    nvme_ctrl::InterruptSink::signal(&*self.irqs, v as u16);
                }
            }
            // Masking is the client's business (it swaps eventfds); the error and request
            // notifiers are never signalled; INTx unmask/resample eventfds are not needed
            // because we signal INTx edge-wise per interrupt.
            _ => debug!(index, flags, "SET_IRQS accepted without effect"),
        }
        Ok(Reply::ok(Vec::new()))
    }

    fn access(&self, msg: &Message, cmd: Command) -> Result<(RegionAccess, u64, u32), DeviceError> {
        let a: RegionAccess = msg.payload_as().ok_or(DeviceError::Malformed(cmd, "short payload"))?;
        let (off, region, count) = (a.offset.get(), a.region.get(), a.count.get());
        if count == 0 || count > MAX_XFER {
            return Err(DeviceError::Invalid(format!("access of {count} bytes")));
        }
        let (size, _) =
            self.region_size(region).ok_or_else(|| DeviceError::Invalid(format!("region {region}")))?;
        if off.checked_add(count as u64).is_none_or(|e| e > size) {
            return Err(DeviceError::Invalid(format!(
                "access {off:#x}+{count} beyond region {region} ({size:#x})"
            )));
        }
        Ok((a, off, count))
    }

    fn region_read(&mut self, msg: &Message) -> Result<Reply, DeviceError> {
        let (a, off, count) = self.access(msg, Command::RegionRead)?;
        let mut data = vec![0u8; count as usize];
        match a.region.get() {
            REGION_CONFIG => self.config.read(off, &mut data),
            REGION_BAR0 => {
                if !matches!(count, 1 | 2 | 4 | 8) {
                    return Err(DeviceError::Invalid(format!("BAR0 read of {count} bytes")));
                }
                self.ctrl.mmio_read(off, &mut data);
            }
            // The MSI-X table is storage; the PBA reads as zero (pending bits live with
            // whoever owns masking, i.e. the client).
            REGION_BAR4 if off < PBA_OFFSET => {
                self.journal_changed();
                let end = (off + count as u64).min(PBA_OFFSET) as usize;
                data[..end - off as usize].copy_from_slice(&self.bar4[off as usize..end]);
            }
            _ => {}
        }
        let mut reply = a.as_bytes().to_vec();
        reply.extend_from_slice(&data);
        Ok(Reply::ok(reply))
    }

    fn region_write(&mut self, msg: &Message) -> Result<Reply, DeviceError> {
        let (a, off, count) = self.access(msg, Command::RegionWrite)?;
        let data = msg
            .payload
            .get(size_of::<RegionAccess>()..size_of::<RegionAccess>() + count as usize)
            .ok_or(DeviceError::Malformed(Command::RegionWrite, "payload shorter than count"))?;
        if !(a.region.get() == REGION_BAR0 && off >= nvme_spec::regs::offset::DOORBELL_BASE) {
            self.after_reply();
        }
        match a.region.get() {
            REGION_CONFIG => {
                self.journal_changed();
                self.config.write(off, data);
                self.irqs.set_msix_enabled(self.config.msix_enabled());
            }
            REGION_BAR0 => {
                if !matches!(count, 4 | 8) {
                    log_limit::limited_warn!(target: "vnvme::guest", off, count, "BAR0 write of unsupported size ignored");
                } else {
                    if let Some(p) = &self.page {
                        if (DOORBELL_PAGE..DOORBELL_PAGE + DOORBELL_PAGE_LEN).contains(&off) {
                            let _ = p.mem.write(off, data);
                        }
                    }
                    self.ctrl.mmio_write(off, data);
                    // CC, AQA, ASQ, ACQ: what a stand-in after a crash keeps.
                    if (nvme_spec::regs::offset::CC..nvme_spec::regs::offset::ACQ + 8).contains(&off) {
                        self.journal_changed();
                    }
                    if off >= nvme_spec::regs::offset::DOORBELL_BASE {
                        self.doorbell_pending = true;
                    } else {
                        self.progress |= self.ctrl.process();
                    }
                }
            }
            REGION_BAR4 if off < PBA_OFFSET => {
                let end = (off + count as u64).min(PBA_OFFSET) as usize;
                self.bar4[off as usize..end].copy_from_slice(&data[..end - off as usize]);
            }
            _ => {}
        }
        Ok(Reply::Access(a))
    }

    /// Raw fds a reply carries (for the framing layer).
    pub fn raw_fds(fds: &[OwnedFd]) -> Vec<RawFd> {
        fds.iter().map(|f| f.as_raw_fd()).collect()
    }

    /// The guest memory map currently shared by the client (for tests).
    pub fn dma_regions(&self) -> usize {
        self.dma.len()
    }

    /// Most DMA regions a client may have at once (VERSION's `max_dma_maps`).
    pub fn dma_region_limit(&self) -> usize {
        self.dma.limit()
    }

    /// The payload of a region write as `T` (tests).
    pub fn parse<T: FromBytes>(b: &[u8]) -> Option<T> {
        T::read_from_prefix(b).ok().map(|(v, _)| v)
    }
}
