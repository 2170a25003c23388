//! The `nvme://` backend against a downstream vnvme controller served over vfio-user
//! from a thread of this process (the same `vfio-user-server` code `vnvme serve`
//! runs): geometry, data through zero copy (memfd guest memory) and through bounce
//! buffers (anonymous memory, PRP-unfriendly segments, bit buckets, host buffers),
//! MDTS splitting, Flush / Write Zeroes / Dataset Management, downstream statuses,
//! deep queues on the notifier path and on polling, and a downstream that goes away.
//! Every wait is bounded.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use block_backend::{Backend, BackendError, DataBuf, Op, RamBackend, Segment};
use guest_mem::GuestMemory;
use nvme_ctrl::{ControllerConfig, NamespaceConfig, PollMode};
use nvme_disk::{NvmeBackend, NvmeBackendOptions, NvmeTarget, OpenError};
use nvme_driver::{CompletionMode, DriverOptions, NvmeDriver, VfioUserOptions, VfioUserTransport};
use nvme_inproc::{InProcessOptions, InProcessTransport};
use vfio_user_server::DoorbellMode;

mod common;
use common::*;

#[test]
fn info_matches_the_downstream_namespace() {
    let mut ns = TestNs::new(24 * MIB);
    ns.volatile_cache = true;
    ns.write_zeroes_max = MIB;
    ns.discard_max = 2 * MIB;
    let d = Downstream::start(&Setup { ns, lba_format: 1, ..Default::default() });
    let b = NvmeBackend::open(&d.uri("ns=1&queues=2&depth=32")).unwrap();
    let i = b.info();
    assert_eq!(i.size, 24 * MIB);
    assert_eq!(i.block_size, 4096, "the downstream LBA size");
    assert!(i.volatile_cache, "VWC present downstream");
    assert!(i.discard && i.discard_zeroes && i.write_zeroes, "{i:?}");
    assert_eq!(i.write_zeroes_max, MIB, "from WZSL");
    assert_eq!(i.discard_max, 2 * MIB, "from DMRSL");
    assert!(i.kind.starts_with("nvme:"), "{}", i.kind);
    assert_eq!(b.max_transfer(), MIB, "MDTS 8 = 1 MiB");

    // Without a cache or limits downstream, none are reported.
    let d = Downstream::start(&Setup::default());
    let b = NvmeBackend::open(&d.uri("queues=1")).unwrap();
    let i = b.info();
    assert_eq!((i.size, i.block_size), (16 * MIB, 512));
    assert!(!i.volatile_cache);
    assert_eq!((i.write_zeroes_max, i.discard_max), (0, 0));
}

#[test]
fn opening_names_what_is_wrong() {
    let d = Downstream::start(&Setup::default());
    let e = NvmeBackend::open(&d.uri("ns=9")).unwrap_err();
    assert!(matches!(e, OpenError::NoNamespace { nsid: 9, .. }), "{e}");
    assert!(e.to_string().contains("namespace 9 does not exist (active namespaces: 1)"), "{e}");
    let e = NvmeBackend::open("nvme:///nonexistent/vnvme.sock").unwrap_err();
    assert!(e.to_string().contains("/nonexistent/vnvme.sock"), "{e}");
    let e = NvmeBackend::open("nvme://vnvme.sock").unwrap_err();
    assert!(e.to_string().contains("neither a socket path"), "{e}");
    let io: std::io::Error = NvmeBackend::open("nvme:///x.sock?ns=0").unwrap_err().into();
    assert_eq!(io.kind(), std::io::ErrorKind::InvalidInput);
}

#[test]
fn queues_are_handed_out_once_and_come_back() {
    let d = Downstream::start(&Setup::default());
    let opts = NvmeBackendOptions { queues: 2, ..d.uri("depth=16").parse().unwrap() };
    let b = NvmeBackend::open_with(opts).unwrap();
    let q1 = b.open_queue().unwrap();
    let q2 = b.open_queue().unwrap();
    let e = b.open_queue().unwrap_err();
    assert!(e.to_string().contains("raise queues="), "{e}");
    drop(q1);
    let mut q3 = b.open_queue().expect("a dropped queue's pair is reusable");
    write_host(q3.as_mut(), 0, pattern(1, 4096));
    assert_eq!(read_host(q3.as_mut(), 0, 4096), pattern(1, 4096));
    drop((q2, q3));
}

