//! What an I/O command works on: [`Io`], the part of the engine lent to one command
//! at a time (as `Admin` is the controller's parts for an admin command). Queues, doorbells,
//! interrupts, QoS and the admin inbox are not among them: fetching a command and
//! posting its completion are the engine's, which runs the command on an `Io` and
//! completes what it returns (`engine/run.rs`).

use std::sync::{Arc, Weak};

use block_backend::{BackendError, Completion, DataBuf, Op, Request, Segment};
use guest_mem::GuestMemory;
use nvme_spec::log::critical_warning;
use nvme_spec::Status;

use super::table::InFlightTable;
use super::{EngineContext, InFlight, Origin, Settings, Tally};
use crate::backends::BackendSet;
use crate::stats::{Count, EngineCounts, NsCounts, OpClass};

/// The engine's parts a command works on besides the context, the memory and the
/// settings: the in-flight table, the backends, segment lists for reuse, this
/// engine's counters and the clock reads of the current poll.
#[derive(Debug)]
pub(crate) struct Work {
    /// Commands at the backends, by tag.
    pub(super) commands: InFlightTable,
    /// A backend queue per active namespace (none once workers own the I/O queues
    /// of the controller's own engine).
    pub(super) backends: BackendSet,
    /// Segment lists of finished commands, for the next ones.
    pub(crate) seg_pool: Vec<Vec<Segment>>,
    /// This engine's shard of the controller's counters.
    pub(super) counts: EngineCounts,
    /// This engine's shard of each namespace's counters (by NSID - 1), taken when
    /// it first counts a command there; the Weak tells a namespace replaced since.
    pub(super) ns_counts: Vec<Option<(Weak<crate::namespace::Namespace>, NsCounts)>>,
    /// The clock read once for the commands one `poll` starts (their timeouts run
    /// from it): one clock read per batch, not per command.
    pub(super) poll_now_ns: Option<u64>,
    /// The clock read once for the commands one `poll` completes (their latency
    /// ends there).
    pub(super) done_now_ns: Option<u64>,
    /// Backend completions to hand to their commands.
    pub(crate) reaped: Vec<Completion>,
}

impl Work {
    pub(super) fn new(backends: BackendSet, counts: EngineCounts) -> Self {
        Work {
            commands: InFlightTable::default(),
            backends,
            seg_pool: Vec::new(),
            counts,
            ns_counts: Vec::new(),
            poll_now_ns: None,
            done_now_ns: None,
            reaped: Vec::new(),
        }
    }
}

/// What an I/O command works on: the engine's parts it needs, lent to one
/// command at a time (`&mut Io`) while the engine keeps the rest.
#[derive(Debug)]
pub(crate) struct Io {
    /// The namespaces, the capabilities, the clock, the events.
    pub ctx: EngineContext,
    pub mem: GuestMemory,
    /// What the admin side last set (page size, MDTS, write cache).
    pub settings: Settings,
    pub work: Work,
}

