//! Format NVM (Base §5.1.10, NVM §4.2): switch a namespace between the 512 B and
//! 4 KiB LBA formats, optionally erasing user data.
//!
//! An erase writes zeroes over whole namespaces, which can take longer than any one
//! call of the admin side may: the thread that runs the admin queue (the vfio-user
//! server's) must keep answering its client (QEMU waits at most 5 s for a register
//! read). So an erasing Format is a [`FormatJob`] that `Controller::process`
//! advances a piece at a time, for at most [`FORMAT_SLICE`] per call, and completes
//! when the last piece has. Each piece is bounded by the namespace's command timeout;
//! a piece the backend does not finish in time fails the Format with Internal Error.

use std::sync::Arc;
use std::time::{Duration, Instant};

use block_backend::Op;
use nvme_spec::admin::FormatNvm;
use nvme_spec::aer::{notice_info, AsyncEvent, EventType};
use nvme_spec::log::lid;
use nvme_spec::{Sqe, Status, NSID_ALL};
use tracing::info;

use super::erase::{FormatJob, Piece};
use super::{done, status, Admin, AdminDone, AdminState};
use crate::engine::IoEngine;
use crate::error::{CmdResult, CommandError};
use crate::namespace::{FormatState, Namespace, LBA_FORMATS};

/// The most one erase piece covers (less when the backend's write-zeroes limit is lower).
const PIECE_MAX: u64 = 256 << 20;

/// The most time one `process` call spends starting erase pieces.
pub(crate) const FORMAT_SLICE: Duration = Duration::from_millis(2);

/// Whether namespace `ns` offers LBA format `lbaf` with protection settings `dps`,
/// its metadata inline (`extended`, MSET) or not: formats with metadata only where
/// it can be kept (and not on a zoned namespace), a PI type only with metadata for
/// it, and MSET only where metadata is kept at all.
fn offers(ns: &Namespace, lbaf: u8, dps: u8, extended: bool) -> bool {
    let Some(def) = LBA_FORMATS[..ns.format_count()].get(lbaf as usize) else { return false };
    crate::namespace::format_fits(*def, dps).is_ok()
        && (def.ms == 0 || ns.zones.is_none())
        && (!extended || ns.meta.is_some())
}

/// Whether the backend of `ns` can do the blocks of format `lbaf` (not smaller
/// than its own, and its size a multiple). `lbaf` is one [`offers`] allowed.
fn backend_fits(ns: &Namespace, lbaf: u8) -> bool {
    let lba = 1u64 << LBA_FORMATS[lbaf as usize].shift;
    crate::namespace::lba_fits(lba, ns.info.block_size, ns.size())
}

/// Puts `ns` in format `f`, one another process chose (a Format NVM through
/// another controller of the subsystem, or through this controller's process
/// before a crash), checked as a Format NVM would be: that process may be one a
/// hostile VMM took over. Ok(true) if it changed; its metadata and zones are left
/// to the caller.
pub(crate) fn adopt(ns: &Namespace, f: FormatState) -> Result<bool, &'static str> {
    if ns.format_state() == f {
        return Ok(false);
    }
    if !offers(ns, f.lbaf, f.dps, f.extended) || !backend_fits(ns, f.lbaf) {
        return Err("the format does not fit the namespace");
    }
    ns.set_lba_format(f.lbaf, f.dps, f.extended);
    Ok(true)
}

impl AdminState {
    /// Ends an erasing Format in progress with Internal Error (`why` is logged).
    pub(crate) fn fail_format(&mut self, engine: &mut IoEngine, why: &str) {
        if let Some(job) = self.format.take() {
            log_limit::limited_warn!(target: "vnvme::backend", cid = job.cid, "Format NVM (erase) failed: {why}");
            engine.complete_deferred(0, job.cid, Status::INTERNAL_ERROR, 0);
        }
    }

    /// True while an erasing Format is in progress.
    pub(crate) fn formatting(&self) -> bool {
        self.format.is_some()
    }

    /// True while an erasing Format of namespace `nsid` is in progress.
    pub(crate) fn formatting_ns(&self, nsid: u32) -> bool {
        self.format.as_ref().is_some_and(|f| f.targets(nsid))
    }
}

