//! The fuzz target as a regular test: every committed corpus input replays without a
//! panic, the hand-built seeds match their committed encodings, and a fixed number of
//! seeded random and mutated programs run clean. Counts, not time, bound the test.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nvme_fuzz::gen::{mutate, random_program, Rng};
use nvme_fuzz::guard::Watchdog;
use nvme_fuzz::{run_one_counted, Program, Stats};

const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/corpus");

/// Random programs per `cargo test` (a couple of seconds in a debug build).
const RANDOM_RUNS: u64 = 2000;

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    v
}

/// A hang fails the whole test binary instead of stalling CI.
fn watchdog() -> Watchdog {
    Watchdog::spawn(Duration::from_secs(120), |data| {
        eprintln!("fuzz test input hung ({} bytes): {:?}", data.len(), Program::decode(data));
    })
}

#[test]
fn corpus_replays_without_panics() {
    let wd = watchdog();
    let corpus = files(Path::new(CORPUS));
    assert!(corpus.len() >= 5, "the corpus has its seeds");
    let mut stats = Stats::default();
    for f in &corpus {
        let data = std::fs::read(f).expect("read corpus file");
        eprintln!("replaying {}", f.display());
        wd.arm(&data);
        run_one_counted(&data, &mut stats);
        wd.disarm();
    }
    assert!(stats.checked_completions > 0, "seeds reach checked completions: {stats:?}");
    assert!(stats.checked_drains > 0, "seeds reach checked drains: {stats:?}");
}

#[test]
fn seeds_match_the_committed_corpus() {
    for (name, p) in nvme_fuzz::seeds::seeds() {
        let path = Path::new(CORPUS).join(name);
        let committed = std::fs::read(&path).unwrap_or_default();
        assert!(
            committed == p.encode(),
            "{} is stale: run `cargo run -p nvme-fuzz --bin fuzz-run -- --write-seeds {CORPUS}`",
            path.display()
        );
        assert_eq!(Program::decode(&committed), p, "{name} decodes to its program");
    }
}

#[test]
fn seeded_random_programs_run_clean() {
    let wd = watchdog();
    let corpus: Vec<Vec<u8>> = files(Path::new(CORPUS)).iter().map(|f| std::fs::read(f).unwrap()).collect();
    let mut rng = Rng::new(0x5eed_0fc0_ffee);
    let mut stats = Stats::default();
    for i in 0..RANDOM_RUNS {
        let data = if i % 2 == 0 {
            random_program(&mut rng)
        } else {
            let a = &corpus[rng.below(corpus.len() as u64) as usize];
            let b = &corpus[rng.below(corpus.len() as u64) as usize];
            mutate(&mut rng, a, b)
        };
        wd.arm(&data);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_one_counted(&data, &mut stats)));
        wd.disarm();
        if r.is_err() {
            panic!("run {i} panicked; input {data:02x?}\nprogram: {:#?}", Program::decode(&data));
        }
    }
    assert_eq!(stats.runs, RANDOM_RUNS);
    assert!(stats.checked_completions > 100, "random programs reach checked completions: {stats:?}");
}
