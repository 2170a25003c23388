//! Copy (NVM §3.3.1), source range descriptor format 0h, or 1h where the format's
//! protection information has the 64-bit guard (as QEMU, and as the format's ELBAF
//! says: format 0h there, or 1h elsewhere, is an Invalid Format): the source ranges are
//! copied one after another to consecutive LBAs from SDLBA on, within the namespace,
//! through its backend: a read of a range into a host buffer, then its write, then
//! the next range. One buffer, of the largest range, counted against the engine's
//! host buffer budget. On a failure Dword 0 of the completion names the first range
//! not copied (the ranges before it are on the medium). With protection information
//! and PRINFOR or PRINFOW asking for something, each range's blocks are checked and
//! their destination's protection information made as its data passes (`copy_pi`).

use std::sync::Arc;

use block_backend::{DataBuf, Op, Request};
use nvme_spec::nvm::{Copy, CopyRange, CopyRangeF1};
use nvme_spec::pi::{prinfo, Guard, PiTags};
use nvme_spec::Sqe;
use nvme_spec::Status;
use zerocopy::FromBytes;

use super::Started;
use crate::copy_pi::{initial_ref_fits, CopyProtection};
use crate::engine::{CopyJob, Finish, InFlight, Io};
use crate::error::{CmdResult, CommandError};
use crate::namespace::Namespace;

/// The largest source range, in bytes: the host buffer one Copy holds.
pub(crate) const COPY_RANGE_MAX_BYTES: u64 = 128 << 10;
/// The most source ranges one Copy carries (MSRC is this, 0's based).
pub(crate) const COPY_MAX_RANGES: usize = 128;
/// The most bytes one Copy moves in all (MCL), which bounds the work one command
/// makes the engine do.
pub(crate) const COPY_MAX_BYTES: u64 = 8 << 20;

/// What Identify Namespace advertises for a namespace of `1 << shift`-byte LBAs,
/// and what a Copy on it is held to: (MSSRL, MCL, MSRC 0's based).
pub(crate) fn copy_limits(shift: u32) -> (u16, u32, u8) {
    let mssrl = (COPY_RANGE_MAX_BYTES >> shift).min(u16::MAX as u64) as u16;
    let mcl = (COPY_MAX_BYTES >> shift).min(u32::MAX as u64) as u32;
    (mssrl, mcl, (COPY_MAX_RANGES - 1) as u8)
}

impl Io {
    pub(crate) fn copy(&mut self, sqid: u16, sqe: &Sqe) -> CmdResult<Started> {
        let nsid = sqe.nsid.get();
        let ns = self.namespace(nsid)?;
        let (nsze, shift) = (ns.nsze(), ns.lba_shift());
        let cmd = Copy(sqe);
        // The descriptor format goes with the format's guard (ELBAF PIF).
        let guard = ns.format_def().guard;
        let entry_size = match (cmd.desfmt(), guard) {
            (0, Guard::Crc16) => size_of::<CopyRange>(),
            (1, Guard::Crc64) => size_of::<CopyRangeF1>(),
            (0 | 1, _) => return Err(CommandError::Status(Status::INVALID_FORMAT.with_dnr())),
            _ => return Err(CommandError::InvalidField("Copy descriptor format (0h and 1h are supported)")),
        };
        let (mssrl, mcl, msrc_z) = copy_limits(shift);
        if cmd.ranges() > msrc_z as usize + 1 {
            return Err(CommandError::CopyLimit("more source ranges than MSRC allows"));
        }
        let raw = self.read_command_data(sqe, (cmd.ranges() * entry_size) as u64)?;
        let entries = source_ranges(&raw, guard);
        let mut ranges = Vec::with_capacity(entries.len());
        let mut total = 0u64;
        for r in &entries {
            let (slba, nlb) = (r.slba, r.nlb);
            if nlb > mssrl as u64 {
                return Err(CommandError::CopyLimit("a source range longer than MSSRL"));
            }
            if slba.checked_add(nlb).is_none_or(|end| end > nsze) {
                return Err(CommandError::LbaOutOfRange { slba, nlb });
            }
            total += nlb;
            ranges.push((slba << shift, nlb << shift));
        }
        if total > mcl as u64 {
            return Err(CommandError::CopyLimit("more blocks in all than MCL allows"));
        }
        let sdlba = cmd.sdlba();
        if sdlba.checked_add(total).is_none_or(|end| end > nsze) {
            return Err(CommandError::LbaOutOfRange { slba: sdlba, nlb: total });
        }
        // Inside the storage (copy_file_range) where the backend can and nothing has
        // to look at the data on the way: no protection information to check, no
        // zone, and no range overlapping its own destination.
        let offload = ns.info.copy
            && ns.zones.is_none()
            && (ns.protection().is_none() || cmd.prinfo() == 0)
            && !overlaps_destination(&ranges, sdlba << shift);
        let largest = ranges.iter().map(|&(_, l)| l).max().expect("at least one range");
        let mut buf = if offload { Vec::new() } else { self.host_buffer(largest)? };
        // Last of the checks that can refuse the command (a zoned namespace has no
        // metadata): nothing is moved for a Copy refused. With protection
        // information asked for, the metadata moves range by range, checked.
        let pi = copy_protection(&ns, &cmd, &entries, sdlba)?;
        if pi.is_none() {
            copy_metadata(&ns, &entries, sdlba)?;
        }
        let (offset, first) = ranges[0];
        buf.truncate(first as usize);
        let fua = cmd.fua() || !self.settings().write_cache();
        let mut job = CopyJob::new(ranges, sdlba << shift, fua);
        job.pi = pi;
        job.offload = offload;
        // On a zoned namespace the destination is a write at its zone's pointer,
        // and no source may be in an offline zone.
        if let Some(zones) = ns.zones.as_ref() {
            for &(offset, len) in job.ranges() {
                zones.check_read(offset, len)?;
            }
            job.zone = Some(zones.start_write(sdlba << shift, total << shift, false, fua)?);
        }
        // The destination's writes go where its Data Placement directive says
        // (Copy has DTYPE and DSPEC where Write has them).
        self.place_write(&ns, sqe, total);
        let (op, data) = match offload {
            true => (Op::Copy { fua }, DataBuf::Within(offset)),
            false => (Op::Read, DataBuf::Host(buf)),
        };
        let mut f = InFlight::new(sqid, sqe, sdlba, op, Finish::Copy(Box::new(job)));
        f.host_bytes = if offload { 0 } else { largest };
        let tag = self.track(f);
        let at = if offload { sdlba << shift } else { offset };
        self.backend_submit(nsid, Request { tag, op, offset: at, len: first, data });
        Ok(Started::Pending)
    }
}

