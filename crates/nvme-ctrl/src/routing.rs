//! Where I/O queues live. Without workers every queue is in the controller's own
//! engine (the in-process host, tests). With workers, each CQ — and every SQ posting
//! to it — lives in one worker's engine, chosen by CQ id; the admin queue stays with
//! the controller. The controller keeps its own book of which queues exist, so admin
//! commands are validated without asking a worker.

use std::collections::BTreeMap;

use guest_mem::GuestMemory;
use nvme_spec::regs::DoorbellKind;

use crate::controller::Controller;
use crate::doorbell::ShadowBuffers;
use crate::engine::IoEngine;
use crate::interrupt::Coalescing;
use crate::runtime::workers::{PollMode, Worker};

/// The data-path settings that admin commands change and every engine honours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EngineSettings {
    pub page_size: u64,
    pub mdts_bytes: u64,
    pub burst: Option<u32>,
    pub coalescing: Coalescing,
    pub write_cache: bool,
}

impl EngineSettings {
    pub fn apply(self, e: &mut IoEngine) {
        e.page_size = self.page_size;
        e.mdts_bytes = self.mdts_bytes;
        e.burst = self.burst;
        e.coalescing = self.coalescing;
        e.write_cache = self.write_cache;
    }
}

/// Which I/O queues exist.
#[derive(Debug, Default)]
pub(crate) struct QueueBook {
    /// CQ id -> number of SQs posting to it.
    cqs: BTreeMap<u16, u32>,
    /// SQ id -> its CQ id.
    sqs: BTreeMap<u16, u16>,
}

impl Controller {
    fn worker_for_cq(&self, cqid: u16) -> Option<&Worker> {
        if self.workers.is_empty() || cqid == 0 {
            None
        } else {
            Some(&self.workers[(cqid as usize - 1) % self.workers.len()])
        }
    }

    /// Starts `n` I/O worker threads; I/O queues created from now on run on them.
    /// Must be called while no I/O queue exists. With `n` = 0 the controller stays in
    /// inline mode: [`Controller::process`] runs the I/O queues too, and `mode` is how
    /// its caller should wait ([`Controller::inline_poll`]).
    pub fn spawn_workers(&mut self, n: usize, mode: PollMode) -> std::io::Result<()> {
        if !self.book.cqs.is_empty() || !self.workers.is_empty() {
            return Err(std::io::Error::other("workers must be started before any I/O queue exists"));
        }
        if n == 0 {
            self.inline_mode = mode;
            return Ok(());
        }
        if n > 0 {
            // I/O queues will all live on the workers: the controller's own engine
            // keeps the admin queue only and needs no backend queues.
            self.engine.close_backends();
        }
        for i in 0..n {
            let mut e = IoEngine::new(self.engine.ctx.clone(), self.engine.mem.clone())?;
            self.settings().apply(&mut e);
            self.workers.push(Worker::spawn(i, e, mode, Some(self.kick.clone()))?);
        }
        Ok(())
    }

    /// Inline mode (no workers): how the caller of [`Controller::process`] should
    /// wait for work. `None` when workers own the I/O queues.
    pub fn inline_poll(&self) -> Option<PollMode> {
        self.workers.is_empty().then_some(self.inline_mode)
    }

    /// Inline mode: descriptors that signal work for [`Controller::process`] besides
    /// transport messages: the doorbell kick eventfd and the notifiers of
    /// asynchronous backends (level triggered, drained by `process`; the kick is
    /// never drained and must be watched edge triggered). Empty with workers.
    pub fn inline_wake_fds(&self) -> (std::os::fd::RawFd, Vec<std::os::fd::RawFd>) {
        use std::os::fd::AsRawFd;
        let notifiers = if self.workers.is_empty() { self.engine.backend_notifiers() } else { Vec::new() };
        (self.kick.as_raw_fd(), notifiers)
    }

    /// Inline mode: a backend with requests in flight can only be polled, so the
    /// caller must not sleep for long.
    pub fn inline_needs_polling(&self) -> bool {
        self.workers.is_empty() && self.engine.backend_needs_polling()
    }

    /// The worker threads (for their statistics).
    pub fn workers(&self) -> &[Worker] {
        &self.workers
    }

    /// Runs `f` on every engine: the controller's own and each worker's.
    pub(crate) fn on_all_engines(&mut self, f: impl Fn(&mut IoEngine) + Clone + Send + 'static) {
        f(&mut self.engine);
        for w in &self.workers {
            let g = f.clone();
            w.call(move |e| g(e));
        }
    }

    pub(crate) fn io_cq_exists(&self, qid: u16) -> bool {
        self.book.cqs.contains_key(&qid)
    }

    pub(crate) fn io_sq_exists(&self, qid: u16) -> bool {
        self.book.sqs.contains_key(&qid)
    }

    pub(crate) fn io_cq_users(&self, qid: u16) -> u32 {
        self.book.cqs.get(&qid).copied().unwrap_or(0)
    }

    pub(crate) fn io_create_cq(&mut self, qid: u16, base: u64, size: u32, ien: bool, iv: u16) {
        self.book.cqs.insert(qid, 0);
        match self.worker_for_cq(qid) {
            Some(w) => w.call(move |e| e.create_cq(qid, base, size, ien, iv)),
            None => self.engine.create_cq(qid, base, size, ien, iv),
        }
    }

