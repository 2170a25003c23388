//! Admin commands, both ways. Each view (`CreateIoCq`, ...) borrows an [`Sqe`] and
//! names its fields, so handlers never shift and mask command dwords themselves; each
//! builder (`CreateIoCqCmd`, ...) holds the same fields by name and encodes them into
//! an [`Sqe`] (command identifier 0, PRPs for data: a host sets the identifier with
//! [`Sqe::set_cid`] and the data pointer with [`Sqe::set_prps`] or [`Sqe::set_sgl1`]),
//! so hosts never shift either.

use zerocopy::little_endian::U32;

use crate::opcode::admin as op;
use crate::Sqe;

/// Create I/O Completion Queue (Base §5.2.1).
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

/// Builds a Create I/O Completion Queue command (Base §5.2.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CreateIoCqCmd {
    pub qid: u16,
    /// Queue Size, 0's based.
    pub qsize_z: u16,
    /// PRP Entry 1: the queue's base address (with `pc`) or its PRP list.
    pub base: u64,
    /// Physically Contiguous.
    pub pc: bool,
    /// Interrupts Enabled.
    pub ien: bool,
    /// Interrupt Vector.
    pub iv: u16,
}

impl CreateIoCqCmd {
    pub fn to_sqe(self) -> Sqe {
        let mut s = Sqe::with_opcode(op::CREATE_IO_CQ);
        s.set_prps(self.base, 0);
        s.cdw10 = U32::new(self.qid as u32 | (self.qsize_z as u32) << 16);
        s.cdw11 = U32::new(self.pc as u32 | (self.ien as u32) << 1 | (self.iv as u32) << 16);
        s
    }
}

/// Create I/O Submission Queue (Base §5.2.2).
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

/// Builds a Create I/O Submission Queue command (Base §5.2.2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CreateIoSqCmd {
    pub qid: u16,
    /// Queue Size, 0's based.
    pub qsize_z: u16,
    /// PRP Entry 1: the queue's base address (with `pc`) or its PRP list.
    pub base: u64,
    /// Physically Contiguous.
    pub pc: bool,
    /// Queue Priority (2 bits; weighted round robin only).
    pub qprio: u8,
    /// Completion Queue Identifier this SQ posts to.
    pub cqid: u16,
    /// NVM Set Identifier.
    pub nvmsetid: u16,
}

impl CreateIoSqCmd {
    pub fn to_sqe(self) -> Sqe {
        let mut s = Sqe::with_opcode(op::CREATE_IO_SQ);
        s.set_prps(self.base, 0);
        s.cdw10 = U32::new(self.qid as u32 | (self.qsize_z as u32) << 16);
        s.cdw11 = U32::new(self.pc as u32 | (self.qprio as u32 & 3) << 1 | (self.cqid as u32) << 16);
        s.cdw12 = U32::new(self.nvmsetid as u32);
        s
    }
}

/// Delete I/O Completion Queue (Base §5.2.3) or Delete I/O Submission Queue
/// (Base §5.2.4): QID in CDW10 15:0.
#[derive(Clone, Copy, Debug)]
pub struct DeleteIoQueue<'a>(pub &'a Sqe);

impl DeleteIoQueue<'_> {
    pub fn qid(&self) -> u16 {
        self.0.cdw10.get() as u16
    }
}

/// Builds a Delete I/O Submission Queue command (Base §5.2.4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeleteIoSqCmd {
    pub qid: u16,
}

impl DeleteIoSqCmd {
    pub fn to_sqe(self) -> Sqe {
        let mut s = Sqe::with_opcode(op::DELETE_IO_SQ);
        s.cdw10 = U32::new(self.qid as u32);
        s
    }
}

/// Builds a Delete I/O Completion Queue command (Base §5.2.3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeleteIoCqCmd {
    pub qid: u16,
}

