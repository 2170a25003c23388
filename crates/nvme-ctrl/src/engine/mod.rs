//! The I/O engine: owns I/O completion and submission queues, their backend queues and
//! their interrupt state, and moves commands through them.
//!
//! An engine has one owner and takes no locks on its hot path: the controller's own
//! engine (the admin queue, and every I/O queue in inline mode), or one per I/O
//! worker thread (`runtime::workers`). Everything the admin side asks of an engine is
//! a method call.
//!
//! - this file: the engine's state, queue creation and deletion, what it is busy with;
//! - `data`: fetching commands and handing them to the backends, reaping;
//! - `run`: a fetched I/O command through QoS, run on its [`Io`] (`work`: the parts
//!   the engine lends it; the commands themselves are `crate::io`), completed;
//! - `completion`: posting completions and signalling interrupts;
//! - `timeout`: commands a backend does not answer, and bounded teardown;
//! - `doorbells`: doorbell writes, shadow buffers and the mapped page.

mod completion;
mod data;
mod doorbells;
mod memory;
mod queues;
mod run;
mod saved;
mod settings;
mod table;
mod throttle;
mod timeout;
mod work;

pub(crate) use data::HOST_BUFFER_BUDGET;
pub use memory::SharedMemory;
pub(crate) use settings::Settings;
pub(crate) use timeout::Deadline;
pub(crate) use timeout::EXPIRY_POLLS;
pub use timeout::TEARDOWN_BOUND;

use std::sync::Arc;

use nvme_spec::regs::DoorbellKind;
use nvme_spec::{Sqe, Status};
use tracing::warn;

use crate::backends::BackendSet;
use crate::doorbell::DoorbellSource;
use crate::events::Events;
use crate::interrupt::{Clock, Coalescing, InterruptSink, Interrupts};
use crate::namespace::NamespaceSlots;
use crate::queue::{CompletionQueue, SubmissionQueue};
use crate::stats::Stats;
use queues::QueueTable;
pub(crate) use table::{CopyJob, Finish, InFlight, Origin, Tally};
pub(crate) use work::{Io, Work};

/// Shared, read-mostly context an engine is built with.
#[derive(Clone, Debug)]
pub struct EngineContext {
    /// The namespace table this engine has adopted (see `IoEngine::set_namespaces`).
    pub namespaces: NamespaceSlots,
    pub irq: Arc<dyn InterruptSink>,
    pub clock: Arc<dyn Clock>,
    pub stats: Arc<Stats>,
    /// Counters per queue pair, indexed by queue identifier (0..=max_qid).
    pub queue_stats: Arc<[crate::stats::QueueStats]>,
    pub events: Arc<Events>,
    pub max_qid: u16,
    pub vectors: u16,
    /// CAP.DSTRD.
    pub dstrd: u8,
    /// What the controller told its host it can do (Dataset Management and Write
    /// Zeroes in ONCS, a volatile write cache).
    pub caps: crate::Capabilities,
    /// The guest memory map, as the transport last published it.
    pub memory: Arc<SharedMemory>,
    /// Set by any engine that hit a fault it cannot report per command; the controller
    /// turns it into CSTS.CFS.
    pub fatal: Arc<std::sync::atomic::AtomicBool>,
}

/// Why the engine cannot go on: the controller sets Controller Fatal Status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fatal(pub String);

/// The I/O side of a controller.
#[derive(Debug)]
pub struct IoEngine {
    /// The part commands run on: the context, guest memory, the settings and the
    /// in-flight work ([`Io`]).
    pub(crate) io: Io,
    /// The generation of `io.ctx.memory` that `io.mem` is.
    mem_generation: u64,
    /// The SQs and CQs, the lists of those that exist, the round-robin turn.
    pub(crate) queues: QueueTable,
    /// Fetch nothing (a state hand-over is under way, `crate::state`).
    pub(crate) quiesced: bool,
    /// Busy polls since the last expiry check.
    polls_since_expiry: u32,
    /// QoS: the limits each namespace draws from, and the commands held back.
    throttle: throttle::Throttle,
    /// Held commands the throttle let go this poll, about to run (kept for its
    /// allocation).
    released: Vec<(u16, Sqe)>,
    /// Shadow doorbell buffers and a doorbell page mapped into the guest.
    pub(crate) doorbells: DoorbellSource,
    /// Admin commands fetched from SQ 0, for the admin side to execute.
    pub(crate) admin_inbox: Vec<Sqe>,
    /// Vectors, coalescing state, and the CQs owed an interrupt decision.
    interrupts: Interrupts,
    /// When false, a poller is spinning and EventIdx is left stale so the host does
    /// not ring; when true, emptied SQs re-arm EventIdx.
    pub arm_eventidx: bool,
    pub(crate) fatal: Option<Fatal>,
}

