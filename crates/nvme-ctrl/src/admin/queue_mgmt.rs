//! Create and Delete I/O Submission and Completion Queues (Base §5.2.1 - §5.2.4)
//! with every check the spec names for them.

use nvme_spec::admin::{CreateIoCq, CreateIoSq, DeleteIoQueue};
use nvme_spec::{Sqe, Status};
use tracing::debug;

use super::{done, status, Admin, AdminDone};
use crate::error::{CmdResult, CommandError};
use crate::queue::CompletionQueue;

impl Admin<'_> {
    /// An I/O queue identifier the controller can allocate: 1..=max, within the number
    /// of queues granted by Set Features (Number of Queues).
    fn io_qid_ok(&self, qid: u16, granted_z: u16) -> bool {
        qid != 0 && qid <= self.cfg.max_io_queues && qid - 1 <= granted_z
    }

    /// Checks a queue's size and base address common to both creates.
    fn check_queue_memory(&self, qsize_z: u16, pc: bool, base: u64, entry: u64) -> CmdResult {
        if qsize_z == 0 || qsize_z > self.cap().mqes_z() {
            return status(Status::INVALID_QUEUE_SIZE);
        }
        if !pc {
            // CAP.CQR = 1: only physically contiguous queues are supported.
            return Err(CommandError::InvalidField("PC = 0 but CAP.CQR requires contiguous queues"));
        }
        if !base.is_multiple_of(self.page_size()) {
            return status(Status::PRP_OFFSET_INVALID);
        }
        let len = (qsize_z as u64 + 1) * entry;
        if self.engine.io.mem.check_range(base, len).is_err() {
            return Err(CommandError::InvalidField("queue memory is not in guest memory"));
        }
        Ok(())
    }

    pub(crate) fn create_io_cq(&mut self, sqe: &Sqe) -> CmdResult<AdminDone> {
        let c = CreateIoCq(sqe);
        let qid = c.qid();
        if !self.io_qid_ok(qid, self.admin.features.ncq_granted_z) || self.runtime.cq_exists(qid) {
            return status(Status::INVALID_QUEUE_IDENTIFIER);
        }
        self.check_queue_memory(c.qsize_z(), c.pc(), c.base(), nvme_spec::CQE_SIZE as u64)?;
        if c.ien() && c.iv() >= self.cfg.msix_vectors {
            return status(Status::INVALID_INTERRUPT_VECTOR);
        }
        let cq = CompletionQueue::new(c.base(), c.qsize_z() as u32 + 1, c.ien(), c.iv());
        self.runtime.create_cq(self.engine, qid, cq);
        self.admin.io_queues_created = true;
        debug!(qid, size = c.qsize_z() as u32 + 1, iv = c.iv(), ien = c.ien(), "created I/O CQ");
        done()
    }

    pub(crate) fn create_io_sq(&mut self, sqe: &Sqe) -> CmdResult<AdminDone> {
        let c = CreateIoSq(sqe);
        let qid = c.qid();
        if !self.io_qid_ok(qid, self.admin.features.nsq_granted_z) || self.runtime.sq_exists(qid) {
            return status(Status::INVALID_QUEUE_IDENTIFIER);
        }
        // Base 2.1 Create I/O Submission Queue, CQID: 0h (the admin CQ) or outside
        // the range the controller granted is Invalid Queue Identifier; a CQ in
        // range that was not created, Completion Queue Invalid.
        let cqid = c.cqid();
        if !self.io_qid_ok(cqid, self.admin.features.ncq_granted_z) {
            return status(Status::INVALID_QUEUE_IDENTIFIER);
        }
        if !self.runtime.cq_exists(cqid) {
            return status(Status::COMPLETION_QUEUE_INVALID);
        }
        self.check_queue_memory(c.qsize_z(), c.pc(), c.base(), nvme_spec::SQE_SIZE as u64)?;
        if c.nvmsetid() != 0 {
            return Err(CommandError::InvalidField("NVM Sets are not supported"));
        }
        self.runtime.create_sq(self.engine, qid, cqid, c.base(), c.qsize_z() as u32 + 1);
        self.admin.io_queues_created = true;
        debug!(qid, cqid, size = c.qsize_z() as u32 + 1, "created I/O SQ");
        done()
    }

    pub(crate) fn delete_io_sq(&mut self, sqe: &Sqe) -> CmdResult<AdminDone> {
        let qid = DeleteIoQueue(sqe).qid();
        if qid == 0 || !self.runtime.sq_exists(qid) {
            return status(Status::INVALID_QUEUE_IDENTIFIER);
        }
        self.runtime.delete_sq(self.engine, qid);
        debug!(qid, "deleted I/O SQ");
        done()
    }

    pub(crate) fn delete_io_cq(&mut self, sqe: &Sqe) -> CmdResult<AdminDone> {
        let qid = DeleteIoQueue(sqe).qid();
        if qid == 0 || !self.runtime.cq_exists(qid) {
            return status(Status::INVALID_QUEUE_IDENTIFIER);
        }
        if self.runtime.cq_users(qid) > 0 {
            return status(Status::INVALID_QUEUE_DELETION);
        }
        self.runtime.delete_cq(self.engine, qid);
        debug!(qid, "deleted I/O CQ");
        done()
    }
}
