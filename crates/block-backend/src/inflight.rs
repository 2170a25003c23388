//! The in-flight core of an asynchronous backend queue: the requests it holds, by
//! slot, and the rules every such queue keeps whatever its wire (a socket, librbd,
//! a userspace NVMe driver):
//!
//! - **Revoke.** A request given up on ([`Requests::revoke`]) never touches guest
//!   memory again: its read data is dropped when it arrives, its write data can no
//!   longer be read out of guest memory (a resend after a reconnect fails instead of
//!   sending what the host has put in that buffer since), no flush follows it, and
//!   it completes with NotReady and no data. The host reuses a buffer as soon as its
//!   command is complete, so this is what keeps a late request from corrupting it.
//! - **FUA as write then flush**, for a wire without FUA: the flush goes once the
//!   write has succeeded ([`Pending::flush_now`]), never for a failed or revoked one.
//! - **The first error stands**: a request split into pieces fails with the first
//!   piece's error.
//! - **Data moves through [`SegmentCursor`]**: out of guest memory for a write
//!   ([`Pending::copy_out`]), into it for a read ([`Pending::copy_in`]), at any
//!   offset within the request, so a wire may split a request as it likes.
//!
//! The wire keeps what it needs per request in `W` (its pieces outstanding, say).
//!
//! # Direct wires
//!
//! A wire that copies all data itself (nbd://, rbd:) keeps every request off guest
//! memory by the rules above: its revoke always succeeds, and the request completes
//! when the wire finishes it. io_uring and nvme:// instead hand the kernel or a
//! device descriptors it moves data through by itself: straight into guest memory
//! (zero copy) or into a bounce buffer the wire keeps in `W`. A piece handed over
//! cannot be called back. Their table is [`Requests::direct`]; they tell the core of
//! every piece they hand over ([`Pending::sent`], saying whether it reaches guest
//! memory itself) and of every one that comes back ([`Requests::landed`]), and revoke
//! ([`Requests::give_up`]) then means:
//!
//! - **Refused** while a piece that reaches guest memory itself is at the device:
//!   nothing keeps that one off guest memory, so the owner must let the command run
//!   to its end ([`BackendQueue::revoke`](crate::BackendQueue::revoke)'s
//!   `Some(false)`). The request keeps its `GuestMemory` meanwhile, and with it the
//!   mappings the device moves data through.
//! - **Otherwise given up on at once**: the request completes now (NotReady, no
//!   data), nothing more of it goes to the device, and its slot, with what the wire
//!   keeps there (bounce buffers, vectors, a host buffer the kernel writes), stays
//!   the device's until its last piece lands. That answer is swallowed
//!   ([`Landed::Swallowed`]): the caller never sees it, and only then may the slot be
//!   reused. A held slot no longer answers to its tag (the owner may reuse the tag as
//!   soon as it has reaped the completion), and held slots are bounded by the
//!   device's queue depth. A request none of whose pieces is at the device (waiting
//!   for room) is freed at once, and [`Revoked::Given`] hands the wire what it kept.

use guest_mem::GuestMemory;

use crate::{BackendError, Completion, DataBuf, Op, Request, Segment, SegmentCursor, SegmentMark};

/// A request at the backend.
#[derive(Debug)]
pub struct Pending<W> {
    pub tag: u64,
    pub op: Op,
    /// Device offset and length.
    pub offset: u64,
    pub len: u64,
    data: DataBuf,
    /// The guest memory the data moves to or from; gone once revoked.
    mem: Option<GuestMemory>,
    /// A FUA write done as write then flush, the flush not sent yet.
    flush_after: bool,
    revoked: bool,
    error: Option<BackendError>,
    /// Pieces at the device (direct wires), and how many of them reach guest memory
    /// themselves.
    at_device: u32,
    direct_at_device: u32,
    /// What the wire keeps for the request.
    pub wire: W,
}

