//! Commands a backend does not answer: each in-flight command carries a deadline
//! (its namespace's timeout), and a command past it completes with an error while
//! its backend requests are abandoned.
//!
//! Abandoning is safe because a command's tag is not reused until the backend gives
//! every request back: the slot turns abandoned (`table`) and counts what is still
//! out, a late completion only decrements that count (it never completes the
//! command a second time, nor reaches a command that reused the tag), and the
//! buffers stay with the requests (each owns its segments or bounce buffer, and the
//! backend its clone of the guest memory map) until then.
//!
//! Expiry costs nothing per command beyond one clock read when it starts: the
//! engine keeps the earliest deadline and scans only when an idle poll (or every
//! [`EXPIRY_POLLS`] busy ones) finds that moment passed. A sleeping owner is woken
//! for it through `next_deadline`. Teardown (Delete SQ, reset, shutdown) waits at
//! most [`TEARDOWN_BOUND`] for what is still in flight, then abandons it too. Every
//! bound runs on the controller's [`Clock`], as command timeouts do, so a test drives
//! it by hand.

use std::time::Duration;

use nvme_spec::Status;

use super::{Finish, InFlight, IoEngine};
use crate::error::CommandError;
use crate::interrupt::Clock;
use crate::stats::Count;

/// The longest a Delete SQ, reset or shutdown waits for commands still with a
/// backend before it abandons them.
pub const TEARDOWN_BOUND: Duration = Duration::from_secs(5);

/// A moment on the controller's [`Clock`] by which a teardown or a quiesce gives up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Deadline(u64);

impl Deadline {
    /// `bound` from now.
    pub(crate) fn after(clock: &dyn Clock, bound: Duration) -> Deadline {
        Deadline(clock.now_ns().saturating_add(u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX)))
    }

    /// The teardown bound from now.
    pub(crate) fn teardown(clock: &dyn Clock) -> Deadline {
        Deadline::after(clock, TEARDOWN_BOUND)
    }

    pub(crate) fn passed(self, clock: &dyn Clock) -> bool {
        clock.now_ns() >= self.0
    }

    /// What is left of it (zero once passed).
    pub(crate) fn remaining(self, clock: &dyn Clock) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(clock.now_ns()))
    }
}

/// The SQ identifier of a command whose queue was torn down while its backend still
/// held an unstoppable request: its completion goes nowhere.
pub(crate) const ORPHAN: u16 = u16::MAX;

/// Busy polls between expiry checks (idle polls always check).
pub(crate) const EXPIRY_POLLS: u32 = 1024;

impl IoEngine {
    /// Completes every command past its deadline with the timeout status, if the
    /// earliest deadline has passed. True if it completed any.
    pub(crate) fn expire_overdue(&mut self) -> bool {
        self.polls_since_expiry = 0;
        let Some(due) = self.io.work.commands.next_expiry() else { return false };
        let now = self.io.ctx.clock.now_ns();
        if now < due {
            return false;
        }
        let mut next = u64::MAX;
        let mut any = false;
        for tag in self.io.work.commands.tags() {
            let Some(f) = self.io.work.commands.running_at(tag) else { continue };
            if f.deadline_ns > now {
                next = next.min(f.deadline_ns);
                continue;
            }
            let ms = crate::namespace::lookup(&self.io.ctx.namespaces, f.at.nsid)
                .map_or(0, |n| n.timeout_ns / 1_000_000);
            self.abandon(tag, CommandError::TimedOut { ms }, false);
            any = true;
        }
        self.io.work.commands.set_next_expiry(next);
        any
    }

    /// Waits (at most until `deadline`) for the commands fetched from SQ `qid` to
    /// finish, then abandons those still with a backend.
    pub(crate) fn settle_sq(&mut self, qid: u16, deadline: Deadline) {
        // Commands QoS holds back have not started: they are aborted at once.
        self.drop_held(|sqid, _| sqid == qid, Status::ABORT_SQ_DELETION);
        let busy = |e: &Self| e.queues.sq(qid).is_some_and(|q| q.in_flight > 0);
        let mut spins = 0u32;
        while busy(self) && !deadline.passed(&*self.io.ctx.clock) {
            self.reap();
            self.expire_overdue();
            spins += 1;
            if spins.is_multiple_of(1024) {
                std::thread::yield_now();
            }
        }
        if busy(self) {
            self.abandon_where(|f| f.at.sqid == qid, || CommandError::SqDeleted);
        }
    }

