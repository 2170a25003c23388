//! What one serving process hands on to the next, whether it lives on (an
//! upgrade's hand-over, `upgrade`) or has died (the keeper's journal, read by a
//! stand-in, `keeper`): the namespaces as they are now, with a RAM namespace's
//! memory, and the QoS groups.

use crate::logging::say;
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use nvme_ctrl::qos::{QosGroup, QosLimits};
use serde::{Deserialize, Serialize};

/// A named QoS group as handed on.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GroupSaved {
    pub name: String,
    pub limits: QosLimits,
}

impl From<&QosGroup> for GroupSaved {
    fn from(g: &QosGroup) -> Self {
        GroupSaved { name: g.name.clone(), limits: g.limits() }
    }
}

/// A namespace as handed on. Descriptors are indexes into the hand-over's (or the
/// journal entry's) `extra_fds`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NsSaved {
    pub nsid: u32,
    pub spec: String,
    /// A RAM namespace's memfd.
    pub memory: Option<usize>,
    /// A RAM namespace's metadata memfd.
    #[serde(default)]
    pub meta_memory: Option<usize>,
    /// The QoS group it draws from (a named one, or its own), and its limits.
    pub group: Option<String>,
    pub limits: Option<QosLimits>,
    /// Its size in bytes now (it may have been resized since `spec`).
    #[serde(default)]
    pub size: Option<u64>,
}

/// The namespaces `d` serves other than the pool's, as handed to another process:
/// each one's `--ns` text (from `specs`), size and QoS, and a RAM namespace's
/// memory (and metadata memory) where `memory_goes` says so, whose descriptors go
/// into `fds`.
pub fn saved_namespaces(
    d: &vfio_user_server::Device,
    specs: &BTreeMap<u32, String>,
    fds: &mut Vec<OwnedFd>,
    memory_goes: impl Fn(&nvme_ctrl::Namespace) -> bool,
) -> Result<Vec<NsSaved>, String> {
    let mut namespaces = Vec::new();
    // The pool's namespaces are the pool's: the next process attaches them from
    // there.
    for ns in d.ctrl.namespaces().filter(|n| !d.ctrl.is_pool_namespace(n.nsid)) {
        let spec = specs.get(&ns.nsid).ok_or_else(|| format!("namespace {} has no --ns text", ns.nsid))?;
        let memory = match ns.backend.handover_fd().filter(|_| memory_goes(ns)) {
            Some(fd) => Some(push(fds, fd.map_err(|e| format!("namespace {}: {e}", ns.nsid))?)),
            None => None,
        };
        // Its metadata lives in memory too: the next process maps the same.
        let meta = ns.meta.as_ref().and_then(|m| m.fd()).filter(|_| memory.is_some());
        let meta_memory = match meta {
            Some(fd) => Some(push(
                fds,
                fd.try_clone_to_owned().map_err(|e| format!("namespace {}: metadata: {e}", ns.nsid))?,
            )),
            None => None,
        };
        let qos = d.ctrl.qos(ns.nsid);
        let (group, limits) = (qos.as_ref().map(|g| g.name.clone()), qos.map(|g| g.limits()));
        namespaces.push(NsSaved {
            nsid: ns.nsid,
            spec: spec.clone(),
            memory,
            meta_memory,
            group,
            limits,
            size: Some(ns.size()),
        });
    }
    Ok(namespaces)
}

/// The QoS group namespace `n` drew from: a named one of `groups`, or its own
/// limits as a group of its own (None: no limits).
pub fn group_of(
    n: &NsSaved,
    groups: &BTreeMap<String, Arc<QosGroup>>,
) -> Result<Option<Arc<QosGroup>>, String> {
    let Some(name) = &n.group else { return Ok(None) };
    match groups.get(name) {
        Some(g) => Ok(Some(g.clone())),
        None => QosGroup::new(name.clone(), n.limits.unwrap_or_default()).map(|g| Some(Arc::new(g))),
    }
}