#[test]
fn fd_backed_guest_memory_moves_zero_copy() {
    let d = Downstream::start(&Setup::default());
    let b = NvmeBackend::open(&d.uri("queues=2")).unwrap();
    let mut q = b.open_queue().unwrap();
    // Two regions, as a VM with RAM below and above a hole has.
    let mem = memfd_memory(&[(0, 4 * MIB), (0x1_0000_0000, 4 * MIB)]);
    let before = b.stats();
    // 64 KiB written from scattered pages of both regions, the first at an offset.
    let segs: Vec<(u64, u64)> = (0..16u64)
        .map(|i| {
            let base = if i % 2 == 0 { 0x10_0000 } else { 0x1_0020_0000 };
            (base + i * 0x3000, 0x1000)
        })
        .collect();
    let mut segs_first_off = segs.clone();
    segs_first_off[0] = (segs[0].0 + 0x200, 0xe00);
    segs_first_off.push((0x30_0000, 0x200));
    let data = pattern(7, 0x10000);
    let mut pos = 0;
    for &(gpa, len) in &segs_first_off {
        mem.write(gpa, &data[pos..pos + len as usize]).unwrap();
        pos += len as usize;
    }
    let c =
        run(q.as_mut(), &mem, vec![req(1, Op::Write { fua: true }, 8192, 0x10000, guest(&segs_first_off))]);
    ok(&c);
    // Read it back zero copy into other pages, and through a host buffer (bounced).
    let dst: Vec<(u64, u64)> = (0..16u64).map(|i| (0x1_0030_0000 + i * 0x1000, 0x1000)).collect();
    ok(&run(q.as_mut(), &mem, vec![req(2, Op::Read, 8192, 0x10000, guest(&dst))]));
    let mut back = vec![0u8; 0x10000];
    mem.read(0x1_0030_0000, &mut back).unwrap();
    assert!(back == data, "zero-copy read differs");
    let s = delta(before, b.stats());
    println!("zero copy: {s:?}");
    assert_eq!(s.zero_copy_bytes, 2 * 0x10000);
    assert_eq!(s.zero_copy_commands, 2);
    assert_eq!(s.bounce_bytes, 0, "nothing bounced");
    assert_eq!(s.regions_mapped, 2, "each region mapped once, lazily");
    assert!(read_host(q.as_mut(), 8192, 0x10000) == data, "the data really is downstream");
    let before = b.stats();

    // A new snapshot with one region more: only that region is mapped; the old ones
    // are reused.
    let fd = test_util::memfd::memfd(MIB);
    let mem2 = mem.with_fd_region(0x2_0000_0000, MIB, fd.as_fd(), 0, true).unwrap();
    mem2.write(0x2_0000_0000, &data[..4096]).unwrap();
    ok(&run(
        q.as_mut(),
        &mem2,
        vec![req(3, Op::Write { fua: false }, 0, 4096, guest(&[(0x2_0000_0000, 4096)]))],
    ));
    let s = delta(before, b.stats());
    assert_eq!(s.regions_mapped, 1);
    assert_eq!(s.bounce_bytes, 0);
    // A snapshot without the first region: it is unmapped once nothing uses it.
    let mem3 = mem2.without_region(0, 4 * MIB).unwrap();
    ok(&run(q.as_mut(), &mem3, vec![req(4, Op::Read, 0, 4096, guest(&[(0x1_0000_0000, 4096)]))]));
    let s = delta(before, b.stats());
    assert_eq!((s.regions_mapped, s.regions_unmapped), (1, 1), "{s:?}");
    let mut got = vec![0u8; 4096];
    mem3.read(0x1_0000_0000, &mut got).unwrap();
    assert_eq!(got, data[..4096]);
}

#[test]
fn anonymous_memory_is_bounced() {
    let d = Downstream::start(&Setup::default());
    let b = NvmeBackend::open(&d.uri("queues=1")).unwrap();
    let mut q = b.open_queue().unwrap();
    let mem = GuestMemory::anonymous(&[(0, 4 * MIB)]).unwrap();
    let data = pattern(3, 0x8000);
    mem.write(0x1000, &data).unwrap();
    let before = b.stats();
    ok(&run(q.as_mut(), &mem, vec![req(1, Op::Write { fua: false }, 0, 0x8000, guest(&[(0x1000, 0x8000)]))]));
    ok(&run(q.as_mut(), &mem, vec![req(2, Op::Read, 0, 0x8000, guest(&[(0x20_0000, 0x8000)]))]));
    let mut back = vec![0u8; 0x8000];
    mem.read(0x20_0000, &mut back).unwrap();
    assert!(back == data);
    let s = delta(before, b.stats());
    println!("anonymous memory: {s:?}");
    assert_eq!((s.bounce_bytes, s.zero_copy_bytes), (0x10000, 0));
    assert_eq!(s.regions_mapped, 0);
}

