//! The test kit: what tests, the fuzzer and the benchmarks share.
//!
//! - [`MockHost`] drives an [`nvme_ctrl::Controller`] the way Linux's nvme driver
//!   (drivers/nvme/host/pci.c) does, over mock guest memory in this process. It
//!   initialises the controller (disable, program the admin queue, enable, wait for
//!   RDY), identifies it, sets the number of queues, creates I/O queue pairs, sends
//!   Doorbell Buffer Config *after* the queues exist, and then runs I/O. With shadow
//!   doorbells it writes each new tail or head into the shadow buffer and writes the
//!   doorbell register only when the EventIdx rule says so; without, every update is
//!   a register write. The device side runs when the host waits
//!   ([`MockHost::process`]), as an I/O thread would.
//!
//!   One core ([`ring`]: one submit path, one reap path, the doorbell rule) under
//!   three facades: [`admin`] (send an admin command, get its completion; every one
//!   runs the device), [`io`] (queue pairs and queues created one at a time) and
//!   [`raw`] (admin commands with every field given, for the error paths).
//! - [`InProcessTransport`]: the userspace driver's transport to a controller in
//!   this process (the driver-against-controller test tier, `vnvme perf --in-process`).
//! - Shared test utilities: one data [`pattern`], one seeded [`Rng`],
//!   [`memfd`](mod@memfd) helpers (shared-memory files sealed against shrinking), and
//!   real NBD servers ([`nbd`]: qemu-nbd, nbdkit), and a [`watchdog`] that ends a
//!   call that would otherwise hang a test run forever.
#![forbid(unsafe_code)]

pub mod admin;
pub mod ceph;
mod host;
pub mod in_process;
pub mod io;
mod irq;
pub mod memfd;
pub mod nbd;
pub mod raw;
pub mod recording;
pub mod ring;
mod rng;
mod skip;
mod watchdog;

pub use host::{Allocator, HostDbbuf, HostError, HostQueue, InitOptions, MockHost, PAGE};
pub use in_process::{InProcessOptions, InProcessTransport};
pub use io::HostSq;
pub use irq::{CountingIrq, ManualClock, SteppingClock};
pub use ring::{CqRing, SqRing};
pub use rng::{pattern, Rng};
pub use skip::skip;
pub use watchdog::{bounded, watchdog, watchdog_for, Watchdog, WATCHDOG_LIMIT};
