//! Kernel VFIO transport: an NVMe PCI function bound to `vfio-pci`, driven from this
//! process through `/dev/vfio`.
//!
//! [`KernelVfioTransport::open`] finds the device's IOMMU group in sysfs, opens the
//! container (`/dev/vfio/vfio`) and the group (`/dev/vfio/N`), attaches the group with
//! the type1v2 IOMMU (or the no-IOMMU "IOMMU" for a `/dev/vfio/noiommu-N` group), gets
//! the device fd, checks that it is an NVM Express function, mmaps BAR0 and turns on
//! memory decoding and bus mastering.
//!
//! DMA memory ([`Transport::dma_alloc`]):
//! - **IOMMU mode**: a memfd, mmapped shared, mapped for the device with
//!   `VFIO_IOMMU_MAP_DMA` at an IOVA from a bump allocator that starts at 4 GiB.
//! - **No-IOMMU mode** (`enable_unsafe_noiommu_mode=1`): the device sees physical
//!   addresses, so buffers come from hugetlbfs (a `MFD_HUGETLB` memfd of 2 MiB pages,
//!   which the kernel neither swaps nor migrates) and are translated through
//!   `/proc/self/pagemap`, which shows frame numbers only to CAP_SYS_ADMIN. An
//!   allocation larger than one huge page must land on physically contiguous huge
//!   pages or it fails; reserve pages first (`echo 64 > /proc/sys/vm/nr_hugepages`).
//!
//! External memory ([`Transport::map_external`], zero copy for the `nvme://` backend):
//! in IOMMU mode the region's host address is mapped with `VFIO_IOMMU_MAP_DMA` (the
//! kernel pins it) at an IOVA from the same bump allocator; no-IOMMU mode declines
//! and the caller copies.
//!
//! Interrupts are MSI-X vectors wired to eventfds with `VFIO_DEVICE_SET_IRQS`.
//! Registers are 32-bit volatile accesses to the BAR0 mapping (64-bit registers as two
//! halves, low first, as Linux's `lo_hi_writeq` does); if the kernel refuses to mmap
//! BAR0 (an MSI-X table inside it on kernels without `MSIX_MAPPABLE`), every access
//! falls back to `pread`/`pwrite` on the device fd.
//!
//! The only `unsafe` of the driver lives here and in the modules below: ioctls, mmap of
//! BAR0 and volatile MMIO, memfds for DMA memory.
//!
//! Layout: this file opens the device and implements [`Transport`]; `ioctl` holds the
//! ioctl numbers and the raw ioctl wrappers, `bar` the BAR0 mapping and its doorbells,
//! `dma` DMA memory allocation, `sysfs` finds the IOMMU group and `pagemap`
//! translates addresses in no-IOMMU mode.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use crate::transport::{new_eventfd, DirectDoorbell, DmaRegion, Transport};
use guest_mem::{GuestMemory, Mapping};
use tracing::{debug, info, warn};
use vfio_bindings::bindings::vfio::{
    vfio_device_info, vfio_group_status, vfio_iommu_type1_dma_map, vfio_iommu_type1_dma_unmap, vfio_irq_info,
    VFIO_TYPE1v2_IOMMU, VFIO_API_VERSION, VFIO_DEVICE_FLAGS_PCI, VFIO_DEVICE_FLAGS_RESET,
    VFIO_DMA_MAP_FLAG_READ, VFIO_DMA_MAP_FLAG_WRITE, VFIO_GROUP_FLAGS_VIABLE, VFIO_IRQ_SET_ACTION_TRIGGER,
    VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE, VFIO_NOIOMMU_IOMMU, VFIO_PCI_BAR0_REGION_INDEX,
    VFIO_PCI_CONFIG_REGION_INDEX, VFIO_PCI_MSIX_IRQ_INDEX, VFIO_REGION_INFO_FLAG_MMAP,
};

