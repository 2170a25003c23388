//! Turning a [`Request`] into a [`Run`]: which descriptor takes it (the direct one,
//! or the buffered one when its offset or length is misaligned), which fallocate
//! mode or discard command serves Discard and Write Zeroes, and whether a transfer
//! goes zero copy into the request's own buffers or through a bounce buffer (filled
//! and emptied by the in-flight core, over `SegmentCursor`).

use std::io;
use std::sync::atomic::Ordering;

use guest_mem::GuestMemory;

use super::buf::{fill_zero_iov, push_repeated, AlignedBuf, IoVec};
use super::limits::{FD_BUFFERED, FD_MAIN, IOV_MAX, TRASH_CHUNK, ZERO_CHUNK};
use super::queue::UringQueue;
use super::request::{Run, Step};
use crate::{check_range, BackendError, DataBuf, Op, Request, Segment};

fn removed_error() -> BackendError {
    BackendError::NotReady("backend file was removed".into())
}

fn invalid(msg: String) -> BackendError {
    BackendError::Io(io::Error::new(io::ErrorKind::InvalidInput, msg))
}

impl UringQueue {
    /// True if the direct descriptor can take a transfer at `offset` of `len` bytes.
    fn direct_ok(&self, offset: u64, len: u64) -> bool {
        !self.sh.layout.direct
            || (offset.is_multiple_of(self.sh.layout.off_align)
                && len.is_multiple_of(self.sh.layout.off_align))
    }

    /// Turns a request into a run (`None`: it is already done), and its vectors into
    /// `self.iov` (cleared by the caller). A bounced write's data is gathered once the
    /// request has its slot.
    pub(super) fn plan(&mut self, mem: &GuestMemory, req: &mut Request) -> Result<Option<Run>, BackendError> {
        if self.sh.removed.load(Ordering::Relaxed) {
            return Err(removed_error());
        }
        let (offset, len) = (req.offset, req.len);
        let new = Run::new;
        let fallocate = |mode, offset, len| Step::Fallocate { mode, offset, len, optional: false };
        let keep = libc::FALLOC_FL_KEEP_SIZE;
        let punch = libc::FALLOC_FL_PUNCH_HOLE | keep;
        let zero_range = libc::FALLOC_FL_ZERO_RANGE | keep;
        match req.op {
            Op::Flush => {
                if self.check_removed() {
                    return Err(removed_error());
                }
                Ok(Some(new(Step::Fsync)))
            }
            Op::Read | Op::Write { .. } => {
                check_range(offset, len, self.sh.size())?;
                if req.op != Op::Read && self.sh.layout.read_only {
                    return Err(BackendError::ReadOnly);
                }
                if len == 0 {
                    return Ok(None);
                }
                self.plan_rw(mem, req).map(Some)
            }
            Op::Copy { fua } => {
                let DataBuf::Within(src) = req.data else { return Err(BackendError::Unsupported) };
                check_range(offset, len, self.sh.size())?;
                check_range(src, len, self.sh.size())?;
                if self.sh.layout.read_only || !self.sh.info.copy {
                    return Err(if self.sh.layout.read_only {
                        BackendError::ReadOnly
                    } else {
                        BackendError::Unsupported
                    });
                }
                // In place, through the page cache (the kernel writes back what the
                // direct descriptor then reads).
                let f = self.sh.buffered.as_ref().unwrap_or(&self.sh.file);
                crate::copy_within(f, src, offset, len)?;
                if fua {
                    f.sync_data()?;
                    self.sh.synced.fsyncs.fetch_add(1, Ordering::Relaxed);
                }
                Ok(None)
            }
            Op::Discard => {
                check_range(offset, len, self.sh.size())?;
                if self.sh.layout.read_only {
                    return Err(BackendError::ReadOnly);
                }
                if !self.sh.info.discard || len == 0 {
                    // Advisory, and not advertised: nothing to do.
                    return Ok(None);
                }
                if !self.sh.layout.block_dev {
                    return Ok(Some(new(fallocate(punch, offset, len))));
                }
                // A device discards whole logical blocks only: keep the ones inside.
                let start = offset.next_multiple_of(self.sh.layout.lbs);
                let end = (offset + len) / self.sh.layout.lbs * self.sh.layout.lbs;
                if start >= end {
                    return Ok(None);
                }
                let step = if self.sh.layout.caps.discard_cmd {
                    Step::DiscardCmd { offset: start, len: end - start }
                } else {
                    fallocate(punch, start, end - start)
                };
                Ok(Some(new(step)))
            }
            Op::WriteZeroes { deallocate } => {
                check_range(offset, len, self.sh.size())?;
                if self.sh.layout.read_only {
                    return Err(BackendError::ReadOnly);
                }
                if len == 0 {
                    return Ok(None);
                }
                let caps = self.sh.layout.caps;
                let mut next = None;
                let step = if self.sh.layout.block_dev {
                    let whole =
                        offset.is_multiple_of(self.sh.layout.lbs) && len.is_multiple_of(self.sh.layout.lbs);
                    if !whole || !caps.zero_range {
                        None
                    } else if deallocate && caps.punch {
                        Some(fallocate(punch, offset, len))
                    } else {
                        Some(fallocate(zero_range, offset, len))
                    }
                } else if deallocate && caps.punch {
                    Some(fallocate(punch, offset, len))
                } else if caps.zero_range {
                    Some(fallocate(zero_range, offset, len))
                } else if caps.punch {
                    // tmpfs: punch (zeroes), then allocate the range again.
                    next = Some(Step::Fallocate { mode: keep, offset, len, optional: true });
                    Some(fallocate(punch, offset, len))
                } else {
                    None
                };
                match step {
                    Some(step) => {
                        let mut run = new(step);
                        run.next = next;
                        Ok(Some(run))
                    }
                    None => Ok(Some(self.plan_zero_write(req))),
                }
            }
        }
    }

