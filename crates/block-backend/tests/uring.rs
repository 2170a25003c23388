//! The io_uring backend against real files (ext4 or whatever the temp dir is, tmpfs
//! under /dev/shm when there is one) and, when loop devices work, a block device.
//! Where loop devices are unavailable the block-device test prints `SKIP: <reason>`
//! and records the skip in `$VNVME_SKIP_LOG`.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use block_backend::{
    Backend, BackendError, BackendQueue, Completion, DataBuf, DirectMode, Op, Request, Segment, UringBackend,
    UringOptions,
};
use guest_mem::GuestMemory;
use test_util::pattern;

const MIB: u64 = 1 << 20;

use test_util::skip;

/// A file that is removed when the test ends, however it ends.
struct TempFile(PathBuf);

impl TempFile {
    fn new(dir: &Path, name: &str) -> Self {
        let p = dir.join(format!("vnvme-uring-{}-{name}.img", std::process::id()));
        let _ = std::fs::remove_file(&p);
        TempFile(p)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The directories to test files in: the temp dir, and tmpfs when there is one.
fn dirs() -> Vec<PathBuf> {
    let mut v = vec![std::env::temp_dir()];
    if Path::new("/dev/shm").is_dir() {
        v.push(PathBuf::from("/dev/shm"));
    }
    v
}

fn opts(size: u64, direct: DirectMode) -> UringOptions {
    UringOptions { direct, create_size: Some(size), ..Default::default() }
}

/// Waits up to `ms` for the queue's notifier to become readable.
fn readable(q: &dyn BackendQueue, ms: i32) -> bool {
    let fd = q.notifier().expect("uring queues have a notifier");
    let mut pfd = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd, and the count says so.
    let r = unsafe { libc::poll(&mut pfd, 1, ms) };
    r == 1 && pfd.revents & libc::POLLIN != 0
}

/// Commits, then sleeps on the notifier and reaps until `n` completions are in.
fn wait(q: &mut dyn BackendQueue, n: usize) -> Vec<Completion> {
    q.commit();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while out.len() < n {
        assert!(Instant::now() < deadline, "only {} of {n} completions arrived", out.len());
        if q.reap(&mut out) == 0 {
            readable(q, 100);
        }
    }
    assert_eq!(out.len(), n, "more completions than requests");
    out
}

/// Runs one request to completion.
fn run(
    q: &mut dyn BackendQueue,
    mem: &GuestMemory,
    op: Op,
    offset: u64,
    len: u64,
    data: DataBuf,
) -> Completion {
    q.submit(mem, Request { tag: 77, op, offset, len, data });
    let c = wait(q, 1).pop().unwrap();
    assert_eq!(c.tag, 77);
    c
}

fn ok(c: &Completion) {
    if let Err(e) = &c.result {
        panic!("request {} failed: {e}", c.tag);
    }
}

fn guest(segs: &[(u64, u64)]) -> DataBuf {
    DataBuf::Guest(segs.iter().map(|&(gpa, len)| Segment::Guest { gpa, len }).collect())
}

fn file_bytes(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    File::open(path).unwrap().read_exact_at(&mut v, offset).unwrap();
    v
}

fn host(c: Completion) -> Vec<u8> {
    ok(&c);
    match c.data {
        DataBuf::Host(v) => v,
        d => panic!("expected a host buffer back, got {d:?}"),
    }
}

/// Writes and reads through guest memory with aligned, misaligned and bit-bucket
/// segments, a misaligned file offset, and host buffers; checks against the file.
fn round_trip(path: &Path, direct: DirectMode) -> UringBackend {
    let be = UringBackend::open(path, opts(4 * MIB, direct)).unwrap();
    let info = be.info();
    assert_eq!(info.size, 4 * MIB);
    assert_eq!(info.block_size, 1);
    assert!(info.volatile_cache);
    assert_eq!(info.kind.contains("O_DIRECT"), be.is_direct(), "{}", info.kind);
    let mut q = be.open_queue().unwrap();
    let q = q.as_mut();
    let mem = GuestMemory::anonymous(&[(0, MIB)]).unwrap();
    let data = pattern(1, 0x10000);
    mem.write(0x10000, &data).unwrap();

    // Aligned pages: zero copy.
    ok(&run(q, &mem, Op::Write { fua: false }, 0, 8192, guest(&[(0x10000, 4096), (0x12000, 4096)])));
    let mut want = data[..4096].to_vec();
    want.extend_from_slice(&data[0x2000..0x3000]);
    assert_eq!(file_bytes(path, 0, 8192), want);

    // Misaligned guest buffers: bounced in direct mode.
    ok(&run(q, &mem, Op::Write { fua: false }, 8192, 4096, guest(&[(0x13003, 1000), (0x14001, 3096)])));
    let mut want = data[0x3003..0x3003 + 1000].to_vec();
    want.extend_from_slice(&data[0x4001..0x4001 + 3096]);
    assert_eq!(file_bytes(path, 8192, 4096), want);

    // A misaligned offset and length: the buffered descriptor in direct mode.
    ok(&run(q, &mem, Op::Write { fua: false }, 100, 300, guest(&[(0x15000, 300)])));
    assert_eq!(file_bytes(path, 100, 300), data[0x5000..0x5000 + 300]);

    // Host buffers.
    let hw = pattern(9, 5000);
    let c = run(q, &mem, Op::Write { fua: false }, MIB + 3, 5000, DataBuf::Host(hw.clone()));
    ok(&c);
    assert_eq!(file_bytes(path, MIB + 3, 5000), hw);
    let back = host(run(q, &mem, Op::Read, MIB + 3, 5000, DataBuf::Host(Vec::new())));
    assert_eq!(back, hw);

    // Read back the first 12 KiB in assorted ways.
    let disk = file_bytes(path, 0, 3 * 4096);
    ok(&run(q, &mem, Op::Read, 0, 12288, guest(&[(0x40000, 8192), (0x43000, 4096)])));
    let mut got = vec![0u8; 12288];
    mem.read(0x40000, &mut got[..8192]).unwrap();
    mem.read(0x43000, &mut got[8192..]).unwrap();
    assert_eq!(got, disk);
    ok(&run(q, &mem, Op::Read, 4096, 8192, guest(&[(0x50007, 5000), (0x52001, 3192)])));
    let mut got = vec![0u8; 8192];
    mem.read(0x50007, &mut got[..5000]).unwrap();
    mem.read(0x52001, &mut got[5000..]).unwrap();
    assert_eq!(got, disk[4096..]);
    let back = host(run(q, &mem, Op::Read, 50, 1000, DataBuf::Host(vec![0; 1000])));
    assert_eq!(back, disk[50..1050]);

    // Bit buckets: whole sectors (scratch buffer) and odd sizes (bounce).
    mem.fill(0x60000, 0x10000, 0xee).unwrap();
    let segs = vec![
        Segment::Guest { gpa: 0x60000, len: 512 },
        Segment::Discard { len: 3072 },
        Segment::Guest { gpa: 0x61000, len: 512 },
    ];
    ok(&run(q, &mem, Op::Read, 0, 4096, DataBuf::Guest(segs)));
    let mut a = vec![0u8; 512];
    mem.read(0x60000, &mut a).unwrap();
    assert_eq!(a, disk[..512]);
    mem.read(0x61000, &mut a).unwrap();
    assert_eq!(a, disk[3584..4096]);
    let mut b = vec![0u8; 512];
    mem.read(0x60200, &mut b).unwrap();
    assert_eq!(b, vec![0xee; 512], "a bit bucket must not land in guest memory");
    let segs = vec![Segment::Discard { len: 100 }, Segment::Guest { gpa: 0x62000, len: 412 }];
    ok(&run(q, &mem, Op::Read, 8192, 512, DataBuf::Guest(segs)));
    let mut a = vec![0u8; 412];
    mem.read(0x62000, &mut a).unwrap();
    assert_eq!(a, disk[8192 + 100..8192 + 512]);
    // A read with no buffer at all (Verify).
    ok(&run(q, &mem, Op::Read, 0, 64 << 10, DataBuf::None));

    // Unmapped guest memory fails the request, and the buffer comes back.
    let c = run(q, &mem, Op::Read, 0, 4096, guest(&[(MIB - 2048, 4096)]));
    assert!(matches!(c.result, Err(BackendError::Memory(_))), "{:?}", c.result);
    assert!(matches!(c.data, DataBuf::Guest(ref s) if s.len() == 1));
    assert_eq!(q.in_flight(), 0);
    be
}

#[test]
fn round_trip_direct_and_buffered() {
    for dir in dirs() {
        let f = TempFile::new(&dir, "rt-auto");
        let be = round_trip(&f.0, DirectMode::Auto);
        eprintln!(
            "{}: direct={} align={:?} info={:?}",
            dir.display(),
            be.is_direct(),
            be.alignment(),
            be.info()
        );
        let f = TempFile::new(&dir, "rt-off");
        let be = round_trip(&f.0, DirectMode::Off);
        assert!(!be.is_direct());
        assert!(be.info().kind.ends_with("(buffered)"));
    }
    // ext4 and friends take O_DIRECT; Auto must have chosen it.
    let f = TempFile::new(&std::env::temp_dir(), "rt-on");
    if let Ok(be) = UringBackend::open(&f.0, opts(MIB, DirectMode::On)) {
        assert!(be.is_direct());
        round_trip(&f.0, DirectMode::On);
    }
}

#[test]
fn many_requests_beyond_queue_depth() {
    for dir in dirs() {
        let f = TempFile::new(&dir, "overflow");
        let be = UringBackend::open(&f.0, UringOptions { queue_depth: 4, ..opts(4 * MIB, DirectMode::Auto) })
            .unwrap();
        let mut q = be.open_queue().unwrap();
        let q = q.as_mut();
        let mem = GuestMemory::anonymous(&[(0, MIB)]).unwrap();
        const N: u64 = 200;
        for i in 0..N {
            mem.write(i * 4096, &pattern(i, 4096)).unwrap();
        }
        // Writes in a scrambled order, each from its own page; some with FUA.
        for k in 0..N {
            let i = (k * 7) % N;
            let op = Op::Write { fua: i.is_multiple_of(5) };
            let req = Request { tag: i, op, offset: i * 4096, len: 4096, data: guest(&[(i * 4096, 4096)]) };
            q.submit(&mem, req);
        }
        assert_eq!(q.in_flight(), N as usize);
        let done = wait(q, N as usize);
        assert_eq!(q.in_flight(), 0);
        let mut tags: Vec<u64> = done.iter().map(|c| c.tag).collect();
        done.iter().for_each(ok);
        tags.sort_unstable();
        assert_eq!(tags, (0..N).collect::<Vec<_>>());
        // Reads into host buffers, matched back by tag.
        for i in 0..N {
            let req = Request {
                tag: 1000 + i,
                op: Op::Read,
                offset: i * 4096,
                len: 4096,
                data: DataBuf::Host(vec![0; 4096]),
            };
            q.submit(&mem, req);
            if i % 50 == 49 {
                q.commit();
            }
        }
        let done = wait(q, N as usize);
        let by_tag: HashMap<u64, Completion> = done.into_iter().map(|c| (c.tag, c)).collect();
        assert_eq!(by_tag.len(), N as usize);
        for (tag, c) in by_tag {
            let i = tag - 1000;
            assert_eq!(host(c), pattern(i, 4096), "request {i}");
        }
    }
}

#[test]
fn more_segments_than_iov_max_and_drop_in_flight() {
    let f = TempFile::new(&std::env::temp_dir(), "iovmax");
    let be = UringBackend::open(&f.0, opts(4 * MIB, DirectMode::Auto)).unwrap();
    let mut q = be.open_queue().unwrap();
    let mem = GuestMemory::anonymous(&[(0, 4 * MIB)]).unwrap();
    // 1100 separate 512-byte pieces (every other KiB): beyond IOV_MAX, so bounced.
    let n = 1100u64;
    let data = pattern(11, (2 * n * 512) as usize);
    mem.write(0, &data).unwrap();
    let segs: Vec<(u64, u64)> = (0..n).map(|i| (i * 1024, 512)).collect();
    ok(&run(q.as_mut(), &mem, Op::Write { fua: false }, 4096, n * 512, guest(&segs)));
    let want: Vec<u8> = (0..n as usize).flat_map(|i| data[i * 1024..i * 1024 + 512].to_vec()).collect();
    assert_eq!(file_bytes(&f.0, 4096, want.len()), want);
    let back: Vec<(u64, u64)> = (0..n).map(|i| (2 * MIB + i * 1024 + 512, 512)).collect();
    ok(&run(q.as_mut(), &mem, Op::Read, 4096, n * 512, guest(&back)));
    for (i, &(gpa, _)) in back.iter().enumerate() {
        let mut b = vec![0u8; 512];
        mem.read(gpa, &mut b).unwrap();
        assert_eq!(b, want[i * 512..(i + 1) * 512], "piece {i}");
    }
    // Dropping a queue with requests in flight waits for the kernel to finish them.
    for i in 0..64u64 {
        let req =
            Request { tag: i, op: Op::Read, offset: i * 4096, len: 4096, data: guest(&[(i * 4096, 4096)]) };
        q.submit(&mem, req);
    }
    q.commit();
    drop(q);
    drop(mem);
}

/// FUA and Flush reach the kernel as what makes them durable: a FUA write is a
/// write the kernel completed with RWF_DSYNC (through the direct descriptor and the
/// buffered one alike), a Flush an fdatasync. The data alone would not tell: it is
/// in the page cache either way.
#[test]
fn fua_writes_and_flush_reach_the_kernel_as_dsync_writes_and_fdatasync() {
    let f = TempFile::new(&std::env::temp_dir(), "fua");
    let be = UringBackend::open(&f.0, opts(MIB, DirectMode::Auto)).unwrap();
    let mut q = be.open_queue().unwrap();
    let q = q.as_mut();
    let mem = GuestMemory::anonymous(&[(0, MIB)]).unwrap();
    mem.write(0, &pattern(3, 8192)).unwrap();
    assert_eq!(be.durability(), (0, 0));
    ok(&run(q, &mem, Op::Write { fua: false }, 0, 4096, guest(&[(0, 4096)])));
    assert_eq!(be.durability(), (0, 0), "a plain write asks for nothing");
    ok(&run(q, &mem, Op::Write { fua: true }, 4096, 8192, guest(&[(0, 8192)])));
    ok(&run(q, &mem, Op::Write { fua: true }, 7, 33, guest(&[(0x100, 33)])));
    assert_eq!(be.durability(), (2, 0), "both FUA writes, aligned and not, were RWF_DSYNC");
    ok(&run(q, &mem, Op::Flush, 0, 0, DataBuf::None));
    assert_eq!(be.durability(), (2, 1), "the Flush was an fdatasync");
    assert_eq!(file_bytes(&f.0, 4096, 8192), pattern(3, 8192));
    assert_eq!(file_bytes(&f.0, 7, 33), pattern(3, 8192)[0x100..0x121]);
    assert!(be.stats_line().unwrap().contains("2 FUA writes"));
}

#[test]
fn discard_and_write_zeroes_on_files() {
    for dir in dirs() {
        let f = TempFile::new(&dir, "zero");
        let be = UringBackend::open(&f.0, opts(4 * MIB, DirectMode::Auto)).unwrap();
        let info = be.info();
        eprintln!("{}: discard={} write_zeroes={}", dir.display(), info.discard, info.write_zeroes);
        let mut q = be.open_queue().unwrap();
        let q = q.as_mut();
        let mem = GuestMemory::anonymous(&[(0, MIB)]).unwrap();
        let fill = |q: &mut dyn BackendQueue| {
            let data = pattern(5, MIB as usize);
            ok(&run(q, &mem, Op::Write { fua: false }, 0, MIB, DataBuf::Host(data)));
        };
        let zeroed = |off: u64, len: usize| {
            let b = file_bytes(&f.0, off, len);
            b.iter().all(|&x| x == 0)
        };

        fill(q);
        let blocks_before = std::fs::metadata(&f.0).unwrap().blocks();
        ok(&run(q, &mem, Op::Discard, 64 << 10, 256 << 10, DataBuf::None));
        if info.discard {
            assert!(info.discard_zeroes, "holes in files read as zeroes");
            assert!(zeroed(64 << 10, 256 << 10));
            let blocks_after = std::fs::metadata(&f.0).unwrap().blocks();
            assert!(blocks_after < blocks_before, "{blocks_after} >= {blocks_before}");
            assert_eq!(file_bytes(&f.0, 0, 4096), pattern(5, 4096));
            // Discard also reaches through the guest path: read back zeroes.
            mem.fill(0, 8192, 0xff).unwrap();
            ok(&run(q, &mem, Op::Read, 64 << 10, 8192, guest(&[(0, 8192)])));
            let mut b = vec![0xffu8; 8192];
            mem.read(0, &mut b).unwrap();
            assert!(b.iter().all(|&x| x == 0));
        }

        for dealloc in [false, true] {
            fill(q);
            ok(&run(q, &mem, Op::WriteZeroes { deallocate: dealloc }, 4096, 100 << 10, DataBuf::None));
            assert!(zeroed(4096, 100 << 10), "deallocate={dealloc}");
            // Unaligned edges are fine for files.
            ok(&run(q, &mem, Op::WriteZeroes { deallocate: dealloc }, 300_001, 7777, DataBuf::None));
            assert!(zeroed(300_001, 7777));
            let edge = file_bytes(&f.0, 300_000, 1);
            assert_ne!(edge, [0], "zeroing must stop at its range");
            assert_eq!(file_bytes(&f.0, 0, 4096), pattern(5, 4096));
        }
        assert_eq!(std::fs::metadata(&f.0).unwrap().len(), 4 * MIB, "the size never changes");
    }
}

#[test]
fn truncated_file_is_not_ready() {
    let f = TempFile::new(&std::env::temp_dir(), "trunc");
    let be = UringBackend::open(&f.0, opts(MIB, DirectMode::Auto)).unwrap();
    let mut q = be.open_queue().unwrap();
    let q = q.as_mut();
    let mem = GuestMemory::anonymous(&[(0, MIB)]).unwrap();
    File::options().write(true).open(&f.0).unwrap().set_len(64 << 10).unwrap();
    // Before the new end: fine.
    ok(&run(q, &mem, Op::Read, 0, 4096, guest(&[(0, 4096)])));
    // Past it, and across it.
    for off in [512 << 10, (64 << 10) - 4096] {
        let c = run(q, &mem, Op::Read, off, 8192, guest(&[(0, 8192)]));
        match &c.result {
            Err(BackendError::NotReady(m)) => assert!(m.contains("truncated"), "{m}"),
            r => panic!("read at {off:#x} of a truncated file: {r:?}"),
        }
    }
}

#[test]
fn unlinked_file_is_not_ready() {
    let f = TempFile::new(&std::env::temp_dir(), "unlink");
    let be = UringBackend::open(&f.0, opts(MIB, DirectMode::Auto)).unwrap();
    let mut q = be.open_queue().unwrap();
    let q = q.as_mut();
    let mem = GuestMemory::anonymous(&[(0, MIB)]).unwrap();
    ok(&run(q, &mem, Op::Flush, 0, 0, DataBuf::None));
    std::fs::remove_file(&f.0).unwrap();
    let c = run(q, &mem, Op::Flush, 0, 0, DataBuf::None);
    assert!(matches!(&c.result, Err(BackendError::NotReady(m)) if m.contains("removed")), "{:?}", c.result);
    // Every later request fails the same way, on every queue.
    let c = run(q, &mem, Op::Read, 0, 4096, guest(&[(0, 4096)]));
    assert!(matches!(c.result, Err(BackendError::NotReady(_))), "{:?}", c.result);
    let mut q2 = be.open_queue().unwrap();
    let c = run(q2.as_mut(), &mem, Op::Write { fua: false }, 0, 4096, guest(&[(0, 4096)]));
    assert!(matches!(c.result, Err(BackendError::NotReady(_))), "{:?}", c.result);
}

#[test]
fn out_of_range_and_read_only() {
    let f = TempFile::new(&std::env::temp_dir(), "range");
    let be = UringBackend::open(&f.0, opts(MIB, DirectMode::Auto)).unwrap();
    let mut q = be.open_queue().unwrap();
    let q = q.as_mut();
    let mem = GuestMemory::anonymous(&[(0, MIB)]).unwrap();
    for op in [Op::Read, Op::Write { fua: false }, Op::Discard, Op::WriteZeroes { deallocate: false }] {
        let data = if op == Op::Discard || matches!(op, Op::WriteZeroes { .. }) {
            DataBuf::None
        } else {
            guest(&[(0, 1024)])
        };
        let c = run(q, &mem, op, MIB - 512, 1024, data);
        assert!(matches!(c.result, Err(BackendError::OutOfRange { .. })), "{op:?}: {:?}", c.result);
    }
    let c = run(q, &mem, Op::Read, u64::MAX - 10, 512, guest(&[(0, 512)]));
    assert!(matches!(c.result, Err(BackendError::OutOfRange { .. })));
    drop(be);

    let ro = UringBackend::open(&f.0, UringOptions { read_only: true, ..Default::default() }).unwrap();
    assert!(!ro.info().discard && !ro.info().write_zeroes);
    let mut q = ro.open_queue().unwrap();
    let q = q.as_mut();
    ok(&run(q, &mem, Op::Read, 0, 4096, guest(&[(0, 4096)])));
    ok(&run(q, &mem, Op::Flush, 0, 0, DataBuf::None));
    for op in [Op::Write { fua: false }, Op::Discard, Op::WriteZeroes { deallocate: true }] {
        let data = if op == Op::Discard || matches!(op, Op::WriteZeroes { .. }) {
            DataBuf::None
        } else {
            guest(&[(0, 4096)])
        };
        let c = run(q, &mem, op, 0, 4096, data);
        assert!(matches!(c.result, Err(BackendError::ReadOnly)), "{op:?}: {:?}", c.result);
    }
    // Opening what is not there without a size fails; so does an empty file.
    let missing = TempFile::new(&std::env::temp_dir(), "missing");
    assert!(UringBackend::open(&missing.0, UringOptions::default()).is_err());
    File::create(&missing.0).unwrap();
    assert!(UringBackend::open(&missing.0, UringOptions::default()).is_err());
    let bad = UringOptions { queue_depth: 0, ..opts(MIB, DirectMode::Off) };
    assert!(UringBackend::open(&missing.0, bad).is_err());
}

#[test]
fn notifier_fires_and_reap_drains_it() {
    let f = TempFile::new(&std::env::temp_dir(), "notify");
    let be = UringBackend::open(&f.0, opts(MIB, DirectMode::Auto)).unwrap();
    let mut q = be.open_queue().unwrap();
    let q = q.as_mut();
    let mem = GuestMemory::anonymous(&[(0, MIB)]).unwrap();
    assert!(!readable(q, 0), "idle queue");
    for i in 0..8u64 {
        let req = Request {
            tag: i,
            op: Op::Write { fua: false },
            offset: i * 4096,
            len: 4096,
            data: guest(&[(0, 4096)]),
        };
        q.submit(&mem, req);
    }
    q.commit();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while out.len() < 8 {
        assert!(Instant::now() < deadline);
        // Sleep on the notifier only: it must wake us for every completion.
        if readable(q, 5000) {
            q.reap(&mut out);
        } else {
            panic!("notifier not readable with {} requests in flight", q.in_flight());
        }
    }
    // A completion posted between reap's drain and its look at the ring leaves one
    // stale signal behind; the next reap must clear it (and find nothing).
    if readable(q, 0) {
        assert_eq!(q.reap(&mut out), 0, "a stale signal, not a completion");
    }
    assert!(!readable(q, 0), "reap must drain the notifier");
    assert_eq!(q.in_flight(), 0);
    // Requests that complete at once (here: out of range) also wake the owner.
    q.submit(&mem, Request { tag: 9, op: Op::Read, offset: MIB, len: 512, data: DataBuf::None });
    q.commit();
    assert!(readable(q, 0));
    assert_eq!(q.in_flight(), 1);
    assert_eq!(q.reap(&mut out), 1);
    assert!(!readable(q, 0));
}

/// 1100 separate 512-byte pieces from `base` (every other KiB): beyond IOV_MAX, so
/// the transfer goes through a bounce buffer.
fn scattered(base: u64) -> DataBuf {
    guest(&(0..1100).map(|i| (base + i * 1024, 512)).collect::<Vec<_>>())
}

/// Whether every byte of `len` at `gpa` is `byte`.
fn all(mem: &GuestMemory, gpa: u64, len: usize, byte: u8) -> bool {
    let mut b = vec![0u8; len];
    mem.read(gpa, &mut b).unwrap();
    b.iter().all(|&x| x == byte)
}

/// The revoke guarantee on this wire (block_backend's in-flight core, direct mode,
/// states it). A read through a bounce buffer, given up on while the kernel holds
/// it, completes at once as given up on and leaves guest memory alone; the kernel's
/// completion never reaches the caller; and its bounce buffer and slot are not
/// handed to a write submitted meanwhile (the kernel reads into that buffer when it
/// runs the read, so the write would carry the read's bytes). A read the kernel does
/// straight into guest memory cannot be stopped. A request still waiting for room in
/// the ring never reaches the kernel.
#[test]
fn requests_given_up_on_while_the_kernel_holds_them() {
    let f = TempFile::new(&std::env::temp_dir(), "revoke");
    let be = UringBackend::open(&f.0, opts(4 * MIB, DirectMode::Off)).unwrap();
    let mut q = be.open_queue().unwrap();
    let q = q.as_mut();
    let mem = GuestMemory::anonymous(&[(0, 4 * MIB)]).unwrap();
    let n = 1100 * 512;
    let old = pattern(41, n);
    std::fs::OpenOptions::new().write(true).open(&f.0).unwrap().write_all_at(&old, 0).unwrap();

    // The read's SQE is in the ring when it is revoked; the kernel runs it later.
    mem.fill(0, 2 * MIB, 0xee).unwrap();
    q.submit(&mem, Request { tag: 1, op: Op::Read, offset: 0, len: n as u64, data: scattered(0) });
    assert_eq!(q.revoke(1), Some(true), "a bounced read can be given up on");
    let mut out = Vec::new();
    assert_eq!(q.reap(&mut out), 1, "it completes at once");
    assert!(matches!(out[0].result, Err(BackendError::NotReady(_))), "{:?}", out[0].result);
    assert!(matches!(out[0].data, DataBuf::None));
    assert_eq!(q.in_flight(), 0);
    // A bounced write (reusing the tag) before the kernel has the read done with.
    let new = pattern(42, n);
    for i in 0..1100 {
        mem.write(2 * MIB + i * 1024, &new[i as usize * 512..(i as usize + 1) * 512]).unwrap();
    }
    let w = Request {
        tag: 1,
        op: Op::Write { fua: false },
        offset: MIB,
        len: n as u64,
        data: scattered(2 * MIB),
    };
    q.submit(&mem, w);
    let done = wait(q, 1);
    ok(&done[0]);
    assert!(file_bytes(&f.0, MIB, n) == new, "the write carried another request's bytes");
    // The read's CQE has landed by now: swallowed.
    for _ in 0..5 {
        readable(q, 20);
        assert_eq!(q.reap(&mut out), 0, "the kernel's completion of a revoked read reached the caller");
    }
    assert!(all(&mem, 0, 2 * MIB as usize, 0xee), "a revoked read's data reached guest memory");

    // Straight into guest memory: the kernel cannot be stopped, so revoke says so,
    // and the read completes with its data.
    q.submit(&mem, Request { tag: 2, op: Op::Read, offset: 0, len: 4096, data: guest(&[(0, 4096)]) });
    assert_eq!(q.revoke(2), Some(false), "a zero-copy read with the kernel cannot be stopped");
    ok(&wait(q, 1)[0]);
    let mut got = vec![0u8; 4096];
    mem.read(0, &mut got).unwrap();
    assert!(got == old[..4096], "the zero-copy read's data");
    drop(be);

    // Waiting for room (a ring of one): never reaches the kernel.
    let be =
        UringBackend::open(&f.0, UringOptions { queue_depth: 1, ..opts(4 * MIB, DirectMode::Off) }).unwrap();
    let mut q = be.open_queue().unwrap();
    let q = q.as_mut();
    mem.fill(0, 2 * MIB, 0xee).unwrap();
    q.submit(&mem, Request { tag: 3, op: Op::Read, offset: 0, len: 4096, data: guest(&[(0, 4096)]) });
    q.submit(&mem, Request { tag: 4, op: Op::Read, offset: 0, len: 4096, data: guest(&[(MIB, 4096)]) });
    q.submit(&mem, Request { tag: 5, op: Op::Read, offset: 4096, len: 4096, data: guest(&[(8192, 4096)]) });
    assert_eq!(q.revoke(4), Some(true), "a request waiting for room can be given up on");
    let done: HashMap<u64, Completion> = wait(q, 3).into_iter().map(|c| (c.tag, c)).collect();
    ok(&done[&3]);
    ok(&done[&5]);
    assert!(matches!(done[&4].result, Err(BackendError::NotReady(_))), "{:?}", done[&4].result);
    assert!(all(&mem, MIB, 4096, 0xee), "a request given up on before the kernel had it moved data");
    mem.read(8192, &mut got).unwrap();
    assert!(got == old[4096..8192], "the read after the one given up on");
}

#[test]
fn direct_mode_parses() {
    assert_eq!("auto".parse::<DirectMode>().unwrap(), DirectMode::Auto);
    assert_eq!("On".parse::<DirectMode>().unwrap(), DirectMode::On);
    assert_eq!("false".parse::<DirectMode>().unwrap(), DirectMode::Off);
    assert!("maybe".parse::<DirectMode>().is_err());
    assert_eq!(DirectMode::Off.to_string(), "off");
    let o = UringOptions::default();
    assert_eq!((o.direct, o.queue_depth, o.create_size, o.read_only), (DirectMode::Auto, 128, None, false));
}

/// A loop device over a file, detached (and the file removed) on drop.
struct Loop {
    dev: PathBuf,
    _file: TempFile,
}

impl Loop {
    fn attach(size: u64) -> Result<Loop, String> {
        let file = TempFile::new(&std::env::temp_dir(), "loop");
        File::create(&file.0).and_then(|f| f.set_len(size)).map_err(|e| format!("backing file: {e}"))?;
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&file.0)
            .output()
            .map_err(|e| format!("cannot run losetup: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "losetup -f --show failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if !dev.exists() {
            let _ = Command::new("losetup").arg("-d").arg(&dev).status();
            return Err(format!("losetup gave {} which does not exist", dev.display()));
        }
        Ok(Loop { dev, _file: file })
    }

    fn queue_attr(&self, name: &str) -> u64 {
        let dev = self.dev.file_name().unwrap().to_string_lossy().into_owned();
        std::fs::read_to_string(format!("/sys/block/{dev}/queue/{name}"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

#[test]
fn loop_block_device() {
    let size = 16 * MIB;
    let lo = match Loop::attach(size) {
        Ok(l) => l,
        Err(reason) => return skip(&format!("no loop device for the block-device test: {reason}")),
    };
    let be = match UringBackend::open(&lo.dev, UringOptions { direct: DirectMode::On, ..Default::default() })
    {
        Ok(be) => be,
        Err(e) => return skip(&format!("cannot open {} with O_DIRECT: {e}", lo.dev.display())),
    };
    let info = be.info();
    eprintln!("{}: {info:?} align={:?}", lo.dev.display(), be.alignment());
    assert!(be.is_block_device() && be.is_direct());
    assert_eq!(info.size, size, "BLKGETSIZE64");
    assert!(info.kind.contains("O_DIRECT"), "{}", info.kind);
    let (discard_max, zeroes_max) =
        (lo.queue_attr("discard_max_bytes"), lo.queue_attr("write_zeroes_max_bytes"));
    assert_eq!(info.write_zeroes, zeroes_max > 0);
    assert_eq!(info.write_zeroes_max, zeroes_max);
    assert!(!info.discard_zeroes);
    if info.discard {
        assert!(info.discard_max == discard_max || info.discard_max == zeroes_max, "{info:?}");
    }
    assert!(!(discard_max == 0 && zeroes_max == 0 && info.discard));

    let mut q = be.open_queue().unwrap();
    let q = q.as_mut();
    let mem = GuestMemory::anonymous(&[(0, 4 * MIB)]).unwrap();
    let data = pattern(7, MIB as usize);
    mem.write(0, &data).unwrap();
    // Aligned (straight into guest memory) and misaligned (bounced) buffers, a
    // misaligned offset (buffered descriptor), FUA and flush.
    ok(&run(q, &mem, Op::Write { fua: false }, 0, MIB, guest(&[(0, MIB)])));
    ok(&run(q, &mem, Op::Write { fua: true }, MIB, 8192, guest(&[(0x1003, 8192)])));
    ok(&run(q, &mem, Op::Write { fua: false }, 2 * MIB + 5, 999, guest(&[(0x2000, 999)])));
    ok(&run(q, &mem, Op::Flush, 0, 0, DataBuf::None));
    ok(&run(q, &mem, Op::Read, 0, MIB, guest(&[(MIB, MIB / 2), (2 * MIB + 512, MIB / 2)])));
    let mut got = vec![0u8; MIB as usize];
    mem.read(MIB, &mut got[..MIB as usize / 2]).unwrap();
    mem.read(2 * MIB + 512, &mut got[MIB as usize / 2..]).unwrap();
    assert_eq!(got, data);
    let back = host(run(q, &mem, Op::Read, MIB, 8192, DataBuf::Host(vec![0; 8192])));
    assert_eq!(back, data[0x1003..0x1003 + 8192]);
    let back = host(run(q, &mem, Op::Read, 2 * MIB + 5, 999, DataBuf::Host(Vec::new())));
    assert_eq!(back, data[0x2000..0x2000 + 999]);

    let read = |q: &mut dyn BackendQueue, off: u64, len: usize| -> Vec<u8> {
        host(run(q, &mem, Op::Read, off, len as u64, DataBuf::Host(vec![0xaa; len])))
    };
    // Write zeroes, whole blocks (fallocate) and partial ones (zero buffers).
    for dealloc in [false, true] {
        ok(&run(q, &mem, Op::Write { fua: false }, 0, MIB, guest(&[(0, MIB)])));
        ok(&run(q, &mem, Op::WriteZeroes { deallocate: dealloc }, 64 << 10, 128 << 10, DataBuf::None));
        assert!(read(q, 64 << 10, 128 << 10).iter().all(|&b| b == 0), "deallocate={dealloc}");
        assert_eq!(read(q, 0, 64 << 10), data[..64 << 10]);
        ok(&run(q, &mem, Op::WriteZeroes { deallocate: dealloc }, 300_001, 7777, DataBuf::None));
        assert!(read(q, 300_001, 7777).iter().all(|&b| b == 0));
        assert_eq!(read(q, 300_000, 1), data[300_000..300_001]);
        assert_eq!(read(q, 300_001 + 7777, 1), data[300_001 + 7777..300_001 + 7778]);
    }
    // Discard: advisory, and what it leaves is the device's business.
    ok(&run(q, &mem, Op::Discard, 0, MIB, DataBuf::None));
    ok(&run(q, &mem, Op::Discard, 100, 1000, DataBuf::None));
    let c = run(q, &mem, Op::Read, size - 512, 1024, DataBuf::None);
    assert!(matches!(c.result, Err(BackendError::OutOfRange { .. })));
}

/// Copy inside the file (copy_file_range): the bytes land at the destination, a
/// direct read through the queue sees them (the page cache written back first), a
/// FUA copy is an fdatasync more, and a range past the end fails.
#[test]
fn copy_inside_the_file_lands_and_reads_back_direct() {
    for dir in dirs() {
        for direct in [DirectMode::Auto, DirectMode::Off] {
            let f = TempFile::new(&dir, "copy");
            let be = UringBackend::open(&f.0, opts(4 * MIB, direct)).unwrap();
            assert!(be.info().copy, "{}: copy_file_range within a regular file", dir.display());
            let mut q = be.open_queue().unwrap();
            let q = q.as_mut();
            let mem = GuestMemory::anonymous(&[(0, MIB)]).unwrap();
            let data = pattern(9, 256 << 10);
            ok(&run(q, &mem, Op::Write { fua: false }, 0, 256 << 10, DataBuf::Host(data.clone())));
            ok(&run(q, &mem, Op::Copy { fua: false }, 2 * MIB, 128 << 10, DataBuf::Within(64 << 10)));
            assert_eq!(file_bytes(&f.0, 2 * MIB, 128 << 10), data[64 << 10..192 << 10]);
            let back = host(run(q, &mem, Op::Read, 2 * MIB, 128 << 10, DataBuf::Host(vec![0; 128 << 10])));
            assert_eq!(back, data[64 << 10..192 << 10], "{}: {direct:?}", dir.display());
            let syncs = be.durability().1;
            ok(&run(q, &mem, Op::Copy { fua: true }, 3 * MIB, 4096, DataBuf::Within(0)));
            assert_eq!(be.durability().1, syncs + 1, "a FUA copy is synced");
            let c = run(q, &mem, Op::Copy { fua: false }, 0, 8192, DataBuf::Within(4 * MIB - 4096));
            assert!(c.result.is_err(), "a source past the end");
        }
    }
}
