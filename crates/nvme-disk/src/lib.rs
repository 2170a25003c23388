//! The nvme:// block backend: a namespace of another NVMe controller, reached through
//! the userspace driver.
//!
//! [`NvmeBackend`] serves that namespace as a [`block_backend::Backend`]. Over
//! vfio-user it is one vnvme in front of another (or of any vfio-user NVMe server);
//! over kernel VFIO it is a real NVMe device bound to `vfio-pci`. The driver
//! (`nvme-driver`) knows nothing of block backends; this crate is the adapter between
//! the two, as OpenVMM keeps `disk_nvme` apart from its NVMe driver.
//!
//! # URI
//!
//! ```text
//! nvme:///abs/path/vnvme.sock[?OPTS]     a vfio-user socket (absolute path)
//! nvme://./relative.sock[?OPTS]          a vfio-user socket, relative to the cwd
//! nvme://0000:01:00.0[?OPTS]             a PCI function bound to vfio-pci
//!
//! OPTS, joined with '&':
//!   ns=N           namespace ID downstream                    (default 1)
//!   queues=N       I/O queue pairs to create downstream       (default 4)
//!   depth=N        entries per downstream queue, 2..=4096     (default 128)
//!   doorbells=M    vfio-user doorbells: trapped, sync, eventfd, mapped (default:
//!                  eventfd when the server offers it, else trapped)
//!   poll=0|1       1: completions are polled, no interrupts   (default 0)
//!   timeout=SECS   bound on bring-up waits and socket I/O     (default 30)
//! ```
//!
//! # Queue ownership
//!
//! [`NvmeBackend::open`] brings the downstream controller up and creates every I/O
//! queue pair at once (`queues=`). Each [`Backend::open_queue`] takes one pair out of
//! the backend for the caller's thread, which then drives it without locks; dropping
//! the queue waits (bounded) for its downstream commands and gives the pair back. A
//! vnvme front controller opens one queue per I/O worker per namespace plus one for
//! its admin side (flush at shutdown, Format), so `queues=` must be at least
//! workers + 1; asking for more than exist is an error that says so.
//!
//! # Splitting and statuses
//!
//! Byte offsets and lengths must be multiples of the downstream LBA size (reported as
//! [`BackendInfo::block_size`]); anything else completes with an `InvalidInput` I/O
//! error. Reads and writes longer than the downstream MDTS (or 65536 blocks, or a
//! quarter of the queue's DMA pool) go down as several commands; Write Zeroes and
//! deallocation are split at their own limits (WZSL, DMRSL, the NLB field). The
//! front request completes when its last piece does, with the first error seen:
//! a downstream status becomes [`BackendError::Nvme`] with its type, code and DNR bit
//! passed through; a transport failure, a vanished device or Controller Fatal Status
//! becomes [`BackendError::NotReady`] for every request in flight and every later one.
//! When the downstream queue is full, pieces wait in a per-queue backlog (in order)
//! and go down as completions free slots.
//!
//! # Zero copy
//!
//! A front request's data pages live in the front's guest memory. When a request
//! arrives with a [`GuestMemory`] snapshot whose map this backend has not seen
//! ([`GuestMemory::same_map`] against the last one), every region of it is offered to
//! the transport ([`DeviceHandle::map_external`]): vfio-user DMA-maps the
//! region's own file descriptor (QEMU gives the front memfd RAM, so the downstream
//! server maps the very same pages), kernel VFIO maps the host address through the
//! IOMMU. The table of mapped regions is shared by all queues of the backend (a
//! mutex, taken only when the map changes); each queue keeps the view it last used.
//! A region stays mapped while any view holds it — the current one, a queue's cached
//! one, or an in-flight command's — and is unmapped when the last goes, so a region
//! that left the guest's map is never unmapped under a command still using it.
//!
//! Downstream PRPs then point straight into guest memory (PRP lists live in the
//! queue's DMA pool). A piece falls back to a bounce buffer in the driver's DMA
//! memory, copied with [`GuestMemory::read`]/[`GuestMemory::write`], when it cannot
//! be described that way: a region that could not be shared (anonymous memory over
//! vfio-user, no-IOMMU VFIO), segments that break the PRP rules (every segment but
//! the first must start on a page boundary and every one but the last must end on
//! one; the first must be dword aligned), SGL bit-bucket segments, and host buffers
//! ([`DataBuf::Host`]). [`NvmeBackend::stats`] counts bytes moved each way.
//!
//! # IOVA layout
//!
//! The transport owns the device's address space. vfio-user: DMA memory (queues,
//! pools) from 4 GiB, external guest RAM from 1 TiB (`EXTERNAL_IOVA_BASE`), each
//! mapping 2 MiB aligned and followed by a 2 MiB hole; IOVAs are never reused. Kernel
//! VFIO: one bump allocator from 4 GiB for both, so everything stays inside the
//! IOMMU's address width.
//!
//! # Completion notification
//!
//! With interrupts (the default), [`BackendQueue::notifier`] is an epoll descriptor
//! that contains the downstream CQ's MSI-X eventfd while requests are in flight (and
//! nothing while the queue is idle, so a late interrupt cannot keep an idle owner
//! awake); `reap` resets the eventfd, then drains the CQ. With `poll=1` there is no
//! notifier and the owner polls `reap`. A watcher thread per backend notices a
//! vfio-user server that goes away (socket hang-up) at once, and polls CSTS once a
//! second while requests are in flight (Controller Fatal Status, a device that reads
//! all ones); either way every busy queue is woken and fails its requests with
//! `NotReady` rather than hanging.
//!
//! # Modules
//!
//! ```text
//! uri        the nvme:// grammar and options (parsing only)
//! open       transport, controller bring-up, capability probing (LBA, MDTS, WZSL, DMRSL)
//! backend    state shared by the queues; queue pairs handed out and given back
//! queue      one queue pair per owner thread: requests in flight, failure, drop
//!   submit   checks, splitting into downstream commands, the backlog, doorbells
//!   complete the notifier, reaping the downstream CQ, finishing pieces
//! map        zero copy: guest memory regions DMA-mapped into the downstream device
//! bounce     the copy path through the driver's DMA memory
//! health     a dead downstream (hang-up, CFS, all ones) fails everything, wakes owners
//! stats      counters
//! error      OpenError, and request errors mapped in one place
//! ```
//!
//! [`Backend::open_queue`]: block_backend::Backend::open_queue
//! [`BackendError::NotReady`]: block_backend::BackendError::NotReady
//! [`BackendError::Nvme`]: block_backend::BackendError::Nvme
//! [`BackendInfo::block_size`]: block_backend::BackendInfo::block_size
//! [`BackendQueue::notifier`]: block_backend::BackendQueue::notifier
//! [`DataBuf::Host`]: block_backend::DataBuf::Host
//! [`DeviceHandle::map_external`]: nvme_driver::DeviceHandle::map_external
//! [`GuestMemory`]: guest_mem::GuestMemory
//! [`GuestMemory::read`]: guest_mem::GuestMemory::read
//! [`GuestMemory::same_map`]: guest_mem::GuestMemory::same_map
//! [`GuestMemory::write`]: guest_mem::GuestMemory::write
#![forbid(unsafe_code)]

mod backend;
mod bounce;
mod error;
mod health;
mod map;
mod open;
mod queue;
mod shared;
mod stats;
mod uri;

use std::sync::{Mutex, MutexGuard};

pub use backend::NvmeBackend;
pub use error::OpenError;
pub use stats::{NvmeBackendStats, NvmeStatsHandle};
pub use uri::{NvmeBackendOptions, NvmeTarget, UriError, URI_SYNTAX};

/// Locks `m`, even if a thread that panicked holding it poisoned it: one owner's
/// panic must not take the backend's other queues (or its teardown) down with it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
