//! Metadata and end-to-end protection (NVM §5.2.3, §5.3) through the mock host: a
//! separate metadata buffer (MPTR) kept per block, protection information types
//! 1-3 generated with PRACT and checked with PRCHK, the exact statuses of a failed
//! check, data corrupted under the namespace caught on read, and Format NVM
//! between the formats with and without metadata.

mod common;
mod io_common;

use std::sync::Arc;

use block_backend::RamBackend;
use io_common::*;
use nvme_ctrl::{ControllerConfig, MetaFile, MetadataConfig, NamespaceConfig};
use nvme_spec::admin::FormatNvmCmd;
use nvme_spec::command::Psdt;
use nvme_spec::identify::{dpc, mc, IdentifyNamespace};
use nvme_spec::opcode::nvm as iop;
use nvme_spec::pi::{crc16_t10dif, prinfo, Pi16};
use nvme_spec::sgl::{SglDescriptor, SglType};
use nvme_spec::{Cqe, Status};
use test_kit::MockHost;
use test_util::pattern;
use zerocopy::little_endian::U32;
use zerocopy::{FromBytes, IntoBytes};

const NS_BYTES: u64 = 4 << 20;
const PRCHK_ALL: u8 = prinfo::PRCHK_MASK;

/// The fields of a Read or Write beyond SLBA and NLB.
#[derive(Clone, Copy, Default)]
struct Pi {
    prinfo: u8,
    ref_tag: u32,
    app_tag: u16,
    app_mask: u16,
    /// Metadata buffer (0: none given).
    mptr: u64,
}

fn cmd(h: &mut MockHost, opcode: u8, slba: u64, nlb: u32, data: (u64, u64), p: Pi) -> Cqe {
    let mut s = h.rw_sqe(opcode, 1, slba, nlb, data);
    s.cdw12 = U32::new(s.cdw12.get() | (p.prinfo as u32) << 26);
    s.cdw14 = U32::new(p.ref_tag);
    s.cdw15 = U32::new(p.app_tag as u32 | (p.app_mask as u32) << 16);
    s.mptr = p.mptr.into();
    h.io_cmd(1, s)
}

/// Writes `data` (512-byte blocks) at `slba` with metadata `meta` (if any).
fn write(h: &mut MockHost, slba: u64, data: &[u8], meta: Option<&[u8]>, p: Pi) -> Cqe {
    let buf = h.alloc.alloc_pages(data.len().div_ceil(4096) as u64);
    h.mem.write(buf, data).unwrap();
    let mut p = p;
    if let Some(m) = meta {
        p.mptr = h.alloc.alloc_pages(1);
        h.mem.write(p.mptr, m).unwrap();
    }
    let nlb = (data.len() / 512) as u32;
    cmd(h, iop::WRITE, slba, nlb, (buf, data.len() as u64), p)
}

/// Reads `nlb` 512-byte blocks at `slba`: the completion, the data, and the
/// metadata buffer (`ms` bytes per block; filled with 0xAA before).
fn read(h: &mut MockHost, slba: u64, nlb: u32, ms: usize, p: Pi) -> (Cqe, Vec<u8>, Vec<u8>) {
    let len = nlb as u64 * 512;
    let buf = h.alloc.alloc_pages(len.div_ceil(4096));
    let mut p = p;
    p.mptr = h.alloc.alloc_pages(1);
    h.mem.write(p.mptr, &vec![0xaa; 4096]).unwrap();
    let c = cmd(h, iop::READ, slba, nlb, (buf, len), p);
    let mut data = vec![0u8; len as usize];
    h.mem.read(buf, &mut data).unwrap();
    let mut meta = vec![0u8; nlb as usize * ms];
    h.mem.read(p.mptr, &mut meta).unwrap();
    (c, data, meta)
}

/// Type 1 protection information for `data` at `slba`, 8 bytes per block.
fn type1_pi(data: &[u8], slba: u64, app: u16) -> Vec<u8> {
    data.chunks(512)
        .enumerate()
        .flat_map(|(i, b)| {
            Pi16 { guard: crc16_t10dif(b), app_tag: app, ref_tag: (slba + i as u64) as u32 }.to_bytes()
        })
        .collect()
}

fn identify_ns(h: &mut MockHost, nsid: u32) -> IdentifyNamespace {
    IdentifyNamespace::read_from_bytes(&h.identify(0, nsid).unwrap()).unwrap()
}

