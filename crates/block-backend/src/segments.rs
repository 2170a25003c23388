//! The one walk over a transfer's guest segments.
//!
//! A request's data lives in a list of [`Segment`]s (what a PRP or SGL walk
//! produced): guest memory ranges and bit buckets, laid end to end to make one
//! transfer. A [`SegmentCursor`] is a borrow of that list plus a position in the
//! transfer; it moves bytes between a contiguous host buffer and the segments from
//! wherever it stands (the bounce path), and hands out the segment pieces of a span
//! for callers that do their own thing with them (zero-copy vectors, compares).
//!
//! Every guest access goes through [`GuestMemory`]'s bounds-checked copies, one per
//! piece. A span that runs past the end of the segments, or a gather across a bit
//! bucket, is refused before any byte moves; a guest memory fault in a later piece
//! leaves the earlier pieces copied, as each access only promises no partial effect
//! of its own.
//!
//! The cursor allocates nothing and copies each byte once: it is the hot path of the
//! RAM and null backends.

use guest_mem::{GuestMemory, MemError};

use crate::{BackendError, Segment};

/// Why a copy through a [`SegmentCursor`] failed.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    /// Guest memory behind a segment is not mapped.
    #[error("guest memory: {0}")]
    Memory(#[from] MemError),
    /// The segments end before the span: only `left` bytes remain after `at`.
    #[error("segments end {left} bytes after transfer offset {at}; {want} bytes wanted")]
    Short { at: u64, left: u64, want: u64 },
    /// The segments do not add up to the transfer they are meant to describe.
    #[error("segments cover {covered} bytes of a {len}-byte transfer")]
    Length { covered: u64, len: u64 },
    /// Data was to be taken from a bit bucket, which holds none (a bit bucket in a write).
    #[error("a bit bucket at transfer offset {at} in a transfer from guest memory")]
    BitBucket { at: u64 },
}

impl From<SegmentError> for BackendError {
    /// A guest memory fault stays [`BackendError::Memory`]; a malformed segment list
    /// is an invalid request, as the io_uring and nvme:// backends always reported it.
    fn from(e: SegmentError) -> Self {
        match e {
            SegmentError::Memory(m) => BackendError::Memory(m),
            e => BackendError::Io(std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string())),
        }
    }
}

/// A position in a transfer's segments, without the borrow: what a request that is
/// sent in pieces keeps between them. [`SegmentCursor::resume`] turns it back into a
/// cursor over the same segments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegmentMark {
    idx: usize,
    off: u64,
    pos: u64,
}

/// A position in the transfer a list of segments describes, borrowing the list.
#[derive(Clone, Copy, Debug)]
pub struct SegmentCursor<'a> {
    segs: &'a [Segment],
    /// The segment the cursor is in, and the byte offset within it (which may be its
    /// length: pieces step over exhausted and empty segments).
    at: SegmentMark,
}

impl<'a> SegmentCursor<'a> {
    /// A cursor at the start of `segs`.
    pub fn new(segs: &'a [Segment]) -> Self {
        SegmentCursor { segs, at: SegmentMark::default() }
    }

    /// A cursor at the start of `segs`, which must add up to exactly `len` bytes.
    pub fn for_transfer(segs: &'a [Segment], len: u64) -> Result<Self, SegmentError> {
        let covered = segs.iter().fold(0u64, |n, s| n.saturating_add(s.len()));
        if covered != len {
            return Err(SegmentError::Length { covered, len });
        }
        Ok(Self::new(segs))
    }

    /// A cursor over `segs` at `mark`, which a cursor over the same segments gave.
    pub fn resume(segs: &'a [Segment], mark: SegmentMark) -> Self {
        SegmentCursor { segs, at: mark }
    }

    /// Where the cursor stands, to [`resume`](Self::resume) from later.
    pub fn mark(&self) -> SegmentMark {
        self.at
    }

    /// The cursor's byte offset in the transfer.
    pub fn offset(&self) -> u64 {
        self.at.pos
    }

