//! Serves an emulated NVMe controller to a VMM over vfio-user: QEMU's
//! `-device vfio-user-pci` and Cloud Hypervisor's `--user-device`.
//!
//! - `pci`: the PCI function's config space (class 01-08-02, PM, MSI-X, PCIe).
//! - `device`: answers protocol messages: regions, DMA maps, interrupts, reset.
//! - `dma`: the client's shared memory as a guest memory map.
//! - `fds`: what a client's file descriptor is, checked before use.
//! - `irq`: interrupts out through eventfds (KVM irqfds under QEMU).
//! - `jobs`: work other threads (a control socket) hand the server thread.
//! - `handover`: the device handed to another process (an upgrade).
//! - `keeper`: the device outliving its process (a crash): a keeper and a journal.
//! - `migration`: vfio-user live migration (v2) of the device.
//! - `transfer`: what the device holds between messages of either.
//! - `server`: the socket loop.
#![forbid(unsafe_code)]

pub mod device;
pub mod dma;
pub mod doorbells;
pub mod fds;
pub mod handover;
pub mod irq;
pub mod jobs;
pub mod keeper;
pub mod migration;
pub mod pci;
pub mod server;
pub mod socket_file;
mod transfer;

pub use device::{Device, DeviceOptions};
pub use doorbells::DoorbellMode;
pub use irq::EventFdInterrupts;
/// The start of a message a client had begun to send, as it moves with an upgrade.
pub use vfio_user::socket::Partial;