    pub(crate) fn io_create_sq(&mut self, qid: u16, cqid: u16, base: u64, size: u32) {
        self.book.sqs.insert(qid, cqid);
        *self.book.cqs.entry(cqid).or_default() += 1;
        match self.worker_for_cq(cqid) {
            Some(w) => w.call(move |e| e.create_sq(qid, cqid, base, size)),
            None => self.engine.create_sq(qid, cqid, base, size),
        }
    }

    pub(crate) fn io_delete_sq(&mut self, qid: u16) {
        let Some(cqid) = self.book.sqs.remove(&qid) else { return };
        if let Some(n) = self.book.cqs.get_mut(&cqid) {
            *n = n.saturating_sub(1);
        }
        match self.worker_for_cq(cqid) {
            Some(w) => w.call(move |e| e.delete_sq(qid)),
            None => self.engine.delete_sq(qid),
        }
    }

    pub(crate) fn io_delete_cq(&mut self, qid: u16) {
        self.book.cqs.remove(&qid);
        match self.worker_for_cq(qid) {
            Some(w) => w.call(move |e| e.delete_cq(qid)),
            None => self.engine.delete_cq(qid),
        }
    }

    /// Routes a trapped doorbell write to the engine that owns the queue.
    pub(crate) fn io_doorbell(&mut self, qid: u16, kind: DoorbellKind, value: u32) {
        let cqid = match kind {
            DoorbellKind::SqTail => self.book.sqs.get(&qid).copied(),
            DoorbellKind::CqHead => self.book.cqs.contains_key(&qid).then_some(qid),
        };
        match cqid.and_then(|c| self.worker_for_cq(c)) {
            Some(w) => w.doorbell(qid, kind, value),
            // Admin queue, inline mode, or a queue that does not exist (the engine
            // raises Invalid Doorbell Register).
            None => self.engine.doorbell(qid, kind, value),
        }
    }

    /// Polls a doorbell page mapped into the guest (BAR0 offsets, starting at the first
    /// doorbell) on every engine. The guest's stores there produce no notification, so
    /// workers must poll ([`PollMode::Always`]) and the admin side must call
    /// [`Controller::process`] periodically.
    ///
    /// Fails if a worker would sleep: nothing would ever wake it.
    pub fn set_doorbell_page(&mut self, page: Option<GuestMemory>) -> std::io::Result<()> {
        if page.is_some() {
            if let Some(w) = self.workers.iter().find(|w| w.mode != PollMode::Always) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "a doorbell page mapped into the guest needs workers that poll always \
                         (worker {} polls {:?}): the guest's stores there wake nobody",
                        w.index, w.mode
                    ),
                ));
            }
        }
        self.on_all_engines(move |e| e.set_doorbell_page(page.clone()));
        Ok(())
    }

    /// The eventfd that wakes every worker to look at its queues' shadow doorbells:
    /// what a VMM wires to the doorbell registers as an ioeventfd (vfio-user
    /// DEVICE_GET_REGION_IO_FDS). The written value is lost, so this only carries
    /// notifications for hosts that use shadow doorbells. Each call returns a new
    /// descriptor for the same eventfd, for the caller to hand out.
    pub fn doorbell_kick(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        self.kick.try_clone()
    }

    pub(crate) fn io_attach_shadow(&mut self, b: ShadowBuffers) {
        self.on_all_engines(move |e| e.attach_shadow(b));
    }

    pub(crate) fn io_set_vector_coalescing_disabled(&mut self, iv: u16, cd: bool) {
        self.on_all_engines(move |e| e.set_vector_coalescing_disabled(iv, cd));
    }

    pub(crate) fn io_apply_settings(&mut self) {
        let s = self.settings();
        self.on_all_engines(move |e| s.apply(e));
    }

    pub(crate) fn io_set_memory(&mut self, mem: GuestMemory) {
        self.on_all_engines(move |e| e.set_memory(mem.clone()));
    }

    /// Controller Level Reset of the data path: every queue goes.
    pub(crate) fn io_reset(&mut self) {
        self.book = QueueBook::default();
        self.on_all_engines(|e| e.reset());
    }

    /// Lets every worker finish the commands it has (shutdown).
    pub(crate) fn io_drain_workers(&mut self) {
        for w in &self.workers {
            w.call(drain_engine);
        }
    }
}

/// Runs an engine until nothing more can happen: work that can progress is done, then
/// requests already with a backend are waited for (bounded, so a stuck backend or a
/// queue whose doorbell value is invalid cannot hang a shutdown).
pub(crate) fn drain_engine(e: &mut IoEngine) {
    for _ in 0..10_000 {
        if !e.poll() {
            break;
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while e.backend_busy() && e.fatal().is_none() && std::time::Instant::now() < deadline {
        if !e.poll() {
            std::thread::yield_now();
        }
    }
    if e.backend_busy() {
        tracing::warn!("shutdown: backend requests still in flight after 5 s");
    }
}

/// How to run the data path (`vnvme serve --workers N --poll MODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerConfig {
    pub workers: usize,
    pub poll: PollMode,
}
