//! SIGTERM and SIGINT stop `vnvme serve` cleanly: `systemctl stop` and Ctrl-C end
//! the client's session as if it had disconnected (its commands complete or fail,
//! the device is reset), the final summary line and stats file are written, the
//! server's socket files are removed, and the process exits 0.
//!
//! The handler only asks (`server::Stop::request`: a store and an eventfd write,
//! both async-signal-safe); the server loop, which watches the eventfd, does the
//! rest. A second signal while stopping changes nothing: the stop is bounded (the
//! controller's teardown bound), and SIGKILL remains for the impatient.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, OnceLock};

use libc::{c_int, c_void, siginfo_t};
use vfio_user_server::server::Stop;

static STOP: OnceLock<Arc<Stop>> = OnceLock::new();
/// The signal that asked for the stop (0: none yet).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(num: c_int, _: *mut siginfo_t, _: *mut c_void) {
    let _ = SIGNAL.compare_exchange(0, num, Ordering::SeqCst, Ordering::SeqCst);
    if let Some(stop) = STOP.get() {
        stop.request();
    }
}

/// Installs the handlers (once per process) and returns what they ask.
pub fn stop_on_signals() -> std::io::Result<Arc<Stop>> {
    if let Some(s) = STOP.get() {
        return Ok(s.clone());
    }
    let stop = Arc::new(Stop::new()?);
    let stop = STOP.get_or_init(|| stop).clone();
    for num in [libc::SIGTERM, libc::SIGINT] {
        vmm_sys_util::signal::register_signal_handler(num, on_stop_signal)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
    }
    Ok(stop)
}

/// The signal that stopped the server, by name (None: it was not stopped by one).
pub fn stopped_by() -> Option<&'static str> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        libc::SIGTERM => Some("SIGTERM"),
        libc::SIGINT => Some("SIGINT"),
        _ => Some("a signal"),
    }
}
