//! Scatter Gather Lists (Base §4.3.2).
//!
//! An SGL is one or more SGL segments. The command holds SGL Descriptor 1; if that is
//! a Data Block (or Bit Bucket) descriptor it describes the whole buffer, otherwise it
//! is a Segment or Last Segment descriptor pointing to the first segment in guest
//! memory: an array of 16-byte descriptors. Only the last descriptor of a segment may
//! be a Segment or Last Segment descriptor, pointing to the next segment; a Last
//! Segment descriptor points to the last segment, which contains neither.
//!
//! Supported descriptors (Base Figures "SGL Descriptor Type" and "Sub Type"):
//! - Data Block, sub type Address: guest memory;
//! - Bit Bucket: bytes of a controller-to-host transfer that the host discards;
//! - Segment and Last Segment, sub type Address.
//!
//! Keyed and Transport SGL Data Blocks are fabrics-only and, like reserved types, fail
//! with SGL Descriptor Type Invalid; the Offset sub type (also fabrics-only) fails
//! with SGL Offset Invalid. The controller does not report support for SGLs longer
//! than the transfer (SGLS bit 18), so the descriptors must describe exactly the
//! transfer length, else Data SGL Length Invalid.
//!
//! A guest controls every segment pointer, so the walk is bounded by a descriptor
//! budget (see `descriptor_budget`): a segment that points to itself ends with SGL
//! Descriptor Count Invalid instead of looping.

use block_backend::Segment;
use guest_mem::GuestMemory;
use nvme_spec::sgl::{SglDescriptor, SglType, SGL_SUBTYPE_ADDRESS, SGL_SUBTYPE_OFFSET};
use zerocopy::IntoBytes;

use crate::dptr::Direction;
use crate::error::{CmdResult, CommandError};

/// Size of one SGL descriptor.
const DESC_SIZE: u64 = 16;

/// Descriptors any SGL may use, whatever its length.
const BASE_DESCRIPTOR_BUDGET: u64 = 4096;

/// The most descriptors (of every type, SGL Descriptor 1 included) a walk for a
/// `len`-byte transfer reads before failing with SGL Descriptor Count Invalid: a
/// generous fixed allowance plus one per 4 KiB of data, so a buffer made of
/// scattered 4 KiB pages always fits. `len` is at most MDTS, so this is bounded, and
/// so is the guest memory read to walk an SGL (16 bytes per descriptor).
fn descriptor_budget(len: u64) -> u64 {
    BASE_DESCRIPTOR_BUDGET + len / 4096
}

/// Appends to `out` the segments of a `len`-byte transfer described by SGL descriptor 1 (from the SQE).
///
/// Data Block descriptors become [`Segment::Guest`] (adjacent contiguous blocks are
/// merged, zero-length ones skipped) and Bit Bucket descriptors [`Segment::Discard`].
/// `dir` is the direction of the data transfer: Bit Buckets are only valid when data
/// moves to the host. On error `out` is left as it was.
///
/// Errors (Base §4.3.2):
/// - [`CommandError::SglType`]: an unsupported descriptor type (carrying the type,
///   bits 7:4 of the SGL Identifier), a Bit Bucket in a host-to-controller transfer
///   (type 1h), or an unsupported sub type other than Offset (carrying the whole SGL
///   Identifier);
/// - [`CommandError::SglOffset`]: a descriptor with the Offset sub type;
/// - [`CommandError::SglSegment`]: a segment whose length is not a non-zero multiple
///   of 16, a Segment or Last Segment descriptor that is not the last descriptor of
///   its segment, or one inside the last segment;
/// - [`CommandError::SglDescriptorCount`]: the SGL has more descriptors than the walk
///   allows;
/// - [`CommandError::SglLength`]: the data and bit bucket lengths do not add up to
///   `len`;
/// - [`CommandError::Memory`]: a segment could not be read from guest memory.
pub fn sgl_segments(
    mem: &GuestMemory,
    first: SglDescriptor,
    len: u64,
    dir: Direction,
    out: &mut Vec<Segment>,
) -> CmdResult<()> {
    let start = out.len();
    let mut walk = Walk { out, start, dir, xfer: len, described: 0 };
    let result = walk.run(mem, first);
    if result.is_err() {
        out.truncate(start);
    }
    result
}

