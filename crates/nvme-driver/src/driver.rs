//! Bring-up and ownership of the queues: [`NvmeDriver`].
//!
//! Bring-up follows Linux `drivers/nvme/host/pci.c`: disable (CC.EN = 0, wait for
//! CSTS.RDY = 0 within CAP.TO), program AQA/ASQ/ACQ, write CC (IOSQES 6, IOCQES 4,
//! MPS 0) then CC.EN = 1, wait for RDY; Identify the controller and the active
//! namespaces; Set Features Number of Queues; create the I/O queue pairs (CQ with
//! interrupt vector = qid); then Doorbell Buffer Config, *after* the queues exist,
//! when OACS bit 8 says the controller has it and shadow doorbells are wanted.
#![forbid(unsafe_code)]

use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use guest_mem::GuestMemory;

use nvme_spec::admin::{
    CreateIoCqCmd, CreateIoSqCmd, DoorbellBufferConfigCmd, GetFeaturesCmd, GetLogPageCmd, IdentifyCmd,
    SetFeaturesCmd,
};
use nvme_spec::features::{fid, NumberOfQueues};
use nvme_spec::identify::{cns, IdentifyController, IdentifyNamespace, IoCommandSetNvmController};
use nvme_spec::opcode::AdminOpcode;
use nvme_spec::regs::{
    doorbell_offset, offset, Aqa, Cap, Cc, Csts, DoorbellKind, ShutdownNotification, ShutdownStatus,
};
use nvme_spec::{Sqe, CQE_SIZE, SQE_SIZE};
use tracing::{debug, info};
use zerocopy::FromBytes;

use crate::command::{Completion, IoCommand, LbaRange, Prepared};
use crate::dma::{DmaBuf, DmaPool, PAGE};
use crate::doorbell::{lock, Doorbell, ShadowBuffers, SharedTransport};
use crate::error::{DriverError, Result};
use crate::identify::{ControllerInfo, NamespaceInfo, NsGeometry};
use crate::queue::{IoQueue, QueueParts, Waits};
use crate::transport::{DmaRegion, Transport};

/// How the host learns that commands completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionMode {
    /// Spin on the CQ; I/O CQs are created with interrupts disabled.
    Polling,
    /// Sleep on the CQ's MSI-X eventfd, then reap.
    Interrupts,
}

/// What [`NvmeDriver::new`] sets up.
#[derive(Clone, Copy, Debug)]
pub struct DriverOptions {
    /// I/O queue pairs to create (fewer if the controller grants fewer; 0: admin only).
    pub io_queues: u16,
    /// Entries per I/O queue (capped by CAP.MQES); depth is one less.
    pub queue_size: u16,
    /// Use Doorbell Buffer Config when the controller supports it.
    pub shadow_doorbells: bool,
    pub completion: CompletionMode,
    /// DMA buffer pool of each I/O queue, in bytes.
    pub pool_bytes: u64,
    /// Bound on every wait: controller state changes and command completions.
    pub timeout: Duration,
}

impl Default for DriverOptions {
    fn default() -> Self {
        DriverOptions {
            io_queues: 1,
            queue_size: 256,
            shadow_doorbells: true,
            completion: CompletionMode::Polling,
            pool_bytes: 8 << 20,
            timeout: Duration::from_secs(10),
        }
    }
}

const ADMIN_ENTRIES: u16 = 32;
/// Admin DMA memory: ASQ, ACQ, then the buffers for admin data and DBBUF.
const ADMIN_BYTES: u64 = 1 << 20;

/// A userspace NVMe driver bound to one controller through a [`Transport`].
#[derive(Debug)]
pub struct NvmeDriver {
    transport: SharedTransport,
    admin: IoQueue,
    admin_pool: DmaPool,
    controller: ControllerInfo,
    namespaces: Vec<NamespaceInfo>,
    /// I/O queues by qid - 1; None once taken out.
    queues: Vec<Option<IoQueue>>,
    dbbuf: Option<ShadowBuffers>,
    opts: DriverOptions,
}

