//! Where a namespace keeps its blocks' metadata (NVM §5.3 and §5.2.3): a file of
//! its own, apart from the data, so the data stays a plain image any tool can read.
//!
//! Layout (docs/metadata.md has it for operators): block `n`'s metadata is the `ms`
//! bytes at `n * ms`, `ms` being the current LBA format's metadata size; the
//! protection information tuple in it (if the format has one: 8 bytes, 16 with the
//! 64-bit guard) is stored complemented, the other bytes as they are. A block whose
//! metadata was never written (a hole, or past the file's end) so reads as zeroes
//! but for its protection information, all ones: an application tag of FFFFh and a
//! reference tag of all ones, which the checks of every type skip. A new namespace therefore
//! reads without protection errors before the host wrote anything, and deallocating
//! a range punches its metadata out (reading as deallocated blocks read: zeroes).
//! The layout changes only with the format, and a Format that changes it empties
//! the file.
//!
//! The file is a regular file beside the data (`FILE.meta`), one given by the
//! operator, or a memfd (a `ram:` namespace: handed to the next process on an
//! upgrade, like the data); a `null:` namespace keeps none (its data is not kept
//! either). Metadata is at most 1/32 of the namespace's size (16 bytes per 512).
//!
//! Reads and writes are synchronous, on the engine's thread: a few bytes per block,
//! in the page cache. [`MetaRead`] is what a read with metadata does once its data
//! is back (the engine holds it in the command's `Finish`; `io/meta.rs` starts it).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileExt;

use block_backend::{DataBuf, Segment, SegmentCursor, SegmentError};
use guest_mem::GuestMemory;
use nvme_spec::pi::{Guard, PiLayout, PiTags};
use nvme_spec::Status;
use rustix::fs::FallocateFlags;

/// Which bytes of each block's metadata are stored complemented: the `len` bytes
/// of protection information at `at` in each block's `ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Complemented {
    pub ms: usize,
    pub at: usize,
    pub len: usize,
}

impl Complemented {
    /// The protection information tuple of layout `l`.
    pub fn of(l: PiLayout) -> Self {
        Complemented { ms: l.ms, at: l.offset(), len: l.size() }
    }

    /// Flips the protection information of the blocks whose metadata `buf` holds
    /// (from a block's start).
    fn flip(self, buf: &mut [u8]) {
        for block in buf.chunks_mut(self.ms) {
            if let Some(pi) = block.get_mut(self.at..self.at + self.len) {
                pi.iter_mut().for_each(|b| *b = !*b);
            }
        }
    }
}

/// A namespace's metadata store.
#[derive(Debug)]
pub struct MetaStore {
    /// None: metadata is not kept (reads as never written).
    file: Option<File>,
}

impl MetaStore {
    /// Metadata in `file` (a new one is empty: every block never written).
    pub fn file(file: File) -> Self {
        MetaStore { file: Some(file) }
    }

    /// Metadata written nowhere, read as never written.
    pub fn discard() -> Self {
        MetaStore { file: None }
    }

