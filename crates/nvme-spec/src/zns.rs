//! The Zoned Namespace Command Set (NVMe Zoned Namespace Command Set Specification,
//! Revision 1.1, "ZNS"): its command set identifier, command views and builders,
//! zone states, the Report Zones data and its Identify structures (CNS 05h and 06h
//! with CSI 02h).

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::opcode::zns as op;
use crate::Sqe;

/// Command Set Identifier of the Zoned Namespace Command Set (Base Figure "Command
/// Set Identifiers").
pub const CSI_ZNS: u8 = 0x02;
/// Command Set Identifier of the NVM Command Set.
pub const CSI_NVM: u8 = 0x00;

/// Zone states (ZNS §2.1.1, Figure "Zone State values" of the Zone Descriptor's ZS).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ZoneState {
    Empty = 0x1,
    ImplicitlyOpened = 0x2,
    ExplicitlyOpened = 0x3,
    Closed = 0x4,
    ReadOnly = 0xd,
    Full = 0xe,
    Offline = 0xf,
}

impl ZoneState {
    /// The state a Zone Descriptor's ZS nibble names (None: a reserved value).
    pub const fn from_raw(v: u8) -> Option<Self> {
        Some(match v {
            0x1 => ZoneState::Empty,
            0x2 => ZoneState::ImplicitlyOpened,
            0x3 => ZoneState::ExplicitlyOpened,
            0x4 => ZoneState::Closed,
            0xd => ZoneState::ReadOnly,
            0xe => ZoneState::Full,
            0xf => ZoneState::Offline,
            _ => return None,
        })
    }
    /// Counts against the open resources (ZSIO, ZSEO).
    pub const fn is_open(self) -> bool {
        matches!(self, ZoneState::ImplicitlyOpened | ZoneState::ExplicitlyOpened)
    }
    /// Counts against the active resources (ZSIO, ZSEO, ZSC).
    pub const fn is_active(self) -> bool {
        matches!(self, ZoneState::ImplicitlyOpened | ZoneState::ExplicitlyOpened | ZoneState::Closed)
    }
    /// For logs and reports: the specification's short names.
    pub const fn name(self) -> &'static str {
        match self {
            ZoneState::Empty => "empty",
            ZoneState::ImplicitlyOpened => "implicitly opened",
            ZoneState::ExplicitlyOpened => "explicitly opened",
            ZoneState::Closed => "closed",
            ZoneState::ReadOnly => "read only",
            ZoneState::Full => "full",
            ZoneState::Offline => "offline",
        }
    }
}

/// Zone Send Action (ZNS Figure "Zone Management Send - Command Dword 13").
pub mod zsa {
    pub const CLOSE: u8 = 0x01;
    pub const FINISH: u8 = 0x02;
    pub const OPEN: u8 = 0x03;
    pub const RESET: u8 = 0x04;
    pub const OFFLINE: u8 = 0x05;
    pub const SET_DESCRIPTOR_EXTENSION: u8 = 0x10;
}

/// Zone Receive Action (ZNS Figure "Zone Management Receive - Command Dword 13").
pub mod zra {
    pub const REPORT_ZONES: u8 = 0x00;
    pub const EXTENDED_REPORT_ZONES: u8 = 0x01;
}

/// Zone Type: the only one defined, Sequential Write Required.
pub const ZONE_TYPE_SEQWRITE_REQUIRED: u8 = 0x2;

/// Zone Management Send (ZNS §3.4.3).
#[derive(Clone, Copy, Debug)]
pub struct ZoneMgmtSend<'a>(pub &'a Sqe);

impl ZoneMgmtSend<'_> {
    /// Starting LBA: the lowest LBA of the zone acted on.
    pub fn slba(&self) -> u64 {
        self.0.cdw10.get() as u64 | ((self.0.cdw11.get() as u64) << 32)
    }
    /// Zone Send Action.
    pub fn zsa(&self) -> u8 {
        self.0.cdw13.get() as u8
    }
    /// Select All: every zone the action applies to, SLBA ignored.
    pub fn select_all(&self) -> bool {
        self.0.cdw13.get() & (1 << 8) != 0
    }
}

/// Zone Management Receive (ZNS §3.4.2).
#[derive(Clone, Copy, Debug)]
pub struct ZoneMgmtRecv<'a>(pub &'a Sqe);

