//! The controller: BAR0 registers and the lifecycle behind CC and CSTS
//! (Base §3.1.4, §3.5.1 controller initialization, §3.6 shutdown, §3.7 reset).

use std::sync::Arc;

use guest_mem::GuestMemory;
use nvme_spec::regs::{doorbell_from_offset, offset, Cap, Csts, ShutdownNotification, ShutdownStatus};
use tracing::{debug, info, warn};

use crate::admin::{Admin, AdminState};
use crate::config::ControllerConfig;
use crate::engine::{EngineContext, IoEngine};
use crate::events::Events;
use crate::interrupt::{Clock, InterruptSink, MonotonicClock};
use crate::lifecycle::{Lifecycle, Phase};
use crate::namespace::{active, Namespace, NamespaceSlots};
use crate::queue::CompletionQueue;
use crate::registers::RegisterFile;
use crate::stats::{Stats, StatsSnapshot};

mod attach;
mod handover;
mod pool;
mod stand_in;
pub use stand_in::AdminQueues;
mod workers;

pub use attach::NamespaceError;

/// CC.CSS: the NVM command set only.
const CSS_NVM: u8 = 0b000;
/// CC.CSS: every I/O command set CAP.CSS bit 6 says is supported (NVM and Zoned
/// Namespace), chosen per namespace.
const CSS_ALL_SUPPORTED: u8 = 0b110;

/// An NVMe controller.
#[derive(Debug)]
pub struct Controller {
    pub(crate) cfg: ControllerConfig,
    /// CAP, CC, CSTS, AQA, ASQ, ACQ, INTMS: what the host reads and writes.
    pub(crate) regs: RegisterFile,
    /// Where the controller is in its life, and what exists only there.
    pub(crate) phase: Phase,
    /// Fetching is stopped for a state hand-over (`handover.rs`).
    pub(crate) quiesced: bool,
    /// The admin queue's engine; without workers it also owns every I/O queue.
    pub(crate) engine: IoEngine,
    /// Who runs the I/O queues (workers, or (none) `process` inline) and which exist.
    pub(crate) runtime: crate::runtime::Runtime,
    pub(crate) admin: AdminState,
    /// Every NSID (NN of them), active or not. Engines each hold the same table.
    pub(crate) namespaces: NamespaceSlots,
    /// QoS groups by NSID (what the engines hold, for reporting).
    pub(crate) qos: std::collections::BTreeMap<u32, Arc<crate::qos::QosGroup>>,
    pub(crate) events: Arc<Events>,
    pub(crate) stats: Arc<Stats>,
    pub(crate) clock: Arc<dyn Clock>,
}

impl Controller {
    /// Builds a controller over `mem`, signalling interrupts through `irq`.
    pub fn new(
        cfg: ControllerConfig,
        mem: GuestMemory,
        irq: Arc<dyn InterruptSink>,
    ) -> std::io::Result<Self> {
        Self::with_clock(cfg, mem, irq, Arc::new(MonotonicClock::default()))
    }

