//! NVM Command Set 1.1 I/O commands through real queues (Read, Write, Compare, Verify,
//! Write Zeroes, Flush, Dataset Management), with the status the spec names for each
//! kind of misuse. Every error test ends by checking the controller still works.

mod io_common;

use std::sync::Arc;

use block_backend::Backend;
use io_common::*;
use nvme_spec::nvm::DatasetManagementCmd;
use nvme_spec::opcode::nvm as iop;
use nvme_spec::{Status, NSID_ALL};
use test_kit::{InitOptions, MockHost, PAGE};
use test_util::Rng;
use zerocopy::little_endian::U32;

const FUA: u32 = 1 << 30;
const DEAC: u32 = 1 << 25;
const NS_BYTES: u64 = 8 << 20;

/// Dataset Management range list (NVM Figure "Dataset Management – Range Definition").
fn dsm_ranges(ranges: &[(u64, u32)]) -> Vec<u8> {
    let mut v = Vec::new();
    for &(slba, nlb) in ranges {
        v.extend_from_slice(&0u32.to_le_bytes());
        v.extend_from_slice(&nlb.to_le_bytes());
        v.extend_from_slice(&slba.to_le_bytes());
    }
    v
}

fn dsm(h: &mut MockHost, qid: u16, nsid: u32, ranges: &[(u64, u32)], deallocate: bool) -> nvme_spec::Cqe {
    let raw = dsm_ranges(ranges);
    let buf = h.alloc.alloc_pages(1);
    h.mem.write(buf, &raw).unwrap();
    let nr_z = (ranges.len() - 1) as u8;
    let mut s = DatasetManagementCmd { nsid, nr_z, ad: deallocate, ..Default::default() }.to_sqe();
    s.set_prps(buf, 0);
    h.io_cmd(qid, s)
}

fn read_back(h: &mut MockHost, qid: u16, nsid: u32, slba: u64, nlb: u32, lba: u32) -> Vec<u8> {
    let (st, v) = h.read_blocks(qid, nsid, slba, nlb, lba);
    assert_eq!(st, Status::SUCCESS);
    v
}

/// The LBA sizes of the two namespaces `two_formats` creates.
const LBAS: [u32; 2] = [512, 4096];

fn two_formats() -> (MockHost, Vec<block_backend::RamBackend>) {
    ram_host(&[(NS_BYTES, 0), (NS_BYTES, 1)], opts())
}

#[test]
fn nvm_read_write_random_patterns_at_512_and_4096_byte_lbas() {
    let (mut h, rams) = two_formats();
    let mut rng = Rng::new(1);
    for (i, &lba) in LBAS.iter().enumerate() {
        let nsid = i as u32 + 1;
        let nsze = NS_BYTES / lba as u64;
        let max_nlb = ((1u64 << 20) / lba as u64) as u32;
        let mut written = Vec::new();
        for round in 0..40 {
            // Include the largest transfer (MDTS) and the last LBA of the namespace.
            let nlb = match round {
                0 => max_nlb,
                1 => 1,
                _ => rng.range(1, max_nlb as u64 / 4) as u32,
            };
            let slba = if round == 1 { nsze - 1 } else { rng.below(nsze - nlb as u64 + 1) };
            let data = rng.bytes((nlb * lba) as usize);
            // Buffers start at any dword inside a page: PRP1 with an offset.
            let buf = h.alloc.alloc(data.len() as u64 + PAGE, PAGE) + rng.below(PAGE / 4) * 4;
            h.mem.write(buf, &data).unwrap();
            let mut s = h.rw_sqe(WRITE, nsid, slba, nlb, (buf, data.len() as u64));
            if rng.chance(30) {
                s.cdw12 = U32::new(s.cdw12.get() | FUA);
            }
            assert_status(&h.io_cmd((round % 2) as u16 + 1, s), Status::SUCCESS, false);
            written.push((slba, data));
        }
        // Later writes may overlap earlier ones: check the newest copy of each LBA.
        let mut image = vec![0u8; NS_BYTES as usize];
        for (slba, data) in &written {
            let off = (*slba * lba as u64) as usize;
            image[off..off + data.len()].copy_from_slice(data);
        }
        for (slba, data) in &written {
            let off = (*slba * lba as u64) as usize;
            let mut back = vec![0u8; data.len()];
            rams[i].read_at(off as u64, &mut back).unwrap();
            assert!(back == image[off..off + data.len()], "backend content at LBA {slba}");
            let via_read = read_back(&mut h, 2, nsid, *slba, data.len() as u32 / lba, lba);
            assert!(via_read == back, "Read returns the backend content at LBA {slba}");
        }
    }
}

