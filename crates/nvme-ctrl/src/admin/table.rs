//! The admin command set as data: each command's row (crate::commands: when it is
//! offered, its Effects entry, its OACS bit) with its handler, and the dispatch
//! that reads it. A new admin command is its handler, its row here and its test.

use nvme_spec::identify::oacs;
use nvme_spec::log::effects;
use nvme_spec::opcode::admin as aop;
use nvme_spec::Sqe;

use super::{done, Admin, AdminDone};
use crate::commands::{row, Always, Command, NsMgmt, Offers, ShadowDoorbells, INVENTORY, LBCC};
use crate::error::{CmdResult, CommandError};

/// An admin command's handler: it runs on the parts the controller lends it.
pub(crate) type AdminHandler = for<'a, 'b, 'c> fn(&'a mut Admin<'b>, &'c Sqe) -> CmdResult<AdminDone>;

/// The admin command set.
pub(crate) static ADMIN: [Command<AdminHandler>; 15] = [
    row(aop::DELETE_IO_SQ, Always, 0, 0, |a, s| a.delete_io_sq(s)),
    row(aop::CREATE_IO_SQ, Always, 0, 0, |a, s| a.create_io_sq(s)),
    row(aop::GET_LOG_PAGE, Always, 0, 0, |a, s| a.get_log_page(s)),
    row(aop::DELETE_IO_CQ, Always, 0, 0, |a, s| a.delete_io_cq(s)),
    row(aop::CREATE_IO_CQ, Always, 0, 0, |a, s| a.create_io_cq(s)),
    row(aop::IDENTIFY, Always, 0, 0, |a, s| a.identify(s)),
    row(aop::ABORT, Always, 0, 0, |a, s| a.abort(s)),
    row(aop::SET_FEATURES, Always, 0, 0, |a, s| a.set_features(s)),
    row(aop::GET_FEATURES, Always, 0, 0, |a, s| a.get_features(s)),
    row(aop::ASYNC_EVENT_REQUEST, Always, 0, 0, |a, s| a.async_event_request(s)),
    row(aop::NAMESPACE_MANAGEMENT, NsMgmt, INVENTORY, oacs::NS_MGMT, |a, s| a.namespace_management(s)),
    row(aop::KEEP_ALIVE, Always, 0, 0, |a, _| a.keep_alive()),
    row(aop::NAMESPACE_ATTACHMENT, NsMgmt, INVENTORY, oacs::NS_MGMT, |a, s| a.namespace_attachment(s)),
    row(aop::DOORBELL_BUFFER_CONFIG, ShadowDoorbells, 0, oacs::DOORBELL_BUFFER_CONFIG, |a, s| {
        a.doorbell_buffer_config(s)
    }),
    row(aop::FORMAT_NVM, Always, LBCC | INVENTORY | effects::CSE_ALL, oacs::FORMAT, |a, s| a.format_nvm(s)),
];

/// Every admin opcode this controller implements, whatever a configuration offers:
/// what the fuzzer must be able to build.
pub fn admin_opcodes() -> impl Iterator<Item = u8> + Clone {
    ADMIN.iter().map(|c| c.opcode)
}

impl Admin<'_> {
    /// What this controller offers of the optional commands now.
    pub(crate) fn offers(&self) -> Offers {
        Offers {
            shadow_doorbells: self.cfg.shadow_doorbells,
            ns_mgmt: self.cfg.pool.is_some(),
            dsm: self.engine.io.ctx.caps.dsm,
            write_zeroes: self.engine.io.ctx.caps.write_zeroes,
            reservations: self.admin.resv_log.watching(),
        }
    }

    /// Runs an admin command through its row: Invalid Opcode where the controller
    /// does not offer it now.
    pub(crate) fn dispatch_admin(&mut self, sqe: &Sqe) -> CmdResult<AdminDone> {
        let offers = self.offers();
        match ADMIN.iter().find(|c| c.opcode == sqe.opcode() && c.offer.holds(&offers)) {
            Some(c) => (c.handler)(self, sqe),
            None => Err(CommandError::InvalidOpcode(sqe.opcode())),
        }
    }

    /// Keep Alive (Base §3.9.5): the Keep Alive Timer starts again.
    pub(crate) fn keep_alive(&mut self) -> CmdResult<AdminDone> {
        self.admin.features.restart_keep_alive(self.clock.now_ns());
        done()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::{check_table, oacs as oacs_of, ALL};

    #[test]
    fn the_admin_table_is_well_formed_and_sets_every_oacs_bit_once() {
        check_table(&ADMIN);
        assert_eq!(oacs_of(&ADMIN, &Offers::default()), oacs::FORMAT);
        assert_eq!(oacs_of(&ADMIN, &ALL), oacs::FORMAT | oacs::NS_MGMT | oacs::DOORBELL_BUFFER_CONFIG);
    }
}
