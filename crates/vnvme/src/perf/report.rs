//! What `perf` tells: a few lines on stdout, and with `--json` every figure next to
//! every knob and the machine, so that a number can be run again.

use std::io::Write;
use std::time::Duration;

use nvme_driver::CompletionMode;
use serde_json::{json, Value};

use super::args::{PerfArgs, Target};
use super::load::Totals;
use super::measure::{CpuUse, ServerCpu};

/// What a run measured.
pub(super) struct Outcome {
    /// The driver's description of its transport.
    pub transport: String,
    /// The namespace's LBA size in bytes.
    pub lba: u64,
    /// Whether shadow doorbells were on.
    pub shadow: bool,
    /// How doorbells were written (what `--doorbells auto` settled on).
    pub doorbells: super::knobs::Doorbells,
    pub totals: Totals,
    pub elapsed: Duration,
    pub cpu: CpuUse,
    /// How the controller's counters moved (see `Counters::delta`).
    pub counters: Option<Value>,
    /// The signal that stopped the run before its deadline (the figures are for
    /// the time it ran).
    pub interrupted_by: Option<&'static str>,
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn completion_name(c: CompletionMode) -> &'static str {
    if c == CompletionMode::Polling {
        "poll"
    } else {
        "irq"
    }
}

impl Outcome {
    fn secs(&self) -> f64 {
        self.elapsed.as_secs_f64()
    }

    fn iops(&self) -> f64 {
        self.totals.ios() as f64 / self.secs()
    }

    fn mbps(&self) -> f64 {
        self.totals.bytes as f64 / self.secs() / 1e6
    }

    /// Microseconds of `cpu_s` CPU seconds per I/O.
    fn cpu_us_per_io(&self, cpu_s: f64) -> f64 {
        let ios = self.totals.ios();
        if ios == 0 {
            0.0
        } else {
            cpu_s * 1e6 / ios as f64
        }
    }

    /// The server's counters and CPU time over the same window as the client's: the
    /// server process, or the controller's worker threads in-process.
    fn server(&self) -> Option<Value> {
        let mut server = self.counters.clone();
        if let Some(c) = self.cpu.server {
            let v = server.get_or_insert_with(|| json!({}));
            v["cpu_s"] = json!(c.seconds());
            v["cpu_us_per_io"] = json!(self.cpu_us_per_io(c.seconds()));
            v["cpu_source"] = json!(c.source());
        }
        server
    }

