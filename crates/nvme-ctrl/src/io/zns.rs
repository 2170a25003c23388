//! The Zoned Namespace Command Set's I/O commands (ZNS §3.4): Zone Management Send
//! and Receive, Zone Append, and the zone rules a Write, Write Zeroes or Read on a
//! zoned namespace follows. The zones themselves are [`crate::zoned`].

use block_backend::{DataBuf, Op};
use nvme_spec::nvm::ReadWrite;
use nvme_spec::opcode::{nvm as op, zns as zop};
use nvme_spec::zns::{zra, zsa, ReportZonesHeader, ZoneMgmtRecv, ZoneMgmtSend, ZoneState};
use nvme_spec::{Sqe, Status};
use zerocopy::little_endian::U64;
use zerocopy::IntoBytes;

use super::{request, Started};
use crate::dptr::Direction;
use crate::engine::{Finish, InFlight, Io};
use crate::error::{CmdResult, CommandError};
use crate::namespace::Namespace;
use crate::stats::Count;
use crate::zoned::{ZoneAction, ZoneError, Zones};

impl From<ZoneError> for CommandError {
    fn from(e: ZoneError) -> Self {
        CommandError::Status(e.status())
    }
}

/// The zones of namespace `ns`, or Invalid Opcode: the command is one of the Zoned
/// Namespace Command Set, which a namespace of the NVM command set does not have.
fn zones_of(ns: &Namespace, opcode: u8) -> CmdResult<&Zones> {
    ns.zones.as_ref().ok_or(CommandError::InvalidOpcode(opcode))
}

impl Io {
    /// A Write, Write Zeroes or Zone Append on a zoned namespace (already within its
    /// size): at its zone's write pointer.
    pub(crate) fn zoned_write(&mut self, sqid: u16, sqe: &Sqe, shift: u32) -> CmdResult<Started> {
        let nsid = sqe.nsid.get();
        let ns = self.namespace(nsid)?;
        let zones = zones_of(&ns, sqe.opcode())?;
        let rw = ReadWrite(sqe);
        let (offset, len) = (rw.slba() << shift, (rw.nlb() as u64) << shift);
        let opcode = sqe.opcode();
        let append = opcode == zop::ZONE_APPEND;
        // Zone Append's own limit is ZASL, which is MDTS here.
        if opcode != op::WRITE_ZEROES && len > self.settings().mdts_bytes() {
            return Err(CommandError::TooLarge(len));
        }
        // The data pointer before the zone: a bad one must not take the zone's place.
        let data = match opcode {
            op::WRITE_ZEROES => DataBuf::None,
            _ => DataBuf::Guest(self.data_segments(sqe, len, Direction::FromHost)?),
        };
        let fua = rw.fua() || !self.settings().write_cache();
        let write = match zones.start_write(offset, len, append, fua) {
            Ok(w) => w,
            Err(e) => {
                // A host's zoned writes arriving out of order show here first: say
                // where the write was and where the zone's pointer stood.
                log_limit::limited_warn!(
                    target: "vnvme::guest",
                    nsid, slba = rw.slba(), nlb = rw.nlb(), append, error = %e,
                    "zoned write refused"
                );
                self.release_data(data, false);
                return Err(e.into());
            }
        };
        let op = match opcode {
            op::WRITE_ZEROES => Op::WriteZeroes { deallocate: false },
            _ => {
                self.count(Count::BytesWritten, len);
                self.count(Count::WriteCommands, 1);
                Op::Write { fua }
            }
        };
        let finish = Finish::Zoned { write, append };
        let slba = write.offset >> shift;
        if let Op::WriteZeroes { .. } = op {
            // Split at the backend's Write Zeroes limit, as on any namespace.
            return Ok(self.submit_ranges(
                InFlight::new(sqid, sqe, slba, op, finish),
                &ns,
                &[(write.offset, len)],
            ));
        }
        Ok(self.submit_one(sqid, sqe, slba, request(op, write.offset, len, data), finish))
    }

