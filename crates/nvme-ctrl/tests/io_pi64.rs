//! The 64-bit guard protection information formats (NVM §5.3.1.3, Extended LBA
//! Formats) through the mock host: how Identify announces them (CTRATT.ELBAS, CNS
//! 05h ELBAF), the 16-byte tuple (CRC-64/NVME guard, 48-bit reference tag whose
//! high bits a command carries in Dword 3), its checks and their statuses, Write
//! Zeroes, and Copy with descriptor format 1h.

mod common;
mod io_common;

use io_common::*;
use nvme_spec::admin::IdentifyCmd;
use nvme_spec::identify::{cns, ctratt, elbaf, IdentifyController, IdentifyNamespace, IdentifyNamespaceNvm};
use nvme_spec::nvm::{CopyCmd, CopyRange, CopyRangeF1};
use nvme_spec::opcode::nvm as iop;
use nvme_spec::pi::{crc64_nvme, prinfo, Pi64};
use nvme_spec::{Cqe, Status};
use test_kit::MockHost;
use test_util::pattern;
use zerocopy::little_endian::U32;
use zerocopy::{FromBytes, IntoBytes};

const PRCHK_ALL: u8 = prinfo::PRCHK_MASK;
/// 512-byte blocks with 16 bytes of metadata, 64-bit guard.
const LBAF_512_G64: u8 = 6;
/// A reference tag above 32 bits: its high 16 bits travel in Dword 3.
const BIG_REF: u64 = 0x1234_0000_0100;

/// What a command carries for protection information: PRINFO `pr`, the 48-bit
/// reference tag `reft` (Dword 14 and Dword 3), application tag `app` (mask all),
/// and its metadata buffer `mptr` (0: none).
#[derive(Clone, Copy)]
struct Prot {
    pr: u8,
    reft: u64,
    app: u16,
    mptr: u64,
}

/// A Read or Write of 512-byte blocks on NSID 1 with `p`.
fn rw(h: &mut MockHost, opcode: u8, slba: u64, nlb: u32, buf: u64, p: Prot) -> Cqe {
    let Prot { pr, reft, app, mptr } = p;
    let mut s = h.rw_sqe(opcode, 1, slba, nlb, (buf, nlb as u64 * 512));
    s.cdw12 = U32::new(s.cdw12.get() | (pr as u32) << 26);
    s.cdw14 = U32::new(reft as u32);
    s.cdw3 = U32::new((reft >> 32) as u32);
    s.cdw15 = U32::new(app as u32 | 0xffff << 16);
    s.mptr = mptr.into();
    h.io_cmd(1, s)
}

/// Writes `data` at `slba` with PRACT (the controller makes the tuples).
fn write_pract(h: &mut MockHost, slba: u64, data: &[u8], reft: u64, app: u16) -> Cqe {
    let buf = h.alloc.alloc_pages(data.len().div_ceil(4096) as u64);
    h.mem.write(buf, data).unwrap();
    rw(
        h,
        iop::WRITE,
        slba,
        (data.len() / 512) as u32,
        buf,
        Prot { pr: prinfo::PRACT | PRCHK_ALL, reft, app, mptr: 0 },
    )
}

/// Reads `nlb` blocks at `slba` with checks `pr` (no PRACT): completion, data, and
/// the 16 bytes of metadata per block.
fn read(h: &mut MockHost, slba: u64, nlb: u32, pr: u8, reft: u64, app: u16) -> (Cqe, Vec<u8>, Vec<u8>) {
    let buf = h.alloc.alloc_pages((nlb as u64 * 512).div_ceil(4096));
    let mptr = h.alloc.alloc_pages(1);
    let c = rw(h, iop::READ, slba, nlb, buf, Prot { pr, reft, app, mptr });
    let mut data = vec![0u8; nlb as usize * 512];
    h.mem.read(buf, &mut data).unwrap();
    let mut meta = vec![0u8; nlb as usize * 16];
    h.mem.read(mptr, &mut meta).unwrap();
    (c, data, meta)
}

/// The tuples a type 2 write of `data` with initial tag `reft` carries.
fn tuples(data: &[u8], reft: u64, app: u16) -> Vec<u8> {
    data.chunks(512)
        .enumerate()
        .flat_map(|(i, b)| Pi64 { guard: crc64_nvme(b), app_tag: app, ref_tag: reft + i as u64 }.to_bytes())
        .collect()
}

