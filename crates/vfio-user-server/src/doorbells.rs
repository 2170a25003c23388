//! How doorbell writes reach the controller.
//!
//! - `Trapped`: every doorbell is a REGION_WRITE message (posted by QEMU, so the vCPU
//!   does not wait for us). With shadow doorbells the guest only writes when EventIdx
//!   asks, so most never happen.
//! - `EventFd`: DEVICE_GET_REGION_IO_FDS hands out one eventfd for every I/O queue
//!   doorbell, so a client with KVM can turn those writes into ioeventfd signals (no
//!   exit to the VMM). The value written is lost, so this needs a guest that uses
//!   shadow doorbells; the eventfd wakes the workers, which read the shadow values.
//!   QEMU 11.1 never asks for IO FDs; our userspace driver does.
//! - `Mapped`: the doorbell page of BAR0 (0x1000..0x2000) is a shared memfd page the
//!   client maps straight into the guest (sparse mmap): doorbell stores cost the guest
//!   nothing and produce no notification, so the workers poll the page (and the
//!   admin queue is polled every millisecond). Trapped writes to that page (QEMU traps
//!   it while an INTx is pending) are stored into the same page.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use guest_mem::{GuestMemory, Mapping};

/// Doorbell delivery mode (`vnvme serve --doorbells`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DoorbellMode {
    #[default]
    Trapped,
    EventFd,
    Mapped,
}

impl std::str::FromStr for DoorbellMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "trapped" => Ok(DoorbellMode::Trapped),
            "eventfd" => Ok(DoorbellMode::EventFd),
            "mapped" => Ok(DoorbellMode::Mapped),
            _ => Err(format!("unknown doorbell mode {s:?} (expected trapped, eventfd or mapped)")),
        }
    }
}

impl DoorbellMode {
    /// The name `vnvme serve --doorbells` takes.
    pub fn name(self) -> &'static str {
        match self {
            DoorbellMode::Trapped => "trapped",
            DoorbellMode::EventFd => "eventfd",
            DoorbellMode::Mapped => "mapped",
        }
    }
}

/// The first doorbell and the size of the mapped doorbell area.
pub const DOORBELL_PAGE: u64 = 0x1000;
pub const DOORBELL_PAGE_LEN: u64 = 0x1000;

/// The memfd behind BAR0's doorbell page in `Mapped` mode.
#[derive(Debug)]
pub struct DoorbellPage {
    fd: OwnedFd,
    /// Our view of it, addressed by BAR0 offset.
    pub mem: GuestMemory,
}

impl DoorbellPage {
    /// A memfd covering BAR0 offsets `0..bar0_len` (only the doorbell page is shared).
    pub fn new(bar0_len: u64) -> std::io::Result<Self> {
        use rustix::fs::{fcntl_add_seals, MemfdFlags, SealFlags};
        let fd =
            rustix::fs::memfd_create(c"vnvme-doorbells", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        let file = std::fs::File::from(fd.try_clone()?);
        file.set_len(bar0_len)?;
        // The client maps this page too: it must not be able to shrink it under our
        // mapping (SIGBUS) or grow it.
        fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        let map = Mapping::from_fd(fd.as_fd(), 0, bar0_len, true).map_err(std::io::Error::from)?;
        let mem =
            GuestMemory::empty().with_region(0, bar0_len, Arc::new(map), 0).map_err(std::io::Error::from)?;
        Ok(DoorbellPage { fd, mem })
    }

    /// The page of an earlier process (a hand-over): `fd` must be a memfd of at least
    /// `bar0_len` bytes sealed against shrinking.
    pub fn from_fd(fd: OwnedFd, bar0_len: u64) -> std::io::Result<Self> {
        let seals = rustix::fs::fcntl_get_seals(&fd)?;
        if !seals.contains(rustix::fs::SealFlags::SHRINK)
            || std::fs::File::from(fd.try_clone()?).metadata()?.len() < bar0_len
        {
            return Err(std::io::Error::other(
                "the doorbell page handed over is not the sealed memfd it must be",
            ));
        }
        let map = Mapping::from_fd(fd.as_fd(), 0, bar0_len, true).map_err(std::io::Error::from)?;
        let mem =
            GuestMemory::empty().with_region(0, bar0_len, Arc::new(map), 0).map_err(std::io::Error::from)?;
        Ok(DoorbellPage { fd, mem })
    }

    /// A descriptor to hand to the client with the region info.
    pub fn fd(&self) -> std::io::Result<OwnedFd> {
        self.fd.try_clone()
    }
}
