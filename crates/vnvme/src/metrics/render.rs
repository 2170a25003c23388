//! One [`Scrape`] in the Prometheus text exposition format, version 0.0.4.
//!
//! The encoder is the Prometheus project's own Rust client, `prometheus-client`
//! (0.26): its `prometheus_text` module writes the 0.0.4 format (HELP and TYPE
//! lines, label values and help text escaped, numbers formatted as Go's client
//! does, so series match other exporters'), and its `Collector` takes values the
//! library did not count itself. Ours are counted in the controller, as atomics
//! read into snapshots on the device thread; each scrape therefore builds a
//! registry holding one collector over the snapshot, and the latency histogram
//! goes in with the controller's own buckets ([`MetricEncoder::encode_histogram`]
//! sums them into the cumulative `le` series).
//!
//! Names follow the Prometheus conventions: prefix `vnvme_`, base units named
//! (`_seconds`, `_bytes`), counters end in `_total` (the encoder appends it to
//! the names below). A family without samples (no namespaces yet) is left out.

use std::fmt;

use block_backend::{StorageReport, StorageState, OUTAGE_BOUNDS_S};
use nvme_ctrl::{NsStatsSnapshot, OpSnapshot, Regime, StatsSnapshot, LATENCY_BOUNDS_NS};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    prometheus_text, DescriptorEncoder, EncodeCounterValue, EncodeMetric, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::{Scrape, WorkerScrape};

/// The `Content-Type` of what [`render`] returns.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Every state `vnvme_controller_state` has a sample for, as `Scrape::state` names them.
const STATES: [&str; 4] = ["disabled", "ready", "shut-down", "fatal"];

/// Picks one kind of command's counters out of a namespace's.
type OpOf = fn(&NsStatsSnapshot) -> &OpSnapshot;

/// The kinds of command a namespace counts apart, with their `op` label.
const OPS: [(&str, OpOf); 4] =
    [("read", |s| &s.read), ("write", |s| &s.write), ("flush", |s| &s.flush), ("other", |s| &s.other)];

/// The exposition text of `s`: every family with a HELP and a TYPE line, each
/// label value escaped. It always succeeds; the text ends with a newline.
pub fn render(s: &Scrape) -> String {
    let mut registry = Registry::with_prefix("vnvme");
    // The registry owns its collectors ('static); a scrape is small to copy.
    registry.register_collector(Box::new(ScrapeCollector(s.clone())));
    let mut out = String::new();
    // Writing into a String does not fail, and the encoder fails only when its
    // writer does.
    prometheus_text::encode(&mut out, &registry).expect("encoding into a String");
    out
}

/// The labels of one sample, in order.
type Labels = Vec<(&'static str, String)>;

/// A scrape, seen by the registry as the source of every family.
#[derive(Debug)]
struct ScrapeCollector(Scrape);

impl Collector for ScrapeCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let s = &self.0;
        let enc = &mut enc;
        controller(enc, s)?;
        namespaces(enc, s)?;
        queues(enc, s)?;
        workers(enc, s)?;
        pool(enc, s)?;
        if let Some(n) = s.keeper_restarts {
            single(
                enc,
                "keeper_restarts",
                "Serving processes the keeper started to stand in for one that died, before this one \
                 (--restart-on-crash); it grows over the keeper's life, across stand-ins.",
                ConstCounter::new(n as u64),
            )?;
        }
        adaptive_poll(enc, s)
    }
}

/// The namespace pool's families (with --pool only).
fn pool(enc: &mut DescriptorEncoder, s: &Scrape) -> fmt::Result {
    let Some(p) = s.pool else { return Ok(()) };
    single(
        enc,
        "pool_capacity_bytes",
        "Bytes the namespace pool's namespaces may take together (--pool; Identify TNVMCAP).",
        ConstGauge::new(p.capacity),
    )?;
    single(
        enc,
        "pool_unallocated_bytes",
        "Bytes of the namespace pool no namespace takes (Identify UNVMCAP): what a host or \
         vnvme ctl ns.create may still make.",
        ConstGauge::new(p.unallocated),
    )?;
    family(
        enc,
        "pool_namespaces",
        "Namespaces in the pool (every controller's), and those attached to this controller.",
        [
            (vec![("attached", "any".to_owned())], ConstGauge::new(p.namespaces)),
            (vec![("attached", "here".to_owned())], ConstGauge::new(p.attached_here)),
        ],
    )
}

