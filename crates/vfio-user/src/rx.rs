//! A connection's receive buffer: the bytes read from the socket and not yet
//! handed out as messages, and the descriptors that came with them.
//!
//! A server that has a keeper (a process that outlives it and starts another in
//! its place when it dies) keeps these bytes in memory the keeper holds too
//! ([`RecvBuffer::keep`]): a memfd laid out as one header page and two halves of
//! [`MAX_MESSAGE`] bytes. The buffer is one half. It is compacted into the other
//! half (copied, then one store of the header names that half), never moved in
//! place, so whenever the process dies, SIGKILL included, the header names whole
//! bytes: the stream from the first message not yet answered to the last byte
//! read. The keeper reads them with [`unanswered`] and hands them to the process
//! that stands in, which answers those messages. Without this, the client would
//! wait for the replies (QEMU: 5 s, then the register access fails), and a message
//! half read would leave the stream out of step.
//!
//! Header (each field a little-endian u64 stored as one atomic store, in program
//! order): the magic, the layout (`base << 1 | half`: the stream offset of the
//! half's first byte, and which half), `done` (the stream offset of the first
//! byte not answered) and `end` (one past the last byte read).

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use zerocopy::FromBytes;

use crate::message::{Message, ProtoError};
use crate::proto::{Header, HEADER_SIZE, MAX_MESSAGE};

/// Descriptors that came with one read, and the stream range of that read.
pub type FdGroup = (u64, u64, Vec<OwnedFd>);

/// A message that has begun to arrive and is not complete, as it moves with its
/// connection to another process (an upgrade): the bytes, the descriptors that came
/// with them (each group with the stream range of the read that brought it,
/// relative to the first byte), and how long ago the first byte was seen. A stand-in
/// after a crash is handed the same, beginning with the messages the dead process
/// had read and not answered.
#[derive(Debug, Default)]
pub struct Partial {
    pub bytes: Vec<u8>,
    pub fds: Vec<FdGroup>,
    pub age: Duration,
}

/// The usual size of the receive buffer; a larger message grows it for itself.
pub(crate) const RX_BUFFER: usize = 64 << 10;

/// Bytes read and not yet handed out, and the descriptors that came with them.
#[derive(Debug, Default)]
pub(crate) struct RecvBuffer {
    /// The buffer, unless it is kept (`kept`).
    buf: Vec<u8>,
    kept: Option<KeptRx>,
    /// `[start..end]` is unparsed; `start` is at stream offset `pos`.
    start: usize,
    end: usize,
    pub(crate) pos: u64,
    /// Descriptors received, with the stream range of the read that brought them.
    pub(crate) fds: Vec<FdGroup>,
    /// A payload buffer handed back (`Connection::recycle`), for the next message.
    pub(crate) spare: Vec<u8>,
    /// When the first byte of the message now partly buffered was seen (None: no
    /// message has begun, or the time was not needed yet).
    pub(crate) begun: Option<Instant>,
}

impl RecvBuffer {
    fn data(&self) -> &[u8] {
        match &self.kept {
            Some(k) => k.half(),
            None => &self.buf,
        }
    }

    fn data_mut(&mut self) -> &mut [u8] {
        match &mut self.kept {
            Some(k) => k.half_mut(),
            None => &mut self.buf,
        }
    }

    fn set_len(&mut self, len: usize) {
        match &mut self.kept {
            Some(k) => k.len = len.min(HALF),
            None if len > self.buf.len() => self.buf.resize(len, 0),
            None => {
                self.buf.truncate(len);
                self.buf.shrink_to_fit();
            }
        }
    }

    pub(crate) fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// The stream offset one past the last byte read.
    pub(crate) fn read_through(&self) -> u64 {
        self.pos + self.buffered() as u64
    }

    /// The header of the next message, if all of it has arrived.
    pub(crate) fn header(&self) -> Option<Header> {
        (self.buffered() >= HEADER_SIZE).then(|| {
            Header::read_from_bytes(&self.data()[self.start..self.start + HEADER_SIZE]).expect("16 bytes")
        })
    }