impl NvmeDriver {
    /// Brings the controller up and creates the I/O queues.
    pub fn new(transport: Box<dyn Transport>, opts: DriverOptions) -> Result<Self> {
        if opts.queue_size < 2 {
            return Err(DriverError::Invalid("I/O queues need at least 2 entries".into()));
        }
        let t: SharedTransport = Arc::new(Mutex::new(transport));
        let (cap, vs) = {
            let mut g = lock(&t);
            (Cap(g.read64(offset::CAP)?), g.read32(offset::VS)?)
        };
        if cap.css() & 1 == 0 {
            return Err(DriverError::Unsupported("CAP.CSS: no NVM command set".into()));
        }
        if cap.mpsmin() != 0 {
            return Err(DriverError::Unsupported(format!(
                "CAP.MPSMIN {}: 4 KiB pages required",
                cap.mpsmin()
            )));
        }
        let ready_timeout = Duration::from_millis(500 * cap.to().max(1) as u64);
        let dstrd = cap.dstrd();

        // Disable, like nvme_disable_ctrl.
        let cc = Cc(lock(&t).read32(offset::CC)?);
        let csts = Csts(lock(&t).read32(offset::CSTS)?);
        if cc.en() || csts.rdy() {
            lock(&t).write32(offset::CC, cc.with_en(false).0)?;
        }
        wait_ready(&t, false, ready_timeout)?;

        // Admin queue.
        let admin_mem = lock(&t).dma_alloc(ADMIN_BYTES)?;
        let asq = admin_mem.iova;
        let acq = asq + PAGE;
        let dbbuf_pages = ShadowPages::pages(opts.io_queues, dstrd);
        let shadow = acq + PAGE;
        let eventidx = shadow + dbbuf_pages * PAGE;
        let pool_start = eventidx + dbbuf_pages * PAGE;
        let admin_pool = DmaPool::new(DmaRegion {
            iova: pool_start,
            len: admin_mem.iova + admin_mem.len - pool_start,
            mem: admin_mem.mem.clone(),
        })?;
        {
            let mut g = lock(&t);
            g.write32(offset::AQA, Aqa::new(ADMIN_ENTRIES - 1, ADMIN_ENTRIES - 1).0)?;
            g.write64(offset::ASQ, asq)?;
            g.write64(offset::ACQ, acq)?;
            // Written without EN, then with EN (Linux nvme_enable_ctrl).
            g.write32(offset::CC, Cc::LINUX.0)?;
            g.write32(offset::CC, Cc::LINUX.with_en(true).0)?;
        }
        wait_ready(&t, true, ready_timeout)?;
        // The admin queue never uses shadow doorbells (nor does Linux's). With eventfd
        // doorbells, which carry no value, its doorbells are register writes.
        let admin_db = |kind| -> Result<Doorbell> {
            if lock(&t).doorbell_needs_shadow() {
                Ok(Doorbell::register(&t, 0, kind, dstrd))
            } else {
                Ok(Doorbell::new(&t, 0, kind, dstrd, None)?)
            }
        };
        let admin = IoQueue::new(QueueParts {
            qid: 0,
            entries: ADMIN_ENTRIES,
            mem: admin_mem.mem.clone(),
            sq_iova: asq,
            cq_iova: acq,
            sq_db: admin_db(DoorbellKind::SqTail)?,
            cq_db: admin_db(DoorbellKind::CqHead)?,
            pool: admin_pool.clone(),
            namespaces: Arc::from(Vec::new()),
            mdts: None,
            irq: None,
            waits: Waits { timeout: opts.timeout, device: t.clone() },
        })?;

        let placeholder = ControllerInfo::new(Box::default(), cap, vs);
        let mut d = NvmeDriver {
            transport: t.clone(),
            admin,
            admin_pool,
            controller: placeholder,
            namespaces: Vec::new(),
            queues: Vec::new(),
            dbbuf: None,
            opts,
        };
        d.identify_all(cap, vs)?;
        d.create_queues(dstrd, ShadowBuffers { mem: admin_mem.mem.clone(), shadow, eventidx })?;
        info!(
            transport = %lock(&t).describe(),
            queues = d.queues.len(),
            shadow = d.dbbuf.is_some(),
            "NVMe controller ready"
        );
        Ok(d)
    }

