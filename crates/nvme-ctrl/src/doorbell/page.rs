//! A doorbell page mapped into the guest (BAR0 0x1000 onwards): the guest stores
//! doorbell values there without an exit, and the engine polls the slots as a value
//! source, remembering the last value it took from each.

use guest_mem::GuestMemory;
use nvme_spec::regs::{doorbell_offset, offset, DoorbellKind};

#[derive(Debug)]
pub(crate) struct MappedPage {
    /// The page, addressed by BAR0 offset (None: not mapped).
    page: Option<GuestMemory>,
    /// The last value taken from each queue's slots: [SQ tail, CQ head].
    seen: Vec<[u32; 2]>,
    /// CAP.DSTRD.
    dstrd: u8,
}

impl MappedPage {
    /// Not mapped yet, for queue identifiers 0..=`max_qid`.
    pub fn new(max_qid: u16, dstrd: u8) -> Self {
        MappedPage { page: None, seen: vec![[0; 2]; max_qid as usize + 1], dstrd }
    }

    /// Uses `page` (or stops using one); every slot's last value is forgotten.
    pub fn set(&mut self, page: Option<GuestMemory>) {
        self.page = page;
        self.seen.iter_mut().for_each(|s| *s = [0; 2]);
    }

    #[inline]
    pub fn is_mapped(&self) -> bool {
        self.page.is_some()
    }

    fn slot(&self, qid: u16, kind: DoorbellKind) -> u64 {
        offset::DOORBELL_BASE + doorbell_offset(qid, kind, self.dstrd)
    }

    /// The value the guest stored in queue `qid`'s `kind` slot, if it is not the one
    /// taken last.
    #[inline]
    pub fn take_new(&mut self, qid: u16, kind: DoorbellKind) -> Option<u32> {
        let page = self.page.as_ref()?;
        let v = page.load_u32(self.slot(qid, kind)).ok()?;
        let seen = self.seen.get_mut(qid as usize)?;
        if seen[kind as usize] == v {
            return None;
        }
        seen[kind as usize] = v;
        Some(v)
    }

    /// Zeroes a queue's slot (the queue was created, or the controller reset), so a
    /// value an earlier queue left is not read as new work.
    pub fn clear(&mut self, qid: u16, kind: DoorbellKind) {
        let slot = self.slot(qid, kind);
        if let Some(page) = &self.page {
            let _ = page.store_u32(slot, 0);
        }
        if let Some(s) = self.seen.get_mut(qid as usize) {
            s[kind as usize] = 0;
        }
    }

    /// The value taken last from a slot (saved with the queue's state).
    pub fn seen(&self, qid: u16, kind: DoorbellKind) -> u32 {
        self.seen.get(qid as usize).map_or(0, |s| s[kind as usize])
    }

    /// Restores [`Self::seen`] from a saved state.
    pub fn restore_seen(&mut self, qid: u16, kind: DoorbellKind, v: u32) {
        if let Some(s) = self.seen.get_mut(qid as usize) {
            s[kind as usize] = v;
        }
    }
}
