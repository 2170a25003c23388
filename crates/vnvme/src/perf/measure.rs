//! What is measured around the run, besides the I/O itself: CPU time (this
//! process's, the server's, or in-process the controller's worker threads') and the
//! controller's counters (the server's `--stats-file`, or the in-process controller's
//! own), each read once before and once after.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvme_ctrl::{Stats, StatsSnapshot};
use serde_json::{json, Value};

/// Run time of this process's load threads as each finished (nanoseconds), by
/// thread ID ([`thread_finishing`]): schedstat exists only for live threads, and a
/// thread just joined may still be listed for a moment, so it is counted from here.
static FINISHED: Mutex<BTreeMap<u32, u64>> = Mutex::new(BTreeMap::new());

/// Run time of one task from its schedstat file (nanoseconds).
fn schedstat_ns(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.split_whitespace().next()?.parse().ok()
}

/// Called by a load thread as its last step: keeps its CPU time in
/// [`cpu_time`] after it is gone.
pub(super) fn thread_finishing() {
    let tid = std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name()?.to_str()?.parse::<u32>().ok());
    if let (Some(tid), Some(ns)) = (tid, schedstat_ns(Path::new("/proc/thread-self/schedstat"))) {
        FINISHED.lock().unwrap_or_else(|p| p.into_inner()).insert(tid, ns);
    }
}

/// CPU time of this process: the run time in /proc/self/task/*/schedstat
/// (nanoseconds) of its live threads, plus what the load threads that finished
/// reported ([`thread_finishing`]), or the process CPU clock where that file does
/// not exist. The file first: rustix reads the vDSO itself for the clock, which
/// faults under valgrind (scripts/bench-cost.sh runs perf under callgrind).
fn cpu_time() -> Duration {
    let from_schedstat = || -> Option<u64> {
        let finished = FINISHED.lock().unwrap_or_else(|p| p.into_inner());
        let mut ns: u64 = finished.values().sum();
        for t in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
            // A task that went away meanwhile is skipped, not a reason to give up.
            let tid = t.file_name().to_str().and_then(|n| n.parse::<u32>().ok());
            if tid.is_some_and(|tid| finished.contains_key(&tid)) {
                continue;
            }
            ns += schedstat_ns(&t.path().join("schedstat")).unwrap_or(0);
        }
        Some(ns)
    };
    match from_schedstat() {
        Some(ns) => Duration::from_nanos(ns),
        None => {
            let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
            Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
        }
    }
}

/// `/proc/<pid>/stat` and `/proc/self/task/<tid>/stat` count CPU time in USER_HZ
/// ticks, which Linux fixes at 100 on every architecture for this interface.
pub(super) const USER_HZ: f64 = 100.0;

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

fn read_server_stats(p: &Path) -> Option<Value> {
    serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok()
}