    fn identify_all(&mut self, cap: Cap, vs: u32) -> Result<()> {
        let id = self.identify(cns::CONTROLLER, 0)?;
        let id =
            IdentifyController::read_from_bytes(&id).map_err(|_| DriverError::Invalid("identify".into()))?;
        self.controller = ControllerInfo::new(Box::new(id), cap, vs);
        let list = self.identify(cns::ACTIVE_NAMESPACE_LIST, 0)?;
        let nsids: Vec<u32> = list
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .take_while(|&n| n != 0)
            .collect();
        for nsid in nsids {
            let b = self.identify(cns::NAMESPACE, nsid)?;
            let id = IdentifyNamespace::read_from_bytes(&b)
                .map_err(|_| DriverError::Invalid("identify".into()))?;
            if id.nsze.get() == 0 {
                continue;
            }
            self.namespaces.push(NamespaceInfo { nsid, id: Box::new(id) });
        }
        Ok(())
    }

    fn create_queues(&mut self, dstrd: u8, dbbuf: ShadowBuffers) -> Result<()> {
        let want = self.opts.io_queues;
        if want == 0 {
            // Admin only (e.g. `vnvme identify`): nothing to create.
            return Ok(());
        }
        let c = self.set_features(fid::NUMBER_OF_QUEUES, NumberOfQueues::new(want - 1, want - 1).0)?;
        let granted = NumberOfQueues(c.dw0);
        let n = want.min(granted.nsqr_z() + 1).min(granted.ncqr_z() + 1);
        self.controller.granted_queues = granted.nsqr_z().min(granted.ncqr_z()) + 1;
        let entries = self.opts.queue_size.min(self.controller.cap.mqes_z().saturating_add(1)).max(2);
        let interrupts = self.opts.completion == CompletionMode::Interrupts;
        let mut irqs = if interrupts {
            lock(&self.transport).enable_interrupts(n + 1)?.into_iter().map(Some).collect()
        } else {
            Vec::new()
        };
        let sq_bytes = (entries as u64 * SQE_SIZE as u64).next_multiple_of(PAGE);
        let cq_bytes = (entries as u64 * CQE_SIZE as u64).next_multiple_of(PAGE);
        let mut layouts = Vec::new();
        for qid in 1..=n {
            let region = lock(&self.transport).dma_alloc(sq_bytes + cq_bytes + self.opts.pool_bytes)?;
            let (sq, cq) = (region.iova, region.iova + sq_bytes);
            region.mem.fill(cq, cq_bytes, 0)?;
            // Vector 0 is the admin queue's, so I/O queue `qid` interrupts on vector `qid`.
            let qsize_z = entries - 1;
            self.admin_raw(
                CreateIoCqCmd { qid, qsize_z, base: cq, pc: true, ien: interrupts, iv: qid }.to_sqe(),
                None,
            )?;
            self.admin_raw(
                CreateIoSqCmd { qid, qsize_z, base: sq, pc: true, cqid: qid, ..Default::default() }.to_sqe(),
                None,
            )?;
            layouts.push((qid, region, sq, cq));
        }
        let needs_shadow = lock(&self.transport).doorbell_needs_shadow();
        if self.opts.shadow_doorbells && self.controller.supports_dbbuf() {
            let len = ShadowPages::pages(self.opts.io_queues, dstrd) * PAGE;
            dbbuf.mem.fill(dbbuf.shadow, len, 0)?;
            dbbuf.mem.fill(dbbuf.eventidx, len, 0)?;
            let s = DoorbellBufferConfigCmd { shadow_doorbell: dbbuf.shadow, eventidx: dbbuf.eventidx };
            self.admin_raw(s.to_sqe(), None)?;
            self.dbbuf = Some(dbbuf);
        } else if needs_shadow {
            return Err(DriverError::Unsupported(
                "eventfd doorbells need shadow doorbells (the value travels in the shadow buffer), \
                 and they are off or the controller lacks Doorbell Buffer Config"
                    .into(),
            ));
        }
        let geos: Arc<[NsGeometry]> = self.namespaces.iter().map(NamespaceInfo::geometry).collect();
        for (qid, region, sq, cq) in layouts {
            let pool_start = cq + cq_bytes;
            let pool = DmaPool::new(DmaRegion {
                iova: pool_start,
                len: region.iova + region.len - pool_start,
                mem: region.mem.clone(),
            })?;
            let shadow = self.dbbuf.as_ref();
            let q = IoQueue::new(QueueParts {
                qid,
                entries,
                mem: region.mem.clone(),
                sq_iova: sq,
                cq_iova: cq,
                sq_db: Doorbell::new(&self.transport, qid, DoorbellKind::SqTail, dstrd, shadow)?,
                cq_db: Doorbell::new(&self.transport, qid, DoorbellKind::CqHead, dstrd, shadow)?,
                pool,
                namespaces: geos.clone(),
                mdts: self.controller.mdts_bytes,
                irq: irqs.get_mut(qid as usize).and_then(Option::take),
                waits: Waits { timeout: self.opts.timeout, device: self.transport.clone() },
            })?;
            debug!(
                qid,
                entries,
                sq = format_args!("{sq:#x}"),
                cq = format_args!("{cq:#x}"),
                "I/O queue pair created"
            );
            self.queues.push(Some(q));
        }
        Ok(())
    }

