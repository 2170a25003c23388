//! NVM command set I/O commands (NVM §3), both ways: views that name the fields of
//! an [`Sqe`], and builders (`ReadWriteCmd`, ...) that encode the same fields into
//! one (command identifier 0, PRPs for data; see [`crate::admin`]).

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::opcode::nvm as op;
use crate::Sqe;

/// Read, Write, Compare, Verify, Write Zeroes and Write Uncorrectable share the
/// SLBA / NLB / control layout (NVM §3.2.6 Read, §3.2.8 Write, §3.2.1 Compare,
/// §3.2.9 Write Zeroes, §3.2.7 Verify).
#[derive(Clone, Copy, Debug)]
pub struct ReadWrite<'a>(pub &'a Sqe);

impl ReadWrite<'_> {
    /// Starting LBA.
    pub fn slba(&self) -> u64 {
        self.0.cdw10.get() as u64 | ((self.0.cdw11.get() as u64) << 32)
    }
    /// Number of Logical Blocks, 0's based.
    pub fn nlb_z(&self) -> u16 {
        self.0.cdw12.get() as u16
    }
    /// Number of logical blocks.
    pub fn nlb(&self) -> u32 {
        self.nlb_z() as u32 + 1
    }
    /// Force Unit Access.
    pub fn fua(&self) -> bool {
        self.0.cdw12.get() & (1 << 30) != 0
    }
    /// Limited Retry.
    pub fn lr(&self) -> bool {
        self.0.cdw12.get() & (1 << 31) != 0
    }
    /// Protection Information field (PRINFO, 29:26).
    pub fn prinfo(&self) -> u8 {
        ((self.0.cdw12.get() >> 26) & 0xf) as u8
    }
    /// Expected (reads) or Initial (writes) Logical Block Reference Tag, low 32
    /// bits (Dword 14).
    pub fn eilbrt(&self) -> u32 {
        self.0.cdw14.get()
    }
    /// Expected Logical Block Application Tag, or the one written with PRACT
    /// (Dword 15, 15:0).
    pub fn elbat(&self) -> u16 {
        self.0.cdw15.get() as u16
    }
    /// Expected Logical Block Application Tag Mask (Dword 15, 31:16).
    pub fn elbatm(&self) -> u16 {
        (self.0.cdw15.get() >> 16) as u16
    }
    /// Write Zeroes: Deallocate (bit 25).
    pub fn deac(&self) -> bool {
        self.0.cdw12.get() & (1 << 25) != 0
    }
    /// Directive Type (23:20).
    pub fn dtype(&self) -> u8 {
        ((self.0.cdw12.get() >> 20) & 0xf) as u8
    }
    /// Directive Specific (CDW13 31:16): with the Data Placement directive, the
    /// placement identifier.
    pub fn dspec(&self) -> u16 {
        (self.0.cdw13.get() >> 16) as u16
    }
}

/// Builds Read, Write, or another command with the SLBA / NLB layout of
/// [`ReadWrite`] (Compare, Verify, Write Uncorrectable).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadWriteCmd {
    pub nsid: u32,
    /// Starting LBA.
    pub slba: u64,
    /// Number of Logical Blocks, 0's based.
    pub nlb_z: u16,
    /// Force Unit Access.
    pub fua: bool,
    /// Limited Retry.
    pub lr: bool,
}

impl ReadWriteCmd {
    pub fn read(self) -> Sqe {
        self.to_sqe(op::READ)
    }
    pub fn write(self) -> Sqe {
        self.to_sqe(op::WRITE)
    }
    /// The fields under any opcode sharing the layout.
    pub fn to_sqe(self, opcode: u8) -> Sqe {
        let mut s = Sqe::with_opcode(opcode);
        s.nsid = U32::new(self.nsid);
        set_lba_range(&mut s, self.slba, self.nlb_z);
        s.cdw12 = U32::new(s.cdw12.get() | (self.fua as u32) << 30 | (self.lr as u32) << 31);
        s
    }
}

/// Builds a Write Zeroes command (NVM §3.2.9).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteZeroesCmd {
    pub nsid: u32,
    /// Starting LBA.
    pub slba: u64,
    /// Number of Logical Blocks, 0's based.
    pub nlb_z: u16,
    /// Deallocate: the blocks may be deallocated rather than written.
    pub deac: bool,
    /// Force Unit Access.
    pub fua: bool,
}

