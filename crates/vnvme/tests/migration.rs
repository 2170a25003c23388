//! vfio-user live migration (migration v2) across processes: `vnvme perf
//! --verify` acting as the VMM moves a running workload between two servers on
//! the same file, back and forth, with no error and every block checked; and the
//! protocol's edges with a raw client (what is offered, states that do not exist,
//! data in the wrong state, invalid data, a reset out of ERROR, an oversized stream).

mod common;

use std::process::Command;

use common::{expect_error, request, Server};

const VNVME: &str = env!("CARGO_BIN_EXE_vnvme");
const FEATURE: u16 = 16;
const MIG_READ: u16 = 17;
const MIG_WRITE: u16 = 18;
const RESET: u16 = 13;
const GET: u32 = 1 << 16;
const SET: u32 = 1 << 17;
const PROBE: u32 = 1 << 18;

fn feature(flags: u32, data: &[u8]) -> Vec<u8> {
    let mut v = ((8 + data.len()) as u32).to_le_bytes().to_vec();
    v.extend_from_slice(&flags.to_le_bytes());
    v.extend_from_slice(data);
    v
}

fn state(s: u32) -> Vec<u8> {
    feature(SET | 2, &[s.to_le_bytes(), (-1i32).to_le_bytes()].concat())
}

fn mig(size: u32, data: &[u8]) -> Vec<u8> {
    let mut v = (8 + size).to_le_bytes().to_vec();
    v.extend_from_slice(&size.to_le_bytes());
    v.extend_from_slice(data);
    v
}

/// `vnvme perf --verify` (plus `extra`) on server `a`, migrating to `b` every 400
/// ms and back for 3 s: no error, no mismatch, there and back at least. Its output.
fn perf_migrating(a: &Server, b: &Server, extra: &[&str]) -> String {
    let out = Command::new(VNVME)
        .args(["perf", "--socket"])
        .arg(&a.socket)
        .arg("--migrate-to")
        .arg(&b.socket)
        .args(["--migrate-every", "400ms", "--runtime", "3s", "--rw", "randrw", "--mix", "50", "--verify"])
        .args(["--qd", "16", "--doorbells", "shadow"])
        .args(extra)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}\n--- a ---\n{}\n--- b ---\n{}", a.log(), b.log());
    assert!(text.contains("; 0 errors)") && text.contains(" 0 mismatches"), "{text}");
    let line = text.lines().find(|l| l.contains("migrations:")).unwrap_or_else(|| panic!("{text}"));
    let n: u32 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    // There and back at least; how many more fit in the run depends on the host's
    // load (a busy host can take seconds over one).
    assert!(n >= 2, "{line}");
    text
}