    /// Zone Management Send (ZNS §3.4.3): open, close, finish, reset or take offline
    /// one zone or (Select All) every zone the action applies to. A reset zone's
    /// written blocks are deallocated at the backend where it can.
    pub(crate) fn zone_mgmt_send(&mut self, sqid: u16, sqe: &Sqe) -> CmdResult<Started> {
        let ns = self.namespace(sqe.nsid.get())?;
        let zones = zones_of(&ns, sqe.opcode())?;
        let cmd = ZoneMgmtSend(sqe);
        let action = match cmd.zsa() {
            zsa::CLOSE => ZoneAction::Close,
            zsa::FINISH => ZoneAction::Finish,
            zsa::OPEN => ZoneAction::Open,
            zsa::RESET => ZoneAction::Reset,
            zsa::OFFLINE => ZoneAction::Offline,
            // ZDES is 0: there are no zone descriptor extensions to set.
            zsa::SET_DESCRIPTOR_EXTENSION => {
                return Err(CommandError::InvalidField("zone descriptor extensions are not supported"))
            }
            _ => return Err(CommandError::InvalidField("reserved Zone Send Action")),
        };
        let slba = cmd.slba();
        let shift = ns.lba_shift();
        if !cmd.select_all() && slba >= ns.nsze() {
            return Err(CommandError::LbaOutOfRange { slba, nlb: 1 });
        }
        let stale = zones.act(action, slba << shift, cmd.select_all())?;
        let dealloc = if ns.info.write_zeroes {
            Some(Op::WriteZeroes { deallocate: true })
        } else if ns.info.discard && ns.info.discard_zeroes {
            Some(Op::Discard)
        } else {
            None
        };
        match dealloc {
            Some(op) if !stale.is_empty() => {
                Ok(self.submit_ranges(InFlight::new(sqid, sqe, slba, op, Finish::Plain), &ns, &stale))
            }
            _ => Ok(Started::Done(Status::SUCCESS)),
        }
    }

    /// Zone Management Receive (ZNS §3.4.2): Report Zones, of all zones or those in
    /// one state, from the zone holding SLBA on; with Partial Report the header
    /// counts the descriptors returned.
    pub(crate) fn zone_mgmt_recv(&mut self, sqe: &Sqe) -> CmdResult<Started> {
        let ns = self.namespace(sqe.nsid.get())?;
        let zones = zones_of(&ns, sqe.opcode())?;
        let cmd = ZoneMgmtRecv(sqe);
        match cmd.zra() {
            zra::REPORT_ZONES => {}
            zra::EXTENDED_REPORT_ZONES => {
                return Err(CommandError::InvalidField("zone descriptor extensions are not supported"))
            }
            _ => return Err(CommandError::InvalidField("reserved Zone Receive Action")),
        }
        let filter = match cmd.zrasf() {
            0 => None,
            1 => Some(ZoneState::Empty),
            2 => Some(ZoneState::ImplicitlyOpened),
            3 => Some(ZoneState::ExplicitlyOpened),
            4 => Some(ZoneState::Closed),
            5 => Some(ZoneState::Full),
            6 => Some(ZoneState::ReadOnly),
            7 => Some(ZoneState::Offline),
            _ => return Err(CommandError::InvalidField("reserved Reporting Options")),
        };
        let (slba, len) = (cmd.slba(), cmd.buffer_len());
        if slba >= ns.nsze() {
            return Err(CommandError::LbaOutOfRange { slba, nlb: 1 });
        }
        if len > self.settings().mdts_bytes() {
            return Err(CommandError::TooLarge(len));
        }
        let header = size_of::<ReportZonesHeader>() as u64;
        let room = (len.saturating_sub(header) / 64) as usize;
        let (matching, descriptors) = zones.report(slba << ns.lba_shift(), filter, ns.lba_shift(), room);
        let nz = if cmd.partial() { descriptors.len() as u64 } else { matching };
        let mut data = ReportZonesHeader { nz: U64::new(nz), ..Default::default() }.as_bytes().to_vec();
        for d in &descriptors {
            data.extend_from_slice(d.as_bytes());
        }
        data.resize(len as usize, 0);
        self.write_command_data(sqe, &data)?;
        Ok(Started::Done(Status::SUCCESS))
    }

    /// Zones of zoned namespace `nsid` that reads of `len` bytes at `offset` cross
    /// are none of them offline.
    pub(crate) fn zoned_check_read(&self, nsid: u32, offset: u64, len: u64) -> CmdResult<()> {
        let r =
            self.with_namespace(nsid, |ns| ns.zones.as_ref().map_or(Ok(()), |z| z.check_read(offset, len)))?;
        Ok(r?)
    }
}
