//! Identify data structures (Base §5.1.13, NVM Command Set Identify data).
//!
//! Every structure here is exactly the bytes the controller copies to the host for one
//! CNS value; reserved areas are grouped into `rsvdNNN` arrays named by their starting
//! byte offset, and the layouts are checked at compile time.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

/// Size of every Identify data structure.
pub const IDENTIFY_DATA_SIZE: usize = 4096;

/// Controller or Namespace Structure values (Base §5.1.13, Figure "CNS Values").
pub mod cns {
    /// Identify Namespace data structure for the specified NSID (NVM Command Set).
    pub const NAMESPACE: u8 = 0x00;
    /// Identify Controller data structure.
    pub const CONTROLLER: u8 = 0x01;
    /// Active Namespace ID list.
    pub const ACTIVE_NAMESPACE_LIST: u8 = 0x02;
    /// Namespace Identification Descriptor list.
    pub const NS_DESCRIPTOR_LIST: u8 = 0x03;
    /// I/O Command Set specific Identify Namespace data structure.
    pub const CSI_NAMESPACE: u8 = 0x05;
    /// I/O Command Set specific Identify Controller data structure.
    pub const CSI_CONTROLLER: u8 = 0x06;
    /// Active Namespace ID list associated with the specified I/O Command Set.
    pub const CSI_ACTIVE_NAMESPACE_LIST: u8 = 0x07;
    /// I/O Command Set Independent Identify Namespace data structure.
    pub const CS_INDEPENDENT_NAMESPACE: u8 = 0x08;
}

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

/// LBA Format data structure (NVM, Figure "LBA Format Data Structure, NVM Command Set").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct LbaFormat {
    /// Metadata Size in bytes per logical block.
    pub ms: U16,
    /// LBA Data Size, log2 bytes (9 = 512 B, 12 = 4 KiB); 0 = format not supported.
    pub lbads: u8,
    /// Relative Performance in bits 1:0 (0 = best .. 3 = degraded).
    pub rp: u8,
}

const _: () = assert!(core::mem::size_of::<LbaFormat>() == 4);

impl LbaFormat {
    pub fn new(lbads: u8, ms: u16) -> Self {
        LbaFormat { ms: U16::new(ms), lbads, rp: 0 }
    }
    /// Logical block data size in bytes (0 if the format is unused).
    pub fn block_size(&self) -> u64 {
        if self.lbads == 0 || self.lbads >= 64 {
            0
        } else {
            1 << self.lbads
        }
    }
}

