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

use crate::{BackendError, Completion, DataBuf, Op, Request, SegmentCursor};

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

    /// Takes `req` in and counts it in flight. A request `checked` refused completes
    /// at once with that error; one with `nothing` to do (an empty range, a flush
    /// without a cache) completes at once, successfully; any other gets a slot, with
    /// `wire`. `fua_by_flush`: a FUA write is sent as a plain write and then a flush.
    pub fn admit(
        &mut self,
        mem: &GuestMemory,
        req: Request,
        checked: Result<(), BackendError>,
        nothing: bool,
        fua_by_flush: bool,
        wire: W,
    ) -> Admit {
        self.in_flight += 1;
        if let Err(e) = checked {
            self.done.push(Completion { tag: req.tag, result: Err(e), data: req.data });
            return Admit::Done;
        }
        if nothing {
            self.done.push(Completion { tag: req.tag, result: Ok(()), data: req.data });
            return Admit::Done;
        }
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
mod tests {
    //! The revoke guarantee and the FUA rule, once, against the core; each backend's
    //! tests check its wire keeps to them.

    use super::*;
    use crate::Segment;

    const PAGE: u64 = 4096;

    fn memory() -> GuestMemory {
        GuestMemory::anonymous(&[(0, 4 * PAGE)]).unwrap()
    }

    fn guest(op: Op, tag: u64) -> Request {
        let segs = vec![Segment::Guest { gpa: PAGE, len: PAGE }];
        Request { tag, op, offset: 0, len: PAGE, data: DataBuf::Guest(segs) }
    }

    fn slot(a: Admit) -> usize {
        match a {
            Admit::Slot(s) => s,
            Admit::Done => panic!("completed at admission"),
        }
    }

    #[test]
    fn a_revoked_read_drops_its_data_and_completes_without_it() {
        let mem = memory();
        mem.fill(PAGE, PAGE, 0xee).unwrap();
        let mut r: Requests<()> = Requests::default();
        let s = slot(r.admit(&mem, guest(Op::Read, 7), Ok(()), false, false, ()));
        assert_eq!(r.revoke(7), Some(true));
        r.get_mut(s).unwrap().copy_in(0, PAGE, Some(&[0x11; PAGE as usize])).unwrap();
        r.finish(s);
        let mut out = Vec::new();
        assert_eq!(r.reap(&mut out), 1);
        assert!(matches!(out[0].result, Err(BackendError::NotReady(_))), "{:?}", out[0].result);
        assert!(matches!(out[0].data, DataBuf::None));
        let mut b = vec![0u8; PAGE as usize];
        mem.read(PAGE, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0xee), "late read data reached guest memory");
        assert_eq!(r.in_flight(), 0);
    }

    #[test]
    fn a_revoked_write_cannot_read_guest_memory_nor_flush() {
        let mem = memory();
        let mut r: Requests<()> = Requests::default();
        let s = slot(r.admit(&mem, guest(Op::Write { fua: true }, 3), Ok(()), false, true, ()));
        let mut buf = vec![0u8; PAGE as usize];
        r.get(s).unwrap().copy_out(0, &mut buf).expect("before revoke the data is there");
        assert_eq!(r.revoke(3), Some(true));
        assert!(
            r.get(s).unwrap().copy_out(0, &mut buf).is_err(),
            "a resend after revoke reads the host's buffer"
        );
        assert!(!r.get_mut(s).unwrap().flush_now(), "a revoked write's flush went out");
    }

    #[test]
    fn fua_by_flush_flushes_once_after_a_good_write_only() {
        let mem = memory();
        let mut r: Requests<()> = Requests::default();
        let s = slot(r.admit(&mem, guest(Op::Write { fua: true }, 1), Ok(()), false, true, ()));
        assert!(r.get_mut(s).unwrap().flush_now());
        assert!(!r.get_mut(s).unwrap().flush_now(), "the flush is sent once");
        let s2 = slot(r.admit(&mem, guest(Op::Write { fua: true }, 2), Ok(()), false, true, ()));
        r.get_mut(s2).unwrap().fail(BackendError::NoSpace);
        assert!(!r.get_mut(s2).unwrap().flush_now(), "a failed write is not flushed");
        let s3 = slot(r.admit(&mem, guest(Op::Write { fua: true }, 4), Ok(()), false, false, ()));
        assert!(!r.get_mut(s3).unwrap().flush_now(), "a wire with FUA sends no flush");
    }

    #[test]
    fn the_first_error_stands_and_refusals_complete_at_once() {
        let mem = memory();
        let mut r: Requests<()> = Requests::default();
        let s = slot(r.admit(&mem, guest(Op::Read, 1), Ok(()), false, false, ()));
        r.get_mut(s).unwrap().fail(BackendError::ReadOnly);
        r.get_mut(s).unwrap().fail(BackendError::NoSpace);
        r.finish(s);
        assert!(matches!(
            r.admit(&mem, guest(Op::Read, 2), Err(BackendError::ReadOnly), false, false, ()),
            Admit::Done
        ));
        assert!(matches!(r.admit(&mem, guest(Op::Read, 3), Ok(()), true, false, ()), Admit::Done));
        assert_eq!(r.revoke(2), Some(true), "a completion not yet reaped is revoked trivially");
        assert_eq!(r.revoke(99), None);
        let mut out = Vec::new();
        assert_eq!(r.reap(&mut out), 3);
        assert!(matches!(out[0].result, Err(BackendError::ReadOnly)));
        assert!(matches!(out[1].result, Err(BackendError::ReadOnly)));
        assert!(out[2].result.is_ok());
    }

    /// The direct-I/O rule: a request revoked while the device holds a piece of it
    /// completes at once, the device's answer is swallowed, and its slot (with what
    /// the wire keeps there) is not handed out again before that answer lands; one
    /// whose piece reaches guest memory itself cannot be revoked; one with nothing at
    /// the device is freed at once.
    #[test]
    fn direct_wires_hold_a_revoked_slot_until_the_device_answers() {
        let mem = memory();
        let mut r: Requests<u32> = Requests::direct();
        let mut out = Vec::new();
        let s = slot(r.admit(&mem, guest(Op::Read, 7), Ok(()), false, false, 70));
        r.get_mut(s).unwrap().sent(false);
        match r.give_up(7) {
            Revoked::Given { slot, freed: None } => assert_eq!(slot, s),
            other => panic!("a bounced piece at the device: {other:?}"),
        }
        assert_eq!(r.reap(&mut out), 1, "a revoked request completes at once");
        assert!(matches!(out[0].result, Err(BackendError::NotReady(_))), "{:?}", out[0].result);
        assert!(matches!(out[0].data, DataBuf::None));
        assert_eq!(r.in_flight(), 0);
        // The owner reuses the tag at once; the slot the device holds is not reused.
        let s2 = slot(r.admit(&mem, guest(Op::Read, 7), Ok(()), false, false, 71));
        assert_ne!(s2, s, "a slot was handed out while the device held it");
        assert!(r.get(s).is_some_and(|p| p.revoked() && p.wire == 70));
        assert!(
            matches!(r.give_up(7), Revoked::Given { slot, .. } if slot == s2),
            "the tag is the new request's"
        );
        out.clear();
        r.reap(&mut out);
        // The device answers the revoked piece: swallowed, and the slot is free.
        assert!(matches!(r.landed(s, false), Landed::Swallowed { freed: Some(70) }));
        assert!(r.get(s).is_none());
        assert!(matches!(r.landed(s2, false), Landed::Unknown), "nothing of s2 was at the device");
        assert_eq!(r.reap(&mut out), 0, "the device's answer reached the caller");
        assert_eq!(slot(r.admit(&mem, guest(Op::Read, 8), Ok(()), false, false, 80)), s, "reused after it");

        // A piece into guest memory itself: refused until it lands.
        let z = slot(r.admit(&mem, guest(Op::Write { fua: false }, 9), Ok(()), false, false, 90));
        r.get_mut(z).unwrap().sent(true);
        r.get_mut(z).unwrap().sent(false);
        assert!(matches!(r.give_up(9), Revoked::Refused));
        assert_eq!(r.revoke(9), Some(false));
        assert!(r.get(z).unwrap().mem().is_some(), "a refused revoke keeps the guest mappings");
        assert!(matches!(r.landed(z, true), Landed::Live(_)));
        assert!(matches!(r.give_up(9), Revoked::Given { freed: None, .. }), "a bounced piece is still out");
        assert!(matches!(r.landed(z, false), Landed::Swallowed { freed: Some(90) }));
        out.clear();
        assert_eq!(r.reap(&mut out), 1, "9 completed once, when revoked");
        assert_eq!(out[0].tag, 9);
        assert_eq!(r.in_flight(), 1, "tag 8");
    }

    #[test]
    fn a_direct_request_not_at_the_device_is_freed_when_revoked() {
        let mem = memory();
        let mut r: Requests<u32> = Requests::direct();
        let s = slot(r.admit(&mem, guest(Op::Read, 1), Ok(()), false, false, 10));
        assert!(matches!(r.give_up(1), Revoked::Given { freed: Some(10), .. }));
        assert!(r.get(s).is_none());
        assert_eq!(slot(r.admit(&mem, guest(Op::Read, 2), Ok(()), false, false, 20)), s);
        let mut out = Vec::new();
        assert_eq!(r.reap(&mut out), 1);
        assert_eq!(out[0].tag, 1);
        assert_eq!(r.in_flight(), 1);
    }

    #[test]
    fn data_moves_at_any_offset_within_the_request() {
        let mem = memory();
        let mut r: Requests<()> = Requests::default();
        let segs = vec![Segment::Guest { gpa: PAGE, len: 512 }, Segment::Guest { gpa: 3 * PAGE, len: 512 }];
        let req = Request { tag: 1, op: Op::Read, offset: 0, len: 1024, data: DataBuf::Guest(segs) };
        let s = slot(r.admit(&mem, req, Ok(()), false, false, ()));
        r.get_mut(s).unwrap().copy_in(256, 512, Some(&[0x5a; 512])).unwrap();
        r.get_mut(s).unwrap().copy_in(768, 256, None).unwrap();
        let (mut a, mut b) = (vec![0u8; 512], vec![0u8; 512]);
        mem.read(PAGE, &mut a).unwrap();
        mem.read(3 * PAGE, &mut b).unwrap();
        assert!(a[..256].iter().all(|&x| x == 0) && a[256..].iter().all(|&x| x == 0x5a));
        assert!(b[..256].iter().all(|&x| x == 0x5a) && b[256..].iter().all(|&x| x == 0));
    }
}
