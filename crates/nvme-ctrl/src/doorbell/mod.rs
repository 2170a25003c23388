//! Shadow doorbells and EventIdx (Base §5.2.5 Doorbell Buffer Config, and the host
//! usage it describes): the one place their memory ordering is written down.
//!
//! # The protocol
//!
//! After a Doorbell Buffer Config command the host keeps two one-page buffers:
//! the *Shadow Doorbell* buffer, where it writes every new SQ tail and CQ head before
//! (maybe) writing the real doorbell register, and the *EventIdx* buffer, where the
//! controller says how far it has seen. Both use the doorbell register layout
//! ([`nvme_spec::regs::doorbell_offset`]). The host writes the register only when
//! its update moves the value past EventIdx ([`nvme_spec::regs::need_event`]):
//!
//! ```text
//! host:        shadow[q] = new;  full barrier;  ei = eventidx[q];
//!              if (u16)(new - ei - 1) < (u16)(new - old): write doorbell register
//! controller:  eventidx[q] = seen;  full barrier;  now = shadow[q];
//!              if now != seen: keep working (the host may have skipped the ring)
//! ```
//!
//! This is a Dekker pair: with a full barrier on both sides, either the host reads our
//! new EventIdx (and rings), or we read its new shadow value (and keep going). Neither
//! side can miss both, so no submission is ever stranded. [`ShadowBuffers::rearm`] is
//! the controller half; nothing else in the crate writes EventIdx.
//!
//! The loads of shadow values are acquire loads: the host writes the SQ entry, then
//! (after its write barrier) the shadow tail, so after reading a tail we may read every
//! entry before it.
//!
//! # What EventIdx values we publish
//!
//! - SQ tail: once the controller has consumed everything up to `tail` and is about to
//!   stop looking, EventIdx = `tail`, so the host's next submission rings. While a
//!   poller is still spinning on the queue it leaves EventIdx stale, so the host does
//!   not ring at all.
//! - CQ head: the controller only needs the host's CQ head when the CQ is full, and it
//!   can read the shadow copy whenever it likes. So EventIdx trails the known head by
//!   one entry (the host rings only when it laps it, about once per queue wrap), and
//!   only a controller waiting for CQ space re-arms it to the current head.
//!
//! # Admin queue
//!
//! Linux and SPDK never write the admin queue's shadow slots; they always ring the
//! register. A trapped admin doorbell write is therefore copied into its shadow slot
//! (the fix QEMU made to its first implementation), so reading the shadow is correct
//! for every queue. I/O queue writes are not copied: the host updates the shadow slot
//! first, and an older trapped value written over a newer shadow value would roll the
//! tail back.
//!
//! The admin SQ's EventIdx is published whenever the queue empties, polling or not, so
//! a host that did use its shadow slot would ring for every admin command; an empty
//! admin SQ armed at its head is then not read again until a doorbell arrives, which
//! keeps a shadow read per run off the I/O path of a controller that also owns the
//! admin queue (inline mode).

pub(crate) mod gap;
#[cfg(test)]
mod model;
mod page;
mod source;

pub(crate) use page::MappedPage;
pub(crate) use source::DoorbellSource;

use std::sync::atomic::{fence, Ordering};

use guest_mem::{GuestMemory, MemError};
use nvme_spec::regs::{doorbell_offset, DoorbellKind};

/// The two buffers of an active Doorbell Buffer Config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShadowBuffers {
    /// Guest address of the Shadow Doorbell buffer.
    pub shadow: u64,
    /// Guest address of the EventIdx buffer.
    pub eventidx: u64,
    pub dstrd: u8,
}

/// The Doorbell Buffer Config's part of a saved controller state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShadowState {
    pub shadow: u64,
    pub eventidx: u64,
}