    /// The pieces of the next `len` bytes, each a segment clipped to the span with
    /// its offset in the transfer; empty segments are skipped. Stops early where the
    /// segments end. The cursor itself does not move.
    pub fn pieces(&self, len: u64) -> Pieces<'a> {
        Pieces { segs: self.segs, at: self.at, left: len }
    }

    /// Moves `n` bytes forward. Fails, without moving, if the segments end first.
    pub fn advance(&mut self, n: u64) -> Result<(), SegmentError> {
        self.check(n, false)?;
        self.each(n, |_, _| Ok(()))
    }

    /// Copies guest memory into `buf`, from the cursor on, and moves past it. Fails
    /// before copying anything if the span runs past the segments or crosses a bit
    /// bucket (there is no data to take from one).
    pub fn read_into(&mut self, mem: &GuestMemory, buf: &mut [u8]) -> Result<(), SegmentError> {
        let len = buf.len() as u64;
        self.check(len, true)?;
        self.each(len, |o, piece| match piece {
            Segment::Guest { gpa, len } => mem.read(gpa, &mut buf[o..o + len as usize]),
            Segment::Discard { .. } => Ok(()),
        })
    }

    /// Copies `buf` into guest memory, from the cursor on, and moves past it; the
    /// bytes that fall in bit buckets are dropped. Fails before copying anything if
    /// the span runs past the segments.
    pub fn write_from(&mut self, mem: &GuestMemory, buf: &[u8]) -> Result<(), SegmentError> {
        let len = buf.len() as u64;
        self.check(len, false)?;
        self.each(len, |o, piece| match piece {
            Segment::Guest { gpa, len } => mem.write(gpa, &buf[o..o + len as usize]),
            Segment::Discard { .. } => Ok(()),
        })
    }

    /// Fills the next `len` bytes of guest memory with `byte` and moves past them;
    /// bit buckets are passed over. Fails before writing anything if the span runs
    /// past the segments.
    pub fn fill(&mut self, mem: &GuestMemory, len: u64, byte: u8) -> Result<(), SegmentError> {
        self.check(len, false)?;
        self.each(len, |_, piece| match piece {
            Segment::Guest { gpa, len } => mem.fill(gpa, len, byte),
            Segment::Discard { .. } => Ok(()),
        })
    }

    /// Runs `f(offset in the span, piece)` over the pieces of the next `len` bytes
    /// (checked to exist), then moves past them; on failure the cursor stays put.
    fn each(
        &mut self,
        len: u64,
        mut f: impl FnMut(usize, Segment) -> Result<(), MemError>,
    ) -> Result<(), SegmentError> {
        // The usual case: the whole span lies in the current segment.
        if let Some(piece) = self.within_one(len) {
            f(0, piece)?;
            self.at.off += len;
            self.at.pos += len;
            return Ok(());
        }
        let base = self.at.pos;
        let mut pieces = self.pieces(len);
        for (at, piece) in pieces.by_ref() {
            f((at - base) as usize, piece)?;
        }
        self.at = pieces.at;
        Ok(())
    }

    /// Checks that the next `len` bytes lie within the segments and, for a `gather`,
    /// in none of their bit buckets.
    /// The next `len` bytes as one piece, if they lie in the current segment (the
    /// usual case: one PRP range, one SGL data block): no walk over the list.
    #[inline]
    fn within_one(&self, len: u64) -> Option<Segment> {
        let s = self.segs.get(self.at.idx)?;
        if len == 0 || s.len().saturating_sub(self.at.off) < len {
            return None;
        }
        Some(match *s {
            Segment::Guest { gpa, .. } => Segment::Guest { gpa: gpa.saturating_add(self.at.off), len },
            Segment::Discard { .. } => Segment::Discard { len },
        })
    }

    fn check(&self, len: u64, gather: bool) -> Result<(), SegmentError> {
        if let Some(piece) = self.within_one(len) {
            if !gather || matches!(piece, Segment::Guest { .. }) {
                return Ok(());
            }
        }
        let mut found = 0;
        for (at, piece) in self.pieces(len) {
            if gather && matches!(piece, Segment::Discard { .. }) {
                return Err(SegmentError::BitBucket { at });
            }
            found += piece.len();
        }
        if found < len {
            return Err(SegmentError::Short { at: self.at.pos, left: found, want: len });
        }
        Ok(())
    }
}

/// The pieces of a span of a transfer: see [`SegmentCursor::pieces`].
#[derive(Clone, Debug)]
pub struct Pieces<'a> {
    segs: &'a [Segment],
    at: SegmentMark,
    left: u64,
}

