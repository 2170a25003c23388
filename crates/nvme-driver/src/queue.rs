//! A queue pair: an SQ and its CQ, the command identifiers in flight, the doorbells,
//! a DMA buffer pool and (with interrupts) the CQ's interrupt eventfd.
//!
//! One owner per queue: an [`IoQueue`] is `Send`, holds everything its hot path
//! touches, and can be moved to the thread that drives it. Only a trapped doorbell
//! write reaches shared state (the transport's lock).
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use guest_mem::GuestMemory;
use nvme_spec::opcode::{AdminOpcode, NvmOpcode};
use nvme_spec::{Cqe, Sqe, CQE_SIZE, SQE_SIZE};
use tracing::warn;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use nvme_spec::regs::{offset, Csts};

use crate::command::{self, Completion, IoCommand, LbaRange, Prepared};
use crate::dma::{DmaBuf, DmaPool};
use crate::doorbell::{lock, Doorbell, SharedTransport};
use crate::error::{DriverError, Result};
use crate::identify::NsGeometry;

/// Counters of one queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub submitted: u64,
    pub completed: u64,
    /// SQ tail doorbell register writes (with shadow doorbells: only those EventIdx asked for).
    pub sq_doorbell_writes: u64,
    /// CQ head doorbell register writes.
    pub cq_doorbell_writes: u64,
    /// Times a wait woke on the interrupt eventfd.
    pub interrupt_wakeups: u64,
    /// Interrupt waits that timed out (100 ms slices) before a completion arrived.
    pub interrupt_wait_timeouts: u64,
}

#[derive(Debug)]
struct Inflight {
    opcode: u8,
    data: Option<DmaBuf>,
    aux: Option<DmaBuf>,
}

#[derive(Debug)]
struct Irq {
    fd: OwnedFd,
    epoll: Epoll,
}

impl Irq {
    /// Resets the eventfd's counter; true if it had been signalled.
    fn clear(&self) -> bool {
        let mut b = [0u8; 8];
        matches!(rustix::io::read(&self.fd, &mut b), Ok(8))
    }
}

/// Where a queue pair lives and how it is reached (built by the driver).
#[derive(Debug)]
pub(crate) struct QueueParts {
    pub qid: u16,
    pub entries: u16,
    pub mem: GuestMemory,
    pub sq_iova: u64,
    pub cq_iova: u64,
    pub sq_db: Doorbell,
    pub cq_db: Doorbell,
    pub pool: DmaPool,
    pub namespaces: Arc<[NsGeometry]>,
    pub mdts: Option<u64>,
    pub irq: Option<OwnedFd>,
    pub waits: Waits,
}

/// What bounds a wait for completions: the command timeout, and the device whose
/// CSTS the wait reads while it finds nothing.
#[derive(Debug)]
pub(crate) struct Waits {
    pub timeout: Duration,
    pub device: SharedTransport,
}

/// How often a wait that finds no completion reads CSTS: a controller in fatal
/// status completes nothing more, and is not waited for to the timeout.
const HEALTH_EVERY: Duration = Duration::from_millis(100);

/// A queue pair the host drives.
#[derive(Debug)]
pub struct IoQueue {
    qid: u16,
    entries: u16,
    mem: GuestMemory,
    sq_iova: u64,
    cq_iova: u64,
    sq_tail: u16,
    cq_head: u16,
    phase: bool,
    sq_db: Doorbell,
    cq_db: Doorbell,
    free_cids: Vec<u16>,
    inflight: Vec<Option<Inflight>>,
    /// Completions reaped while waiting for another command, not yet handed out.
    ready: VecDeque<Completion>,
    pool: DmaPool,
    namespaces: Arc<[NsGeometry]>,
    mdts: Option<u64>,
    irq: Option<Irq>,
    timeout: Duration,
    device: SharedTransport,
    stats: QueueStats,
    /// With deferred doorbells: the SQ tail moved since the doorbell was last updated.
    defer_sq_doorbell: bool,
    sq_dirty: bool,
}

