//! Prometheus metrics: `vnvme serve --metrics ADDR` serves the text exposition format
//! over HTTP on a loopback TCP address or a UNIX socket.
//!
//! - `render`: one [`Scrape`] as exposition text; [`json`]: the same scrape as the
//!   control socket's `stats.get` answer (the stats file holds its controller part).
//! - `http`: the bounded HTTP server (its own thread, started before the sandbox).
//!
//! A scrape is collected on the device thread (a job, like the control socket's),
//! so it sees one consistent moment of the controller.
pub mod http;
pub mod render;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use nvme_ctrl::{
    Lifecycle, NsStatsSnapshot, OpSnapshot, QueueSnapshot, Regime, Stats, StatsSnapshot, Verdict,
};
use serde_json::Value;

use crate::control::reply;
use vfio_user_server::Device;

/// Everything one scrape reports.
#[derive(Clone, Debug, Default)]
pub struct Scrape {
    /// Build and identity, for the `vnvme_info` metric's labels.
    pub version: String,
    /// The commit the binary was built from (build.rs).
    pub commit: String,
    pub serial: String,
    /// Controller lifecycle: "disabled", "ready", "shut-down" or "fatal".
    pub state: String,
    pub client_connected: bool,
    pub dma_regions: u64,
    pub uptime_s: u64,
    /// Controller-wide counters.
    pub controller: StatsSnapshot,
    pub namespaces: Vec<NsScrape>,
    pub queues: Vec<QueueSnapshot>,
    pub workers: Vec<WorkerScrape>,
    /// Adaptive polling's judge (none with `--poll off` or `always`).
    pub poll: Option<Verdict>,
    /// The namespace pool (with `--pool`): capacity, what is left, namespaces.
    pub pool: Option<PoolScrape>,
    /// How many serving processes the keeper started to stand in for others before
    /// this one (`--restart-on-crash` only).
    pub keeper_restarts: Option<u32>,
}

/// The namespace pool as one controller sees it.
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolScrape {
    pub capacity: u64,
    pub unallocated: u64,
    pub namespaces: u64,
    /// Those attached to this controller.
    pub attached_here: u64,
}

/// One namespace.
#[derive(Clone, Debug, Default)]
pub struct NsScrape {
    pub nsid: u32,
    pub size_bytes: u64,
    pub lba_size: u64,
    /// The backend's description ("ram", "uring:/srv/a.img (O_DIRECT, ...)").
    pub backend: String,
    pub stats: NsStatsSnapshot,
    /// Its storage, when the backend can lose it (nbd://, rbd:).
    pub storage: Option<block_backend::StorageReport>,
    /// Its ANA group and the group's state on this controller (a controller of a
    /// subsystem only).
    pub ana: Option<(u32, &'static str)>,
}

/// One I/O worker thread's polling counters.
#[derive(Clone, Debug, Default)]
pub struct WorkerScrape {
    pub index: usize,
    pub sleeps: u64,
    pub wakeups: u64,
    pub spin_hits: u64,
    pub spin_misses: u64,
    pub spin_contended: u64,
    pub spin_ns: u64,
    pub spin_lost_ns: u64,
}

/// The name a controller state goes by in metrics and on the control socket.
pub fn state_name(l: Lifecycle) -> &'static str {
    match l {
        Lifecycle::Disabled => "disabled",
        Lifecycle::Ready => "ready",
        Lifecycle::ShutDown => "shut-down",
        Lifecycle::Fatal => "fatal",
    }
}

