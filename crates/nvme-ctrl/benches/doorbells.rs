//! Doorbell microbenchmark: how many doorbell writes trap, and how many commands a
//! second one thread moves, when the mock host drives the controller the way Linux's
//! nvme driver under fio (libaio, `rw=randread`/`randwrite`, `bs=4k`) drives a disk.
//!
//! Not a test: `cargo bench -p nvme-ctrl --bench doorbells [-- --commands N --repeat N
//! --qd 1,4,16,64 --out DIR]`. Run without `--bench` (as `cargo test --benches` does)
//! it only checks, with a few commands per point and no files written, that it runs.
//!
//! The host model, per point (workload, queue depth, shadow doorbells on or off):
//! - one I/O queue pair of 1024 entries (Linux `io_queue_depth`), one namespace on the
//!   null backend (4 KiB LBAs), one MSI-X vector per CQ, no interrupt coalescing;
//! - `qd` commands are submitted, each with its own SQ tail update (`MockHost::submit`,
//!   Linux `nvme_queue_rq` for a request that is not part of a plugged batch);
//! - then the host waits, which is when the device runs (`MockHost::process`), reaps
//!   every completion and updates the CQ head once (`MockHost::reap_queue`, one pass of
//!   `nvme_irq`), and resubmits one command per completion (fio refilling its depth).
//!
//! Host and device share one thread, so commands/s is the cost of both sides together
//! with no VM exits: it ranks changes to the controller, it is not a guest's IOPS.
//!
//! The bench prints its knobs and versions, measures, and writes `results.json`; the
//! report, `scripts/bench-doorbells.py` (which it runs), adds the machine's description
//! and writes `table.md` and `chart.svg` with the module every benchmark draws with
//! (`scripts/lib/vnvme_report.py`).

#[path = "doorbells/facts.rs"]
mod facts;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use block_backend::NullBackend;
use nvme_ctrl::{ControllerConfig, NamespaceConfig, StatsSnapshot};
use nvme_spec::opcode::nvm as iop;
use serde::Serialize;
use test_kit::{InitOptions, MockHost};
use test_util::Rng;

/// The I/O queue every command goes through (one fio job on one CPU uses one queue).
const QID: u16 = 1;
/// Entries per I/O queue: Linux's default `nvme.io_queue_depth`.
const QUEUE_SIZE: u32 = 1024;
/// Linux's `NVME_AQ_DEPTH`.
const ADMIN_QUEUE_SIZE: u32 = 32;
/// I/O size, and the LBA size of the namespace (LBA format 1).
const BLOCK: u64 = 4096;
const LBA_FORMAT: u8 = 1;
/// Null namespace size: the span random offsets are drawn from.
const NS_BYTES: u64 = 64 << 30;
const GUEST_MEM: u64 = 32 << 20;
const RNG_SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// The seed measurements, from the QEMU shadow doorbell series (seed 004): fio
/// randread 4 KiB, libaio, one job, Linux 5.15 guest under KVM, Xeon Gold 6248R.
/// They are the reference the issue quotes, not measurements of ours.
const SEED_LABEL: &str = "seed reference (QEMU, KVM, 2022)";
const SEED_QD: [u32; 4] = [1, 2, 4, 8];
const SEED_MMIO_QEMU: [f64; 4] = [2.01, 1.99, 1.99, 1.99];
const SEED_MMIO_DBBUF: [f64; 4] = [1.00, 0.52, 0.27, 0.46];
const SEED_IOPS_QEMU: [f64; 4] = [25.1e3, 25.9e3, 24.5e3, 24.0e3];
const SEED_IOPS_DBBUF: [f64; 4] = [29.1e3, 60.1e3, 99.8e3, 82.5e3];

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Workload {
    RandRead,
    RandWrite,
}

impl Workload {
    const ALL: [Workload; 2] = [Workload::RandRead, Workload::RandWrite];
    fn name(self) -> &'static str {
        match self {
            Workload::RandRead => "randread",
            Workload::RandWrite => "randwrite",
        }
    }
    fn opcode(self) -> u8 {
        match self {
            Workload::RandRead => iop::READ,
            Workload::RandWrite => iop::WRITE,
        }
    }
}

