//! Namespaces added, removed and resized under a running host (Controller::
//! add_namespace, remove_namespace, resize_namespace), as the host sees it: the
//! Namespace Attribute Changed notice and the Changed Namespace List log (Base
//! §5.1.2, §5.1.12.1.5), Identify (NN, the active list, a zero-filled structure for an
//! inactive NSID), and I/O on the namespace before, during and after the change,
//! inline and with worker threads.

mod common;

use std::sync::Arc;

use block_backend::{Backend, FaultBackend, FaultRule, RamBackend};
use common::*;
use nvme_ctrl::{NamespaceConfig, NamespaceError};
use nvme_spec::features::fid;
use nvme_spec::log::lid;
use nvme_spec::{Cqe, Status};
use test_kit::{InitOptions, MockHost};

const NS_ATTRIBUTE_CHANGED: u32 = 2 | ((lid::CHANGED_NAMESPACE_LIST as u32) << 16);

/// A host on a controller with room for `nn` namespaces, one RAM namespace at
/// start, notices enabled and an AER outstanding; I/O queues run by `workers`.
fn host(nn: u32, workers: usize) -> MockHost {
    let (mut cfg, _) = ram_cfg(1);
    cfg.max_namespaces = nn;
    let mut h = MockHost::new(cfg, MEM);
    h.ctrl.spawn_workers(workers, nvme_ctrl::PollMode::Off).unwrap();
    h.init(InitOptions { io_queues: 2, queue_size: 64, ..Default::default() }).unwrap();
    assert_cqe(&h.set_features_raw(fid::ASYNC_EVENT_CONFIG, 1 << 8, false), Status::SUCCESS);
    h
}

fn ram(bytes: u64) -> NamespaceConfig {
    NamespaceConfig::new(Arc::new(RamBackend::new(bytes)), 0)
}

/// The next namespace notice: exactly one AER completion, then the changed list
/// (read with RAE clear, so the next change is reported again).
#[track_caller]
fn notice(h: &mut MockHost, aer: u16) -> Vec<u32> {
    let got: Vec<Cqe> = h.reap_admin();
    assert_eq!(got.len(), 1, "one AER completion: {got:?}");
    assert_eq!((got[0].cid.get(), got[0].dw0.get()), (aer, NS_ATTRIBUTE_CHANGED), "{got:?}");
    let (st, data, others) = h.get_log_exec(lid::CHANGED_NAMESPACE_LIST, 0xffff_ffff, 1023, 0, false);
    assert_eq!(st, Status::SUCCESS);
    assert!(others.is_empty());
    data.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).take_while(|&n| n != 0).collect()
}

fn active_list(h: &mut MockHost) -> Vec<u32> {
    let d = h.identify(0x02, 0).unwrap();
    d.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).take_while(|&n| n != 0).collect()
}

fn nsze(h: &mut MockHost, nsid: u32) -> u64 {
    u64::from_le_bytes(h.identify(0x00, nsid).unwrap()[0..8].try_into().unwrap())
}

#[test]
fn nn_has_room_and_an_inactive_nsid_identifies_as_zeroes() {
    let mut h = host(8, 0);
    assert_eq!(le32(&h.identify(0x01, 0).unwrap(), 516), 8, "NN");
    assert_eq!(active_list(&mut h), vec![1]);
    assert!(h.identify(0x00, 5).unwrap().iter().all(|&b| b == 0), "inactive NSID: zero-filled");
    assert_eq!(h.identify_raw(0x00, 9, 0).unwrap_err().code(), Status::INVALID_NAMESPACE.code(), "past NN");
    let (st, _) = h.read_blocks(1, 5, 0, 1, 512);
    assert_eq!(st.code(), Status::INVALID_NAMESPACE.code(), "I/O to an inactive NSID");
}

