//! An emulated NVMe controller that knows no transport.
//!
//! A transport (the vfio-user server, the in-process test host) feeds it BAR0 register
//! accesses and guest memory, and gives it somewhere to send interrupts; the
//! controller does the rest: the CC/CSTS state machine, admin and I/O queues, shadow
//! doorbells with EventIdx, and the NVM command set over pluggable block backends.
//!
//! Module map:
//! - `controller`: BAR0 register file and lifecycle (enable, reset, shutdown, fatal).
//!   `impl Controller` continues in `admin/*` (one file per command group), `routing`
//!   (which engine owns a queue) and `runtime` (starting workers, inline mode).
//! - `engine`: queues and the data path, owned by one thread.
//! - `doorbell`: shadow doorbells and EventIdx — every memory-ordering rule.
//! - `queue`: SQ fetch and CQ post (phase tag last).
//! - `dptr`: PRP and SGL walks.
//! - `admin`, `io`: one file per command group.
//! - `error`: internal errors and their mapping to NVMe status, in one place.
//! - `attach`: namespaces added, removed and resized under a running host.
//! - `qos`: IOPS and bandwidth limits per namespace or group (`engine::throttle`
//!   holds back what they do not let through yet).
//! - `runtime`: worker threads and the idle loop they share with inline mode.
#![forbid(unsafe_code)]

mod admin;
mod attach;
mod backends;
mod config;
mod controller;
mod doorbell;
mod dptr;
mod engine;
mod error;
mod events;
#[cfg(test)]
mod interleave;
mod interrupt;
mod io;
mod namespace;
pub mod qos;
mod queue;
mod registers;
mod routing;
pub mod runtime;
pub mod state;
mod stats;

pub use attach::NamespaceError;
pub use config::{Capabilities, ControllerConfig, NamespaceConfig, DEFAULT_COMMAND_TIMEOUT, MAX_NAMESPACES};
pub use controller::{Controller, Lifecycle};
pub use engine::TEARDOWN_BOUND;
pub use interrupt::{Clock, InterruptSink, MonotonicClock};
pub use namespace::Namespace;
pub use runtime::judge::{Regime, SpinJudge, Verdict};
pub use runtime::poll::{PollMode, SpinPolicy, SpinStats};
pub use runtime::workers::{Worker, WorkerStats};
pub use runtime::WorkerConfig;
pub use state::{ControllerState, StateError, STATE_VERSION};
pub use stats::{
    NsStats, NsStatsSnapshot, OpClass, OpSnapshot, QueueSnapshot, QueueStats, Stats, StatsSnapshot,
    LATENCY_BOUNDS_NS, LATENCY_BUCKETS,
};
