//! Identify Controller (CNS 01h) and the NVM Command Set specific Identify Controller
//! (CNS 06h, CSI 00h), with the power state descriptors, the capability bit masks the
//! controller fields hold, and the padding helpers for its string fields.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use super::IDENTIFY_DATA_SIZE;

/// Power State Descriptor (Base §5.1.13.2.1, Figure "Identify – Power State
/// Descriptor Data Structure").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct PowerStateDescriptor {
    /// Maximum Power, in units given by [`ps_flags::MXPS`].
    pub mp: U16,
    pub rsvd2: u8,
    /// MXPS (bit 0) and NOPS (bit 1), see [`ps_flags`].
    pub flags: u8,
    /// Entry Latency in microseconds.
    pub enlat: U32,
    /// Exit Latency in microseconds.
    pub exlat: U32,
    /// Relative Read Throughput (4:0).
    pub rrt: u8,
    /// Relative Read Latency (4:0).
    pub rrl: u8,
    /// Relative Write Throughput (4:0).
    pub rwt: u8,
    /// Relative Write Latency (4:0).
    pub rwl: u8,
    /// Idle Power.
    pub idlp: U16,
    /// Idle Power Scale in bits 7:6.
    pub ips: u8,
    pub rsvd19: u8,
    /// Active Power.
    pub actp: U16,
    /// Active Power Workload in bits 2:0, Active Power Scale in bits 7:6.
    pub apw_aps: u8,
    pub rsvd23: [u8; 9],
}

const _: () = assert!(core::mem::size_of::<PowerStateDescriptor>() == 32);

/// Power State Descriptor `flags` bits.
pub mod ps_flags {
    /// Max Power Scale: `mp` is in 0.0001 W units (otherwise 0.01 W).
    pub const MXPS: u8 = 1 << 0;
    /// Non-Operational State.
    pub const NOPS: u8 = 1 << 1;
}

