//! Asynchronous Event Request (Base §5.1.2) and Abort (Base §5.1.1).

use nvme_spec::admin::Abort;
use nvme_spec::{Sqe, Status};

use super::{status, Admin, AdminDone};
use crate::error::CmdResult;

impl Admin<'_> {
    pub(crate) fn async_event_request(&mut self, sqe: &Sqe) -> CmdResult<AdminDone> {
        if self.admin.aers.len() > self.cfg.aerl_z as usize {
            return status(Status::AER_LIMIT_EXCEEDED);
        }
        self.admin.aers.push(sqe.cid());
        Ok(AdminDone::Deferred)
    }

    /// Completes outstanding Asynchronous Event Requests with queued events.
    pub(crate) fn deliver_events(&mut self) -> bool {
        let mut any = false;
        while !self.admin.aers.is_empty() {
            let Some(ev) = self.events.take_deliverable() else { break };
            let cid = self.admin.aers.remove(0);
            self.engine.complete_deferred(0, cid, Status::SUCCESS, ev.dw0());
            any = true;
        }
        any
    }

    /// Abort is best effort (Base §5.1.1): commands here either have not been fetched
    /// (the host can see that) or are already with a backend that cannot cancel, so the
    /// answer is always "not aborted" (dword 0 bit 0 set). Only one Abort is ever
    /// outstanding, so the Abort Command Limit is never exceeded.
    pub(crate) fn abort(&mut self, sqe: &Sqe) -> CmdResult<AdminDone> {
        let a = Abort(sqe);
        tracing::debug!(sqid = a.sqid(), cid = a.cid(), "abort requested: not aborted");
        Ok(AdminDone::Complete(1))
    }
}
