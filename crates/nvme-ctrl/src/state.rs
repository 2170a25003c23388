//! Saving a controller's state and restoring it into another controller (a new
//! process after an upgrade, or the destination of a migration).
//!
//! [`Controller::quiesce`] stops fetching commands on every engine and waits,
//! bounded, until every fetched command has completed (commands QoS held back are
//! let through). The host may keep writing doorbells and shadow slots meanwhile: new
//! tails are recorded, nothing is fetched. [`Controller::save_state`] then copies out
//! everything the guest can observe as plain data ([`ControllerState`]), and
//! [`Controller::restore_state`] puts it into a controller built over the same
//! configuration and namespaces, which carries on where the first one stopped. If
//! the hand-over fails, [`Controller::resume`] lets the first controller go on.
//!
//! The format is JSON through serde, described in docs/UPGRADE.md. Its `version`
//! changes whenever a field changes meaning or a field a restore needs is added; a
//! controller restores only the versions it knows ([`STATE_VERSION`]) and refuses
//! others, saying which. Fields added with a default that keeps the old meaning do
//! not change the version.
//!
//! Not part of the state: commands in flight (there are none after a quiesce),
//! coalesced interrupts not yet signalled (a quiesce signals them), and QoS limits
//! (the transport keeps and re-applies those). Every counter is: the controller's,
//! each namespace's (latency histograms and time held by QoS included) and each
//! queue's.

use std::time::Duration;

use nvme_spec::aer::{AsyncEvent, EventType};
use nvme_spec::log::ErrorInformationEntry;
use nvme_spec::regs::{Aqa, Cc, Csts, DoorbellKind};
use nvme_spec::Cqe;
use serde::{Deserialize, Serialize};
use zerocopy::{FromBytes, IntoBytes};

use crate::controller::{Controller, Lifecycle, Phase};
use crate::doorbell::ShadowBuffers;
use crate::engine::IoEngine;
pub use crate::events::EventsSaved;
use crate::queue::{CompletionQueue, SubmissionQueue};
use crate::registers::RegisterValues;
pub use crate::stats::StatsSaved;

/// The version of [`ControllerState`] this build writes and reads.
pub const STATE_VERSION: u32 = 1;