impl ShadowState {
    /// The buffers, if a controller running with `page_size` pages (None: disabled)
    /// and doorbell stride `dstrd` could have them; or why not.
    pub(crate) fn check(self, page_size: Option<u64>, dstrd: u8) -> Result<ShadowBuffers, String> {
        let Some(page) = page_size else {
            return Err("a Doorbell Buffer Config on a disabled controller".into());
        };
        if !self.shadow.is_multiple_of(page)
            || !self.eventidx.is_multiple_of(page)
            || self.shadow == self.eventidx
        {
            return Err(format!(
                "shadow doorbell buffers {:#x} / {:#x}: two page-aligned buffers",
                self.shadow, self.eventidx
            ));
        }
        Ok(ShadowBuffers { shadow: self.shadow, eventidx: self.eventidx, dstrd })
    }
}

impl ShadowBuffers {
    /// For a saved state.
    pub fn save(&self) -> ShadowState {
        ShadowState { shadow: self.shadow, eventidx: self.eventidx }
    }

    /// Bytes each buffer must hold for queue identifiers `0..=max_qid`.
    pub fn required_len(max_qid: u16, dstrd: u8) -> u64 {
        doorbell_offset(max_qid, DoorbellKind::CqHead, dstrd) + 4
    }

    fn slot(&self, base: u64, qid: u16, kind: DoorbellKind) -> u64 {
        base + doorbell_offset(qid, kind, self.dstrd)
    }

    /// The host's latest value for a doorbell (acquire: entries before it are visible).
    pub fn load(&self, mem: &GuestMemory, qid: u16, kind: DoorbellKind) -> Result<u32, MemError> {
        mem.load_u32(self.slot(self.shadow, qid, kind))
    }

    /// Writes a shadow doorbell slot: at attach time (the controller's current value,
    /// so a zeroed buffer is not mistaken for a new tail) and for trapped admin
    /// doorbell writes (see the module docs).
    pub fn store_shadow(
        &self,
        mem: &GuestMemory,
        qid: u16,
        kind: DoorbellKind,
        v: u32,
    ) -> Result<(), MemError> {
        mem.store_u32(self.slot(self.shadow, qid, kind), v)
    }

    /// Publishes an EventIdx value without re-checking (queue setup, and CQ EventIdx
    /// when the controller does not need a ring).
    pub fn publish(&self, mem: &GuestMemory, qid: u16, kind: DoorbellKind, v: u32) -> Result<(), MemError> {
        mem.store_u32(self.slot(self.eventidx, qid, kind), v)
    }

    /// The controller half of the protocol: publish `seen` as EventIdx, full barrier,
    /// re-read the shadow doorbell. Returns the value read after the barrier; if it
    /// differs from `seen` the host moved on and may not ring, so the caller must
    /// keep working.
    pub fn rearm(&self, mem: &GuestMemory, qid: u16, kind: DoorbellKind, seen: u32) -> Result<u32, MemError> {
        rearm(&mut self.slots(mem, qid, kind), seen)
    }

    /// One queue's pair of slots, for [`SqArm::rearm`].
    pub fn slots<'a>(&'a self, mem: &'a GuestMemory, qid: u16, kind: DoorbellKind) -> Slots<'a> {
        Slots { buffers: self, mem, qid, kind }
    }
}

/// The memory a re-arm touches: one queue's EventIdx slot and its shadow slot. The
/// protocol ([`rearm`], [`SqArm`]) is written against this, so the interleaving
/// model (`model.rs`) runs the code the engine runs, over a memory
/// that lets the host act between any two of its accesses.
pub trait EventIdxSlots {
    type Error;
    /// Stores our EventIdx.
    fn publish(&mut self, v: u32) -> Result<(), Self::Error>;
    /// A full barrier: the store before it is visible before the load after it.
    fn fence(&mut self);
    /// Acquire load of the host's shadow value.
    fn load_shadow(&mut self) -> Result<u32, Self::Error>;
}

/// [`EventIdxSlots`] over guest memory.
#[derive(Debug)]
pub struct Slots<'a> {
    buffers: &'a ShadowBuffers,
    mem: &'a GuestMemory,
    qid: u16,
    kind: DoorbellKind,
}