    /// As [`Controller::new`], with an explicit clock (tests drive time by hand).
    pub fn with_clock(
        cfg: ControllerConfig,
        mem: GuestMemory,
        irq: Arc<dyn InterruptSink>,
        clock: Arc<dyn Clock>,
    ) -> std::io::Result<Self> {
        if cfg.max_io_queues == 0 || cfg.max_io_queues > 511 {
            // 511 queue pairs keep the shadow doorbell slots within one 4 KiB page,
            // which Doorbell Buffer Config requires.
            return Err(std::io::Error::other("max_io_queues must be 1..=511"));
        }
        if cfg.msix_vectors == 0 || cfg.msix_vectors > 2048 {
            return Err(std::io::Error::other("msix_vectors must be 1..=2048"));
        }
        let nn = (cfg.max_namespaces as usize).max(cfg.namespaces.len());
        if nn > crate::config::MAX_NAMESPACES as usize {
            return Err(std::io::Error::other(format!(
                "{nn} namespaces: at most {} are supported",
                crate::config::MAX_NAMESPACES
            )));
        }
        if let Some(f) = &cfg.fdp {
            f.check().map_err(|e| std::io::Error::other(format!("flexible data placement: {e}")))?;
        }
        let fdp = cfg.fdp.map(|f| Arc::new(crate::fdp::Fdp::new(f)));
        let ana = Arc::new(crate::ana::Ana::default());
        let host = Arc::new(crate::reservation::HostIdentity::new(cfg.subsystem.map_or(0, |s| s.cntlid)));
        let mut slots: Vec<Option<Arc<Namespace>>> = vec![None; nn];
        for (i, n) in cfg.namespaces.iter().enumerate() {
            let nsid = n.nsid.unwrap_or(i as u32 + 1);
            let slot = slots
                .get_mut((nsid as usize).wrapping_sub(1))
                .ok_or_else(|| std::io::Error::other(format!("namespace {nsid}: NSIDs are 1..={nn}")))?;
            if slot.is_some() {
                return Err(std::io::Error::other(format!("namespace {nsid} given twice")));
            }
            *slot = Some(Arc::new(
                crate::namespace::make(nsid, n, &cfg.serial, fdp.as_ref(), &ana, &host)
                    .map_err(std::io::Error::other)?,
            ));
        }
        let namespaces: NamespaceSlots = slots.into();
        let stats = Arc::new(Stats::default());
        let events = Arc::new(Events::default());
        let caps = capabilities_of(&cfg, &namespaces);
        let ctx = EngineContext {
            namespaces: namespaces.clone(),
            irq,
            clock: clock.clone(),
            stats: stats.clone(),
            queue_stats: (0..=cfg.max_io_queues).map(|_| Default::default()).collect(),
            events: events.clone(),
            max_qid: cfg.max_io_queues,
            vectors: cfg.msix_vectors,
            dstrd: cfg.dstrd,
            caps,
            memory: Arc::new(crate::engine::SharedMemory::new(mem)),
            fatal: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        };
        let engine = IoEngine::new(ctx)?;
        // TO = 20 (10 s): generous for a loaded host; MPSMIN 4 KiB, MPSMAX 64 KiB.
        let cap = Cap::new(cfg.mqes_z, 20, cfg.dstrd, 0, 4);
        let mut admin = AdminState::new(&cfg, &namespaces, caps.volatile_write_cache)?;
        admin.created_ns = clock.now_ns();
        admin.fdp = fdp;
        admin.ana = ana;
        admin.host = host;
        admin.resv_log.watch(active(&namespaces).any(|n| n.reservations().is_some()));
        admin.features.reset_ns = admin.created_ns;
        let mut ctrl = Controller {
            regs: RegisterFile::new(cap),
            phase: Phase::Disabled,
            quiesced: false,
            engine,
            runtime: crate::runtime::Runtime::new()?,
            admin,
            namespaces,
            qos: Default::default(),
            events,
            stats,
            clock,
            cfg,
        };
        // The pool's namespaces attached to this controller (a host has not
        // heard of any namespace yet: no notice).
        ctrl.sync_pool_quietly();
        Ok(ctrl)
    }

    /// What the controller told its host it can do (fixed at creation).
    pub fn capabilities(&self) -> crate::Capabilities {
        self.engine.io.ctx.caps
    }

    pub fn lifecycle(&self) -> Lifecycle {
        self.phase.lifecycle()
    }