use self::bar::{Bar0, BarMapping, MappedDoorbell};
use self::dma::{align_up, memfd, DmaMapping, MFD_HUGE_2MB};
use self::ioctl::{
    argsz, ioctl_ptr, ioctl_val, irq_set_buffer, region_info, VFIO_CHECK_EXTENSION, VFIO_DEVICE_GET_INFO,
    VFIO_DEVICE_GET_IRQ_INFO, VFIO_DEVICE_RESET, VFIO_DEVICE_SET_IRQS, VFIO_GET_API_VERSION,
    VFIO_GROUP_GET_DEVICE_FD, VFIO_GROUP_GET_STATUS, VFIO_GROUP_SET_CONTAINER, VFIO_IOMMU_MAP_DMA,
    VFIO_IOMMU_UNMAP_DMA, VFIO_SET_IOMMU,
};
use self::ioctl::{ctx, invalid};
use self::pagemap::translate;

/// The ioctls an open transport still issues (DMA mappings as a client's memory comes
/// and goes, interrupt wiring, reset): what a sandbox around it must allow.
pub const RUNTIME_IOCTLS: [u64; 4] =
    [VFIO_DEVICE_SET_IRQS, VFIO_DEVICE_RESET, VFIO_IOMMU_MAP_DMA, VFIO_IOMMU_UNMAP_DMA];

/// First IOVA handed out in IOMMU mode: above the 32-bit MMIO/MSI windows that some
/// platforms reserve, well inside every IOMMU's address width (39 bits and up).
const IOVA_BASE: u64 = 1 << 32;
/// Page size of DMA mappings in IOMMU mode.
const PAGE: u64 = 4096;
/// Huge page size used for DMA memory in no-IOMMU mode.
const HUGE_PAGE: u64 = 2 << 20;
/// Smallest BAR0 an NVMe controller can have: registers plus the admin doorbells.
const MIN_BAR0: u64 = 0x1008;
/// PCI class code of an NVM Express I/O controller (base 01h, sub 08h, prog-if 02h).
const NVME_CLASS: [u8; 3] = [0x02, 0x08, 0x01];

mod bar;
mod dma;
mod ioctl;
mod pagemap;
mod sysfs;

pub use pagemap::{pagemap_offset, pagemap_phys, PagemapError};
pub use sysfs::{group_id_from_link, locate, normalize_bdf, GroupLocation};

/// Memory from outside the driver mapped with [`Transport::map_external`].
#[derive(Debug)]
struct ExternalMapping {
    iova: u64,
    size: u64,
    /// The snapshot the range belongs to, held so the host mapping the IOMMU was
    /// given stays in place (and its address is not reused) until the unmap.
    _mem: GuestMemory,
}

/// An NVMe function bound to vfio-pci.
#[derive(Debug)]
pub struct KernelVfioTransport {
    bdf: String,
    group_id: u32,
    noiommu: bool,
    device_flags: u32,
    config_offset: u64,
    msix_vectors: u32,
    irqs_enabled: u16,
    next_iova: u64,
    dma: Vec<DmaMapping>,
    external: Vec<ExternalMapping>,
    bar0: Bar0,
    // Closed in this order: device, group, container.
    device: File,
    /// Held open: closing the group detaches it from the container.
    _group: File,
    container: File,
}

fn open_rw(path: &Path, what: &str) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).open(path).map_err(|e| {
        let hint = match e.raw_os_error() {
            Some(libc::EBUSY) => " (already open in another process)",
            Some(libc::EACCES) | Some(libc::EPERM) => " (needs root or ownership of the node)",
            _ => "",
        };
        ctx(e, format!("{what} {}{hint}", path.display()))
    })
}

impl KernelVfioTransport {
    /// Opens the NVMe function at PCI address `bdf` (e.g. `0000:01:00.0`), which must
    /// be bound to vfio-pci, with every other device of its IOMMU group bound to
    /// vfio-pci or to no driver.
    pub fn open(bdf: &str) -> io::Result<Self> {
        Self::open_at(Path::new("/sys"), Path::new("/dev/vfio"), bdf)
    }