#[test]
fn identify_offers_the_formats_with_metadata_only_where_they_can_be_kept() {
    let mut h = pi_host(2, 1 | 8);
    let id = identify_ns(&mut h, 1);
    assert_eq!((id.nlbaf, id.flbas, id.mc, id.dps), (7, 2, mc::SEPARATE | mc::EXTENDED, 1 | 8));
    assert_eq!(id.dpc, dpc::TYPE1 | dpc::TYPE2 | dpc::TYPE3 | dpc::FIRST | dpc::LAST);
    let lbaf: Vec<(u8, u16)> = id.lbaf[..9].iter().map(|f| (f.lbads, f.ms.get())).collect();
    // The last two with the 64-bit guard (io_pi64.rs); none past them.
    assert_eq!(lbaf, [(9, 0), (12, 0), (9, 8), (12, 8), (12, 16), (12, 64), (9, 16), (12, 16), (0, 0)]);
    // The namespace without a store has the two plain formats, nothing to protect.
    let id = identify_ns(&mut h, 2);
    assert_eq!((id.nlbaf, id.mc, id.dpc, id.dps), (1, 0, 0, 0));
}

#[test]
fn pract_inserts_and_strips_the_protection_information() {
    let mut h = pi_host(2, 1);
    let data = pattern(3, 4 * 512);
    // No metadata buffer: the controller makes the protection information.
    let p = Pi { prinfo: prinfo::PRACT | PRCHK_ALL, ref_tag: 40, app_tag: 0x77, app_mask: 0xffff, mptr: 0 };
    assert_status(&write(&mut h, 40, &data, None, p), Status::SUCCESS, false);
    // Read back stripped (the buffer untouched), checked on the way.
    let (c, got, meta) = read(&mut h, 40, 4, 8, p);
    assert_status(&c, Status::SUCCESS, false);
    assert!(got == data);
    assert_eq!(meta, vec![0xaa; 32], "PRACT with 8 bytes of metadata strips it");
    // Read with the metadata: what was generated.
    let (c, _, meta) = read(&mut h, 40, 4, 8, Pi { prinfo: 0, ..p });
    assert_status(&c, Status::SUCCESS, false);
    assert_eq!(meta, type1_pi(&data, 40, 0x77));
}

#[test]
fn a_write_whose_protection_information_is_wrong_is_refused_and_lands_nowhere() {
    let mut h = pi_host(2, 1);
    let old = pattern(1, 2 * 512);
    let good = Pi { prinfo: PRCHK_ALL, ref_tag: 8, app_tag: 5, app_mask: 0xffff, mptr: 0 };
    assert_status(&write(&mut h, 8, &old, Some(&type1_pi(&old, 8, 5)), good), Status::SUCCESS, false);
    let new = pattern(2, 2 * 512);
    let mut bad_guard = type1_pi(&new, 8, 5);
    bad_guard[8] ^= 1; // the second block's guard
    assert_status(
        &write(&mut h, 8, &new, Some(&bad_guard), good),
        Status::END_TO_END_GUARD_CHECK_ERROR,
        true,
    );
    let bad_ref = type1_pi(&new, 9, 5);
    assert_status(
        &write(&mut h, 8, &new, Some(&bad_ref), good),
        Status::END_TO_END_REFERENCE_TAG_CHECK_ERROR,
        true,
    );
    let bad_app = type1_pi(&new, 8, 6);
    assert_status(
        &write(&mut h, 8, &new, Some(&bad_app), good),
        Status::END_TO_END_APPLICATION_TAG_CHECK_ERROR,
        true,
    );
    // The mask says which application tag bits count.
    let masked = Pi { app_mask: 0xfff0, ..good };
    assert_status(
        &write(&mut h, 20, &new, Some(&type1_pi(&new, 20, 6)), Pi { ref_tag: 20, ..masked }),
        Status::SUCCESS,
        false,
    );
    // Type 1: an initial reference tag that is not the LBA, checked, is refused.
    let off = Pi { ref_tag: 9, ..good };
    assert_status(
        &write(&mut h, 8, &new, Some(&type1_pi(&new, 9, 5)), off),
        Status::INVALID_PROTECTION_INFORMATION,
        true,
    );
    // Unchecked, the same wrong guard goes through: the host did not ask.
    // None of the refused writes landed: the old data and metadata are there.
    let (c, got, meta) = read(&mut h, 8, 2, 8, good);
    assert_status(&c, Status::SUCCESS, false);
    assert!(got == old);
    assert_eq!(meta, type1_pi(&old, 8, 5));
}

#[test]
fn data_changed_under_the_namespace_fails_the_guard_check_on_read_and_verify() {
    let mut h = pi_host(2, 1);
    let data = pattern(9, 8 * 512);
    let p = Pi { prinfo: prinfo::PRACT | PRCHK_ALL, ref_tag: 100, app_tag: 0, app_mask: 0, mptr: 0 };
    assert_status(&write(&mut h, 100, &data, None, p), Status::SUCCESS, false);
    // One byte of block 103 changed through the plain namespace on the same data.
    let mut block = data[3 * 512..4 * 512].to_vec();
    block[17] ^= 0x40;
    assert_eq!(h.write_blocks(1, 2, 103, 512, &block), Status::SUCCESS);
    let (c, _, _) = read(&mut h, 100, 8, 8, p);
    assert_status(&c, Status::END_TO_END_GUARD_CHECK_ERROR, true);
    // The blocks before it are good; without the guard check the read goes through.
    assert_status(&read(&mut h, 100, 3, 8, p).0, Status::SUCCESS, false);
    let unchecked = Pi { prinfo: prinfo::PRACT, ..p };
    assert_status(&read(&mut h, 100, 8, 8, unchecked).0, Status::SUCCESS, false);
    // Verify checks the same way, moving nothing.
    let verify = |h: &mut MockHost, prinfo| {
        let mut s = h.rw_sqe(iop::VERIFY, 1, 100, 8, (0, 0));
        s.cdw12 = U32::new(s.cdw12.get() | (prinfo as u32) << 26);
        s.cdw14 = U32::new(100);
        h.io_cmd(1, s)
    };
    assert_status(&verify(&mut h, PRCHK_ALL), Status::END_TO_END_GUARD_CHECK_ERROR, true);
    assert_status(&verify(&mut h, prinfo::PRCHK_REF), Status::SUCCESS, false);
}

