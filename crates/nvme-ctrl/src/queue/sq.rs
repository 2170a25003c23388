//! A submission queue: a ring of 64-byte entries the controller fetches from.

use guest_mem::{GuestMemory, MemError};
use nvme_spec::{Sqe, SQE_SIZE};

/// Controller-side state of one submission queue.
#[derive(Debug)]
pub struct SubmissionQueue {
    pub qid: u16,
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
}

impl SubmissionQueue {
    pub fn new(qid: u16, cqid: u16, base: u64, size: u32) -> Self {
        SubmissionQueue { qid, cqid, base, size, head: 0, tail: 0, in_flight: 0, rung: false }
    }

    pub fn is_empty(&self) -> bool {
        self.head == self.tail
    }

    /// Entries between head and tail.
    pub fn pending(&self) -> u32 {
        (self.tail + self.size - self.head) % self.size
    }

    /// Fetches the entry at head and advances head.
    pub fn fetch(&mut self, mem: &GuestMemory) -> Result<Sqe, MemError> {
        let sqe = mem.read_obj::<Sqe>(self.base + self.head as u64 * SQE_SIZE as u64)?;
        self.head = (self.head + 1) % self.size;
        Ok(sqe)
    }

    /// Bytes of guest memory the ring occupies.
    pub fn ring_len(&self) -> u64 {
        self.size as u64 * SQE_SIZE as u64
    }
}
