//! `vnvme perf`: a load generator over the userspace NVMe driver and a vfio-user
//! device. One thread per I/O queue, each owning its queue and keeping `qd` commands
//! in flight; latency in a log-linear histogram; client CPU time from
//! CLOCK_PROCESS_CPUTIME_ID (user + system, what getrusage sums, at ns resolution);
//! optionally the server's counters from its `--stats-file`, read before and after,
//! and the server's CPU time from `/proc/<pid>/stat` (`--server-pid`) over the same
//! window as the client's.
//!
//! `--in-process` runs the controller in this process instead (the test kit's
//! `InProcessTransport`: no socket, no second process), the ceiling a vfio-user
//! transport can approach. Its "server" counters come straight from the controller and
//! its "server" CPU is that of the controller's I/O worker threads (`vnvme-q*`), the
//! client's the rest of the process.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nvme_ctrl::PollMode;
use nvme_driver::CompletionMode;

use crate::nsspec::NsSpec;

mod histogram;
mod knobs;
mod load;
mod measure;
mod report;
mod setup;

pub use histogram::Histogram;
pub(crate) use knobs::parse_duration;
pub use knobs::{Doorbells, Workload};

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
    /// Run the controller in this process (the test kit's in-process transport):
    /// doorbells are function calls (--doorbells trapped or shadow).
    #[arg(long)]
    pub in_process: bool,
    /// --in-process namespaces, as `vnvme serve --ns` takes them [default:
    /// null:64G:lba=4096].
    #[arg(long = "in-process-ns")]
    pub in_process_ns: Vec<NsSpec>,
    /// --in-process: controller I/O worker threads, as `vnvme serve --workers`
    /// [default: 1, whatever the host].
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
    /// Check the data: every LBA written carries a header (its LBA and the block's
    /// generation) and a fill derived from both; every read of a block this run
    /// wrote is checked against what was last written there, and at the end every
    /// block written is read back and checked. A block with a command in flight is
    /// neither read nor written again meanwhile. Any mismatch is an error.
    #[arg(long)]
    pub verify: bool,
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
    #[arg(long, default_value = "5s", value_parser = knobs::parse_duration)]
    pub runtime: Duration,
    /// How long a command may take before perf gives up on it and reports an error.
    /// Longer than a server's namespace timeout (`timeout=`, 30 s by default), so the
    /// error completion that timeout sends is what perf reports.
    #[arg(long, default_value = "60s", value_parser = knobs::parse_duration)]
    pub timeout: Duration,
    /// The namespace to load, by its NSID (1 is the first `--ns` of `vnvme serve`).
    /// `--ns` is an older name for it.
    #[arg(long = "nsid", alias = "ns", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub nsid: u32,
    /// trapped, shadow (EventIdx), sync, eventfd or mapped.
    #[arg(long, default_value = "shadow")]
    pub doorbells: Doorbells,
    /// poll (spin on the CQ) or irq (sleep on the MSI-X eventfd).
    #[arg(long, default_value = "poll", value_parser = knobs::parse_completion)]
    pub completion: CompletionMode,
    /// Print the results and every knob as JSON (for scripts) instead of the lines
    /// for people, which go to stderr; `--json FILE` writes the JSON to FILE and
    /// keeps the lines on stdout.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
    /// The server's --stats-file, read before and after the run.
    #[arg(long)]
    pub server_stats: Option<PathBuf>,
    /// The server's process ID: report its CPU time (/proc/PID/stat utime+stime)
    /// over the run, per I/O.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Live-migrate the device (vfio-user migration v2) to the server at this socket
    /// while the load runs, then back to --socket, and so on, every
    /// --migrate-every: this program acts as the VMM (queues pause meanwhile, as
    /// vCPUs would, with their commands in flight). Guest memory is also copied
    /// through the source's DMA log, as to another host, and the copy checked
    /// against the memory (a page the log missed fails the migration). Both servers
    /// must serve the same storage (e.g. the same file). Trapped or shadow doorbells.
    #[arg(long, value_name = "SOCKET")]
    pub migrate_to: Option<PathBuf>,
    /// How often --migrate-to migrates.
    #[arg(long, default_value = "1s", value_parser = knobs::parse_duration)]
    pub migrate_every: Duration,
}