    /// The next message, if all of it has arrived.
    pub(crate) fn take(&mut self) -> Result<Option<Message>, ProtoError> {
        let Some(header) = self.header() else { return Ok(None) };
        let size = header.size.get() as usize;
        if !(HEADER_SIZE..=MAX_MESSAGE).contains(&size) {
            return Err(ProtoError::BadSize(size as u32));
        }
        if self.buffered() < size {
            return Ok(None);
        }
        let mut payload = std::mem::take(&mut self.spare);
        payload.clear();
        payload.extend_from_slice(&self.data()[self.start + HEADER_SIZE..self.start + size]);
        let (at, end) = (self.pos, self.pos + size as u64);
        // Descriptors whose read began before this message and that no earlier
        // message took belong to none (a peer that sent them mid-message): dropped.
        self.fds.retain(|(_, read_end, _)| *read_end > at);
        let mut fds = Vec::new();
        if let Some(i) = self.fds.iter().position(|(rs, re, _)| *rs <= at && at < *re && end >= *re) {
            fds = self.fds.remove(i).2;
        }
        self.start += size;
        self.pos = end;
        // Kept, the bytes stay until the message is answered (`answered`).
        if self.start == self.end && self.kept.is_none() {
            self.start = 0;
            self.end = 0;
        }
        // Whatever follows is another message: its first byte came with the latest
        // read (every whole message is taken after each read), not with this one's.
        self.begun = None;
        Ok(Some(Message { header, payload, fds }))
    }

    /// Every message taken so far is answered: kept, a process standing in after
    /// this one dies does not answer them again.
    pub(crate) fn answered(&mut self) {
        let Some(k) = &mut self.kept else { return };
        k.set(DONE, self.pos);
        k.done = self.pos;
        if self.start == self.end {
            // Nothing is left to keep: the next read goes to the half's start.
            (self.start, self.end) = (0, 0);
            k.set(LAYOUT, self.pos << 1 | k.which as u64);
        }
    }

    /// Room for at least the rest of the next message (or its header) after `end`.
    pub(crate) fn make_room(&mut self) -> &mut [u8] {
        let want =
            self.header().map_or(HEADER_SIZE, |h| (h.size.get() as usize).clamp(HEADER_SIZE, MAX_MESSAGE));
        // What is still to come of it (at least a byte: a read into no room would
        // look like the peer's end).
        let rest = want.saturating_sub(self.buffered()).max(1);
        if self.data().len() < RX_BUFFER {
            self.set_len(RX_BUFFER);
        }
        let len = self.data().len();
        if len - self.start < want || self.end == len {
            self.compact(rest);
        }
        let need = self.end + rest;
        let len = self.data().len();
        if len < need {
            self.set_len(need);
        } else if len > RX_BUFFER && need <= RX_BUFFER {
            // A large message has gone: back to the usual size.
            self.set_len(RX_BUFFER);
        }
        let end = self.end;
        &mut self.data_mut()[end..]
    }

    /// Moves what is kept to the buffer's start, with room for `rest` more bytes.
    fn compact(&mut self, rest: usize) {
        let Some(k) = &mut self.kept else {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            return;
        };
        // Kept: what is taken and not answered yet too (a reader that reads again
        // before it answers), unless the message now arriving would not fit beside
        // it: then that is no longer kept for a stand-in.
        let mut from = self.start - (self.pos - k.done) as usize;
        if self.end - from + rest > HALF {
            from = self.start;
            k.done = self.pos;
            k.set(DONE, self.pos);
        }
        // Into the other half; one store then names that half, so the header never
        // names bytes half moved.
        let (this, other) = k.halves();
        other[..self.end - from].copy_from_slice(&this[from..self.end]);
        k.which ^= 1;
        k.set(LAYOUT, k.done << 1 | k.which as u64);
        self.start -= from;
        self.end -= from;
    }

