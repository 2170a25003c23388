//! Opening: the transport an `nvme://` target needs (eventfd doorbells tried first
//! over vfio-user), controller bring-up with every I/O queue pair at once, and what
//! the namespace and controller can do, asked once ([`Limits`]).

use std::io;
use std::sync::{Arc, Mutex};

use block_backend::BackendInfo;
use nvme_driver::vfio::KernelVfioTransport;
use nvme_driver::{
    CompletionMode, DoorbellMode, DriverOptions, NvmeDriver, Transport, VfioUserOptions, VfioUserTransport,
};
use nvme_spec::identify::{dlfeat, oncs, vwc};
use tracing::{debug, info, warn};

use crate::backend::NvmeBackend;
use crate::error::OpenError;
use crate::health::{Health, Watcher};
use crate::lock;
use crate::map::GuestMaps;
use crate::shared::{Pairs, QueueOptions, Shared, Sizes};
use crate::stats::Counters;
use crate::uri::{NvmeBackendOptions, NvmeTarget};

/// Largest read/write per command when the controller reports no MDTS.
const NO_MDTS_CHUNK: u64 = 2 << 20;

impl NvmeBackend {
    /// Opens the namespace an `nvme://` URI names.
    pub fn open(uri: &str) -> Result<Self, OpenError> {
        Self::open_with(NvmeBackendOptions::parse(uri)?)
    }

    /// Opens the namespace `opts` names.
    pub fn open_with(opts: NvmeBackendOptions) -> Result<Self, OpenError> {
        let target = opts.target.clone();
        let connect = |source| OpenError::Connect { target: target.clone(), source };
        if let (NvmeTarget::VfioUser(p), true) = (&opts.target, opts.auto_doorbells) {
            let eventfd =
                VfioUserOptions { doorbells: DoorbellMode::EventFd, socket_timeout: Some(opts.timeout) };
            let first = VfioUserTransport::connect(p, eventfd).map_err(connect).and_then(|t| {
                let o = NvmeBackendOptions { doorbells: DoorbellMode::EventFd, ..opts.clone() };
                Self::with_transport(Box::new(t), o)
            });
            match first {
                Ok(b) => return Ok(b),
                Err(e) => {
                    debug!("{}: eventfd doorbells not available ({e}); using {}", target, opts.doorbells)
                }
            }
        }
        let transport: Box<dyn Transport> = match &opts.target {
            NvmeTarget::VfioUser(p) => Box::new(
                VfioUserTransport::connect(
                    p,
                    VfioUserOptions { doorbells: opts.doorbells, socket_timeout: Some(opts.timeout) },
                )
                .map_err(connect)?,
            ),
            NvmeTarget::Pci(bdf) => Box::new(KernelVfioTransport::open(bdf).map_err(connect)?),
            NvmeTarget::Other(d) => {
                return Err(connect(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{d}: no transport to open (use NvmeBackend::with_transport)"),
                )))
            }
        };
        Self::with_transport(transport, opts)
    }

    /// Opens namespace `opts.nsid` of the controller behind `transport` (the target in
    /// `opts` is only used in messages, e.g. [`NvmeTarget::Other`]): for transports
    /// built by the caller, such as the in-process one.
    pub fn with_transport(
        transport: Box<dyn Transport>,
        opts: NvmeBackendOptions,
    ) -> Result<Self, OpenError> {
        let target = opts.target.clone();
        let driver_err = |source| OpenError::Driver { target: target.clone(), source };
        // Bounce buffers come from each queue's pool: 64 KiB per slot, 4..32 MiB.
        let pool_bytes = (opts.depth as u64 * (64 << 10)).clamp(4 << 20, 32 << 20);
        let dopts = DriverOptions {
            io_queues: opts.queues,
            queue_size: opts.depth,
            shadow_doorbells: true,
            completion: if opts.poll { CompletionMode::Polling } else { CompletionMode::Interrupts },
            pool_bytes,
            timeout: opts.timeout,
        };
        let mut driver = NvmeDriver::new(transport, dopts).map_err(driver_err)?;
        let Limits { lba, blocks, info, max_rw, max_wz, max_dsm } = probe(&mut driver, &opts, pool_bytes)?;
        let queues = driver.take_queues();
        if queues.len() < opts.queues as usize {
            warn!("{target}: the controller granted {} of {} I/O queue pairs", queues.len(), opts.queues);
        }
        let health = Arc::new(Health::default());
        for q in &queues {
            if let Some(fd) = q.interrupt_fd() {
                lock(&health.wakers).push(fd.try_clone_to_owned().map_err(|e| driver_err(e.into()))?);
            }
        }
        let device = driver.device_handle();
        let watcher = Watcher::spawn(device.clone(), health.clone()).map_err(|e| driver_err(e.into()))?;
        info!(
            "{target}: namespace {} ({blocks} blocks of {lba} bytes), {} queue pair(s) of {} entries, {}; \
             {} bytes per command",
            opts.nsid,
            queues.len(),
            opts.depth,
            if opts.poll { "polled" } else { "interrupts" },
            max_rw
        );
        let stats = Arc::new(Counters::default());
        Ok(NvmeBackend {
            shared: Arc::new(Shared {
                maps: GuestMaps::new(device.clone(), stats.clone(), target.clone()),
                target,
                nsid: opts.nsid,
                sizes: Sizes { lba, max_rw, max_wz, max_dsm },
                info,
                pairs: Pairs::new(queues),
                device,
                stats,
                health,
                queues: QueueOptions { poll: opts.poll, timeout: opts.timeout },
                watcher: Mutex::new(Some(watcher)),
                driver: Mutex::new(Some(driver)),
            }),
        })
    }
}