/// Server counters once they include `ios` more I/O commands than `before` (the
/// server rewrites its stats file twice a second; bounded wait).
fn server_stats_after(p: &Path, before: &Value, ios: u64) -> Option<Value> {
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

/// CPU clocks read as the run starts; [`Clocks::stop`] reads them again.
pub(super) struct Clocks {
    process: Duration,
    /// `/proc/<pid>/stat` of the server and what it said, with `--server-pid`.
    server: Option<(u32, PathBuf, Option<f64>)>,
    /// The in-process controller's worker threads' CPU seconds.
    workers: Option<f64>,
}

/// CPU time over the run.
#[derive(Debug)]
pub(super) struct CpuUse {
    /// This process's, less the in-process controller's worker threads.
    pub client: Duration,
    /// This process's, all threads.
    pub process: Duration,
    pub server: Option<ServerCpu>,
}

/// The server's CPU time over the run, and whose it is.
#[derive(Debug, Clone, Copy)]
pub(super) enum ServerCpu {
    /// The server process (`--server-pid`).
    Process { pid: u32, seconds: f64 },
    /// The in-process controller's worker threads.
    Workers { seconds: f64 },
}

impl ServerCpu {
    pub(super) fn seconds(self) -> f64 {
        match self {
            ServerCpu::Process { seconds, .. } | ServerCpu::Workers { seconds } => seconds,
        }
    }

    /// Where the figure comes from, for the JSON.
    pub(super) fn source(self) -> String {
        match self {
            ServerCpu::Process { pid, .. } => format!("/proc/{pid}/stat utime+stime (USER_HZ {USER_HZ})"),
            ServerCpu::Workers { .. } => {
                format!("/proc/self/task/*/stat of vnvme-q* threads (USER_HZ {USER_HZ})")
            }
        }
    }
}

impl Clocks {
    /// Reads the clocks: the server's (`server_pid`), the in-process controller's
    /// workers' (`in_process`), and last, nearest the run, this process's.
    pub(super) fn start(server_pid: Option<u32>, in_process: bool) -> Clocks {
        let server = server_pid.map(|pid| {
            let path = PathBuf::from(format!("/proc/{pid}/stat"));
            let before = proc_cpu(&path);
            (pid, path, before)
        });
        let workers = in_process.then(worker_threads_cpu);
        Clocks { process: cpu_time(), server, workers }
    }

    /// Reads the clocks again, this process's first.
    pub(super) fn stop(self) -> CpuUse {
        let process = cpu_time() - self.process;
        let server = self.server.and_then(|(pid, path, before)| {
            Some(ServerCpu::Process { pid, seconds: proc_cpu(&path)? - before? })
        });
        // In-process, the controller's workers are ours: split them out as the "server".
        let workers = self.workers.map(|w0| (worker_threads_cpu() - w0).max(0.0));
        let client = process.saturating_sub(Duration::from_secs_f64(workers.unwrap_or(0.0)));
        let server = server.or(workers.map(|seconds| ServerCpu::Workers { seconds }));
        CpuUse { client, process, server }
    }
}

/// The controller's counters over the run.
pub(super) enum Counters {
    /// None asked for.
    None,
    /// The server's `--stats-file`, and what it said before the run (`None`: unreadable).
    File { path: PathBuf, before: Option<Value> },
    /// The in-process controller's, before and (once stopped) after the run (boxed:
    /// two snapshots would make every variant that large).
    InProcess { stats: Arc<Stats>, before: Box<StatsSnapshot>, after: Option<Box<StatsSnapshot>> },
}

impl Counters {
    /// Reads the counters before the run.
    pub(super) fn start(server_stats: Option<&Path>, ctrl: Option<&Arc<Stats>>) -> Counters {
        match (ctrl, server_stats) {
            (Some(stats), _) => {
                Counters::InProcess { stats: stats.clone(), before: Box::new(stats.snapshot()), after: None }
            }
            (None, Some(path)) => {
                Counters::File { path: path.to_path_buf(), before: read_server_stats(path) }
            }
            (None, None) => Counters::None,
        }
    }

    /// Ends the run for the in-process controller's counters, read now. A stats file is
    /// read in [`Counters::delta`], once the server has written the run's counts.
    pub(super) fn stop(&mut self) {
        if let Counters::InProcess { stats, after, .. } = self {
            *after = Some(Box::new(stats.snapshot()));
        }
    }

    /// How the counters moved over the run, as JSON; from a stats file, once it counts
    /// the run's `ios` I/O commands (a bounded wait).
    pub(super) fn delta(&self, ios: u64) -> Option<Value> {
        match self {
            Counters::InProcess { before: b, after: Some(f), .. } => {
                let field = |s: &StatsSnapshot, k: &str| s.get(k).unwrap_or(0);
                Some(counters_json(json!("in-process controller"), &|k| {
                    field(f, k).saturating_sub(field(b, k))
                }))
            }
            Counters::File { path, before: Some(before) } => {
                server_stats_after(path, before, ios).map(|after| {
                    counters_json(json!(path), &|k| {
                        after[k].as_u64().unwrap_or(0).saturating_sub(before[k].as_u64().unwrap_or(0))
                    })
                })
            }
            Counters::File { path, before: None } => {
                crate::logging::say!("vnvme perf: cannot read server stats from {}", path.display());
                None
            }
            Counters::InProcess { after: None, .. } | Counters::None => None,
        }
    }
}

/// The counters `perf` reports, from `delta(name)`, and their rates per I/O command.
fn counters_json(source: Value, delta: &dyn Fn(&str) -> u64) -> Value {
    let (sio, sdb, sirq) = (delta("io_commands"), delta("io_doorbell_writes"), delta("interrupts"));
    let per = |n: u64| if sio == 0 { 0.0 } else { n as f64 / sio as f64 };
    json!({
        "source": source,
        "io_commands": sio,
        "io_doorbell_writes": sdb,
        "interrupts": sirq,
        "shadow_reads": delta("shadow_reads"),
        "eventidx_races": delta("eventidx_races"),
        "doorbell_pauses": delta("doorbell_pauses"),
        "trapped_doorbells_per_io": per(sdb),
        "interrupts_per_io": per(sirq),
    })
}