    /// The memory page size CC.MPS chose (4 KiB, the minimum, while disabled).
    pub(crate) fn page_size(&self) -> u64 {
        self.phase.page_size().unwrap_or(4096)
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// Calls `n` whenever an I/O worker raises an asynchronous event, so a transport
    /// whose admin side sleeps can wake up and run [`Controller::process`].
    pub fn set_event_notifier(&self, n: crate::events::Notifier) {
        if self.events.set_notifier(n).is_err() {
            warn!("event notifier already set; keeping the first");
        }
    }

    /// The shared live counters (for a transport that reports them elsewhere).
    pub fn stats_handle(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// The active namespaces, in NSID order.
    pub fn namespaces(&self) -> impl Iterator<Item = &Arc<Namespace>> + '_ {
        active(&self.namespaces)
    }

    /// Number of Namespaces (Identify NN): the NSIDs namespaces may have.
    pub fn max_namespaces(&self) -> u32 {
        self.namespaces.len() as u32
    }

    /// Replaces the guest memory map (vfio-user DMA map/unmap).
    /// Replaces the guest memory map on every engine, waiting until each worker has
    /// it: after this returns, no new command uses the old map (unmaps, resets).
    pub fn set_memory(&mut self, mem: GuestMemory) {
        self.engine.io.ctx.memory.publish(mem);
        self.on_all_engines(|e| e.adopt_memory());
    }

    /// Installs a map that only *adds* regions to the current one (a DMA map),
    /// without waiting for any worker: each adopts it before it next fetches a
    /// command (`engine::memory` says why that is soon enough).
    pub fn grow_memory(&mut self, mem: GuestMemory) {
        self.engine.io.ctx.memory.publish(mem);
        self.engine.adopt_memory();
    }

    pub fn memory(&self) -> &GuestMemory {
        &self.engine.io.mem
    }

    pub fn cap(&self) -> Cap {
        self.regs.cap()
    }

    /// Bytes of BAR0 the controller decodes: registers plus every doorbell.
    pub fn bar0_len(&self) -> u64 {
        let end = offset::DOORBELL_BASE
            + nvme_spec::regs::doorbell_offset(
                self.cfg.max_io_queues,
                nvme_spec::regs::DoorbellKind::CqHead,
                self.cfg.dstrd,
            )
            + 4;
        end.next_power_of_two().max(0x4000)
    }

    /// Interrupt Mask (INTMS), for transports that use pin-based or MSI interrupts.
    pub fn intms(&self) -> u32 {
        self.regs.intms()
    }

    // ---- register access

    fn reg64(&self, off: u64) -> Option<u64> {
        let fatal =
            off == offset::CSTS && self.engine.io.ctx.fatal.load(std::sync::atomic::Ordering::Acquire);
        self.regs.read(off, fatal)
    }

    /// Reads `data.len()` (1, 2, 4 or 8) bytes of BAR0 at `off`. Unimplemented and
    /// write-only registers (doorbells) read as zero.
    pub fn mmio_read(&self, off: u64, data: &mut [u8]) {
        data.fill(0);
        if !matches!(data.len(), 1 | 2 | 4 | 8) || off >= offset::DOORBELL_BASE {
            return;
        }
        // Find the register containing `off`: 64-bit registers at 0x00, 0x28, 0x30.
        let (base, width) = match off & !3 {
            o @ (offset::CAP | offset::ASQ | offset::ACQ) => (o, 8),
            o if matches!(o, 0x04 | 0x2c | 0x34) => (o - 4, 8),
            o => (o, 4),
        };
        let Some(v) = self.reg64(base) else { return };
        let bytes = v.to_le_bytes();
        let start = (off - base) as usize;
        for (i, b) in data.iter_mut().enumerate() {
            if start + i < width {
                *b = bytes[start + i];
            }
        }
    }

    /// Handles a write of `data` (4 or 8 bytes) to BAR0 at `off`.
    pub fn mmio_write(&mut self, off: u64, data: &[u8]) {
        let v = match data.len() {
            4 => u32::from_le_bytes(data.try_into().expect("len 4")) as u64,
            8 => u64::from_le_bytes(data.try_into().expect("len 8")),
            n => {
                log_limit::limited_warn!(target: "vnvme::guest", off, n, "BAR0 write of unsupported size ignored");
                return;
            }
        };
        if off >= offset::DOORBELL_BASE {
            self.doorbell_write(off - offset::DOORBELL_BASE, v as u32);
            return;
        }
        match (off, data.len()) {
            (offset::CC, 4) => self.write_cc(v as u32),
            (offset::AQA, 4) => self.write_when_disabled("AQA", |r| r.set_aqa(v as u32)),
            (offset::ASQ, 8) => self.write_when_disabled("ASQ", |r| r.set_queue_base(false, v, None)),
            (offset::ACQ, 8) => self.write_when_disabled("ACQ", |r| r.set_queue_base(true, v, None)),
            (offset::ASQ, 4) => self.write_when_disabled("ASQ", |r| r.set_queue_base(false, v, Some(false))),
            (0x2c, 4) => self.write_when_disabled("ASQ", |r| r.set_queue_base(false, v, Some(true))),
            (offset::ACQ, 4) => self.write_when_disabled("ACQ", |r| r.set_queue_base(true, v, Some(false))),
            (0x34, 4) => self.write_when_disabled("ACQ", |r| r.set_queue_base(true, v, Some(true))),
            (offset::INTMS, 4) => self.regs.mask(v as u32, true),
            (offset::INTMC, 4) => self.regs.mask(v as u32, false),
            // NVM Subsystem Reset is not supported (CAP.NSSRS = 0): writes are ignored.
            (offset::NSSR, 4) => {}
            _ => debug!(target: "vnvme::guest", off, v, "write to read-only or reserved register ignored"),
        }
    }

    fn write_when_disabled(&mut self, name: &str, f: impl FnOnce(&mut RegisterFile)) {
        if self.lifecycle() == Lifecycle::Disabled {
            f(&mut self.regs);
        } else {
            log_limit::limited_warn!(target: "vnvme::guest", "{name} written while the controller is enabled: ignored");
        }
    }

    fn doorbell_write(&mut self, rel: u64, value: u32) {
        if self.lifecycle() != Lifecycle::Ready {
            debug!(target: "vnvme::guest", rel, value, "doorbell write while not ready ignored");
            return;
        }
        match doorbell_from_offset(rel, self.cfg.dstrd) {
            Some((qid, kind)) if qid <= self.cfg.max_io_queues => {
                self.runtime.doorbell(&mut self.engine, qid, kind, value)
            }
            _ => {
                // Not a doorbell of any queue the controller can have (the engine
                // counts it).
                self.engine.doorbell(u16::MAX, nvme_spec::regs::DoorbellKind::SqTail, value);
            }
        }
    }

    fn write_cc(&mut self, v: u32) {
        let old = self.regs.set_cc(v);
        let new = self.regs.cc();
        if old.en() && !new.en() {
            self.reset();
            return;
        }
        if !old.en() && new.en() {
            self.enable();
        }
        if new.shn() != ShutdownNotification::None && old.shn() == ShutdownNotification::None {
            self.shutdown(new.shn());
        }
    }

    /// CC.EN 0 -> 1 (Base §3.5.1): validate the configuration, create the admin queue.
    fn enable(&mut self) {
        if self.lifecycle() == Lifecycle::Fatal || self.regs.csts().cfs() {
            return;
        }
        let (cc, cap) = (self.regs.cc(), self.regs.cap());
        let (asq, acq, asqs, acqs) = self.regs.admin_queue();
        let page = 1u64 << (12 + cc.mps() as u32);
        let problem = if cc.mps() < cap.mpsmin() || cc.mps() > cap.mpsmax() {
            Some("CC.MPS outside CAP.MPSMIN..MPSMAX")
        } else if !matches!(cc.css(), CSS_NVM | CSS_ALL_SUPPORTED) {
            Some("CC.CSS selects neither the NVM command set (000b) nor all I/O command sets (110b)")
        } else if cc.ams() != 0 {
            Some("CC.AMS selects an arbitration mechanism other than round robin")
        } else if asqs < 2 || acqs < 2 {
            Some("AQA: admin queues must have at least 2 entries")
        } else if !asq.is_multiple_of(page) || !acq.is_multiple_of(page) {
            Some("ASQ/ACQ not aligned to the memory page size")
        } else {
            None
        };
        if let Some(why) = problem {
            log_limit::limited_warn!(target: "vnvme::guest", cc = format_args!("{:#x}", cc.0), "enable refused: {why}");
            self.regs.set_csts(Csts(Csts::CFS));
            self.phase = Phase::Fatal;
            return;
        }
        self.engine.create_cq(0, CompletionQueue::new(acq, acqs, true, 0));
        self.engine.create_sq(0, 0, asq, asqs);
        self.apply_settings();
        self.regs.set_csts(Csts(Csts::RDY));
        self.phase = Phase::Ready { page_size: page };
        info!(
            asq = format_args!("{asq:#x}"),
            acq = format_args!("{acq:#x}"),
            asqs,
            acqs,
            "controller enabled"
        );
    }

    /// Controller Level Reset (CC.EN 1 -> 0, Base §3.7.2): delete every queue, forget
    /// the Doorbell Buffer Config and volatile feature settings, clear CSTS.
    fn reset(&mut self) {
        let deadline = crate::engine::Deadline::teardown(&*self.clock);
        self.runtime.reset(&mut self.engine, deadline);
        // Admin commands fetched and not executed belong to the queue being deleted.
        self.engine.admin_inbox.clear();
        self.admin.reset(self.clock.now_ns());
        self.apply_settings();
        self.engine.io.ctx.fatal.store(false, std::sync::atomic::Ordering::Release);
        self.events.reset();
        // Open zones close (ZNS: a Controller Level Reset).
        for ns in crate::namespace::active(&self.namespaces) {
            if let Some(z) = &ns.zones {
                z.reset_controller(false);
            }
        }
        self.regs.set_csts(Csts(0));
        self.phase = Phase::Disabled;
        self.regs.clear_enable();
        info!("controller reset");
    }

    /// CC.SHN (Base §3.6.1): finish outstanding work, then report shutdown complete.
    /// Normal and abrupt notifications both complete every command already fetched;
    /// nothing is lost because the backends complete or fail each request.
    fn shutdown(&mut self, kind: ShutdownNotification) {
        self.regs.set_shutdown_status(ShutdownStatus::Occurring);
        // Run the whole controller, not just the engine: an admin command fetched here
        // must execute now, or it would sit in the inbox and complete after the next
        // enable with a stale command identifier. `process` also reads shadow tails,
        // so submissions the host made without ringing finish like rung ones do.
        // Bounded by progress: once a round does nothing, what is left cannot move
        // (e.g. a queue whose doorbell value is invalid) and waiting would not help.
        for _ in 0..10_000 {
            if !self.process() || self.lifecycle() != Lifecycle::Ready {
                break;
            }
        }
        // One bound for the whole controller, not one per engine or namespace.
        let deadline = crate::engine::Deadline::teardown(&*self.clock);
        if self.lifecycle() == Lifecycle::Ready {
            crate::runtime::drain_engine(&mut self.engine, deadline);
            self.runtime.drain_workers(deadline);
            self.process();
        }
        for ns in active(&self.namespaces.clone()) {
            if ns.info.volatile_cache {
                self.admin.flush_namespace(ns, &self.engine.io.mem, deadline, &*self.clock);
            }
            // The zones' state is made durable with the data.
            if let Some(Err(e)) = ns.zones.as_ref().map(|z| z.sync()) {
                warn!(nsid = ns.nsid, "cannot make the zone state file durable at shutdown: {e}");
            }
            // And its blocks' metadata.
            if let Some(Err(e)) = ns.meta.as_ref().map(|m| m.sync()) {
                warn!(nsid = ns.nsid, "cannot make the metadata file durable at shutdown: {e}");
            }
        }
        self.regs.set_shutdown_status(ShutdownStatus::Complete);
        if let Phase::Ready { page_size } = self.phase {
            self.phase = Phase::ShutDown { page_size };
        }
        info!(%kind, "controller shut down");
    }

    // ---- running

    /// Does all work that is ready: admin commands, I/O, completions, interrupts,
    /// coalescing timers. Returns true if anything happened. Transports call this when
    /// a doorbell was written or a backend notifier fired; the in-process host calls
    /// it whenever it waits.
    pub fn process(&mut self) -> bool {
        // Namespaces other controllers (or this one) attached or detached here:
        // in every state, so a host that enables later finds them.
        let mut any = self.sync_pool();
        if self.lifecycle() != Lifecycle::Ready {
            return any;
        }
        if self.admin.features.keep_alive_until.is_some_and(|t| self.clock.now_ns() >= t) {
            self.keep_alive_expired();
            return true;
        }
        if self.admin.resv_log.watching() {
            // Notifications other controllers' reservation changes owe this one.
            any |= self.admin_parts().collect_resv_notices();
        }
        for _ in 0..64 {
            let mut progress = self.engine.poll();
            let inbox = std::mem::take(&mut self.engine.admin_inbox);
            // Admin work: commands fetched, an erasing Format, events for the AERs
            // outstanding (borrowing the parts only then: this runs per poll).
            if !inbox.is_empty() || self.admin.has_work(&self.events) {
                let mut admin = self.admin_parts();
                for sqe in inbox {
                    progress = true;
                    admin.execute(sqe);
                }
                progress |= admin.advance_format();
                progress |= admin.deliver_events();
                // A Namespace Attachment this controller just ran takes effect
                // here before the host's next command.
                progress |= self.sync_pool();
            }
            if self.engine.io.ctx.fatal.load(std::sync::atomic::Ordering::Acquire) {
                let why = self.engine.fatal().map_or("fault in an I/O worker".to_string(), |f| f.0.clone());
                warn!(target: "vnvme::guest", "controller fatal status: {why}");
                self.regs.set_fatal();
                self.phase = Phase::Fatal;
                return true;
            }
            any |= progress;
            if !progress {
                break;
            }
        }
        self.engine.fire_timers();
        any
    }

    /// The data-path settings every engine honours.
    pub(crate) fn settings(&self) -> crate::engine::Settings {
        self.admin.features.engine_settings().paged(self.page_size(), self.mdts_bytes())
    }

    /// MDTS in bytes.
    pub(crate) fn mdts_bytes(&self) -> u64 {
        self.cfg.mdts_bytes(self.regs.cap())
    }

    /// The parts an admin command works on, borrowed for one command.
    fn admin_parts(&mut self) -> Admin<'_> {
        Admin {
            cfg: &self.cfg,
            cap: self.regs.cap(),
            page_size: self.page_size(),
            admin: &mut self.admin,
            engine: &mut self.engine,
            runtime: &mut self.runtime,
            namespaces: &self.namespaces,
            events: &self.events,
            stats: &self.stats,
            clock: &*self.clock,
        }
    }

