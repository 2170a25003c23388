//! NVM command set I/O commands (NVM §3): one file per command family, each a
//! method of [`Io`], the engine's parts lent for one command (`engine/work.rs`). A
//! command starts here and says how it goes on ([`Started`]); fetching it and
//! posting its completion are the engine's (`engine/run.rs`).

mod copy;
mod dsm;
mod fdp;
mod flush;
mod meta;
mod resv;
mod rw;
mod table;
mod zns;

pub(crate) use copy::copy_limits;
pub use table::io_opcodes;
pub(crate) use table::{NVM, ZONED};

use block_backend::{DataBuf, Op, Request, Segment, SegmentCursor};
use nvme_spec::command::Psdt;
use nvme_spec::opcode::{nvm as op, zns as zop};
use nvme_spec::{Sqe, Status};

use crate::dptr::{prp_segments, sgl_segments, Direction};
use crate::engine::{Finish, InFlight, Io, Origin, Tally};
use crate::error::{CmdResult, CommandError};
use crate::namespace::Namespace;
use crate::stats::OpClass;
use std::sync::Arc;

/// How a started command goes on.
pub(crate) enum Started {
    /// Requests were submitted; the completion comes when they finish.
    Pending,
    /// Done already (nothing to transfer), with this status.
    Done(Status),
    /// Run to its end at a synchronous backend already, finished and counted: the
    /// engine posts its completion, with this status and result, naming `slba`.
    Ran { status: Status, result: u64, slba: u64 },
}

impl Io {
    /// Starts an I/O command fetched from SQ `sqid` (inlined into the engine's one
    /// caller, as the dispatch is into it).
    #[inline(always)]
    pub(crate) fn start(&mut self, sqid: u16, sqe: &Sqe) -> CmdResult<Started> {
        if sqe.fuse() != 0 {
            // FUSES = 0: fused operations are not supported.
            return Err(CommandError::InvalidField("fused operation"));
        }
        let opcode = sqe.opcode();
        if !matches!(opcode, op::READ | op::WRITE) {
            // Read and Write check their namespace's reservation in `rw.rs`.
            self.reservation_gate(sqe)?;
        }
        self.dispatch_io(sqid, sqe)
    }

    /// The active namespace `nsid` for a command that accesses it: Invalid
    /// Namespace or Format if there is none, and the path error of its ANA group's
    /// state if this controller does not reach it now (`crate::ana`).
    pub(crate) fn namespace(&self, nsid: u32) -> CmdResult<Arc<Namespace>> {
        let ns = crate::namespace::for_command_ref(&self.ctx.namespaces, nsid)?;
        reachable(ns)?;
        Ok(ns.clone())
    }

    /// `f` of the active namespace `nsid` (a borrow, where [`IoEngine::namespace`]
    /// takes a reference), or the error [`IoEngine::namespace`] gives.
    #[inline]
    pub(crate) fn with_namespace<T>(&self, nsid: u32, f: impl FnOnce(&Namespace) -> T) -> CmdResult<T> {
        let ns = crate::namespace::for_command_ref(&self.ctx.namespaces, nsid)?;
        reachable(ns)?;
        Ok(f(ns))
    }

    /// A zeroed host buffer of `len` bytes for a command's backend request, within
    /// the engine's [`HOST_BUFFER_BUDGET`](crate::engine::HOST_BUFFER_BUDGET).
    pub(crate) fn host_buffer(&self, len: u64) -> CmdResult<Vec<u8>> {
        if self.host_bytes_held() + len > crate::engine::HOST_BUFFER_BUDGET {
            return Err(CommandError::HostBuffersBusy(len));
        }
        Ok(vec![0; len as usize])
    }

    /// The guest segments of a command's data pointer for a `len`-byte transfer.
    #[inline]
    pub(crate) fn data_segments(&mut self, sqe: &Sqe, len: u64, dir: Direction) -> CmdResult<Vec<Segment>> {
        let mut segs = self.work.seg_pool.pop().unwrap_or_default();
        let r = match sqe.psdt() {
            Psdt::Prp => {
                prp_segments(&self.mem, sqe.prp1(), sqe.prp2(), len, self.settings().page_size(), &mut segs)
            }
            // The two differ in MPTR's form only, which the metadata path reads
            // (io/meta.rs).
            Psdt::SglMptrContiguous | Psdt::SglMptrSgl => {
                sgl_segments(&self.mem, sqe.sgl1(), len, dir, &mut segs)
            }
            Psdt::Reserved => Err(CommandError::InvalidField("PSDT 11b is reserved")),
        };
        // The walks leave data addresses to the copy; checking them here instead means
        // a command with a bad data page fails before the backend sees it, so a Write
        // never lands partly (and a Read never fills half a buffer) before failing.
        let r = r.and_then(|()| in_guest_memory(&self.mem, &segs));
        match r {
            Ok(()) => Ok(segs),
            Err(e) => {
                segs.clear();
                self.work.seg_pool.push(segs);
                Err(e)
            }
        }
    }

    /// `data` written to a command's data pointer (a report's whole buffer).
    pub(crate) fn write_command_data(&mut self, sqe: &Sqe, data: &[u8]) -> CmdResult<()> {
        let len = data.len() as u64;
        let segs = self.data_segments(sqe, len, Direction::ToHost)?;
        let written = SegmentCursor::for_transfer(&segs, len).and_then(|mut c| c.write_from(&self.mem, data));
        self.release_data(DataBuf::Guest(segs), written.is_ok());
        written?;
        Ok(())
    }

