//! Shared set-up for the admin test tier: RAM namespaces, a host at each stage of
//! bring-up, and the "still works afterwards" check every test ends with.
#![allow(dead_code)]

use std::sync::Arc;

use block_backend::RamBackend;
use nvme_ctrl::{ControllerConfig, NamespaceConfig};
use nvme_spec::{Cqe, Status};
use test_kit::{InitOptions, ManualClock, MockHost};

/// Guest memory every test host gets.
pub const MEM: u64 = 64 << 20;
/// Size of each RAM namespace.
pub const NS_BYTES: u64 = 8 << 20;

/// A configuration with `n` RAM namespaces of [`NS_BYTES`] in the 512 B format.
pub fn ram_cfg(n: usize) -> (ControllerConfig, Vec<RamBackend>) {
    let rams: Vec<RamBackend> = (0..n).map(|_| RamBackend::new(NS_BYTES)).collect();
    let cfg = ControllerConfig {
        namespaces: rams.iter().map(|r| NamespaceConfig::new(Arc::new(r.clone()), 0)).collect(),
        ..Default::default()
    };
    (cfg, rams)
}

/// An enabled controller with one namespace and only the admin queue.
pub fn enabled() -> MockHost {
    let (cfg, _) = ram_cfg(1);
    let mut h = MockHost::new(cfg, MEM);
    h.enable(32).expect("enable");
    h
}

/// A Linux-style bring-up with `io_queues` pairs of 64 entries and shadow doorbells
/// as asked, on one namespace.
pub fn ready(io_queues: u16, shadow: bool) -> (MockHost, RamBackend) {
    let (cfg, mut rams) = ram_cfg(1);
    let mut h = MockHost::new(cfg, MEM);
    h.init(InitOptions { io_queues, queue_size: 64, shadow_doorbells: shadow, ..Default::default() })
        .expect("init");
    (h, rams.remove(0))
}

/// As [`ready`], with a controller clock the test moves by hand.
pub fn ready_with_clock(cfg: ControllerConfig, io_queues: u16, shadow: bool) -> (MockHost, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::default());
    let mut h = MockHost::with_clock(cfg, MEM, clock.clone());
    h.init(InitOptions { io_queues, queue_size: 64, shadow_doorbells: shadow, ..Default::default() })
        .expect("init");
    (h, clock)
}

/// Asserts a completion's exact status: SCT, SC and DNR (and that More is clear).
#[track_caller]
pub fn assert_status(got: Status, want: Status) {
    assert_eq!(got, want, "status: got {got:?}, want {want:?}");
}

#[track_caller]
pub fn assert_cqe(c: &Cqe, want: Status) {
    assert_status(c.status(), want);
}

/// The controller keeps working: it is ready without a fatal status, a good admin
/// command (Identify Controller) succeeds, and, if I/O queue 1 exists, so does a read.
#[track_caller]
pub fn assert_alive(h: &mut MockHost) {
    let csts = h.csts();
    assert!(csts.rdy() && !csts.cfs(), "controller not ready: CSTS {:#x}", csts.0);
    let id = h.identify(0x01, 0).expect("Identify Controller after the error");
    assert_eq!(&id[4..13], b"VNVME0001");
    if h.io.first().is_some_and(|q| q.qid == 1) {
        let (st, _) = h.read_blocks(1, 1, 0, 1, 4096);
        assert_eq!(st, Status::SUCCESS, "read on queue 1 after the error");
    }
}

pub fn le16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes(b[off..off + 2].try_into().unwrap())
}
pub fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}
pub fn le64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}
/// The low 64 bits of a 128-bit little-endian SMART counter.
pub fn le128_lo(b: &[u8], off: usize) -> u64 {
    assert!(b[off + 8..off + 16].iter().all(|&x| x == 0), "counter above 2^64");
    le64(b, off)
}
