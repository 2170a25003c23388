//! Who runs the queues, and how an idle owner waits.
//!
//! - [`workers`]: I/O worker threads, each owning an engine and its queues.
//! - [`idle`]: the one idle loop (busy, spin, re-arm EventIdx, look again, sleep) that
//!   workers and inline mode (the transport's own thread) both drive.
//! - [`poll`]: the spin policy that decides how long an idle owner spins.

pub mod idle;
pub mod poll;
pub mod workers;