#[test]
fn blocks_never_written_or_deallocated_read_unchecked_and_write_zeroes_generates() {
    let mut h = pi_host(2, 1);
    let p = Pi { prinfo: PRCHK_ALL, ref_tag: 7, ..Default::default() };
    // Never written: all ones (checks disabled), so a checked read goes through.
    let (c, _, meta) = read(&mut h, 7, 2, 8, p);
    assert_status(&c, Status::SUCCESS, false);
    assert_eq!(meta, vec![0xff; 16]);
    // Write Zeroes with PRACT: zeroes with protection information that checks.
    let mut s = h.rw_sqe(iop::WRITE_ZEROES, 1, 7, 2, (0, 0));
    s.cdw12 = U32::new(s.cdw12.get() | (prinfo::PRACT as u32) << 26);
    s.cdw14 = U32::new(7);
    assert_status(&h.io_cmd(1, s), Status::SUCCESS, false);
    let (c, got, meta) = read(&mut h, 7, 2, 8, p);
    assert_status(&c, Status::SUCCESS, false);
    assert!(got.iter().all(|&b| b == 0));
    assert_eq!(meta, type1_pi(&[0u8; 1024], 7, 0));
    // It checks nothing itself: PRCHK bits are refused.
    let mut s = h.rw_sqe(iop::WRITE_ZEROES, 1, 7, 2, (0, 0));
    s.cdw12 = U32::new(s.cdw12.get() | (prinfo::PRCHK_GUARD as u32) << 26);
    assert_status(&h.io_cmd(1, s), Status::INVALID_PROTECTION_INFORMATION, true);
}

#[test]
fn metadata_without_protection_is_kept_as_given_and_types_2_and_3_count_their_tags() {
    // 512 + 8 without protection information: bytes in, the same bytes out.
    let mut h = pi_host(2, 0);
    let data = pattern(4, 1024);
    let meta: Vec<u8> = (0..16).collect();
    // PRINFO means nothing without a type.
    let p = Pi { prinfo: PRCHK_ALL, ..Default::default() };
    assert_status(&write(&mut h, 3, &data, Some(&meta), p), Status::SUCCESS, false);
    assert_eq!(read(&mut h, 3, 2, 8, p).2, meta);
    // Never written, without protection information: zeroes, as deallocated blocks read.
    assert_eq!(read(&mut h, 500, 1, 8, p).2, vec![0; 8]);

    // Type 2: reference tags count up from the command's; type 3 keeps one.
    for (dps, second) in [(2u8, 501u32), (3, 500)] {
        let mut h = pi_host(2, dps);
        let p = Pi { prinfo: prinfo::PRACT | PRCHK_ALL, ref_tag: 500, app_tag: 1, app_mask: 0xffff, mptr: 0 };
        assert_status(&write(&mut h, 60, &data, None, p), Status::SUCCESS, false);
        let (c, _, m) = read(&mut h, 60, 2, 8, Pi { prinfo: PRCHK_ALL, ..p });
        assert_status(&c, Status::SUCCESS, false);
        assert_eq!(Pi16::from_bytes(m[8..16].try_into().unwrap()).ref_tag, second, "type {dps}");
        // Another expected tag: a reference tag error (type 3 is not checked by it,
        // Linux asks only for the guard there; the controller checks what is asked).
        let (c, _, _) = read(&mut h, 60, 2, 8, Pi { prinfo: prinfo::PRCHK_REF, ref_tag: 499, ..p });
        assert_status(&c, Status::END_TO_END_REFERENCE_TAG_CHECK_ERROR, true);
    }
}