/// Identify Controller data structure (Base §5.1.13.2.1, Figure "Identify – Identify
/// Controller Data Structure, I/O Command Set Independent").
///
/// Fields are named after the specification's abbreviations. Bytes 1024..2048 hold
/// only NVMe over Fabrics fields (IOCCSZ, IORCSZ, ICDOFF, FCATT, MSDBD, OFCS, DCTYPE)
/// and are reserved for a PCIe controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct IdentifyController {
    /// PCI Vendor ID.
    pub vid: U16,
    /// PCI Subsystem Vendor ID.
    pub ssvid: U16,
    /// Serial Number (ASCII, space padded; see [`ascii_pad`]).
    pub sn: [u8; 20],
    /// Model Number (ASCII, space padded).
    pub mn: [u8; 40],
    /// Firmware Revision (ASCII, space padded).
    pub fr: [u8; 8],
    /// Recommended Arbitration Burst (log2 commands).
    pub rab: u8,
    /// IEEE OUI Identifier, least significant byte first.
    pub ieee: [u8; 3],
    /// Controller Multi-Path I/O and Namespace Sharing Capabilities.
    pub cmic: u8,
    /// Maximum Data Transfer Size, log2 in units of CAP.MPSMIN (0 = no limit).
    pub mdts: u8,
    /// Controller ID.
    pub cntlid: U16,
    /// Version, same encoding as the VS register.
    pub ver: U32,
    /// RTD3 Resume Latency in microseconds.
    pub rtd3r: U32,
    /// RTD3 Entry Latency in microseconds.
    pub rtd3e: U32,
    /// Optional Asynchronous Events Supported, see [`oaes`].
    pub oaes: U32,
    /// Controller Attributes.
    pub ctratt: U32,
    /// Read Recovery Levels Supported.
    pub rrls: U16,
    /// Boot Partition Capabilities.
    pub bpcap: u8,
    pub rsvd103: u8,
    /// NVM Subsystem Shutdown Latency.
    pub nssl: U32,
    pub rsvd108: [u8; 2],
    /// Power Loss Signaling Information.
    pub plsi: u8,
    /// Controller Type, see [`cntrltype`].
    pub cntrltype: u8,
    /// FRU Globally Unique Identifier.
    pub fguid: [u8; 16],
    /// Command Retry Delay Time 1, in 100 ms units.
    pub crdt1: U16,
    /// Command Retry Delay Time 2.
    pub crdt2: U16,
    /// Command Retry Delay Time 3.
    pub crdt3: U16,
    pub rsvd134: [u8; 119],
    /// NVM Subsystem Report (NVMe-MI).
    pub nvmsr: u8,
    /// VPD Write Cycle Information (NVMe-MI).
    pub vwci: u8,
    /// Management Endpoint Capabilities (NVMe-MI).
    pub mec: u8,
    /// Optional Admin Command Support, see [`oacs`].
    pub oacs: U16,
    /// Abort Command Limit, 0's based.
    pub acl: u8,
    /// Asynchronous Event Request Limit, 0's based.
    pub aerl: u8,
    /// Firmware Updates, see [`frmw`].
    pub frmw: u8,
    /// Log Page Attributes, see [`lpa`].
    pub lpa: u8,
    /// Error Log Page Entries, 0's based.
    pub elpe: u8,
    /// Number of Power States Support, 0's based.
    pub npss: u8,
    /// Admin Vendor Specific Command Configuration.
    pub avscc: u8,
    /// Autonomous Power State Transition Attributes.
    pub apsta: u8,
    /// Warning Composite Temperature Threshold, kelvins.
    pub wctemp: U16,
    /// Critical Composite Temperature Threshold, kelvins.
    pub cctemp: U16,
    /// Maximum Time for Firmware Activation, 100 ms units.
    pub mtfa: U16,
    /// Host Memory Buffer Preferred Size, 4 KiB units.
    pub hmpre: U32,
    /// Host Memory Buffer Minimum Size, 4 KiB units.
    pub hmmin: U32,
    /// Total NVM Capacity in bytes (128-bit little-endian).
    pub tnvmcap: [u8; 16],
    /// Unallocated NVM Capacity in bytes (128-bit little-endian).
    pub unvmcap: [u8; 16],
    /// Replay Protected Memory Block Support.
    pub rpmbs: U32,
    /// Extended Device Self-test Time, minutes.
    pub edstt: U16,
    /// Device Self-test Options.
    pub dsto: u8,
    /// Firmware Update Granularity, 4 KiB units (FFh = no restriction).
    pub fwug: u8,
    /// Keep Alive Support, 100 ms granularity (0 = not supported).
    pub kas: U16,
    /// Host Controlled Thermal Management Attributes.
    pub hctma: U16,
    /// Minimum Thermal Management Temperature, kelvins.
    pub mntmt: U16,
    /// Maximum Thermal Management Temperature, kelvins.
    pub mxtmt: U16,
    /// Sanitize Capabilities.
    pub sanicap: U32,
    /// Host Memory Buffer Minimum Descriptor Entry Size, 4 KiB units.
    pub hmminds: U32,
    /// Host Memory Maximum Descriptors Entries.
    pub hmmaxd: U16,
    /// NVM Set Identifier Maximum.
    pub nsetidmax: U16,
    /// Endurance Group Identifier Maximum.
    pub endgidmax: U16,
    /// ANA Transition Time, seconds.
    pub anatt: u8,
    /// Asymmetric Namespace Access Capabilities.
    pub anacap: u8,
    /// ANA Group Identifier Maximum.
    pub anagrpmax: U32,
    /// Number of ANA Group Identifiers.
    pub nanagrpid: U32,
    /// Persistent Event Log Size, 64 KiB units.
    pub pels: U32,
    /// Domain Identifier.
    pub domainid: U16,
    pub rsvd358: [u8; 10],
    /// Max Endurance Group Capacity (128-bit little-endian).
    pub megcap: [u8; 16],
    /// Temperature Threshold Hysteresis Attributes.
    pub tmpthha: u8,
    pub rsvd385: u8,
    /// Command Quiesce Time, milliseconds.
    pub cqt: U16,
    pub rsvd388: [u8; 124],
    /// Submission Queue Entry Size: required log2 in 3:0, maximum log2 in 7:4.
    pub sqes: u8,
    /// Completion Queue Entry Size: required log2 in 3:0, maximum log2 in 7:4.
    pub cqes: u8,
    /// Maximum Outstanding Commands (fabrics only; 0 on PCIe).
    pub maxcmd: U16,
    /// Number of Namespaces: the largest valid NSID.
    pub nn: U32,
    /// Optional NVM Command Support, see [`oncs`].
    pub oncs: U16,
    /// Fused Operation Support (bit 0 = Compare and Write).
    pub fuses: U16,
    /// Format NVM Attributes.
    pub fna: u8,
    /// Volatile Write Cache, see [`vwc`].
    pub vwc: u8,
    /// Atomic Write Unit Normal, logical blocks, 0's based.
    pub awun: U16,
    /// Atomic Write Unit Power Fail, logical blocks, 0's based.
    pub awupf: U16,
    /// I/O Command Set Vendor Specific Command Configuration (formerly NVSCC).
    pub icsvscc: u8,
    /// Namespace Write Protection Capabilities.
    pub nwpc: u8,
    /// Atomic Compare & Write Unit, logical blocks, 0's based.
    pub acwu: U16,
    /// Optional Copy Formats Supported (bit n = Copy Format n).
    pub ocfs: U16,
    /// SGL Support, see [`sgls`].
    pub sgls: U32,
    /// Maximum Number of Allowed Namespaces (0 = same as `nn`).
    pub mnan: U32,
    /// Maximum Domain Namespace Attachments (128-bit little-endian).
    pub maxdna: [u8; 16],
    /// Maximum I/O Controller Namespace Attachments.
    pub maxcna: U32,
    /// Optimal Aggregated Queue Depth.
    pub oaqd: U32,
    pub rsvd568: [u8; 200],
    /// NVM Subsystem NVMe Qualified Name, UTF-8, NUL terminated (see [`nul_pad`]).
    pub subnqn: [u8; 256],
    /// Reserved, and the NVMe over Fabrics area (1792..2048).
    pub rsvd1024: [u8; 1024],
    /// Power State Descriptors 0..=31.
    pub psd: [PowerStateDescriptor; 32],
    /// Vendor Specific.
    pub vs: [u8; 1024],
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<IdentifyController>() == IDENTIFY_DATA_SIZE);
    assert!(offset_of!(IdentifyController, ieee) == 73);
    assert!(offset_of!(IdentifyController, mdts) == 77);
    assert!(offset_of!(IdentifyController, ver) == 80);
    assert!(offset_of!(IdentifyController, ctratt) == 96);
    assert!(offset_of!(IdentifyController, cntrltype) == 111);
    assert!(offset_of!(IdentifyController, crdt1) == 128);
    assert!(offset_of!(IdentifyController, nvmsr) == 253);
    assert!(offset_of!(IdentifyController, oacs) == 256);
    assert!(offset_of!(IdentifyController, wctemp) == 266);
    assert!(offset_of!(IdentifyController, tnvmcap) == 280);
    assert!(offset_of!(IdentifyController, kas) == 320);
    assert!(offset_of!(IdentifyController, pels) == 352);
    assert!(offset_of!(IdentifyController, megcap) == 368);
    assert!(offset_of!(IdentifyController, sqes) == 512);
    assert!(offset_of!(IdentifyController, nn) == 516);
    assert!(offset_of!(IdentifyController, oncs) == 520);
    assert!(offset_of!(IdentifyController, vwc) == 525);
    assert!(offset_of!(IdentifyController, sgls) == 536);
    assert!(offset_of!(IdentifyController, maxdna) == 544);
    assert!(offset_of!(IdentifyController, oaqd) == 564);
    assert!(offset_of!(IdentifyController, subnqn) == 768);
    assert!(offset_of!(IdentifyController, psd) == 2048);
    assert!(offset_of!(IdentifyController, vs) == 3072);
};