/// Everything a controller's guest can observe, as plain data.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ControllerState {
    pub version: u32,
    /// The controller's clock when saved (ns): the restoring side's clock continues
    /// from here, so times kept relative to it (timestamp, power-on hours, coalescing)
    /// carry over.
    pub clock_ns: u64,
    pub regs: Registers,
    pub sqs: Vec<SqState>,
    pub cqs: Vec<CqState>,
    /// The Doorbell Buffer Config in force.
    pub shadow: Option<ShadowState>,
    /// What the controller told its host it can do: a controller restoring this
    /// must have been created with the same (`ControllerConfig::capabilities`).
    #[serde(default)]
    pub capabilities: Option<crate::Capabilities>,
    /// The SQ the controller's own engine arbitrates next (round robin), so a
    /// restored controller without workers fetches in the same order.
    #[serde(default)]
    pub next_sq: Option<u16>,
    /// Interrupt vectors whose coalescing the host disabled (Interrupt Vector
    /// Configuration).
    pub coalescing_disabled: Vec<u16>,
    pub admin: AdminSaved,
    pub events: EventsSaved,
    /// The controller's counters (SMART data units, commands, media errors...).
    pub stats: StatsSaved,
    /// Each namespace's counters (commands, bytes, errors and latency by kind, time
    /// held by QoS), by NSID, so an upgrade or a migration carries them as it does
    /// the controller's (empty in a state from a build that did not).
    #[serde(default)]
    pub namespace_stats: Vec<(u32, crate::stats::NsStatsSnapshot)>,
    /// Each queue's counters (commands, doorbells, completions, interrupts).
    #[serde(default)]
    pub queue_stats: Vec<crate::stats::QueueSnapshot>,
    /// Active namespaces: the restoring side must have the same ones (NSID, size),
    /// and takes their current LBA format from here (a Format NVM may have changed it).
    pub namespaces: Vec<NamespaceSaved>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Registers {
    pub cc: u32,
    pub csts: u32,
    pub aqa: u32,
    pub asq: u64,
    pub acq: u64,
    pub intms: u32,
    /// "disabled", "ready", "shut-down" or "fatal".
    pub lifecycle: String,
    /// CC.MPS in bytes.
    pub page_size: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SqState {
    pub qid: u16,
    pub cqid: u16,
    pub base: u64,
    pub size: u32,
    pub head: u32,
    pub tail: u32,
    /// The EventIdx last published for it (None: not yet, or re-arm pending).
    pub eventidx: Option<u32>,
    /// The last value seen in the mapped doorbell page (doorbells mapped).
    #[serde(default)]
    pub page_seen: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CqState {
    pub qid: u16,
    pub base: u64,
    pub size: u32,
    pub head: u32,
    pub tail: u32,
    pub phase: bool,
    pub ien: bool,
    pub iv: u16,
    /// Completions waiting for room (the CQ was full), oldest first, each as 32 hex
    /// digits (the 16-byte entry, phase bit not yet set).
    pub overflow: Vec<String>,
    pub waiting_for_space: bool,
    #[serde(default)]
    pub page_seen: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShadowState {
    pub shadow: u64,
    pub eventidx: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdminSaved {
    /// Command identifiers of outstanding Asynchronous Event Requests.
    pub aers: Vec<u16>,
    pub io_queues_created: bool,
    pub nsq_granted_z: u16,
    pub ncq_granted_z: u16,
    pub features: FeaturesSaved,
    /// The host's Timestamp (ms) as of `clock_ns`, if it set one.
    pub timestamp_ms: Option<u64>,
    /// Clock readings of the controller's creation and of its last reset.
    pub created_ns: u64,
    pub reset_ns: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeaturesSaved {
    pub arbitration: u32,
    pub power_management: u32,
    pub temp_over: u16,
    pub temp_under: u16,
    pub error_recovery: u32,
    pub write_cache: bool,
    pub coalescing: u32,
    pub write_atomicity: u32,
    pub aec: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceSaved {
    pub nsid: u32,
    pub size: u64,
    pub lba_format: u8,
}

/// Why a quiesce or a restore failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("commands still in flight after {0:?} (a backend that does not answer?)")]
    Busy(Duration),
    #[error("an erasing Format NVM is in progress")]
    FormatInProgress,
    #[error("state version {0} is not one this build restores (it restores version {STATE_VERSION})")]
    Version(u32),
    #[error("the state does not fit this controller: {0}")]
    Mismatch(String),
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str, len: usize) -> Result<Vec<u8>, StateError> {
    let bad = || StateError::Mismatch(format!("{s:?} is not {len} bytes of hex"));
    if s.len() != len * 2 {
        return Err(bad());
    }
    (0..len).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())).collect()
}

fn event_type(v: u8) -> Option<EventType> {
    Some(match v {
        0 => EventType::ErrorStatus,
        1 => EventType::SmartHealth,
        2 => EventType::Notice,
        3 => EventType::Immediate,
        4 => EventType::OneShot,
        6 => EventType::IoCommandSpecific,
        7 => EventType::VendorSpecific,
        _ => return None,
    })
}

fn lifecycle_name(l: Lifecycle) -> &'static str {
    match l {
        Lifecycle::Disabled => "disabled",
        Lifecycle::Ready => "ready",
        Lifecycle::ShutDown => "shut-down",
        Lifecycle::Fatal => "fatal",
    }
}

/// One engine's queues, as saved.
type EngineQueues = (Vec<SqState>, Vec<CqState>);

impl IoEngine {
    /// Stops (or restarts) fetching commands; completions, doorbells and interrupts
    /// go on.
    pub(crate) fn set_quiesced(&mut self, q: bool) {
        self.quiesced = q;
    }

    /// Nothing fetched is unfinished: no command at a backend or held back by QoS, no
    /// admin command waiting to run.
    pub(crate) fn quiet(&self) -> bool {
        !self.backend_busy() && self.held() == 0 && self.admin_inbox.is_empty()
    }

    fn save_queues(&self) -> EngineQueues {
        let sqs = self
            .queues
            .sqs()
            .map(|(qid, q)| SqState {
                qid,
                cqid: q.cqid,
                base: q.base,
                size: q.size,
                head: q.head,
                tail: q.tail,
                eventidx: q.arm.published(),
                page_seen: self.page.seen(qid, DoorbellKind::SqTail),
            })
            .collect();
        let cqs = self
            .queues
            .cqs()
            .map(|(qid, q)| CqState {
                qid,
                base: q.base,
                size: q.size,
                head: q.head,
                tail: q.tail,
                phase: q.phase,
                ien: q.ien,
                iv: q.iv,
                overflow: q.overflow.iter().map(|c| hex(c.as_bytes())).collect(),
                waiting_for_space: q.waiting_for_space,
                page_seen: self.page.seen(qid, DoorbellKind::CqHead),
            })
            .collect();
        (sqs, cqs)
    }

    /// Puts saved queues in place as they were (checked by
    /// [`Controller::restore_state`]): nothing is written to guest memory (the shadow
    /// slots and EventIdx there are the live ones). Each CQ comes with its decoded
    /// overflow.
    pub(crate) fn install_queues(&mut self, sqs: &[SqState], cqs: &[(CqState, Vec<Cqe>)]) {
        for (c, overflow) in cqs {
            let mut q = CompletionQueue::new(c.base, c.size, c.ien, c.iv);
            (q.head, q.tail, q.phase, q.waiting_for_space) = (c.head, c.tail, c.phase, c.waiting_for_space);
            q.overflow.extend(overflow.iter().copied());
            self.queues.insert_cq(c.qid, q);
            self.page.restore_seen(c.qid, DoorbellKind::CqHead, c.page_seen);
        }
        for s in sqs {
            // EventIdx is published again here (`resume`): what the saved process
            // last published need not be what guest memory holds any more.
            let mut q = SubmissionQueue::new(s.cqid, s.base, s.size);
            (q.head, q.tail) = (s.head, s.tail);
            self.queues.insert_sq(s.qid, q);
            self.page.restore_seen(s.qid, DoorbellKind::SqTail, s.page_seen);
        }
    }
}

impl Controller {
    /// Stops fetching commands everywhere and waits, at most `bound`, until every
    /// command already fetched has completed and an erasing Format has finished;
    /// signals every coalesced interrupt. On failure the controller is resumed.
    pub fn quiesce(&mut self, bound: Duration) -> Result<(), StateError> {
        let deadline = crate::engine::Deadline::after(&*self.clock, bound);
        self.on_all_engines(|e| e.set_quiesced(true));
        self.quiesced = true;
        loop {
            // Runs the admin queue's pending work (AERs stay parked) and reaps.
            self.process();
            let format = self.admin.format.is_some();
            let mut quiet = self.engine.quiet() && !format;
            for w in self.runtime.workers() {
                quiet &= w.call(|e| {
                    e.poll();
                    e.quiet()
                });
            }
            // A fatal controller fetches and posts nothing more: what its backends
            // still have in flight waits for the reset its host owes it (which
            // abandons it within the teardown bound), not for a quiesce.
            if quiet || self.lifecycle() == Lifecycle::Fatal {
                break;
            }
            if deadline.passed(&*self.clock) {
                self.resume();
                return Err(if format { StateError::FormatInProgress } else { StateError::Busy(bound) });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        self.on_all_engines(|e| e.flush_interrupts());
        Ok(())
    }

    /// Whether the controller is quiesced.
    pub fn is_quiesced(&self) -> bool {
        self.quiesced
    }

    /// Lets a quiesced controller fetch commands again.
    pub fn resume(&mut self) {
        self.quiesced = false;
        // Every engine looks at its queues now, workers included, with EventIdx armed:
        // a doorbell written meanwhile woke an engine that could not fetch, and a host
        // using shadow doorbells may move a tail without writing one at all while
        // EventIdx says the device looks on its own. That was true of the process (or
        // the migration source) that published it, which polled; an engine that was
        // asleep here stays asleep, so it must publish its own EventIdx before it
        // sleeps again, or no doorbell would ever wake it.
        self.on_all_engines(|e| {
            e.set_quiesced(false);
            e.arm_eventidx = true;
            e.poll();
        });
        self.process();
    }

    /// The controller's state. Call it quiesced: commands in flight are not part of
    /// it.
    pub fn save_state(&mut self) -> ControllerState {
        let now = self.clock.now_ns();
        let (mut sqs, mut cqs) = self.engine.save_queues();
        for w in self.runtime.workers() {
            let (s, c) = w.call(|e| e.save_queues());
            sqs.extend(s);
            cqs.extend(c);
        }
        sqs.sort_by_key(|q| q.qid);
        cqs.sort_by_key(|q| q.qid);
        let f = &self.admin.features;
        let v = &f.cur;
        let coalescing_disabled =
            (0..self.cfg.msix_vectors).filter(|&iv| self.engine.vector_coalescing_disabled(iv)).collect();
        let r = self.regs.values();
        ControllerState {
            version: STATE_VERSION,
            clock_ns: now,
            capabilities: Some(self.capabilities()),
            regs: Registers {
                cc: r.cc,
                csts: r.csts,
                aqa: r.aqa,
                asq: r.asq,
                acq: r.acq,
                intms: r.intms,
                lifecycle: lifecycle_name(self.lifecycle()).into(),
                page_size: self.page_size(),
            },
            sqs,
            cqs,
            next_sq: self.engine.queues.upcoming(),
            shadow: self.engine.shadow.map(|b| ShadowState { shadow: b.shadow, eventidx: b.eventidx }),
            coalescing_disabled,
            admin: AdminSaved {
                aers: self.admin.aers.clone(),
                io_queues_created: self.admin.io_queues_created,
                nsq_granted_z: f.nsq_granted_z,
                ncq_granted_z: f.ncq_granted_z,
                features: FeaturesSaved {
                    arbitration: v.arbitration,
                    power_management: v.power_management,
                    temp_over: v.temp_over,
                    temp_under: v.temp_under,
                    error_recovery: v.error_recovery,
                    write_cache: v.write_cache,
                    coalescing: v.coalescing,
                    write_atomicity: v.write_atomicity,
                    aec: v.aec,
                },
                timestamp_ms: f.timestamp.map(|(ms, at)| crate::admin::timestamp_now(ms, at, now)),
                created_ns: self.admin.created_ns,
                reset_ns: f.reset_ns,
            },
            events: self.events.save(),
            stats: self.stats.snapshot().into(),
            namespace_stats: self.namespaces().map(|n| (n.nsid, n.stats.snapshot())).collect(),
            queue_stats: self
                .engine
                .ctx
                .queue_stats
                .iter()
                .enumerate()
                .map(|(qid, q)| q.snapshot(qid as u16, None))
                .filter(|q| *q != crate::stats::QueueSnapshot { qid: q.qid, ..Default::default() })
                .collect(),
            namespaces: self
                .namespaces()
                .map(|n| NamespaceSaved { nsid: n.nsid, size: n.size(), lba_format: n.lba_format() })
                .collect(),
        }
    }

    /// Restores `s` into this controller, which must be new (disabled, no queues) and
    /// built over the same configuration and namespaces; its clock should continue
    /// from `s.clock_ns`. All or nothing: every part of `s` is checked (against this
    /// controller, against itself, and against what a controller of this
    /// configuration could have reached) before anything changes, so a refused state
    /// leaves the controller exactly as new as it was.
    pub fn restore_state(&mut self, s: &ControllerState) -> Result<(), StateError> {
        let checked = self.check_state(s)?;
        self.apply_state(s, checked);
        Ok(())
    }

    /// Every check of [`Self::restore_state`]; what it decodes on the way.
    fn check_state(&self, s: &ControllerState) -> Result<Checked, StateError> {
        let bad = |why: String| Err(StateError::Mismatch(why));
        if s.version != STATE_VERSION {
            return Err(StateError::Version(s.version));
        }
        if self.lifecycle() != Lifecycle::Disabled || !self.book.is_empty() || self.engine.cq_exists(0) {
            return bad("the controller is not new".into());
        }
        if let Some(c) = s.capabilities.filter(|&c| c != self.capabilities()) {
            return bad(format!(
                "capabilities {c:?}, here {:?} (create the controller with ControllerConfig::capabilities)",
                self.capabilities()
            ));
        }
        let mine: Vec<(u32, u64)> = self.namespaces().map(|n| (n.nsid, n.size())).collect();
        let theirs: Vec<(u32, u64)> = s.namespaces.iter().map(|n| (n.nsid, n.size)).collect();
        if mine != theirs {
            return bad(format!("namespaces (NSID, bytes) {theirs:?}, here {mine:?}"));
        }
        if let Some(n) =
            s.namespaces.iter().find(|n| n.lba_format as usize >= crate::namespace::LBA_FORMATS.len())
        {
            return bad(format!(
                "namespace {}: LBA format {} (this controller has {})",
                n.nsid,
                n.lba_format,
                crate::namespace::LBA_FORMATS.len()
            ));
        }
        let lifecycle = match s.regs.lifecycle.as_str() {
            "disabled" => Lifecycle::Disabled,
            "ready" => Lifecycle::Ready,
            "shut-down" => Lifecycle::ShutDown,
            "fatal" => Lifecycle::Fatal,
            l => return bad(format!("lifecycle {l:?}")),
        };
        self.check_registers(s, lifecycle)?;
        let cqs = self.check_queues(s, lifecycle)?;
        if let Some(sh) = s.shadow {
            let page = s.regs.page_size;
            if lifecycle == Lifecycle::Disabled {
                return bad("a Doorbell Buffer Config on a disabled controller".into());
            }
            if !sh.shadow.is_multiple_of(page)
                || !sh.eventidx.is_multiple_of(page)
                || sh.shadow == sh.eventidx
            {
                return bad(format!(
                    "shadow doorbell buffers {:#x} / {:#x}: two page-aligned buffers",
                    sh.shadow, sh.eventidx
                ));
            }
        }
        for iv in s.cqs.iter().map(|c| c.iv).chain(s.coalescing_disabled.iter().copied()) {
            if iv >= self.cfg.msix_vectors {
                return bad(format!("vector {iv} beyond {}", self.cfg.msix_vectors));
            }
        }
        if s.next_sq.is_some_and(|q| !s.sqs.iter().any(|x| x.qid == q)) {
            return bad(format!("next SQ {:?} does not exist", s.next_sq));
        }
        let a = &s.admin;
        if a.aers.len() > self.cfg.aerl_z as usize + 1
            || (lifecycle == Lifecycle::Disabled && !a.aers.is_empty())
        {
            return bad(format!(
                "{} Asynchronous Event Requests outstanding (at most {})",
                a.aers.len(),
                self.cfg.aerl_z as usize + 1
            ));
        }
        if has_duplicates(a.aers.iter().copied()) {
            return bad("an Asynchronous Event Request's command identifier twice".into());
        }
        let max_granted_z = self.engine.ctx.max_qid.saturating_sub(1);
        if a.nsq_granted_z > max_granted_z || a.ncq_granted_z > max_granted_z {
            return bad(format!(
                "{} / {} I/O queues granted (0's based; this controller has {})",
                a.nsq_granted_z, a.ncq_granted_z, self.engine.ctx.max_qid
            ));
        }
        if a.timestamp_ms.is_some_and(|ms| ms >= 1 << 48) {
            return bad(format!("timestamp {:?} ms (the field has 48 bits)", a.timestamp_ms));
        }
        if a.features.power_management & 0x1f != 0 {
            return bad(format!(
                "power state {} (this controller has one)",
                a.features.power_management & 0x1f
            ));
        }
        let mut events = Vec::new();
        if s.events.queued.len() > MAX_QUEUED_EVENTS {
            return bad(format!("{} events queued", s.events.queued.len()));
        }
        for dw0 in &s.events.queued {
            let kind =
                event_type(*dw0 as u8 & 7).ok_or_else(|| StateError::Mismatch(format!("event {dw0:#x}")))?;
            events.push(AsyncEvent { kind, info: (dw0 >> 8) as u8, log_page: (dw0 >> 16) as u8 });
        }
        if s.events.errors.len() > crate::events::ERROR_LOG_ENTRIES {
            return bad(format!("{} error log entries", s.events.errors.len()));
        }
        let mut errors = Vec::new();
        for e in &s.events.errors {
            let b = unhex(e, 64)?;
            errors.push(
                ErrorInformationEntry::read_from_bytes(&b)
                    .map_err(|_| StateError::Mismatch("error entry".into()))?,
            );
        }
        if let Some((nsid, _)) = s.namespace_stats.iter().find(|(n, _)| !mine.iter().any(|m| m.0 == *n)) {
            return bad(format!("counters for namespace {nsid}, which is not here"));
        }
        if let Some(q) = s.queue_stats.iter().find(|q| q.qid > self.engine.ctx.max_qid) {
            return bad(format!("counters for queue {}, beyond this controller's", q.qid));
        }
        let nn = self.max_namespaces().max(1);
        let ns = &s.events.changed_ns;
        if ns.len() > 1024 || ns.windows(2).any(|w| w[0] >= w[1]) || ns.iter().any(|&n| n == 0 || n > nn) {
            return bad(format!("changed namespace list {ns:?}"));
        }
        Ok(Checked { lifecycle, cqs, events, errors })
    }

    /// The registers: consistent with each other and with the lifecycle.
    fn check_registers(&self, s: &ControllerState, lifecycle: Lifecycle) -> Result<(), StateError> {
        let r = &s.regs;
        let (cc, csts) = (Cc(r.cc), Csts(r.csts));
        let bad = |why: &str| {
            Err(StateError::Mismatch(format!(
                "registers: {why} (CC {:#x}, CSTS {:#x}, {})",
                r.cc, r.csts, r.lifecycle
            )))
        };
        let defined = Csts::RDY | Csts::CFS | (3 << Csts::SHST_SHIFT) | Csts::NSSRO | Csts::PP;
        if r.csts & !defined != 0 {
            return bad("reserved CSTS bits set");
        }
        if !r.page_size.is_power_of_two() || !(4096..=65536).contains(&r.page_size) {
            return bad(&format!("page size {}", r.page_size));
        }
        match lifecycle {
            Lifecycle::Disabled if cc.en() || csts.rdy() || csts.cfs() => {
                bad("disabled, yet enabled or ready")
            }
            Lifecycle::Ready | Lifecycle::ShutDown if !cc.en() || !csts.rdy() || csts.cfs() => {
                bad("running, yet not enabled and ready")
            }
            Lifecycle::Fatal if !csts.cfs() => bad("fatal without CSTS.CFS"),
            Lifecycle::Ready | Lifecycle::ShutDown
                if cc.mps() < self.cap().mpsmin()
                    || cc.mps() > self.cap().mpsmax()
                    || r.page_size != 1u64 << (12 + cc.mps() as u32) =>
            {
                bad("the page size is not CC.MPS's")
            }
            Lifecycle::Ready | Lifecycle::ShutDown
                if !r.asq.is_multiple_of(r.page_size) || !r.acq.is_multiple_of(r.page_size) =>
            {
                bad("ASQ/ACQ not page aligned")
            }
            _ => Ok(()),
        }
    }

    /// The queues: each within this controller's limits and its own, admin queues
    /// as the registers say, every SQ on a CQ of the state. Returns the CQs with
    /// their decoded overflow.
    fn check_queues(
        &self,
        s: &ControllerState,
        lifecycle: Lifecycle,
    ) -> Result<Vec<(CqState, Vec<Cqe>)>, StateError> {
        let bad = |why: String| Err(StateError::Mismatch(why));
        let max_qid = self.engine.ctx.max_qid;
        if has_duplicates(s.sqs.iter().map(|q| q.qid)) || has_duplicates(s.cqs.iter().map(|q| q.qid)) {
            return bad("a queue identifier twice".into());
        }
        let running = matches!(lifecycle, Lifecycle::Ready | Lifecycle::ShutDown);
        let (admin_sq, admin_cq) = (s.sqs.iter().find(|q| q.qid == 0), s.cqs.iter().find(|q| q.qid == 0));
        if lifecycle == Lifecycle::Disabled && !(s.sqs.is_empty() && s.cqs.is_empty()) {
            return bad("queues on a disabled controller".into());
        }
        if running {
            let aqa = Aqa(s.regs.aqa);
            let admin_ok = admin_sq
                .is_some_and(|q| q.base == s.regs.asq && q.size == aqa.asqs_z() as u32 + 1 && q.cqid == 0)
                && admin_cq
                    .is_some_and(|q| q.base == s.regs.acq && q.size == aqa.acqs_z() as u32 + 1 && q.iv == 0);
            if !admin_ok {
                return bad("the admin queues are not the ones AQA, ASQ and ACQ describe".into());
            }
        }
        let page = s.regs.page_size;
        let limit = |qid: u16| if qid == 0 { 4096 } else { self.cap().mqes_z() as u32 + 1 };
        let granted = |qid: u16, z: u16| qid == 0 || qid as u32 <= z as u32 + 1;
        let mut cqs = Vec::with_capacity(s.cqs.len());
        for c in &s.cqs {
            let what = format!("CQ {}", c.qid);
            if c.qid > max_qid || !granted(c.qid, s.admin.ncq_granted_z) {
                return bad(format!("{what}: beyond the queues granted (this controller has {max_qid})"));
            }
            if c.size < 2 || c.size > limit(c.qid) || c.head >= c.size || c.tail >= c.size {
                return bad(format!("{what}: size {} (head {}, tail {})", c.size, c.head, c.tail));
            }
            if !c.base.is_multiple_of(page) {
                return bad(format!("{what}: base {:#x} not page aligned", c.base));
            }
            let posting: u64 =
                s.sqs.iter().filter(|q| q.cqid == c.qid).map(|q| q.size.saturating_sub(1) as u64).sum();
            if c.overflow.len() as u64 > posting {
                return bad(format!(
                    "{what}: {} completions waiting, more than its SQs hold",
                    c.overflow.len()
                ));
            }
            let mut overflow = Vec::with_capacity(c.overflow.len());
            for e in &c.overflow {
                let b = unhex(e, 16)?;
                overflow.push(Cqe::read_from_bytes(&b).map_err(|_| StateError::Mismatch("CQE".into()))?);
            }
            cqs.push((c.clone(), overflow));
        }
        for q in &s.sqs {
            let what = format!("SQ {}", q.qid);
            if q.qid > max_qid || !granted(q.qid, s.admin.nsq_granted_z) {
                return bad(format!("{what}: beyond the queues granted (this controller has {max_qid})"));
            }
            if q.size < 2 || q.size > limit(q.qid) || q.head >= q.size || q.tail >= q.size {
                return bad(format!("{what}: size {} (head {}, tail {})", q.size, q.head, q.tail));
            }
            if !q.base.is_multiple_of(page) {
                return bad(format!("{what}: base {:#x} not page aligned", q.base));
            }
            if (q.qid == 0) != (q.cqid == 0) || !s.cqs.iter().any(|c| c.qid == q.cqid) {
                return bad(format!("{what} posts to CQ {}, which is not in the state", q.cqid));
            }
        }
        Ok(cqs)
    }

    /// Puts a checked state in place. Cannot fail.
    fn apply_state(&mut self, s: &ControllerState, c: Checked) {
        // Queues: the admin pair on the controller's engine, I/O queues where the
        // routing puts them (the number of workers may differ from the saved side).
        let (admin_cqs, io_cqs): (Vec<_>, Vec<_>) = c.cqs.into_iter().partition(|(q, _)| q.qid == 0);
        let admin_sq: Vec<SqState> = s.sqs.iter().filter(|q| q.qid == 0).cloned().collect();
        self.engine.install_queues(&admin_sq, &admin_cqs);
        for cq in io_cqs {
            self.io_restore_cq(cq);
        }
        for q in s.sqs.iter().filter(|q| q.qid != 0) {
            self.io_restore_sq(q.clone());
        }
        if let Some(q) = s.next_sq {
            self.engine.queues.set_upcoming(q);
        }
        if let Some(sh) = s.shadow {
            let b = ShadowBuffers { shadow: sh.shadow, eventidx: sh.eventidx, dstrd: self.cfg.dstrd };
            self.on_all_engines(move |e| e.shadow = Some(b));
        }
        for &iv in &s.coalescing_disabled {
            self.io_set_vector_coalescing_disabled(iv, true);
        }
        // Admin side and features.
        let a = &s.admin;
        self.admin.aers = a.aers.clone();
        self.admin.io_queues_created = a.io_queues_created;
        self.admin.created_ns = a.created_ns;
        let f = &mut self.admin.features;
        f.nsq_granted_z = a.nsq_granted_z;
        f.ncq_granted_z = a.ncq_granted_z;
        let v = &a.features;
        f.cur.arbitration = v.arbitration;
        f.cur.power_management = v.power_management;
        f.cur.temp_over = v.temp_over;
        f.cur.temp_under = v.temp_under;
        f.cur.error_recovery = v.error_recovery;
        f.cur.write_cache = v.write_cache;
        f.cur.coalescing = v.coalescing;
        f.cur.write_atomicity = v.write_atomicity;
        f.cur.aec = v.aec;
        f.aec = nvme_spec::features::AsyncEventConfig(v.aec);
        f.reset_ns = a.reset_ns;
        f.timestamp = a.timestamp_ms.map(|ms| (ms, self.clock.now_ns()));
        self.events.restore(&s.events, c.events, c.errors);
        self.stats.restore(&s.stats);
        for (nsid, st) in &s.namespace_stats {
            if let Some(ns) = self.namespaces().find(|x| x.nsid == *nsid) {
                ns.stats.restore(st);
            }
        }
        for q in &s.queue_stats {
            if let Some(c) = self.engine.ctx.queue_stats.get(q.qid as usize) {
                c.restore(q);
            }
        }
        if let Some(j) = self.runtime.judge() {
            // The commands counter jumped: the running epoch would look free.
            j.restart_epoch();
        }
        for n in &s.namespaces {
            if let Some(ns) = self.namespaces().find(|x| x.nsid == n.nsid) {
                ns.set_lba_format(n.lba_format);
            }
        }
        // Registers last: the controller is live from here.
        self.regs.restore(RegisterValues {
            cc: s.regs.cc,
            csts: s.regs.csts,
            aqa: s.regs.aqa,
            asq: s.regs.asq,
            acq: s.regs.acq,
            intms: s.regs.intms,
        });
        self.phase = Phase::of(c.lifecycle, s.regs.page_size);
        if csts_fatal(s.regs.csts) {
            self.engine.ctx.fatal.store(true, std::sync::atomic::Ordering::Release);
        }
        self.io_apply_settings();
    }
}

/// What checking a state decoded, for applying it.
struct Checked {
    lifecycle: Lifecycle,
    /// Every CQ of the state with its overflow, decoded.
    cqs: Vec<(CqState, Vec<Cqe>)>,
    events: Vec<AsyncEvent>,
    errors: Vec<ErrorInformationEntry>,
}

/// Most events a restored controller may have queued: one per event type and
/// information value it can raise is far fewer.
const MAX_QUEUED_EVENTS: usize = 256;

fn has_duplicates<T: Ord>(items: impl Iterator<Item = T>) -> bool {
    let mut v: Vec<T> = items.collect();
    let n = v.len();
    v.sort();
    v.dedup();
    v.len() != n
}

fn csts_fatal(csts: u32) -> bool {
    csts & Csts::CFS != 0
}
