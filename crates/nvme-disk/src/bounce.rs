//! The bounce path: copies between the front's data (guest segments or a host buffer)
//! and a buffer in the driver's DMA memory, for pieces that cannot go zero copy
//! (memory the transport could not share, segments PRPs cannot describe, bit buckets,
//! host buffers). Bit-bucket bytes of a read are dropped on the way back.

use block_backend::{BackendError, DataBuf, SegmentCursor, SegmentMark};
use guest_mem::GuestMemory;
use nvme_driver::DmaBuf;

use crate::error::invalid;

/// Bytes staged per copy between guest memory and a bounce buffer.
const STAGE: usize = 64 << 10;

/// Copies `buf.len()` bytes of the request's data from byte `off` (mark `seg`)
/// into a bounce buffer.
pub(crate) fn stage_in(
    data: &DataBuf,
    mem: &GuestMemory,
    off: u64,
    seg: SegmentMark,
    buf: &DmaBuf,
    scratch: &mut Vec<u8>,
) -> Result<(), BackendError> {
    let n = buf.len();
    match data {
        DataBuf::Host(v) => buf.write_at(0, &v[off as usize..(off + n) as usize])?,
        DataBuf::Guest(segs) => {
            let mut cur = SegmentCursor::resume(segs, seg);
            copy_chunks(n, scratch, |at, part| {
                cur.read_into(mem, part)?;
                Ok(buf.write_at(at, part)?)
            })?;
        }
        DataBuf::None => return Err(invalid("no data buffer".into())),
    }
    Ok(())
}

/// Copies a bounced read's `len` bytes into the request's data at byte `off`; the
/// bytes that fall in bit buckets are dropped.
pub(crate) fn stage_out(
    data: &mut DataBuf,
    mem: &GuestMemory,
    off: u64,
    len: u64,
    seg: SegmentMark,
    buf: &DmaBuf,
    scratch: &mut Vec<u8>,
) -> Result<(), BackendError> {
    match data {
        DataBuf::Host(v) => buf.read_at(0, &mut v[off as usize..(off + len) as usize])?,
        DataBuf::Guest(segs) => {
            let mut cur = SegmentCursor::resume(segs, seg);
            copy_chunks(len, scratch, |at, part| {
                buf.read_at(at, part)?;
                Ok(cur.write_from(mem, part)?)
            })?
        }
        DataBuf::None => return Err(invalid("no data buffer".into())),
    }
    Ok(())
}

/// Runs `f(offset, staging slice)` over `len` bytes in chunks of at most [`STAGE`].
fn copy_chunks(
    len: u64,
    scratch: &mut Vec<u8>,
    mut f: impl FnMut(u64, &mut [u8]) -> Result<(), BackendError>,
) -> Result<(), BackendError> {
    if scratch.len() < STAGE {
        scratch.resize(STAGE, 0);
    }
    let mut at = 0;
    while at < len {
        let k = (len - at).min(STAGE as u64) as usize;
        f(at, &mut scratch[..k])?;
        at += k as u64;
    }
    Ok(())
}