    // ---- admin commands

    /// Runs an admin command with an optional data buffer; fails on an error status.
    pub fn admin_command(&mut self, sqe: Sqe, data: Option<DmaBuf>) -> Result<Completion> {
        self.admin_raw(sqe, data)
    }

    fn admin_raw(&mut self, sqe: Sqe, data: Option<DmaBuf>) -> Result<Completion> {
        let opcode = sqe.opcode();
        let cid = self.admin.submit_prepared(Prepared { sqe, data, aux: None }, opcode)?;
        let c = self.admin.wait_for(cid, opcode)?;
        IoQueue::check(c, AdminOpcode(opcode).name().unwrap_or("admin command"))
    }

    /// A DMA buffer for admin data.
    pub fn admin_buf(&self, len: u64) -> Result<DmaBuf> {
        self.admin_pool.alloc(len)
    }

    /// Identify with CNS `cns` for `nsid`: the 4096 bytes returned.
    pub fn identify(&mut self, cns: u8, nsid: u32) -> Result<Vec<u8>> {
        let buf = self.admin_pool.alloc(4096)?;
        let mut s = IdentifyCmd { nsid, cns, ..Default::default() }.to_sqe();
        s.set_prps(buf.iova(), 0);
        let c = self.admin_raw(s, Some(buf))?;
        Ok(c.buf.expect("identify carries its buffer").to_vec()?)
    }

    /// Get Log Page `lid` for `nsid` (0xffff_ffff: controller-wide): the first `len`
    /// bytes (a multiple of 4, at most a page).
    pub fn get_log_page(&mut self, lid: u8, nsid: u32, len: u32) -> Result<Vec<u8>> {
        if len == 0 || !len.is_multiple_of(4) || len > 4096 {
            return Err(DriverError::Unsupported(format!(
                "log page length {len}: 4..=4096, a multiple of 4"
            )));
        }
        let buf = self.admin_pool.alloc(len as u64)?;
        let mut s = GetLogPageCmd { nsid, lid, numd_z: len / 4 - 1, ..Default::default() }.to_sqe();
        s.set_prps(buf.iova(), 0);
        let c = self.admin_raw(s, Some(buf))?;
        let mut v = c.buf.expect("the log page carries its buffer").to_vec()?;
        v.truncate(len as usize);
        Ok(v)
    }

    /// The NVM Command Set specific Identify Controller data (CNS 06h, CSI 00h):
    /// Write Zeroes and Dataset Management limits. Fails on controllers older than
    /// NVMe 2.0 that do not know the CNS value.
    pub fn identify_nvm_controller(&mut self) -> Result<IoCommandSetNvmController> {
        let b = self.identify(cns::CSI_CONTROLLER, 0)?;
        IoCommandSetNvmController::read_from_bytes(&b).map_err(|_| DriverError::Invalid("identify".into()))
    }

    /// Set Features `fid` with CDW11 `value`.
    pub fn set_features(&mut self, fid: u8, value: u32) -> Result<Completion> {
        self.admin_raw(SetFeaturesCmd { fid, cdw11: value, ..Default::default() }.to_sqe(), None)
    }

