//! Work other threads hand to the server thread, which owns the [`Device`]: a
//! control socket adding a namespace, changing QoS, reading controller state. The
//! server loop runs queued jobs between messages (and between clients), so a job
//! never races a message, and needs no lock on the device.
//!
//! A job is a closure; its caller waits for the answer on a channel, bounded (the
//! server thread may be busy, e.g. waiting out a DMA_UNMAP), and reports a timeout
//! instead of waiting forever. The queue is bounded too: past [`MAX_QUEUED`] jobs a
//! submission is refused at once.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::device::Device;

type Job = Box<dyn FnOnce(&mut Device) + Send>;

/// Most jobs waiting at once.
pub const MAX_QUEUED: usize = 64;

/// Why a job did not run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JobError {
    #[error("the device thread has {MAX_QUEUED} requests waiting already")]
    Full,
    #[error("the device thread did not take the request within {0:?} (busy with its client)")]
    Timeout(Duration),
    #[error("the device thread is gone")]
    Gone,
}

/// The queue of jobs for one server thread.
pub struct DeviceJobs {
    queue: Mutex<VecDeque<Job>>,
    wake: EventFd,
}

impl std::fmt::Debug for DeviceJobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.queue.lock().map_or(0, |q| q.len());
        f.debug_struct("DeviceJobs").field("queued", &n).finish()
    }
}

impl DeviceJobs {
    pub fn new() -> std::io::Result<Arc<Self>> {
        Ok(Arc::new(DeviceJobs { queue: Mutex::new(VecDeque::new()), wake: EventFd::new(EFD_NONBLOCK)? }))
    }

    /// Runs `f` on the server thread and returns its result, waiting at most
    /// `limit` for it.
    pub fn run<T: Send + 'static>(
        &self,
        limit: Duration,
        f: impl FnOnce(&mut Device) -> T + Send + 'static,
    ) -> Result<T, JobError> {
        let (tx, rx) = mpsc::sync_channel(1);
        {
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            if q.len() >= MAX_QUEUED {
                return Err(JobError::Full);
            }
            q.push_back(Box::new(move |d: &mut Device| {
                let _ = tx.send(f(d));
            }));
        }
        let _ = self.wake.write(1);
        match rx.recv_timeout(limit) {
            Ok(v) => Ok(v),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(JobError::Timeout(limit)),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(JobError::Gone),
        }
    }

    /// Readable while jobs wait (level: drained by [`DeviceJobs::run_pending`]).
    pub fn fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    /// Runs every waiting job on `device` (the server thread calls this). Returns
    /// how many ran.
    pub fn run_pending(&self, device: &mut Device) -> usize {
        let _ = self.wake.read();
        let mut n = 0;
        loop {
            // One at a time, the lock not held while a job runs.
            let job = self.queue.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
            let Some(job) = job else { return n };
            job(device);
            n += 1;
        }
    }
}