#[test]
fn protection_information_first_in_16_bytes_of_metadata_at_4096_byte_blocks() {
    let mut h = pi_host(4, 1 | 8);
    let data = pattern(5, 4096);
    let p = Pi { prinfo: prinfo::PRACT | PRCHK_ALL, ref_tag: 3, app_tag: 9, app_mask: 0xffff, mptr: 0 };
    // 16 bytes: PRACT inserts into the host's metadata, which still moves.
    let buf = h.alloc.alloc_pages(1);
    h.mem.write(buf, &data).unwrap();
    let mptr = h.alloc.alloc_pages(1);
    h.mem.write(mptr, &[0x5c; 16]).unwrap();
    assert_status(&cmd(&mut h, iop::WRITE, 3, 1, (buf, 4096), Pi { mptr, ..p }), Status::SUCCESS, false);
    let rbuf = h.alloc.alloc_pages(1);
    let rmeta = h.alloc.alloc_pages(1);
    let c = cmd(&mut h, iop::READ, 3, 1, (rbuf, 4096), Pi { mptr: rmeta, prinfo: PRCHK_ALL, ..p });
    assert_status(&c, Status::SUCCESS, false);
    let mut m = [0u8; 16];
    h.mem.read(rmeta, &mut m).unwrap();
    let pi = Pi16 { guard: crc16_t10dif(&data), app_tag: 9, ref_tag: 3 };
    assert_eq!(&m[..8], &pi.to_bytes());
    assert_eq!(&m[8..], &[0x5c; 8]);
}

#[test]
fn format_moves_between_formats_and_refuses_what_cannot_be() {
    let mut h = pi_host(0, 0);
    let format = |h: &mut MockHost, nsid, lbaf, pi, pil, mset| {
        let s = FormatNvmCmd { nsid, lbaf, mset, pi, pil, ses: 0 }.to_sqe();
        h.admin_cmd(s).unwrap().status()
    };
    assert_eq!(format(&mut h, 1, 3, 2, true, false), Status::SUCCESS);
    let id = identify_ns(&mut h, 1);
    assert_eq!((id.flbas, id.dps, id.current_lbaf().block_size()), (3, 2 | 8, 4096));
    // A type needs metadata; the plain namespace has no store for metadata; there
    // is no format 8.
    for (nsid, lbaf, pi, mset) in [(1, 1, 1, false), (1, 1, 1, true), (2, 2, 0, false), (1, 8, 0, false)] {
        let st = format(&mut h, nsid, lbaf, pi, false, mset);
        assert_eq!(st.code(), Status::INVALID_FORMAT, "nsid {nsid} lbaf {lbaf} pi {pi} mset {mset}");
    }
    // Type 2 at 4096 + 8 in place: a checked write and read go through it.
    let data = pattern(6, 4096);
    let buf = h.alloc.alloc_pages(1);
    h.mem.write(buf, &data).unwrap();
    let p = Pi { prinfo: prinfo::PRACT | PRCHK_ALL, ref_tag: 77, ..Default::default() };
    assert_status(&cmd(&mut h, iop::WRITE, 2, 1, (buf, 4096), p), Status::SUCCESS, false);
    let c = cmd(&mut h, iop::READ, 2, 1, (buf, 4096), p);
    assert_status(&c, Status::SUCCESS, false);
    // Back to no metadata: reads and writes as any namespace.
    assert_eq!(format(&mut h, 1, 0, 0, false, false), Status::SUCCESS);
    assert_eq!(identify_ns(&mut h, 1).dps, 0);
    assert_still_works(&mut h, 1, 1, 512);
}

#[test]
fn metadata_sgls_and_misaligned_buffers_are_refused() {
    let mut h = pi_host(2, 0);
    let data = pattern(1, 512);
    let buf = h.alloc.alloc_pages(1);
    h.mem.write(buf, &data).unwrap();
    let mptr = h.alloc.alloc_pages(1);
    let c = cmd(&mut h, iop::WRITE, 0, 1, (buf, 512), Pi { mptr: mptr + 2, ..Default::default() });
    assert_status(&c, Status::INVALID_FIELD, true);
    // MPTR past guest memory: a data transfer error, nothing written.
    let c = cmd(&mut h, iop::WRITE, 0, 1, (buf, 512), Pi { mptr: MEM + 4096, ..Default::default() });
    assert_status(&c, Status::DATA_TRANSFER_ERROR, true);
    // PSDT 10b: MPTR holds the address of an SGL descriptor (qword aligned).
    let mut s = h.rw_sqe(iop::READ, 1, 0, 1, (buf, 512));
    s.set_cdw0(iop::READ, 0, Psdt::SglMptrSgl);
    s.set_sgl1(&SglDescriptor::new(SglType::DataBlock, buf, 512));
    s.mptr = (mptr + 4).into();
    assert_status(&h.io_cmd(1, s), Status::INVALID_FIELD, true);
    // Zone Append exists on zoned namespaces only, metadata or not.
    let s = h.rw_sqe(nvme_spec::opcode::zns::ZONE_APPEND, 1, 0, 1, (buf, 512));
    assert_status(&h.io_cmd(1, s), Status::INVALID_OPCODE, true);
    assert_still_works(&mut h, 1, 2, 512);
}