    /// Write Zeroes by writing zero buffers.
    fn plan_zero_write(&mut self, req: &Request) -> Run {
        let mut run = Run::new(Step::WriteZeroBufs);
        run.fd = if self.direct_ok(req.offset, req.len) { FD_MAIN } else { FD_BUFFERED };
        let zeroes = self.zero_addr();
        fill_zero_iov(&mut self.iov, zeroes, req.len);
        run
    }

    /// The shared zero buffer's address (allocated on first use).
    pub(super) fn zero_addr(&self) -> usize {
        self.sh.zeroes.get_or_init(|| AlignedBuf::new(ZERO_CHUNK, self.sh.layout.mem_align as usize)).addr()
    }

    fn plan_rw(&mut self, mem: &GuestMemory, req: &mut Request) -> Result<Run, BackendError> {
        let write = req.op != Op::Read;
        let len = req.len;
        let direct_ok = self.direct_ok(req.offset, len);
        let align = (self.sh.layout.direct && direct_ok)
            .then_some((self.sh.layout.mem_align, self.sh.layout.off_align));
        let step = match req.op {
            Op::Write { fua: true } => Step::Write { flags: libc::RWF_DSYNC },
            Op::Write { fua: false } => Step::Write { flags: 0 },
            _ => Step::Read,
        };
        let mut run = Run::new(step);
        run.fd = if direct_ok { FD_MAIN } else { FD_BUFFERED };
        let straight = self.straight_iov(mem, &mut req.data, len, write, align)?;
        if straight {
            run.zero_copy = matches!(req.data, DataBuf::Guest(_));
        } else {
            let n = len as usize;
            let b = self.get_bounce(n);
            self.iov.clear();
            self.iov.push(IoVec { base: b.addr(), len: n });
            run.bounce = Some(b);
        }
        Ok(run)
    }

    /// Builds vectors straight onto the buffers of a request's `len` bytes.
    /// Returns `Ok(false)` when a bounce buffer is needed instead: some piece
    /// breaks the direct-I/O alignment `align` (memory, length), or there are more
    /// than IOV_MAX pieces.
    fn straight_iov(
        &mut self,
        mem: &GuestMemory,
        data: &mut DataBuf,
        len: u64,
        write: bool,
        align: Option<(u64, u64)>,
    ) -> Result<bool, BackendError> {
        let trash = self.trash.as_ref().map_or(0, |t| t.addr());
        let (ranges, iov) = (&mut self.ranges, &mut self.iov);
        let (ma, oa) = align.unwrap_or((1, 1));
        let fits = |base: usize, n: usize| (base as u64).is_multiple_of(ma) && (n as u64).is_multiple_of(oa);
        let mut straight = true;
        match data {
            DataBuf::Host(v) => {
                if (v.len() as u64) < len {
                    if write {
                        return Err(invalid(format!(
                            "host buffer of {} bytes for a {len}-byte write",
                            v.len()
                        )));
                    }
                    v.resize(len as usize, 0);
                }
                let base = v.as_mut_ptr() as usize;
                straight &= fits(base, len as usize);
                iov.push(IoVec { base, len: len as usize });
            }
            DataBuf::Guest(segs) => {
                let mut total = 0u64;
                for s in segs.iter() {
                    match *s {
                        Segment::Guest { gpa, len } => {
                            ranges.clear();
                            mem.host_ranges(gpa, len, ranges)?;
                            for r in ranges.iter() {
                                straight &= fits(r.ptr as usize, r.len);
                                iov.push(IoVec { base: r.ptr as usize, len: r.len });
                            }
                        }
                        Segment::Discard { len } => {
                            if write {
                                return Err(invalid("bit bucket in a write".into()));
                            }
                            straight &= trash != 0 && len.is_multiple_of(oa);
                            push_repeated(iov, trash, TRASH_CHUNK, len);
                        }
                    }
                    total += s.len();
                }
                if total != len {
                    return Err(invalid(format!("segments cover {total} bytes of a {len}-byte transfer")));
                }
            }
            DataBuf::None | DataBuf::Within(_) => {
                if write {
                    return Err(BackendError::Short { done: 0, len });
                }
                // A read nobody wants the data of (Verify): into the scratch buffer.
                straight &= trash != 0 && len.is_multiple_of(oa);
                push_repeated(iov, trash, TRASH_CHUNK, len);
            }
        }
        Ok(straight && iov.len() <= IOV_MAX)
    }
}