/// Runs the load on the target and reports what it measured.
pub fn run(a: PerfArgs) -> Result<(), Box<dyn std::error::Error>> {
    let target = a.target.resolve()?;
    if a.qd == 0 || a.queues == 0 || a.mix > 100 || a.bs == 0 {
        return Err("--qd and --queues must be at least 1, --mix 0..=100, --bs non-zero".into());
    }
    let setup::Setup { driver: mut d, ctrl_stats, lba, blocks, shadow } = setup::open(&a, &target)?;
    let transport = d.describe_transport();
    let mut counters = measure::Counters::start(a.server_stats.as_deref(), ctrl_stats.as_ref());
    let queues = d.take_queues();
    let clocks = measure::Clocks::start(a.server_pid, ctrl_stats.is_some());
    let t0 = Instant::now();
    let deadline = t0 + a.runtime;
    let pause = std::sync::Arc::new(load::Pause::default());
    let migrations = match (&a.migrate_to, &target) {
        (Some(to), Target::Socket(from)) => Some(spawn_migrations(
            d.device_handle(),
            pause.clone(),
            [from.clone(), to.clone()],
            a.migrate_every,
            deadline,
        )),
        (Some(_), Target::InProcess { .. }) => return Err("--migrate-to needs --socket".into()),
        (None, _) => None,
    };
    let results = load::run(queues, &a, lba, blocks, deadline, &pause);
    let elapsed = t0.elapsed();
    let migrated = migrations.map(|h| h.join().expect("migration thread"));
    let cpu = clocks.stop();
    counters.stop();
    let (queues, totals) = load::Totals::sum(results);
    for q in queues {
        d.return_queue(q);
    }
    // A controller that reports a fatal status failed the run, whatever its
    // completions said: a host would reset it.
    let fatal = match d.device_handle().csts() {
        Ok(c) if c.cfs() => Some(format!("the controller reports Controller Fatal Status (CSTS {:#x})", c.0)),
        Ok(_) => None,
        Err(e) => Some(format!("CSTS could not be read after the run: {e}")),
    };
    // A normal shutdown before going away (what Linux does), so the controller is idle
    // when the connection and its DMA mappings go.
    if let Err(e) = d.shutdown() {
        eprintln!("vnvme perf: controller shutdown: {e}");
    }
    let counters = counters.delta(totals.ios());
    let mut errors = totals.errors;
    if let Some(why) = &fatal {
        eprintln!("vnvme perf: {why}");
        errors += 1;
    }
    // With --json and no file, stdout holds the JSON alone.
    let json_to_stdout = a.json.as_deref() == Some(std::path::Path::new("-"));
    let mut people: Box<dyn std::io::Write> =
        if json_to_stdout { Box::new(std::io::stderr()) } else { Box::new(std::io::stdout()) };
    if let Some(m) = &migrated {
        writeln!(people, "{}", m.describe())?;
        if let Some(e) = &m.error {
            eprintln!("vnvme perf: migration failed: {e}");
            errors += 1;
        }
    }
    let outcome = report::Outcome { transport, lba, shadow, totals, elapsed, cpu, counters };
    outcome.print(&a, &mut people)?;
    if let Some(p) = &a.json {
        let text = serde_json::to_string_pretty(&outcome.json(&a, &target))? + "\n";
        if json_to_stdout {
            print!("{text}");
        } else {
            std::fs::write(p, text).map_err(|e| format!("--json {}: {e}", p.display()))?;
        }
    }
    if errors > 0 {
        return Err(format!("{errors} I/O errors").into());
    }
    Ok(())
}

/// What the migration thread did.
#[derive(Debug, Default)]
struct Migrations {
    downtimes: Vec<Duration>,
    /// Each migration's memory copy.
    copies: Vec<nvme_driver::dirty::CopyReport>,
    bytes: usize,
    error: Option<String>,
}

impl Migrations {
    fn describe(&self) -> String {
        let mut d = self.downtimes.clone();
        d.sort();
        let ms = |x: Option<&Duration>| x.map_or(0.0, |d| d.as_secs_f64() * 1e3);
        format!(
            "  migrations: {} (device state {} bytes each), downtime ms: min {:.2}, median {:.2}, max {:.2}",
            d.len(),
            self.bytes,
            ms(d.first()),
            ms(d.get(d.len() / 2)),
            ms(d.last())
        ) + &self.describe_copies()
    }

    fn describe_copies(&self) -> String {
        let Some(first) = self.copies.first() else { return String::new() };
        let spread = |f: fn(&nvme_driver::dirty::CopyReport) -> u64| {
            let mut v: Vec<u64> = self.copies.iter().map(f).collect();
            v.sort();
            format!("{}/{}/{}", v[0], v[v.len() / 2], v[v.len() - 1])
        };
        format!(
            "\n  guest memory: {} KiB copied while running, then pages the logs reported (min/median/max): \
             device {}, this process {}; every copy matched the memory",
            first.full_bytes >> 10,
            spread(|c| c.device_pages),
            spread(|c| c.cpu_pages)
        )
    }
}

/// Migrates the device from `from` to `to` and back, every `every`, until `deadline`
/// (stops at the first failure).
fn spawn_migrations(
    h: nvme_driver::DeviceHandle,
    pause: std::sync::Arc<load::Pause>,
    [from, to]: [PathBuf; 2],
    every: Duration,
    deadline: Instant,
) -> std::thread::JoinHandle<Migrations> {
    std::thread::spawn(move || {
        let m = migrate_until(h, &pause, [from, to], every, deadline);
        measure::thread_finishing();
        m
    })
}

/// The migration thread's loop (see [`spawn_migrations`]).
fn migrate_until(
    h: nvme_driver::DeviceHandle,
    pause: &load::Pause,
    [from, to]: [PathBuf; 2],
    every: Duration,
    deadline: Instant,
) -> Migrations {
    let mut m = Migrations::default();
    let mut next = [to, from].into_iter().cycle();
    loop {
        let at = Instant::now() + every;
        if at + Duration::from_millis(100) >= deadline {
            return m;
        }
        std::thread::sleep(at - Instant::now());
        let dest = next.next().expect("cycle");
        // Guest memory first, while the queues run (a VMM's pre-copy); then the
        // queues pause between rounds (commands stay in flight), as vCPUs do, for
        // the stop and the rest of the copy.
        let r = h.start_memory_copy().and_then(|()| {
            let _paused = pause.write().unwrap_or_else(|p| p.into_inner());
            h.migrate(&dest)
        });
        match r {
            Ok(r) => {
                m.downtimes.push(r.downtime);
                m.copies.extend(r.memory);
                m.bytes = r.bytes;
            }
            Err(e) => {
                m.error = Some(format!("to {}: {e}", dest.display()));
                return m;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
