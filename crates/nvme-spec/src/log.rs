//! Log pages returned by Get Log Page (Base §5.1.12).

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::status::Status;

/// Log Page Identifiers (Base §5.1.12, Figure "Get Log Page – Log Page Identifiers").
pub mod lid {
    pub const SUPPORTED_LOG_PAGES: u8 = 0x00;
    pub const ERROR_INFORMATION: u8 = 0x01;
    pub const SMART_HEALTH: u8 = 0x02;
    pub const FIRMWARE_SLOT: u8 = 0x03;
    /// Changed (Attached) Namespace List.
    pub const CHANGED_NAMESPACE_LIST: u8 = 0x04;
    pub const COMMANDS_SUPPORTED_AND_EFFECTS: u8 = 0x05;
    pub const DEVICE_SELF_TEST: u8 = 0x06;
    pub const TELEMETRY_HOST: u8 = 0x07;
    /// Asymmetric Namespace Access (see [`crate::ana`]).
    pub const ANA: u8 = 0x0c;
    /// FDP Configurations, Reclaim Unit Handle Usage, FDP Statistics and FDP
    /// Events (endurance group specific: LSI names the group).
    pub const FDP_CONFIGURATIONS: u8 = 0x20;
    pub const RUH_USAGE: u8 = 0x21;
    pub const FDP_STATISTICS: u8 = 0x22;
    pub const FDP_EVENTS: u8 = 0x23;
    /// Changed Zone List (ZNS; namespace specific).
    pub const CHANGED_ZONE_LIST: u8 = 0xbf;
}

/// One Error Information log entry (LID 01h; Base §5.1.12, Figure "Error Information
/// Log Entry Data Structure").
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct ErrorInformationEntry {
    /// Unique, incrementing identifier of this error (0 = entry invalid).
    pub error_count: U64,
    /// Submission Queue ID of the failed command (FFFFh = not specific to a command).
    pub sqid: U16,
    /// Command ID of the failed command (FFFFh = not specific to a command).
    pub cid: U16,
    /// Status field of the completion in 15:1 and its phase tag in bit 0.
    pub status: U16,
    /// Parameter Error Location: byte in 7:0, bit in 10:8 (FFFFh = not applicable).
    pub parameter_error_location: U16,
    /// First LBA that experienced the error, if applicable.
    pub lba: U64,
    /// Namespace of the error, if applicable (0 = none).
    pub nsid: U32,
    /// Vendor Specific Information Available (log page identifier, 0 = none).
    pub vendor_specific: u8,
    /// Transport Type, 0 if the error is not transport related.
    pub trtype: u8,
    /// Command Set Identifier of the failed command.
    pub csi: u8,
    /// Opcode of the failed command.
    pub opcode: u8,
    /// Command Specific Information.
    pub command_specific: U64,
    /// Transport Type Specific Information.
    pub trtype_specific: U16,
    pub rsvd42: [u8; 21],
    /// Log Page Version (LPV).
    pub lpv: u8,
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<ErrorInformationEntry>() == 64);
    assert!(offset_of!(ErrorInformationEntry, status) == 12);
    assert!(offset_of!(ErrorInformationEntry, lba) == 16);
    assert!(offset_of!(ErrorInformationEntry, nsid) == 24);
    assert!(offset_of!(ErrorInformationEntry, trtype) == 29);
    assert!(offset_of!(ErrorInformationEntry, opcode) == 31);
    assert!(offset_of!(ErrorInformationEntry, command_specific) == 32);
    assert!(offset_of!(ErrorInformationEntry, trtype_specific) == 40);
    assert!(offset_of!(ErrorInformationEntry, lpv) == 63);
};

impl Default for ErrorInformationEntry {
    fn default() -> Self {
        Self::new_zeroed()
    }
}

impl ErrorInformationEntry {
    /// Parameter Error Location value meaning "not applicable".
    pub const PEL_NONE: u16 = 0xffff;

    /// The completion status recorded in this entry.
    pub fn status(&self) -> Status {
        Status::from_raw(self.status.get() >> 1)
    }
    /// The phase tag of the completion this entry describes.
    pub fn phase(&self) -> bool {
        self.status.get() & 1 != 0
    }
    pub fn set_status(&mut self, status: Status, phase: bool) {
        self.status = U16::new((status.raw() << 1) | phase as u16);
    }
    /// Points the Parameter Error Location at `bit` (0..=7) of `byte` of the command.
    pub fn set_parameter_error_location(&mut self, byte: u8, bit: u8) {
        self.parameter_error_location = U16::new(byte as u16 | (((bit & 7) as u16) << 8));
    }
}