    /// The `len` bytes a command's data pointer holds (a DSM range list, Copy's
    /// source range entries), read out of guest memory.
    pub(crate) fn read_command_data(&mut self, sqe: &Sqe, len: u64) -> CmdResult<Vec<u8>> {
        let mut segs = self.data_segments(sqe, len, Direction::FromHost)?;
        let mut raw = vec![0u8; len as usize];
        let read = SegmentCursor::for_transfer(&segs, len).and_then(|mut c| c.read_into(&self.mem, &mut raw));
        segs.clear();
        self.work.seg_pool.push(segs);
        read?;
        Ok(raw)
    }

    /// Submits one backend request per `(offset, len)` range for command `f`, which
    /// moves no data, splitting ranges longer than the backend's limit for its op.
    pub(crate) fn submit_ranges(
        &mut self,
        mut f: InFlight,
        ns: &Namespace,
        ranges: &[(u64, u64)],
    ) -> Started {
        let op = f.op;
        let max = match op {
            Op::Discard => ns.info.discard_max,
            Op::WriteZeroes { .. } => ns.info.write_zeroes_max,
            _ => 0,
        };
        let mut work = Vec::with_capacity(ranges.len());
        for &(mut offset, mut len) in ranges {
            while len > 0 {
                let n = if max > 0 { len.min(max) } else { len };
                work.push((offset, n));
                offset += n;
                len -= n;
            }
        }
        if work.is_empty() {
            return Started::Done(Status::SUCCESS);
        }
        f.remaining = work.len() as u32;
        let tag = self.track(f);
        for (offset, len) in work {
            let req = Request { tag, op, offset, len, data: DataBuf::None };
            self.backend_submit(ns.nsid, req);
        }
        Started::Pending
    }

    /// Submits `req` (its tag unset) for command `sqe` from SQ `sqid`, naming LBA
    /// `slba` of its namespace, and tracks it.
    pub(crate) fn submit_one(
        &mut self,
        sqid: u16,
        sqe: &Sqe,
        slba: u64,
        mut req: Request,
        finish: Finish,
    ) -> Started {
        let class = OpClass::of(sqe.opcode());
        let bytes = if matches!(class, OpClass::Read | OpClass::Write) { req.len } else { 0 };
        let nsid = sqe.nsid.get();
        // A synchronous backend (null, RAM, a file without io_uring) runs the request
        // here: no tag, no timeout, no reap, the completion posted now. A Compare
        // needs its command's state when the data is back, so it takes the tag path.
        // The variants taken here own nothing: kept from being dropped, they cost no
        // drop glue call per I/O (a match leaves a variant without bindings in place,
        // to be dropped at the end, which the compiler does not see through).
        let finish = std::mem::ManuallyDrop::new(finish);
        let zoned = match *finish {
            Finish::Plain => None,
            Finish::Zoned { write, append } => Some((write, append)),
            _ => {
                let owned = std::mem::ManuallyDrop::into_inner(finish);
                return self.submit_tracked(InFlight::new(sqid, sqe, slba, req.op, owned), bytes, req);
            }
        };
        match self.backend_run_now(nsid, &mut req) {
            Some((result, started_ns)) => {
                let tally = Tally { class, bytes, started_ns };
                let (status, result) =
                    self.finish_now(Origin::of(sqid, sqe, slba), tally, req, &result, zoned);
                Started::Ran { status, result, slba }
            }
            None => {
                let finish = match zoned {
                    None => Finish::Plain,
                    Some((write, append)) => Finish::Zoned { write, append },
                };
                self.submit_tracked(InFlight::new(sqid, sqe, slba, req.op, finish), bytes, req)
            }
        }
    }

    /// [`Io::submit_one`] through the in-flight table: the request goes to the
    /// backend with a tag, and the command (`bytes` of data) completes when it
    /// comes back.
    fn submit_tracked(&mut self, mut f: InFlight, bytes: u64, mut req: Request) -> Started {
        f.tally.bytes = bytes;
        if let DataBuf::Host(b) = &req.data {
            f.host_bytes = b.len() as u64;
        }
        let nsid = f.at.nsid;
        req.tag = self.track(f);
        self.backend_submit(nsid, req);
        Started::Pending
    }
}

/// A backend request for a command, its tag not yet given.
#[inline]
pub(crate) fn request(op: Op, offset: u64, len: u64, data: DataBuf) -> Request {
    Request { tag: 0, op, offset, len, data }
}

/// Checks every guest segment of a walk lies in guest memory (the walks leave the
/// data's addresses to the copy).
pub(crate) fn in_guest_memory(mem: &guest_mem::GuestMemory, segs: &[Segment]) -> CmdResult<()> {
    segs.iter().try_for_each(|s| match *s {
        Segment::Guest { gpa, len } => mem.check_range(gpa, len).map_err(CommandError::Memory),
        Segment::Discard { .. } => Ok(()),
    })
}

/// Whether commands to `ns` are processed on this controller now: not when its
/// ANA group is inaccessible, lost or changing (a path error, DNR clear: the host
/// retries on another controller of the subsystem).
#[inline]
fn reachable(ns: &Namespace) -> CmdResult<()> {
    match ns.ana_group().refusal() {
        None => Ok(()),
        Some(s) => Err(CommandError::Status(s)),
    }
}

/// The SLBA of commands that carry one (for the Error Information log).
pub(crate) fn error_slba(sqe: &Sqe) -> u64 {
    match sqe.opcode() {
        // Copy's SDLBA has the same place.
        op::WRITE | op::READ | op::COMPARE | op::VERIFY | op::WRITE_ZEROES | op::COPY | zop::ZONE_APPEND => {
            nvme_spec::nvm::ReadWrite(sqe).slba()
        }
        _ => 0,
    }
}