impl EventIdxSlots for Slots<'_> {
    type Error = MemError;
    fn publish(&mut self, v: u32) -> Result<(), MemError> {
        self.buffers.publish(self.mem, self.qid, self.kind, v)
    }
    fn fence(&mut self) {
        // Pairs with the host's full barrier between its shadow store and its
        // EventIdx load (Linux `mb()` in nvme_dbbuf_update_and_check_event).
        fence(Ordering::SeqCst);
    }
    fn load_shadow(&mut self) -> Result<u32, MemError> {
        self.buffers.load(self.mem, self.qid, self.kind)
    }
}

/// Publish `seen`, full barrier, re-read the shadow value (see the module docs).
pub fn rearm<S: EventIdxSlots>(slots: &mut S, seen: u32) -> Result<u32, S::Error> {
    slots.publish(seen)?;
    slots.fence();
    slots.load_shadow()
}

/// What re-arming an empty SQ found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rearm {
    /// EventIdx already holds this head (published, and fenced, when the queue was
    /// last found empty there): nothing was read or written.
    Unchanged,
    /// EventIdx is now this head and the shadow tail still equals it: the host's
    /// next submission rings.
    Armed,
    /// The host wrote this tail meanwhile and may not ring for it: keep working.
    Moved(u32),
}

/// The SQ EventIdx value this controller published, so a run that finds an SQ empty
/// at the head it is already armed at skips the store, the fence and the re-read
/// (the common case: an owner woken for something else).
///
/// The record is exactly what guest memory holds: it changes at every store of the
/// slot, whatever the re-read after that store finds. A record kept only when the
/// re-read found nothing new would, after a re-arm that raced the host, still name
/// the older value; when the head came round to it, the controller would skip the
/// re-arm and sleep with EventIdx behind the tail, and the host's next submission
/// would not ring (a lost wake-up seen as one command in a million never completing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SqArm {
    published: Option<u32>,
}

impl SqArm {
    /// The SQ is empty at `head` (the tail last read): make sure the host's next
    /// submission rings, or find the one it made meanwhile.
    pub fn rearm<S: EventIdxSlots>(&mut self, slots: &mut S, head: u32) -> Result<Rearm, S::Error> {
        if self.published == Some(head) {
            return Ok(Rearm::Unchanged);
        }
        slots.publish(head)?;
        self.published = Some(head);
        slots.fence();
        let t = slots.load_shadow()?;
        Ok(if t == head { Rearm::Armed } else { Rearm::Moved(t) })
    }

    /// The value EventIdx holds, if this controller stored it.
    pub fn published(&self) -> Option<u32> {
        self.published
    }

    /// Whether EventIdx holds `head`.
    pub fn is_at(&self, head: u32) -> bool {
        self.published == Some(head)
    }

    /// The slot was written by something else (buffers attached, a value carried
    /// into new buffers, state restored): the next re-arm stores again.
    pub fn forget(&mut self) {
        self.published = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_use_the_doorbell_layout() {
        let mem = GuestMemory::anonymous(&[(0, 0x3000)]).unwrap();
        let b = ShadowBuffers { shadow: 0x1000, eventidx: 0x2000, dstrd: 0 };
        b.store_shadow(&mem, 3, DoorbellKind::CqHead, 77).unwrap();
        assert_eq!(mem.load_u32(0x1000 + 7 * 4).unwrap(), 77);
        b.publish(&mem, 2, DoorbellKind::SqTail, 5).unwrap();
        assert_eq!(mem.load_u32(0x2000 + 4 * 4).unwrap(), 5);
        mem.store_u32(0x1000 + 4 * 4, 9).unwrap();
        assert_eq!(b.rearm(&mem, 2, DoorbellKind::SqTail, 8).unwrap(), 9);
        assert_eq!(mem.load_u32(0x2000 + 4 * 4).unwrap(), 8);
        assert_eq!(ShadowBuffers::required_len(64, 0), 65 * 8);
    }
}
