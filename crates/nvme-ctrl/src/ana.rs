//! Asymmetric Namespace Access (Base §8.1.1) on this controller: the state in
//! which it reaches each ANA group of namespaces, set by the operator (a path
//! taken out of service before it goes, or brought back), reported to the host
//! in the ANA log page and through ANA Change notices, and enforced on every
//! command that accesses a namespace: one of a group that is inaccessible, lost
//! or changing completes with the path error the spec names, and the host's
//! multipath sends it down another controller of the subsystem.
//!
//! Reported only by a controller of a multi-controller subsystem (`--cntlid`):
//! alone, a controller has no other path to offer. Each namespace belongs to one
//! group for as long as it is attached (ANACAP bit 6); a controller's process
//! holds its own groups' states, since each controller is its own process.

use std::sync::atomic::{AtomicU16, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use nvme_spec::ana::{AnaGroupDescriptor, AnaLogHeader, AnaState};
use nvme_spec::Status;
use serde::{Deserialize, Serialize};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::IntoBytes;

/// ANA groups a controller has (ANAGRPMAX and NANAGRPID): IDs 1 to this.
pub const MAX_GROUPS: u32 = 32;

/// ANA Transition Time (ANATT), seconds: how long a group may stay in the
/// change state before a host gives up on it (Linux resets the controller
/// after twice this).
pub const TRANSITION_SECONDS: u8 = 10;

/// The group a namespace is in unless its configuration names another.
pub const DEFAULT_GROUP: u32 = 1;

/// One ANA group's state on this controller, shared by its namespaces.
#[derive(Debug)]
pub struct AnaGroup {
    id: u32,
    state: AtomicU8,
    /// The status a command to one of its namespaces completes with, packed (0:
    /// the command is processed): the one word a command reads.
    refusal: AtomicU16,
    /// This group's descriptor's Change Count.
    change_count: AtomicU64,
}

impl AnaGroup {
    fn new(id: u32) -> Self {
        AnaGroup {
            id,
            state: AtomicU8::new(AnaState::Optimized as u8),
            refusal: AtomicU16::new(0),
            change_count: AtomicU64::new(0),
        }
    }

    /// A group of its own, optimized, for a namespace made outside a controller.
    pub(crate) fn standalone() -> Arc<Self> {
        Arc::new(AnaGroup::new(DEFAULT_GROUP))
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn state(&self) -> AnaState {
        AnaState::from_u8(self.state.load(Ordering::Acquire)).unwrap_or(AnaState::Optimized)
    }

    /// What a command that accesses one of its namespaces completes with instead
    /// of being processed (None: it is processed).
    #[inline]
    pub fn refusal(&self) -> Option<Status> {
        match self.refusal.load(Ordering::Acquire) {
            0 => None,
            raw => Some(Status::from_raw(raw)),
        }
    }

    /// Moves to `to`; false if it was there already.
    fn set(&self, to: AnaState) -> bool {
        if self.state.swap(to as u8, Ordering::AcqRel) == to as u8 {
            return false;
        }
        self.refusal.store(to.refusal().map_or(0, Status::raw), Ordering::Release);
        self.change_count.fetch_add(1, Ordering::AcqRel);
        true
    }
}

/// The controller's ANA groups.
#[derive(Debug)]
pub struct Ana {
    groups: Box<[Arc<AnaGroup>]>,
    /// The log page's Change Count.
    change_count: AtomicU64,
}

impl Default for Ana {
    fn default() -> Self {
        Ana {
            groups: (1..=MAX_GROUPS).map(|id| Arc::new(AnaGroup::new(id))).collect(),
            change_count: AtomicU64::new(0),
        }
    }
}

/// Why an ANA state could not be set.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AnaError {
    #[error("ANA group {0} is outside 1..={MAX_GROUPS}")]
    NoGroup(u32),
}

impl Ana {
    /// Group `id` (1 to [`MAX_GROUPS`]).
    pub fn group(&self, id: u32) -> Result<&Arc<AnaGroup>, AnaError> {
        self.groups.get((id as usize).wrapping_sub(1)).ok_or(AnaError::NoGroup(id))
    }

    pub fn groups(&self) -> impl Iterator<Item = &Arc<AnaGroup>> {
        self.groups.iter()
    }

    /// Puts group `id` (None: every group) in state `to`. Returns the groups
    /// that changed; the log's Change Count moves if any did.
    pub fn set(&self, id: Option<u32>, to: AnaState) -> Result<Vec<u32>, AnaError> {
        let targets: Vec<&Arc<AnaGroup>> = match id {
            Some(id) => vec![self.group(id)?],
            None => self.groups.iter().collect(),
        };
        let changed: Vec<u32> = targets.into_iter().filter(|g| g.set(to)).map(|g| g.id).collect();
        if !changed.is_empty() {
            self.change_count.fetch_add(1, Ordering::AcqRel);
        }
        Ok(changed)
    }

    /// The ANA log page (Base §5.1.12.1.13) of the active namespaces `members`
    /// (NSID, group; in NSID order): a descriptor for each group that has one, in
    /// group order, each with its namespaces' NSIDs (none with Return Groups Only).
    pub fn log_page(&self, members: impl Iterator<Item = (u32, u32)>, groups_only: bool) -> Vec<u8> {
        let mut by_group: Vec<Vec<u32>> = vec![Vec::new(); self.groups.len()];
        for (nsid, group) in members {
            if let Some(m) = by_group.get_mut((group as usize).wrapping_sub(1)) {
                m.push(nsid);
            }
        }
        let members = by_group;
        let present = members.iter().filter(|m| !m.is_empty()).count();
        let header = AnaLogHeader {
            change_count: U64::new(self.change_count.load(Ordering::Acquire)),
            ngrps: U16::new(present as u16),
            ..Default::default()
        };
        let mut page = header.as_bytes().to_vec();
        for (g, nsids) in self.groups.iter().zip(&members).filter(|(_, m)| !m.is_empty()) {
            let listed: &[u32] = if groups_only { &[] } else { nsids };
            let d = AnaGroupDescriptor {
                grpid: U32::new(g.id),
                nnsids: U32::new(listed.len() as u32),
                change_count: U64::new(g.change_count.load(Ordering::Acquire)),
                state: g.state() as u8,
                ..Default::default()
            };
            page.extend_from_slice(d.as_bytes());
            for &nsid in listed {
                page.extend_from_slice(&nsid.to_le_bytes());
            }
        }
        page
    }

    /// A namespace joined or left a group: the log's content changed.
    pub(crate) fn membership_changed(&self) {
        self.change_count.fetch_add(1, Ordering::AcqRel);
    }

    /// What a hand-over carries: the groups not optimized, and the log's count.
    pub(crate) fn save(&self) -> AnaSaved {
        AnaSaved {
            change_count: self.change_count.load(Ordering::Acquire),
            groups: self
                .groups
                .iter()
                .filter(|g| g.state() != AnaState::Optimized || g.change_count.load(Ordering::Acquire) != 0)
                .map(|g| (g.id, g.state() as u8, g.change_count.load(Ordering::Acquire)))
                .collect(),
        }
    }

    /// Puts a checked saved state back.
    pub(crate) fn restore(&self, c: AnaChecked) {
        for (id, st, count) in c.groups {
            if let Ok(g) = self.group(id) {
                g.set(st);
                g.change_count.store(count, Ordering::Release);
            }
        }
        self.change_count.store(c.change_count, Ordering::Release);
    }
}

/// A saved ANA part, decoded.
#[derive(Debug)]
pub(crate) struct AnaChecked {
    change_count: u64,
    groups: Vec<(u32, AnaState, u64)>,
}

impl AnaSaved {
    /// Decodes it, refusing groups and states a controller does not have.
    pub(crate) fn check(&self) -> Result<AnaChecked, String> {
        let mut groups = Vec::with_capacity(self.groups.len());
        for &(id, state, count) in &self.groups {
            if id == 0 || id > MAX_GROUPS {
                return Err(AnaError::NoGroup(id).to_string());
            }
            if groups.iter().any(|&(g, _, _)| g == id) {
                return Err(format!("ANA group {id} given twice"));
            }
            let st =
                AnaState::from_u8(state).ok_or_else(|| format!("ANA group {id}: no state {state:#x}"))?;
            groups.push((id, st, count));
        }
        Ok(AnaChecked { change_count: self.change_count, groups })
    }
}

/// The ANA part of a saved controller state (absent from one saved before it
/// existed: every group optimized).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnaSaved {
    pub change_count: u64,
    /// (group, state, the group's change count), for the groups that ever changed.
    pub groups: Vec<(u32, u8, u64)>,
}
