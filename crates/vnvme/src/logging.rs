//! Log output: a tracing filter that a running server can change (`vnvme ctl
//! log.set`), text with colours only on a terminal, or one JSON object per line
//! (vnvme's own lines, written with [`say`], included). Only clap's own errors
//! about the command line come before the format is known, and are text.

use std::io::IsTerminal;
use std::sync::OnceLock;

use tracing::Level;
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, reload, EnvFilter, Registry};

/// `eprintln!` in one write, in the log format: vnvme's own lines (start-up, stop,
/// summaries, errors) are log lines too, plain text or, with `--log-format json`, a
/// JSON object shaped as the tracing lines are. The keeper and the processes it
/// starts share one stderr (the service's log): a line written in pieces, as
/// `eprintln!` writes its formatted parts, interleaves with the other process's line.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::logging::say_line(format!($($arg)*))
    };
}
pub(crate) use say;

/// Writes `line` to stderr in one write, at level INFO (see [`say`]).
pub fn say_line(line: String) {
    say_at(Level::INFO, line)
}

/// Writes `line` to stderr in one write at `level`: as it is and a newline, or as
/// one JSON object on a line with `--log-format json`.
pub fn say_at(level: Level, line: String) {
    let mut out = match FORMAT.get() {
        Some(LogFormat::Json) => json_line(level, &line),
        _ => line,
    };
    out.push('\n');
    let _ = std::io::Write::write_all(&mut std::io::stderr(), out.as_bytes());
}

/// `line` as tracing's JSON lines are: timestamp, level, fields.message, target.
/// The program's prefix (`vnvme: `, `vnvme keeper: `) becomes the target.
fn json_line(level: Level, line: &str) -> String {
    let (target, message) = if let Some(rest) = line.strip_prefix("vnvme keeper") {
        // "vnvme keeper: ..." and "vnvme keeper (pid N): ..."
        ("vnvme::keeper", rest.strip_prefix(": ").unwrap_or(line))
    } else if let Some(rest) = line.strip_prefix("vnvme perf: ") {
        ("vnvme::perf", rest)
    } else {
        ("vnvme", line.strip_prefix("vnvme: ").unwrap_or(line))
    };
    let mut timestamp = String::new();
    let _ = fmt::time::SystemTime.format_time(&mut fmt::format::Writer::new(&mut timestamp));
    let quoted = |s: &str| serde_json::Value::from(s).to_string();
    format!(
        "{{\"timestamp\":{},\"level\":\"{level}\",\"fields\":{{\"message\":{}}},\"target\":{}}}",
        quoted(&timestamp),
        quoted(message),
        quoted(target)
    )
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
    let _ = FORMAT.set(format);
    if format == LogFormat::Json {
        // A panic's message is a log line too (the default hook writes text).
        std::panic::set_hook(Box::new(|info| {
            let thread = std::thread::current();
            say_at(Level::ERROR, format!("vnvme: thread '{}' {info}", thread.name().unwrap_or("<unnamed>")));
        }));
    }
    let (env, used) = match EnvFilter::try_new(filter) {
        Ok(f) => (f, filter.to_string()),
        Err(e) => {
            say_at(Level::WARN, format!("vnvme: --log {filter:?}: {e}; using \"warn\""));
            (EnvFilter::new("warn"), "warn".to_string())
        }
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    /// issue 49: `say!` lines were text under --log-format json.
    #[test]
    fn a_json_line_is_shaped_as_tracing_writes_them() {
        let v: serde_json::Value =
            serde_json::from_str(&json_line(Level::INFO, "vnvme: namespace 1: \"a\"\tb")).unwrap();
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["target"], "vnvme");
        assert_eq!(v["fields"]["message"], "namespace 1: \"a\"\tb");
        assert!(v["timestamp"].as_str().is_some_and(|t| t.len() >= 20 && t.ends_with('Z')), "{v}");
        let v: serde_json::Value =
            serde_json::from_str(&json_line(Level::ERROR, "vnvme keeper: x\ny")).unwrap();
        assert_eq!((v["level"].as_str(), v["target"].as_str()), (Some("ERROR"), Some("vnvme::keeper")));
        assert_eq!(v["fields"]["message"], "x\ny");
        let v: serde_json::Value =
            serde_json::from_str(&json_line(Level::INFO, "vnvme keeper (pid 7): x")).unwrap();
        assert_eq!(v["target"], "vnvme::keeper");
        assert_eq!(v["fields"]["message"], "vnvme keeper (pid 7): x");
        let v: serde_json::Value =
            serde_json::from_str(&json_line(Level::INFO, "vnvme 0.1.0 (pid 7)")).unwrap();
        assert_eq!(
            (v["target"].as_str(), v["fields"]["message"].as_str()),
            (Some("vnvme"), Some("vnvme 0.1.0 (pid 7)"))
        );
    }
}
