//! The in-flight table: one slot per command whose requests are at a backend,
//! indexed by the tag the requests carry.
//!
//! A tag is not reused until the backend has given back every request of its
//! command: a command completed early (timed out, its queue torn down) turns
//! [`Slot::Abandoned`] and counts what is still out, so a late completion only hands
//! the tag back, never completes the command twice nor reaches a command that
//! reused the tag. The table also keeps the earliest deadline of its running
//! commands, so expiry costs nothing until that moment passes.

use block_backend::{DataBuf, Op, Request, Segment};
use nvme_spec::{Sqe, Status};

use crate::stats::OpClass;
use crate::zoned::ZoneWrite;

/// What an in-flight command does when its backend requests finish.
#[derive(Debug)]
pub(crate) enum Finish {
    /// Complete with the collected status.
    Plain,
    /// Compare the data read (a host buffer) with these guest segments.
    Compare(Vec<Segment>),
    /// Go on with a Copy's next request while its requests succeed.
    Copy(Box<CopyJob>),
    /// A write to a zoned namespace: its zone's pointer moves when it is done, and
    /// a Zone Append completes with the LBA it went to.
    Zoned { write: ZoneWrite, append: bool },
    /// A read of a namespace with metadata: check the data against its protection
    /// information, then hand the metadata to the host.
    Meta(Box<crate::metadata::MetaRead>),
}

/// The command a completion answers: the SQ it came from and its identifier, and
/// the namespace and first LBA it names (the Error Information log's; 0 where it
/// names none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Origin {
    pub sqid: u16,
    pub cid: u16,
    pub nsid: u32,
    pub slba: u64,
}

impl Origin {
    /// Command `sqe` from SQ `sqid`, naming LBA `slba` of the namespace it names.
    #[inline]
    pub(crate) fn of(sqid: u16, sqe: &Sqe, slba: u64) -> Self {
        Origin { sqid, cid: sqe.cid(), nsid: sqe.nsid.get(), slba }
    }

    /// A command that names no namespace.
    #[inline]
    pub(crate) fn bare(sqid: u16, cid: u16) -> Self {
        Origin { sqid, cid, nsid: 0, slba: 0 }
    }
}

/// A command whose backend requests have not all completed.
#[derive(Debug)]
pub(crate) struct InFlight {
    pub at: Origin,
    /// Backend requests still outstanding.
    pub remaining: u32,
    pub status: Status,
    /// What the backend requests do (all of one command's requests do the same).
    pub op: Op,
    /// How the namespace counts it.
    pub tally: Tally,
    pub finish: Finish,
    /// When the command times out (clock ns; u64::MAX: never). Set by `track`.
    pub deadline_ns: u64,
    /// It timed out but its backend could not stop its requests: it completes when
    /// they end.
    pub overdue: bool,
    /// Bytes of host buffers its requests carry (Compare, Verify, Copy): counted
    /// against the engine's budget until every request is back.
    pub host_bytes: u64,
}

impl InFlight {
    /// Command `sqe` from SQ `sqid` (naming LBA `slba`), about to hand one request
    /// doing `op` to a backend (a caller with more sets `remaining`).
    pub(crate) fn new(sqid: u16, sqe: &Sqe, slba: u64, op: Op, finish: Finish) -> Self {
        InFlight {
            at: Origin::of(sqid, sqe, slba),
            remaining: 1,
            status: Status::SUCCESS,
            op,
            tally: Tally { class: OpClass::of(sqe.opcode()), bytes: 0, started_ns: 0 },
            finish,
            deadline_ns: u64::MAX,
            overdue: false,
            host_bytes: 0,
        }
    }
}

/// How a namespace counts a command: its kind (from its opcode), the bytes it moves
/// (reads and writes: their length), and when it was fetched (clock ns, set by
/// `track`), so its latency ends where it completes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tally {
    pub class: OpClass,
    pub bytes: u64,
    pub started_ns: u64,
}

