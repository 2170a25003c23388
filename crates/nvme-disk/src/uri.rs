//! The `nvme://` URI: its grammar, what it names ([`NvmeTarget`]) and the options it
//! sets ([`NvmeBackendOptions`]). Parsing only; nothing here touches a device.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use nvme_driver::vfio::normalize_bdf;
use nvme_driver::DoorbellMode;

/// The URI grammar, for command-line help.
pub const URI_SYNTAX: &str = "\
nvme:///abs/path.sock[?OPTS]   namespace of a vfio-user NVMe server (socket path; also nvme://./rel.sock)
nvme://DDDD:BB:DD.F[?OPTS]     namespace of a PCI NVMe device bound to vfio-pci
  OPTS (joined with &): ns=N (1), queues=N (4; a vnvme front needs workers + 1),
  depth=N (128 entries per queue), doorbells=trapped|sync|eventfd|mapped (trapped),
  poll=0|1 (0: interrupts), timeout=SECS (30)";

/// Where the downstream controller is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NvmeTarget {
    /// A vfio-user server's socket.
    VfioUser(PathBuf),
    /// A PCI function bound to vfio-pci (normalized `DDDD:BB:DD.F`).
    Pci(String),
    /// A transport the caller built ([`crate::NvmeBackend::with_transport`]), described.
    Other(String),
}

impl std::fmt::Display for NvmeTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NvmeTarget::VfioUser(p) => write!(f, "vfio-user {}", p.display()),
            NvmeTarget::Pci(b) => write!(f, "PCI {b}"),
            NvmeTarget::Other(d) => f.write_str(d),
        }
    }
}

/// Everything an `nvme://` URI says ([`NvmeBackendOptions::parse`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvmeBackendOptions {
    pub target: NvmeTarget,
    /// Namespace ID on the downstream controller.
    pub nsid: u32,
    /// I/O queue pairs created downstream: one per [`block_backend::Backend::open_queue`].
    pub queues: u16,
    /// Entries per downstream I/O queue (commands in flight: one less).
    pub depth: u16,
    /// How doorbells reach a vfio-user server.
    pub doorbells: DoorbellMode,
    /// `doorbells` was not chosen: try eventfd doorbells first (one kick straight to
    /// the server's worker instead of a socket message through its main thread) and
    /// fall back to `doorbells` when the server does not offer them.
    pub auto_doorbells: bool,
    /// Poll for completions instead of taking interrupts (no notifier).
    pub poll: bool,
    /// Bound on bring-up waits and on each socket read or write.
    pub timeout: Duration,
}

impl NvmeBackendOptions {
    pub const DEFAULT_QUEUES: u16 = 4;
    pub const DEFAULT_DEPTH: u16 = 128;
    pub const MAX_DEPTH: u16 = 4096;

    /// Options with every default for `target`.
    pub fn new(target: NvmeTarget) -> Self {
        NvmeBackendOptions {
            target,
            nsid: 1,
            queues: Self::DEFAULT_QUEUES,
            depth: Self::DEFAULT_DEPTH,
            doorbells: DoorbellMode::Trapped,
            auto_doorbells: true,
            poll: false,
            timeout: Duration::from_secs(30),
        }
    }

