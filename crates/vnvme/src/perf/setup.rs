//! Reaching the controller: a vfio-user server's socket, or a controller started in
//! this process; then the driver brought up with `perf`'s queues and the knobs checked
//! against what the controller and the namespace allow.

use std::sync::Arc;

use nvme_ctrl::{ControllerConfig, Stats};
use nvme_driver::{DriverOptions, NvmeDriver, Transport, VfioUserOptions, VfioUserTransport};
use nvme_inproc::{InProcessOptions, InProcessTransport};

use super::args::{PerfArgs, Target};
use super::knobs::Doorbells;

/// A driver with `a.queues` I/O queues, ready to run.
pub(super) struct Setup {
    pub driver: NvmeDriver,
    /// The in-process controller's counters (`None` behind a socket).
    pub ctrl_stats: Option<Arc<Stats>>,
    /// The namespace's LBA size in bytes and its size in LBAs.
    pub lba: u64,
    pub blocks: u64,
    /// Whether shadow doorbells are on.
    pub shadow: bool,
    /// How doorbells are written (what `auto` settled on).
    pub doorbells: Doorbells,
}

/// Connects to (or starts) the controller and brings the driver up; refuses knobs the
/// target cannot honour. `auto` doorbells take shadow doorbells where offered, and
/// otherwise connect again for the server's mapped doorbell page (or trapped
/// writes, where there is none).
pub(super) fn open(a: &PerfArgs, target: &Target) -> Result<Setup, Box<dyn std::error::Error>> {
    let first = open_as(a, target, a.doorbells)?;
    if a.doorbells != Doorbells::Auto || first.shadow {
        return Ok(first);
    }
    // Let go of the controller as a host does (queues deleted, shutdown) before
    // connecting again.
    let _ = first.driver.shutdown();
    match open_as(a, target, Doorbells::Mapped) {
        Ok(s) => {
            crate::logging::say!(
                "vnvme perf: the controller offers no shadow doorbells: doorbells written to the page the server \
                 maps (--doorbells mapped)"
            );
            Ok(s)
        }
        Err(e) => {
            crate::logging::say!(
                "vnvme perf: the controller offers no shadow doorbells, and no mapped doorbell page ({e}): \
                 trapped doorbell writes (--doorbells trapped)"
            );
            open_as(a, target, Doorbells::Trapped)
        }
    }
}

fn open_as(a: &PerfArgs, target: &Target, doorbells: Doorbells) -> Result<Setup, Box<dyn std::error::Error>> {
    let (mode, shadow) = doorbells.transport();
    let (t, ctrl_stats): (Box<dyn Transport>, Option<Arc<Stats>>) = match target {
        Target::Socket(socket) => (
            Box::new(VfioUserTransport::connect(
                socket,
                VfioUserOptions { doorbells: mode, ..Default::default() },
            )?),
            None,
        ),
        Target::InProcess { namespaces, workers, poll } => {
            if !matches!(doorbells, Doorbells::Trapped | Doorbells::Shadow | Doorbells::Auto) {
                return Err(format!(
                    "--in-process: --doorbells {} needs a vfio-user server; doorbells here are function calls \
                     (trapped, or shadow with EventIdx)",
                    a.doorbells.name()
                )
                .into());
            }
            if a.server_stats.is_some() || a.server_pid.is_some() {
                return Err("--in-process: --server-stats and --server-pid need a server process".into());
            }
            let cfg = ControllerConfig {
                namespaces: namespaces
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let o = s.open(Some(i as u32 + 1), &file_lock::Policy::default())?;
                        Ok(o.config())
                    })
                    .collect::<std::io::Result<_>>()?,
                ..Default::default()
            };
            let t = InProcessTransport::new(cfg, InProcessOptions { workers: *workers, poll: *poll })?;
            let stats = t.stats_handle();
            (Box::new(t), Some(stats))
        }
    };
    let d = NvmeDriver::new(t, driver_options(a, shadow))?;
    let shadow = shadow && d.shadow_doorbells();
    if doorbells == Doorbells::Shadow && !shadow {
        return Err(
            "--doorbells shadow: the controller does not offer Doorbell Buffer Config (--doorbells auto \
                    uses what it offers)"
                .into(),
        );
    }
    let doorbells = if doorbells == Doorbells::Auto {
        if shadow {
            Doorbells::Shadow
        } else {
            Doorbells::Auto
        }
    } else {
        doorbells
    };
    if d.io_queue_count() < a.queues {
        return Err(
            format!("the controller granted {} I/O queues, {} wanted", d.io_queue_count(), a.queues).into()
        );
    }
    let ns = d.namespace(a.nsid).ok_or_else(|| format!("no namespace {}", a.nsid))?.clone();
    let (lba, blocks) = (ns.lba_size(), ns.blocks());
    if !a.bs.is_multiple_of(lba) || a.bs / lba > 65536 {
        return Err(
            format!("--bs {} is not a multiple of the {lba}-byte LBA (at most 65536 blocks)", a.bs).into()
        );
    }
    if d.controller().mdts_bytes.is_some_and(|m| a.bs > m) {
        return Err(format!("--bs {} exceeds MDTS ({:?} bytes)", a.bs, d.controller().mdts_bytes).into());
    }
    Ok(Setup { driver: d, ctrl_stats, lba, blocks, shadow, doorbells })
}

/// Queues and a DMA pool sized for `a.qd` commands of `a.bs` bytes on each queue.
fn driver_options(a: &PerfArgs, shadow: bool) -> DriverOptions {
    let list_pages = a.bs.div_ceil(4096) / 511 + 1;
    DriverOptions {
        io_queues: a.queues,
        // Queues as deep as Linux makes them (1024, capped by CAP.MQES), whatever the
        // QD: a CQ's head doorbell traps about once per wrap with shadow doorbells.
        queue_size: (a.qd as u32 + 1).max(1024).min(u16::MAX as u32) as u16,
        shadow_doorbells: shadow,
        completion: a.completion,
        pool_bytes: (a.qd as u64 * (a.bs.next_multiple_of(4096) + list_pages * 4096))
            .next_multiple_of(2 << 20)
            + (2 << 20),
        timeout: a.timeout,
    }
}
