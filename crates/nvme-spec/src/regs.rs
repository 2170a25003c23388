//! Controller registers (Base §3.1.4, PCIe §3.1) and doorbell layout (PCIe §3.1.2).
//!
//! Registers are plain integers wrapped in newtypes with named accessors, so handlers
//! never decode `cc >> 14` by hand. Fields that are 0's based carry a `_z` suffix.

/// Offsets of the controller registers in BAR0 (Base Figure 33).
pub mod offset {
    pub const CAP: u64 = 0x00;
    pub const VS: u64 = 0x08;
    pub const INTMS: u64 = 0x0c;
    pub const INTMC: u64 = 0x10;
    pub const CC: u64 = 0x14;
    pub const CSTS: u64 = 0x1c;
    pub const NSSR: u64 = 0x20;
    pub const AQA: u64 = 0x24;
    pub const ASQ: u64 = 0x28;
    pub const ACQ: u64 = 0x30;
    pub const CMBLOC: u64 = 0x38;
    pub const CMBSZ: u64 = 0x3c;
    pub const BPINFO: u64 = 0x40;
    pub const CRTO: u64 = 0x68;
    /// First doorbell register (SQ 0 tail).
    pub const DOORBELL_BASE: u64 = 0x1000;
}

/// VS value for NVMe 1.4.0 (Base §3.1.4.2: MJR in 31:16, MNR in 15:8).
pub const NVME_VERSION_1_4: u32 = 0x0001_0400;

/// Which half of a queue pair a doorbell belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DoorbellKind {
    /// Submission Queue y Tail Doorbell.
    SqTail,
    /// Completion Queue y Head Doorbell.
    CqHead,
}

/// For logs: `SQ tail` or `CQ head`.
impl core::fmt::Display for DoorbellKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            DoorbellKind::SqTail => "SQ tail",
            DoorbellKind::CqHead => "CQ head",
        })
    }
}

/// Byte offset of a doorbell relative to the first doorbell (PCIe §3.1.2):
/// SQyTDBL at `(2y) * (4 << CAP.DSTRD)`, CQyHDBL at `(2y + 1) * (4 << CAP.DSTRD)`.
///
/// This is the only place the formula exists: BAR0 doorbells add
/// [`offset::DOORBELL_BASE`], and the Shadow Doorbell and EventIdx buffers
/// (Base §5.2.5 Doorbell Buffer Config) use the same offsets from the start of their
/// buffers.
pub const fn doorbell_offset(qid: u16, kind: DoorbellKind, dstrd: u8) -> u64 {
    let slot = 2 * qid as u64
        + match kind {
            DoorbellKind::SqTail => 0,
            DoorbellKind::CqHead => 1,
        };
    slot * (4u64 << dstrd)
}

/// The host's EventIdx rule for shadow doorbells (Base §5.2.5 Doorbell Buffer Config;
/// Linux `nvme_dbbuf_need_event`): moving a Shadow Doorbell entry from `old` to `new`
/// must also write the doorbell register when it passes `event_idx`, that is when
/// `event_idx` lies in `[old, new)` with the wrap of a 16-bit queue index.
pub const fn need_event(event_idx: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event_idx).wrapping_sub(1) < new.wrapping_sub(old)
}

/// Inverse of [`doorbell_offset`]: which doorbell an offset (relative to the first
/// doorbell) addresses, if it is exactly a doorbell register.
pub const fn doorbell_from_offset(off: u64, dstrd: u8) -> Option<(u16, DoorbellKind)> {
    let stride = 4u64 << dstrd;
    if !off.is_multiple_of(stride) {
        return None;
    }
    let slot = off / stride;
    if slot / 2 > u16::MAX as u64 {
        return None;
    }
    let kind = if slot.is_multiple_of(2) { DoorbellKind::SqTail } else { DoorbellKind::CqHead };
    Some(((slot / 2) as u16, kind))
}

const fn bits64(v: u64, lo: u32, width: u32) -> u64 {
    (v >> lo) & ((1u64 << width) - 1)
}

const fn bits32(v: u32, lo: u32, width: u32) -> u32 {
    (v >> lo) & ((1u32 << width) - 1)
}

/// Controller Capabilities (Base §3.1.4.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cap(pub u64);