/// A cursor at transfer offset `at` of `segs`: resumed from `mark` (which must lie
/// there) or walked to from the start.
fn cursor(segs: &[Segment], at: u64, mark: Option<SegmentMark>) -> Result<SegmentCursor<'_>, BackendError> {
    match mark {
        Some(m) => {
            let c = SegmentCursor::resume(segs, m);
            debug_assert_eq!(c.offset(), at, "a segment mark not at the offset it is given for");
            Ok(c)
        }
        None => {
            let mut c = SegmentCursor::new(segs);
            c.advance(at)?;
            Ok(c)
        }
    }
}

fn invalid(msg: &str) -> BackendError {
    BackendError::Io(std::io::Error::new(std::io::ErrorKind::InvalidInput, msg.to_string()))
}

impl<W> Pending<W> {
    /// Given up on by the owner.
    pub fn revoked(&self) -> bool {
        self.revoked
    }

    /// Records a failure; the first one stands.
    pub fn fail(&mut self, e: BackendError) {
        self.error.get_or_insert(e);
    }

    pub fn failed(&self) -> bool {
        self.error.is_some()
    }

    /// The first failure recorded.
    pub fn error(&self) -> Option<&BackendError> {
        self.error.as_ref()
    }

    /// The request's buffer, for a wire that builds zero-copy descriptors onto it.
    pub fn data(&self) -> &DataBuf {
        &self.data
    }

    /// The guest memory the data moves to or from: None once revoked, or for a
    /// request that moves none.
    pub fn mem(&self) -> Option<&GuestMemory> {
        self.mem.as_ref()
    }

    /// A piece of the request went to the device (direct wires): it is the device's
    /// until it lands ([`Requests::landed`]). `direct`: it reaches guest memory
    /// itself (zero copy), so revoke cannot stop it.
    pub fn sent(&mut self, direct: bool) {
        debug_assert!(!self.revoked, "a piece sent for a revoked request");
        self.at_device += 1;
        self.direct_at_device += u32::from(direct);
    }

    /// Pieces at the device.
    pub fn at_device(&self) -> u32 {
        self.at_device
    }

    /// Fills `dst` with the write's data from request offset `at`. Fails for a
    /// revoked request: its buffer is the host's again.
    pub fn copy_out(&self, at: u64, dst: &mut [u8]) -> Result<(), BackendError> {
        if self.revoked {
            return Err(BackendError::NotReady("given up on before it was sent".into()));
        }
        match (&self.data, &self.mem) {
            (DataBuf::Guest(segs), Some(mem)) => {
                let mut c = SegmentCursor::new(segs);
                c.advance(at)?;
                c.read_into(mem, dst)?;
            }
            (DataBuf::Host(b), _) => {
                let src = b
                    .get(at as usize..at as usize + dst.len())
                    .ok_or_else(|| invalid("a short write buffer"))?;
                dst.copy_from_slice(src);
            }
            _ => return Err(invalid("a write without data")),
        }
        Ok(())
    }

