//! The admin side's part of a saved controller state: outstanding Asynchronous
//! Event Requests, the queues granted, feature values and the clock readings they
//! count from.

use serde::{Deserialize, Serialize};

use super::FeatureValues;
use super::{timestamp_now, AdminState};
use crate::saved::has_duplicates;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdminSaved {
    /// Command identifiers of outstanding Asynchronous Event Requests.
    pub aers: Vec<u16>,
    pub io_queues_created: bool,
    pub nsq_granted_z: u16,
    pub ncq_granted_z: u16,
    pub features: FeatureValues,
    /// The host's Timestamp (ms) as of the state's clock reading, if it set one.
    pub timestamp_ms: Option<u64>,
    /// Clock readings of the controller's creation and of its last reset.
    pub created_ns: u64,
    pub reset_ns: u64,
    /// The Host Identifier the host set (hex, 16 or 32 digits; absent: none), which
    /// its reservation commands go by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id: Option<String>,
    /// Reservation Notification Masks by NSID.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resv_masks: Vec<(u32, u32)>,
}

/// What a saved admin part must fit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AdminBounds {
    /// Asynchronous Event Requests the controller accepts (AERL + 1).
    pub aers: usize,
    /// I/O queues the controller has.
    pub max_qid: u16,
    /// The saved controller was enabled (a disabled one has no AER outstanding).
    pub enabled: bool,
}

/// A saved Host Identifier: 8 bytes, or 16 (the extended form).
fn host_id(hex: &str) -> Result<(crate::reservation::HostId, bool), String> {
    let extended = hex.len() == 32;
    let raw = crate::saved::unhex(hex, if extended { 16 } else { 8 })?;
    let mut id = [0u8; 16];
    id[..raw.len()].copy_from_slice(&raw);
    Ok((id, extended))
}

impl AdminSaved {
    /// Refuses what a controller within `b` could not have reached.
    pub(crate) fn check(&self, b: AdminBounds) -> Result<(), String> {
        if let Some(h) = &self.host_id {
            host_id(h).map_err(|e| format!("host identifier: {e}"))?;
        }
        if self.resv_masks.len() > crate::config::MAX_NAMESPACES as usize {
            return Err(format!("{} reservation notification masks", self.resv_masks.len()));
        }
        if self.aers.len() > b.aers || (!b.enabled && !self.aers.is_empty()) {
            return Err(format!(
                "{} Asynchronous Event Requests outstanding (at most {})",
                self.aers.len(),
                b.aers
            ));
        }
        if has_duplicates(self.aers.iter().copied()) {
            return Err("an Asynchronous Event Request's command identifier twice".into());
        }
        let max_granted_z = b.max_qid.saturating_sub(1);
        if self.nsq_granted_z > max_granted_z || self.ncq_granted_z > max_granted_z {
            return Err(format!(
                "{} / {} I/O queues granted (0's based; this controller has {})",
                self.nsq_granted_z, self.ncq_granted_z, b.max_qid
            ));
        }
        if self.timestamp_ms.is_some_and(|ms| ms >= 1 << 48) {
            return Err(format!("timestamp {:?} ms (the field has 48 bits)", self.timestamp_ms));
        }
        if self.features.power_management & 0x1f != 0 {
            return Err(format!(
                "power state {} (this controller has one)",
                self.features.power_management & 0x1f
            ));
        }
        Ok(())
    }
}

impl AdminState {
    /// For a saved state taken at clock reading `now`.
    pub(crate) fn save(&self, now: u64) -> AdminSaved {
        let f = &self.features;
        AdminSaved {
            aers: self.aers.clone(),
            io_queues_created: self.io_queues_created,
            nsq_granted_z: f.nsq_granted_z,
            ncq_granted_z: f.ncq_granted_z,
            features: f.cur.clone(),
            timestamp_ms: f.timestamp.map(|(ms, at)| timestamp_now(ms, at, now)),
            created_ns: self.created_ns,
            reset_ns: f.reset_ns,
            host_id: match self.host.get() {
                (id, _) if id == [0; 16] => None,
                (id, true) => Some(crate::saved::hex(&id)),
                (id, false) => Some(crate::saved::hex(&id[..8])),
            },
            resv_masks: self.resv_log.masks(),
        }
    }

    /// Puts a checked saved part back, at clock reading `now`.
    pub(crate) fn restore(&mut self, s: &AdminSaved, now: u64) {
        self.aers = s.aers.clone();
        self.io_queues_created = s.io_queues_created;
        self.created_ns = s.created_ns;
        let f = &mut self.features;
        (f.nsq_granted_z, f.ncq_granted_z) = (s.nsq_granted_z, s.ncq_granted_z);
        f.cur = s.features.clone();
        f.aec = nvme_spec::features::AsyncEventConfig(s.features.aec);
        f.reset_ns = s.reset_ns;
        f.timestamp = s.timestamp_ms.map(|ms| (ms, now));
        // A whole KATO from the restore: the host's keep alives resume with it.
        f.restart_keep_alive(now);
        if let Some(Ok((id, extended))) = s.host_id.as_deref().map(host_id) {
            self.host.set(id, extended);
        }
        for &(nsid, m) in &s.resv_masks {
            self.resv_log.set_mask(nsid, m);
        }
    }
}