#[test]
fn segments_prps_cannot_describe_are_bounced_correctly() {
    let d = Downstream::start(&Setup::default());
    let b = NvmeBackend::open(&d.uri("queues=1")).unwrap();
    let mut q = b.open_queue().unwrap();
    let mem = memfd_memory(&[(0, 4 * MIB)]);
    let base = pattern(11, 0x4000);
    write_host(q.as_mut(), 0, base.clone());
    let before = b.stats();
    // A middle segment that starts mid-page: no PRP list can say that.
    let segs = [(0x1000, 0x1000), (0x5010, 0x1000), (0x9000, 0x2000)];
    let data = pattern(12, 0x4000);
    let mut pos = 0;
    for &(gpa, len) in &segs {
        mem.write(gpa, &data[pos..pos + len as usize]).unwrap();
        pos += len as usize;
    }
    ok(&run(q.as_mut(), &mem, vec![req(1, Op::Write { fua: false }, 0, 0x4000, guest(&segs))]));
    assert!(read_host(q.as_mut(), 0, 0x4000) == data);
    // A read with a bit bucket in the middle: those bytes go nowhere.
    mem.fill(0x40_0000 - 0x10_0000, 0x10_0000, 0xee).unwrap();
    let dst = 0x30_0000;
    let segs = vec![
        Segment::Guest { gpa: dst, len: 0x1000 },
        Segment::Discard { len: 0x2000 },
        Segment::Guest { gpa: dst + 0x1000, len: 0x1000 },
    ];
    ok(&run(q.as_mut(), &mem, vec![req(2, Op::Read, 0, 0x4000, DataBuf::Guest(segs))]));
    let mut got = vec![0u8; 0x3000];
    mem.read(dst, &mut got).unwrap();
    assert_eq!(got[..0x1000], data[..0x1000]);
    assert_eq!(got[0x1000..0x2000], data[0x3000..]);
    assert!(got[0x2000..].iter().all(|&b| b == 0xee), "nothing written past the segments");
    let s = delta(before, b.stats());
    println!("PRP-unfriendly segments: {s:?}");
    assert_eq!(s.zero_copy_bytes, 0);
    assert_eq!(s.bounce_bytes, 0x8000 + 0x4000, "two bounced requests plus the host read");
    // A bit bucket in a write is refused.
    let c = run(
        q.as_mut(),
        &mem,
        vec![req(
            3,
            Op::Write { fua: false },
            0,
            0x1000,
            DataBuf::Guest(vec![Segment::Discard { len: 0x1000 }]),
        )],
    );
    assert!(matches!(&c[0].result, Err(BackendError::Io(e)) if e.kind() == std::io::ErrorKind::InvalidInput));
}

#[test]
fn requests_beyond_mdts_are_split_and_misaligned_ones_refused() {
    // MDTS 3: 32 KiB per downstream command.
    let d = Downstream::start(&Setup { mdts: 3, ..Default::default() });
    let b = NvmeBackend::open(&d.uri("queues=1&depth=8")).unwrap();
    assert_eq!(b.max_transfer(), 32 << 10);
    let mut q = b.open_queue().unwrap();
    let len = MIB + 0x1000;
    let data = pattern(5, len as usize);
    for mem in [memfd_memory(&[(0, 8 * MIB)]), GuestMemory::anonymous(&[(0, 8 * MIB)]).unwrap()] {
        let before = b.stats();
        // Starts 0x200 into a page, so every piece boundary is mid-page too.
        let src = [(0x200, 0xe00), (0x1000, len - 0xe00)];
        mem.write(0x200, &data).unwrap();
        ok(&run(q.as_mut(), &mem, vec![req(1, Op::Write { fua: false }, 512 * 8, len, guest(&src))]));
        let dst = 0x40_0000 + 0x600;
        ok(&run(q.as_mut(), &mem, vec![req(2, Op::Read, 512 * 8, len, guest(&[(dst, len)]))]));
        let mut back = vec![0u8; len as usize];
        mem.read(dst, &mut back).unwrap();
        assert!(back == data, "split transfer differs");
        let s = delta(before, b.stats());
        println!("split: {s:?}");
        assert_eq!(s.split_requests, 2);
        assert_eq!(s.commands, 2 * len.div_ceil(32 << 10));
        assert_eq!(s.zero_copy_bytes + s.bounce_bytes, 2 * len);
        assert!(s.backlogged > 0, "33 pieces do not fit a queue of 7");
    }
    assert!(read_host(q.as_mut(), 512 * 8, len) == data);
    // Offsets and lengths must be whole downstream blocks.
    let mem = GuestMemory::anonymous(&[(0, MIB)]).unwrap();
    let c = run(
        q.as_mut(),
        &mem,
        vec![
            req(1, Op::Read, 100, 512, guest(&[(0, 512)])),
            req(2, Op::Write { fua: false }, 512, 100, guest(&[(0, 100)])),
        ],
    );
    for c in c {
        assert!(
            matches!(&c.result, Err(BackendError::Io(e)) if e.kind() == std::io::ErrorKind::InvalidInput)
        );
    }
}