/// Writes one family: HELP and TYPE, then a sample per label set. Nothing at all
/// when there are no samples.
fn family<M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Labels, M)>,
) -> fmt::Result {
    let mut samples = samples.into_iter().peekable();
    let Some((_, first)) = samples.peek() else { return Ok(()) };
    let mut m = enc.encode_descriptor(name, help, None, first.metric_type())?;
    for (labels, metric) in samples {
        metric.encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A family of one sample without labels.
fn single<M: EncodeMetric>(enc: &mut DescriptorEncoder, name: &str, help: &str, metric: M) -> fmt::Result {
    family(enc, name, help, [(Labels::new(), metric)])
}

/// Nanoseconds in the base unit Prometheus wants.
fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

fn controller(enc: &mut DescriptorEncoder, s: &Scrape) -> fmt::Result {
    family(
        enc,
        "info",
        "The vnvme program serving this controller: its version, the commit it was built \
         from, and the serial number the controller reports in Identify Controller. Always 1.",
        [(
            vec![("version", s.version.clone()), ("commit", s.commit.clone()), ("serial", s.serial.clone())],
            ConstGauge::new(1u64),
        )],
    )?;
    family(
        enc,
        "controller_state",
        "Controller state as the host driver sees it (disabled: CC.EN clear; ready: \
         CSTS.RDY set; shut-down: shutdown complete; fatal: CSTS.CFS set, the host must \
         reset it). 1 for the current state, 0 for the others.",
        STATES.map(|st| (vec![("state", st.to_owned())], ConstGauge::new(u64::from(s.state == st)))),
    )?;
    single(
        enc,
        "client_connected",
        "1 while a VMM (QEMU, Cloud Hypervisor) is connected over vfio-user, else 0.",
        ConstGauge::new(u64::from(s.client_connected)),
    )?;
    single(
        enc,
        "dma_regions",
        "Guest memory regions the VMM has shared for DMA.",
        ConstGauge::new(s.dma_regions),
    )?;
    single(enc, "uptime_seconds", "Seconds since vnvme serve started.", ConstGauge::new(s.uptime_s))?;

    // The controller's counters, each as its row in nvme-ctrl's `counters!` names it.
    for (c, v) in StatsSnapshot::COUNTERS.iter().zip(s.controller.values()) {
        single(enc, c.metric, c.help.trim_start(), ConstCounter::new(v))?;
    }
    Ok(())
}

fn namespaces(enc: &mut DescriptorEncoder, s: &Scrape) -> fmt::Result {
    let nsid = |n: u32| vec![("nsid", n.to_string())];
    family(
        enc,
        "namespace_info",
        "The backend that stores each namespace's data, as vnvme describes it. Always 1.",
        s.namespaces.iter().map(|n| {
            (vec![("nsid", n.nsid.to_string()), ("backend", n.backend.clone())], ConstGauge::new(1u64))
        }),
    )?;
    family(
        enc,
        "namespace_ana_state",
        "Asymmetric Namespace Access state of each namespace's ANA group on this controller \
         (a controller of a subsystem, --cntlid, only; set with vnvme ctl ana.set): 1 for \
         the current state, 0 for the others. A host sends no I/O down a path that is not \
         optimized or non-optimized.",
        s.namespaces.iter().filter_map(|n| n.ana.map(|a| (n.nsid, a))).flat_map(|(nsid, (group, now))| {
            nvme_spec::ana::AnaState::ALL.map(|st| {
                let labels = vec![
                    ("nsid", nsid.to_string()),
                    ("group", group.to_string()),
                    ("state", st.name().to_owned()),
                ];
                (labels, ConstGauge::new(u64::from(st.name() == now)))
            })
        }),
    )?;
    family(
        enc,
        "namespace_size_bytes",
        "Capacity of each namespace, in bytes.",
        s.namespaces.iter().map(|n| (nsid(n.nsid), ConstGauge::new(n.size_bytes))),
    )?;
    family(
        enc,
        "namespace_lba_bytes",
        "Logical block size of each namespace, in bytes.",
        s.namespaces.iter().map(|n| (nsid(n.nsid), ConstGauge::new(n.lba_size))),
    )?;

    // Every (namespace, kind) pair with its labels.
    let ops = || {
        s.namespaces.iter().flat_map(|n| {
            OPS.iter().map(move |(op, of)| {
                (vec![("nsid", n.nsid.to_string()), ("op", (*op).to_owned())], of(&n.stats))
            })
        })
    };
    family(
        enc,
        "namespace_commands",
        "I/O commands completed on each namespace, failed ones included, by kind: read, \
         write, flush, other (Write Zeroes, Dataset Management, Compare, Verify).",
        ops().map(|(l, o)| (l, ConstCounter::new(o.commands))),
    )?;
    family(
        enc,
        "namespace_bytes",
        "Data bytes transferred by each namespace's commands, by kind (reads and writes \
         move data; the other kinds count 0).",
        ops().map(|(l, o)| (l, ConstCounter::new(o.bytes))),
    )?;
    family(
        enc,
        "namespace_errors",
        "Commands on each namespace completed with an error status, by kind.",
        ops().map(|(l, o)| (l, ConstCounter::new(o.errors))),
    )?;
    family(
        enc,
        "namespace_latency_seconds",
        "Command latency inside vnvme, by namespace and kind: from the controller starting \
         a command to posting its completion. Time held back by QoS limits is not included \
         (see vnvme_namespace_qos_throttled_seconds_total).",
        ops().map(|(l, o)| (l, Latency(o))),
    )?;
    family(
        enc,
        "namespace_qos_throttled_commands",
        "Commands held back by each namespace's QoS limits (IOPS or bandwidth) before they \
         could start.",
        s.namespaces.iter().map(|n| (nsid(n.nsid), ConstCounter::new(n.stats.throttled_commands))),
    )?;
    family(
        enc,
        "namespace_qos_throttled_seconds",
        "Time commands spent held back by each namespace's QoS limits, summed over the \
         commands.",
        s.namespaces.iter().map(|n| (nsid(n.nsid), ConstCounter::new(seconds(n.stats.throttled_ns)))),
    )?;
    storage(enc, s)
}

/// The storage of namespaces whose backend can lose it (nbd://, rbd:): where it is, what
/// waits for it, its outages.
fn storage(enc: &mut DescriptorEncoder, s: &Scrape) -> fmt::Result {
    let nsid = |n: u32| vec![("nsid", n.to_string())];
    let with = || s.namespaces.iter().filter_map(|n| n.storage.as_ref().map(|r| (n.nsid, r)));
    family(
        enc,
        "namespace_storage_state",
        "Where each network namespace's storage is, one series per state, 1 for the current \
         one: up; waiting (lost: commands wait, within the hold); gone (past the hold: \
         commands fail Namespace Not Ready until it is back).",
        with().flat_map(|(n, r)| {
            [StorageState::Up, StorageState::Waiting, StorageState::Gone].into_iter().map(move |st| {
                (
                    vec![("nsid", n.to_string()), ("state", st.name().to_owned())],
                    ConstGauge::new((r.state == st) as u64),
                )
            })
        }),
    )?;
    family(
        enc,
        "namespace_storage_waiting_commands",
        "Commands waiting for each network namespace's storage to come back.",
        with().map(|(n, r)| (nsid(n), ConstGauge::new(r.waiting))),
    )?;
    family(
        enc,
        "namespace_storage_outages",
        "Times each network namespace lost its storage (a connection lost).",
        with().map(|(n, r)| (nsid(n), ConstCounter::new(r.outages))),
    )?;
    family(
        enc,
        "namespace_storage_outages_past_hold",
        "Outages that outlasted the namespace's hold, after which its commands failed.",
        with().map(|(n, r)| (nsid(n), ConstCounter::new(r.outages_past_hold))),
    )?;
    family(
        enc,
        "namespace_storage_outage_seconds",
        "How long each outage of a network namespace's storage lasted: until it was back, \
         or until the hold ran out.",
        with().map(|(n, r)| (nsid(n), Outages(r))),
    )
}

/// The outage-length histogram of a storage report.
#[derive(Debug)]
struct Outages<'a>(&'a StorageReport);

impl EncodeMetric for Outages<'_> {
    fn encode(&self, mut enc: MetricEncoder) -> fmt::Result {
        let counts = &self.0.outage_buckets;
        let bounds = OUTAGE_BOUNDS_S.iter().copied().chain([f64::INFINITY]);
        let buckets: Vec<(f64, u64)> = bounds.zip(counts.iter().copied()).collect();
        let count = counts.iter().sum();
        enc.encode_histogram::<NoLabelSet>(self.0.outage_ms_sum as f64 / 1e3, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// One latency histogram, from the controller's own buckets.
#[derive(Debug)]
struct Latency<'a>(&'a OpSnapshot);

impl EncodeMetric for Latency<'_> {
    fn encode(&self, mut enc: MetricEncoder) -> fmt::Result {
        let counts = &self.0.latency;
        let bounds = LATENCY_BOUNDS_NS.iter().map(|&ns| seconds(ns)).chain([f64::INFINITY]);
        let buckets: Vec<(f64, u64)> = bounds.zip(counts.iter().copied()).collect();
        // The count is the buckets' sum, not `commands`: the controller counts both
        // for each completion, but a snapshot taken meanwhile may see one and not the
        // other, and `_count` must equal the +Inf bucket.
        let count = counts.iter().sum();
        enc.encode_histogram::<NoLabelSet>(seconds(self.0.latency_sum_ns), count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

fn queues(enc: &mut DescriptorEncoder, s: &Scrape) -> fmt::Result {
    let per_queue = |pick: fn(&nvme_ctrl::QueueSnapshot) -> u64| {
        s.queues.iter().map(move |q| {
            let worker = q.worker.map_or_else(|| "controller".to_owned(), |w| w.to_string());
            (vec![("qid", q.qid.to_string()), ("worker", worker)], ConstCounter::new(pick(q)))
        })
    };
    let owner = "worker is the I/O worker thread that owns the queue, or controller for the \
                 controller's own thread";
    family(
        enc,
        "queue_commands",
        &format!("Commands fetched from each submission queue ({owner})."),
        per_queue(|q| q.commands),
    )?;
    family(
        enc,
        "queue_sq_doorbell_writes",
        &format!("Trapped writes of each submission queue's tail doorbell ({owner})."),
        per_queue(|q| q.sq_doorbell_writes),
    )?;
    family(
        enc,
        "queue_cq_doorbell_writes",
        &format!("Trapped writes of each completion queue's head doorbell ({owner})."),
        per_queue(|q| q.cq_doorbell_writes),
    )?;
    family(
        enc,
        "queue_completions",
        &format!("Completions posted to each queue pair's completion queue ({owner})."),
        per_queue(|q| q.completions),
    )?;
    family(
        enc,
        "queue_interrupts",
        &format!("Interrupts signalled for each queue pair's completion queue ({owner})."),
        per_queue(|q| q.interrupts),
    )
}

fn workers(enc: &mut DescriptorEncoder, s: &Scrape) -> fmt::Result {
    family(
        enc,
        "worker_sleeps",
        "Times each I/O worker thread went to sleep, idle.",
        per_worker(s, |w| w.sleeps),
    )?;
    family(
        enc,
        "worker_wakeups",
        "Times each I/O worker was woken from sleep (a doorbell or a request found it asleep).",
        per_worker(s, |w| w.wakeups),
    )?;
    family(
        enc,
        "worker_spin_hits",
        "Spin phases (busy-polling for new work before sleeping) in which new work arrived.",
        per_worker(s, |w| w.spin_hits),
    )?;
    family(
        enc,
        "worker_spin_misses",
        "Spin phases that ran out of time without new work.",
        per_worker(s, |w| w.spin_misses),
    )?;
    family(
        enc,
        "worker_spin_contended",
        "Windows of spinning during which other threads took too much of the worker's CPU \
         (the worker then spins less).",
        per_worker(s, |w| w.spin_contended),
    )?;
    family(
        enc,
        "worker_spin_seconds",
        "Time each I/O worker spent spinning.",
        per_worker(s, |w| seconds(w.spin_ns)),
    )?;
    family(
        enc,
        "worker_spin_lost_seconds",
        "Of the time spent spinning, the part during which other threads had the worker's CPU.",
        per_worker(s, |w| seconds(w.spin_lost_ns)),
    )
}

fn adaptive_poll(enc: &mut DescriptorEncoder, s: &Scrape) -> fmt::Result {
    let Some(v) = &s.poll else { return Ok(()) };
    single(
        enc,
        "adaptive_poll_spinning",
        "Adaptive polling: 1 while spinning is the regime judged cheaper in process CPU time per command, \
         0 while sleeping is.",
        ConstGauge::new(u64::from(v.choice == Regime::Spin)),
    )?;
    family(
        enc,
        "adaptive_poll_cpu_per_command_seconds",
        "Adaptive polling: the process's CPU time per command last measured in each regime (spin, sleep).",
        [Regime::Sleep, Regime::Spin].into_iter().filter_map(|r| {
            let ns = v.cost(r)?;
            Some((vec![("regime", r.name().to_owned())], ConstGauge::new(seconds(ns))))
        }),
    )?;
    single(
        enc,
        "adaptive_poll_epochs",
        "Adaptive polling: epochs judged (50 ms of the chosen regime or a 20 ms exploration, each with enough commands).",
        ConstCounter::new(v.epochs),
    )?;
    single(
        enc,
        "adaptive_poll_choice_changes",
        "Adaptive polling: times the cheaper regime changed (the guest's pace or the host's load moved).",
        ConstCounter::new(v.changes),
    )
}

/// One counter sample per worker, labelled with its index.
fn per_worker<'a, V: EncodeCounterValue + 'a>(
    s: &'a Scrape,
    pick: impl Fn(&WorkerScrape) -> V + 'a,
) -> impl Iterator<Item = (Labels, ConstCounter<V>)> + 'a {
    s.workers.iter().map(move |w| (vec![("worker", w.index.to_string())], ConstCounter::new(pick(w))))
}

#[cfg(test)]
mod tests;
