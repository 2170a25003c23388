//! Reservations (Base §8.1.22; NVM §3.2.6 to §3.2.9): the reservation types, the
//! fields of Reservation Register, Report, Acquire and Release, their data, the
//! Reservation Notification log page (LID 80h) and the features that go with
//! them (Host Identifier, Reservation Notification Mask, Reservation Persistence).

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::Sqe;

/// A reservation's type (Base Figure "Reservation Type Encoding").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReservationType {
    WriteExclusive = 1,
    ExclusiveAccess = 2,
    WriteExclusiveRegistrantsOnly = 3,
    ExclusiveAccessRegistrantsOnly = 4,
    WriteExclusiveAllRegistrants = 5,
    ExclusiveAccessAllRegistrants = 6,
}

impl ReservationType {
    pub fn from_u8(v: u8) -> Option<Self> {
        use ReservationType::*;
        Some(match v {
            1 => WriteExclusive,
            2 => ExclusiveAccess,
            3 => WriteExclusiveRegistrantsOnly,
            4 => ExclusiveAccessRegistrantsOnly,
            5 => WriteExclusiveAllRegistrants,
            6 => ExclusiveAccessAllRegistrants,
            _ => return None,
        })
    }

    /// Every registrant holds it (the "all registrants" types).
    pub fn all_registrants(self) -> bool {
        matches!(self, Self::WriteExclusiveAllRegistrants | Self::ExclusiveAccessAllRegistrants)
    }

    /// Registrants that do not hold it may still write (and, for the exclusive
    /// access kinds, read): the "registrants only" and "all registrants" types.
    pub fn registrants_may_access(self) -> bool {
        !matches!(self, Self::WriteExclusive | Self::ExclusiveAccess)
    }

    /// Reads are kept to those it lets in, not only writes.
    pub fn exclusive_access(self) -> bool {
        matches!(
            self,
            Self::ExclusiveAccess
                | Self::ExclusiveAccessRegistrantsOnly
                | Self::ExclusiveAccessAllRegistrants
        )
    }
}

/// Identify Namespace RESCAP bits.
pub mod rescap {
    /// Persist Through Power Loss.
    pub const PTPL: u8 = 1 << 0;
    /// Write Exclusive to Exclusive Access All Registrants (bits 1 to 6).
    pub const ALL_TYPES: u8 = 0b0111_1110;
    /// Ignore Existing Key as NVMe 1.3 and later define it (IEKEY on Acquire and
    /// Release is reserved). Not set: IEKEY is honoured on every command, as
    /// Linux sends it.
    pub const IEKEY13: u8 = 1 << 7;
}

/// Reservation Register Action (RREGA).
pub mod rrega {
    pub const REGISTER: u8 = 0;
    pub const UNREGISTER: u8 = 1;
    pub const REPLACE: u8 = 2;
}

/// Reservation Acquire Action (RACQA).
pub mod racqa {
    pub const ACQUIRE: u8 = 0;
    pub const PREEMPT: u8 = 1;
    pub const PREEMPT_AND_ABORT: u8 = 2;
}

/// Reservation Release Action (RRELA).
pub mod rrela {
    pub const RELEASE: u8 = 0;
    pub const CLEAR: u8 = 1;
}

/// Change Persist Through Power Loss State (Reservation Register CPTPL).
pub mod cptpl {
    pub const NO_CHANGE: u8 = 0;
    pub const CLEAR: u8 = 2;
    pub const SET: u8 = 3;
}

/// Dword 10 of Reservation Register, Acquire and Release.
#[derive(Clone, Copy, Debug)]
pub struct ReservationCmd<'a>(pub &'a Sqe);

impl ReservationCmd<'_> {
    fn cdw10(&self) -> u32 {
        self.0.cdw10.get()
    }
    /// The action (RREGA, RACQA or RRELA: bits 2:0).
    pub fn action(&self) -> u8 {
        (self.cdw10() & 7) as u8
    }
    /// Ignore Existing Key (bit 3).
    pub fn iekey(&self) -> bool {
        self.cdw10() & (1 << 3) != 0
    }
    /// Reservation Type (Acquire, Release: bits 15:8).
    pub fn rtype(&self) -> u8 {
        (self.cdw10() >> 8) as u8
    }
    /// Change Persist Through Power Loss State (Register: bits 31:30).
    pub fn cptpl(&self) -> u8 {
        (self.cdw10() >> 30) as u8
    }
    /// Reservation Report: Number of Dwords (0's based, dword 10).
    pub fn report_dwords(&self) -> u32 {
        self.cdw10().saturating_add(1)
    }
    /// Reservation Report: Extended Data Structure (dword 11 bit 0).
    pub fn extended(&self) -> bool {
        self.0.cdw11.get() & 1 != 0
    }
}

/// Reservation Register's data: the current key, and the new one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct RegisterData {
    pub crkey: U64,
    pub nrkey: U64,
}

