//! Read, Write, Verify and Write Zeroes on a namespace whose format has metadata
//! (NVM §5.2.3 and §5.3): the metadata moves between the host's separate buffer
//! (MPTR) and the namespace's metadata store, and protection information is
//! generated (PRACT) or checked (PRCHK) block by block.
//!
//! A write's metadata is checked (or generated) and stored before its data goes to
//! the backend, so a block whose protection information is wrong never lands; a
//! read's data and metadata are checked when the data is back, before the host
//! hears of it. With PRACT and metadata that is only the protection information
//! (its tuple), nothing moves through MPTR: the controller inserts it on writes and
//! strips it on reads.

use block_backend::{DataBuf, Op, Segment, SegmentCursor, SegmentError};
use nvme_spec::command::Psdt;
use nvme_spec::nvm::ReadWrite;
use nvme_spec::opcode::nvm as op;
use nvme_spec::pi::{prinfo, Guard, PiLayout, PiTags, PiType};
use nvme_spec::Sqe;

use super::{request, Started};
use crate::dptr::{sgl_segments, Direction};
use crate::engine::{Finish, InFlight, Io};
use crate::error::{CmdResult, CommandError};
use crate::metadata::{each_block_crc, CompareWith, Complemented, MetaRead};
use crate::namespace::{FormatState, Namespace};
use crate::stats::Count;

/// A command's protection information fields, as they apply to `ns` now.
struct Prot {
    pi: Option<PiLayout>,
    pract: bool,
    prchk: u8,
    tags: PiTags,
}

impl Prot {
    fn of(format: FormatState, rw: &ReadWrite<'_>, prinfo_bits: u8) -> Prot {
        let pi = format.protection();
        // Without protection information the field means nothing.
        let bits = if pi.is_some() { prinfo_bits } else { 0 };
        Prot {
            pi,
            pract: bits & prinfo::PRACT != 0,
            prchk: bits & prinfo::PRCHK_MASK,
            tags: command_tags(pi, rw),
        }
    }

    /// Whether the metadata moves through MPTR: not when PRACT inserts or strips
    /// metadata that is only the protection information.
    fn moved(&self) -> bool {
        !(self.pract && self.pi.is_some_and(|l| l.ms == l.size()))
    }

    /// Type 1's reference tag is the LBA's low 32 (48) bits: a command whose initial
    /// reference tag says otherwise, and asks for it to be checked, is refused.
    fn check_initial_ref(&self, slba: u64) -> CmdResult<()> {
        let Some(l) = self.pi.filter(|l| l.ty == PiType::Type1) else { return Ok(()) };
        if self.prchk & prinfo::PRCHK_REF != 0 && self.tags.ref_tag != l.lba_ref_tag(slba) {
            return Err(CommandError::InvalidProtection("type 1: the initial reference tag is not the LBA"));
        }
        Ok(())
    }
}

/// A block of zeroes of the largest LBA format's size (4 KiB), whose guard Write
/// Zeroes with PRACT generates.
static ZERO_BLOCK: [u8; 4096] = [0; 4096];
const _: () = {
    let mut i = 0;
    while i < crate::namespace::LBA_FORMATS.len() {
        assert!(1usize << crate::namespace::LBA_FORMATS[i].shift <= ZERO_BLOCK.len());
        i += 1;
    }
};

/// A command's tags (Dwords 14 and 15; Dword 3 too with the 64-bit guard).
pub(crate) fn command_tags(pi: Option<PiLayout>, rw: &ReadWrite<'_>) -> PiTags {
    let guard = pi.map_or(Guard::Crc16, |l| l.guard);
    PiTags {
        ref_tag: guard.command_ref_tag(rw.eilbrt(), rw.0.cdw3.get()),
        app_tag: rw.elbat(),
        app_mask: rw.elbatm(),
    }
}

