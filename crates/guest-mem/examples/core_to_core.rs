//! How long a cache line takes to go from one CPU to another and back: the cost
//! every polled doorbell and completion entry pays between a client and a server
//! pinned to those CPUs.
//!
//! On a shared host the two virtual CPUs a benchmark is given do not keep their
//! place: seen here (2-vCPU AMD EPYC guest), the round trip between CPU 0 and 1 is
//! about 100-160 ns for a while, then 440-510 ns (the two vCPUs landed on cores
//! that share no cache), then back, within a minute. A polled client and server
//! then run at half speed, and a pair of runs either side of such a move compares
//! two placements, not two servers. `scripts/bench-vfio-user.sh --pin` runs this
//! before and after every run and flags a pair whose round trips disagree.
//!
//! Two threads, pinned to `--cpus A,B`, pass a counter back and forth through one
//! atomic on its own cache line: `--trips` round trips per batch, `--batches`
//! batches, the first unmeasured (both threads spinning, the line warm).
//!
//! ```text
//! cargo build --release -p guest-mem --example core_to_core
//! target/release/examples/core_to_core --cpus 0,1 [--trips 10000] [--batches 7]
//! ```
//!
//! Prints the median batch's nanoseconds per round trip on stdout (a bare number,
//! for scripts), and every knob and batch on stderr.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// One atomic alone on a 128-byte line pair (adjacent-line prefetch included).
#[repr(align(128))]
struct Line(AtomicU64);

#[derive(Debug)]
struct Knobs {
    cpus: (usize, usize),
    trips: u64,
    batches: usize,
}

fn parse_args() -> Result<Knobs, String> {
    let mut k = Knobs { cpus: (0, 1), trips: 10_000, batches: 7 };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--cpus" => {
                let v = value()?;
                let (x, y) = v.split_once(',').ok_or_else(|| format!("--cpus {v:?}: give two CPUs, A,B"))?;
                let cpu = |s: &str| {
                    s.parse::<usize>().map_err(|_| format!("--cpus {v:?}: {s:?} is not a CPU number"))
                };
                k.cpus = (cpu(x)?, cpu(y)?);
                if k.cpus.0 == k.cpus.1 {
                    return Err(format!("--cpus {v:?}: two different CPUs"));
                }
            }
            "--trips" => {
                let v = value()?;
                k.trips = v.parse().ok().filter(|&n| n > 0).ok_or_else(|| format!("bad --trips {v:?}"))?;
            }
            "--batches" => {
                let v = value()?;
                k.batches = v
                    .parse()
                    .ok()
                    .filter(|&n| n > 1)
                    .ok_or_else(|| format!("bad --batches {v:?} (2 or more)"))?;
            }
            "-h" | "--help" => {
                return Err("usage: core_to_core [--cpus A,B] [--trips N] [--batches K]".into());
            }
            _ => return Err(format!("unknown argument {a:?}")),
        }
    }
    Ok(k)
}

fn pin(cpu: usize) -> Result<(), String> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(format!("CPU {cpu}: past CPU_SETSIZE"));
    }
    // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: cpu < CPU_SETSIZE (checked above), so the bit is inside `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a live cpu_set_t of the size passed; pid 0 is this thread.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(format!("pinning to CPU {cpu}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

fn main() -> ExitCode {
    let k = match parse_args() {
        Ok(k) => k,
        Err(e) => {
            eprintln!("core_to_core: {e}");
            return ExitCode::from(2);
        }
    };
    // Both CPUs checked here, before the far side is waited for: a far side that
    // could not pin itself would leave this side spinning.
    if let Err(e) = pin(k.cpus.1).and_then(|()| pin(k.cpus.0)) {
        eprintln!("core_to_core: {e}");
        return ExitCode::FAILURE;
    }
    let line = Arc::new(Line(AtomicU64::new(0)));
    let total = k.trips * k.batches as u64;
    let other = line.clone();
    let cpu_b = k.cpus.1;
    // The far side answers every odd value with the next even one.
    let far = std::thread::spawn(move || -> Result<(), String> {
        pin(cpu_b)?;
        let mut want = 1;
        while want < 2 * total {
            while other.0.load(Ordering::Acquire) != want {
                std::hint::spin_loop();
            }
            other.0.store(want + 1, Ordering::Release);
            want += 2;
        }
        Ok(())
    });
    let mut ns = Vec::with_capacity(k.batches);
    let mut v = 0;
    for _ in 0..k.batches {
        let t0 = Instant::now();
        for _ in 0..k.trips {
            line.0.store(v + 1, Ordering::Release);
            while line.0.load(Ordering::Acquire) != v + 2 {
                std::hint::spin_loop();
            }
            v += 2;
        }
        ns.push(t0.elapsed().as_nanos() as f64 / k.trips as f64);
    }
    match far.join() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            eprintln!("core_to_core: {e}");
            return ExitCode::FAILURE;
        }
        Err(_) => return ExitCode::FAILURE,
    }
    let mut measured = ns[1..].to_vec();
    measured.sort_by(f64::total_cmp);
    let median = measured[measured.len() / 2];
    eprintln!(
        "core_to_core: CPU {} <-> CPU {}: {median:.0} ns per round trip (median of {} batches of {}; min {:.0}, max {:.0}; warm-up {:.0})",
        k.cpus.0,
        k.cpus.1,
        measured.len(),
        k.trips,
        measured[0],
        measured[measured.len() - 1],
        ns[0]
    );
    println!("{median:.0}");
    ExitCode::SUCCESS
}
