//! The kernel VFIO transport against a real NVMe controller bound to vfio-pci.
//!
//! Needs `/dev/vfio/vfio` and `VNVME_VFIO_BDF=<PCI address>` of an NVMe function bound
//! to vfio-pci (the whole IOMMU group must be bound to vfio-pci or unbound). Without
//! them the test prints `SKIP: <reason>` and records the skip in `$VNVME_SKIP_LOG`.
//!
//! It is non-destructive: it resets and re-enables the controller and reads Identify
//! Controller, but never sends an I/O command or anything that changes media.

use std::path::Path;
use std::time::{Duration, Instant};

use nvme_driver::transport::Transport;
use nvme_driver::vfio::KernelVfioTransport;
use nvme_spec::admin::IdentifyCmd;
use nvme_spec::identify::cns;
use nvme_spec::regs::{doorbell_offset, offset, Cap, Cc, Csts, DoorbellKind};
use nvme_spec::Cqe;

use test_util::skip;

/// The device to test, or why there is none.
fn device() -> Result<String, String> {
    if !Path::new("/dev/vfio/vfio").exists() {
        return Err("/dev/vfio/vfio is absent (no VFIO on this machine)".into());
    }
    match std::env::var("VNVME_VFIO_BDF") {
        Ok(b) if !b.trim().is_empty() => Ok(b),
        _ => Err("VNVME_VFIO_BDF is not set (PCI address of an NVMe device bound to vfio-pci)".into()),
    }
}

fn wait_ready(t: &mut KernelVfioTransport, ready: bool, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let c = Csts(t.read32(offset::CSTS).unwrap());
        assert!(!c.cfs(), "controller fatal status (CSTS {:#x})", c.0);
        if c.rdy() == ready {
            return;
        }
        assert!(Instant::now() < deadline, "CSTS.RDY did not become {ready} within {timeout:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn kernel_vfio_transport_brings_up_a_real_controller() {
    let bdf = match device() {
        Ok(b) => b,
        Err(reason) => return skip(&reason),
    };
    let mut t = KernelVfioTransport::open(&bdf).unwrap_or_else(|e| panic!("open {bdf}: {e}"));
    eprintln!("{}", t.describe());

    let cap = Cap(t.read64(offset::CAP).unwrap());
    let vs = t.read32(offset::VS).unwrap();
    assert!(vs >> 16 >= 1, "NVMe version {vs:#x}");
    assert_eq!(cap.mpsmin(), 0, "the test uses 4 KiB pages");
    let timeout = Duration::from_millis(500 * cap.to().max(1) as u64);

    t.write32(offset::CC, 0).unwrap();
    wait_ready(&mut t, false, timeout);

    let dma = t.dma_alloc(3 * 4096).unwrap();
    assert!(dma.iova.is_multiple_of(4096) && dma.len >= 3 * 4096);
    let (asq, acq, id) = (dma.iova, dma.iova + 4096, dma.iova + 8192);
    dma.mem.fill(dma.iova, dma.len, 0).unwrap();
    let irqs = t.enable_interrupts(1).unwrap();
    assert_eq!(irqs.len(), 1);

    t.write32(offset::AQA, 0x001f_001f).unwrap();
    t.write64(offset::ASQ, asq).unwrap();
    t.write64(offset::ACQ, acq).unwrap();
    t.write32(offset::CC, Cc::LINUX.with_en(true).0).unwrap();
    wait_ready(&mut t, true, timeout);

    let mut s = IdentifyCmd { cns: cns::CONTROLLER, ..Default::default() }.to_sqe();
    s.set_cid(1);
    s.set_prps(id, 0);
    dma.mem.write_obj(asq, &s).unwrap();
    let dstrd = cap.dstrd();
    t.doorbell(offset::DOORBELL_BASE + doorbell_offset(0, DoorbellKind::SqTail, dstrd), 1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let cqe = loop {
        let c: Cqe = dma.mem.read_obj(acq).unwrap();
        if c.phase() {
            break c;
        }
        assert!(Instant::now() < deadline, "Identify Controller did not complete");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(cqe.cid.get(), 1);
    assert!(cqe.status().is_success(), "Identify Controller: {:?}", cqe.status());
    t.doorbell(offset::DOORBELL_BASE + doorbell_offset(0, DoorbellKind::CqHead, dstrd), 1).unwrap();
    let mut ident = vec![0u8; 4096];
    dma.mem.read(id, &mut ident).unwrap();
    let vid = u16::from_le_bytes([ident[0], ident[1]]);
    let model = String::from_utf8_lossy(&ident[24..64]).trim().to_string();
    eprintln!("Identify Controller: vid {vid:#06x}, model {model:?}");
    assert_ne!(vid, 0);
    // The admin completion queue interrupts on vector 0.
    let fired = (0..500).any(|_| {
        std::thread::sleep(Duration::from_millis(1));
        let mut count = [0u8; 8];
        rustix::io::read(&irqs[0], &mut count).is_ok_and(|n| n == 8 && count != [0; 8])
    });
    assert!(fired, "MSI-X vector 0 did not fire for the admin completion");
    // A mapped BAR0 hands out lock-free doorbell writers.
    let direct = t.direct_doorbell(offset::DOORBELL_BASE).unwrap();
    eprintln!("direct doorbells: {}", if direct.is_some() { "yes (BAR0 mmapped)" } else { "no" });

    t.write32(offset::CC, 0).unwrap();
    wait_ready(&mut t, false, timeout);
    match t.reset() {
        Ok(()) => assert_eq!(t.read32(offset::CC).unwrap() & 1, 0, "CC.EN after a function reset"),
        Err(e) if e.kind() == std::io::ErrorKind::Unsupported => eprintln!("{e}"),
        Err(e) => panic!("reset: {e}"),
    }
    assert!(t.enable_interrupts(0).unwrap().is_empty());
}