#[test]
fn flush_write_zeroes_and_discard() {
    let mut ns = TestNs::new(16 * MIB);
    ns.write_zeroes_max = MIB;
    ns.discard_max = 2 * MIB;
    let d = Downstream::start(&Setup { ns, ..Default::default() });
    let b = NvmeBackend::open(&d.uri("queues=1")).unwrap();
    let mut q = b.open_queue().unwrap();
    write_host(q.as_mut(), 0, pattern(2, 0x10000));
    let none = GuestMemory::empty();
    let c = run(
        q.as_mut(),
        &none,
        vec![
            req(1, Op::Flush, 0, 0, DataBuf::None),
            req(2, Op::WriteZeroes { deallocate: false }, 0x1000, 0x1000, DataBuf::None),
            req(3, Op::WriteZeroes { deallocate: true }, 0x4000, 0x2000, DataBuf::None),
            req(4, Op::Discard, 0x8000, 0x4000, DataBuf::None),
        ],
    );
    ok(&c);
    let got = read_host(q.as_mut(), 0, 0x10000);
    let want = pattern(2, 0x10000);
    for (i, (g, w)) in got.chunks(0x1000).zip(want.chunks(0x1000)).enumerate() {
        let zero = matches!(i, 1 | 4 | 5 | 8..=11);
        if zero {
            assert!(g.iter().all(|&b| b == 0), "block {i} should read as zeroes");
        } else {
            assert_eq!(g, w, "block {i} untouched");
        }
    }
    // Longer than the downstream's limits (WZSL 1 MiB, DMRSL 2 MiB): split.
    let before = b.stats();
    ok(&run(
        q.as_mut(),
        &none,
        vec![req(5, Op::WriteZeroes { deallocate: false }, 0, 16 * MIB, DataBuf::None)],
    ));
    assert_eq!(delta(before, b.stats()).commands, 16);
    let before = b.stats();
    ok(&run(q.as_mut(), &none, vec![req(6, Op::Discard, 0, 16 * MIB, DataBuf::None)]));
    assert_eq!(delta(before, b.stats()).commands, 8);
}

#[test]
fn downstream_statuses_are_passed_through() {
    let d = Downstream::start(&Setup::default());
    let b = NvmeBackend::open(&d.uri("queues=1")).unwrap();
    let mut q = b.open_queue().unwrap();
    let mem = memfd_memory(&[(0, MIB)]);
    let size = b.info().size;
    let c = run(
        q.as_mut(),
        &mem,
        vec![
            req(1, Op::Read, size, 4096, guest(&[(0, 4096)])),
            // Partly past the end, split into pieces: the failing piece's status wins.
            req(2, Op::Write { fua: false }, size - 4096, 8192, guest(&[(0, 8192)])),
            req(3, Op::Read, 0, 4096, guest(&[(0, 4096)])),
        ],
    );
    for c in &c[..2] {
        match &c.result {
            Err(BackendError::Nvme { sct: 0, sc: 0x80, dnr: true }) => {}
            r => panic!("request {}: LBA Out of Range expected, got {r:?}", c.tag),
        }
    }
    assert!(c[2].result.is_ok());
    assert!(b.stats().errors >= 2);
}

