//! Message layouts. All fields are little-endian; sizes are checked at compile time.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Command numbers (vfio-user.rst "Commands").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Command {
    Version = 1,
    DmaMap = 2,
    DmaUnmap = 3,
    DeviceGetInfo = 4,
    DeviceGetRegionInfo = 5,
    DeviceGetRegionIoFds = 6,
    DeviceGetIrqInfo = 7,
    DeviceSetIrqs = 8,
    RegionRead = 9,
    RegionWrite = 10,
    DmaRead = 11,
    DmaWrite = 12,
    DeviceReset = 13,
    RegionWriteMulti = 15,
    DeviceFeature = 16,
    MigDataRead = 17,
    MigDataWrite = 18,
}

impl Command {
    pub fn from_u16(v: u16) -> Option<Self> {
        use Command::*;
        Some(match v {
            1 => Version,
            2 => DmaMap,
            3 => DmaUnmap,
            4 => DeviceGetInfo,
            5 => DeviceGetRegionInfo,
            6 => DeviceGetRegionIoFds,
            7 => DeviceGetIrqInfo,
            8 => DeviceSetIrqs,
            9 => RegionRead,
            10 => RegionWrite,
            11 => DmaRead,
            12 => DmaWrite,
            13 => DeviceReset,
            15 => RegionWriteMulti,
            16 => DeviceFeature,
            17 => MigDataRead,
            18 => MigDataWrite,
            _ => return None,
        })
    }
}

/// Header flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsgFlags(pub u32);

impl MsgFlags {
    pub const TYPE_MASK: u32 = 0xf;
    pub const COMMAND: u32 = 0x0;
    pub const REPLY: u32 = 0x1;
    pub const NO_REPLY: u32 = 0x10;
    pub const ERROR: u32 = 0x20;

    pub fn is_reply(self) -> bool {
        self.0 & Self::TYPE_MASK == Self::REPLY
    }
    pub fn no_reply(self) -> bool {
        self.0 & Self::NO_REPLY != 0
    }
    pub fn is_error(self) -> bool {
        self.0 & Self::ERROR != 0
    }
}

/// The 16-byte header in front of every message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct Header {
    pub msg_id: U16,
    pub command: U16,
    /// Size of the whole message, header included.
    pub size: U32,
    pub flags: U32,
    /// errno of a failed command (replies with the Error flag).
    pub error: U32,
}

pub const HEADER_SIZE: usize = 16;
const _: () = assert!(size_of::<Header>() == HEADER_SIZE);

/// DMA_MAP payload.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct DmaMap {
    pub argsz: U32,
    pub flags: U32,
    /// Offset into the passed file descriptor.
    pub offset: U64,
    /// Guest (IOVA) address.
    pub address: U64,
    pub size: U64,
}
const _: () = assert!(size_of::<DmaMap>() == 32);

pub const DMA_MAP_FLAG_READ: u32 = 1 << 0;
pub const DMA_MAP_FLAG_WRITE: u32 = 1 << 1;

/// DMA_UNMAP payload.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct DmaUnmap {
    pub argsz: U32,
    pub flags: U32,
    pub address: U64,
    pub size: U64,
}
const _: () = assert!(size_of::<DmaUnmap>() == 24);

/// `VFIO_DMA_UNMAP_FLAG_ALL`: unmap everything (address and size are 0).
pub const DMA_UNMAP_FLAG_ALL: u32 = 1 << 1;

/// DEVICE_GET_INFO payload (request and reply).
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct DeviceInfo {
    pub argsz: U32,
    pub flags: U32,
    pub num_regions: U32,
    pub num_irqs: U32,
}
const _: () = assert!(size_of::<DeviceInfo>() == 16);

pub const DEVICE_FLAGS_RESET: u32 = 1 << 0;
pub const DEVICE_FLAGS_PCI: u32 = 1 << 1;

/// DEVICE_GET_REGION_INFO payload (`struct vfio_region_info`).
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct RegionInfo {
    pub argsz: U32,
    pub flags: U32,
    pub index: U32,
    pub cap_offset: U32,
    pub size: U64,
    pub offset: U64,
}
const _: () = assert!(size_of::<RegionInfo>() == 32);

pub const REGION_FLAG_READ: u32 = 1 << 0;
pub const REGION_FLAG_WRITE: u32 = 1 << 1;
pub const REGION_FLAG_MMAP: u32 = 1 << 2;
pub const REGION_FLAG_CAPS: u32 = 1 << 3;

/// Capability header in a region info reply.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct CapHeader {
    pub id: U16,
    pub version: U16,
    pub next: U32,
}
pub const CAP_SPARSE_MMAP: u16 = 1;

/// Sparse mmap capability body (after the header): count, then areas.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct SparseMmapHeader {
    pub nr_areas: U32,
    pub reserved: U32,
}

#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct SparseMmapArea {
    pub offset: U64,
    pub size: U64,
}