/// Identify Namespace data structure for the NVM Command Set (CNS 00h; NVM,
/// Figure "Identify Namespace Data Structure, NVM Command Set").
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct IdentifyNamespace {
    /// Namespace Size in logical blocks.
    pub nsze: U64,
    /// Namespace Capacity in logical blocks.
    pub ncap: U64,
    /// Namespace Utilization in logical blocks.
    pub nuse: U64,
    /// Namespace Features, see [`nsfeat`].
    pub nsfeat: u8,
    /// Number of LBA Formats, 0's based.
    pub nlbaf: u8,
    /// Formatted LBA Size, see [`flbas`].
    pub flbas: u8,
    /// Metadata Capabilities.
    pub mc: u8,
    /// End-to-end Data Protection Capabilities.
    pub dpc: u8,
    /// End-to-end Data Protection Type Settings.
    pub dps: u8,
    /// Namespace Multi-path I/O and Namespace Sharing Capabilities.
    pub nmic: u8,
    /// Reservation Capabilities.
    pub rescap: u8,
    /// Format Progress Indicator.
    pub fpi: u8,
    /// Deallocate Logical Block Features, see [`dlfeat`].
    pub dlfeat: u8,
    /// Namespace Atomic Write Unit Normal, 0's based.
    pub nawun: U16,
    /// Namespace Atomic Write Unit Power Fail, 0's based.
    pub nawupf: U16,
    /// Namespace Atomic Compare & Write Unit, 0's based.
    pub nacwu: U16,
    /// Namespace Atomic Boundary Size Normal.
    pub nabsn: U16,
    /// Namespace Atomic Boundary Offset.
    pub nabo: U16,
    /// Namespace Atomic Boundary Size Power Fail.
    pub nabspf: U16,
    /// Namespace Optimal I/O Boundary, logical blocks.
    pub noiob: U16,
    /// NVM Capacity in bytes (128-bit little-endian).
    pub nvmcap: [u8; 16],
    /// Namespace Preferred Write Granularity, 0's based.
    pub npwg: U16,
    /// Namespace Preferred Write Alignment, 0's based.
    pub npwa: U16,
    /// Namespace Preferred Deallocate Granularity, 0's based.
    pub npdg: U16,
    /// Namespace Preferred Deallocate Alignment, 0's based.
    pub npda: U16,
    /// Namespace Optimal Write Size, 0's based.
    pub nows: U16,
    /// Maximum Single Source Range Length (Copy).
    pub mssrl: U16,
    /// Maximum Copy Length.
    pub mcl: U32,
    /// Maximum Source Range Count, 0's based.
    pub msrc: u8,
    /// Key Per I/O Status.
    pub kpios: u8,
    /// Number of Unique Attribute LBA Formats.
    pub nulbaf: u8,
    pub rsvd83: u8,
    /// Key Per I/O Data Access Alignment and Granularity.
    pub kpiodaag: U32,
    pub rsvd88: [u8; 4],
    /// ANA Group Identifier.
    pub anagrpid: U32,
    pub rsvd96: [u8; 3],
    /// Namespace Attributes (bit 0 = write protected).
    pub nsattr: u8,
    /// NVM Set Identifier.
    pub nvmsetid: U16,
    /// Endurance Group Identifier.
    pub endgid: U16,
    /// Namespace Globally Unique Identifier.
    pub nguid: [u8; 16],
    /// IEEE Extended Unique Identifier.
    pub eui64: [u8; 8],
    /// LBA Format 0..=63 support.
    pub lbaf: [LbaFormat; 64],
    pub rsvd384: [u8; 3328],
    /// Vendor Specific.
    pub vs: [u8; 384],
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<IdentifyNamespace>() == IDENTIFY_DATA_SIZE);
    assert!(offset_of!(IdentifyNamespace, nsfeat) == 24);
    assert!(offset_of!(IdentifyNamespace, nlbaf) == 25);
    assert!(offset_of!(IdentifyNamespace, flbas) == 26);
    assert!(offset_of!(IdentifyNamespace, dlfeat) == 33);
    assert!(offset_of!(IdentifyNamespace, noiob) == 46);
    assert!(offset_of!(IdentifyNamespace, nvmcap) == 48);
    assert!(offset_of!(IdentifyNamespace, npwg) == 64);
    assert!(offset_of!(IdentifyNamespace, mssrl) == 74);
    assert!(offset_of!(IdentifyNamespace, nulbaf) == 82);
    assert!(offset_of!(IdentifyNamespace, anagrpid) == 92);
    assert!(offset_of!(IdentifyNamespace, nsattr) == 99);
    assert!(offset_of!(IdentifyNamespace, nguid) == 104);
    assert!(offset_of!(IdentifyNamespace, eui64) == 120);
    assert!(offset_of!(IdentifyNamespace, lbaf) == 128);
    assert!(offset_of!(IdentifyNamespace, vs) == 3712);
};

impl Default for IdentifyNamespace {
    fn default() -> Self {
        Self::new_zeroed()
    }
}

impl IdentifyNamespace {
    /// The LBA format selected by FLBAS.
    pub fn current_lbaf(&self) -> LbaFormat {
        self.lbaf[flbas::format_index(self.flbas) as usize & 63]
    }
}

/// Namespace Features (NSFEAT) bits.
pub mod nsfeat {
    /// Thin provisioning.
    pub const THIN_PROVISIONING: u8 = 1 << 0;
    /// NAWUN, NAWUPF and NACWU are defined for this namespace.
    pub const NSABP: u8 = 1 << 1;
    /// Deallocated or Unwritten Logical Block error supported.
    pub const DAE: u8 = 1 << 2;
    /// NGUID and EUI64 are never reused.
    pub const UIDREUSE: u8 = 1 << 3;
    /// NPWG, NPWA, NPDG, NPDA and NOWS are defined.
    pub const OPTPERF: u8 = 1 << 4;
}

/// Deallocate Logical Block Features (DLFEAT) bits.
pub mod dlfeat {
    /// Read behavior of deallocated blocks, bits 2:0.
    pub const READ_BEHAVIOR_MASK: u8 = 0b111;
    /// Deallocated blocks read as all zeroes.
    pub const READ_ZEROES: u8 = 0b001;
    /// Deallocated blocks read as all ones.
    pub const READ_ONES: u8 = 0b010;
    /// Write Zeroes supports the Deallocate bit.
    pub const WRITE_ZEROES_DEALLOC: u8 = 1 << 3;
    /// The guard field of deallocated blocks holds the CRC of the data read.
    pub const GUARD_CRC: u8 = 1 << 4;
}

/// Formatted LBA Size (FLBAS) encoding.
pub mod flbas {
    /// Metadata is transferred at the end of the data LBA (extended LBA).
    pub const EXTENDED_METADATA: u8 = 1 << 4;

