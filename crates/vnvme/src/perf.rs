//! `vnvme perf`: a load generator over the userspace NVMe driver and a vfio-user
//! device. One thread per I/O queue, each owning its queue and keeping `qd` commands
//! in flight; latency in a log-linear histogram; client CPU time from
//! CLOCK_PROCESS_CPUTIME_ID (user + system, what getrusage sums, at ns resolution);
//! optionally the server's counters from its `--stats-file`, read before and after,
//! and the server's CPU time from `/proc/<pid>/stat` (`--server-pid`) over the same
//! window as the client's.
//!
//! `--in-process` runs the controller in this process instead (the driver's
//! `InProcessTransport`: no socket, no second process), the ceiling a vfio-user
//! transport can approach. Its "server" counters come straight from the controller and
//! its "server" CPU is that of the controller's I/O worker threads (`vnvme-q*`), the
//! client's the rest of the process.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvme_ctrl::{ControllerConfig, NamespaceConfig, PollMode, Stats};
use nvme_driver::{
    CompletionMode, DoorbellMode, DriverOptions, InProcessOptions, InProcessTransport, IoCommand, IoQueue,
    NvmeDriver, QueueStats, Transport, VfioUserOptions, VfioUserTransport,
};
use serde_json::json;

use crate::nsspec::NsSpec;

mod histogram;
pub use histogram::Histogram;

/// Access pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    RandRead,
    RandWrite,
    Read,
    Write,
    RandRw,
}

impl std::str::FromStr for Workload {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "randread" => Workload::RandRead,
            "randwrite" => Workload::RandWrite,
            "read" => Workload::Read,
            "write" => Workload::Write,
            "randrw" => Workload::RandRw,
            _ => return Err(format!("unknown --rw {s:?} (randread, randwrite, read, write, randrw)")),
        })
    }
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::RandRead => "randread",
            Workload::RandWrite => "randwrite",
            Workload::Read => "read",
            Workload::Write => "write",
            Workload::RandRw => "randrw",
        }
    }
    fn random(self) -> bool {
        matches!(self, Workload::RandRead | Workload::RandWrite | Workload::RandRw)
    }
}

/// How doorbells are rung: the transport's mode plus shadow doorbells on or off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Doorbells {
    /// Posted REGION_WRITE per doorbell, no shadow buffer.
    Trapped,
    /// Shadow doorbells + EventIdx; trapped writes only when EventIdx asks.
    Shadow,
    /// REGION_WRITE waiting for the reply, no shadow buffer.
    Sync,
    /// An ioeventfd per doorbell, values in the shadow buffer.
    EventFd,
    /// Stores into the server's mmapped doorbell page.
    Mapped,
}

impl std::str::FromStr for Doorbells {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "trapped" => Doorbells::Trapped,
            "shadow" => Doorbells::Shadow,
            "sync" => Doorbells::Sync,
            "eventfd" => Doorbells::EventFd,
            "mapped" => Doorbells::Mapped,
            _ => return Err(format!("unknown --doorbells {s:?} (trapped, shadow, sync, eventfd, mapped)")),
        })
    }
}

impl Doorbells {
    fn name(self) -> &'static str {
        match self {
            Doorbells::Trapped => "trapped",
            Doorbells::Shadow => "shadow",
            Doorbells::Sync => "sync",
            Doorbells::EventFd => "eventfd",
            Doorbells::Mapped => "mapped",
        }
    }
    fn transport(self) -> (DoorbellMode, bool) {
        match self {
            Doorbells::Trapped => (DoorbellMode::Trapped, false),
            Doorbells::Shadow => (DoorbellMode::Trapped, true),
            Doorbells::Sync => (DoorbellMode::Sync, false),
            Doorbells::EventFd => (DoorbellMode::EventFd, true),
            Doorbells::Mapped => (DoorbellMode::Mapped, false),
        }
    }
}

/// `poll` or `irq`.
fn parse_completion(s: &str) -> Result<CompletionMode, String> {
    match s {
        "poll" => Ok(CompletionMode::Polling),
        "irq" => Ok(CompletionMode::Interrupts),
        _ => Err(format!("unknown --completion {s:?} (poll, irq)")),
    }
}