#[test]
fn a_saved_state_carries_the_format_and_the_store_keeps_the_metadata() {
    use nvme_ctrl::{Controller, StateError};
    let ram = RamBackend::new(NS_BYTES);
    let store = MetaFile::memory().unwrap();
    let config = |store: Option<MetaFile>| ControllerConfig {
        namespaces: vec![NamespaceConfig {
            metadata: store.map(|store| MetadataConfig { store, dps: 0, extended: false }),
            ..NamespaceConfig::new(Arc::new(ram.clone()), 0)
        }],
        ..Default::default()
    };
    let mut h = MockHost::new(config(Some(store.clone())), MEM);
    h.init(opts()).expect("bring-up");
    // Formatted by the host into type 3, first in 16 bytes at 4096-byte blocks.
    let s = FormatNvmCmd { nsid: 1, lbaf: 4, mset: false, pi: 3, pil: true, ses: 0 }.to_sqe();
    assert_eq!(h.admin_cmd(s).unwrap().status(), Status::SUCCESS);
    let data = pattern(8, 4096);
    let buf = h.alloc.alloc_pages(1);
    h.mem.write(buf, &data).unwrap();
    let p = Pi { prinfo: prinfo::PRACT | PRCHK_ALL, ref_tag: 0xabc, app_tag: 4, app_mask: 0xffff, mptr: 0 };
    let mptr = h.alloc.alloc_pages(1);
    assert_status(&cmd(&mut h, iop::WRITE, 5, 1, (buf, 4096), Pi { mptr, ..p }), Status::SUCCESS, false);
    h.ctrl.quiesce(std::time::Duration::from_secs(5)).expect("quiesce");
    let state = h.ctrl.save_state();
    assert_eq!((state.namespaces[0].lba_format, state.namespaces[0].dps), (4, 3 | 8));
    // A controller whose namespace keeps no metadata cannot take that format.
    let plain = Controller::new(config(None), h.mem.clone(), h.irq.clone()).unwrap();
    let mut plain = plain;
    assert!(matches!(plain.restore_state(&state), Err(StateError::Mismatch(e)) if e.contains("metadata")));
    // One over the same store (what an upgrade hands over) reads it back, checked.
    let mut c = Controller::new(config(Some(store)), h.mem.clone(), h.irq.clone()).unwrap();
    c.restore_state(&state).expect("restore");
    let old = std::mem::replace(&mut h.ctrl, c);
    std::mem::forget(old);
    assert_eq!(identify_ns(&mut h, 1).dps, 3 | 8);
    let rbuf = h.alloc.alloc_pages(1);
    let rmeta = h.alloc.alloc_pages(1);
    let c = cmd(&mut h, iop::READ, 5, 1, (rbuf, 4096), Pi { prinfo: PRCHK_ALL, mptr: rmeta, ..p });
    assert_status(&c, Status::SUCCESS, false);
    let mut m = [0u8; 8];
    h.mem.read(rmeta, &mut m).unwrap();
    assert_eq!(Pi16::from_bytes(m), Pi16 { guard: crc16_t10dif(&data), app_tag: 4, ref_tag: 0xabc });
}

/// A Read or Write with PSDT 10b: the data in one SGL Data Block, the metadata
/// described by the SGL descriptor at MPTR.
fn sgl_cmd(h: &mut MockHost, opcode: u8, slba: u64, data: u64, len: u32, meta_desc: SglDescriptor) -> Cqe {
    let mut s = h.rw_sqe(opcode, 1, slba, len / 512, (data, len as u64));
    s.set_cdw0(opcode, 0, Psdt::SglMptrSgl);
    s.set_sgl1(&SglDescriptor::new(SglType::DataBlock, data, len));
    let at = h.alloc.alloc_pages(1);
    h.mem.write(at, meta_desc.as_bytes()).unwrap();
    s.mptr = at.into();
    h.io_cmd(1, s)
}

