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
//!
//! A run ends at its deadline, at once when the controller reports Controller
//! Fatal Status (the driver's waits look at CSTS), or on SIGINT or SIGTERM
//! (`interrupt`), which print the results so far, marked, and exit 128 + the signal.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod args;
mod histogram;
mod interrupt;
mod knobs;
mod load;
mod measure;
mod report;
mod setup;

pub use args::{PerfArgs, Target};
pub use interrupt::Interrupted;
pub(crate) use knobs::parse_duration;

/// Runs the load on the target and reports what it measured.
pub fn run(a: PerfArgs) -> Result<(), Box<dyn std::error::Error>> {
    let target = a.target.resolve()?;
    if a.qd == 0 || a.queues == 0 || a.mix > 100 || a.bs == 0 {
        return Err("--qd and --queues must be at least 1, --mix 0..=100, --bs non-zero".into());
    }
    interrupt::catch()?;
    // Checked before the run, not after it: never written over a file that is not
    // perf's JSON (an image, say), nor one someone holds.
    let results = crate::stats_file::Kind {
        what: "a vnvme perf results file",
        known: |o| o.get("tool").and_then(|t| t.as_str()) == Some("vnvme perf"),
    };
    let mut json_out = match a.json.as_deref() {
        Some(p) if p != std::path::Path::new("-") => {
            Some(crate::stats_file::JsonOutput::claim(p, "--json", results)?)
        }
        _ => None,
    };
    let setup::Setup { driver: mut d, ctrl_stats, lba, blocks, shadow, doorbells } =
        setup::open(&a, &target)?;
    let transport = d.describe_transport();
    let mut counters = measure::Counters::start(a.server_stats.as_deref(), ctrl_stats.as_ref());
    let queues = d.take_queues();
    let clocks = measure::Clocks::start(a.server_pid, ctrl_stats.is_some());
    let t0 = Instant::now();
    let deadline = t0 + a.runtime;
    let pause = Arc::new(load::Pause::default());
    let load_done = Arc::new(AtomicBool::new(false));
    let migrations = match (&a.migrate_to, &target) {
        (Some(to), Target::Socket(from)) => Some(spawn_migrations(
            d.device_handle(),
            (pause.clone(), load_done.clone()),
            [from.clone(), to.clone()],
            a.migrate_every,
            deadline,
        )),
        (Some(_), Target::InProcess { .. }) => return Err("--migrate-to needs --socket".into()),
        (None, _) => None,
    };
    let results = load::run(queues, &a, lba, blocks, deadline, &pause);
    let elapsed = t0.elapsed();
    load_done.store(true, Ordering::SeqCst);
    let interrupted = interrupt::received();
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
        Ok(c) if c.cfs() => Some(format!(
            "the controller reports Controller Fatal Status (CSTS {:#x}); the load stopped when it saw it",
            c.0
        )),
        Ok(_) => None,
        Err(e) => Some(format!("CSTS could not be read after the run: {e}")),
    };
    // A normal shutdown before going away (what Linux does), so the controller is idle
    // when the connection and its DMA mappings go. A controller in fatal status (or
    // out of reach) completes no shutdown: a host resets it, and waiting for it would
    // take the command timeout.
    if fatal.is_none() {
        if let Err(e) = d.shutdown() {
            crate::logging::say!("vnvme perf: controller shutdown: {e}");
        }
    }
    let counters = counters.delta(totals.ios());
    let mut errors = totals.errors;
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
    let interrupted_by = interrupted.map(|(name, _)| name);
    let outcome =
        report::Outcome { transport, lba, shadow, doorbells, totals, elapsed, cpu, counters, interrupted_by };
    outcome.print(&a, &mut people)?;
    if let Some(p) = &a.json {
        let text = serde_json::to_string_pretty(&outcome.json(&a, &target))? + "\n";
        if json_to_stdout {
            print!("{text}");
        } else {
            let out = json_out.take().expect("claimed before the run");
            out.write(&text).map_err(|e| format!("--json {}: {e}", p.display()))?;
        }
    }
    if let Some((name, code)) = interrupted {
        let message = format!(
            "stopped by {name} after {:.2} s of the {} s asked: the results are for the time it ran{}",
            elapsed.as_secs_f64(),
            a.runtime.as_secs_f64(),
            match (&fatal, errors) {
                (Some(why), _) => format!("; {why}"),
                (None, 0) => String::new(),
                (None, n) => format!(" ({n} I/O errors)"),
            }
        );
        return Err(Box::new(Interrupted { code, message }));
    }
    match (fatal, errors) {
        (Some(why), 0) => Err(why.into()),
        (Some(why), n) => Err(format!("{why}; {n} I/O errors").into()),
        (None, 0) => Ok(()),
        (None, n) => Err(format!("{n} I/O errors").into()),
    }
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
/// or the load's end (`done`), whichever comes first (stops at the first failure).
fn spawn_migrations(
    h: nvme_driver::DeviceHandle,
    (pause, done): (Arc<load::Pause>, Arc<AtomicBool>),
    [from, to]: [PathBuf; 2],
    every: Duration,
    deadline: Instant,
) -> std::thread::JoinHandle<Migrations> {
    std::thread::spawn(move || {
        let m = migrate_until(h, (&pause, &done), [from, to], every, deadline);
        measure::thread_finishing();
        m
    })
}

/// The migration thread's loop (see [`spawn_migrations`]).
fn migrate_until(
    h: nvme_driver::DeviceHandle,
    (pause, done): (&load::Pause, &AtomicBool),
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
        // In slices: a load that ended early (an error, a signal) ends this too.
        while let Some(left) = at.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
            if done.load(Ordering::SeqCst) {
                return m;
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
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
