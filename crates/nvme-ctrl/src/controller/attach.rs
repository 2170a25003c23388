//! Namespaces added, removed, resized and given QoS limits under a running host (what an operator asks
//! for through a control socket), the way the spec tells a host about it: the
//! namespace's NSID goes into the Changed Namespace List log (Base §5.1.12.1.5) and a
//! Namespace Attribute Changed notice is raised (Base §5.1.2, OAES bit 8) if the host
//! enabled it; Linux then rescans on its own.
//!
//! Every engine adopts the new namespace table before the host hears of the change:
//! a namespace added has its backend queues open when the first command comes, and
//! one removed has no command left running anywhere (commands still at its backend
//! complete with Invalid Namespace, their requests given up on as a timeout does).

use std::sync::Arc;

use nvme_spec::aer::{notice_info, AsyncEvent, EventType};
use nvme_spec::log::lid;
use tracing::{info, warn};

use super::Controller;
use crate::config::NamespaceConfig;
use crate::namespace::{lba_fits, make as make_namespace};
use crate::namespace::{lookup, Namespace, NamespaceSlots};
use crate::qos::QosGroup;

/// Why a namespace could not be added, removed or resized.
#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    #[error("no free NSID: all {0} are in use (the controller was started with room for {0} namespaces)")]
    Full(u32),
    #[error("NSID {0} is outside 1..={1}")]
    OutOfRange(u32, u32),
    #[error("NSID {0} is in use")]
    InUse(u32),
    #[error("there is no namespace {0}")]
    NotFound(u32),
    #[error("{0}")]
    Invalid(String),
    #[error("cannot open the backend's queues: {0}")]
    Open(std::io::Error),
    #[error("namespace {nsid}: cannot resize the backend: {source}")]
    Resize { nsid: u32, source: std::io::Error },
    #[error(
        "namespace {nsid}: the guest may have data beyond {new_size} bytes (the backend holds data up to \
         {size} bytes); shrink anyway with force"
    )]
    WouldLoseData { nsid: u32, new_size: u64, size: u64 },
}

impl Controller {
    /// Adds a namespace at `nsid` (the lowest free NSID if None) and tells the host.
    /// Returns its NSID.
    /// With a namespace pool, the NSID is one the pool has not given out, and the
    /// pool is told this controller has it.
    pub fn add_namespace(&mut self, n: &NamespaceConfig, nsid: Option<u32>) -> Result<u32, NamespaceError> {
        let nn = self.max_namespaces();
        let pool = self.cfg.pool.as_ref().map(|p| p.state());
        let pools = |id: u32| pool.as_ref().is_some_and(|p| p.namespaces.contains_key(&id));
        let nsid = match nsid.or(n.nsid) {
            Some(id) if id == 0 || id > nn => return Err(NamespaceError::OutOfRange(id, nn)),
            Some(id) if lookup(&self.namespaces, id).is_some() || pools(id) => {
                return Err(NamespaceError::InUse(id))
            }
            Some(id) => id,
            None => {
                let free = (1..=nn).find(|&id| lookup(&self.namespaces, id).is_none() && !pools(id));
                free.ok_or(NamespaceError::Full(nn))?
            }
        };
        self.insert_namespace(n, nsid)?;
        self.namespace_changed(nsid);
        if let Err(e) = self.claim_fixed_nsids() {
            // The pool gave the NSID out in between: this controller lets it go.
            self.drop_namespace(nsid)?;
            return Err(NamespaceError::Invalid(e));
        }
        Ok(nsid)
    }

    /// Adds a namespace at free slot `nsid` (the caller tells the host).
    pub(crate) fn insert_namespace(&mut self, n: &NamespaceConfig, nsid: u32) -> Result<(), NamespaceError> {
        if nsid == 0 || nsid > self.max_namespaces() {
            return Err(NamespaceError::OutOfRange(nsid, self.max_namespaces()));
        }
        if lookup(&self.namespaces, nsid).is_some() {
            return Err(NamespaceError::InUse(nsid));
        }
        let ns = Arc::new(
            make_namespace(
                nsid,
                n,
                &self.cfg.serial,
                self.admin.fdp.as_ref(),
                &self.admin.ana,
                &self.admin.host,
            )
            .map_err(NamespaceError::Invalid)?,
        );
        self.admin.attach(&ns).map_err(NamespaceError::Open)?;
        let mut slots = self.namespaces.to_vec();
        slots[nsid as usize - 1] = Some(ns.clone());
        self.publish_namespaces(slots.into());
        info!(nsid, backend = %ns.info.kind, size = ns.size(), "namespace added");
        self.admin.ana.membership_changed();
        Ok(())
    }

