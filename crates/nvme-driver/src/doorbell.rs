//! Doorbell updates, the host half of the shadow doorbell protocol (Base §5.2.5
//! Doorbell Buffer Config): the one place its memory ordering is written down.
//!
//! With shadow doorbells the host stores each new SQ tail / CQ head in the Shadow
//! Doorbell buffer, issues a full barrier, reads the controller's EventIdx, and writes
//! the real doorbell only if the update moved past EventIdx — Linux
//! `nvme_dbbuf_update_and_check_event`:
//!
//! ```text
//! host:        shadow[q] = new;  full barrier;  ei = eventidx[q];  ring if need_event(ei, new, old)
//! controller:  eventidx[q] = seen;  full barrier;  now = shadow[q];  keep working if now != seen
//! ```
//!
//! With a full barrier on both sides, either we see the controller's new EventIdx (and
//! ring) or the controller sees our new shadow value: a submission is never stranded.
#![forbid(unsafe_code)]

use std::io;
use std::sync::atomic::{fence, Ordering};
use std::sync::{Arc, Mutex};

use guest_mem::GuestMemory;
use nvme_spec::regs::{doorbell_offset, need_event, offset, DoorbellKind};

use crate::transport::{DirectDoorbell, Transport};

/// The transport, shared by the driver and every queue (one socket, one device fd).
pub type SharedTransport = Arc<Mutex<Box<dyn Transport>>>;

/// Locks the shared transport; a panic elsewhere does not make it unusable.
pub(crate) fn lock(t: &SharedTransport) -> std::sync::MutexGuard<'_, Box<dyn Transport>> {
    t.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where a queue's Shadow Doorbell and EventIdx buffers are (host view by IOVA).
#[derive(Clone, Debug)]
pub struct ShadowBuffers {
    pub mem: GuestMemory,
    pub shadow: u64,
    pub eventidx: u64,
}

/// How a doorbell reaches the device.
#[derive(Debug)]
enum Ring {
    /// Through the shared transport (a trapped register write).
    Shared(SharedTransport),
    /// A writer this doorbell owns (mapped page, eventfd).
    Direct(Box<dyn DirectDoorbell>),
    /// A register write that waits for the device (a doorbell whose value must
    /// travel with the write even when the transport's doorbells carry none).
    Register(SharedTransport),
}

/// One doorbell register (an SQ tail or a CQ head) and its shadow slots.
#[derive(Debug)]
pub struct Doorbell {
    bar_off: u64,
    ring: Ring,
    /// Shadow slot and EventIdx slot addresses, when shadow doorbells are on.
    shadow: Option<(GuestMemory, u64, u64)>,
    last: u32,
    /// Register writes (or eventfd signals) issued.
    pub rings: u64,
    /// Updates, rung or not.
    pub updates: u64,
}

impl Doorbell {
    pub fn new(
        transport: &SharedTransport,
        qid: u16,
        kind: DoorbellKind,
        dstrd: u8,
        shadow: Option<&ShadowBuffers>,
    ) -> io::Result<Self> {
        let rel = doorbell_offset(qid, kind, dstrd);
        let bar_off = offset::DOORBELL_BASE + rel;
        let ring = match lock(transport).direct_doorbell(bar_off)? {
            Some(d) => Ring::Direct(d),
            None => Ring::Shared(transport.clone()),
        };
        let shadow = shadow.map(|b| (b.mem.clone(), b.shadow + rel, b.eventidx + rel));
        Ok(Doorbell { bar_off, ring, shadow, last: 0, rings: 0, updates: 0 })
    }

    /// A doorbell rung with plain register writes, never shadowed (the admin queue
    /// when the transport's doorbells carry no value).
    pub fn register(transport: &SharedTransport, qid: u16, kind: DoorbellKind, dstrd: u8) -> Self {
        let bar_off = offset::DOORBELL_BASE + doorbell_offset(qid, kind, dstrd);
        Doorbell {
            bar_off,
            ring: Ring::Register(transport.clone()),
            shadow: None,
            last: 0,
            rings: 0,
            updates: 0,
        }
    }

    /// Publishes `value`: with shadow doorbells, the shadow slot then (maybe) the
    /// register; without, the register. Everything the host wrote to queue memory
    /// before this call is visible to the device before the value is.
    pub fn update(&mut self, value: u32) -> io::Result<()> {
        let old = std::mem::replace(&mut self.last, value);
        self.updates += 1;
        if let Some((mem, shadow, eventidx)) = &self.shadow {
            // Release store: the SQEs (or our consumption of CQEs) come first.
            mem.store_u32(*shadow, value)?;
            // Pairs with the controller's full barrier between publishing EventIdx and
            // re-reading the shadow slot (nvme-ctrl doorbell.rs `rearm`).
            fence(Ordering::SeqCst);
            let ei = mem.load_u32(*eventidx)?;
            if !need_event(ei as u16, value as u16, old as u16) {
                return Ok(());
            }
        } else {
            // Queue memory writes before the doorbell (Linux: the wmb in writel).
            fence(Ordering::Release);
        }
        self.rings += 1;
        match &mut self.ring {
            Ring::Shared(t) => lock(t).doorbell(self.bar_off, value),
            Ring::Direct(d) => d.ring(value),
            Ring::Register(t) => lock(t).write32(self.bar_off, value),
        }
    }

    /// Whether this doorbell uses the shadow buffer.
    pub fn shadowed(&self) -> bool {
        self.shadow.is_some()
    }
}
