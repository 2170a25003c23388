//! Counters: what the backend did, by request and by downstream command, and how the
//! data moved (zero copy or bounced). Relaxed atomics shared by every queue; read as
//! a [`NvmeBackendStats`] snapshot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) requests: AtomicU64,
    pub(crate) commands: AtomicU64,
    pub(crate) split_requests: AtomicU64,
    pub(crate) zero_copy_bytes: AtomicU64,
    pub(crate) zero_copy_commands: AtomicU64,
    pub(crate) bounce_bytes: AtomicU64,
    pub(crate) bounce_commands: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) not_ready: AtomicU64,
    pub(crate) regions_mapped: AtomicU64,
    pub(crate) regions_unmapped: AtomicU64,
    pub(crate) map_failures: AtomicU64,
    pub(crate) backlogged: AtomicU64,
}

pub(crate) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// A snapshot of an [`crate::NvmeBackend`]'s counters (all queues together).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvmeBackendStats {
    /// Requests submitted by the front.
    pub requests: u64,
    /// Commands sent downstream.
    pub commands: u64,
    /// Requests that went down as more than one command.
    pub split_requests: u64,
    /// Read/write bytes whose downstream PRPs pointed straight at the front's memory.
    pub zero_copy_bytes: u64,
    pub zero_copy_commands: u64,
    /// Read/write bytes copied through a bounce buffer in the driver's DMA memory.
    pub bounce_bytes: u64,
    pub bounce_commands: u64,
    /// Downstream commands that completed with an error status.
    pub errors: u64,
    /// Requests failed with `NotReady` (downstream gone or fatal).
    pub not_ready: u64,
    /// Guest memory regions mapped into / unmapped from the downstream device.
    pub regions_mapped: u64,
    pub regions_unmapped: u64,
    /// Regions the transport failed to map (they are bounced instead).
    pub map_failures: u64,
    /// Requests that had to wait for a free downstream slot or DMA buffer.
    pub backlogged: u64,
}

/// A cloneable handle on a backend's counters, readable while the backend is owned
/// elsewhere (behind `Arc<dyn block_backend::Backend>`).
#[derive(Clone, Debug)]
pub struct NvmeStatsHandle(pub(crate) Arc<Counters>);

impl NvmeStatsHandle {
    pub fn snapshot(&self) -> NvmeBackendStats {
        let c = &self.0;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        NvmeBackendStats {
            requests: g(&c.requests),
            commands: g(&c.commands),
            split_requests: g(&c.split_requests),
            zero_copy_bytes: g(&c.zero_copy_bytes),
            zero_copy_commands: g(&c.zero_copy_commands),
            bounce_bytes: g(&c.bounce_bytes),
            bounce_commands: g(&c.bounce_commands),
            errors: g(&c.errors),
            not_ready: g(&c.not_ready),
            regions_mapped: g(&c.regions_mapped),
            regions_unmapped: g(&c.regions_unmapped),
            map_failures: g(&c.map_failures),
            backlogged: g(&c.backlogged),
        }
    }
}

impl NvmeBackendStats {
    /// The one-line summary `Backend::stats_line` reports.
    pub(crate) fn line(&self) -> String {
        let s = self;
        format!(
            "{} requests as {} downstream commands ({} split); zero copy {} bytes in {} commands, \
             bounced {} bytes in {} commands; {} regions mapped, {} map failures; {} errors, {} not ready",
            s.requests,
            s.commands,
            s.split_requests,
            s.zero_copy_bytes,
            s.zero_copy_commands,
            s.bounce_bytes,
            s.bounce_commands,
            s.regions_mapped,
            s.map_failures,
            s.errors,
            s.not_ready
        )
    }
}
