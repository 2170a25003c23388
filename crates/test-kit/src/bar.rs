//! BAR0 as a host reaches it, and the register half of Linux's bring-up over it.
//!
//! Three hosts drive a controller in the tests: the mock host (function calls into
//! a controller in this process), the vfio-user test host (REGION_READ/WRITE over
//! a socket) and the fuzzer's driver (vfio-user messages it records). Each
//! implements [`Bar0`]; the rings ([`crate::ring`]) and [`enable`] are written once
//! over it.

use nvme_spec::regs::{doorbell_offset, offset, Aqa, Cc, Csts, DoorbellKind};

/// BAR0 of an NVMe controller.
pub trait Bar0 {
    /// Reads `out.len()` bytes at `off`.
    fn read(&mut self, off: u64, out: &mut [u8]);
    /// Writes `data` at `off` (one access of its size).
    fn write(&mut self, off: u64, data: &[u8]);
    /// Lets the controller move while the host waits for it (a state change, a
    /// completion): run it, or sleep a little.
    fn pause(&mut self);

    fn read32(&mut self, off: u64) -> u32 {
        let mut b = [0u8; 4];
        self.read(off, &mut b);
        u32::from_le_bytes(b)
    }
    fn read64(&mut self, off: u64) -> u64 {
        let mut b = [0u8; 8];
        self.read(off, &mut b);
        u64::from_le_bytes(b)
    }
    fn write32(&mut self, off: u64, v: u32) {
        self.write(off, &v.to_le_bytes());
    }
    fn write64(&mut self, off: u64, v: u64) {
        self.write(off, &v.to_le_bytes());
    }
    /// Writes doorbell `kind` of queue `qid` (a trapped write).
    fn ring(&mut self, dstrd: u8, qid: u16, kind: DoorbellKind, v: u32) {
        self.write32(offset::DOORBELL_BASE + doorbell_offset(qid, kind, dstrd), v);
    }
}

/// Waits, at most `pauses` times [`Bar0::pause`], for CSTS.RDY to read `ready`.
/// Err: CSTS as last read (CSTS.CFS set, or RDY never changed).
pub fn wait_ready<B: Bar0 + ?Sized>(bar: &mut B, ready: bool, pauses: u32) -> Result<(), u32> {
    let mut left = pauses;
    loop {
        let csts = Csts(bar.read32(offset::CSTS));
        if csts.cfs() {
            return Err(csts.0);
        }
        if csts.rdy() == ready {
            return Ok(());
        }
        if left == 0 {
            return Err(csts.0);
        }
        left -= 1;
        bar.pause();
    }
}

/// Where the admin queue goes: its rings' guest addresses and its entries.
#[derive(Clone, Copy, Debug)]
pub struct AdminQueue {
    pub asq: u64,
    pub acq: u64,
    pub entries: u16,
}

/// The register half of `nvme_reset_work`: CC.EN = 0 and wait for RDY = 0, program
/// AQA/ASQ/ACQ, write CC without EN and then with it (64-byte SQEs, 16-byte CQEs,
/// 4 KiB pages, round robin), and wait for RDY. `pauses` bounds each wait.
pub fn enable<B: Bar0 + ?Sized>(bar: &mut B, admin: AdminQueue, pauses: u32) -> Result<(), u32> {
    bar.write32(offset::CC, 0);
    wait_ready(bar, false, pauses)?;
    bar.write32(offset::AQA, Aqa::new(admin.entries - 1, admin.entries - 1).0);
    bar.write64(offset::ASQ, admin.asq);
    bar.write64(offset::ACQ, admin.acq);
    bar.write32(offset::CC, Cc::LINUX.0);
    bar.write32(offset::CC, Cc::LINUX.with_en(true).0);
    wait_ready(bar, true, pauses)
}

/// A controller in this process is BAR0 by function call; pausing runs it.
impl Bar0 for nvme_ctrl::Controller {
    fn read(&mut self, off: u64, out: &mut [u8]) {
        self.mmio_read(off, out);
    }
    fn write(&mut self, off: u64, data: &[u8]) {
        self.mmio_write(off, data);
    }
    fn pause(&mut self) {
        while self.process() {}
    }
}
