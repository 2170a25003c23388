//! One queue: one NBD connection in the transmission phase, driven without a thread of
//! its own. `submit` turns a request into NBD commands ("pieces", split at the
//! server's maximum payload) written to a send buffer, `commit` sends what the socket
//! takes, and `reap` reads the replies that arrived (simple or structured), copies
//! read data into guest memory and completes requests. The socket itself is the
//! notifier: readable when replies wait.
//!
//! Data always goes through our buffers (write data is copied out of guest memory as
//! each piece is encoded, read data into it as it arrives), so a request given up on
//! (`revoke`) can always be kept off guest memory: its late data is dropped, and a
//! write of it is not sent again after a reconnect. The requests themselves are
//! block_backend's in-flight core ([`Requests`]); the wire keeps per request the
//! number of its pieces not yet answered.
//!
//! If the connection breaks, commands wait: the queue keeps every unanswered piece
//! (and takes new requests), tries the server again with a backoff (50 ms doubling to
//! 1 s, each try at most 1 s) for as long as the hold (`NbdOptions::hold`) allows,
//! and on a new connection sends them all again in the order they first came. Past
//! the hold every request fails with NotReady (Namespace Not Ready for the guest,
//! with a retry delay when it asked for one) and the export counts as gone: a new
//! request tries the server again at most every second, so the namespace comes back
//! with its server. A try blocks the queue's thread (and so the other namespaces it
//! serves) for at most that second; a refused connection returns at once.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use block_backend::{Admit, BackendError, BackendQueue, Completion, Op, Request, Requests};
use guest_mem::GuestMemory;
use rustix::event::epoll;
use tracing::{info, warn};

use crate::handshake::{self, Export, Stream};
use crate::proto::{self, cflag, chunk, cmd, tflag, ReplyHeader};
use crate::shared::Shared;

/// One NBD command of a request; its cookie is its index.
#[derive(Debug, Clone, Copy)]
struct Piece {
    /// Order of creation: a new connection gets the pieces again in this order.
    seq: u64,
    req: usize,
    kind: u16,
    flags: u16,
    /// Offset within the request, and length.
    at: u64,
    len: u64,
}

/// The wait after the first failed try to reconnect; it doubles up to MAX_BACKOFF.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// The most one try (connect and handshake) may take.
const TRY_TIMEOUT: Duration = Duration::from_secs(1);
/// Once the export is gone, how often a new command may try the server again.
const REVIVE_EVERY: Duration = Duration::from_secs(1);

/// Where the queue's connection is.
#[derive(Debug)]
enum Link {
    Up,
    /// Lost (`why`) at `since`: commands wait, kept, until the hold runs out. The
    /// next try is at `next_try`; `backoff` is the wait after it, should it fail.
    Down {
        since: Instant,
        why: String,
        last: String,
        tries: u32,
        next_try: Instant,
        backoff: Duration,
    },
    /// Past the hold: commands fail Not Ready (`why`); one tries the server again
    /// at most every REVIVE_EVERY.
    Gone {
        why: String,
        last_try: Instant,
    },
}

/// One connection to the export, owned by the thread that opened it.
#[derive(Debug)]
pub(crate) struct NbdQueue {
    shared: Arc<Shared>,
    stream: Option<Stream>,
    /// The notifier the owner watches: an epoll set holding the current connection,
    /// so it stays the same descriptor across reconnects.
    epoll: std::os::fd::OwnedFd,
    /// Requests at the server; the wire's part of each is its pieces unanswered.
    reqs: Requests<u32>,
    pieces: Vec<Option<Piece>>,
    free_pieces: Vec<usize>,
    out: Vec<u8>,
    inbuf: Vec<u8>,
    link: Link,
    /// Since when the server has not answered anything: a connection that comes
    /// back and breaks again before a reply continues the same outage (the hold is
    /// counted from here, not from each break).
    silent_since: Option<Instant>,
    /// Pieces created so far (their `seq`).
    pieces_made: u64,
    /// The commands this queue counts as waiting in the backend's storage report.
    waiting_reported: i64,
}

fn invalid(msg: String) -> BackendError {
    BackendError::Io(io::Error::new(io::ErrorKind::InvalidInput, msg))
}