#[test]
fn identify_announces_the_64_bit_guard_formats() {
    let mut h = pi_host(LBAF_512_G64, 1);
    let c = IdentifyController::read_from_bytes(&h.identify(1, 0).unwrap()).unwrap();
    assert_ne!(c.ctratt.get() & ctratt::ELBAS, 0, "CTRATT.ELBAS");
    let id = IdentifyNamespace::read_from_bytes(&h.identify(0, 1).unwrap()).unwrap();
    assert_eq!((id.nlbaf, id.flbas, id.dps), (7, LBAF_512_G64, 1));
    let lbaf: Vec<(u8, u16)> = id.lbaf[6..8].iter().map(|f| (f.lbads, f.ms.get())).collect();
    assert_eq!(lbaf, [(9, 16), (12, 16)]);
    // CNS 05h, CSI 00h: the guard of each format, no storage tags.
    let mut s = IdentifyCmd { nsid: 1, cns: cns::CSI_NAMESPACE, csi: 0, ..Default::default() }.to_sqe();
    s.set_prps(h.admin_buf, 0);
    h.admin_ok(s).unwrap();
    let mut raw = vec![0u8; 4096];
    h.mem.read(h.admin_buf, &mut raw).unwrap();
    let nvm = IdentifyNamespaceNvm::read_from_bytes(&raw).unwrap();
    let pif: Vec<u8> = nvm.elbaf[..9].iter().map(|e| elbaf::pif(e.get())).collect();
    assert_eq!(pif, [0, 0, 0, 0, 0, 0, 2, 2, 0]);
    assert!(nvm.elbaf.iter().all(|e| e.get() & elbaf::STS_MASK == 0));
    // A namespace without metadata: two formats, both 16-bit (nothing to guard).
    let mut s = IdentifyCmd { nsid: 2, cns: cns::CSI_NAMESPACE, csi: 0, ..Default::default() }.to_sqe();
    s.set_prps(h.admin_buf, 0);
    h.admin_ok(s).unwrap();
    h.mem.read(h.admin_buf, &mut raw).unwrap();
    assert!(IdentifyNamespaceNvm::read_from_bytes(&raw).unwrap().elbaf.iter().all(|e| e.get() == 0));
}

#[test]
fn the_tuple_is_crc64_with_a_48_bit_reference_tag_and_is_checked() {
    let mut h = pi_host(LBAF_512_G64, 2);
    let data = pattern(64, 4 * 512);
    // Metadata that is only the tuple: PRACT moves none through MPTR.
    assert_status(&write_pract(&mut h, 8, &data, BIG_REF, 0x42), Status::SUCCESS, false);
    let (c, got, meta) = read(&mut h, 8, 4, PRCHK_ALL, BIG_REF, 0x42);
    assert_status(&c, Status::SUCCESS, false);
    assert_eq!((got, meta), (data.clone(), tuples(&data, BIG_REF, 0x42)));
    // The tag's high bits are Dword 3's: without them the reference check fails.
    let (c, _, _) = read(&mut h, 8, 4, prinfo::PRCHK_REF, BIG_REF & 0xffff_ffff, 0x42);
    assert_status(&c, Status::END_TO_END_REFERENCE_TAG_CHECK_ERROR, true);
    let (c, _, _) = read(&mut h, 8, 4, prinfo::PRCHK_APP, BIG_REF, 0x43);
    assert_status(&c, Status::END_TO_END_APPLICATION_TAG_CHECK_ERROR, true);
    // A byte changed under the namespace (NSID 2: the same data, no metadata).
    let buf = h.alloc.alloc_pages(1);
    h.mem.write(buf, &[0x55; 512]).unwrap();
    let s = h.rw_sqe(iop::WRITE, 2, 10, 1, (buf, 512));
    assert_status(&h.io_cmd(1, s), Status::SUCCESS, false);
    let (c, _, _) = read(&mut h, 8, 4, prinfo::PRCHK_GUARD, BIG_REF, 0x42);
    assert_status(&c, Status::END_TO_END_GUARD_CHECK_ERROR, true);
    // A write whose own tuples are wrong never lands.
    let mptr = h.alloc.alloc_pages(1);
    let mut bad = tuples(&data, BIG_REF, 0x42);
    bad[16 + 3] ^= 1;
    h.mem.write(mptr, &bad).unwrap();
    h.mem.write(buf, &data).unwrap();
    let c = rw(&mut h, iop::WRITE, 100, 4, buf, Prot { pr: PRCHK_ALL, reft: BIG_REF, app: 0x42, mptr });
    assert_status(&c, Status::END_TO_END_GUARD_CHECK_ERROR, true);
    // Never written: all-ones tags, every check skipped.
    let (c, _, meta) = read(&mut h, 100, 4, PRCHK_ALL, BIG_REF, 0x42);
    assert_status(&c, Status::SUCCESS, false);
    assert!(meta.chunks(16).all(|m| m[8..] == [0xff; 8]), "{meta:x?}");
}

