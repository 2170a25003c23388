//! The buffers the kernel reads and writes besides guest memory (bounce, zeroes,
//! scratch), and the I/O vector lists that point at them. Plain numbers, no raw
//! pointers, so the requests holding them stay `Send`.

use std::fmt;

use super::limits::{BUF_ALIGN, IOV_MAX, ZERO_CHUNK};

/// A zero-initialised buffer whose start is aligned to [`BUF_ALIGN`] (or more).
pub(super) struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    pub(super) cap: usize,
}

impl AlignedBuf {
    pub(super) fn new(cap: usize, align: usize) -> Self {
        let align = align.max(BUF_ALIGN);
        let raw = vec![0u8; cap + align];
        let start = raw.as_ptr().align_offset(align);
        AlignedBuf { raw, start, cap }
    }
    /// The address of the first byte, for the kernel. The heap block never moves.
    pub(super) fn addr(&self) -> usize {
        self.raw.as_ptr() as usize + self.start
    }
    pub(super) fn slice(&self, n: usize) -> &[u8] {
        &self.raw[self.start..self.start + n]
    }
    pub(super) fn slice_mut(&mut self, n: usize) -> &mut [u8] {
        &mut self.raw[self.start..self.start + n]
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AlignedBuf({} bytes at {:#x})", self.cap, self.addr())
    }
}

/// One I/O vector, laid out exactly like `struct iovec` but made of plain numbers,
/// so requests holding them stay `Send`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct IoVec {
    pub(super) base: usize,
    pub(super) len: usize,
}

const _: () = assert!(std::mem::size_of::<IoVec>() == std::mem::size_of::<libc::iovec>());
const _: () = assert!(std::mem::align_of::<IoVec>() == std::mem::align_of::<libc::iovec>());

/// Drops the first `n` bytes of a vector list (after a partial transfer).
pub(super) fn advance(iov: &mut Vec<IoVec>, mut n: usize) {
    let mut k = 0;
    while k < iov.len() && n >= iov[k].len {
        n -= iov[k].len;
        k += 1;
    }
    iov.drain(..k);
    if n > 0 {
        if let Some(first) = iov.first_mut() {
            first.base += n;
            first.len -= n;
        }
    }
}

/// Appends vectors covering `len` bytes of a buffer `chunk` bytes long at `base`,
/// reusing it as often as needed.
pub(super) fn push_repeated(iov: &mut Vec<IoVec>, base: usize, chunk: usize, mut len: u64) {
    while len > 0 {
        let n = (chunk as u64).min(len) as usize;
        iov.push(IoVec { base, len: n });
        len -= n as u64;
    }
}

/// Points a zero-writing request's vectors at the shared zero buffer, for as much of
/// the `rest` as one writev takes.
pub(super) fn fill_zero_iov(iov: &mut Vec<IoVec>, zeroes: usize, rest: u64) {
    iov.clear();
    push_repeated(iov, zeroes, ZERO_CHUNK, rest.min((ZERO_CHUNK * IOV_MAX) as u64));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(parts: &[(usize, usize)]) -> Vec<IoVec> {
        parts.iter().map(|&(base, len)| IoVec { base, len }).collect()
    }

    #[test]
    fn advance_skips_whole_and_partial_vectors() {
        let mut iov = v(&[(0x1000, 100), (0x2000, 200), (0x3000, 300)]);
        advance(&mut iov, 0);
        assert_eq!(iov.len(), 3);
        advance(&mut iov, 150);
        assert_eq!(iov, v(&[(0x2000 + 50, 150), (0x3000, 300)]));
        advance(&mut iov, 150);
        assert_eq!(iov, v(&[(0x3000, 300)]));
        advance(&mut iov, 300);
        assert!(iov.is_empty());
    }

    #[test]
    fn repeated_buffers_cover_the_length() {
        let mut iov = Vec::new();
        push_repeated(&mut iov, 0x5000, 64, 150);
        assert_eq!(iov, v(&[(0x5000, 64), (0x5000, 64), (0x5000, 22)]));
        let mut iov = Vec::new();
        fill_zero_iov(&mut iov, 0x9000, (ZERO_CHUNK * IOV_MAX) as u64 * 3);
        assert_eq!(iov.len(), IOV_MAX, "one writev never takes more than IOV_MAX vectors");
    }

    #[test]
    fn aligned_buffers_are_aligned() {
        for align in [512, 4096, 8192] {
            let mut b = AlignedBuf::new(1000, align);
            assert_eq!(b.addr() % align, 0);
            assert_eq!(b.slice_mut(1000).len(), 1000);
        }
    }
}