/// Every setting a run depends on.
#[derive(Clone, Debug, Serialize)]
struct Knobs {
    commands: u64,
    repeat: u32,
    qd: Vec<u32>,
    workloads: Vec<Workload>,
    block_bytes: u64,
    io_queues: u16,
    queue_entries: u32,
    admin_queue_entries: u32,
    backend: &'static str,
    namespace_bytes: u64,
    lba_format: u8,
    interrupts: &'static str,
    rng: String,
    host_model: &'static str,
    timing: &'static str,
    /// False when run as a check (no `--bench`): nothing is written.
    write_files: bool,
    out: Option<PathBuf>,
}

impl Knobs {
    fn parse() -> Result<Knobs, String> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let bench = args.iter().any(|a| a == "--bench");
        let mut k = Knobs {
            commands: if bench { 200_000 } else { 2_000 },
            repeat: if bench { 3 } else { 1 },
            qd: vec![1, 4, 16, 64],
            workloads: Workload::ALL.to_vec(),
            block_bytes: BLOCK,
            io_queues: 1,
            queue_entries: QUEUE_SIZE,
            admin_queue_entries: ADMIN_QUEUE_SIZE,
            backend: "block_backend::NullBackend",
            namespace_bytes: NS_BYTES,
            lba_format: LBA_FORMAT,
            interrupts: "MSI-X, one vector per CQ, coalescing off",
            rng: format!("test_util::Rng (xorshift64*), seed {RNG_SEED:#x}, uniform 4 KiB-aligned offsets"),
            host_model: "per-command SQ tail update; device runs when the host waits; \
                         one CQ head update per reap pass; one resubmission per completion",
            timing: "wall clock of the I/O loop only (bring-up excluded); host and device \
                     in one thread",
            write_files: bench,
            out: None,
        };
        let mut it = args.into_iter();
        while let Some(a) = it.next() {
            let mut val = |name: &str| it.next().ok_or(format!("{name} needs a value"));
            match a.as_str() {
                "--bench" => {}
                "--commands" => k.commands = parse_num(&val("--commands")?)?,
                "--repeat" => k.repeat = parse_num(&val("--repeat")?)?,
                "--qd" => {
                    k.qd = val("--qd")?.split(',').map(parse_num).collect::<Result<_, _>>()?;
                }
                "--out" => k.out = Some(PathBuf::from(val("--out")?)),
                "-h" | "--help" => return Err(String::new()),
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        if k.commands == 0 || k.repeat == 0 || k.qd.is_empty() {
            return Err("--commands, --repeat and --qd must be non-empty and non-zero".into());
        }
        if let Some(&bad) = k.qd.iter().find(|&&q| q == 0 || q >= k.queue_entries) {
            return Err(format!("queue depth {bad} must be 1..{}", k.queue_entries));
        }
        Ok(k)
    }
}

fn parse_num<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    s.trim().replace('_', "").parse().map_err(|_| format!("not a number: {s:?}"))
}

const USAGE: &str = "usage: cargo bench -p nvme-ctrl --bench doorbells -- \
[--commands N] [--repeat N] [--qd 1,4,16,64] [--out DIR]\n\
  --commands N  commands per run (default 200000)\n\
  --repeat N    runs per point; the median and min/max are reported (default 3)\n\
  --qd LIST     queue depths (default 1,4,16,64)\n\
  --out DIR     write results.json, table.md and chart.svg into DIR\n\
                (default <workspace>/results/mock-doorbells/<UTC timestamp>/)\n\
The table and chart are drawn by scripts/bench-doorbells.py DIR (python3), which the\n\
bench runs; run it again to redraw them.";

/// What one run counted and how long its I/O loop took.
#[derive(Clone, Copy, Debug, Serialize)]
struct Run {
    seconds: f64,
    commands: u64,
    /// Controller counters over the I/O loop.
    io_doorbell_writes: u64,
    interrupts: u64,
    shadow_reads: u64,
    eventidx_races: u64,
    /// Every doorbell write since the controller was created, bring-up included.
    lifetime_doorbell_writes: u64,
    lifetime_admin_commands: u64,
}