/// NVM Write with FUA (and without), Read with FUA, Flush and a Flush to every
/// namespace, on namespaces whose backends have a volatile write cache: each
/// reaches the backend as what makes it durable (a FUA write as a FUA write, a
/// Flush as a backend flush, on every namespace for NSID FFFFFFFFh). The data read
/// back alone could not tell: it looks the same whether a flush happened or not.
#[test]
fn nvm_fua_and_flush_reach_a_backend_with_a_volatile_cache() {
    use block_backend::Op;
    use test_kit::recording::{RecordingBackend, Seen};
    let rec: Vec<RecordingBackend> =
        (0..2).map(|_| RecordingBackend::new(Arc::new(block_backend::RamBackend::new(NS_BYTES)))).collect();
    let mut h = host_with(rec.iter().map(|r| (Arc::new(r.clone()) as Arc<dyn Backend>, 0)).collect(), opts());
    let vwc = h.identify(0x01, 0).unwrap()[525];
    assert_eq!(vwc & 1, 1, "VWC present");
    for r in &rec {
        r.take();
    }
    let buf = h.alloc.alloc_pages(1);
    for (fua, nsid) in [(true, 1u32), (false, 1), (true, 2)] {
        let mut s = h.rw_sqe(WRITE, nsid, 8, 2, (buf, 1024));
        if fua {
            s.cdw12 = U32::new(s.cdw12.get() | FUA);
        }
        assert_status(&h.io_cmd(1, s), Status::SUCCESS, false);
        let want = Seen { op: Op::Write { fua }, offset: 8 * 512, len: 1024, from: None };
        assert_eq!(rec[nsid as usize - 1].take(), [want], "write fua={fua} on namespace {nsid}");
    }
    let mut s = h.rw_sqe(READ, 1, 8, 2, (buf, 1024));
    s.cdw12 = U32::new(s.cdw12.get() | FUA);
    assert_status(&h.io_cmd(1, s), Status::SUCCESS, false);
    assert_eq!(rec[0].take(), [Seen { op: Op::Read, offset: 8 * 512, len: 1024, from: None }]);
    assert_status(&h.io_cmd(1, MockHost::lba_sqe(iop::FLUSH, 2, 0, 1)), Status::SUCCESS, false);
    assert_eq!(rec[1].take().iter().map(|s| s.op).collect::<Vec<_>>(), [Op::Flush]);
    assert!(rec[0].take().is_empty(), "a Flush of namespace 2 leaves namespace 1 alone");
    assert_status(&h.io_cmd(1, MockHost::lba_sqe(iop::FLUSH, NSID_ALL, 0, 1)), Status::SUCCESS, false);
    for (i, r) in rec.iter().enumerate() {
        assert_eq!(r.take().iter().map(|s| s.op).collect::<Vec<_>>(), [Op::Flush], "namespace {}", i + 1);
    }
    // The host turns the write cache off (Set Features, Volatile Write Cache, WCE 0):
    // every write is then durable on completion, a FUA write for the backend.
    let c = h.set_features_raw(nvme_spec::features::fid::VOLATILE_WRITE_CACHE, 0, false);
    assert_status(&c, Status::SUCCESS, false);
    let s = h.rw_sqe(WRITE, 1, 8, 2, (buf, 1024));
    assert_status(&h.io_cmd(1, s), Status::SUCCESS, false);
    assert_eq!(rec[0].take(), [Seen { op: Op::Write { fua: true }, offset: 8 * 512, len: 1024, from: None }]);
}

