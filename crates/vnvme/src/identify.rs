//! `vnvme identify`: bring a vfio-user NVMe device up with the userspace driver (admin
//! queue only) and print what Identify says about it.

use std::fmt::Write;
use std::path::PathBuf;

use nvme_driver::{DriverOptions, NvmeDriver, VfioUserOptions, VfioUserTransport};
use nvme_spec::identify::{oacs, oncs, sgls, vwc};

fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

fn bits(v: u32, names: &[(u32, &str)]) -> String {
    let set: Vec<&str> = names.iter().filter(|(b, _)| v & b != 0).map(|(_, n)| *n).collect();
    if set.is_empty() {
        "none".into()
    } else {
        set.join(", ")
    }
}

/// What `vnvme identify` prints for an initialised driver.
pub fn report(d: &NvmeDriver) -> String {
    let c = d.controller();
    let id = &c.id;
    let mut o = String::new();
    let _ = writeln!(o, "controller ({})", d.describe_transport());
    let _ = writeln!(o, "  model              {}", c.model());
    let _ = writeln!(o, "  serial             {}", c.serial());
    let _ = writeln!(o, "  firmware           {}", c.firmware());
    let _ = writeln!(o, "  version            {} (VS {:#010x})", c.version(), c.vs);
    let _ = writeln!(o, "  PCI vendor         {:04x} (subsystem {:04x})", id.vid.get(), id.ssvid.get());
    let _ = writeln!(o, "  controller ID      {}", id.cntlid.get());
    let mdts = match c.mdts_bytes {
        Some(b) => format!("{} ({})", id.mdts, size(b)),
        None => "0 (no limit)".into(),
    };
    let _ = writeln!(o, "  MDTS               {mdts}");
    let cap = c.cap;
    let _ = writeln!(
        o,
        "  CAP                MQES {} entries, TO {} ms, DSTRD {}, page sizes {}..{}",
        cap.mqes_z() as u32 + 1,
        cap.to() as u32 * 500,
        cap.dstrd(),
        size(1 << (12 + cap.mpsmin())),
        size(1 << (12 + cap.mpsmax()))
    );
    let oacs_v = id.oacs.get() as u32;
    let _ = writeln!(
        o,
        "  OACS               {oacs_v:#06x}: {}",
        bits(
            oacs_v,
            &[
                (oacs::SECURITY as u32, "Security"),
                (oacs::FORMAT as u32, "Format NVM"),
                (oacs::FIRMWARE as u32, "Firmware"),
                (oacs::NS_MGMT as u32, "Namespace Management"),
                (oacs::SELF_TEST as u32, "Device Self-test"),
                (oacs::DIRECTIVES as u32, "Directives"),
                (oacs::NVME_MI as u32, "NVMe-MI"),
                (oacs::VIRT_MGMT as u32, "Virtualization Management"),
                (oacs::DOORBELL_BUFFER_CONFIG as u32, "Doorbell Buffer Config"),
                (oacs::GET_LBA_STATUS as u32, "Get LBA Status"),
            ]
        )
    );
    let _ = writeln!(
        o,
        "  Doorbell Buffer Config  {}",
        if c.supports_dbbuf() { "supported (shadow doorbells + EventIdx)" } else { "not supported" }
    );
    let oncs_v = id.oncs.get() as u32;
    let _ = writeln!(
        o,
        "  ONCS               {oncs_v:#06x}: {}",
        bits(
            oncs_v,
            &[
                (oncs::COMPARE as u32, "Compare"),
                (oncs::WRITE_UNCORRECTABLE as u32, "Write Uncorrectable"),
                (oncs::DSM as u32, "Dataset Management"),
                (oncs::WRITE_ZEROES as u32, "Write Zeroes"),
                (oncs::SAVE_SELECT as u32, "Save/Select"),
                (oncs::RESERVATIONS as u32, "Reservations"),
                (oncs::TIMESTAMP as u32, "Timestamp"),
                (oncs::VERIFY as u32, "Verify"),
                (oncs::COPY as u32, "Copy"),
            ]
        )
    );
    let sgls_v = id.sgls.get();
    let support = match sgls_v & sgls::SUPPORT_MASK {
        sgls::SUPPORTED_NO_ALIGN => "SGLs supported",
        sgls::SUPPORTED_DWORD_ALIGN => "SGLs supported (dword aligned)",
        _ => "SGLs not supported",
    };
    let extra = bits(
        sgls_v,
        &[
            (sgls::KEYED, "keyed data block"),
            (sgls::BIT_BUCKET, "bit bucket"),
            (sgls::MPTR_CONTIGUOUS, "contiguous MPTR"),
            (sgls::LENGTH_LARGER_THAN_DATA, "length > data"),
            (sgls::MPTR_SGL, "MPTR SGL"),
            (sgls::ADDRESS_AS_OFFSET, "address as offset"),
        ],
    );
    let _ = writeln!(o, "  SGLS               {sgls_v:#010x}: {support}; {extra}");
    let _ = writeln!(
        o,
        "  VWC                {}",
        if id.vwc & vwc::PRESENT != 0 { "volatile write cache present" } else { "no volatile write cache" }
    );
    let _ = writeln!(o, "  SQES/CQES          {:#04x}/{:#04x}", id.sqes, id.cqes);
    let _ = writeln!(o, "  NN                 {}", id.nn.get());
    for ns in d.namespaces() {
        let nid = &ns.id;
        let cur = nid.flbas & 0xf;
        let _ = writeln!(
            o,
            "namespace {}: {} ({} blocks of {} B), LBA format {} (metadata {} B)",
            ns.nsid,
            size(ns.size_bytes()),
            ns.blocks(),
            ns.lba_size(),
            cur,
            nid.current_lbaf().ms.get()
        );
        let formats: Vec<String> = nid.lbaf[..=(nid.nlbaf as usize).min(63)]
            .iter()
            .enumerate()
            .map(|(i, f)| format!("{i}: {} B + {} B", f.block_size(), f.ms.get()))
            .collect();
        let _ = writeln!(
            o,
            "  capacity {} blocks, in use {} blocks; formats [{}]",
            nid.ncap.get(),
            nid.nuse.get(),
            formats.join(", ")
        );
    }
    o
}