impl Run {
    fn per_cmd(&self, n: u64) -> f64 {
        n as f64 / self.commands as f64
    }
}

/// Median, min and max of one metric over a point's runs.
#[derive(Clone, Copy, Debug, Serialize)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

impl Spread {
    fn of(mut v: Vec<f64>) -> Spread {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Spread { median, min: v[0], max: v[n - 1] }
    }
}

/// One (workload, queue depth, shadow doorbells) point.
#[derive(Clone, Debug, Serialize)]
struct Point {
    workload: Workload,
    qd: u32,
    shadow_doorbells: bool,
    commands_per_sec: Spread,
    /// `io_doorbell_writes` / commands: trapped writes to I/O queue doorbells.
    trapped_io_doorbells_per_cmd: Spread,
    /// `doorbell_writes` over the controller's life (admin bring-up included) / commands.
    total_doorbells_per_cmd: Spread,
    interrupts_per_cmd: Spread,
    eventidx_races: Spread,
    shadow_reads_per_cmd: Spread,
    runs: Vec<Run>,
}

impl Point {
    fn new(workload: Workload, qd: u32, shadow: bool, runs: Vec<Run>) -> Point {
        let s = |f: &dyn Fn(&Run) -> f64| Spread::of(runs.iter().map(f).collect());
        Point {
            workload,
            qd,
            shadow_doorbells: shadow,
            commands_per_sec: s(&|r| r.commands as f64 / r.seconds),
            trapped_io_doorbells_per_cmd: s(&|r| r.per_cmd(r.io_doorbell_writes)),
            total_doorbells_per_cmd: s(&|r| r.per_cmd(r.lifetime_doorbell_writes)),
            interrupts_per_cmd: s(&|r| r.per_cmd(r.interrupts)),
            eventidx_races: s(&|r| r.eventidx_races as f64),
            shadow_reads_per_cmd: s(&|r| r.per_cmd(r.shadow_reads)),
            runs,
        }
    }
}

