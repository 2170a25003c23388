//! Log output: a tracing filter that a running server can change (`vnvme ctl
//! log.set`), text with colours only on a terminal, or one JSON object per line.

use std::io::IsTerminal;
use std::sync::OnceLock;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, reload, EnvFilter, Registry};

/// `eprintln!` in one write. The keeper and the processes it starts share one
/// stderr (the service's log): a line written in pieces, as `eprintln!` writes its
/// formatted parts, interleaves with the other process's line.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::logging::say_line(format!($($arg)*))
    };
}
pub(crate) use say;

/// Writes `line` and a newline to stderr in one write (see [`say`]).
pub fn say_line(mut line: String) {
    line.push('\n');
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
}

/// How log lines look on stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

type Handle = reload::Handle<EnvFilter, Registry>;

/// The live filter and what it was set from.
struct Live {
    handle: Handle,
    current: std::sync::Mutex<String>,
}

static LIVE: OnceLock<Live> = OnceLock::new();
static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// The log format in use ("text" or "json"), for a process that takes this one over.
pub fn format_name() -> &'static str {
    match FORMAT.get() {
        Some(LogFormat::Json) => "json",
        _ => "text",
    }
}

/// Installs the global subscriber with filter `filter` (a bad filter falls back to
/// "warn" and says so).
pub fn init(filter: &str, format: LogFormat) {
    let (env, used) = match EnvFilter::try_new(filter) {
        Ok(f) => (f, filter.to_string()),
        Err(e) => {
            eprintln!("vnvme: --log {filter:?}: {e}; using \"warn\"");
            (EnvFilter::new("warn"), "warn".to_string())
        }
    };
    let _ = FORMAT.set(format);
    // NO_COLOR (no-color.org), e.g. from `vnvme ctl upgrade`, whose new server ends
    // up writing to the old one's log.
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let (layer, handle) = reload::Layer::new(env);
    let registry = tracing_subscriber::registry().with(layer);
    let result = match format {
        LogFormat::Text => {
            registry.with(fmt::layer().with_writer(std::io::stderr).with_ansi(ansi)).try_init()
        }
        LogFormat::Json => registry.with(fmt::layer().json().with_writer(std::io::stderr)).try_init(),
    };
    if result.is_ok() {
        let _ = LIVE.set(Live { handle, current: std::sync::Mutex::new(used) });
    }
}

/// Replaces the filter of the running process; returns the one it replaced.
pub fn set_filter(filter: &str) -> Result<String, String> {
    let live = LIVE.get().ok_or("logging is not set up in this process")?;
    let f = EnvFilter::try_new(filter).map_err(|e| format!("bad filter {filter:?}: {e}"))?;
    live.handle.reload(f).map_err(|e| e.to_string())?;
    let mut cur = live.current.lock().unwrap_or_else(|p| p.into_inner());
    Ok(std::mem::replace(&mut *cur, filter.to_string()))
}

/// The filter in force.
pub fn filter() -> String {
    LIVE.get().map_or_else(String::new, |l| l.current.lock().unwrap_or_else(|p| p.into_inner()).clone())
}
