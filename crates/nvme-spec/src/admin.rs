//! Typed views of admin command dwords. Each view borrows an [`Sqe`] and names its
//! fields, so handlers never shift and mask command dwords themselves.

use crate::Sqe;

/// Create I/O Completion Queue (Base §5.2.4).
#[derive(Clone, Copy, Debug)]
pub struct CreateIoCq<'a>(pub &'a Sqe);

impl CreateIoCq<'_> {
    pub fn qid(&self) -> u16 {
        self.0.cdw10.get() as u16
    }
    /// Queue Size, 0's based.
    pub fn qsize_z(&self) -> u16 {
        (self.0.cdw10.get() >> 16) as u16
    }
    /// Physically Contiguous.
    pub fn pc(&self) -> bool {
        self.0.cdw11.get() & 1 != 0
    }
    /// Interrupts Enabled.
    pub fn ien(&self) -> bool {
        self.0.cdw11.get() & 2 != 0
    }
    /// Interrupt Vector.
    pub fn iv(&self) -> u16 {
        (self.0.cdw11.get() >> 16) as u16
    }
    /// PRP Entry 1: the queue's base address when `pc` is set.
    pub fn base(&self) -> u64 {
        self.0.prp1()
    }
}

/// Create I/O Submission Queue (Base §5.2.5).
#[derive(Clone, Copy, Debug)]
pub struct CreateIoSq<'a>(pub &'a Sqe);

impl CreateIoSq<'_> {
    pub fn qid(&self) -> u16 {
        self.0.cdw10.get() as u16
    }
    /// Queue Size, 0's based.
    pub fn qsize_z(&self) -> u16 {
        (self.0.cdw10.get() >> 16) as u16
    }
    pub fn pc(&self) -> bool {
        self.0.cdw11.get() & 1 != 0
    }
    /// Queue Priority (only meaningful with weighted round robin arbitration).
    pub fn qprio(&self) -> u8 {
        ((self.0.cdw11.get() >> 1) & 3) as u8
    }
    /// Completion Queue Identifier this SQ posts to.
    pub fn cqid(&self) -> u16 {
        (self.0.cdw11.get() >> 16) as u16
    }
    /// NVM Set Identifier (CDW12 15:0).
    pub fn nvmsetid(&self) -> u16 {
        self.0.cdw12.get() as u16
    }
    pub fn base(&self) -> u64 {
        self.0.prp1()
    }
}

/// Delete I/O Submission or Completion Queue (Base §5.2.6, §5.2.7): QID in CDW10 15:0.
#[derive(Clone, Copy, Debug)]
pub struct DeleteIoQueue<'a>(pub &'a Sqe);

impl DeleteIoQueue<'_> {
    pub fn qid(&self) -> u16 {
        self.0.cdw10.get() as u16
    }
}

/// Get Log Page (Base §5.1.12).
#[derive(Clone, Copy, Debug)]
pub struct GetLogPage<'a>(pub &'a Sqe);

impl GetLogPage<'_> {
    /// Log Page Identifier.
    pub fn lid(&self) -> u8 {
        self.0.cdw10.get() as u8
    }
    /// Log Specific Parameter.
    pub fn lsp(&self) -> u8 {
        ((self.0.cdw10.get() >> 8) & 0x7f) as u8
    }
    /// Retain Asynchronous Event.
    pub fn rae(&self) -> bool {
        self.0.cdw10.get() & (1 << 15) != 0
    }
    /// Number of Dwords to transfer, 0's based (NUMDU:NUMDL).
    pub fn numd_z(&self) -> u32 {
        (self.0.cdw10.get() >> 16) | ((self.0.cdw11.get() & 0xffff) << 16)
    }
    /// Log Specific Identifier.
    pub fn lsi(&self) -> u16 {
        (self.0.cdw11.get() >> 16) as u16
    }
    /// Log Page Offset in bytes (or in entries, with `ot`).
    pub fn offset(&self) -> u64 {
        self.0.cdw12.get() as u64 | ((self.0.cdw13.get() as u64) << 32)
    }
    /// Offset Type: the offset is an index into a list of entries.
    pub fn ot(&self) -> bool {
        self.0.cdw14.get() & (1 << 23) != 0
    }
    /// Command Set Identifier.
    pub fn csi(&self) -> u8 {
        (self.0.cdw14.get() >> 24) as u8
    }
    /// Bytes to transfer.
    pub fn transfer_len(&self) -> u64 {
        (self.numd_z() as u64 + 1) * 4
    }
}

