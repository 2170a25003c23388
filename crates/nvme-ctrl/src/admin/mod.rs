//! Admin commands (Base §5): dispatch plus one file per command group.

mod aer;
mod dbbuf;
mod erase;
mod features;
pub(crate) mod format;
mod identify;
mod log_page;
mod nsmgmt;
mod queue_mgmt;
mod resv;
mod saved;
mod table;

use std::sync::Arc;
use std::time::Duration;

use block_backend::{BackendError, BackendQueue, Completion, DataBuf, Op, Request, Segment, SegmentCursor};
use guest_mem::GuestMemory;
use nvme_spec::command::Psdt;
use nvme_spec::opcode::AdminOpcode;
use nvme_spec::{Sqe, Status};
use tracing::debug;

use nvme_spec::regs::Cap;

use crate::backends::BackendSet;
use crate::config::ControllerConfig;
use crate::dptr::prp_segments;
use crate::engine::{describe, Deadline, IoEngine, Origin};
use crate::error::{CmdResult, CommandError};
use crate::events::Events;
use crate::interrupt::Clock;
use crate::namespace::{Namespace, NamespaceSlots};
use crate::runtime::Runtime;
use crate::stats::Stats;

pub(crate) use features::FeatureState;
pub use features::FeatureValues;
pub(crate) use saved::AdminBounds;
pub use saved::AdminSaved;
pub use table::admin_opcodes;

/// What an admin command works on: the parts of the controller it needs, borrowed
/// for one command. Registers and the lifecycle are not among them: no admin
/// command changes those.
pub(crate) struct Admin<'a> {
    pub cfg: &'a ControllerConfig,
    pub cap: Cap,
    /// The memory page size CC.MPS chose.
    pub page_size: u64,
    /// Admin-side state: features, outstanding AERs, a Format in progress.
    pub admin: &'a mut AdminState,
    /// The controller's own engine: the admin queue (and every I/O queue inline).
    pub engine: &'a mut IoEngine,
    /// Where I/O queues live: queue creation and deletion go through it.
    pub runtime: &'a mut Runtime,
    pub namespaces: &'a NamespaceSlots,
    pub events: &'a Events,
    pub stats: &'a Stats,
    pub clock: &'a dyn Clock,
}

/// How an admin command finished.
pub(crate) enum AdminDone {
    /// Complete now with this dword 0.
    Complete(u32),
    /// Parked (Asynchronous Event Request): completed later.
    Deferred,
}

/// Admin-side state that survives between commands.
#[derive(Debug)]
pub struct AdminState {
    pub(crate) features: FeatureState,
    /// Command identifiers of outstanding Asynchronous Event Requests.
    pub(crate) aers: Vec<u16>,
    /// An I/O queue was created since the last reset (Number of Queues may no longer change).
    pub(crate) io_queues_created: bool,
    /// A backend queue per active namespace for admin-driven work (Format, the
    /// shutdown flush).
    backends: BackendSet,
    /// Tag of the next request on `backends` (a request abandoned at its deadline
    /// may still complete later: its completion is told apart by the tag).
    next_tag: u64,
    /// An erasing Format NVM in progress.
    pub(crate) format: Option<erase::FormatJob>,
    /// Moves with every namespace a Format NVM changes (what a keeper's journal
    /// follows: `Controller::format_epoch`).
    pub(crate) format_epoch: u64,
    /// Clock reading when the controller was created (SMART power-on hours).
    pub(crate) created_ns: u64,
    /// Endurance group 1's Flexible Data Placement (None: not offered); the
    /// namespaces that place writes hold it too.
    pub(crate) fdp: Option<Arc<crate::fdp::Fdp>>,
    /// The ANA groups' states (reported with a subsystem only); each namespace
    /// holds its own group too.
    pub(crate) ana: Arc<crate::ana::Ana>,
    /// The Host Identifier the host set (Set Features 81h); the namespaces with
    /// reservations hold it too.
    pub(crate) host: Arc<crate::reservation::HostIdentity>,
    /// The Reservation Notification log and masks.
    pub(crate) resv_log: crate::reservation::NotificationLog,
    /// The namespace pool's namespaces active here, with the NGUID each had when
    /// attached (one made again at its NSID is another).
    pub(crate) pool_here: std::collections::BTreeMap<u32, [u8; 16]>,
    /// When to try again to attach a pool namespace that could not be (clock ns).
    pub(crate) pool_retry_at: Option<u64>,
}

