//! What the driver needs from the bus: BAR0 register access, doorbell writes, DMA
//! memory the device can reach, and interrupt eventfds. Implemented by
//! [`crate::vfio_user`] (a vfio-user client), [`crate::vfio`] (kernel VFIO) and, outside
//! this crate, the test kit's `InProcessTransport` (a controller in this process).
#![forbid(unsafe_code)]

use std::io;
use std::os::fd::OwnedFd;

use guest_mem::GuestMemory;
use rustix::event::{eventfd, EventfdFlags};

/// The PCI Command register (PCI Local Bus 3.0 §6.2.2) as the driver leaves it:
/// memory decoding and bus mastering on, and the legacy INTx pin off, since the
/// driver polls or takes MSI-X (Linux sets the same bits; SPDK's vfio-user target
/// reports Controller Fatal Status to a driver that leaves INTx enabled).
pub mod pci_command {
    /// Offset in config space.
    pub const OFFSET: u64 = 0x04;
    pub const MEMORY_SPACE: u16 = 1 << 1;
    pub const BUS_MASTER: u16 = 1 << 2;
    pub const INTX_DISABLE: u16 = 1 << 10;
    /// What the driver sets.
    pub const DRIVER: u16 = MEMORY_SPACE | BUS_MASTER | INTX_DISABLE;
}

/// DMA memory shared with the device.
#[derive(Clone, Debug)]
pub struct DmaRegion {
    /// Where the device sees the region (its I/O virtual address).
    pub iova: u64,
    pub len: u64,
    /// The host's view of the same memory, addressed by IOVA: `mem.read(iova, ..)`
    /// reads the first byte of the region.
    pub mem: GuestMemory,
}

/// A doorbell writer a queue can own outright, so ringing needs neither the shared
/// transport nor its lock (a mapped doorbell page, an eventfd per doorbell).
pub trait DirectDoorbell: Send + std::fmt::Debug {
    /// Rings the doorbell this writer was made for with `value`.
    fn ring(&mut self, value: u32) -> io::Result<()>;
}

/// A way to reach one NVMe PCI function.
pub trait Transport: Send + std::fmt::Debug {
    /// Reads a 32-bit BAR0 register.
    fn read32(&mut self, off: u64) -> io::Result<u32>;
    /// Reads a 64-bit BAR0 register.
    fn read64(&mut self, off: u64) -> io::Result<u64>;
    /// Writes a 32-bit BAR0 register and waits until the device has taken it.
    fn write32(&mut self, off: u64, value: u32) -> io::Result<()>;
    /// Writes a 64-bit BAR0 register and waits until the device has taken it.
    fn write64(&mut self, off: u64, value: u64) -> io::Result<()>;
    /// A doorbell register write at BAR0 offset `off` (the hot path; transports may
    /// post it without waiting). Writes are seen by the device in the order issued.
    fn doorbell(&mut self, off: u64, value: u32) -> io::Result<()>;
    /// A writer for the doorbell at BAR0 offset `off` that works without `&mut self`,
    /// if the transport's doorbell mode has one (None: use [`Transport::doorbell`]).
    fn direct_doorbell(&mut self, off: u64) -> io::Result<Option<Box<dyn DirectDoorbell>>> {
        let _ = off;
        Ok(None)
    }
    /// Whether doorbell writes carry no value and the device reads the value from the
    /// shadow doorbell buffer instead (an eventfd per doorbell): the driver must then
    /// use shadow doorbells.
    fn doorbell_needs_shadow(&self) -> bool {
        false
    }
    /// DMA memory shared with the device: a region the device can reach at `iova`,
    /// zero filled, at least `len` bytes, page aligned.
    fn dma_alloc(&mut self, len: u64) -> io::Result<DmaRegion>;
    /// One eventfd per interrupt vector `0..n` (MSI-X), signalled by the device
    /// (non-blocking, made with [`new_eventfd`]).
    fn enable_interrupts(&mut self, n: u16) -> io::Result<Vec<OwnedFd>>;
    /// A function-level reset of the device.
    fn reset(&mut self) -> io::Result<()>;
    /// One line saying what this transport is connected to, for logs and reports.
    fn describe(&self) -> String;
    /// Makes `[gpa, gpa + len)` of `mem` reachable by the device without copying:
    /// memory the driver did not get from [`Transport::dma_alloc`], typically a
    /// virtual machine's RAM that another device handed us. The range lies inside
    /// one region of `mem`. Returns the IOVA at which the device sees `gpa`, chosen
    /// by the transport so it collides with nothing else it maps, or `None` when
    /// this transport cannot share that memory (the caller then copies through DMA
    /// memory instead). The mapping lasts until [`Transport::unmap_external`].
    fn map_external(&mut self, mem: &GuestMemory, gpa: u64, len: u64) -> io::Result<Option<u64>> {
        let _ = (mem, gpa, len);
        Ok(None)
    }
    /// Ends a mapping made by [`Transport::map_external`] (`iova`, `len` as mapped).
    fn unmap_external(&mut self, iova: u64, len: u64) -> io::Result<()> {
        let _ = (iova, len);
        Ok(())
    }
    /// A descriptor that reports hang-up (POLLHUP / POLLRDHUP) once the device is
    /// gone for good (vfio-user: the socket, when the server goes away). `None` if
    /// the transport has none.
    fn hangup_fd(&self) -> io::Result<Option<OwnedFd>> {
        Ok(None)
    }
    /// Starts moving guest memory for a live migration, as a VMM going to another
    /// host does, while everything runs: the server's DMA log and this process's
    /// log of its own writes on, then a full copy. The next [`Self::migrate`]
    /// copies what both logs report and checks the copy (see `crate::dirty`).
    /// Unsupported by default.
    fn start_memory_copy(&mut self) -> io::Result<()> {
        Err(io::Error::new(io::ErrorKind::Unsupported, "this transport cannot migrate its device"))
    }
    /// Live-migrates the device to the server at `dest` and goes on with it there
    /// (vfio-user: migration v2). Unsupported by default.
    fn migrate(&mut self, dest: &std::path::Path) -> io::Result<Migrated> {
        let _ = dest;
        Err(io::Error::new(io::ErrorKind::Unsupported, "this transport cannot migrate its device"))
    }
}

/// What a live migration did ([`Transport::migrate`]).
#[derive(Clone, Copy, Debug)]
pub struct Migrated {
    /// From the source's stop to the destination's start, the memory check apart.
    pub downtime: std::time::Duration,
    /// Bytes of device state moved.
    pub bytes: usize,
    /// After [`Transport::start_memory_copy`]: what was copied again and checked.
    pub memory: Option<crate::dirty::CopyReport>,
}

/// A non-blocking, close-on-exec eventfd (interrupt vectors, wake-ups).
pub fn new_eventfd() -> io::Result<OwnedFd> {
    Ok(eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?)
}
