//! The host's memcpy bandwidth on one core: the physical limit of a backend that
//! copies every byte it serves, such as a RAM namespace copying into guest memory
//! (`GuestMemory::write` is one `copy_nonoverlapping` per mapped chunk).
//!
//! Copies `--chunk` bytes at a time from a source much larger than the caches
//! (`--src`, walked in order, or at random chunk offsets with `--random`) into a
//! destination set the size of the buffers a client keeps in flight (`--dst`: QD x
//! the I/O size), as a server copies a namespace's data into the buffers of the
//! commands in flight. Both are filled before the clock starts (no page faults are
//! timed) and one unmeasured repetition warms the destination up. Each of
//! `--repeat` repetitions copies for `--seconds` and gives GB/s (10^9 bytes copied,
//! not read plus written, per second). Pin it with taskset to the CPU to measure.
//!
//! ```text
//! cargo build --release -p guest-mem --example memcpy_bw
//! taskset -c 1 target/release/examples/memcpy_bw --chunk 128K --dst 8M --src 2G \
//!     --seconds 0.5 --repeat 5 [--random] [--json FILE]
//! ```
//!
//! Prints one JSON object (to FILE with `--json`, and always a line for people on
//! stderr): every knob, the CPUs it was allowed, each repetition's GB/s, their
//! median, minimum and maximum.

use std::hint::black_box;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// What to measure, from the command line.
#[derive(Debug)]
struct Knobs {
    chunk: usize,
    dst: usize,
    src: usize,
    seconds: f64,
    repeat: usize,
    random: bool,
    json: Option<String>,
}

/// A size: bytes, or with a K, M or G suffix (powers of 1024).
fn parse_size(s: &str) -> Result<usize, String> {
    let (num, mul) = match s.as_bytes().last().map(u8::to_ascii_uppercase) {
        Some(b'K') => (&s[..s.len() - 1], 1 << 10),
        Some(b'M') => (&s[..s.len() - 1], 1 << 20),
        Some(b'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let n: usize = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    n.checked_mul(mul).filter(|&v| v > 0).ok_or_else(|| format!("size {s:?}: not a positive size"))
}

fn parse_args() -> Result<Knobs, String> {
    let mut k = Knobs {
        chunk: 128 << 10,
        dst: 128 << 10,
        src: 2 << 30,
        seconds: 0.5,
        repeat: 5,
        random: false,
        json: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--chunk" => k.chunk = parse_size(&value()?)?,
            "--dst" => k.dst = parse_size(&value()?)?,
            "--src" => k.src = parse_size(&value()?)?,
            "--seconds" => {
                let v = value()?;
                k.seconds = v
                    .parse()
                    .ok()
                    .filter(|s: &f64| *s > 0.0)
                    .ok_or_else(|| format!("bad --seconds {v:?}"))?;
            }
            "--repeat" => {
                let v = value()?;
                k.repeat = v.parse().ok().filter(|&n| n > 0).ok_or_else(|| format!("bad --repeat {v:?}"))?;
            }
            "--random" => k.random = true,
            "--json" => k.json = Some(value()?),
            "-h" | "--help" => return Err(String::new()),
            _ => return Err(format!("unknown argument {a:?}")),
        }
    }
    if k.dst < k.chunk || k.src < k.chunk {
        return Err("--dst and --src must each hold at least one --chunk".into());
    }
    Ok(k)
}

/// A small xorshift generator: random chunk offsets without a dependency.
#[derive(Debug)]
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Copies chunks from `src` into the slots of `dst` for `secs`; returns GB/s.
fn measure(k: &Knobs, src: &[u8], dst: &mut [u8], rng: &mut XorShift, next: &mut usize, secs: f64) -> f64 {
    let (src_chunks, dst_slots) = (src.len() / k.chunk, dst.len() / k.chunk);
    // Read the clock about once per MiB copied: rarely enough not to be measured.
    let batch = ((1 << 20) / k.chunk).max(1);
    let limit = Duration::from_secs_f64(secs);
    let mut slot = 0;
    let mut bytes = 0u64;
    let start = Instant::now();
    loop {
        for _ in 0..batch {
            let s = if k.random {
                rng.below(src_chunks)
            } else {
                *next = (*next + 1) % src_chunks;
                *next
            };
            slot = (slot + 1) % dst_slots;
            dst[slot * k.chunk..(slot + 1) * k.chunk].copy_from_slice(&src[s * k.chunk..(s + 1) * k.chunk]);
        }
        // The copies must happen: the destination is handed to an opaque reader.
        black_box(&mut *dst);
        bytes += (batch * k.chunk) as u64;
        let el = start.elapsed();
        if el >= limit {
            return bytes as f64 / el.as_secs_f64() / 1e9;
        }
    }
}

/// The CPUs this process may run on (`Cpus_allowed_list`), as taskset left them.
fn cpus_allowed() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:").map(|v| v.trim().to_string()))
        })
        .unwrap_or_else(|| "?".into())
}

fn main() -> ExitCode {
    let k = match parse_args() {
        Ok(k) => k,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("memcpy_bw: {e}");
            }
            eprintln!(
                "usage: memcpy_bw [--chunk SIZE] [--dst SIZE] [--src SIZE] [--seconds S] [--repeat N] \
                 [--random] [--json FILE]"
            );
            return ExitCode::from(2);
        }
    };
    // Non-zero fills: every page is written (a zeroed Vec may stay unmapped).
    let src = vec![0x5a_u8; k.src];
    let mut dst = vec![0xa5_u8; k.dst];
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut next = 0;
    measure(&k, &src, &mut dst, &mut rng, &mut next, k.seconds.min(0.2));
    let gbps: Vec<f64> =
        (0..k.repeat).map(|_| measure(&k, &src, &mut dst, &mut rng, &mut next, k.seconds)).collect();
    let mut sorted = gbps.clone();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let median = if n % 2 == 1 { sorted[n / 2] } else { (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0 };
    let pattern = if k.random { "random" } else { "sequential" };
    let list = gbps.iter().map(|v| format!("{v:.4}")).collect::<Vec<_>>().join(", ");
    let json = format!(
        "{{\"tool\": \"memcpy_bw\", \"copy\": \"<[u8]>::copy_from_slice (memcpy)\", \"chunk_bytes\": {}, \
         \"dst_bytes\": {}, \"src_bytes\": {}, \"src_pattern\": \"{pattern}\", \"seconds_per_repeat\": {}, \
         \"repeat\": {}, \"warm_up_s\": {}, \"cpus_allowed\": \"{}\", \"gb_per_s\": [{list}], \
         \"median_gb_per_s\": {median:.4}, \"min_gb_per_s\": {:.4}, \"max_gb_per_s\": {:.4}}}",
        k.chunk,
        k.dst,
        k.src,
        k.seconds,
        k.repeat,
        k.seconds.min(0.2),
        cpus_allowed(),
        sorted[0],
        sorted[n - 1]
    );
    eprintln!(
        "memcpy_bw: {} B chunks, {pattern} from {} MiB into {} KiB, CPU(s) {}: median {median:.2} GB/s \
         [{:.2}-{:.2}] over {n} x {} s",
        k.chunk,
        k.src >> 20,
        k.dst >> 10,
        cpus_allowed(),
        sorted[0],
        sorted[n - 1],
        k.seconds
    );
    match &k.json {
        Some(path) => {
            if let Err(e) = std::fs::write(path, json + "\n") {
                eprintln!("memcpy_bw: {path}: {e}");
                return ExitCode::FAILURE;
            }
        }
        None => println!("{json}"),
    }
    ExitCode::SUCCESS
}
