//! Reservation Register, Report, Acquire and Release (NVM §3.2.6 to §3.2.9) on
//! a namespace with reservations (`crate::reservation`), and the check every
//! command that reads or writes a namespace passes: one its host's reservation
//! keeps out completes with Reservation Conflict.

use nvme_spec::opcode::{nvm as op, zns as zop};
use nvme_spec::resv::{
    AcquireData, RegisterData, RegisteredController, RegisteredControllerExtended, ReportHeader,
    ReservationCmd, EXTENDED_HEADER_LEN,
};
use nvme_spec::{Sqe, Status, NSID_ALL};
use zerocopy::little_endian::{U16, U64};
use zerocopy::{FromBytes, IntoBytes};

use super::Started;
use crate::engine::Io;
use crate::error::{CmdResult, CommandError};
use crate::namespace::Namespace;
use crate::reservation::{Access, Ask, Reservations, ResvState};

/// How the reservation rules see a command (None: they do not look at it).
#[inline]
pub(crate) fn access_of(opcode: u8) -> Option<Access> {
    match opcode {
        op::READ | op::COMPARE | op::VERIFY | zop::ZONE_MGMT_RECV | op::IO_MGMT_RECV => Some(Access::Read),
        op::WRITE
        | op::WRITE_UNCORRECTABLE
        | op::WRITE_ZEROES
        | op::DATASET_MANAGEMENT
        | op::COPY
        | op::FLUSH
        | zop::ZONE_APPEND
        | zop::ZONE_MGMT_SEND
        | op::IO_MGMT_SEND => Some(Access::Write),
        _ => None,
    }
}

/// Reservation Conflict for a command `ns`'s reservation keeps this
/// controller's host from.
#[inline]
pub(crate) fn check(ns: &Namespace, opcode: u8) -> CmdResult<()> {
    match (ns.reservations(), access_of(opcode)) {
        (Some(r), Some(a)) => r.check(a).map_err(CommandError::Status),
        _ => Ok(()),
    }
}

impl Io {
    /// The reservation check of a command that is not a plain Read or Write
    /// (those check it in `rw.rs`, where they read the namespace anyway).
    pub(crate) fn reservation_gate(&self, sqe: &Sqe) -> CmdResult<()> {
        let nsid = sqe.nsid.get();
        if nsid == NSID_ALL {
            return Ok(());
        }
        match crate::namespace::lookup(&self.ctx.namespaces, nsid) {
            // A path this controller does not serve now answers with its path
            // error first (retryable elsewhere), not a conflict.
            Some(ns) if ns.ana_group().refusal().is_some() => Ok(()),
            Some(ns) => check(ns, sqe.opcode()),
            None => Ok(()),
        }
    }

    /// One of the four reservation commands.
    pub(crate) fn reservation(&mut self, sqe: &Sqe) -> CmdResult<Started> {
        let ns = self.namespace(sqe.nsid.get())?;
        let Some(r) = ns.reservations() else {
            // RESCAP 0: the namespace takes no reservation command.
            return Err(CommandError::InvalidOpcode(sqe.opcode()));
        };
        let c = ReservationCmd(sqe);
        let result = match sqe.opcode() {
            op::RESERVATION_REGISTER => {
                let d = self.data::<RegisterData>(sqe)?;
                let ask = Ask { action: c.action(), iekey: c.iekey(), crkey: d.crkey.get() };
                r.update(|s, me| s.register(me, ask, d.nrkey.get(), (c.cptpl(), true)))
            }
            op::RESERVATION_ACQUIRE => {
                let d = self.data::<AcquireData>(sqe)?;
                // Preempt and Abort: the preempted hosts' commands still to come
                // conflict; those already at the backend finish (they cannot be
                // called back from storage).
                let ask = Ask { action: c.action(), iekey: c.iekey(), crkey: d.crkey.get() };
                r.update(|s, me| s.acquire(me, ask, c.rtype(), d.prkey.get())).map(|_| ())
            }
            op::RESERVATION_RELEASE => {
                let raw = self.read_command_data(sqe, 8)?;
                let crkey = u64::from_le_bytes(raw[..8].try_into().expect("8 bytes"));
                let ask = Ask { action: c.action(), iekey: c.iekey(), crkey };
                r.update(|s, me| s.release(me, ask, c.rtype()))
            }
            _ => return self.reservation_report(sqe, r),
        };
        Ok(Started::Done(result.err().map_or(Status::SUCCESS, Status::with_dnr)))
    }

    fn data<T: FromBytes>(&mut self, sqe: &Sqe) -> CmdResult<T> {
        let raw = self.read_command_data(sqe, size_of::<T>() as u64)?;
        Ok(T::read_from_bytes(&raw).expect("read_command_data reads the length asked"))
    }

    /// Reservation Report: the header and a structure per registered
    /// controller, cut to the NUMD dwords asked.
    fn reservation_report(&mut self, sqe: &Sqe, r: &Reservations) -> CmdResult<Started> {
        let c = ReservationCmd(sqe);
        let (_, extended_id) = r.host().get();
        if c.extended() != extended_id && r.host().get().0 != [0; 16] {
            // The structure asked does not carry this host's identifier's form.
            return Ok(Started::Done(Status::HOST_IDENTIFIER_INCONSISTENT_FORMAT));
        }
        // The host's whole buffer (NUMD dwords): the report, cut or zero filled.
        let len = c.report_dwords() as u64 * 4;
        if len > self.settings().mdts_bytes() {
            return Err(CommandError::TooLarge(len));
        }
        let mut out = report(&r.current(), c.extended());
        out.resize(len as usize, 0);
        self.write_command_data(sqe, &out)?;
        Ok(Started::Done(Status::SUCCESS))
    }
}

/// The Reservation Report data of `s`.
fn report(s: &ResvState, extended: bool) -> Vec<u8> {
    let entries: Vec<(u16, bool, &[u8; 16], u64)> = s
        .registrants
        .iter()
        .flat_map(|g| g.cntlids.iter().map(move |&c| (c, s.holds(&g.host), &g.host, g.key)))
        .collect();
    let header = ReportHeader {
        gen: s.generation.into(),
        rtype: s.rtype.unwrap_or(0),
        regctl: U16::new(entries.len() as u16),
        ptpls: s.ptpl as u8,
        ..Default::default()
    };
    let mut out = header.as_bytes().to_vec();
    if extended {
        out.resize(EXTENDED_HEADER_LEN, 0);
        for (cntlid, holds, host, key) in entries {
            let e = RegisteredControllerExtended {
                cntlid: U16::new(cntlid),
                rcsts: holds as u8,
                rkey: U64::new(key),
                hostid: *host,
                ..Default::default()
            };
            out.extend_from_slice(e.as_bytes());
        }
    } else {
        for (cntlid, holds, host, key) in entries {
            let mut hostid = [0u8; 8];
            hostid.copy_from_slice(&host[..8]);
            let e = RegisteredController {
                cntlid: U16::new(cntlid),
                rcsts: holds as u8,
                hostid,
                rkey: U64::new(key),
                ..Default::default()
            };
            out.extend_from_slice(e.as_bytes());
        }
    }
    out
}
