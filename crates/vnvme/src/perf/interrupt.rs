//! Ctrl-C (SIGINT) and SIGTERM during a run: the load stops, what is in flight gets
//! a moment to land, and the results measured so far are printed (and written, with
//! --json), marked as interrupted; then perf exits 128 + the signal (130 for Ctrl-C).
//!
//! The handler only records the signal (an atomic store, async-signal-safe); the
//! queue threads look at it between rounds as they look at the deadline.

use std::sync::atomic::{AtomicI32, Ordering};

use libc::{c_int, c_void, siginfo_t};

/// The signal received (0: none).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(num: c_int, _: *mut siginfo_t, _: *mut c_void) {
    let _ = SIGNAL.compare_exchange(0, num, Ordering::SeqCst, Ordering::SeqCst);
}

/// Installs the handlers for SIGINT and SIGTERM.
pub(super) fn catch() -> std::io::Result<()> {
    for num in [libc::SIGINT, libc::SIGTERM] {
        vmm_sys_util::signal::register_signal_handler(num, on_signal)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
    }
    Ok(())
}

/// The signal that interrupted the run, if one did: its name and the exit status
/// it stands for (128 + its number, as a shell reports it).
pub(super) fn received() -> Option<(&'static str, u8)> {
    match SIGNAL.load(Ordering::Relaxed) {
        0 => None,
        libc::SIGINT => Some(("SIGINT", 130)),
        libc::SIGTERM => Some(("SIGTERM", 143)),
        n => Some(("a signal", 128u8.saturating_add(n as u8))),
    }
}

/// A run stopped by a signal, its results printed: main exits with `code`.
#[derive(Debug)]
pub struct Interrupted {
    pub code: u8,
    pub message: String,
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Interrupted {}
