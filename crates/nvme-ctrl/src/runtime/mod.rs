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
//! transport needs to know to run it inline (`Controller::inline_*`), and
//! [`routing`]: which engine owns a queue.

pub mod idle;
pub mod judge;
pub mod poll;
mod routing;
pub mod workers;

use std::sync::Arc;

use crate::engine::{Deadline, IoEngine, TEARDOWN_BOUND};
use crate::error::CommandError;
use judge::SpinJudge;
use poll::PollMode;
pub(crate) use routing::QueueBook;
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
    /// Which I/O queues exist (`runtime::routing`).
    book: QueueBook,
}

impl Runtime {
    /// Inline, not polling, with a kick eventfd of its own.
    pub fn new() -> std::io::Result<Self> {
        let kick = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?;
        Ok(Runtime {
            workers: Vec::new(),
            inline_mode: PollMode::Off,
            judge: None,
            kick: Arc::new(kick),
            book: QueueBook::default(),
        })
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
    pub(crate) fn start(
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

    /// Inline mode: how the thread that calls `process` should wait (None: workers).
    pub(crate) fn inline_mode(&self) -> Option<PollMode> {
        self.inline().then_some(self.inline_mode)
    }

    /// The eventfd that wakes every worker (and an inline owner watching it).
    pub(crate) fn kick(&self) -> &std::os::fd::OwnedFd {
        &self.kick
    }

    /// Uses `fd` as the kick eventfd; before the workers start.
    pub(crate) fn set_kick(&mut self, fd: std::os::fd::OwnedFd) -> std::io::Result<()> {
        if !self.inline() {
            return Err(std::io::Error::other("the doorbell kick must be set before the workers start"));
        }
        self.kick = Arc::new(fd);
        Ok(())
    }

    /// Lets every worker finish the commands it has (shutdown), all by `deadline`.
    pub(crate) fn drain_workers(&self, deadline: Deadline) {
        for w in self.workers() {
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
    while busy(e) && e.fatal().is_none() && !deadline.passed(&*e.io.ctx.clock) {
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