/// Brings up a fresh controller and runs `k.commands` commands at depth `qd`.
fn run_once(k: &Knobs, w: Workload, qd: u32, shadow: bool) -> Run {
    let cfg = ControllerConfig {
        namespaces: vec![NamespaceConfig::new(Arc::new(NullBackend::new(k.namespace_bytes)), k.lba_format)],
        ..Default::default()
    };
    let mut h = MockHost::new(cfg, GUEST_MEM);
    let created = h.ctrl.stats();
    h.init(InitOptions {
        io_queues: k.io_queues,
        queue_size: k.queue_entries,
        admin_queue_size: k.admin_queue_entries,
        shadow_doorbells: shadow,
        interrupts: true,
    })
    .expect("bring-up");
    assert_eq!(h.dbbuf.is_some(), shadow, "shadow doorbells are used exactly when asked for");

    // One data buffer per slot of the depth, as fio has one per io_u; a completion
    // frees its buffer for the resubmission that follows it.
    let bufs: Vec<u64> = (0..qd).map(|_| h.alloc.alloc_pages(1)).collect();
    for (i, &b) in bufs.iter().enumerate() {
        h.mem.fill(b, k.block_bytes, 0x5a ^ i as u8).expect("buffer");
    }
    let mut buf_of_cid = vec![0u64; k.queue_entries as usize];
    let blocks = k.namespace_bytes / k.block_bytes;
    let nlb = (k.block_bytes / BLOCK) as u32;
    let mut rng = Rng::new(RNG_SEED);
    let (opcode, total) = (w.opcode(), k.commands);
    let mut submit = |h: &mut MockHost, buf_of_cid: &mut [u64], buf: u64| {
        let slba = rng.below(blocks);
        let sqe = h.rw_sqe(opcode, 1, slba, nlb, (buf, k.block_bytes));
        let cid = h.submit(QID, sqe).expect("the depth is below the queue size");
        buf_of_cid[cid as usize] = buf;
    };

    let before = h.ctrl.stats();
    let start = Instant::now();
    let mut submitted = 0u64;
    let mut completed = 0u64;
    for &b in bufs.iter().take(total.min(qd as u64) as usize) {
        submit(&mut h, &mut buf_of_cid, b);
        submitted += 1;
    }
    while completed < total {
        h.process();
        let got = h.reap_queue(QID);
        assert!(!got.is_empty(), "null I/O completes whenever the device runs");
        for c in &got {
            assert!(c.status().is_success(), "{} failed: {:?}", w.name(), c.status());
            completed += 1;
            if submitted < total {
                let buf = buf_of_cid[c.cid.get() as usize];
                submit(&mut h, &mut buf_of_cid, buf);
                submitted += 1;
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let d: StatsSnapshot = h.ctrl.stats() - before;
    let life = h.ctrl.stats() - created;
    assert_eq!(d.io_commands, total, "every command completed once");
    Run {
        seconds,
        commands: total,
        io_doorbell_writes: d.io_doorbell_writes,
        interrupts: d.interrupts,
        shadow_reads: d.shadow_reads,
        eventidx_races: d.eventidx_races,
        lifetime_doorbell_writes: life.doorbell_writes,
        lifetime_admin_commands: life.admin_commands,
    }
}

#[derive(Serialize)]
struct SeedReference {
    label: &'static str,
    source: &'static str,
    setup: &'static str,
    qd: [u32; 4],
    mmio_per_io_qemu: [f64; 4],
    mmio_per_io_qemu_dbbuf: [f64; 4],
    iops_qemu: [f64; 4],
    iops_qemu_dbbuf: [f64; 4],
}

const SEED: SeedReference = SeedReference {
    label: SEED_LABEL,
    source: "QEMU hw/nvme shadow doorbell buffer series cover letter (Jinhao Fan, 2022), \
             the project's seed document 004",
    setup: "fio libaio randread bs=4k numjobs=1, Ubuntu 22.04 guest (Linux 5.15.0-33), \
            KVM, null-co drive, Xeon Gold 6248R; MMIO per I/O measured with perf-kvm",
    qd: SEED_QD,
    mmio_per_io_qemu: SEED_MMIO_QEMU,
    mmio_per_io_qemu_dbbuf: SEED_MMIO_DBBUF,
    iops_qemu: SEED_IOPS_QEMU,
    iops_qemu_dbbuf: SEED_IOPS_DBBUF,
};

#[derive(Serialize)]
struct Report<'a> {
    benchmark: &'static str,
    /// The bench's own facts; the report adds the machine (CPU, cores, kernel).
    machine: &'a facts::Facts,
    knobs: &'a Knobs,
    metrics: Vec<Metric>,
    measured: &'a [Point],
    seed_reference: SeedReference,
}

/// What a reported metric counts.
#[derive(Serialize)]
struct Metric {
    name: &'static str,
    meaning: &'static str,
}

const METRICS: [(&str, &str); 6] = [
    ("commands_per_sec", "commands / wall-clock seconds of the I/O loop, host and device in one thread"),
    ("trapped_io_doorbells_per_cmd", "controller stats io_doorbell_writes / commands (I/O queues)"),
    (
        "total_doorbells_per_cmd",
        "controller stats doorbell_writes since creation / commands (admin bring-up included)",
    ),
    ("interrupts_per_cmd", "controller stats interrupts / commands"),
    ("eventidx_races", "controller stats eventidx_races over the I/O loop (a count)"),
    ("shadow_reads_per_cmd", "controller stats shadow_reads / commands (admin SQ polls included)"),
];

fn main() {
    let k = match Knobs::parse() {
        Ok(k) => k,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("doorbells: {e}");
            }
            eprintln!("{USAGE}");
            std::process::exit(if e.is_empty() { 0 } else { 2 });
        }
    };
    let f = facts::Facts::detect();
    if !k.write_files {
        println!(
            "doorbells: no --bench argument, so a quick check ({} commands a point, nothing written); \
                  run `cargo bench -p nvme-ctrl --bench doorbells` for numbers",
            k.commands
        );
    }
    print!("{}", header(&f, &k));

    let mut points = Vec::new();
    for &w in &k.workloads {
        for &qd in &k.qd {
            for shadow in [false, true] {
                let runs = (0..k.repeat).map(|_| run_once(&k, w, qd, shadow)).collect();
                let p = Point::new(w, qd, shadow, runs);
                eprintln!(
                    "  {:<9} qd {:>3} shadow {:<3}: {:>10.0} cmd/s [{:.0}–{:.0}], {:.4} trapped/cmd",
                    w.name(),
                    qd,
                    if shadow { "on" } else { "off" },
                    p.commands_per_sec.median,
                    p.commands_per_sec.min,
                    p.commands_per_sec.max,
                    p.trapped_io_doorbells_per_cmd.median
                );
                points.push(p);
            }
        }
    }

    if !k.write_files {
        return;
    }
    let root = workspace_root();
    let dir = k.out.clone().unwrap_or_else(|| root.join("results").join("mock-doorbells").join(&f.run_id));
    let report = Report {
        benchmark: "nvme-ctrl/benches/doorbells.rs",
        machine: &f,
        knobs: &k,
        metrics: METRICS.iter().map(|&(name, meaning)| Metric { name, meaning }).collect(),
        measured: &points,
        seed_reference: SEED,
    };
    let json = serde_json::to_string_pretty(&report).expect("serialize");
    let written =
        std::fs::create_dir_all(&dir).and_then(|_| std::fs::write(dir.join("results.json"), json + "\n"));
    if let Err(e) = written {
        eprintln!("doorbells: cannot write {}: {e}", dir.display());
        std::process::exit(1);
    }
    // The machine's description, the table and the chart: the report every benchmark's
    // charts come from. It prints the table and the files it wrote.
    let script = root.join("scripts").join("bench-doorbells.py");
    println!();
    match Command::new("python3").arg(&script).arg(&dir).status() {
        Ok(st) if st.success() => {}
        other => {
            let why = match other {
                Ok(st) => format!("it failed ({st})"),
                Err(e) => format!("python3 did not run ({e})"),
            };
            eprintln!(
                "doorbells: wrote {}/results.json, but the report did not: {why}; \
                 draw the table and chart with `python3 scripts/bench-doorbells.py DIR`",
                dir.display()
            );
            std::process::exit(1);
        }
    }
}

