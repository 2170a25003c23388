//! Submission Queue Entry (Base §4.1, Figure 91 "Common Command Format").

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::sgl::SglDescriptor;

/// PSDT: PRP or SGL for Data Transfer (Base §4.1, CDW0 bits 15:14).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Psdt {
    /// PRPs are used for this transfer.
    Prp,
    /// SGLs; MPTR holds the address of a contiguous metadata buffer.
    SglMptrContiguous,
    /// SGLs; MPTR holds the address of an SGL segment for metadata.
    SglMptrSgl,
    /// 11b is reserved.
    Reserved,
}

/// A 64-byte submission queue entry, exactly as it sits in guest memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct Sqe {
    pub cdw0: U32,
    pub nsid: U32,
    pub cdw2: U32,
    pub cdw3: U32,
    pub mptr: U64,
    /// Data pointer: PRP entry 1 and 2, or one SGL descriptor (see [`Sqe::sgl1`]).
    pub dptr: [U64; 2],
    pub cdw10: U32,
    pub cdw11: U32,
    pub cdw12: U32,
    pub cdw13: U32,
    pub cdw14: U32,
    pub cdw15: U32,
}

const _: () = assert!(core::mem::size_of::<Sqe>() == crate::SQE_SIZE);

impl Sqe {
    pub fn opcode(&self) -> u8 {
        self.cdw0.get() as u8
    }
    /// Fused Operation (00b = normal).
    pub fn fuse(&self) -> u8 {
        ((self.cdw0.get() >> 8) & 3) as u8
    }
    pub fn psdt(&self) -> Psdt {
        match (self.cdw0.get() >> 14) & 3 {
            0 => Psdt::Prp,
            1 => Psdt::SglMptrContiguous,
            2 => Psdt::SglMptrSgl,
            _ => Psdt::Reserved,
        }
    }
    /// Command Identifier.
    pub fn cid(&self) -> u16 {
        (self.cdw0.get() >> 16) as u16
    }
    pub fn prp1(&self) -> u64 {
        self.dptr[0].get()
    }
    pub fn prp2(&self) -> u64 {
        self.dptr[1].get()
    }
    /// The data pointer read as SGL Descriptor 1.
    pub fn sgl1(&self) -> SglDescriptor {
        let mut d = SglDescriptor::default();
        d.as_mut_bytes().copy_from_slice(self.dptr.as_bytes());
        d
    }

    /// An entry carrying `opcode`, PRPs for data, command identifier 0 and every
    /// other field zero: the base the command builders start from.
    pub fn with_opcode(opcode: u8) -> Self {
        let mut s = Sqe::default();
        s.set_cdw0(opcode, 0, Psdt::Prp);
        s
    }

    /// Builds CDW0 from opcode, command identifier and PSDT (fuse = 0).
    pub fn set_cdw0(&mut self, opcode: u8, cid: u16, psdt: Psdt) {
        let psdt = match psdt {
            Psdt::Prp => 0,
            Psdt::SglMptrContiguous => 1,
            Psdt::SglMptrSgl => 2,
            Psdt::Reserved => 3,
        };
        self.cdw0 = U32::new(opcode as u32 | (psdt << 14) | ((cid as u32) << 16));
    }
    /// Sets the Command Identifier (CDW0 31:16), leaving opcode, FUSE and PSDT alone:
    /// a host picks the identifier when it places the entry in a queue.
    pub fn set_cid(&mut self, cid: u16) {
        self.cdw0 = U32::new((self.cdw0.get() & 0xffff) | ((cid as u32) << 16));
    }
    pub fn set_prps(&mut self, prp1: u64, prp2: u64) {
        self.dptr = [U64::new(prp1), U64::new(prp2)];
    }
    pub fn set_sgl1(&mut self, d: &SglDescriptor) {
        self.dptr.as_mut_bytes().copy_from_slice(d.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdw0_fields() {
        let mut s = Sqe::default();
        s.set_cdw0(0x02, 0xbeef, Psdt::SglMptrContiguous);
        assert_eq!(s.opcode(), 0x02);
        assert_eq!(s.cid(), 0xbeef);
        assert_eq!(s.psdt(), Psdt::SglMptrContiguous);
        assert_eq!(s.fuse(), 0);
        assert_eq!(s.as_bytes()[0], 0x02);
        assert_eq!(&s.as_bytes()[2..4], &[0xef, 0xbe]);
    }

    #[test]
    fn set_cid_keeps_opcode_fuse_and_psdt() {
        let mut s = Sqe::with_opcode(0x01);
        assert_eq!(s.cdw0.get(), 0x0000_0001);
        s.set_cdw0(0x02, 7, Psdt::SglMptrContiguous);
        s.cdw0 = U32::new(s.cdw0.get() | (1 << 8)); // FUSE = 01b
        s.set_cid(0xbeef);
        assert_eq!(s.cdw0.get(), 0xbeef_4102);
    }
}
