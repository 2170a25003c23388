//! Running inputs safely: catching panics together with where they happened, and a
//! watchdog that turns a hang into a reported failure instead of a stuck CI job.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::exec::Stats;

/// A panic caught while running an input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Crash {
    pub message: String,
    /// `file:line` of the panic, which tells one bug from another.
    pub location: String,
}

impl std::fmt::Display for Crash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "panicked at {}: {}", self.location, self.message)
    }
}

static LAST_PANIC: Mutex<Option<Crash>> = Mutex::new(None);
static QUIET: AtomicBool = AtomicBool::new(false);

/// Records every panic for [`run_catching`]; prints it too unless `quiet`.
pub fn install_panic_hook(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "<non-string panic payload>".into());
        let location = info.location().map_or("<unknown>".into(), |l| format!("{}:{}", l.file(), l.line()));
        *LAST_PANIC.lock().unwrap_or_else(|p| p.into_inner()) = Some(Crash { message, location });
        if !QUIET.load(Ordering::Relaxed) {
            default(info);
        }
    }));
}

/// Silences (or restores) the panic hook's printing.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// Runs one input, turning a panic into a [`Crash`].
pub fn run_catching(data: &[u8], stats: &mut Stats) -> Result<(), Crash> {
    catch(|| crate::run_one_counted(data, stats))
}

/// Runs `f`, turning a panic into a [`Crash`].
pub fn catch(f: impl FnOnce()) -> Result<(), Crash> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(()) => Ok(()),
        Err(_) => Err(LAST_PANIC
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .unwrap_or(Crash { message: "panic (hook not installed)".into(), location: "<unknown>".into() })),
    }
}

type Armed = Option<(Instant, Vec<u8>)>;

/// Watches the input being run; if one runs longer than the timeout, calls the
/// hang handler with it and exits the process with status 3.
#[derive(Clone, Debug)]
pub struct Watchdog {
    armed: Arc<Mutex<Armed>>,
}

impl Watchdog {
    pub fn spawn(timeout: Duration, on_hang: impl Fn(&[u8]) + Send + 'static) -> Self {
        let armed: Arc<Mutex<Armed>> = Arc::new(Mutex::new(None));
        let watched = armed.clone();
        std::thread::Builder::new()
            .name("fuzz-watchdog".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(100).min(timeout / 4));
                let g = watched.lock().unwrap_or_else(|p| p.into_inner());
                if let Some((start, data)) = g.as_ref() {
                    if start.elapsed() > timeout {
                        on_hang(data);
                        std::process::exit(3);
                    }
                }
            })
            .expect("spawn watchdog");
        Watchdog { armed }
    }

    pub fn arm(&self, data: &[u8]) {
        *self.armed.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), data.to_vec()));
    }

    pub fn disarm(&self) {
        *self.armed.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}