impl Iterator for Pieces<'_> {
    /// The piece's offset in the transfer, and the piece.
    type Item = (u64, Segment);

    fn next(&mut self) -> Option<(u64, Segment)> {
        while self.left > 0 {
            let s = self.segs.get(self.at.idx)?;
            let avail = s.len().saturating_sub(self.at.off);
            if avail == 0 {
                self.at.idx += 1;
                self.at.off = 0;
                continue;
            }
            let k = avail.min(self.left);
            let piece = match *s {
                // A segment the guest placed at the top of the address space may end
                // past it: saturating keeps such a piece unmappable (every access to
                // it fails its bounds check) instead of wrapping to address 0.
                Segment::Guest { gpa, .. } => Segment::Guest { gpa: gpa.saturating_add(self.at.off), len: k },
                Segment::Discard { .. } => Segment::Discard { len: k },
            };
            let at = self.at.pos;
            self.at.off += k;
            self.at.pos += k;
            self.left -= k;
            return Some((at, piece));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> GuestMemory {
        GuestMemory::anonymous(&[(0, 0x10000)]).unwrap()
    }

    /// 0x100 guest bytes, a 0x80-byte bit bucket, an empty segment, 0x200 guest bytes.
    fn segs() -> [Segment; 4] {
        [
            Segment::Guest { gpa: 0x1000, len: 0x100 },
            Segment::Discard { len: 0x80 },
            Segment::Guest { gpa: 0x5000, len: 0 },
            Segment::Guest { gpa: 0x3000, len: 0x200 },
        ]
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + 1) as u8).collect()
    }

    #[test]
    fn pieces_carry_their_transfer_offset_and_clip_to_the_span() {
        let segs = segs();
        let mut c = SegmentCursor::new(&segs);
        c.advance(0xc0).unwrap();
        assert_eq!(c.offset(), 0xc0);
        let got: Vec<_> = c.pieces(0x100).collect();
        assert_eq!(
            got,
            vec![
                (0xc0, Segment::Guest { gpa: 0x10c0, len: 0x40 }),
                (0x100, Segment::Discard { len: 0x80 }),
                (0x180, Segment::Guest { gpa: 0x3000, len: 0x40 }),
            ]
        );
        // The whole transfer, with the empty segment stepped over.
        let all: Vec<_> = SegmentCursor::new(&segs).pieces(u64::MAX).map(|(at, p)| (at, p.len())).collect();
        assert_eq!(all, vec![(0, 0x100), (0x100, 0x80), (0x180, 0x200)]);
        assert_eq!(SegmentCursor::new(&segs).pieces(0).count(), 0);
        assert_eq!(SegmentCursor::new(&[]).pieces(10).count(), 0);
    }

    #[test]
    fn write_from_starts_inside_a_segment_and_drops_bit_bucket_bytes() {
        let mem = mem();
        mem.fill(0, 0x10000, 0xee).unwrap();
        let segs = segs();
        let data = pattern(0x200);
        let mut c = SegmentCursor::new(&segs);
        c.advance(0x80).unwrap();
        c.write_from(&mem, &data).unwrap();
        assert_eq!(c.offset(), 0x280);
        let mut a = vec![0u8; 0x80];
        mem.read(0x1080, &mut a).unwrap();
        assert_eq!(a, data[..0x80]);
        let mut b = vec![0u8; 0x100];
        mem.read(0x3000, &mut b).unwrap();
        assert_eq!(b, data[0x100..]);
        // The bytes before the cursor, and after the span, are untouched.
        assert_eq!(mem.read_obj::<u8>(0x107f).unwrap(), 0xee);
        assert_eq!(mem.read_obj::<u8>(0x3100).unwrap(), 0xee);
        // The empty segment's address was never written.
        assert_eq!(mem.read_obj::<u8>(0x5000).unwrap(), 0xee);
    }

    #[test]
    fn read_into_spans_segments_in_steps() {
        let mem = mem();
        let data = pattern(0x300);
        mem.write(0x1000, &data[..0x100]).unwrap();
        mem.write(0x2000, &data[0x100..0x180]).unwrap();
        mem.write(0x3000, &data[0x180..]).unwrap();
        let segs = [
            Segment::Guest { gpa: 0x1000, len: 0x100 },
            Segment::Guest { gpa: 0x2000, len: 0x80 },
            Segment::Guest { gpa: 0x3000, len: 0x180 },
        ];
        let mut c = SegmentCursor::for_transfer(&segs, 0x300).unwrap();
        let mut got = vec![0u8; 0x300];
        // Uneven steps that start and end inside segments, and a zero-length one.
        for (lo, hi) in [(0, 0x30), (0x30, 0x30), (0x30, 0x170), (0x170, 0x300)] {
            c.read_into(&mem, &mut got[lo..hi]).unwrap();
            assert_eq!(c.offset(), hi as u64);
        }
        assert_eq!(got, data);
        // A mark resumes where the cursor stood.
        let mut c = SegmentCursor::new(&segs);
        c.advance(0x150).unwrap();
        let mut again = SegmentCursor::resume(&segs, c.mark());
        let mut part = vec![0u8; 0x40];
        again.read_into(&mem, &mut part).unwrap();
        assert_eq!(part, data[0x150..0x190]);
    }

    #[test]
    fn past_the_end_fails_and_copies_nothing() {
        let mem = mem();
        mem.fill(0, 0x10000, 0xee).unwrap();
        let segs = segs();
        let mut c = SegmentCursor::new(&segs);
        c.advance(0x300).unwrap();
        let before = c.mark();
        let e = c.write_from(&mem, &[1; 0x81]).unwrap_err();
        assert!(matches!(e, SegmentError::Short { at: 0x300, left: 0x80, want: 0x81 }), "{e:?}");
        assert_eq!(c.mark(), before, "the cursor stays put");
        assert_eq!(mem.read_obj::<u8>(0x3100).unwrap(), 0xee, "nothing written");
        assert!(matches!(c.fill(&mem, 0x100, 0), Err(SegmentError::Short { .. })));
        assert!(matches!(c.advance(0x81), Err(SegmentError::Short { .. })));
        let mut buf = [7u8; 0x400];
        let mut c = SegmentCursor::new(&segs[3..]);
        assert!(matches!(c.read_into(&mem, &mut buf), Err(SegmentError::Short { .. })));
        assert_eq!(buf, [7u8; 0x400], "nothing read");
        // Zero bytes at the very end are fine.
        c.advance(0x200).unwrap();
        c.read_into(&mem, &mut []).unwrap();
        c.write_from(&mem, &[]).unwrap();
        assert_eq!(c.offset(), 0x200);
    }

    #[test]
    fn a_gather_refuses_bit_buckets_before_copying() {
        let mem = mem();
        let segs = segs();
        let mut buf = [7u8; 0x200];
        let mut c = SegmentCursor::new(&segs);
        let e = c.read_into(&mem, &mut buf).unwrap_err();
        assert!(matches!(e, SegmentError::BitBucket { at: 0x100 }), "{e:?}");
        assert_eq!(buf, [7u8; 0x200], "nothing read");
        assert_eq!(c.offset(), 0);
        // Up to the bucket is fine, and so is a span past it.
        c.read_into(&mem, &mut buf[..0x100]).unwrap();
        c.advance(0x80).unwrap();
        c.read_into(&mem, &mut buf).unwrap();
    }

    #[test]
    fn a_guest_memory_fault_is_a_memory_error() {
        let mem = mem();
        let segs = [Segment::Guest { gpa: 0x1000, len: 0x100 }, Segment::Guest { gpa: 0xff80, len: 0x100 }];
        let mut c = SegmentCursor::new(&segs);
        let e = c.write_from(&mem, &[1; 0x200]).unwrap_err();
        assert!(matches!(e, SegmentError::Memory(MemError::Unmapped { gpa: 0xff80, len: 0x100 })), "{e:?}");
        assert_eq!(c.offset(), 0, "the cursor stays put");
        assert!(matches!(BackendError::from(e), BackendError::Memory(_)));
        let mut buf = [0u8; 0x200];
        assert!(matches!(c.read_into(&mem, &mut buf), Err(SegmentError::Memory(_))));
        assert!(matches!(c.fill(&mem, 0x200, 0), Err(SegmentError::Memory(_))));
    }

    #[test]
    fn fill_passes_over_bit_buckets() {
        let mem = mem();
        mem.fill(0, 0x10000, 0xee).unwrap();
        let segs = segs();
        SegmentCursor::for_transfer(&segs, 0x380).unwrap().fill(&mem, 0x380, 0).unwrap();
        let mut a = vec![0xffu8; 0x100];
        mem.read(0x1000, &mut a).unwrap();
        assert!(a.iter().all(|&b| b == 0));
        mem.read(0x3100, &mut a).unwrap();
        assert!(a.iter().all(|&b| b == 0));
        assert_eq!(mem.read_obj::<u8>(0x3200).unwrap(), 0xee);
    }

    #[test]
    fn for_transfer_wants_the_segments_to_add_up() {
        let segs = segs();
        assert!(SegmentCursor::for_transfer(&segs, 0x380).is_ok());
        let e = SegmentCursor::for_transfer(&segs, 0x400).unwrap_err();
        assert!(matches!(e, SegmentError::Length { covered: 0x380, len: 0x400 }), "{e:?}");
        assert!(matches!(SegmentCursor::for_transfer(&segs, 0x37f), Err(SegmentError::Length { .. })));
        assert!(SegmentCursor::for_transfer(&[], 0).is_ok());
        let huge = [Segment::Discard { len: u64::MAX }, Segment::Discard { len: 2 }];
        assert!(SegmentCursor::for_transfer(&huge, 1).is_err());
        let b = BackendError::from(e);
        assert!(
            matches!(b, BackendError::Io(ref io) if io.kind() == std::io::ErrorKind::InvalidInput),
            "{b:?}"
        );
    }

    #[test]
    fn a_segment_past_the_top_of_the_address_space_never_wraps() {
        let mem = mem();
        let segs = [Segment::Guest { gpa: u64::MAX - 0xf, len: 0x100 }];
        let mut c = SegmentCursor::new(&segs);
        c.advance(0x80).unwrap();
        let e = c.write_from(&mem, &[1; 0x10]).unwrap_err();
        assert!(matches!(e, SegmentError::Memory(MemError::Unmapped { gpa: u64::MAX, .. })), "{e:?}");
    }
}