impl Cap {
    /// Builds CAP from its fields. `mqes_z` is 0's based; `to` is in 500 ms units;
    /// `mpsmin`/`mpsmax` are the exponent minus 12.
    pub const fn new(mqes_z: u16, to: u8, dstrd: u8, mpsmin: u8, mpsmax: u8) -> Self {
        let mut v = mqes_z as u64;
        v |= 1 << 16; // CQR: contiguous queues required
        v |= (to as u64) << 24;
        v |= ((dstrd & 0xf) as u64) << 32;
        v |= 1 << 37; // CSS bit 0: NVM command set
        v |= 1 << 43; // CSS bit 6: one or more I/O command sets (CC.CSS = 110b)
        v |= ((mpsmin & 0xf) as u64) << 48;
        v |= ((mpsmax & 0xf) as u64) << 52;
        Cap(v)
    }
    /// Maximum Queue Entries Supported, 0's based.
    pub const fn mqes_z(self) -> u16 {
        bits64(self.0, 0, 16) as u16
    }
    /// Contiguous Queues Required.
    pub const fn cqr(self) -> bool {
        bits64(self.0, 16, 1) != 0
    }
    /// Timeout, in 500 ms units.
    pub const fn to(self) -> u8 {
        bits64(self.0, 24, 8) as u8
    }
    /// Doorbell Stride: doorbells are `4 << dstrd` bytes apart.
    pub const fn dstrd(self) -> u8 {
        bits64(self.0, 32, 4) as u8
    }
    /// Command Sets Supported: bit 0 the NVM command set, bit 6 I/O command sets
    /// chosen through CC.CSS = 110b.
    pub const fn css(self) -> u8 {
        bits64(self.0, 37, 8) as u8
    }
    /// Memory Page Size Minimum (page size is `1 << (12 + mpsmin)`).
    pub const fn mpsmin(self) -> u8 {
        bits64(self.0, 48, 4) as u8
    }
    /// Memory Page Size Maximum.
    pub const fn mpsmax(self) -> u8 {
        bits64(self.0, 52, 4) as u8
    }
}

/// CC.SHN: Shutdown Notification (Base §3.1.4.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShutdownNotification {
    None,
    Normal,
    Abrupt,
}

/// For logs: `none`, `normal` or `abrupt`.
impl core::fmt::Display for ShutdownNotification {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            ShutdownNotification::None => "none",
            ShutdownNotification::Normal => "normal",
            ShutdownNotification::Abrupt => "abrupt",
        })
    }
}

/// Controller Configuration (Base §3.1.4.5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cc(pub u32);

impl Cc {
    /// Bits a host may set: EN, CSS, MPS, AMS, SHN, IOSQES, IOCQES (CRIME is not supported).
    pub const WRITABLE: u32 = 0x00ff_fff1;

    /// The configuration Linux writes before it enables a controller: 64-byte SQEs
    /// (IOSQES = 6), 16-byte CQEs (IOCQES = 4), 4 KiB pages (MPS = 0), the NVM command
    /// set (CSS = 0), round robin (AMS = 0), EN clear.
    pub const LINUX: Cc = Cc(0).with_iosqes(6).with_iocqes(4);

    pub const fn en(self) -> bool {
        self.0 & 1 != 0
    }
    /// I/O Command Set Selected.
    pub const fn css(self) -> u8 {
        bits32(self.0, 4, 3) as u8
    }
    /// Memory Page Size: `1 << (12 + mps)`.
    pub const fn mps(self) -> u8 {
        bits32(self.0, 7, 4) as u8
    }
    /// Arbitration Mechanism Selected (0 = round robin).
    pub const fn ams(self) -> u8 {
        bits32(self.0, 11, 3) as u8
    }
    pub const fn shn(self) -> ShutdownNotification {
        match bits32(self.0, 14, 2) {
            0 => ShutdownNotification::None,
            1 => ShutdownNotification::Normal,
            // 10b is abrupt; 11b is reserved and treated as abrupt, the safer reading.
            _ => ShutdownNotification::Abrupt,
        }
    }
    /// I/O Submission Queue Entry Size, as a power of two.
    pub const fn iosqes(self) -> u8 {
        bits32(self.0, 16, 4) as u8
    }
    /// I/O Completion Queue Entry Size, as a power of two.
    pub const fn iocqes(self) -> u8 {
        bits32(self.0, 20, 4) as u8
    }
    pub const fn with_en(self, en: bool) -> Self {
        Cc((self.0 & !1) | en as u32)
    }
    pub const fn with_shn(self, shn: ShutdownNotification) -> Self {
        let v = match shn {
            ShutdownNotification::None => 0,
            ShutdownNotification::Normal => 1,
            ShutdownNotification::Abrupt => 2,
        };
        Cc((self.0 & !(3 << 14)) | (v << 14))
    }
    /// Sets IOSQES: SQ entries are `1 << iosqes` bytes.
    pub const fn with_iosqes(self, iosqes: u8) -> Self {
        Cc((self.0 & !(0xf << 16)) | ((iosqes as u32 & 0xf) << 16))
    }
    /// Sets IOCQES: CQ entries are `1 << iocqes` bytes.
    pub const fn with_iocqes(self, iocqes: u8) -> Self {
        Cc((self.0 & !(0xf << 20)) | ((iocqes as u32 & 0xf) << 20))
    }
}

/// CSTS.SHST: Shutdown Status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShutdownStatus {
    Normal = 0,
    Occurring = 1,
    Complete = 2,
}

/// Controller Status (Base §3.1.4.6).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Csts(pub u32);

impl Csts {
    pub const RDY: u32 = 1 << 0;
    pub const CFS: u32 = 1 << 1;
    pub const SHST_SHIFT: u32 = 2;
    pub const NSSRO: u32 = 1 << 4;
    pub const PP: u32 = 1 << 5;