/// Size of the SMART / Health Information log page.
pub const SMART_LOG_SIZE: usize = 512;

/// SMART / Health Information log page (LID 02h; Base §5.1.12, Figure "SMART / Health
/// Information Log Page").
///
/// The 16-byte counters are 128-bit little-endian integers; see [`u128_le`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct SmartHealthLog {
    /// Critical Warning, see [`critical_warning`].
    pub critical_warning: u8,
    /// Composite Temperature, kelvins.
    pub composite_temperature: U16,
    /// Available Spare, percent.
    pub available_spare: u8,
    /// Available Spare Threshold, percent.
    pub available_spare_threshold: u8,
    /// Percentage Used (may exceed 100).
    pub percentage_used: u8,
    /// Endurance Group Critical Warning Summary.
    pub endurance_group_critical_warning: u8,
    pub rsvd7: [u8; 25],
    /// Data Units Read, thousands of 512-byte units, rounded up.
    pub data_units_read: [u8; 16],
    /// Data Units Written, thousands of 512-byte units, rounded up.
    pub data_units_written: [u8; 16],
    /// Host Read Commands completed.
    pub host_read_commands: [u8; 16],
    /// Host Write Commands completed.
    pub host_write_commands: [u8; 16],
    /// Controller Busy Time, minutes.
    pub controller_busy_time: [u8; 16],
    pub power_cycles: [u8; 16],
    pub power_on_hours: [u8; 16],
    pub unsafe_shutdowns: [u8; 16],
    /// Media and Data Integrity Errors.
    pub media_errors: [u8; 16],
    /// Number of Error Information Log Entries over the controller's life.
    pub num_err_log_entries: [u8; 16],
    /// Warning Composite Temperature Time, minutes.
    pub warning_temp_time: U32,
    /// Critical Composite Temperature Time, minutes.
    pub critical_comp_time: U32,
    /// Temperature Sensors 1..=8, kelvins (0 = not implemented).
    pub temp_sensor: [U16; 8],
    /// Thermal Management Temperature 1 Transition Count.
    pub tmt1_transition_count: U32,
    /// Thermal Management Temperature 2 Transition Count.
    pub tmt2_transition_count: U32,
    /// Total Time For Thermal Management Temperature 1, seconds.
    pub tmt1_total_time: U32,
    /// Total Time For Thermal Management Temperature 2, seconds.
    pub tmt2_total_time: U32,
    pub rsvd232: [u8; 280],
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<SmartHealthLog>() == SMART_LOG_SIZE);
    assert!(offset_of!(SmartHealthLog, composite_temperature) == 1);
    assert!(offset_of!(SmartHealthLog, endurance_group_critical_warning) == 6);
    assert!(offset_of!(SmartHealthLog, data_units_read) == 32);
    assert!(offset_of!(SmartHealthLog, host_read_commands) == 64);
    assert!(offset_of!(SmartHealthLog, power_on_hours) == 128);
    assert!(offset_of!(SmartHealthLog, num_err_log_entries) == 176);
    assert!(offset_of!(SmartHealthLog, warning_temp_time) == 192);
    assert!(offset_of!(SmartHealthLog, temp_sensor) == 200);
    assert!(offset_of!(SmartHealthLog, tmt1_transition_count) == 216);
    assert!(offset_of!(SmartHealthLog, tmt2_total_time) == 228);
};

impl Default for SmartHealthLog {
    fn default() -> Self {
        Self::new_zeroed()
    }
}

/// A 128-bit counter in the little-endian byte order log pages use.
pub const fn u128_le(v: u128) -> [u8; 16] {
    v.to_le_bytes()
}

/// Reads a 128-bit little-endian log page counter.
pub const fn u128_from_le(b: [u8; 16]) -> u128 {
    u128::from_le_bytes(b)
}