impl WriteZeroesCmd {
    pub fn to_sqe(self) -> Sqe {
        let mut s = Sqe::with_opcode(op::WRITE_ZEROES);
        s.nsid = U32::new(self.nsid);
        set_lba_range(&mut s, self.slba, self.nlb_z);
        s.cdw12 = U32::new(s.cdw12.get() | (self.deac as u32) << 25 | (self.fua as u32) << 30);
        s
    }
}

/// SLBA in CDW11:CDW10, NLB (0's based) in CDW12 15:0.
fn set_lba_range(s: &mut Sqe, slba: u64, nlb_z: u16) {
    s.cdw10 = U32::new(slba as u32);
    s.cdw11 = U32::new((slba >> 32) as u32);
    s.cdw12 = U32::new(nlb_z as u32);
}

/// Builds a Flush command (Base §7.2): no fields but the namespace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlushCmd {
    /// The namespace, or [`crate::NSID_ALL`] for every namespace.
    pub nsid: u32,
}

impl FlushCmd {
    pub fn to_sqe(self) -> Sqe {
        let mut s = Sqe::with_opcode(op::FLUSH);
        s.nsid = U32::new(self.nsid);
        s
    }
}

/// Dataset Management (NVM §3.2.3).
#[derive(Clone, Copy, Debug)]
pub struct DatasetManagement<'a>(pub &'a Sqe);

impl DatasetManagement<'_> {
    /// Number of Ranges, 0's based.
    pub fn nr_z(&self) -> u8 {
        self.0.cdw10.get() as u8
    }
    pub fn ranges(&self) -> usize {
        self.nr_z() as usize + 1
    }
    /// Attribute – Deallocate.
    pub fn ad(&self) -> bool {
        self.0.cdw11.get() & (1 << 2) != 0
    }
    /// Attribute – Integral Dataset for Write.
    pub fn idw(&self) -> bool {
        self.0.cdw11.get() & (1 << 1) != 0
    }
    /// Attribute – Integral Dataset for Read.
    pub fn idr(&self) -> bool {
        self.0.cdw11.get() & 1 != 0
    }
}

/// Builds a Dataset Management command (NVM §3.2.3); the range list ([`DsmRange`]
/// entries) is the data, PRP1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DatasetManagementCmd {
    pub nsid: u32,
    /// Number of Ranges, 0's based.
    pub nr_z: u8,
    /// Attribute – Deallocate.
    pub ad: bool,
    /// Attribute – Integral Dataset for Write.
    pub idw: bool,
    /// Attribute – Integral Dataset for Read.
    pub idr: bool,
}

impl DatasetManagementCmd {
    pub fn to_sqe(self) -> Sqe {
        let mut s = Sqe::with_opcode(op::DATASET_MANAGEMENT);
        s.nsid = U32::new(self.nsid);
        s.cdw10 = U32::new(self.nr_z as u32);
        s.cdw11 = U32::new(self.idr as u32 | (self.idw as u32) << 1 | (self.ad as u32) << 2);
        s
    }
}

/// One Dataset Management range (NVM Figure "Dataset Management – Range Definition").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct DsmRange {
    pub context_attributes: U32,
    /// Length in logical blocks (not 0's based).
    pub nlb: U32,
    pub slba: U64,
}

const _: () = assert!(core::mem::size_of::<DsmRange>() == 16);

/// The most ranges one Dataset Management command can carry.
pub const DSM_MAX_RANGES: usize = 256;

impl DsmRange {
    /// A range of `nlb` blocks (not 0's based) from `slba`, no context attributes.
    pub fn new(slba: u64, nlb: u32) -> Self {
        DsmRange { context_attributes: U32::new(0), nlb: U32::new(nlb), slba: U64::new(slba) }
    }
}

/// Copy (NVM §3.3.1): copies the source ranges listed in the data buffer, one after
/// another, to the LBAs from SDLBA on, within the namespace.
#[derive(Clone, Copy, Debug)]
pub struct Copy<'a>(pub &'a Sqe);