    /// `n` bytes were read into the room [`Self::make_room`] gave, with `fds`.
    pub(crate) fn filled(&mut self, n: usize, fds: Vec<OwnedFd>) {
        let read_at = self.read_through();
        self.end += n;
        if let Some(k) = &self.kept {
            k.set(END, read_at + n as u64);
        }
        if !fds.is_empty() {
            self.fds.push((read_at, read_at + n as u64, fds));
        }
    }

    /// From now on the bytes are kept in `memory` ([`kept_memory`]), which another
    /// process can hold too (the buffer must be empty). What `memory` held before
    /// (a client before this one) is forgotten.
    pub(crate) fn keep(&mut self, memory: impl AsFd) -> io::Result<()> {
        assert_eq!(self.buffered(), 0, "a buffer is kept from a message's boundary");
        let k = KeptRx::map(memory, self.pos)?;
        (self.buf, self.start, self.end) = (Vec::new(), 0, 0);
        self.kept = Some(k);
        Ok(())
    }

    /// A copy of what is buffered, the descriptors duplicated.
    pub(crate) fn partial(&self) -> io::Result<Partial> {
        let fds = self
            .fds
            .iter()
            .map(|(s, e, fds)| {
                let dup = fds.iter().map(|f| f.try_clone()).collect::<io::Result<Vec<_>>>()?;
                Ok((s.saturating_sub(self.pos), e.saturating_sub(self.pos), dup))
            })
            .collect::<io::Result<_>>()?;
        Ok(Partial {
            bytes: self.data()[self.start..self.end].to_vec(),
            fds,
            age: self.begun.map_or(Duration::ZERO, |t| t.elapsed()),
        })
    }

    /// Starts an empty buffer with `p`.
    pub(crate) fn preload(&mut self, p: Partial) -> io::Result<()> {
        assert_eq!(self.buffered(), 0, "preload into a connection that has read");
        if p.bytes.is_empty() {
            return Ok(());
        }
        match &mut self.kept {
            Some(_) if p.bytes.len() > HALF => {
                return Err(io::Error::other(format!(
                    "{} bytes handed over to be read, more than the {HALF} a connection buffers",
                    p.bytes.len()
                )))
            }
            Some(k) => {
                k.len = k.len.max(p.bytes.len());
                k.half_mut()[..p.bytes.len()].copy_from_slice(&p.bytes);
                (self.start, self.end) = (0, p.bytes.len());
                k.set(LAYOUT, self.pos << 1 | k.which as u64);
                k.set(END, self.pos + p.bytes.len() as u64);
            }
            None => {
                (self.start, self.end) = (0, p.bytes.len());
                self.buf = p.bytes;
            }
        }
        self.fds = p.fds.into_iter().map(|(s, e, f)| (self.pos + s, self.pos + e, f)).collect();
        let now = Instant::now();
        self.begun = Some(now.checked_sub(p.age).unwrap_or(now));
        Ok(())
    }
}

const MAGIC: u64 = u64::from_le_bytes(*b"vnvmeRX1");
const PAGE: usize = 4096;
/// Each half holds the largest message.
const HALF: usize = MAX_MESSAGE;
const TOTAL: usize = PAGE + 2 * HALF;
/// The header's fields, by index.
const LAYOUT: usize = 1;
const DONE: usize = 2;
const END: usize = 3;