/// SMART / Health Critical Warning bits.
pub mod critical_warning {
    /// Available spare is below the threshold.
    pub const SPARE: u8 = 1 << 0;
    /// A temperature is outside its threshold.
    pub const TEMPERATURE: u8 = 1 << 1;
    /// NVM subsystem reliability is degraded.
    pub const RELIABILITY: u8 = 1 << 2;
    /// All media is read only.
    pub const READ_ONLY: u8 = 1 << 3;
    /// The volatile memory backup device has failed.
    pub const VOLATILE_BACKUP: u8 = 1 << 4;
    /// The Persistent Memory Region is read only.
    pub const PMR_READ_ONLY: u8 = 1 << 5;
}

/// Firmware Slot Information log page (LID 03h; Base §5.1.12, Figure "Firmware Slot
/// Information Log Page").
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct FirmwareSlotLog {
    /// Active Firmware Info: running slot in 2:0, slot activated at next reset in 6:4.
    pub afi: u8,
    pub rsvd1: [u8; 7],
    /// Firmware Revision for slots 1..=7 (ASCII, space padded; zero = empty slot).
    pub frs: [[u8; 8]; 7],
    pub rsvd64: [u8; 448],
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<FirmwareSlotLog>() == 512);
    assert!(offset_of!(FirmwareSlotLog, frs) == 8);
    assert!(offset_of!(FirmwareSlotLog, rsvd64) == 64);
};

impl Default for FirmwareSlotLog {
    fn default() -> Self {
        Self::new_zeroed()
    }
}

impl FirmwareSlotLog {
    /// AFI value: `active` slot running, `next` (0 = none) to be activated at reset.
    pub const fn afi(active: u8, next: u8) -> u8 {
        (active & 7) | ((next & 7) << 4)
    }
}

/// Commands Supported and Effects log page (LID 05h; Base §5.1.12, Figure "Commands
/// Supported and Effects Log Page"). Each dword is indexed by opcode; see [`effects`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct CommandsSupportedAndEffects {
    /// Admin Command Supported, by admin opcode.
    pub acs: [U32; 256],
    /// I/O Command Supported, by I/O opcode (for the CSI in the command).
    pub iocs: [U32; 256],
    pub rsvd2048: [u8; 2048],
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<CommandsSupportedAndEffects>() == 4096);
    assert!(offset_of!(CommandsSupportedAndEffects, iocs) == 1024);
    assert!(offset_of!(CommandsSupportedAndEffects, rsvd2048) == 2048);
};

impl Default for CommandsSupportedAndEffects {
    fn default() -> Self {
        Self::new_zeroed()
    }
}

/// Commands Supported and Effects data structure bits (Base §5.1.12, Figure "Commands
/// Supported and Effects Data Structure").
pub mod effects {
    /// Command Supported.
    pub const CSUPP: u32 = 1 << 0;
    /// Logical Block Content Change.
    pub const LBCC: u32 = 1 << 1;
    /// Namespace Capability Change.
    pub const NCC: u32 = 1 << 2;
    /// Namespace Inventory Change.
    pub const NIC: u32 = 1 << 3;
    /// Controller Capability Change.
    pub const CCC: u32 = 1 << 4;
    /// Command Submission and Execution, bits 18:16.
    pub const CSE_SHIFT: u32 = 16;
    pub const CSE_MASK: u32 = 0b111 << CSE_SHIFT;
    /// No other command to the same namespace may be outstanding.
    pub const CSE_NS_EXCLUSIVE: u32 = 0b001 << CSE_SHIFT;
    /// No other command to any namespace may be outstanding.
    pub const CSE_ALL: u32 = 0b010 << CSE_SHIFT;
    /// UUID Selection Supported.
    pub const USS: u32 = 1 << 19;
}

/// Changed Namespace List log page (LID 04h; Base §5.1.12, Figure "Changed Attached
/// Namespace List Log Page"): up to 1024 NSIDs in increasing order, zero filled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct ChangedNamespaceList {
    pub nsid: [U32; 1024],
}

const _: () = assert!(core::mem::size_of::<ChangedNamespaceList>() == 4096);

impl Default for ChangedNamespaceList {
    fn default() -> Self {
        Self::new_zeroed()
    }
}