/// Reservation Acquire's data: the current key, and the key of the registrants
/// to preempt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct AcquireData {
    pub crkey: U64,
    pub prkey: U64,
}

/// Reservation Report's header (the extended structure's header is this and 40
/// reserved bytes more).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct ReportHeader {
    /// Generation: counts registrations, unregistrations, replacements and
    /// preemptions.
    pub gen: U32,
    /// The reservation's type (0: none).
    pub rtype: u8,
    /// Number of Registered Controllers.
    pub regctl: U16,
    pub rsvd7: [u8; 2],
    /// Persist Through Power Loss State.
    pub ptpls: u8,
    pub rsvd10: [u8; 14],
}

/// A Registered Controller data structure (the header's 8-byte host identifier).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct RegisteredController {
    pub cntlid: U16,
    /// Reservation Status: bit 0, the host holds the reservation.
    pub rcsts: u8,
    pub rsvd3: [u8; 5],
    pub hostid: [u8; 8],
    pub rkey: U64,
}

/// A Registered Controller Extended data structure (128-bit host identifier).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct RegisteredControllerExtended {
    pub cntlid: U16,
    pub rcsts: u8,
    pub rsvd3: [u8; 5],
    pub rkey: U64,
    pub hostid: [u8; 16],
    pub rsvd32: [u8; 32],
}

/// Bytes of the extended report's header.
pub const EXTENDED_HEADER_LEN: usize = 64;

/// Reservation Notification log page type.
pub mod notification {
    pub const EMPTY: u8 = 0;
    pub const REGISTRATION_PREEMPTED: u8 = 1;
    pub const RESERVATION_RELEASED: u8 = 2;
    pub const RESERVATION_PREEMPTED: u8 = 3;
}

/// The Reservation Notification log page (LID 80h): one notification.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct ReservationNotificationLog {
    /// Log Page Count: counts notifications; 0 is skipped when it wraps.
    pub count: U64,
    /// Reservation Notification Log Page Type, see [`notification`].
    pub kind: u8,
    /// Number of Available Log Pages after this one (saturating at FFh).
    pub available: u8,
    pub rsvd10: [u8; 2],
    pub nsid: U32,
    pub rsvd16: [u8; 32],
    pub rsvd48: [u8; 16],
}

/// Reservation Notification Mask feature bits (1 masks the notification).
pub mod notify_mask {
    pub const REGISTRATION_PREEMPTED: u32 = 1 << 1;
    pub const RESERVATION_RELEASED: u32 = 1 << 2;
    pub const RESERVATION_PREEMPTED: u32 = 1 << 3;
    pub const ALL: u32 = 0b1110;
}

/// Feature identifiers.
pub mod fid {
    /// Host Identifier (8 bytes, or 16 with EXHID, dword 11 bit 0).
    pub const HOST_IDENTIFIER: u8 = 0x81;
    /// Reservation Notification Mask (namespace specific).
    pub const RESERVATION_NOTIFICATION_MASK: u8 = 0x82;
    /// Reservation Persistence (namespace specific: bit 0, PTPL).
    pub const RESERVATION_PERSISTENCE: u8 = 0x83;
}

/// The I/O Command Specific asynchronous event: Reservation Log Page Available.
pub const AEN_LOG_PAGE_AVAILABLE: u8 = 0x00;

/// The Reservation Notification log page's identifier.
pub const LID_NOTIFICATION: u8 = 0x80;

const _: () = assert!(core::mem::size_of::<ReportHeader>() == 24);
const _: () = assert!(core::mem::size_of::<RegisteredController>() == 24);
const _: () = assert!(core::mem::size_of::<RegisteredControllerExtended>() == 64);
const _: () = assert!(core::mem::size_of::<ReservationNotificationLog>() == 64);
const _: () = assert!(core::mem::size_of::<RegisterData>() == 16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_and_their_rules() {
        use ReservationType::*;
        for v in 1..=6 {
            assert_eq!(ReservationType::from_u8(v).unwrap() as u8, v);
        }
        assert_eq!(ReservationType::from_u8(0), None);
        assert_eq!(ReservationType::from_u8(7), None);
        assert!(!WriteExclusive.exclusive_access() && ExclusiveAccess.exclusive_access());
        assert!(
            !ExclusiveAccess.registrants_may_access()
                && WriteExclusiveRegistrantsOnly.registrants_may_access()
        );
        assert!(
            ExclusiveAccessAllRegistrants.all_registrants()
                && !ExclusiveAccessRegistrantsOnly.all_registrants()
        );
    }

    #[test]
    fn command_fields() {
        let s =
            Sqe { cdw10: U32::new(2 | 1 << 3 | 5 << 8 | 3 << 30), cdw11: U32::new(1), ..Default::default() };
        let c = ReservationCmd(&s);
        assert_eq!((c.action(), c.iekey(), c.rtype(), c.cptpl(), c.extended()), (2, true, 5, 3, true));
    }
}