impl ZoneMgmtRecv<'_> {
    /// Starting LBA: zones from the one holding it.
    pub fn slba(&self) -> u64 {
        self.0.cdw10.get() as u64 | ((self.0.cdw11.get() as u64) << 32)
    }
    /// Bytes of the data buffer (NUMD is 0's based, in dwords).
    pub fn buffer_len(&self) -> u64 {
        (self.0.cdw12.get() as u64 + 1) * 4
    }
    /// Zone Receive Action.
    pub fn zra(&self) -> u8 {
        self.0.cdw13.get() as u8
    }
    /// Zone Receive Action Specific Field: for Report Zones, which zones (0: all,
    /// 1-7: the zones in one state, in the order of [`ZoneState`]'s first seven).
    pub fn zrasf(&self) -> u8 {
        (self.0.cdw13.get() >> 8) as u8
    }
    /// Partial Report: the header counts the descriptors returned, not all that match.
    pub fn partial(&self) -> bool {
        self.0.cdw13.get() & (1 << 16) != 0
    }
}

/// Builds Zone Management Send and Receive commands (command identifier 0, PRPs
/// for data, as [`crate::nvm`]'s builders).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ZoneMgmtCmd {
    pub nsid: u32,
    pub slba: u64,
}

impl ZoneMgmtCmd {
    /// Zone Management Send with action `zsa`.
    pub fn send(self, zsa: u8, select_all: bool) -> Sqe {
        let mut s = self.base(op::ZONE_MGMT_SEND);
        s.cdw13 = U32::new(zsa as u32 | (select_all as u32) << 8);
        s
    }
    /// Zone Management Receive of `len` bytes (a multiple of 4) with action `zra`.
    pub fn receive(self, zra: u8, zrasf: u8, partial: bool, len: u32) -> Sqe {
        let mut s = self.base(op::ZONE_MGMT_RECV);
        s.cdw12 = U32::new((len / 4).saturating_sub(1));
        s.cdw13 = U32::new(zra as u32 | (zrasf as u32) << 8 | (partial as u32) << 16);
        s
    }
    fn base(self, opcode: u8) -> Sqe {
        let mut s = Sqe::with_opcode(opcode);
        s.nsid = U32::new(self.nsid);
        s.cdw10 = U32::new(self.slba as u32);
        s.cdw11 = U32::new((self.slba >> 32) as u32);
        s
    }
}

/// The header of Report Zones data (ZNS Figure "Report Zones Data Structure").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct ReportZonesHeader {
    /// Number of Zones: matching from SLBA on, or with Partial Report those returned.
    pub nz: U64,
    pub rsvd8: [u8; 24],
    pub rsvd32: [u8; 32],
}

/// One Zone Descriptor (ZNS Figure "Zone Descriptor Data Structure").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct ZoneDescriptor {
    /// Zone Type (3:0).
    pub zt: u8,
    /// Zone State (7:4).
    pub zs: u8,
    /// Zone Attributes.
    pub za: u8,
    /// Zone Attributes Information.
    pub zai: u8,
    pub rsvd4: [u8; 4],
    /// Zone Capacity, in logical blocks.
    pub zcap: U64,
    /// Zone Start Logical Block Address.
    pub zslba: U64,
    /// Write Pointer.
    pub wp: U64,
    pub rsvd32: [u8; 32],
}

const _: () = assert!(core::mem::size_of::<ReportZonesHeader>() == 64);
const _: () = assert!(core::mem::size_of::<ZoneDescriptor>() == 64);

impl ZoneDescriptor {
    /// A Sequential Write Required zone's descriptor.
    pub fn new(state: ZoneState, zslba: u64, zcap: u64, wp: u64) -> Self {
        ZoneDescriptor {
            zt: ZONE_TYPE_SEQWRITE_REQUIRED,
            zs: (state as u8) << 4,
            zcap: U64::new(zcap),
            zslba: U64::new(zslba),
            wp: U64::new(wp),
            ..Default::default()
        }
    }
    /// The state its ZS names.
    pub fn state(&self) -> Option<ZoneState> {
        ZoneState::from_raw(self.zs >> 4)
    }
}

/// One LBA Format Extension (ZNS Figure "Zoned Namespace LBA Format Extension").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct ZoneFormatExtension {
    /// Zone Size, in logical blocks.
    pub zsze: U64,
    /// Zone Descriptor Extension Size, in 64-byte units.
    pub zdes: u8,
    pub rsvd9: [u8; 7],
}

