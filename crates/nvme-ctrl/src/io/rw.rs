//! Read, Write, Compare, Verify and Write Zeroes (NVM §3.2.6, §3.2.8, §3.2.1,
//! §3.2.7, §3.2.9): the commands addressed by SLBA and NLB.

use block_backend::{DataBuf, Op};
use nvme_spec::nvm::ReadWrite;
use nvme_spec::opcode::{nvm as op, zns as zop};
use nvme_spec::Sqe;

use super::{request, Started};
use crate::dptr::Direction;
use crate::engine::{Finish, InFlight, Io};
use crate::error::{CmdResult, CommandError};
use crate::stats::Count;

impl Io {
    pub(crate) fn read_write(&mut self, sqid: u16, sqe: &Sqe) -> CmdResult<Started> {
        let nsid = sqe.nsid.get();
        // Its size and format, read in place (no reference taken per command), and
        // once: a Format NVM changing it meanwhile does not change it for this command.
        let (size, format, zoned, placed, reserved) = self.with_namespace(nsid, |ns| {
            let reserved = ns.reservations().is_some();
            (ns.size(), ns.format_state(), ns.zones.is_some(), ns.placement.is_some(), reserved)
        })?;
        let f = format.def();
        let (shift, ms) = (f.shift as u32, f.ms);
        let nsze = size >> shift;
        let rw = ReadWrite(sqe);
        let (slba, nlb) = (rw.slba(), rw.nlb() as u64);
        match slba.checked_add(nlb) {
            Some(end) if end <= nsze => {}
            _ => return Err(CommandError::LbaOutOfRange { slba, nlb }),
        }
        let (offset, len) = (slba << shift, nlb << shift);
        let opcode = sqe.opcode();
        // One test on the common path for the namespaces that are not plain.
        if zoned || ms != 0 || reserved || opcode == zop::ZONE_APPEND {
            if reserved && matches!(opcode, op::READ | op::WRITE) {
                // Those two skipped the reservation gate (`io/mod.rs`).
                self.with_namespace(nsid, |ns| super::resv::check(ns, opcode))??;
            }
            if ms != 0 && opcode != zop::ZONE_APPEND {
                // Metadata moves beside the data (a Compare compares it too).
                let ns = self.namespace(nsid)?;
                return self.read_write_meta(sqid, sqe, &ns, format);
            } else if zoned || opcode == zop::ZONE_APPEND {
                // A zoned namespace's writes take their zone's place; its reads go as
                // any other, but for offline zones. Zone Append exists only there.
                match opcode {
                    op::READ | op::COMPARE | op::VERIFY => self.zoned_check_read(nsid, offset, len)?,
                    _ => return self.zoned_write(sqid, sqe, shift),
                }
            }
        }
        // Write Zeroes moves no data; Verify reads into a host buffer; both are bounded
        // by their own limits (WZSL = 0: none; VSL = MDTS) rather than MDTS.
        if opcode != op::WRITE_ZEROES && len > self.settings().mdts_bytes() {
            return Err(CommandError::TooLarge(len));
        }
        let fua = rw.fua() || !self.settings().write_cache();
        let started = match opcode {
            op::READ => {
                let segs = self.data_segments(sqe, len, Direction::ToHost)?;
                self.count(Count::BytesRead, len);
                self.count(Count::ReadCommands, 1);
                self.submit_one(
                    sqid,
                    sqe,
                    slba,
                    request(Op::Read, offset, len, DataBuf::Guest(segs)),
                    Finish::Plain,
                )
            }
            op::WRITE => {
                let segs = self.data_segments(sqe, len, Direction::FromHost)?;
                if placed {
                    // Found above, in this command: the table does not change meanwhile.
                    let _ = self.with_namespace(nsid, |ns| self.place_write(ns, sqe, nlb));
                }
                self.count(Count::BytesWritten, len);
                self.count(Count::WriteCommands, 1);
                self.submit_one(
                    sqid,
                    sqe,
                    slba,
                    request(Op::Write { fua }, offset, len, DataBuf::Guest(segs)),
                    Finish::Plain,
                )
            }
            op::COMPARE => {
                let buf = DataBuf::Host(self.host_buffer(len)?);
                let segs = self.data_segments(sqe, len, Direction::FromHost)?;
                self.submit_one(sqid, sqe, slba, request(Op::Read, offset, len, buf), Finish::Compare(segs))
            }
            op::VERIFY => {
                // Verify checks the media can be read; the data goes nowhere.
                let buf = DataBuf::Host(self.host_buffer(len)?);
                self.submit_one(sqid, sqe, slba, request(Op::Read, offset, len, buf), Finish::Plain)
            }
            op::WRITE_ZEROES => {
                let op = Op::WriteZeroes { deallocate: rw.deac() };
                let ns = self.namespace(nsid)?;
                self.place_write(&ns, sqe, nlb);
                self.submit_ranges(InFlight::new(sqid, sqe, slba, op, Finish::Plain), &ns, &[(offset, len)])
            }
            _ => unreachable!("dispatched by opcode"),
        };
        Ok(started)
    }
}
