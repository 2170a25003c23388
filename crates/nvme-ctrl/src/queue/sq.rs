//! A submission queue: a ring of 64-byte entries the controller fetches from.

use guest_mem::{GuestMemory, MemError};
use nvme_spec::{Sqe, SQE_SIZE};

use crate::doorbell::SqArm;

/// Controller-side state of one submission queue.
#[derive(Debug)]
pub struct SubmissionQueue {
    pub cqid: u16,
    /// Guest address of entry 0.
    pub base: u64,
    /// Number of entries (not 0's based).
    pub size: u32,
    /// Next entry the controller fetches.
    pub head: u32,
    /// Latest tail the host gave us.
    pub tail: u32,
    /// Commands fetched and not yet completed.
    pub in_flight: u32,
    /// The host has written this queue's tail doorbell register at least once.
    pub rung: bool,
    /// An invalid shadow tail already reported, so a value the host leaves in place
    /// raises one event, not one per poll.
    pub reported_bad_tail: Option<u32>,
    /// The SQ EventIdx value this controller last published (shadow doorbells).
    pub arm: SqArm,
}

impl SubmissionQueue {
    pub fn new(cqid: u16, base: u64, size: u32) -> Self {
        SubmissionQueue {
            cqid,
            base,
            size,
            head: 0,
            tail: 0,
            in_flight: 0,
            rung: false,
            reported_bad_tail: None,
            arm: SqArm::default(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.head == self.tail
    }

    /// Entries between head and tail.
    pub fn pending(&self) -> u32 {
        (self.tail + self.size - self.head) % self.size
    }

    /// Whether the host may move the tail to `new_tail`: inside the ring, and adding
    /// no more entries than there are free slots (Base 2.1, Asynchronous Event
    /// Information – Error Status, Invalid Doorbell Write Value: "attempted to add a
    /// command to a full Submission Queue"). A tail equal to the current one adds
    /// nothing and is valid.
    pub fn valid_tail(&self, new_tail: u32) -> bool {
        let free = self.size - 1 - self.pending();
        new_tail < self.size && (new_tail + self.size - self.tail) % self.size <= free
    }

    /// Fetches the entry at head into `sqe` and advances head.
    #[inline]
    pub fn fetch_into(&mut self, mem: &GuestMemory, sqe: &mut Sqe) -> Result<(), MemError> {
        mem.read_small_into(self.base + self.head as u64 * SQE_SIZE as u64, sqe)?;
        self.head += 1;
        if self.head == self.size {
            self.head = 0;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_may_add_at_most_the_free_slots() {
        let mut sq = SubmissionQueue::new(1, 0, 16);
        assert!(sq.valid_tail(0) && sq.valid_tail(15));
        assert!(!sq.valid_tail(16));
        sq.tail = 5;
        // 5 pending, 10 free: up to tail 15, and not round to 0 (16 pending).
        assert!(sq.valid_tail(5) && sq.valid_tail(15));
        assert!(!sq.valid_tail(0) && !sq.valid_tail(4));
        sq.head = 3;
        assert!(sq.valid_tail(0) && sq.valid_tail(2));
        assert!(!sq.valid_tail(3) && !sq.valid_tail(4));
        sq.head = 5;
        assert!(sq.valid_tail(4) && !sq.valid_tail(5 + 16));
    }
}