impl Default for IdentifyController {
    fn default() -> Self {
        Self::new_zeroed()
    }
}

/// Controller Multi-Path I/O and Namespace Sharing Capabilities (CMIC) bits.
pub mod cmic {
    /// The NVM subsystem may have two or more controllers (with bit 0 of a
    /// namespace's NMIC, a host may reach it through each).
    pub const MULTI_CONTROLLER: u8 = 1 << 1;
    /// Asymmetric Namespace Access Reporting (the ANA log page, ANAGRPID).
    pub const ANA_REPORTING: u8 = 1 << 3;
}

/// Controller Attributes (CTRATT) bits.
pub mod ctratt {
    /// Endurance Groups are supported (ENDGIDMAX names how many).
    pub const ENDURANCE_GROUPS: u32 = 1 << 4;
    /// Extended LBA Formats Supported: the host reads each format's protection
    /// information format from Identify CNS 05h (CSI 00h).
    pub const ELBAS: u32 = 1 << 15;
    /// Flexible Data Placement is supported.
    pub const FDPS: u32 = 1 << 19;
}

/// Optional Admin Command Support (OACS) bits.
pub mod oacs {
    pub const SECURITY: u16 = 1 << 0;
    pub const FORMAT: u16 = 1 << 1;
    pub const FIRMWARE: u16 = 1 << 2;
    pub const NS_MGMT: u16 = 1 << 3;
    pub const SELF_TEST: u16 = 1 << 4;
    pub const DIRECTIVES: u16 = 1 << 5;
    pub const NVME_MI: u16 = 1 << 6;
    pub const VIRT_MGMT: u16 = 1 << 7;
    pub const DOORBELL_BUFFER_CONFIG: u16 = 1 << 8;
    pub const GET_LBA_STATUS: u16 = 1 << 9;
    pub const COMMAND_FEATURE_LOCKDOWN: u16 = 1 << 10;
}