/// How many commands one `poll` takes at most, so a busy guest cannot starve the
/// caller's other work (admin queue, timers).
pub(crate) const POLL_BUDGET: u32 = 512;

impl IoEngine {
    pub fn new(ctx: EngineContext) -> std::io::Result<Self> {
        let (mem_generation, mem) = ctx.memory.latest();
        let backends = BackendSet::open(ctx.namespaces.iter().map(|s| s.as_ref().map(|n| &*n.backend)))?;
        Ok(IoEngine {
            queues: QueueTable::new(ctx.max_qid),
            quiesced: false,
            polls_since_expiry: 0,
            throttle: Default::default(),
            released: Vec::new(),
            admin_inbox: Vec::new(),
            doorbells: DoorbellSource::new(ctx.max_qid, ctx.dstrd),
            interrupts: Interrupts::new(ctx.vectors),
            arm_eventidx: true,
            fatal: None,
            mem_generation,
            io: Io {
                work: Work::new(backends, ctx.stats.engine_counts()),
                settings: Settings::default(),
                mem,
                ctx,
            },
        })
    }

    /// Adopts the newest published memory map, if it changed since the last look.
    pub(crate) fn adopt_memory(&mut self) {
        if self.io.ctx.memory.generation() != self.mem_generation {
            (self.mem_generation, self.io.mem) = self.io.ctx.memory.latest();
            self.io.work.backends.memory_changed(&self.io.mem);
        }
    }

    /// The reason the engine stopped, if it hit a fault it cannot report per command.
    pub fn fatal(&self) -> Option<&Fatal> {
        self.fatal.as_ref()
    }

    pub(crate) fn set_fatal(&mut self, why: String) {
        warn!(target: "vnvme::guest", "controller fatal: {why}");
        if self.fatal.is_none() {
            self.fatal = Some(Fatal(why));
        }
        self.io.ctx.fatal.store(true, std::sync::atomic::Ordering::Release);
    }

    // ---- queue management (called by the admin side after it validated the command)

    pub fn sq_exists(&self, qid: u16) -> bool {
        self.queues.sq(qid).is_some()
    }

    pub fn cq_exists(&self, qid: u16) -> bool {
        self.queues.cq(qid).is_some()
    }

    pub fn create_cq(&mut self, qid: u16, cq: CompletionQueue) {
        self.queues.insert_cq(qid, cq);
        self.doorbells.clear(qid, DoorbellKind::CqHead);
        self.init_shadow_slots(qid, DoorbellKind::CqHead, 0);
    }

    pub fn create_sq(&mut self, qid: u16, cqid: u16, base: u64, size: u32) {
        self.queues.insert_sq(qid, SubmissionQueue::new(cqid, base, size));
        self.doorbells.clear(qid, DoorbellKind::SqTail);
        self.init_shadow_slots(qid, DoorbellKind::SqTail, 0);
    }

    /// Deletes an SQ after every command fetched from it has completed (Base §5.2.4
    /// Delete I/O Submission Queue: the Delete completes after outstanding commands
    /// are completed or aborted). Commands a backend still holds after
    /// [`TEARDOWN_BOUND`] are aborted (Command Aborted due to SQ Deletion).
    pub fn delete_sq(&mut self, qid: u16) {
        self.delete_sq_by(qid, Deadline::teardown(&*self.io.ctx.clock));
    }

    fn delete_sq_by(&mut self, qid: u16, deadline: Deadline) {
        self.settle_sq(qid, deadline);
        self.queues.remove_sq(qid);
    }

    /// Queue parameters, for the admin side's checks.
    pub fn sq_info(&self, qid: u16) -> Option<(u16, u32)> {
        self.queues.sq(qid).map(|q| (q.cqid, q.in_flight))
    }

    pub fn delete_cq(&mut self, qid: u16) {
        self.queues.remove_cq(qid);
    }

    /// Drops every I/O queue (controller reset), letting in-flight requests finish
    /// for at most [`TEARDOWN_BOUND`] in all.
    pub fn reset(&mut self) {
        self.reset_by(Deadline::teardown(&*self.io.ctx.clock));
    }

