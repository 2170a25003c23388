//! Framing: one message = header + payload, file descriptors as SCM_RIGHTS attached
//! to the first byte. With `rx` (its kept memory's mapping), the one place in the
//! crate with `unsafe` (sendmsg/recvmsg).

use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use zerocopy::IntoBytes;

pub use crate::message::{Message, ProtoError};
use crate::proto::{Header, HEADER_SIZE};
pub use crate::rx::{FdGroup, Partial};
use crate::rx::{RecvBuffer, RX_BUFFER};

/// Most file descriptors we accept with one message (we advertise `max_msg_fds`).
pub const MAX_FDS: usize = 16;

/// One end of a vfio-user socket.
///
/// Reading is buffered: one recvmsg takes whatever has arrived, often several
/// messages (a guest's doorbell writes come in bursts), and they are handed out one
/// by one. Descriptors ride on the first byte of the sendmsg that carried them, and
/// the kernel ends a read right after the data they came with: they belong to the
/// last message that begins in that read.
///
/// Two ways to read: [`Connection::recv`] blocks until a whole message is in (a
/// client waiting for its reply); [`Connection::fill`] takes what has arrived without
/// ever waiting, [`Connection::next_message`] hands out the whole messages, and
/// [`Connection::pending_deadline`] says by when the one that has begun must be
/// complete (a server, whose thread has queues to run meanwhile).
#[derive(Debug)]
pub struct Connection {
    sock: UnixStream,
    /// How long a message may take to arrive once begun, and a reply to leave.
    deadline: Option<Duration>,
    rx: RecvBuffer,
}

impl Connection {
    pub fn new(sock: UnixStream) -> Self {
        Connection { sock, deadline: None, rx: RecvBuffer::default() }
    }

    /// True if a whole message has arrived and not been taken: [`Self::recv`]
    /// returns it without a system call. A reader that waits for the socket to be
    /// readable must take these first (the socket does not say they are there).
    pub fn has_message(&self) -> bool {
        self.rx.header().is_some_and(|h| self.rx.buffered() >= (h.size.get() as usize).max(HEADER_SIZE))
    }

    /// Hands back a message's payload buffer once it is no longer needed: the next
    /// message's payload is read into it instead of a new allocation. A buffer
    /// larger than the usual receive buffer is dropped, so one large message does
    /// not pin its memory.
    pub fn recycle(&mut self, payload: Vec<u8>) {
        if payload.capacity() <= RX_BUFFER {
            self.rx.spare = payload;
        }
    }

    /// Bytes read from the socket and not yet handed out as a message.
    pub fn buffered(&self) -> usize {
        self.rx.buffered()
    }

    /// A copy of what is buffered (call it once the whole messages are taken: it is
    /// the start of a message), its descriptors duplicated: for a hand-over, after
    /// which this connection is not read again.
    pub fn partial(&self) -> io::Result<Partial> {
        self.rx.partial()
    }

    /// Starts an empty connection's buffer with what another process had received
    /// ([`Self::partial`] there; after a crash, the keeper's [`crate::rx::unanswered`]):
    /// the whole messages in it are handed out before anything is read, and the
    /// deadline of one begun runs from when its first byte arrived there. Err if it
    /// is more than a kept buffer holds.
    pub fn preload(&mut self, p: Partial) -> io::Result<()> {
        self.rx.preload(p)
    }

    /// Keeps what this connection receives in `memory` ([`crate::rx::kept_memory`]),
    /// which another process (a keeper) holds too, from now on; call it before
    /// anything is read.
    pub fn keep_received(&mut self, memory: impl std::os::fd::AsFd) -> io::Result<()> {
        self.rx.keep(memory)
    }

    /// Every message handed out so far is answered (or needs no answer): a process
    /// standing in after this one dies does not answer them again. Call it before
    /// the reply is sent: a reply twice would be worse than none.
    pub fn answered(&mut self) {
        self.rx.answered()
    }

