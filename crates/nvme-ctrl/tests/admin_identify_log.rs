//! Identify (Base §5.1.13) and Get Log Page (Base §5.1.12): the structures a host
//! reads, with three namespaces, and every invalid-parameter status.

mod common;

use common::*;
use nvme_spec::log::lid;
use nvme_spec::opcode::{admin as aop, nvm as iop};
use nvme_spec::Status;
use test_kit::MockHost;
use test_util::pattern;
use zerocopy::little_endian::U32;

/// An enabled controller with three RAM namespaces and two I/O queue pairs.
fn three_ns() -> MockHost {
    let (cfg, _) = ram_cfg(3);
    let mut h = MockHost::new(cfg, MEM);
    h.init(test_kit::InitOptions { io_queues: 2, queue_size: 64, ..Default::default() }).unwrap();
    h
}

fn ns_list(data: &[u8]) -> Vec<u32> {
    data.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).take_while(|&n| n != 0).collect()
}

// ---- Identify (Base §5.1.13)

#[test]
fn spec_5_1_13_cns_01_identify_controller() {
    let mut h = three_ns();
    let id = h.identify_raw(0x01, 0, 0).unwrap();
    assert_eq!(le16(&id, 0), 0x1b36, "VID");
    assert_eq!(&id[4..13], b"VNVME0001", "SN");
    assert_eq!(id[77], 8, "MDTS");
    assert_eq!(le32(&id, 80), 0x0001_0400, "VER");
    assert_eq!(le16(&id, 256) & (1 << 8), 1 << 8, "OACS: Doorbell Buffer Config");
    assert_eq!(le16(&id, 256) & (1 << 1), 1 << 1, "OACS: Format NVM");
    assert_eq!(id[259], 3, "AERL (0's based)");
    assert_eq!(id[262], 63, "ELPE (0's based)");
    assert_eq!(id[512], 0x66, "SQES");
    assert_eq!(id[513], 0x44, "CQES");
    assert_eq!(le32(&id, 516), 3, "NN");
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_13_cns_00_identify_namespace() {
    let mut h = three_ns();
    let ns = h.identify_raw(0x00, 2, 0).unwrap();
    assert_eq!(le64(&ns, 0), NS_BYTES / 512, "NSZE");
    assert_eq!(le64(&ns, 8), NS_BYTES / 512, "NCAP");
    assert_eq!(ns[25], 1, "NLBAF: two formats");
    assert_eq!(ns[26] & 0xf, 0, "FLBAS: format 0");
    assert_eq!(ns[128 + 2], 9, "LBAF0: 512 B");
    assert_eq!(ns[132 + 2], 12, "LBAF1: 4 KiB");
    assert_eq!(le16(&ns, 128), 0, "no metadata");
    assert!(ns[104..120].iter().any(|&b| b != 0), "NGUID set");
    assert!(ns[120..128].iter().any(|&b| b != 0), "EUI64 set");
    let other = h.identify_raw(0x00, 3, 0).unwrap();
    assert_ne!(ns[104..128], other[104..128], "identifiers differ between namespaces");
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_13_cns_00_invalid_nsid_is_invalid_namespace_or_format() {
    let mut h = three_ns();
    for nsid in [0, 4, 1000, 0xffff_fffe, 0xffff_ffff] {
        assert_eq!(
            h.identify_raw(0x00, nsid, 0),
            Err(Status::INVALID_NAMESPACE.with_dnr()),
            "nsid {nsid:#x}"
        );
    }
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_13_cns_02_active_namespace_list_is_ascending_after_nsid() {
    let mut h = three_ns();
    assert_eq!(ns_list(&h.identify_raw(0x02, 0, 0).unwrap()), vec![1, 2, 3]);
    assert_eq!(ns_list(&h.identify_raw(0x02, 1, 0).unwrap()), vec![2, 3]);
    assert_eq!(ns_list(&h.identify_raw(0x02, 2, 0).unwrap()), vec![3]);
    let empty = h.identify_raw(0x02, 3, 0).unwrap();
    assert!(empty.iter().all(|&b| b == 0), "nothing after the last namespace: zero filled");
    assert!(h.identify_raw(0x02, 100, 0).unwrap().iter().all(|&b| b == 0));
    for nsid in [0xffff_fffe, 0xffff_ffff] {
        assert_eq!(h.identify_raw(0x02, nsid, 0), Err(Status::INVALID_NAMESPACE.with_dnr()));
    }
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_13_cns_03_descriptor_list_has_eui64_nguid_uuid_and_csi() {
    let mut h = three_ns();
    let idns = h.identify_raw(0x00, 1, 0).unwrap();
    let d = h.identify_raw(0x03, 1, 0).unwrap();
    let mut seen = Vec::new();
    let mut pos = 0;
    while pos + 4 <= d.len() && d[pos] != 0 {
        let (nidt, nidl) = (d[pos], d[pos + 1] as usize);
        let id = &d[pos + 4..pos + 4 + nidl];
        match nidt {
            1 => assert_eq!((nidl, id), (8, &idns[120..128]), "EUI64 matches Identify Namespace"),
            2 => assert_eq!((nidl, id), (16, &idns[104..120]), "NGUID matches Identify Namespace"),
            3 => {
                assert_eq!(nidl, 16);
                assert_eq!(id[6] >> 4, 4, "UUID version 4");
            }
            4 => assert_eq!((nidl, id), (1, &[0u8][..]), "CSI: NVM command set"),
            t => panic!("unexpected descriptor type {t}"),
        }
        seen.push(nidt);
        pos += 4 + nidl;
    }
    assert_eq!(seen, vec![1, 2, 3, 4]);
    assert!(d[pos..].iter().all(|&b| b == 0), "rest zero filled");
    let d3 = h.identify_raw(0x03, 3, 0).unwrap();
    assert_ne!(d[..pos], d3[..pos], "namespace 3 has its own identifiers");
    for nsid in [0, 4, 0xffff_ffff] {
        assert_eq!(
            h.identify_raw(0x03, nsid, 0),
            Err(Status::INVALID_NAMESPACE.with_dnr()),
            "nsid {nsid:#x}"
        );
    }
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_13_cns_05_06_07_nvm_command_set_structures() {
    let mut h = three_ns();
    // CSI is CDW11 bits 31:24: the NVM (0) and Zoned Namespace (2) command sets
    // exist; these namespaces are all NVM ones.
    assert!(h.identify_raw(0x05, 2, 0).is_ok());
    assert_eq!(h.identify_raw(0x05, 2, 2 << 24), Err(Status::INVALID_FIELD.with_dnr()));
    assert_eq!(h.identify_raw(0x05, 2, 1 << 24), Err(Status::INVALID_FIELD.with_dnr()));
    assert_eq!(h.identify_raw(0x05, 4, 0), Err(Status::INVALID_NAMESPACE.with_dnr()));
    assert_eq!(h.identify_raw(0x05, 0, 0), Err(Status::INVALID_NAMESPACE.with_dnr()));
    let c = h.identify_raw(0x06, 0, 0).unwrap();
    assert_eq!(c[0], 8, "VSL = MDTS");
    assert_eq!(h.identify_raw(0x06, 0, 1 << 24), Err(Status::INVALID_FIELD.with_dnr()));
    assert_eq!(h.identify_raw(0x06, 0, 2 << 24).unwrap()[0], 0, "ZNS: ZASL 0 (MDTS)");
    assert_eq!(ns_list(&h.identify_raw(0x07, 0, 0).unwrap()), vec![1, 2, 3]);
    assert_eq!(ns_list(&h.identify_raw(0x07, 2, 0).unwrap()), vec![3]);
    assert_eq!(h.identify_raw(0x07, 0, 1 << 24), Err(Status::INVALID_FIELD.with_dnr()));
    assert_eq!(ns_list(&h.identify_raw(0x07, 0, 2 << 24).unwrap()), Vec::<u32>::new(), "no zoned namespace");
    assert_eq!(h.identify_raw(0x07, 0xffff_ffff, 0), Err(Status::INVALID_NAMESPACE.with_dnr()));
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_13_unsupported_cns_is_invalid_field() {
    let mut h = three_ns();
    for cns in [0x04, 0x08, 0x10, 0x11, 0x12, 0x13, 0x1f, 0xff] {
        assert_eq!(h.identify_raw(cns, 0, 0), Err(Status::INVALID_FIELD.with_dnr()), "CNS {cns:#x}");
    }
    assert_alive(&mut h);
}

#[test]
fn spec_5_unsupported_admin_opcode_is_invalid_opcode() {
    let mut h = three_ns();
    for op in [aop::FIRMWARE_COMMIT, aop::NAMESPACE_MANAGEMENT, aop::SANITIZE, 0x03, 0xc0] {
        let st = h.admin_status(MockHost::admin_sqe(op));
        assert_status(st, Status::INVALID_OPCODE.with_dnr());
    }
    assert_alive(&mut h);
}

// ---- Get Log Page (Base §5.1.12)

#[test]
fn spec_5_1_12_1_2_error_log_records_failed_commands_newest_first() {
    let mut h = three_ns();
    // Three failures: an admin one, an I/O one, another admin one.
    let mut bad = MockHost::admin_sqe(aop::IDENTIFY);
    bad.cdw10 = U32::new(0x42);
    let c1 = h.admin_raw(bad);
    assert_cqe(&c1, Status::INVALID_FIELD.with_dnr());
    let buf = h.alloc.alloc_pages(1);
    let s = h.rw_sqe(iop::READ, 2, NS_BYTES / 512, 1, (buf, 512));
    let c2 = h.io_cmd(1, s);
    assert_cqe(&c2, Status::LBA_OUT_OF_RANGE.with_dnr());
    let c3 = h.admin_raw(MockHost::admin_sqe(0xc1));
    assert_cqe(&c3, Status::INVALID_OPCODE.with_dnr());

    let log = h.log_at(lid::ERROR_INFORMATION, 4096, 0, false);
    let e = |i: usize| &log[i * 64..(i + 1) * 64];
    let count0 = le64(e(0), 0);
    assert!(count0 >= 3);
    for (i, (c, sqid)) in [(c3, 0u16), (c2, 1), (c1, 0)].iter().enumerate() {
        let ent = e(i);
        assert_eq!(le64(ent, 0), count0 - i as u64, "entry {i}: error count decreases with age");
        assert_eq!(le16(ent, 8), *sqid, "entry {i}: SQID");
        assert_eq!(le16(ent, 10), c.cid.get(), "entry {i}: CID");
        assert_eq!(le16(ent, 12) >> 1, c.status().raw(), "entry {i}: status field");
    }
    assert_eq!(le64(e(1), 16), NS_BYTES / 512, "the I/O error names its LBA");
    assert_eq!(le32(e(1), 24), 2, "... and its namespace");
    // A later failure goes on top with the next count.
    let c4 = h.admin_raw(MockHost::admin_sqe(0xc1));
    let log = h.log_at(lid::ERROR_INFORMATION, 128, 0, false);
    assert_eq!(le64(&log, 0), count0 + 1);
    assert_eq!(le16(&log, 10), c4.cid.get());
    assert_eq!(le64(&log, 64), count0);
    // The SMART log counts them too.
    let smart = h.log_at(lid::SMART_HEALTH, 512, 0, false);
    assert_eq!(le128_lo(&smart, 176), count0 + 1, "Number of Error Information Log Entries");
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_12_1_3_smart_log_counts_temperature_data_units_and_commands() {
    let mut h = three_ns();
    let before = h.log_at(lid::SMART_HEALTH, 512, 0, false);
    assert_eq!(before[0], 0, "no critical warning");
    assert_eq!(le16(&before, 1), 313, "composite temperature (K)");
    assert_eq!(before[3], 100, "available spare");
    let (r0, w0) = (le128_lo(&before, 64), le128_lo(&before, 80));
    // 1000 blocks of 512 B written = exactly one data unit; then 3 blocks read.
    let data = pattern(1, 100 * 512);
    for i in 0..10 {
        assert_eq!(h.write_blocks(1, 1, i * 100, 512, &data), Status::SUCCESS);
    }
    let (st, _) = h.read_blocks(2, 2, 0, 3, 512);
    assert_eq!(st, Status::SUCCESS);
    let after = h.log_at(lid::SMART_HEALTH, 512, 0, false);
    assert_eq!(le128_lo(&after, 80) - w0, 10, "Host Write Commands");
    assert_eq!(le128_lo(&after, 64) - r0, 1, "Host Read Commands");
    assert_eq!(le128_lo(&after, 48), 1, "Data Units Written: 512,000 bytes is one unit");
    assert_eq!(le128_lo(&after, 32), 1, "Data Units Read: rounded up");
    assert_eq!(le16(&after, 200), 313, "temperature sensor 1");
    assert_eq!(le128_lo(&after, 112), 1, "power cycles");
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_12_1_4_firmware_slot_log() {
    let mut h = three_ns();
    let f = h.log_at(lid::FIRMWARE_SLOT, 512, 0, false);
    assert_eq!(f[0] & 7, 1, "AFI: slot 1 active");
    let fw = env!("CARGO_PKG_VERSION");
    assert_eq!(&f[8..8 + fw.len()], fw.as_bytes(), "FRS1");
    assert!(f[8 + fw.len()..16].iter().all(|&b| b == b' '), "FRS1 space padded");
    assert!(f[16..].iter().all(|&b| b == 0), "other slots empty");
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_12_1_6_commands_supported_and_effects() {
    let mut h = three_ns();
    let e = h.log_at(lid::COMMANDS_SUPPORTED_AND_EFFECTS, 4096, 0, false);
    let acs = |op: u8| le32(&e, op as usize * 4);
    let iocs = |op: u8| le32(&e, 1024 + op as usize * 4);
    let admin_impl = [
        aop::DELETE_IO_SQ,
        aop::CREATE_IO_SQ,
        aop::GET_LOG_PAGE,
        aop::DELETE_IO_CQ,
        aop::CREATE_IO_CQ,
        aop::IDENTIFY,
        aop::ABORT,
        aop::SET_FEATURES,
        aop::GET_FEATURES,
        aop::ASYNC_EVENT_REQUEST,
        aop::KEEP_ALIVE,
        aop::DOORBELL_BUFFER_CONFIG,
        aop::FORMAT_NVM,
    ];
    let io_impl = [
        iop::FLUSH,
        iop::WRITE,
        iop::READ,
        iop::COMPARE,
        iop::WRITE_ZEROES,
        iop::DATASET_MANAGEMENT,
        iop::VERIFY,
        iop::COPY,
        // Answered FDP Disabled without Flexible Data Placement: supported.
        iop::IO_MGMT_RECV,
        iop::IO_MGMT_SEND,
    ];
    for op in 0..=255u8 {
        assert_eq!(acs(op) & 1 != 0, admin_impl.contains(&op), "admin opcode {op:#x} CSUPP");
        assert_eq!(iocs(op) & 1 != 0, io_impl.contains(&op), "I/O opcode {op:#x} CSUPP");
    }
    // LBCC (bit 1) where logical block content changes.
    for op in [iop::WRITE, iop::WRITE_ZEROES, iop::DATASET_MANAGEMENT, iop::COPY] {
        assert_ne!(iocs(op) & 2, 0, "I/O opcode {op:#x} LBCC");
    }
    for op in [iop::READ, iop::FLUSH, iop::COMPARE, iop::VERIFY] {
        assert_eq!(iocs(op) & 2, 0, "I/O opcode {op:#x} has no LBCC");
    }
    assert_ne!(acs(aop::FORMAT_NVM) & 2, 0, "Format NVM LBCC");
    assert_ne!(acs(aop::FORMAT_NVM) & 4, 0, "Format NVM NCC");
    assert_eq!((acs(aop::FORMAT_NVM) >> 16) & 7, 2, "Format NVM: CSE = no other command outstanding");
    assert!(e[2048..].iter().all(|&b| b == 0));
    // Every opcode marked supported is indeed not an Invalid Opcode (spot check the
    // ones that take no parameters to succeed).
    let c = h.admin_raw(MockHost::admin_sqe(aop::ABORT));
    assert_cqe(&c, Status::SUCCESS);
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_12_unsupported_log_identifier_is_invalid_log_page() {
    let mut h = three_ns();
    for l in
        [lid::SUPPORTED_LOG_PAGES, lid::DEVICE_SELF_TEST, lid::TELEMETRY_HOST, 0x08, 0x70, 0x80, 0xc0, 0xff]
    {
        let (st, _) = h.get_log_raw(l, 0xffff_ffff, 127, 0, false);
        assert_status(st, Status::INVALID_LOG_PAGE.with_dnr());
    }
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_12_offset_beyond_log_or_unaligned_is_invalid_field() {
    let mut h = three_ns();
    // SMART is 512 bytes; Firmware Slot 512; Effects 4096.
    for (l, size) in
        [(lid::SMART_HEALTH, 512u64), (lid::FIRMWARE_SLOT, 512), (lid::COMMANDS_SUPPORTED_AND_EFFECTS, 4096)]
    {
        let (st, _) = h.get_log_raw(l, 0xffff_ffff, 0, size + 4, false);
        assert_status(st, Status::INVALID_FIELD.with_dnr());
        let (st, _) = h.get_log_raw(l, 0xffff_ffff, 0, 1 << 40, false);
        assert_status(st, Status::INVALID_FIELD.with_dnr());
        for off in [1, 2, 3, 5, 6] {
            let (st, _) = h.get_log_raw(l, 0xffff_ffff, 0, off, false);
            assert_status(st, Status::INVALID_FIELD.with_dnr());
        }
    }
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_12_length_beyond_mdts_is_invalid_field() {
    let mut h = three_ns();
    // MDTS = 2^8 * 4 KiB = 1 MiB; ask for one dword more (NUMDU carries the high bits).
    let numd_z = (1u32 << 20) / 4;
    let (st, _) = h.get_log_raw(lid::SMART_HEALTH, 0xffff_ffff, numd_z, 0, false);
    assert_status(st, Status::INVALID_FIELD.with_dnr());
    let (st, _) = h.get_log_raw(lid::ERROR_INFORMATION, 0xffff_ffff, u32::MAX, 0, false);
    assert_status(st, Status::INVALID_FIELD.with_dnr());
    assert_alive(&mut h);
}

#[test]
fn spec_5_1_12_offset_inside_a_log_returns_those_bytes() {
    let mut h = three_ns();
    let full = h.log_at(lid::COMMANDS_SUPPORTED_AND_EFFECTS, 4096, 0, false);
    for (off, len) in [(4u64, 4u32), (1024, 64), (0x80 * 4, 8), (4092, 4), (2044, 8)] {
        let part = h.log_at(lid::COMMANDS_SUPPORTED_AND_EFFECTS, len, off, false);
        assert_eq!(part[..], full[off as usize..off as usize + len as usize], "offset {off}");
    }
    let smart = h.log_at(lid::SMART_HEALTH, 512, 0, false);
    let part = h.log_at(lid::SMART_HEALTH, 32, 200, false);
    assert_eq!(part[..], smart[200..232]);
    // Reading past the end of a log returns zeroes for the missing part.
    let tail = h.log_at(lid::SMART_HEALTH, 64, 480, false);
    assert_eq!(tail[..32], smart[480..512]);
    assert!(tail[32..].iter().all(|&b| b == 0));
    assert_alive(&mut h);
}