/// I/O Command Set specific Identify Namespace for the Zoned Namespace Command Set
/// (CNS 05h, CSI 02h; ZNS Figure "Identify Namespace Data Structure").
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct IdentifyNamespaceZns {
    /// Zone Operation Characteristics (bit 0 variable capacity, bit 1 active excursions).
    pub zoc: U16,
    /// Optional Zoned Command Support (bit 0: reads across zone boundaries).
    pub ozcs: U16,
    /// Maximum Active Resources, 0's based (0xFFFF_FFFF: no limit).
    pub mar: U32,
    /// Maximum Open Resources, 0's based (0xFFFF_FFFF: no limit).
    pub mor: U32,
    /// Reset Recommended Limit, seconds (0: not reported).
    pub rrl: U32,
    /// Finish Recommended Limit, seconds (0: not reported).
    pub frl: U32,
    pub rsvd20: [u8; 2796],
    /// LBA Format Extensions, one per LBA format of Identify Namespace.
    pub lbafe: [ZoneFormatExtension; 64],
    pub rsvd3840: [u8; 256],
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<IdentifyNamespaceZns>() == 4096);
    assert!(offset_of!(IdentifyNamespaceZns, lbafe) == 2816);
};

impl Default for IdentifyNamespaceZns {
    fn default() -> Self {
        Self::new_zeroed()
    }
}

/// The Changed Zone List log page (LID BFh; ZNS Figure "Changed Zone List"): up
/// to [`CHANGED_ZONE_LIST_MAX`] zones whose descriptors changed, by ZSLBA.
pub fn changed_zone_list(zslbas: &[u64], overflowed: bool) -> [u8; 4096] {
    let mut page = [0u8; 4096];
    if overflowed || zslbas.len() > CHANGED_ZONE_LIST_MAX {
        page[..2].copy_from_slice(&0xffffu16.to_le_bytes());
        return page;
    }
    page[..2].copy_from_slice(&(zslbas.len() as u16).to_le_bytes());
    for (i, z) in zslbas.iter().enumerate() {
        page[8 + 8 * i..16 + 8 * i].copy_from_slice(&z.to_le_bytes());
    }
    page
}

/// The most zones the Changed Zone List names; past it, NZID is FFFFh.
pub const CHANGED_ZONE_LIST_MAX: usize = 511;

/// Optional Zoned Command Support: Read Across Zone Boundaries.
pub const OZCS_RAZB: u16 = 1 << 0;
/// MAR and MOR's "no limit".
pub const NO_LIMIT: u32 = 0xffff_ffff;

/// I/O Command Set specific Identify Controller for the Zoned Namespace Command Set
/// (CNS 06h, CSI 02h).
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct IdentifyControllerZns {
    /// Zone Append Size Limit, log2 in units of CAP.MPSMIN (0: MDTS).
    pub zasl: u8,
    pub rsvd1: [u8; 4095],
}

const _: () = assert!(core::mem::size_of::<IdentifyControllerZns>() == 4096);

impl Default for IdentifyControllerZns {
    fn default() -> Self {
        Self::new_zeroed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip() {
        let s = ZoneMgmtCmd { nsid: 3, slba: 0x1_0000_0200 }.send(zsa::RESET, true);
        let v = ZoneMgmtSend(&s);
        assert_eq!(
            (s.opcode(), v.slba(), v.zsa(), v.select_all()),
            (op::ZONE_MGMT_SEND, 0x1_0000_0200, 4, true)
        );
        let r = ZoneMgmtCmd { nsid: 3, slba: 64 }.receive(zra::REPORT_ZONES, 4, true, 4096);
        let v = ZoneMgmtRecv(&r);
        assert_eq!((v.slba(), v.buffer_len(), v.zra(), v.zrasf(), v.partial()), (64, 4096, 0, 4, true));
    }

    #[test]
    fn changed_zone_list_layout() {
        let p = changed_zone_list(&[0x4000, 0x8000], false);
        assert_eq!((p[0], p[1]), (2, 0));
        assert_eq!(u64::from_le_bytes(p[8..16].try_into().unwrap()), 0x4000);
        assert_eq!(u64::from_le_bytes(p[16..24].try_into().unwrap()), 0x8000);
        assert_eq!(&changed_zone_list(&[1; 512], false)[..2], &[0xff, 0xff]);
        assert_eq!(&changed_zone_list(&[], true)[..2], &[0xff, 0xff]);
    }

    #[test]
    fn descriptor_fields() {
        let d = ZoneDescriptor::new(ZoneState::Closed, 128, 100, 150);
        let b = d.as_bytes();
        assert_eq!((b[0], b[1]), (2, 0x40));
        assert_eq!(u64::from_le_bytes(b[8..16].try_into().unwrap()), 100);
        assert_eq!(u64::from_le_bytes(b[16..24].try_into().unwrap()), 128);
        assert_eq!(u64::from_le_bytes(b[24..32].try_into().unwrap()), 150);
        assert_eq!(d.state(), Some(ZoneState::Closed));
        for v in 0..16 {
            if let Some(s) = ZoneState::from_raw(v) {
                assert_eq!(s as u8, v);
            }
        }
    }
}
