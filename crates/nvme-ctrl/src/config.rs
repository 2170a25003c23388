//! What a controller is built from.

use std::sync::Arc;
use std::time::Duration;

use block_backend::Backend;

/// How long a namespace's backend may take with a command unless configured: what
/// Linux waits for an I/O before it aborts it (nvme_core.io_timeout).
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// Command Retry Delay Times (Identify Controller CRDT1-3, in 100 ms): how long a
/// host that enabled Advanced Command Retry (Linux does) waits before it retries a
/// command whose status names one (CRD; `error::retry_delay` decides which).
/// CRD 1, 1 s: the storage is unreachable (Namespace Not Ready): Linux's five
/// retries then span five seconds, what a network backend's reconnect takes, instead
/// of failing the I/O within microseconds. CRD 2, 5 s: a command timed out at the
/// backend (Internal Error after the namespace timeout). CRDT3 is not used.
pub const RETRY_DELAYS: [u16; 3] = [10, 50, 0];

/// The most namespaces a controller may have (NN): the Changed Namespace List log
/// names up to 1,024, and every engine keeps a slot per NSID.
pub const MAX_NAMESPACES: u32 = 1024;

/// One namespace to attach at start.
#[derive(Clone, Debug)]
pub struct NamespaceConfig {
    pub backend: Arc<dyn Backend>,
    /// Index into [`crate::namespace::LBA_FORMATS`] (0 = 512 B, 1 = 4 KiB; those
    /// with metadata only with [`NamespaceConfig::metadata`]).
    pub lba_format: u8,
    /// A command its backend has not finished after this long completes with an
    /// error and its backend requests are abandoned (None: wait forever).
    pub timeout: Option<Duration>,
    /// Its NSID (None: its position in [`ControllerConfig::namespaces`] plus one).
    pub nsid: Option<u32>,
    /// A zoned namespace's layout (None: the NVM command set).
    pub zoned: Option<crate::zoned::ZonedConfig>,
    /// Where its metadata is kept, and its protection settings (None: formats
    /// without metadata only).
    pub metadata: Option<MetadataConfig>,
    /// Its ANA group, 1 to [`crate::ana::MAX_GROUPS`] (None: group 1). Reported
    /// by a controller of a subsystem only.
    pub ana_group: Option<u32>,
    /// Its reservation state file, the same for every controller of the
    /// subsystem (None: no reservations).
    pub reservations: Option<Arc<std::fs::File>>,
    /// Its NGUID (the EUI-64 and UUID derive from it), where it is not derived
    /// from the serial number and NSID: a namespace of the pool, new at each
    /// creation.
    pub identity: Option<[u8; 16]>,
}

/// A namespace's metadata store and the protection settings it starts with.
#[derive(Clone, Debug)]
pub struct MetadataConfig {
    /// The store's file (a regular file or a memfd); None: metadata is not kept.
    pub store: MetaFile,
    /// Identify DPS: the PI type (0-3) and bit 3 for the first bytes of the metadata.
    pub dps: u8,
    /// Metadata inline after each block's data (extended LBAs) instead of MPTR.
    pub extended: bool,
}

/// A metadata store's file, shared by every namespace made from one configuration.
#[derive(Clone, Debug)]
pub struct MetaFile(pub Option<Arc<std::fs::File>>);

impl MetaFile {
    /// A store in a memfd of its own.
    pub fn memory() -> std::io::Result<MetaFile> {
        let fd = rustix::fs::memfd_create("vnvme-meta", rustix::fs::MemfdFlags::CLOEXEC)?;
        Ok(MetaFile(Some(Arc::new(std::fs::File::from(fd)))))
    }

    pub(crate) fn try_clone(&self) -> std::io::Result<crate::metadata::MetaStore> {
        Ok(match &self.0 {
            Some(f) => crate::metadata::MetaStore::file(f.try_clone()?),
            None => crate::metadata::MetaStore::discard(),
        })
    }
}

impl NamespaceConfig {
    /// A namespace with the default command timeout.
    pub fn new(backend: Arc<dyn Backend>, lba_format: u8) -> Self {
        NamespaceConfig {
            backend,
            lba_format,
            timeout: Some(DEFAULT_COMMAND_TIMEOUT),
            nsid: None,
            zoned: None,
            metadata: None,
            ana_group: None,
            reservations: None,
            identity: None,
        }
    }
}

/// What the controller tells the host it can do, beyond its configuration: fixed
/// at creation from the namespaces it starts with (a host reads them once).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Capabilities {
    /// ONCS Dataset Management.
    pub dsm: bool,
    /// ONCS Write Zeroes.
    pub write_zeroes: bool,
    /// VWC: a volatile write cache is present.
    pub volatile_write_cache: bool,
    /// CTRATT FDPS: Flexible Data Placement (always what the configuration says).
    #[serde(default)]
    pub fdp: bool,
    /// CNTLID and CMIC: a controller of a subsystem of several (always what the
    /// configuration says; a guest that saw one path must find the same ID again).
    #[serde(default)]
    pub subsystem: Option<SubsystemConfig>,
    /// OACS Namespace Management: a namespace pool (always what the configuration
    /// says).
    #[serde(default)]
    pub ns_management: bool,
}

