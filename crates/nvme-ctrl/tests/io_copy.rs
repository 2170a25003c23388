//! Copy (NVM §3.3.1, descriptor format 0h) against RAM namespaces through the mock
//! host: the ranges land one after another at SDLBA, the limits Identify advertises
//! (MSSRL, MCL, MSRC, ONCS bit 8, OCFS) are the ones enforced with Command Size
//! Limit Exceeded, bad ranges are LBA Out of Range and write nothing, a failed
//! range is named in Dword 0 with the ranges before it copied; and the host buffers
//! a guest can make an engine hold (Verify, Compare, Copy) are bounded.

mod common;
mod io_common;

use std::sync::Arc;

use block_backend::{Backend, FaultBackend, FaultRule, RamBackend};
use common::{le16, le32};
use io_common::*;
use nvme_spec::identify::oncs;
use nvme_spec::nvm::{CopyCmd, CopyRange};
use nvme_spec::opcode::nvm as iop;
use nvme_spec::{Cqe, Status};
use test_kit::MockHost;
use test_util::{pattern, Rng};
use zerocopy::IntoBytes;

const NS_BYTES: u64 = 8 << 20;

/// A Copy of `ranges` (SLBA, NLB not 0's based) to `sdlba`, descriptor format `fmt`.
fn copy(h: &mut MockHost, nsid: u32, sdlba: u64, ranges: &[(u64, u32)], fmt: u8) -> Cqe {
    let raw: Vec<u8> = ranges.iter().flat_map(|&(s, n)| CopyRange::new(s, n).as_bytes().to_vec()).collect();
    let pages = raw.len().div_ceil(4096).max(1) as u64;
    let buf = h.alloc.alloc_pages(pages);
    h.mem.write(buf, &raw).unwrap();
    let nr_z = (ranges.len() - 1) as u8;
    let mut s = CopyCmd { nsid, sdlba, nr_z, desfmt: fmt, fua: false }.to_sqe();
    let (prp1, prp2) = h.build_prps(buf, raw.len() as u64);
    s.set_prps(prp1, prp2);
    h.io_cmd(1, s)
}

fn read(h: &mut MockHost, nsid: u32, slba: u64, nlb: u32, lba: u32) -> Vec<u8> {
    let (st, v) = h.read_blocks(1, nsid, slba, nlb, lba);
    assert_eq!(st, Status::SUCCESS);
    v
}

#[test]
fn ranges_land_in_order_at_sdlba_at_512_and_4096_byte_lbas() {
    let (mut h, _rams) = ram_host(&[(NS_BYTES, 0), (NS_BYTES, 1)], opts());
    let mut rng = Rng::new(7);
    for (i, lba) in [512u32, 4096].into_iter().enumerate() {
        let nsid = i as u32 + 1;
        // Three ranges, one of them the longest MSSRL allows.
        let mssrl = (128 << 10) / lba;
        let ranges = [(10u64, 3u32), (200, mssrl), (50, 1 + rng.below(7) as u32)];
        let mut want = Vec::new();
        for (k, &(slba, nlb)) in ranges.iter().enumerate() {
            let data = pattern(k as u64 * 31 + nsid as u64, (nlb * lba) as usize);
            assert_eq!(h.write_blocks(1, nsid, slba, lba, &data), Status::SUCCESS);
            want.extend_from_slice(&data);
        }
        let sdlba = 1000;
        let c = copy(&mut h, nsid, sdlba, &ranges, 0);
        assert_status(&c, Status::SUCCESS, false);
        assert_eq!(c.dw0.get(), 0);
        let total: u32 = ranges.iter().map(|r| r.1).sum();
        assert!(
            read(&mut h, nsid, sdlba, total, lba) == want,
            "{lba}-byte LBAs: the copy reads back different"
        );
        // The sources are as they were.
        let (slba, nlb) = ranges[0];
        assert!(read(&mut h, nsid, slba, nlb, lba) == want[..(nlb * lba) as usize]);
    }
}