fn is_segment(d: &SglDescriptor) -> bool {
    matches!(d.kind(), SglType::Segment | SglType::LastSegment)
}

/// Checks that `d` uses the Address sub type, the only one without fabrics.
fn check_subtype(d: &SglDescriptor) -> CmdResult<()> {
    match d.subtype() {
        SGL_SUBTYPE_ADDRESS => Ok(()),
        SGL_SUBTYPE_OFFSET => Err(CommandError::SglOffset),
        _ => Err(CommandError::SglType(d.id)),
    }
}

/// The state of one SGL walk.
struct Walk<'a> {
    out: &'a mut Vec<Segment>,
    /// Segments before this index were in `out` before the walk: never merged into.
    start: usize,
    dir: Direction,
    /// The transfer length.
    xfer: u64,
    /// Bytes described by the data and bit bucket descriptors seen so far.
    described: u64,
}

impl Walk<'_> {
    fn run(&mut self, mem: &GuestMemory, first: SglDescriptor) -> CmdResult<()> {
        // SGL Descriptor 1 counts against the budget too.
        let mut budget = descriptor_budget(self.xfer) - 1;
        if !is_segment(&first) {
            self.data(&first)?;
            return self.finish();
        }
        let mut seg = first;
        let mut list: Vec<SglDescriptor> = Vec::new();
        loop {
            check_subtype(&seg)?;
            let last = seg.kind() == SglType::LastSegment;
            let seg_len = u64::from(seg.len.get());
            if seg_len == 0 || seg_len % DESC_SIZE != 0 {
                return Err(CommandError::SglSegment("segment length is not a non-zero multiple of 16"));
            }
            let count = seg_len / DESC_SIZE;
            if count > budget {
                return Err(CommandError::SglDescriptorCount);
            }
            budget -= count;
            // `count` <= the budget, so this allocation is bounded; one read fetches
            // the whole segment.
            list.clear();
            list.resize(count as usize, SglDescriptor::default());
            mem.read(seg.addr.get(), list.as_mut_slice().as_mut_bytes())?;
            let (tail, body) = list.split_last().expect("a segment has at least one descriptor");
            for d in body {
                self.data(d)?;
            }
            if !is_segment(tail) {
                self.data(tail)?;
                return self.finish();
            }
            if last {
                return Err(CommandError::SglSegment("the last segment contains a segment descriptor"));
            }
            seg = *tail;
        }
    }

    /// Handles a descriptor in a data position: anything but the last descriptor of a
    /// segment, or SGL Descriptor 1 when it describes the buffer itself.
    fn data(&mut self, d: &SglDescriptor) -> CmdResult<()> {
        let len = u64::from(d.len.get());
        match d.kind() {
            SglType::DataBlock => {
                check_subtype(d)?;
                self.describe(len)?;
                if len != 0 {
                    self.push(Segment::Guest { gpa: d.addr.get(), len });
                }
                Ok(())
            }
            SglType::BitBucket => {
                // Bit Buckets tell the controller which read data the host does not
                // want; there is nothing to discard in a host-to-controller transfer.
                if self.dir == Direction::FromHost {
                    return Err(CommandError::SglType(d.id >> 4));
                }
                check_subtype(d)?;
                self.describe(len)?;
                if len != 0 {
                    self.push(Segment::Discard { len });
                }
                Ok(())
            }
            SglType::Segment | SglType::LastSegment => Err(CommandError::SglSegment(
                "only the last descriptor of a segment may be a segment descriptor",
            )),
            SglType::KeyedDataBlock | SglType::TransportDataBlock | SglType::Other(_) => {
                Err(CommandError::SglType(d.id >> 4))
            }
        }
    }

    /// Accounts for `len` more described bytes, failing as soon as they exceed the
    /// transfer (which also bounds the walk by the transfer length).
    fn describe(&mut self, len: u64) -> CmdResult<()> {
        self.described = self.described.saturating_add(len);
        if self.described > self.xfer {
            return Err(CommandError::SglLength { sgl: self.described, xfer: self.xfer });
        }
        Ok(())
    }

    fn finish(&self) -> CmdResult<()> {
        if self.described != self.xfer {
            return Err(CommandError::SglLength { sgl: self.described, xfer: self.xfer });
        }
        Ok(())
    }

    /// Appends `seg`, extending the previous segment of this walk when both are guest
    /// memory and contiguous, or both are discarded bytes.
    fn push(&mut self, seg: Segment) {
        if self.out.len() > self.start {
            match (self.out.last_mut(), seg) {
                (Some(Segment::Guest { gpa: last, len: last_len }), Segment::Guest { gpa, len })
                    if last.checked_add(*last_len) == Some(gpa) =>
                {
                    *last_len += len;
                    return;
                }
                (Some(Segment::Discard { len: last_len }), Segment::Discard { len }) => {
                    *last_len += len;
                    return;
                }
                _ => {}
            }
        }
        self.out.push(seg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> GuestMemory {
        GuestMemory::anonymous(&[(0, 1 << 20)]).unwrap()
    }

    fn data(addr: u64, len: u32) -> SglDescriptor {
        SglDescriptor::new(SglType::DataBlock, addr, len)
    }

    fn bucket(len: u32) -> SglDescriptor {
        SglDescriptor::new(SglType::BitBucket, 0, len)
    }

    fn seg(addr: u64, count: u32) -> SglDescriptor {
        SglDescriptor::new(SglType::Segment, addr, count * 16)
    }

    fn last(addr: u64, count: u32) -> SglDescriptor {
        SglDescriptor::new(SglType::LastSegment, addr, count * 16)
    }

    fn g(gpa: u64, len: u64) -> Segment {
        Segment::Guest { gpa, len }
    }

    fn write_segment(mem: &GuestMemory, gpa: u64, descs: &[SglDescriptor]) {
        mem.write(gpa, descs.as_bytes()).unwrap();
    }

    fn segs(mem: &GuestMemory, first: SglDescriptor, len: u64, dir: Direction) -> Vec<Segment> {
        let mut out = Vec::new();
        sgl_segments(mem, first, len, dir, &mut out).unwrap();
        assert_eq!(out.iter().map(Segment::len).sum::<u64>(), len, "lengths add up");
        assert!(out.iter().all(|s| !s.is_empty()), "no empty segments");
        out
    }

    fn err(mem: &GuestMemory, first: SglDescriptor, len: u64, dir: Direction) -> CommandError {
        let mut out = vec![g(0x100, 0x10)];
        let e = sgl_segments(mem, first, len, dir, &mut out).unwrap_err();
        assert_eq!(out, vec![g(0x100, 0x10)], "out restored on error");
        e
    }

    use Direction::{FromHost, ToHost};

    #[test]
    fn spec_4_3_2_single_data_block() {
        let m = mem();
        assert_eq!(segs(&m, data(0x1234, 0x3000), 0x3000, ToHost), vec![g(0x1234, 0x3000)]);
        assert_eq!(segs(&m, data(0x1234, 0x3000), 0x3000, FromHost), vec![g(0x1234, 0x3000)]);
        // Data blocks are not checked against guest memory here.
        assert_eq!(segs(&m, data(1 << 40, 512), 512, FromHost), vec![g(1 << 40, 512)]);
    }

    #[test]
    fn spec_4_3_2_zero_length_transfer_with_empty_data_block() {
        let m = mem();
        assert!(segs(&m, data(0x1000, 0), 0, ToHost).is_empty());
    }

    #[test]
    fn spec_4_3_2_data_block_shorter_than_transfer_is_length_error() {
        let m = mem();
        assert!(matches!(
            err(&m, data(0x1000, 0x1000), 0x2000, ToHost),
            CommandError::SglLength { sgl: 0x1000, xfer: 0x2000 }
        ));
    }

    #[test]
    fn spec_4_3_2_data_block_longer_than_transfer_is_length_error() {
        let m = mem();
        assert!(matches!(
            err(&m, data(0x1000, 0x2001), 0x2000, FromHost),
            CommandError::SglLength { sgl: 0x2001, xfer: 0x2000 }
        ));
    }

    #[test]
    fn spec_4_3_2_last_segment_from_the_command() {
        let m = mem();
        write_segment(&m, 0x8000, &[data(0x10000, 0x200), data(0x30000, 0x200), data(0x20000, 0x400)]);
        assert_eq!(
            segs(&m, last(0x8000, 3), 0x800, ToHost),
            vec![g(0x10000, 0x200), g(0x30000, 0x200), g(0x20000, 0x400)]
        );
    }

    #[test]
    fn spec_4_3_2_segment_chains_to_last_segment() {
        let m = mem();
        write_segment(&m, 0x8000, &[data(0x10000, 0x1000), data(0x30000, 0x1000), seg(0x9000, 2)]);
        write_segment(&m, 0x9000, &[data(0x50000, 0x800), last(0xa000, 1)]);
        write_segment(&m, 0xa000, &[data(0x70000, 0x800)]);
        assert_eq!(
            segs(&m, seg(0x8000, 3), 0x3000, FromHost),
            vec![g(0x10000, 0x1000), g(0x30000, 0x1000), g(0x50000, 0x800), g(0x70000, 0x800)]
        );
        // A segment may hold only the pointer to the next one.
        write_segment(&m, 0xb000, &[last(0xa000, 1)]);
        assert_eq!(segs(&m, seg(0xb000, 1), 0x800, ToHost), vec![g(0x70000, 0x800)]);
    }

    #[test]
    fn spec_4_3_2_descriptor_after_a_segment_descriptor_is_invalid() {
        let m = mem();
        write_segment(&m, 0xa000, &[data(0x70000, 0x800)]);
        write_segment(&m, 0x8000, &[data(0x10000, 0x800), seg(0xa000, 1), data(0x30000, 0x800)]);
        assert!(matches!(err(&m, seg(0x8000, 3), 0x1800, FromHost), CommandError::SglSegment(_)));
        write_segment(&m, 0x8000, &[last(0xa000, 1), data(0x30000, 0x800)]);
        assert!(matches!(err(&m, seg(0x8000, 2), 0x1000, ToHost), CommandError::SglSegment(_)));
    }

    #[test]
    fn spec_4_3_2_last_segment_containing_a_segment_descriptor_is_invalid() {
        let m = mem();
        write_segment(&m, 0xa000, &[data(0x70000, 0x800)]);
        write_segment(&m, 0x8000, &[data(0x10000, 0x800), last(0xa000, 1)]);
        assert!(matches!(err(&m, last(0x8000, 2), 0x1000, ToHost), CommandError::SglSegment(_)));
        write_segment(&m, 0x8000, &[data(0x10000, 0x800), seg(0xa000, 1)]);
        assert!(matches!(err(&m, last(0x8000, 2), 0x1000, ToHost), CommandError::SglSegment(_)));
    }

    #[test]
    fn spec_4_3_2_segment_length_not_a_multiple_of_16_is_invalid() {
        let m = mem();
        write_segment(&m, 0x8000, &[data(0x10000, 0x800), data(0x20000, 0x800)]);
        for bad in [0, 8, 17, 31] {
            let d = SglDescriptor::new(SglType::Segment, 0x8000, bad);
            assert!(matches!(err(&m, d, 0x1000, ToHost), CommandError::SglSegment(_)));
            let d = SglDescriptor::new(SglType::LastSegment, 0x8000, bad);
            assert!(matches!(err(&m, d, 0x1000, ToHost), CommandError::SglSegment(_)));
        }
        // Also for a segment descriptor found in a segment.
        write_segment(&m, 0x9000, &[SglDescriptor::new(SglType::LastSegment, 0x8000, 24)]);
        assert!(matches!(err(&m, seg(0x9000, 1), 0x1000, ToHost), CommandError::SglSegment(_)));
    }

    #[test]
    fn spec_4_3_2_bit_bucket_in_a_read_is_discarded() {
        let m = mem();
        write_segment(
            &m,
            0x8000,
            &[data(0x10000, 0x200), bucket(0x100), bucket(0x100), data(0x20000, 0x200)],
        );
        assert_eq!(
            segs(&m, last(0x8000, 4), 0x600, ToHost),
            vec![g(0x10000, 0x200), Segment::Discard { len: 0x200 }, g(0x20000, 0x200)]
        );
        // A bucket alone as SGL Descriptor 1.
        assert_eq!(segs(&m, bucket(0x400), 0x400, ToHost), vec![Segment::Discard { len: 0x400 }]);
        // Bucket bytes count towards the SGL length.
        assert!(matches!(err(&m, last(0x8000, 4), 0x400, ToHost), CommandError::SglLength { .. }));
    }

    #[test]
    fn spec_4_3_2_bit_bucket_in_a_write_is_type_error() {
        let m = mem();
        write_segment(&m, 0x8000, &[data(0x10000, 0x200), bucket(0x200)]);
        assert!(matches!(err(&m, last(0x8000, 2), 0x400, FromHost), CommandError::SglType(1)));
        assert!(matches!(err(&m, bucket(0x200), 0x200, FromHost), CommandError::SglType(1)));
    }

    #[test]
    fn spec_4_3_2_keyed_transport_and_reserved_types_are_invalid() {
        let m = mem();
        for (kind, code) in [
            (SglType::KeyedDataBlock, 4),
            (SglType::TransportDataBlock, 5),
            (SglType::Other(6), 6),
            (SglType::Other(0xf), 0xf),
        ] {
            let d = SglDescriptor::new(kind, 0x10000, 0x200);
            assert!(matches!(err(&m, d, 0x200, ToHost), CommandError::SglType(c) if c == code));
            write_segment(&m, 0x8000, &[data(0x20000, 0x200), d]);
            assert!(matches!(
                err(&m, last(0x8000, 2), 0x400, FromHost),
                CommandError::SglType(c) if c == code
            ));
        }
    }

    #[test]
    fn spec_4_3_2_offset_subtype_is_invalid() {
        let m = mem();
        let mut d = data(0x10000, 0x200);
        d.id |= SGL_SUBTYPE_OFFSET;
        assert!(matches!(err(&m, d, 0x200, ToHost), CommandError::SglOffset));
        let mut s = last(0x8000, 1);
        s.id |= SGL_SUBTYPE_OFFSET;
        write_segment(&m, 0x8000, &[data(0x10000, 0x200)]);
        assert!(matches!(err(&m, s, 0x200, ToHost), CommandError::SglOffset));
        write_segment(&m, 0x8000, &[d]);
        assert!(matches!(err(&m, last(0x8000, 1), 0x200, ToHost), CommandError::SglOffset));
        // Transport specific (2h) and reserved sub types are not supported either.
        let mut d = data(0x10000, 0x200);
        d.id |= 0x2;
        assert!(matches!(err(&m, d, 0x200, ToHost), CommandError::SglType(0x02)));
    }

    #[test]
    fn spec_4_3_2_self_referencing_segment_terminates() {
        let m = mem();
        write_segment(&m, 0x8000, &[seg(0x8000, 1)]);
        assert!(matches!(err(&m, seg(0x8000, 1), 0x1000, ToHost), CommandError::SglDescriptorCount));
        // With data in each pass, the length check stops it even sooner.
        write_segment(&m, 0x9000, &[data(0x10000, 0x200), seg(0x9000, 2)]);
        assert!(matches!(
            err(&m, seg(0x9000, 2), 0x1000, ToHost),
            CommandError::SglLength { sgl: 0x1200, xfer: 0x1000 }
        ));
        // Zero-length data blocks do not help a loop escape the budget.
        write_segment(&m, 0xa000, &[data(0x10000, 0), seg(0xa000, 2)]);
        assert!(matches!(err(&m, seg(0xa000, 2), 0x1000, ToHost), CommandError::SglDescriptorCount));
    }

    #[test]
    fn spec_4_3_2_too_many_descriptors_is_invalid_without_reading_them() {
        let m = mem();
        // 0xffff_fff0 bytes of descriptors at an unmapped address: rejected by count,
        // before any allocation or read.
        let d = SglDescriptor::new(SglType::LastSegment, 0x4000_0000, 0xffff_fff0);
        assert!(matches!(err(&m, d, 0x1000, ToHost), CommandError::SglDescriptorCount));
        // Up to the budget is fine.
        let n = descriptor_budget(0x1000) - 1;
        let descs: Vec<SglDescriptor> =
            (0..n).map(|i| data(0x10_0000 + i * 0x20, u32::from(i == 0) * 0x1000)).collect();
        write_segment(&m, 0x1_0000, &descs);
        assert_eq!(segs(&m, last(0x1_0000, n as u32), 0x1000, ToHost), vec![g(0x10_0000, 0x1000)]);
        assert!(matches!(
            err(&m, last(0x1_0000, n as u32 + 1), 0x1000, ToHost),
            CommandError::SglDescriptorCount
        ));
    }

    #[test]
    fn spec_4_3_2_segment_outside_guest_memory_is_data_transfer_error() {
        let m = mem();
        assert!(matches!(err(&m, last(0x20_0000, 2), 0x400, ToHost), CommandError::Memory(_)));
        // Partly outside.
        assert!(matches!(err(&m, last((1 << 20) - 16, 2), 0x400, ToHost), CommandError::Memory(_)));
        // The next segment outside.
        write_segment(&m, 0x8000, &[data(0x10000, 0x200), last(0x4000_0000, 1)]);
        assert!(matches!(err(&m, seg(0x8000, 2), 0x400, ToHost), CommandError::Memory(_)));
        // At the top of the address space.
        assert!(matches!(err(&m, last(u64::MAX - 15, 2), 0x400, ToHost), CommandError::Memory(_)));
    }

    #[test]
    fn spec_4_3_2_zero_length_data_blocks_are_skipped() {
        let m = mem();
        write_segment(
            &m,
            0x8000,
            &[data(0x10000, 0), data(0x20000, 0x200), data(0x90000, 0), data(0x40000, 0x200)],
        );
        assert_eq!(segs(&m, last(0x8000, 4), 0x400, FromHost), vec![g(0x20000, 0x200), g(0x40000, 0x200)]);
    }

    #[test]
    fn spec_4_3_2_contiguous_data_blocks_merge() {
        let m = mem();
        write_segment(&m, 0x8000, &[data(0x10000, 0x200), data(0x10200, 0x600), seg(0x9000, 1)]);
        write_segment(&m, 0x9000, &[last(0xa000, 2)]);
        write_segment(&m, 0xa000, &[data(0x10800, 0x800), data(0x40000, 0x10)]);
        assert_eq!(segs(&m, seg(0x8000, 3), 0x1010, ToHost), vec![g(0x10000, 0x1000), g(0x40000, 0x10)]);
    }

    #[test]
    fn spec_4_3_2_appends_without_merging_into_existing_segments() {
        let m = mem();
        let mut out = vec![g(0x1000, 0x1000)];
        sgl_segments(&m, data(0x2000, 0x200), 0x200, ToHost, &mut out).unwrap();
        assert_eq!(out, vec![g(0x1000, 0x1000), g(0x2000, 0x200)]);
    }
}