/// One source range of either descriptor format: its blocks and the tags its
/// protection information is expected to have (the reference tag of 32 bits in
/// format 0h, of the format's 48 in 1h).
#[derive(Clone, Copy, Debug)]
struct SourceRange {
    slba: u64,
    nlb: u64,
    tags: PiTags,
}

/// The source range entries in `raw`, whose format is the one for `guard`.
fn source_ranges(raw: &[u8], guard: Guard) -> Vec<SourceRange> {
    match guard {
        Guard::Crc16 => <[CopyRange]>::ref_from_bytes(raw)
            .expect("a multiple of 32 bytes")
            .iter()
            .map(|r| SourceRange {
                slba: r.slba.get(),
                nlb: r.nlb_z.get() as u64 + 1,
                tags: PiTags {
                    ref_tag: r.eilbrt.get() as u64,
                    app_tag: r.elbat.get(),
                    app_mask: r.elbatm.get(),
                },
            })
            .collect(),
        Guard::Crc64 => <[CopyRangeF1]>::ref_from_bytes(raw)
            .expect("a multiple of 40 bytes")
            .iter()
            .map(|r| SourceRange {
                slba: r.slba.get(),
                nlb: r.nlb_z.get() as u64 + 1,
                tags: PiTags {
                    ref_tag: r.eilbrt() & guard.ref_mask(),
                    app_tag: r.elbat.get(),
                    app_mask: r.elbatm.get(),
                },
            })
            .collect(),
    }
}

/// True if a range (byte offset, length) overlaps where it goes, the ranges going
/// one after another from byte `dest`: copy_file_range refuses such a copy.
fn overlaps_destination(ranges: &[(u64, u64)], dest: u64) -> bool {
    let mut to = dest;
    ranges.iter().any(|&(from, len)| {
        let overlap = from < to + len && to < from + len;
        to += len;
        overlap
    })
}

/// A Copy on a namespace with protection information whose PRINFOR or PRINFOW
/// asks for something: what each range then does (`copy_pi`), or why the Copy is
/// refused. None: the metadata moves as stored.
fn copy_protection(
    ns: &Arc<Namespace>,
    cmd: &Copy<'_>,
    entries: &[SourceRange],
    sdlba: u64,
) -> CmdResult<Option<Box<CopyProtection>>> {
    let Some(layout) = ns.protection().filter(|_| cmd.prinfo() != 0) else { return Ok(None) };
    let (read, write) = CopyProtection::fields(cmd.prinfo());
    // Both sides strip and insert, or both pass the protection information
    // through: one of each is not a Copy the host can mean.
    if (read ^ write) & prinfo::PRACT != 0 {
        return Err(CommandError::InvalidField("PRACT differs between PRINFOR and PRINFOW"));
    }
    let sources: Vec<(u64, PiTags)> = entries.iter().map(|r| (r.slba, r.tags)).collect();
    let read_checks = read & prinfo::PRCHK_MASK;
    if !sources.iter().all(|&(slba, t)| initial_ref_fits(layout, read_checks, slba, t)) {
        return Err(CommandError::InvalidProtection("a source range's EILBRT is not its SLBA (type 1)"));
    }
    let rw = nvme_spec::nvm::ReadWrite(cmd.0);
    let dest = (sdlba, super::meta::command_tags(Some(layout), &rw));
    let (write_pract, write_checks) = (write & prinfo::PRACT != 0, write & prinfo::PRCHK_MASK);
    if !write_pract && !initial_ref_fits(layout, write_checks, sdlba, dest.1) {
        return Err(CommandError::InvalidProtection("ILBRT is not SDLBA (type 1)"));
    }
    let block = 1usize << ns.lba_shift();
    Ok(Some(Box::new(CopyProtection {
        ns: ns.clone(),
        layout,
        block,
        read_checks,
        write_pract,
        write_checks,
        sources,
        dest,
    })))
}

/// A Copy on a namespace with metadata, nothing asked of its protection
/// information: each source block's metadata goes to its destination block, as
/// it is (before the data: a Copy that fails part way leaves the destination's
/// metadata ahead of its data, as its data is indeterminate then anyway).
fn copy_metadata(ns: &Namespace, entries: &[SourceRange], sdlba: u64) -> CmdResult<()> {
    let ms = ns.meta_size() as u64;
    let Some(store) = ns.meta.as_ref().filter(|_| ms > 0) else { return Ok(()) };
    let io = |e: std::io::Error| CommandError::Backend { write: true, source: e.into() };
    let mut to = sdlba * ms;
    for r in entries {
        let mut meta = vec![0u8; (r.nlb * ms) as usize];
        // As stored: the same layout at both ends.
        store.read(r.slba * ms, &mut meta, None).map_err(io)?;
        store.write(to, &meta, None).map_err(io)?;
        to += meta.len() as u64;
    }
    Ok(())
}
