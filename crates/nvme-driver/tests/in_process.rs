//! The driver against the controller in the same process (STYLE tier 2), through the
//! test kit's `InProcessTransport` (calls `nvme_ctrl::Controller` directly, with I/O
//! worker threads so the device runs while the driver waits). Exercises bring-up,
//! shadow doorbells, PRP lists, interrupts and the command set without a socket.

use std::sync::Arc;
use std::time::Duration;

use block_backend::RamBackend;
use nvme_ctrl::{ControllerConfig, NamespaceConfig, PollMode};
use nvme_driver::{CompletionMode, DriverOptions, IoCommand, LbaRange, NvmeDriver};
use nvme_inproc::{InProcessOptions, InProcessTransport};
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