    /// LBA format index: bits 3:0 are the low nibble, bits 6:5 the high two bits.
    pub const fn format_index(flbas: u8) -> u8 {
        (flbas & 0x0f) | ((flbas >> 1) & 0x30)
    }

    /// The FLBAS value selecting format `index` (0..=63).
    pub const fn from_index(index: u8, extended_metadata: bool) -> u8 {
        let ext = if extended_metadata { EXTENDED_METADATA } else { 0 };
        (index & 0x0f) | ((index & 0x30) << 1) | ext
    }
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

/// Namespace Identification Descriptor header (CNS 03h; Base §5.1.13, Figure
/// "Identify – Namespace Identification Descriptor"). The NIDL-byte identifier follows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct NsIdDescriptorHeader {
    /// Namespace Identifier Type, see [`nidt`].
    pub nidt: u8,
    /// Namespace Identifier Length in bytes.
    pub nidl: u8,
    pub rsvd2: [u8; 2],
}

const _: () = assert!(core::mem::size_of::<NsIdDescriptorHeader>() == 4);

/// Namespace Identifier Types and their lengths.
pub mod nidt {
    /// IEEE Extended Unique Identifier.
    pub const EUI64: u8 = 0x1;
    pub const EUI64_LEN: u8 = 8;
    /// Namespace Globally Unique Identifier.
    pub const NGUID: u8 = 0x2;
    pub const NGUID_LEN: u8 = 16;
    /// Namespace UUID.
    pub const UUID: u8 = 0x3;
    pub const UUID_LEN: u8 = 16;
    /// Command Set Identifier.
    pub const CSI: u8 = 0x4;
    pub const CSI_LEN: u8 = 1;
}

/// Serialises `(nidt, identifier)` pairs into a Namespace Identification Descriptor
/// list: each entry is a 4-byte header followed by the identifier, and the rest of the
/// 4096-byte buffer is zero (which terminates the list).
///
/// Entries with type 0 or an empty identifier (which would read as the terminator), with
/// an identifier longer than 255 bytes, or that no longer fit in the buffer are left out.
pub fn ns_descriptor_list(descs: &[(u8, &[u8])]) -> [u8; IDENTIFY_DATA_SIZE] {
    let mut out = [0u8; IDENTIFY_DATA_SIZE];
    let mut pos = 0;
    for &(nidt, id) in descs {
        let Ok(nidl) = u8::try_from(id.len()) else {
            continue;
        };
        if nidt == 0 || nidl == 0 {
            continue;
        }
        let end = pos + 4 + id.len();
        if end > out.len() {
            continue;
        }
        let hdr = NsIdDescriptorHeader { nidt, nidl, rsvd2: [0; 2] };
        out[pos..pos + 4].copy_from_slice(hdr.as_bytes());
        out[pos + 4..end].copy_from_slice(id);
        pos = end;
    }
    out
}

/// Maximum entries in a namespace ID list (CNS 02h, 07h, ...).
pub const NS_LIST_MAX: usize = 1024;

/// The Active Namespace ID list (CNS 02h; Base §5.1.13, Figure "Namespace List"):
/// up to 1024 NSIDs in increasing order, zero filled.
pub type ActiveNamespaceList = [U32; NS_LIST_MAX];

