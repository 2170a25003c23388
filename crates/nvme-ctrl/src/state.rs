//! Saving a controller's state and restoring it into another controller (a new
//! process after an upgrade, or the destination of a migration).
//!
//! `Controller::quiesce` stops fetching commands on every engine and waits,
//! bounded, until every fetched command has completed (commands QoS held back are
//! let through). The host may keep writing doorbells and shadow slots meanwhile: new
//! tails are recorded, nothing is fetched. `Controller::save_state` then copies out
//! everything the guest can observe as plain data ([`ControllerState`]), and
//! `Controller::restore_state` puts it into a controller built over the same
//! configuration and namespaces, which carries on where the first one stopped. If
//! the hand-over fails, `Controller::resume` lets the first controller go on.
//!
//! The format is JSON through serde, described in docs/UPGRADE.md. Its `version`
//! changes whenever a field changes meaning or a field a restore needs is added; a
//! controller restores only the versions it knows ([`STATE_VERSION`]) and refuses
//! others, saying which. Fields added with a default that keeps the old meaning do
//! not change the version.
//!
//! Each part saves itself into its own record and checks a saved one (the
//! registers, the queues, the shadow buffers, the admin side, the events, the
//! counters); a restore checks every part before it changes any
//! (`controller/handover.rs`). This module is the envelope that carries them.
//!
//! Not part of the state: commands in flight (there are none after a quiesce),
//! coalesced interrupts not yet signalled (a quiesce signals them), and QoS limits
//! (the transport keeps and re-applies those). Every counter is: the controller's,
//! each namespace's (latency histograms and time held by QoS included) and each
//! queue's.

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::admin::{AdminSaved, FeatureValues as FeaturesSaved};
pub use crate::doorbell::ShadowState;
pub use crate::events::EventsSaved;
pub use crate::queue::{CqState, SqState};
pub use crate::registers::Registers;
pub use crate::stats::StatsSaved;
use crate::stats::{NsStatsSnapshot, QueueSnapshot};

/// The version of [`ControllerState`] this build writes and reads.
pub const STATE_VERSION: u32 = 1;

/// Everything a controller's guest can observe, as plain data.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ControllerState {
    pub version: u32,
    /// The controller's clock when saved (ns): the restoring side's clock continues
    /// from here, so times kept relative to it (timestamp, power-on hours, coalescing)
    /// carry over.
    pub clock_ns: u64,
    pub regs: Registers,
    pub sqs: Vec<SqState>,
    pub cqs: Vec<CqState>,
    /// The Doorbell Buffer Config in force.
    pub shadow: Option<ShadowState>,
    /// What the controller told its host it can do: a controller restoring this
    /// must have been created with the same (`ControllerConfig::capabilities`).
    #[serde(default)]
    pub capabilities: Option<crate::Capabilities>,
    /// The SQ the controller's own engine arbitrates next (round robin), so a
    /// restored controller without workers fetches in the same order.
    #[serde(default)]
    pub next_sq: Option<u16>,
    /// Interrupt vectors whose coalescing the host disabled (Interrupt Vector
    /// Configuration).
    pub coalescing_disabled: Vec<u16>,
    pub admin: AdminSaved,
    pub events: EventsSaved,
    /// The controller's counters (SMART data units, commands, media errors...).
    pub stats: StatsSaved,
    /// Each namespace's counters (commands, bytes, errors and latency by kind, time
    /// held by QoS), by NSID, so an upgrade or a migration carries them as it does
    /// the controller's (empty in a state from a build that did not).
    #[serde(default)]
    pub namespace_stats: Vec<(u32, NsStatsSnapshot)>,
    /// Each queue's counters (commands, doorbells, completions, interrupts).
    #[serde(default)]
    pub queue_stats: Vec<QueueSnapshot>,
    /// Active namespaces: the restoring side must have the same ones (NSID, size),
    /// and takes their current LBA format from here (a Format NVM may have changed it).
    pub namespaces: Vec<NamespaceSaved>,
    /// Flexible Data Placement's reclaim units, statistics and events (None: FDP
    /// is off); the restoring side must offer FDP alike.
    #[serde(default)]
    pub fdp: Option<crate::fdp::FdpSaved>,
    /// The ANA groups' states on this controller (all optimized in a state from a
    /// build without ANA).
    #[serde(default)]
    pub ana: crate::ana::AnaSaved,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceSaved {
    pub nsid: u32,
    pub size: u64,
    pub lba_format: u8,
    /// A zoned namespace's zones, each its state (the Zone Descriptor's ZS value)
    /// and bytes written; the restoring side's namespace must be zoned alike.
    #[serde(default)]
    pub zones: Option<Vec<(u8, u64)>>,
    /// A zoned namespace's zone size and capacity (bytes).
    #[serde(default)]
    pub zone_layout: Option<(u64, u64)>,
    /// Its protection settings (Identify DPS; 0: none).
    #[serde(default)]
    pub dps: u8,
    /// Metadata inline after each block's data (FLBAS bit 4).
    #[serde(default)]
    pub extended: bool,
}

/// Why a quiesce or a restore failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("commands still in flight after {0:?} (a backend that does not answer?)")]
    Busy(Duration),
    #[error("an erasing Format NVM is in progress")]
    FormatInProgress,
    #[error("state version {0} is not one this build restores (it restores version {STATE_VERSION})")]
    Version(u32),
    #[error("the state does not fit this controller: {0}")]
    Mismatch(String),
}