#[test]
fn identify_advertises_the_limits_that_are_enforced() {
    // Room for a copy of MCL blocks (8 MiB) after its sources.
    const BIG: u64 = 32 << 20;
    let (mut h, _rams) = ram_host(&[(BIG, 0)], opts());
    let ctrl = h.identify(1, 0).unwrap();
    assert_ne!(le16(&ctrl, 520) & oncs::COPY, 0, "ONCS bit 8 (Copy)");
    assert_eq!(le16(&ctrl, 534), 0b11, "OCFS: descriptor formats 0h and 1h");
    let ns = h.identify(0, 1).unwrap();
    let (mssrl, mcl, msrc) = (le16(&ns, 74) as u32, le32(&ns, 76), ns[80] as usize);
    assert_eq!((mssrl, mcl, msrc), (256, 256 * 64, 127), "512-byte LBAs: 128 KiB ranges, 128 of them, 8 MiB");
    let data = pattern(3, 512);
    assert_eq!(h.write_blocks(1, 1, 5000, 512, &data), Status::SUCCESS);
    let untouched = read(&mut h, 1, 9000, 1, 512);
    let refused = |h: &mut MockHost, c: Cqe, want: Status, why: &str| {
        assert_status(&c, want, true);
        assert!(read(h, 1, 9000, 1, 512) == untouched, "{why}: refused, yet the destination changed");
    };
    // MSRC: 129 ranges are too many (128 are fine, below).
    let c = copy(&mut h, 1, 9000, &[(5000, 1); 129], 0);
    refused(&mut h, c, Status::COMMAND_SIZE_LIMIT_EXCEEDED, "129 ranges");
    // MSSRL: one range one block longer.
    let c = copy(&mut h, 1, 9000, &[(0, mssrl + 1)], 0);
    refused(&mut h, c, Status::COMMAND_SIZE_LIMIT_EXCEEDED, "a range past MSSRL");
    // Descriptor format 1h is for the 64-bit guard's formats, not this one; 2h
    // (other namespaces) is not offered.
    let c = copy(&mut h, 1, 9000, &[(0, 1)], 1);
    refused(&mut h, c, Status::INVALID_FORMAT, "format 1h");
    let c = copy(&mut h, 1, 9000, &[(0, 1)], 2);
    refused(&mut h, c, Status::INVALID_FIELD, "format 2h");
    // A source past the end, and a destination past the end.
    let nsze = BIG / 512;
    let c = copy(&mut h, 1, 9000, &[(0, 1), (nsze - 1, 2)], 0);
    refused(&mut h, c, Status::LBA_OUT_OF_RANGE, "a source past the end");
    let c = copy(&mut h, 1, nsze - 2, &[(0, 3)], 0);
    assert_status(&c, Status::LBA_OUT_OF_RANGE, true);
    // MCL (128 full ranges) and MSRC at their limits: fine.
    let c = copy(&mut h, 1, 20000, &[(5000, 1); 128], 0);
    assert_status(&c, Status::SUCCESS, false);
    assert!(read(&mut h, 1, 20127, 1, 512) == data, "the 128th range");
    let c = copy(&mut h, 1, nsze / 2, &[(5000, mssrl); 64], 0);
    assert_status(&c, Status::SUCCESS, false);
    let last = nsze / 2 + mcl as u64 - mssrl as u64;
    assert!(read(&mut h, 1, last, 1, 512) == data, "the last range of an MCL copy");
    // One block past MCL.
    let mut past = vec![(5000, mssrl); 64];
    past.push((5000, 1));
    let c = copy(&mut h, 1, 9000, &past, 0);
    refused(&mut h, c, Status::COMMAND_SIZE_LIMIT_EXCEEDED, "a copy past MCL");
    assert_still_works(&mut h, 1, 1, 512);
}

#[test]
fn a_failed_range_is_named_in_dword_0_and_the_ranges_before_it_are_copied() {
    let ram: Arc<dyn Backend> = Arc::new(RamBackend::new(NS_BYTES));
    let be = FaultBackend::new(ram, vec!["read/eio/lba=300+8".parse::<FaultRule>().unwrap()]);
    let mut h = host_with(vec![(Arc::new(be), 0)], opts());
    let a = pattern(1, 4 * 512);
    let c3 = pattern(3, 2 * 512);
    assert_eq!(h.write_blocks(1, 1, 100, 512, &a), Status::SUCCESS);
    assert_eq!(h.write_blocks(1, 1, 400, 512, &c3), Status::SUCCESS);
    let before = read(&mut h, 1, 2000, 8, 512);
    let c = copy(&mut h, 1, 2000, &[(100, 4), (300, 2), (400, 2)], 0);
    assert_status(&c, Status::UNRECOVERED_READ_ERROR, false);
    assert_eq!(c.dw0.get(), 1, "Dword 0: the first source range not copied");
    let after = read(&mut h, 1, 2000, 8, 512);
    assert!(after[..4 * 512] == a, "range 0 was copied");
    assert!(after[4 * 512..] == before[4 * 512..], "nothing after the failed range was written");
    assert_still_works(&mut h, 1, 1, 512);
}

