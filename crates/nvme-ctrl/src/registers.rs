//! The controller's register file (Base §3.1.4): CAP, VS, INTMS/INTMC, CC, CSTS, AQA,
//! ASQ and ACQ as the host reads and writes them. What a register write *does* (an
//! enable, a reset, a shutdown) is the controller's lifecycle; this part keeps the
//! values and their masks.

use nvme_spec::regs::{offset, Aqa, Cap, Cc, Csts, ShutdownStatus, NVME_VERSION_1_4};
use serde::{Deserialize, Serialize};

use crate::lifecycle::{Lifecycle, Phase};

#[derive(Debug)]
pub(crate) struct RegisterFile {
    cap: Cap,
    cc: Cc,
    csts: Csts,
    aqa: Aqa,
    asq: u64,
    acq: u64,
    intms: u32,
}

/// The registers' part of a saved controller state, with the lifecycle they go with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Registers {
    pub cc: u32,
    pub csts: u32,
    pub aqa: u32,
    pub asq: u64,
    pub acq: u64,
    pub intms: u32,
    /// "disabled", "ready", "shut-down" or "fatal".
    pub lifecycle: String,
    /// CC.MPS in bytes.
    pub page_size: u64,
}

impl Registers {
    /// The phase these registers say the controller was in, if they are consistent
    /// with each other, with the lifecycle and with `cap`; or why not.
    pub(crate) fn check(&self, cap: Cap) -> Result<Phase, String> {
        let lifecycle =
            Lifecycle::from_name(&self.lifecycle).ok_or_else(|| format!("lifecycle {:?}", self.lifecycle))?;
        let (cc, csts) = (Cc(self.cc), Csts(self.csts));
        let why = |why: &str| {
            format!("registers: {why} (CC {:#x}, CSTS {:#x}, {})", self.cc, self.csts, self.lifecycle)
        };
        let defined = Csts::RDY | Csts::CFS | (3 << Csts::SHST_SHIFT) | Csts::NSSRO | Csts::PP;
        if self.csts & !defined != 0 {
            return Err(why("reserved CSTS bits set"));
        }
        let page = self.page_size;
        if !page.is_power_of_two() || !(4096..=65536).contains(&page) {
            return Err(why(&format!("page size {page}")));
        }
        let running = matches!(lifecycle, Lifecycle::Ready | Lifecycle::ShutDown);
        let problem = if lifecycle == Lifecycle::Disabled && (cc.en() || csts.rdy() || csts.cfs()) {
            Some("disabled, yet enabled or ready")
        } else if running && (!cc.en() || !csts.rdy() || csts.cfs()) {
            Some("running, yet not enabled and ready")
        } else if lifecycle == Lifecycle::Fatal && !csts.cfs() {
            Some("fatal without CSTS.CFS")
        } else if running
            && (cc.mps() < cap.mpsmin() || cc.mps() > cap.mpsmax() || page != 1u64 << (12 + cc.mps() as u32))
        {
            Some("the page size is not CC.MPS's")
        } else if running && (!self.asq.is_multiple_of(page) || !self.acq.is_multiple_of(page)) {
            Some("ASQ/ACQ not page aligned")
        } else {
            None
        };
        if let Some(p) = problem {
            return Err(why(p));
        }
        Ok(Phase::of(lifecycle, page))
    }

    /// The admin queues as AQA, ASQ and ACQ describe them: (base, entries) of the
    /// SQ and of the CQ.
    pub(crate) fn admin_queues(&self) -> ((u64, u32), (u64, u32)) {
        let aqa = Aqa(self.aqa);
        ((self.asq, aqa.asqs_z() as u32 + 1), (self.acq, aqa.acqs_z() as u32 + 1))
    }
}

impl RegisterFile {
    /// At power-on: everything zero but CAP.
    pub fn new(cap: Cap) -> Self {
        RegisterFile { cap, cc: Cc(0), csts: Csts(0), aqa: Aqa(0), asq: 0, acq: 0, intms: 0 }
    }

    /// Back to power-on (a function-level reset), CAP kept.
    pub fn power_on(&mut self) {
        *self = RegisterFile::new(self.cap);
    }

    /// The 64-bit register at `off` as the host reads it (None: none there).
    /// `fatal`: a worker hit a fault, CSTS.CFS reads set.
    pub fn read(&self, off: u64, fatal: bool) -> Option<u64> {
        Some(match off {
            offset::CAP => self.cap.0,
            offset::VS => NVME_VERSION_1_4 as u64,
            offset::INTMS | offset::INTMC => self.intms as u64,
            offset::CC => self.cc.0 as u64,
            offset::CSTS => (self.csts.0 | if fatal { Csts::CFS } else { 0 }) as u64,
            offset::NSSR => 0,
            offset::AQA => self.aqa.0 as u64,
            offset::ASQ => self.asq,
            offset::ACQ => self.acq,
            _ => return None,
        })
    }

    pub fn cap(&self) -> Cap {
        self.cap
    }

    pub fn cc(&self) -> Cc {
        self.cc
    }

    pub fn csts(&self) -> Csts {
        self.csts
    }

    pub fn intms(&self) -> u32 {
        self.intms
    }

    /// The admin queue as AQA/ASQ/ACQ say: (ASQ, ACQ, SQ entries, CQ entries).
    pub fn admin_queue(&self) -> (u64, u64, u32, u32) {
        (self.asq, self.acq, self.aqa.asqs_z() as u32 + 1, self.aqa.acqs_z() as u32 + 1)
    }