    fn open_at(sys: &Path, dev: &Path, bdf: &str) -> io::Result<Self> {
        let bdf = normalize_bdf(bdf)?;
        let loc = locate(sys, dev, &bdf)?;
        let container = open_rw(&dev.join("vfio"), "VFIO container")?;
        let api = ioctl_val(&container, VFIO_GET_API_VERSION, 0, "VFIO_GET_API_VERSION")?;
        if api != VFIO_API_VERSION as i32 {
            return Err(io::Error::other(format!("VFIO API version {api}, expected {VFIO_API_VERSION}")));
        }
        let (iommu, iommu_name) = if loc.noiommu {
            (VFIO_NOIOMMU_IOMMU, "no-IOMMU (unsafe mode)")
        } else {
            (VFIO_TYPE1v2_IOMMU, "type1v2 IOMMU")
        };
        if ioctl_val(&container, VFIO_CHECK_EXTENSION, iommu as libc::c_ulong, "VFIO_CHECK_EXTENSION")? <= 0 {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("the VFIO container does not support the {iommu_name}"),
            ));
        }
        let group = open_rw(&loc.path, "VFIO group")?;
        let mut status = vfio_group_status { argsz: argsz::<vfio_group_status>(), flags: 0 };
        // SAFETY: `status` is a live vfio_group_status of the size argsz names.
        unsafe { ioctl_ptr(&group, VFIO_GROUP_GET_STATUS, &mut status, "VFIO_GROUP_GET_STATUS")? };
        if status.flags & VFIO_GROUP_FLAGS_VIABLE == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "VFIO group {} is not viable: every device in {}/kernel/iommu_groups/{}/devices must be \
                     bound to vfio-pci or to no driver",
                    loc.id,
                    sys.display(),
                    loc.id
                ),
            ));
        }
        let mut cfd: RawFd = container.as_raw_fd();
        // The request reads one int (the container fd) from `cfd`, which lives across
        // the call.
        // SAFETY: the kernel reads one live int.
        unsafe { ioctl_ptr(&group, VFIO_GROUP_SET_CONTAINER, &mut cfd, "VFIO_GROUP_SET_CONTAINER")? };
        ioctl_val(&container, VFIO_SET_IOMMU, iommu as libc::c_ulong, "VFIO_SET_IOMMU")?;
        let name = CString::new(bdf.clone()).map_err(|_| invalid("PCI address contains NUL"))?;
        // The request reads the NUL-terminated device name, which `name` owns for the
        // duration of the call; it returns a new fd on success.
        // SAFETY: the kernel reads a live C string.
        let dfd = unsafe {
            ioctl_ptr(&group, VFIO_GROUP_GET_DEVICE_FD, name.as_ptr().cast_mut(), "VFIO_GROUP_GET_DEVICE_FD")?
        };
        // SAFETY: the kernel just installed `dfd` for us; nothing else owns it.
        let device = unsafe { File::from_raw_fd(dfd) };

        let mut dinfo = vfio_device_info { argsz: argsz::<vfio_device_info>(), ..Default::default() };
        // SAFETY: `dinfo` is a live vfio_device_info of the size argsz names.
        unsafe { ioctl_ptr(&device, VFIO_DEVICE_GET_INFO, &mut dinfo, "VFIO_DEVICE_GET_INFO")? };
        if dinfo.flags & VFIO_DEVICE_FLAGS_PCI == 0
            || dinfo.num_regions <= VFIO_PCI_CONFIG_REGION_INDEX
            || dinfo.num_irqs <= VFIO_PCI_MSIX_IRQ_INDEX
        {
            return Err(invalid(format!(
                "{bdf} is not a VFIO PCI device (flags {:#x}, {} regions, {} IRQ indices)",
                dinfo.flags, dinfo.num_regions, dinfo.num_irqs
            )));
        }
        let cfg = region_info(&device, VFIO_PCI_CONFIG_REGION_INDEX)?;
        let mut class = [0u8; 3];
        device.read_exact_at(&mut class, cfg.offset + 9).map_err(|e| ctx(e, "reading the class code"))?;
        if class != NVME_CLASS {
            return Err(invalid(format!(
                "{bdf} is not an NVM Express controller (class {:02x}-{:02x}-{:02x})",
                class[2], class[1], class[0]
            )));
        }
        let b0 = region_info(&device, VFIO_PCI_BAR0_REGION_INDEX)?;
        if b0.size < MIN_BAR0 {
            return Err(invalid(format!("{bdf}: BAR0 of {} bytes is too small for NVMe registers", b0.size)));
        }
        let bar0 = if b0.flags & VFIO_REGION_INFO_FLAG_MMAP != 0 {
            match BarMapping::map(&device, b0.offset, b0.size) {
                Ok(m) => Bar0::Mapped(Arc::new(m)),
                Err(e) => {
                    warn!("{bdf}: {e}; registers and doorbells go through pread/pwrite");
                    Bar0::Trapped { offset: b0.offset, size: b0.size }
                }
            }
        } else {
            Bar0::Trapped { offset: b0.offset, size: b0.size }
        };
        let mut irq = vfio_irq_info {
            argsz: argsz::<vfio_irq_info>(),
            index: VFIO_PCI_MSIX_IRQ_INDEX,
            ..Default::default()
        };
        // SAFETY: `irq` is a live vfio_irq_info of the size argsz names.
        unsafe { ioctl_ptr(&device, VFIO_DEVICE_GET_IRQ_INFO, &mut irq, "VFIO_DEVICE_GET_IRQ_INFO")? };

        let mut t = KernelVfioTransport {
            bdf,
            group_id: loc.id,
            noiommu: loc.noiommu,
            device_flags: dinfo.flags,
            config_offset: cfg.offset,
            msix_vectors: irq.count,
            irqs_enabled: 0,
            next_iova: IOVA_BASE,
            dma: Vec::new(),
            external: Vec::new(),
            bar0,
            device,
            _group: group,
            container,
        };
        t.enable_bus_master()?;
        info!("{}", t.describe());
        Ok(t)
    }

    /// PCI Command: memory decoding and bus mastering on, INTx off
    /// ([`crate::transport::pci_command`]).
    fn enable_bus_master(&mut self) -> io::Result<()> {
        use crate::transport::pci_command;
        let mut cmd = [0u8; 2];
        self.device
            .read_exact_at(&mut cmd, self.config_offset + pci_command::OFFSET)
            .map_err(|e| ctx(e, "reading PCI Command"))?;
        let v = u16::from_le_bytes(cmd) | pci_command::DRIVER;
        self.device
            .write_all_at(&v.to_le_bytes(), self.config_offset + pci_command::OFFSET)
            .map_err(|e| ctx(e, "enabling bus mastering"))
    }

    fn set_irqs(&mut self, flags: u32, fds: &[RawFd]) -> io::Result<()> {
        let mut buf = irq_set_buffer(flags, VFIO_PCI_MSIX_IRQ_INDEX, 0, fds);
        // `buf` holds the header and exactly `fds.len()` ints, which is what its argsz
        // and count say; the kernel only reads it.
        // SAFETY: the kernel reads exactly the buffer argsz describes.
        unsafe { ioctl_ptr(&self.device, VFIO_DEVICE_SET_IRQS, buf.as_mut_ptr(), "VFIO_DEVICE_SET_IRQS")? };
        Ok(())
    }

    fn disable_interrupts(&mut self) -> io::Result<()> {
        if self.irqs_enabled > 0 {
            self.set_irqs(VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER, &[])?;
            self.irqs_enabled = 0;
        }
        Ok(())
    }

    fn bar_offset(&self, off: u64, size: u64) -> io::Result<u64> {
        match off.checked_add(4) {
            Some(end) if end <= size && off.is_multiple_of(4) => Ok(off),
            _ => Err(invalid(format!("BAR0 offset {off:#x} is unaligned or beyond {size:#x}"))),
        }
    }
}

