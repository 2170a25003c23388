//! The vfio-user fuzz target as a regular test: a fixed number of seeded random
//! sessions run clean, reach the controller's I/O path, and leave no descriptor open.
//! One test in its own binary, so nothing else opens descriptors while it counts them.

use std::time::Duration;

use nvme_fuzz::gen::Rng;
use nvme_fuzz::guard::Watchdog;
use nvme_fuzz::vfio::{run_vfio_counted, set_check_fd_leaks, VfioStats};

/// Random sessions per `cargo test` (a few seconds in a debug build).
const RANDOM_RUNS: u64 = 300;

#[test]
fn random_sessions_run_clean_and_close_what_they_open() {
    let wd = Watchdog::spawn(Duration::from_secs(120), |data| {
        eprintln!("vfio fuzz test input hung ({} bytes): {data:02x?}", data.len());
    });
    set_check_fd_leaks(true);
    let mut rng = Rng::new(0x5eed_0f10);
    let mut stats = VfioStats::default();
    for _ in 0..RANDOM_RUNS {
        let max = 1 + rng.below(512);
        let mut input = vec![0u8; 8 + rng.below(max) as usize];
        rng.fill(&mut input);
        wd.arm(&input);
        run_vfio_counted(&input, &mut stats);
        wd.disarm();
    }
    eprintln!("{}", stats.line());
    assert!(stats.socket_runs > 0 && stats.worker_runs > 0, "both paths and both runtimes ran: {stats:?}");
    assert!(stats.io_commands > 0, "sessions reached the I/O path: {stats:?}");
    assert!(stats.error_replies > 0 && stats.ok_replies > 0, "{stats:?}");
}