impl Io {
    /// Read, Write, Verify, Write Zeroes (or with extended LBAs Compare) of `nlb`
    /// blocks at `slba` of namespace `ns` in `format` (read once for the command,
    /// which the range was checked in), a format with metadata.
    pub(crate) fn read_write_meta(
        &mut self,
        sqid: u16,
        sqe: &Sqe,
        ns: &Namespace,
        format: FormatState,
    ) -> CmdResult<Started> {
        let rw = ReadWrite(sqe);
        let (slba, nlb) = (rw.slba(), rw.nlb() as u64);
        let opcode = sqe.opcode();
        let p = Prot::of(format, &rw, rw.prinfo());
        // The protection information's bytes are kept complemented (metadata.rs).
        let flip = p.pi.map(Complemented::of);
        let (shift, ms) = (format.def().shift as u32, format.def().ms as u64);
        let store = ns.meta.as_ref().expect("a format with metadata has a store");
        let (offset, len) = (slba << shift, nlb << shift);
        let (moff, mlen) = (slba * ms, (nlb * ms) as usize);
        // Extended LBAs: the data pointer holds each block's data then its metadata
        // (the data alone when PRACT inserts or strips metadata that is only PI).
        let blocks = Blocks { nlb, shift, ms, inline: format.extended && p.moved() };
        let xfer = blocks.xfer();
        if opcode != op::WRITE_ZEROES && xfer > self.settings().mdts_bytes() {
            return Err(CommandError::TooLarge(xfer));
        }
        p.check_initial_ref(slba)?;
        // The host's metadata buffer, for the commands that move metadata.
        let mptr = if matches!(opcode, op::READ | op::WRITE | op::COMPARE) && p.moved() && !format.extended {
            let dir = if opcode == op::READ { Direction::ToHost } else { Direction::FromHost };
            Some(self.metadata_segments(sqe, mlen as u64, dir)?)
        } else {
            None
        };
        let meta_err = |write| move |e: std::io::Error| CommandError::Backend { write, source: e.into() };
        let fua = rw.fua() || !self.settings().write_cache();
        match opcode {
            op::WRITE => {
                let (data, inline_meta) = self.command_data(sqe, Direction::FromHost, blocks)?;
                let from = inline_meta.as_deref().or(mptr.as_deref());
                let stored = self.write_metadata(&p, from, &data, blocks).and_then(|meta| {
                    store.write(moff, &meta, flip).map_err(meta_err(true))?;
                    if fua {
                        store.sync().map_err(meta_err(true))?;
                    }
                    Ok(())
                });
                if let Err(e) = stored {
                    self.release_data(data, false);
                    return Err(e);
                }
                self.place_write(ns, sqe, nlb);
                self.count(Count::BytesWritten, len);
                self.count(Count::WriteCommands, 1);
                Ok(self.submit_one(
                    sqid,
                    sqe,
                    slba,
                    request(Op::Write { fua }, offset, len, data),
                    Finish::Plain,
                ))
            }
            op::READ | op::VERIFY => {
                let mut meta = vec![0u8; mlen];
                store.read(moff, &mut meta, flip).map_err(meta_err(false))?;
                let mut job = MetaRead {
                    meta,
                    block: 1 << shift,
                    ms: ms as usize,
                    pi: p.pi,
                    prchk: p.prchk,
                    tags: p.tags,
                    to: mptr,
                    compare: None,
                };
                let data = if opcode == op::READ {
                    let (data, inline_meta) = self.command_data(sqe, Direction::ToHost, blocks)?;
                    if inline_meta.is_some() {
                        job.to = inline_meta;
                    }
                    self.count(Count::BytesRead, len);
                    self.count(Count::ReadCommands, 1);
                    data
                } else {
                    DataBuf::Host(self.host_buffer(len)?)
                };
                let finish = Finish::Meta(Box::new(job));
                Ok(self.submit_one(sqid, sqe, slba, request(Op::Read, offset, len, data), finish))
            }
            op::COMPARE => {
                // The stored blocks are checked as PRCHK asks (against the command's
                // tags), then their data and their metadata but for its protection
                // information compared with the host's. Nothing is inserted or
                // stripped: PRACT is refused, as QEMU refuses it.
                if p.pi.is_some() && p.pract {
                    return Err(CommandError::InvalidProtection("Compare with PRACT"));
                }
                let (data, inline_meta) = self.command_data(sqe, Direction::FromHost, blocks)?;
                let DataBuf::Guest(segs) = data else { unreachable!("guest segments") };
                let host_meta = inline_meta.or(mptr).expect("inline or at MPTR: metadata moves");
                let mut meta = vec![0u8; mlen];
                let buf = store
                    .read(moff, &mut meta, flip)
                    .map_err(meta_err(false))
                    .and_then(|()| self.host_buffer(len));
                let buf = match buf {
                    Ok(b) => b,
                    Err(e) => {
                        self.release_data(DataBuf::Guest(segs), false);
                        return Err(e);
                    }
                };
                let job = MetaRead {
                    meta,
                    block: 1 << shift,
                    ms: ms as usize,
                    pi: p.pi,
                    prchk: p.prchk,
                    tags: p.tags,
                    to: None,
                    compare: Some(CompareWith { data: segs, meta: host_meta }),
                };
                let finish = Finish::Meta(Box::new(job));
                Ok(self.submit_one(
                    sqid,
                    sqe,
                    slba,
                    request(Op::Read, offset, len, DataBuf::Host(buf)),
                    finish,
                ))
            }
            op::WRITE_ZEROES => {
                if p.prchk != 0 {
                    return Err(CommandError::InvalidProtection("Write Zeroes checks nothing"));
                }
                match p.pi.filter(|_| p.pract) {
                    // Generated for blocks of zeroes.
                    Some(l) => {
                        let zeroes = l.data_crc(&ZERO_BLOCK[..1 << shift]);
                        let mut meta = vec![0u8; mlen];
                        for (i, m) in meta.chunks_mut(l.ms).enumerate() {
                            l.generate(zeroes, p.tags, i as u32, m);
                        }
                        store.write(moff, &meta, flip).map_err(meta_err(true))?;
                    }
                    // Deallocated: never written; else zeroes, as the data.
                    None if rw.deac() => store.clear(moff, mlen as u64).map_err(meta_err(true))?,
                    None => store.write(moff, &vec![0u8; mlen], flip).map_err(meta_err(true))?,
                }
                if fua {
                    store.sync().map_err(meta_err(true))?;
                }
                let op = Op::WriteZeroes { deallocate: rw.deac() };
                self.place_write(ns, sqe, nlb);
                Ok(self.submit_ranges(
                    InFlight::new(sqid, sqe, slba, op, Finish::Plain),
                    ns,
                    &[(offset, len)],
                ))
            }
            _ => unreachable!("dispatched by opcode"),
        }
    }

