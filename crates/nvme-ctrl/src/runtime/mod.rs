//! Who runs the queues, and how an idle owner waits.
//!
//! - [`workers`]: I/O worker threads, each owning an engine and its queues.
//! - [`idle`]: the one idle loop (busy, spin, re-arm EventIdx, look again, sleep) that
//!   workers and inline mode (the transport's own thread) both drive.
//! - [`poll`]: the spin policy that decides how long an idle owner spins.
//! - [`judge`]: whether adaptive owners spin at all, by the process's CPU time per
//!   command in each regime.
//!
//! Here too: how a controller starts its workers or stays inline, and what its
//! transport needs to know to run it inline (`Controller::inline_*`).

pub mod idle;
pub mod judge;
pub mod poll;
pub mod workers;

use std::sync::Arc;

use guest_mem::GuestMemory;

use crate::controller::Controller;
use crate::engine::{Deadline, IoEngine, TEARDOWN_BOUND};
use crate::error::CommandError;
use judge::SpinJudge;
use poll::PollMode;
use workers::Worker;

/// How to run the data path (`vnvme serve --workers N --poll MODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerConfig {
    pub workers: usize,
    pub poll: PollMode,
}

/// Who runs the I/O queues (worker threads, or the controller's own thread when
/// there are none: inline mode) and how an idle owner waits.
#[derive(Debug)]
pub(crate) struct Runtime {
    workers: Vec<Worker>,
    /// Without workers: how the thread that calls `process` should wait.
    inline_mode: PollMode,
    /// With adaptive polling: whether its owners spin at all (`judge.rs`).
    judge: Option<Arc<SpinJudge>>,
    /// Wakes every worker (see `Controller::doorbell_kick`).
    kick: Arc<std::os::fd::OwnedFd>,
}

impl Runtime {
    /// Inline, not polling, with a kick eventfd of its own.
    pub fn new() -> std::io::Result<Self> {
        let kick = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?;
        Ok(Runtime { workers: Vec::new(), inline_mode: PollMode::Off, judge: None, kick: Arc::new(kick) })
    }

    pub fn workers(&self) -> &[Worker] {
        &self.workers
    }

    /// No workers: the controller's own thread runs every queue.
    #[inline]
    pub fn inline(&self) -> bool {
        self.workers.is_empty()
    }

    /// The worker that owns CQ `cqid` (None: the controller's own engine).
    pub fn worker_for_cq(&self, cqid: u16) -> Option<&Worker> {
        if self.workers.is_empty() || cqid == 0 {
            None
        } else {
            Some(&self.workers[(cqid as usize - 1) % self.workers.len()])
        }
    }

    /// Starts `n` workers polling as `mode`, each on an engine `engine` makes (none:
    /// inline, waiting as `mode` says).
    fn start(
        &mut self,
        n: usize,
        mode: PollMode,
        stats: &Arc<crate::stats::Stats>,
        mut engine: impl FnMut() -> std::io::Result<IoEngine>,
    ) -> std::io::Result<()> {
        self.judge = (mode == PollMode::Adaptive).then(|| Arc::new(SpinJudge::new(stats.clone())));
        if n == 0 {
            self.inline_mode = mode;
            return Ok(());
        }
        for i in 0..n {
            self.workers.push(Worker::spawn(
                i,
                engine()?,
                mode,
                self.judge.clone(),
                Some(self.kick.clone()),
            )?);
        }
        Ok(())
    }

    pub fn judge(&self) -> Option<&Arc<SpinJudge>> {
        self.judge.as_ref()
    }
}

impl Controller {
    /// Starts `n` I/O worker threads; I/O queues created from now on run on them.
    /// Must be called while no I/O queue exists. With `n` = 0 the controller stays in
    /// inline mode: [`Controller::process`] runs the I/O queues too, and `mode` is how
    /// its caller should wait ([`Controller::inline_poll`]).
    pub fn spawn_workers(&mut self, n: usize, mode: PollMode) -> std::io::Result<()> {
        if !self.book.is_empty() || !self.runtime.inline() {
            return Err(std::io::Error::other("workers must be started before any I/O queue exists"));
        }
        if n > 0 {
            // I/O queues will all live on the workers: the controller's own engine
            // keeps the admin queue only and needs no backend queues.
            self.engine.close_backends();
        }
        let (ctx, settings) = (self.engine.ctx.clone(), self.settings());
        self.runtime.start(n, mode, &self.stats, || {
            let mut e = IoEngine::new(ctx.clone())?;
            e.apply_settings(settings);
            Ok(e)
        })
    }