impl AdminState {
    pub(crate) fn new(
        cfg: &ControllerConfig,
        namespaces: &[Option<Arc<Namespace>>],
        vwc_present: bool,
    ) -> std::io::Result<Self> {
        let backends = BackendSet::open(namespaces.iter().map(|s| s.as_ref().map(|n| &*n.backend)))?;
        Ok(AdminState {
            features: FeatureState::new(cfg, vwc_present),
            aers: Vec::new(),
            io_queues_created: false,
            backends,
            next_tag: 0,
            format: None,
            format_epoch: 0,
            created_ns: 0,
            fdp: None,
            ana: Default::default(),
            host: Arc::new(crate::reservation::HostIdentity::new(0)),
            resv_log: Default::default(),
            pool_here: Default::default(),
            pool_retry_at: None,
        })
    }

    /// Controller Level Reset: outstanding AERs vanish, features return to defaults,
    /// an erasing Format is abandoned (its piece's completion is discarded when it
    /// comes).
    pub(crate) fn reset(&mut self, now_ns: u64) {
        self.aers.clear();
        self.io_queues_created = false;
        self.features.reset(now_ns);
        if self.format.take().is_some() {
            debug!("an erasing Format NVM was abandoned by a reset");
        }
    }

    /// Whether the admin side has work besides commands: an erasing Format to move
    /// on, or an event for an outstanding Asynchronous Event Request.
    pub(crate) fn has_work(&self, events: &Events) -> bool {
        self.format.is_some() || (!self.aers.is_empty() && events.any_queued())
    }

    /// The admin backend queue of `ns`.
    fn queue(&mut self, ns: &Namespace) -> Result<&mut Box<dyn BackendQueue>, BackendError> {
        self.backends
            .queue(ns.nsid)
            .ok_or_else(|| BackendError::NotReady(format!("namespace {} has no backend queue", ns.nsid)))
    }

    /// Starts one request on the admin backend queue of `ns`; returns its tag.
    pub(crate) fn submit(
        &mut self,
        ns: &Namespace,
        mem: &GuestMemory,
        op: Op,
        offset: u64,
        len: u64,
    ) -> Result<u64, BackendError> {
        self.next_tag += 1;
        let tag = self.next_tag;
        let q = self.queue(ns)?;
        q.submit(mem, Request { tag, op, offset, len, data: DataBuf::None });
        q.commit();
        Ok(tag)
    }

    /// The result of request `tag` on the admin backend queue of `ns` if it has
    /// finished (without waiting). Completions of requests given up on earlier are
    /// discarded.
    pub(crate) fn reap_tagged(&mut self, ns: &Namespace, tag: u64) -> Option<Result<(), BackendError>> {
        // Requests given up on, on removed namespaces' queues: dropped as they end.
        self.backends.reap_retiring(&mut Vec::new());
        let q = match self.queue(ns) {
            Ok(q) => q,
            Err(e) => return Some(Err(e)),
        };
        if q.in_flight() == 0 {
            return None;
        }
        let mut out: Vec<Completion> = Vec::new();
        q.reap(&mut out);
        out.into_iter().find(|c| c.tag == tag).map(|c| c.result)
    }

    /// Opens the admin backend queue of a namespace just added.
    pub(crate) fn attach(&mut self, ns: &Namespace) -> std::io::Result<()> {
        self.backends.attach(ns.nsid, &*ns.backend)
    }

    /// Lets go of the admin backend queue of a namespace just removed (kept until
    /// requests given up on come back); an erasing Format of it fails.
    pub(crate) fn detach(&mut self, nsid: u32) {
        self.backends.detach(nsid);
    }

    /// Runs one request without data (a flush) on the admin backend queue of `ns` and
    /// waits for it until `deadline`, then gives up on it ([`CommandError::TimedOut`]).
    fn run_backend(
        &mut self,
        ns: &Namespace,
        mem: &GuestMemory,
        op: Op,
        deadline: Deadline,
        clock: &dyn Clock,
    ) -> CmdResult {
        let started = clock.now_ns();
        let write = !matches!(op, Op::Read);
        let tag = self.submit(ns, mem, op, 0, 0).map_err(|source| CommandError::Backend { write, source })?;
        let mut spins = 0u64;
        loop {
            if let Some(result) = self.reap_tagged(ns, tag) {
                return result.map_err(|source| CommandError::Backend { write, source });
            }
            if deadline.passed(clock) {
                return Err(CommandError::TimedOut {
                    ms: clock.now_ns().saturating_sub(started) / 1_000_000,
                });
            }
            spins += 1;
            match self.queue(ns).ok().and_then(|q| q.notifier()) {
                // Asynchronous backends: sleep until the completion is ready.
                Some(fd) => {
                    let wait = deadline.remaining(clock).min(Duration::from_millis(10));
                    let mut pfd = [rustix::event::PollFd::new(&fd, rustix::event::PollFlags::IN)];
                    let ts = rustix::event::Timespec { tv_sec: 0, tv_nsec: wait.as_nanos() as i64 };
                    let _ = rustix::event::poll(&mut pfd, Some(&ts));
                }
                None if spins.is_multiple_of(1024) => std::thread::yield_now(),
                None => {}
            }
        }
    }