/// One entry of the in-flight table.
#[derive(Debug)]
pub(crate) enum Slot {
    Free,
    /// A command with requests at a backend.
    Running(InFlight),
    /// A command already completed to the host whose backend still holds
    /// `remaining` requests; the tag is retired until they come back.
    Abandoned {
        remaining: u32,
        host_bytes: u64,
    },
}

#[derive(Debug)]
pub(crate) struct InFlightTable {
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Slots in [`Slot::Running`].
    running: usize,
    /// Slots in [`Slot::Abandoned`].
    abandoned: usize,
    /// Host buffer bytes of the running and abandoned commands.
    host_bytes: u64,
    /// The earliest deadline of a running command (clock ns; u64::MAX: none), or
    /// earlier: an expiry scan is due then.
    next_expiry: u64,
}

impl Default for InFlightTable {
    fn default() -> Self {
        InFlightTable {
            slots: Vec::new(),
            free: Vec::new(),
            running: 0,
            abandoned: 0,
            host_bytes: 0,
            next_expiry: u64::MAX,
        }
    }
}

impl InFlightTable {
    /// Gives `f` a tag.
    #[inline]
    pub fn insert(&mut self, f: InFlight) -> u64 {
        self.running += 1;
        self.host_bytes += f.host_bytes;
        self.next_expiry = self.next_expiry.min(f.deadline_ns);
        match self.free.pop() {
            Some(t) => {
                self.slots[t as usize] = Slot::Running(f);
                t as u64
            }
            None => {
                self.slots.push(Slot::Running(f));
                (self.slots.len() - 1) as u64
            }
        }
    }

    /// Tags held: running commands and abandoned ones not yet given back.
    #[inline]
    pub fn held(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Host buffer bytes that commands at the backends hold.
    #[inline]
    pub fn host_bytes(&self) -> u64 {
        self.host_bytes
    }

    /// Commands at a backend that the host still waits for.
    #[inline]
    pub fn running(&self) -> usize {
        self.running
    }

    /// Nothing at any backend, abandoned or not.
    #[inline]
    pub fn empty(&self) -> bool {
        self.running == 0 && self.abandoned == 0
    }

    /// The running command at `tag`.
    #[inline]
    pub fn running_mut(&mut self, tag: usize) -> Option<&mut InFlight> {
        match self.slots.get_mut(tag) {
            Some(Slot::Running(f)) => Some(f),
            _ => None,
        }
    }

    /// The running command at `tag`.
    pub fn running_at(&self, tag: usize) -> Option<&InFlight> {
        match self.slots.get(tag) {
            Some(Slot::Running(f)) => Some(f),
            _ => None,
        }
    }

    /// Every running command.
    pub fn running_iter_mut(&mut self) -> impl Iterator<Item = &mut InFlight> {
        self.slots.iter_mut().filter_map(|s| match s {
            Slot::Running(f) => Some(f),
            _ => None,
        })
    }

    /// The tags a scan walks (every slot, free or not).
    pub fn tags(&self) -> std::ops::Range<usize> {
        0..self.slots.len()
    }

    /// A request of an abandoned command came back: true if `tag` is one (its tag
    /// is free again after the last).
    #[inline]
    pub fn late(&mut self, tag: usize) -> bool {
        let Some(Slot::Abandoned { remaining, host_bytes }) = self.slots.get_mut(tag) else { return false };
        *remaining -= 1;
        if *remaining == 0 {
            self.host_bytes -= *host_bytes;
            self.slots[tag] = Slot::Free;
            self.abandoned -= 1;
            self.free.push(tag as u32);
        }
        true
    }

    /// Takes out the running command at `tag`, all its requests back: its tag is
    /// free.
    #[inline]
    pub fn finish(&mut self, tag: usize) -> Option<InFlight> {
        if !matches!(self.slots.get(tag), Some(Slot::Running(_))) {
            return None;
        }
        let Slot::Running(f) = std::mem::replace(&mut self.slots[tag], Slot::Free) else { unreachable!() };
        self.host_bytes -= f.host_bytes;
        self.free.push(tag as u32);
        self.stopped_running();
        Some(f)
    }

    /// Takes out the running command at `tag` while its requests are still out: the
    /// tag stays retired until they come back.
    pub fn abandon(&mut self, tag: usize) -> Option<InFlight> {
        let Some(Slot::Running(f)) = self.slots.get(tag) else { return None };
        let (remaining, host_bytes) = (f.remaining, f.host_bytes);
        let Slot::Running(f) =
            std::mem::replace(&mut self.slots[tag], Slot::Abandoned { remaining, host_bytes })
        else {
            unreachable!()
        };
        self.abandoned += 1;
        self.stopped_running();
        Some(f)
    }

    /// With no command running, no expiry is due (a sleeping owner is not woken for
    /// nothing).
    fn stopped_running(&mut self) {
        self.running -= 1;
        if self.running == 0 {
            self.next_expiry = u64::MAX;
        }
    }

    /// When the next expiry scan is due (None: no running command has a deadline).
    #[inline]
    pub fn next_expiry(&self) -> Option<u64> {
        (self.next_expiry != u64::MAX).then_some(self.next_expiry)
    }

    /// After a scan: the earliest deadline left.
    pub fn set_next_expiry(&mut self, at: u64) {
        self.next_expiry = at;
    }
}

/// A Copy under way: its source ranges (byte offset, length), the one being
/// copied, whether its read is done (its write in flight), and where it goes.
#[derive(Debug)]
pub(crate) struct CopyJob {
    ranges: Vec<(u64, u64)>,
    next: usize,
    writing: bool,
    dest: u64,
    fua: bool,
    /// Its place in a zoned namespace's zone, taken when it started.
    pub zone: Option<ZoneWrite>,
    /// Protection information checked and generated range by range.
    pub pi: Option<Box<crate::copy_pi::CopyProtection>>,
    /// Each range is one [`Op::Copy`] inside the backend, not a read and a write.
    pub offload: bool,
}

impl CopyJob {
    /// A Copy of `ranges` (byte offset, length) to consecutive bytes from `dest`.
    pub(crate) fn new(ranges: Vec<(u64, u64)>, dest: u64, fua: bool) -> Self {
        CopyJob { ranges, next: 0, writing: false, dest, fua, zone: None, pi: None, offload: false }
    }

