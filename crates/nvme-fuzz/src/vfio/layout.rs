//! What the vfio-user fuzzer's pieces share: its bounds, where the bring-up puts
//! things in guest memory, and the descriptor pool's sizes.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// Longest one message may take in `Device::handle`: anything that blocks on a
/// client's descriptor (a full pipe, a full blocking eventfd) would take forever.
pub(super) const MESSAGE_LIMIT: Duration = Duration::from_secs(3);
/// How long a socket session may go on once the client has hung up.
pub(super) const SESSION_LIMIT: Duration = Duration::from_secs(10);
/// Most messages a run sends (bring-up sequences count as one).
pub(super) const MAX_MESSAGES: usize = 48;

/// Where the bring-up maps its guest memory, and how much.
pub(super) const GUEST_IOVA: u64 = 0x4000_0000;
pub(super) const GUEST_LEN: u64 = 256 << 10;
pub(super) const ADMIN_SQ: u64 = 0x0000;
pub(super) const ADMIN_CQ: u64 = 0x1000;
pub(super) const IO_SQ: u64 = 0x2000;
pub(super) const IO_CQ: u64 = 0x3000;
pub(super) const DATA: u64 = 0x4000;
pub(super) const DATA_PAGES: u64 = 16;
pub(super) const IDENTIFY: u64 = 0x14000;
pub(super) const SHADOW: u64 = 0x15000;
pub(super) const EVENTIDX: u64 = 0x16000;
pub(super) const ADMIN_ENTRIES: u16 = 16;
pub(super) const IO_ENTRIES: u16 = 64;
/// Size of the small memfds and the regular file in the pool.
pub(super) const SMALL_FILE: u64 = 64 << 10;
/// Size of the sparse memfd in the pool (1 TiB, none of it written).
pub(super) const SPARSE_LEN: u64 = 1 << 40;
pub(super) const PAGE: u64 = 4096;

pub(super) static CHECK_FD_LEAKS: AtomicBool = AtomicBool::new(false);