    /// Flushes `ns` (controller shutdown), giving up at `deadline` with a log line.
    pub(crate) fn flush_namespace(
        &mut self,
        ns: &Namespace,
        mem: &GuestMemory,
        deadline: Deadline,
        clock: &dyn Clock,
    ) {
        if let Err(e) = self.run_backend(ns, mem, Op::Flush, deadline, clock) {
            log_limit::limited_warn!(target: "vnvme::backend", nsid = ns.nsid, "flush at shutdown failed: {e}");
        }
    }
}

impl Admin<'_> {
    /// Executes one admin command fetched from the admin SQ and posts its completion.
    pub(crate) fn execute(&mut self, sqe: Sqe) {
        let result = if sqe.psdt() != Psdt::Prp {
            // PCIe transport: admin commands use PRPs only.
            Err(CommandError::InvalidField("admin commands must use PRPs"))
        } else if sqe.fuse() != 0 {
            Err(CommandError::InvalidField("fused operation"))
        } else {
            self.dispatch_admin(&sqe)
        };
        match result {
            Ok(AdminDone::Complete(dw0)) => {
                self.engine.complete(Origin::of(0, &sqe, 0), Status::SUCCESS, dw0)
            }
            Ok(AdminDone::Deferred) => self.engine.release(0),
            Err(e) => {
                debug!(target: "vnvme::guest", "admin {}: {e}", describe(AdminOpcode(sqe.opcode()), &sqe));
                self.engine.complete(Origin::of(0, &sqe, 0), e.status(), 0);
            }
        }
    }

    /// Copies `data` to the host buffer of an admin command (PRP1/PRP2).
    pub(crate) fn copy_to_host(&mut self, sqe: &Sqe, data: &[u8]) -> CmdResult {
        let segs = self.data_segments(sqe, data.len() as u64)?;
        SegmentCursor::for_transfer(&segs, data.len() as u64)?.write_from(&self.engine.io.mem, data)?;
        Ok(())
    }

    /// Reads `len` bytes from the host buffer of an admin command.
    pub(crate) fn copy_from_host(&mut self, sqe: &Sqe, len: usize) -> CmdResult<Vec<u8>> {
        let segs = self.data_segments(sqe, len as u64)?;
        let mut buf = vec![0u8; len];
        SegmentCursor::for_transfer(&segs, len as u64)?.read_into(&self.engine.io.mem, &mut buf)?;
        Ok(buf)
    }

    /// The guest segments of an admin command's `len`-byte buffer (PRP1/PRP2).
    fn data_segments(&self, sqe: &Sqe, len: u64) -> CmdResult<Vec<Segment>> {
        if len > self.mdts_bytes() {
            return Err(CommandError::TooLarge(len));
        }
        let mut segs = Vec::new();
        prp_segments(&self.engine.io.mem, sqe.prp1(), sqe.prp2(), len, self.page_size(), &mut segs)?;
        Ok(segs)
    }

    /// The namespace `nsid` if it is active.
    pub(crate) fn active_ns(&self, nsid: u32) -> CmdResult<Arc<Namespace>> {
        crate::namespace::for_command(self.namespaces, nsid)
    }

    /// Number of Namespaces (Identify NN).
    fn max_namespaces(&self) -> u32 {
        self.namespaces.len() as u32
    }

    fn page_size(&self) -> u64 {
        self.page_size
    }

    fn cap(&self) -> Cap {
        self.cap
    }

    /// MDTS in bytes.
    fn mdts_bytes(&self) -> u64 {
        self.cfg.mdts_bytes(self.cap)
    }

    /// The settings the features now make, on every engine.
    fn apply_settings(&mut self) {
        let s = self.admin.features.engine_settings().paged(self.page_size, self.mdts_bytes());
        self.runtime.apply_settings(self.engine, s);
    }
}

/// Shorthand for a successful completion with dword 0 = 0.
pub(crate) fn done() -> CmdResult<AdminDone> {
    Ok(AdminDone::Complete(0))
}

/// Fails with a status the spec names (DNR set).
pub(crate) fn status<T>(s: Status) -> CmdResult<T> {
    Err(CommandError::Status(s.with_dnr()))
}

/// The Timestamp (Base: Set Features, Timestamp; 48 bits of milliseconds) now, for
/// one the host set to `ms` at clock reading `at`: it wraps within its 48 bits.
pub(crate) fn timestamp_now(ms: u64, at: u64, now: u64) -> u64 {
    ms.wrapping_add(now.saturating_sub(at) / 1_000_000) & ((1 << 48) - 1)
}