#[test]
fn metadata_described_by_an_sgl_moves_like_a_contiguous_buffer() {
    let mut h = pi_host(2, 0);
    let data = pattern(12, 2048);
    let buf = h.alloc.alloc_pages(1);
    h.mem.write(buf, &data).unwrap();
    // Four blocks' metadata in two pieces, through a Last Segment of two Data Blocks.
    let meta: Vec<u8> = (100..132).collect();
    let (m1, m2, list) = (h.alloc.alloc_pages(1), h.alloc.alloc_pages(1), h.alloc.alloc_pages(1));
    h.mem.write(m1 + 40, &meta[..12]).unwrap();
    h.mem.write(m2, &meta[12..]).unwrap();
    let descs =
        [SglDescriptor::new(SglType::DataBlock, m1 + 40, 12), SglDescriptor::new(SglType::DataBlock, m2, 20)];
    let raw: Vec<u8> = descs.iter().flat_map(|d| d.as_bytes().to_vec()).collect();
    h.mem.write(list, &raw).unwrap();
    let c = sgl_cmd(&mut h, iop::WRITE, 10, buf, 2048, SglDescriptor::new(SglType::LastSegment, list, 32));
    assert_status(&c, Status::SUCCESS, false);
    // Read back into one Data Block at MPTR's descriptor, and through the plain
    // MPTR the same bytes.
    let (rbuf, rmeta) = (h.alloc.alloc_pages(1), h.alloc.alloc_pages(1));
    let c = sgl_cmd(&mut h, iop::READ, 10, rbuf, 2048, SglDescriptor::new(SglType::DataBlock, rmeta, 32));
    assert_status(&c, Status::SUCCESS, false);
    let mut got = vec![0u8; 32];
    h.mem.read(rmeta, &mut got).unwrap();
    assert_eq!(got, meta);
    assert_eq!(read(&mut h, 10, 4, 8, Pi::default()).2, meta);
    // A descriptor describing less than the metadata: Data SGL Length Invalid.
    let c = sgl_cmd(&mut h, iop::READ, 10, rbuf, 2048, SglDescriptor::new(SglType::DataBlock, rmeta, 24));
    assert_status(&c, Status::DATA_SGL_LENGTH_INVALID, true);
    // Identify says MPTR may hold an SGL descriptor (SGLS bit 19).
    let ctrl = h.identify(1, 0).unwrap();
    assert_ne!(
        u32::from_le_bytes(ctrl[536..540].try_into().unwrap()) & nvme_spec::identify::sgls::MPTR_SGL,
        0
    );
}

#[test]
fn extended_lbas_carry_each_blocks_metadata_after_its_data() {
    let mut h = pi_host(0, 0);
    // MSET: metadata inline, 512 + 8, type 1 PI last.
    let s = FormatNvmCmd { nsid: 1, lbaf: 2, mset: true, pi: 1, pil: false, ses: 0 }.to_sqe();
    assert_eq!(h.admin_cmd(s).unwrap().status(), Status::SUCCESS);
    let id = identify_ns(&mut h, 1);
    assert_eq!((id.flbas, id.mc), (0x10 | 2, mc::SEPARATE | mc::EXTENDED));
    // Three blocks, each its 512 bytes then its 8 of PI.
    let data = pattern(13, 3 * 512);
    let pi = type1_pi(&data, 30, 2);
    let inter: Vec<u8> = data.chunks(512).zip(pi.chunks(8)).flat_map(|(d, m)| [d, m].concat()).collect();
    let buf = h.alloc.alloc_pages(1);
    h.mem.write(buf, &inter).unwrap();
    let p = Pi { prinfo: PRCHK_ALL, ref_tag: 30, app_tag: 2, app_mask: 0xffff, mptr: 0 };
    let n = inter.len() as u64;
    assert_status(&cmd(&mut h, iop::WRITE, 30, 3, (buf, n), p), Status::SUCCESS, false);
    // A block whose inline guard is wrong is refused.
    let mut bad = inter.clone();
    bad[520 + 512] ^= 1;
    h.mem.write(buf, &bad).unwrap();
    assert_status(&cmd(&mut h, iop::WRITE, 30, 3, (buf, n), p), Status::END_TO_END_GUARD_CHECK_ERROR, true);
    // Read back as it was written, checked; Compare takes the same layout.
    let rbuf = h.alloc.alloc_pages(1);
    assert_status(&cmd(&mut h, iop::READ, 30, 3, (rbuf, n), p), Status::SUCCESS, false);
    let mut got = vec![0u8; inter.len()];
    h.mem.read(rbuf, &mut got).unwrap();
    assert!(got == inter, "data and metadata interleaved as written");
    assert_status(&cmd(&mut h, iop::COMPARE, 30, 3, (rbuf, n), p), Status::SUCCESS, false);
    // PRACT with 8 bytes of PI: only the data moves.
    let sbuf = h.alloc.alloc_pages(1);
    let strip = Pi { prinfo: prinfo::PRACT | PRCHK_ALL, ..p };
    assert_status(&cmd(&mut h, iop::READ, 30, 3, (sbuf, 3 * 512), strip), Status::SUCCESS, false);
    let mut got = vec![0u8; 3 * 512];
    h.mem.read(sbuf, &mut got).unwrap();
    assert!(got == data);
    // The data changed under the namespace: the inline guard check fails the read.
    let mut block = data[512..1024].to_vec();
    block[3] ^= 0x10;
    assert_eq!(h.write_blocks(1, 2, 31, 512, &block), Status::SUCCESS);
    assert_status(&cmd(&mut h, iop::READ, 30, 3, (rbuf, n), p), Status::END_TO_END_GUARD_CHECK_ERROR, true);
}

