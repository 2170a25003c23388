//! The backend: the state its queues share, the queue pairs it hands out (one per
//! [`Backend::open_queue`], given back when the queue is dropped), and what it tells
//! the front about itself. Bring-up is in `open`.

use std::io;
use std::sync::Arc;

use block_backend::{Backend, BackendInfo, BackendQueue};

use crate::queue::NvmeQueue;
use crate::shared::Shared;
use crate::stats::{NvmeBackendStats, NvmeStatsHandle};

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
        self.shared.sizes.max_rw
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
        let mut q = s.pairs.take().ok_or_else(|| {
            io::Error::other(format!(
                "{}: all {} downstream I/O queue pair(s) are in use; raise queues= in the nvme:// URI \
                 (a vnvme front opens one per I/O worker plus one for its admin side: workers + 1)",
                s.target,
                s.pairs.total()
            ))
        })?;
        if let Err(e) = q.set_deferred_doorbell(true) {
            s.pairs.give_back(q);
            return Err(io::Error::other(e));
        }
        Ok(Box::new(NvmeQueue::new(q, s.clone())?))
    }
}