#[test]
fn nvm_write_with_fua_stores_the_data_and_read_with_fua_is_allowed() {
    let (mut h, rams) = two_formats();
    for (i, &lba) in LBAS.iter().enumerate() {
        let data = Rng::new(2).bytes(lba as usize * 4);
        let buf = h.alloc.alloc_pages(4);
        h.mem.write(buf, &data).unwrap();
        let mut s = h.rw_sqe(WRITE, i as u32 + 1, 100, 4, (buf, data.len() as u64));
        s.cdw12 = U32::new(s.cdw12.get() | FUA);
        assert_status(&h.io_cmd(1, s), Status::SUCCESS, false);
        let mut back = vec![0u8; data.len()];
        rams[i].read_at(100 * lba as u64, &mut back).unwrap();
        assert!(back == data);
        // FUA on a Read is allowed too.
        let out = h.alloc.alloc_pages(4);
        let mut s = h.rw_sqe(READ, i as u32 + 1, 100, 4, (out, data.len() as u64));
        s.cdw12 = U32::new(s.cdw12.get() | FUA);
        assert_status(&h.io_cmd(1, s), Status::SUCCESS, false);
    }
}

#[test]
fn nvm_lba_range_beyond_nsze_or_overflowing_is_lba_out_of_range() {
    let (mut h, rams) = two_formats();
    for (i, &lba) in LBAS.iter().enumerate() {
        let nsid = i as u32 + 1;
        let nsze = NS_BYTES / lba as u64;
        let buf = h.alloc.alloc_pages(4);
        for opcode in [READ, WRITE, iop::COMPARE, iop::VERIFY, iop::WRITE_ZEROES] {
            for (slba, nlb) in [(nsze, 1), (nsze - 1, 2), (u64::MAX, 2), (u64::MAX - 1, 4), (1 << 63, 1)] {
                let len = nlb as u64 * lba as u64;
                let s = if matches!(opcode, iop::VERIFY | iop::WRITE_ZEROES) {
                    MockHost::lba_sqe(opcode, nsid, slba, nlb)
                } else {
                    h.rw_sqe(opcode, nsid, slba, nlb, (buf, len))
                };
                let c = h.io_cmd(1, s);
                assert_status(&c, Status::LBA_OUT_OF_RANGE, true);
            }
        }
        // Nothing was written by the failed writes.
        let mut back = vec![0u8; lba as usize];
        rams[i].read_at((nsze - 1) * lba as u64, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
        assert_still_works(&mut h, 1, nsid, lba);
    }
}

#[test]
fn nvm_transfer_beyond_mdts_is_invalid_field() {
    let (mut h, _) = two_formats();
    let buf = h.alloc.alloc_pages(300);
    for (i, &lba) in LBAS.iter().enumerate() {
        let nsid = i as u32 + 1;
        let max_nlb = ((1u64 << 20) / lba as u64) as u32;
        for opcode in [READ, WRITE, iop::COMPARE] {
            let s = h.rw_sqe(opcode, nsid, 0, max_nlb + 1, (buf, (max_nlb as u64 + 1) * lba as u64));
            assert_status(&h.io_cmd(1, s), Status::INVALID_FIELD, true);
        }
        // Verify is bounded by VSL, which equals MDTS here.
        let s = MockHost::lba_sqe(iop::VERIFY, nsid, 0, max_nlb + 1);
        assert_status(&h.io_cmd(1, s), Status::INVALID_FIELD, true);
        // Exactly MDTS is fine.
        let s = h.rw_sqe(READ, nsid, 0, max_nlb, (buf, 1 << 20));
        assert_status(&h.io_cmd(1, s), Status::SUCCESS, false);
        // Write Zeroes moves no data: MDTS does not apply (WZSL = 0).
        let s = MockHost::lba_sqe(iop::WRITE_ZEROES, nsid, 0, max_nlb * 4);
        assert_status(&h.io_cmd(1, s), Status::SUCCESS, false);
        assert_still_works(&mut h, 2, nsid, lba);
    }
}

#[test]
fn nvm_invalid_nsid_is_invalid_namespace_or_format() {
    let (mut h, _) = two_formats();
    let buf = h.alloc.alloc_pages(1);
    // NN = 2: 0, 3 and a large value are not active namespaces; FFFFFFFFh (broadcast)
    // is not valid for any of these commands.
    for nsid in [0, 3, 0x1000, NSID_ALL] {
        for opcode in [READ, WRITE, iop::COMPARE] {
            let s = h.rw_sqe(opcode, nsid, 0, 1, (buf, 512));
            assert_status(&h.io_cmd(1, s), Status::INVALID_NAMESPACE, true);
        }
        for opcode in [iop::VERIFY, iop::WRITE_ZEROES] {
            let s = MockHost::lba_sqe(opcode, nsid, 0, 1);
            assert_status(&h.io_cmd(1, s), Status::INVALID_NAMESPACE, true);
        }
        let c = dsm(&mut h, 1, nsid, &[(0, 1)], true);
        assert_status(&c, Status::INVALID_NAMESPACE, true);
    }
    for nsid in [0, 3] {
        let s = MockHost::lba_sqe(iop::FLUSH, nsid, 0, 1);
        assert_status(&h.io_cmd(1, s), Status::INVALID_NAMESPACE, true);
    }
    assert_still_works(&mut h, 1, 1, 512);
}

#[test]
fn nvm_unsupported_io_opcode_is_invalid_opcode() {
    let (mut h, _) = two_formats();
    // Write Uncorrectable is not in ONCS; reservation commands need a namespace
    // with reservations (RESCAP 0 here); the rest are not defined at all.
    for opcode in [
        iop::WRITE_UNCORRECTABLE,
        iop::RESERVATION_REGISTER,
        iop::RESERVATION_REPORT,
        iop::RESERVATION_ACQUIRE,
        iop::RESERVATION_RELEASE,
        0x03,
        0x7d,
        0x80,
        0xff,
    ] {
        let s = MockHost::lba_sqe(opcode, 1, 0, 1);
        assert_status(&h.io_cmd(1, s), Status::INVALID_OPCODE, true);
    }
    assert_still_works(&mut h, 1, 1, 512);
}

#[test]
fn spec_4_1_fused_operation_is_invalid_field() {
    let (mut h, rams) = two_formats();
    let buf = h.alloc.alloc_pages(1);
    h.mem.fill(buf, 512, 0xab).unwrap();
    // FUSES = 0: neither the first nor the second command of a fused pair is accepted.
    for fuse in [1u32, 2, 3] {
        for opcode in [WRITE, iop::COMPARE] {
            let mut s = h.rw_sqe(opcode, 1, 7, 1, (buf, 512));
            s.cdw0 = U32::new(s.cdw0.get() | (fuse << 8));
            assert_status(&h.io_cmd(1, s), Status::INVALID_FIELD, true);
        }
    }
    let mut back = [0u8; 512];
    rams[0].read_at(7 * 512, &mut back).unwrap();
    assert_eq!(back, [0; 512], "a rejected fused Write wrote nothing");
    assert_still_works(&mut h, 1, 1, 512);
}

#[test]
fn nvm_compare_match_succeeds_and_mismatch_is_compare_failure() {
    let (mut h, _) = two_formats();
    for (i, &lba) in LBAS.iter().enumerate() {
        let nsid = i as u32 + 1;
        // Several pages, so the compare buffer is described by a PRP list.
        let nlb = (4 * PAGE as u32) / lba + 1;
        let data = Rng::new(3 + i as u64).bytes((nlb * lba) as usize);
        assert_eq!(h.write_blocks(1, nsid, 20, lba, &data), Status::SUCCESS);
        let buf = h.alloc.alloc(data.len() as u64 + PAGE, PAGE) + 0x40;
        h.mem.write(buf, &data).unwrap();
        let s = h.rw_sqe(iop::COMPARE, nsid, 20, nlb, (buf, data.len() as u64));
        assert_status(&h.io_cmd(1, s), Status::SUCCESS, false);
        for at in [0, data.len() / 2, data.len() - 1] {
            h.mem.write(buf + at as u64, &[data[at] ^ 0x01]).unwrap();
            let s = h.rw_sqe(iop::COMPARE, nsid, 20, nlb, (buf, data.len() as u64));
            // Media and Data Integrity Errors (SCT 2h), Compare Failure (85h).
            let c = h.io_cmd(1, s);
            assert_eq!((c.status().sct(), c.status().sc()), (2, 0x85));
            assert_status(&c, Status::COMPARE_FAILURE, true);
            h.mem.write(buf + at as u64, &[data[at]]).unwrap();
        }
        // Unwritten blocks compare equal to zeroes.
        let zeroes = h.alloc.alloc_pages(1);
        let s = h.rw_sqe(iop::COMPARE, nsid, 5000 / (lba as u64 / 512), 1, (zeroes, lba as u64));
        assert_status(&h.io_cmd(1, s), Status::SUCCESS, false);
        assert_still_works(&mut h, 2, nsid, lba);
    }
}

#[test]
fn nvm_verify_succeeds_on_written_and_unwritten_blocks() {
    let (mut h, _) = two_formats();
    for (i, &lba) in LBAS.iter().enumerate() {
        let nsid = i as u32 + 1;
        let data = Rng::new(4).bytes(lba as usize * 8);
        assert_eq!(h.write_blocks(1, nsid, 0, lba, &data), Status::SUCCESS);
        for (slba, nlb) in [(0, 8), (4, 100), (NS_BYTES / lba as u64 - 1, 1)] {
            let s = MockHost::lba_sqe(iop::VERIFY, nsid, slba, nlb);
            assert_status(&h.io_cmd(1, s), Status::SUCCESS, false);
        }
    }
    // Verify transfers nothing: the data pointer is ignored even when it is garbage.
    let mut s = MockHost::lba_sqe(iop::VERIFY, 1, 0, 1);
    s.set_prps(0xdead_beef_0001, 3);
    assert_status(&h.io_cmd(1, s), Status::SUCCESS, false);
}

#[test]
fn nvm_write_zeroes_zeroes_the_range_with_and_without_deac() {
    let (mut h, rams) = two_formats();
    for (i, &lba) in LBAS.iter().enumerate() {
        let nsid = i as u32 + 1;
        for deac in [false, true] {
            let data = Rng::new(5 + deac as u64).bytes(lba as usize * 16);
            assert_eq!(h.write_blocks(1, nsid, 64, lba, &data), Status::SUCCESS);
            let mut s = MockHost::lba_sqe(iop::WRITE_ZEROES, nsid, 68, 8);
            if deac {
                s.cdw12 = U32::new(s.cdw12.get() | DEAC);
            }
            assert_status(&h.io_cmd(1, s), Status::SUCCESS, false);
            let back = read_back(&mut h, 2, nsid, 64, 16, lba);
            let l = lba as usize;
            assert!(back[..4 * l] == data[..4 * l], "blocks before the range are untouched");
            assert!(back[4 * l..12 * l].iter().all(|&b| b == 0), "the range reads zeroes (deac {deac})");
            assert!(back[12 * l..] == data[12 * l..], "blocks after the range are untouched");
            let mut raw = vec![0xffu8; 8 * l];
            rams[i].read_at(68 * lba as u64, &mut raw).unwrap();
            assert!(raw.iter().all(|&b| b == 0));
        }
    }
}

#[test]
fn nvm_dsm_deallocate_of_several_ranges_reads_back_zeroes() {
    let (mut h, _) = two_formats();
    for (i, &lba) in LBAS.iter().enumerate() {
        let nsid = i as u32 + 1;
        let data = Rng::new(6).bytes(lba as usize * 64);
        assert_eq!(h.write_blocks(1, nsid, 0, lba, &data), Status::SUCCESS);
        // Three ranges, out of order, plus an empty one (NLB 0 deallocates nothing).
        let ranges = [(40u64, 8u32), (2, 3), (20, 1), (30, 0)];
        assert_status(&dsm(&mut h, 1, nsid, &ranges, true), Status::SUCCESS, false);
        let back = read_back(&mut h, 2, nsid, 0, 64, lba);
        for b in 0..64u64 {
            let deallocated = ranges.iter().any(|&(s, n)| b >= s && b < s + n as u64);
            let blk = &back[(b * lba as u64) as usize..((b + 1) * lba as u64) as usize];
            let orig = &data[(b * lba as u64) as usize..((b + 1) * lba as u64) as usize];
            if deallocated {
                assert!(blk.iter().all(|&x| x == 0), "LBA {b} was deallocated (DLFEAT: reads zeroes)");
            } else {
                assert!(blk == orig, "LBA {b} was not in any range");
            }
        }
        // Attributes without Deallocate are hints: success, nothing changes.
        let data2 = Rng::new(7).bytes(lba as usize * 4);
        assert_eq!(h.write_blocks(1, nsid, 100, lba, &data2), Status::SUCCESS);
        assert_status(&dsm(&mut h, 1, nsid, &[(100, 4)], false), Status::SUCCESS, false);
        assert!(read_back(&mut h, 1, nsid, 100, 4, lba) == data2);
        // The largest range list (256 ranges, 4 KiB).
        let many: Vec<(u64, u32)> = (0..256).map(|r| (200 + r * 2, 1)).collect();
        assert_status(&dsm(&mut h, 2, nsid, &many, true), Status::SUCCESS, false);
    }
}

#[test]
fn nvm_dsm_range_outside_namespace_is_lba_out_of_range_and_changes_nothing() {
    let (mut h, _) = two_formats();
    for (i, &lba) in LBAS.iter().enumerate() {
        let nsid = i as u32 + 1;
        let nsze = NS_BYTES / lba as u64;
        let data = Rng::new(8).bytes(lba as usize * 4);
        assert_eq!(h.write_blocks(1, nsid, 0, lba, &data), Status::SUCCESS);
        for bad in [(nsze, 1u32), (nsze - 1, 2), (u64::MAX, 2), (0, u32::MAX)] {
            // The valid range comes first: it must not be deallocated either.
            let c = dsm(&mut h, 1, nsid, &[(0, 4), bad], true);
            assert_status(&c, Status::LBA_OUT_OF_RANGE, true);
            assert!(read_back(&mut h, 1, nsid, 0, 4, lba) == data, "no range was deallocated");
        }
        assert_still_works(&mut h, 1, nsid, lba);
    }
}

#[test]
fn nvm_flush_of_all_namespaces_or_one_succeeds_and_of_a_missing_one_is_invalid_namespace() {
    let (mut h, _) = ram_host(&[(NS_BYTES, 0), (NS_BYTES, 1), (NS_BYTES, 0)], opts());
    for nsid in 1..=3 {
        assert_eq!(h.write_blocks(1, nsid, 0, 4096, &[nsid as u8; 4096]), Status::SUCCESS);
    }
    let s = MockHost::lba_sqe(iop::FLUSH, NSID_ALL, 0, 1);
    assert_status(&h.io_cmd(1, s), Status::SUCCESS, false);
    for nsid in 1..=3 {
        let s = MockHost::lba_sqe(iop::FLUSH, nsid, 0, 1);
        assert_status(&h.io_cmd(2, s), Status::SUCCESS, false);
    }
    let s = MockHost::lba_sqe(iop::FLUSH, 4, 0, 1);
    assert_status(&h.io_cmd(1, s), Status::INVALID_NAMESPACE, true);
    assert_still_works(&mut h, 1, 3, 512);
}

#[test]
fn nvm_namespaces_with_different_lba_formats_at_once() {
    let (mut h, rams) = ram_host(&[(NS_BYTES, 0), (NS_BYTES, 1), (2 * NS_BYTES, 0)], opts());
    let lbas = [512u32, 4096, 512];
    for (i, &lba) in lbas.iter().enumerate() {
        let id = h.identify(0x00, i as u32 + 1).unwrap();
        let nsze = u64::from_le_bytes(id[0..8].try_into().unwrap());
        assert_eq!(nsze, [NS_BYTES, NS_BYTES, 2 * NS_BYTES][i] / lba as u64);
        assert_eq!(id[26] & 0xf, [0, 1, 0][i], "FLBAS");
    }
    // The same SLBA in each namespace, interleaved on both queues.
    let mut rng = Rng::new(9);
    let datas: Vec<Vec<u8>> = lbas.iter().map(|&l| rng.bytes(l as usize * 3)).collect();
    let mut cids = Vec::new();
    for (i, &lba) in lbas.iter().enumerate() {
        let buf = h.alloc.alloc(datas[i].len() as u64, PAGE);
        h.mem.write(buf, &datas[i]).unwrap();
        let s = h.rw_sqe(WRITE, i as u32 + 1, 10, 3, (buf, lba as u64 * 3));
        cids.push(h.submit(1 + (i % 2) as u16, s).unwrap());
    }
    h.process();
    let mut done = h.reap_queue(1);
    done.extend(h.reap_queue(2));
    assert_eq!(done.len(), 3);
    assert!(done.iter().all(|c| c.status() == Status::SUCCESS));
    for (i, &lba) in lbas.iter().enumerate() {
        let mut raw = vec![0u8; datas[i].len()];
        rams[i].read_at(10 * lba as u64, &mut raw).unwrap();
        assert!(raw == datas[i], "namespace {} holds its own data at its own LBA size", i + 1);
        assert!(read_back(&mut h, 2, i as u32 + 1, 10, 3, lba) == datas[i]);
    }
}

#[test]
fn nvm_null_backend_reads_zeroes() {
    for (lbaf, lba) in [(0u8, 512u32), (1, 4096)] {
        let mut h = null_host(NS_BYTES, lbaf, opts());
        let data = Rng::new(10).bytes(lba as usize * 8);
        assert_eq!(h.write_blocks(1, 1, 0, lba, &data), Status::SUCCESS);
        let buf = h.alloc.alloc_pages(8);
        h.mem.fill(buf, 8 * lba as u64, 0xaa).unwrap();
        let s = h.rw_sqe(READ, 1, 0, 8, (buf, 8 * lba as u64));
        let c = h.io_cmd(1, s);
        assert_status(&c, Status::SUCCESS, false);
        let mut back = vec![0xffu8; 8 * lba as usize];
        h.mem.read(buf, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0), "null backend returns zeroes");
        // The other commands succeed too.
        for opcode in [iop::VERIFY, iop::WRITE_ZEROES, iop::FLUSH] {
            let s = MockHost::lba_sqe(opcode, 1, 0, 8);
            assert_status(&h.io_cmd(1, s), Status::SUCCESS, false);
        }
        let s = h.rw_sqe(iop::COMPARE, 1, 0, 8, (buf, 8 * lba as u64));
        assert_status(&h.io_cmd(1, s), Status::SUCCESS, false);
        assert_status(&dsm(&mut h, 2, 1, &[(0, 8)], true), Status::SUCCESS, false);
        let s = MockHost::lba_sqe(READ, 1, NS_BYTES / lba as u64, 1);
        assert_status(&h.io_cmd(1, s), Status::LBA_OUT_OF_RANGE, true);
    }
}

#[test]
fn nvm_commands_without_shadow_doorbells_behave_the_same() {
    let (mut h, _) = ram_host(&[(NS_BYTES, 0)], InitOptions { shadow_doorbells: false, ..opts() });
    assert!(h.dbbuf.is_none());
    let data = Rng::new(11).bytes(512 * 9);
    assert_eq!(h.write_blocks(1, 1, 5, 512, &data), Status::SUCCESS);
    assert!(read_back(&mut h, 2, 1, 5, 9, 512) == data);
    let s = MockHost::lba_sqe(0x7f, 1, 0, 1);
    assert_status(&h.io_cmd(1, s), Status::INVALID_OPCODE, true);
    assert_still_works(&mut h, 1, 1, 512);
}
