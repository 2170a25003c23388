//! What an nvme:// backend and all its queues share: the downstream namespace and
//! its sizes, the queue pairs not in use, the device and its health, the guest
//! memory mapped for it, the counters.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use block_backend::BackendInfo;
use nvme_driver::{DeviceHandle, IoQueue, NvmeDriver};
use tracing::debug;

use crate::health::{Health, Watcher};
use crate::lock;
use crate::map::GuestMaps;
use crate::stats::Counters;
use crate::uri::NvmeTarget;

/// The downstream I/O queue pairs: how many there are, and those no backend queue
/// has now (taken by `open_queue`, given back when its queue is dropped).
#[derive(Debug)]
pub(crate) struct Pairs {
    total: usize,
    free: Mutex<Vec<IoQueue>>,
}

impl Pairs {
    pub(crate) fn new(queues: Vec<IoQueue>) -> Self {
        Pairs { total: queues.len(), free: Mutex::new(queues) }
    }

    pub(crate) fn total(&self) -> usize {
        self.total
    }

    /// A pair no queue has, if one is left.
    pub(crate) fn take(&self) -> Option<IoQueue> {
        lock(&self.free).pop()
    }

    /// A pair back from a queue.
    pub(crate) fn give_back(&self, q: IoQueue) {
        lock(&self.free).push(q);
    }
}

/// How the backend's queues run their pairs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QueueOptions {
    /// Poll the completion queues (no interrupts).
    pub(crate) poll: bool,
    /// Bound on waiting for a dropped queue's commands.
    pub(crate) timeout: Duration,
}

/// The downstream namespace's block size and what one command may carry.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sizes {
    /// Bytes per logical block.
    pub(crate) lba: u64,
    /// Most bytes per downstream Read or Write.
    pub(crate) max_rw: u64,
    /// Most blocks per Write Zeroes / per deallocated range.
    pub(crate) max_wz: u64,
    pub(crate) max_dsm: u64,
}

/// What a backend and all its queues share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) target: NvmeTarget,
    pub(crate) nsid: u32,
    pub(crate) sizes: Sizes,
    pub(crate) info: BackendInfo,
    pub(crate) pairs: Pairs,
    pub(crate) device: DeviceHandle,
    pub(crate) maps: GuestMaps,
    pub(crate) stats: Arc<Counters>,
    pub(crate) health: Arc<Health>,
    pub(crate) queues: QueueOptions,
    pub(crate) watcher: Mutex<Option<Watcher>>,
    pub(crate) driver: Mutex<Option<NvmeDriver>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        drop(lock(&self.watcher).take());
        self.maps.forget();
        if let Some(d) = lock(&self.driver).take() {
            if self.health.dead().is_none() {
                if let Err(e) = d.shutdown() {
                    debug!("{}: shutdown: {e}", self.target);
                }
            }
        }
    }
}
