//! `vnvme demo`: a controller in this process, driven by vnvme's own userspace NVMe
//! driver over the in-process transport (register writes are function calls, DMA
//! memory is shared by address): no VMM, no socket, no guest.

use std::time::Instant;

use nvme_ctrl::{ControllerConfig, PollMode};
use nvme_driver::{CompletionMode, DriverOptions, IoCommand, NvmeDriver};
use nvme_inproc::{InProcessOptions, InProcessTransport};

use crate::nsspec::{human_size, Kind, NsSpec};

/// `vnvme demo`'s arguments.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Namespaces: KIND:SIZE[:lba=512|4096], e.g. ram:64M or null:1G:lba=4096.
    #[arg(long = "ns", default_value = "ram:64M")]
    pub namespaces: Vec<NsSpec>,
    /// I/O queue pairs.
    #[arg(long, default_value_t = 4)]
    pub queues: u16,
    /// Commands to run per queue depth.
    #[arg(long, default_value_t = 20_000)]
    pub commands: u32,
    /// Do not use shadow doorbells.
    #[arg(long)]
    pub no_shadow: bool,
}

/// The queue depths of the closing table.
const DEPTHS: [u32; 4] = [1, 4, 16, 64];

pub fn run(a: DemoArgs) -> Result<(), Box<dyn std::error::Error>> {
    let DemoArgs { namespaces: specs, queues, commands, no_shadow } = a;
    let locks = file_lock::Policy::default();
    let opened = specs
        .iter()
        .enumerate()
        .map(|(i, s)| s.open(Some(i as u32 + 1), &locks))
        .collect::<std::io::Result<Vec<_>>>()?;
    let cfg =
        ControllerConfig { namespaces: opened.iter().map(|o| o.config()).collect(), ..Default::default() };
    if !(1..=cfg.max_io_queues).contains(&queues) {
        return Err(
            format!("--queues {queues}: 1..={} (the controller's queue limit)", cfg.max_io_queues).into()
        );
    }
    // One I/O worker, as `vnvme serve` runs by default.
    let t = InProcessTransport::new(cfg, InProcessOptions { workers: 1, poll: PollMode::Adaptive })?;
    let stats = t.stats_handle();
    let mut d = NvmeDriver::new(
        Box::new(t),
        DriverOptions {
            io_queues: queues,
            queue_size: 256,
            shadow_doorbells: !no_shadow,
            // Sleep on the MSI-X eventfd, as a guest's driver does.
            completion: CompletionMode::Interrupts,
            pool_bytes: 8 << 20,
            ..Default::default()
        },
    )
    .map_err(|e| format!("controller bring-up failed: {e}"))?;
    let c = d.controller();
    println!("controller: {} (serial {}, firmware {})", c.model(), c.serial(), c.firmware());
    println!(
        "  version {}, MDTS {}, {} I/O queue pairs, Doorbell Buffer Config: {}",
        c.version(),
        c.mdts_bytes.map_or("no limit".to_string(), |b| format!("{} KiB", b >> 10)),
        d.io_queue_count(),
        if c.supports_dbbuf() { "offered" } else { "not offered" }
    );
    println!("  shadow doorbells: {}", if d.shadow_doorbells() { "enabled by the host" } else { "off" });
    for (s, ns) in specs.iter().zip(d.namespaces()) {
        let what = match s.kind {
            Kind::Ram => "ram".to_string(),
            Kind::Null(_) => "null".to_string(),
            _ => s.describe(),
        };
        println!(
            "namespace {} ({what}): {}, {} x {} B blocks",
            ns.nsid,
            human_size(ns.size_bytes()),
            ns.blocks(),
            ns.lba_size()
        );
    }

    // Write a pattern, read it back, compare: on every namespace, through every queue.
    let data: Vec<u8> = (0..64 * 1024u32).map(|x| (x.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    for (i, s) in specs.iter().enumerate() {
        let nsid = i as u32 + 1;
        let lba = d.namespace(nsid).ok_or("a namespace the driver did not find")?.lba_size();
        for qid in 1..=queues {
            let slba = (qid as u64 - 1) * (data.len() as u64 / lba);
            let q = d.queue(qid)?;
            q.write(nsid, slba, &data, false)
                .map_err(|e| format!("namespace {nsid} queue {qid}: write: {e}"))?;
            let mut back = vec![0u8; data.len()];
            q.read(nsid, slba, &mut back).map_err(|e| format!("namespace {nsid} queue {qid}: read: {e}"))?;
            // A null namespace reads zeroes; anything else returns what was written.
            if !matches!(s.kind, Kind::Null(_)) && back != data {
                return Err(format!("namespace {nsid} queue {qid}: the data read back differs").into());
            }
        }
        println!("namespace {nsid}: 64 KiB written and read back on {queues} queue(s): ok");
    }

    println!("\n4 KiB random reads on queue 1, namespace 1 ({commands} commands per queue depth):");
    println!("{:>4} {:>12} {:>22} {:>16}", "QD", "commands/s", "trapped doorbells/cmd", "interrupts/cmd");
    let ns = d.namespace(1).ok_or("no namespace 1")?.clone();
    let nlb = (4096 / ns.lba_size()).max(1) as u32;
    let slots = (ns.blocks() / nlb as u64).max(1);
    let q = d.queue(1)?;
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next_lba = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % slots) * nlb as u64
    };
    let mut done = Vec::new();
    for qd in DEPTHS {
        let qd = qd.min(q.depth() as u32 - 1).min(commands);
        let before = stats.snapshot();
        // The doorbell register writes this driver made (each a trap): counted
        // where they are made. The controller's own count lags by a write its
        // I/O worker has not taken yet when the last completion is reaped.
        let rings = |q: &nvme_driver::IoQueue| {
            let s = q.stats();
            s.sq_doorbell_writes + s.cq_doorbell_writes
        };
        let rings_before = rings(q);
        let start = Instant::now();
        let (mut submitted, mut completed) = (0u32, 0u32);
        while submitted < qd {
            let buf = q.alloc_buf(4096)?;
            q.submit(IoCommand::Read { nsid: 1, slba: next_lba(), nlb, buf })?;
            submitted += 1;
        }
        while completed < submitted {
            done.clear();
            q.wait_completions(&mut done)?;
            for c in done.drain(..) {
                completed += 1;
                let buf = c.into_result().map_err(|e| format!("read failed: {e}"))?;
                if let Some(buf) = buf.filter(|_| submitted < commands) {
                    q.submit(IoCommand::Read { nsid: 1, slba: next_lba(), nlb, buf })?;
                    submitted += 1;
                }
            }
        }
        let secs = start.elapsed().as_secs_f64();
        let after = stats.snapshot();
        let per = |n: u64| n as f64 / completed as f64;
        println!(
            "{qd:>4} {:>12.0} {:>22.3} {:>16.3}",
            completed as f64 / secs,
            per(rings(q) - rings_before),
            per(after.interrupts - before.interrupts)
        );
    }
    d.shutdown()?;
    println!(
        "\nthe driver and the controller share this process here (one I/O worker thread); `vnvme serve` \
         puts the controller in its own process behind a vfio-user socket."
    );
    Ok(())
}