    /// With adaptive polling, the judge of whether its owners spin at all (shared by
    /// every worker, or the inline loop's to use).
    pub fn spin_judge(&self) -> Option<Arc<SpinJudge>> {
        self.runtime.judge().cloned()
    }

    /// Inline mode (no workers): how the caller of [`Controller::process`] should
    /// wait for work. `None` when workers own the I/O queues.
    pub fn inline_poll(&self) -> Option<PollMode> {
        self.runtime.inline().then_some(self.runtime.inline_mode)
    }

    /// Inline mode: descriptors that signal work for [`Controller::process`] besides
    /// transport messages: the doorbell kick eventfd and the notifiers of
    /// asynchronous backends (level triggered, drained by `process`; the kick is
    /// never drained and must be watched edge triggered). Empty with workers.
    pub fn inline_wake_fds(&self) -> (std::os::fd::RawFd, Vec<std::os::fd::RawFd>) {
        use std::os::fd::AsRawFd;
        let notifiers = if self.runtime.inline() { self.engine.backend_notifiers() } else { Vec::new() };
        (self.runtime.kick.as_raw_fd(), notifiers)
    }

    /// Inline mode: changes whenever the notifiers of [`Controller::inline_wake_fds`]
    /// may have changed (namespaces added or removed).
    pub fn inline_notifier_generation(&self) -> u64 {
        self.engine.notifier_generation()
    }

    /// Inline mode: a backend with requests in flight can only be polled, so the
    /// caller must not sleep for long.
    pub fn inline_needs_polling(&self) -> bool {
        self.runtime.inline() && self.engine.backend_needs_polling()
    }

    /// The worker threads (for their statistics).
    pub fn workers(&self) -> &[Worker] {
        self.runtime.workers()
    }

    /// Polls a doorbell page mapped into the guest (BAR0 offsets, starting at the first
    /// doorbell) on every engine. The guest's stores there produce no notification, so
    /// workers must poll ([`PollMode::Always`]) and the admin side must call
    /// [`Controller::process`] periodically.
    ///
    /// Fails if a worker would sleep: nothing would ever wake it.
    pub fn set_doorbell_page(&mut self, page: Option<GuestMemory>) -> std::io::Result<()> {
        if page.is_some() {
            if let Some(w) = self.runtime.workers().iter().find(|w| w.mode != PollMode::Always) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "a doorbell page mapped into the guest needs workers that poll always \
                         (worker {} has --poll {}): the guest's stores there wake nobody",
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
    /// Uses `fd` as the doorbell kick eventfd (the one an earlier process handed its
    /// client). Before the workers start.
    pub fn set_doorbell_kick(&mut self, fd: std::os::fd::OwnedFd) -> std::io::Result<()> {
        if !self.runtime.inline() {
            return Err(std::io::Error::other("the doorbell kick must be set before the workers start"));
        }
        self.runtime.kick = std::sync::Arc::new(fd);
        Ok(())
    }

    pub fn doorbell_kick(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        self.runtime.kick.try_clone()
    }

    /// Lets every worker finish the commands it has (shutdown), all by `deadline`.
    pub(crate) fn io_drain_workers(&mut self, deadline: Deadline) {
        for w in self.runtime.workers() {
            w.call(move |e| drain_engine(e, deadline));
        }
    }
}

/// Runs an engine until nothing more can happen: work that can progress is done, then
/// requests already with a backend are waited for until `deadline` (a shutdown's
/// [`TEARDOWN_BOUND`], so a stuck backend or a queue whose doorbell value is invalid
/// cannot hang it); commands still with a backend then are completed as timed out
/// and abandoned.
pub(crate) fn drain_engine(e: &mut IoEngine, deadline: Deadline) {
    for _ in 0..10_000 {
        if !e.poll() {
            break;
        }
    }
    let busy = |e: &IoEngine| e.backend_busy() || e.held() > 0;
    while busy(e) && e.fatal().is_none() && !deadline.passed(&*e.ctx.clock) {
        if !e.poll() {
            std::thread::yield_now();
        }
    }
    if busy(e) {
        let ms = TEARDOWN_BOUND.as_millis() as u64;
        e.abandon_where(|_| true, || CommandError::TimedOut { ms });
        e.drop_held(|_, _| true, CommandError::TimedOut { ms }.status());
        e.poll();
    }
}