/// A Copy on namespace 1 of `ranges` (SLBA, NLB, EILBRT) to `sdlba`, with PRINFOR
/// `r` and PRINFOW `w`, the destination's ILBRT, LBAT and LBATM given: its
/// completion.
fn copy_pi(
    h: &mut MockHost,
    ranges: &[(u64, u32, u32)],
    sdlba: u64,
    r: u8,
    w: u8,
    dest: (u32, u16, u16),
) -> Cqe {
    use nvme_spec::nvm::{CopyCmd, CopyRange};
    let list = h.alloc.alloc_pages(1);
    let mut raw = Vec::new();
    for &(slba, nlb, eilbrt) in ranges {
        let mut e = CopyRange::new(slba, nlb);
        e.eilbrt = eilbrt.into();
        e.elbatm = 0.into();
        raw.extend_from_slice(e.as_bytes());
    }
    h.mem.write(list, &raw).unwrap();
    let mut s = CopyCmd { nsid: 1, sdlba, nr_z: (ranges.len() - 1) as u8, desfmt: 0, fua: false }.to_sqe();
    s.set_prps(list, 0);
    s.cdw12 = U32::new(s.cdw12.get() | (r as u32) << 12 | (w as u32) << 26);
    s.cdw14 = U32::new(dest.0);
    s.cdw15 = U32::new(dest.1 as u32 | (dest.2 as u32) << 16);
    h.io_cmd(1, s)
}

#[test]
fn copy_checks_its_sources_and_generates_or_checks_its_destinations_protection() {
    let mut h = pi_host(2, 1);
    let data = pattern(31, 8 * 512);
    let gen = Pi { prinfo: prinfo::PRACT | PRCHK_ALL, ref_tag: 16, ..Default::default() };
    assert_status(&write(&mut h, 16, &data, None, gen), Status::SUCCESS, false);
    // Checked on the way out, generated at the destination: ref tags 200.., app tag 7.
    let strip = prinfo::PRACT | PRCHK_ALL;
    let c =
        copy_pi(&mut h, &[(16, 4, 16), (20, 4, 20)], 200, strip, prinfo::PRACT | PRCHK_ALL, (200, 7, 0xffff));
    assert_status(&c, Status::SUCCESS, false);
    let good = Pi { prinfo: PRCHK_ALL, ref_tag: 200, app_tag: 7, app_mask: 0xffff, mptr: 0 };
    let (c, got, meta) = read(&mut h, 200, 8, 8, good);
    assert_status(&c, Status::SUCCESS, false);
    assert_eq!((got, meta), (data.clone(), type1_pi(&data, 200, 7)));
    // Carried from the source without PRACT: the destination's checks see the
    // source's reference tags, and the first range fails (Dword 0: range 0).
    let c = copy_pi(&mut h, &[(16, 8, 16)], 300, PRCHK_ALL, PRCHK_ALL, (300, 0, 0));
    assert_status(&c, Status::END_TO_END_REFERENCE_TAG_CHECK_ERROR, true);
    assert_eq!(c.dw0.get(), 0);
    // Carried and checked for the guard only: the blocks keep their tags.
    let c = copy_pi(&mut h, &[(16, 8, 16)], 300, 0, prinfo::PRCHK_GUARD, (300, 0, 0));
    assert_status(&c, Status::SUCCESS, false);
    let (c, got, meta) = read(&mut h, 300, 8, 8, Pi { prinfo: prinfo::PRCHK_GUARD, ..good });
    assert_status(&c, Status::SUCCESS, false);
    assert_eq!((got, meta), (data.clone(), type1_pi(&data, 16, 0)));
    // A source block changed under the namespace (NSID 2, the same data without
    // metadata): the second range fails its guard check, the first is copied.
    let buf = h.alloc.alloc_pages(1);
    h.mem.write(buf, &[0x55; 512]).unwrap();
    let s = h.rw_sqe(iop::WRITE, 2, 21, 1, (buf, 512));
    assert_status(&h.io_cmd(1, s), Status::SUCCESS, false);
    let c = copy_pi(
        &mut h,
        &[(16, 4, 16), (20, 4, 20)],
        400,
        prinfo::PRACT | prinfo::PRCHK_GUARD,
        prinfo::PRACT,
        (400, 0, 0),
    );
    assert_status(&c, Status::END_TO_END_GUARD_CHECK_ERROR, true);
    assert_eq!(c.dw0.get(), 1, "the first range not copied");
    let (c, got, _) = read(&mut h, 400, 4, 8, Pi { prinfo: PRCHK_ALL, ref_tag: 400, ..Default::default() });
    assert_status(&c, Status::SUCCESS, false);
    assert_eq!(got, data[..2048]);
    // Type 1 with a reference check against tags that are not the LBAs: refused
    // before anything moves.
    let c =
        copy_pi(&mut h, &[(16, 4, 17)], 500, prinfo::PRACT | prinfo::PRCHK_REF, prinfo::PRACT, (500, 0, 0));
    assert_status(&c, Status::INVALID_PROTECTION_INFORMATION, true);
    // Stripping at the source but passing through at the destination (or the other
    // way round) is not a Copy: Invalid Field.
    for (r, w) in [(prinfo::PRACT, 0), (0, prinfo::PRACT)] {
        let c = copy_pi(&mut h, &[(16, 4, 16)], 500, r, w, (500, 0, 0));
        assert_status(&c, Status::INVALID_FIELD, true);
    }
    let c = copy_pi(&mut h, &[(16, 4, 16)], 500, 0, prinfo::PRCHK_REF, (501, 0, 0));
    assert_status(&c, Status::INVALID_PROTECTION_INFORMATION, true);
    let (_, _, meta) = read(&mut h, 500, 4, 8, Pi::default());
    assert!(meta.chunks(8).all(|m| m[..2] == [0xff, 0xff] || m == [0xff; 8]), "never written: {meta:x?}");
}

