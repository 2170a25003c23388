//! NVM I/O commands (NVM §3.2) and their completions.
#![forbid(unsafe_code)]

use nvme_spec::nvm::{
    DatasetManagementCmd, DsmRange, FlushCmd, ReadWriteCmd, WriteZeroesCmd, DSM_MAX_RANGES,
};
use nvme_spec::opcode::{nvm as op, NvmOpcode};
use nvme_spec::{Sqe, Status};
use zerocopy::IntoBytes;

use crate::dma::{DmaBuf, DmaPool};
use crate::error::{DriverError, Result};
use crate::identify::NsGeometry;
use crate::prp;

/// A range of logical blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LbaRange {
    pub slba: u64,
    /// Number of logical blocks (not 0's based).
    pub nlb: u32,
}

/// An I/O command. Data buffers move into the command and come back in its
/// [`Completion`], so the host cannot touch them while the device does.
#[derive(Debug)]
pub enum IoCommand {
    /// Read `nlb` blocks at `slba` into the first `nlb * lba_size` bytes of `buf`.
    Read { nsid: u32, slba: u64, nlb: u32, buf: DmaBuf },
    /// Write `nlb` blocks at `slba` from `buf`; `fua`: Force Unit Access.
    Write { nsid: u32, slba: u64, nlb: u32, buf: DmaBuf, fua: bool },
    /// Flush the volatile write cache of `nsid` (0xffff_ffff: all namespaces).
    Flush { nsid: u32 },
    /// Write Zeroes; `deallocate` sets DEAC (the blocks may be deallocated).
    WriteZeroes { nsid: u32, slba: u64, nlb: u32, deallocate: bool },
    /// Dataset Management with Attribute – Deallocate over up to 256 ranges.
    Deallocate { nsid: u32, ranges: Vec<LbaRange> },
}

impl IoCommand {
    pub fn opcode(&self) -> u8 {
        match self {
            IoCommand::Read { .. } => op::READ,
            IoCommand::Write { .. } => op::WRITE,
            IoCommand::Flush { .. } => op::FLUSH,
            IoCommand::WriteZeroes { .. } => op::WRITE_ZEROES,
            IoCommand::Deallocate { .. } => op::DATASET_MANAGEMENT,
        }
    }
}

/// A human name for an I/O opcode (for errors).
pub fn opcode_name(opcode: u8) -> &'static str {
    NvmOpcode(opcode).name().unwrap_or("command")
}

/// A finished command.
#[derive(Debug)]
pub struct Completion {
    pub cid: u16,
    pub opcode: u8,
    pub status: Status,
    /// Command specific dword 0.
    pub dw0: u32,
    /// The data buffer the command carried, back to its owner.
    pub buf: Option<DmaBuf>,
}

impl Completion {
    /// The completion as a result: the data buffer, or the NVMe status as an error.
    pub fn into_result(self) -> Result<Option<DmaBuf>> {
        if self.status.is_success() {
            Ok(self.buf)
        } else {
            Err(DriverError::Nvme { op: opcode_name(self.opcode), status: self.status })
        }
    }
}

/// A command ready for the SQ: its entry and the buffers to hold until completion.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub sqe: Sqe,
    pub data: Option<DmaBuf>,
    /// A PRP list or range list the device reads.
    pub aux: Option<DmaBuf>,
}

fn check_range(ns: &NsGeometry, slba: u64, nlb: u32) -> Result<()> {
    if nlb == 0 || nlb > 65536 {
        return Err(DriverError::Invalid(format!("{nlb} blocks (1..=65536 per command)")));
    }
    if slba.checked_add(nlb as u64).is_none_or(|e| e > ns.blocks) {
        return Err(DriverError::Invalid(format!(
            "blocks {slba}+{nlb} beyond namespace {} ({} blocks)",
            ns.nsid, ns.blocks
        )));
    }
    Ok(())
}

/// Builds the SQE for `cmd`, with PRPs for its data (list pages from `pool`).
pub(crate) fn prepare(
    cmd: IoCommand,
    ns: impl Fn(u32) -> Option<NsGeometry>,
    mdts: Option<u64>,
    pool: &DmaPool,
) -> Result<Prepared> {
    let geo = |nsid| ns(nsid).ok_or_else(|| DriverError::Invalid(format!("no namespace {nsid}")));
    let data_cmd = |opcode, nsid, slba, nlb, buf: DmaBuf, fua| -> Result<Prepared> {
        let g = geo(nsid)?;
        check_range(&g, slba, nlb)?;
        let len = nlb as u64 * g.lba_size;
        if len > buf.len() {
            return Err(DriverError::Invalid(format!(
                "{len}-byte transfer into a {}-byte buffer",
                buf.len()
            )));
        }
        if mdts.is_some_and(|m| len > m) {
            return Err(DriverError::Invalid(format!("{len}-byte transfer exceeds MDTS ({mdts:?} bytes)")));
        }
        let p = prp::build(pool, buf.iova(), len)?;
        let mut sqe = ReadWriteCmd { nsid, slba, nlb_z: (nlb - 1) as u16, fua, lr: false }.to_sqe(opcode);
        sqe.set_prps(p.prp1, p.prp2);
        Ok(Prepared { sqe, data: Some(buf), aux: p.list })
    };
    match cmd {
        IoCommand::Read { nsid, slba, nlb, buf } => data_cmd(op::READ, nsid, slba, nlb, buf, false),
        IoCommand::Write { nsid, slba, nlb, buf, fua } => data_cmd(op::WRITE, nsid, slba, nlb, buf, fua),
        IoCommand::Flush { nsid } => Ok(Prepared { sqe: FlushCmd { nsid }.to_sqe(), data: None, aux: None }),
        IoCommand::WriteZeroes { nsid, slba, nlb, deallocate } => {
            check_range(&geo(nsid)?, slba, nlb)?;
            let sqe =
                WriteZeroesCmd { nsid, slba, nlb_z: (nlb - 1) as u16, deac: deallocate, fua: false }.to_sqe();
            Ok(Prepared { sqe, data: None, aux: None })
        }
        IoCommand::Deallocate { nsid, ranges } => {
            let g = geo(nsid)?;
            if ranges.is_empty() || ranges.len() > DSM_MAX_RANGES {
                return Err(DriverError::Invalid(format!("{} DSM ranges (1..=256)", ranges.len())));
            }
            let mut bytes = Vec::with_capacity(ranges.len() * 16);
            for r in &ranges {
                check_range(&g, r.slba, r.nlb)?;
                bytes.extend_from_slice(DsmRange::new(r.slba, r.nlb).as_bytes());
            }
            let list = pool.alloc(bytes.len() as u64)?;
            list.write_at(0, &bytes)?;
            let nr_z = (ranges.len() - 1) as u8;
            let mut sqe = DatasetManagementCmd { nsid, nr_z, ad: true, ..Default::default() }.to_sqe();
            sqe.set_prps(list.iova(), 0);
            Ok(Prepared { sqe, data: None, aux: Some(list) })
        }
    }
}