impl Io {
    /// What the admin side last set.
    #[inline]
    pub(crate) fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Bytes of host buffers the commands at the backends hold (see
    /// [`HOST_BUFFER_BUDGET`]).
    pub(crate) fn host_bytes_held(&self) -> u64 {
        self.work.commands.host_bytes()
    }
    /// Allocates a tag for an in-flight command and starts its timeout.
    pub(crate) fn track(&mut self, mut f: InFlight) -> u64 {
        f.deadline_ns = self.command_deadline(f.at.nsid);
        let clock = &self.ctx.clock;
        f.tally.started_ns = *self.work.poll_now_ns.get_or_insert_with(|| clock.now_ns());
        self.work.commands.insert(f)
    }
    /// Hands `req` to namespace `nsid`'s backend queue on this engine. An engine
    /// without backend queues (the controller's own, once workers own the I/O
    /// queues) never gets I/O; if it did, the request fails instead of panicking.
    pub(crate) fn backend_submit(&mut self, nsid: u32, req: block_backend::Request) {
        match self.work.backends.queue(nsid) {
            Some(q) => q.submit(&self.mem, req),
            None => self.work.reaped.push(block_backend::Completion {
                tag: req.tag,
                result: Err(block_backend::BackendError::NotReady("no backend queue on this engine".into())),
                data: req.data,
            }),
        }
    }
    /// Runs `req` to its end now if namespace `nsid`'s queue is synchronous: its
    /// result, with the poll's start time (the command's, as [`IoEngine::track`]
    /// would set it). None leaves `req` as it was, for a tag and
    /// [`IoEngine::backend_submit`].
    #[inline]
    pub(crate) fn backend_run_now(
        &mut self,
        nsid: u32,
        req: &mut block_backend::Request,
    ) -> Option<(Result<(), block_backend::BackendError>, u64)> {
        let q = self.work.backends.queue_running_now(nsid)?;
        let clock = &self.ctx.clock;
        let started_ns = *self.work.poll_now_ns.get_or_insert_with(|| clock.now_ns());
        q.run_now(&self.mem, req).map(|r| (r, started_ns))
    }
    /// A write to zoned namespace `nsid` is back from its backend: its zone's pointer
    /// moves past it. Returns the namespace's LBA shift.
    pub(crate) fn zone_written(&self, nsid: u32, w: crate::zoned::ZoneWrite) -> u32 {
        let ns = crate::namespace::lookup(&self.ctx.namespaces, nsid);
        let Some(ns) = ns else { return 0 };
        if let Some(z) = &ns.zones {
            z.finish_write(w);
        }
        ns.lba_shift()
    }
    /// A finished request's buffer handed back: what it read into guest memory marked
    /// for a migration's log, its segment list kept for the next command.
    #[inline]
    pub(crate) fn release_data(&mut self, data: DataBuf, into_guest: bool) {
        if into_guest {
            super::data::mark_written(&self.mem, &data);
        }
        if let DataBuf::Guest(mut v) = data {
            v.clear();
            self.work.seg_pool.push(v);
        }
    }
    /// The deadline (clock ns) for a command on `nsid` starting now; u64::MAX when
    /// its namespace has no timeout. A broadcast (Flush of every namespace) takes
    /// the longest timeout of them.
    pub(crate) fn command_deadline(&mut self, nsid: u32) -> u64 {
        let ns = &self.ctx.namespaces;
        let t = match crate::namespace::lookup(ns, nsid) {
            Some(n) => n.timeout_ns,
            None if crate::namespace::active(ns).any(|n| n.timeout_ns == 0) => 0,
            None => crate::namespace::active(ns).map(|n| n.timeout_ns).max().unwrap_or(0),
        };
        if t == 0 {
            return u64::MAX;
        }
        let clock = &self.ctx.clock;
        self.work.poll_now_ns.get_or_insert_with(|| clock.now_ns()).saturating_add(t)
    }

    /// Counts a command of `class` on namespace `nsid` that moved `bytes` and took
    /// `latency_ns`, in this engine's shard of the namespace's counters.
    #[inline]
    pub(crate) fn count_ns(&mut self, nsid: u32, class: OpClass, bytes: u64, latency_ns: u64, ok: bool) {
        let Some(ns) = crate::namespace::lookup(&self.ctx.namespaces, nsid) else { return };
        // The usual case: this engine counted for this namespace before.
        if let Some(Some((w, c))) = self.work.ns_counts.get(nsid as usize - 1) {
            if std::ptr::eq(w.as_ptr(), Arc::as_ptr(ns)) {
                c.record(class, bytes, latency_ns, ok);
                return;
            }
        }
        self.count_ns_first(nsid, class, bytes, latency_ns, ok);
    }

    /// [`Self::count_ns`] for a namespace's first command on this engine (or the
    /// first since its NSID was given to another namespace): takes a shard to count in.
    #[cold]
    #[inline(never)]
    fn count_ns_first(&mut self, nsid: u32, class: OpClass, bytes: u64, latency_ns: u64, ok: bool) {
        let Some(ns) = crate::namespace::lookup(&self.ctx.namespaces, nsid) else { return };
        let i = nsid as usize - 1;
        if self.work.ns_counts.len() <= i {
            self.work.ns_counts.resize_with(i + 1, || None);
        }
        let slot = self.work.ns_counts[i].insert((Arc::downgrade(ns), ns.stats.engine_counts()));
        slot.1.record(class, bytes, latency_ns, ok);
    }

    /// Counts `n` in this engine's shard of the controller's counters.
    #[inline]
    pub(crate) fn count(&self, c: crate::stats::Count, n: u64) {
        self.work.counts.add(c, n);
    }

    /// Side effects of a failed backend request, besides its status: the log line,
    /// the SMART media error count and critical warnings (Base SMART / Health log:
    /// bit 2 for media and internal errors that degrade reliability, bit 3 when the
    /// storage became read-only), which raise a SMART / Health event when the host
    /// enabled it.
    pub(crate) fn backend_failed(&mut self, nsid: u32, slba: u64, op: Op, status: Status, e: &BackendError) {
        self.work.counts.add(Count::BackendErrors, 1);
        // A dying disk must not flood the log.
        log_limit::limited_warn!(
            target: "vnvme::backend",
            nsid, slba, %op, status = format_args!("{:#x}", status.raw()),
            "backend request failed: {e}"
        );
        let warning = match e {
            BackendError::Io(_) | BackendError::Short { .. } => {
                self.work.counts.add(Count::MediaErrors, 1);
                critical_warning::RELIABILITY
            }
            BackendError::NotReady(_) => critical_warning::RELIABILITY,
            BackendError::ReadOnly => critical_warning::READ_ONLY,
            _ => 0,
        };
        if warning != 0 {
            self.ctx.events.raise_critical_warning(warning);
        }
    }

    /// Finishes a command whose one backend request a synchronous backend ran to
    /// its end inside `run_now` ([`IoEngine::backend_done`] without the in-flight
    /// table: a `Finish::Plain` one, or with `zoned`, its zone write and whether a
    /// Zone Append, a `Finish::Zoned` one): the status and result its completion
    /// carries, which the engine posts.
    pub(crate) fn finish_now(
        &mut self,
        at: Origin,
        tally: Tally,
        req: Request,
        result: &Result<(), BackendError>,
        zoned: Option<(crate::zoned::ZoneWrite, bool)>,
    ) -> (Status, u64) {
        let (Origin { nsid, slba, .. }, op) = (at, req.op);
        let status = match result {
            Ok(()) => Status::SUCCESS,
            Err(e) => {
                let status = crate::error::backend_status(!matches!(op, Op::Read), e);
                self.backend_failed(nsid, slba, op, status, e);
                status
            }
        };
        self.release_data(req.data, matches!(op, Op::Read));
        // Fetched and done within this poll: one clock read for the poll's starts
        // (set by the caller, as `track` does) and one for its ends.
        let clock = &self.ctx.clock;
        let now = *self.work.done_now_ns.get_or_insert_with(|| clock.now_ns());
        let latency = now.saturating_sub(tally.started_ns);
        self.count_ns(nsid, tally.class, tally.bytes, latency, status.is_success());
        let mut result = 0;
        if let Some((write, append)) = zoned {
            // The zone's pointer moves (and is recorded) before the host hears of it.
            let shift = self.zone_written(nsid, write);
            if append && status.is_success() {
                result = write.offset >> shift;
            }
        }
        (status, result)
    }
}