    /// The stream offset (from this connection's start) one past the last message
    /// handed out.
    pub fn taken_through(&self) -> u64 {
        self.rx.pos
    }

    /// Duplicates of the descriptors that came with reads beginning at or after
    /// stream offset `at`, each group with its read's range; and the offset to ask
    /// from next time.
    pub fn fds_read_from(&self, at: u64) -> io::Result<(Vec<FdGroup>, u64)> {
        let groups = self
            .rx
            .fds
            .iter()
            .filter(|(s, _, _)| *s >= at)
            .map(|(s, e, fds)| Ok((*s, *e, fds.iter().map(|f| f.try_clone()).collect::<io::Result<_>>()?)))
            .collect::<io::Result<_>>()?;
        Ok((groups, self.rx.read_through()))
    }

    /// Whether any descriptor came with a read beginning at or after `at`.
    pub fn has_fds_from(&self, at: u64) -> bool {
        self.rx.fds.last().is_some_and(|(s, _, _)| *s >= at)
    }

    /// A connection to an untrusted peer: a message that has begun to arrive must
    /// complete within `limit`, and a message we send must leave within `limit`;
    /// otherwise the call fails with [`ProtoError::Deadline`] instead of waiting for
    /// the peer forever. Call [`Self::recv`] only once the socket is readable: the
    /// deadline also bounds the wait for a message's first byte.
    pub fn with_deadline(sock: UnixStream, limit: Duration) -> io::Result<Self> {
        sock.set_read_timeout(Some(limit))?;
        sock.set_write_timeout(Some(limit))?;
        Ok(Connection { sock, deadline: Some(limit), rx: RecvBuffer::default() })
    }

    pub fn stream(&self) -> &UnixStream {
        &self.sock
    }

