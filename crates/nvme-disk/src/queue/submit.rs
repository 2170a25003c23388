//! Sending a request downstream: the checks made before anything goes down, the split
//! into commands at the downstream limits (MDTS, WZSL, DMRSL, the NLB field), each
//! command's data either zero copy (PRPs into the front's guest memory) or through a
//! bounce buffer, and the in-order backlog of pieces waiting for a free slot.

use block_backend::{BackendError, DataBuf, Op, Request, Segment, SegmentCursor};
use nvme_driver::{prp, DriverError};
use nvme_spec::nvm::{DatasetManagementCmd, DsmRange, FlushCmd, ReadWriteCmd, WriteZeroesCmd};
use nvme_spec::opcode::nvm as op;
use zerocopy::IntoBytes;

use super::{NvmeQueue, Piece, Step};
use crate::bounce::stage_in;
use crate::error::{driver_failed, invalid};
use crate::stats::bump;

/// NLB, 0's based, of a chunk of `blocks` (1..=65536: `max_rw` and `max_wz` say so).
fn nlb_z(blocks: u64) -> u16 {
    debug_assert!((1..=65536).contains(&blocks));
    (blocks - 1) as u16
}

impl NvmeQueue {
    /// Checks a request before anything goes downstream.
    pub(super) fn check(&self, req: &Request) -> Result<(), BackendError> {
        let lba = self.shared.sizes.lba;
        if req.op != Op::Flush && (!req.offset.is_multiple_of(lba) || !req.len.is_multiple_of(lba)) {
            return Err(invalid(format!(
                "range {:#x}+{:#x} is not in whole {lba}-byte blocks of the downstream namespace",
                req.offset, req.len
            )));
        }
        if matches!(req.op, Op::Read | Op::Write { .. }) {
            let write = req.op != Op::Read;
            match &req.data {
                DataBuf::None | DataBuf::Within(_) => {
                    return Err(invalid("a read or write without a buffer".into()))
                }
                DataBuf::Host(v) if (v.len() as u64) < req.len => {
                    return Err(invalid(format!("{}-byte buffer for {} bytes", v.len(), req.len)))
                }
                DataBuf::Host(_) => {}
                DataBuf::Guest(segs) => {
                    if segs.iter().map(Segment::len).sum::<u64>() != req.len {
                        return Err(invalid("segment lengths do not add up to the request".into()));
                    }
                    if write && segs.iter().any(|s| matches!(s, Segment::Discard { .. })) {
                        return Err(invalid("a bit bucket in a write".into()));
                    }
                }
            }
        }
        Ok(())
    }

    /// Sends the next piece of request `r` downstream.
    fn send_piece(&mut self, r: usize) -> Step {
        if self.pieces_in_flight >= self.pieces.len() {
            return Step::Blocked;
        }
        let sh = &*self.shared;
        let lba = sh.sizes.lba;
        let req = self.reqs.get(r).expect("live request");
        let (off, seg) = (req.wire.next, req.wire.seg);
        let mut view = None;
        let mut copy_back = false;
        let (sqe, data, aux, n) = match req.op {
            Op::Flush => (FlushCmd { nsid: sh.nsid }.to_sqe(), None, None, 1),
            // Not offered (BackendInfo::copy is false).
            Op::Copy { .. } => return Step::Failed(block_backend::BackendError::Unsupported),
            Op::WriteZeroes { deallocate } => {
                let n = (req.len - off).min(sh.sizes.max_wz * lba);
                let slba = (req.offset + off) / lba;
                let wz = WriteZeroesCmd {
                    nsid: sh.nsid,
                    slba,
                    nlb_z: nlb_z(n / lba),
                    deac: deallocate,
                    fua: false,
                };
                (wz.to_sqe(), None, None, n)
            }
            Op::Discard => {
                let n = (req.len - off).min(sh.sizes.max_dsm * lba);
                let range = DsmRange::new((req.offset + off) / lba, (n / lba) as u32);
                let list = match self.q.as_ref().expect("queue").alloc_buf(16) {
                    Ok(b) => b,
                    Err(e) => return self.no_buffer(e),
                };
                if let Err(e) = list.write_at(0, range.as_bytes()) {
                    return Step::Failed(e.into());
                }
                let mut s =
                    DatasetManagementCmd { nsid: sh.nsid, nr_z: 0, ad: true, ..Default::default() }.to_sqe();
                s.set_prps(list.iova(), 0);
                (s, None, Some(list), n)
            }
            Op::Read | Op::Write { .. } => {
                let n = (req.len - off).min(sh.sizes.max_rw);
                let (opcode, fua) = match req.op {
                    Op::Write { fua } => (op::WRITE, fua),
                    _ => (op::READ, false),
                };
                let rw = ReadWriteCmd {
                    nsid: sh.nsid,
                    slba: (req.offset + off) / lba,
                    nlb_z: nlb_z(n / lba),
                    fua,
                    lr: false,
                };
                let mut sqe = rw.to_sqe(opcode);
                let pool = self.q.as_ref().expect("queue").pool().clone();
                // Zero copy when every byte is in shared memory and fits PRP rules.
                if let (DataBuf::Guest(segs), Some(mem)) = (req.data(), req.mem()) {
                    if self.view.as_ref().is_none_or(|v| !v.mem.same_map(mem)) {
                        self.view = Some(sh.maps.view_for(mem));
                    }
                    let v = self.view.as_ref().expect("just set");
                    if v.device_ranges(segs, seg, n, &mut self.segs) && prp::segments_fit(&self.segs) {
                        view = Some(v.clone());
                    }
                }
                if view.is_some() {
                    let p = match prp::build_segments(&pool, &self.segs) {
                        Ok(p) => p,
                        Err(e) => return self.no_buffer(e),
                    };
                    sqe.set_prps(p.prp1, p.prp2);
                    (sqe, None, p.list, n)
                } else {
                    let buf = match pool.alloc(n) {
                        Ok(b) => b,
                        Err(e) => return self.no_buffer(e),
                    };
                    if opcode == op::WRITE {
                        if let Err(e) = stage_in(req, off, seg, &buf, &mut self.scratch) {
                            return Step::Failed(e);
                        }
                    } else {
                        copy_back = true;
                    }
                    let p = match prp::build(&pool, buf.iova(), n) {
                        Ok(p) => p,
                        Err(e) => return self.no_buffer(e),
                    };
                    sqe.set_prps(p.prp1, p.prp2);
                    (sqe, Some(buf), p.list, n)
                }
            }
        };
        let cid = match self.q.as_mut().expect("queue").submit_sqe(sqe, data, aux) {
            Ok(cid) => cid,
            Err(DriverError::QueueFull(_)) => return Step::Blocked,
            Err(e) => return Step::Failed(driver_failed(e)),
        };
        let req = self.reqs.get_mut(r).expect("live request");
        let next_seg = match req.data() {
            DataBuf::Guest(segs) if n > 0 && matches!(req.op, Op::Read | Op::Write { .. }) => {
                let mut cur = SegmentCursor::resume(segs, seg);
                cur.advance(n).map(|()| cur.mark())
            }
            _ => Ok(seg),
        };
        req.wire.next += n;
        match next_seg {
            Ok(m) => req.wire.seg = m,
            // `check` made the segments add up to the request, so they cannot end
            // first; if they did, the request fails rather than send the wrong bytes.
            Err(e) => {
                req.fail(e.into());
                req.wire.next = req.wire.end;
            }
        }
        let zero_copy = view.is_some();
        req.sent(zero_copy);
        req.wire.pieces += 1;
        let rw = matches!(req.op, Op::Read | Op::Write { .. });
        self.pieces[cid as usize] = Some(Piece { req: r, off, len: n, seg, copy_back, _view: view });
        self.pieces_in_flight += 1;
        let st = &sh.stats;
        bump(&st.commands, 1);
        if zero_copy {
            bump(&st.zero_copy_bytes, n);
            bump(&st.zero_copy_commands, 1);
        } else if rw {
            bump(&st.bounce_bytes, n);
            bump(&st.bounce_commands, 1);
        }
        Step::Sent
    }