/// Memory for a connection to keep what it receives in (see the module's doc),
/// made before a sandbox that would not allow it: sized and sealed at that size,
/// so that the process that reads it never faults on a shrunk file. One serves
/// each connection in turn.
pub fn kept_memory() -> io::Result<OwnedFd> {
    use rustix::fs::{fcntl_add_seals, ftruncate, memfd_create, MemfdFlags, SealFlags};
    let fd = memfd_create("vfio-user-received", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    ftruncate(&fd, TOTAL as u64)?;
    fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
    Ok(fd)
}

/// Receive memory another process holds too, mapped (see the module's doc).
#[derive(Debug)]
struct KeptRx {
    map: NonNull<u8>,
    /// The half in use, and how much of it.
    which: usize,
    len: usize,
    /// The stream offset of the first byte not answered (as in the header).
    done: u64,
}

// Another process may map the memfd, but no other thread of this one reaches the
// mapping: it moves between threads as a Vec's allocation does.
// SAFETY: the mapping is this value's alone in this process.
unsafe impl Send for KeptRx {}

impl KeptRx {
    /// Maps `memory` ([`kept_memory`]), its header set to an empty stream at `base`.
    fn map(memory: impl AsFd, base: u64) -> io::Result<KeptRx> {
        let st = rustix::fs::fstat(&memory)?;
        if (st.st_size as u64) < TOTAL as u64 {
            return Err(io::Error::other(format!("receive memory of {} bytes, not {TOTAL}", st.st_size)));
        }
        // The file is at least TOTAL bytes long (checked above; kept_memory seals
        // it against shrinking) and the kernel chooses the address.
        // SAFETY: a new shared mapping that aliases no Rust memory.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                TOTAL,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                memory,
                0,
            )?
        };
        let map = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        let k = KeptRx { map, which: 0, len: RX_BUFFER, done: base };
        k.set(0, 0);
        k.set(LAYOUT, base << 1);
        k.set(DONE, base);
        k.set(END, base);
        k.set(0, MAGIC);
        Ok(k)
    }

    /// Stores header field `i`.
    fn set(&self, i: usize, v: u64) {
        // The header page starts the mapping, page-aligned, and its first four
        // u64s are only ever accessed as atomics in this process.
        // SAFETY: an aligned, live [AtomicU64; 4], shared only as atomics.
        let h = unsafe { &*self.map.as_ptr().cast::<[AtomicU64; 4]>() };
        h[i].store(v.to_le(), Ordering::Release);
    }

    fn half(&self) -> &[u8] {
        // Half `which` lies inside the mapping and `len` <= HALF; the mapping lives
        // as long as `self`, and only `self` writes it in this process.
        // SAFETY: a live, in-bounds range that nothing writes while it is borrowed.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(PAGE + self.which * HALF), self.len) }
    }

    fn half_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `half`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_ptr().add(PAGE + self.which * HALF), self.len) }
    }

    /// The half in use (its `len` bytes) and the whole other half.
    fn halves(&mut self) -> (&[u8], &mut [u8]) {
        let base = self.map.as_ptr();
        let (this, other) = (PAGE + self.which * HALF, PAGE + (self.which ^ 1) * HALF);
        // The two halves are disjoint ranges inside the mapping.
        // SAFETY: in bounds, disjoint, and `&mut self` makes these the only references.
        unsafe {
            (
                std::slice::from_raw_parts(base.add(this), self.len),
                std::slice::from_raw_parts_mut(base.add(other), HALF),
            )
        }
    }
}

impl Drop for KeptRx {
    fn drop(&mut self) {
        // The mapping made in `map`, of TOTAL bytes; no slice of it outlives `self`.
        // SAFETY: unmapped once, with nothing left pointing into it.
        let _ = unsafe { rustix::mm::munmap(self.map.as_ptr().cast(), TOTAL) };
    }
}

/// What kept receive memory (`fd`, from a process that died) holds unanswered:
/// the stream offset of its first byte, and the bytes up to the last one read.
/// `through`: where the dead process said that what it had done was kept
/// elsewhere (its journal), a message boundary at or after which to begin.
///
/// The memory was written by a process that may have been taken over by a hostile
/// client: every offset is checked, and a header that does not add up is an error.
pub fn unanswered(fd: impl AsFd, through: u64) -> io::Result<(u64, Vec<u8>)> {
    let KeptHeader { base, which, done, end } = KeptHeader::read(&fd)?;
    let from = if (done..=end).contains(&through) { through } else { done };
    let mut bytes = vec![0u8; (end - from) as usize];
    read_exact_at(&fd, &mut bytes, (PAGE + which * HALF) as u64 + (from - base))?;
    Ok((from, bytes))
}