    /// True while an erasing Format is in progress: the transport must call
    /// [`Controller::process`] at least every millisecond or so until it ends (its
    /// pieces complete on the admin side's own backend queues, which nothing else
    /// watches).
    pub fn admin_busy(&self) -> bool {
        self.admin.formatting()
    }

    /// The admin side must also run now and then with nothing else to do: some
    /// namespace shares reservations with other controllers, whose changes may owe
    /// this one a notification.
    pub fn shares_state(&self) -> bool {
        self.admin.resv_log.watching() || self.cfg.pool.is_some()
    }

    /// Resets the whole function to its power-on state (vfio-user DEVICE_RESET, or a
    /// client going away): a Controller Level Reset plus the admin queue registers.
    /// From any state: what a restore, a migration or a client left behind is gone,
    /// whatever the lifecycle says.
    pub fn device_reset(&mut self) {
        self.reset();
        self.regs.power_on();
        self.phase = Phase::Disabled;
    }

    /// The next time (clock ns) `process` must run: a coalesced interrupt, a
    /// command's timeout, the Keep Alive Timer.
    pub fn next_deadline(&self) -> Option<u64> {
        let keep_alive =
            self.admin.features.keep_alive_until.filter(|_| self.lifecycle() == Lifecycle::Ready);
        match (self.engine.next_deadline(), keep_alive) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The Keep Alive Timer expired (Base §3.9.5): the controller records it in the
    /// Error Information log, stops processing commands and reports Controller
    /// Fatal Status; the host resets it (a Controller Level Reset) to go on.
    #[cold]
    fn keep_alive_expired(&mut self) {
        let kato = self.admin.features.cur.kato_ms;
        warn!(
            target: "vnvme::guest",
            kato_ms = kato,
            "keep alive timer expired: no Keep Alive command within KATO; controller fatal status"
        );
        self.events.record_error(0, 0xffff, nvme_spec::Status::KEEP_ALIVE_TIMER_EXPIRED, 0, 0);
        self.admin.features.keep_alive_until = None;
        self.regs.set_fatal();
        self.phase = Phase::Fatal;
    }

    /// The controller's clock in nanoseconds: the time base of [`Self::next_deadline`].
    pub fn clock_now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    /// Gives polling transports control over EventIdx re-arming (see `IoEngine`).
    pub fn set_arm_eventidx(&mut self, arm: bool) {
        self.engine.arm_eventidx = arm;
    }
}

/// What a controller of `cfg` over `namespaces` tells its host it can do: what
/// `cfg` says, or else what its backends do natively. With room for namespaces
/// added later (which may have a cache) a volatile write cache is present: a host
/// reads VWC once, at bring-up, and sends Flush only if it is.
fn capabilities_of(cfg: &ControllerConfig, namespaces: &[Option<Arc<Namespace>>]) -> crate::Capabilities {
    let c = cfg.capabilities.unwrap_or_else(|| {
        let any = |f: fn(&Namespace) -> bool| active(namespaces).any(|n| f(n));
        crate::Capabilities {
            dsm: any(|n| n.info.discard),
            write_zeroes: any(|n| n.info.write_zeroes),
            volatile_write_cache: any(|n| n.info.volatile_cache) || namespaces.iter().any(Option::is_none),
            fdp: false,
            subsystem: None,
            ns_management: false,
        }
    });
    // Not choices a taking-over controller makes: FDP, the subsystem and the pool
    // are its configuration's.
    crate::Capabilities {
        fdp: cfg.fdp.is_some(),
        subsystem: cfg.subsystem,
        ns_management: cfg.pool.is_some(),
        ..c
    }
}
