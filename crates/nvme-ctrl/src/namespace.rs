//! Namespaces: a backend plus the LBA format the host chose.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use block_backend::{Backend, BackendInfo};

pub(crate) use crate::lba_format::{format_fits, lba_fits};
pub use crate::lba_format::{format_index, FormatState, LbaFormatDef, LBA_FORMATS, PLAIN_FORMATS};

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
    /// The format in effect: LBA format index, protection settings and where
    /// metadata travels, in one word ([`FormatState`]) so a command reads all of
    /// them at one instant while a Format NVM may change them (only it does).
    format: AtomicU32,
    /// Its identifiers (Identify's NGUID, EUI64 and its UUID descriptor).
    pub ids: NsIds,
    /// Commands not finished by the backend after this many nanoseconds time out
    /// (0: never).
    pub timeout_ns: u64,
    /// Commands, bytes, errors and latency by kind.
    pub stats: crate::stats::NsStats,
    /// A zoned namespace's zones (None: a namespace of the NVM command set).
    pub zones: Option<crate::zoned::Zones>,
    /// Where its blocks' metadata is kept (None: it has only the formats without).
    pub meta: Option<crate::metadata::MetaStore>,
    /// The endurance group's Flexible Data Placement, whose every reclaim unit
    /// handle it has a placement handle for (None: FDP is off, or it is zoned).
    pub placement: Option<Arc<crate::fdp::Fdp>>,
    /// Its ANA group on this controller: whether commands to it are processed.
    ana: Arc<crate::ana::AnaGroup>,
    /// Its reservations, shared with the subsystem's other controllers (None: it
    /// has none: no `resv=` file).
    resv: Option<crate::reservation::Reservations>,
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
        let ids = NsIds::of(nguid);
        Namespace {
            nsid,
            backend,
            size: AtomicU64::new(info.size),
            info,
            format: AtomicU32::new(
                FormatState { lbaf: lba_format.min(PLAIN_FORMATS as u8 - 1), dps: 0, extended: false }.pack(),
            ),
            ids,
            timeout_ns: 0,
            stats: Default::default(),
            zones: None,
            meta: None,
            placement: None,
            ana: crate::ana::AnaGroup::standalone(),
            resv: None,
        }
    }

    /// Its reservations (None: it takes no reservation commands).
    #[inline]
    pub fn reservations(&self) -> Option<&crate::reservation::Reservations> {
        self.resv.as_ref()
    }

    /// Its ANA group on this controller.
    #[inline]
    pub fn ana_group(&self) -> &crate::ana::AnaGroup {
        &self.ana
    }

    /// Gives it a metadata store (formats with metadata become possible), in LBA
    /// format `lba_format` with protection settings `dps`. The caller checked both.
    pub fn with_metadata(mut self, store: crate::metadata::MetaStore, dps: u8, extended: bool) -> Self {
        self.meta = Some(store);
        let lbaf = self.lba_format();
        self.set_lba_format(lbaf, dps, extended);
        self
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

    /// Its format now: read once by a command, which then holds to it whatever a
    /// Format NVM does meanwhile.
    #[inline]
    pub fn format_state(&self) -> FormatState {
        FormatState::unpack(self.format.load(Ordering::Acquire))
    }

    pub fn lba_format(&self) -> u8 {
        self.format_state().lbaf
    }

    /// Puts format `f` with protection settings `dps` into effect (the caller
    /// checked the namespace can have them).
    pub fn set_lba_format(&self, f: u8, dps: u8, extended: bool) {
        let extended = extended && LBA_FORMATS[f as usize].ms > 0;
        self.format.store(FormatState { lbaf: f, dps, extended }.pack(), Ordering::Release);
    }

    /// The number of LBA formats it offers (Identify NLBAF plus one).
    pub fn format_count(&self) -> usize {
        if self.meta.is_some() {
            LBA_FORMATS.len()
        } else {
            PLAIN_FORMATS
        }
    }

    /// The LBA format in effect.
    #[inline]
    pub fn format_def(&self) -> LbaFormatDef {
        self.format_state().def()
    }

    /// log2 of the LBA data size.
    pub fn lba_shift(&self) -> u32 {
        self.format_def().shift as u32
    }

    /// Metadata bytes per block in the current format.
    pub fn meta_size(&self) -> u16 {
        self.format_def().ms
    }

    /// True if metadata travels inline after each block's data (FLBAS bit 4).
    pub fn extended(&self) -> bool {
        self.format_state().extended
    }

    /// The protection settings (Identify DPS).
    pub fn dps(&self) -> u8 {
        self.format_state().dps
    }

    /// The protection information of the current format (None: none).
    pub fn protection(&self) -> Option<nvme_spec::pi::PiLayout> {
        self.format_state().protection()
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

/// A namespace's identifiers: its NGUID, and the UUID and EUI-64 made from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NsIds {
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
    pub uuid: [u8; 16],
}

impl NsIds {
    /// The identifiers that go with `nguid`.
    pub fn of(nguid: [u8; 16]) -> Self {
        let mut uuid = nguid;
        uuid[6] = (uuid[6] & 0x0f) | 0x40; // version 4 layout
        uuid[8] = (uuid[8] & 0x3f) | 0x80; // RFC 4122 variant
        let mut eui64 = [0u8; 8];
        eui64.copy_from_slice(&nguid[8..]);
        eui64[0] = 0x52; // locally administered OUI space
        NsIds { nguid, eui64, uuid }
    }
}

/// Namespace `nsid` as `n` describes it, or why it cannot be; with `fdp`, of the
/// NVM command set, it places its writes through FDP's handles.
pub(crate) fn make(
    nsid: u32,
    n: &crate::config::NamespaceConfig,
    serial: &str,
    fdp: Option<&Arc<crate::fdp::Fdp>>,
    ana: &crate::ana::Ana,
    host: &Arc<crate::reservation::HostIdentity>,
) -> Result<Namespace, String> {
    let group = n.ana_group.unwrap_or(crate::ana::DEFAULT_GROUP);
    let group = ana.group(group).map_err(|e| format!("namespace {nsid}: {e}"))?.clone();
    let info = n.backend.info();
    let formats = if n.metadata.is_some() { LBA_FORMATS.len() } else { PLAIN_FORMATS };
    let Some(f) = LBA_FORMATS[..formats].get(n.lba_format as usize) else {
        return Err(format!("namespace {nsid}: no LBA format {}", n.lba_format));
    };
    let lbads = f.shift;
    if let Some(m) = &n.metadata {
        if let Err(e) = format_fits(*f, m.dps) {
            return Err(format!("namespace {nsid}: {e}"));
        }
        if n.zoned.is_some() && f.ms > 0 {
            return Err(format!("namespace {nsid}: a zoned namespace cannot have metadata (not yet)"));
        }
    }
    if !lba_fits(1 << lbads, info.block_size, info.size) {
        return Err(format!(
            "namespace {nsid} ({}): a {}-byte LBA does not suit the backend (block size {}, size {})",
            info.kind,
            1u32 << lbads,
            info.block_size,
            info.size
        ));
    }
    let mut ns = Namespace::new(nsid, n.backend.clone(), 0, serial).with_timeout(n.timeout);
    ns.ana = group;
    if let Some(nguid) = n.identity {
        ns.ids = NsIds::of(nguid);
    }
    if let Some(f) = &n.reservations {
        let f = f.try_clone().map_err(|e| format!("namespace {nsid}: reservation state file: {e}"))?;
        let file = crate::reservation::ResvFile::open(f)
            .map_err(|e| format!("namespace {nsid}: reservation state file: {e}"))?;
        ns.resv = Some(crate::reservation::Reservations::new(file, host.clone()));
    }
    ns.set_lba_format(n.lba_format, 0, false);
    if let Some(m) = &n.metadata {
        let store = m.store.try_clone().map_err(|e| format!("namespace {nsid}: metadata file: {e}"))?;
        ns = ns.with_metadata(store, m.dps, m.extended);
    }
    match &n.zoned {
        Some(z) => {
            let state = z.state_file.as_ref().map(|f| f.try_clone()).transpose();
            let state = state.map_err(|e| format!("namespace {nsid}: zone state file: {e}"))?;
            let zones = crate::zoned::Zones::new(z, info.size, state)
                .map_err(|e| format!("namespace {nsid} ({}): {e}", info.kind))?;
            Ok(ns.with_zones(zones))
        }
        None => {
            ns.placement = fdp.cloned();
            Ok(ns)
        }
    }
}
