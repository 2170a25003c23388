//! The stable, time-bounded fuzz runner (no nightly, no libFuzzer): seeded random
//! programs and mutations of the corpus, each run under `catch_unwind` and a watchdog.
//!
//! ```text
//! fuzz-run [--target controller|vfio|state|all] [--seconds N | --iterations N] [--seed S]
//!          [--corpus DIR] [--artifacts DIR] [--timeout SECS] [--quiet] [--known-bugs]
//! fuzz-run --replay FILE...      run inputs once (exit 1 on a crash, 3 on a hang)
//! fuzz-run --minimize FILE       shrink a crashing or hanging input to FILE.min
//! fuzz-run --dump FILE           print the program an input decodes to
//! fuzz-run --write-seeds DIR     write the hand-built seed programs
//! ```
//!
//! Three targets: `controller` (programs of commands, register and memory map changes
//! against the controller), `vfio` (vfio-user message sequences with descriptors of
//! every kind against the vfio-user server) and `state` (saved controller states
//! mutated field by field, restored into a new controller); `all`, the default
//! (`both` is an older name for it), splits the time or iterations between them.
//! Inputs of the vfio and state targets are saved with `-vfio` or `-state` in their
//! name, which is how `--replay` (with `--target all`) tells them apart.
//!
//! A crash writes its input to `<artifacts>/crash-<hash>` (one per panic location), a
//! hang (an input running longer than `--timeout`, default 60 s) to
//! `<artifacts>/timeout-<hash>`; either makes the exit status non-zero. Inputs slower
//! than 2 s are reported and the first few saved as `slow-<hash>`, without failing:
//! the controller has bounded but long waits (a shutdown may spin 10^6 times).
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use nvme_fuzz::gen::{fnv1a, mutate, random_program, Rng};
use nvme_fuzz::guard::{catch, install_panic_hook, run_catching, set_quiet, Crash, Watchdog};
use nvme_fuzz::state::{run_state_counted, StateStats};
use nvme_fuzz::vfio::{run_vfio_counted, set_check_fd_leaks, VfioStats};
use nvme_fuzz::{Program, Stats};
use std::sync::atomic::{AtomicBool, Ordering};

/// Inputs slower than this are reported, not failed.
const SLOW: Duration = Duration::from_secs(2);

const DEFAULT_CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/corpus");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Controller,
    Vfio,
    State,
    All,
}

/// The vfio or state target is running (names what the watchdog saves).
static RUNNING_VFIO: AtomicBool = AtomicBool::new(false);
static RUNNING_STATE: AtomicBool = AtomicBool::new(false);

#[derive(Debug)]
struct Args {
    target: Target,
    seconds: Option<f64>,
    iterations: Option<u64>,
    seed: Option<u64>,
    corpus: PathBuf,
    artifacts: PathBuf,
    timeout: Duration,
    quiet: bool,
    replay: Vec<PathBuf>,
    minimize: Option<PathBuf>,
    dump: Option<PathBuf>,
    write_seeds: Option<PathBuf>,
}

fn usage(msg: &str) -> ! {
    eprintln!("fuzz-run: {msg}");
    eprintln!(
        "usage: fuzz-run [--target controller|vfio|state|all] [--seconds N | --iterations N] [--seed S] [--corpus DIR] [--artifacts DIR] \
         [--timeout SECS] [--quiet] [--known-bugs] | --replay FILE... | --minimize FILE | --dump FILE | --write-seeds DIR"
    );
    std::process::exit(2)
}

fn parse_u64(s: &str) -> u64 {
    let r = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.unwrap_or_else(|_| usage(&format!("not a number: {s}")))
}