/// What the downstream namespace and controller allow, asked once at open.
struct Limits {
    /// Bytes per logical block.
    lba: u64,
    blocks: u64,
    info: BackendInfo,
    /// Most bytes per Read or Write.
    max_rw: u64,
    /// Most blocks per Write Zeroes / per deallocated range.
    max_wz: u64,
    max_dsm: u64,
}

/// Asks namespace `opts.nsid` and its controller for their format and limits; a
/// namespace this backend cannot serve is refused here, with the reason.
fn probe(driver: &mut NvmeDriver, opts: &NvmeBackendOptions, pool_bytes: u64) -> Result<Limits, OpenError> {
    let target = &opts.target;
    let unsupported = |msg: String| OpenError::Unsupported { target: target.clone(), msg };
    let Some(ns) = driver.namespace(opts.nsid).cloned() else {
        let available: Vec<String> = driver.namespaces().iter().map(|n| n.nsid.to_string()).collect();
        return Err(OpenError::NoNamespace {
            target: target.clone(),
            nsid: opts.nsid,
            available: if available.is_empty() { "none".into() } else { available.join(", ") },
        });
    };
    let lba = ns.lba_size();
    if lba == 0 || !lba.is_power_of_two() {
        return Err(unsupported(format!("namespace {}: unusable LBA size {lba}", opts.nsid)));
    }
    if ns.id.current_lbaf().ms.get() != 0 {
        return Err(unsupported(format!("namespace {}: formats with metadata are not supported", opts.nsid)));
    }
    let ctrl = driver.controller().clone();
    // The NVM command set limits, if the controller can tell (NVMe 2.0).
    let nvm = driver.identify_nvm_controller().ok();
    let oncs = ctrl.id.oncs.get();
    let mps = 12 + ctrl.cap.mpsmin() as u32;
    let wz_bytes = nvm.as_ref().filter(|n| n.wzsl > 0).and_then(|n| 1u64.checked_shl(n.wzsl as u32 + mps));
    let dsm_blocks = nvm.as_ref().map(|n| n.dmrsl.get() as u64).filter(|&b| b > 0);
    let info = BackendInfo {
        kind: format!("nvme:{target} ns {}", opts.nsid),
        size: ns.size_bytes(),
        block_size: lba as u32,
        volatile_cache: ctrl.id.vwc & vwc::PRESENT != 0,
        discard: oncs & oncs::DSM != 0,
        discard_zeroes: ns.id.dlfeat & dlfeat::READ_BEHAVIOR_MASK == dlfeat::READ_ZEROES,
        discard_max: dsm_blocks.map_or(0, |b| b * lba),
        write_zeroes: oncs & oncs::WRITE_ZEROES != 0,
        write_zeroes_max: wz_bytes.unwrap_or(0),
        // A downstream Copy could do it; not offered yet, so a Copy reads and writes.
        copy: false,
        // Write protected downstream: so it is here (its writes fail there anyway).
        read_only: ns.id.nsattr & nvme_spec::identify::nsattr::WRITE_PROTECTED != 0,
    };
    let max_rw = ctrl.mdts_bytes.unwrap_or(NO_MDTS_CHUNK).min(65536 * lba).min(pool_bytes / 4) / lba * lba;
    if max_rw == 0 {
        return Err(unsupported(format!("an LBA of {lba} bytes exceeds the largest transfer (MDTS)")));
    }
    let max_wz = wz_bytes.map_or(65536, |b| (b / lba).clamp(1, 65536));
    let max_dsm = dsm_blocks.unwrap_or(u32::MAX as u64).min(u32::MAX as u64);
    Ok(Limits { lba, blocks: ns.blocks(), info, max_rw, max_wz, max_dsm })
}