/// `5s`, `300ms`, `2m`, or plain seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mul_ms) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1000.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000.0)
    } else {
        (s, 1000.0)
    };
    let v: f64 = num.parse().map_err(|_| format!("bad duration {s:?} (e.g. 5s, 300ms)"))?;
    if !(v > 0.0 && v.is_finite()) {
        return Err(format!("duration {s:?} must be positive"));
    }
    Ok(Duration::from_secs_f64(v * mul_ms / 1000.0))
}

/// Where the controller is.
#[derive(Debug, Clone)]
pub enum Target {
    /// A vfio-user server on this socket.
    Socket(PathBuf),
    /// A controller in this process with these namespaces, workers and polling.
    InProcess { namespaces: Vec<NsSpec>, workers: usize, poll: PollMode },
}

/// The arguments that choose the [`Target`]: a server's socket, or a controller in
/// this process and its knobs.
#[derive(Debug, Clone, clap::Args)]
pub struct TargetArgs {
    /// UNIX socket of the vfio-user server.
    #[arg(long, required_unless_present = "in_process", conflicts_with = "in_process")]
    pub socket: Option<PathBuf>,
    /// Run the controller in this process (the driver's in-process transport):
    /// doorbells are function calls (--doorbells trapped or shadow).
    #[arg(long)]
    pub in_process: bool,
    /// --in-process namespaces, as `vnvme serve --ns` takes them [default:
    /// null:64G:lba=4096].
    #[arg(long = "in-process-ns")]
    pub in_process_ns: Vec<NsSpec>,
    /// --in-process: controller I/O worker threads, as `vnvme serve --workers`
    /// [default: 1].
    #[arg(long)]
    pub workers: Option<usize>,
    /// --in-process: how idle workers wait, as `vnvme serve --poll` [default:
    /// adaptive].
    #[arg(long)]
    pub poll: Option<PollMode>,
}

impl TargetArgs {
    /// The target these arguments name, with the in-process defaults filled in;
    /// in-process knobs without `--in-process` are an error.
    pub fn resolve(&self) -> Result<Target, String> {
        let in_process_knobs =
            self.workers.is_some() || self.poll.is_some() || !self.in_process_ns.is_empty();
        match &self.socket {
            Some(_) if in_process_knobs => {
                Err("--workers, --poll and --in-process-ns need --in-process".into())
            }
            Some(s) => Ok(Target::Socket(s.clone())),
            None if !self.in_process => Err("perf needs --socket or --in-process".into()),
            None if self.workers.unwrap_or(1) > 64 => Err("--in-process: --workers must be 0..=64".into()),
            None => Ok(Target::InProcess {
                namespaces: if self.in_process_ns.is_empty() {
                    vec!["null:64G:lba=4096".parse().expect("valid default namespace")]
                } else {
                    self.in_process_ns.clone()
                },
                workers: self.workers.unwrap_or(1),
                poll: self.poll.unwrap_or_default(),
            }),
        }
    }
}

/// `vnvme perf`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct PerfArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// randread, randwrite, read, write or randrw.
    #[arg(long, default_value = "randread")]
    pub rw: Workload,
    /// Read percentage for randrw.
    #[arg(long, default_value_t = 70)]
    pub mix: u8,
    /// Block size per I/O (e.g. 4k, 128k).
    #[arg(long, default_value = "4k", value_parser = crate::nsspec::parse_size)]
    pub bs: u64,
    /// Commands in flight per queue.
    #[arg(long, default_value_t = 16)]
    pub qd: u16,
    /// I/O queue pairs, one thread each.
    #[arg(long, default_value_t = 1)]
    pub queues: u16,
    /// How long to run (e.g. 5s, 500ms).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub runtime: Duration,
    /// Namespace ID.
    #[arg(long = "ns", default_value_t = 1)]
    pub nsid: u32,
    /// trapped, shadow (EventIdx), sync, eventfd or mapped.
    #[arg(long, default_value = "shadow")]
    pub doorbells: Doorbells,
    /// poll (spin on the CQ) or irq (sleep on the MSI-X eventfd).
    #[arg(long, default_value = "poll", value_parser = parse_completion)]
    pub completion: CompletionMode,
    /// Write the results and every knob as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The server's --stats-file, read before and after the run.
    #[arg(long)]
    pub server_stats: Option<PathBuf>,
    /// The server's process ID: report its CPU time (/proc/PID/stat utime+stime)
    /// over the run, per I/O.
    #[arg(long)]
    pub server_pid: Option<u32>,
}

