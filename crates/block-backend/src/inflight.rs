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
}

impl<W> Default for Requests<W> {
    fn default() -> Self {
        Requests { slots: Vec::new(), free: Vec::new(), done: Vec::new(), in_flight: 0 }
    }
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
        let p = Pending {
            tag: req.tag,
            op: req.op,
            offset: req.offset,
            len: req.len,
            data: req.data,
            mem: moves_data.then(|| mem.clone()),
            flush_after: fua_by_flush && matches!(req.op, Op::Write { fua: true }),
            revoked: false,
            error: None,
            wire,
        };
        Admit::Slot(match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(p);
                i
            }
            None => {
                self.slots.push(Some(p));
                self.slots.len() - 1
            }
        })
    }

    pub fn get(&self, slot: usize) -> Option<&Pending<W>> {
        self.slots.get(slot).and_then(Option::as_ref)
    }

    pub fn get_mut(&mut self, slot: usize) -> Option<&mut Pending<W>> {
        self.slots.get_mut(slot).and_then(Option::as_mut)
    }

    /// Completes the request in `slot`: its first error, or NotReady and no data if
    /// it was revoked, or success.
    pub fn finish(&mut self, slot: usize) {
        let Some(p) = self.slots.get_mut(slot).and_then(Option::take) else { return };
        self.free.push(slot);
        let (result, data) = if p.revoked {
            (Err(BackendError::NotReady("given up on before it finished".into())), DataBuf::None)
        } else {
            (p.error.map_or(Ok(()), Err), p.data)
        };
        self.done.push(Completion { tag: p.tag, result, data });
    }

    /// Gives up on request `tag`: from now on it keeps off guest memory (see the
    /// module). Some(true) if the queue holds it (or its completion), None if not.
    pub fn revoke(&mut self, tag: u64) -> Option<bool> {
        if self.done.iter().any(|c| c.tag == tag) {
            return Some(true);
        }
        let p = self.slots.iter_mut().flatten().find(|p| p.tag == tag)?;
        p.revoked = true;
        p.flush_after = false;
        p.mem = None;
        Some(true)
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
