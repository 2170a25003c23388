//! A backend that never answers cannot wedge anything: a command its backend holds
//! past the namespace's timeout completes with Internal Error (no DNR) while other
//! I/O goes on, a late completion after that is ignored, and Delete SQ, reset and
//! shutdown finish within a bound with requests hung. Driven by fault injection's
//! `hang` and `delay=MS`; every bound is on the controller's clock, which the tests
//! move by hand or one step per reading (no test times anything).

mod io_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use block_backend::{Backend, FaultBackend, FaultRule, RamBackend};
use io_common::*;
use nvme_ctrl::{Clock, ControllerConfig, MonotonicClock, NamespaceConfig, TEARDOWN_BOUND};
use nvme_spec::{Cqe, Status};
use test_kit::{InitOptions, ManualClock, MockHost, SteppingClock};

const NS_BYTES: u64 = 8 << 20;
const LBA: u32 = 512;
/// How long a test waits for something that must happen before it fails (real
/// time; never a measure of speed).
const LONG: Duration = Duration::from_secs(30);

/// The controller's clock for the teardown tests: 1 ms per reading.
fn stepping() -> Arc<SteppingClock> {
    Arc::new(SteppingClock::new(Duration::from_millis(1)))
}

/// Runs `f` and returns how much of `clock`'s time it took (a watchdog ends the
/// test run if a broken bound never lets it return).
fn clock_time<T>(clock: &SteppingClock, f: impl FnOnce() -> T) -> (T, Duration) {
    let t0 = clock.peek();
    let r = test_util::bounded("a teardown on a stepping clock", f);
    (r, clock.peek() - t0)
}

/// Checks a teardown waited for its bound (it did not give up early on what a
/// backend still held) and gave up there (it did not wait one bound per queue,
/// worker or namespace).
fn assert_one_bound(what: &str, took: Duration) {
    assert!(took >= TEARDOWN_BOUND, "{what} gave up after {took:?} of clock time, before the bound");
    assert!(took < 2 * TEARDOWN_BOUND, "{what} took {took:?} of clock time: more than one bound");
}

/// A host whose namespace injects `rules` and times commands out after `timeout`,
/// on `clock`.
fn host(rules: &[&str], timeout: Option<Duration>, clock: Arc<dyn Clock>) -> MockHost {
    host_on(0, rules, timeout, clock)
}

/// As [`host`], its I/O queues run by `workers` worker threads (0: inline).
fn host_on(workers: usize, rules: &[&str], timeout: Option<Duration>, clock: Arc<dyn Clock>) -> MockHost {
    let ram: Arc<dyn Backend> = Arc::new(RamBackend::new(NS_BYTES));
    let be = FaultBackend::new(ram, rules.iter().map(|r| r.parse::<FaultRule>().unwrap()).collect());
    let mut ns = NamespaceConfig::new(Arc::new(be), 0);
    ns.timeout = timeout;
    let cfg = ControllerConfig { namespaces: vec![ns], ..Default::default() };
    let mut h = MockHost::with_clock(cfg, MEM, clock);
    h.ctrl.spawn_workers(workers, nvme_ctrl::PollMode::Off).unwrap();
    h.init(InitOptions { io_queues: 2, queue_size: 64, ..Default::default() }).expect("bring-up");
    h
}

/// Submits a one-block read of `slba` on queue `qid` without running the device.
fn submit_read(h: &mut MockHost, qid: u16, slba: u64) -> u16 {
    let buf = h.alloc.alloc_pages(1);
    let s = h.rw_sqe(READ, 1, slba, 1, (buf, LBA as u64));
    h.submit(qid, s).expect("room")
}