    pub const fn rdy(self) -> bool {
        self.0 & Self::RDY != 0
    }
    /// Controller Fatal Status.
    pub const fn cfs(self) -> bool {
        self.0 & Self::CFS != 0
    }
    pub const fn shst(self) -> ShutdownStatus {
        match bits32(self.0, 2, 2) {
            0 => ShutdownStatus::Normal,
            1 => ShutdownStatus::Occurring,
            _ => ShutdownStatus::Complete,
        }
    }
    pub const fn with_shst(self, s: ShutdownStatus) -> Self {
        Csts((self.0 & !(3 << Self::SHST_SHIFT)) | ((s as u32) << Self::SHST_SHIFT))
    }
}

/// Admin Queue Attributes (Base §3.1.4.8). Both sizes are 0's based.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Aqa(pub u32);

impl Aqa {
    /// Admin Submission Queue Size, 0's based (12 bits).
    pub const fn asqs_z(self) -> u16 {
        bits32(self.0, 0, 12) as u16
    }
    /// Admin Completion Queue Size, 0's based (12 bits).
    pub const fn acqs_z(self) -> u16 {
        bits32(self.0, 16, 12) as u16
    }
    pub const fn new(asqs_z: u16, acqs_z: u16) -> Self {
        Aqa((asqs_z as u32 & 0xfff) | ((acqs_z as u32 & 0xfff) << 16))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doorbell_offsets_match_pcie_3_1_2() {
        assert_eq!(doorbell_offset(0, DoorbellKind::SqTail, 0), 0);
        assert_eq!(doorbell_offset(0, DoorbellKind::CqHead, 0), 4);
        assert_eq!(doorbell_offset(3, DoorbellKind::SqTail, 0), 24);
        assert_eq!(doorbell_offset(3, DoorbellKind::CqHead, 2), 7 * 16);
        for dstrd in 0..4 {
            for qid in [0u16, 1, 63, 64, 65535] {
                for kind in [DoorbellKind::SqTail, DoorbellKind::CqHead] {
                    let off = doorbell_offset(qid, kind, dstrd);
                    assert_eq!(doorbell_from_offset(off, dstrd), Some((qid, kind)));
                }
            }
        }
        assert_eq!(doorbell_from_offset(2, 0), None);
        assert_eq!(doorbell_from_offset(4, 1), None);
    }

    #[test]
    fn cap_fields_round_trip() {
        let cap = Cap::new(1023, 20, 0, 0, 4);
        assert_eq!(cap.mqes_z(), 1023);
        assert!(cap.cqr());
        assert_eq!(cap.to(), 20);
        assert_eq!(cap.dstrd(), 0);
        assert_eq!(cap.css() & 1, 1);
        assert_eq!(cap.mpsmin(), 0);
        assert_eq!(cap.mpsmax(), 4);
    }

    #[test]
    fn cc_decodes_linux_enable_value() {
        // Linux writes IOCQES=4, IOSQES=6, AMS=0, MPS=0, CSS=0, EN=1.
        let cc = Cc(0x0046_0001);
        assert!(cc.en());
        assert_eq!(cc.iosqes(), 6);
        assert_eq!(cc.iocqes(), 4);
        assert_eq!(cc.mps(), 0);
        assert_eq!(cc.shn(), ShutdownNotification::None);
        assert_eq!(Cc(0x4000).shn(), ShutdownNotification::Normal);
        assert_eq!(Cc(0x8000).shn(), ShutdownNotification::Abrupt);
    }

    #[test]
    fn cc_linux_encodes_iosqes_6_iocqes_4() {
        assert_eq!(Cc::LINUX.0, 0x0046_0000, "IOCQES 23:20 = 4, IOSQES 19:16 = 6");
        assert_eq!(Cc::LINUX.with_en(true).0, 0x0046_0001);
        assert_eq!(1usize << Cc::LINUX.iosqes(), crate::SQE_SIZE);
        assert_eq!(1usize << Cc::LINUX.iocqes(), crate::CQE_SIZE);
        let shn = Cc::LINUX.with_en(true).with_shn(ShutdownNotification::Normal);
        assert_eq!(shn.0, 0x0046_4001, "SHN 15:14 = 01b");
        assert_eq!(shn.with_shn(ShutdownNotification::Abrupt).0, 0x0046_8001);
        assert_eq!(shn.with_shn(ShutdownNotification::None), Cc::LINUX.with_en(true));
    }

    #[test]
    fn need_event_rings_when_crossing_eventidx() {
        assert!(need_event(5, 6, 5), "moving just past EventIdx rings");
        assert!(need_event(5, 9, 3), "jumping over EventIdx rings");
        assert!(!need_event(5, 5, 3), "stopping at EventIdx does not ring");
        assert!(!need_event(10, 9, 3), "not reaching EventIdx does not ring");
        assert!(need_event(65535, 2, 65534), "wraps like u16");
    }
}
