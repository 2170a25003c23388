//! The io_uring backend's sizes and bounds.

use std::time::Duration;

/// The most vectors one readv/writev takes (Linux UIO_MAXIOV).
pub(super) const IOV_MAX: usize = 1024;
/// Alignment of every buffer this backend allocates (bounce, zeroes, scratch).
pub(super) const BUF_ALIGN: usize = 4096;
/// Size of the shared zero buffer that emulated Write Zeroes writes from.
pub(super) const ZERO_CHUNK: usize = 256 << 10;
/// Size of the per-queue scratch buffer that SGL bit buckets read into.
pub(super) const TRASH_CHUNK: usize = 64 << 10;
/// Bounce buffers kept per queue, and the largest one kept.
pub(super) const BOUNCE_POOL_MAX: usize = 16;
pub(super) const BOUNCE_KEEP_MAX: usize = 4 << 20;
/// How often reap checks whether the backing file was unlinked.
pub(super) const REMOVAL_CHECK_PERIOD: Duration = Duration::from_secs(1);
/// Retries of a request the kernel answered with EAGAIN or EINTR.
pub(super) const MAX_RETRIES: u8 = 16;
/// The largest ring the kernel accepts without clamping.
pub(super) const MAX_QUEUE_DEPTH: u32 = 32768;
/// Fixed-file slots: the main descriptor and the buffered one (the main one again
/// when the main one is buffered already).
pub(super) const FD_MAIN: u32 = 0;
pub(super) const FD_BUFFERED: u32 = 1;