impl DeleteIoCqCmd {
    pub fn to_sqe(self) -> Sqe {
        let mut s = Sqe::with_opcode(op::DELETE_IO_CQ);
        s.cdw10 = U32::new(self.qid as u32);
        s
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

/// Builds a Get Log Page command (Base §5.1.12).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GetLogPageCmd {
    pub nsid: u32,
    /// Log Page Identifier.
    pub lid: u8,
    /// Log Specific Parameter (7 bits).
    pub lsp: u8,
    /// Retain Asynchronous Event.
    pub rae: bool,
    /// Number of Dwords to transfer, 0's based (split into NUMDL and NUMDU).
    pub numd_z: u32,
    /// Log Specific Identifier.
    pub lsi: u16,
    /// Log Page Offset in bytes (or in entries, with `ot`).
    pub offset: u64,
    /// Offset Type.
    pub ot: bool,
    /// Command Set Identifier.
    pub csi: u8,
}

impl GetLogPageCmd {
    pub fn to_sqe(self) -> Sqe {
        let mut s = Sqe::with_opcode(op::GET_LOG_PAGE);
        s.nsid = U32::new(self.nsid);
        s.cdw10 = U32::new(
            self.lid as u32
                | (self.lsp as u32 & 0x7f) << 8
                | (self.rae as u32) << 15
                | (self.numd_z & 0xffff) << 16,
        );
        s.cdw11 = U32::new(self.numd_z >> 16 | (self.lsi as u32) << 16);
        s.cdw12 = U32::new(self.offset as u32);
        s.cdw13 = U32::new((self.offset >> 32) as u32);
        s.cdw14 = U32::new((self.ot as u32) << 23 | (self.csi as u32) << 24);
        s
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

/// Builds an Identify command (Base §5.1.13); the data buffer is PRP1 (and PRP2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdentifyCmd {
    pub nsid: u32,
    /// Controller or Namespace Structure (see [`crate::identify::cns`]).
    pub cns: u8,
    /// Controller Identifier.
    pub cntid: u16,
    /// Command Set Identifier.
    pub csi: u8,
}

impl IdentifyCmd {
    pub fn to_sqe(self) -> Sqe {
        let mut s = Sqe::with_opcode(op::IDENTIFY);
        s.nsid = U32::new(self.nsid);
        s.cdw10 = U32::new(self.cns as u32 | (self.cntid as u32) << 16);
        s.cdw11 = U32::new((self.csi as u32) << 24);
        s
    }
}

/// Set Features / Get Features (Base §5.1.25, §5.1.11).
#[derive(Clone, Copy, Debug)]
pub struct Features<'a>(pub &'a Sqe);

/// Get Features Select field (Base Figure 191).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FeatureSelect {
    #[default]
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
        FeatureSelect::from_bits((self.0.cdw10.get() >> 8) as u8)
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

impl FeatureSelect {
    /// Decodes a SEL field value (bits above the 3-bit field are ignored).
    pub fn from_bits(v: u8) -> Self {
        match v & 7 {
            0 => FeatureSelect::Current,
            1 => FeatureSelect::Default,
            2 => FeatureSelect::Saved,
            3 => FeatureSelect::SupportedCapabilities,
            v => FeatureSelect::Reserved(v),
        }
    }
    /// The 3-bit SEL field value.
    pub fn bits(self) -> u8 {
        match self {
            FeatureSelect::Current => 0,
            FeatureSelect::Default => 1,
            FeatureSelect::Saved => 2,
            FeatureSelect::SupportedCapabilities => 3,
            FeatureSelect::Reserved(v) => v & 7,
        }
    }
}

/// Builds a Get Features command (Base §5.1.11).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GetFeaturesCmd {
    pub nsid: u32,
    /// Feature Identifier (see [`crate::features::fid`]).
    pub fid: u8,
    /// Select.
    pub sel: FeatureSelect,
    /// Feature-specific input (CDW11).
    pub cdw11: u32,
}

impl GetFeaturesCmd {
    pub fn to_sqe(self) -> Sqe {
        let mut s = Sqe::with_opcode(op::GET_FEATURES);
        s.nsid = U32::new(self.nsid);
        s.cdw10 = U32::new(self.fid as u32 | (self.sel.bits() as u32) << 8);
        s.cdw11 = U32::new(self.cdw11);
        s
    }
}

/// Builds a Set Features command (Base §5.1.25).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetFeaturesCmd {
    pub nsid: u32,
    /// Feature Identifier (see [`crate::features::fid`]).
    pub fid: u8,
    /// Save.
    pub sv: bool,
    /// The feature-specific value (CDW11).
    pub cdw11: u32,
}

