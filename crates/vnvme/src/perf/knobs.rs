//! `vnvme perf`'s knobs that are more than a number: the access pattern, how
//! doorbells are rung, how completions are awaited, and durations.

use std::time::Duration;

use nvme_driver::{CompletionMode, DoorbellMode};

/// Access pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    RandRead,
    RandWrite,
    Read,
    Write,
    RandRw,
}

impl std::str::FromStr for Workload {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "randread" => Workload::RandRead,
            "randwrite" => Workload::RandWrite,
            "read" => Workload::Read,
            "write" => Workload::Write,
            "randrw" => Workload::RandRw,
            _ => return Err(format!("unknown --rw {s:?} (randread, randwrite, read, write, randrw)")),
        })
    }
}

impl Workload {
    pub(super) fn name(self) -> &'static str {
        match self {
            Workload::RandRead => "randread",
            Workload::RandWrite => "randwrite",
            Workload::Read => "read",
            Workload::Write => "write",
            Workload::RandRw => "randrw",
        }
    }
    pub(super) fn random(self) -> bool {
        matches!(self, Workload::RandRead | Workload::RandWrite | Workload::RandRw)
    }
}

/// How doorbells are rung: the transport's mode plus shadow doorbells on or off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Doorbells {
    /// Shadow doorbells where the controller offers Doorbell Buffer Config, else
    /// the doorbell page the server maps (a peer such as SPDK's target), else
    /// trapped.
    Auto,
    /// Posted REGION_WRITE per doorbell, no shadow buffer.
    Trapped,
    /// Shadow doorbells + EventIdx; trapped writes only when EventIdx asks.
    Shadow,
    /// REGION_WRITE waiting for the reply, no shadow buffer.
    Sync,
    /// An ioeventfd per doorbell, values in the shadow buffer.
    EventFd,
    /// Stores into the server's mmapped doorbell page.
    Mapped,
}

impl std::str::FromStr for Doorbells {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "auto" => Doorbells::Auto,
            "trapped" => Doorbells::Trapped,
            "shadow" => Doorbells::Shadow,
            "sync" => Doorbells::Sync,
            "eventfd" => Doorbells::EventFd,
            "mapped" => Doorbells::Mapped,
            _ => {
                return Err(format!(
                    "unknown --doorbells {s:?} (auto, trapped, shadow, sync, eventfd, mapped)"
                ))
            }
        })
    }
}

impl Doorbells {
    pub(super) fn name(self) -> &'static str {
        match self {
            Doorbells::Auto => "auto",
            Doorbells::Trapped => "trapped",
            Doorbells::Shadow => "shadow",
            Doorbells::Sync => "sync",
            Doorbells::EventFd => "eventfd",
            Doorbells::Mapped => "mapped",
        }
    }
    pub(super) fn transport(self) -> (DoorbellMode, bool) {
        match self {
            Doorbells::Trapped => (DoorbellMode::Trapped, false),
            // First as shadow; `setup` falls back if the controller has none.
            Doorbells::Shadow | Doorbells::Auto => (DoorbellMode::Trapped, true),
            Doorbells::Sync => (DoorbellMode::Sync, false),
            Doorbells::EventFd => (DoorbellMode::EventFd, true),
            Doorbells::Mapped => (DoorbellMode::Mapped, false),
        }
    }
}

/// `poll` or `irq`.
pub(super) fn parse_completion(s: &str) -> Result<CompletionMode, String> {
    match s {
        "poll" => Ok(CompletionMode::Polling),
        "irq" => Ok(CompletionMode::Interrupts),
        _ => Err(format!("unknown --completion {s:?} (poll, irq)")),
    }
}

/// `5s`, `300ms`, `2m`, or plain seconds.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mul_ms) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1000.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000.0)
    } else {
        (s, 1000.0)
    };
    let v: f64 = num.parse().map_err(|_| format!("bad duration {s:?} (e.g. 5s, 300ms)"))?;
    if !(v > 0.0 && v.is_finite()) {
        return Err(format!("duration {s:?} must be positive"));
    }
    Ok(Duration::from_secs_f64(v * mul_ms / 1000.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_knobs() {
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("300ms").unwrap(), Duration::from_millis(300));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert!(parse_duration("-1s").is_err());
        assert_eq!("randrw".parse::<Workload>().unwrap(), Workload::RandRw);
        assert!("sideways".parse::<Workload>().is_err());
        assert_eq!("shadow".parse::<Doorbells>().unwrap().transport(), (DoorbellMode::Trapped, true));
        assert!(parse_completion("irq").is_ok() && parse_completion("x").is_err());
    }
}