impl IoQueue {
    pub(crate) fn new(p: QueueParts) -> Result<Self> {
        p.mem.fill(p.cq_iova, p.entries as u64 * CQE_SIZE as u64, 0)?;
        let irq = match p.irq {
            Some(fd) => {
                let epoll = Epoll::new()?;
                epoll.ctl(ControlOperation::Add, fd.as_raw_fd(), EpollEvent::new(EventSet::IN, 0))?;
                Some(Irq { fd, epoll })
            }
            None => None,
        };
        // A full ring keeps one slot empty: entries - 1 commands in flight at most.
        let depth = p.entries - 1;
        Ok(IoQueue {
            qid: p.qid,
            entries: p.entries,
            mem: p.mem,
            sq_iova: p.sq_iova,
            cq_iova: p.cq_iova,
            sq_tail: 0,
            cq_head: 0,
            phase: true,
            sq_db: p.sq_db,
            cq_db: p.cq_db,
            free_cids: (0..depth).rev().collect(),
            inflight: (0..depth).map(|_| None).collect(),
            ready: VecDeque::new(),
            pool: p.pool,
            namespaces: p.namespaces,
            mdts: p.mdts,
            irq,
            timeout: p.waits.timeout,
            device: p.waits.device,
            stats: QueueStats::default(),
            defer_sq_doorbell: false,
            sq_dirty: false,
        })
    }

    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// Most commands in flight at once (entries - 1).
    pub fn depth(&self) -> u16 {
        self.entries - 1
    }

    /// Commands submitted and not yet handed back as completions.
    pub fn outstanding(&self) -> usize {
        self.inflight.len() - self.free_cids.len() + self.ready.len()
    }

    pub fn stats(&self) -> QueueStats {
        QueueStats {
            sq_doorbell_writes: self.sq_db.rings,
            cq_doorbell_writes: self.cq_db.rings,
            ..self.stats
        }
    }

    /// Whether this queue's doorbells go through the shadow buffer.
    pub fn shadow_doorbells(&self) -> bool {
        self.sq_db.shadowed()
    }

    /// The queue's DMA buffer pool.
    pub fn pool(&self) -> &DmaPool {
        &self.pool
    }

    /// A DMA buffer from this queue's pool.
    pub fn alloc_buf(&self, len: u64) -> Result<DmaBuf> {
        self.pool.alloc(len)
    }

    /// Geometry of namespace `nsid`.
    pub fn namespace(&self, nsid: u32) -> Option<NsGeometry> {
        self.namespaces.iter().find(|n| n.nsid == nsid).copied()
    }

    /// The controller's Maximum Data Transfer Size in bytes (None: no limit).
    pub fn mdts(&self) -> Option<u64> {
        self.mdts
    }