    /// Its source ranges (byte offset, length).
    pub(crate) fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }

    /// The first range not (yet) copied: Dword 0 of a failed Copy.
    pub(crate) fn first_not_copied(&self) -> u32 {
        self.next as u32
    }

    /// After a request of the current range succeeded, with its buffer back: that
    /// range's write, or the next range's read; Ok(None) once every range is
    /// copied. Err: the status the Copy ends with (a protection information check
    /// failed; or the buffer did not come back as the host buffer it went out as).
    pub(crate) fn advance(&mut self, tag: u64, data: DataBuf) -> Result<Option<Request>, Status> {
        if self.offload {
            // The range is copied: the next one, inside the backend too.
            self.dest += self.ranges[self.next].1;
            self.next += 1;
            let Some(&(src, len)) = self.ranges.get(self.next) else { return Ok(None) };
            let op = Op::Copy { fua: self.fua };
            return Ok(Some(Request { tag, op, offset: self.dest, len, data: DataBuf::Within(src) }));
        }
        let DataBuf::Host(mut buf) = data else { return Err(Status::INTERNAL_ERROR) };
        let (_, len) = self.ranges[self.next];
        if !self.writing {
            if let Some(p) = &self.pi {
                p.range(self.next, &buf[..len as usize], self.dest / p.block as u64)?;
            }
            self.writing = true;
            let op = Op::Write { fua: self.fua };
            return Ok(Some(Request { tag, op, offset: self.dest, len, data: DataBuf::Host(buf) }));
        }
        self.writing = false;
        self.dest += len;
        self.next += 1;
        let Some(&(offset, len)) = self.ranges.get(self.next) else { return Ok(None) };
        buf.clear();
        buf.resize(len as usize, 0);
        Ok(Some(Request { tag, op: Op::Read, offset, len, data: DataBuf::Host(buf) }))
    }
}
