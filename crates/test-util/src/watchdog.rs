//! A bound on a call that could wait forever when the behaviour under test breaks
//! (a teardown that never gives up, a wait on a clock that never reaches its
//! deadline): past it the whole test process aborts with a line naming the call,
//! which the test runner reports as a crash. It only ends a hang; it never decides
//! a pass by timing.

use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::time::Duration;

/// How long a watched call may take before the process is aborted: far beyond what
/// any correct run takes on a loaded machine.
pub const WATCHDOG_LIMIT: Duration = Duration::from_secs(120);

/// Aborts the process if it is not dropped within the limit.
#[derive(Debug)]
pub struct Watchdog {
    done: Option<Sender<()>>,
}

/// Watches `what` for [`WATCHDOG_LIMIT`].
pub fn watchdog(what: &str) -> Watchdog {
    watchdog_for(what, WATCHDOG_LIMIT)
}

/// Watches `what` for `limit`.
pub fn watchdog_for(what: &str, limit: Duration) -> Watchdog {
    let (tx, rx) = channel::<()>();
    let what = what.to_string();
    std::thread::spawn(move || {
        if let Err(RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
            // Straight to the descriptor: the test harness's capture of eprintln! dies
            // with the process.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "watchdog: {what} did not return within {limit:?}: aborting the test process"
            );
            std::process::abort();
        }
    });
    Watchdog { done: Some(tx) }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Dropping the sender ends the watcher's wait (Disconnected).
        self.done.take();
    }
}

/// Runs `f` under a watchdog named `what`.
pub fn bounded<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let _w = watchdog(what);
    f()
}
