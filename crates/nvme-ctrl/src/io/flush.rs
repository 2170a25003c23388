//! Flush (NVM §3.2.4): make every completed write durable. NSID FFFFFFFFh flushes
//! every namespace (Identify VWC reports broadcast support).

use block_backend::{DataBuf, Op, Request};
use nvme_spec::{Sqe, Status, NSID_ALL};

use super::Started;
use crate::engine::{Finish, InFlight, Io};
use crate::error::CmdResult;

impl Io {
    pub(crate) fn flush(&mut self, sqid: u16, sqe: &Sqe) -> CmdResult<Started> {
        let nsid = sqe.nsid.get();
        let targets: Vec<u32> = if nsid == NSID_ALL {
            // Those this controller reaches now (crate::ana).
            crate::namespace::active(&self.ctx.namespaces)
                .filter(|n| n.ana_group().refusal().is_none())
                .map(|n| n.nsid)
                .collect()
        } else {
            vec![self.namespace(nsid)?.nsid]
        };
        // A zoned namespace's zone state file, and a namespace's metadata file, are
        // made durable with its data (the data's flush is the backend's, below).
        for &n in &targets {
            if let Some(Err(e)) = self.with_namespace(n, |ns| ns.zones.as_ref().map(|z| z.sync()))? {
                tracing::warn!(nsid = n, "cannot make the zone state file durable: {e}");
                return Ok(Started::Done(Status::WRITE_FAULT));
            }
            if let Some(Err(e)) = self.with_namespace(n, |ns| ns.meta.as_ref().map(|m| m.sync()))? {
                log_limit::limited_warn!(target: "vnvme::backend", nsid = n, "cannot make the metadata file durable: {e}");
                return Ok(Started::Done(Status::WRITE_FAULT));
            }
        }
        if targets.is_empty() {
            return Ok(Started::Done(Status::SUCCESS));
        }
        let mut f = InFlight::new(sqid, sqe, 0, Op::Flush, Finish::Plain);
        f.remaining = targets.len() as u32;
        let tag = self.track(f);
        for n in targets {
            let req = Request { tag, op: Op::Flush, offset: 0, len: 0, data: DataBuf::None };
            self.backend_submit(n, req);
        }
        Ok(Started::Pending)
    }
}
