//! A userspace NVMe driver over a [`Transport`]: a vfio-user client
//! ([`vfio_user::VfioUserTransport`]) or kernel VFIO ([`vfio`]). The in-process
//! transport (a controller in the same process) lives in the `test-kit` crate, so the
//! driver does not depend on the emulator.
//!
//! [`NvmeDriver::new`] brings a controller up the way Linux does and creates I/O
//! queue pairs; each [`IoQueue`] can be moved to the thread that drives it and offers
//! an asynchronous API ([`IoQueue::submit`], [`IoQueue::poll_completions`],
//! [`IoQueue::wait_completions`]) and blocking helpers ([`IoQueue::read`],
//! [`IoQueue::write`], ...). Shadow doorbells with EventIdx are used when the
//! controller offers Doorbell Buffer Config ([`doorbell`] holds the protocol).
//!
//! The driver knows nothing of block backends: the `nvme://` namespace kind, which
//! serves a namespace of the controller it drives as a `block_backend::Backend` (zero
//! copy where the transport can share the front's guest memory,
//! [`Transport::map_external`]), is the `nvme-disk` crate.
//!
//! Host access to DMA memory goes through `guest_mem::GuestMemory` over the same
//! mappings the device reaches, so driver code needs no `unsafe`; only a transport
//! that must call into the kernel directly (kernel VFIO) may.
#![deny(unsafe_code)]

pub mod command;
pub mod dirty;
pub mod dma;
pub mod doorbell;
pub mod driver;
pub mod error;
pub mod identify;
pub mod prp;
pub mod queue;
pub mod transport;
pub mod vfio;
pub mod vfio_user;

pub use command::{Completion, IoCommand, LbaRange};
pub use dma::{DmaBuf, DmaPool};
pub use driver::{CompletionMode, DeviceHandle, DriverOptions, NvmeDriver};
pub use error::DriverError;
pub use identify::{ControllerInfo, NamespaceInfo, NsGeometry};
pub use queue::{IoQueue, QueueStats};
pub use transport::{new_eventfd, DirectDoorbell, DmaRegion, Migrated, Transport};
pub use vfio_user::{DoorbellMode, VfioUserOptions, VfioUserTransport};