fn migrate_under_verified_load(engine: &str, a_args: &[&str], b_args: &[&str]) {
    let dir = common::temp_dir("migration");
    let img = format!("file:{}:64M:engine={engine}", dir.join("shared.img").display());
    let mut a_all = vec!["--ns", img.as_str()];
    a_all.extend_from_slice(a_args);
    // The destination shares the file with the source (--incoming); without it,
    // the file is in use (tests/locks.rs).
    let mut b_all = vec!["--ns", img.as_str(), "--incoming"];
    b_all.extend_from_slice(b_args);
    let a = Server::start_in(&dir, "a", &a_all);
    let b = Server::start_in(&dir, "b", &b_all);
    let text = perf_migrating(&a, &b, &["--queues", "2"]);
    eprintln!("{text}");
    for s in [&a, &b] {
        assert!(s.log().contains("migration state changed"), "{}", s.log());
    }
    drop((a, b));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_verified_workload_moves_between_two_servers_and_back() {
    migrate_under_verified_load("auto", &["--workers", "1"], &["--workers", "1"]);
}

#[test]
fn the_state_moves_between_inline_and_two_workers() {
    // Synchronous reads complete where they are fetched (no reap): the pages they
    // fill must be in the dirty log all the same.
    migrate_under_verified_load("sync", &["--workers", "0"], &["--workers", "2"]);
}

/// `struct vfio_user_device_feature` with `room` bytes of reply asked for.
fn feature_room(flags: u32, data: &[u8], room: usize) -> Vec<u8> {
    let mut v = feature(flags, data);
    v[..4].copy_from_slice(&((8 + data.len() + room) as u32).to_le_bytes());
    v
}

fn report(iova: u64, len: u64, page: u64) -> Vec<u8> {
    [iova.to_le_bytes(), len.to_le_bytes(), page.to_le_bytes()].concat()
}

/// DMA logging (features 6-8) as vfio-user.rst describes it, and every refusal
/// with its errno. What it logs under real I/O is checked by the migrations above
/// (`perf --migrate-to` copies guest memory through the log and compares).
fn dma_logging_edges(c: &mut vfio_user::Connection) {
    const START: u32 = 6;
    const STOP: u32 = 7;
    const REPORT: u32 = 8;
    let einval = libc::EINVAL as u32;
    for (f, how) in [(START, SET), (STOP, SET), (REPORT, GET)] {
        assert!(!common::is_error(&request(c, 4, FEATURE, &[&feature(PROBE | how | f, &[])], &[])), "{f}");
    }
    assert_eq!(expect_error(c, 4, FEATURE, &[&feature(PROBE | GET | START, &[])], &[]), libc::ENOTSUP as u32);
    assert_eq!(
        expect_error(c, 4, FEATURE, &[&feature(PROBE | SET | REPORT, &[])], &[]),
        libc::ENOTSUP as u32
    );
    // A report before any start.
    assert_eq!(
        expect_error(c, 4, FEATURE, &[&feature_room(GET | REPORT, &report(0, 1 << 20, 4096), 64)], &[]),
        einval
    );
    let control = |page: u64, n: u32, ranges: &[(u64, u64)]| {
        let mut d = page.to_le_bytes().to_vec();
        d.extend_from_slice(&n.to_le_bytes());
        d.extend_from_slice(&0u32.to_le_bytes());
        for (a, l) in ranges {
            d.extend_from_slice(&a.to_le_bytes());
            d.extend_from_slice(&l.to_le_bytes());
        }
        d
    };
    for bad in [control(0, 0, &[]), control(3000, 0, &[]), control(4096, 2, &[(0, 4096)])] {
        assert_eq!(expect_error(c, 4, FEATURE, &[&feature(SET | START, &bad)], &[]), einval);
    }
    assert_eq!(
        expect_error(c, 4, FEATURE, &[&feature(SET | START, &control(4096, 1, &[(u64::MAX, 2)]))], &[]),
        einval
    );
    assert_eq!(expect_error(c, 4, FEATURE, &[&feature(SET | START, &[0; 4])], &[]), einval);
    // A start answers with the page size it logs at (a smaller hint is raised).
    let r = request(c, 4, FEATURE, &[&feature(SET | START, &control(512, 1, &[(0, 1 << 30)]))], &[]);
    assert!(!common::is_error(&r));
    assert_eq!(u64::from_le_bytes(r.payload[8..16].try_into().unwrap()), 4096);
    // Nothing mapped, nothing written: a clean bitmap, sized to the range.
    let r = request(c, 4, FEATURE, &[&feature_room(GET | REPORT, &report(0, 1 << 20, 4096), 32)], &[]);
    assert!(!common::is_error(&r));
    assert_eq!(r.payload.len(), 8 + 24 + 32);
    assert!(r.payload[32..].iter().all(|&b| b == 0));
    // argsz too small for the bitmap; units that are not a power of two; an empty
    // or wrapping range; a bitmap too large for one reply.
    assert_eq!(
        expect_error(c, 4, FEATURE, &[&feature_room(GET | REPORT, &report(0, 1 << 20, 4096), 8)], &[]),
        einval
    );
    for bad in [report(0, 1 << 20, 3000), report(0, 0, 4096), report(u64::MAX, 2, 4096)] {
        assert_eq!(expect_error(c, 4, FEATURE, &[&feature_room(GET | REPORT, &bad, 1 << 16)], &[]), einval);
    }
    assert_eq!(
        expect_error(c, 4, FEATURE, &[&feature_room(GET | REPORT, &report(0, 1 << 50, 4096), 1 << 20)], &[]),
        libc::ENOSPC as u32
    );
    assert!(!common::is_error(&request(c, 4, FEATURE, &[&feature(SET | STOP, &[])], &[])));
    assert_eq!(
        expect_error(c, 4, FEATURE, &[&feature_room(GET | REPORT, &report(0, 1 << 20, 4096), 32)], &[]),
        einval,
        "stopped"
    );
}

#[test]
fn migration_protocol_edges() {
    let mut s = Server::start();
    let mut c = s.raw_negotiated();
    // MIGRATION: STOP_COPY offered; probing it works; SET is not a thing for it.
    let r = request(&mut c, 1, FEATURE, &[&feature(GET | 1, &[])], &[]);
    assert!(!common::is_error(&r));
    assert_eq!(u64::from_le_bytes(r.payload[8..16].try_into().unwrap()) & 1, 1);
    assert!(!common::is_error(&request(&mut c, 2, FEATURE, &[&feature(PROBE | GET | 2, &[])], &[])));
    assert_eq!(expect_error(&mut c, 3, FEATURE, &[&feature(SET | 1, &[0; 8])], &[]), libc::ENOTSUP as u32);
    dma_logging_edges(&mut c);
    // Unknown, ERROR and P2P states; data in the wrong state.
    for st in [0, 5, 7, 99] {
        assert_eq!(expect_error(&mut c, 5, FEATURE, &[&state(st)], &[]), libc::EINVAL as u32, "state {st}");
    }
    assert_eq!(expect_error(&mut c, 6, MIG_READ, &[&mig(64, &[])], &[]), libc::EINVAL as u32);
    assert_eq!(expect_error(&mut c, 7, MIG_WRITE, &[&mig(3, b"abc")], &[]), libc::EINVAL as u32);
    // STOP_COPY gives the stream; a short read ends it.
    assert!(!common::is_error(&request(&mut c, 8, FEATURE, &[&state(3)], &[])));
    let r = request(&mut c, 9, MIG_READ, &[&mig(1 << 20, &[])], &[]);
    let n = u32::from_le_bytes(r.payload[4..8].try_into().unwrap()) as usize;
    assert!(n > 100 && n < 1 << 20, "{n}");
    let stream = r.payload[8..8 + n].to_vec();
    assert!(stream.starts_with(b"{\"version\":1"), "{}", String::from_utf8_lossy(&stream[..40]));
    assert_eq!(expect_error(&mut c, 10, MIG_READ, &[&mig(2 << 20, &[])], &[]), libc::EINVAL as u32);
    // STOP_COPY -> PRE_COPY does not exist; to RESUMING goes through STOP.
    assert_eq!(expect_error(&mut c, 11, FEATURE, &[&state(6)], &[]), libc::EINVAL as u32);
    assert!(!common::is_error(&request(&mut c, 12, FEATURE, &[&state(4)], &[])));
    // Invalid data: the arc fails and the device is in ERROR until a reset.
    assert!(!common::is_error(&request(&mut c, 13, MIG_WRITE, &[&mig(9, b"{\"oops\":1")], &[])));
    assert_eq!(expect_error(&mut c, 14, FEATURE, &[&state(2)], &[]), libc::EINVAL as u32);
    let r = request(&mut c, 15, FEATURE, &[&feature(GET | 2, &[])], &[]);
    assert_eq!(u32::from_le_bytes(r.payload[8..12].try_into().unwrap()), 0, "ERROR");
    assert_eq!(expect_error(&mut c, 16, FEATURE, &[&state(1)], &[]), libc::EINVAL as u32);
    assert!(!common::is_error(&request(&mut c, 17, RESET, &[], &[])));
    let r = request(&mut c, 18, FEATURE, &[&feature(GET | 2, &[])], &[]);
    assert_eq!(u32::from_le_bytes(r.payload[8..12].try_into().unwrap()), 2, "RUNNING after the reset");
    // The saved stream restores; an endless one is refused at the bound.
    assert!(!common::is_error(&request(&mut c, 19, FEATURE, &[&state(4)], &[])));
    assert!(!common::is_error(&request(&mut c, 20, MIG_WRITE, &[&mig(stream.len() as u32, &stream)], &[])));
    assert!(!common::is_error(&request(&mut c, 21, FEATURE, &[&state(2)], &[])));
    assert!(!common::is_error(&request(&mut c, 22, FEATURE, &[&state(4)], &[])));
    let mb = vec![b' '; 1 << 20];
    let mut errno = 0;
    for i in 0..17 {
        let r = request(&mut c, 30 + i, MIG_WRITE, &[&mig(mb.len() as u32, &mb)], &[]);
        if common::is_error(&r) {
            errno = r.header.error.get();
            break;
        }
    }
    assert_eq!(errno, libc::ENOSPC as u32, "a stream over 16 MiB");
    drop(c);
    // A client that leaves mid-migration leaves a device that serves the next.
    s.assert_alive();
    let mut c = s.raw_negotiated();
    let r = request(&mut c, 1, FEATURE, &[&feature(GET | 2, &[])], &[]);
    assert_eq!(u32::from_le_bytes(r.payload[8..12].try_into().unwrap()), 2);
}

/// Reads the whole migration stream (the device in STOP_COPY).
fn read_stream(c: &mut vfio_user::Connection, id: u16) -> Vec<u8> {
    let mut stream = Vec::new();
    loop {
        let r = request(c, id, MIG_READ, &[&mig(1 << 20, &[])], &[]);
        assert!(!common::is_error(&r), "MIG_DATA_READ refused");
        let n = u32::from_le_bytes(r.payload[4..8].try_into().unwrap()) as usize;
        stream.extend_from_slice(&r.payload[8..8 + n]);
        if n < 1 << 20 {
            return stream;
        }
    }
}

/// issue 25.5: a migration stream refused for a field late in it leaves nothing
/// behind. After the refusal, a reset and a disconnect, the next VM creates its
/// I/O queues and does I/O (it once got Invalid Queue Identifier for CQ 1), and an
/// incoming migration with a good stream is taken (it once was refused as "not new").
/// Streams that would change what a guest cannot write (config space identity) are
/// refused too.
#[test]
fn a_refused_migration_stream_leaves_nothing_for_the_next_vm() {
    use common::nvme_host::NvmeOverVfioUser;

    let mut s = Server::start();
    // A VM with I/O queues, and its stream.
    let mut h = NvmeOverVfioUser::new(s.client());
    h.bring_up(16, false);
    h.write_read_verify(0, 1, 3);
    let c = h.client.connection();
    assert!(!common::is_error(&request(c, 100, FEATURE, &[&state(3)], &[])));
    let good = read_stream(c, 101);
    assert!(!common::is_error(&request(c, 102, FEATURE, &[&state(2)], &[])));
    drop(h);
    let v: serde_json::Value = serde_json::from_slice(&good).unwrap();
    assert!(v["controller"]["sqs"].as_array().unwrap().len() >= 2, "the stream has I/O queues");
    let broken = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v = v.clone();
        f(&mut v);
        serde_json::to_vec(&v).unwrap()
    };
    let refused = [
        // The last SQ posts to a CQ that is not there: found after the CQs.
        broken(&|v| {
            let sqs = v["controller"]["sqs"].as_array_mut().unwrap();
            sqs.last_mut().unwrap()["cqid"] = 9.into();
        }),
        // Another vendor ID in config space.
        broken(&|v| {
            let cfg = v["config"].as_str().unwrap();
            v["config"] = format!("8680{}", &cfg[4..]).into();
        }),
        // A character of two bytes across a byte's two hex digits, in config space
        // and in a completion waiting in a CQ: refused, not cut through (a panic).
        broken(&|v| {
            let cfg = v["config"].as_str().unwrap();
            v["config"] = format!("a\u{e9}b{}", &cfg[4..]).into();
        }),
        broken(&|v| {
            let cqs = v["controller"]["cqs"].as_array_mut().unwrap();
            let waiting = format!("0\u{e9}{}", "0".repeat(29));
            cqs.last_mut().unwrap()["overflow"] = serde_json::json!([waiting]);
        }),
    ];
    for (i, stream) in refused.iter().enumerate() {
        let id = 10 * i as u16;
        let mut c = s.raw_negotiated();
        assert!(!common::is_error(&request(&mut c, id + 1, FEATURE, &[&state(4)], &[])));
        let w = request(&mut c, id + 2, MIG_WRITE, &[&mig(stream.len() as u32, stream)], &[]);
        assert!(!common::is_error(&w));
        assert_eq!(
            expect_error(&mut c, id + 3, FEATURE, &[&state(1)], &[]),
            libc::EINVAL as u32,
            "stream {i}"
        );
        assert!(!common::is_error(&request(&mut c, id + 4, RESET, &[], &[])));
        drop(c);
        // The next VM.
        let mut h = NvmeOverVfioUser::new(s.client());
        h.bring_up(16, false);
        h.write_read_verify(8, 2, 5 + i as u8);
        drop(h);
    }
    // A good stream is still taken.
    let mut c = s.raw_negotiated();
    assert!(!common::is_error(&request(&mut c, 1, FEATURE, &[&state(4)], &[])));
    assert!(!common::is_error(&request(&mut c, 2, MIG_WRITE, &[&mig(good.len() as u32, &good)], &[])));
    let r = request(&mut c, 3, FEATURE, &[&state(1)], &[]);
    assert!(!common::is_error(&r), "a good stream refused: errno {}\n{}", r.header.error.get(), s.log());
    drop(c);
    assert!(s.log().contains("migration data refused"), "{}", s.log());
    // That session's counters went back to the stream's (fewer commands than the
    // server had run by then): its end is logged, and the next client is served.
    common::still_serving(&mut s);
    s.assert_alive();
}