#[derive(Debug, Default)]
struct ThreadResult {
    hist: Histogram,
    reads: u64,
    writes: u64,
    bytes: u64,
    errors: u64,
    first_error: Option<String>,
    stats: QueueStats,
}

/// xorshift64*: cheap, deterministic per thread.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn drive(mut q: IoQueue, a: &PerfArgs, lba: u64, blocks: u64, deadline: Instant) -> (IoQueue, ThreadResult) {
    let mut r = ThreadResult::default();
    let nlb = (a.bs / lba) as u32;
    let slots = (blocks / nlb as u64).max(1);
    // Each queue works its own share of the namespace for sequential patterns.
    let share = (slots / a.queues as u64).max(1);
    let mut seq = (q.qid() as u64 - 1) * share;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (q.qid() as u64) << 32 | 1);
    let mut bufs = Vec::new();
    for _ in 0..a.qd {
        match q.alloc_buf(a.bs) {
            Ok(b) => {
                let _ = b.fill(0xa5);
                bufs.push(b);
            }
            Err(e) => {
                r.errors += 1;
                r.first_error = Some(e.to_string());
                return (q, r);
            }
        }
    }
    let mut started = vec![Instant::now(); q.depth() as usize + 1];
    let mut done = Vec::with_capacity(a.qd as usize);
    let mut inflight = 0usize;
    loop {
        let now = Instant::now();
        let stop = now >= deadline;
        while !stop && inflight < a.qd as usize {
            let Some(buf) = bufs.pop() else { break };
            let slot = if a.rw.random() {
                rng.next() % slots
            } else {
                seq = (seq + 1) % slots;
                seq
            };
            let slba = slot * nlb as u64;
            let read = match a.rw {
                Workload::RandRead | Workload::Read => true,
                Workload::RandWrite | Workload::Write => false,
                Workload::RandRw => rng.next() % 100 < a.mix as u64,
            };
            let cmd = if read {
                IoCommand::Read { nsid: a.nsid, slba, nlb, buf }
            } else {
                IoCommand::Write { nsid: a.nsid, slba, nlb, buf, fua: false }
            };
            let t0 = Instant::now();
            match q.submit(cmd) {
                Ok(cid) => {
                    started[cid as usize] = t0;
                    inflight += 1;
                }
                Err(e) => {
                    r.errors += 1;
                    r.first_error.get_or_insert(e.to_string());
                    break;
                }
            }
        }
        if inflight == 0 {
            break;
        }
        done.clear();
        if let Err(e) = q.wait_completions(&mut done) {
            r.errors += 1;
            r.first_error.get_or_insert(e.to_string());
            break;
        }
        let t1 = Instant::now();
        for c in done.drain(..) {
            inflight -= 1;
            r.hist.record((t1 - started[c.cid as usize]).as_nanos() as u64);
            if c.opcode == nvme_spec::opcode::nvm::READ {
                r.reads += 1;
            } else {
                r.writes += 1;
            }
            r.bytes += a.bs;
            let ok = c.status.is_success();
            if !ok {
                r.errors += 1;
                r.first_error.get_or_insert(format!("status {:?}", c.status));
            }
            if let Some(b) = c.buf {
                bufs.push(b);
            }
        }
    }
    r.stats = q.stats();
    (q, r)
}

fn cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// `/proc/<pid>/stat` and `/proc/self/task/<tid>/stat` count CPU time in USER_HZ
/// ticks, which Linux fixes at 100 on every architecture for this interface.
const USER_HZ: f64 = 100.0;

/// utime + stime of a process (all its threads) or a task, in seconds.
fn proc_cpu(stat_path: &Path) -> Option<f64> {
    let s = std::fs::read_to_string(stat_path).ok()?;
    // The command name may contain spaces and parentheses: fields resume after the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ... utime(14) stime(15), i.e. indices 11 and 12 here.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / USER_HZ)
}

