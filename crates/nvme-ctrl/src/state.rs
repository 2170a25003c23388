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
//! coalesced interrupts not yet signalled (a quiesce signals them), per-namespace and
//! per-queue counters, and QoS limits (the transport keeps and re-applies those).

use std::time::{Duration, Instant};

use nvme_spec::aer::{AsyncEvent, EventType};
use nvme_spec::log::ErrorInformationEntry;
use nvme_spec::regs::{Aqa, Cc, Csts};
use nvme_spec::Cqe;
use serde::{Deserialize, Serialize};
use zerocopy::{FromBytes, IntoBytes};

use crate::controller::{Controller, Lifecycle};
use crate::doorbell::ShadowBuffers;
use crate::engine::IoEngine;
use crate::queue::{CompletionQueue, SubmissionQueue};
use crate::stats::StatsSnapshot;

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

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EventsSaved {
    /// Error Information log entries, newest first, each as 128 hex digits.
    pub errors: Vec<String>,
    pub error_count: u64,
    /// Events raised and not yet reported: completion dword 0 of each.
    pub queued: Vec<u32>,
    pub masked: u8,
    pub changed_ns: Vec<u32>,
    pub critical_warning: u8,
    pub warning_events: u8,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsSaved {
    pub doorbell_writes: u64,
    pub io_doorbell_writes: u64,
    pub io_cq_doorbell_writes: u64,
    pub interrupts: u64,
    pub admin_commands: u64,
    pub io_commands: u64,
    pub shadow_reads: u64,
    pub eventidx_races: u64,
    pub errors: u64,
    pub read_commands: u64,
    pub write_commands: u64,
    pub media_errors: u64,
    pub backend_errors: u64,
    pub timeouts: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
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

impl From<StatsSnapshot> for StatsSaved {
    fn from(s: StatsSnapshot) -> Self {
        StatsSaved {
            doorbell_writes: s.doorbell_writes,
            io_doorbell_writes: s.io_doorbell_writes,
            io_cq_doorbell_writes: s.io_cq_doorbell_writes,
            interrupts: s.interrupts,
            admin_commands: s.admin_commands,
            io_commands: s.io_commands,
            shadow_reads: s.shadow_reads,
            eventidx_races: s.eventidx_races,
            errors: s.errors,
            read_commands: s.read_commands,
            write_commands: s.write_commands,
            media_errors: s.media_errors,
            backend_errors: s.backend_errors,
            timeouts: s.timeouts,
            bytes_read: s.bytes_read,
            bytes_written: s.bytes_written,
        }
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
        self.running == 0 && self.throttle.held_total == 0 && self.admin_inbox.is_empty()
    }

    /// Signals every coalesced interrupt now (a quiesce leaves none pending).
    pub(crate) fn flush_interrupts(&mut self) {
        self.signal_interrupts();
        for (iv, v) in self.vectors.iter_mut().enumerate() {
            if v.take_pending() {
                crate::stats::Stats::add(&self.ctx.stats.interrupts, 1);
                self.ctx.irq.signal(iv as u16);
            }
        }
        self.vectors_waiting = false;
    }

    fn save_queues(&self) -> EngineQueues {
        let seen = |qid: u16, k: usize| self.page_seen.get(qid as usize).map_or(0, |s| s[k]);
        let sqs = (0..self.sqs.len())
            .filter_map(|i| self.sqs[i].as_ref().map(|q| (i as u16, q)))
            .map(|(qid, q)| SqState {
                qid,
                cqid: q.cqid,
                base: q.base,
                size: q.size,
                head: q.head,
                tail: q.tail,
                eventidx: q.arm.published(),
                page_seen: seen(qid, 0),
            })
            .collect();
        let cqs = (0..self.cqs.len())
            .filter_map(|i| self.cqs[i].as_ref().map(|q| (i as u16, q)))
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
                page_seen: seen(qid, 1),
            })
            .collect();
        (sqs, cqs)
    }

    /// Puts saved queues in place as they were: nothing is written to guest memory
    /// (the shadow slots and EventIdx there are the live ones).
    pub(crate) fn restore_queues(&mut self, sqs: &[SqState], cqs: &[CqState]) -> Result<(), StateError> {
        let max_qid = self.ctx.max_qid;
        let range = |qid: u16| -> Result<usize, StateError> {
            (qid <= max_qid).then_some(qid as usize).ok_or_else(|| {
                StateError::Mismatch(format!("queue {qid} beyond this controller's {max_qid}"))
            })
        };
        for c in cqs {
            let i = range(c.qid)?;
            if c.size < 2 || c.head >= c.size || c.tail >= c.size {
                return Err(StateError::Mismatch(format!("CQ {}: head/tail outside its size", c.qid)));
            }
            let mut q = CompletionQueue::new(c.base, c.size, c.ien, c.iv);
            (q.head, q.tail, q.phase, q.waiting_for_space) = (c.head, c.tail, c.phase, c.waiting_for_space);
            for e in &c.overflow {
                let b = unhex(e, 16)?;
                q.overflow
                    .push_back(Cqe::read_from_bytes(&b).map_err(|_| StateError::Mismatch("CQE".into()))?);
            }
            self.cqs[i] = Some(q);
            self.note_cq(c.qid);
            if let Some(s) = self.page_seen.get_mut(i) {
                s[1] = c.page_seen;
            }
        }
        for s in sqs {
            let i = range(s.qid)?;
            if s.size < 2 || s.head >= s.size || s.tail >= s.size {
                return Err(StateError::Mismatch(format!("SQ {}: head/tail outside its size", s.qid)));
            }
            let Some(cq) = self.cqs.get_mut(s.cqid as usize).and_then(Option::as_mut) else {
                return Err(StateError::Mismatch(format!(
                    "SQ {} posts to CQ {}, which is not here",
                    s.qid, s.cqid
                )));
            };
            cq.sq_count += 1;
            let mut q = SubmissionQueue::new(s.cqid, s.base, s.size);
            // EventIdx is published again here (`resume`): what the saved process
            // last published need not be what guest memory holds any more.
            (q.head, q.tail) = (s.head, s.tail);
            self.sqs[i] = Some(q);
            let pos = self.active_sqs.partition_point(|&q| q < s.qid);
            self.active_sqs.insert(pos, s.qid);
            if let Some(p) = self.page_seen.get_mut(i) {
                p[0] = s.page_seen;
            }
        }
        Ok(())
    }
}