impl Admin<'_> {
    pub(crate) fn format_nvm(&mut self, sqe: &Sqe) -> CmdResult<AdminDone> {
        let f = FormatNvm(sqe);
        let nsid = sqe.nsid.get();
        let targets = if nsid == NSID_ALL {
            crate::namespace::active(self.namespaces).cloned().collect()
        } else {
            vec![self.active_ns(nsid)?]
        };
        // Protection information type and location (PIL means nothing without a type).
        let dps = match f.pi() {
            0 => 0,
            pi => pi | if f.pil() { nvme_spec::identify::dps::FIRST } else { 0 },
        };
        let lbaf = f.lbaf();
        if !targets.iter().all(|ns| offers(ns, lbaf, dps, f.mset())) {
            return status(Status::INVALID_FORMAT);
        }
        let erase = match f.ses() {
            0 => false,
            1 => true,
            _ => return Err(CommandError::InvalidField("cryptographic erase is not supported")),
        };
        if !targets.iter().all(|ns| backend_fits(ns, lbaf)) {
            return status(Status::INVALID_FORMAT);
        }
        if self.admin.format.is_some() {
            return status(Status::FORMAT_IN_PROGRESS);
        }
        if !erase {
            if let Err(s) = self.record_in_pool(&targets, lbaf, dps, f.mset()) {
                return status(s);
            }
            self.apply_format(&targets, lbaf, dps, f.mset(), false);
            return done();
        }
        self.admin.format = Some(FormatJob {
            cid: sqe.cid(),
            lbaf,
            dps,
            extended: f.mset(),
            targets,
            at: 0,
            done: 0,
            piece: None,
        });
        self.advance_format();
        Ok(AdminDone::Deferred)
    }

    /// Moves an erasing Format on: reaps its piece, starts the next ones for at most
    /// [`FORMAT_SLICE`], and completes the command after the last. True if anything
    /// moved.
    pub(crate) fn advance_format(&mut self) -> bool {
        let Some(mut job) = self.admin.format.take() else { return false };
        let started = Instant::now();
        let mut progress = false;
        let outcome = loop {
            if let Some(p) = &job.piece {
                let ns = &job.targets[job.at];
                match self.admin.reap_tagged(ns, p.tag) {
                    Some(Ok(())) => {
                        job.done += p.len;
                        job.piece = None;
                        progress = true;
                    }
                    Some(Err(source)) => break Some(Err(CommandError::Backend { write: true, source })),
                    None if self.clock.now_ns() >= p.expires_ns => {
                        let ms = ns.timeout_ns / 1_000_000;
                        break Some(Err(CommandError::TimedOut { ms }));
                    }
                    None => break None,
                }
            }
            while job.at < job.targets.len() && job.done >= job.targets[job.at].size() {
                job.at += 1;
                job.done = 0;
            }
            if job.at == job.targets.len() {
                break Some(Ok(()));
            }
            if started.elapsed() >= FORMAT_SLICE {
                break None;
            }
            let ns = job.targets[job.at].clone();
            let max = match ns.info.write_zeroes_max {
                0 => PIECE_MAX,
                m => m.min(PIECE_MAX),
            };
            let len = ns.size().saturating_sub(job.done).min(max);
            let mem = self.engine.io.mem.clone();
            let tag = match self.admin.submit(&ns, &mem, Op::WriteZeroes { deallocate: true }, job.done, len)
            {
                Ok(t) => t,
                Err(source) => break Some(Err(CommandError::Backend { write: true, source })),
            };
            let expires_ns = match ns.timeout_ns {
                0 => u64::MAX,
                t => self.clock.now_ns().saturating_add(t),
            };
            job.piece = Some(Piece { tag, len, expires_ns });
            progress = true;
        };
        match outcome {
            None => self.admin.format = Some(job),
            Some(result) => {
                let status = match result.and_then(|()| {
                    self.record_in_pool(&job.targets, job.lbaf, job.dps, job.extended)
                        .map_err(CommandError::Status)
                }) {
                    Ok(()) => {
                        self.apply_format(&job.targets, job.lbaf, job.dps, job.extended, true);
                        Status::SUCCESS
                    }
                    Err(e) => {
                        log_limit::limited_warn!(target: "vnvme::backend", "Format NVM (erase) failed: {e}");
                        e.status()
                    }
                };
                self.engine.complete_deferred(0, job.cid, status, 0);
                progress = true;
            }
        }
        progress
    }

    /// Writes the new format of `targets` into the pool, where there is one,
    /// before it takes effect here: every other controller that has them (the
    /// pool's namespaces attached to it, an operator's NSID it was given too)
    /// takes it up when it next looks (`Controller::sync_pool`), and so does
    /// whichever controller starts or attaches them next. A Format whose record
    /// fails changes nothing here.
    fn record_in_pool(
        &self,
        targets: &[Arc<Namespace>],
        lbaf: u8,
        dps: u8,
        extended: bool,
    ) -> Result<(), Status> {
        let Some(pool) = self.cfg.pool.as_deref() else { return Ok(()) };
        let fixed = pool.state();
        for ns in targets {
            if self.admin.pool_here.contains_key(&ns.nsid) {
                pool.format(ns.nsid, lbaf)?;
            } else if fixed.fixed.contains_key(&ns.nsid) {
                pool.format_fixed(ns.nsid, FormatState { lbaf, dps, extended })?;
            }
        }
        Ok(())
    }

    /// Puts LBA format `lbaf` with protection settings `dps` into effect on
    /// `targets` and tells the host. Metadata kept in another layout means nothing
    /// in this one: it starts over never written (so unchecked), as after an erase.
    fn apply_format(&mut self, targets: &[Arc<Namespace>], lbaf: u8, dps: u8, extended: bool, erase: bool) {
        for ns in targets {
            let changed = (ns.lba_format(), ns.dps()) != (lbaf, dps);
            if let Some(m) = ns.meta.as_ref().filter(|_| changed || erase) {
                if let Err(e) = m.clear_all() {
                    log_limit::limited_warn!(target: "vnvme::backend", nsid = ns.nsid, "cannot clear the metadata: {e}");
                }
            }
            ns.set_lba_format(lbaf, dps, extended);
            self.admin.format_epoch += 1;
            // A formatted zoned namespace starts over with every zone empty.
            if let Some(z) = &ns.zones {
                z.reset_controller(true);
            }
            self.events.namespace_changed(ns.nsid);
            info!(
                nsid = ns.nsid,
                lba_size = 1u32 << ns.lba_shift(),
                metadata = ns.meta_size(),
                pi = dps & nvme_spec::identify::dps::TYPE_MASK,
                erase,
                "namespace formatted"
            );
        }
        if self.admin.features.aec.ns_attribute_notices() {
            self.events.raise(AsyncEvent {
                kind: EventType::Notice,
                info: notice_info::NAMESPACE_ATTRIBUTE_CHANGED,
                log_page: lid::CHANGED_NAMESPACE_LIST,
            });
        }
    }
}