    /// Get Features `fid` (current value) with CDW11 `cdw11`: the completion's DW0.
    pub fn get_features(&mut self, fid: u8, cdw11: u32) -> Result<u32> {
        Ok(self.admin_raw(GetFeaturesCmd { fid, cdw11, ..Default::default() }.to_sqe(), None)?.dw0)
    }

    /// Normal shutdown as the spec recommends and Linux does it (Base §3.6.1): the
    /// I/O submission queues deleted, then their completion queues (best effort: a
    /// controller that refuses still gets the shutdown), then CC.SHN = 01b and a
    /// wait for CSTS.SHST = complete. A target that kept queues alive through the
    /// notification saw completions posted to queues the host had stopped reading
    /// (SPDK's failed its controller on a CQ it found full). Queues taken out of the
    /// driver must no longer be used afterwards.
    pub fn shutdown(mut self) -> Result<()> {
        let n = self.io_queue_count();
        for qid in 1..=n {
            let _ = self.admin_raw(nvme_spec::admin::DeleteIoSqCmd { qid }.to_sqe(), None);
        }
        for qid in 1..=n {
            let _ = self.admin_raw(nvme_spec::admin::DeleteIoCqCmd { qid }.to_sqe(), None);
        }
        let t = self.transport.clone();
        let cc = Cc(lock(&t).read32(offset::CC)?);
        lock(&t).write32(offset::CC, cc.with_shn(ShutdownNotification::Normal).0)?;
        let deadline = Instant::now() + self.opts.timeout;
        loop {
            let csts = Csts(lock(&t).read32(offset::CSTS)?);
            if csts.shst() == ShutdownStatus::Complete {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(DriverError::Timeout {
                    what: "shutdown",
                    ms: self.opts.timeout.as_millis() as u64,
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    // ---- what we found

    pub fn controller(&self) -> &ControllerInfo {
        &self.controller
    }

    pub fn namespaces(&self) -> &[NamespaceInfo] {
        &self.namespaces
    }

    pub fn namespace(&self, nsid: u32) -> Option<&NamespaceInfo> {
        self.namespaces.iter().find(|n| n.nsid == nsid)
    }

    /// Whether Doorbell Buffer Config is in effect.
    pub fn shadow_doorbells(&self) -> bool {
        self.dbbuf.is_some()
    }

    /// I/O queue pairs created (qids 1..=n).
    pub fn io_queue_count(&self) -> u16 {
        self.queues.len() as u16
    }

    pub fn options(&self) -> &DriverOptions {
        &self.opts
    }

    /// The transport's one-line description.
    pub fn describe_transport(&self) -> String {
        lock(&self.transport).describe()
    }

    /// A handle on the transport for work outside the queues (mapping external
    /// memory, health checks) that any thread may hold.
    pub fn device_handle(&self) -> DeviceHandle {
        DeviceHandle { transport: self.transport.clone() }
    }

    // ---- queues

    /// I/O queue `qid`, if it is in the driver.
    pub fn queue(&mut self, qid: u16) -> Result<&mut IoQueue> {
        qid.checked_sub(1)
            .and_then(|i| self.queues.get_mut(i as usize))
            .and_then(Option::as_mut)
            .ok_or(DriverError::NoQueue(qid))
    }

    /// Moves I/O queue `qid` out of the driver, e.g. to the thread that will drive it.
    pub fn take_queue(&mut self, qid: u16) -> Result<IoQueue> {
        qid.checked_sub(1)
            .and_then(|i| self.queues.get_mut(i as usize))
            .and_then(Option::take)
            .ok_or(DriverError::NoQueue(qid))
    }

    /// Moves every I/O queue still in the driver out of it.
    pub fn take_queues(&mut self) -> Vec<IoQueue> {
        self.queues.iter_mut().filter_map(Option::take).collect()
    }

    /// Puts a queue taken with [`NvmeDriver::take_queue`] back.
    pub fn return_queue(&mut self, q: IoQueue) {
        let i = q.qid() as usize - 1;
        self.queues[i] = Some(q);
    }

    /// Submits `cmd` on queue `qid`; see [`IoQueue::submit`].
    pub fn submit(&mut self, qid: u16, cmd: IoCommand) -> Result<u16> {
        self.queue(qid)?.submit(cmd)
    }

    /// Appends queue `qid`'s available completions to `out`.
    pub fn poll_completions(&mut self, qid: u16, out: &mut Vec<Completion>) -> Result<usize> {
        self.queue(qid)?.poll_completions(out)
    }

    /// Waits for at least one completion on queue `qid`.
    pub fn wait_completions(&mut self, qid: u16, out: &mut Vec<Completion>) -> Result<usize> {
        self.queue(qid)?.wait_completions(out)
    }

    fn first_queue(&mut self) -> Result<&mut IoQueue> {
        self.queues.iter_mut().find_map(Option::as_mut).ok_or(DriverError::NoQueue(1))
    }

    /// Blocking read through the first I/O queue in the driver.
    pub fn read(&mut self, nsid: u32, slba: u64, out: &mut [u8]) -> Result<()> {
        self.first_queue()?.read(nsid, slba, out)
    }

    /// Blocking write through the first I/O queue in the driver.
    pub fn write(&mut self, nsid: u32, slba: u64, data: &[u8]) -> Result<()> {
        self.first_queue()?.write(nsid, slba, data, false)
    }

    pub fn flush(&mut self, nsid: u32) -> Result<()> {
        self.first_queue()?.flush(nsid)
    }

    pub fn write_zeroes(&mut self, nsid: u32, slba: u64, nlb: u32, deallocate: bool) -> Result<()> {
        self.first_queue()?.write_zeroes(nsid, slba, nlb, deallocate)
    }

    pub fn deallocate(&mut self, nsid: u32, ranges: &[LbaRange]) -> Result<()> {
        self.first_queue()?.deallocate(nsid, ranges)
    }
}

/// A shareable handle on a driver's transport (see [`NvmeDriver::device_handle`]).
/// Calls take the transport's lock, like a trapped doorbell write does.
#[derive(Clone, Debug)]
pub struct DeviceHandle {
    transport: SharedTransport,
}

impl DeviceHandle {
    /// See [`Transport::map_external`].
    pub fn map_external(&self, mem: &GuestMemory, gpa: u64, len: u64) -> io::Result<Option<u64>> {
        lock(&self.transport).map_external(mem, gpa, len)
    }

    /// See [`Transport::unmap_external`].
    pub fn unmap_external(&self, iova: u64, len: u64) -> io::Result<()> {
        lock(&self.transport).unmap_external(iova, len)
    }

    /// See [`Transport::hangup_fd`].
    pub fn hangup_fd(&self) -> io::Result<Option<OwnedFd>> {
        lock(&self.transport).hangup_fd()
    }

    /// The controller's CSTS register.
    pub fn csts(&self) -> io::Result<Csts> {
        Ok(Csts(lock(&self.transport).read32(offset::CSTS)?))
    }

    /// The transport's one-line description.
    pub fn describe(&self) -> String {
        lock(&self.transport).describe()
    }

    /// See [`Transport::migrate`]: queues wait on the transport's lock meanwhile.
    pub fn migrate(&self, dest: &std::path::Path) -> io::Result<crate::transport::Migrated> {
        lock(&self.transport).migrate(dest)
    }

    /// See [`Transport::start_memory_copy`].
    pub fn start_memory_copy(&self) -> io::Result<()> {
        lock(&self.transport).start_memory_copy()
    }
}

/// Sizing of the Shadow Doorbell and EventIdx buffers.
struct ShadowPages;

impl ShadowPages {
    /// Pages each buffer needs for qids `0..=io_queues` with stride `dstrd`.
    fn pages(io_queues: u16, dstrd: u8) -> u64 {
        (doorbell_offset(io_queues, DoorbellKind::CqHead, dstrd) + 4).div_ceil(PAGE)
    }
}

fn wait_ready(t: &SharedTransport, rdy: bool, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let csts = Csts(lock(t).read32(offset::CSTS)?);
        if csts.cfs() && rdy {
            return Err(DriverError::ControllerFatal { csts: csts.0 });
        }
        if csts.rdy() == rdy {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(DriverError::Timeout {
                what: if rdy { "CSTS.RDY = 1" } else { "CSTS.RDY = 0" },
                ms: timeout.as_millis() as u64,
            });
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}