    /// The CQ's interrupt eventfd (MSI-X vector = qid), when the queue completes by
    /// interrupts. It is readable once the device has signalled; see
    /// [`IoQueue::clear_interrupt`].
    pub fn interrupt_fd(&self) -> Option<BorrowedFd<'_>> {
        self.irq.as_ref().map(|i| i.fd.as_fd())
    }

    /// Resets the interrupt eventfd (call it before looking at the CQ, so an
    /// interrupt raised after the call is not lost); true if it had fired.
    pub fn clear_interrupt(&mut self) -> bool {
        let fired = self.irq.as_ref().is_some_and(Irq::clear);
        if fired {
            self.stats.interrupt_wakeups += 1;
        }
        fired
    }

    /// With `defer`, submissions only write SQ entries and [`IoQueue::ring_sq`]
    /// publishes the tail once for the batch (one doorbell write for many commands).
    /// Turning deferral off rings for anything still unpublished.
    pub fn set_deferred_doorbell(&mut self, defer: bool) -> Result<()> {
        self.defer_sq_doorbell = defer;
        if !defer {
            self.ring_sq()?;
        }
        Ok(())
    }

    /// Publishes the SQ tail if submissions moved it since the last update.
    pub fn ring_sq(&mut self) -> Result<()> {
        if std::mem::take(&mut self.sq_dirty) {
            self.sq_db.update(self.sq_tail as u32)?;
        }
        Ok(())
    }

    /// Submits an entry the caller built (opcode, NSID, data pointer, command
    /// dwords); the command identifier is filled in and returned. `data` and `aux`
    /// (a data buffer, a PRP list or a range list the entry points into) are held
    /// until the command completes; `data` comes back in its [`Completion`]. For
    /// data pointers into memory the driver did not allocate (see
    /// [`crate::transport::Transport::map_external`]), the caller keeps that memory
    /// reachable until the completion.
    pub fn submit_sqe(&mut self, sqe: Sqe, data: Option<DmaBuf>, aux: Option<DmaBuf>) -> Result<u16> {
        let opcode = sqe.opcode();
        self.submit_prepared(Prepared { sqe, data, aux }, opcode)
    }

    /// Writes `cmd` into the SQ and updates the tail doorbell; returns its command
    /// identifier. On error the command (and its buffer) is dropped.
    pub fn submit(&mut self, cmd: IoCommand) -> Result<u16> {
        if self.free_cids.is_empty() {
            return Err(DriverError::QueueFull(self.qid));
        }
        let opcode = cmd.opcode();
        let ns = self.namespaces.clone();
        let p = command::prepare(cmd, |id| ns.iter().find(|n| n.nsid == id).copied(), self.mdts, &self.pool)?;
        self.submit_prepared(p, opcode)
    }

    /// Submits a prepared entry (I/O commands, and admin commands on queue 0).
    pub(crate) fn submit_prepared(&mut self, mut p: Prepared, opcode: u8) -> Result<u16> {
        let cid = self.free_cids.pop().ok_or(DriverError::QueueFull(self.qid))?;
        p.sqe.set_cid(cid);
        let slot = self.sq_iova + self.sq_tail as u64 * SQE_SIZE as u64;
        if let Err(e) = self.mem.write_obj(slot, &p.sqe) {
            self.free_cids.push(cid);
            return Err(e.into());
        }
        self.inflight[cid as usize] = Some(Inflight { opcode, data: p.data, aux: p.aux });
        self.sq_tail = (self.sq_tail + 1) % self.entries;
        self.stats.submitted += 1;
        if self.defer_sq_doorbell {
            self.sq_dirty = true;
        } else {
            self.sq_db.update(self.sq_tail as u32)?;
        }
        Ok(cid)
    }

    /// Consumes every new CQ entry into `out`, then updates the CQ head doorbell once.
    fn reap(&mut self, out: &mut Vec<Completion>) -> Result<usize> {
        let mut n = 0;
        loop {
            let addr = self.cq_iova + self.cq_head as u64 * CQE_SIZE as u64;
            // Acquire load of the dword with the phase tag: the controller writes it last,
            // after a release fence, so the rest of the entry is visible once it is.
            let dw3 = self.mem.load_u32(addr + 12)?;
            if (dw3 >> 16) & 1 != self.phase as u32 {
                break;
            }
            let cqe: Cqe = self.mem.read_obj(addr)?;
            self.cq_head += 1;
            if self.cq_head == self.entries {
                self.cq_head = 0;
                self.phase = !self.phase;
            }
            let cid = cqe.cid.get();
            let Some(f) = self.inflight.get_mut(cid as usize).and_then(Option::take) else {
                warn!(target: "nvme_driver::device", qid = self.qid, cid, "completion for a command not in flight ignored");
                continue;
            };
            drop(f.aux);
            self.free_cids.push(cid);
            self.stats.completed += 1;
            out.push(Completion {
                cid,
                opcode: f.opcode,
                status: cqe.status(),
                dw0: cqe.dw0.get(),
                buf: f.data,
            });
            n += 1;
        }
        if n > 0 {
            self.cq_db.update(self.cq_head as u32)?;
        }
        Ok(n)
    }

    /// Appends every completion available now to `out` without waiting.
    pub fn poll_completions(&mut self, out: &mut Vec<Completion>) -> Result<usize> {
        let mut n = self.ready.len();
        out.extend(self.ready.drain(..));
        n += self.reap(out)?;
        Ok(n)
    }

    /// Waits (bounded by the queue's command timeout) until at least one completion is
    /// available, and appends all available ones to `out`: by spinning on the CQ, or
    /// by sleeping on the interrupt eventfd when the queue has one.
    pub fn wait_completions(&mut self, out: &mut Vec<Completion>) -> Result<usize> {
        if !self.ready.is_empty() {
            return self.poll_completions(out);
        }
        if self.outstanding() == 0 {
            return Err(DriverError::Invalid(format!("queue {}: nothing in flight to wait for", self.qid)));
        }
        self.wait_reap(out)
    }

    fn wait_reap(&mut self, out: &mut Vec<Completion>) -> Result<usize> {
        // Nothing deferred may stay unpublished while we wait for it.
        self.ring_sq()?;
        let deadline = Instant::now() + self.timeout;
        let mut health = Instant::now() + HEALTH_EVERY;
        let mut spins = 0u32;
        loop {
            let n = self.reap(out)?;
            if n > 0 {
                return Ok(n);
            }
            let now = Instant::now();
            if now >= health {
                // A device gone (the read fails) or in fatal status (Base §3.1.4.6
                // CSTS.CFS; the host resets it, §3.7) answers nothing more: say so
                // now, not at the timeout.
                let csts = Csts(lock(&self.device).read32(offset::CSTS)?);
                if csts.cfs() {
                    return Err(DriverError::ControllerFatal { csts: csts.0 });
                }
                health = now + HEALTH_EVERY;
            }
            if now >= deadline {
                return Err(DriverError::Timeout {
                    what: "a completion",
                    ms: self.timeout.as_millis() as u64,
                });
            }
            match &self.irq {
                Some(irq) => {
                    let slice = (deadline - now).min(Duration::from_millis(100));
                    let mut ev = [EpollEvent::default(); 1];
                    let r = match irq.epoll.wait(slice.as_millis().max(1) as i32, &mut ev) {
                        Ok(r) => r,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e.into()),
                    };
                    if r == 0 {
                        self.stats.interrupt_wait_timeouts += 1;
                    } else {
                        // Reset the counter before reaping: an interrupt raised after this
                        // read is seen by the next wait, so none is lost.
                        irq.clear();
                        self.stats.interrupt_wakeups += 1;
                    }
                }
                None => {
                    // Spin first (lowest latency), then give the CPU away between looks:
                    // the device may be running on this core.
                    spins = spins.saturating_add(1);
                    if spins < 2000 {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
            }
        }
    }

    /// Submits `cmd` and waits for its completion. Other completions that arrive
    /// meanwhile are kept for [`IoQueue::poll_completions`].
    pub fn execute(&mut self, cmd: IoCommand) -> Result<Completion> {
        let opcode = cmd.opcode();
        let cid = self.submit(cmd)?;
        self.wait_for(cid, opcode)
    }

    pub(crate) fn wait_for(&mut self, cid: u16, opcode: u8) -> Result<Completion> {
        let mut got = Vec::new();
        loop {
            got.clear();
            self.wait_reap(&mut got).map_err(|e| match e {
                DriverError::Timeout { ms, .. } => {
                    let (admin, io) = (AdminOpcode(opcode), NvmOpcode(opcode));
                    let name: &dyn std::fmt::Display = if self.qid == 0 { &admin } else { &io };
                    warn!(qid = self.qid, cid, "{name} timed out");
                    DriverError::Timeout { what: "a command completion", ms }
                }
                e => e,
            })?;
            let mut found = None;
            for c in got.drain(..) {
                if c.cid == cid && found.is_none() {
                    found = Some(c);
                } else {
                    self.ready.push_back(c);
                }
            }
            if let Some(c) = found {
                return Ok(c);
            }
        }
    }

    fn geometry(&self, nsid: u32) -> Result<NsGeometry> {
        self.namespace(nsid).ok_or_else(|| DriverError::Invalid(format!("no namespace {nsid}")))
    }

    /// Bytes per blocking-helper command: MDTS, capped so a chunk fits the pool twice.
    fn chunk_bytes(&self, lba: u64) -> u64 {
        let cap = self.mdts.unwrap_or(1 << 20).min(self.pool.capacity() / 2).max(lba);
        cap / lba * lba
    }

    fn check_len(&self, nsid: u32, len: usize) -> Result<NsGeometry> {
        let g = self.geometry(nsid)?;
        if len == 0 || !(len as u64).is_multiple_of(g.lba_size) {
            return Err(DriverError::Invalid(format!(
                "{len} bytes is not a multiple of {} (LBA size)",
                g.lba_size
            )));
        }
        Ok(g)
    }

    /// Reads `out.len()` bytes (a multiple of the LBA size) at block `slba`.
    pub fn read(&mut self, nsid: u32, slba: u64, out: &mut [u8]) -> Result<()> {
        let g = self.check_len(nsid, out.len())?;
        let chunk = self.chunk_bytes(g.lba_size) as usize;
        for (i, part) in out.chunks_mut(chunk).enumerate() {
            let buf = self.pool.alloc(part.len() as u64)?;
            let lba = slba + (i * chunk) as u64 / g.lba_size;
            let nlb = (part.len() as u64 / g.lba_size) as u32;
            let buf = self.execute(IoCommand::Read { nsid, slba: lba, nlb, buf })?.into_result()?;
            buf.expect("reads carry their buffer").read_at(0, part)?;
        }
        Ok(())
    }

    /// Writes `data` (a multiple of the LBA size) at block `slba`.
    pub fn write(&mut self, nsid: u32, slba: u64, data: &[u8], fua: bool) -> Result<()> {
        let g = self.check_len(nsid, data.len())?;
        let chunk = self.chunk_bytes(g.lba_size) as usize;
        for (i, part) in data.chunks(chunk).enumerate() {
            let buf = self.pool.alloc(part.len() as u64)?;
            buf.write_at(0, part)?;
            let lba = slba + (i * chunk) as u64 / g.lba_size;
            let nlb = (part.len() as u64 / g.lba_size) as u32;
            self.execute(IoCommand::Write { nsid, slba: lba, nlb, buf, fua })?.into_result()?;
        }
        Ok(())
    }

    /// Flushes the volatile write cache.
    pub fn flush(&mut self, nsid: u32) -> Result<()> {
        self.execute(IoCommand::Flush { nsid })?.into_result().map(drop)
    }

    /// Write Zeroes over `nlb` blocks at `slba`.
    pub fn write_zeroes(&mut self, nsid: u32, slba: u64, nlb: u32, deallocate: bool) -> Result<()> {
        self.execute(IoCommand::WriteZeroes { nsid, slba, nlb, deallocate })?.into_result().map(drop)
    }

    /// Dataset Management – Deallocate over `ranges`.
    pub fn deallocate(&mut self, nsid: u32, ranges: &[LbaRange]) -> Result<()> {
        self.execute(IoCommand::Deallocate { nsid, ranges: ranges.to_vec() })?.into_result().map(drop)
    }

    /// Fails a status as an error for admin helpers.
    pub(crate) fn check(c: Completion, op: &'static str) -> Result<Completion> {
        if c.status.is_success() {
            Ok(c)
        } else {
            Err(DriverError::Nvme { op, status: c.status })
        }
    }
}