/// An NBD error as the backend error it means.
fn nbd_error(e: u32, msg: &str) -> BackendError {
    let text = if msg.is_empty() {
        format!("NBD server: {}", proto::error_name(e))
    } else {
        format!("NBD server: {} ({msg})", proto::error_name(e))
    };
    match e {
        28 => BackendError::NoSpace,
        1 => BackendError::ReadOnly,
        108 => BackendError::NotReady(text),
        22 => invalid(text),
        _ => BackendError::Io(io::Error::from_raw_os_error(e as i32)),
    }
}

impl NbdQueue {
    pub(crate) fn new(shared: Arc<Shared>, stream: Stream) -> io::Result<Self> {
        stream.set_timeouts(None)?;
        set_nonblocking(&stream)?;
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        watch(&epoll, &stream)?;
        Ok(NbdQueue {
            shared,
            stream: Some(stream),
            epoll,
            reqs: Requests::default(),
            pieces: Vec::new(),
            free_pieces: Vec::new(),
            out: Vec::new(),
            inbuf: Vec::new(),
            link: Link::Up,
            silent_since: None,
            pieces_made: 0,
            waiting_reported: 0,
        })
    }

    fn export(&self) -> &Export {
        &self.shared.export
    }

    /// Checks `req` against the export's size and block size.
    fn check(&self, req: &Request) -> Result<(), BackendError> {
        let e = self.export();
        let min = u64::from(e.min_block);
        if req.op != Op::Flush {
            block_backend::check_range(req.offset, req.len, self.shared.size)?;
            if !req.offset.is_multiple_of(min) || !req.len.is_multiple_of(min) {
                return Err(invalid(format!(
                    "range {:#x}+{:#x} is not in whole {min}-byte blocks of the export",
                    req.offset, req.len
                )));
            }
        }
        if matches!(req.op, Op::Write { .. } | Op::WriteZeroes { .. } | Op::Discard)
            && e.has(tflag::READ_ONLY)
        {
            return Err(BackendError::ReadOnly);
        }
        Ok(())
    }

    fn new_piece(&mut self, mut p: Piece) -> usize {
        p.seq = self.pieces_made;
        self.pieces_made += 1;
        match self.free_pieces.pop() {
            Some(i) => {
                self.pieces[i] = Some(p);
                i
            }
            None => {
                self.pieces.push(Some(p));
                self.pieces.len() - 1
            }
        }
    }

