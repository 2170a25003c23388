//! `vnvme serve`: the controller as a vfio-user device.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nvme_ctrl::{Controller, ControllerConfig, NamespaceConfig, PollMode, StatsSnapshot};
use vfio_user_server::pci::PciIds;
use vfio_user_server::{server, Device, DeviceOptions, EventFdInterrupts};

use crate::nsspec::NsSpec;

/// Everything `serve` needs.
#[derive(Debug)]
pub struct ServeArgs {
    pub socket: PathBuf,
    pub namespaces: Vec<NsSpec>,
    pub workers: usize,
    pub poll: PollMode,
    pub queues: u16,
    pub serial: String,
    pub pci_id: (u16, u16),
    pub once: bool,
    pub stats_file: Option<PathBuf>,
    pub doorbells: vfio_user_server::DoorbellMode,
    pub no_shadow_doorbells: bool,
}

pub fn run(a: ServeArgs) -> Result<(), Box<dyn std::error::Error>> {
    let opened = a.namespaces.iter().map(|s| s.open()).collect::<std::io::Result<Vec<_>>>()?;
    let cfg = ControllerConfig {
        serial: a.serial.clone(),
        max_io_queues: a.queues,
        msix_vectors: a.queues + 1,
        shadow_doorbells: !a.no_shadow_doorbells,
        namespaces: opened
            .iter()
            .map(|o| NamespaceConfig { backend: o.backend.clone(), lba_format: o.lba_format })
            .collect(),
        ..Default::default()
    };
    let irqs = Arc::new(EventFdInterrupts::new(cfg.msix_vectors));
    let mut ctrl = Controller::new(cfg, guest_mem::GuestMemory::empty(), irqs.clone())?;
    // A mapped doorbell page produces no notification: workers must poll it.
    let poll = if a.doorbells == vfio_user_server::DoorbellMode::Mapped { PollMode::Always } else { a.poll };
    if poll != a.poll {
        eprintln!(
            "vnvme: --doorbells mapped: workers poll always (the guest's doorbell stores do not notify)"
        );
    }
    ctrl.spawn_workers(a.workers, poll)?;
    let stats = ctrl.stats_handle();
    let opts = DeviceOptions {
        ids: PciIds { vendor: a.pci_id.0, device: a.pci_id.1, ..DeviceOptions::default().ids },
        doorbells: a.doorbells,
    };
    let mut dev = Device::new(ctrl, irqs, opts)?;
    let listener = server::bind(&a.socket)?;
    for (i, o) in opened.iter().enumerate() {
        let bi = o.backend.info();
        eprintln!(
            "vnvme: namespace {}: {} ({} bytes, {}-byte LBAs, write cache {}, discard {}, write zeroes {})",
            i + 1,
            bi.kind,
            bi.size,
            if o.lba_format == 0 { 512 } else { 4096 },
            if bi.volatile_cache { "volatile" } else { "none" },
            if bi.discard { "yes" } else { "no" },
            if bi.write_zeroes { "native" } else { "no" },
        );
    }
    eprintln!(
        "vnvme: serving {} namespace(s) on {} ({}, polling {:?}, doorbells {:?}, {} queue pairs)",
        a.namespaces.len(),
        a.socket.display(),
        if a.workers == 0 { "inline: no workers".to_string() } else { format!("{} worker(s)", a.workers) },
        poll,
        a.doorbells,
        a.queues
    );
    if let Some(path) = a.stats_file.clone() {
        let stats = stats.clone();
        std::thread::Builder::new().name("vnvme-stats".into()).spawn(move || loop {
            let _ = write_stats(&path, &stats.snapshot());
            std::thread::sleep(Duration::from_millis(500));
        })?;
    }
    let r = server::serve(&listener, &mut dev, if a.once { Some(1) } else { None });
    let s = stats.snapshot();
    eprintln!("vnvme: {}", summary(&s));
    for w in dev.ctrl.workers() {
        eprintln!("vnvme: {}", w.stats_line());
    }
    for (i, o) in opened.iter().enumerate() {
        if let Some(line) = o.backend.stats_line() {
            eprintln!("vnvme: namespace {}: {line}", i + 1);
        }
    }
    if let Some(p) = &a.stats_file {
        write_stats(p, &s)?;
    }
    let _ = std::fs::remove_file(&a.socket);
    r.map_err(Into::into)
}

fn summary(s: &StatsSnapshot) -> String {
    let per = |n: u64| if s.io_commands == 0 { 0.0 } else { n as f64 / s.io_commands as f64 };
    format!(
        "{} I/O commands, {} admin; trapped I/O doorbell writes {} ({:.3}/cmd), interrupts {} ({:.3}/cmd)",
        s.io_commands,
        s.admin_commands,
        s.io_doorbell_writes,
        per(s.io_doorbell_writes),
        s.interrupts,
        per(s.interrupts)
    )
}

/// Writes the counters as one JSON object (atomically, via a rename).
fn write_stats(path: &Path, s: &StatsSnapshot) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let v = serde_json::json!({
        "io_commands": s.io_commands,
        "admin_commands": s.admin_commands,
        "doorbell_writes": s.doorbell_writes,
        "io_doorbell_writes": s.io_doorbell_writes,
        "io_cq_doorbell_writes": s.io_cq_doorbell_writes,
        "media_errors": s.media_errors,
        "backend_errors": s.backend_errors,
        "interrupts": s.interrupts,
        "shadow_reads": s.shadow_reads,
        "eventidx_races": s.eventidx_races,
        "errors": s.errors,
        "read_commands": s.read_commands,
        "write_commands": s.write_commands,
        "bytes_read": s.bytes_read,
        "bytes_written": s.bytes_written,
    });
    let mut f = std::fs::File::create(&tmp)?;
    writeln!(f, "{v}")?;
    std::fs::rename(tmp, path)
}

/// Parses `VVVV:DDDD` (hex).
pub fn parse_pci_id(s: &str) -> Result<(u16, u16), String> {
    let (v, d) = s.split_once(':').ok_or("expected VENDOR:DEVICE in hex, e.g. 1b36:0010")?;
    let p = |x: &str| u16::from_str_radix(x, 16).map_err(|_| format!("bad hex id {x:?}"));
    Ok((p(v)?, p(d)?))
}
