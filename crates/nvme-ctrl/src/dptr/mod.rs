//! Data pointers: turning a command's PRP entries or SGL into the list of guest
//! memory segments a transfer covers (Base §4.3). Every fault becomes a
//! [`CommandError`] naming the status the spec gives it.

mod prp;
mod sgl;

pub use prp::prp_segments;
pub use sgl::sgl_segments;

/// Which way data moves, relative to the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Controller to host memory (Read, Identify, Get Log Page...).
    ToHost,
    /// Host memory to controller (Write, Compare, Set Features data...).
    FromHost,
}

/// Whether the guest's data in `segs` equals `data`, read a page at a time so a
/// mismatch stops early.
pub(crate) fn guest_equals(
    mem: &guest_mem::GuestMemory,
    segs: &[block_backend::Segment],
    data: &[u8],
) -> Result<bool, block_backend::SegmentError> {
    let mut cur = block_backend::SegmentCursor::for_transfer(segs, data.len() as u64)?;
    let mut chunk = [0u8; 4096];
    for want in data.chunks(chunk.len()) {
        let got = &mut chunk[..want.len()];
        cur.read_into(mem, got)?;
        if got != want {
            return Ok(false);
        }
    }
    Ok(true)
}