#[test]
fn host_buffers_a_guest_can_make_an_engine_hold_are_bounded() {
    // Verify commands of 1 MiB (MDTS) on a namespace whose reads never end: each
    // holds a 1 MiB host buffer at the backend. 64 fit the budget; the next ones
    // complete at once with Command Interrupted (no DNR: the host retries).
    let ram: Arc<dyn Backend> = Arc::new(RamBackend::new(NS_BYTES));
    let be = FaultBackend::new(ram, vec!["read/hang".parse::<FaultRule>().unwrap()]);
    let o = test_kit::InitOptions { io_queues: 1, queue_size: 256, ..Default::default() };
    let mut h = host_with(vec![(Arc::new(be), 0)], o);
    let nlb = (1u32 << 20) / 512;
    for i in 0..70u64 {
        let s = MockHost::lba_sqe(iop::VERIFY, 1, (i % 8) * nlb as u64, nlb);
        h.submit(1, s).expect("room in the queue");
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut done = Vec::new();
    while done.len() < 6 && std::time::Instant::now() < deadline {
        h.process();
        done.extend(h.reap_queue(1));
    }
    assert_eq!(done.len(), 6, "70 Verify of 1 MiB, 64 held: 6 answered at once");
    for c in &done {
        assert_status(c, Status::COMMAND_INTERRUPTED, false);
    }
    // A Copy needs a buffer too, and is turned away the same way; a plain read (no
    // host buffer) is not, it only waits with the others.
    let c = copy(&mut h, 1, 6000, &[(0, 1)], 0);
    assert_status(&c, Status::COMMAND_INTERRUPTED, false);
}

/// On a file backend each range is copied inside the file (copy_file_range): the
/// backend sees one Copy request per range and no read or write, and the data
/// lands. A range overlapping its own destination, or a RAM namespace, goes
/// through a host buffer.
#[test]
fn a_file_namespace_copies_inside_the_file() {
    let path = std::env::temp_dir().join(format!("vnvme-copy-offload-{}.img", std::process::id()));
    let file = block_backend::FileBackend::open(&path, Some(NS_BYTES)).unwrap();
    let rec = test_kit::recording::RecordingBackend::new(Arc::new(file));
    let ram: Arc<dyn Backend> = Arc::new(RamBackend::new(NS_BYTES));
    let mut h = host_with(vec![(Arc::new(rec.clone()), 0), (ram, 0)], opts());
    let lba = 512u32;
    let mut want = Vec::new();
    for (k, slba) in [100u64, 300].into_iter().enumerate() {
        for nsid in [1, 2] {
            let data = pattern(k as u64 + 77, 8 * lba as usize);
            assert_eq!(h.write_blocks(1, nsid, slba, lba, &data), Status::SUCCESS);
            if nsid == 1 {
                want.extend_from_slice(&data);
            }
        }
    }
    rec.take();
    assert_status(&copy(&mut h, 1, 2000, &[(100, 8), (300, 8)], 0), Status::SUCCESS, false);
    let seen = rec.take();
    let ops: Vec<_> =
        seen.iter().map(|s| (s.op, s.from.map(|f| f / 512), s.offset / 512, s.len / 512)).collect();
    use block_backend::Op;
    assert_eq!(
        ops,
        [(Op::Copy { fua: false }, Some(100), 2000, 8), (Op::Copy { fua: false }, Some(300), 2008, 8)]
    );
    assert_eq!(read(&mut h, 1, 2000, 16, lba), want);
    // Overlapping its destination: through a host buffer, as the RAM namespace.
    assert_status(&copy(&mut h, 1, 104, &[(100, 8)], 0), Status::SUCCESS, false);
    let seen = rec.take();
    assert!(seen.iter().all(|s| !matches!(s.op, Op::Copy { .. })), "{seen:?}");
    assert_eq!(read(&mut h, 1, 104, 8, lba), want[..8 * 512]);
    assert_status(&copy(&mut h, 2, 2000, &[(100, 8), (300, 8)], 0), Status::SUCCESS, false);
    assert_eq!(read(&mut h, 2, 2000, 16, lba), want);
    std::fs::remove_file(&path).unwrap();
}
