//! Dataset Management (NVM §3.2.3): only the Deallocate attribute has an effect; the
//! others are hints the controller may ignore.

use block_backend::Op;
use nvme_spec::nvm::{DatasetManagement, DsmRange};
use nvme_spec::Sqe;
use zerocopy::FromBytes;

use super::Started;
use crate::engine::{Finish, InFlight, Io};
use crate::error::{CmdResult, CommandError};

impl Io {
    pub(crate) fn dataset_management(&mut self, sqid: u16, sqe: &Sqe) -> CmdResult<Started> {
        let ns = self.namespace(sqe.nsid.get())?;
        let dsm = DatasetManagement(sqe);
        let n = dsm.ranges();
        let len = (n * size_of::<DsmRange>()) as u64;
        let raw = self.read_command_data(sqe, len)?;
        let ranges = <[DsmRange]>::ref_from_bytes(&raw).expect("length is a multiple of 16");
        let nsze = ns.nsze();
        for r in ranges {
            let (slba, nlb) = (r.slba.get(), r.nlb.get() as u64);
            if slba.checked_add(nlb).is_none_or(|end| end > nsze) {
                return Err(CommandError::LbaOutOfRange { slba, nlb });
            }
        }
        let work: Vec<(u64, u64)> = if dsm.ad() && ns.info.discard {
            let shift = ns.lba_shift();
            ranges
                .iter()
                .filter(|r| r.nlb.get() > 0)
                .map(|r| (r.slba.get() << shift, (r.nlb.get() as u64) << shift))
                .collect()
        } else {
            Vec::new()
        };
        // Deallocated blocks' metadata reads as never written (unchecked) from now.
        let ms = ns.meta_size() as u64;
        if let Some(store) = ns.meta.as_ref().filter(|_| ms > 0 && !work.is_empty()) {
            for r in ranges.iter().filter(|r| r.nlb.get() > 0) {
                let cleared = store.clear(r.slba.get() * ms, r.nlb.get() as u64 * ms);
                cleared.map_err(|e| CommandError::Backend { write: true, source: e.into() })?;
            }
        }
        let f = InFlight::new(sqid, sqe, ranges[0].slba.get(), Op::Discard, Finish::Plain);
        Ok(self.submit_ranges(f, &ns, &work))
    }
}
