//! I/O Management Receive and Send (NVM §3.2.4, §3.2.5): a namespace's reclaim
//! unit handle status and update under Flexible Data Placement; and what a write
//! charges to its reclaim unit.

use nvme_spec::fdp::{mo, IoManagement};
use nvme_spec::nvm::ReadWrite;
use nvme_spec::{Sqe, Status};

use super::Started;
use crate::engine::Io;
use crate::error::{CmdResult, CommandError};
use crate::fdp::Placement;
use crate::namespace::Namespace;

/// The most placement identifiers one update names: every handle once.
const MAX_UPDATE_PIDS: usize = crate::config::MAX_RUHS as usize;

impl Io {
    /// I/O Management Receive: with MO 1, a descriptor per placement handle of the
    /// namespace (none for one without, a zoned namespace's); MO 0 transfers nothing.
    pub(crate) fn io_mgmt_recv(&mut self, sqe: &Sqe) -> CmdResult<Started> {
        let ns = self.namespace(sqe.nsid.get())?;
        let cmd = IoManagement(sqe);
        match cmd.mo() {
            0 => return Ok(Started::Done(Status::SUCCESS)),
            mo::RUH if self.ctx.caps.fdp => {}
            mo::RUH => return Ok(Started::Done(Status::FDP_DISABLED.with_dnr())),
            _ => return Err(CommandError::InvalidField("reserved Management Operation")),
        }
        let len = cmd.receive_len();
        if len > self.settings().mdts_bytes() {
            return Err(CommandError::TooLarge(len));
        }
        let f = ns.format_def();
        let mut data = match &ns.placement {
            Some(fdp) => fdp.status(f.shift as u32, f.ms),
            None => vec![0u8; 16],
        };
        data.resize(len as usize, 0);
        self.write_command_data(sqe, &data)?;
        Ok(Started::Done(Status::SUCCESS))
    }

    /// I/O Management Send: with MO 1, Reclaim Unit Handle Update of the placement
    /// identifiers in the data (MOS + 1 of them); all or none.
    pub(crate) fn io_mgmt_send(&mut self, sqe: &Sqe) -> CmdResult<Started> {
        let ns = self.namespace(sqe.nsid.get())?;
        let cmd = IoManagement(sqe);
        match cmd.mo() {
            0 => return Ok(Started::Done(Status::SUCCESS)),
            mo::RUH => {}
            _ => return Err(CommandError::InvalidField("reserved Management Operation")),
        }
        let Some(fdp) = &ns.placement else {
            if self.ctx.caps.fdp {
                return Err(CommandError::InvalidField("the namespace has no placement handles"));
            }
            return Ok(Started::Done(Status::FDP_DISABLED.with_dnr()));
        };
        let n = cmd.mos() as usize + 1;
        if n > MAX_UPDATE_PIDS {
            return Err(CommandError::InvalidField("more placement identifiers than handles"));
        }
        let raw = self.read_command_data(sqe, 2 * n as u64)?;
        let pids: Vec<u16> = raw.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
        if fdp.check_pids(&pids).is_err() {
            return Err(CommandError::InvalidField("a placement identifier the namespace does not have"));
        }
        fdp.update(ns.nsid, &pids, self.ctx.clock.now_ns());
        Ok(Started::Done(Status::SUCCESS))
    }

    /// Charges a write of `nlb` blocks on `ns` (data and metadata) to the reclaim
    /// unit its Data Placement directive names, if the namespace places writes.
    /// Write, Write Zeroes and Copy carry DTYPE and DSPEC in the same bits.
    pub(crate) fn place_write(&self, ns: &Namespace, sqe: &Sqe, nlb: u64) {
        if let Some(fdp) = &ns.placement {
            let f = ns.format_def();
            let bytes = nlb * ((1u64 << f.shift) + f.ms as u64);
            let rw = ReadWrite(sqe);
            fdp.write(ns.nsid, Placement::of(rw.dtype(), rw.dspec()), bytes, || self.ctx.clock.now_ns());
        }
    }
}