fn deep_queue(doorbells: DoorbellMode, uri_opts: &str) {
    let d = Downstream::start(&Setup { doorbells, ..Default::default() });
    let b = NvmeBackend::open(&d.uri(uri_opts)).unwrap();
    let mut q = b.open_queue().unwrap();
    let mem = memfd_memory(&[(0, 8 * MIB)]);
    let n = 300u64;
    for i in 0..n {
        mem.write(i * 8192, &pattern(i, 4096)).unwrap();
    }
    let before = b.stats();
    let writes = (0..n)
        .map(|i| req(i, Op::Write { fua: false }, i * 4096, 4096, guest(&[(i * 8192, 4096)])))
        .collect();
    ok(&run(q.as_mut(), &mem, writes));
    let reads =
        (0..n).map(|i| req(i, Op::Read, i * 4096, 4096, guest(&[(4 * MIB + i * 4096, 4096)]))).collect();
    let c = run(q.as_mut(), &mem, reads);
    ok(&c);
    assert_eq!(c.len(), n as usize);
    for i in 0..n {
        let mut got = vec![0u8; 4096];
        mem.read(4 * MIB + i * 4096, &mut got).unwrap();
        assert!(got == pattern(i, 4096), "block {i}");
    }
    let s = delta(before, b.stats());
    println!("deep queue ({uri_opts}): {s:?}");
    assert_eq!(s.zero_copy_commands, 2 * n);
    assert!(s.backlogged > 0, "{n} requests exceed the downstream queue");
    // Idle: the notifier must not stay readable (an owner would spin).
    if let Some(fd) = q.notifier() {
        assert!(!wait_readable(fd, 20), "notifier readable while idle");
    }
}

#[test]
fn many_requests_in_flight_through_the_notifier() {
    deep_queue(DoorbellMode::Trapped, "queues=2&depth=32");
    deep_queue(DoorbellMode::EventFd, "queues=1&depth=64&doorbells=eventfd");
    deep_queue(DoorbellMode::Mapped, "queues=1&depth=64&doorbells=mapped");
}

#[test]
fn doorbells_default_to_eventfd_when_offered_else_trapped() {
    let d = Downstream::start(&Setup { doorbells: DoorbellMode::EventFd, ..Setup::default() });
    let b = NvmeBackend::open(&d.uri("queues=1")).unwrap();
    assert!(b.describe().contains("doorbells eventfd"), "{}", b.describe());
    drop((b, d));
    let d = Downstream::start(&Setup::default());
    let b = NvmeBackend::open(&d.uri("queues=1")).unwrap();
    assert!(b.describe().contains("doorbells trapped"), "{}", b.describe());
    drop((b, d));
    // Asked for explicitly, a mode the server lacks is an error, not a fallback.
    let d = Downstream::start(&Setup::default());
    assert!(NvmeBackend::open(&d.uri("queues=1&doorbells=eventfd")).is_err());
}

#[test]
fn many_requests_in_flight_polled() {
    let d = Downstream::start(&Setup::default());
    let b = NvmeBackend::open(&d.uri("queues=1&depth=16&poll=1")).unwrap();
    let q = b.open_queue().unwrap();
    assert!(q.notifier().is_none(), "poll=1 has no notifier");
    drop((q, b, d));
    deep_queue(DoorbellMode::Trapped, "queues=1&depth=16&poll=1");
}

fn goes_away(poll: bool) {
    let s = Setup::default();
    let d = Downstream::start(&s);
    let b = NvmeBackend::open(&d.uri(&format!("queues=2&poll={}", poll as u8))).unwrap();
    let mut q = b.open_queue().unwrap();
    let mem = memfd_memory(&[(0, MIB)]);
    write_host(q.as_mut(), 0, pattern(1, 4096));
    // Hold the downstream's I/O, put requests in flight, then cut the connection.
    s.ns.set_gate(false);
    for i in 0..4 {
        q.submit(&mem, req(i, Op::Read, i * 4096, 4096, guest(&[(i * 4096, 4096)])));
    }
    q.commit();
    std::thread::sleep(Duration::from_millis(50));
    let mut out = Vec::new();
    assert_eq!(q.reap(&mut out), 0, "held back downstream");
    d.kill();
    if let Some(fd) = q.notifier() {
        assert!(wait_readable(fd, TIMEOUT.as_millis() as i64), "the owner is woken");
    }
    let deadline = Instant::now() + TIMEOUT;
    while out.len() < 4 {
        q.reap(&mut out);
        assert!(Instant::now() < deadline, "requests in flight at the end never completed");
        std::thread::yield_now();
    }
    for c in &out {
        assert!(matches!(&c.result, Err(BackendError::NotReady(_))), "{:?}", c.result);
    }
    assert!(b.dead().is_some());
    // Later requests fail at once, on this queue and on another.
    let c = run(q.as_mut(), &mem, vec![req(9, Op::Write { fua: false }, 0, 4096, guest(&[(0, 4096)]))]);
    assert!(matches!(&c[0].result, Err(BackendError::NotReady(_))));
    let mut q2 = b.open_queue().unwrap();
    let c = run(q2.as_mut(), &mem, vec![req(10, Op::Flush, 0, 0, DataBuf::None)]);
    assert!(matches!(&c[0].result, Err(BackendError::NotReady(_))));
    assert_eq!(b.stats().not_ready, 6);
    s.ns.set_gate(true);
    drop((q, q2, b, d));
}