fn parse_args() -> Args {
    let mut a = Args {
        target: Target::All,
        seconds: None,
        iterations: None,
        seed: None,
        corpus: DEFAULT_CORPUS.into(),
        artifacts: "fuzz-artifacts".into(),
        timeout: Duration::from_secs(60),
        quiet: false,
        replay: Vec::new(),
        minimize: None,
        dump: None,
        write_seeds: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| usage(&format!("{arg} needs a value")));
        match arg.as_str() {
            "--seconds" => a.seconds = Some(val().parse().unwrap_or_else(|_| usage("bad --seconds"))),
            "--target" => {
                a.target = match val().as_str() {
                    "controller" => Target::Controller,
                    "vfio" => Target::Vfio,
                    "state" => Target::State,
                    "all" | "both" => Target::All,
                    t => usage(&format!("unknown target {t}")),
                }
            }
            "--iterations" => a.iterations = Some(parse_u64(&val())),
            "--seed" => a.seed = Some(parse_u64(&val())),
            "--corpus" => a.corpus = val().into(),
            "--artifacts" => a.artifacts = val().into(),
            "--timeout" => {
                a.timeout = Duration::from_secs_f64(val().parse().unwrap_or_else(|_| usage("bad --timeout")))
            }
            "--quiet" => a.quiet = true,
            "--known-bugs" => nvme_fuzz::set_explore_known_bugs(true),
            "--replay" => {
                a.replay.extend(it.by_ref().map(PathBuf::from));
                if a.replay.is_empty() {
                    usage("--replay needs files");
                }
            }
            "--minimize" => a.minimize = Some(val().into()),
            "--dump" => a.dump = Some(val().into()),
            "--write-seeds" => a.write_seeds = Some(val().into()),
            "-h" | "--help" => usage("help"),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    a
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| usage(&format!("{}: {e}", path.display())))
}

fn load_corpus(dir: &Path) -> Vec<Vec<u8>> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> =
        rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_file()).collect();
    files.sort();
    files.iter().map(|p| read(p)).collect()
}

fn save(dir: &Path, prefix: &str, data: &[u8]) -> PathBuf {
    let _ = std::fs::create_dir_all(dir);
    let path = dir.join(format!("{prefix}-{:016x}", fnv1a(data)));
    if let Err(e) = std::fs::write(&path, data) {
        eprintln!("fuzz: cannot write {}: {e}", path.display());
    }
    path
}

fn main() -> ExitCode {
    let args = parse_args();
    if let Some(p) = &args.dump {
        println!("{:#?}", Program::decode(&read(p)));
        return ExitCode::SUCCESS;
    }
    if let Some(dir) = &args.write_seeds {
        for (name, p) in nvme_fuzz::seeds::seeds() {
            let path = dir.join(name);
            std::fs::write(&path, p.encode()).unwrap_or_else(|e| usage(&format!("{}: {e}", path.display())));
            println!("wrote {}", path.display());
        }
        return ExitCode::SUCCESS;
    }
    if let Some(p) = &args.minimize {
        return minimize(p, args.timeout);
    }
    install_panic_hook(args.quiet);
    let artifacts = args.artifacts.clone();
    let wd = Watchdog::spawn(args.timeout, move |data| {
        let prefix = if RUNNING_VFIO.load(Ordering::Relaxed) {
            "timeout-vfio"
        } else if RUNNING_STATE.load(Ordering::Relaxed) {
            "timeout-state"
        } else {
            "timeout"
        };
        let p = save(&artifacts, prefix, data);
        eprintln!("fuzz: an input ran for too long (hang?); saved to {}", p.display());
    });
    if !args.replay.is_empty() {
        return replay(&args.replay, args.target, &wd);
    }
    fuzz(&args, &wd)
}

