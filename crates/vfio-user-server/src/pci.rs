//! PCI configuration space of the NVMe function: class 01-08-02 (NVM Express I/O
//! controller), a 64-bit memory BAR0 for the controller registers and doorbells, a
//! 32-bit memory BAR4 for the MSI-X table and PBA, and the PM, MSI-X and PCI Express
//! (endpoint) capabilities a Linux guest and QEMU's vfio-user-pci expect.

/// Size of the config region we expose (PCIe extended config space).
pub const CONFIG_SIZE: usize = 4096;

const CAP_PM: u8 = 0x40;
const CAP_MSIX: u8 = 0x50;
const CAP_EXP: u8 = 0x60;

/// BAR4 layout: MSI-X table at 0, PBA at `PBA_OFFSET`.
pub const PBA_OFFSET: u64 = 0x1000;

/// Identity and sizes of the function.
#[derive(Clone, Copy, Debug)]
pub struct PciIds {
    pub vendor: u16,
    pub device: u16,
    pub subsystem_vendor: u16,
    pub subsystem: u16,
    pub revision: u8,
}

/// The config space: contents plus the masks of what a guest may write.
#[derive(Clone)]
pub struct ConfigSpace {
    data: [u8; CONFIG_SIZE],
    /// Bits writable by the guest.
    wmask: [u8; CONFIG_SIZE],
    /// Bits cleared by writing 1 (status register).
    w1c: [u8; CONFIG_SIZE],
    bar_sizes: [u64; 6],
}

impl std::fmt::Debug for ConfigSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigSpace").field("bar_sizes", &self.bar_sizes).finish_non_exhaustive()
    }
}

impl ConfigSpace {
    /// Builds the config space for an NVMe function with `bar0` bytes of registers and
    /// `vectors` MSI-X vectors (table and PBA in BAR4 of `bar4` bytes).
    pub fn new(ids: PciIds, bar0: u64, bar4: u64, vectors: u16) -> Self {
        assert!(bar0.is_power_of_two() && bar4.is_power_of_two() && (1..=2048).contains(&vectors));
        let mut c = ConfigSpace {
            data: [0; CONFIG_SIZE],
            wmask: [0; CONFIG_SIZE],
            w1c: [0; CONFIG_SIZE],
            bar_sizes: [0; 6],
        };
        c.set16(0x00, ids.vendor);
        c.set16(0x02, ids.device);
        // Command: memory space + bus master + INTx disable are writable.
        c.wmask16(0x04, 0x0406 | 0x0040 | 0x0100);
        // Status: capabilities list.
        c.set16(0x06, 0x0010);
        c.w1c[0x07] = 0xf9;
        c.data[0x08] = ids.revision;
        // Class code 01h (mass storage), 08h (NVM), 02h (NVM Express).
        c.data[0x09] = 0x02;
        c.data[0x0a] = 0x08;
        c.data[0x0b] = 0x01;
        c.data[0x0e] = 0x00; // header type 0, single function
        c.wmask[0x0c] = 0xff; // cache line size
        c.wmask[0x0d] = 0xff; // latency timer
                              // BAR0/1: 64-bit non-prefetchable memory.
        c.set32(0x10, 0x4);
        c.bar_sizes[0] = bar0;
        c.wmask32(0x10, !(bar0 as u32 - 1) & !0xf);
        c.wmask32(0x14, 0xffff_ffff);
        // BAR4: 32-bit non-prefetchable memory (MSI-X table and PBA).
        c.set32(0x20, 0x0);
        c.bar_sizes[4] = bar4;
        c.wmask32(0x20, !(bar4 as u32 - 1) & !0xf);
        c.set16(0x2c, ids.subsystem_vendor);
        c.set16(0x2e, ids.subsystem);
        c.data[0x34] = CAP_PM;
        c.wmask[0x3c] = 0xff; // interrupt line
        c.data[0x3d] = 0x01; // INTA#

        // Power Management capability (version 3, D0 only).
        c.data[CAP_PM as usize] = 0x01;
        c.data[CAP_PM as usize + 1] = CAP_MSIX;
        c.set16(CAP_PM as usize + 2, 0x0003);
        c.wmask16(CAP_PM as usize + 4, 0x0003); // PowerState (we stay in D0 regardless)

        // MSI-X capability: table in BAR4 at 0, PBA in BAR4 at PBA_OFFSET.
        let m = CAP_MSIX as usize;
        c.data[m] = 0x11;
        c.data[m + 1] = CAP_EXP;
        c.set16(m + 2, vectors - 1);
        c.wmask16(m + 2, 0xc000); // MSI-X Enable, Function Mask
        c.set32(m + 4, 4); // table: BIR 4, offset 0
        c.set32(m + 8, PBA_OFFSET as u32 | 4);

        // PCI Express capability v2, endpoint.
        let e = CAP_EXP as usize;
        c.data[e] = 0x10;
        c.data[e + 1] = 0x00;
        c.set16(e + 2, 0x0002); // version 2, device/port type 0 = endpoint
        c.set32(e + 4, 0x0000_8000 | 0x1); // DevCap: role-based error reporting, MPS 256
        c.wmask16(e + 8, 0x7cff); // DevCtl
        c.set32(e + 0x0c, (1 << 4) | 0x4); // LinkCap: x1, 16 GT/s
        c.set16(e + 0x12, (1 << 4) | 0x4); // LinkSta: x1 at 16 GT/s
        c.set32(e + 0x24, 0x0000_0000); // DevCap2
        c
    }