    /// Removes namespace `nsid` and tells the host. Its commands still with the
    /// backend complete with Invalid Namespace. A namespace of the pool is the
    /// pool's: it is detached there (`ns.detach`), not removed here.
    pub fn remove_namespace(&mut self, nsid: u32) -> Result<(), NamespaceError> {
        if self.is_pool_namespace(nsid) {
            return Err(NamespaceError::Invalid(format!(
                "namespace {nsid} is the namespace pool's: detach it from this controller (ns.detach) or \
                 delete it (ns.delete)"
            )));
        }
        self.drop_namespace(nsid)?;
        self.namespace_changed(nsid);
        // Its NSID is free again; the pool may give it out.
        if let Err(e) = self.claim_fixed_nsids() {
            warn!(nsid, "namespace pool: {e}");
        }
        Ok(())
    }

    /// Removes namespace `nsid` (the caller tells the host).
    pub(crate) fn drop_namespace(&mut self, nsid: u32) -> Result<(), NamespaceError> {
        let Some(ns) = lookup(&self.namespaces, nsid).cloned() else {
            return Err(NamespaceError::NotFound(nsid));
        };
        if self.admin.formatting_ns(nsid) {
            self.admin.fail_format(&mut self.engine, "its namespace was removed");
        }
        let mut slots = self.namespaces.to_vec();
        slots[nsid as usize - 1] = None;
        self.publish_namespaces(slots.into());
        self.qos.remove(&nsid);
        self.admin.detach(nsid);
        info!(nsid, backend = %ns.info.kind, "namespace removed");
        self.admin.ana.membership_changed();
        Ok(())
    }

    /// Resizes namespace `nsid` to `bytes` and tells the host. Shrinking is refused
    /// when the backend may hold data beyond the new end (the guest's data), unless
    /// `force`. Returns the old size.
    /// Fails the zone of zoned namespace `nsid` starting at LBA `zslba` into
    /// `state` (read only or offline), as a medium would, and tells the host (Zone
    /// Descriptor Changed, if it enabled those notices). Returns whether the zone
    /// changed (false: it was in that state already).
    pub fn fail_zone(
        &mut self,
        nsid: u32,
        zslba: u64,
        state: nvme_spec::zns::ZoneState,
    ) -> Result<bool, NamespaceError> {
        let Some(ns) = lookup(&self.namespaces, nsid).cloned() else {
            return Err(NamespaceError::NotFound(nsid));
        };
        let Some(zones) = &ns.zones else {
            return Err(NamespaceError::Invalid(format!("namespace {nsid} is not zoned")));
        };
        if zslba >= ns.nsze() {
            return Err(NamespaceError::Invalid(format!("namespace {nsid} has no LBA {zslba}")));
        }
        let changed = zones.fail_zone(zslba << ns.lba_shift(), state).map_err(|e| {
            NamespaceError::Invalid(format!("namespace {nsid}, the zone at LBA {zslba}: {e}"))
        })?;
        if changed {
            warn!(nsid, zslba, state = state.name(), "zone failed by the operator");
            if self.admin.features.aec.zone_descriptor_notices() {
                self.events.raise(AsyncEvent {
                    kind: EventType::Notice,
                    info: notice_info::ZONE_DESCRIPTOR_CHANGED,
                    log_page: lid::CHANGED_ZONE_LIST,
                });
            }
        }
        Ok(changed)
    }

    pub fn resize_namespace(&mut self, nsid: u32, bytes: u64, force: bool) -> Result<u64, NamespaceError> {
        let Some(ns) = lookup(&self.namespaces, nsid).cloned() else {
            return Err(NamespaceError::NotFound(nsid));
        };
        if self.is_pool_namespace(nsid) {
            // Its size is the pool's record, counted against the pool's capacity
            // and seen by every controller.
            return Err(NamespaceError::Invalid(format!(
                "namespace {nsid} is the namespace pool's: its size is fixed at its creation"
            )));
        }
        let old = ns.size();
        if ns.zones.is_some() {
            // The zones, their count and the zone state file's layout are fixed.
            return Err(NamespaceError::Invalid(format!(
                "namespace {nsid} is zoned: its zones are fixed, it cannot be resized (add a new namespace)"
            )));
        }
        let lba = 1u64 << ns.lba_shift();
        if !lba_fits(lba, ns.info.block_size, bytes) {
            return Err(NamespaceError::Invalid(format!(
                "namespace {nsid}: {bytes} bytes is not a whole number of its {lba}-byte blocks (or is zero)"
            )));
        }
        if bytes < old && !force {
            let holds =
                ns.backend.data_end(bytes).map_err(|source| NamespaceError::Resize { nsid, source })?;
            if let Some(size) = holds {
                return Err(NamespaceError::WouldLoseData { nsid, new_size: bytes, size });
            }
        }
        if bytes < old {
            // New commands see the new end before the storage shrinks under them.
            ns.set_size(bytes);
        }
        if let Err(source) = ns.backend.resize(bytes) {
            ns.set_size(old);
            return Err(NamespaceError::Resize { nsid, source });
        }
        ns.set_size(bytes);
        info!(nsid, old, new = bytes, "namespace resized");
        self.namespace_changed(nsid);
        Ok(old)
    }