impl SetFeaturesCmd {
    pub fn to_sqe(self) -> Sqe {
        let mut s = Sqe::with_opcode(op::SET_FEATURES);
        s.nsid = U32::new(self.nsid);
        s.cdw10 = U32::new(self.fid as u32 | (self.sv as u32) << 31);
        s.cdw11 = U32::new(self.cdw11);
        s
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

/// Builds an Abort command (Base §5.1.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AbortCmd {
    /// Submission Queue Identifier of the command to abort.
    pub sqid: u16,
    /// Command Identifier of the command to abort.
    pub cid: u16,
}

impl AbortCmd {
    pub fn to_sqe(self) -> Sqe {
        let mut s = Sqe::with_opcode(op::ABORT);
        s.cdw10 = U32::new(self.sqid as u32 | (self.cid as u32) << 16);
        s
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
    /// Protection Information Location: the first bytes of the metadata (else the last).
    pub fn pil(&self) -> bool {
        self.0.cdw10.get() & (1 << 8) != 0
    }
    /// Secure Erase Settings: 0 none, 1 user data erase, 2 cryptographic erase.
    pub fn ses(&self) -> u8 {
        ((self.0.cdw10.get() >> 9) & 7) as u8
    }
}

/// Builds a Format NVM command (Base §5.1.10, NVM §4.2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FormatNvmCmd {
    pub nsid: u32,
    /// LBA Format index (6 bits: LBAFL in 3:0, LBAFU in 13:12).
    pub lbaf: u8,
    /// Metadata Settings.
    pub mset: bool,
    /// Protection Information (3 bits).
    pub pi: u8,
    /// Protection Information Location.
    pub pil: bool,
    /// Secure Erase Settings (3 bits).
    pub ses: u8,
}

impl FormatNvmCmd {
    pub fn to_sqe(self) -> Sqe {
        let mut s = Sqe::with_opcode(op::FORMAT_NVM);
        s.nsid = U32::new(self.nsid);
        let lbaf = self.lbaf as u32;
        s.cdw10 = U32::new(
            (lbaf & 0xf)
                | (self.mset as u32) << 4
                | (self.pi as u32 & 7) << 5
                | (self.pil as u32) << 8
                | (self.ses as u32 & 7) << 9
                | ((lbaf >> 4) & 3) << 12,
        );
        s
    }
}

/// Doorbell Buffer Config (Base §5.2.5): PRP1 is the Shadow Doorbell buffer, PRP2
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

/// Builds a Doorbell Buffer Config command (Base §5.2.5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DoorbellBufferConfigCmd {
    /// PRP Entry 1: the Shadow Doorbell buffer (one page, page aligned).
    pub shadow_doorbell: u64,
    /// PRP Entry 2: the EventIdx buffer (one page, page aligned).
    pub eventidx: u64,
}

impl DoorbellBufferConfigCmd {
    pub fn to_sqe(self) -> Sqe {
        let mut s = Sqe::with_opcode(op::DOORBELL_BUFFER_CONFIG);
        s.set_prps(self.shadow_doorbell, self.eventidx);
        s
    }
}

#[cfg(test)]
mod tests {
    //! Each builder's dwords against values worked out by hand from the figures of
    //! the command, and decoded back through its view.
    use super::*;

    #[test]
    fn spec_5_2_1_create_io_cq() {
        let cmd = CreateIoCqCmd { qid: 3, qsize_z: 1023, base: 0x1234_5000, pc: true, ien: true, iv: 2 };
        let s = cmd.to_sqe();
        assert_eq!(s.cdw0.get(), 0x05);
        assert_eq!(s.cdw10.get(), 0x03ff_0003, "QSIZE 31:16, QID 15:0");
        assert_eq!(s.cdw11.get(), 0x0002_0003, "IV 31:16, IEN bit 1, PC bit 0");
        assert_eq!((s.prp1(), s.prp2()), (0x1234_5000, 0));
        let v = CreateIoCq(&s);
        assert_eq!(
            (v.qid(), v.qsize_z(), v.pc(), v.ien(), v.iv(), v.base()),
            (3, 1023, true, true, 2, 0x1234_5000)
        );
    }

    #[test]
    fn spec_5_2_2_create_io_sq() {
        let cmd =
            CreateIoSqCmd { qid: 4, qsize_z: 63, base: 0x8000, pc: true, qprio: 2, cqid: 1, nvmsetid: 9 };
        let s = cmd.to_sqe();
        assert_eq!(s.cdw0.get(), 0x01);
        assert_eq!(s.cdw10.get(), 0x003f_0004);
        assert_eq!(s.cdw11.get(), 0x0001_0005, "CQID 31:16, QPRIO 2:1, PC bit 0");
        assert_eq!(s.cdw12.get(), 9, "NVMSETID 15:0");
        assert_eq!(s.prp1(), 0x8000);
        let v = CreateIoSq(&s);
        assert_eq!((v.qid(), v.qsize_z(), v.pc(), v.qprio(), v.cqid(), v.nvmsetid()), (4, 63, true, 2, 1, 9));
    }

    #[test]
    fn spec_5_2_3_and_5_2_4_delete_io_queues() {
        let cq = DeleteIoCqCmd { qid: 0xabcd }.to_sqe();
        assert_eq!((cq.cdw0.get(), cq.cdw10.get()), (0x04, 0xabcd));
        let sq = DeleteIoSqCmd { qid: 7 }.to_sqe();
        assert_eq!((sq.cdw0.get(), sq.cdw10.get()), (0x00, 7));
        assert_eq!(DeleteIoQueue(&sq).qid(), 7);
    }

