//! Format NVM (Base §5.1.10, NVM §4.2): switch a namespace between the 512 B and
//! 4 KiB LBA formats, optionally erasing user data.

use block_backend::Op;
use nvme_spec::admin::FormatNvm;
use nvme_spec::aer::{notice_info, AsyncEvent, EventType};
use nvme_spec::log::lid;
use nvme_spec::{Sqe, Status, NSID_ALL};
use tracing::info;

use super::{done, status, AdminDone};
use crate::controller::Controller;
use crate::error::{CmdResult, CommandError};
use crate::namespace::LBA_FORMATS;

impl Controller {
    pub(crate) fn format_nvm(&mut self, sqe: &Sqe) -> CmdResult<AdminDone> {
        let f = FormatNvm(sqe);
        let nsid = sqe.nsid.get();
        let targets = if nsid == NSID_ALL { self.namespaces.to_vec() } else { vec![self.active_ns(nsid)?] };
        if f.lbaf() as usize >= LBA_FORMATS.len() || f.mset() || f.pi() != 0 {
            // No metadata and no protection information formats exist.
            return status(Status::INVALID_FORMAT);
        }
        let erase = match f.ses() {
            0 => false,
            1 => true,
            _ => return Err(CommandError::InvalidField("cryptographic erase is not supported")),
        };
        let lba = 1u64 << LBA_FORMATS[f.lbaf() as usize];
        if targets.iter().any(|ns| !crate::controller::lba_fits(lba, &ns.info)) {
            // The backend cannot do blocks that small (or its size is not a multiple).
            return status(Status::INVALID_FORMAT);
        }
        let mem = self.engine.mem.clone();
        for ns in &targets {
            if erase {
                // In pieces the backend accepts (1 GiB when it names no limit).
                let max = if ns.info.write_zeroes_max > 0 { ns.info.write_zeroes_max } else { 1 << 30 };
                let mut off = 0;
                while off < ns.info.size {
                    let n = (ns.info.size - off).min(max);
                    self.admin.run_backend(ns, &mem, Op::WriteZeroes { deallocate: true }, off, n)?;
                    off += n;
                }
            }
            ns.set_lba_format(f.lbaf());
            self.events.namespace_changed(ns.nsid);
            info!(nsid = ns.nsid, lba_size = 1u32 << ns.lba_shift(), erase, "namespace formatted");
        }
        if self.admin.features.aec.ns_attribute_notices() {
            self.events.raise(AsyncEvent {
                kind: EventType::Notice,
                info: notice_info::NAMESPACE_ATTRIBUTE_CHANGED,
                log_page: lid::CHANGED_NAMESPACE_LIST,
            });
        }
        done()
    }
}
