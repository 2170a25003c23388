//! What Identify told us about the controller and its namespaces.
#![forbid(unsafe_code)]

use nvme_spec::identify::{oacs, IdentifyController, IdentifyNamespace};
use nvme_spec::regs::Cap;

/// The controller, as the driver found it at bring-up.
#[derive(Clone, Debug)]
pub struct ControllerInfo {
    /// Identify Controller data (CNS 01h).
    pub id: Box<IdentifyController>,
    /// The CAP register.
    pub cap: Cap,
    /// The VS register.
    pub vs: u32,
    /// Maximum Data Transfer Size in bytes (None: no limit).
    pub mdts_bytes: Option<u64>,
    /// I/O queue pairs the controller granted (Set Features Number of Queues).
    pub granted_queues: u16,
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim_end_matches([' ', '\0']).to_string()
}

impl ControllerInfo {
    pub fn new(id: Box<IdentifyController>, cap: Cap, vs: u32) -> Self {
        // MDTS is a power of two in units of CAP.MPSMIN pages (Base §5.1.13.2.1).
        let mdts_bytes = match id.mdts {
            0 => None,
            m => 1u64.checked_shl(m as u32 + 12 + cap.mpsmin() as u32),
        };
        ControllerInfo { id, cap, vs, mdts_bytes, granted_queues: 0 }
    }
    pub fn model(&self) -> String {
        text(&self.id.mn)
    }
    pub fn serial(&self) -> String {
        text(&self.id.sn)
    }
    pub fn firmware(&self) -> String {
        text(&self.id.fr)
    }
    /// Version as "major.minor.tertiary" from VS.
    pub fn version(&self) -> String {
        format!("{}.{}.{}", self.vs >> 16, (self.vs >> 8) & 0xff, self.vs & 0xff)
    }
    /// OACS bit 8: the controller supports Doorbell Buffer Config.
    pub fn supports_dbbuf(&self) -> bool {
        self.id.oacs.get() & oacs::DOORBELL_BUFFER_CONFIG != 0
    }
}

/// One active namespace.
#[derive(Clone, Debug)]
pub struct NamespaceInfo {
    pub nsid: u32,
    /// Identify Namespace data (CNS 00h).
    pub id: Box<IdentifyNamespace>,
}

impl NamespaceInfo {
    /// Bytes per logical block in the current format.
    pub fn lba_size(&self) -> u64 {
        self.id.current_lbaf().block_size()
    }
    /// Namespace size in logical blocks.
    pub fn blocks(&self) -> u64 {
        self.id.nsze.get()
    }
    pub fn size_bytes(&self) -> u64 {
        self.blocks().saturating_mul(self.lba_size())
    }
    pub fn geometry(&self) -> NsGeometry {
        NsGeometry { nsid: self.nsid, lba_size: self.lba_size(), blocks: self.blocks() }
    }
}

/// What a queue needs to know about a namespace to build commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NsGeometry {
    pub nsid: u32,
    pub lba_size: u64,
    pub blocks: u64,
}