    /// AQA's sizes are 12-bit fields; the rest of the register is reserved.
    pub fn set_aqa(&mut self, v: u32) {
        self.aqa = Aqa(v & 0x0fff_0fff);
    }

    /// A write of ASQ or ACQ (`acq`): the whole register, or (`half` Some(high)) its
    /// low or high 32 bits.
    pub fn set_queue_base(&mut self, acq: bool, v: u64, half: Option<bool>) {
        let r = if acq { &mut self.acq } else { &mut self.asq };
        *r = match half {
            None => v,
            Some(false) => (*r & !0xffff_ffff) | (v & 0xffff_ffff),
            Some(true) => (*r & 0xffff_ffff) | (v << 32),
        };
    }

    /// INTMS (`set`) or INTMC: sets or clears mask bits.
    pub fn mask(&mut self, bits: u32, set: bool) {
        if set {
            self.intms |= bits;
        } else {
            self.intms &= !bits;
        }
    }

    /// Takes CC's writable bits from `v`; the CC it replaces.
    pub fn set_cc(&mut self, v: u32) -> Cc {
        std::mem::replace(&mut self.cc, Cc(v & Cc::WRITABLE))
    }

    /// CC.EN cleared, as a reset does.
    pub fn clear_enable(&mut self) {
        self.cc = Cc(self.cc.0 & !1);
    }

    /// CSTS: ready (RDY), reset (0), or fatal (CFS).
    pub fn set_csts(&mut self, csts: Csts) {
        self.csts = csts;
    }

    /// CSTS.CFS set, the rest kept.
    pub fn set_fatal(&mut self) {
        self.csts = Csts(self.csts.0 | Csts::CFS);
    }

    pub fn set_shutdown_status(&mut self, s: ShutdownStatus) {
        self.csts = self.csts.with_shst(s);
    }

    /// For a saved state, with the phase the controller is in.
    pub fn save(&self, phase: Phase) -> Registers {
        Registers {
            cc: self.cc.0,
            csts: self.csts.0,
            aqa: self.aqa.0,
            asq: self.asq,
            acq: self.acq,
            intms: self.intms,
            lifecycle: phase.lifecycle().name().into(),
            page_size: phase.page_size().unwrap_or(4096),
        }
    }

    /// From a saved state ([`Registers::check`]ed).
    pub fn restore(&mut self, v: &Registers) {
        (self.cc, self.csts, self.aqa) = (Cc(v.cc), Csts(v.csts), Aqa(v.aqa));
        (self.asq, self.acq, self.intms) = (v.asq, v.acq, v.intms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_masks_and_reads() {
        let mut r = RegisterFile::new(Cap::new(1023, 20, 0, 0, 4));
        r.set_queue_base(false, 0x1234_5000, Some(false));
        r.set_queue_base(false, 0x1, Some(true));
        assert_eq!(r.read(offset::ASQ, false), Some(0x1_1234_5000));
        r.set_queue_base(true, 0xdead_0000_0000_2000, None);
        assert_eq!(r.read(offset::ACQ, false), Some(0xdead_0000_0000_2000));
        r.set_aqa(0xffff_ffff);
        assert_eq!(r.read(offset::AQA, false), Some(0x0fff_0fff));
        r.mask(0b1010, true);
        r.mask(0b0010, false);
        assert_eq!(r.intms(), 0b1000);
        assert_eq!(r.read(offset::CSTS, true), Some(Csts::CFS as u64));
        let old = r.set_cc(0xffff_ffff);
        assert_eq!((old.0, r.cc().0), (0, Cc::WRITABLE));
        assert_eq!(r.read(0x3c, false), None);
        let phase = Phase::Ready { page_size: 8192 };
        let v = r.save(phase);
        assert_eq!((v.lifecycle.as_str(), v.page_size), ("ready", 8192));
        r.power_on();
        assert_eq!(r.read(offset::ASQ, false), Some(0));
        r.restore(&v);
        assert_eq!(r.save(phase), v);
    }

    /// A saved register part is checked against itself, the lifecycle it names and
    /// CAP before a restore uses it.
    #[test]
    fn a_saved_register_part_is_checked() {
        let cap = Cap::new(1023, 20, 0, 0, 4);
        let ready = Registers {
            cc: 1 | (1 << 7), // EN, MPS = 1 (8 KiB)
            csts: Csts::RDY,
            aqa: 0x001f_001f,
            asq: 0x4000,
            acq: 0x6000,
            intms: 0,
            lifecycle: "ready".into(),
            page_size: 8192,
        };
        assert_eq!(ready.check(cap), Ok(Phase::Ready { page_size: 8192 }));
        assert_eq!(ready.admin_queues(), ((0x4000, 32), (0x6000, 32)));
        type Break = (&'static str, fn(&mut Registers));
        let broken: [Break; 6] = [
            ("an unknown lifecycle", |r| r.lifecycle = "sleeping".into()),
            ("ready, not enabled", |r| r.cc &= !1),
            ("a page size that is not CC.MPS's", |r| r.page_size = 4096),
            ("no page size", |r| r.page_size = 3000),
            ("ASQ not page aligned", |r| r.asq += 4096),
            ("fatal without CFS", |r| r.lifecycle = "fatal".into()),
        ];
        for (what, f) in broken {
            let mut r = ready.clone();
            f(&mut r);
            assert!(r.check(cap).is_err(), "{what} was not refused");
        }
    }
}
