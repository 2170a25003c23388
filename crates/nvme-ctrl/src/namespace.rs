//! Namespaces: a backend plus the LBA format the host chose.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use block_backend::{Backend, BackendInfo};

/// Supported LBA data sizes as log2, indexed by LBA format (Identify Namespace LBAF).
pub const LBA_FORMATS: [u8; 2] = [9, 12];

/// Every NSID the controller reports (Identify NN), each inactive (None) or active:
/// read-only and shared by the admin side and every engine, replaced as a whole when
/// a namespace is added or removed.
pub type NamespaceSlots = Arc<[Option<Arc<Namespace>>]>;

/// The active namespace `nsid` in `slots`.
pub fn lookup(slots: &[Option<Arc<Namespace>>], nsid: u32) -> Option<&Arc<Namespace>> {
    slots.get((nsid as usize).wrapping_sub(1))?.as_ref()
}

/// [`lookup`] for a command: the namespace, or Invalid Namespace or Format. A match,
/// not `ok_or`: that builds the error, and drops it, for every command.
pub(crate) fn for_command(
    slots: &[Option<Arc<Namespace>>],
    nsid: u32,
) -> crate::error::CmdResult<Arc<Namespace>> {
    for_command_ref(slots, nsid).cloned()
}

/// [`for_command`] without taking a reference.
#[inline]
pub(crate) fn for_command_ref(
    slots: &[Option<Arc<Namespace>>],
    nsid: u32,
) -> crate::error::CmdResult<&Arc<Namespace>> {
    match lookup(slots, nsid) {
        Some(ns) => Ok(ns),
        None => Err(crate::error::CommandError::InvalidNamespace(nsid)),
    }
}

/// The active namespaces in `slots`, in NSID order.
pub fn active(slots: &[Option<Arc<Namespace>>]) -> impl Iterator<Item = &Arc<Namespace>> + '_ {
    slots.iter().flatten()
}

/// An active namespace.
#[derive(Debug)]
pub struct Namespace {
    pub nsid: u32,
    pub backend: Arc<dyn Backend>,
    /// What the backend said it can do when the namespace was made (its size then;
    /// [`Namespace::size`] is the size now).
    pub info: BackendInfo,
    /// Bytes (changes only through a resize).
    size: AtomicU64,
    /// Current LBA format index (changes only through Format NVM).
    lba_format: AtomicU8,
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
    pub uuid: [u8; 16],
    /// Commands not finished by the backend after this many nanoseconds time out
    /// (0: never).
    pub timeout_ns: u64,
    /// Commands, bytes, errors and latency by kind.
    pub stats: crate::stats::NsStats,
    /// A zoned namespace's zones (None: a namespace of the NVM command set).
    pub zones: Option<crate::zoned::Zones>,
}

impl Namespace {
    pub fn new(nsid: u32, backend: Arc<dyn Backend>, lba_format: u8, serial: &str) -> Self {
        let info = backend.info();
        // Stable identifiers derived from the serial number and nsid, so a namespace
        // keeps its identity across restarts with the same configuration.
        let h = fnv1a(serial.as_bytes()) ^ (nsid as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let h2 = fnv1a(&h.to_le_bytes());
        let mut nguid = [0u8; 16];
        nguid[..8].copy_from_slice(&h.to_be_bytes());
        nguid[8..].copy_from_slice(&h2.to_be_bytes());
        let mut uuid = nguid;
        uuid[6] = (uuid[6] & 0x0f) | 0x40; // version 4 layout
        uuid[8] = (uuid[8] & 0x3f) | 0x80; // RFC 4122 variant
        let mut eui64 = [0u8; 8];
        eui64.copy_from_slice(&h2.to_be_bytes());
        eui64[0] = 0x52; // locally administered OUI space
        Namespace {
            nsid,
            backend,
            size: AtomicU64::new(info.size),
            info,
            lba_format: AtomicU8::new(lba_format.min(LBA_FORMATS.len() as u8 - 1)),
            nguid,
            eui64,
            uuid,
            timeout_ns: 0,
            stats: Default::default(),
            zones: None,
        }
    }

    /// Makes it a zoned namespace of `zones`: its size is what they span.
    pub fn with_zones(mut self, zones: crate::zoned::Zones) -> Self {
        self.size = AtomicU64::new(zones.span());
        self.zones = Some(zones);
        self
    }

    /// Its Command Set Identifier: the Zoned Namespace or the NVM command set.
    pub fn csi(&self) -> u8 {
        if self.zones.is_some() {
            nvme_spec::zns::CSI_ZNS
        } else {
            nvme_spec::zns::CSI_NVM
        }
    }

    /// Sets the command timeout (None: never).
    pub fn with_timeout(mut self, t: Option<std::time::Duration>) -> Self {
        self.timeout_ns = t.map_or(0, |t| u64::try_from(t.as_nanos()).unwrap_or(u64::MAX).max(1));
        self
    }

    pub fn lba_format(&self) -> u8 {
        self.lba_format.load(Ordering::Acquire)
    }

    pub fn set_lba_format(&self, f: u8) {
        self.lba_format.store(f, Ordering::Release);
    }

    /// log2 of the LBA data size.
    pub fn lba_shift(&self) -> u32 {
        LBA_FORMATS[self.lba_format() as usize] as u32
    }

    /// Namespace size in bytes.
    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    /// Records a new size (the backend has already been resized).
    pub(crate) fn set_size(&self, bytes: u64) {
        self.size.store(bytes, Ordering::Release);
    }

    /// Namespace size in logical blocks.
    pub fn nsze(&self) -> u64 {
        self.size() >> self.lba_shift()
    }
}

fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// True if `lba`-byte blocks work on a backend of `block_size` holding `size` bytes:
/// a multiple of its block size that divides its capacity.
pub(crate) fn lba_fits(lba: u64, block_size: u32, size: u64) -> bool {
    let bs = u64::from(block_size.max(1));
    lba.is_multiple_of(bs) && size.is_multiple_of(lba) && size >= lba
}

/// Namespace `nsid` as `n` describes it, or why it cannot be.
pub(crate) fn make(nsid: u32, n: &crate::config::NamespaceConfig, serial: &str) -> Result<Namespace, String> {
    let info = n.backend.info();
    let Some(&lbads) = LBA_FORMATS.get(n.lba_format as usize) else {
        return Err(format!("namespace {nsid}: no LBA format {}", n.lba_format));
    };
    if !lba_fits(1 << lbads, info.block_size, info.size) {
        return Err(format!(
            "namespace {nsid} ({}): a {}-byte LBA does not suit the backend (block size {}, size {})",
            info.kind,
            1u32 << lbads,
            info.block_size,
            info.size
        ));
    }
    let ns = Namespace::new(nsid, n.backend.clone(), n.lba_format, serial).with_timeout(n.timeout);
    match &n.zoned {
        Some(z) => {
            let state = z.state_file.as_ref().map(|f| f.try_clone()).transpose();
            let state = state.map_err(|e| format!("namespace {nsid}: zone state file: {e}"))?;
            let zones = crate::zoned::Zones::new(z, info.size, state)
                .map_err(|e| format!("namespace {nsid} ({}): {e}", info.kind))?;
            Ok(ns.with_zones(zones))
        }
        None => Ok(ns),
    }
}