    /// Another handle on the socket, with its own (empty) receive buffer: for a
    /// second writer, or a reader taking over once this one's buffer is empty.
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(Connection { sock: self.sock.try_clone()?, deadline: self.deadline, rx: RecvBuffer::default() })
    }

    /// Maps a socket timeout to the deadline error.
    fn stalled(&self, e: io::Error, what: &'static str) -> ProtoError {
        match (e.kind(), self.deadline) {
            (io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut, Some(limit)) => {
                ProtoError::Deadline { what, limit }
            }
            (io::ErrorKind::UnexpectedEof, _) => ProtoError::Closed,
            _ => ProtoError::Io(e),
        }
    }

    /// Reads one whole message. Blocks until it has arrived: the first byte for at
    /// most the socket timeout (the deadline, with [`Self::with_deadline`]), and once
    /// a message has begun, the whole of it must be in by the deadline counted from
    /// its first byte, however the peer spreads the rest.
    pub fn recv(&mut self) -> Result<Message, ProtoError> {
        loop {
            if let Some(m) = self.rx.take()? {
                return Ok(m);
            }
            if let Some(until) = self.pending_deadline() {
                if !wait_readable(self.sock.as_raw_fd(), until)? {
                    return Err(self.late());
                }
            }
            match self.read(0) {
                Ok(0) => return Err(ProtoError::Closed),
                Ok(_) => {}
                Err(ProtoError::Io(e)) => {
                    let what = if self.rx.buffered() > 0 { BEGUN } else { "no message arrived" };
                    return Err(self.stalled(e, what));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads whatever has arrived, without waiting: true if bytes came, false if
    /// there were none. [`Self::next_message`] then hands out the whole messages.
    pub fn fill(&mut self) -> Result<bool, ProtoError> {
        match self.read(libc::MSG_DONTWAIT) {
            Ok(0) => Err(ProtoError::Closed),
            Ok(_) => Ok(true),
            Err(ProtoError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The next whole message already read, if any (no system call).
    pub fn next_message(&mut self) -> Result<Option<Message>, ProtoError> {
        self.rx.take()
    }

    /// With a deadline, once the whole messages are taken: when the message that
    /// has begun to arrive must be complete (None: none has begun). Its first byte
    /// came with the latest read; the clock is read only the first time a message
    /// is seen incomplete, so the usual case (whole messages) costs none.
    pub fn pending_deadline(&mut self) -> Option<Instant> {
        let limit = self.deadline?;
        if self.rx.buffered() == 0 {
            self.rx.begun = None;
            return None;
        }
        Some(*self.rx.begun.get_or_insert_with(Instant::now) + limit)
    }

    /// The error for a message not complete by its deadline.
    pub fn late(&self) -> ProtoError {
        ProtoError::Deadline { what: BEGUN, limit: self.deadline.unwrap_or_default() }
    }

    /// One recvmsg into the buffer (`flags`: MSG_DONTWAIT or 0). The bytes read.
    fn read(&mut self, flags: i32) -> Result<usize, ProtoError> {
        let fd = self.sock.as_raw_fd();
        let room = self.rx.make_room();
        if room.is_empty() {
            // Kept memory full of whole messages not taken (a reader that reads
            // again before it takes them): nothing more until they are.
            return Err(ProtoError::Io(io::ErrorKind::WouldBlock.into()));
        }
        let (n, fds) = recv_with_fds(fd, room, flags)?;
        self.rx.filled(n, fds);
        Ok(n)
    }

    /// Writes all of `buf`, bounded like [`Self::recv`].
    fn write_all(&mut self, mut buf: &[u8], stall: &mut Stall) -> Result<(), ProtoError> {
        const WHAT: &str = "a message could not be sent (the peer is not reading)";
        while !buf.is_empty() {
            match self.sock.write(buf) {
                Ok(0) => return Err(ProtoError::Closed),
                Ok(n) => buf = &buf[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.stalled(e, WHAT)),
            }
            if !buf.is_empty() && stall.over(self.deadline) {
                return Err(self.stalled(io::ErrorKind::TimedOut.into(), WHAT));
            }
        }
        Ok(())
    }

    /// Writes `bytes` as they are, without framing, the descriptors with the first
    /// byte: for a peer that cuts messages its own way (tests, the fuzzer).
    pub fn send_bytes(&mut self, bytes: &[u8], fds: &[RawFd]) -> Result<(), ProtoError> {
        let n = if fds.is_empty() {
            0
        } else {
            send_with_fds(self.sock.as_raw_fd(), bytes, fds)
                .map_err(|e| self.stalled(e, "a message could not be sent (the peer is not reading)"))?
        };
        self.write_all(&bytes[n..], &mut Stall::default())
    }

    /// Sends `header` (its size is filled in) followed by `parts`, with `fds`.
    pub fn send(&mut self, mut header: Header, parts: &[&[u8]], fds: &[RawFd]) -> Result<(), ProtoError> {
        let len = HEADER_SIZE + parts.iter().map(|p| p.len()).sum::<usize>();
        header.size.set(len as u32);
        let mut buf = Vec::with_capacity(len);
        buf.extend_from_slice(header.as_bytes());
        for p in parts {
            buf.extend_from_slice(p);
        }
        let n = if fds.is_empty() {
            0
        } else {
            send_with_fds(self.sock.as_raw_fd(), &buf, fds)
                .map_err(|e| self.stalled(e, "a message could not be sent (the peer is not reading)"))?
        };
        self.write_all(&buf[n..], &mut Stall::default())
    }
}

/// Marks every descriptor of this process from `first` up close-on-exec, so a
/// program it starts inherits only what it is handed explicitly (a descriptor the
/// process itself inherited without meaning to, a lock file say, would otherwise
/// live on in every program started from it). Nothing is closed here: whoever owns
/// a descriptor keeps it.
pub fn cloexec_from(first: RawFd) -> io::Result<()> {
    let first = u32::try_from(first).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // close_range(2) with CLOSE_RANGE_CLOEXEC changes only the close-on-exec flag
    // of the descriptors in the range; it takes no pointer and closes nothing.
    // SAFETY: a flag change on descriptors, no memory is touched.
    let r = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What a peer that began a message and did not finish it is told.
const BEGUN: &str = "a message began to arrive and did not complete";

/// Waits until `fd` is readable or `until` has passed (false).
fn wait_readable(fd: RawFd, until: Instant) -> Result<bool, ProtoError> {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: `p` is one live pollfd, and the count says one.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r > 0 {
            return Ok(true);
        }
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e.into());
            }
        }
    }
}

/// When a message began to stall. The clock is read only once a read or write comes
/// up short, so a message that moves in one call, the usual case, costs no clock read;
/// the deadline then runs from the first short call (the calls before it did not wait).
#[derive(Debug, Default)]
struct Stall(Option<Instant>);

impl Stall {
    /// True once more than `limit` has passed since the first short call.
    fn over(&mut self, limit: Option<Duration>) -> bool {
        limit.is_some_and(|d| self.0.get_or_insert_with(Instant::now).elapsed() > d)
    }
}

const CMSG_SPACE: usize = 64 + MAX_FDS * 4;

/// recvmsg into `buf` with `flags`, collecting any SCM_RIGHTS descriptors
/// (close-on-exec).
fn recv_with_fds(fd: RawFd, buf: &mut [u8], flags: i32) -> Result<(usize, Vec<OwnedFd>), ProtoError> {
    let mut cmsg = [0u64; CMSG_SPACE / 8];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: msghdr is plain data; zero is a valid initial value for every field.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.as_mut_ptr().cast();
    msg.msg_controllen = CMSG_SPACE;
    let n = loop {
        // `msg` points at `iov` (covering `buf`) and `cmsg`, both live and writable for
        // the duration of the call, with their true lengths.
        // SAFETY: every buffer `msg` names is live and writable at its stated length.
        let r = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC | flags) };
        if r >= 0 {
            break r as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e.into());
        }
    };
    let mut fds = Vec::new();
    // The CMSG_* macros walk the control buffer the kernel just filled in, bounded by
    // msg_controllen; each SCM_RIGHTS payload is an array of ints the kernel installed
    // in our fd table, so taking ownership of them is sound.
    // SAFETY: the walk stays inside what the kernel filled, and the fds are ours.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const RawFd;
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / size_of::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 || fds.len() > MAX_FDS {
        return Err(ProtoError::TooManyFds(fds.len()));
    }
    Ok((n, fds))
}