#[test]
fn type_1_tags_are_the_lbas_low_48_bits_and_write_zeroes_guards_zeroes() {
    let mut h = pi_host(LBAF_512_G64, 1);
    let data = pattern(65, 2 * 512);
    // Type 1: a checked initial tag that is not the LBA is refused.
    let c = write_pract(&mut h, 40, &data, 40 | 1 << 32, 0);
    assert_status(&c, Status::INVALID_PROTECTION_INFORMATION, true);
    assert_status(&write_pract(&mut h, 40, &data, 40, 0), Status::SUCCESS, false);
    let (c, got, _) = read(&mut h, 40, 2, PRCHK_ALL, 40, 0);
    assert_status(&c, Status::SUCCESS, false);
    assert_eq!(got, data);
    // Write Zeroes with PRACT: the guard of a block of zeroes (not 0 for CRC-64).
    let mut s = h.rw_sqe(iop::WRITE_ZEROES, 1, 60, 3, (0, 0));
    s.cdw12 = U32::new(2 | (prinfo::PRACT as u32) << 26);
    s.cdw14 = U32::new(60);
    assert_status(&h.io_cmd(1, s), Status::SUCCESS, false);
    let (c, got, meta) = read(&mut h, 60, 3, PRCHK_ALL, 60, 0);
    assert_status(&c, Status::SUCCESS, false);
    assert!(got.iter().all(|&b| b == 0));
    assert_eq!(meta, tuples(&got, 60, 0));
    assert_ne!(crc64_nvme(&[0u8; 512]), 0);
}

/// A Copy on NSID 1 of `ranges` (SLBA, NLB, expected initial tag) in descriptor
/// format `fmt` to `sdlba`, PRINFOR and PRINFOW `rw`, destination tag `dest`.
fn copy(h: &mut MockHost, fmt: u8, ranges: &[(u64, u32, u64)], sdlba: u64, rw: (u8, u8), dest: u64) -> Cqe {
    let (r, w) = rw;
    let list = h.alloc.alloc_pages(1);
    let mut raw = Vec::new();
    for &(slba, nlb, eilbrt) in ranges {
        match fmt {
            1 => raw.extend_from_slice(CopyRangeF1::new(slba, nlb, eilbrt).as_bytes()),
            _ => raw.extend_from_slice(CopyRange::new(slba, nlb).as_bytes()),
        }
    }
    h.mem.write(list, &raw).unwrap();
    let mut s = CopyCmd { nsid: 1, sdlba, nr_z: (ranges.len() - 1) as u8, desfmt: fmt, fua: false }.to_sqe();
    s.set_prps(list, 0);
    s.cdw12 = U32::new(s.cdw12.get() | (r as u32) << 12 | (w as u32) << 26);
    s.cdw14 = U32::new(dest as u32);
    s.cdw3 = U32::new((dest >> 32) as u32);
    h.io_cmd(1, s)
}

#[test]
fn copy_takes_format_1h_with_48_bit_tags_and_refuses_format_0h() {
    let mut h = pi_host(LBAF_512_G64, 2);
    let data = pattern(66, 8 * 512);
    assert_status(&write_pract(&mut h, 16, &data, BIG_REF, 0), Status::SUCCESS, false);
    let untouched = read(&mut h, 200, 8, 0, 0, 0);
    // Format 0h's 32-bit tags do not go with this format.
    let c = copy(&mut h, 0, &[(16, 8, 0)], 200, (0, 0), 0);
    assert_status(&c, Status::INVALID_FORMAT, true);
    // Checked against each range's 48-bit ELBT: the second range's is off by one.
    let both = prinfo::PRACT | PRCHK_ALL;
    let c = copy(&mut h, 1, &[(16, 4, BIG_REF), (20, 4, BIG_REF + 5)], 200, (both, both), BIG_REF << 1);
    assert_status(&c, Status::END_TO_END_REFERENCE_TAG_CHECK_ERROR, true);
    assert_eq!(c.dw0.get(), 1, "the first range not copied");
    let (_, got, _) = read(&mut h, 204, 4, 0, 0, 0);
    assert_eq!(got, untouched.1[2048..], "the failed range's destination is untouched");
    // Right tags: stripped at the source, the destination's made from Dwords 14 and 3.
    let c = copy(&mut h, 1, &[(16, 4, BIG_REF), (20, 4, BIG_REF + 4)], 200, (both, both), BIG_REF << 1);
    assert_status(&c, Status::SUCCESS, false);
    let (c, got, meta) = read(&mut h, 200, 8, PRCHK_ALL, BIG_REF << 1, 0);
    assert_status(&c, Status::SUCCESS, false);
    assert_eq!((got, meta), (data.clone(), tuples(&data, BIG_REF << 1, 0)));
}
