//! An emulated NVMe controller that knows no transport.
//!
//! A transport (the vfio-user server, the in-process test host) feeds it BAR0 register
//! accesses and guest memory, and gives it somewhere to send interrupts; the
//! controller does the rest: the CC/CSTS state machine, admin and I/O queues, shadow
//! doorbells with EventIdx, and the NVM command set over pluggable block backends.
//!
//! Module map:
//! - `controller`: BAR0 registers and the lifecycle (enable, reset, shutdown, fatal),
//!   the one place `impl Controller` lives: `controller/attach` (namespaces under a
//!   running host), `controller/handover` (quiesce, save, restore), `controller/workers`
//!   (starting workers, inline mode). It lends admin commands the parts they need
//!   (`admin::Admin`).
//! - `registers`, `lifecycle`: the register file, and where the controller is in its life.
//! - `engine`: queues and the data path, owned by one thread.
//! - `doorbell`: shadow doorbells and EventIdx — every memory-ordering rule.
//! - `queue`: SQ fetch and CQ post (phase tag last).
//! - `dptr`: PRP and SGL walks.
//! - `admin`, `io`: one file per command group.
//! - `error`: internal errors and their mapping to NVMe status, in one place.
//! - `fdp`: Flexible Data Placement: reclaim unit handles, their statistics and events.
//! - `lba_format`: the LBA formats, the one a namespace is in, and what fits (a
//!   format's protection settings, its blocks on a backend).
//! - `metadata`: where a namespace's blocks' metadata (and protection information) lives.
//! - `qos`: IOPS and bandwidth limits per namespace or group (`engine::throttle`
//!   holds back what they do not let through yet).
//! - `runtime`: worker threads, the idle loop they share with inline mode, and
//!   `runtime::routing`: which engine owns a queue.
//! - `state`: the saved state's envelope; each part saves and checks its own record
//!   (`saved` holds what they share).
#![forbid(unsafe_code)]

mod admin;
pub mod ana;
mod backends;
mod commands;
mod config;
mod controller;
mod copy_pi;
mod doorbell;
mod dptr;
mod engine;
mod error;
mod events;
pub mod fdp;
#[cfg(test)]
mod interleave;
mod interrupt;
mod io;
mod lba_format;
mod lifecycle;
pub mod metadata;
mod namespace;
pub mod pool;
pub mod qos;
mod queue;
mod registers;
pub mod reservation;
pub mod runtime;
mod saved;
mod shared_file;
pub mod state;
mod stats;
pub mod zoned;

pub use admin::admin_opcodes;
pub use config::{
    Capabilities, ControllerConfig, FdpConfig, MetaFile, MetadataConfig, NamespaceConfig, SubsystemConfig,
    DEFAULT_COMMAND_TIMEOUT, MAX_CNTLID, MAX_NAMESPACES, MAX_RUHS, RETRY_DELAYS,
};
pub use controller::{AdminQueues, Controller, NamespaceError};
pub use engine::TEARDOWN_BOUND;
pub use interrupt::{Clock, InterruptSink, MonotonicClock};
pub use io::io_opcodes;
pub use lifecycle::Lifecycle;
pub use namespace::{format_index, FormatState, LbaFormatDef, Namespace, NsIds, LBA_FORMATS};
pub use runtime::judge::{Regime, SpinJudge, Verdict};
pub use runtime::poll::{PollMode, SpinPolicy, SpinStats};
pub use runtime::workers::{Worker, WorkerStats};
pub use runtime::WorkerConfig;
pub use state::{ControllerState, StateError, STATE_VERSION};
pub use stats::{
    Counter, NsStats, NsStatsSnapshot, OpClass, OpSnapshot, QueueSnapshot, QueueStats, Shown, Stats,
    StatsSnapshot, LATENCY_BOUNDS_NS, LATENCY_BUCKETS,
};