/// sendmsg of `buf` with `fds` attached. Returns the bytes sent.
fn send_with_fds(fd: RawFd, buf: &[u8], fds: &[RawFd]) -> io::Result<usize> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::other("too many file descriptors"));
    }
    let mut cmsg = [0u64; CMSG_SPACE / 8];
    let mut iov = libc::iovec { iov_base: buf.as_ptr() as *mut _, iov_len: buf.len() };
    // SAFETY: msghdr is plain data; zero is a valid initial value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is a pure size computation.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(size_of_val(fds) as u32) } as usize;
    // The control buffer is large enough for one header plus `fds` (checked against
    // MAX_FDS above); we write exactly one SCM_RIGHTS message into it, and sendmsg only
    // reads `buf` (the kernel does not write through iov_base).
    // SAFETY: the control buffer fits what is written, and sendmsg only reads.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(size_of_val(fds) as u32) as usize;
        let data = libc::CMSG_DATA(c) as *mut RawFd;
        for (i, f) in fds.iter().enumerate() {
            data.add(i).write_unaligned(*f);
        }
        loop {
            let r = libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL);
            if r >= 0 {
                return Ok(r as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::Command;
    use std::fs::File;
    use std::io::{Read, Seek};
    use zerocopy::little_endian::{U16, U32};

    #[test]
    fn messages_and_fds_round_trip() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut a, mut b) = (Connection::new(a), Connection::new(b));
        let mut f = tempfile();
        f.write_all(b"hello").unwrap();
        let h = Header {
            msg_id: U16::new(7),
            command: U16::new(Command::DmaMap as u16),
            flags: U32::new(0),
            ..Default::default()
        };
        a.send(h, &[b"abc", b"defg"], &[f.as_raw_fd()]).unwrap();
        let m = b.recv().unwrap();
        assert_eq!(m.header.msg_id.get(), 7);
        assert_eq!(m.header.size.get(), 16 + 7);
        assert_eq!(m.payload, b"abcdefg");
        assert_eq!(m.fds.len(), 1);
        let mut g = File::from(m.fds.into_iter().next().unwrap());
        g.rewind().unwrap();
        let mut s = String::new();
        g.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello");
        drop(a);
        assert!(matches!(b.recv(), Err(ProtoError::Closed)));
    }

    #[test]
    fn bad_sizes_are_errors() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut b = Connection::new(b);
        let mut h = Header::default();
        h.size.set(8);
        a.write_all(h.as_bytes()).unwrap();
        assert!(matches!(b.recv(), Err(ProtoError::BadSize(8))));
    }

    fn tempfile() -> File {
        // SAFETY: memfd_create with a valid name; result checked.
        let fd = unsafe { libc::memfd_create(c"vfio-user-test".as_ptr(), 0) };
        assert!(fd >= 0);
        // SAFETY: fresh fd we own.
        unsafe { File::from_raw_fd(fd) }
    }

    fn msg(id: u16, payload: &[u8]) -> (Header, Vec<u8>) {
        let h =
            Header { msg_id: U16::new(id), command: U16::new(Command::DmaMap as u16), ..Default::default() };
        (h, payload.to_vec())
    }

    /// Messages sent back to back come in with one read, each with its own
    /// descriptors; the ones after the first need no system call.
    #[test]
    fn a_burst_is_read_at_once_and_descriptors_stay_with_their_message() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut a, mut b) = (Connection::new(a), Connection::new(b));
        let f = tempfile();
        for (i, with_fd) in [(1u16, false), (2, true), (3, false), (4, true), (5, false)] {
            let (h, p) = msg(i, &vec![i as u8; 100 * i as usize]);
            let fds: Vec<RawFd> = if with_fd { vec![f.as_raw_fd()] } else { vec![] };
            a.send(h, &[&p], &fds).unwrap();
        }
        let mut got = Vec::new();
        for _ in 0..5 {
            let m = b.recv().unwrap();
            assert_eq!(m.payload.len(), 100 * m.header.msg_id.get() as usize);
            got.push((m.header.msg_id.get(), m.fds.len()));
        }
        assert_eq!(got, vec![(1, 0), (2, 1), (3, 0), (4, 1), (5, 0)]);
        assert!(!b.has_message() && b.buffered() == 0);
    }

    /// A payload handed back is the buffer the next message's payload comes in (no
    /// allocation per message); one larger than the receive buffer is not kept.
    #[test]
    fn a_recycled_payload_buffer_carries_the_next_message() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut a, mut b) = (Connection::new(a), Connection::new(b));
        for (i, len) in [(1u16, 40usize), (2, 24), (3, 200_000), (4, 16)] {
            let (h, p) = msg(i, &vec![i as u8; len]);
            a.send(h, &[&p], &[]).unwrap();
        }
        let m1 = b.recv().unwrap();
        let at = m1.payload.as_ptr();
        b.recycle(m1.payload);
        let m2 = b.recv().unwrap();
        assert_eq!(m2.payload, vec![2u8; 24]);
        assert_eq!(m2.payload.as_ptr(), at, "the second payload reuses the first's buffer");
        b.recycle(m2.payload);
        let m3 = b.recv().unwrap();
        assert_eq!(m3.payload.len(), 200_000);
        b.recycle(m3.payload);
        assert_eq!(b.rx.spare.capacity(), 0, "a large buffer is dropped, not kept");
        assert_eq!(b.recv().unwrap().payload, vec![4u8; 16]);
    }

    /// A message that arrives in pieces (and one larger than the usual buffer) is
    /// put together; what follows it stays buffered for the next call.
    #[test]
    fn messages_in_pieces_and_large_ones_are_put_together() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut b = Connection::new(b);
        let mut a = a;
        let big = vec![7u8; RX_BUFFER * 3 + 5];
        let mut bytes = Vec::new();
        for (id, p) in [(1u16, &big[..]), (2, &b"tail"[..])] {
            let mut h = Header { msg_id: U16::new(id), ..Default::default() };
            h.size.set((HEADER_SIZE + p.len()) as u32);
            bytes.extend_from_slice(h.as_bytes());
            bytes.extend_from_slice(p);
        }
        let writer = std::thread::spawn(move || {
            for chunk in bytes.chunks(7001) {
                a.write_all(chunk).unwrap();
                std::thread::sleep(Duration::from_micros(200));
            }
            a
        });
        let m = b.recv().unwrap();
        assert_eq!((m.header.msg_id.get(), m.payload.len()), (1, big.len()));
        assert!(m.payload.iter().all(|&x| x == 7));
        let m = b.recv().unwrap();
        assert_eq!((m.header.msg_id.get(), &m.payload[..]), (2, &b"tail"[..]));
        drop(writer.join().unwrap());
        assert!(matches!(b.recv(), Err(ProtoError::Closed)));
    }

    /// The deadline of a message in progress runs from its first byte: bytes that
    /// trickle in later do not move it, a message taken whole ends it, and the
    /// start of the next one, read with the end of the one before, starts its own.
    #[test]
    fn a_begun_message_is_due_a_deadline_after_its_first_byte() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut b = Connection::with_deadline(b, Duration::from_secs(5)).unwrap();
        assert!(!b.fill().unwrap(), "nothing to read: fill does not wait");
        assert_eq!(b.pending_deadline(), None);
        let p = [1u8; 16];
        let mut whole = raw(1, (HEADER_SIZE + p.len()) as u32);
        whole.extend_from_slice(&p);
        a.write_all(&whole[..5]).unwrap();
        assert!(b.fill().unwrap());
        assert!(b.next_message().unwrap().is_none());
        let due = b.pending_deadline().expect("a message has begun");
        std::thread::sleep(Duration::from_millis(20));
        a.write_all(&whole[5..20]).unwrap();
        assert!(b.fill().unwrap());
        assert!(b.next_message().unwrap().is_none());
        assert_eq!(b.pending_deadline(), Some(due), "later bytes do not move the deadline");
        // The rest, and the first bytes of the next message, in one write.
        let mut rest = whole[20..].to_vec();
        rest.extend_from_slice(&whole[..3]);
        std::thread::sleep(Duration::from_millis(20));
        a.write_all(&rest).unwrap();
        assert!(b.fill().unwrap());
        assert_eq!(b.next_message().unwrap().expect("whole").payload, p);
        let next = b.pending_deadline().expect("the next message has begun");
        assert!(next > due, "the next message has a deadline of its own");
        a.write_all(&whole[3..]).unwrap();
        assert!(b.fill().unwrap());
        assert!(b.next_message().unwrap().is_some());
        assert_eq!(b.pending_deadline(), None);
        // Without a deadline, nothing is due.
        let (_c, d) = UnixStream::pair().unwrap();
        assert_eq!(Connection::new(d).pending_deadline(), None);
    }

    /// A blocking receive gives up on a begun message a deadline after its first
    /// byte, however the rest trickles in.
    #[test]
    fn recv_gives_up_a_deadline_after_the_first_byte() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut b = Connection::with_deadline(b, Duration::from_millis(300)).unwrap();
        let trickle = std::thread::spawn(move || {
            let h = raw(1, 64);
            for byte in h.iter().chain([0u8; 48].iter()) {
                if a.write_all(&[*byte]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(40));
            }
        });
        match b.recv() {
            Err(ProtoError::Deadline { what, .. }) => assert!(what.contains("did not complete"), "{what}"),
            other => panic!("a trickled message was taken: {other:?}"),
        }
        drop(b);
        trickle.join().unwrap();
    }

    /// What a connection has of a begun message (bytes and descriptors) goes to
    /// another connection on the same socket, which finishes it.
    #[test]
    fn a_partial_message_moves_to_another_connection() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut a = Connection::new(a);
        let mut b = Connection::with_deadline(b, Duration::from_secs(5)).unwrap();
        let f = tempfile();
        let (h, p) = msg(7, &[7u8; 40]);
        let mut bytes = Vec::new();
        let mut hh = h;
        hh.size.set((HEADER_SIZE + p.len()) as u32);
        bytes.extend_from_slice(hh.as_bytes());
        bytes.extend_from_slice(&p);
        let n = send_with_fds(a.stream().as_raw_fd(), &bytes[..30], &[f.as_raw_fd()]).unwrap();
        assert_eq!(n, 30);
        assert!(b.fill().unwrap());
        assert!(b.next_message().unwrap().is_none());
        b.pending_deadline();
        let part = b.partial().unwrap();
        assert_eq!(part.bytes, &bytes[..30]);
        assert_eq!(part.fds.len(), 1);
        let mut c =
            Connection::with_deadline(b.stream().try_clone().unwrap(), Duration::from_secs(5)).unwrap();
        c.preload(part).unwrap();
        assert!(c.pending_deadline().is_some());
        a.write_all(&bytes[30..], &mut Stall::default()).unwrap();
        let m = c.recv().unwrap();
        assert_eq!((m.header.msg_id.get(), m.payload.len(), m.fds.len()), (7, 40, 1));
    }

    /// Three messages (the second with a descriptor), each sent as a client sends
    /// it, and cut once more at every byte of the stream, each piece in a read of
    /// its own: the receiver hands out the same three messages, the descriptor with
    /// the second.
    #[test]
    fn messages_cut_at_every_byte_come_out_whole() {
        let payloads: [&[u8]; 3] = [b"first", &[9u8; 40], b""];
        let mut stream = Vec::new();
        let mut starts = Vec::new();
        for (i, p) in payloads.iter().enumerate() {
            starts.push(stream.len());
            stream.extend(raw(i as u16 + 1, (HEADER_SIZE + p.len()) as u32));
            stream.extend_from_slice(p);
        }
        let f = tempfile();
        for cut in 1..stream.len() {
            let (a, b) = UnixStream::pair().unwrap();
            let (mut a, mut b) =
                (Connection::new(a), Connection::with_deadline(b, Duration::from_secs(5)).unwrap());
            // Each message starts a write of its own, as a client's sendmsg per
            // message does (the descriptor rides on the second one's first byte).
            let mut bounds = vec![0, cut, starts[1], starts[2], stream.len()];
            bounds.sort_unstable();
            bounds.dedup();
            for w in bounds.windows(2) {
                let fds: &[RawFd] = if w[0] == starts[1] { &[f.as_raw_fd()] } else { &[] };
                a.send_bytes(&stream[w[0]..w[1]], fds).unwrap();
                // Each piece in a read of its own.
                assert!(b.fill().unwrap());
            }
            let mut got = Vec::new();
            while let Some(m) = b.next_message().unwrap() {
                got.push((m.header.msg_id.get(), m.payload.clone(), m.fds.len()));
            }
            let want: Vec<_> = payloads
                .iter()
                .enumerate()
                .map(|(i, p)| (i as u16 + 1, p.to_vec(), (i == 1) as usize))
                .collect();
            assert_eq!(got, want, "cut at byte {cut}");
            assert_eq!(b.pending_deadline(), None);
        }
    }

    fn raw(id: u16, size: u32) -> Vec<u8> {
        let mut h = Header { msg_id: U16::new(id), ..Default::default() };
        h.size.set(size);
        h.as_bytes().to_vec()
    }
}