/// Optional NVM Command Support (ONCS) bits.
pub mod oncs {
    pub const COMPARE: u16 = 1 << 0;
    pub const WRITE_UNCORRECTABLE: u16 = 1 << 1;
    /// Dataset Management.
    pub const DSM: u16 = 1 << 2;
    pub const WRITE_ZEROES: u16 = 1 << 3;
    /// Save field of Set Features and Select field of Get Features.
    pub const SAVE_SELECT: u16 = 1 << 4;
    pub const RESERVATIONS: u16 = 1 << 5;
    pub const TIMESTAMP: u16 = 1 << 6;
    pub const VERIFY: u16 = 1 << 7;
    pub const COPY: u16 = 1 << 8;
}

/// Log Page Attributes (LPA) bits.
pub mod lpa {
    /// SMART / Health information log page is available per namespace.
    pub const SMART_PER_NS: u8 = 1 << 0;
    /// Commands Supported and Effects log page.
    pub const COMMANDS_EFFECTS: u8 = 1 << 1;
    /// Extended data for Get Log Page (NUMDU, LPOU, offsets beyond 4 GiB).
    pub const EXTENDED_DATA: u8 = 1 << 2;
    /// Telemetry Host-Initiated and Controller-Initiated log pages.
    pub const TELEMETRY: u8 = 1 << 3;
    pub const PERSISTENT_EVENT: u8 = 1 << 4;
    /// Supported Log Pages, Commands Supported and Effects, Feature Identifiers
    /// Supported and Effects and NVMe-MI Commands Supported and Effects log pages.
    pub const SUPPORTED_LOG_PAGES: u8 = 1 << 5;
}

/// Volatile Write Cache (VWC) bits.
pub mod vwc {
    /// A volatile write cache is present.
    pub const PRESENT: u8 = 1 << 0;
    /// Flush Behavior (2:1) mask.
    pub const FLUSH_BEHAVIOR_MASK: u8 = 0b11 << 1;
    /// Flush with NSID FFFFFFFFh is not supported.
    pub const FLUSH_BROADCAST_NOT_SUPPORTED: u8 = 0b10 << 1;
    /// Flush with NSID FFFFFFFFh is supported.
    pub const FLUSH_BROADCAST_SUPPORTED: u8 = 0b11 << 1;
}

