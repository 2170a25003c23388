//! The I/O command sets as data: each command's row (crate::commands: when it is
//! offered, its Effects entry, its ONCS bit) with its handler, and the dispatch
//! that reads it. Read and Write, most of what a guest sends, are looked for first
//! (their rows are here all the same: the log and Identify read them). A new I/O
//! command is its handler, its row here and its test.

use nvme_spec::identify::oncs;
use nvme_spec::opcode::{nvm as iop, zns as zop};
use nvme_spec::Sqe;

use super::Started;
use crate::commands::{row, Always, Command, Dsm, Offer, Reservations, WriteZeroes, LBCC};
use crate::engine::Io;
use crate::error::{CmdResult, CommandError};

/// An I/O command's handler: the parts it runs on, the SQ it was fetched from, the entry.
pub(crate) type IoHandler = for<'a, 'c> fn(&'a mut Io, u16, &'c Sqe) -> CmdResult<Started>;

/// The NVM command set.
pub(crate) static NVM: [Command<IoHandler>; 14] = [
    row(iop::FLUSH, Always, 0, 0, |e, q, s| e.flush(q, s)),
    row(iop::WRITE, Always, LBCC, 0, |e, q, s| e.read_write(q, s)),
    row(iop::READ, Always, 0, 0, |e, q, s| e.read_write(q, s)),
    row(iop::COMPARE, Always, 0, oncs::COMPARE, |e, q, s| e.read_write(q, s)),
    row(iop::WRITE_ZEROES, WriteZeroes, LBCC, oncs::WRITE_ZEROES, |e, q, s| e.read_write(q, s)),
    row(iop::DATASET_MANAGEMENT, Dsm, LBCC, oncs::DSM, |e, q, s| e.dataset_management(q, s)),
    row(iop::VERIFY, Always, 0, oncs::VERIFY, |e, q, s| e.read_write(q, s)),
    row(iop::RESERVATION_REGISTER, Reservations, 0, oncs::RESERVATIONS, |e, _, s| e.reservation(s)),
    row(iop::RESERVATION_REPORT, Reservations, 0, oncs::RESERVATIONS, |e, _, s| e.reservation(s)),
    row(iop::RESERVATION_ACQUIRE, Reservations, 0, oncs::RESERVATIONS, |e, _, s| e.reservation(s)),
    row(iop::RESERVATION_RELEASE, Reservations, 0, oncs::RESERVATIONS, |e, _, s| e.reservation(s)),
    row(iop::COPY, Always, LBCC, oncs::COPY, |e, q, s| e.copy(q, s)),
    // Without Flexible Data Placement both are answered FDP Disabled, so both are
    // supported whether or not the controller has it (as QEMU's nvme lists them).
    row(iop::IO_MGMT_RECV, Always, 0, 0, |e, _, s| e.io_mgmt_recv(s)),
    row(iop::IO_MGMT_SEND, Always, 0, 0, |e, _, s| e.io_mgmt_send(s)),
];

/// The Zoned Namespace command set's own commands (it has the NVM set's too).
pub(crate) static ZONED: [Command<IoHandler>; 3] = [
    row(zop::ZONE_MGMT_SEND, Always, LBCC, 0, |e, q, s| e.zone_mgmt_send(q, s)),
    row(zop::ZONE_MGMT_RECV, Always, 0, 0, |e, _, s| e.zone_mgmt_recv(s)),
    row(zop::ZONE_APPEND, Always, LBCC, 0, |e, q, s| e.read_write(q, s)),
];

/// Every I/O opcode this controller implements, of the NVM and Zoned Namespace
/// command sets, whatever a configuration offers: what the fuzzer must be able to
/// build.
pub fn io_opcodes() -> impl Iterator<Item = u8> + Clone {
    NVM.iter().chain(&ZONED).map(|c| c.opcode)
}

impl Io {
    /// Runs an I/O command through its row: Invalid Opcode where the controller
    /// does not offer it. Read and Write are looked for first.
    #[inline]
    pub(super) fn dispatch_io(&mut self, sqid: u16, sqe: &Sqe) -> CmdResult<Started> {
        let opcode = sqe.opcode();
        if matches!(opcode, iop::READ | iop::WRITE) {
            return self.read_write(sqid, sqe);
        }
        match NVM.iter().chain(&ZONED).find(|c| c.opcode == opcode) {
            Some(c) if self.offered(c.offer) => (c.handler)(self, sqid, sqe),
            _ => Err(CommandError::InvalidOpcode(opcode)),
        }
    }

    /// Whether the engine offers the commands of `offer` ([`crate::commands::Offers`]
    /// as the engine knows it).
    fn offered(&self, offer: Offer) -> bool {
        match offer {
            Offer::Always => true,
            // Optional commands exist only where Identify ONCS reports them: some
            // namespace's backend does them natively.
            Offer::Dsm => self.ctx.caps.dsm,
            Offer::WriteZeroes => self.ctx.caps.write_zeroes,
            // Each namespace says: the handler answers Invalid Opcode on one that
            // keeps no reservations.
            Offer::Reservations => true,
            // Admin commands' offers: no I/O row has them.
            Offer::ShadowDoorbells | Offer::NsMgmt => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::{check_table, oncs as oncs_of, Offers};

    #[test]
    fn the_nvm_and_zoned_tables_are_well_formed() {
        check_table(&NVM.iter().chain(&ZONED).copied().collect::<Vec<_>>());
        assert_eq!(oncs_of(&NVM, &Offers::default()), oncs::COMPARE | oncs::VERIFY | oncs::COPY);
    }
}