/// Runs the device until a completion for `cid` shows up on `qid` (bounded by LONG).
fn wait_for(h: &mut MockHost, qid: u16, cid: u16) -> Cqe {
    let t = Instant::now();
    while t.elapsed() < LONG {
        h.process();
        if let Some(c) = h.reap_queue(qid).into_iter().find(|c| c.cid.get() == cid) {
            return c;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("no completion for cid {cid} on queue {qid}");
}

#[test]
fn a_hung_read_completes_with_internal_error_after_the_timeout_and_io_goes_on() {
    let clock = Arc::new(ManualClock::default());
    let mut h = host(&["read/hang/lba=100+1"], Some(Duration::from_secs(1)), clock.clone());
    let cid = submit_read(&mut h, 1, 100);
    h.process();
    assert!(h.reap_queue(1).is_empty(), "a hung read does not complete by itself");
    // Other I/O, on the same queue and another, is served meanwhile.
    assert_still_works(&mut h, 1, 1, LBA);
    assert_still_works(&mut h, 2, 1, LBA);
    clock.advance_us(999_000);
    h.process();
    assert!(h.reap_queue(1).is_empty(), "not before the timeout");
    clock.advance_us(2_000);
    let c = wait_for(&mut h, 1, cid);
    assert_status(&c, Status::INTERNAL_ERROR, false);
    assert_eq!(h.ctrl.stats().timeouts, 1);
    assert_still_works(&mut h, 1, 1, LBA);
}

#[test]
fn a_late_completion_after_a_timeout_is_ignored() {
    // The backend answers after 300 ms of real time; the controller's clock says the
    // 10 ms timeout passed long before.
    let clock = Arc::new(ManualClock::default());
    let mut h = host(&["read/delay=300/lba=100+1"], Some(Duration::from_millis(10)), clock.clone());
    let cid = submit_read(&mut h, 1, 100);
    h.process();
    clock.advance_us(20_000);
    let c = wait_for(&mut h, 1, cid);
    assert_status(&c, Status::INTERNAL_ERROR, false);
    // Meanwhile commands reuse command identifiers and tags; once the late request is
    // back, none of them sees a second completion.
    let t = Instant::now();
    let mut extra = Vec::new();
    while t.elapsed() < Duration::from_millis(600) {
        assert_still_works(&mut h, 1, 1, LBA);
        h.process();
        extra.extend(h.reap_queue(1));
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(extra.is_empty(), "completions nobody asked for: {extra:?}");
    assert_eq!(h.ctrl.stats().timeouts, 1);
    // The retired tag came back: a read of the same block now just works.
    let (st, _) = h.read_blocks(1, 1, 101, 1, LBA);
    assert_eq!(st, Status::SUCCESS);
}

#[test]
fn a_delayed_write_completes_successfully_after_the_delay() {
    let mut h = host(&["write/delay=50"], Some(Duration::from_secs(30)), Arc::new(MonotonicClock::default()));
    let data = test_util::Rng::new(7).bytes(LBA as usize);
    let buf = h.alloc.alloc_pages(1);
    h.mem.write(buf, &data).unwrap();
    let s = h.rw_sqe(WRITE, 1, 40, 1, (buf, LBA as u64));
    let cid = h.submit(1, s).unwrap();
    h.process();
    assert!(h.reap_queue(1).is_empty(), "the write is held back");
    // A read is not delayed: it overtakes the write.
    let (st, _) = h.read_blocks(1, 1, 41, 1, LBA);
    assert_eq!(st, Status::SUCCESS);
    let c = wait_for(&mut h, 1, cid);
    assert_status(&c, Status::SUCCESS, false);
    let (st, back) = h.read_blocks(2, 1, 40, 1, LBA);
    assert_eq!((st, back == data), (Status::SUCCESS, true));
    assert_eq!(h.ctrl.stats().timeouts, 0);
}

#[test]
fn delete_sq_with_a_hung_read_aborts_it_within_the_bound() {
    // No timeout: only the teardown bound ends the wait.
    let clock = stepping();
    let mut h = host(&["read/hang/lba=0+1"], None, clock.clone());
    let cid = submit_read(&mut h, 1, 0);
    h.process();
    let (c, took) = clock_time(&clock, || h.remove_io_sq(1).expect("Delete SQ completes"));
    assert_one_bound("Delete SQ", took);
    assert!(c.status().is_success(), "{:?}", c.status());
    let cqes = h.reap_queue(1);
    let aborted = cqes.iter().find(|c| c.cid.get() == cid).expect("the hung read was completed");
    assert_status(aborted, Status::ABORT_SQ_DELETION, false);
    assert_still_works(&mut h, 2, 1, LBA);
}

#[test]
fn reset_with_a_hung_read_finishes_once_it_times_out() {
    let clock = stepping();
    let mut h = host(&["read/hang/lba=0+1"], Some(Duration::from_millis(200)), clock.clone());
    submit_read(&mut h, 1, 0);
    submit_read(&mut h, 2, 0);
    h.process();
    let cc = h.read32(0x14);
    let ((), took) = clock_time(&clock, || h.write32(0x14, cc & !1));
    assert!(took < TEARDOWN_BOUND, "the reset took {took:?} of clock time: it waited past the timeout");
    assert!(!h.csts().rdy());
    assert_eq!(h.ctrl.stats().timeouts, 2);
    // The controller comes back up and serves I/O (the hung requests stay retired).
    h.init(InitOptions { io_queues: 2, queue_size: 64, ..Default::default() }).expect("bring-up again");
    assert_still_works(&mut h, 1, 1, LBA);
}

#[test]
fn shutdown_with_a_hung_read_completes_once_it_times_out() {
    let timeout = Some(Duration::from_millis(200));
    let clock = stepping();
    let mut h = host(&["read/hang/lba=0+1"], timeout, clock.clone());
    let cid = submit_read(&mut h, 1, 0);
    h.process();
    let cc = h.read32(0x14);
    let ((), took) = clock_time(&clock, || h.write32(0x14, cc | 1 << 14)); // CC.SHN = normal
    assert!(took < TEARDOWN_BOUND, "the shutdown took {took:?} of clock time: it waited past the timeout");
    assert_eq!((h.read32(0x1c) >> 2) & 3, 2, "CSTS.SHST = shutdown complete");
    let c = h.reap_queue(1).into_iter().find(|c| c.cid.get() == cid).expect("the hung read was completed");
    assert_status(&c, Status::INTERNAL_ERROR, false);
}

#[test]
fn shutdown_with_reads_hung_on_two_workers_waits_one_bound_not_one_per_worker() {
    let clock = stepping();
    let mut h = host_on(2, &["read/hang/lba=0+1"], None, clock.clone());
    let cids = [submit_read(&mut h, 1, 0), submit_read(&mut h, 2, 0)];
    h.process();
    let cc = h.read32(0x14);
    let ((), took) = clock_time(&clock, || h.write32(0x14, cc | 1 << 14)); // CC.SHN = normal
    assert_one_bound("the shutdown", took);
    assert_eq!((h.read32(0x1c) >> 2) & 3, 2, "CSTS.SHST = shutdown complete");
    for (qid, cid) in [(1u16, cids[0]), (2, cids[1])] {
        let c =
            h.reap_queue(qid).into_iter().find(|c| c.cid.get() == cid).expect("the hung read was completed");
        assert_status(&c, Status::INTERNAL_ERROR, false);
    }
    assert_eq!(h.ctrl.stats().timeouts, 2);
}

/// Format NVM with User Data Erase (`cdw10.SES` = 1).
const SES_USER_DATA: u32 = 1 << 9;

fn submit_erasing_format(h: &mut MockHost) -> u16 {
    let mut s = nvme_spec::Sqe::with_opcode(nvme_spec::opcode::admin::FORMAT_NVM);
    s.nsid = zerocopy::little_endian::U32::new(1);
    s.cdw10 = zerocopy::little_endian::U32::new(SES_USER_DATA);
    h.submit(0, s).expect("admin queue has room")
}

/// An erase runs in pieces between other admin commands, so a backend that never
/// answers holds up only the Format: it fails with Internal Error at the namespace
/// timeout, a second Format meanwhile gets Format In Progress, and the admin queue
/// serves everything else.
#[test]
fn an_erasing_format_whose_backend_hangs_fails_at_the_timeout_and_admin_goes_on() {
    let clock = Arc::new(ManualClock::default());
    let mut h = host(&["discard/hang"], Some(Duration::from_secs(1)), clock.clone());
    let cid = submit_erasing_format(&mut h);
    h.process();
    assert!(h.reap_queue(0).is_empty(), "the erase hangs");
    assert!(h.ctrl.admin_busy());
    h.identify(nvme_spec::identify::cns::CONTROLLER, 0).expect("Identify while the Format runs");
    let second = submit_erasing_format(&mut h);
    let c = wait_for(&mut h, 0, second);
    assert_status(&c, Status::FORMAT_IN_PROGRESS, true);
    clock.advance_us(1_001_000);
    let c = wait_for(&mut h, 0, cid);
    assert_status(&c, Status::INTERNAL_ERROR, false);
    assert!(!h.ctrl.admin_busy());
    assert_still_works(&mut h, 1, 1, LBA);
}

/// A namespace with a volatile write cache is flushed at shutdown; a flush that
/// never completes is given up at the shutdown bound instead of holding the
/// controller (and the thread that wrote CC.SHN) forever.
#[test]
fn shutdown_with_a_hung_flush_completes_within_the_bound() {
    let dir = std::env::temp_dir().join(format!("vnvme-flush-hang-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file: Arc<dyn Backend> =
        Arc::new(block_backend::FileBackend::open(&dir.join("disk.img"), Some(NS_BYTES)).unwrap());
    assert!(file.info().volatile_cache, "files have a write cache to flush");
    let be = FaultBackend::new(file, vec!["flush/hang".parse().unwrap()]);
    let cfg =
        ControllerConfig { namespaces: vec![NamespaceConfig::new(Arc::new(be), 0)], ..Default::default() };
    // 100 ms a reading: the flush's wait sleeps up to 10 ms between readings.
    let clock = Arc::new(SteppingClock::new(Duration::from_millis(100)));
    let mut h = MockHost::with_clock(cfg, MEM, clock.clone());
    h.init(InitOptions { io_queues: 1, queue_size: 64, ..Default::default() }).expect("bring-up");
    let cc = h.read32(0x14);
    let ((), took) = clock_time(&clock, || h.write32(0x14, cc | 1 << 14)); // CC.SHN = normal
    assert_one_bound("the shutdown", took);
    assert_eq!((h.read32(0x1c) >> 2) & 3, 2, "CSTS.SHST = shutdown complete");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A guest cannot pile up work the backend has not finished: once a queue has its
/// size in fetched, unfinished commands, the controller stops fetching from it
/// (entries wait in the ring) until completions free room. A hostile host that keeps
/// writing entries past what it knows the controller has consumed gets no more than
/// that in flight, and loses nothing.
#[test]
fn a_queue_never_has_more_than_its_size_in_flight() {
    const SIZE: u32 = 8;
    let clock = Arc::new(ManualClock::default());
    let mut h = host(&["read/hang"], Some(Duration::from_secs(1)), clock.clone());
    let mut cq = h.new_io_cq(3, 64, false, 0).unwrap();
    let mut sq = h.new_io_sq(3, 3, SIZE).unwrap();
    let buf = h.alloc.alloc_pages(1);
    let read = |h: &mut MockHost, cid: u16| {
        let mut s = h.rw_sqe(READ, 1, 0, 1, (buf, LBA as u64));
        s.set_cid(cid);
        s
    };
    // Seven reads (a full ring as far as the host may know), fetched and hung.
    for cid in 0..SIZE as u16 - 1 {
        let s = read(&mut h, cid);
        h.sq_push(&mut sq.ring, &s);
    }
    h.process();
    // Seven more, ignoring that no completion has told the host of any free slot.
    for cid in 100..100 + SIZE as u16 - 1 {
        let s = read(&mut h, cid);
        h.sq_push(&mut sq.ring, &s);
    }
    h.process();
    assert!(h.pop_cqes(&mut cq, 64).0.is_empty(), "every fetched read hangs");
    // At the timeout, exactly the fetched ones complete: SIZE of them, not 14.
    clock.advance_us(1_001_000);
    h.process();
    let first = h.pop_cqes(&mut cq, 64).0;
    assert_eq!(first.len(), SIZE as usize, "in flight at once: {first:?}");
    assert!(first.iter().all(|c| c.status().code() == Status::INTERNAL_ERROR.code()));
    // The rest were fetched as room freed, and time out in turn: none is lost.
    clock.advance_us(1_001_000);
    h.process();
    let rest = h.pop_cqes(&mut cq, 64).0;
    assert_eq!(first.len() + rest.len(), 2 * (SIZE as usize - 1), "{rest:?}");
}

/// A command given up on must not touch the host's buffer afterwards: the host
/// reuses it as soon as it has the completion. A read held 400 ms at the backend
/// times out at 100 ms; the buffer the host then fills must still hold the host's
/// bytes after the backend's time is long past.
#[test]
fn a_timed_out_read_never_writes_the_buffer_afterwards() {
    let mut h = host(
        &["read/delay=400/lba=0+1"],
        Some(Duration::from_millis(100)),
        Arc::new(MonotonicClock::default()),
    );
    assert_eq!(h.write_blocks(1, 1, 0, LBA, &[0xaa; LBA as usize]), Status::SUCCESS);
    let buf = h.alloc.alloc_pages(1);
    let s = h.rw_sqe(READ, 1, 0, 1, (buf, LBA as u64));
    let cid = h.submit(1, s).unwrap();
    let c = wait_for(&mut h, 1, cid);
    assert_status(&c, Status::INTERNAL_ERROR, false);
    // The host reuses the buffer.
    h.mem.fill(buf, LBA as u64, 0x55).unwrap();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(700) {
        h.process();
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut got = vec![0u8; LBA as usize];
    h.mem.read(buf, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 0x55), "the late read landed in the host's reused buffer");
    assert_still_works(&mut h, 1, 1, LBA);
}

/// A backend that cannot stop a request (as a direct read the kernel is doing):
/// at its timeout the command is not completed, since the data may still land; it
/// completes when the backend is done, and nothing else waits on it.
#[test]
fn a_request_the_backend_cannot_stop_completes_when_it_ends_not_at_the_timeout() {
    use block_backend::{BackendInfo, BackendQueue, Completion, Request};
    use guest_mem::GuestMemory;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Holds reads of LBA 0 until `release` is set; nothing can be revoked.
    #[derive(Debug)]
    struct Stubborn(RamBackend, Arc<AtomicBool>);
    #[derive(Debug)]
    struct StubbornQueue {
        inner: Box<dyn BackendQueue>,
        release: Arc<AtomicBool>,
        held: Vec<(GuestMemory, Request)>,
    }
    impl Backend for Stubborn {
        fn info(&self) -> BackendInfo {
            self.0.info()
        }
        fn open_queue(&self) -> std::io::Result<Box<dyn BackendQueue>> {
            Ok(Box::new(StubbornQueue {
                inner: self.0.open_queue()?,
                release: self.1.clone(),
                held: Vec::new(),
            }))
        }
    }
    impl BackendQueue for StubbornQueue {
        fn submit(&mut self, mem: &GuestMemory, req: Request) {
            if req.op == block_backend::Op::Read && req.offset == 0 {
                self.held.push((mem.clone(), req));
            } else {
                self.inner.submit(mem, req);
            }
        }
        fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
            if self.release.load(Ordering::Relaxed) {
                for (mem, req) in std::mem::take(&mut self.held) {
                    self.inner.submit(&mem, req);
                }
            }
            self.inner.reap(out)
        }
        fn in_flight(&self) -> usize {
            self.inner.in_flight() + self.held.len()
        }
        fn needs_polling(&self) -> bool {
            !self.held.is_empty() || self.inner.needs_polling()
        }
        // revoke: the default, Some(false): it cannot be stopped.
    }

    let release = Arc::new(AtomicBool::new(false));
    let ram = RamBackend::new(NS_BYTES);
    let mut ns = NamespaceConfig::new(Arc::new(Stubborn(ram, release.clone())), 0);
    ns.timeout = Some(Duration::from_millis(50));
    let cfg = ControllerConfig { namespaces: vec![ns], ..Default::default() };
    let clock = Arc::new(ManualClock::default());
    let mut h = MockHost::with_clock(cfg, MEM, clock.clone());
    h.init(InitOptions { io_queues: 2, queue_size: 64, ..Default::default() }).expect("bring-up");
    assert_eq!(h.write_blocks(1, 1, 0, LBA, &[0xcd; LBA as usize]), Status::SUCCESS);
    let buf = h.alloc.alloc_pages(1);
    let s = h.rw_sqe(READ, 1, 0, 1, (buf, LBA as u64));
    let cid = h.submit(1, s).unwrap();
    h.process();
    // Far past the timeout: the read could still land, so it is not completed, and
    // other I/O (on the other queue, whose completions the helper takes) goes on.
    clock.advance_us(1_000_000);
    let mut early = Vec::new();
    for _ in 0..3 {
        h.process();
        early.extend(h.reap_queue(1));
        assert_still_works(&mut h, 2, 1, LBA);
    }
    assert!(early.is_empty(), "completed at the timeout while the read could still land: {early:?}");
    // The backend ends the read: now it completes, with its data.
    release.store(true, Ordering::Relaxed);
    let c = wait_for(&mut h, 1, cid);
    assert_status(&c, Status::SUCCESS, false);
    let mut got = vec![0u8; LBA as usize];
    h.mem.read(buf, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 0xcd), "the read's data, delivered before its completion");
    assert_still_works(&mut h, 1, 1, LBA);
}
