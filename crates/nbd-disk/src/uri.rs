//! NBD URIs, as QEMU and libnbd write them (the NBD project's doc/uri.md):
//!
//! ```text
//! nbd://HOST[:PORT][/EXPORT]          TCP (port 10809 by default)
//! nbd+unix:///[EXPORT]?socket=PATH    a UNIX socket
//! ```
//!
//! An empty export name is the server's default export. `nbds://` (TLS) is refused
//! with a message that says so.

use std::fmt;
use std::path::PathBuf;

/// The IANA port of NBD.
pub const DEFAULT_PORT: u16 = 10809;

/// Where the server is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    /// `host:port` (a name, an IPv4 address, or a bracketed IPv6 address).
    Tcp {
        host: String,
        port: u16,
    },
    Unix(PathBuf),
}

/// A parsed NBD URI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdUri {
    pub address: Address,
    pub export: String,
}

impl fmt::Display for NbdUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.address {
            Address::Tcp { host, port } => write!(f, "nbd://{host}:{port}/{}", self.export),
            Address::Unix(p) => write!(f, "nbd+unix:///{}?socket={}", self.export, p.display()),
        }
    }
}

/// Undoes %XX escapes (export names and paths may carry them).
fn unescape(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3).ok_or_else(|| format!("bad escape in {s:?}"))?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| format!("bad escape %{hex} in {s:?}"))?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} is not UTF-8 once unescaped"))
}

impl std::str::FromStr for NbdUri {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.starts_with("nbds://") || s.starts_with("nbds+unix://") {
            return Err(format!("{s}: NBD over TLS is not supported (use nbd:// or nbd+unix://)"));
        }
        if let Some(rest) = s.strip_prefix("nbd+unix://") {
            let rest = rest
                .strip_prefix('/')
                .ok_or_else(|| format!("{s}: expected nbd+unix:///EXPORT?socket=PATH"))?;
            let (export, query) =
                rest.split_once('?').ok_or_else(|| format!("{s}: socket=PATH is required"))?;
            let mut socket = None;
            for kv in query.split('&') {
                match kv.split_once('=') {
                    Some(("socket", p)) if !p.is_empty() => socket = Some(PathBuf::from(unescape(p)?)),
                    _ => return Err(format!("{s}: unknown query part {kv:?} (only socket=PATH)")),
                }
            }
            let socket = socket.ok_or_else(|| format!("{s}: socket=PATH is required"))?;
            return Ok(NbdUri { address: Address::Unix(socket), export: unescape(export)? });
        }
        let rest =
            s.strip_prefix("nbd://").ok_or_else(|| format!("{s}: not an nbd:// or nbd+unix:// URI"))?;
        if rest.contains('?') {
            return Err(format!("{s}: nbd:// takes no query"));
        }
        let (authority, export) = rest.split_once('/').unwrap_or((rest, ""));
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or_else(|| format!("{s}: unclosed [ in the host"))?;
            (h.to_string(), after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (authority.to_string(), None),
            }
        };
        if host.is_empty() {
            return Err(format!("{s}: no host"));
        }
        let port = match port {
            None => DEFAULT_PORT,
            Some(p) => p.parse().map_err(|_| format!("{s}: bad port {p:?}"))?,
        };
        Ok(NbdUri { address: Address::Tcp { host, port }, export: unescape(export)? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_and_unix_uris_parse_and_bad_ones_say_why() {
        let u: NbdUri = "nbd://example.net/disk".parse().unwrap();
        assert_eq!(u.address, Address::Tcp { host: "example.net".into(), port: 10809 });
        assert_eq!(u.export, "disk");
        let u: NbdUri = "nbd://127.0.0.1:10810".parse().unwrap();
        assert_eq!(
            (u.address, u.export),
            (Address::Tcp { host: "127.0.0.1".into(), port: 10810 }, "".into())
        );
        let u: NbdUri = "nbd://[::1]:7000/a%20b".parse().unwrap();
        assert_eq!((u.address, u.export), (Address::Tcp { host: "::1".into(), port: 7000 }, "a b".into()));
        let u: NbdUri = "nbd+unix:///vm1?socket=/run/nbd.sock".parse().unwrap();
        assert_eq!((u.address, u.export), (Address::Unix("/run/nbd.sock".into()), "vm1".into()));
        let u: NbdUri = "nbd+unix:///?socket=/tmp/s".parse().unwrap();
        assert_eq!(u.export, "");
        for (bad, why) in [
            ("nbds://h/x", "TLS"),
            ("nbd+unix:///x", "socket=PATH is required"),
            ("nbd+unix:///x?sock=/a", "unknown query"),
            ("nbd://:10809/x", "no host"),
            ("nbd://h:port/x", "bad port"),
            ("nbd://h/x?y", "no query"),
            ("http://h/x", "not an nbd"),
        ] {
            let e = bad.parse::<NbdUri>().unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