    /// Its file, for a handover (None: nothing kept).
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.file.as_ref().map(|f| f.as_fd())
    }

    /// Reads the metadata at `offset` (a block's start) into `buf`, the bytes `pi`
    /// names complemented back (None: as stored).
    pub fn read(&self, offset: u64, buf: &mut [u8], pi: Option<Complemented>) -> io::Result<()> {
        let mut got = 0;
        if let Some(f) = &self.file {
            while got < buf.len() {
                match f.read_at(&mut buf[got..], offset + got as u64) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
        // Past the end: never written.
        buf[got..].fill(0);
        if let Some(c) = pi {
            c.flip(buf);
        }
        Ok(())
    }

    /// Writes `data` as the metadata at `offset` (a block's start), the bytes `pi`
    /// names complemented (None: as given).
    pub fn write(&self, offset: u64, data: &[u8], pi: Option<Complemented>) -> io::Result<()> {
        let Some(f) = &self.file else { return Ok(()) };
        match pi {
            Some(c) => {
                let mut stored = data.to_vec();
                c.flip(&mut stored);
                f.write_all_at(&stored, offset)
            }
            None => f.write_all_at(data, offset),
        }
    }

    /// Makes `len` bytes at `offset` never written.
    pub fn clear(&self, offset: u64, len: u64) -> io::Result<()> {
        let Some(f) = &self.file else { return Ok(()) };
        let end = f.metadata()?.len();
        let len = len.min(end.saturating_sub(offset));
        if len == 0 {
            return Ok(());
        }
        let flags = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
        if rustix::fs::fallocate(f, flags, offset, len).is_ok() {
            return Ok(());
        }
        // No hole punching here: write the stored form of "never written".
        let zeros = vec![0u8; len.min(1 << 20) as usize];
        let mut at = 0;
        while at < len {
            let n = (len - at).min(zeros.len() as u64) as usize;
            f.write_all_at(&zeros[..n], offset + at)?;
            at += n as u64;
        }
        Ok(())
    }

    /// Makes every block's metadata never written (a Format).
    pub fn clear_all(&self) -> io::Result<()> {
        match &self.file {
            Some(f) => f.set_len(0),
            None => Ok(()),
        }
    }

    /// Makes what was written durable.
    pub fn sync(&self) -> io::Result<()> {
        match &self.file {
            Some(f) => f.sync_data(),
            None => Ok(()),
        }
    }
}

/// What a read of a namespace with metadata does once its data is back.
#[derive(Debug)]
pub(crate) struct MetaRead {
    /// The blocks' metadata, read from the store when the command started.
    pub meta: Vec<u8>,
    /// Bytes of data per block.
    pub block: usize,
    pub ms: usize,
    pub pi: Option<PiLayout>,
    /// The checks asked for (PRINFO bits 2:0).
    pub prchk: u8,
    pub tags: PiTags,
    /// Where the metadata goes in guest memory (None: nowhere: stripped, or a Verify).
    pub to: Option<Vec<Segment>>,
    /// A Compare: what the blocks and their metadata are compared with.
    pub compare: Option<CompareWith>,
}

/// The host's side of a Compare on a namespace with metadata: its data, and its
/// metadata (from MPTR, or inline after each block's data), in guest memory.
#[derive(Debug)]
pub(crate) struct CompareWith {
    pub data: Vec<Segment>,
    pub meta: Vec<Segment>,
}

impl MetaRead {
    /// Checks the data read (`data`: guest segments or a host buffer of `len`
    /// bytes) against the blocks' protection information, then hands the metadata
    /// to the host. Returns the command's status.
    pub(crate) fn finish(&self, mem: &GuestMemory, data: &DataBuf, nsid: u32, slba: u64) -> Status {
        if let Some(l) = self.pi.filter(|_| self.prchk != 0) {
            let len = (self.meta.len() / self.ms * self.block) as u64;
            let r = each_block_crc(mem, data, len, self.block, l.guard, |i, crc| {
                let m = &self.meta[i as usize * self.ms..][..self.ms];
                l.check(self.prchk, crc, m, self.tags, i).map_err(|e| (i, e))
            });
            match r {
                Ok(Ok(())) => {}
                Ok(Err((i, e))) => {
                    log_limit::limited_warn!(
                        target: "vnvme::guest",
                        nsid, lba = slba + i as u64, check = ?e,
                        "protection information check failed on a read"
                    );
                    return e.status();
                }
                Err(_) => return Status::DATA_TRANSFER_ERROR.with_dnr(),
            }
        }
        if let Some(c) = &self.compare {
            return self.compare(mem, data, c);
        }
        if let Some(segs) = &self.to {
            let copied = SegmentCursor::for_transfer(segs, self.meta.len() as u64)
                .and_then(|mut c| c.write_from(mem, &self.meta));
            if copied.is_err() {
                return Status::DATA_TRANSFER_ERROR.with_dnr();
            }
            if GuestMemory::logging_writes() {
                for s in segs {
                    if let Segment::Guest { gpa, len } = *s {
                        mem.mark_dirty(gpa, len);
                    }
                }
            }
        }
        Status::SUCCESS
    }

    /// A Compare's end, the stored blocks' protection information checked: the
    /// data, then the metadata but for its protection information (the spec
    /// compares metadata "excluding protection information"), equal to the host's,
    /// or Compare Failure.
    fn compare(&self, mem: &GuestMemory, data: &DataBuf, c: &CompareWith) -> Status {
        let DataBuf::Host(stored) = data else { return Status::INTERNAL_ERROR };
        let len = self.meta.len() / self.ms * self.block;
        let mut host_meta = vec![0u8; self.meta.len()];
        let got = crate::dptr::guest_equals(mem, &c.data, &stored[..len]).and_then(|same| {
            SegmentCursor::for_transfer(&c.meta, host_meta.len() as u64)?.read_into(mem, &mut host_meta)?;
            Ok(same)
        });
        let same_data = match got {
            Ok(same) => same,
            Err(_) => return Status::DATA_TRANSFER_ERROR.with_dnr(),
        };
        // The bytes of each block's metadata that are not its tuple.
        let (skip, size) = self.pi.map_or((0, 0), |l| (l.offset(), l.size()));
        let same_meta = self
            .meta
            .chunks(self.ms)
            .zip(host_meta.chunks(self.ms))
            .all(|(a, b)| a[..skip] == b[..skip] && a[skip + size..] == b[skip + size..]);
        if same_data && same_meta {
            Status::SUCCESS
        } else {
            Status::COMPARE_FAILURE.with_dnr()
        }
    }
}

/// Calls `f(i, crc)` with the running `guard` CRC of each `block`-byte block of
/// the `len` bytes of `data` ([`Guard::data_crc`]), in order, until `f` fails.
pub(crate) fn each_block_crc<E>(
    mem: &GuestMemory,
    data: &DataBuf,
    len: u64,
    block: usize,
    guard: Guard,
    mut f: impl FnMut(u32, u64) -> Result<(), E>,
) -> Result<Result<(), E>, SegmentError> {
    match data {
        DataBuf::Host(buf) => {
            for (i, b) in buf[..len as usize].chunks(block).enumerate() {
                if let Err(e) = f(i as u32, guard.data_crc(b)) {
                    return Ok(Err(e));
                }
            }
        }
        DataBuf::Guest(segs) => {
            let mut cur = SegmentCursor::for_transfer(segs, len)?;
            let mut scratch = vec![0u8; block];
            for i in 0..(len / block as u64) as u32 {
                cur.read_into(mem, &mut scratch)?;
                if let Err(e) = f(i, guard.data_crc(&scratch)) {
                    return Ok(Err(e));
                }
            }
        }
        DataBuf::None | DataBuf::Within(_) => {}
    }
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PI_LAST_OF_16: Option<Complemented> = Some(Complemented { ms: 16, at: 8, len: 8 });

    #[test]
    fn never_written_reads_as_zeroes_with_all_ones_protection_information() {
        let m = crate::config::MetaFile::memory().unwrap().try_clone().unwrap();
        let mut b = [0u8; 32];
        m.read(160, &mut b, PI_LAST_OF_16).unwrap();
        assert_eq!(b[..8], [0; 8]);
        assert_eq!(b[8..16], [0xff; 8]);
        assert_eq!(b[16..24], [0; 8]);
        // Written, read back as given, both ways.
        let block: Vec<u8> = (1..=16).collect();
        m.write(16, &block, PI_LAST_OF_16).unwrap();
        let mut b = [0u8; 16];
        m.read(16, &mut b, PI_LAST_OF_16).unwrap();
        assert_eq!(b[..], block[..]);
        m.write(64, &block, None).unwrap();
        m.read(64, &mut b, None).unwrap();
        assert_eq!(b[..], block[..]);
        // Cleared: never written again.
        m.clear(16, 16).unwrap();
        m.read(16, &mut b, PI_LAST_OF_16).unwrap();
        assert_eq!((b[..8].to_vec(), b[8..].to_vec()), (vec![0; 8], vec![0xff; 8]));
        m.clear_all().unwrap();
        m.read(64, &mut b, None).unwrap();
        assert_eq!(b, [0; 16]);
        // Nothing kept: nothing back.
        let d = MetaStore::discard();
        d.write(0, &block, None).unwrap();
        d.read(0, &mut b, PI_LAST_OF_16).unwrap();
        assert_eq!((b[..8].to_vec(), b[8..].to_vec()), (vec![0; 8], vec![0xff; 8]));
    }

    #[test]
    fn a_hole_punched_in_the_middle_of_a_page_reads_as_never_written() {
        let m = crate::config::MetaFile::memory().unwrap().try_clone().unwrap();
        let pi = Some(Complemented { ms: 8, at: 0, len: 8 });
        m.write(0, &[0x11; 8192], pi).unwrap();
        m.clear(4000, 200).unwrap();
        let mut b = vec![0u8; 8192];
        m.read(0, &mut b, pi).unwrap();
        assert!(b[..4000].iter().all(|&x| x == 0x11));
        assert!(b[4000..4200].iter().all(|&x| x == 0xff));
        assert!(b[4200..].iter().all(|&x| x == 0x11));
    }
}