    /// Writes piece `cookie`'s command (and a write's payload) to the send buffer.
    fn encode(&mut self, cookie: usize) -> Result<(), BackendError> {
        let p = self.pieces[cookie].expect("live piece");
        let req = self.reqs.get(p.req).expect("live request");
        let wire_len = if p.kind == cmd::FLUSH { 0 } else { p.len as u32 };
        let offset = if p.kind == cmd::FLUSH { 0 } else { req.offset + p.at };
        // Nothing of a command that cannot be encoded whole is sent.
        let begin = self.out.len();
        self.out.extend_from_slice(&proto::request(p.flags, p.kind, cookie as u64, offset, wire_len));
        if p.kind == cmd::WRITE {
            let start = self.out.len();
            self.out.resize(start + p.len as usize, 0);
            // A revoked write fails here instead of sending the host's buffer.
            if let Err(e) = req.copy_out(p.at, &mut self.out[start..]) {
                self.out.truncate(begin);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Splits request `r` into pieces and encodes them.
    fn start(&mut self, r: usize) -> Result<(), BackendError> {
        let e = *self.export();
        let req = self.reqs.get(r).expect("live request");
        let (kind, flags, max) = match req.op {
            Op::Read => (cmd::READ, 0, self.shared.max_payload),
            Op::Write { fua } => {
                let f = if fua && e.has(tflag::SEND_FUA) { cflag::FUA } else { 0 };
                (cmd::WRITE, f, self.shared.max_payload)
            }
            Op::Flush => (cmd::FLUSH, 0, 0),
            // Not offered (BackendInfo::copy is false).
            Op::Copy { .. } => return Err(BackendError::Unsupported),
            Op::Discard => (cmd::TRIM, 0, self.shared.max_other),
            Op::WriteZeroes { deallocate } => {
                (cmd::WRITE_ZEROES, if deallocate { 0 } else { cflag::NO_HOLE }, self.shared.max_other)
            }
        };
        let (len, mut cookies) = (req.len, Vec::new());
        if kind == cmd::FLUSH {
            cookies.push(self.new_piece(Piece { seq: 0, req: r, kind, flags, at: 0, len: 0 }));
        } else {
            let mut at = 0;
            while at < len {
                let n = (len - at).min(max);
                cookies.push(self.new_piece(Piece { seq: 0, req: r, kind, flags, at, len: n }));
                at += n;
            }
        }
        self.reqs.get_mut(r).expect("live").wire = cookies.len() as u32;
        // All of the request goes, or none of it: a piece that cannot be encoded
        // takes the pieces before it back out of the send buffer.
        let begin = self.out.len();
        for c in cookies {
            if let Err(e) = self.encode(c) {
                self.out.truncate(begin);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Piece `cookie` is answered (with `err` if it failed).
    fn piece_done(&mut self, cookie: usize, err: Option<BackendError>) {
        let Some(p) = self.pieces.get_mut(cookie).and_then(Option::take) else { return };
        self.free_pieces.push(cookie);
        let Some(req) = self.reqs.get_mut(p.req) else { return };
        if let Some(e) = err {
            req.fail(e);
        }
        req.wire -= 1;
        if req.wire > 0 {
            return;
        }
        if req.flush_now() {
            // The write is complete: now its flush (a FUA write without FUA).
            req.wire = 1;
            let c = self.new_piece(Piece { seq: 0, req: p.req, kind: cmd::FLUSH, flags: 0, at: 0, len: 0 });
            if let Err(e) = self.encode(c) {
                self.piece_done(c, Some(e));
            }
            return;
        }
        self.reqs.finish(p.req);
    }

    /// Copies read data arriving for piece `cookie` at request offset `at` into the
    /// request's buffer (or zeroes for a hole, `data` None).
    fn deliver(&mut self, cookie: usize, at: u64, n: u64, data: Option<&[u8]>) -> Result<(), BackendError> {
        let p = self.pieces[cookie].ok_or_else(|| invalid(format!("data for unknown cookie {cookie}")))?;
        if at < p.at || at + n > p.at + p.len {
            return Err(invalid(format!("the server sent data outside the read ({at:#x}+{n:#x})")));
        }
        // Dropped if the request was revoked.
        self.reqs.get_mut(p.req).expect("live request").copy_in(at, n, data)
    }

    /// Sends what the socket takes. False if the connection broke.
    fn send(&mut self) -> bool {
        let Some(s) = self.stream.as_mut() else { return false };
        while !self.out.is_empty() {
            match s.write(&self.out) {
                Ok(0) => return false,
                Ok(n) => {
                    self.out.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        true
    }

    /// Reads what arrived. False if the connection broke.
    fn receive(&mut self) -> bool {
        let Some(s) = self.stream.as_mut() else { return false };
        let mut buf = [0u8; 64 << 10];
        // A bound per reap, so one busy connection cannot keep its owner here.
        for _ in 0..64 {
            match s.read(&mut buf) {
                Ok(0) => return false,
                Ok(n) => self.inbuf.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        true
    }

    /// Handles every whole reply in the receive buffer. Err: the stream is out of
    /// step (or the server broke the protocol): the connection must go.
    fn parse(&mut self) -> Result<(), String> {
        let mut at = 0;
        loop {
            let b = &self.inbuf[at..];
            if b.len() < ReplyHeader::MAGIC_LEN {
                break;
            }
            let hlen = ReplyHeader::len_for(b)?;
            if b.len() < hlen {
                break;
            }
            match ReplyHeader::parse(&b[..hlen])? {
                ReplyHeader::Simple { error, cookie } => {
                    let c = cookie as usize;
                    let p = self
                        .pieces
                        .get(c)
                        .copied()
                        .flatten()
                        .ok_or(format!("a reply to unknown cookie {c}"))?;
                    let data_len = if error == 0 && p.kind == cmd::READ { p.len as usize } else { 0 };
                    if b.len() < hlen + data_len {
                        break;
                    }
                    let data = b[hlen..hlen + data_len].to_vec();
                    at += hlen + data_len;
                    let mut err = (error != 0).then(|| nbd_error(error, ""));
                    if data_len > 0 {
                        if let Err(e) = self.deliver(c, p.at, p.len, Some(&data)) {
                            err.get_or_insert(e);
                        }
                    }
                    self.piece_done(c, err);
                }
                ReplyHeader::Chunk { flags, kind, cookie, len } => {
                    if len > self.shared.max_payload as u32 + 64 {
                        return Err(format!("a reply chunk of {len} bytes"));
                    }
                    if b.len() < hlen + len as usize {
                        break;
                    }
                    let payload = b[hlen..hlen + len as usize].to_vec();
                    at += hlen + len as usize;
                    let c = cookie as usize;
                    let p = self
                        .pieces
                        .get(c)
                        .copied()
                        .flatten()
                        .ok_or(format!("a chunk for unknown cookie {c}"))?;
                    let base = self.reqs.get(p.req).map_or(0, |r| r.offset);
                    let u64at = |i: usize| u64::from_be_bytes(payload[i..i + 8].try_into().expect("8"));
                    let mut err = None;
                    match kind {
                        chunk::NONE => {}
                        chunk::OFFSET_DATA if payload.len() >= 8 => {
                            let off = u64at(0).wrapping_sub(base);
                            if let Err(e) =
                                self.deliver(c, off, (payload.len() - 8) as u64, Some(&payload[8..]))
                            {
                                err = Some(e);
                            }
                        }
                        chunk::OFFSET_HOLE if payload.len() == 12 => {
                            let off = u64at(0).wrapping_sub(base);
                            let n = u32::from_be_bytes(payload[8..12].try_into().expect("4"));
                            if let Err(e) = self.deliver(c, off, u64::from(n), None) {
                                err = Some(e);
                            }
                        }
                        k if k & chunk::ERROR_BIT != 0 && payload.len() >= 6 => {
                            let e = u32::from_be_bytes(payload[0..4].try_into().expect("4"));
                            let mlen = u16::from_be_bytes([payload[4], payload[5]]) as usize;
                            let msg =
                                payload.get(6..6 + mlen).map(String::from_utf8_lossy).unwrap_or_default();
                            err = Some(nbd_error(e, &msg));
                        }
                        k => return Err(format!("a reply chunk of type {k:#x} ({} bytes)", payload.len())),
                    }
                    if let Some(e) = err {
                        if let Some(req) = self.reqs.get_mut(p.req) {
                            req.fail(e);
                        }
                    }
                    if flags & chunk::FLAG_DONE != 0 {
                        self.piece_done(c, None);
                    }
                }
            }
        }
        if at > 0 {
            self.silent_since = None;
        }
        self.inbuf.drain(..at);
        Ok(())
    }

    /// The connection broke (`why`): commands wait while the queue reconnects
    /// (`try_reconnect`, a first try at once).
    fn lost(&mut self, why: &str) {
        self.stream = None;
        self.inbuf.clear();
        self.out.clear();
        if !matches!(self.link, Link::Up) {
            return;
        }
        let now = Instant::now();
        let since = *self.silent_since.get_or_insert(now);
        warn!(
            target: "vnvme::backend",
            uri = %self.shared.uri,
            "NBD connection lost ({why}): reconnecting; {} command(s) wait, at most {:?}",
            self.reqs.in_flight(),
            self.shared.hold.saturating_sub(now - since)
        );
        self.shared.storage.lost();
        self.link = Link::Down {
            since,
            why: why.to_string(),
            last: String::new(),
            tries: 0,
            next_try: now,
            backoff: FIRST_BACKOFF,
        };
        self.try_reconnect();
    }

    /// While the connection is down: a try if one is due; past the hold the export
    /// is gone and every request fails Not Ready.
    fn try_reconnect(&mut self) {
        let hold = self.shared.hold;
        let Link::Down { since, next_try, .. } = &self.link else { return };
        let (since, now) = (*since, Instant::now());
        if now < *next_try {
            return;
        }
        let left = (since + hold).saturating_duration_since(now);
        let attempt = if left.is_zero() { None } else { Some(self.connect_again(left.min(TRY_TIMEOUT))) };
        let Link::Down { why, last, tries, next_try, backoff, .. } = &mut self.link else { return };
        *tries += attempt.is_some() as u32;
        match attempt {
            Some(Ok(())) => {
                info!(
                    target: "vnvme::backend",
                    uri = %self.shared.uri,
                    "NBD connection re-established after {} ms ({} tr{}); {} command(s) sent again",
                    since.elapsed().as_millis(),
                    tries,
                    if *tries == 1 { "y" } else { "ies" },
                    self.reqs.in_flight()
                );
                self.shared.storage.back(since.elapsed());
                self.link = Link::Up;
            }
            failed => {
                if let Some(Err(e)) = failed {
                    *last = e;
                }
                let now = Instant::now();
                if now >= since + hold {
                    let msg = format!(
                        "NBD server {} gone ({why}; not back within the hold of {hold:?}, {tries} tries; last: {last})",
                        self.shared.uri
                    );
                    warn!(target: "vnvme::backend", "{msg}; its commands fail Not Ready, and one tries it again every {}s", REVIVE_EVERY.as_secs());
                    self.shared.storage.gave_up(now - since);
                    self.link = Link::Gone { why: msg, last_try: now };
                    self.fail_all();
                } else {
                    *next_try = (now + *backoff).min(since + hold);
                    *backoff = (*backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// One try at a new connection to the same export (same size), within
    /// `timeout`; on success every unanswered piece is sent again, in the order the
    /// pieces were made.
    fn connect_again(&mut self, timeout: Duration) -> Result<(), String> {
        let (s, e) =
            handshake::reopen(&self.shared.uri, &self.shared.target, timeout).map_err(|e| e.to_string())?;
        if e.size != self.shared.export.size {
            return Err(format!("the export now has {} bytes, not {}", e.size, self.shared.export.size));
        }
        s.set_timeouts(None)
            .and_then(|()| set_nonblocking(&s))
            .and_then(|()| watch(&self.epoll, &s))
            .map_err(|e| e.to_string())?;
        self.stream = Some(s);
        // What was encoded while down goes again below, once.
        self.out.clear();
        self.inbuf.clear();
        let mut unanswered: Vec<usize> =
            (0..self.pieces.len()).filter(|&i| self.pieces[i].is_some()).collect();
        unanswered.sort_by_key(|&i| self.pieces[i].map_or(0, |p| p.seq));
        for c in unanswered {
            if let Err(e) = self.encode(c) {
                self.piece_done(c, Some(e));
            }
        }
        Ok(())
    }

    /// A command arrived for an export that is gone: try it again, at most every
    /// REVIVE_EVERY and for TRY_TIMEOUT, so it comes back when its server does.
    fn maybe_revive(&mut self) {
        let Link::Gone { last_try, .. } = &mut self.link else { return };
        if last_try.elapsed() < REVIVE_EVERY {
            return;
        }
        *last_try = Instant::now();
        match self.connect_again(TRY_TIMEOUT) {
            Ok(()) => {
                self.shared.storage.revived();
                self.link = Link::Up;
                self.silent_since = None;
                info!(target: "vnvme::backend", uri = %self.shared.uri, "NBD server back: namespace ready again");
            }
            Err(e) => {
                tracing::debug!(target: "vnvme::backend", uri = %self.shared.uri, "NBD server still gone: {e}")
            }
        }
    }

    /// Keeps the storage report's count of waiting commands in step with this
    /// queue's: what it holds while down, nothing otherwise.
    fn report_waiting(&mut self) {
        let now = if matches!(self.link, Link::Down { .. }) { self.reqs.in_flight() as i64 } else { 0 };
        if now != self.waiting_reported {
            self.shared.storage.waiting(now - self.waiting_reported);
            self.waiting_reported = now;
        }
    }

    fn fail_all(&mut self) {
        let why = match &self.link {
            Link::Gone { why, .. } => why.clone(),
            _ => "the NBD server is gone".to_string(),
        };
        for c in 0..self.pieces.len() {
            if self.pieces[c].is_some() {
                self.piece_done(c, Some(BackendError::NotReady(why.clone())));
            }
        }
    }
}

/// Adds connection `s` to the notifier (a closed connection leaves it by itself).
fn watch(epoll: &std::os::fd::OwnedFd, s: &Stream) -> io::Result<()> {
    epoll::add(epoll, s.as_fd(), epoll::EventData::new_u64(0), epoll::EventFlags::IN)?;
    Ok(())
}

/// O_NONBLOCK through fcntl (the FIONBIO ioctl std uses is refused by the sandbox).
fn set_nonblocking(s: &Stream) -> io::Result<()> {
    let fd = s.as_fd();
    let fl = rustix::fs::fcntl_getfl(fd)?;
    rustix::fs::fcntl_setfl(fd, fl | rustix::fs::OFlags::NONBLOCK)?;
    Ok(())
}

impl BackendQueue for NbdQueue {
    fn submit(&mut self, mem: &GuestMemory, req: Request) {
        self.maybe_revive();
        let checked = match &self.link {
            Link::Gone { why, .. } => Err(BackendError::NotReady(why.clone())),
            Link::Up | Link::Down { .. } => self.check(&req),
        };
        let e = *self.export();
        // Nothing to do: no cache to flush, or an empty range.
        let nothing = match req.op {
            Op::Flush => !e.has(tflag::SEND_FLUSH),
            _ => req.len == 0,
        };
        // Without FUA on the wire, a FUA write is a write, then a flush (if there is
        // a cache to flush at all).
        let fua_by_flush = !e.has(tflag::SEND_FUA) && e.has(tflag::SEND_FLUSH);
        let Admit::Slot(r) =
            self.reqs.admit(mem, req, checked.map(|()| (!nothing).then_some(0)), fua_by_flush)
        else {
            return;
        };
        if let Err(err) = self.start(r) {
            // Nothing of it went out whole: drop its pieces and fail it.
            for c in 0..self.pieces.len() {
                if self.pieces[c].is_some_and(|p| p.req == r) {
                    self.pieces[c] = None;
                    self.free_pieces.push(c);
                }
            }
            let req = self.reqs.get_mut(r).expect("live");
            req.wire = 0;
            req.fail(err);
            self.reqs.finish(r);
        }
        self.report_waiting();
    }

    fn commit(&mut self) {
        self.try_reconnect();
        if self.stream.is_some() && !self.out.is_empty() && !self.send() {
            // What a reconnect queues again goes with it.
            self.lost("send failed");
        }
    }

    fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        self.try_reconnect();
        if self.stream.is_some() {
            let ok = self.send() && self.receive();
            match (ok, self.parse()) {
                (true, Ok(())) => {}
                (false, _) => self.lost("the server closed the connection"),
                (_, Err(e)) => self.lost(&e),
            }
            // What a reconnect queued again goes now.
            if self.stream.is_some() && !self.out.is_empty() && !self.send() {
                self.lost("send failed after reconnecting");
            }
        }
        if matches!(self.link, Link::Up) && self.reqs.in_flight() == 0 {
            // Nothing unanswered: no outage goes on.
            self.silent_since = None;
        }
        let n = self.reqs.reap(out);
        self.report_waiting();
        n
    }

    fn in_flight(&self) -> usize {
        self.reqs.in_flight()
    }

    fn notifier(&self) -> Option<BorrowedFd<'_>> {
        Some(self.epoll.as_fd())
    }

    fn needs_polling(&self) -> bool {
        // Unsent bytes: the socket's readability says nothing of its room to write.
        // Down: the next try to reconnect falls due with no event to say so.
        !self.out.is_empty() || self.reqs.has_done() || matches!(self.link, Link::Down { .. })
    }

    fn revoke(&mut self, tag: u64) -> Option<bool> {
        // Read data is dropped on arrival; a write not yet sent (or to be sent again)
        // fails instead of reading the host's buffer.
        self.reqs.revoke(tag)
    }
}

impl Drop for NbdQueue {
    fn drop(&mut self) {
        self.shared.storage.waiting(-self.waiting_reported);
        self.shared.storage.closed(match self.link {
            Link::Up => block_backend::StorageState::Up,
            Link::Down { .. } => block_backend::StorageState::Waiting,
            Link::Gone { .. } => block_backend::StorageState::Gone,
        });
        // Tell the server we are leaving (best effort).
        if let Some(s) = self.stream.as_mut() {
            let _ = s.write(&proto::request(0, cmd::DISC, 0, 0, 0));
        }
    }
}