/// SGL Support (SGLS) bits.
pub mod sgls {
    /// SGLs supported, no alignment or granularity requirement (1:0 = 01b).
    pub const SUPPORTED_NO_ALIGN: u32 = 0b01;
    /// SGLs supported, dword alignment and granularity required (1:0 = 10b).
    pub const SUPPORTED_DWORD_ALIGN: u32 = 0b10;
    /// Mask of the SGL Support sub-field.
    pub const SUPPORT_MASK: u32 = 0b11;
    /// Keyed SGL Data Block descriptor.
    pub const KEYED: u32 = 1 << 2;
    /// SGL Bit Bucket descriptor.
    pub const BIT_BUCKET: u32 = 1 << 16;
    /// Byte aligned contiguous physical buffer of metadata (MPTR without an SGL).
    pub const MPTR_CONTIGUOUS: u32 = 1 << 17;
    /// SGL length may be larger than the amount of data to transfer.
    pub const LENGTH_LARGER_THAN_DATA: u32 = 1 << 18;
    /// MPTR may point to a single SGL descriptor.
    pub const MPTR_SGL: u32 = 1 << 19;
    /// The Address field of a Data Block descriptor may be an offset.
    pub const ADDRESS_AS_OFFSET: u32 = 1 << 20;
    /// Transport SGL Data Block descriptor.
    pub const TRANSPORT_DATA_BLOCK: u32 = 1 << 21;
}

/// Optional Asynchronous Events Supported (OAES) bits.
pub mod oaes {
    /// Namespace Attribute Notices (Changed Namespace List).
    pub const NS_ATTRIBUTE_CHANGED: u32 = 1 << 8;
    /// Firmware Activation Notices.
    pub const FW_ACTIVATION: u32 = 1 << 9;
    /// Asymmetric Namespace Access Change Notices.
    pub const ANA_CHANGE: u32 = 1 << 11;
    /// Zone Descriptor Changed Notices (ZNS).
    pub const ZONE_DESCRIPTOR_CHANGED: u32 = 1 << 27;
}

/// Firmware Updates (FRMW) bits.
pub mod frmw {
    /// Firmware slot 1 is read only.
    pub const SLOT1_READ_ONLY: u8 = 1 << 0;
    /// Number of firmware slots, bits 3:1.
    pub const NUM_SLOTS_MASK: u8 = 0b111 << 1;
    /// Firmware activation without a reset is supported.
    pub const ACTIVATION_WITHOUT_RESET: u8 = 1 << 4;
    /// Multiple update detection is supported.
    pub const MULTIPLE_UPDATE_DETECTION: u8 = 1 << 5;

    /// The FRMW value advertising `n` slots (1..=7) with no other attribute.
    pub const fn num_slots(n: u8) -> u8 {
        (n << 1) & NUM_SLOTS_MASK
    }
}

/// Controller Type (CNTRLTYPE) values.
pub mod cntrltype {
    pub const NOT_REPORTED: u8 = 0;
    pub const IO: u8 = 1;
    pub const DISCOVERY: u8 = 2;
    pub const ADMINISTRATIVE: u8 = 3;
}

/// `s` as an ASCII field of `N` bytes: space padded and truncated, as Identify
/// Controller SN, MN and FR require. Characters outside printable ASCII become `?`.
pub fn ascii_pad<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [b' '; N];
    for (dst, c) in out.iter_mut().zip(s.chars()) {
        *dst = if c == ' ' || c.is_ascii_graphic() { c as u8 } else { b'?' };
    }
    out
}

/// `s` as a UTF-8 field of `N` bytes, NUL padded and always NUL terminated (for SUBNQN).
/// A string that does not fit is cut at the last character boundary that does.
pub fn nul_pad<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let mut len = s.len().min(N.saturating_sub(1));
    while !s.is_char_boundary(len) {
        len -= 1;
    }
    out[..len].copy_from_slice(&s.as_bytes()[..len]);
    out
}

