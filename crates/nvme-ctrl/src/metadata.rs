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

/// What [`audit`] found in a namespace's data and metadata.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PiAudit {
    /// Blocks whose protection information was written (not all ones).
    pub written: u64,
    /// Of those, the blocks checked (the others' application tag left them out).
    pub checked: u64,
    /// The first blocks found wrong (at most [`AUDIT_KEEPS`]) and how many in all.
    pub bad: Vec<PiMismatch>,
    pub bad_count: u64,
}

/// A block whose protection information does not match its data or its LBA.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PiMismatch {
    pub lba: u64,
    /// The guard stored, and the guard its data and metadata give.
    pub guard: u64,
    pub data_guard: u64,
    /// The reference tag stored (type 1 wants the LBA's low bits).
    pub ref_tag: u64,
}

/// How many mismatches an [`audit`] lists (it counts them all).
pub const AUDIT_KEEPS: usize = 16;

/// Checks each block of `data` (`2^shift`-byte blocks, as many as the file holds)
/// against its protection information in `meta` (laid out as `layout` says): the
/// guard against the block's data and the metadata bytes before the tuple, and for
/// type 1 the reference tag against the block's LBA. Blocks never written (their
/// tuple all ones) are not counted; blocks whose application tag is FFFFh (which
/// turns checking off) or is not `app_tag`, when one is given, are left out.
pub fn audit(
    data: &File,
    meta: &MetaStore,
    layout: PiLayout,
    shift: u32,
    app_tag: Option<u16>,
) -> io::Result<PiAudit> {
    const CHUNK: u64 = 1024;
    let (block, ms) = (1usize << shift, layout.ms);
    let blocks = data.metadata()?.len() >> shift;
    let (mut dbuf, mut mbuf) = (vec![0u8; CHUNK as usize * block], vec![0u8; CHUNK as usize * ms]);
    let mut out = PiAudit::default();
    let pi = Complemented::of(layout);
    let mut first = 0;
    while first < blocks {
        let n = CHUNK.min(blocks - first) as usize;
        data.read_exact_at(&mut dbuf[..n * block], first << shift)?;
        meta.read(first * ms as u64, &mut mbuf[..n * ms], Some(pi))?;
        for i in 0..n {
            let m = &mbuf[i * ms..(i + 1) * ms];
            if m[pi.at..pi.at + pi.len].iter().all(|&b| b == 0xff) {
                continue;
            }
            out.written += 1;
            let t = layout.read(m);
            if t.app_tag == 0xffff || app_tag.is_some_and(|a| a != t.app_tag) {
                continue;
            }
            out.checked += 1;
            let lba = first + i as u64;
            let data_guard = layout.guard(layout.data_crc(&dbuf[i * block..(i + 1) * block]), m);
            let ref_ok = layout.ty != nvme_spec::pi::PiType::Type1 || t.ref_tag == layout.lba_ref_tag(lba);
            if t.guard != data_guard || !ref_ok {
                out.bad_count += 1;
                if out.bad.len() < AUDIT_KEEPS {
                    out.bad.push(PiMismatch { lba, guard: t.guard, data_guard, ref_tag: t.ref_tag });
                }
            }
        }
        first += n as u64;
    }
    Ok(out)
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

    /// Six blocks: two right, one never written, one with checking off, one whose
    /// data changed under its guard, one whose reference tag is another LBA's.
    #[test]
    fn an_audit_finds_the_blocks_whose_data_or_lba_left_their_tuple() {
        use nvme_spec::pi::{PiTuple, PiType};
        let dir = std::env::temp_dir().join(format!("vnvme-audit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let layout = PiLayout { ty: PiType::Type1, guard: Guard::Crc16, ms: 8, first: false };
        let data: Vec<u8> = (0..6 * 512).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(dir.join("d"), &data).unwrap();
        let rw = || std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).clone();
        let store = MetaStore::file(rw().open(dir.join("m")).unwrap());
        let tuple = |lba: u64, app_tag: u16, ref_tag: u64| {
            let mut m = [0u8; 8];
            let block = &data[lba as usize * 512..][..512];
            let guard = layout.guard(layout.data_crc(block), &m);
            layout.write(PiTuple { guard, app_tag, ref_tag }, &mut m);
            m
        };
        let pi = Some(Complemented::of(layout));
        for (lba, m) in
            [(0, tuple(0, 0, 0)), (1, tuple(1, 7, 1)), (3, tuple(3, 0xffff, 99)), (4, tuple(4, 0, 4))]
        {
            store.write(lba * 8, &m, pi).unwrap();
        }
        store.write(5 * 8, &tuple(5, 0, 4), pi).unwrap();
        // Block 4's data changes after its tuple was made.
        let f = rw().open(dir.join("d")).unwrap();
        f.write_all_at(&[0xaa], 4 * 512 + 100).unwrap();
        let a = audit(&f, &store, layout, 9, None).unwrap();
        assert_eq!((a.written, a.checked, a.bad_count), (5, 4, 2), "{a:?}");
        assert_eq!(a.bad.iter().map(|b| b.lba).collect::<Vec<_>>(), vec![4, 5]);
        assert_ne!(a.bad[0].guard, a.bad[0].data_guard, "block 4: its guard");
        assert_eq!(a.bad[1].ref_tag, 4, "block 5: its guard right, its reference tag 4's");
        assert_eq!(a.bad[1].guard, a.bad[1].data_guard);
        // Only application tag 7: block 1, which is right.
        let a = audit(&f, &store, layout, 9, Some(7)).unwrap();
        assert_eq!((a.written, a.checked, a.bad_count), (5, 1, 0), "{a:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

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
