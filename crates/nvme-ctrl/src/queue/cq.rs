//! A completion queue: a ring of 16-byte entries the controller posts to, with the
//! phase tag flipping on every wrap (Base §4.2.4, §4.6? "Completion Queue Entry").

use std::collections::VecDeque;

use guest_mem::{GuestMemory, MemError};
use nvme_spec::{Cqe, CQE_SIZE};
use zerocopy::IntoBytes;

/// Controller-side state of one completion queue.
#[derive(Debug)]
pub struct CompletionQueue {
    pub base: u64,
    /// Number of entries (not 0's based).
    pub size: u32,
    /// Oldest entry the host has not consumed, as far as we know.
    pub head: u32,
    /// Next entry the controller writes.
    pub tail: u32,
    /// Phase tag of the entries being written in this lap.
    pub phase: bool,
    /// How it interrupts.
    pub irq: CqIrq,
    /// Completions waiting for room, in order.
    pub overflow: VecDeque<Cqe>,
    /// Entries posted since the last interrupt decision.
    pub unsignalled: u32,
    /// The controller asked for a CQ head doorbell (EventIdx armed) because it is full.
    pub waiting_for_space: bool,
    /// An invalid shadow head already reported (one event per bad value, not per poll).
    pub reported_bad_head: Option<u32>,
}

/// How a completion queue interrupts: whether at all (Interrupts Enabled), and on
/// which vector (kept either way: a saved state has it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqIrq {
    pub ien: bool,
    pub iv: u16,
}

impl CompletionQueue {
    pub fn new(base: u64, size: u32, ien: bool, iv: u16) -> Self {
        CompletionQueue {
            base,
            size,
            head: 0,
            tail: 0,
            phase: true,
            irq: CqIrq { ien, iv },
            overflow: VecDeque::new(),
            unsignalled: 0,
            waiting_for_space: false,
            reported_bad_head: None,
        }
    }

    pub fn is_full(&self) -> bool {
        // (tail + 1) % size == head, without a division on every completion.
        let next = self.tail + 1;
        if next == self.size {
            self.head == 0
        } else {
            next == self.head
        }
    }

    /// Entries posted and not yet consumed by the host.
    pub fn used(&self) -> u32 {
        (self.tail + self.size - self.head) % self.size
    }

    /// Whether `new_head` is a head the host may legally report: it must lie between
    /// the current head and the tail (it cannot consume what was never posted).
    pub fn valid_head(&self, new_head: u32) -> bool {
        new_head < self.size && (new_head + self.size - self.head) % self.size <= self.used()
    }

    /// Writes one entry at tail: dwords 0-2, then a release fence, then dword 3 with
    /// the phase tag, so a host polling the phase never sees a half-written entry.
    /// The caller checks for room first.
    #[inline]
    pub fn post(&mut self, mem: &GuestMemory, mut cqe: Cqe) -> Result<(), MemError> {
        debug_assert!(!self.is_full());
        let status = (cqe.status.get() & !1) | self.phase as u16;
        cqe.status.set(status);
        let addr = self.base + self.tail as u64 * CQE_SIZE as u64;
        let bytes = cqe.as_bytes();
        let mut head = [0u8; 12];
        head.copy_from_slice(&bytes[..12]);
        // The release store of dword 3 pairs with the host's read barrier after it
        // sees the new phase tag.
        mem.write_then_publish_u32(addr, &head, cqe.dw3())?;
        self.tail += 1;
        if self.tail == self.size {
            self.tail = 0;
            self.phase = !self.phase;
        }
        self.unsignalled += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvme_spec::Status;
    use zerocopy::little_endian::U16;

    #[test]
    fn phase_flips_on_wrap_and_head_validation() {
        let mem = GuestMemory::anonymous(&[(0, 0x1000)]).unwrap();
        let mut cq = CompletionQueue::new(0, 3, true, 1);
        let mk = |cid| Cqe { cid: U16::new(cid), ..Default::default() };
        cq.post(&mem, mk(1)).unwrap();
        cq.post(&mem, mk(2)).unwrap();
        assert!(cq.is_full());
        assert!(cq.valid_head(2) && cq.valid_head(1) && cq.valid_head(0));
        cq.head = 2;
        assert!(!cq.valid_head(1), "head cannot move backwards past tail");
        cq.post(&mem, mk(3)).unwrap();
        assert_eq!(cq.tail, 0);
        assert!(!cq.phase);
        let e: Cqe = mem.read_obj(2 * 16).unwrap();
        assert!(e.phase());
        assert_eq!(e.cid.get(), 3);
        assert_eq!(e.status(), Status::SUCCESS);
        cq.post(&mem, mk(4)).unwrap();
        let e: Cqe = mem.read_obj(0).unwrap();
        assert!(!e.phase(), "second lap carries phase 0");
    }
}
