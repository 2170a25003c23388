//! Where an engine's doorbell values come from besides trapped register writes:
//! the two buffers of a Doorbell Buffer Config (shadow doorbells and EventIdx) and a
//! doorbell page mapped into the guest. What the engine does with them is
//! `engine/doorbells.rs`; this part owns them.

use guest_mem::GuestMemory;
use nvme_spec::regs::DoorbellKind;

use super::{MappedPage, ShadowBuffers};

#[derive(Debug)]
pub(crate) struct DoorbellSource {
    /// The Doorbell Buffer Config in force (none until the host sends one, and
    /// after a reset).
    shadow: Option<ShadowBuffers>,
    page: MappedPage,
}

impl DoorbellSource {
    /// For queue identifiers up to `max_qid` with doorbell stride `dstrd`: no shadow
    /// buffers, no mapped page.
    pub(crate) fn new(max_qid: u16, dstrd: u8) -> Self {
        DoorbellSource { shadow: None, page: MappedPage::new(max_qid, dstrd) }
    }

    #[inline]
    pub(crate) fn shadow(&self) -> Option<ShadowBuffers> {
        self.shadow
    }

    /// Uses `buffers` (Doorbell Buffer Config, a restore), or none (a reset).
    pub(crate) fn set_shadow(&mut self, buffers: Option<ShadowBuffers>) {
        self.shadow = buffers;
    }

    #[inline]
    pub(crate) fn page_mapped(&self) -> bool {
        self.page.is_mapped()
    }

    /// Maps (or unmaps) the doorbell page.
    pub(crate) fn set_page(&mut self, page: Option<GuestMemory>) {
        self.page.set(page);
    }

    /// A value the host stored in the mapped page since it was last taken.
    #[inline]
    pub(crate) fn take_new(&mut self, qid: u16, kind: DoorbellKind) -> Option<u32> {
        self.page.take_new(qid, kind)
    }

    /// Forgets what was taken from queue `qid`'s slot (the queue was deleted).
    pub(crate) fn clear(&mut self, qid: u16, kind: DoorbellKind) {
        self.page.clear(qid, kind);
    }

    /// The last value taken from a slot of the mapped page (a saved state).
    pub(crate) fn seen(&self, qid: u16, kind: DoorbellKind) -> u32 {
        self.page.seen(qid, kind)
    }

    /// The last value taken from a slot, as a saved state had it.
    pub(crate) fn restore_seen(&mut self, qid: u16, kind: DoorbellKind, v: u32) {
        self.page.restore_seen(qid, kind, v);
    }
}