/// One scrape of `d` (on the device thread).
pub fn collect(d: &Device, stats: &Stats, serial: &str, started: Instant) -> Scrape {
    let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let ana = d.ctrl.ana_groups();
    let ana_of = |nsid: u32| {
        ana.iter().find(|(_, _, nsids)| nsids.contains(&nsid)).map(|(group, state, _)| (*group, state.name()))
    };
    Scrape {
        version: env!("CARGO_PKG_VERSION").into(),
        commit: crate::version::COMMIT.into(),
        serial: serial.into(),
        state: state_name(d.ctrl.lifecycle()).into(),
        client_connected: d.client_connected(),
        dma_regions: d.dma_regions() as u64,
        uptime_s: started.elapsed().as_secs(),
        controller: stats.snapshot(),
        namespaces: d
            .ctrl
            .namespaces()
            .map(|n| NsScrape {
                nsid: n.nsid,
                size_bytes: n.size(),
                lba_size: 1 << n.lba_shift(),
                backend: n.info.kind.clone(),
                stats: n.stats.snapshot(),
                storage: n.backend.storage(),
                ana: ana_of(n.nsid),
            })
            .collect(),
        queues: d.ctrl.queue_snapshots(),
        workers: d
            .ctrl
            .workers()
            .iter()
            .map(|w| {
                let s = w.stats();
                WorkerScrape {
                    index: w.index,
                    sleeps: g(&s.sleeps),
                    wakeups: g(&s.wakeups),
                    spin_hits: g(&s.spin_hits),
                    spin_misses: g(&s.spin_misses),
                    spin_contended: g(&s.spin_contended),
                    spin_ns: g(&s.spin_ns),
                    spin_lost_ns: g(&s.spin_lost_ns),
                }
            })
            .collect(),
        poll: d.ctrl.spin_judge().map(|j| j.verdict()),
        keeper_restarts: crate::keeper::link().map(|l| l.restarts),
        pool: d.ctrl.pool().map(|p| {
            let st = p.state();
            PoolScrape {
                capacity: st.capacity,
                unallocated: st.unallocated(),
                namespaces: st.namespaces.len() as u64,
                attached_here: st.namespaces.values().filter(|n| n.attached.contains(&p.cntlid())).count()
                    as u64,
            }
        }),
    }
}

/// A scrape as `stats.get` answers: the controller's counters, then each namespace
/// (per kind of command, with the average latency), queue and worker, and adaptive
/// polling's verdict.
pub fn json(s: &Scrape) -> Value {
    serde_json::to_value(report(s)).unwrap_or(Value::Null)
}

/// A scrape as the control socket's typed `stats.get` answer.
pub fn report(s: &Scrape) -> reply::Stats {
    let op = |o: &OpSnapshot| {
        let avg_us = if o.commands > 0 { o.latency_sum_ns as f64 / o.commands as f64 / 1000.0 } else { 0.0 };
        reply::OpStats {
            commands: o.commands,
            bytes: o.bytes,
            errors: o.errors,
            latency_avg_us: (avg_us * 10.0).round() / 10.0,
        }
    };
    reply::Stats {
        controller: s.controller,
        namespaces: s
            .namespaces
            .iter()
            .map(|n| reply::NsStats {
                nsid: n.nsid,
                read: op(&n.stats.read),
                write: op(&n.stats.write),
                flush: op(&n.stats.flush),
                other: op(&n.stats.other),
                throttled_commands: n.stats.throttled_commands,
                throttled_s: n.stats.throttled_ns as f64 / 1e9,
                storage: n.storage.as_ref().map(|r| reply::StorageStats {
                    state: r.state.name().into(),
                    waiting: r.waiting,
                    outages: r.outages,
                    outages_past_hold: r.outages_past_hold,
                    outage_s: r.outage_ms_sum as f64 / 1e3,
                }),
            })
            .collect(),
        queues: s.queues.clone(),
        workers: s
            .workers
            .iter()
            .map(|w| reply::WorkerStats {
                worker: w.index,
                sleeps: w.sleeps,
                wakeups: w.wakeups,
                spin_hits: w.spin_hits,
                spin_misses: w.spin_misses,
                spin_contended: w.spin_contended,
                spin_ns: w.spin_ns,
                spin_lost_ns: w.spin_lost_ns,
            })
            .collect(),
        adaptive_poll: s.poll.as_ref().map(|v| reply::AdaptivePoll {
            choice: v.choice.name().into(),
            running: v.running.name().into(),
            cpu_per_command_ns: reply::PollCost { sleep: v.cost(Regime::Sleep), spin: v.cost(Regime::Spin) },
            epochs: v.epochs,
            changes: v.changes,
        }),
    }
}