    /// Parses an `nvme://` URI (grammar in the crate documentation).
    pub fn parse(uri: &str) -> Result<Self, UriError> {
        let err = |msg: String| UriError { uri: uri.to_string(), msg };
        let rest = uri.strip_prefix("nvme://").ok_or_else(|| {
            err("must start with nvme:// (nvme:///path/to.sock or nvme://0000:01:00.0)".into())
        })?;
        let (target, query) = match rest.split_once('?') {
            Some((t, q)) => (t, Some(q)),
            None => (rest, None),
        };
        let target = if target.is_empty() {
            return Err(err("no target: give a vfio-user socket (nvme:///path/to.sock, nvme://./rel.sock) \
                 or a PCI address (nvme://0000:01:00.0)"
                .into()));
        } else if target.starts_with('/') || target.starts_with("./") || target.starts_with("../") {
            NvmeTarget::VfioUser(PathBuf::from(target))
        } else {
            match normalize_bdf(target) {
                Ok(b) => NvmeTarget::Pci(b),
                Err(_) => {
                    return Err(err(format!(
                        "target {target:?} is neither a socket path (absolute, or starting with ./) \
                         nor a PCI address like 0000:01:00.0"
                    )))
                }
            }
        };
        let mut o = NvmeBackendOptions::new(target);
        let mut seen: Vec<&str> = Vec::new();
        for kv in query.unwrap_or_default().split('&').filter(|s| !s.is_empty()) {
            let (k, v) =
                kv.split_once('=').ok_or_else(|| err(format!("option {kv:?} has no value (KEY=VALUE)")))?;
            if seen.contains(&k) {
                return Err(err(format!("option {k} given twice")));
            }
            seen.push(k);
            let num = |lo: u64, hi: u64| -> Result<u64, UriError> {
                v.parse::<u64>()
                    .ok()
                    .filter(|n| (lo..=hi).contains(n))
                    .ok_or_else(|| err(format!("{k}={v}: expected a number in {lo}..={hi}")))
            };
            match k {
                "ns" => o.nsid = num(1, 0xffff_fffe)? as u32,
                "queues" => o.queues = num(1, 1024)? as u16,
                "depth" => o.depth = num(2, Self::MAX_DEPTH as u64)? as u16,
                "doorbells" => {
                    if !matches!(o.target, NvmeTarget::VfioUser(_)) {
                        return Err(err("doorbells= applies to vfio-user sockets only".into()));
                    }
                    o.doorbells = v.parse().map_err(|e: String| err(format!("doorbells={v}: {e}")))?;
                    o.auto_doorbells = false;
                }
                "poll" => {
                    o.poll = match v {
                        "0" | "off" | "false" => false,
                        "1" | "on" | "true" => true,
                        _ => return Err(err(format!("poll={v}: expected 0 or 1"))),
                    }
                }
                "timeout" => o.timeout = Duration::from_secs(num(1, 3600)?),
                _ => {
                    return Err(err(format!(
                        "unknown option {k:?} (known: ns, queues, depth, doorbells, poll, timeout)"
                    )))
                }
            }
        }
        Ok(o)
    }
}

impl FromStr for NvmeBackendOptions {
    type Err = UriError;
    fn from_str(s: &str) -> Result<Self, UriError> {
        Self::parse(s)
    }
}

/// A malformed `nvme://` URI.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad nvme:// URI {uri:?}: {msg}")]
pub struct UriError {
    pub uri: String,
    pub msg: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_parse_with_defaults_and_options() {
        let o = NvmeBackendOptions::parse("nvme:///run/vnvme.sock").unwrap();
        assert_eq!(o.target, NvmeTarget::VfioUser("/run/vnvme.sock".into()));
        assert_eq!((o.nsid, o.queues, o.depth, o.poll), (1, 4, 128, false));
        assert_eq!(o.doorbells, DoorbellMode::Trapped);
        let o = NvmeBackendOptions::parse("nvme://./a.sock?ns=2&queues=8&depth=64&doorbells=eventfd&poll=1")
            .unwrap();
        assert_eq!(o.target, NvmeTarget::VfioUser("./a.sock".into()));
        assert_eq!((o.nsid, o.queues, o.depth, o.poll), (2, 8, 64, true));
        assert_eq!(o.doorbells, DoorbellMode::EventFd);
        let o = NvmeBackendOptions::parse("nvme://01:00.0?timeout=5").unwrap();
        assert_eq!(o.target, NvmeTarget::Pci("0000:01:00.0".into()));
        assert_eq!(o.timeout, Duration::from_secs(5));
    }

    #[test]
    fn bad_uris_name_the_offending_part() {
        let e = |u: &str| NvmeBackendOptions::parse(u).unwrap_err().to_string();
        assert!(e("file:///x").contains("must start with nvme://"), "{}", e("file:///x"));
        assert!(e("nvme://").contains("no target"));
        assert!(e("nvme://?ns=1").contains("no target"));
        assert!(e("nvme://relative.sock").contains("\"relative.sock\""));
        assert!(e("nvme:///a.sock?ns=0").contains("ns=0"));
        assert!(e("nvme:///a.sock?ns=x").contains("ns=x"));
        assert!(e("nvme:///a.sock?depth=1").contains("depth=1"));
        assert!(e("nvme:///a.sock?queues=0").contains("queues=0"));
        assert!(e("nvme:///a.sock?doorbells=carrier-pigeon").contains("doorbells=carrier-pigeon"));
        assert!(e("nvme:///a.sock?poll=maybe").contains("poll=maybe"));
        assert!(e("nvme:///a.sock?colour=blue").contains("unknown option \"colour\""));
        assert!(e("nvme:///a.sock?ns").contains("\"ns\" has no value"));
        assert!(e("nvme:///a.sock?ns=1&ns=2").contains("ns given twice"));
        assert!(e("nvme://0000:01:00.0?doorbells=mapped").contains("vfio-user sockets only"));
    }
}
