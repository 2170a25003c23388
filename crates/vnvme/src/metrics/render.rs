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
use nvme_ctrl::{NsStatsSnapshot, OpSnapshot, Regime, LATENCY_BOUNDS_NS};
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

    let c = &s.controller;
    let counters = [
        (
            "admin_commands",
            "Admin commands completed (Identify, queue creation and deletion, Get Log Page, \
             features, ...).",
            c.admin_commands,
        ),
        ("io_commands", "I/O commands completed, over all namespaces and queues.", c.io_commands),
        ("command_errors", "Commands, admin and I/O, completed with an error status.", c.errors),
        ("backend_errors", "Requests to the storage backends that failed, for any reason.", c.backend_errors),
        (
            "media_errors",
            "Commands failed with a media error: the backend could not read or write the data.",
            c.media_errors,
        ),
        (
            "command_timeouts",
            "Commands completed with an error because their backend did not answer in time \
             (the namespace's timeout, or the bound on deleting a queue).",
            c.timeouts,
        ),
        (
            "doorbell_writes",
            "Doorbell register writes that trapped to the controller (a VM exit each), all \
             queues. With shadow doorbells most updates do not trap.",
            c.doorbell_writes,
        ),
        (
            "io_doorbell_writes",
            "Trapped doorbell writes to I/O queues only; divided by vnvme_io_commands_total, \
             the traps each I/O costs.",
            c.io_doorbell_writes,
        ),
        (
            "shadow_doorbell_reads",
            "Reads of the shadow doorbell buffer (Doorbell Buffer Config), which tell the \
             controller new queue tails and heads without a trap.",
            c.shadow_reads,
        ),
        (
            "eventidx_races",
            "Times the controller, about to stop polling a queue, found new work the host \
             posted meanwhile (the EventIdx re-check caught it; no I/O waits for a trap).",
            c.eventidx_races,
        ),
        ("interrupts", "Interrupts signalled to the guest, all queues.", c.interrupts),
    ];
    for (name, help, v) in counters {
        single(enc, name, help, ConstCounter::new(v))?;
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
mod tests {
    use std::io::Write;
    use std::path::PathBuf;
    use std::process::{Command, Stdio};

    use nvme_ctrl::{QueueSnapshot, StatsSnapshot, Verdict, LATENCY_BUCKETS};

    use super::*;
    use crate::metrics::NsScrape;

    /// A backend description with every character the format must escape.
    const AWKWARD_BACKEND: &str = "file:/srv/a \"b\"\\c.img\nnext";

    fn op(commands: u64, bytes: u64, errors: u64, buckets: &[(usize, u64)], sum_ns: u64) -> OpSnapshot {
        let mut latency = [0; LATENCY_BUCKETS];
        for &(i, n) in buckets {
            latency[i] = n;
        }
        OpSnapshot { commands, bytes, errors, latency, latency_sum_ns: sum_ns }
    }

    /// Two namespaces, two queues, one worker.
    fn fixture() -> Scrape {
        Scrape {
            version: "0.1.0".into(),
            commit: "0123456789ab".into(),
            serial: "VN0001".into(),
            state: "ready".into(),
            client_connected: true,
            dma_regions: 3,
            uptime_s: 42,
            controller: StatsSnapshot {
                admin_commands: 7,
                io_commands: 5,
                errors: 1,
                doorbell_writes: 9,
                io_doorbell_writes: 3,
                shadow_reads: 20,
                eventidx_races: 1,
                interrupts: 4,
                ..Default::default()
            },
            namespaces: vec![
                NsScrape {
                    nsid: 1,
                    size_bytes: 1 << 30,
                    lba_size: 512,
                    backend: "ram".into(),
                    stats: NsStatsSnapshot {
                        // 5 µs, 8 µs (first bucket) and 700 µs (the 1 ms bucket).
                        read: op(3, 12288, 1, &[(0, 2), (6, 1)], 713_000),
                        // 60 µs (the 100 µs bucket) and 20 s (above every bound).
                        write: op(2, 8192, 0, &[(3, 1), (19, 1)], 20_000_060_000),
                        throttled_commands: 4,
                        throttled_ns: 1_500_000_000,
                        ..Default::default()
                    },
                    storage: None,
                    ana: Some((1, "inaccessible")),
                },
                NsScrape {
                    nsid: 2,
                    size_bytes: 4 << 30,
                    lba_size: 4096,
                    backend: AWKWARD_BACKEND.into(),
                    stats: NsStatsSnapshot::default(),
                    // Waiting for its second outage; the first lasted 2.1 s.
                    storage: Some(StorageReport {
                        state: StorageState::Waiting,
                        waiting: 5,
                        outages: 2,
                        outages_past_hold: 0,
                        outage_buckets: [0, 0, 0, 0, 1, 0, 0, 0, 0],
                        outage_ms_sum: 2100,
                    }),
                    ana: None,
                },
            ],
            queues: vec![
                QueueSnapshot {
                    qid: 0,
                    worker: None,
                    commands: 7,
                    completions: 7,
                    interrupts: 1,
                    ..Default::default()
                },
                QueueSnapshot {
                    qid: 1,
                    worker: Some(0),
                    commands: 5,
                    sq_doorbell_writes: 2,
                    cq_doorbell_writes: 1,
                    completions: 5,
                    interrupts: 3,
                },
            ],
            workers: vec![WorkerScrape {
                index: 0,
                sleeps: 4,
                wakeups: 3,
                spin_hits: 10,
                spin_misses: 4,
                spin_contended: 1,
                spin_ns: 1_500_000_000,
                spin_lost_ns: 250_000_000,
            }],
            poll: Some(Verdict {
                choice: Regime::Sleep,
                running: Regime::Sleep,
                cost_ns: [Some(21_000), Some(52_500)],
                epochs: 120,
                changes: 1,
            }),
            pool: Some(crate::metrics::PoolScrape {
                capacity: 64 << 20,
                unallocated: 56 << 20,
                namespaces: 2,
                attached_here: 1,
            }),
        }
    }

    /// The value of the sample written exactly as `series` (name and labels).
    fn sample(text: &str, series: &str) -> Option<String> {
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ').map(str::to_owned))
    }

    #[test]
    fn exact_lines() {
        let text = render(&fixture());
        for line in [
            "# TYPE vnvme_info gauge",
            "vnvme_info{version=\"0.1.0\",commit=\"0123456789ab\",serial=\"VN0001\"} 1",
            "vnvme_controller_state{state=\"disabled\"} 0",
            "vnvme_controller_state{state=\"ready\"} 1",
            "vnvme_controller_state{state=\"shut-down\"} 0",
            "vnvme_controller_state{state=\"fatal\"} 0",
            "vnvme_client_connected 1",
            "vnvme_dma_regions 3",
            "vnvme_uptime_seconds 42",
            "# TYPE vnvme_admin_commands_total counter",
            "vnvme_admin_commands_total 7",
            "vnvme_command_errors_total 1",
            "vnvme_shadow_doorbell_reads_total 20",
            "vnvme_command_timeouts_total 0",
            "vnvme_namespace_size_bytes{nsid=\"2\"} 4294967296",
            "vnvme_pool_capacity_bytes 67108864",
            "vnvme_pool_unallocated_bytes 58720256",
            "vnvme_pool_namespaces{attached=\"any\"} 2",
            "vnvme_pool_namespaces{attached=\"here\"} 1",
            "vnvme_namespace_lba_bytes{nsid=\"1\"} 512",
            "vnvme_namespace_info{nsid=\"1\",backend=\"ram\"} 1",
            "vnvme_namespace_ana_state{nsid=\"1\",group=\"1\",state=\"optimized\"} 0",
            "vnvme_namespace_ana_state{nsid=\"1\",group=\"1\",state=\"inaccessible\"} 1",
            "vnvme_namespace_ana_state{nsid=\"1\",group=\"1\",state=\"change\"} 0",
            "vnvme_namespace_commands_total{nsid=\"1\",op=\"read\"} 3",
            "vnvme_namespace_bytes_total{nsid=\"1\",op=\"write\"} 8192",
            "vnvme_namespace_errors_total{nsid=\"1\",op=\"read\"} 1",
            "vnvme_namespace_commands_total{nsid=\"2\",op=\"other\"} 0",
            "# TYPE vnvme_namespace_latency_seconds histogram",
            "vnvme_namespace_latency_seconds_bucket{nsid=\"1\",op=\"read\",le=\"1e-05\"} 2",
            "vnvme_namespace_latency_seconds_bucket{nsid=\"1\",op=\"read\",le=\"0.0005\"} 2",
            "vnvme_namespace_latency_seconds_bucket{nsid=\"1\",op=\"read\",le=\"0.001\"} 3",
            "vnvme_namespace_latency_seconds_bucket{nsid=\"1\",op=\"write\",le=\"10\"} 1",
            "vnvme_namespace_latency_seconds_bucket{nsid=\"1\",op=\"write\",le=\"+Inf\"} 2",
            "vnvme_namespace_latency_seconds_sum{nsid=\"1\",op=\"read\"} 0.000713",
            "vnvme_namespace_latency_seconds_count{nsid=\"1\",op=\"read\"} 3",
            "vnvme_namespace_qos_throttled_commands_total{nsid=\"1\"} 4",
            "vnvme_namespace_qos_throttled_seconds_total{nsid=\"1\"} 1.5",
            "# TYPE vnvme_namespace_storage_state gauge",
            "vnvme_namespace_storage_state{nsid=\"2\",state=\"up\"} 0",
            "vnvme_namespace_storage_state{nsid=\"2\",state=\"waiting\"} 1",
            "vnvme_namespace_storage_state{nsid=\"2\",state=\"gone\"} 0",
            "vnvme_namespace_storage_waiting_commands{nsid=\"2\"} 5",
            "vnvme_namespace_storage_outages_total{nsid=\"2\"} 2",
            "vnvme_namespace_storage_outages_past_hold_total{nsid=\"2\"} 0",
            "vnvme_namespace_storage_outage_seconds_bucket{nsid=\"2\",le=\"2\"} 0",
            "vnvme_namespace_storage_outage_seconds_bucket{nsid=\"2\",le=\"5\"} 1",
            "vnvme_namespace_storage_outage_seconds_bucket{nsid=\"2\",le=\"+Inf\"} 1",
            "vnvme_namespace_storage_outage_seconds_sum{nsid=\"2\"} 2.1",
            "vnvme_namespace_storage_outage_seconds_count{nsid=\"2\"} 1",
            "vnvme_queue_commands_total{qid=\"0\",worker=\"controller\"} 7",
            "vnvme_queue_sq_doorbell_writes_total{qid=\"1\",worker=\"0\"} 2",
            "vnvme_queue_interrupts_total{qid=\"1\",worker=\"0\"} 3",
            "vnvme_worker_sleeps_total{worker=\"0\"} 4",
            "vnvme_worker_spin_seconds_total{worker=\"0\"} 1.5",
            "vnvme_worker_spin_lost_seconds_total{worker=\"0\"} 0.25",
            "# TYPE vnvme_adaptive_poll_spinning gauge",
            "vnvme_adaptive_poll_spinning 0",
            "vnvme_adaptive_poll_cpu_per_command_seconds{regime=\"sleep\"} 0.000021",
            "vnvme_adaptive_poll_cpu_per_command_seconds{regime=\"spin\"} 0.0000525",
            "vnvme_adaptive_poll_epochs_total 120",
            "vnvme_adaptive_poll_choice_changes_total 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing line {line:?} in:\n{text}");
        }
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn label_values_are_escaped() {
        let text = render(&fixture());
        let want = r#"vnvme_namespace_info{nsid="2",backend="file:/srv/a \"b\"\\c.img\nnext"} 1"#;
        assert!(text.lines().any(|l| l == want), "no {want} in:\n{text}");
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_end_at_the_count() {
        let s = fixture();
        let text = render(&s);
        for ns in &s.namespaces {
            for (name, of) in OPS {
                let labels = format!("nsid=\"{}\",op=\"{name}\"", ns.nsid);
                let prefix = format!("vnvme_namespace_latency_seconds_bucket{{{labels},le=");
                let buckets: Vec<(String, u64)> = text
                    .lines()
                    .filter_map(|l| l.strip_prefix(&prefix))
                    .map(|rest| {
                        let (le, v) = rest.split_once("} ").expect("le and value");
                        (le.trim_matches('"').to_owned(), v.parse().expect("an integer"))
                    })
                    .collect();
                assert_eq!(buckets.len(), LATENCY_BUCKETS, "{labels}");
                assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "not cumulative: {buckets:?}");
                let (last_le, inf) = buckets.last().expect("buckets").clone();
                assert_eq!(last_le, "+Inf");
                let count = sample(&text, &format!("vnvme_namespace_latency_seconds_count{{{labels}}}"));
                assert_eq!(count, Some(inf.to_string()), "{labels}: +Inf must equal _count");
                assert_eq!(inf, of(&ns.stats).commands, "{labels}");
            }
        }
    }

    #[test]
    fn every_family_has_help_then_type_and_every_sample_a_family() {
        let text = render(&fixture());
        let lines: Vec<&str> = text.lines().collect();
        let mut families = Vec::new();
        for (i, l) in lines.iter().enumerate() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                let (name, _) = rest.split_once(' ').expect("name and type");
                let help = lines[i - 1].strip_prefix("# HELP ").expect("HELP before TYPE");
                assert!(help.starts_with(&format!("{name} ")) && help.len() > name.len() + 20, "{help}");
                families.push(name.to_owned());
            }
        }
        assert_eq!(families.len(), 50, "{families:?}");
        for l in lines.iter().filter(|l| !l.starts_with('#')) {
            let name = l.split(['{', ' ']).next().expect("a name");
            let base = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s));
            assert!(
                families.iter().any(|f| f == name || Some(f.as_str()) == base),
                "{name} has no HELP/TYPE"
            );
        }
    }

    /// promtool on PATH, or where scripts/lib/promtool.sh keeps it.
    fn promtool() -> Option<PathBuf> {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let cache = std::env::var_os("VNVME_CACHE")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/vnvme")))
            .map(|c| c.join("promtool/bin/promtool"));
        std::env::split_paths(&path).map(|d| d.join("promtool")).chain(cache).find(|p| p.is_file())
    }

    #[test]
    fn promtool_check_metrics_accepts_it() {
        let Some(promtool) = promtool() else {
            test_util::skip(
                "promtool not found on PATH or in the vnvme cache, so the exposition text was not \
                 validated by Prometheus's own checker; `bash scripts/lib/promtool.sh` fetches it \
                 (Debian's prometheus package, downloaded, not installed)",
            );
            return;
        };
        let empty = Scrape { state: "disabled".into(), ..Default::default() };
        for s in [fixture(), empty] {
            let text = render(&s);
            let mut child = Command::new(&promtool)
                .args(["check", "metrics"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("run promtool");
            child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write to promtool");
            let out = child.wait_with_output().expect("promtool exits");
            assert!(
                out.status.success(),
                "promtool check metrics refused:\n{}{}\n--- the text:\n{text}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            println!("promtool ({}) accepted {} lines", promtool.display(), text.lines().count());
        }
    }
}