/// The QoS groups as they were, by name.
pub fn groups(saved: &[GroupSaved]) -> Result<BTreeMap<String, Arc<QosGroup>>, String> {
    saved.iter().map(|g| Ok((g.name.clone(), Arc::new(QosGroup::new(g.name.clone(), g.limits)?)))).collect()
}

/// What a stand-in takes from the journal besides the device: the namespaces as
/// the operator last left them (those `ns.add` added, not those `ns.remove`
/// removed, each at its size now, with its QoS) with a RAM namespace's memory,
/// and the named QoS groups. A crash then loses none of them, nor the data of a
/// RAM namespace.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Journaled {
    pub namespaces: Vec<NsSaved>,
    pub groups: Vec<GroupSaved>,
}

impl Journaled {
    /// What the journal of `h` holds (None: an entry without it, from a build
    /// before it was journaled).
    pub fn from_journal(h: &vfio_user_server::handover::Handover) -> Option<Journaled> {
        serde_json::from_value(h.saved.extra.clone()).ok()
    }

    /// The named QoS groups, made again; one whose limits are not valid is left
    /// out, said so (the journal came from a process a hostile VMM may have taken
    /// over: it costs that group, not the stand-in).
    pub fn groups(&self) -> BTreeMap<String, Arc<QosGroup>> {
        let mut made = BTreeMap::new();
        for g in &self.groups {
            match QosGroup::new(g.name.clone(), g.limits) {
                Ok(q) => {
                    made.insert(g.name.clone(), Arc::new(q));
                }
                Err(e) => say!("vnvme: QoS group {:?} from before the crash: {e}; left out", g.name),
            }
        }
        made
    }
}

/// Journals what a stand-in keeps of this server ([`Journaled`]): the namespaces
/// as they are now, by their `--ns` text in `specs`, and the named `groups`.
/// Nothing without a keeper. Run on the device thread, before the operator whose
/// change it records is answered.
pub fn journal(
    d: &mut vfio_user_server::Device,
    specs: &BTreeMap<u32, String>,
    groups: &BTreeMap<String, Arc<QosGroup>>,
) {
    if !d.is_kept() {
        return;
    }
    let mut fds = Vec::new();
    // A zoned RAM namespace's write pointers die with the process (an upgrade hands
    // them over; a journal has no controller state): its data without them would
    // read back under zones the stand-in reports empty. It starts over, zeroed, as
    // a whole.
    let built = saved_namespaces(d, specs, &mut fds, |ns| ns.zones.is_none()).and_then(|namespaces| {
        let groups = groups.values().map(|g| GroupSaved::from(&**g)).collect();
        serde_json::to_value(Journaled { namespaces, groups }).map_err(|e| e.to_string())
    });
    match built {
        Ok(v) => d.journal_extra(v, fds),
        Err(e) => tracing::warn!(
            "the keeper's journal does not have the namespaces as they are now ({e}): a stand-in after a \
             crash would serve them as last journaled"
        ),
    }
}

/// Adds `fd` to `fds`; its index there.
pub fn push(fds: &mut Vec<OwnedFd>, fd: OwnedFd) -> usize {
    fds.push(fd);
    fds.len() - 1
}

#[cfg(test)]
mod tests {
    use nvme_ctrl::qos::Limit;

    use super::*;

    /// A group the journal got wrong costs that group, not the stand-in.
    #[test]
    fn a_journaled_group_with_limits_out_of_bounds_is_left_out() {
        let limits = |rate| QosLimits { iops: Some(Limit { rate, burst: 0 }), ..Default::default() };
        let j = Journaled {
            namespaces: Vec::new(),
            groups: vec![
                GroupSaved { name: "gold".into(), limits: limits(5000) },
                GroupSaved { name: "bad".into(), limits: limits(0) },
            ],
        };
        let made = j.groups();
        assert_eq!(made.keys().collect::<Vec<_>>(), ["gold"]);
        assert_eq!(made["gold"].limits(), limits(5000));
    }
}