/// A Compare of `data` (512-byte blocks) at `slba` of NSID 1 with metadata `meta`
/// at MPTR.
fn compare(h: &mut MockHost, slba: u64, data: &[u8], meta: &[u8], p: Pi) -> Cqe {
    let buf = h.alloc.alloc_pages(data.len().div_ceil(4096) as u64);
    h.mem.write(buf, data).unwrap();
    let mptr = h.alloc.alloc_pages(1);
    h.mem.write(mptr, meta).unwrap();
    let nlb = (data.len() / 512) as u32;
    cmd(h, iop::COMPARE, slba, nlb, (buf, data.len() as u64), Pi { mptr, ..p })
}

#[test]
fn compare_compares_the_metadata_too_but_not_the_protection_information() {
    // Without protection information: every metadata byte is compared.
    let mut h = pi_host(2, 0);
    let data = pattern(40, 1024);
    let meta: Vec<u8> = (1..=16).collect();
    assert_status(&write(&mut h, 3, &data, Some(&meta), Pi::default()), Status::SUCCESS, false);
    assert_status(&compare(&mut h, 3, &data, &meta, Pi::default()), Status::SUCCESS, false);
    let mut other = meta.clone();
    other[9] ^= 1;
    assert_status(&compare(&mut h, 3, &data, &other, Pi::default()), Status::COMPARE_FAILURE, true);
    let mut changed = data.clone();
    changed[700] ^= 1;
    assert_status(&compare(&mut h, 3, &changed, &meta, Pi::default()), Status::COMPARE_FAILURE, true);

    // Type 1 first in 16 bytes at 4096-byte blocks: the other 8 bytes are compared,
    // the protection information is not (it is checked, as PRCHK asks).
    let mut h = pi_host(4, 1 | 8);
    let data = pattern(41, 4096);
    let mut meta = vec![0u8; 16];
    meta[8..].copy_from_slice(b"userdata");
    let p = Pi { prinfo: prinfo::PRACT | PRCHK_ALL, ref_tag: 2, ..Default::default() };
    // With PRACT and more metadata than the tuple, the host gives the rest.
    let buf = h.alloc.alloc_pages(1);
    h.mem.write(buf, &data).unwrap();
    let mptr = h.alloc.alloc_pages(1);
    h.mem.write(mptr, &meta).unwrap();
    assert_status(&cmd(&mut h, iop::WRITE, 2, 1, (buf, 4096), Pi { mptr, ..p }), Status::SUCCESS, false);
    let cmp4k = |h: &mut MockHost, data: &[u8], meta: &[u8], p: Pi| {
        let buf = h.alloc.alloc_pages(1);
        h.mem.write(buf, data).unwrap();
        let mptr = h.alloc.alloc_pages(1);
        h.mem.write(mptr, meta).unwrap();
        cmd(h, iop::COMPARE, 2, 1, (buf, 4096), Pi { mptr, ..p })
    };
    let checked = Pi { prinfo: PRCHK_ALL, ref_tag: 2, ..Default::default() };
    // The host's tuple bytes are whatever: not compared.
    let mut host = meta.clone();
    host[..8].fill(0xee);
    assert_status(&cmp4k(&mut h, &data, &host, checked), Status::SUCCESS, false);
    host[15] ^= 1;
    assert_status(&cmp4k(&mut h, &data, &host, checked), Status::COMPARE_FAILURE, true);
    // The stored block's own protection information is checked against the tags.
    let wrong_ref = Pi { prinfo: prinfo::PRCHK_REF, ref_tag: 2, ..Default::default() };
    let c = cmp4k(&mut h, &data, &meta, Pi { ref_tag: 3, ..wrong_ref });
    assert_status(&c, Status::INVALID_PROTECTION_INFORMATION, true);
    let wrong_app = Pi { prinfo: prinfo::PRCHK_APP, ref_tag: 2, app_tag: 9, app_mask: 0xffff, mptr: 0 };
    assert_status(
        &cmp4k(&mut h, &data, &meta, wrong_app),
        Status::END_TO_END_APPLICATION_TAG_CHECK_ERROR,
        true,
    );
    // Nothing is inserted or stripped on a Compare.
    let c = cmp4k(&mut h, &data, &meta, Pi { prinfo: prinfo::PRACT, ..checked });
    assert_status(&c, Status::INVALID_PROTECTION_INFORMATION, true);
}