impl ChangedNamespaceList {
    /// The list for `changed`, which must be in increasing order. More than 1024
    /// entries are reported as a single FFFFFFFFh entry, as the specification requires.
    pub fn new(changed: &[u32]) -> Self {
        let mut l = Self::new_zeroed();
        if changed.len() > l.nsid.len() {
            l.nsid[0] = U32::new(crate::NSID_ALL);
        } else {
            for (dst, &id) in l.nsid.iter_mut().zip(changed) {
                *dst = U32::new(id);
            }
        }
        l
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(core::mem::size_of::<ErrorInformationEntry>(), 64);
        assert_eq!(core::mem::size_of::<SmartHealthLog>(), 512);
        assert_eq!(core::mem::size_of::<FirmwareSlotLog>(), 512);
        assert_eq!(core::mem::size_of::<CommandsSupportedAndEffects>(), 4096);
        assert_eq!(core::mem::size_of::<ChangedNamespaceList>(), 4096);
    }

    #[test]
    fn error_entry_fields() {
        let mut e = ErrorInformationEntry::new_zeroed();
        e.error_count = U64::new(3);
        e.sqid = U16::new(1);
        e.cid = U16::new(0xbeef);
        e.set_status(Status::INVALID_FIELD.with_dnr(), true);
        e.set_parameter_error_location(40, 3);
        e.opcode = 0x02;
        assert_eq!(e.status(), Status::INVALID_FIELD.with_dnr());
        assert!(e.phase());
        let b = e.as_bytes();
        assert_eq!(b[0], 3);
        assert_eq!(&b[10..12], &[0xef, 0xbe]);
        // SC 02h, DNR (bit 14) shifted left by one, phase tag set.
        assert_eq!(u16::from_le_bytes([b[12], b[13]]), (0x4002 << 1) | 1);
        assert_eq!(&b[14..16], &[40, 3]);
        assert_eq!(b[31], 0x02);
    }

    #[test]
    fn smart_layout_and_counters() {
        let mut s = SmartHealthLog::new_zeroed();
        s.critical_warning = critical_warning::SPARE | critical_warning::READ_ONLY;
        s.composite_temperature = U16::new(273 + 35);
        s.data_units_read = u128_le(0x0102_0304);
        s.power_cycles = u128_le(u128::MAX - 1);
        s.temp_sensor[7] = U16::new(300);
        let b = s.as_bytes();
        assert_eq!(b[0], 0b1001);
        assert_eq!(&b[1..3], &(308u16).to_le_bytes());
        assert_eq!(&b[32..36], &[4, 3, 2, 1]);
        assert!(b[36..48].iter().all(|&x| x == 0));
        assert_eq!(b[112], 0xfe);
        assert_eq!(&b[214..216], &300u16.to_le_bytes());
        assert_eq!(u128_from_le(s.power_cycles), u128::MAX - 1);
    }

    #[test]
    fn firmware_slot() {
        let mut f = FirmwareSlotLog::new_zeroed();
        f.afi = FirmwareSlotLog::afi(1, 2);
        f.frs[0] = crate::identify::ascii_pad("1.0");
        let b = f.as_bytes();
        assert_eq!(b[0], 0x21);
        assert_eq!(&b[8..16], b"1.0     ");
    }

    #[test]
    fn effects_bits() {
        let mut c = CommandsSupportedAndEffects::new_zeroed();
        c.acs[0x80] =
            U32::new(effects::CSUPP | effects::LBCC | effects::NCC | effects::NIC | effects::CSE_ALL);
        c.iocs[0x01] = U32::new(effects::CSUPP | effects::LBCC);
        let b = c.as_bytes();
        assert_eq!(&b[0x80 * 4..0x80 * 4 + 4], &[0x0f, 0, 0x02, 0]);
        assert_eq!(&b[1024 + 4..1024 + 8], &[0x03, 0, 0, 0]);
        assert_eq!(effects::CSE_MASK & effects::CSE_NS_EXCLUSIVE, 1 << 16);
    }

    #[test]
    fn changed_ns_list() {
        let l = ChangedNamespaceList::new(&[1, 5]);
        let b = l.as_bytes();
        assert_eq!(&b[0..8], &[1, 0, 0, 0, 5, 0, 0, 0]);
        assert!(b[8..].iter().all(|&x| x == 0));
        let many = [7u32; 1025];
        let l = ChangedNamespaceList::new(&many);
        assert_eq!(l.nsid[0].get(), 0xffff_ffff);
        assert!(l.nsid[1..].iter().all(|x| x.get() == 0));
    }
}