/// The stream offset of the first byte kept receive memory (`fd`) holds
/// unanswered: what came with the messages before it is no longer needed.
pub fn answered_through(fd: impl AsFd) -> io::Result<u64> {
    Ok(KeptHeader::read(&fd)?.done)
}

/// Kept receive memory's header, as read by another process and checked.
struct KeptHeader {
    base: u64,
    which: usize,
    done: u64,
    end: u64,
}

impl KeptHeader {
    fn read(fd: &impl AsFd) -> io::Result<KeptHeader> {
        let bad =
            |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("kept receive memory: {what}"));
        let mut h = [0u8; 32];
        read_exact_at(fd, &mut h, 0)?;
        let field = |i: usize| u64::from_le_bytes(h[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        if field(0) != MAGIC {
            return Err(bad("no header"));
        }
        let (base, which, done, end) =
            (field(LAYOUT) >> 1, (field(LAYOUT) & 1) as usize, field(DONE), field(END));
        if !(base <= done && done <= end && end - base <= HALF as u64) {
            return Err(bad(&format!("offsets out of order (base {base}, answered {done}, read {end})")));
        }
        Ok(KeptHeader { base, which, done, end })
    }
}

fn read_exact_at(fd: &impl AsFd, mut buf: &mut [u8], mut at: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match rustix::io::pread(fd, &mut *buf, at) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                at += n as u64;
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;

    use zerocopy::IntoBytes;

    use super::*;
    use crate::Connection;

    /// A connection pair whose receiving end (the second) keeps what it receives
    /// in new kept memory (the third).
    fn kept_pair() -> (Connection, Connection, OwnedFd) {
        let (a, b) = UnixStream::pair().unwrap();
        let mut b = Connection::new(b);
        let fd = kept_memory().unwrap();
        b.keep_received(&fd).unwrap();
        (Connection::new(a), b, fd)
    }

    /// A message of `size` bytes (header included), its payload bytes all `id`.
    fn raw(id: u16, size: usize) -> Vec<u8> {
        let mut h = Header::default();
        h.msg_id.set(id);
        h.size.set(size as u32);
        let mut m = h.as_bytes().to_vec();
        m.resize(size, id as u8);
        m
    }

    /// Messages of every size up to several times the usual buffer, sent in pieces
    /// that end anywhere, some answered at once and some not: at every step the kept
    /// memory holds exactly the stream from the first message not answered to the
    /// last byte read, as a process that died there would leave it, through every
    /// compaction into the other half.
    #[test]
    fn kept_memory_holds_what_is_not_answered_through_every_compaction() {
        let (mut a, mut b, fd) = kept_pair();
        let mut stream = Vec::new();
        let mut bounds = vec![0u64];
        let sizes = [16usize, 40, 4096, 70_000, 100, RX_BUFFER - 8, 16, 300_000, 24, 24, 24, MAX_MESSAGE, 33];
        for (i, &size) in sizes.iter().cycle().take(60).enumerate() {
            stream.extend(raw(i as u16, size));
            bounds.push(stream.len() as u64);
        }
        let mut sent = 0;
        let mut answered = 0u64;
        let mut taken = 0;
        let mut step = 0usize;
        while sent < stream.len() {
            // Pieces of odd sizes, from 1 byte to 200 KiB.
            step += 1;
            let n = ((step * 7919) % (200 << 10)).max(1).min(stream.len() - sent);
            a.send_bytes(&stream[sent..sent + n], &[]).unwrap();
            sent += n;
            let mut read = b.taken_through() as usize + b.buffered();
            while read < sent {
                assert!(b.fill().unwrap());
                read = b.taken_through() as usize + b.buffered();
                while let Some(m) = b.next_message().unwrap() {
                    assert_eq!(m.header.msg_id.get(), taken as u16);
                    taken += 1;
                    // Every third message is left unanswered until the next one is
                    // (the next read may have to give it up to make room).
                    if taken % 3 != 0 {
                        b.answered();
                        answered = bounds[taken];
                    }
                }
                let (from, bytes) = unanswered(&fd, 0).unwrap();
                assert!(from == answered || from == bounds[taken], "step {step}: {from} {answered}");
                answered = from;
                assert_eq!(bytes, &stream[from as usize..read], "step {step}");
            }
        }
        assert_eq!(taken, 60);
    }

    /// The journal's word that what a message did is kept elsewhere moves the start
    /// on, but only inside what the header says is there.
    #[test]
    fn through_moves_the_start_only_within_the_unanswered_bytes() {
        let (mut a, mut b, fd) = kept_pair();
        let stream: Vec<u8> = [raw(1, 20), raw(2, 30), raw(3, 40)].concat();
        a.send_bytes(&stream[..60], &[]).unwrap();
        assert!(b.fill().unwrap());
        while b.next_message().unwrap().is_some() {}
        assert_eq!(unanswered(&fd, 0).unwrap(), (0, stream[..60].to_vec()));
        assert_eq!(unanswered(&fd, 20).unwrap(), (20, stream[20..60].to_vec()));
        assert_eq!(unanswered(&fd, 61).unwrap(), (0, stream[..60].to_vec()), "beyond what was read");
        b.answered();
        assert_eq!(unanswered(&fd, 20).unwrap(), (50, stream[50..60].to_vec()), "before what is answered");
    }

    /// Memory that is not kept receive memory, or whose header does not add up
    /// (what a process taken over by a hostile client could leave), is refused.
    #[test]
    fn a_header_that_does_not_add_up_is_refused() {
        let (_a, _b, fd) = kept_pair();
        let put = |i: usize, v: u64| rustix::io::pwrite(&fd, &v.to_le_bytes(), i as u64 * 8).unwrap();
        put(DONE, 10);
        assert!(unanswered(&fd, 0).is_err(), "answered past what was read");
        put(END, 10 + HALF as u64 + 1);
        assert!(unanswered(&fd, 0).is_err(), "more than a half");
        put(END, 12);
        put(LAYOUT, 11 << 1);
        assert!(unanswered(&fd, 0).is_err(), "answered before the half begins");
        put(LAYOUT, 10 << 1 | 1);
        assert_eq!(unanswered(&fd, 0).unwrap(), (10, vec![0, 0]));
        put(0, 7);
        assert!(unanswered(&fd, 0).is_err(), "no magic");
        let not_kept = rustix::fs::memfd_create("t", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        assert!(unanswered(&not_kept, 0).is_err(), "an empty file");
    }

    /// A stand-in's connection, kept too, starts from what the keeper read, hands
    /// out its whole messages first, and keeps them until they are answered.
    #[test]
    fn a_kept_connection_preloaded_keeps_what_it_was_handed() {
        let (_a, mut b, fd) = kept_pair();
        let stream: Vec<u8> = [raw(1, 20), raw(2, 30)].concat();
        b.preload(Partial { bytes: stream[..45].to_vec(), ..Default::default() }).unwrap();
        assert_eq!(unanswered(&fd, 0).unwrap(), (0, stream[..45].to_vec()));
        assert_eq!(b.next_message().unwrap().map(|m| m.header.msg_id.get()), Some(1));
        assert!(b.next_message().unwrap().is_none());
        b.answered();
        assert_eq!(unanswered(&fd, 0).unwrap(), (20, stream[20..45].to_vec()));
        let too_much = Partial { bytes: vec![0; HALF + 1], ..Default::default() };
        let (_c, mut d, _) = kept_pair();
        assert!(d.preload(too_much).is_err());
    }
}