    /// Writes the results for people to `out` (the first error to stderr).
    pub(super) fn print(&self, a: &PerfArgs, out: &mut dyn Write) -> std::io::Result<()> {
        let t = &self.totals;
        let (ios, secs) = (t.ios(), self.secs());
        let client_cpu = self.cpu.client.as_secs_f64();
        writeln!(
                out,
            "vnvme perf: {} | rw={} mix={} bs={} qd={} queues={} runtime={}s nsid={} doorbells={} completion={}",
            self.transport,
            a.rw.name(),
            a.mix,
            a.bs,
            a.qd,
            a.queues,
            a.runtime.as_secs_f64(),
            a.nsid,
            self.doorbells.name(),
            completion_name(a.completion)
        )?;
        if let Some(name) = self.interrupted_by {
            writeln!(
                out,
                "  INTERRUPTED by {name} after {secs:.2} s of the {} s asked: the figures are for the time it ran",
                a.runtime.as_secs_f64()
            )?;
        }
        writeln!(
            out,
            "  IOPS {:.0}  MB/s {:.1}  ({ios} I/Os: {} reads, {} writes, in {secs:.2} s; {} errors)",
            self.iops(),
            self.mbps(),
            t.reads,
            t.writes,
            t.errors
        )?;
        if a.verify {
            writeln!(
                out,
                "  verify: {} reads checked during the run, {} blocks read back at the end, {} mismatches",
                t.verified, t.read_back, t.mismatches
            )?;
        }
        writeln!(
            out,
            "  latency us: mean {:.1}  p50 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
            t.hist.mean() / 1000.0,
            us(t.hist.quantile(0.5)),
            us(t.hist.quantile(0.99)),
            us(t.hist.quantile(0.999)),
            us(t.hist.max())
        )?;
        writeln!(
            out,
            "  client CPU: {client_cpu:.2} s = {:.0} % of one core, {:.2} us per I/O",
            client_cpu / secs * 100.0,
            self.cpu_us_per_io(client_cpu)
        )?;
        writeln!(
                out,
            "  driver: SQ doorbell writes {:.4}/IO, CQ head doorbell writes {:.4}/IO, interrupt wakeups {:.4}/IO",
            t.per_io(t.sq_doorbell_writes),
            t.per_io(t.cq_doorbell_writes),
            t.per_io(t.interrupt_wakeups)
        )?;
        if let Some(s) = self.counters.as_ref().filter(|s| s.get("io_commands").is_some()) {
            writeln!(
                out,
                "  server: trapped I/O doorbells {:.4}/IO, interrupts {:.4}/IO ({} I/O commands counted)",
                s["trapped_doorbells_per_io"].as_f64().unwrap_or(0.0),
                s["interrupts_per_io"].as_f64().unwrap_or(0.0),
                s["io_commands"]
            )?;
        }
        if let Some(c) = self.cpu.server {
            writeln!(
                out,
                "  server CPU: {:.2} s = {:.0} % of one core, {:.2} us per I/O{}",
                c.seconds(),
                c.seconds() / secs * 100.0,
                self.cpu_us_per_io(c.seconds()),
                match c {
                    ServerCpu::Workers { .. } => " (in-process worker threads; client CPU excludes them)",
                    ServerCpu::Process { .. } => "",
                }
            )?;
        }
        if let Some(e) = &t.first_error {
            crate::logging::say!("vnvme perf: first error: {e}");
        }
        Ok(())
    }

    /// The results, every knob and the machine, as `--json` prints them.
    pub(super) fn json(&self, a: &PerfArgs, target: &Target) -> Value {
        let t = &self.totals;
        json!({
            "tool": "vnvme perf",
            "machine": machine(),
            "transport": self.transport,
            "knobs": {
                "target": target_json(target),
                "rw": a.rw.name(),
                "verify_mode": a.verify,
                "mix_read_percent": a.mix,
                "bs": a.bs,
                "qd": a.qd,
                "queues": a.queues,
                "runtime_s": a.runtime.as_secs_f64(),
                "timeout_s": a.timeout.as_secs_f64(),
                "nsid": a.nsid,
                "lba_size": self.lba,
                "doorbells": self.doorbells.name(),
                "shadow_doorbells": self.shadow,
                "completion": completion_name(a.completion),
                "threads": "one per queue",
            },
            "results": {
                "interrupted_by": self.interrupted_by,
                "elapsed_s": self.secs(),
                "ios": t.ios(),
                "reads": t.reads,
                "writes": t.writes,
                "errors": t.errors,
                "verify": a.verify.then(|| serde_json::json!({
                    "reads_checked": t.verified, "read_back": t.read_back, "mismatches": t.mismatches,
                })),
                "iops": self.iops(),
                "mb_per_s": self.mbps(),
                "latency_us": {
                    "mean": t.hist.mean() / 1000.0,
                    "p50": us(t.hist.quantile(0.5)),
                    "p99": us(t.hist.quantile(0.99)),
                    "p99_9": us(t.hist.quantile(0.999)),
                    "max": us(t.hist.max()),
                },
                "client_cpu_s": self.cpu.client.as_secs_f64(),
                "process_cpu_s": self.cpu.process.as_secs_f64(),
                "client_cpu_us_per_io": self.cpu_us_per_io(self.cpu.client.as_secs_f64()),
                "driver_sq_doorbell_writes_per_io": t.per_io(t.sq_doorbell_writes),
                "driver_cq_doorbell_writes_per_io": t.per_io(t.cq_doorbell_writes),
                "interrupt_wakeups_per_io": t.per_io(t.interrupt_wakeups),
            },
            "server": self.server(),
        })
    }
}

fn target_json(target: &Target) -> Value {
    match target {
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
    }
}

/// The machine and build a figure was measured on.
fn machine() -> Value {
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