/// DMA memory (`dma.rs` has the pieces).
impl KernelVfioTransport {
    pub(super) fn dma_alloc_iommu(&mut self, len: u64) -> io::Result<DmaRegion> {
        let size = align_up(len, PAGE).ok_or_else(|| invalid("DMA length overflows"))?;
        let fd = memfd(c"vnvme-vfio-dma", 0, size)?;
        let map = Arc::new(Mapping::from_fd(fd.as_fd(), 0, size, true)?);
        // Large buffers start on a 2 MiB boundary so the IOMMU can use large pages.
        let align = if size >= HUGE_PAGE { HUGE_PAGE } else { PAGE };
        let iova = align_up(self.next_iova, align)
            .filter(|i| i.checked_add(size).is_some())
            .ok_or_else(|| io::Error::other("IOVA space exhausted"))?;
        let (vaddr, _) = map.as_raw();
        let mut m = vfio_iommu_type1_dma_map {
            argsz: argsz::<vfio_iommu_type1_dma_map>(),
            flags: VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE,
            vaddr: vaddr as u64,
            iova,
            size,
        };
        // `m` is a live vfio_iommu_type1_dma_map of the size argsz names; the range it
        // names is our own mapping, kept alive by `self.dma` until unmapped.
        // SAFETY: a live argument, and a range that stays mapped until unmapped here.
        unsafe { ioctl_ptr(&self.container, VFIO_IOMMU_MAP_DMA, &mut m, "VFIO_IOMMU_MAP_DMA") }.map_err(
            |e| {
                if e.raw_os_error() == Some(libc::ENOMEM) {
                    ctx(e, "pinning DMA memory (raise the locked-memory limit, ulimit -l)")
                } else {
                    e
                }
            },
        )?;
        self.next_iova = iova + size;
        self.dma.push(DmaMapping { iova, size, _map: map.clone(), in_iommu: true });
        let mem = GuestMemory::empty().with_region(iova, size, map, 0)?;
        debug!(iova = format_args!("{iova:#x}"), size, "DMA memory mapped through the IOMMU");
        Ok(DmaRegion { iova, len: size, mem })
    }