    /// The guest segments of a command's data, as `blocks` lie there; with extended
    /// LBAs (`inline`), split into the blocks' data and their metadata (each block's
    /// `2^shift` bytes, then its `ms`).
    fn command_data(
        &mut self,
        sqe: &Sqe,
        dir: Direction,
        blocks: Blocks,
    ) -> CmdResult<(DataBuf, Option<Vec<Segment>>)> {
        let Blocks { nlb, shift, ms, inline } = blocks;
        let xfer = blocks.xfer();
        let segs = self.data_segments(sqe, xfer, dir)?;
        if !inline {
            return Ok((DataBuf::Guest(segs), None));
        }
        let mut data = self.work.seg_pool.pop().unwrap_or_default();
        let mut meta = Vec::new();
        let split = (|| {
            let mut cur = SegmentCursor::for_transfer(&segs, xfer)?;
            for _ in 0..nlb {
                data.extend(cur.pieces(1 << shift).map(|(_, p)| p));
                cur.advance(1 << shift)?;
                meta.extend(cur.pieces(ms).map(|(_, p)| p));
                cur.advance(ms)?;
            }
            Ok::<(), SegmentError>(())
        })();
        self.release_data(DataBuf::Guest(segs), false);
        match split {
            Ok(()) => Ok((DataBuf::Guest(data), Some(meta))),
            Err(e) => {
                self.release_data(DataBuf::Guest(data), false);
                Err(e.into())
            }
        }
    }

    /// The guest memory of a command's `mlen` bytes of metadata: the buffer at MPTR
    /// (dword aligned), or with PSDT 10b the SGL descriptor at MPTR (qword aligned:
    /// a Data Block, or a Segment or Last Segment of them), checked to be in guest
    /// memory.
    fn metadata_segments(&self, sqe: &Sqe, mlen: u64, dir: Direction) -> CmdResult<Vec<Segment>> {
        let gpa = sqe.mptr.get();
        let mut segs = Vec::new();
        if sqe.psdt() == Psdt::SglMptrSgl {
            if gpa & 7 != 0 {
                return Err(CommandError::InvalidField("MPTR (an SGL descriptor) is not qword aligned"));
            }
            let first = self.mem.read_obj::<nvme_spec::sgl::SglDescriptor>(gpa)?;
            sgl_segments(&self.mem, first, mlen, dir, &mut segs)?;
        } else {
            if gpa & 3 != 0 {
                return Err(CommandError::InvalidField("MPTR is not dword aligned"));
            }
            segs.push(Segment::Guest { gpa, len: mlen });
        }
        super::in_guest_memory(&self.mem, &segs)?;
        Ok(segs)
    }

    /// A write's metadata: the host's (from `mptr`), its protection information
    /// generated (PRACT) or checked (PRCHK) against the data.
    fn write_metadata(
        &self,
        p: &Prot,
        from: Option<&[Segment]>,
        data: &DataBuf,
        blocks: Blocks,
    ) -> CmdResult<Vec<u8>> {
        let Blocks { nlb, shift, ms, .. } = blocks;
        let (len, block, mlen) = (nlb << shift, 1usize << shift, (nlb * ms) as usize);
        let mut meta = vec![0u8; mlen];
        if let Some(segs) = from {
            SegmentCursor::for_transfer(segs, mlen as u64)?.read_into(&self.mem, &mut meta)?;
        }
        let Some(l) = p.pi.filter(|_| p.pract || p.prchk != 0) else { return Ok(meta) };
        let r = each_block_crc(&self.mem, data, len, block, l.guard, |i, crc| {
            let m = &mut meta[i as usize * l.ms..][..l.ms];
            if p.pract {
                l.generate(crc, p.tags, i, m);
                Ok(())
            } else {
                l.check(p.prchk, crc, m, p.tags, i)
            }
        });
        match r {
            Ok(Ok(())) => Ok(meta),
            Ok(Err(e)) => Err(CommandError::Protection(e)),
            Err(e) => Err(e.into()),
        }
    }
}

/// How a command's blocks lie in its data pointer: `nlb` blocks of `2^shift` bytes,
/// each with `ms` bytes of metadata, which with extended LBAs (`inline`) follow the
/// block there.
#[derive(Clone, Copy, Debug)]
struct Blocks {
    nlb: u64,
    shift: u32,
    ms: u64,
    inline: bool,
}

impl Blocks {
    /// The bytes the data pointer holds.
    fn xfer(self) -> u64 {
        match self.inline {
            true => self.nlb * ((1 << self.shift) + self.ms),
            false => self.nlb << self.shift,
        }
    }
}