    fn set16(&mut self, off: usize, v: u16) {
        self.data[off..off + 2].copy_from_slice(&v.to_le_bytes());
    }
    fn set32(&mut self, off: usize, v: u32) {
        self.data[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }
    fn wmask16(&mut self, off: usize, v: u16) {
        self.wmask[off..off + 2].copy_from_slice(&v.to_le_bytes());
    }
    fn wmask32(&mut self, off: usize, v: u32) {
        self.wmask[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }

    pub fn bar_size(&self, bar: usize) -> u64 {
        self.bar_sizes.get(bar).copied().unwrap_or(0)
    }

    /// Reads `buf.len()` bytes at `off`; bytes past the end read as zero.
    pub fn read(&self, off: u64, buf: &mut [u8]) {
        for (i, b) in buf.iter_mut().enumerate() {
            *b = off.checked_add(i as u64).and_then(|o| self.data.get(o as usize)).copied().unwrap_or(0);
        }
    }

    /// Writes `data` at `off` through the write masks (read-only bits keep their
    /// value, write-1-to-clear bits clear). Out-of-range bytes are ignored.
    pub fn write(&mut self, off: u64, data: &[u8]) {
        for (i, &v) in data.iter().enumerate() {
            let Some(o) = off.checked_add(i as u64).map(|o| o as usize).filter(|&o| o < CONFIG_SIZE) else {
                continue;
            };
            let m = self.wmask[o];
            self.data[o] = (self.data[o] & !m) | (v & m);
            self.data[o] &= !(v & self.w1c[o]);
        }
    }

    /// MSI-X Enable bit of the Message Control register.
    pub fn msix_enabled(&self) -> bool {
        self.data[CAP_MSIX as usize + 3] & 0x80 != 0
    }

    /// MSI-X Function Mask bit.
    pub fn msix_function_masked(&self) -> bool {
        self.data[CAP_MSIX as usize + 3] & 0x40 != 0
    }

    /// Bus Master Enable.
    pub fn bus_master(&self) -> bool {
        self.data[0x04] & 0x04 != 0
    }

    /// Whether saved contents (a hand-over, a migration stream) fit this function:
    /// the same size, and every bit a guest cannot write (identity, class, BAR
    /// sizes, capabilities and their layout) the same as here. A source built
    /// differently (another PCI ID, another vector count) is refused, as is a
    /// stream that would change what the guest cannot.
    pub fn check_restore(&self, data: &[u8]) -> Result<(), String> {
        if data.len() != CONFIG_SIZE {
            return Err(format!("config space of {} bytes, want {CONFIG_SIZE}", data.len()));
        }
        let differs =
            (0..CONFIG_SIZE).find(|&o| (data[o] ^ self.data[o]) & !(self.wmask[o] | self.w1c[o]) != 0);
        match differs {
            Some(o) => Err(format!(
                "config space byte {o:#x} is {:#04x}, here {:#04x}, and a guest cannot write it",
                data[o], self.data[o]
            )),
            None => Ok(()),
        }
    }

    /// Puts saved contents back ([`Self::check_restore`] first); the masks stay this
    /// function's own.
    pub fn restore(&mut self, data: &[u8]) -> Result<(), String> {
        self.check_restore(data)?;
        self.data.copy_from_slice(data);
        Ok(())
    }

    /// Whole config space (for tests and debugging).
    pub fn bytes(&self) -> &[u8; CONFIG_SIZE] {
        &self.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cs() -> ConfigSpace {
        let ids = PciIds {
            vendor: 0x1b36,
            device: 0x0010,
            subsystem_vendor: 0x1af4,
            subsystem: 0x1100,
            revision: 2,
        };
        ConfigSpace::new(ids, 0x4000, 0x2000, 65)
    }

    fn caps(c: &ConfigSpace) -> Vec<u8> {
        let mut ids = Vec::new();
        let mut p = c.bytes()[0x34] as usize;
        while p != 0 {
            ids.push(c.bytes()[p]);
            p = c.bytes()[p + 1] as usize;
            assert!(ids.len() < 16, "capability list loops");
        }
        ids
    }

    #[test]
    fn nvme_class_and_capability_chain() {
        let c = cs();
        assert_eq!(&c.bytes()[0x09..0x0c], &[0x02, 0x08, 0x01]);
        assert_eq!(caps(&c), vec![0x01, 0x11, 0x10], "PM, MSI-X, PCI Express");
        let mut b = [0u8; 2];
        c.read(0x52, &mut b);
        assert_eq!(u16::from_le_bytes(b) & 0x7ff, 64, "65 vectors, 0's based");
        assert_eq!(c.bytes()[0x62] & 0xf0, 0, "PCIe endpoint");
    }

    #[test]
    fn bar_sizing_and_read_only_bits() {
        let mut c = cs();
        c.write(0x10, &0xffff_ffffu32.to_le_bytes());
        let mut b = [0u8; 4];
        c.read(0x10, &mut b);
        assert_eq!(u32::from_le_bytes(b), 0xffff_c004, "16 KiB, 64-bit memory");
        c.write(0x20, &0xffff_ffffu32.to_le_bytes());
        c.read(0x20, &mut b);
        assert_eq!(u32::from_le_bytes(b), 0xffff_e000);
        c.write(0x00, &[0, 0, 0, 0]);
        c.read(0x00, &mut b);
        assert_eq!(u32::from_le_bytes(b), 0x0010_1b36, "IDs are read-only");
        c.write(0x52, &[0x00, 0xc0]);
        assert!(c.msix_enabled() && c.msix_function_masked());
        c.write(0x04, &[0x06, 0x00]);
        assert!(c.bus_master());
        c.read(0xfff, &mut b[..1]);
        c.read(0x2000, &mut b);
        assert_eq!(b, [0; 4]);
        c.write(u64::MAX - 1, &[1, 2, 3]);
    }
}