#[test]
fn a_downstream_that_goes_away_fails_requests_not_ready() {
    goes_away(false);
    goes_away(true);
}

#[test]
fn a_vnvme_in_front_of_another_moves_guest_data_zero_copy() {
    // host driver -> vfio-user -> front vnvme (namespace nvme://) -> vfio-user ->
    // downstream vnvme (RAM). The host's DMA memory is memfd-backed, as a VM's RAM is
    // under QEMU, so the front can hand the same pages to the downstream.
    let down = Downstream::start(&Setup::default());
    let backend = NvmeBackend::open(&down.uri("queues=3&depth=64")).unwrap();
    let stats = backend.stats_handle();
    let front = Downstream::serve(Arc::new(backend), &Setup::default());
    let t = VfioUserTransport::connect(&front.socket, VfioUserOptions::default()).unwrap();
    let opts = DriverOptions {
        io_queues: 1,
        queue_size: 64,
        completion: CompletionMode::Interrupts,
        pool_bytes: 4 * MIB,
        timeout: TIMEOUT,
        ..Default::default()
    };
    let mut host = NvmeDriver::new(Box::new(t), opts).unwrap();
    assert_eq!(host.namespace(1).unwrap().size_bytes(), 16 * MIB);
    let before = stats.snapshot();
    let data = pattern(9, MIB as usize);
    host.write(1, 2048, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    host.read(1, 2048, &mut back).unwrap();
    assert!(back == data, "data through two controllers differs");
    host.flush(1).unwrap();
    let s = delta(before, stats.snapshot());
    println!("front vnvme -> downstream vnvme: {s:?}");
    assert_eq!(s.zero_copy_bytes, 2 * MIB, "every byte went zero copy");
    assert_eq!(s.bounce_bytes, 0);
    assert!(s.regions_mapped >= 1);
    host.shutdown().unwrap();
}

#[test]
fn the_in_process_transport_shares_fd_memory_too() {
    let cfg = ControllerConfig {
        namespaces: vec![NamespaceConfig::new(Arc::new(RamBackend::new(4 * MIB)), 1)],
        ..Default::default()
    };
    let t = InProcessTransport::new(cfg, InProcessOptions { workers: 1, poll: PollMode::Off }).unwrap();
    let opts =
        NvmeBackendOptions { queues: 1, ..NvmeBackendOptions::new(NvmeTarget::Other("in-process".into())) };
    let b = NvmeBackend::with_transport(Box::new(t), opts).unwrap();
    assert_eq!((b.info().size, b.info().block_size), (4 * MIB, 4096));
    let mut q = b.open_queue().unwrap();
    let mem = memfd_memory(&[(0x8000_0000, MIB)]);
    let data = pattern(4, 0x20000);
    mem.write(0x8000_0000, &data).unwrap();
    ok(&run(
        q.as_mut(),
        &mem,
        vec![req(1, Op::Write { fua: false }, 0, 0x20000, guest(&[(0x8000_0000, 0x20000)]))],
    ));
    assert!(read_host(q.as_mut(), 0, 0x20000) == data);
    let s = b.stats();
    assert_eq!((s.zero_copy_bytes, s.bounce_bytes), (0x20000, 0x20000), "{s:?}");
    let e = NvmeBackend::open_with(NvmeBackendOptions::new(NvmeTarget::Other("x".into()))).unwrap_err();
    assert!(e.to_string().contains("with_transport"), "{e}");
}