impl Copy<'_> {
    /// Starting Destination LBA (CDW11:CDW10).
    pub fn sdlba(&self) -> u64 {
        self.0.cdw10.get() as u64 | ((self.0.cdw11.get() as u64) << 32)
    }
    /// Number of Ranges, 0's based (CDW12 7:0).
    pub fn nr_z(&self) -> u8 {
        self.0.cdw12.get() as u8
    }
    pub fn ranges(&self) -> usize {
        self.nr_z() as usize + 1
    }
    /// Descriptor Format (CDW12 11:8): 0h is [`CopyRange`], 1h [`CopyRangeF1`].
    pub fn desfmt(&self) -> u8 {
        ((self.0.cdw12.get() >> 8) & 0xf) as u8
    }
    /// Force Unit Access (CDW12 bit 30), for the writes of the destination.
    /// Protection Information Read and Write fields (PRINFOR, 15:12; PRINFOW,
    /// 29:26), together: zero when neither asks anything.
    pub fn prinfo(&self) -> u8 {
        let v = self.0.cdw12.get();
        (((v >> 12) & 0xf) | (((v >> 26) & 0xf) << 4)) as u8
    }
    pub fn fua(&self) -> bool {
        self.0.cdw12.get() & (1 << 30) != 0
    }
}

/// Builds a Copy command; the source range entries ([`CopyRange`], format 0) are
/// the data, PRP1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyCmd {
    pub nsid: u32,
    /// Starting Destination LBA.
    pub sdlba: u64,
    /// Number of Ranges, 0's based.
    pub nr_z: u8,
    /// Descriptor Format.
    pub desfmt: u8,
    pub fua: bool,
}

impl CopyCmd {
    pub fn to_sqe(self) -> Sqe {
        let mut s = Sqe::with_opcode(op::COPY);
        s.nsid = U32::new(self.nsid);
        s.cdw10 = U32::new(self.sdlba as u32);
        s.cdw11 = U32::new((self.sdlba >> 32) as u32);
        s.cdw12 = U32::new(self.nr_z as u32 | ((self.desfmt as u32 & 0xf) << 8) | (self.fua as u32) << 30);
        s
    }
}

/// One Source Range entry of Copy descriptor format 0h (NVM Figure "Source Range
/// Entries Copy Descriptor Format 0h"); the tag fields matter only with protection
/// information.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct CopyRange {
    pub rsvd0: U64,
    /// Starting LBA.
    pub slba: U64,
    /// Number of Logical Blocks, 0's based.
    pub nlb_z: zerocopy::little_endian::U16,
    pub rsvd18: [u8; 6],
    /// Expected Initial Logical Block Reference Tag.
    pub eilbrt: U32,
    /// Expected Logical Block Application Tag, and its Mask.
    pub elbat: zerocopy::little_endian::U16,
    pub elbatm: zerocopy::little_endian::U16,
}

const _: () = assert!(core::mem::size_of::<CopyRange>() == 32);

impl CopyRange {
    /// A range of `nlb` blocks (not 0's based, 1..=65536) from `slba`.
    pub fn new(slba: u64, nlb: u32) -> Self {
        CopyRange { slba: U64::new(slba), nlb_z: (nlb.saturating_sub(1) as u16).into(), ..Default::default() }
    }
}

/// One Source Range entry of Copy descriptor format 1h (NVM Figure "Source Range
/// Entries Copy Descriptor Format 1h"), for namespaces whose protection information
/// has the 64-bit guard: its expected reference tag is wider.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct CopyRangeF1 {
    pub rsvd0: U64,
    /// Starting LBA.
    pub slba: U64,
    /// Number of Logical Blocks, 0's based.
    pub nlb_z: zerocopy::little_endian::U16,
    pub rsvd18: [u8; 8],
    /// Expected Logical Block Storage Tag and Expected Initial Logical Block
    /// Reference Tag: 80 bits, most significant byte first (as the tuple on the
    /// medium), the reference tag in the low bits.
    pub elbt: [u8; 10],
    /// Expected Logical Block Application Tag, and its Mask.
    pub elbat: zerocopy::little_endian::U16,
    pub elbatm: zerocopy::little_endian::U16,
}

const _: () = assert!(core::mem::size_of::<CopyRangeF1>() == 40);

impl CopyRangeF1 {
    /// A range of `nlb` blocks (not 0's based, 1..=65536) from `slba`, expecting
    /// reference tag `eilbrt` first.
    pub fn new(slba: u64, nlb: u32, eilbrt: u64) -> Self {
        let mut elbt = [0u8; 10];
        elbt[2..].copy_from_slice(&eilbrt.to_be_bytes());
        CopyRangeF1 {
            slba: U64::new(slba),
            nlb_z: (nlb.saturating_sub(1) as u16).into(),
            elbt,
            ..Default::default()
        }
    }