    /// Puts ANA group `group` (None: every group) in `state` on this controller
    /// and tells the host (an ANA Change notice, if it enabled those): from now
    /// on, commands to the group's namespaces are processed or refused as the
    /// state says (`crate::ana`). Returns the groups with namespaces that changed
    /// (what the host sees; a group without namespaces takes the state too, for
    /// a namespace added to it later). Only a controller of a subsystem reports
    /// ANA.
    pub fn set_ana_state(
        &mut self,
        group: Option<u32>,
        state: nvme_spec::ana::AnaState,
    ) -> Result<Vec<u32>, NamespaceError> {
        if self.cfg.subsystem.is_none() {
            return Err(NamespaceError::Invalid(
                "ANA is reported by a controller of a subsystem only (start it with --cntlid)".into(),
            ));
        }
        let mut changed =
            self.admin.ana.set(group, state).map_err(|e| NamespaceError::Invalid(e.to_string()))?;
        changed.retain(|&g| self.namespaces().any(|n| n.ana_group().id() == g));
        if !changed.is_empty() {
            info!(groups = ?changed, state = state.name(), "ANA state set");
            if self.admin.features.aec.ana_change_notices() {
                self.events.raise(AsyncEvent {
                    kind: EventType::Notice,
                    info: notice_info::ANA_CHANGE,
                    log_page: lid::ANA,
                });
            }
        }
        Ok(changed)
    }

    /// Each ANA group with an active namespace: its ID, its state here, and its
    /// namespaces (empty without a subsystem: ANA is not reported).
    pub fn ana_groups(&self) -> Vec<(u32, nvme_spec::ana::AnaState, Vec<u32>)> {
        if self.cfg.subsystem.is_none() {
            return Vec::new();
        }
        self.admin
            .ana
            .groups()
            .map(|g| {
                let nsids = self.namespaces().filter(|n| n.ana_group().id() == g.id()).map(|n| n.nsid);
                (g.id(), g.state(), nsids.collect::<Vec<u32>>())
            })
            .filter(|(_, _, n)| !n.is_empty())
            .collect()
    }

    /// Makes `slots` the namespace table of the admin side and of every engine,
    /// returning once each has adopted it.
    fn publish_namespaces(&mut self, slots: NamespaceSlots) {
        self.admin.resv_log.watch(crate::namespace::active(&slots).any(|n| n.reservations().is_some()));
        self.namespaces = slots.clone();
        self.on_all_engines(move |e| e.set_namespaces(slots.clone()));
    }

    /// Records that `nsid` changed and raises the Namespace Attribute Changed notice
    /// if the host asked for it.
    pub(crate) fn namespace_changed(&mut self, nsid: u32) {
        self.events.namespace_changed(nsid);
        if self.admin.features.aec.ns_attribute_notices() {
            self.events.raise(AsyncEvent {
                kind: EventType::Notice,
                info: notice_info::NAMESPACE_ATTRIBUTE_CHANGED,
                log_page: lid::CHANGED_NAMESPACE_LIST,
            });
        }
    }

    /// Makes namespace `nsid` draw from the limits of `group` (None: no limits), on
    /// every engine; commands held back are looked at again at once.
    pub fn set_qos(&mut self, nsid: u32, group: Option<Arc<QosGroup>>) -> Result<(), NamespaceError> {
        if lookup(&self.namespaces, nsid).is_none() {
            return Err(NamespaceError::NotFound(nsid));
        }
        match &group {
            Some(g) => {
                info!(nsid, group = %g.name, limits = %g.limits(), "namespace QoS set");
                self.qos.insert(nsid, g.clone());
            }
            None => {
                if self.qos.remove(&nsid).is_some() {
                    info!(nsid, "namespace QoS cleared");
                }
            }
        }
        self.on_all_engines(move |e| e.set_qos(nsid, group.clone()));
        Ok(())
    }

    /// The limits namespace `nsid` draws from, if any.
    pub fn qos(&self, nsid: u32) -> Option<Arc<QosGroup>> {
        self.qos.get(&nsid).cloned()
    }

    /// The namespace `nsid` if it is active.
    pub fn namespace(&self, nsid: u32) -> Option<Arc<Namespace>> {
        lookup(&self.namespaces, nsid).cloned()
    }
}