/// The server's resident memory (KiB).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// issue 25.4: a client that commits no memory cannot make the server commit a lot.
/// Four maps of a 2 TiB sparse memfd and DMA logging started cost the server tables
/// of 8 bytes per 128 MiB mapped (512 KiB here), not a bit per page (256 MiB, as
/// they once did); a report over clean memory commits nothing either.
#[test]
fn dma_logging_over_sparse_terabytes_costs_what_is_written_not_what_is_mapped() {
    use vfio_user::proto::{DmaMap, DMA_MAP_FLAG_READ, DMA_MAP_FLAG_WRITE};
    use zerocopy::little_endian::{U32, U64};
    use zerocopy::IntoBytes;

    const TIB: u64 = 1 << 40;
    let mut s = Server::start();
    let mut c = s.raw_negotiated();
    let mems: Vec<_> = (0..4).map(|_| test_util::memfd::memfd(2 * TIB)).collect();
    for (i, m) in mems.iter().enumerate() {
        let map = DmaMap {
            argsz: U32::new(32),
            flags: U32::new(DMA_MAP_FLAG_READ | DMA_MAP_FLAG_WRITE),
            offset: U64::new(0),
            address: U64::new((i as u64 + 1) * 4 * TIB),
            size: U64::new(2 * TIB),
        };
        let r = request(
            &mut c,
            1 + i as u16,
            vfio_user::Command::DmaMap as u16,
            &[map.as_bytes()],
            &[std::os::fd::AsRawFd::as_raw_fd(m)],
        );
        assert!(!common::is_error(&r), "DMA_MAP of 2 TiB refused: errno {}", r.header.error.get());
    }
    let before = rss_kib(s.pid());
    let mut control = 4096u64.to_le_bytes().to_vec();
    control.extend_from_slice(&[0u8; 8]);
    let r = request(&mut c, 10, FEATURE, &[&feature(SET | 6, &control)], &[]);
    assert!(!common::is_error(&r), "DMA_LOGGING_START refused: errno {}", r.header.error.get());
    // A report of the first 16 GiB of each region (one reply holds 32 GiB less a little).
    for i in 0..4u64 {
        let r = request(
            &mut c,
            20,
            FEATURE,
            &[&feature_room(GET | 8, &report((i + 1) * 4 * TIB, 16 << 30, 4096), 1 << 20)],
            &[],
        );
        assert!(!common::is_error(&r), "report refused: errno {}", r.header.error.get());
        assert!(r.payload[32..].iter().all(|&b| b == 0), "nothing was written");
    }
    let grew = rss_kib(s.pid()).saturating_sub(before);
    eprintln!("DMA logging over 4 x 2 TiB, started and reported: the server's RSS grew {grew} KiB");
    assert!(grew < 16 << 10, "logging 8 TiB of sparse memory made the server commit {grew} KiB");
    drop(c);
    s.assert_alive();
}