/// CPU seconds of this process's controller worker threads (`vnvme-q*`, in-process).
fn worker_threads_cpu() -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return 0.0 };
    dir.filter_map(|e| e.ok())
        .filter(|e| {
            std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim_end().starts_with("vnvme-q"))
        })
        .filter_map(|e| proc_cpu(&e.path().join("stat")))
        .sum()
}

fn read_server_stats(p: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok()
}

/// Server counters once they include `ios` more I/O commands than `before` (the
/// server rewrites its stats file twice a second; bounded wait).
fn server_stats_after(p: &Path, before: &serde_json::Value, ios: u64) -> Option<serde_json::Value> {
    let want = before["io_commands"].as_u64().unwrap_or(0) + ios;
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let v = read_server_stats(p);
        if let Some(v) = &v {
            if v["io_commands"].as_u64().unwrap_or(0) >= want {
                return Some(v.clone());
            }
        }
        if Instant::now() >= deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn machine() -> serde_json::Value {
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    json!({
        "cpu": cpu,
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "kernel": read("/proc/sys/kernel/osrelease"),
        "vnvme": env!("CARGO_PKG_VERSION"),
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
    })
}

pub fn run(a: PerfArgs) -> Result<(), Box<dyn std::error::Error>> {
    let target = a.target.resolve()?;
    if a.qd == 0 || a.queues == 0 || a.mix > 100 || a.bs == 0 {
        return Err("--qd and --queues must be at least 1, --mix 0..=100, --bs non-zero".into());
    }
    let (mode, shadow) = a.doorbells.transport();
    let (t, ctrl_stats): (Box<dyn Transport>, Option<Arc<Stats>>) = match &target {
        Target::Socket(socket) => (
            Box::new(VfioUserTransport::connect(
                socket,
                VfioUserOptions { doorbells: mode, ..Default::default() },
            )?),
            None,
        ),
        Target::InProcess { namespaces, workers, poll } => {
            if !matches!(a.doorbells, Doorbells::Trapped | Doorbells::Shadow) {
                return Err(format!(
                    "--in-process: --doorbells {} needs a vfio-user server; doorbells here are function calls \
                     (trapped, or shadow with EventIdx)",
                    a.doorbells.name()
                )
                .into());
            }
            if a.server_stats.is_some() || a.server_pid.is_some() {
                return Err("--in-process: --server-stats and --server-pid need a server process".into());
            }
            let cfg = ControllerConfig {
                namespaces: namespaces
                    .iter()
                    .map(|s| {
                        let o = s.open()?;
                        Ok(NamespaceConfig { backend: o.backend, lba_format: o.lba_format })
                    })
                    .collect::<std::io::Result<_>>()?,
                ..Default::default()
            };
            let t = InProcessTransport::new(cfg, InProcessOptions { workers: *workers, poll: *poll })?;
            let stats = t.stats_handle();
            (Box::new(t), Some(stats))
        }
    };
    let list_pages = a.bs.div_ceil(4096) / 511 + 1;
    let opts = DriverOptions {
        io_queues: a.queues,
        // Queues as deep as Linux makes them (1024, capped by CAP.MQES), whatever the
        // QD: a CQ's head doorbell traps about once per wrap with shadow doorbells.
        queue_size: (a.qd as u32 + 1).max(1024).min(u16::MAX as u32) as u16,
        shadow_doorbells: shadow,
        completion: a.completion,
        pool_bytes: (a.qd as u64 * (a.bs.next_multiple_of(4096) + list_pages * 4096))
            .next_multiple_of(2 << 20)
            + (2 << 20),
        timeout: Duration::from_secs(10),
    };
    let mut d = NvmeDriver::new(t, opts)?;
    if shadow && !d.shadow_doorbells() {
        return Err("--doorbells shadow: the controller does not offer Doorbell Buffer Config".into());
    }
    if d.io_queue_count() < a.queues {
        return Err(
            format!("the controller granted {} I/O queues, {} wanted", d.io_queue_count(), a.queues).into()
        );
    }
    let ns = d.namespace(a.nsid).ok_or_else(|| format!("no namespace {}", a.nsid))?.clone();
    let (lba, blocks) = (ns.lba_size(), ns.blocks());
    if !a.bs.is_multiple_of(lba) || a.bs / lba > 65536 {
        return Err(
            format!("--bs {} is not a multiple of the {lba}-byte LBA (at most 65536 blocks)", a.bs).into()
        );
    }
    if d.controller().mdts_bytes.is_some_and(|m| a.bs > m) {
        return Err(format!("--bs {} exceeds MDTS ({:?} bytes)", a.bs, d.controller().mdts_bytes).into());
    }
    let transport = d.describe_transport();
    let server_before = a.server_stats.as_deref().and_then(read_server_stats);
    let ctrl_before = ctrl_stats.as_ref().map(|s| s.snapshot());
    let server_stat_path = a.server_pid.map(|p| PathBuf::from(format!("/proc/{p}/stat")));
    let queues = d.take_queues();
    let server_cpu0 = server_stat_path.as_deref().and_then(proc_cpu);
    let workers_cpu0 = worker_threads_cpu();
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    let deadline = t0 + a.runtime;
    let results: Vec<(IoQueue, ThreadResult)> = std::thread::scope(|s| {
        let hs: Vec<_> = queues
            .into_iter()
            .map(|q| {
                let a = &a;
                std::thread::Builder::new()
                    .name(format!("perf-q{}", q.qid()))
                    .spawn_scoped(s, move || drive(q, a, lba, blocks, deadline))
                    .expect("spawn perf thread")
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("perf thread")).collect()
    });
    let elapsed = t0.elapsed();
    let process_cpu = cpu_time() - cpu0;
    let server_cpu1 = server_stat_path.as_deref().and_then(proc_cpu);
    // In-process, the controller's workers are ours: split them out as the "server".
    let workers_cpu = if ctrl_stats.is_some() { (worker_threads_cpu() - workers_cpu0).max(0.0) } else { 0.0 };
    let cpu = process_cpu.saturating_sub(Duration::from_secs_f64(workers_cpu));
    let ctrl_after = ctrl_stats.as_ref().map(|s| s.snapshot());
    let mut hist = Histogram::default();
    let (mut reads, mut writes, mut bytes, mut errors) = (0, 0, 0, 0);
    let mut first_error = None;
    let (mut sq_db, mut cq_db, mut wakeups) = (0, 0, 0);
    for (q, r) in results {
        hist.merge(&r.hist);
        reads += r.reads;
        writes += r.writes;
        bytes += r.bytes;
        errors += r.errors;
        first_error = first_error.or(r.first_error);
        sq_db += r.stats.sq_doorbell_writes;
        cq_db += r.stats.cq_doorbell_writes;
        wakeups += r.stats.interrupt_wakeups;
        d.return_queue(q);
    }
    // A normal shutdown before going away (what Linux does), so the controller is idle
    // when the connection and its DMA mappings go.
    if let Err(e) = d.shutdown() {
        eprintln!("vnvme perf: controller shutdown: {e}");
    }
    let ios = reads + writes;
    let secs = elapsed.as_secs_f64();
    let per_io = |n: u64| if ios == 0 { 0.0 } else { n as f64 / ios as f64 };
    let us = |ns: u64| ns as f64 / 1000.0;
    let iops = ios as f64 / secs;
    let mbps = bytes as f64 / secs / 1e6;
    let cpu_us_per_io = if ios == 0 { 0.0 } else { cpu.as_secs_f64() * 1e6 / ios as f64 };

    let counters = |source: serde_json::Value, delta: &dyn Fn(&str) -> u64| {
        let (sio, sdb, sirq) = (delta("io_commands"), delta("io_doorbell_writes"), delta("interrupts"));
        let per = |n: u64| if sio == 0 { 0.0 } else { n as f64 / sio as f64 };
        json!({
            "source": source,
            "io_commands": sio,
            "io_doorbell_writes": sdb,
            "interrupts": sirq,
            "shadow_reads": delta("shadow_reads"),
            "eventidx_races": delta("eventidx_races"),
            "trapped_doorbells_per_io": per(sdb),
            "interrupts_per_io": per(sirq),
        })
    };
    let mut server = match (&a.server_stats, &server_before, ctrl_before, ctrl_after) {
        (_, _, Some(b), Some(f)) => {
            let field = |s: &nvme_ctrl::StatsSnapshot, k: &str| match k {
                "io_commands" => s.io_commands,
                "io_doorbell_writes" => s.io_doorbell_writes,
                "interrupts" => s.interrupts,
                "shadow_reads" => s.shadow_reads,
                "eventidx_races" => s.eventidx_races,
                _ => 0,
            };
            Some(counters(json!("in-process controller"), &|k| field(&f, k).saturating_sub(field(&b, k))))
        }
        (Some(p), Some(before), _, _) => server_stats_after(p, before, ios).map(|after| {
            counters(json!(p), &|k| {
                after[k].as_u64().unwrap_or(0).saturating_sub(before[k].as_u64().unwrap_or(0))
            })
        }),
        (Some(p), None, _, _) => {
            eprintln!("vnvme perf: cannot read server stats from {}", p.display());
            None
        }
        _ => None,
    };
    // Server CPU over the same window as the client's: the server process, or the
    // controller's worker threads in-process.
    let server_cpu_s = match (server_cpu0, server_cpu1) {
        (Some(b), Some(f)) => Some(f - b),
        _ if ctrl_stats.is_some() => Some(workers_cpu),
        _ => None,
    };
    if let Some(c) = server_cpu_s {
        let v = server.get_or_insert_with(|| json!({}));
        v["cpu_s"] = json!(c);
        v["cpu_us_per_io"] = json!(if ios == 0 { 0.0 } else { c * 1e6 / ios as f64 });
        v["cpu_source"] = json!(match a.server_pid {
            Some(p) => format!("/proc/{p}/stat utime+stime (USER_HZ {USER_HZ})"),
            None => format!("/proc/self/task/*/stat of vnvme-q* threads (USER_HZ {USER_HZ})"),
        });
    }

    println!(
        "vnvme perf: {} | rw={} mix={} bs={} qd={} queues={} runtime={:?} ns={} doorbells={} completion={}",
        transport,
        a.rw.name(),
        a.mix,
        a.bs,
        a.qd,
        a.queues,
        a.runtime,
        a.nsid,
        a.doorbells.name(),
        if a.completion == CompletionMode::Polling { "poll" } else { "irq" }
    );
    println!("  IOPS {iops:.0}  MB/s {mbps:.1}  ({ios} I/Os: {reads} reads, {writes} writes, in {secs:.2} s; {errors} errors)");
    println!(
        "  latency us: mean {:.1}  p50 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
        hist.mean() / 1000.0,
        us(hist.quantile(0.5)),
        us(hist.quantile(0.99)),
        us(hist.quantile(0.999)),
        us(hist.max())
    );
    println!(
        "  client CPU: {:.2} s = {:.0} % of one core, {cpu_us_per_io:.2} us per I/O",
        cpu.as_secs_f64(),
        cpu.as_secs_f64() / secs * 100.0
    );
    println!(
        "  driver: SQ doorbell writes {:.4}/IO, CQ head doorbell writes {:.4}/IO, interrupt wakeups {:.4}/IO",
        per_io(sq_db),
        per_io(cq_db),
        per_io(wakeups)
    );
    if let Some(s) = server.as_ref().filter(|s| s.get("io_commands").is_some()) {
        println!(
            "  server: trapped I/O doorbells {:.4}/IO, interrupts {:.4}/IO ({} I/O commands counted)",
            s["trapped_doorbells_per_io"].as_f64().unwrap_or(0.0),
            s["interrupts_per_io"].as_f64().unwrap_or(0.0),
            s["io_commands"]
        );
    }
    if let Some(c) = server_cpu_s {
        println!(
            "  server CPU: {c:.2} s = {:.0} % of one core, {:.2} us per I/O{}",
            c / secs * 100.0,
            if ios == 0 { 0.0 } else { c * 1e6 / ios as f64 },
            if ctrl_stats.is_some() { " (in-process worker threads; client CPU excludes them)" } else { "" }
        );
    }
    if let Some(e) = &first_error {
        eprintln!("vnvme perf: first error: {e}");
    }
    if let Some(p) = &a.json {
        let v = json!({
            "tool": "vnvme perf",
            "machine": machine(),
            "transport": transport,
            "knobs": {
                "target": match &target {
                    Target::Socket(p) => json!({ "socket": p }),
                    Target::InProcess { namespaces, workers, poll } => json!({
                        "in_process": true,
                        "namespaces": namespaces
                            .iter()
                            .map(|n| json!({ "kind": n.describe(), "bytes": n.size, "lba_format": n.lba_format }))
                            .collect::<Vec<_>>(),
                        "workers": workers,
                        "poll": format!("{poll:?}").to_lowercase(),
                    }),
                },
                "rw": a.rw.name(),
                "mix_read_percent": a.mix,
                "bs": a.bs,
                "qd": a.qd,
                "queues": a.queues,
                "runtime_s": a.runtime.as_secs_f64(),
                "nsid": a.nsid,
                "lba_size": lba,
                "doorbells": a.doorbells.name(),
                "shadow_doorbells": shadow,
                "completion": if a.completion == CompletionMode::Polling { "poll" } else { "irq" },
                "threads": "one per queue",
            },
            "results": {
                "elapsed_s": secs,
                "ios": ios,
                "reads": reads,
                "writes": writes,
                "errors": errors,
                "iops": iops,
                "mb_per_s": mbps,
                "latency_us": {
                    "mean": hist.mean() / 1000.0,
                    "p50": us(hist.quantile(0.5)),
                    "p99": us(hist.quantile(0.99)),
                    "p99_9": us(hist.quantile(0.999)),
                    "max": us(hist.max()),
                },
                "client_cpu_s": cpu.as_secs_f64(),
                "process_cpu_s": process_cpu.as_secs_f64(),
                "client_cpu_us_per_io": cpu_us_per_io,
                "driver_sq_doorbell_writes_per_io": per_io(sq_db),
                "driver_cq_doorbell_writes_per_io": per_io(cq_db),
                "interrupt_wakeups_per_io": per_io(wakeups),
            },
            "server": server,
        });
        std::fs::write(p, serde_json::to_string_pretty(&v)? + "\n")?;
    }
    if errors > 0 {
        return Err(format!("{errors} I/O errors").into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_knobs() {
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("300ms").unwrap(), Duration::from_millis(300));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert!(parse_duration("-1s").is_err());
        assert_eq!("randrw".parse::<Workload>().unwrap(), Workload::RandRw);
        assert!("sideways".parse::<Workload>().is_err());
        assert_eq!("shadow".parse::<Doorbells>().unwrap().transport(), (DoorbellMode::Trapped, true));
        assert!(parse_completion("irq").is_ok() && parse_completion("x").is_err());
    }

    fn target(args: &[&str]) -> Result<Target, String> {
        #[derive(clap::Parser)]
        struct Perf {
            #[command(flatten)]
            a: PerfArgs,
        }
        let p = <Perf as clap::Parser>::try_parse_from(std::iter::once("perf").chain(args.iter().copied()))
            .map_err(|e| e.kind().to_string())?;
        p.a.target.resolve()
    }

    #[test]
    fn target_is_a_socket_or_in_process() {
        assert!(matches!(target(&["--socket", "s"]), Ok(Target::Socket(_))));
        let Ok(Target::InProcess { namespaces, workers: 1, poll: PollMode::Adaptive }) =
            target(&["--in-process"])
        else {
            panic!("in-process defaults")
        };
        assert_eq!(namespaces.len(), 1);
        assert!(matches!(
            target(&["--in-process", "--workers", "0"]),
            Ok(Target::InProcess { workers: 0, .. })
        ));
        assert!(target(&["--in-process", "--workers", "65"]).is_err());
        assert!(target(&["--socket", "s", "--workers", "2"]).is_err());
        assert!(target(&["--socket", "s", "--in-process"]).is_err());
        assert!(target(&[]).is_err());
    }
}
