//! Commands as data: one table per command set (admin, NVM, zoned) that says,
//! for every opcode the controller implements, when it is offered, what it may
//! change (its Commands Supported and Effects entry) and the Identify Controller
//! bit (OACS for admin commands, ONCS for NVM ones) that reports it.
//!
//! Identify's OACS and ONCS, the Commands Supported and Effects log and both
//! dispatches read these tables, so they cannot disagree: a command is answered
//! Invalid Opcode exactly when the log leaves it out and its bit is clear. A row
//! also names its handler, so a new command is its handler, its row and its test.
//! The tables live beside their handlers (`admin/table.rs`, `io/table.rs`); this
//! module has their shape and what is read from them. `tests/commands_agree.rs`
//! walks the configurations and checks all three for every opcode 00h-FFh.

use nvme_spec::log::{effects, CommandsSupportedAndEffects};
use zerocopy::little_endian::U32;
use zerocopy::FromZeros;
pub(crate) use Offer::*;

/// What this controller offers of the optional commands, from its configuration
/// and the namespaces it has now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Offers {
    /// Doorbell Buffer Config (shadow doorbells; `--no-shadow-doorbells` clears it).
    pub(crate) shadow_doorbells: bool,
    /// Namespace Management and Attachment (a namespace pool).
    pub(crate) ns_mgmt: bool,
    /// Dataset Management: some namespace's backend deallocates natively.
    pub(crate) dsm: bool,
    /// Write Zeroes: some namespace's backend zeroes natively.
    pub(crate) write_zeroes: bool,
    /// The reservation commands: some namespace keeps a reservation state file.
    pub(crate) reservations: bool,
}

/// When a command is offered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Offer {
    Always,
    ShadowDoorbells,
    NsMgmt,
    Dsm,
    WriteZeroes,
    Reservations,
}

impl Offer {
    pub(crate) fn holds(self, o: &Offers) -> bool {
        match self {
            Offer::Always => true,
            Offer::ShadowDoorbells => o.shadow_doorbells,
            Offer::NsMgmt => o.ns_mgmt,
            Offer::Dsm => o.dsm,
            Offer::WriteZeroes => o.write_zeroes,
            Offer::Reservations => o.reservations,
        }
    }
}

/// One command of a command set; `H`, its handler.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Command<H = ()> {
    pub(crate) opcode: u8,
    pub(crate) offer: Offer,
    /// Its Commands Supported and Effects entry when offered (CSUPP included).
    pub(crate) effects: u32,
    /// The OACS (admin) or ONCS (NVM) bit that reports it; 0 for none.
    pub(crate) bit: u16,
    pub(crate) handler: H,
}

/// A row of a table: its Effects entry gets CSUPP.
pub(crate) const fn row<H>(opcode: u8, offer: Offer, effects: u32, bit: u16, handler: H) -> Command<H> {
    Command { opcode, offer, effects: effects | effects::CSUPP, bit, handler }
}

/// Logical block content changes.
pub(crate) const LBCC: u32 = effects::LBCC;
/// The namespace inventory changes: Linux rescans after either when it passed the
/// command through (nvme-cli).
pub(crate) const INVENTORY: u32 = effects::NCC | effects::NIC;

fn bits<H>(table: &[Command<H>], o: &Offers) -> u16 {
    table.iter().filter(|c| c.offer.holds(o)).fold(0, |b, c| b | c.bit)
}

/// Identify Controller OACS: the bits of the admin commands of `admin` offered.
pub(crate) fn oacs<H>(admin: &[Command<H>], o: &Offers) -> u16 {
    bits(admin, o)
}

/// Identify Controller ONCS, the command bits of the NVM set `nvm` (Save and
/// Select, Timestamp and the like are features, not commands: the caller adds
/// them).
pub(crate) fn oncs<H>(nvm: &[Command<H>], o: &Offers) -> u16 {
    bits(nvm, o)
}

/// Commands Supported and Effects (Base §5.1.12.1.6) of the I/O command set whose
/// tables are `io` (the NVM set's; for the Zoned Namespace set, the NVM set's and
/// its own: a Linux host reads Zone Append's entry before it lets a zoned
/// namespace be written); `admin` is the admin table.
pub(crate) fn effects_log<A, I>(
    admin: &[Command<A>],
    io: &[&[Command<I>]],
    o: &Offers,
) -> CommandsSupportedAndEffects {
    let mut e = CommandsSupportedAndEffects::new_zeroed();
    for c in admin.iter().filter(|c| c.offer.holds(o)) {
        e.acs[c.opcode as usize] = U32::new(c.effects);
    }
    for c in io.iter().flat_map(|t| t.iter()).filter(|c| c.offer.holds(o)) {
        e.iocs[c.opcode as usize] = U32::new(c.effects);
    }
    e
}

/// Every optional command on: the test tables' other end from `Offers::default()`.
#[cfg(test)]
pub(crate) const ALL: Offers =
    Offers { shadow_doorbells: true, ns_mgmt: true, dsm: true, write_zeroes: true, reservations: true };

/// What every table must be: no opcode twice, and every optional command reported by
/// an Identify bit, offered with every option on and not with none.
#[cfg(test)]
pub(crate) fn check_table<H>(rows: &[Command<H>]) {
    for (i, c) in rows.iter().enumerate() {
        assert!(rows[i + 1..].iter().all(|d| d.opcode != c.opcode), "{:#04x} twice", c.opcode);
        if c.offer != Always {
            assert_ne!(c.bit, 0, "{:#04x} is optional and reported by no bit", c.opcode);
            assert!(!c.offer.holds(&Offers::default()) && c.offer.holds(&ALL), "{:#04x}", c.opcode);
        }
    }
}
