//! The test kit: the mock host the controller's tests, the fuzzer and the benchmarks
//! drive it with.
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
//! - Test doubles around the controller: interrupt sinks and clocks ([`CountingIrq`],
//!   [`ManualClock`], [`SteppingClock`]), a backend that records what reached it
//!   ([`recording`]), guest memory over sealed memfds ([`memfd_memory`]).
//!
//! What tests share below the controller lives in `test-util` (the seeded generator,
//! the data pattern, memfds, skips, the watchdog); the real NBD and Ceph servers in
//! `test-servers`; the in-process transport `vnvme perf --in-process` uses is product
//! code, in `nvme-inproc`.
#![forbid(unsafe_code)]

pub mod admin;
pub mod bar;
mod host;
pub mod io;
mod irq;
mod memfd;
pub mod raw;
pub mod recording;
pub mod ring;

pub use bar::Bar0;
pub use host::{Allocator, HostDbbuf, HostError, HostQueue, InitOptions, MockHost, PAGE};
pub use io::HostSq;
pub use irq::{CountingIrq, ManualClock, SteppingClock};
pub use memfd::memfd_memory;
pub use ring::{CqRing, Doorbells, SqRing};