/// Builds an Active Namespace ID list: the NSIDs from `nsids` that are strictly greater
/// than `after`, in ascending order without duplicates, at most 1024 of them (the
/// smallest), as little-endian dwords, zero filled. `nsids` may come in any order;
/// 0 and FFFFFFFFh are never listed.
pub fn active_ns_list(after: u32, nsids: impl Iterator<Item = u32>) -> [u8; IDENTIFY_DATA_SIZE] {
    let mut list = [0u32; NS_LIST_MAX];
    let mut len = 0usize;
    for id in nsids {
        if id <= after || id == crate::NSID_ALL {
            continue;
        }
        let Err(pos) = list[..len].binary_search(&id) else {
            continue; // duplicate
        };
        if pos >= NS_LIST_MAX {
            continue; // larger than the 1024 smallest seen so far
        }
        if len < NS_LIST_MAX {
            list.copy_within(pos..len, pos + 1);
            len += 1;
        } else {
            list.copy_within(pos..NS_LIST_MAX - 1, pos + 1);
        }
        list[pos] = id;
    }
    let mut out = [0u8; IDENTIFY_DATA_SIZE];
    for (dst, id) in out.chunks_exact_mut(4).zip(&list[..len]) {
        dst.copy_from_slice(&id.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(core::mem::size_of::<IdentifyController>(), 4096);
        assert_eq!(core::mem::size_of::<IdentifyNamespace>(), 4096);
        assert_eq!(core::mem::size_of::<IoCommandSetNvmController>(), 4096);
        assert_eq!(core::mem::size_of::<ActiveNamespaceList>(), 4096);
        assert_eq!(core::mem::size_of::<PowerStateDescriptor>(), 32);
    }

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

    #[test]
    fn flbas_index() {
        assert_eq!(flbas::format_index(0x00), 0);
        assert_eq!(flbas::format_index(0x0f), 15);
        assert_eq!(flbas::format_index(0x10 | 0x03), 3);
        assert_eq!(flbas::format_index(0x20), 16);
        assert_eq!(flbas::format_index(0x60 | 0x0f), 63);
        for i in 0..64 {
            assert_eq!(flbas::format_index(flbas::from_index(i, true)), i);
            assert_eq!(flbas::from_index(i, true) & flbas::EXTENDED_METADATA, flbas::EXTENDED_METADATA);
        }
    }

    #[test]
    fn namespace_layout() {
        let mut ns = IdentifyNamespace::new_zeroed();
        ns.nsze = U64::new(0x1000);
        ns.nlbaf = 1;
        ns.flbas = flbas::from_index(1, false);
        ns.dlfeat = dlfeat::READ_ZEROES | dlfeat::WRITE_ZEROES_DEALLOC;
        ns.lbaf[0] = LbaFormat::new(9, 0);
        ns.lbaf[1] = LbaFormat::new(12, 8);
        ns.eui64 = [1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(ns.current_lbaf().block_size(), 4096);
        let b = ns.as_bytes();
        assert_eq!(&b[0..8], &[0, 0x10, 0, 0, 0, 0, 0, 0]);
        assert_eq!(b[25], 1);
        assert_eq!(b[26], 1);
        assert_eq!(b[33], 0b1001);
        assert_eq!(&b[120..128], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[128..136], &[0, 0, 9, 0, 8, 0, 12, 0]);
    }

    #[test]
    fn descriptor_list() {
        let eui = [0xaa; 8];
        let nguid = [0x11; 16];
        let buf = ns_descriptor_list(&[(nidt::EUI64, &eui), (nidt::NGUID, &nguid), (nidt::CSI, &[0])]);
        assert_eq!(&buf[0..4], &[1, 8, 0, 0]);
        assert_eq!(&buf[4..12], &eui);
        assert_eq!(&buf[12..16], &[2, 16, 0, 0]);
        assert_eq!(&buf[16..32], &nguid);
        assert_eq!(&buf[32..36], &[4, 1, 0, 0]);
        assert_eq!(buf[36], 0);
        assert!(buf[37..].iter().all(|&b| b == 0));
    }

    #[test]
    fn descriptor_list_skips_invalid_and_overflow() {
        let big = [0x55u8; 255];
        let descs = [(nidt::UUID, &big[..]); 20];
        let buf = ns_descriptor_list(&descs);
        // 259 bytes per entry: 15 fit in 4096 (3885 bytes), the rest is zero.
        assert_eq!(&buf[15 * 259 - 259..15 * 259 - 255], &[3, 255, 0, 0]);
        assert!(buf[15 * 259..].iter().all(|&b| b == 0));
        let empty = ns_descriptor_list(&[(nidt::EUI64, &[]), (0, &[1, 2])]);
        assert!(empty.iter().all(|&b| b == 0));
    }

    fn decode(list: &[u8; 4096]) -> impl Iterator<Item = u32> + '_ {
        list.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).take_while(|&id| id != 0)
    }

    #[test]
    fn active_ns_list_filters_and_sorts() {
        let list = active_ns_list(2, [7u32, 1, 3, 2, 5, 7, 0, crate::NSID_ALL].into_iter());
        let got: [u32; 3] = {
            let mut a = [0; 3];
            for (d, s) in a.iter_mut().zip(decode(&list)) {
                *d = s;
            }
            a
        };
        assert_eq!(got, [3, 5, 7]);
        assert_eq!(decode(&list).count(), 3);
        assert!(list[12..].iter().all(|&b| b == 0));

        let none = active_ns_list(0, core::iter::empty());
        assert!(none.iter().all(|&b| b == 0));
    }

    #[test]
    fn active_ns_list_keeps_smallest_1024() {
        // 3000 down to 1: the list must be 1..=1024 in order.
        let list = active_ns_list(0, (1..=3000u32).rev());
        assert_eq!(decode(&list).count(), 1024);
        for (i, id) in decode(&list).enumerate() {
            assert_eq!(id, i as u32 + 1);
        }
        let list = active_ns_list(1000, 1..=5000u32);
        assert_eq!(decode(&list).next(), Some(1001));
        assert_eq!(decode(&list).last(), Some(2024));
    }
}
