//! `vnvme demo`: the controller in this process, driven by the built-in host.

use std::time::Instant;

use nvme_ctrl::ControllerConfig;
use nvme_spec::opcode::nvm as iop;
use test_kit::{InitOptions, MockHost};

use crate::nsspec::NsSpec;

fn ascii(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim_end_matches([' ', '\0']).to_string()
}

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

pub fn run(a: DemoArgs) -> Result<(), Box<dyn std::error::Error>> {
    let DemoArgs { namespaces: specs, queues, commands, no_shadow } = a;
    let opened = specs.iter().map(|s| s.open()).collect::<std::io::Result<Vec<_>>>()?;
    let cfg =
        ControllerConfig { namespaces: opened.iter().map(|o| o.config()).collect(), ..Default::default() };
    if !(1..=cfg.max_io_queues).contains(&queues) {
        return Err(format!("--queues must be 1..={}", cfg.max_io_queues).into());
    }
    let mut h = MockHost::new(cfg, 256 << 20);
    h.init(InitOptions {
        io_queues: queues,
        queue_size: 256,
        shadow_doorbells: !no_shadow,
        ..Default::default()
    })
    .map_err(|e| format!("controller bring-up failed: {e:?}"))?;
    let id = h.identify(0x01, 0).map_err(|e| format!("{e:?}"))?;
    let oacs = u16::from_le_bytes([id[256], id[257]]);
    println!(
        "controller: {} (serial {}, firmware {})",
        ascii(&id[24..64]),
        ascii(&id[4..24]),
        ascii(&id[64..72])
    );
    println!(
        "  version 1.4, MDTS {} KiB, {} I/O queue pairs, OACS {:#06x} (Doorbell Buffer Config: {})",
        (1u32 << id[77]) * 4,
        queues,
        oacs,
        if oacs & (1 << 8) != 0 { "yes" } else { "no" }
    );
    println!("  shadow doorbells: {}", if h.dbbuf.is_some() { "enabled by the host" } else { "off" });
    for (i, s) in specs.iter().enumerate() {
        let nsid = i as u32 + 1;
        let ns = h.identify(0x00, nsid).map_err(|e| format!("{e:?}"))?;
        let nsze = u64::from_le_bytes(ns[0..8].try_into()?);
        let lbads = ns[128 + 4 * (ns[26] & 0xf) as usize + 2];
        println!(
            "namespace {nsid}: {} {} MiB, {} x {} B blocks",
            s.describe(),
            opened[i].backend.info().size >> 20,
            nsze,
            1u32 << lbads
        );
    }

    // Write a pattern, read it back, compare: on every namespace, through every queue.
    for (i, s) in specs.iter().enumerate() {
        let nsid = i as u32 + 1;
        let lba = if opened[i].lba_format == 0 { 512 } else { 4096 };
        let data: Vec<u8> = (0..64 * 1024u32).map(|x| (x.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for q in 1..=queues {
            let slba = (q as u64 - 1) * (data.len() / lba as usize) as u64;
            let st = h.write_blocks(q, nsid, slba, lba, &data);
            let (st2, back) = h.read_blocks(q, nsid, slba, (data.len() / lba as usize) as u32, lba);
            let ok =
                st.is_success() && st2.is_success() && (s.kind != crate::nsspec::Kind::Ram || back == data);
            if !ok {
                return Err(format!(
                    "namespace {nsid} queue {q}: write {st:?} read {st2:?}, data match {}",
                    back == data
                )
                .into());
            }
        }
        println!("namespace {nsid}: 64 KiB written and read back on {queues} queue(s): ok");
    }

    println!("\n4 KiB random reads on queue 1, namespace 1 ({commands} commands per queue depth):");
    println!("{:>4} {:>12} {:>22} {:>16}", "QD", "commands/s", "trapped doorbells/cmd", "interrupts/cmd");
    let lba = if opened[0].lba_format == 0 { 512u32 } else { 4096 };
    let nlb = 4096 / lba;
    let blocks = opened[0].backend.info().size / lba as u64;
    let buf = h.alloc.alloc_pages(1);
    for qd in [1u32, 4, 16, 64] {
        let before = h.ctrl.stats();
        let start = Instant::now();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next_lba = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % (blocks / nlb as u64)) * nlb as u64
        };
        let (mut submitted, mut completed) = (0u32, 0u32);
        while submitted < qd.min(commands) {
            let s = h.rw_sqe(iop::READ, 1, next_lba(), nlb, buf, 4096);
            h.submit(1, s).ok_or("queue full")?;
            submitted += 1;
        }
        while completed < commands {
            h.process();
            let got = h.reap_queue(1);
            for c in &got {
                if !c.status().is_success() {
                    return Err(format!("read failed: {}", c.status()).into());
                }
            }
            completed += got.len() as u32;
            for _ in 0..got.len() {
                if submitted < commands {
                    let s = h.rw_sqe(iop::READ, 1, next_lba(), nlb, buf, 4096);
                    h.submit(1, s).ok_or("queue full")?;
                    submitted += 1;
                }
            }
        }
        let secs = start.elapsed().as_secs_f64();
        let d = h.ctrl.stats() - before;
        println!(
            "{qd:>4} {:>12.0} {:>22.3} {:>16.3}",
            commands as f64 / secs,
            d.io_doorbell_writes as f64 / commands as f64,
            d.interrupts as f64 / commands as f64
        );
    }
    println!("\nhost and device share one thread here; `vnvme serve` (vfio-user) puts the device in its own process.");
    Ok(())
}
