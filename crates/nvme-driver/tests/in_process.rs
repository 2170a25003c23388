//! The driver against the controller in the same process (STYLE tier 2), through the
//! test kit's `InProcessTransport` (calls `nvme_ctrl::Controller` directly, with I/O
//! worker threads so the device runs while the driver waits). Exercises bring-up,
//! shadow doorbells, PRP lists, interrupts and the command set without a socket.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use block_backend::{FaultBackend, RamBackend};
use nvme_ctrl::{ControllerConfig, NamespaceConfig, PollMode};
use nvme_driver::{
    CompletionMode, DmaRegion, DriverError, DriverOptions, IoCommand, LbaRange, NvmeDriver, Transport,
};
use nvme_inproc::{InProcessOptions, InProcessTransport};
use nvme_spec::regs::{offset, Csts};
use test_util::pattern;

fn in_process() -> InProcessTransport {
    let cfg = ControllerConfig {
        namespaces: vec![NamespaceConfig::new(Arc::new(RamBackend::new(16 << 20)), 0)],
        ..Default::default()
    };
    InProcessTransport::new(cfg, InProcessOptions { workers: 1, poll: PollMode::Adaptive }).unwrap()
}

fn driver(shadow: bool, completion: CompletionMode) -> NvmeDriver {
    let opts = DriverOptions {
        io_queues: 1,
        queue_size: 64,
        shadow_doorbells: shadow,
        completion,
        pool_bytes: 4 << 20,
        timeout: Duration::from_secs(10),
    };
    NvmeDriver::new(Box::new(in_process()), opts).unwrap()
}

#[test]
fn bring_up_identify_and_data_round_trip() {
    for (shadow, completion) in [(true, CompletionMode::Polling), (false, CompletionMode::Interrupts)] {
        let mut d = driver(shadow, completion);
        assert_eq!(d.shadow_doorbells(), shadow);
        assert_eq!(d.namespaces().len(), 1);
        assert_eq!(d.namespace(1).unwrap().size_bytes(), 16 << 20);
        // 1 MiB (MDTS): a 256-entry PRP list.
        let data = pattern(3, 1 << 20);
        d.write(1, 100, &data).unwrap();
        let mut got = vec![0u8; data.len()];
        d.read(1, 100, &mut got).unwrap();
        assert!(got == data, "shadow {shadow}: data differs");
        d.deallocate(1, &[LbaRange { slba: 100, nlb: 8 }]).unwrap();
        d.write_zeroes(1, 108, 8, false).unwrap();
        d.flush(1).unwrap();
        let mut head = vec![0xffu8; 8192];
        d.read(1, 100, &mut head).unwrap();
        assert!(head.iter().all(|&b| b == 0));
    }
}

#[test]
fn async_submissions_fill_the_queue_and_report_full() {
    let mut d = driver(true, CompletionMode::Polling);
    let q = d.queue(1).unwrap();
    assert_eq!(q.depth(), 63);
    let mut cids = Vec::new();
    for i in 0..63u64 {
        let buf = q.alloc_buf(4096).unwrap();
        buf.write_at(0, &pattern(i, 4096)).unwrap();
        cids.push(q.submit(IoCommand::Write { nsid: 1, slba: i * 8, nlb: 8, buf, fua: false }).unwrap());
    }
    let buf = q.alloc_buf(4096).unwrap();
    assert!(matches!(
        q.submit(IoCommand::Read { nsid: 1, slba: 0, nlb: 8, buf }),
        Err(nvme_driver::DriverError::QueueFull(1))
    ));
    let mut done = Vec::new();
    while done.len() < 63 {
        q.wait_completions(&mut done).unwrap();
    }
    assert!(done.iter().all(|c| c.status.is_success()));
    drop(done); // the completions hand the write buffers back
    let mut got = vec![0u8; 4096];
    q.read(1, 62 * 8, &mut got).unwrap();
    assert_eq!(got, pattern(62, 4096));
    assert_eq!(q.outstanding(), 0);
    assert_eq!(q.pool().free_bytes(), q.pool().capacity(), "every buffer went back to the pool");
}

/// A transport that reports Controller Fatal Status once told to, as a stand-in for
/// a crashed server does (the commands in flight are never completed).
#[derive(Debug)]
struct FatalOnCue {
    inner: InProcessTransport,
    fatal: Arc<AtomicBool>,
}

impl Transport for FatalOnCue {
    fn read32(&mut self, off: u64) -> io::Result<u32> {
        let v = self.inner.read32(off)?;
        let cfs = off == offset::CSTS && self.fatal.load(Ordering::SeqCst);
        Ok(if cfs { v | Csts::CFS } else { v })
    }
    fn read64(&mut self, off: u64) -> io::Result<u64> {
        self.inner.read64(off)
    }
    fn write32(&mut self, off: u64, value: u32) -> io::Result<()> {
        self.inner.write32(off, value)
    }
    fn write64(&mut self, off: u64, value: u64) -> io::Result<()> {
        self.inner.write64(off, value)
    }
    fn doorbell(&mut self, off: u64, value: u32) -> io::Result<()> {
        self.inner.doorbell(off, value)
    }
    fn dma_alloc(&mut self, len: u64) -> io::Result<DmaRegion> {
        self.inner.dma_alloc(len)
    }
    fn enable_interrupts(&mut self, n: u16) -> io::Result<Vec<OwnedFd>> {
        self.inner.enable_interrupts(n)
    }
    fn reset(&mut self) -> io::Result<()> {
        self.inner.reset()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// issue 49: `vnvme perf` waited out its 60 s command timeout after the controller
/// had reported Controller Fatal Status. A wait that finds no completion reads CSTS
/// (every 100 ms) and fails with the fatal status, polling or on interrupts.
#[test]
fn a_wait_ends_when_the_controller_reports_fatal_status() {
    for completion in [CompletionMode::Polling, CompletionMode::Interrupts] {
        // Reads take 2 s: the fatal status, raised 200 ms in, must end the wait first.
        let slow =
            FaultBackend::new(Arc::new(RamBackend::new(1 << 20)), vec!["read/delay=2000".parse().unwrap()]);
        let cfg = ControllerConfig {
            namespaces: vec![NamespaceConfig::new(Arc::new(slow), 0)],
            ..Default::default()
        };
        let inner =
            InProcessTransport::new(cfg, InProcessOptions { workers: 1, poll: PollMode::Adaptive }).unwrap();
        let fatal = Arc::new(AtomicBool::new(false));
        let t = FatalOnCue { inner, fatal: fatal.clone() };
        let opts = DriverOptions {
            io_queues: 1,
            queue_size: 16,
            shadow_doorbells: true,
            completion,
            pool_bytes: 1 << 20,
            timeout: Duration::from_secs(20),
        };
        let mut d = NvmeDriver::new(Box::new(t), opts).unwrap();
        let cue = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            fatal.store(true, Ordering::SeqCst);
        });
        let t0 = Instant::now();
        let mut buf = vec![0u8; 4096];
        let e = d.read(1, 0, &mut buf).unwrap_err();
        let took = t0.elapsed();
        cue.join().unwrap();
        assert!(
            matches!(e, DriverError::ControllerFatal { csts } if csts & Csts::CFS != 0),
            "{completion:?}: {e}"
        );
        assert!(took < Duration::from_secs(1), "{completion:?}: the wait took {took:?}");
    }
}
