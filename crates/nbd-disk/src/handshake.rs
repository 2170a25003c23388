//! Connecting to an NBD server and the fixed newstyle handshake: structured replies
//! asked for (used if the server agrees), then NBD_OPT_GO for the export with its
//! block size constraints. Blocking, under the connection's read and write timeouts,
//! so a server that stops answering fails the handshake instead of hanging it.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::proto::{self, hflag, info, opt, rep, OptionReply};
use crate::uri::{Address, NbdUri};

/// A connection to the server.
#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    /// Connects to `addr`, waiting at most `timeout` (per address tried), and sets
    /// `timeout` on reads and writes.
    pub fn connect(addr: &Address, timeout: Duration) -> io::Result<Stream> {
        Self::connect_to(&Target::resolve(addr)?, timeout)
    }

    /// As [`Stream::connect`], to addresses resolved before (a reconnect makes no
    /// name lookup: the sandbox would refuse the files and sockets it needs).
    pub fn connect_to(target: &Target, timeout: Duration) -> io::Result<Stream> {
        let s = match target {
            Target::Unix(p) => Stream::Unix(UnixStream::connect(p)?),
            Target::Tcp(addrs) => {
                let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
                let mut found = None;
                for &a in addrs {
                    match TcpStream::connect_timeout(&a, timeout) {
                        Ok(s) => {
                            found = Some(s);
                            break;
                        }
                        Err(e) => last = e,
                    }
                }
                let s = found.ok_or(last)?;
                // Requests are small and latency counts: no Nagle.
                s.set_nodelay(true)?;
                Stream::Tcp(s)
            }
        };
        s.set_timeouts(Some(timeout))?;
        Ok(s)
    }

    pub fn set_timeouts(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
            Stream::Unix(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
        }
    }
}

impl Read for Stream {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(b),
            Stream::Unix(s) => s.read(b),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(b),
            Stream::Unix(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Tcp(s) => s.as_fd(),
            Stream::Unix(s) => s.as_fd(),
        }
    }
}

/// Where to connect, names resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Unix(std::path::PathBuf),
    Tcp(Vec<std::net::SocketAddr>),
}

impl Target {
    pub fn resolve(addr: &Address) -> io::Result<Target> {
        Ok(match addr {
            Address::Unix(p) => Target::Unix(p.clone()),
            Address::Tcp { host, port } => Target::Tcp((host.as_str(), *port).to_socket_addrs()?.collect()),
        })
    }
}

/// What the server said of the export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Export {
    pub size: u64,
    /// Transmission flags (`proto::tflag`).
    pub flags: u16,
    /// Block size constraints: every request's offset and length are multiples of
    /// `min`; payloads are at most `max`. Defaults when the server names none: 1,
    /// 4096, 32 MiB.
    pub min_block: u32,
    pub preferred_block: u32,
    pub max_block: u32,
    /// The server agreed to structured replies.
    pub structured: bool,
}

impl Export {
    pub fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }
}