    /// Read data arriving for request offset `at` (`None`: `n` zero bytes, a hole):
    /// into the request's buffer, or dropped if the request was revoked.
    pub fn copy_in(&mut self, at: u64, n: u64, data: Option<&[u8]>) -> Result<(), BackendError> {
        if self.revoked {
            return Ok(());
        }
        match (&mut self.data, &self.mem) {
            (DataBuf::Guest(segs), Some(mem)) => {
                let mut c = SegmentCursor::new(segs);
                c.advance(at)?;
                match data {
                    Some(d) => c.write_from(mem, d)?,
                    None => c.fill(mem, n, 0)?,
                }
            }
            (DataBuf::Host(b), _) => {
                let dst = b
                    .get_mut(at as usize..(at + n) as usize)
                    .ok_or_else(|| invalid("read data beyond the buffer"))?;
                match data {
                    Some(d) => dst.copy_from_slice(d),
                    None => dst.fill(0),
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// [`copy_out`](Self::copy_out) in chunks: hands `sink(offset in the span, bytes)`
    /// the `len` bytes of the write's data from request offset `at`, at most
    /// `scratch.len()` at a time (guest data is staged in `scratch`, a host buffer's
    /// handed over as it is), walking the segments once. For a bounce buffer the host
    /// reaches only through copies (a device's DMA memory). `mark`: where `at` lies in
    /// the guest segments, if the wire keeps it (a request sent in pieces), so they
    /// are not walked from their start.
    pub fn copy_out_chunks(
        &self,
        at: u64,
        mark: Option<SegmentMark>,
        len: u64,
        scratch: &mut [u8],
        mut sink: impl FnMut(u64, &[u8]) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        if self.revoked {
            return Err(BackendError::NotReady("given up on before it was sent".into()));
        }
        let step = scratch.len().max(1) as u64;
        match (&self.data, &self.mem) {
            (DataBuf::Guest(segs), Some(mem)) => {
                let mut c = cursor(segs, at, mark)?;
                let mut done = 0;
                while done < len {
                    let part = &mut scratch[..(len - done).min(step) as usize];
                    c.read_into(mem, part)?;
                    sink(done, part)?;
                    done += part.len() as u64;
                }
            }
            (DataBuf::Host(b), _) => {
                let src =
                    b.get(at as usize..(at + len) as usize).ok_or_else(|| invalid("a short write buffer"))?;
                for (i, part) in src.chunks(step as usize).enumerate() {
                    sink(i as u64 * step, part)?;
                }
            }
            _ => return Err(invalid("a write without data")),
        }
        Ok(())
    }

    /// [`copy_in`](Self::copy_in) in chunks: `len` bytes of read data for request
    /// offset `at`, which `fill(offset in the span, room)` puts in the room it is
    /// handed, at most `scratch.len()` bytes at a time (staged in `scratch` for guest
    /// memory, straight into a host buffer), walking the segments once (from `mark`,
    /// as for [`copy_out_chunks`](Self::copy_out_chunks)). Nothing is asked of `fill`
    /// for a revoked request: its data is dropped.
    pub fn copy_in_chunks(
        &mut self,
        at: u64,
        mark: Option<SegmentMark>,
        len: u64,
        scratch: &mut [u8],
        mut fill: impl FnMut(u64, &mut [u8]) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        if self.revoked {
            return Ok(());
        }
        let step = scratch.len().max(1) as u64;
        match (&mut self.data, &self.mem) {
            (DataBuf::Guest(segs), Some(mem)) => {
                let mut c = cursor(segs, at, mark)?;
                let mut done = 0;
                while done < len {
                    let part = &mut scratch[..(len - done).min(step) as usize];
                    fill(done, part)?;
                    c.write_from(mem, part)?;
                    done += part.len() as u64;
                }
            }
            (DataBuf::Host(b), _) => {
                let dst = b
                    .get_mut(at as usize..(at + len) as usize)
                    .ok_or_else(|| invalid("read data beyond the buffer"))?;
                for (i, part) in dst.chunks_mut(step as usize).enumerate() {
                    fill(i as u64 * step, part)?;
                }
            }
            // Data nobody wants (a Verify).
            _ => {}
        }
        Ok(())
    }

    /// What the owner is told when the request ends (taking its error and data):
    /// nothing for a direct wire's revoked request, which was told when revoked.
    fn completion(&mut self, direct: bool) -> Option<Completion> {
        debug_assert_eq!(self.at_device, 0, "a slot freed while the device holds a piece of it");
        let (result, data) = match (self.revoked, direct) {
            (true, true) => return None,
            (true, false) => {
                (Err(BackendError::NotReady("given up on before it finished".into())), DataBuf::None)
            }
            (false, _) => {
                (self.error.take().map_or(Ok(()), Err), std::mem::replace(&mut self.data, DataBuf::None))
            }
        };
        Some(Completion { tag: self.tag, result, data })
    }

    /// The write is done: true, once, if its flush must go now (a FUA write done as
    /// write then flush, neither failed nor revoked).
    pub fn flush_now(&mut self) -> bool {
        let now = self.flush_after && self.error.is_none() && !self.revoked;
        self.flush_after = false;
        now
    }
}

/// What a queue holds: requests at the backend by slot, and completions not yet
/// reaped.
#[derive(Debug)]
pub struct Requests<W> {
    slots: Vec<Option<Pending<W>>>,
    free: Vec<usize>,
    done: Vec<Completion>,
    /// Submitted and not yet reaped.
    in_flight: usize,
    /// A direct wire's table (see the module).
    direct: bool,
}

/// A table for a wire that copies all data itself.
impl<W> Default for Requests<W> {
    fn default() -> Self {
        Requests { slots: Vec::new(), free: Vec::new(), done: Vec::new(), in_flight: 0, direct: false }
    }
}

/// What [`Requests::give_up`] did.
#[derive(Debug)]
pub enum Revoked<W> {
    /// The queue does not hold the tag.
    NotHere,
    /// Its completion waits for a reap: done with guest memory already.
    Done,
    /// A piece at the device reaches guest memory itself: it cannot be stopped.
    Refused,
    /// Given up on, in `slot`. `freed` (direct wires): nothing of it was at the
    /// device, so the slot is free already, and this is what the wire kept there
    /// (the wire forgets the slot: it may be handed out again).
    Given { slot: usize, freed: Option<W> },
}

impl<W> Revoked<W> {
    /// As [`BackendQueue::revoke`](crate::BackendQueue::revoke) answers.
    pub fn answer(&self) -> Option<bool> {
        match self {
            Revoked::NotHere => None,
            Revoked::Refused => Some(false),
            Revoked::Done | Revoked::Given { .. } => Some(true),
        }
    }
}

/// What [`Requests::landed`] found.
#[derive(Debug)]
pub enum Landed<'a, W> {
    /// The request goes on: the wire takes in the piece's result.
    Live(&'a mut Pending<W>),
    /// The request was given up on: the piece's answer is swallowed. `freed`: it was
    /// its last piece, so the slot is free now, and this is what the wire kept there.
    Swallowed { freed: Option<W> },
    /// No request in that slot.
    Unknown,
}

/// How [`Requests::admit`] takes a request in.
#[derive(Debug)]
pub enum Admit {
    /// At the backend: the slot it holds.
    Slot(usize),
    /// Already complete (refused by the checks, or nothing to do).
    Done,
}

impl<W> Requests<W> {
    /// A table for a direct wire (see the module).
    pub fn direct() -> Self {
        Requests { direct: true, ..Requests::default() }
    }

    /// Takes `req` in and counts it in flight, as the backend `planned` it: a
    /// request refused completes at once with that error; one with nothing to do
    /// (`None`: an empty range, a flush without a cache) completes at once,
    /// successfully; any other gets a slot, with its wire. `fua_by_flush`: a FUA
    /// write is sent as a plain write and then a flush.
    pub fn admit(
        &mut self,
        mem: &GuestMemory,
        req: Request,
        planned: Result<Option<W>, BackendError>,
        fua_by_flush: bool,
    ) -> Admit {
        self.in_flight += 1;
        let wire = match planned {
            Ok(Some(wire)) => wire,
            Ok(None) => {
                self.done.push(Completion { tag: req.tag, result: Ok(()), data: req.data });
                return Admit::Done;
            }
            Err(e) => {
                self.done.push(Completion { tag: req.tag, result: Err(e), data: req.data });
                return Admit::Done;
            }
        };
        let moves_data = matches!(req.op, Op::Read | Op::Write { .. });
        // The slot first, so the request is built where it stays (no copy of it).
        let slot = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        // A free slot is empty: built in it, with nothing to drop first.
        self.slots[slot].get_or_insert_with(|| Pending {
            tag: req.tag,
            op: req.op,
            offset: req.offset,
            len: req.len,
            data: req.data,
            mem: moves_data.then(|| mem.clone()),
            flush_after: fua_by_flush && matches!(req.op, Op::Write { fua: true }),
            revoked: false,
            error: None,
            at_device: 0,
            direct_at_device: 0,
            wire,
        });
        Admit::Slot(slot)
    }

    pub fn get(&self, slot: usize) -> Option<&Pending<W>> {
        self.slots.get(slot).and_then(Option::as_ref)
    }

    pub fn get_mut(&mut self, slot: usize) -> Option<&mut Pending<W>> {
        self.slots.get_mut(slot).and_then(Option::as_mut)
    }

    /// Completes the request in `slot` and frees the slot: its first error, or
    /// NotReady and no data if it was revoked (a direct wire's revoked request
    /// completed when it was revoked: nothing more), or success. What the wire kept
    /// is dropped with it (a wire that recycles buffers takes them out first). The
    /// device must hold no piece of it.
    pub fn finish(&mut self, slot: usize) {
        // In place, not moved out of its slot: every request leaves this way.
        let Some(cell) = self.slots.get_mut(slot) else { return };
        let Some(p) = cell.as_mut() else { return };
        if let Some(c) = p.completion(self.direct) {
            self.done.push(c);
        }
        *cell = None;
        self.free.push(slot);
    }

    /// [`finish`](Self::finish), handing back what the wire kept.
    fn finish_taking(&mut self, slot: usize) -> Option<W> {
        let mut p = self.slots.get_mut(slot)?.take()?;
        let completion = p.completion(self.direct);
        self.free.push(slot);
        if let Some(c) = completion {
            self.done.push(c);
        }
        Some(p.wire)
    }

    /// A piece of the request in `slot` came back from the device (direct wires;
    /// `direct` as it was [`sent`](Pending::sent)). A revoked request's answer is
    /// swallowed here, and its slot freed with its last piece.
    pub fn landed(&mut self, slot: usize, direct: bool) -> Landed<'_, W> {
        let Some(p) = self.slots.get_mut(slot).and_then(Option::as_mut) else { return Landed::Unknown };
        debug_assert!(p.at_device > 0 && (!direct || p.direct_at_device > 0), "a piece landed twice");
        p.at_device = p.at_device.saturating_sub(1);
        if direct {
            p.direct_at_device = p.direct_at_device.saturating_sub(1);
        }
        if !p.revoked {
            return Landed::Live(self.slots[slot].as_mut().expect("held"));
        }
        if p.at_device > 0 {
            return Landed::Swallowed { freed: None };
        }
        Landed::Swallowed { freed: self.finish_taking(slot) }
    }

    /// Gives up on request `tag`: from now on it keeps off guest memory (see the
    /// module). Some(true) if the queue holds it (or its completion), Some(false) if
    /// it cannot be stopped, None if the queue does not hold it. A direct wire uses
    /// [`give_up`](Self::give_up), which says what became of the slot.
    pub fn revoke(&mut self, tag: u64) -> Option<bool> {
        self.give_up(tag).answer()
    }

    /// [`revoke`](Self::revoke), saying what became of the request.
    pub fn give_up(&mut self, tag: u64) -> Revoked<W> {
        if self.done.iter().any(|c| c.tag == tag) {
            return Revoked::Done;
        }
        // A direct wire's revoked request has completed: its held slot is not the tag's.
        let direct = self.direct;
        let Some(slot) = self
            .slots
            .iter()
            .position(|p| p.as_ref().is_some_and(|p| p.tag == tag && !(direct && p.revoked)))
        else {
            return Revoked::NotHere;
        };
        let p = self.slots[slot].as_mut().expect("found");
        if p.direct_at_device > 0 {
            return Revoked::Refused;
        }
        p.revoked = true;
        p.flush_after = false;
        p.mem = None;
        if !direct {
            return Revoked::Given { slot, freed: None };
        }
        let held = p.at_device > 0;
        self.done.push(Completion {
            tag,
            result: Err(BackendError::NotReady("given up on before it finished".into())),
            data: DataBuf::None,
        });
        let freed = if held { None } else { self.finish_taking(slot) };
        Revoked::Given { slot, freed }
    }

    /// The table's slots, free or not: for a wire that must visit every request
    /// (the device is gone).
    pub fn slots(&self) -> std::ops::Range<usize> {
        0..self.slots.len()
    }

    /// Moves the completions waiting into `out`; how many.
    pub fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        let n = self.done.len();
        self.in_flight -= n;
        out.append(&mut self.done);
        n
    }

    /// Submitted and not yet reaped.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Completions wait for a reap (nothing on the wire will signal them).
    pub fn has_done(&self) -> bool {
        !self.done.is_empty()
    }
}

#[cfg(test)]
mod tests;