impl Controller {
    /// Stops fetching commands everywhere and waits, at most `bound`, until every
    /// command already fetched has completed and an erasing Format has finished;
    /// signals every coalesced interrupt. On failure the controller is resumed.
    pub fn quiesce(&mut self, bound: Duration) -> Result<(), StateError> {
        let deadline = Instant::now() + bound;
        self.on_all_engines(|e| e.set_quiesced(true));
        self.quiesced = true;
        loop {
            // Runs the admin queue's pending work (AERs stay parked) and reaps.
            self.process();
            let format = self.admin.format.is_some();
            let mut quiet = self.engine.quiet() && !format;
            for w in &self.workers {
                quiet &= w.call(|e| {
                    e.poll();
                    e.quiet()
                });
            }
            if quiet {
                break;
            }
            if Instant::now() >= deadline {
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
        for w in &self.workers {
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
        ControllerState {
            version: STATE_VERSION,
            clock_ns: now,
            capabilities: Some(self.capabilities()),
            regs: Registers {
                cc: self.cc.0,
                csts: self.csts.0,
                aqa: self.aqa.0,
                asq: self.asq,
                acq: self.acq,
                intms: self.intms,
                lifecycle: lifecycle_name(self.state).into(),
                page_size: self.page_size,
            },
            sqs,
            cqs,
            next_sq: self
                .engine
                .active_sqs
                .get(self.engine.rr_next % self.engine.active_sqs.len().max(1))
                .copied(),
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
                timestamp_ms: f.timestamp.map(|(ms, at)| ms + now.saturating_sub(at) / 1_000_000),
                created_ns: self.admin.created_ns,
                reset_ns: f.reset_ns,
            },
            events: self.events.save(),
            stats: self.stats.snapshot().into(),
            namespaces: self
                .namespaces()
                .map(|n| NamespaceSaved { nsid: n.nsid, size: n.size(), lba_format: n.lba_format() })
                .collect(),
        }
    }

    /// Restores `s` into this controller, which must be new (disabled, no queues) and
    /// built over the same configuration and namespaces; its clock should continue
    /// from `s.clock_ns`. Checks everything before changing anything.
    pub fn restore_state(&mut self, s: &ControllerState) -> Result<(), StateError> {
        if s.version != STATE_VERSION {
            return Err(StateError::Version(s.version));
        }
        if self.state != Lifecycle::Disabled || !self.book.is_empty() {
            return Err(StateError::Mismatch("the controller is not new".into()));
        }
        if let Some(c) = s.capabilities.filter(|&c| c != self.capabilities()) {
            return Err(StateError::Mismatch(format!(
                "capabilities {c:?}, here {:?} (create the controller with ControllerConfig::capabilities)",
                self.capabilities()
            )));
        }
        let mine: Vec<(u32, u64)> = self.namespaces().map(|n| (n.nsid, n.size())).collect();
        let theirs: Vec<(u32, u64)> = s.namespaces.iter().map(|n| (n.nsid, n.size)).collect();
        if mine != theirs {
            return Err(StateError::Mismatch(format!("namespaces (NSID, bytes) {theirs:?}, here {mine:?}")));
        }
        let lifecycle = match s.regs.lifecycle.as_str() {
            "disabled" => Lifecycle::Disabled,
            "ready" => Lifecycle::Ready,
            "shut-down" => Lifecycle::ShutDown,
            "fatal" => Lifecycle::Fatal,
            l => return Err(StateError::Mismatch(format!("lifecycle {l:?}"))),
        };
        if !s.regs.page_size.is_power_of_two() || !(4096..=65536).contains(&s.regs.page_size) {
            return Err(StateError::Mismatch(format!("page size {}", s.regs.page_size)));
        }
        for iv in s.cqs.iter().map(|c| c.iv).chain(s.coalescing_disabled.iter().copied()) {
            if iv >= self.cfg.msix_vectors {
                return Err(StateError::Mismatch(format!("vector {iv} beyond {}", self.cfg.msix_vectors)));
            }
        }
        let mut events = Vec::new();
        for dw0 in &s.events.queued {
            let kind =
                event_type(*dw0 as u8 & 7).ok_or_else(|| StateError::Mismatch(format!("event {dw0:#x}")))?;
            events.push(AsyncEvent { kind, info: (dw0 >> 8) as u8, log_page: (dw0 >> 16) as u8 });
        }
        let mut errors = Vec::new();
        for e in &s.events.errors {
            let b = unhex(e, 64)?;
            errors.push(
                ErrorInformationEntry::read_from_bytes(&b)
                    .map_err(|_| StateError::Mismatch("error entry".into()))?,
            );
        }
        // Queues: the admin pair on the controller's engine, I/O queues where the
        // routing puts them (the number of workers may differ from the saved side).
        let admin_sq: Vec<SqState> = s.sqs.iter().filter(|q| q.qid == 0).cloned().collect();
        let admin_cq: Vec<CqState> = s.cqs.iter().filter(|q| q.qid == 0).cloned().collect();
        self.engine.restore_queues(&admin_sq, &admin_cq)?;
        for c in s.cqs.iter().filter(|q| q.qid != 0) {
            self.io_restore_cq(c.clone())?;
        }
        for q in s.sqs.iter().filter(|q| q.qid != 0) {
            self.io_restore_sq(q.clone())?;
        }
        if let Some(q) = s.next_sq {
            self.engine.rr_next = self.engine.active_sqs.iter().position(|&x| x == q).unwrap_or(0);
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
        self.events.restore(&s.events, events, errors);
        self.stats.restore(&s.stats);
        if let Some(j) = &self.judge {
            // The commands counter jumped: the running epoch would look free.
            j.restart_epoch();
        }
        for n in &s.namespaces {
            if let Some(ns) = self.namespaces().find(|x| x.nsid == n.nsid) {
                ns.set_lba_format(n.lba_format);
            }
        }
        // Registers last: the controller is live from here.
        self.cc = Cc(s.regs.cc);
        self.csts = Csts(s.regs.csts);
        self.aqa = Aqa(s.regs.aqa);
        (self.asq, self.acq, self.intms) = (s.regs.asq, s.regs.acq, s.regs.intms);
        self.page_size = s.regs.page_size;
        self.state = lifecycle;
        if csts_fatal(s.regs.csts) {
            self.engine.ctx.fatal.store(true, std::sync::atomic::Ordering::Release);
        }
        self.io_apply_settings();
        Ok(())
    }
}

fn csts_fatal(csts: u32) -> bool {
    csts & Csts::CFS != 0
}