    /// Abandons every running command `pick` chooses (a queue or the controller is
    /// being torn down), completing it with `why`'s status.
    pub(crate) fn abandon_where(&mut self, pick: impl Fn(&InFlight) -> bool, why: impl Fn() -> CommandError) {
        for tag in self.io.work.commands.tags() {
            if self.io.work.commands.running_at(tag).is_some_and(&pick) {
                self.abandon(tag, why(), true);
            }
        }
    }

    /// Asks the backend queues holding command `tag`'s requests to stop them from
    /// touching guest memory. True if none can still do so (or none moves data).
    fn revoke(&mut self, tag: usize, nsid: u32, op: block_backend::Op) -> bool {
        use block_backend::Op;
        if matches!(op, Op::Flush | Op::Discard | Op::WriteZeroes { .. } | Op::Copy { .. }) {
            return true;
        }
        self.io.work.backends.revoke(nsid, tag as u64)
    }

    /// Completes the running command at `tag` to the host with `why`'s status and
    /// retires its tag until the backend returns its requests, if the backend can
    /// keep those requests off guest memory from now on: the host reuses a buffer
    /// as soon as its command is complete, and a late read landing there would
    /// corrupt it. A request the backend cannot stop (a direct read the kernel is
    /// doing) keeps its command running until it ends; torn-down queues leave it
    /// with nowhere to complete to, and that is logged.
    fn abandon(&mut self, tag: usize, why: CommandError, teardown: bool) {
        let Some((nsid, op)) = self.io.work.commands.running_at(tag).map(|f| (f.at.nsid, f.op)) else {
            return;
        };
        if !self.revoke(tag, nsid, op) {
            let f = self.io.work.commands.running_mut(tag).expect("running above");
            if teardown && f.at.sqid != ORPHAN {
                log_limit::limited_warn!(
                    target: "vnvme::backend",
                    sqid = f.at.sqid, cid = f.at.cid, nsid, %op,
                    "queue torn down while its backend still holds a request it cannot stop: that \
                     request may still move data to or from guest memory"
                );
                f.at.sqid = ORPHAN;
            } else if !f.overdue {
                log_limit::limited_warn!(
                    target: "vnvme::backend",
                    sqid = f.at.sqid, cid = f.at.cid, nsid, %op,
                    "command past its timeout, but its backend cannot stop the request safely: it \
                     completes when the backend does"
                );
            }
            f.overdue = true;
            f.deadline_ns = u64::MAX;
            return;
        }
        let Some(f) = self.io.work.commands.abandon(tag) else { return };
        // A write given up on keeps its place in its zone (the backend may still
        // write it): the zone's pointer moves past it, or no write could follow.
        match &f.finish {
            Finish::Zoned { write, .. } => {
                self.io.zone_written(f.at.nsid, *write);
            }
            Finish::Copy(job) => {
                if let Some(w) = job.zone {
                    self.io.zone_written(f.at.nsid, w);
                }
            }
            _ => {}
        }
        if matches!(why, CommandError::TimedOut { .. } | CommandError::SqDeleted) {
            self.io.work.counts.add(Count::Timeouts, 1);
        }
        // A status decided earlier (its namespace was removed, a request failed)
        // stands; otherwise the reason it is given up on.
        let status: Status = if f.status.is_success() { why.status() } else { f.status };
        // A stuck backend must not flood the log.
        log_limit::limited_warn!(
            target: "vnvme::backend",
            sqid = f.at.sqid, cid = f.at.cid, nsid = f.at.nsid, slba = f.at.slba, op = %f.op,
            status = format_args!("{:#x}", status.raw()),
            "command abandoned: {why}"
        );
        let f = InFlight { status, ..f };
        self.count_done(&f);
        self.complete(f.at, status, 0);
    }
}
