//! The in-process transport: the driver and an `nvme_ctrl::Controller` in the same
//! process, with no socket and no second process. A register or doorbell write is a
//! function call into the controller (`mmio_write` then `process`, what the vfio-user
//! server does for each REGION_WRITE); DMA memory is an anonymous mapping both sides
//! address by IOVA; MSI-X vectors are eventfds the controller signals.
//!
//! What it is for: tests that exercise the driver against the real controller without
//! vfio-user (bring-up, shadow doorbells, PRP lists, interrupts, the command set), and
//! `vnvme perf --in-process`, the ceiling a vfio-user transport can approach (same
//! driver, same controller and I/O worker threads, nothing in between).
//!
//! It is a crate of its own, not part of `nvme-driver`, so the driver never compiles
//! the emulator (the driver only defines the [`Transport`] trait this implements),
//! and not part of a test crate, since `vnvme perf --in-process` and `vnvme demo`
//! ship it.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use guest_mem::{GuestMemory, Mapping};
use nvme_ctrl::{Controller, ControllerConfig, InterruptSink, PollMode, Stats};

use nvme_driver::{new_eventfd, DmaRegion, Transport};

/// First IOVA handed out (0 stays invalid), and the allocation granule.
const IOVA_BASE: u64 = 1 << 32;
const CHUNK: u64 = 2 << 20;

/// MSI-X vectors as eventfds (what the vfio-user server's interrupts are).
#[derive(Debug, Default)]
struct Irqs(Mutex<Vec<OwnedFd>>);

impl InterruptSink for Irqs {
    fn signal(&self, vector: u16) {
        let fds = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = fds.get(vector as usize) {
            let _ = rustix::io::write(f, &1u64.to_ne_bytes());
        }
    }
}

/// How the in-process controller runs.
#[derive(Clone, Copy, Debug)]
pub struct InProcessOptions {
    /// I/O worker threads (`vnvme serve --workers`); 0 runs I/O queues inline in
    /// `process`, i.e. only when the driver writes a register or doorbell.
    pub workers: usize,
    /// How idle workers wait (`vnvme serve --poll`).
    pub poll: PollMode,
}

impl Default for InProcessOptions {
    fn default() -> Self {
        InProcessOptions { workers: 1, poll: PollMode::Adaptive }
    }
}

/// A controller in this process, reached by function calls.
#[derive(Debug)]
pub struct InProcessTransport {
    ctrl: Controller,
    /// Every DMA region, as the controller sees them.
    mem: GuestMemory,
    irqs: Arc<Irqs>,
    next_iova: u64,
    dma_bytes: u64,
    opts: InProcessOptions,
}

impl InProcessTransport {
    /// Builds a controller from `cfg` and starts its I/O workers.
    pub fn new(cfg: ControllerConfig, opts: InProcessOptions) -> io::Result<Self> {
        let irqs = Arc::new(Irqs::default());
        let mut ctrl = Controller::new(cfg, GuestMemory::empty(), irqs.clone())?;
        if opts.workers > 0 {
            ctrl.spawn_workers(opts.workers, opts.poll)?;
        }
        Ok(InProcessTransport {
            ctrl,
            mem: GuestMemory::empty(),
            irqs,
            next_iova: IOVA_BASE,
            dma_bytes: 0,
            opts,
        })
    }

    /// The controller's live counters (trapped doorbell writes, interrupts, commands),
    /// readable while the driver owns the transport.
    pub fn stats_handle(&self) -> Arc<Stats> {
        self.ctrl.stats_handle()
    }
}

impl Transport for InProcessTransport {
    fn read32(&mut self, off: u64) -> io::Result<u32> {
        let mut b = [0u8; 4];
        self.ctrl.mmio_read(off, &mut b);
        Ok(u32::from_le_bytes(b))
    }

