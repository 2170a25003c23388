//! The bounce path: copies between the front's data (guest segments or a host buffer)
//! and a buffer in the driver's DMA memory, for pieces that cannot go zero copy
//! (memory the transport could not share, segments PRPs cannot describe, bit buckets,
//! host buffers). The in-flight core walks the data (`SegmentCursor`, once per piece)
//! and keeps a request given up on off guest memory; bit-bucket bytes of a read are
//! dropped on the way back.

use block_backend::{BackendError, Pending, SegmentMark};
use nvme_driver::DmaBuf;

/// Bytes staged per copy between guest memory and a bounce buffer.
const STAGE: usize = 64 << 10;

/// Copies `buf.len()` bytes of the request's data from byte `off` (mark `seg` in
/// guest segments) into a bounce buffer.
pub(crate) fn stage_in<W>(
    req: &Pending<W>,
    off: u64,
    seg: SegmentMark,
    buf: &DmaBuf,
    scratch: &mut Vec<u8>,
) -> Result<(), BackendError> {
    req.copy_out_chunks(off, Some(seg), buf.len(), stage(scratch), |at, part| Ok(buf.write_at(at, part)?))
}

/// Copies a bounced read's `len` bytes into the request's data at byte `off` (mark
/// `seg`), not at all for a request given up on.
pub(crate) fn stage_out<W>(
    req: &mut Pending<W>,
    off: u64,
    len: u64,
    seg: SegmentMark,
    buf: &DmaBuf,
    scratch: &mut Vec<u8>,
) -> Result<(), BackendError> {
    req.copy_in_chunks(off, Some(seg), len, stage(scratch), |at, room| Ok(buf.read_at(at, room)?))
}

/// The staging buffer, [`STAGE`] bytes.
fn stage(scratch: &mut Vec<u8>) -> &mut [u8] {
    if scratch.len() < STAGE {
        scratch.resize(STAGE, 0);
    }
    &mut scratch[..STAGE]
}