fn added_namespace_takes_io(workers: usize) {
    let mut h = host(4, workers);
    let aer = h.submit_aer();
    let nsid = h.ctrl.add_namespace(&ram(4 << 20), None).unwrap();
    assert_eq!(nsid, 2, "the lowest free NSID");
    assert_eq!(notice(&mut h, aer), vec![2]);
    assert_eq!(active_list(&mut h), vec![1, 2]);
    assert_eq!(nsze(&mut h, 2), (4 << 20) / 512);
    let data = test_util::pattern(2, 4096);
    for qid in [1, 2] {
        assert_eq!(h.write_blocks(qid, 2, 8, 512, &data), Status::SUCCESS);
        assert_eq!(h.read_blocks(qid, 2, 8, 8, 512), (Status::SUCCESS, data.clone()));
    }
    // At a chosen NSID, and the errors an operator can make.
    assert_eq!(h.ctrl.add_namespace(&ram(1 << 20), Some(4)).unwrap(), 4);
    assert!(matches!(h.ctrl.add_namespace(&ram(1 << 20), Some(4)), Err(NamespaceError::InUse(4))));
    assert!(matches!(h.ctrl.add_namespace(&ram(1 << 20), Some(5)), Err(NamespaceError::OutOfRange(5, 4))));
    assert_eq!(h.ctrl.add_namespace(&ram(1 << 20), None).unwrap(), 3);
    assert!(matches!(h.ctrl.add_namespace(&ram(1 << 20), None), Err(NamespaceError::Full(4))));
    let odd = NamespaceConfig::new(Arc::new(RamBackend::new(1000)), 0);
    assert!(matches!(
        h.ctrl.remove_namespace(3).and(h.ctrl.add_namespace(&odd, None)),
        Err(NamespaceError::Invalid(_))
    ));
    assert_alive(&mut h);
}

#[test]
fn an_added_namespace_is_announced_and_takes_io_inline() {
    added_namespace_takes_io(0);
}

#[test]
fn an_added_namespace_is_announced_and_takes_io_on_workers() {
    added_namespace_takes_io(2);
}

