//! The controller's side of its runtime: starting workers or staying inline, what a
//! transport needs to run it inline, and controller-wide settings reaching every
//! engine.

use std::sync::Arc;

use guest_mem::GuestMemory;

use super::Controller;
use crate::engine::IoEngine;
use crate::runtime::idle::Queues;
use crate::runtime::judge::SpinJudge;
use crate::runtime::poll::PollMode;
use crate::runtime::workers::Worker;

impl Controller {
    /// Starts `n` I/O worker threads; I/O queues created from now on run on them.
    /// Must be called while no I/O queue exists. With `n` = 0 the controller stays in
    /// inline mode: [`Controller::process`] runs the I/O queues too, and `mode` is how
    /// its caller should wait ([`Controller::inline_poll`]).
    pub fn spawn_workers(&mut self, n: usize, mode: PollMode) -> std::io::Result<()> {
        if !self.runtime.no_io_queues() || !self.runtime.inline() {
            return Err(std::io::Error::other("workers must be started before any I/O queue exists"));
        }
        if n > 0 {
            // I/O queues will all live on the workers: the controller's own engine
            // keeps the admin queue only and needs no backend queues.
            self.engine.close_backends();
        }
        let (ctx, settings) = (self.engine.io.ctx.clone(), self.settings());
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
        self.runtime.inline_mode()
    }

    /// Inline mode: descriptors that signal work for [`Controller::process`] besides
    /// transport messages: the doorbell kick eventfd and the notifiers of
    /// asynchronous backends (level triggered, drained by `process`; the kick is
    /// never drained and must be watched edge triggered). Empty with workers.
    pub fn inline_wake_fds(&self) -> (std::os::fd::RawFd, Vec<std::os::fd::RawFd>) {
        use std::os::fd::AsRawFd;
        let notifiers = if self.runtime.inline() { self.engine.backend_notifiers() } else { Vec::new() };
        (self.runtime.kick().as_raw_fd(), notifiers)
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

    /// Uses `fd` as the doorbell kick eventfd (the one an earlier process handed its
    /// client). Before the workers start.
    pub fn set_doorbell_kick(&mut self, fd: std::os::fd::OwnedFd) -> std::io::Result<()> {
        self.runtime.set_kick(fd)
    }

    /// The eventfd that wakes every worker to look at its queues' shadow doorbells:
    /// what a VMM wires to the doorbell registers as an ioeventfd (vfio-user
    /// DEVICE_GET_REGION_IO_FDS). The written value is lost, so this only carries
    /// notifications for hosts that use shadow doorbells. Each call returns a new
    /// descriptor for the same eventfd, for the caller to hand out.
    pub fn doorbell_kick(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        self.runtime.kick().try_clone()
    }

    /// The counters of every queue that exists now (the admin queue first), each
    /// with the worker that owns its CQ.
    pub fn queue_snapshots(&self) -> Vec<crate::QueueSnapshot> {
        self.runtime.queue_snapshots(&self.engine, self.lifecycle() != crate::Lifecycle::Disabled)
    }

    /// Runs `f` on every engine: the controller's own and each worker's.
    pub(crate) fn on_all_engines(&mut self, f: impl Fn(&mut IoEngine) + Clone + Send + 'static) {
        self.runtime.on_all_engines(&mut self.engine, f);
    }

    /// The settings the features and CC.MPS make, on every engine.
    pub(crate) fn apply_settings(&mut self) {
        let s = self.settings();
        self.runtime.apply_settings(&mut self.engine, s);
    }
}

/// A controller in inline mode: its own engine holds every queue, and a run also
/// executes admin commands and delivers events.
impl Queues for Controller {
    fn run(&mut self) -> bool {
        self.process()
    }
    fn set_arm_eventidx(&mut self, arm: bool) {
        Controller::set_arm_eventidx(self, arm);
    }
}
