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

mod args;
mod histogram;
mod knobs;
mod load;
mod measure;
mod report;
mod setup;

pub use args::{PerfArgs, Target};
pub(crate) use knobs::parse_duration;

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
        crate::logging::say!("vnvme perf: controller shutdown: {e}");
    }
    let counters = counters.delta(totals.ios());
    let mut errors = totals.errors;
    if let Some(why) = &fatal {
        crate::logging::say!("vnvme perf: {why}");
        errors += 1;
    }
    // With --json and no file, stdout holds the JSON alone.
    let json_to_stdout = a.json.as_deref() == Some(std::path::Path::new("-"));
    let mut people: Box<dyn std::io::Write> =
        if json_to_stdout { Box::new(std::io::stderr()) } else { Box::new(std::io::stdout()) };
    if let Some(m) = &migrated {
        writeln!(people, "{}", m.describe())?;
        if let Some(e) = &m.error {
            crate::logging::say!("vnvme perf: migration failed: {e}");
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
    use nvme_ctrl::PollMode;

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