/// DEVICE_GET_REGION_IO_FDS request / reply head.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct RegionIoFds {
    pub argsz: U32,
    pub flags: U32,
    pub index: U32,
    pub count: U32,
}
const _: () = assert!(size_of::<RegionIoFds>() == 16);

/// One sub-region of a DEVICE_GET_REGION_IO_FDS reply.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct IoFdSubRegion {
    pub offset: U64,
    pub size: U64,
    pub fd_index: U32,
    /// 0 = ioeventfd.
    pub kind: U32,
    pub flags: U32,
    pub padding: U32,
    pub datamatch: U64,
}
const _: () = assert!(size_of::<IoFdSubRegion>() == 40);

/// DEVICE_GET_IRQ_INFO payload.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct IrqInfo {
    pub argsz: U32,
    pub flags: U32,
    pub index: U32,
    pub count: U32,
}
const _: () = assert!(size_of::<IrqInfo>() == 16);

pub const IRQ_INFO_EVENTFD: u32 = 1 << 0;
pub const IRQ_INFO_MASKABLE: u32 = 1 << 1;
pub const IRQ_INFO_AUTOMASKED: u32 = 1 << 2;
pub const IRQ_INFO_NORESIZE: u32 = 1 << 3;

/// PCI IRQ indices (linux/vfio.h).
pub const IRQ_INDEX_INTX: u32 = 0;
pub const IRQ_INDEX_MSI: u32 = 1;
pub const IRQ_INDEX_MSIX: u32 = 2;
pub const IRQ_INDEX_ERR: u32 = 3;
pub const IRQ_INDEX_REQ: u32 = 4;
pub const NUM_IRQ_INDICES: u32 = 5;

/// DEVICE_SET_IRQS payload head (data follows for DATA_BOOL).
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct SetIrqs {
    pub argsz: U32,
    pub flags: U32,
    pub index: U32,
    pub start: U32,
    pub count: U32,
}
const _: () = assert!(size_of::<SetIrqs>() == 20);

pub const IRQ_SET_DATA_NONE: u32 = 1 << 0;
pub const IRQ_SET_DATA_BOOL: u32 = 1 << 1;
pub const IRQ_SET_DATA_EVENTFD: u32 = 1 << 2;
pub const IRQ_SET_ACTION_MASK: u32 = 1 << 3;
pub const IRQ_SET_ACTION_UNMASK: u32 = 1 << 4;
pub const IRQ_SET_ACTION_TRIGGER: u32 = 1 << 5;

/// REGION_READ / REGION_WRITE head (data follows).
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct RegionAccess {
    pub offset: U64,
    pub region: U32,
    pub count: U32,
}
const _: () = assert!(size_of::<RegionAccess>() == 16);

/// PCI region indices (linux/vfio.h).
pub const REGION_BAR0: u32 = 0;
pub const REGION_BAR4: u32 = 4;
pub const REGION_BAR5: u32 = 5;
pub const REGION_ROM: u32 = 6;
pub const REGION_CONFIG: u32 = 7;
pub const REGION_VGA: u32 = 8;
pub const NUM_REGIONS: u32 = 9;

/// Largest payload we accept in one message (data transfers are capped at 1 MiB by the
/// negotiated `max_data_xfer_size`; this leaves room for headers).
pub const MAX_MESSAGE: usize = (1 << 20) + 4096;

/// VFIO_USER_DEVICE_FEATURE (linux/vfio.h `struct vfio_device_feature`): the feature
/// index in the low 16 bits of `flags`, and what to do with it.
pub const DEVICE_FEATURE_MASK: u32 = 0xffff;
pub const DEVICE_FEATURE_GET: u32 = 1 << 16;
pub const DEVICE_FEATURE_SET: u32 = 1 << 17;
pub const DEVICE_FEATURE_PROBE: u32 = 1 << 18;
/// Features (indexes).
pub const DEVICE_FEATURE_MIGRATION: u32 = 1;
pub const DEVICE_FEATURE_MIG_DEVICE_STATE: u32 = 2;
pub const DEVICE_FEATURE_DMA_LOGGING_START: u32 = 6;
pub const DEVICE_FEATURE_DMA_LOGGING_STOP: u32 = 7;
pub const DEVICE_FEATURE_DMA_LOGGING_REPORT: u32 = 8;
/// `DEVICE_FEATURE_MIGRATION` flags: the STOP_COPY state is offered.
pub const MIGRATION_STOP_COPY: u64 = 1 << 0;
/// `enum vfio_device_mig_state`: the migration states vfio-user uses.
pub const MIG_STATE_ERROR: u32 = 0;
pub const MIG_STATE_STOP: u32 = 1;
pub const MIG_STATE_RUNNING: u32 = 2;
pub const MIG_STATE_STOP_COPY: u32 = 3;
pub const MIG_STATE_RESUMING: u32 = 4;