/// I/O Command Set specific Identify Controller data structure for the NVM Command Set
/// (CNS 06h, CSI 00h; NVM, Figure "Identify I/O Command Set Specific Controller Data
/// Structure for the NVM Command Set").
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct IoCommandSetNvmController {
    /// Verify Size Limit, log2 in units of CAP.MPSMIN (0 = no limit).
    pub vsl: u8,
    /// Write Zeroes Size Limit, log2 in units of CAP.MPSMIN (0 = no limit).
    pub wzsl: u8,
    /// Write Uncorrectable Size Limit, log2 in units of CAP.MPSMIN (0 = no limit).
    pub wusl: u8,
    /// Dataset Management Ranges Limit (0 = not reported).
    pub dmrl: u8,
    /// Dataset Management Range Size Limit, logical blocks (0 = not reported).
    pub dmrsl: U32,
    /// Dataset Management Size Limit, logical blocks (0 = not reported).
    pub dmsl: U64,
    pub rsvd16: [u8; 4080],
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<IoCommandSetNvmController>() == IDENTIFY_DATA_SIZE);
    assert!(offset_of!(IoCommandSetNvmController, dmrsl) == 4);
    assert!(offset_of!(IoCommandSetNvmController, dmsl) == 8);
};

impl Default for IoCommandSetNvmController {
    fn default() -> Self {
        Self::new_zeroed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_bytes_land_at_spec_offsets() {
        let mut c = IdentifyController::new_zeroed();
        c.vid = U16::new(0x1b36);
        c.mdts = 5;
        c.ver = U32::new(0x0001_0400);
        c.oacs = U16::new(oacs::FORMAT | oacs::DOORBELL_BUFFER_CONFIG);
        c.sqes = 0x66;
        c.cqes = 0x44;
        c.nn = U32::new(256);
        c.vwc = vwc::PRESENT | vwc::FLUSH_BROADCAST_SUPPORTED;
        c.sgls = U32::new(sgls::SUPPORTED_NO_ALIGN | sgls::BIT_BUCKET);
        c.subnqn = nul_pad("nqn.2014-08.org.example:vnvme");
        c.psd[1].mp = U16::new(0x1234);
        let b = c.as_bytes();
        assert_eq!(&b[0..2], &[0x36, 0x1b]);
        assert_eq!(b[77], 5);
        assert_eq!(&b[80..84], &[0x00, 0x04, 0x01, 0x00]);
        assert_eq!(&b[256..258], &[0x02, 0x01]);
        assert_eq!(b[512], 0x66);
        assert_eq!(b[513], 0x44);
        assert_eq!(&b[516..520], &[0, 1, 0, 0]);
        assert_eq!(b[525], 0b111);
        assert_eq!(&b[536..540], &[0x01, 0x00, 0x01, 0x00]);
        assert_eq!(&b[768..772], b"nqn.");
        assert_eq!(b[768 + 255], 0);
        assert_eq!(&b[2048 + 32..2048 + 34], &[0x34, 0x12]);
    }

    #[test]
    fn ascii_pad_pads_and_truncates() {
        assert_eq!(ascii_pad::<8>("1.0"), *b"1.0     ");
        assert_eq!(ascii_pad::<4>("vnvme"), *b"vnvm");
        assert_eq!(ascii_pad::<4>(""), *b"    ");
        assert_eq!(ascii_pad::<5>("a\u{e9}b\tc"), *b"a?b?c");
    }

    #[test]
    fn nul_pad_terminates() {
        assert_eq!(nul_pad::<4>("abcdef"), *b"abc\0");
        assert_eq!(nul_pad::<6>("ab"), *b"ab\0\0\0\0");
        // 'é' is two bytes and does not fit before the terminator.
        assert_eq!(nul_pad::<4>("ab\u{e9}"), *b"ab\0\0");
    }
}