    fn read64(&mut self, off: u64) -> io::Result<u64> {
        let mut b = [0u8; 8];
        self.ctrl.mmio_read(off, &mut b);
        Ok(u64::from_le_bytes(b))
    }

    fn write32(&mut self, off: u64, value: u32) -> io::Result<()> {
        self.ctrl.mmio_write(off, &value.to_le_bytes());
        self.ctrl.process();
        Ok(())
    }

    fn write64(&mut self, off: u64, value: u64) -> io::Result<()> {
        self.ctrl.mmio_write(off, &value.to_le_bytes());
        self.ctrl.process();
        Ok(())
    }

    fn doorbell(&mut self, off: u64, value: u32) -> io::Result<()> {
        // A trapped doorbell without the trap: the controller routes it to the worker
        // that owns the queue (a mailbox message) and runs its admin side.
        self.write32(off, value)
    }

    fn dma_alloc(&mut self, len: u64) -> io::Result<DmaRegion> {
        let len = len.max(1).next_multiple_of(CHUNK);
        let iova = self.next_iova;
        // A hole after each region, so an overrun faults instead of landing in the next.
        self.next_iova += len + CHUNK;
        // One mapping, seen by the driver as this region and by the controller as part
        // of its whole address map.
        let map = Arc::new(Mapping::anonymous(len).map_err(io::Error::other)?);
        let region = GuestMemory::empty().with_region(iova, len, map.clone(), 0).map_err(io::Error::other)?;
        self.mem = self.mem.with_region(iova, len, map, 0).map_err(io::Error::other)?;
        self.ctrl.set_memory(self.mem.clone());
        self.dma_bytes += len;
        Ok(DmaRegion { iova, len, mem: region })
    }

    fn enable_interrupts(&mut self, n: u16) -> io::Result<Vec<OwnedFd>> {
        let fds = (0..n).map(|_| new_eventfd()).collect::<io::Result<Vec<_>>>()?;
        let theirs = fds.iter().map(|f| f.try_clone()).collect::<io::Result<Vec<_>>>()?;
        *self.irqs.0.lock().unwrap_or_else(|p| p.into_inner()) = theirs;
        Ok(fds)
    }

    fn reset(&mut self) -> io::Result<()> {
        self.ctrl.device_reset();
        Ok(())
    }

    /// Memory backed by a file descriptor is mapped a second time, shared, into the
    /// controller's address map (both views reach the same pages); anonymous memory
    /// cannot be shared that way.
    fn map_external(&mut self, mem: &GuestMemory, gpa: u64, len: u64) -> io::Result<Option<u64>> {
        let Some(src) = mem.region_sources().find(|r| r.gpa <= gpa && gpa - r.gpa < r.len) else {
            return Ok(None);
        };
        let Some((fd, off)) = src.fd else { return Ok(None) };
        let off = off + (gpa - src.gpa);
        if len == 0 || len > src.len - (gpa - src.gpa) || !off.is_multiple_of(4096) {
            return Ok(None);
        }
        let map = Arc::new(Mapping::from_fd(fd, off, len, true).map_err(io::Error::other)?);
        let iova = self.next_iova;
        self.next_iova += len.next_multiple_of(CHUNK) + CHUNK;
        self.mem = self.mem.with_region(iova, len, map, 0).map_err(io::Error::other)?;
        self.ctrl.set_memory(self.mem.clone());
        Ok(Some(iova))
    }

    fn unmap_external(&mut self, iova: u64, len: u64) -> io::Result<()> {
        let mem = self.mem.without_region(iova, len).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("no external mapping at {iova:#x}+{len:#x}"))
        })?;
        self.mem = mem;
        self.ctrl.set_memory(self.mem.clone());
        Ok(())
    }

    fn describe(&self) -> String {
        format!(
            "in-process controller ({} worker(s), polling {:?}, {} MiB DMA)",
            self.opts.workers,
            self.opts.poll,
            self.dma_bytes >> 20
        )
    }
}
