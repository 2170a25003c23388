//! Handing a controller's state over: quiesce, save, restore (a new process after
//! an upgrade, or the destination of a migration), resume. The record and its
//! format are in `state.rs`; each part saves itself and checks its own saved
//! record, and a restore here checks every part before it changes any.

use std::time::Duration;

use nvme_spec::Cqe;

use super::Controller;
use crate::admin::AdminBounds;
use crate::doorbell::ShadowBuffers;
use crate::engine::Deadline;
use crate::events::EventsChecked;
use crate::lifecycle::{Lifecycle, Phase};
use crate::queue::saved::QueueBounds;
use crate::queue::{CqState, SqState};
use crate::state::{ControllerState, NamespaceSaved, StateError, STATE_VERSION};

/// A state whose every part was checked, decoded for putting in place.
struct Checked {
    phase: Phase,
    /// Every CQ of the state with its waiting completions.
    cqs: Vec<(CqState, Vec<Cqe>)>,
    shadow: Option<ShadowBuffers>,
    events: EventsChecked,
    ana: crate::ana::AnaChecked,
}

impl Controller {
    /// Stops fetching commands everywhere and waits, at most `bound`, until every
    /// command already fetched has completed and an erasing Format has finished;
    /// signals every coalesced interrupt. On failure the controller is resumed.
    pub fn quiesce(&mut self, bound: Duration) -> Result<(), StateError> {
        let deadline = Deadline::after(&*self.clock, bound);
        self.on_all_engines(|e| e.set_quiesced(true));
        self.quiesced = true;
        loop {
            // Runs the admin queue's pending work (AERs stay parked) and reaps.
            self.process();
            let format = self.admin.formatting();
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
        ControllerState {
            version: STATE_VERSION,
            clock_ns: now,
            capabilities: Some(self.capabilities()),
            regs: self.regs.save(self.phase),
            sqs,
            cqs,
            next_sq: self.engine.queues.upcoming(),
            shadow: self.engine.shadow().map(|b| b.save()),
            coalescing_disabled: (0..self.cfg.msix_vectors)
                .filter(|&iv| self.engine.vector_coalescing_disabled(iv))
                .collect(),
            admin: self.admin.save(now),
            events: self.events.save(),
            stats: self.stats.snapshot().into(),
            namespace_stats: self.namespaces().map(|n| (n.nsid, n.stats.snapshot())).collect(),
            queue_stats: self.engine.save_queue_stats(),
            namespaces: self
                .namespaces()
                .map(|n| NamespaceSaved {
                    nsid: n.nsid,
                    size: n.size(),
                    lba_format: n.lba_format(),
                    dps: n.dps(),
                    extended: n.extended(),
                    zones: n.zones.as_ref().map(|z| z.save()),
                    zone_layout: n.zones.as_ref().map(|z| z.layout()),
                })
                .collect(),
            fdp: self.admin.fdp.as_ref().map(|f| f.save()),
            ana: self.admin.ana.save(),
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

    /// Every check of [`Self::restore_state`], part by part; what they decode.
    fn check_state(&self, s: &ControllerState) -> Result<Checked, StateError> {
        if s.version != STATE_VERSION {
            return Err(StateError::Version(s.version));
        }
        let bad = |why: String| StateError::Mismatch(why);
        if self.lifecycle() != Lifecycle::Disabled || !self.runtime.no_io_queues() || self.engine.cq_exists(0)
        {
            return Err(bad("the controller is not new".into()));
        }
        if let Some(c) = s.capabilities.filter(|&c| c != self.capabilities()) {
            return Err(bad(format!(
                "capabilities {c:?}, here {:?} (create the controller with ControllerConfig::capabilities)",
                self.capabilities()
            )));
        }
        self.check_namespaces(s).map_err(bad)?;
        match (&self.admin.fdp, &s.fdp) {
            (None, None) => {}
            (Some(f), Some(saved)) => saved.check(f.config()).map_err(bad)?,
            (Some(_), None) => return Err(bad("FDP is on here, not in the state".into())),
            (None, Some(_)) => return Err(bad("FDP is on in the state, not here".into())),
        }
        let phase = s.regs.check(self.cap()).map_err(bad)?;
        let bounds = QueueBounds {
            max_qid: self.cfg.max_io_queues,
            io_entries: self.cap().mqes_z() as u32 + 1,
            vectors: self.cfg.msix_vectors,
            page_size: s.regs.page_size,
            nsq_granted_z: s.admin.nsq_granted_z,
            ncq_granted_z: s.admin.ncq_granted_z,
            admin: phase.page_size().map(|_| s.regs.admin_queues()),
        };
        let cqs = crate::queue::saved::check(&s.sqs, &s.cqs, &bounds).map_err(bad)?;
        let shadow =
            s.shadow.map(|sh| sh.check(phase.page_size(), self.cfg.dstrd)).transpose().map_err(bad)?;
        if let Some(iv) = s.coalescing_disabled.iter().find(|&&iv| iv >= self.cfg.msix_vectors) {
            return Err(bad(format!("vector {iv} beyond {}", self.cfg.msix_vectors)));
        }
        if s.next_sq.is_some_and(|q| !s.sqs.iter().any(|x| x.qid == q)) {
            return Err(bad(format!("next SQ {:?} does not exist", s.next_sq)));
        }
        s.admin
            .check(AdminBounds {
                aers: self.cfg.aerl_z as usize + 1,
                max_qid: self.cfg.max_io_queues,
                enabled: phase != Phase::Disabled,
            })
            .map_err(bad)?;
        let events = s.events.check(self.max_namespaces()).map_err(bad)?;
        let ana = s.ana.check().map_err(bad)?;
        if let Some(q) = s.queue_stats.iter().find(|q| q.qid > self.cfg.max_io_queues) {
            return Err(bad(format!("counters for queue {}, beyond this controller's", q.qid)));
        }
        Ok(Checked { phase, cqs, shadow, events, ana })
    }

    /// The namespaces and their counters: the same NSIDs and sizes as here, LBA
    /// formats this controller has.
    fn check_namespaces(&self, s: &ControllerState) -> Result<(), String> {
        let mine: Vec<(u32, u64)> = self.namespaces().map(|n| (n.nsid, n.size())).collect();
        let theirs: Vec<(u32, u64)> = s.namespaces.iter().map(|n| (n.nsid, n.size)).collect();
        if mine != theirs {
            return Err(format!("namespaces (NSID, bytes) {theirs:?}, here {mine:?}"));
        }
        for n in &s.namespaces {
            let ns = self.namespaces().find(|x| x.nsid == n.nsid).expect("the same NSIDs (above)");
            let formats = ns.format_count();
            if n.lba_format as usize >= formats {
                return Err(format!(
                    "namespace {}: LBA format {} (it has {formats} here{})",
                    n.nsid,
                    n.lba_format,
                    if ns.meta.is_none() { ": no metadata store" } else { "" }
                ));
            }
            let def = crate::namespace::LBA_FORMATS[n.lba_format as usize];
            let ms = def.ms;
            crate::namespace::format_fits(def, n.dps).map_err(|e| format!("namespace {}: {e}", n.nsid))?;
            if ms > 0 && ns.zones.is_some() {
                return Err(format!("namespace {}: a zoned namespace in a format with metadata", n.nsid));
            }
        }
        for n in &s.namespaces {
            let here = self.namespaces().find(|x| x.nsid == n.nsid).and_then(|x| x.zones.as_ref());
            match (here, &n.zones) {
                (None, None) => {}
                (Some(z), Some(saved)) => {
                    let shift = crate::namespace::LBA_FORMATS[n.lba_format as usize].shift as u32;
                    z.check_saved(saved, n.zone_layout, shift)
                        .map_err(|e| format!("namespace {}: {e}", n.nsid))?
                }
                (Some(_), None) => {
                    return Err(format!("namespace {} is zoned here, not in the state", n.nsid))
                }
                (None, Some(_)) => {
                    return Err(format!("namespace {} is zoned in the state, not here", n.nsid))
                }
            }
        }
        if let Some((nsid, _)) = s.namespace_stats.iter().find(|(n, _)| !mine.iter().any(|m| m.0 == *n)) {
            return Err(format!("counters for namespace {nsid}, which is not here"));
        }
        Ok(())
    }

    /// Puts a checked state in place, part by part. Cannot fail.
    fn apply_state(&mut self, s: &ControllerState, c: Checked) {
        // Queues: the admin pair on the controller's engine, I/O queues where the
        // routing puts them (the number of workers may differ from the saved side).
        let (admin_cqs, io_cqs): (Vec<_>, Vec<_>) = c.cqs.into_iter().partition(|(q, _)| q.qid == 0);
        let admin_sq: Vec<SqState> = s.sqs.iter().filter(|q| q.qid == 0).cloned().collect();
        self.engine.install_queues(&admin_sq, &admin_cqs);
        for cq in io_cqs {
            self.runtime.restore_cq(&mut self.engine, cq);
        }
        for q in s.sqs.iter().filter(|q| q.qid != 0) {
            self.runtime.restore_sq(&mut self.engine, q.clone());
        }
        if let Some(q) = s.next_sq {
            self.engine.queues.set_upcoming(q);
        }
        if let Some(b) = c.shadow {
            self.on_all_engines(move |e| e.restore_shadow(b));
        }
        for &iv in &s.coalescing_disabled {
            self.runtime.set_vector_coalescing_disabled(&mut self.engine, iv, true);
        }
        self.admin.restore(&s.admin, self.clock.now_ns());
        self.events.restore(c.events);
        self.stats.restore(&s.stats);
        for (nsid, st) in &s.namespace_stats {
            if let Some(ns) = self.namespaces().find(|x| x.nsid == *nsid) {
                ns.stats.restore(st);
            }
        }
        self.engine.restore_queue_stats(&s.queue_stats);
        if let Some(j) = self.runtime.judge() {
            // The commands counter jumped: the running epoch would look free.
            j.restart_epoch();
        }
        for n in &s.namespaces {
            if let Some(ns) = self.namespaces().find(|x| x.nsid == n.nsid) {
                ns.set_lba_format(n.lba_format, n.dps, n.extended);
                if let (Some(z), Some(saved)) = (&ns.zones, &n.zones) {
                    z.restore(saved);
                }
            }
        }
        if let (Some(f), Some(saved)) = (&self.admin.fdp, &s.fdp) {
            f.restore(saved);
        }
        self.admin.ana.restore(c.ana);
        // Registers last: the controller is live from here.
        self.regs.restore(&s.regs);
        self.phase = c.phase;
        if c.phase == Phase::Fatal {
            self.engine.io.ctx.fatal.store(true, std::sync::atomic::Ordering::Release);
        }
        self.apply_settings();
    }
}