fn replay(files: &[PathBuf], target: Target, wd: &Watchdog) -> ExitCode {
    let mut failed = false;
    for f in files {
        let data = read(f);
        let named = |s: &str| f.file_name().is_some_and(|n| n.to_string_lossy().contains(s));
        let which = match target {
            Target::All if named("vfio") => Target::Vfio,
            Target::All if named("state") => Target::State,
            Target::All => Target::Controller,
            t => t,
        };
        RUNNING_VFIO.store(which == Target::Vfio, Ordering::Relaxed);
        RUNNING_STATE.store(which == Target::State, Ordering::Relaxed);
        wd.arm(&data);
        let r = match which {
            Target::Vfio => catch(|| run_vfio_counted(&data, &mut VfioStats::default())),
            Target::State => catch(|| run_state_counted(&data, &mut StateStats::default())),
            _ => run_catching(&data, &mut Stats::default()),
        };
        wd.disarm();
        match r {
            Ok(()) => println!("ok {}", f.display()),
            Err(c) => {
                // The minimiser's child protocol: one CRASH line with the location.
                println!("CRASH {} {}", c.location, f.display());
                eprintln!("fuzz: {}: {c}", f.display());
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn fuzz(args: &Args, wd: &Watchdog) -> ExitCode {
    let seed = args.seed.unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        t.as_nanos() as u64 ^ (std::process::id() as u64) << 32
    });
    let targets: &[Target] = match args.target {
        Target::All => &[Target::Controller, Target::Vfio, Target::State],
        Target::Controller => &[Target::Controller],
        Target::Vfio => &[Target::Vfio],
        Target::State => &[Target::State],
    };
    let n = targets.len();
    let iterations = args.iterations.map(|i| i.div_ceil(n as u64));
    let limit = match (args.seconds, iterations) {
        (_, Some(_)) => None,
        (Some(s), None) => Some(Duration::from_secs_f64(s / n as f64)),
        (None, None) => Some(Duration::from_secs(30 / n as u64)),
    };
    let mut ok = true;
    for t in targets {
        ok &= match t {
            Target::Vfio => fuzz_vfio(args, wd, seed, limit, iterations),
            Target::State => fuzz_state(args, wd, seed, limit, iterations),
            _ => fuzz_controller(args, wd, seed, limit, iterations),
        };
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Crashes seen so far, by panic location: the first one's input, and how many.
type Crashes = BTreeMap<String, (Crash, PathBuf, u64)>;

/// Records a crash; saves and prints the input the first time a location is hit.
fn record(crashes: &mut Crashes, c: Crash, artifacts: &Path, prefix: &str, input: &[u8]) {
    match crashes.get_mut(&c.location) {
        Some(e) => e.2 += 1,
        None => {
            let path = save(artifacts, prefix, input);
            eprintln!("fuzz: crash #{}: {c}\nfuzz: input saved to {}", crashes.len() + 1, path.display());
            // Later hits of the same location would only repeat the trace.
            set_quiet(true);
            crashes.insert(c.location.clone(), (c, path, 1));
        }
    }
}

/// The vfio-user target: fresh random inputs (their decoding makes most of them
/// start with a driver-like bring-up), each run checked for descriptor leaks.
fn fuzz_vfio(
    args: &Args,
    wd: &Watchdog,
    seed: u64,
    limit: Option<Duration>,
    iterations: Option<u64>,
) -> bool {
    RUNNING_VFIO.store(true, Ordering::Relaxed);
    set_check_fd_leaks(true);
    let mut rng = Rng::new(seed ^ 0x7f10_05e5);
    let mut stats = VfioStats::default();
    let mut crashes = Crashes::new();
    let start = Instant::now();
    let (mut runs, mut slow) = (0u64, 0u64);
    while !(iterations.is_some_and(|n| runs >= n) || limit.is_some_and(|l| start.elapsed() >= l)) {
        let max = 1 + rng.below(1024);
        let mut input = vec![0u8; 8 + rng.below(max) as usize];
        rng.fill(&mut input);
        wd.arm(&input);
        let t = Instant::now();
        let r = catch(|| run_vfio_counted(&input, &mut stats));
        let took = t.elapsed();
        wd.disarm();
        runs += 1;
        if took > SLOW {
            slow += 1;
            if slow <= 5 {
                let p = save(&args.artifacts, "slow-vfio", &input);
                eprintln!("fuzz: a vfio input took {took:.1?}; saved to {}", p.display());
            }
        }
        if let Err(c) = r {
            record(&mut crashes, c, &args.artifacts, "crash-vfio", &input);
        }
    }
    RUNNING_VFIO.store(false, Ordering::Relaxed);
    let secs = start.elapsed().as_secs_f64();
    let n_crash: u64 = crashes.values().map(|c| c.2).sum();
    println!(
        "fuzz: vfio-user: {runs} runs in {secs:.1} s ({:.0} runs/s), {n_crash} crashes ({} distinct), seed {seed:#x}",
        runs as f64 / secs.max(1e-9),
        crashes.len()
    );
    println!("fuzz: vfio-user: {}", stats.line());
    if slow > 0 {
        println!("fuzz: vfio-user: {slow} inputs took longer than {SLOW:?} (not failures)");
    }
    for (c, path, n) in crashes.values() {
        println!("fuzz: CRASH x{n} {c} -> {}", path.display());
    }
    crashes.is_empty()
}

/// The state target: random inputs, each up to three mutations of a saved state.
fn fuzz_state(
    args: &Args,
    wd: &Watchdog,
    seed: u64,
    limit: Option<Duration>,
    iterations: Option<u64>,
) -> bool {
    RUNNING_STATE.store(true, Ordering::Relaxed);
    let mut rng = Rng::new(seed ^ 0x57a7_e5ed);
    let mut stats = StateStats::default();
    let mut crashes = Crashes::new();
    let start = Instant::now();
    let mut runs = 0u64;
    while !(iterations.is_some_and(|n| runs >= n) || limit.is_some_and(|l| start.elapsed() >= l)) {
        let mut input = vec![0u8; 4 + rng.below(64) as usize];
        rng.fill(&mut input);
        wd.arm(&input);
        let r = catch(|| run_state_counted(&input, &mut stats));
        wd.disarm();
        runs += 1;
        if let Err(c) = r {
            record(&mut crashes, c, &args.artifacts, "crash-state", &input);
        }
    }
    RUNNING_STATE.store(false, Ordering::Relaxed);
    let secs = start.elapsed().as_secs_f64();
    let n_crash: u64 = crashes.values().map(|c| c.2).sum();
    println!(
        "fuzz: state: {runs} runs in {secs:.1} s ({:.0} runs/s), {n_crash} crashes ({} distinct), seed {seed:#x}",
        runs as f64 / secs.max(1e-9),
        crashes.len()
    );
    println!("fuzz: state: {}", stats.line());
    for (c, path, n) in crashes.values() {
        println!("fuzz: CRASH x{n} {c} -> {}", path.display());
    }
    crashes.is_empty()
}

/// The controller target: random programs and mutations of the corpus.
fn fuzz_controller(
    args: &Args,
    wd: &Watchdog,
    seed: u64,
    limit: Option<Duration>,
    iterations: Option<u64>,
) -> bool {
    let corpus = load_corpus(&args.corpus);
    let mut rng = Rng::new(seed);
    let mut stats = Stats::default();
    let mut crashes = Crashes::new();
    let start = Instant::now();
    let mut runs = 0u64;
    let mut slow = 0u64;
    eprintln!("fuzz: seed {seed:#x}, {} corpus inputs, timeout {:?}", corpus.len(), args.timeout);
    loop {
        if iterations.is_some_and(|n| runs >= n) || limit.is_some_and(|l| start.elapsed() >= l) {
            break;
        }
        let input = if corpus.is_empty() || rng.below(10) < 4 {
            random_program(&mut rng)
        } else {
            let a = &corpus[rng.below(corpus.len() as u64) as usize];
            let b = &corpus[rng.below(corpus.len() as u64) as usize];
            mutate(&mut rng, a, b)
        };
        wd.arm(&input);
        let t = Instant::now();
        let r = run_catching(&input, &mut stats);
        let took = t.elapsed();
        wd.disarm();
        runs += 1;
        if took > SLOW {
            slow += 1;
            if slow <= 5 {
                let p = save(&args.artifacts, "slow", &input);
                eprintln!("fuzz: an input took {took:.1?}; saved to {}", p.display());
            }
        }
        if let Err(c) = r {
            record(&mut crashes, c, &args.artifacts, "crash", &input);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let n_crash: u64 = crashes.values().map(|c| c.2).sum();
    println!(
        "fuzz: controller: {runs} runs in {secs:.1} s ({:.0} runs/s), {n_crash} crashes ({} distinct), seed {seed:#x}",
        runs as f64 / secs.max(1e-9),
        crashes.len()
    );
    println!("fuzz: actions: {}", stats.action_line());
    if slow > 0 {
        println!("fuzz: {slow} inputs took longer than {SLOW:?} (not failures)");
    }
    println!(
        "fuzz: checked {} completions ({} with an error status) and {} drains; init ok {} failed {}; \
         {} skipped actions; {} runs with I/O workers; {} runs ended tainted, {} with CSTS.CFS",
        stats.checked_completions,
        stats.error_completions,
        stats.checked_drains,
        stats.init_ok,
        stats.init_failed,
        stats.skipped,
        stats.worker_runs,
        stats.tainted_runs,
        stats.fatal_runs
    );
    for (c, path, n) in crashes.values() {
        println!("fuzz: CRASH x{n} {c} -> {}", path.display());
    }
    crashes.is_empty()
}

/// How a candidate input behaves, judged in a child process.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    Pass,
    Crash(String),
    Hang,
}

fn judge(data: &[u8], timeout: Duration) -> Outcome {
    let path =
        std::env::temp_dir().join(format!("nvme-fuzz-min-{}-{:016x}", std::process::id(), fnv1a(data)));
    std::fs::write(&path, data).expect("write candidate");
    let exe = std::env::current_exe().expect("current exe");
    let known: &[&str] = if nvme_fuzz::explore_known_bugs() { &["--known-bugs"] } else { &[] };
    let mut child = Command::new(exe)
        .args(["--quiet", "--timeout", "3600"])
        .args(known)
        .arg("--replay")
        .arg(&path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn replay");
    let start = Instant::now();
    let out = loop {
        if let Some(_status) = child.try_wait().expect("wait") {
            break child.wait_with_output().expect("output");
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_file(&path);
            return Outcome::Hang;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let _ = std::fs::remove_file(&path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.lines().find_map(|l| l.strip_prefix("CRASH ")) {
        Some(rest) => Outcome::Crash(rest.split(' ').next().unwrap_or("").to_string()),
        None => Outcome::Pass,
    }
}

/// Shrinks an input while it keeps failing the same way: drop actions, then
/// un-mutate the ones left.
fn minimize(path: &Path, timeout: Duration) -> ExitCode {
    let data = read(path);
    let want = judge(&data, timeout);
    if want == Outcome::Pass {
        eprintln!("fuzz: {} does not fail; nothing to minimise", path.display());
        return ExitCode::from(1);
    }
    eprintln!("fuzz: minimising {} ({want:?})", path.display());
    let mut best = Program::decode(&data);
    if judge(&best.encode(), timeout) != want {
        eprintln!("fuzz: the canonical encoding behaves differently; keeping the bytes as they are");
        return ExitCode::from(1);
    }
    loop {
        let before = best.clone();
        let mut i = best.actions.len();
        while i > 0 {
            i -= 1;
            let mut c = best.clone();
            c.actions.remove(i);
            if judge(&c.encode(), timeout) == want {
                best = c;
            }
        }
        for i in 0..best.actions.len() {
            let mut c = best.clone();
            if simplify(&mut c.actions[i]) && judge(&c.encode(), timeout) == want {
                best = c;
            }
        }
        if best == before {
            break;
        }
    }
    let out = PathBuf::from(format!("{}.min", path.display()));
    std::fs::write(&out, best.encode()).expect("write minimised input");
    println!("{best:#?}");
    println!("fuzz: {} actions, {} bytes -> {}", best.actions.len(), best.encode().len(), out.display());
    ExitCode::SUCCESS
}

/// Makes an action plainer; false if there is nothing to simplify.
fn simplify(a: &mut nvme_fuzz::program::Action) -> bool {
    use nvme_fuzz::program::{Action, Mutation};
    match a {
        Action::Io(c) if c.mutation != Mutation::default() => c.mutation = Mutation::default(),
        Action::Admin(c) if c.mutation != Mutation::default() => c.mutation = Mutation::default(),
        _ => return false,
    }
    true
}