/// Identify (Base §5.1.13).
#[derive(Clone, Copy, Debug)]
pub struct Identify<'a>(pub &'a Sqe);

impl Identify<'_> {
    /// Controller or Namespace Structure.
    pub fn cns(&self) -> u8 {
        self.0.cdw10.get() as u8
    }
    /// Controller Identifier (for CNS values that take one).
    pub fn cntid(&self) -> u16 {
        (self.0.cdw10.get() >> 16) as u16
    }
    /// Command Set Identifier (CDW11 31:24).
    pub fn csi(&self) -> u8 {
        (self.0.cdw11.get() >> 24) as u8
    }
    pub fn nsid(&self) -> u32 {
        self.0.nsid.get()
    }
}

/// Set Features / Get Features (Base §5.1.25, §5.1.11).
#[derive(Clone, Copy, Debug)]
pub struct Features<'a>(pub &'a Sqe);

/// Get Features Select field (Base Figure 191).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FeatureSelect {
    Current,
    Default,
    Saved,
    SupportedCapabilities,
    Reserved(u8),
}

impl Features<'_> {
    /// Feature Identifier.
    pub fn fid(&self) -> u8 {
        self.0.cdw10.get() as u8
    }
    /// Get Features: Select.
    pub fn sel(&self) -> FeatureSelect {
        match (self.0.cdw10.get() >> 8) & 7 {
            0 => FeatureSelect::Current,
            1 => FeatureSelect::Default,
            2 => FeatureSelect::Saved,
            3 => FeatureSelect::SupportedCapabilities,
            v => FeatureSelect::Reserved(v as u8),
        }
    }
    /// Set Features: Save.
    pub fn sv(&self) -> bool {
        self.0.cdw10.get() & (1 << 31) != 0
    }
    /// The feature-specific value (CDW11).
    pub fn value(&self) -> u32 {
        self.0.cdw11.get()
    }
    pub fn nsid(&self) -> u32 {
        self.0.nsid.get()
    }
}

/// Abort (Base §5.1.1).
#[derive(Clone, Copy, Debug)]
pub struct Abort<'a>(pub &'a Sqe);

impl Abort<'_> {
    pub fn sqid(&self) -> u16 {
        self.0.cdw10.get() as u16
    }
    pub fn cid(&self) -> u16 {
        (self.0.cdw10.get() >> 16) as u16
    }
}

/// Format NVM (NVM §4.2, Base §5.1.10).
#[derive(Clone, Copy, Debug)]
pub struct FormatNvm<'a>(pub &'a Sqe);

impl FormatNvm<'_> {
    /// LBA Format index (LBAFU:LBAFL).
    pub fn lbaf(&self) -> u8 {
        let v = self.0.cdw10.get();
        ((v & 0xf) | (((v >> 12) & 3) << 4)) as u8
    }
    /// Metadata Settings.
    pub fn mset(&self) -> bool {
        self.0.cdw10.get() & (1 << 4) != 0
    }
    /// Protection Information.
    pub fn pi(&self) -> u8 {
        ((self.0.cdw10.get() >> 5) & 7) as u8
    }
    /// Secure Erase Settings: 0 none, 1 user data erase, 2 cryptographic erase.
    pub fn ses(&self) -> u8 {
        ((self.0.cdw10.get() >> 9) & 7) as u8
    }
}

/// Doorbell Buffer Config (Base §5.2.1): PRP1 is the Shadow Doorbell buffer, PRP2
/// the EventIdx buffer; both are one memory page, page aligned.
#[derive(Clone, Copy, Debug)]
pub struct DoorbellBufferConfig<'a>(pub &'a Sqe);

impl DoorbellBufferConfig<'_> {
    pub fn shadow_doorbell(&self) -> u64 {
        self.0.prp1()
    }
    pub fn eventidx(&self) -> u64 {
        self.0.prp2()
    }
}
