//! Format NVM (Base §5.1.10, NVM §4.2) and Abort (Base §5.1.1).

mod common;

use common::*;
use nvme_spec::Status;
use test_kit::MockHost;
use test_util::pattern;

const SES_USER_DATA: u32 = 1 << 9;

fn lba_format(h: &mut MockHost, nsid: u32) -> (u8, u64) {
    let id = h.identify(0x00, nsid).unwrap();
    (id[26] & 0xf, le64(&id, 0))
}

// ---- Format NVM

#[test]
fn spec_5_1_10_format_switches_512_and_4096_byte_formats() {
    let (mut h, _) = ready(1, true);
    assert_eq!(lba_format(&mut h, 1), (0, NS_BYTES / 512));
    assert_status(h.format_raw(1, 1), Status::SUCCESS);
    assert_eq!(lba_format(&mut h, 1), (1, NS_BYTES / 4096), "FLBAS and NSZE follow the new format");
    let last = NS_BYTES / 4096 - 1;
    let data = pattern(4, 4096);
    assert_eq!(h.write_blocks(1, 1, last, 4096, &data), Status::SUCCESS);
    let (st, back) = h.read_blocks(1, 1, last, 1, 4096);
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(back, data, "4 KiB blocks");
    let (st, _) = h.read_blocks(1, 1, last + 1, 1, 4096);
    assert_status(st, Status::LBA_OUT_OF_RANGE.with_dnr());

    assert_status(h.format_raw(1, 0), Status::SUCCESS);
    assert_eq!(lba_format(&mut h, 1), (0, NS_BYTES / 512));
    let (st, _) = h.read_blocks(1, 1, NS_BYTES / 512 - 1, 1, 512);
    assert_eq!(st, Status::SUCCESS, "the last 512 B block is addressable again");
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_10_ses_1_user_data_erase_reads_back_zero() {
    let (mut h, ram) = ready(1, false);
    let data = pattern(7, 8 * 512);
    assert_eq!(h.write_blocks(1, 1, 100, 512, &data), Status::SUCCESS);
    assert_eq!(h.write_blocks(1, 1, NS_BYTES / 512 - 8, 512, &data), Status::SUCCESS);
    // Without SES the data stays.
    assert_status(h.format_raw(1, 0), Status::SUCCESS);
    assert_eq!(h.read_blocks(1, 1, 100, 8, 512).1, data);
    assert_status(h.format_raw(1, SES_USER_DATA), Status::SUCCESS);
    for slba in [100, NS_BYTES / 512 - 8] {
        let (st, back) = h.read_blocks(1, 1, slba, 8, 512);
        assert_eq!(st, Status::SUCCESS);
        assert!(back.iter().all(|&b| b == 0), "erased at {slba}");
    }
    let mut raw = vec![0u8; 4096];
    ram.read_at(100 * 512, &mut raw).unwrap();
    assert!(raw.iter().all(|&b| b == 0), "the backend was erased");
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_10_ses_crypto_or_reserved_is_invalid_field() {
    let (mut h, _) = ready(1, false);
    for ses in 2..=7u32 {
        assert_status(h.format_raw(1, ses << 9), Status::INVALID_FIELD.with_dnr());
    }
    assert_eq!(lba_format(&mut h, 1).0, 0, "nothing changed");
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_10_unsupported_lbaf_metadata_or_pi_is_invalid_format() {
    let (mut h, _) = ready(1, false);
    let bad = [
        2,            // LBAF 2 does not exist (NLBAF = 1)
        15,           // LBAFL max
        1 << 12,      // LBAFU = 1: format 16
        1 << 4,       // MSET: no metadata formats
        1 << 5,       // PI type 1
        2 << 5,       // PI type 2
        3 << 5,       // PI type 3
        1 | (1 << 5), // a valid LBAF with PI
    ];
    for cdw10 in bad {
        assert_status(h.format_raw(1, cdw10), Status::INVALID_FORMAT.with_dnr());
    }
    assert_eq!(lba_format(&mut h, 1).0, 0, "nothing changed");
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_10_invalid_nsid_is_invalid_namespace_and_broadcast_formats_all() {
    let (cfg, _) = ram_cfg(3);
    let mut h = MockHost::new(cfg, MEM);
    h.init(test_kit::InitOptions { io_queues: 1, queue_size: 64, ..Default::default() }).unwrap();
    for nsid in [0, 4, 0xffff_fffe] {
        assert_status(h.format_raw(nsid, 1), Status::INVALID_NAMESPACE.with_dnr());
    }
    assert_status(h.format_raw(0xffff_ffff, 1), Status::SUCCESS);
    for nsid in 1..=3 {
        assert_eq!(lba_format(&mut h, nsid), (1, NS_BYTES / 4096), "namespace {nsid} formatted");
    }
    assert_status(h.format_raw(2, 0), Status::SUCCESS);
    assert_eq!(lba_format(&mut h, 1).0, 1);
    assert_eq!(lba_format(&mut h, 2).0, 0, "a single namespace formats alone");
    assert_eq!(lba_format(&mut h, 3).0, 1);
    assert_alive(&mut h);
}

// ---- Abort

#[test]
fn spec_5_1_1_abort_reports_not_aborted_and_controller_keeps_working() {
    let (mut h, _) = ready(2, true);
    // Commands that do not exist (on an I/O SQ, the admin SQ, an SQ that does not
    // exist) and an outstanding AER.
    let aer = h.submit_aer();
    for (sqid, cid) in [(1u16, 0x1234u16), (0, 0), (0, aer), (9, 1)] {
        let c = h.abort_raw(sqid, cid);
        assert_cqe(&c, Status::SUCCESS);
        assert_eq!(c.dw0.get() & 1, 1, "dword 0 bit 0: command not aborted");
    }
    // The AER is still outstanding and still works.
    h.ring(9, nvme_spec::regs::DoorbellKind::SqTail, 1);
    let got = h.reap_admin();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].cid.get(), aer);
    assert_alive(&mut h);
}