    pub(super) fn iommu_unmap(&self, iova: u64, size: u64) -> io::Result<()> {
        let mut u = vfio_iommu_type1_dma_unmap {
            argsz: argsz::<vfio_iommu_type1_dma_unmap>(),
            iova,
            size,
            ..Default::default()
        };
        // `u` is a live vfio_iommu_type1_dma_unmap of the size argsz names (no dirty
        // bitmap requested, so no trailing data).
        // SAFETY: a live argument of exactly the size argsz names.
        unsafe { ioctl_ptr(&self.container, VFIO_IOMMU_UNMAP_DMA, &mut u, "VFIO_IOMMU_UNMAP_DMA") }?;
        Ok(())
    }

    pub(super) fn dma_alloc_noiommu(&mut self, len: u64) -> io::Result<DmaRegion> {
        let size = align_up(len, HUGE_PAGE).ok_or_else(|| invalid("DMA length overflows"))?;
        let fd = memfd(c"vnvme-vfio-dma", libc::MFD_HUGETLB | MFD_HUGE_2MB, size).map_err(|e| {
            ctx(
                e,
                "no-IOMMU DMA memory comes from 2 MiB huge pages: reserve some (/proc/sys/vm/nr_hugepages)",
            )
        })?;
        // A shared hugetlb mapping reserves its pages here, so a shortage fails now
        // rather than as SIGBUS on first touch.
        let map = Arc::new(Mapping::from_fd(fd.as_fd(), 0, size, true)?);
        let scratch = GuestMemory::empty().with_region(0, size, map.clone(), 0)?;
        scratch.fill(0, size, 0)?; // fault every huge page in
        let pagemap = File::open("/proc/self/pagemap").map_err(|e| ctx(e, "/proc/self/pagemap"))?;
        let (base, _) = map.as_raw();
        let phys0 = translate(&pagemap, base as u64)?;
        for i in 1..size / HUGE_PAGE {
            let p = translate(&pagemap, base as u64 + i * HUGE_PAGE)?;
            if p != phys0 + i * HUGE_PAGE {
                return Err(io::Error::other(format!(
                    "no-IOMMU mode: the {size}-byte DMA buffer is not physically contiguous; \
                     allocate at most {HUGE_PAGE} bytes at a time"
                )));
            }
        }
        self.dma.push(DmaMapping { iova: phys0, size, _map: map.clone(), in_iommu: false });
        let mem = GuestMemory::empty().with_region(phys0, size, map, 0)?;
        debug!(phys = format_args!("{phys0:#x}"), size, "no-IOMMU DMA memory");
        Ok(DmaRegion { iova: phys0, len: size, mem })
    }
}