    /// The low 64 bits of ELBT (the reference tag, and any storage tag above its
    /// bits there).
    pub fn eilbrt(&self) -> u64 {
        u64::from_be_bytes(self.elbt[2..].try_into().expect("8 bytes"))
    }
}

#[cfg(test)]
mod tests {
    //! Each builder's dwords against values worked out by hand from the command's
    //! figures, and decoded back through its view.
    use super::*;
    use zerocopy::IntoBytes;

    #[test]
    fn copy_fields_and_range_layout() {
        let cmd = CopyCmd { nsid: 2, sdlba: 0x1_0000_0010, nr_z: 3, desfmt: 0, fua: true };
        let s = cmd.to_sqe();
        assert_eq!(s.cdw0.get() & 0xff, 0x19);
        assert_eq!((s.cdw10.get(), s.cdw11.get(), s.cdw12.get()), (0x10, 1, 0x4000_0003));
        let c = Copy(&s);
        assert_eq!((c.sdlba(), c.ranges(), c.desfmt(), c.fua()), (0x1_0000_0010, 4, 0, true));
        let s = CopyCmd { desfmt: 1, ..cmd }.to_sqe();
        assert_eq!(Copy(&s).desfmt(), 1);
        let r = CopyRange::new(0x0102_0304_0506_0708, 16);
        let b = r.as_bytes();
        assert_eq!(&b[8..16], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&b[16..18], &15u16.to_le_bytes(), "NLB is 0's based at bytes 17:16");
        assert!(b[..8].iter().chain(&b[18..]).all(|&x| x == 0));
    }

    #[test]
    fn nvm_read_write_slba_nlb_fua() {
        let cmd = ReadWriteCmd { nsid: 1, slba: 0x1_2345_6789, nlb_z: 7, fua: true, lr: false };
        let w = cmd.write();
        assert_eq!(w.cdw0.get(), 0x01);
        assert_eq!(w.nsid.get(), 1);
        assert_eq!((w.cdw10.get(), w.cdw11.get()), (0x2345_6789, 1), "SLBA low, high");
        assert_eq!(w.cdw12.get(), 0x4000_0007, "FUA 30, NLB 15:0");
        let v = ReadWrite(&w);
        assert_eq!((v.slba(), v.nlb_z(), v.nlb(), v.fua(), v.lr()), (0x1_2345_6789, 7, 8, true, false));
        let r = ReadWriteCmd { nsid: 2, slba: 5, nlb_z: 0xffff, fua: false, lr: true }.read();
        assert_eq!((r.cdw0.get(), r.cdw10.get(), r.cdw11.get(), r.cdw12.get()), (0x02, 5, 0, 0x8000_ffff));
        assert_eq!(ReadWriteCmd::default().to_sqe(op::VERIFY).cdw0.get(), 0x0c);
    }

    #[test]
    fn nvm_write_zeroes_deac() {
        let s = WriteZeroesCmd { nsid: 1, slba: 16, nlb_z: 3, deac: true, fua: false }.to_sqe();
        assert_eq!(s.cdw0.get(), 0x08);
        assert_eq!((s.cdw10.get(), s.cdw11.get(), s.cdw12.get()), (16, 0, 0x0200_0003), "DEAC 25, NLB 15:0");
        assert!(ReadWrite(&s).deac());
    }

    #[test]
    fn nvm_flush_and_dataset_management() {
        let f = FlushCmd { nsid: crate::NSID_ALL }.to_sqe();
        assert_eq!((f.cdw0.get(), f.nsid.get(), f.cdw10.get()), (0x00, 0xffff_ffff, 0));
        let d = DatasetManagementCmd { nsid: 1, nr_z: 255, ad: true, ..Default::default() }.to_sqe();
        assert_eq!(d.cdw0.get(), 0x09);
        assert_eq!((d.cdw10.get(), d.cdw11.get()), (0xff, 0x4), "NR 7:0; AD bit 2");
        let v = DatasetManagement(&d);
        assert_eq!((v.ranges(), v.ad(), v.idw(), v.idr()), (256, true, false, false));
        let r = DsmRange::new(0x0102_0304_0506_0708, 9);
        assert_eq!(r.as_bytes(), &[0, 0, 0, 0, 9, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1]);
    }
}