    #[test]
    fn spec_5_2_5_doorbell_buffer_config() {
        let s = DoorbellBufferConfigCmd { shadow_doorbell: 0x1000, eventidx: 0x2000 }.to_sqe();
        assert_eq!(s.cdw0.get(), 0x7c);
        assert_eq!((s.prp1(), s.prp2()), (0x1000, 0x2000));
        assert_eq!(s.cdw10.get(), 0);
    }

    #[test]
    fn spec_5_1_12_get_log_page() {
        let cmd = GetLogPageCmd {
            nsid: 0xffff_ffff,
            lid: 0x02,
            lsp: 0x7f,
            rae: true,
            numd_z: 0x0003_0001,
            lsi: 0x1234,
            offset: 0x0000_0005_0000_0200,
            ot: true,
            csi: 2,
        };
        let s = cmd.to_sqe();
        assert_eq!(s.cdw0.get(), 0x02);
        assert_eq!(s.nsid.get(), 0xffff_ffff);
        assert_eq!(s.cdw10.get(), 0x0001_ff02, "NUMDL 31:16, RAE 15, LSP 14:8, LID 7:0");
        assert_eq!(s.cdw11.get(), 0x1234_0003, "LSI 31:16, NUMDU 15:0");
        assert_eq!((s.cdw12.get(), s.cdw13.get()), (0x200, 5));
        assert_eq!(s.cdw14.get(), 0x0280_0000, "CSI 31:24, OT 23");
        let v = GetLogPage(&s);
        assert_eq!((v.lid(), v.lsp(), v.rae(), v.numd_z(), v.lsi()), (2, 0x7f, true, 0x0003_0001, 0x1234));
        assert_eq!((v.offset(), v.ot(), v.csi()), (0x0000_0005_0000_0200, true, 2));
    }

    #[test]
    fn spec_5_1_13_identify() {
        let s = IdentifyCmd { nsid: 1, cns: 0x12, cntid: 0x0102, csi: 2 }.to_sqe();
        assert_eq!(s.cdw0.get(), 0x06);
        assert_eq!(s.nsid.get(), 1);
        assert_eq!(s.cdw10.get(), 0x0102_0012, "CNTID 31:16, CNS 7:0");
        assert_eq!(s.cdw11.get(), 0x0200_0000, "CSI 31:24");
        let v = Identify(&s);
        assert_eq!((v.cns(), v.cntid(), v.csi(), v.nsid()), (0x12, 0x0102, 2, 1));
    }

    #[test]
    fn spec_5_1_11_and_5_1_25_features() {
        let g = GetFeaturesCmd { nsid: 0, fid: 0x07, sel: FeatureSelect::SupportedCapabilities, cdw11: 0x55 }
            .to_sqe();
        assert_eq!(g.cdw0.get(), 0x0a);
        assert_eq!(g.cdw10.get(), 0x0307, "SEL 10:8, FID 7:0");
        assert_eq!(g.cdw11.get(), 0x55);
        assert_eq!(Features(&g).sel(), FeatureSelect::SupportedCapabilities);
        let r = GetFeaturesCmd { sel: FeatureSelect::Reserved(5), ..GetFeaturesCmd::default() }.to_sqe();
        assert_eq!(Features(&r).sel(), FeatureSelect::Reserved(5));
        let s = SetFeaturesCmd { nsid: 1, fid: 0x06, sv: true, cdw11: 1 }.to_sqe();
        assert_eq!(s.cdw0.get(), 0x09);
        assert_eq!(s.cdw10.get(), 0x8000_0006, "SV 31, FID 7:0");
        assert_eq!((s.cdw11.get(), s.nsid.get()), (1, 1));
        let v = Features(&s);
        assert_eq!((v.fid(), v.sv(), v.value()), (6, true, 1));
    }

    #[test]
    fn spec_5_1_10_format_nvm() {
        let cmd = FormatNvmCmd { nsid: 1, lbaf: 0x23, mset: true, pi: 5, pil: true, ses: 2 };
        let s = cmd.to_sqe();
        assert_eq!((s.cdw0.get(), s.nsid.get()), (0x80, 1));
        assert_eq!(
            s.cdw10.get(),
            0x2000 | 0x400 | 0x100 | 0xa0 | 0x10 | 0x3,
            "LBAFU 13:12, SES 11:9, PIL 8, PI 7:5, MSET 4, LBAFL 3:0"
        );
        let v = FormatNvm(&s);
        assert_eq!((v.lbaf(), v.mset(), v.pi(), v.ses()), (0x23, true, 5, 2));
    }

    #[test]
    fn spec_5_1_1_abort() {
        let s = AbortCmd { sqid: 2, cid: 0xbeef }.to_sqe();
        assert_eq!((s.cdw0.get(), s.cdw10.get()), (0x08, 0xbeef_0002), "CID 31:16, SQID 15:0");
        assert_eq!((Abort(&s).sqid(), Abort(&s).cid()), (2, 0xbeef));
    }
}