/// Static controller parameters. [`ControllerConfig::default`] gives what a Linux
/// guest expects of a modern emulated controller.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    pub serial: String,
    pub model: String,
    pub firmware: String,
    /// PCI vendor and subsystem vendor IDs, also reported in Identify.
    pub vid: u16,
    pub ssvid: u16,
    /// Highest I/O queue identifier the controller accepts (queue pairs).
    pub max_io_queues: u16,
    /// Maximum Queue Entries Supported, 0's based (CAP.MQES).
    pub mqes_z: u16,
    /// Maximum Data Transfer Size as a power of two in units of the minimum page size.
    pub mdts: u8,
    /// MSI-X vectors (the admin queue uses vector 0).
    pub msix_vectors: u16,
    /// CAP.DSTRD: doorbells are `4 << dstrd` bytes apart.
    pub dstrd: u8,
    /// Asynchronous Event Request Limit, 0's based.
    pub aerl_z: u8,
    /// Abort Command Limit, 0's based.
    pub acl_z: u8,
    /// Composite temperature the controller reports, in kelvins.
    pub temperature_k: u16,
    pub namespaces: Vec<NamespaceConfig>,
    /// Number of Namespaces (Identify NN): the NSIDs namespaces may have, so room for
    /// those added later ([`crate::Controller::add_namespace`]). 0: exactly as many as
    /// `namespaces`. At most [`MAX_NAMESPACES`].
    pub max_namespaces: u32,
    /// Offer Doorbell Buffer Config (OACS bit 8). Off only to measure what shadow
    /// doorbells save: the host then writes every doorbell register.
    pub shadow_doorbells: bool,
    /// These capabilities rather than those the namespaces imply: a controller
    /// taking over from another (`ControllerState::capabilities`) says what it said.
    pub capabilities: Option<Capabilities>,
    /// Flexible Data Placement in endurance group 1 (None: not offered).
    pub fdp: Option<FdpConfig>,
    /// One controller of a subsystem of several (None: the only one, CNTLID 0).
    pub subsystem: Option<SubsystemConfig>,
    /// The namespace pool hosts create namespaces in and attach them from
    /// (Namespace Management and Attachment; None: not offered).
    pub pool: Option<Arc<crate::pool::NamespacePool>>,
}

/// A controller's place in an NVM subsystem of several controllers, each served by
/// its own process (docs/subsystems.md): its CNTLID, unique in the subsystem. The
/// subsystem is named by the serial number, which every controller of it shares
/// (so do the namespaces' identifiers, derived from it), and its namespaces are
/// the same storage opened by each process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SubsystemConfig {
    /// Controller ID (0 to [`MAX_CNTLID`]).
    pub cntlid: u16,
}

/// The highest controller ID (FFF0h-FFFFh are reserved).
pub const MAX_CNTLID: u16 = 0xffef;

/// Flexible Data Placement as a controller offers it: one endurance group (1), one
/// reclaim group, one configuration; every namespace of the NVM command set gets a
/// placement handle for each reclaim unit handle (placement handle i is RUH i).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FdpConfig {
    /// Reclaim unit handles (1..=[`MAX_RUHS`]).
    pub ruhs: u16,
    /// Reclaim Unit Nominal Size in bytes (a multiple of 4 KiB).
    pub ru_size: u64,
}

/// The most reclaim unit handles: what Linux asks the status of (it reads up to 127
/// descriptors), and a bound on the state a configuration can make us keep.
pub const MAX_RUHS: u16 = 127;

impl FdpConfig {
    /// Why it cannot be, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.ruhs == 0 || self.ruhs > MAX_RUHS {
            return Err(format!("{} reclaim unit handles: 1 to {MAX_RUHS}", self.ruhs));
        }
        if self.ru_size == 0 || !self.ru_size.is_multiple_of(4096) {
            return Err(format!(
                "a reclaim unit of {} bytes: a multiple of 4 KiB, at least 4 KiB",
                self.ru_size
            ));
        }
        Ok(())
    }
}

impl ControllerConfig {
    /// MDTS in bytes: MDTS is in units of the minimum memory page size (CAP.MPSMIN).
    pub(crate) fn mdts_bytes(&self, cap: nvme_spec::regs::Cap) -> u64 {
        (1u64 << self.mdts) * (1 << (12 + cap.mpsmin() as u32))
    }
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            serial: "VNVME0001".into(),
            model: "vnvme emulated NVMe controller".into(),
            firmware: env!("CARGO_PKG_VERSION").into(),
            // 0x1b36 is the Red Hat / QEMU "generic" PCI vendor ID used by emulated
            // devices that have no vendor of their own.
            vid: 0x1b36,
            ssvid: 0x1af4,
            max_io_queues: 64,
            mqes_z: 1023,
            mdts: 8,
            msix_vectors: 65,
            dstrd: 0,
            aerl_z: 3,
            acl_z: 3,
            temperature_k: 313,
            namespaces: Vec::new(),
            max_namespaces: 0,
            shadow_doorbells: true,
            capabilities: None,
            fdp: None,
            subsystem: None,
            pool: None,
        }
    }
}
