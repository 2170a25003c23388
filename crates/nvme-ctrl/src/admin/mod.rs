//! Admin commands (Base §5): dispatch plus one file per command group.

mod aer;
mod dbbuf;
mod features;
mod format;
mod identify;
mod log_page;
mod queue_mgmt;

use std::sync::Arc;

use block_backend::{BackendQueue, Completion, DataBuf, Op, Request, Segment, SegmentCursor};
use guest_mem::GuestMemory;
use nvme_spec::command::Psdt;
use nvme_spec::opcode::{admin as op, AdminOpcode};
use nvme_spec::{Sqe, Status};
use tracing::{debug, warn};

use crate::config::ControllerConfig;
use crate::controller::Controller;
use crate::dptr::prp_segments;
use crate::engine::describe;
use crate::error::{CmdResult, CommandError};
use crate::namespace::Namespace;

pub(crate) use features::FeatureState;

/// How an admin command finished.
pub(crate) enum AdminDone {
    /// Complete now with this dword 0.
    Complete(u32),
    /// Parked (Asynchronous Event Request): completed later.
    Deferred,
}

/// Admin-side state that survives between commands.
#[derive(Debug)]
pub struct AdminState {
    pub(crate) features: FeatureState,
    /// Command identifiers of outstanding Asynchronous Event Requests.
    pub(crate) aers: Vec<u16>,
    /// An I/O queue was created since the last reset (Number of Queues may no longer change).
    pub(crate) io_queues_created: bool,
    /// One backend queue per namespace for admin-driven work (Format, shutdown flush).
    backends: Vec<Box<dyn BackendQueue>>,
    /// Clock reading when the controller was created (SMART power-on hours).
    pub(crate) created_ns: u64,
}

impl AdminState {
    pub(crate) fn new(cfg: &ControllerConfig, namespaces: &[Arc<Namespace>]) -> std::io::Result<Self> {
        Ok(AdminState {
            features: FeatureState::new(cfg, namespaces),
            aers: Vec::new(),
            io_queues_created: false,
            backends: namespaces.iter().map(|n| n.backend.open_queue()).collect::<Result<_, _>>()?,
            created_ns: 0,
        })
    }

    /// Controller Level Reset: outstanding AERs vanish, features return to defaults.
    pub(crate) fn reset(&mut self, now_ns: u64) {
        self.aers.clear();
        self.io_queues_created = false;
        self.features.reset(now_ns);
    }

    /// Runs one request on the admin backend queue of `ns` and waits for it.
    pub(crate) fn run_backend(
        &mut self,
        ns: &Namespace,
        mem: &GuestMemory,
        op: Op,
        offset: u64,
        len: u64,
    ) -> CmdResult {
        let q = &mut self.backends[ns.nsid as usize - 1];
        q.submit(mem, Request { tag: 0, op, offset, len, data: DataBuf::None });
        q.commit();
        let mut out: Vec<Completion> = Vec::new();
        let mut spins = 0u64;
        while out.is_empty() {
            if q.reap(&mut out) == 0 {
                spins += 1;
                match q.notifier() {
                    // Asynchronous backends: sleep until the completion is ready.
                    Some(fd) => {
                        let mut pfd = [rustix::event::PollFd::new(&fd, rustix::event::PollFlags::IN)];
                        let _ = rustix::event::poll(
                            &mut pfd,
                            Some(&rustix::event::Timespec { tv_sec: 0, tv_nsec: 10_000_000 }),
                        );
                    }
                    None if spins.is_multiple_of(1024) => std::thread::yield_now(),
                    None => {}
                }
            }
        }
        let write = !matches!(op, Op::Read);
        out.pop().expect("one").result.map_err(|source| CommandError::Backend { write, source })
    }

    pub(crate) fn flush_namespace(&mut self, ns: &Namespace, mem: &GuestMemory) {
        if let Err(e) = self.run_backend(ns, mem, Op::Flush, 0, 0) {
            warn!(nsid = ns.nsid, "flush at shutdown failed: {e}");
        }
    }
}

