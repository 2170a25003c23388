//! Flexible Data Placement (Base §8.1.10, from TP4146): the log pages, the I/O
//! Management commands' fields and data, the FDP features' fields and the
//! placement directive a write carries.
//!
//! Terms: a reclaim unit (RU) is a unit of media the controller fills and erases
//! as a whole; a reclaim unit handle (RUH) points at the RU its writes fill now; a
//! namespace's placement handles (PHNDL) index the RUHs it may use; a placement
//! identifier (PID) names a reclaim group (RG) in its high bits and a placement
//! handle in the rest.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::Sqe;

/// Directive Type of the Data Placement directive (a write's CDW12 23:20).
pub const DTYPE_DATA_PLACEMENT: u8 = 2;

/// Identify Controller CTRATT bits FDP needs (with the others).
pub use crate::identify::ctratt;

/// FDP Configurations log page header (LID 20h): NUMFDPC (0's based), VER, and SZE
/// (the whole page's bytes).
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct ConfigLogHeader {
    pub numfdpc_z: U16,
    pub ver: u8,
    pub rsvd3: u8,
    pub sze: U32,
    pub rsvd8: [u8; 8],
}

/// One FDP Configuration Descriptor (LID 20h), followed by NRUH 4-byte Reclaim Unit
/// Handle Descriptors (byte 0: RUHT).
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct ConfigDescriptor {
    /// Descriptor Size: this structure, its RUH descriptors and its vendor bytes.
    pub dsze: U16,
    /// FDP Attributes: bits 3:0 RGIF (reclaim group identifier format: the PID's
    /// high bits naming the RG), bit 4 FDP volatile write cache, bit 7 valid.
    pub fdpa: u8,
    /// Vendor Specific Size.
    pub vss: u8,
    /// Number of Reclaim Groups.
    pub nrg: U32,
    /// Number of Reclaim Unit Handles.
    pub nruh: U16,
    /// Max Placement Identifiers a namespace may have (0's based).
    pub maxpids_z: U16,
    /// Number of Namespaces Supported.
    pub nnss: U32,
    /// Reclaim Unit Nominal Size (bytes).
    pub runs: U64,
    /// Estimated Reclaim Unit Time Limit (seconds; 0: none).
    pub erutl: U32,
    pub rsvd28: [u8; 36],
}

/// FDP Attributes bits.
pub mod fdpa {
    pub const VALID: u8 = 1 << 7;
}

/// Reclaim Unit Handle Type (a RUH descriptor's byte 0).
pub mod ruht {
    pub const INITIALLY_ISOLATED: u8 = 1;
    pub const PERSISTENTLY_ISOLATED: u8 = 2;
}

/// Reclaim Unit Handle Attributes (RUH Usage log, LID 21h).
pub mod ruha {
    pub const UNUSED: u8 = 0;
    pub const HOST_SPECIFIED: u8 = 1;
    pub const CONTROLLER_SPECIFIED: u8 = 2;
}

/// FDP Statistics log page (LID 22h): Host Bytes with Metadata Written, Media Bytes
/// with Metadata Written, Media Bytes Erased (each 128 bits).
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct Statistics {
    pub hbmw: [U64; 2],
    pub mbmw: [U64; 2],
    pub mbe: [U64; 2],
    pub rsvd48: [u8; 16],
}

/// FDP event types (FDP Events log, LID 23h; FDP Events feature, FID 1Eh).
pub mod event {
    /// Host event: the RU a RUH pointed at was not fully written when the handle
    /// moved on (a Reclaim Unit Handle Update).
    pub const RU_NOT_FULLY_WRITTEN: u8 = 0x00;
    /// Host event: the estimated RU time limit passed.
    pub const RU_TIME_LIMIT_EXCEEDED: u8 = 0x01;
    /// Host event: a controller reset moved reclaim unit handles.
    pub const CTRL_RESET_MODIFIED_RUH: u8 = 0x02;
    /// Host event: a write named a placement identifier the namespace lacks.
    pub const INVALID_PID: u8 = 0x03;
    /// Controller event: media was reallocated.
    pub const MEDIA_REALLOCATED: u8 = 0x80;
    /// Controller event: the controller moved a reclaim unit handle by itself.
    pub const IMPLICITLY_MODIFIED_RUH: u8 = 0x81;
}