impl Transport for KernelVfioTransport {
    fn read32(&mut self, off: u64) -> io::Result<u32> {
        match &self.bar0 {
            Bar0::Mapped(m) => m.read32(off),
            Bar0::Trapped { offset, size } => {
                let off = self.bar_offset(off, *size)?;
                let mut b = [0u8; 4];
                self.device.read_exact_at(&mut b, offset + off).map_err(|e| ctx(e, "BAR0 read"))?;
                Ok(u32::from_le_bytes(b))
            }
        }
    }

    fn read64(&mut self, off: u64) -> io::Result<u64> {
        let lo = self.read32(off)? as u64;
        let hi = self.read32(off.checked_add(4).ok_or_else(|| invalid("BAR0 offset overflows"))?)? as u64;
        Ok(lo | (hi << 32))
    }

    fn write32(&mut self, off: u64, value: u32) -> io::Result<()> {
        match &self.bar0 {
            Bar0::Mapped(m) => m.write32(off, value),
            Bar0::Trapped { offset, size } => {
                let off = self.bar_offset(off, *size)?;
                self.device.write_all_at(&value.to_le_bytes(), offset + off).map_err(|e| ctx(e, "BAR0 write"))
            }
        }
    }

    fn write64(&mut self, off: u64, value: u64) -> io::Result<()> {
        self.write32(off, value as u32)?;
        self.write32(
            off.checked_add(4).ok_or_else(|| invalid("BAR0 offset overflows"))?,
            (value >> 32) as u32,
        )
    }

    fn doorbell(&mut self, off: u64, value: u32) -> io::Result<()> {
        self.write32(off, value)
    }

    fn direct_doorbell(&mut self, off: u64) -> io::Result<Option<Box<dyn DirectDoorbell>>> {
        match &self.bar0 {
            Bar0::Mapped(m) => {
                m.reg(off)?;
                Ok(Some(Box::new(MappedDoorbell { bar: m.clone(), off })))
            }
            Bar0::Trapped { .. } => Ok(None),
        }
    }

    fn dma_alloc(&mut self, len: u64) -> io::Result<DmaRegion> {
        if len == 0 {
            return Err(invalid("DMA allocation of 0 bytes"));
        }
        if self.noiommu {
            self.dma_alloc_noiommu(len)
        } else {
            self.dma_alloc_iommu(len)
        }
    }

    fn enable_interrupts(&mut self, n: u16) -> io::Result<Vec<OwnedFd>> {
        if u32::from(n) > self.msix_vectors {
            return Err(invalid(format!(
                "{} has {} MSI-X vectors, {n} requested",
                self.bdf, self.msix_vectors
            )));
        }
        // Re-enabling with another vector count needs MSI-X off first.
        self.disable_interrupts()?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let fds = (0..n).map(|_| new_eventfd()).collect::<io::Result<Vec<_>>>()?;
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        self.set_irqs(VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER, &raw)?;
        self.irqs_enabled = n;
        Ok(fds)
    }