fn protocol(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn read_u16(s: &mut Stream) -> io::Result<u16> {
    let mut b = [0u8; 2];
    s.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}

fn read_u64(s: &mut Stream) -> io::Result<u64> {
    let mut b = [0u8; 8];
    s.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

/// The most option reply data we read (an INFO reply is a few bytes; an error
/// message is at most a string).
const MAX_REPLY_DATA: u32 = proto::MAX_STRING as u32 + 64;

/// Reads one option reply to `option`: its header and data.
fn option_reply(s: &mut Stream, option: u32) -> io::Result<(u32, Vec<u8>)> {
    let mut h = [0u8; OptionReply::SIZE];
    s.read_exact(&mut h)?;
    let r = OptionReply::parse(&h).map_err(protocol)?;
    if r.option != option {
        return Err(protocol(format!("a reply to option {} while asking {option}", r.option)));
    }
    if r.len > MAX_REPLY_DATA {
        return Err(protocol(format!("an option reply of {} bytes", r.len)));
    }
    let mut data = vec![0u8; r.len as usize];
    s.read_exact(&mut data)?;
    Ok((r.kind, data))
}

/// An error reply as an error naming it (with the server's message, if any).
fn refused(what: &str, kind: u32, data: &[u8]) -> io::Error {
    let msg = String::from_utf8_lossy(data);
    let text = if msg.is_empty() {
        format!("{what}: {}", rep::error_name(kind))
    } else {
        format!("{what}: {} ({msg})", rep::error_name(kind))
    };
    let k = if kind == rep::ERR_UNKNOWN { io::ErrorKind::NotFound } else { io::ErrorKind::Other };
    io::Error::new(k, text)
}

/// Runs the handshake for `export` on a fresh connection.
pub fn handshake(s: &mut Stream, export: &str) -> io::Result<Export> {
    if export.len() > proto::MAX_STRING {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "export name over 4096 bytes"));
    }
    if read_u64(s)? != proto::NBD_MAGIC {
        return Err(protocol("not an NBD server (no NBDMAGIC)"));
    }
    if read_u64(s)? != proto::IHAVEOPT {
        return Err(protocol("an oldstyle NBD server: only the fixed newstyle handshake is supported"));
    }
    let server = read_u16(s)?;
    if server & hflag::FIXED_NEWSTYLE == 0 {
        return Err(protocol("the server does not speak the fixed newstyle handshake"));
    }
    let client = u32::from(hflag::FIXED_NEWSTYLE | (server & hflag::NO_ZEROES));
    s.write_all(&client.to_be_bytes())?;

    s.write_all(&proto::option(opt::STRUCTURED_REPLY, &[]))?;
    let structured = match option_reply(s, opt::STRUCTURED_REPLY)? {
        (rep::ACK, _) => true,
        (k, _) if k & rep::ERR_BIT != 0 => false,
        (k, _) => return Err(protocol(format!("reply type {k} to STRUCTURED_REPLY"))),
    };

    s.write_all(&proto::option(opt::GO, &proto::go_data(export)))?;
    let mut exp =
        Export { size: 0, flags: 0, min_block: 1, preferred_block: 4096, max_block: 32 << 20, structured };
    let mut got_export = false;
    loop {
        let (kind, data) = option_reply(s, opt::GO)?;
        match kind {
            rep::ACK => break,
            rep::INFO if data.len() >= 2 => {
                let t = u16::from_be_bytes([data[0], data[1]]);
                match (t, data.len()) {
                    (info::EXPORT, 12) => {
                        exp.size = u64::from_be_bytes(data[2..10].try_into().expect("8"));
                        exp.flags = u16::from_be_bytes([data[10], data[11]]);
                        got_export = true;
                    }
                    (info::BLOCK_SIZE, 14) => {
                        let at = |i: usize| u32::from_be_bytes(data[i..i + 4].try_into().expect("4"));
                        (exp.min_block, exp.preferred_block, exp.max_block) = (at(2), at(6), at(10));
                    }
                    // Names, descriptions and what else a server volunteers.
                    _ => {}
                }
            }
            rep::INFO => return Err(protocol("an INFO reply without its type")),
            k if k & rep::ERR_BIT != 0 => return Err(refused(&format!("export {export:?}"), k, &data)),
            k => return Err(protocol(format!("reply type {k} to GO"))),
        }
    }
    if !got_export {
        return Err(protocol("the server ended GO without saying the export's size"));
    }
    let b = (exp.min_block, exp.preferred_block, exp.max_block);
    if !b.0.is_power_of_two()
        || b.0 > 65536
        || b.1 < b.0
        || b.2 < b.0
        || !exp.size.is_multiple_of(u64::from(b.0))
    {
        return Err(protocol(format!(
            "block sizes min {} preferred {} max {} for a {}-byte export",
            b.0, b.1, b.2, exp.size
        )));
    }
    Ok(exp)
}

/// Connects to `uri` and runs the handshake; also returns the resolved target, for
/// connecting again.
pub fn open(uri: &NbdUri, timeout: Duration) -> io::Result<(Stream, Export, Target)> {
    let ctx = |e: io::Error| io::Error::new(e.kind(), format!("{uri}: {e}"));
    let target = Target::resolve(&uri.address).map_err(ctx)?;
    let (s, e) = reopen(uri, &target, timeout)?;
    Ok((s, e, target))
}

/// Connects to `target` (what `uri` resolved to) and runs the handshake.
pub fn reopen(uri: &NbdUri, target: &Target, timeout: Duration) -> io::Result<(Stream, Export)> {
    let ctx = |e: io::Error| io::Error::new(e.kind(), format!("{uri}: {e}"));
    let mut s = Stream::connect_to(target, timeout).map_err(ctx)?;
    let e = handshake(&mut s, &uri.export).map_err(ctx)?;
    Ok((s, e))
}
