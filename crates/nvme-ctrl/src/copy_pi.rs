//! Copy with protection information (NVM §3.3.1; descriptor format 0h on a
//! namespace whose PI has the 16-bit guard, 1h on one with the 64-bit guard): each source range's blocks are checked as PRINFOR asks,
//! against the range entry's tags, once its data is read; its destination's
//! protection information is then generated (PRACT, set in both PRINFOR and
//! PRINFOW: stripped from the source, inserted at the destination) or carried from
//! the source and checked as PRINFOW asks against the command's tags (PRACT clear
//! in both), and stored before the destination's data is written.

use std::sync::Arc;

use nvme_spec::pi::{prinfo, PiError, PiLayout, PiTags};
use nvme_spec::Status;

use crate::metadata::Complemented;
use crate::namespace::Namespace;

/// What one Copy asks of the protection information, held by its job.
#[derive(Debug)]
pub(crate) struct CopyProtection {
    /// Its namespace (the metadata store).
    pub ns: Arc<Namespace>,
    pub layout: PiLayout,
    /// Bytes of data per block.
    pub block: usize,
    /// PRINFOR: which checks the source blocks get.
    pub read_checks: u8,
    /// PRINFOW: generate the destination's PI, and which checks it gets if not.
    pub write_pract: bool,
    pub write_checks: u8,
    /// Each source range's tags (its entry's EILBRT, ELBAT, ELBATM) and first LBA.
    pub sources: Vec<(u64, PiTags)>,
    /// The destination's tags (CDW14 ILBRT, CDW15 LBAT and LBATM) and first LBA.
    pub dest: (u64, PiTags),
}

impl CopyProtection {
    /// PRINFOR and PRINFOW from a Copy's combined field (`Copy::prinfo`).
    pub fn fields(prinfo_rw: u8) -> (u8, u8) {
        (prinfo_rw & 0xf, prinfo_rw >> 4)
    }

    /// Range `r`'s blocks, read into `data`, going to `to_lba`: checks the source,
    /// then stores the destination's metadata. An error is the status the Copy ends
    /// with (End-to-end ... Check Error, or an internal error of the store).
    pub fn range(&self, r: usize, data: &[u8], to_lba: u64) -> Result<(), Status> {
        let l = self.layout;
        let store = self.ns.meta.as_ref().ok_or(Status::INTERNAL_ERROR)?;
        let flip = Some(Complemented::of(l));
        let (slba, tags) = self.sources[r];
        let nlb = data.len() / self.block;
        let mut meta = vec![0u8; nlb * l.ms];
        let io = |_| Status::INTERNAL_ERROR;
        store.read(slba * l.ms as u64, &mut meta, flip).map_err(io)?;
        let (dest_lba, dest_tags) = self.dest;
        // Block i of this range is block `first + i` of the destination.
        let first = (to_lba - dest_lba) as u32;
        for (i, (d, m)) in data.chunks(self.block).zip(meta.chunks_mut(l.ms)).enumerate() {
            let crc = l.data_crc(d);
            let i = i as u32;
            l.check(self.read_checks, crc, m, tags, i).map_err(PiError::status)?;
            if self.write_pract {
                l.generate(crc, dest_tags, first + i, m);
            } else {
                l.check(self.write_checks, crc, m, dest_tags, first + i).map_err(PiError::status)?;
            }
        }
        store.write(to_lba * l.ms as u64, &meta, flip).map_err(io)
    }
}

/// Type 1's reference tag is the LBA's low 32 (48) bits: a check of it against a
/// different initial tag is refused before anything moves (as Read and Write do).
pub(crate) fn initial_ref_fits(l: PiLayout, checks: u8, first_lba: u64, tags: PiTags) -> bool {
    !(l.ty == nvme_spec::pi::PiType::Type1
        && checks & prinfo::PRCHK_REF != 0
        && tags.ref_tag != l.lba_ref_tag(first_lba))
}