/// The workspace root: this crate lives at `<root>/crates/nvme-ctrl`.
fn workspace_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

fn header(f: &facts::Facts, k: &Knobs) -> String {
    let mut s = String::new();
    let mut line = |key: &str, v: &dyn std::fmt::Display| s.push_str(&format!("- {key}: {v}\n"));
    line("benchmark", &"nvme-ctrl/benches/doorbells.rs (null namespace, mock host, one thread)");
    line("date (UTC)", &f.date_utc);
    line("nvme-ctrl version", &f.crate_version);
    line("git commit", &f.git_commit);
    line("rustc", &f.rustc);
    line("build", &f.profile);
    line("command", &f.command_line.join(" "));
    line("commands per run", &k.commands);
    line("runs per point", &format!("{} (the report gives median [min–max])", k.repeat));
    let qds: Vec<String> = k.qd.iter().map(u32::to_string).collect();
    line("queue depths", &qds.join(", "));
    let ws: Vec<&str> = k.workloads.iter().map(|w| w.name()).collect();
    line("workloads", &format!("{}, {} B each", ws.join(", "), k.block_bytes));
    line(
        "controller",
        &format!(
            "default ControllerConfig, {} I/O queue pair of {} entries, admin queue {}, {}",
            k.io_queues, k.queue_entries, k.admin_queue_entries, k.interrupts
        ),
    );
    line(
        "namespace",
        &format!("{} of {} GiB, LBA format {} (4 KiB)", k.backend, k.namespace_bytes >> 30, k.lba_format),
    );
    line("offsets", &k.rng);
    line("host model", &k.host_model);
    line("commands/s", &k.timing);
    s
}