/// A subsystem controller with a namespace from the pool migrates: source and
/// destination are one controller (one CNTLID) of one pool, the namespace the
/// host made there is attached to both, and a verified workload on it moves
/// between them and back with no error.
#[test]
fn a_pool_namespace_moves_with_its_controller() {
    let dir = common::temp_dir("migration-pool");
    let img = format!("file:{}:16M", dir.join("fixed.img").display());
    let pool = format!("{}:64M", dir.join("pool").display());
    let control = dir.join("a.ctl");
    let a = Server::start_in(
        &dir,
        "a",
        &[
            "--ns",
            &img,
            "--cntlid",
            "1",
            "--pool",
            &pool,
            "--control",
            control.to_str().unwrap(),
            "--workers",
            "1",
        ],
    );
    let ctl = |args: &[&str]| {
        let out = Command::new(VNVME)
            .args(["ctl", "--json", "--control"])
            .arg(&control)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}\n{}", String::from_utf8_lossy(&out.stderr), a.log());
    };
    ctl(&["ns.create", "16M"]);
    ctl(&["ns.attach", "2", "1"]);
    let b = Server::start_in(&dir, "b", &["--ns", &img, "--cntlid", "1", "--pool", &pool, "--workers", "1"]);
    perf_migrating(&a, &b, &["--nsid", "2"]);
    drop((a, b));
    let _ = std::fs::remove_dir_all(&dir);
}