/// What `vnvme identify --json` prints: the same facts, for scripts (sizes in bytes,
/// times in milliseconds, bit fields as numbers and by name).
pub fn report_json(d: &NvmeDriver) -> serde_json::Value {
    let c = d.controller();
    let id = &c.id;
    let cap = c.cap;
    let names = |v: u32, list: &[(u32, &str)]| -> Vec<String> {
        list.iter().filter(|(b, _)| v & b != 0).map(|(_, n)| n.to_string()).collect()
    };
    let namespaces: Vec<serde_json::Value> = d
        .namespaces()
        .iter()
        .map(|ns| {
            let nid = &ns.id;
            serde_json::json!({
                "nsid": ns.nsid,
                "size_bytes": ns.size_bytes(),
                "blocks": ns.blocks(),
                "lba_bytes": ns.lba_size(),
                "lba_format": nid.flbas & 0xf,
                "metadata_bytes": nid.current_lbaf().ms.get(),
                "capacity_blocks": nid.ncap.get(),
                "in_use_blocks": nid.nuse.get(),
                "formats": nid.lbaf[..=(nid.nlbaf as usize).min(63)]
                    .iter()
                    .map(|f| serde_json::json!({ "lba_bytes": f.block_size(), "metadata_bytes": f.ms.get() }))
                    .collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::json!({
        "transport": d.describe_transport(),
        "model": c.model(),
        "serial": c.serial(),
        "firmware": c.firmware(),
        "version": c.version().to_string(),
        "pci_vendor": format!("{:04x}", id.vid.get()),
        "pci_subsystem_vendor": format!("{:04x}", id.ssvid.get()),
        "controller_id": id.cntlid.get(),
        "mdts_bytes": c.mdts_bytes,
        "max_queue_entries": cap.mqes_z() as u32 + 1,
        "ready_timeout_ms": cap.to() as u32 * 500,
        "doorbell_stride": cap.dstrd(),
        "page_bytes_min": 1u64 << (12 + cap.mpsmin()),
        "page_bytes_max": 1u64 << (12 + cap.mpsmax()),
        "oacs": id.oacs.get(),
        "doorbell_buffer_config": c.supports_dbbuf(),
        "oncs": id.oncs.get(),
        "oncs_names": names(id.oncs.get() as u32, &[
            (oncs::COMPARE as u32, "Compare"),
            (oncs::DSM as u32, "Dataset Management"),
            (oncs::WRITE_ZEROES as u32, "Write Zeroes"),
            (oncs::TIMESTAMP as u32, "Timestamp"),
            (oncs::VERIFY as u32, "Verify"),
            (oncs::COPY as u32, "Copy"),
        ]),
        "sgls": id.sgls.get(),
        "volatile_write_cache": id.vwc & vwc::PRESENT != 0,
        "namespace_count": id.nn.get(),
        "namespaces": namespaces,
    })
}

/// `vnvme identify`'s arguments.
#[derive(Debug, clap::Args)]
pub struct IdentifyArgs {
    /// UNIX socket of the vfio-user server (e.g. `vnvme serve --socket`).
    #[arg(long)]
    pub socket: PathBuf,
    /// Print the result as JSON (for scripts).
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: IdentifyArgs) -> Result<(), Box<dyn std::error::Error>> {
    let t = VfioUserTransport::connect(&a.socket, VfioUserOptions::default())
        .map_err(|e| format!("--socket {}: {e}", a.socket.display()))?;
    let d = NvmeDriver::new(Box::new(t), DriverOptions { io_queues: 0, ..Default::default() })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report_json(&d))?);
    } else {
        print!("{}", report(&d));
    }
    d.shutdown()?;
    Ok(())
}