    /// A DMA buffer could not be had: wait for completions to free one, unless none
    /// are coming.
    fn no_buffer(&self, e: DriverError) -> Step {
        match e {
            DriverError::PoolExhausted(_) if self.pieces_in_flight > 0 => Step::Blocked,
            e => Step::Failed(driver_failed(e)),
        }
    }

    /// Sends pieces of request `r` until it is all sent or something blocks.
    pub(super) fn drive(&mut self, r: usize) -> bool {
        loop {
            match self.reqs.get(r) {
                Some(req) if req.wire.next < req.wire.end && !req.revoked() => {}
                _ => return true,
            }
            match self.send_piece(r) {
                Step::Sent => {}
                Step::Blocked => return false,
                Step::Failed(e) => {
                    self.fail_req(r, e);
                    return true;
                }
            }
        }
    }

    /// Sends backlogged pieces in order while there is room.
    pub(super) fn pump(&mut self) {
        while let Some(&r) = self.backlog.front() {
            if !self.drive(r) {
                return;
            }
            self.backlog.pop_front();
        }
    }

    pub(super) fn ring(&mut self) {
        if let Err(e) = self.q().ring_sq() {
            self.transport_failed(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use block_backend::{Segment, SegmentCursor};

    #[test]
    fn seg_cursor_walks_segments() {
        let segs = [
            Segment::Guest { gpa: 0x1000, len: 0x200 },
            Segment::Discard { len: 0x100 },
            Segment::Guest { gpa: 0x9000, len: 0x1000 },
        ];
        // A piece's mark, kept across pieces, resumes where the last piece ended.
        let mut c = SegmentCursor::new(&segs);
        c.advance(0x250).unwrap();
        let mark = c.mark();
        let mut c = SegmentCursor::resume(&segs, mark);
        assert_eq!(c.offset(), 0x250);
        c.advance(0xb0).unwrap();
        assert_eq!(c.pieces(1).next(), Some((0x300, Segment::Guest { gpa: 0x9000, len: 1 })));
        // Empty segments are stepped over.
        let holes = [
            Segment::Guest { gpa: 0, len: 0 },
            Segment::Guest { gpa: 0x1000, len: 0x10 },
            Segment::Discard { len: 0 },
        ];
        let n: u64 = SegmentCursor::new(&holes).pieces(0x10).map(|(_, p)| p.len()).sum();
        assert_eq!(n, 0x10);
        let mut end = SegmentCursor::new(&holes);
        end.advance(0x10).unwrap();
        assert!(end.advance(1).is_err(), "nothing past the end");
        let mut c = SegmentCursor::new(&segs);
        c.advance(0x100).unwrap();
        let seen: Vec<_> = c.pieces(0x300).collect();
        assert_eq!(
            seen,
            vec![
                (0x100, Segment::Guest { gpa: 0x1100, len: 0x100 }),
                (0x200, Segment::Discard { len: 0x100 }),
                (0x300, Segment::Guest { gpa: 0x9000, len: 0x100 }),
            ]
        );
    }
}
