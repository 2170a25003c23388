//! The backend: the state its queues share, the queue pairs it hands out (one per
//! [`Backend::open_queue`], given back when the queue is dropped), and what it tells
//! the front about itself. Bring-up is in `open`.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use block_backend::{Backend, BackendInfo, BackendQueue};
use nvme_driver::{DeviceHandle, IoQueue, NvmeDriver};
use tracing::debug;

use crate::health::{Health, Watcher};
use crate::lock;
use crate::map::GuestMaps;
use crate::queue::NvmeQueue;
use crate::stats::{Counters, NvmeBackendStats, NvmeStatsHandle};
use crate::uri::NvmeTarget;

/// What a backend and all its queues share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) target: NvmeTarget,
    pub(crate) nsid: u32,
    pub(crate) lba: u64,
    pub(crate) info: BackendInfo,
    /// Most bytes per downstream Read or Write.
    pub(crate) max_rw: u64,
    /// Most blocks per Write Zeroes / per deallocated range.
    pub(crate) max_wz: u64,
    pub(crate) max_dsm: u64,
    pub(crate) total_queues: usize,
    pub(crate) free: Mutex<Vec<IoQueue>>,
    pub(crate) device: DeviceHandle,
    pub(crate) maps: GuestMaps,
    pub(crate) stats: Arc<Counters>,
    pub(crate) health: Arc<Health>,
    pub(crate) poll: bool,
    /// Bound on waiting for a dropped queue's commands.
    pub(crate) timeout: Duration,
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

/// A namespace of another NVMe controller as a block backend (crate documentation).
#[derive(Debug)]
pub struct NvmeBackend {
    pub(crate) shared: Arc<Shared>,
}

impl NvmeBackend {
    /// The backend's counters now.
    pub fn stats(&self) -> NvmeBackendStats {
        self.stats_handle().snapshot()
    }

    /// A handle on the counters that outlives borrowing the backend.
    pub fn stats_handle(&self) -> NvmeStatsHandle {
        NvmeStatsHandle(self.shared.stats.clone())
    }

    /// Most bytes one downstream Read or Write carries (longer requests are split).
    pub fn max_transfer(&self) -> u64 {
        self.shared.max_rw
    }

    /// Why the downstream controller is unusable, once it is.
    pub fn dead(&self) -> Option<String> {
        self.shared.health.dead().map(str::to_string)
    }

    /// The transport's one-line description.
    pub fn describe(&self) -> String {
        self.shared.device.describe()
    }
}

impl Backend for NvmeBackend {
    fn info(&self) -> BackendInfo {
        self.shared.info.clone()
    }

    fn stats_line(&self) -> Option<String> {
        Some(self.stats().line())
    }

    fn open_queue(&self) -> io::Result<Box<dyn BackendQueue>> {
        let s = &self.shared;
        let mut q = lock(&s.free).pop().ok_or_else(|| {
            io::Error::other(format!(
                "{}: all {} downstream I/O queue pair(s) are in use; raise queues= in the nvme:// URI \
                 (a vnvme front opens one per I/O worker plus one for its admin side: workers + 1)",
                s.target, s.total_queues
            ))
        })?;
        if let Err(e) = q.set_deferred_doorbell(true) {
            lock(&s.free).push(q);
            return Err(io::Error::other(e));
        }
        Ok(Box::new(NvmeQueue::new(q, s.clone())?))
    }
}