    /// As [`IoEngine::reset`], abandoning what is still in flight at `deadline`.
    pub(crate) fn reset_by(&mut self, deadline: Deadline) {
        for qid in self.queues.active_sqs().to_vec() {
            self.delete_sq_by(qid, deadline);
        }
        if self.doorbells.page_mapped() {
            for qid in 0..=self.io.ctx.max_qid {
                self.doorbells.clear(qid, DoorbellKind::SqTail);
                self.doorbells.clear(qid, DoorbellKind::CqHead);
            }
        }
        self.queues.clear_cqs();
        self.doorbells.set_shadow(None);
        self.interrupts.reset();
        self.io.settings =
            Settings::from_features(None, Coalescing::default(), self.io.settings.write_cache(), false)
                .paged(self.io.settings.page_size(), self.io.settings.mdts_bytes());
        self.arm_eventidx = true;
        self.fatal = None;
    }

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

    /// Adopts what the admin side set.
    pub(crate) fn apply_settings(&mut self, s: Settings) {
        self.io.settings = s;
    }

    pub fn set_vector_coalescing_disabled(&mut self, iv: u16, disabled: bool) {
        self.interrupts.set_coalescing_disabled(iv, disabled);
    }

    pub fn vector_coalescing_disabled(&self, iv: u16) -> bool {
        self.interrupts.coalescing_disabled(iv)
    }

    /// True if commands fetched from a queue are still with a backend.
    pub fn backend_busy(&self) -> bool {
        self.io.work.commands.running() > 0
    }

    /// Closes this engine's backend queues: the controller's own engine, once workers
    /// own every I/O queue, so a backend with a limited number of queues (nvme://)
    /// or a cost per queue (an io_uring ring) spends them on the workers only.
    pub(crate) fn close_backends(&mut self) {
        self.io.work.backends.close();
    }

    /// The descriptors of backend queues that complete asynchronously: the owner
    /// sleeps on them (level triggered) alongside its doorbells.
    pub fn backend_notifiers(&self) -> Vec<std::os::fd::RawFd> {
        self.io.work.backends.notifiers()
    }

    /// Changes whenever [`IoEngine::backend_notifiers`] may have changed (a namespace
    /// added or removed, a removed namespace's queue finally closed).
    pub fn notifier_generation(&self) -> u64 {
        self.io.work.backends.generation()
    }

    /// True if a backend queue with requests in flight has no notifier, so only
    /// polling finds its completions: the owner must not sleep for long.
    pub fn backend_needs_polling(&self) -> bool {
        self.io.work.backends.needs_polling()
    }

    /// Adopts a new namespace table: opens a backend queue for each namespace
    /// added; for each one removed, its commands still at the backend will complete
    /// with Invalid Namespace when the backend has finished with them (the queue is
    /// kept until then), and those held by QoS complete so at once. Runs on the
    /// engine's own thread.
    pub(crate) fn set_namespaces(&mut self, slots: NamespaceSlots) {
        let old = std::mem::replace(&mut self.io.ctx.namespaces, slots.clone());
        for i in 0..slots.len().max(old.len()) {
            let before = old.get(i).and_then(Option::as_ref);
            let after = slots.get(i).and_then(Option::as_ref);
            let same = matches!((before, after), (Some(a), Some(b)) if Arc::ptr_eq(a, b));
            if same {
                continue;
            }
            if let Some(gone) = before {
                let nsid = gone.nsid;
                // Commands at the backend are not completed now: their requests may
                // still move data into guest memory, which the host reuses once it
                // has a completion. They finish when the backend is done with them
                // (or time out), with this status.
                for f in self.io.work.commands.running_iter_mut().filter(|f| f.at.nsid == nsid) {
                    f.status = Status::INVALID_NAMESPACE.with_dnr();
                }
                self.drop_held(|_, n| n == nsid, Status::INVALID_NAMESPACE.with_dnr());
                self.set_qos(nsid, None);
                self.io.work.backends.detach(nsid);
            }
            if let Some(new) = after {
                if let Err(e) = self.io.work.backends.attach(new.nsid, &*new.backend) {
                    warn!(
                        nsid = new.nsid,
                        "cannot open a backend queue for the new namespace ({e}): its I/O on this engine fails"
                    );
                }
            }
        }
    }

    /// True if commands are in flight in the backends, held back by QoS, or SQs hold
    /// unfetched entries.
    pub fn busy(&self) -> bool {
        self.backend_busy()
            || self.throttle.held() > 0
            || self.queues.active_sqs().iter().any(|&q| self.queues.sq(q).is_some_and(|s| !s.is_empty()))
    }
}

/// The command a submission queue entry carries, for logs; `opcode` prints its name
/// ([`nvme_spec::opcode::AdminOpcode`] or [`nvme_spec::opcode::NvmOpcode`]).
pub(crate) fn describe(opcode: impl std::fmt::Display, sqe: &Sqe) -> String {
    format!("{opcode} cid {} nsid {}", sqe.cid(), sqe.nsid.get())
}