fn removal_ends_io_in_flight(workers: usize) {
    let mut h = host(4, workers);
    // Reads take 300 ms at the backend: one is in flight when the namespace goes.
    let slow = FaultBackend::new(
        Arc::new(RamBackend::new(4 << 20)),
        vec!["read/delay=300".parse::<FaultRule>().unwrap()],
    );
    let cfg = NamespaceConfig { timeout: None, ..NamespaceConfig::new(Arc::new(slow), 0) };
    let nsid = h.ctrl.add_namespace(&cfg, None).unwrap();
    let _ = h.reap_admin();
    let buf = h.alloc.alloc_pages(1);
    let s = h.rw_sqe(nvme_spec::opcode::nvm::READ, nsid, 0, 1, (buf, 512));
    let fetched =
        |h: &MockHost| h.ctrl.queue_snapshots().iter().find(|q| q.qid == 1).map_or(0, |q| q.commands);
    let before = fetched(&h);
    let cid = h.submit(1, s).unwrap();
    // With workers the fetch happens on another thread: wait until it has.
    let t = std::time::Instant::now();
    while fetched(&h) == before {
        h.process();
        assert!(t.elapsed() < std::time::Duration::from_secs(10), "the read was never fetched");
        std::thread::yield_now();
    }
    let aer = h.submit_aer();
    h.ctrl.remove_namespace(nsid).unwrap();
    // Not completed at once: the backend may still write into the read's buffer,
    // which the host would reuse once told the command is over.
    assert!(h.reap_queue(1).is_empty(), "completed while its request is still at the backend");
    // When the backend is done, it ends with the status that says the namespace is gone.
    let t = std::time::Instant::now();
    let c = loop {
        h.process();
        if let Some(c) = h.reap_queue(1).into_iter().find(|c| c.cid.get() == cid) {
            break c;
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(10), "the read in flight never ended");
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    assert_cqe(&c, Status::INVALID_NAMESPACE.with_dnr());
    assert_eq!(notice(&mut h, aer), vec![nsid]);
    assert_eq!(active_list(&mut h), vec![1]);
    assert!(h.identify(0x00, nsid).unwrap().iter().all(|&b| b == 0));
    let (st, _) = h.read_blocks(2, nsid, 0, 1, 512);
    assert_eq!(st, Status::INVALID_NAMESPACE.with_dnr());
    assert!(matches!(h.ctrl.remove_namespace(nsid), Err(NamespaceError::NotFound(_))));
    // The NSID can be used again.
    assert_eq!(h.ctrl.add_namespace(&ram(1 << 20), None).unwrap(), nsid);
    assert_eq!(h.write_blocks(2, nsid, 0, 512, &[7; 512]), Status::SUCCESS);
    assert_alive(&mut h);
}

#[test]
fn removing_a_namespace_ends_its_io_in_flight_inline() {
    removal_ends_io_in_flight(0);
}

#[test]
fn removing_a_namespace_ends_its_io_in_flight_on_workers() {
    removal_ends_io_in_flight(2);
}

#[test]
fn resize_grows_and_shrinks_only_over_no_data_unless_forced() {
    let mut h = host(2, 1);
    let be = RamBackend::new(4 << 20);
    let nsid = h.ctrl.add_namespace(&NamespaceConfig::new(Arc::new(be.clone()), 0), None).unwrap();
    let _ = h.reap_admin();
    let end = (4 << 20) / 512;
    assert_eq!(h.read_blocks(1, nsid, end, 1, 512).0, Status::LBA_OUT_OF_RANGE.with_dnr());

    let aer = h.submit_aer();
    assert_eq!(h.ctrl.resize_namespace(nsid, 8 << 20, false).unwrap(), 4 << 20);
    assert_eq!(notice(&mut h, aer), vec![nsid]);
    assert_eq!(nsze(&mut h, nsid), (8 << 20) / 512);
    assert_eq!(be.info().size, 8 << 20, "the backend grew");
    assert_eq!(h.write_blocks(1, nsid, end + 100, 512, &[9; 512]), Status::SUCCESS, "past the old end");

    // Data past the new end: refused, and nothing changed.
    let e = h.ctrl.resize_namespace(nsid, 4 << 20, false).unwrap_err();
    assert!(matches!(e, NamespaceError::WouldLoseData { .. }), "{e}");
    assert_eq!(nsze(&mut h, nsid), (8 << 20) / 512);
    // Below the data, forced: done; I/O past the new end is out of range.
    h.ctrl.resize_namespace(nsid, 4 << 20, true).unwrap();
    assert_eq!(nsze(&mut h, nsid), end);
    assert_eq!(h.read_blocks(1, nsid, end + 100, 1, 512).0, Status::LBA_OUT_OF_RANGE.with_dnr());
    // A shrink over nothing written needs no force.
    h.ctrl.resize_namespace(nsid, 2 << 20, false).unwrap();
    let bad = h.ctrl.resize_namespace(nsid, 1000, false).unwrap_err();
    assert!(matches!(bad, NamespaceError::Invalid(_)), "{bad}");
    assert!(matches!(h.ctrl.resize_namespace(9, 1 << 20, false), Err(NamespaceError::NotFound(9))));
    assert_alive(&mut h);
}

#[test]
fn a_namespace_that_cannot_be_resized_says_why() {
    let mut h = host(2, 0);
    #[derive(Debug)]
    struct Fixed(RamBackend);
    impl Backend for Fixed {
        fn info(&self) -> block_backend::BackendInfo {
            self.0.info()
        }
        fn open_queue(&self) -> std::io::Result<Box<dyn block_backend::BackendQueue>> {
            self.0.open_queue()
        }
    }
    let nsid = h
        .ctrl
        .add_namespace(&NamespaceConfig::new(Arc::new(Fixed(RamBackend::new(1 << 20))), 0), None)
        .unwrap();
    let e = h.ctrl.resize_namespace(nsid, 2 << 20, false).unwrap_err();
    assert!(matches!(e, NamespaceError::Resize { .. }), "{e}");
    assert_eq!(nsze(&mut h, nsid), (1 << 20) / 512, "unchanged");
}