    fn reset(&mut self) -> io::Result<()> {
        if self.device_flags & VFIO_DEVICE_FLAGS_RESET == 0 {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{} offers no function-level reset through VFIO", self.bdf),
            ));
        }
        ioctl_val(&self.device, VFIO_DEVICE_RESET, 0, "VFIO_DEVICE_RESET")?;
        // vfio-pci restores the saved config space after the reset; make sure the
        // device may still master the bus.
        self.enable_bus_master()
    }

    /// IOMMU mode: VFIO_IOMMU_MAP_DMA of the range's host address, at an IOVA from
    /// the same bump allocator as DMA memory (so the two never overlap, and both stay
    /// within the IOMMU's address width). The kernel pins the pages. No-IOMMU mode
    /// cannot do this (the device would need physical addresses of memory that is
    /// neither pinned nor contiguous): `None`, and the caller copies.
    fn map_external(&mut self, mem: &GuestMemory, gpa: u64, len: u64) -> io::Result<Option<u64>> {
        if self.noiommu || len == 0 || !gpa.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) {
            return Ok(None);
        }
        // Only this region is kept alive while the IOMMU maps it: the whole snapshot
        // would also hold regions the guest unmaps later, whose memory must go when
        // they do. A range that is not within one region is not shared.
        let Some(region) = mem.only_region_at(gpa).filter(|r| r.check_range(gpa, len).is_ok()) else {
            return Ok(None);
        };
        let mut host = Vec::new();
        region.host_ranges(gpa, len, &mut host)?;
        let [range] = host[..] else { return Ok(None) };
        let vaddr = range.ptr as u64;
        if !vaddr.is_multiple_of(PAGE) {
            return Ok(None);
        }
        let align = if len >= HUGE_PAGE { HUGE_PAGE } else { PAGE };
        let iova = align_up(self.next_iova, align)
            .filter(|i| i.checked_add(len).is_some())
            .ok_or_else(|| io::Error::other("IOVA space exhausted"))?;
        let mut m = vfio_iommu_type1_dma_map {
            argsz: argsz::<vfio_iommu_type1_dma_map>(),
            flags: VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE,
            vaddr,
            iova,
            size: len,
        };
        // `m` is a live vfio_iommu_type1_dma_map of the size argsz names. The range it
        // names is a mapping of guest memory that `region` keeps alive; it is stored
        // below and held until the IOMMU mapping is removed.
        // SAFETY: a live argument, and guest memory kept mapped while the IOMMU maps it.
        unsafe { ioctl_ptr(&self.container, VFIO_IOMMU_MAP_DMA, &mut m, "VFIO_IOMMU_MAP_DMA") }?;
        self.next_iova = iova + len;
        self.external.push(ExternalMapping { iova, size: len, _mem: region });
        debug!(
            gpa = format_args!("{gpa:#x}"),
            iova = format_args!("{iova:#x}"),
            len,
            "external memory mapped"
        );
        Ok(Some(iova))
    }

    fn unmap_external(&mut self, iova: u64, len: u64) -> io::Result<()> {
        let i = self.external.iter().position(|e| e.iova == iova && e.size == len).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("no external mapping at {iova:#x}+{len:#x}"))
        })?;
        self.iommu_unmap(iova, len)?;
        self.external.remove(i);
        Ok(())
    }

    fn describe(&self) -> String {
        let (access, size) = match &self.bar0 {
            Bar0::Mapped(m) => ("mmapped", m.len as u64),
            Bar0::Trapped { size, .. } => ("via pread/pwrite", *size),
        };
        format!(
            "kernel VFIO {} (group {}, {}): BAR0 {size:#x} bytes {access}, {} MSI-X vectors",
            self.bdf,
            self.group_id,
            if self.noiommu { "no-IOMMU" } else { "type1v2 IOMMU" },
            self.msix_vectors
        )
    }
}

impl Drop for KernelVfioTransport {
    fn drop(&mut self) {
        if let Err(e) = self.disable_interrupts() {
            warn!("{}: disabling MSI-X: {e}", self.bdf);
        }
        let ranges: Vec<(u64, u64)> = (self.dma.iter().filter(|d| d.in_iommu).map(|d| (d.iova, d.size)))
            .chain(self.external.iter().map(|e| (e.iova, e.size)))
            .collect();
        for (iova, size) in ranges {
            if let Err(e) = self.iommu_unmap(iova, size) {
                warn!("{}: {e}", self.bdf);
            }
        }
        self.dma.clear();
        self.external.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::sysfs::fake::FakeSys;
    use super::*;

    #[test]
    fn opening_a_missing_device_says_which_one() {
        let e = KernelVfioTransport::open("0000:ff:1f.7").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        assert!(e.to_string().contains("0000:ff:1f.7"), "{e}");
        let e = KernelVfioTransport::open("not-a-bdf").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        // A fully set-up fake group whose container node is a plain file: the first
        // ioctl fails, and the error names it.
        let f = FakeSys::new("ioctl");
        f.device("0000:01:00.0", Some("vfio-pci"), Some(9));
        f.node("9");
        f.node("vfio");
        let e = KernelVfioTransport::open_at(&f.sys(), &f.dev(), "01:00.0").unwrap_err();
        assert!(e.to_string().contains("VFIO_GET_API_VERSION"), "{e}");
    }
}