/// An FDP Event's flags.
pub mod event_flags {
    /// Placement Identifier Valid.
    pub const PIV: u8 = 1 << 0;
    /// Namespace Identifier Valid.
    pub const NSIDV: u8 = 1 << 1;
    /// Location Valid.
    pub const LV: u8 = 1 << 2;
}

/// The FDP Events log page header (LID 23h): the number of events that follow.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct EventsHeader {
    pub nevents: U32,
    pub rsvd4: [u8; 60],
}

/// One FDP Event (64 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct Event {
    pub etype: u8,
    pub flags: u8,
    pub pid: U16,
    /// When it happened, as the Timestamp feature reports time (8 bytes).
    pub timestamp: [u8; 8],
    pub nsid: U32,
    /// Type specific.
    pub type_specific: [u8; 16],
    pub rgid: U16,
    pub ruhid: U16,
    pub rsvd36: [u8; 4],
    pub vendor: [u8; 24],
}

/// The Reclaim Unit Handle Status header (I/O Management Receive, MO 1).
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct RuhStatusHeader {
    pub rsvd0: [u8; 14],
    /// Number of Reclaim Unit Handle Status Descriptors.
    pub nruhsd: U16,
}

/// One Reclaim Unit Handle Status Descriptor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct RuhStatusDescriptor {
    pub pid: U16,
    pub ruhid: U16,
    /// Estimated Active Reclaim Unit Time Remaining (seconds; 0: no limit).
    pub earutr: U32,
    /// Reclaim Unit Available Media Writes (logical blocks).
    pub ruamw: U64,
    pub rsvd16: [u8; 16],
}

const _: () = {
    use core::mem::size_of;
    assert!(size_of::<ConfigLogHeader>() == 16);
    assert!(size_of::<ConfigDescriptor>() == 64);
    assert!(size_of::<Statistics>() == 64);
    assert!(size_of::<EventsHeader>() == 64);
    assert!(size_of::<Event>() == 64);
    assert!(size_of::<RuhStatusHeader>() == 16);
    assert!(size_of::<RuhStatusDescriptor>() == 32);
};

/// Management Operations of I/O Management Receive and Send.
pub mod mo {
    /// Receive: Reclaim Unit Handle Status. Send: Reclaim Unit Handle Update.
    pub const RUH: u8 = 0x01;
}

/// I/O Management Receive and Send (NVM §3.2.4, §3.2.5): MO in CDW10 7:0, MOS in
/// CDW10 31:16, and for Receive NUMD (0's based dwords) in CDW11.
#[derive(Clone, Copy, Debug)]
pub struct IoManagement<'a>(pub &'a Sqe);

impl IoManagement<'_> {
    /// Management Operation.
    pub fn mo(&self) -> u8 {
        self.0.cdw10.get() as u8
    }
    /// Management Operation Specific: for RUH Update, the number of PIDs, 0's based.
    pub fn mos(&self) -> u16 {
        (self.0.cdw10.get() >> 16) as u16
    }
    /// Receive: bytes to transfer.
    pub fn receive_len(&self) -> u64 {
        (self.0.cdw11.get() as u64 + 1) * 4
    }
}

/// The FDP feature (FID 1Dh) value: FDP Enable in bit 0, the configuration index
/// in 15:8 (CDW11 of Set Features names the endurance group, CDW12 carries this).
pub mod feature {
    pub const FDPE: u32 = 1 << 0;
    pub const fn config_index(v: u32) -> u8 {
        (v >> 8) as u8
    }
}

/// The FDP Events feature (FID 1Eh): CDW11 names a placement handle (15:0) and a
/// number of event types (23:16); Set's CDW12 bit 0 enables or disables them.
#[derive(Clone, Copy, Debug)]
pub struct EventsFeature(pub u32);

impl EventsFeature {
    pub fn phndl(self) -> u16 {
        self.0 as u16
    }
    pub fn noet(self) -> u8 {
        (self.0 >> 16) as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::FromZeros;

    #[test]
    fn io_management_fields_sit_where_the_spec_puts_them() {
        let mut s = Sqe::new_zeroed();
        s.cdw10 = U32::new(0x0003_0001);
        s.cdw11 = U32::new(1023);
        let m = IoManagement(&s);
        assert_eq!((m.mo(), m.mos(), m.receive_len()), (1, 3, 4096));
        assert_eq!(EventsFeature(0x0006_0002).phndl(), 2);
        assert_eq!(EventsFeature(0x0006_0002).noet(), 6);
    }
}