impl Controller {
    /// Executes one admin command fetched from the admin SQ and posts its completion.
    pub(crate) fn execute_admin(&mut self, sqe: Sqe) {
        let cid = sqe.cid();
        let result = if sqe.psdt() != Psdt::Prp {
            // PCIe transport: admin commands use PRPs only.
            Err(CommandError::InvalidField("admin commands must use PRPs"))
        } else if sqe.fuse() != 0 {
            Err(CommandError::InvalidField("fused operation"))
        } else {
            self.dispatch_admin(&sqe)
        };
        match result {
            Ok(AdminDone::Complete(dw0)) => {
                self.engine.complete(0, cid, Status::SUCCESS, dw0, sqe.nsid.get(), 0)
            }
            Ok(AdminDone::Deferred) => self.engine.release(0),
            Err(e) => {
                debug!(target: "vnvme::guest", "admin {}: {e}", describe(AdminOpcode(sqe.opcode()), &sqe));
                self.engine.complete(0, cid, e.status(), 0, sqe.nsid.get(), 0);
            }
        }
    }

    fn dispatch_admin(&mut self, sqe: &Sqe) -> CmdResult<AdminDone> {
        match sqe.opcode() {
            op::DELETE_IO_SQ => self.delete_io_sq(sqe),
            op::CREATE_IO_SQ => self.create_io_sq(sqe),
            op::GET_LOG_PAGE => self.get_log_page(sqe),
            op::DELETE_IO_CQ => self.delete_io_cq(sqe),
            op::CREATE_IO_CQ => self.create_io_cq(sqe),
            op::IDENTIFY => self.identify(sqe),
            op::ABORT => self.abort(sqe),
            op::SET_FEATURES => self.set_features(sqe),
            op::GET_FEATURES => self.get_features(sqe),
            op::ASYNC_EVENT_REQUEST => self.async_event_request(sqe),
            op::DOORBELL_BUFFER_CONFIG if self.cfg.shadow_doorbells => self.doorbell_buffer_config(sqe),
            op::FORMAT_NVM => self.format_nvm(sqe),
            other => Err(CommandError::InvalidOpcode(other)),
        }
    }

    /// Copies `data` to the host buffer of an admin command (PRP1/PRP2).
    pub(crate) fn copy_to_host(&mut self, sqe: &Sqe, data: &[u8]) -> CmdResult {
        let segs = self.data_segments(sqe, data.len() as u64)?;
        SegmentCursor::for_transfer(&segs, data.len() as u64)?.write_from(&self.engine.mem, data)?;
        Ok(())
    }

    /// Reads `len` bytes from the host buffer of an admin command.
    pub(crate) fn copy_from_host(&mut self, sqe: &Sqe, len: usize) -> CmdResult<Vec<u8>> {
        let segs = self.data_segments(sqe, len as u64)?;
        let mut buf = vec![0u8; len];
        SegmentCursor::for_transfer(&segs, len as u64)?.read_into(&self.engine.mem, &mut buf)?;
        Ok(buf)
    }

    /// The guest segments of an admin command's `len`-byte buffer (PRP1/PRP2).
    fn data_segments(&self, sqe: &Sqe, len: u64) -> CmdResult<Vec<Segment>> {
        if len > self.mdts_bytes() {
            return Err(CommandError::TooLarge(len));
        }
        let mut segs = Vec::new();
        prp_segments(&self.engine.mem, sqe.prp1(), sqe.prp2(), len, self.page_size, &mut segs)?;
        Ok(segs)
    }

    /// The namespace `nsid` if it is active.
    pub(crate) fn active_ns(&self, nsid: u32) -> CmdResult<Arc<Namespace>> {
        nsid.checked_sub(1)
            .and_then(|i| self.namespaces.get(i as usize))
            .cloned()
            .ok_or(CommandError::InvalidNamespace(nsid))
    }
}

/// Shorthand for a successful completion with dword 0 = 0.
pub(crate) fn done() -> CmdResult<AdminDone> {
    Ok(AdminDone::Complete(0))
}

/// Fails with a status the spec names (DNR set).
pub(crate) fn status<T>(s: Status) -> CmdResult<T> {
    Err(CommandError::Status(s.with_dnr()))
}
