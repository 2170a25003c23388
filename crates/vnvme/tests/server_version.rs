//! Robustness of `vnvme serve` across two processes over a real socket: the
//! vfio-user handshake, device description, config space, region access limits,
//! malformed and truncated messages, DMA maps, interrupts, resets, and clients that
//! vanish in the middle of I/O. Every test starts its own server process and checks at
//! the end that it is still alive and serving.

mod common;

use std::io::Write;
use std::os::fd::AsRawFd;
use std::time::Duration;

use common::nvme_host::{NvmeOverVfioUser, IO_VECTOR, PAGE};
use common::*;
use nvme_spec::regs::Cc;
use vfio_user::client::{Client, ClientError};
use vfio_user::proto::*;
use vfio_user::{Command, Connection};
use zerocopy::little_endian::{U32, U64};
use zerocopy::IntoBytes;

/// QEMU's VERSION JSON, byte for byte (hw/vfio-user/proxy.c `caps_json`).
const QEMU_CAPS: &str = r#"{"capabilities":{"migration":{"pgsize":4096,"max_bitmap_size":268435456},"max_msg_fds":16,"max_data_xfer_size":1048576,"pgsizes":4096,"max_dma_maps":65535,"write_multiple":true}}"#;

const VERSION: u16 = Command::Version as u16;
const GET_INFO: u16 = Command::DeviceGetInfo as u16;
const REGION_INFO: u16 = Command::DeviceGetRegionInfo as u16;
const SET_IRQS: u16 = Command::DeviceSetIrqs as u16;
const READ: u16 = Command::RegionRead as u16;
const WRITE: u16 = Command::RegionWrite as u16;
const DMA_MAP: u16 = Command::DmaMap as u16;
const DMA_UNMAP: u16 = Command::DmaUnmap as u16;

fn qemu_version_payload(major: u16, minor: u16, json: &str) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&major.to_le_bytes());
    p.extend_from_slice(&minor.to_le_bytes());
    p.extend_from_slice(json.as_bytes());
    p.push(0);
    p
}

fn access(region: u32, offset: u64, count: u32) -> RegionAccess {
    RegionAccess { offset: U64::new(offset), region: U32::new(region), count: U32::new(count) }
}

fn server_errno(e: ClientError) -> u32 {
    match e {
        ClientError::Server { errno, .. } => errno,
        other => panic!("expected an error reply, got {other}"),
    }
}

fn config_space(c: &mut vfio_user::client::Client) -> Vec<u8> {
    let mut cfg = vec![0u8; 4096];
    c.region_read(REGION_CONFIG, 0, &mut cfg).expect("read the whole config space");
    cfg
}

// ---- VERSION

#[test]
fn version_with_qemus_exact_json_is_accepted_and_the_reply_fits_qemus_buffer() {
    let mut server = Server::start();
    let mut c = Connection::new(server.stream());
    let req = qemu_version_payload(0, 0, QEMU_CAPS);
    let r = request(&mut c, 0x1234, VERSION, &[&req], &[]);
    assert!(!is_error(&r), "VERSION refused: errno {}", r.header.error.get());
    // QEMU receives the reply into its request buffer (vfio_user_recv_one).
    assert!(r.header.size.get() as usize <= HEADER_SIZE + req.len(), "reply longer than QEMU's request");
    assert_eq!(r.payload.last(), Some(&0), "QEMU needs a NUL-terminated JSON ('corrupt version reply')");
    let (major, minor, caps) = vfio_user::version::decode(&r.payload).unwrap();
    assert_eq!((major, minor), (0, 0), "QEMU refuses major != 0 or minor > 0");
    assert!(caps.max_msg_fds.is_some_and(|n| (1..=16).contains(&n)), "QEMU: max_msg_fds <= 16");
    assert!(caps.max_data_xfer_size.is_some_and(|n| n <= 64 << 20), "QEMU: xfer <= 64 MiB");
    assert!(caps.max_dma_maps.is_some_and(|n| n <= 65535));
    assert!(caps.pgsizes.is_some_and(|p| p & 0xfff == 0 && p & 4096 != 0), "QEMU: no page size below 4 KiB");
    assert!(caps.migration.is_some_and(|m| m.pgsize == 4096), "Cloud Hypervisor needs migration.pgsize");
    let json: serde_json::Value =
        serde_json::from_slice(&r.payload[4..r.payload.len() - 1]).expect("reply JSON parses");
    let offered = &json["capabilities"];
    assert!(offered.get("write_multiple").is_none(), "write_multiple turns on QEMU's queued-send quirk");
    assert!(offered.get("twin_socket").is_none(), "twin_socket was not offered by the client");
    // The connection is negotiated: a command goes through.
    let r = request(
        &mut c,
        2,
        GET_INFO,
        &[DeviceInfo { argsz: U32::new(16), ..Default::default() }.as_bytes()],
        &[],
    );
    assert!(!is_error(&r));
    server.assert_alive();
}

#[test]
fn version_with_malformed_json_is_refused_and_a_good_version_still_works() {
    let mut server = Server::start();
    let mut c = Connection::new(server.stream());
    let bad = [
        qemu_version_payload(0, 0, "{not json"),
        qemu_version_payload(0, 0, r#"{"capabilities":{"max_msg_fds":"sixteen"}}"#),
        qemu_version_payload(0, 0, r#"{"capabilities":{"max_msg_fds":-1}}"#),
        vec![0, 0],                                             // shorter than major + minor
        [&[0u8, 0, 0, 0][..], &[0xff, 0xfe, b'{', 0]].concat(), // not UTF-8
    ];
    for (i, p) in bad.iter().enumerate() {
        expect_error(&mut c, 10 + i as u16, VERSION, &[p], &[]);
    }
    // Nothing was negotiated by the failures.
    expect_error(&mut c, 20, GET_INFO, &[DeviceInfo::default().as_bytes()], &[]);
    let r = request(&mut c, 21, VERSION, &[&qemu_version_payload(0, 0, QEMU_CAPS)], &[]);
    assert!(!is_error(&r));
    server.assert_alive();
    drop(c);
    still_serving(&mut server);
}

#[test]
fn version_with_major_other_than_zero_is_refused() {
    let mut server = Server::start();
    let mut c = Connection::new(server.stream());
    for (id, major) in [(1u16, 1u16), (2, 0xffff)] {
        let errno = expect_error(&mut c, id, VERSION, &[&qemu_version_payload(major, 0, QEMU_CAPS)], &[]);
        assert_eq!(errno, libc::EINVAL as u32);
    }
    // A newer minor is fine: the server answers with the minor it speaks.
    let r = request(&mut c, 3, VERSION, &[&qemu_version_payload(0, 7, QEMU_CAPS)], &[]);
    assert!(!is_error(&r));
    assert_eq!(vfio_user::version::decode(&r.payload).unwrap().1, 0);
    server.assert_alive();
}

#[test]
fn commands_before_version_get_an_error_reply() {
    let mut server = Server::start();
    let mut c = Connection::new(server.stream());
    let memfd = memfd(0x10000);
    let map = DmaMap {
        argsz: U32::new(32),
        flags: U32::new(DMA_MAP_FLAG_READ | DMA_MAP_FLAG_WRITE),
        offset: U64::new(0),
        address: U64::new(0x10000),
        size: U64::new(0x10000),
    };
    expect_error(&mut c, 1, GET_INFO, &[DeviceInfo::default().as_bytes()], &[]);
    expect_error(&mut c, 2, READ, &[access(REGION_CONFIG, 0, 4).as_bytes()], &[]);
    expect_error(&mut c, 3, WRITE, &[access(REGION_BAR0, 0x14, 4).as_bytes(), &1u32.to_le_bytes()], &[]);
    expect_error(&mut c, 4, DMA_MAP, &[map.as_bytes()], &[memfd.as_raw_fd()]);
    expect_error(&mut c, 5, Command::DeviceReset as u16, &[], &[]);
    let r = request(&mut c, 6, VERSION, &[&version_payload()], &[]);
    assert!(!is_error(&r));
    // The refused DMA_MAP left nothing behind: the same map now succeeds.
    let r = request(&mut c, 7, DMA_MAP, &[map.as_bytes()], &[memfd.as_raw_fd()]);
    assert!(!is_error(&r), "errno {}", r.header.error.get());
    server.assert_alive();
}

// ---- device description

#[test]
fn device_info_is_a_resettable_pci_device_with_9_regions_and_5_irq_indices() {
    let mut server = Server::start();
    let mut c = server.client();
    let info = c.device_info().unwrap();
    assert_eq!(info.argsz.get(), 16);
    assert_eq!(
        info.flags.get() & (DEVICE_FLAGS_PCI | DEVICE_FLAGS_RESET),
        DEVICE_FLAGS_PCI | DEVICE_FLAGS_RESET
    );
    assert_eq!(info.num_regions.get(), 9);
    assert_eq!(info.num_irqs.get(), 5);
    // IRQ indices: INTx 1, MSI 0, MSI-X = queues + 1 (64 + 1 by default), ERR, REQ.
    let counts: Vec<u32> = (0..5).map(|i| c.irq_info(i).unwrap().count.get()).collect();
    assert_eq!(counts[IRQ_INDEX_INTX as usize], 1);
    assert_eq!(counts[IRQ_INDEX_MSI as usize], 0);
    assert_eq!(counts[IRQ_INDEX_MSIX as usize], 65);
    assert!(c.irq_info(IRQ_INDEX_MSIX).unwrap().flags.get() & IRQ_INFO_EVENTFD != 0);
    assert_eq!(server_errno(c.irq_info(5).unwrap_err()), libc::EINVAL as u32);
    server.assert_alive();
}

#[test]
fn region_info_for_every_index_and_einval_past_the_last() {
    let mut server = Server::start();
    let mut c = server.client();
    let mut sizes = Vec::new();
    for index in 0..9 {
        let (info, caps, fd) = c.region_info(index).unwrap();
        assert_eq!(info.index.get(), index);
        assert_eq!(info.argsz.get() as usize, 32 + caps.len());
        let flags = info.flags.get();
        let size = info.size.get();
        if size > 0 {
            assert_eq!(flags & (REGION_FLAG_READ | REGION_FLAG_WRITE), REGION_FLAG_READ | REGION_FLAG_WRITE);
        }
        if flags & REGION_FLAG_MMAP == 0 {
            assert!(fd.is_none(), "region {index}: an fd without MMAP");
        }
        sizes.push(size);
    }
    assert!(sizes[REGION_BAR0 as usize] >= 0x2000 && sizes[REGION_BAR0 as usize].is_power_of_two());
    assert!(sizes[REGION_BAR4 as usize].is_power_of_two());
    assert_eq!(sizes[REGION_CONFIG as usize], 4096, "PCIe config space keeps QEMU's express cap");
    for absent in [1, 2, 3, 5, REGION_ROM, REGION_VGA] {
        assert_eq!(sizes[absent as usize], 0, "region {absent} should be absent");
    }
    assert_eq!(server_errno(c.region_info(9).unwrap_err()), libc::EINVAL as u32);
    assert_eq!(server_errno(c.region_info(u32::MAX).unwrap_err()), libc::EINVAL as u32);
    // Short request payload.
    let errno = expect_error(c.connection(), 0x7000, REGION_INFO, &[&[0u8; 8]], &[]);
    assert_eq!(errno, libc::EINVAL as u32);
    server.assert_alive();
}

// ---- config space

fn cap_chain(cfg: &[u8]) -> Vec<(u8, usize)> {
    let mut out = Vec::new();
    let mut p = cfg[0x34] as usize;
    while p != 0 {
        assert!(p >= 0x40 && p.is_multiple_of(4) && p < 0x100, "bad capability pointer {p:#x}");
        out.push((cfg[p], p));
        p = cfg[p + 1] as usize;
        assert!(out.len() < 48, "capability list loops");
    }
    out
}

#[test]
fn config_space_is_an_nvme_function_with_pm_msix_and_pcie_endpoint_caps() {
    let mut server = Server::start();
    let mut c = server.client();
    let cfg = config_space(&mut c);
    let r16 = |o: usize| u16::from_le_bytes([cfg[o], cfg[o + 1]]);
    let r32 = |o: usize| u32::from_le_bytes(cfg[o..o + 4].try_into().unwrap());
    assert_eq!(r16(0x00), 0x1b36, "vendor");
    assert_eq!(r16(0x02), 0x0010, "device");
    assert_eq!(&cfg[0x09..0x0c], &[0x02, 0x08, 0x01], "class 01-08-02 (NVM Express)");
    assert_ne!(r16(0x06) & 0x0010, 0, "status: capabilities list");
    assert_eq!(cfg[0x0e] & 0x7f, 0, "header type 0");
    let chain = cap_chain(&cfg);
    let ids: Vec<u8> = chain.iter().map(|&(id, _)| id).collect();
    assert_eq!(ids, vec![0x01, 0x11, 0x10], "PM -> MSI-X -> PCI Express");
    let msix = chain[1].1;
    assert_eq!((r16(msix + 2) & 0x7ff) + 1, 65, "MSI-X table size = vectors");
    assert_eq!(r32(msix + 4) & 7, 4, "MSI-X table in BAR4");
    assert_eq!(r32(msix + 8) & 7, 4, "PBA in BAR4");
    let table_end = (r32(msix + 4) & !7) as u64 + 65 * 16;
    assert!(table_end <= (r32(msix + 8) & !7) as u64, "table and PBA do not overlap");
    let exp = chain[2].1;
    assert_eq!((r16(exp + 2) >> 4) & 0xf, 0, "PCIe device/port type: Endpoint");
    assert!(r16(exp + 2) & 0xf >= 1, "PCIe capability version");
    assert_eq!(r32(0x10) & 0xf, 0x4, "BAR0: 64-bit non-prefetchable memory");
    assert_eq!(r32(0x20) & 0x1, 0, "BAR4: memory");
    assert_eq!(cfg[0x3d], 1, "INTA#");
    // Partial reads agree with the whole.
    let mut b = [0u8; 4];
    c.region_read(REGION_CONFIG, 0x08, &mut b).unwrap();
    assert_eq!(b, cfg[0x08..0x0c]);
    c.region_read(REGION_CONFIG, 0xffc, &mut b).unwrap();
    assert_eq!(b, cfg[0xffc..]);
    server.assert_alive();
}

#[test]
fn config_space_bars_size_through_all_ones_writes() {
    let mut server = Server::start();
    let mut c = server.client();
    let bar0 = c.region_info(REGION_BAR0).unwrap().0.size.get();
    let bar4 = c.region_info(REGION_BAR4).unwrap().0.size.get();
    let mut sized = [0u32; 7];
    for (i, off) in [0x10u64, 0x14, 0x18, 0x1c, 0x20, 0x24, 0x30].into_iter().enumerate() {
        let orig = c.read_u32(REGION_CONFIG, off).unwrap();
        c.region_write(REGION_CONFIG, off, &0xffff_ffffu32.to_le_bytes()).unwrap();
        sized[i] = c.read_u32(REGION_CONFIG, off).unwrap();
        c.region_write(REGION_CONFIG, off, &orig.to_le_bytes()).unwrap();
        assert_eq!(c.read_u32(REGION_CONFIG, off).unwrap(), orig, "BAR at {off:#x} restored");
    }
    let size64 = ((sized[1] as u64) << 32 | (sized[0] & !0xf) as u64).wrapping_neg();
    assert_eq!(size64, bar0, "BAR0/1 sizing matches region 0");
    assert_eq!(sized[0] & 0xf, 0x4, "BAR0 type bits survive sizing");
    assert_eq!((sized[4] & !0xf).wrapping_neg() as u64, bar4, "BAR4 sizing matches region 4");
    assert_eq!(&sized[2..4], &[0, 0], "BAR2/3 absent");
    assert_eq!(sized[5], 0, "BAR5 absent");
    assert_eq!(sized[6], 0, "no expansion ROM");
    // Read-only identity survives a write.
    c.region_write(REGION_CONFIG, 0, &0u32.to_le_bytes()).unwrap();
    assert_eq!(c.read_u32(REGION_CONFIG, 0).unwrap(), 0x0010_1b36);
    server.assert_alive();
}

// ---- region access limits

#[test]
fn region_access_out_of_range_gets_error_replies_and_the_server_keeps_serving() {
    let mut server = Server::start();
    let mut c = server.raw_negotiated();
    let cases: Vec<(&str, RegionAccess)> = vec![
        ("offset at the end of config", access(REGION_CONFIG, 4096, 4)),
        ("offset far beyond config", access(REGION_CONFIG, 1 << 40, 4)),
        ("offset + count straddles the end", access(REGION_CONFIG, 4094, 4)),
        ("offset + count overflows", access(REGION_CONFIG, u64::MAX - 1, 4)),
        ("offset + count overflows (BAR0)", access(REGION_BAR0, u64::MAX, 8)),
        ("count 0", access(REGION_CONFIG, 0, 0)),
        ("count over 1 MiB", access(REGION_CONFIG, 0, (1 << 20) + 1)),
        ("count u32::MAX", access(REGION_BAR0, 0, u32::MAX)),
        ("absent region", access(1, 0, 4)),
        ("region 9", access(9, 0, 4)),
        ("region u32::MAX", access(u32::MAX, 0, 4)),
        ("BAR0 beyond its end", access(REGION_BAR0, 1 << 30, 4)),
        ("BAR4 beyond its end", access(REGION_BAR4, 1 << 20, 4)),
    ];
    let mut id = 100;
    for (what, a) in &cases {
        id += 1;
        let m = request(&mut c, id, READ, &[a.as_bytes()], &[]);
        assert!(is_error(&m) && m.header.error.get() != 0, "REGION_READ {what} was not refused");
        id += 1;
        // Writes carry as many data bytes as they can (never more than 64 KiB here),
        // so the payload-short case is covered too.
        let data = vec![0xa5u8; (a.count.get() as usize).min(64 << 10)];
        let m = request(&mut c, id, WRITE, &[a.as_bytes(), &data], &[]);
        assert!(is_error(&m) && m.header.error.get() != 0, "REGION_WRITE {what} was not refused");
    }
    // A BAR0 read of a size no register has is refused; such a write is dropped the way
    // hardware drops it (logged under vnvme::guest), with a normal reply.
    id += 1;
    expect_error(&mut c, id, READ, &[access(REGION_BAR0, 0x14, 3).as_bytes()], &[]);
    id += 1;
    let m = request(&mut c, id, WRITE, &[access(REGION_BAR0, 0x14, 3).as_bytes(), &[1, 0, 0]], &[]);
    assert!(!is_error(&m));
    id += 1;
    let m = request(&mut c, id, READ, &[access(REGION_BAR0, 0x14, 4).as_bytes()], &[]);
    assert_eq!(&m.payload[16..], &[0; 4], "CC unchanged by the 3-byte write");
    // A write whose payload is shorter than its count.
    id += 1;
    expect_error(&mut c, id, WRITE, &[access(REGION_CONFIG, 0x3c, 4).as_bytes(), &[1, 2]], &[]);
    // A write of more than 1 MiB really sent: refused, payload drained, stream intact.
    id += 1;
    let big = vec![0u8; (1 << 20) + 8];
    expect_error(&mut c, id, WRITE, &[access(REGION_BAR0, 0, big.len() as u32).as_bytes(), &big], &[]);
    // Short headers of the access itself.
    id += 1;
    expect_error(&mut c, id, READ, &[&[0u8; 12]], &[]);
    // The same connection still works, and the replies have QEMU's sizes.
    id += 1;
    let m = request(&mut c, id, READ, &[access(REGION_CONFIG, 0, 4).as_bytes()], &[]);
    assert!(!is_error(&m));
    assert_eq!(m.header.size.get(), 32 + 4);
    assert_eq!(&m.payload[16..], &0x0010_1b36u32.to_le_bytes());
    id += 1;
    let m = request(&mut c, id, WRITE, &[access(REGION_CONFIG, 0x3c, 1).as_bytes(), &[9]], &[]);
    assert!(!is_error(&m));
    assert_eq!(m.header.size.get(), 32, "REGION_WRITE reply is the 16-byte access without data");
    server.assert_alive();
    drop(c);
    still_serving(&mut server);
}

// ---- broken framing

#[test]
fn truncated_messages_then_close_leave_the_server_serving_the_next_client() {
    let mut server = Server::start();
    // Before VERSION: a header promising 1000 bytes, 100 sent.
    let mut s = server.stream();
    write_raw(&mut s, &raw_header(1, VERSION, 1000));
    write_raw(&mut s, &[0u8; 84]);
    drop(s);
    still_serving(&mut server);
    // After VERSION: a REGION_WRITE whose data never arrives.
    let c = server.raw_negotiated();
    let mut s = c.stream().try_clone().unwrap();
    drop(c);
    let mut m = raw_header(2, WRITE, 16 + 16 + 4096).to_vec();
    m.extend_from_slice(access(REGION_BAR0, 0x14, 4096).as_bytes());
    m.extend_from_slice(&[1u8; 100]);
    write_raw(&mut s, &m);
    drop(s);
    still_serving(&mut server);
    // Half a header.
    let mut s = server.stream();
    write_raw(&mut s, &raw_header(3, GET_INFO, 32)[..7]);
    drop(s);
    still_serving(&mut server);
    // A DMA_MAP whose payload is cut short.
    let c = server.raw_negotiated();
    let mut s = c.stream().try_clone().unwrap();
    drop(c);
    write_raw(&mut s, &raw_header(4, DMA_MAP, 48));
    write_raw(&mut s, &[0u8; 10]);
    drop(s);
    still_serving(&mut server);
    server.assert_alive();
}

#[test]
fn header_sizes_below_16_or_above_the_limit_drop_the_connection_and_the_server_survives() {
    let mut server = Server::start();
    for (negotiate, size) in [
        (false, 0u32),
        (true, 8),
        (true, 15),
        (true, (1 << 20) + 4097),
        (true, (2 << 20) + 1),
        (false, u32::MAX),
    ] {
        let mut s = if negotiate {
            let c = server.raw_negotiated();
            c.stream().try_clone().unwrap()
        } else {
            server.stream()
        };
        write_raw(&mut s, &raw_header(9, GET_INFO, size));
        // Whatever comes after must not be needed: the server must drop us now.
        let _ = s.write_all(&[0u8; 16]);
        assert!(closed_by_peer(&mut s), "header size {size}: connection not dropped");
        drop(s);
        still_serving(&mut server);
    }
    server.assert_alive();
}

#[test]
fn unknown_command_numbers_get_an_error_and_the_connection_stays_usable() {
    let mut server = Server::start();
    let mut c = server.raw_negotiated();
    let mut id = 0x4000;
    for cmd in [0u16, 11, 12, 14, 15, 16, 17, 18, 19, 99, 0x8000, 65535] {
        for payload_len in [0usize, 24, 4096] {
            id += 1;
            let errno = expect_error(&mut c, id, cmd, &[&vec![0x5au8; payload_len]], &[]);
            assert_ne!(errno, 0, "command {cmd}");
        }
        // The stream is still in step: a real command answers correctly.
        id += 1;
        let m = request(
            &mut c,
            id,
            GET_INFO,
            &[DeviceInfo { argsz: U32::new(16), ..Default::default() }.as_bytes()],
            &[],
        );
        assert!(!is_error(&m), "after command {cmd}");
        assert_eq!(Client::parse::<DeviceInfo>(&m.payload).unwrap().num_regions.get(), 9);
    }
    // A reply sent by the client (the server never asks anything) is ignored.
    c.send(header(0x4fff, GET_INFO, MsgFlags::REPLY), &[&[0u8; 16]], &[]).unwrap();
    // Unknown commands sent as posted (No_reply) get no reply at all.
    c.send(header(0x5000, 99, MsgFlags::COMMAND | MsgFlags::NO_REPLY), &[&[0u8; 8]], &[]).unwrap();
    let m = request(
        &mut c,
        0x5001,
        GET_INFO,
        &[DeviceInfo { argsz: U32::new(16), ..Default::default() }.as_bytes()],
        &[],
    );
    assert!(!is_error(&m));
    server.assert_alive();
}

#[test]
fn posted_writes_get_no_reply_and_are_ordered_before_a_later_read() {
    let mut server = Server::start();
    let mut c = server.raw_negotiated();
    let posted = MsgFlags::COMMAND | MsgFlags::NO_REPLY;
    // Latency timer (0x0d) is writable.
    c.send(header(0x100, WRITE, posted), &[access(REGION_CONFIG, 0x0d, 1).as_bytes(), &[0x42]], &[]).unwrap();
    // A posted write that fails is not answered either.
    c.send(header(0x101, WRITE, posted), &[access(REGION_CONFIG, 8192, 4).as_bytes(), &[0; 4]], &[]).unwrap();
    // A posted read-type command (meaningless) must not produce a reply either.
    c.send(header(0x102, GET_INFO, posted), &[DeviceInfo::default().as_bytes()], &[]).unwrap();
    c.send(header(0x103, READ, MsgFlags::COMMAND), &[access(REGION_CONFIG, 0x0c, 4).as_bytes()], &[])
        .unwrap();
    let m = c.recv().unwrap();
    assert_eq!(m.header.msg_id.get(), 0x103, "the first reply must answer the read, not a posted write");
    assert!(!is_error(&m));
    assert_eq!(m.payload[16 + 1], 0x42, "the posted write happened before the read");
    // Nothing else is waiting in the stream.
    c.stream().set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut probe = [0u8; 1];
    let r = std::io::Read::read(&mut c.stream().try_clone().unwrap(), &mut probe);
    assert!(r.is_err(), "unexpected extra bytes after the read's reply: {r:?}");
    server.assert_alive();
}

// ---- DMA

#[test]
fn dma_map_overlapping_an_existing_region_is_eexist() {
    let mut server = Server::start();
    let mut c = server.client();
    let fd = memfd(0x40000);
    c.dma_map(0x100000, 0x20000, Some(std::os::fd::AsFd::as_fd(&fd)), 0).unwrap();
    for (iova, size) in
        [(0x100000, 0x20000), (0x110000, 0x20000), (0xf0000, 0x20000), (0x108000, 0x1000), (0, 1 << 30)]
    {
        let e = c.dma_map(iova, size, Some(std::os::fd::AsFd::as_fd(&fd)), 0).unwrap_err();
        assert_eq!(server_errno(e), libc::EEXIST as u32, "{iova:#x}+{size:#x}");
        let e = c.dma_map(iova, size, None, 0).unwrap_err();
        assert_eq!(server_errno(e), libc::EEXIST as u32, "fd-less {iova:#x}+{size:#x}");
    }
    // Adjacent is fine.
    c.dma_map(0x120000, 0x10000, Some(std::os::fd::AsFd::as_fd(&fd)), 0x20000).unwrap();
    c.dma_map(0xf0000, 0x10000, None, 0).unwrap();
    // Empty and wrapping ranges are invalid.
    assert_eq!(server_errno(c.dma_map(0x200000, 0, None, 0).unwrap_err()), libc::EINVAL as u32);
    assert_eq!(server_errno(c.dma_map(u64::MAX - 0xfff, 0x2000, None, 0).unwrap_err()), libc::EINVAL as u32);
    server.assert_alive();
}

#[test]
fn dma_map_beyond_the_end_of_its_file_is_refused() {
    let mut server = Server::start();
    let mut c = server.client();
    let fd = memfd(0x10000);
    let bfd = std::os::fd::AsFd::as_fd(&fd);
    // Touching such a mapping past EOF would SIGBUS the server.
    assert_ne!(server_errno(c.dma_map(0x100000, 0x20000, Some(bfd), 0).unwrap_err()), 0);
    assert_ne!(server_errno(c.dma_map(0x100000, 0x10000, Some(bfd), 0x1000).unwrap_err()), 0);
    assert_ne!(server_errno(c.dma_map(0x100000, 0x1000, Some(bfd), u64::MAX - 0xfff).unwrap_err()), 0);
    // What used to kill the server: admin queues placed past the end of the file.
    let _ = c.dma_map(0x100000, 0x100000, Some(bfd), 0);
    c.region_write(REGION_BAR0, 0x24, &0x001f_001fu32.to_le_bytes()).unwrap();
    c.region_write(REGION_BAR0, 0x28, &0x180000u64.to_le_bytes()).unwrap();
    c.region_write(REGION_BAR0, 0x30, &0x181000u64.to_le_bytes()).unwrap();
    c.region_write(REGION_BAR0, 0x14, &Cc::LINUX.with_en(true).0.to_le_bytes()).unwrap();
    c.region_write(REGION_BAR0, 0x1000, &1u32.to_le_bytes()).unwrap();
    server.assert_alive();
    c.dma_map(0x100000, 0x10000, Some(bfd), 0).unwrap();
    server.assert_alive();
}

#[test]
fn read_only_dma_region_used_as_queue_memory_does_not_crash_the_server() {
    let mut server = Server::start();
    let mut c = server.client();
    let fd = memfd(0x10000);
    // QEMU maps ROMs this way: READ without WRITE.
    let ro = DmaMap {
        argsz: U32::new(32),
        flags: U32::new(DMA_MAP_FLAG_READ),
        offset: U64::new(0),
        address: U64::new(0x100000),
        size: U64::new(0x10000),
    };
    let m = request(c.connection(), 0x6050, DMA_MAP, &[ro.as_bytes()], &[fd.as_raw_fd()]);
    assert!(!is_error(&m), "errno {}", m.header.error.get());
    // The guest points both admin queues into the ROM and rings: the completion write
    // must fail inside the controller, not fault the server.
    c.region_write(REGION_BAR0, 0x24, &0x001f_001fu32.to_le_bytes()).unwrap();
    c.region_write(REGION_BAR0, 0x28, &0x100000u64.to_le_bytes()).unwrap();
    c.region_write(REGION_BAR0, 0x30, &0x101000u64.to_le_bytes()).unwrap();
    c.region_write(REGION_BAR0, 0x14, &Cc::LINUX.with_en(true).0.to_le_bytes()).unwrap();
    c.region_write(REGION_BAR0, 0x1000, &1u32.to_le_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    server.assert_alive();
    // The read-only map is still a map: it unmaps by its exact range.
    c.dma_unmap(0x100000, 0x10000).unwrap();
    drop(c);
    let mut h = NvmeOverVfioUser::new(server.client());
    h.bring_up(16, false);
    h.write_read_verify(0, 4, 0x52);
    server.assert_alive();
}

#[test]
fn dma_unmap_of_a_range_that_is_not_mapped_is_an_error() {
    let mut server = Server::start();
    let mut c = server.client();
    let fd = memfd(0x20000);
    assert_ne!(server_errno(c.dma_unmap(0x100000, 0x1000).unwrap_err()), 0, "nothing mapped yet");
    c.dma_map(0x100000, 0x20000, Some(std::os::fd::AsFd::as_fd(&fd)), 0).unwrap();
    assert_ne!(server_errno(c.dma_unmap(0x100000, 0x1000).unwrap_err()), 0, "part of a region");
    assert_ne!(server_errno(c.dma_unmap(0x101000, 0x1f000).unwrap_err()), 0, "tail of a region");
    assert_ne!(server_errno(c.dma_unmap(0x200000, 0x20000).unwrap_err()), 0, "elsewhere");
    c.dma_unmap(0x100000, 0x20000).unwrap();
    assert_ne!(server_errno(c.dma_unmap(0x100000, 0x20000).unwrap_err()), 0, "already unmapped");
    // The reply to a good unmap echoes the 24-byte request (QEMU and CH read 40 bytes).
    c.dma_map(0x100000, 0x20000, Some(std::os::fd::AsFd::as_fd(&fd)), 0).unwrap();
    let u = DmaUnmap {
        argsz: U32::new(24),
        flags: U32::new(0),
        address: U64::new(0x100000),
        size: U64::new(0x20000),
    };
    let m = request(c.connection(), 0x6000, DMA_UNMAP, &[u.as_bytes()], &[]);
    assert!(!is_error(&m));
    assert_eq!(m.header.size.get(), 40);
    assert_eq!(m.payload, u.as_bytes());
    server.assert_alive();
}

#[test]
fn dma_map_with_two_fds_is_refused() {
    let mut server = Server::start();
    let mut c = server.client();
    let (a, b) = (memfd(0x10000), memfd(0x10000));
    let map = DmaMap {
        argsz: U32::new(32),
        flags: U32::new(DMA_MAP_FLAG_READ | DMA_MAP_FLAG_WRITE),
        offset: U64::new(0),
        address: U64::new(0x100000),
        size: U64::new(0x10000),
    };
    expect_error(c.connection(), 0x6100, DMA_MAP, &[map.as_bytes()], &[a.as_raw_fd(), b.as_raw_fd()]);
    // Unknown flags too.
    let mut bad = map;
    bad.flags = U32::new(0x80 | DMA_MAP_FLAG_READ);
    expect_error(c.connection(), 0x6101, DMA_MAP, &[bad.as_bytes()], &[a.as_raw_fd()]);
    // A short payload.
    expect_error(c.connection(), 0x6102, DMA_MAP, &[&map.as_bytes()[..16]], &[a.as_raw_fd()]);
    // Nothing was mapped by the refusals.
    c.dma_map(0x100000, 0x10000, Some(std::os::fd::AsFd::as_fd(&a)), 0).unwrap();
    server.assert_alive();
}

#[test]
fn dma_unmap_flag_all_removes_every_region() {
    let mut server = Server::start();
    let mut c = server.client();
    let fd = memfd(0x40000);
    c.dma_map(0x100000, 0x10000, Some(std::os::fd::AsFd::as_fd(&fd)), 0).unwrap();
    c.dma_map(0x200000, 0x10000, Some(std::os::fd::AsFd::as_fd(&fd)), 0x10000).unwrap();
    c.dma_map(0x300000, 0x10000, None, 0).unwrap();
    let all = DmaUnmap {
        argsz: U32::new(24),
        flags: U32::new(DMA_UNMAP_FLAG_ALL),
        address: U64::new(0),
        size: U64::new(0),
    };
    let m = request(c.connection(), 0x6200, DMA_UNMAP, &[all.as_bytes()], &[]);
    assert!(!is_error(&m), "errno {}", m.header.error.get());
    assert_eq!(m.header.size.get(), 40);
    // Everything is gone: the same maps succeed again, and a plain unmap finds nothing.
    assert!(c.dma_unmap(0x100000, 0x10000).is_err());
    c.dma_map(0x100000, 0x10000, Some(std::os::fd::AsFd::as_fd(&fd)), 0).unwrap();
    c.dma_map(0x200000, 0x10000, Some(std::os::fd::AsFd::as_fd(&fd)), 0x10000).unwrap();
    c.dma_map(0x300000, 0x10000, None, 0).unwrap();
    server.assert_alive();
}

// ---- interrupts

fn set_irqs(flags: u32, index: u32, start: u32, count: u32) -> SetIrqs {
    SetIrqs {
        argsz: U32::new(20),
        flags: U32::new(flags),
        index: U32::new(index),
        start: U32::new(start),
        count: U32::new(count),
    }
}

#[test]
fn set_irqs_refuses_bad_flags_indices_ranges_and_stray_fds() {
    let mut server = Server::start();
    let mut c = server.client();
    let e1 = TestEventFd::new();
    let e2 = TestEventFd::new();
    let trig = IRQ_SET_ACTION_TRIGGER;
    let cases: Vec<(&str, SetIrqs, Vec<i32>)> = vec![
        ("no data type", set_irqs(trig, IRQ_INDEX_MSIX, 0, 1), vec![]),
        ("no action", set_irqs(IRQ_SET_DATA_NONE, IRQ_INDEX_MSIX, 0, 1), vec![]),
        (
            "two data types",
            set_irqs(IRQ_SET_DATA_NONE | IRQ_SET_DATA_EVENTFD | trig, IRQ_INDEX_MSIX, 0, 1),
            vec![],
        ),
        (
            "two actions",
            set_irqs(IRQ_SET_DATA_NONE | trig | IRQ_SET_ACTION_MASK, IRQ_INDEX_MSIX, 0, 1),
            vec![],
        ),
        ("unknown flag bit", set_irqs(IRQ_SET_DATA_NONE | trig | 0x40, IRQ_INDEX_MSIX, 0, 1), vec![]),
        ("index 9", set_irqs(IRQ_SET_DATA_EVENTFD | trig, 9, 0, 1), vec![e1.raw()]),
        ("index u32::MAX", set_irqs(IRQ_SET_DATA_NONE | trig, u32::MAX, 0, 1), vec![]),
        (
            "start + count beyond the vectors",
            set_irqs(IRQ_SET_DATA_EVENTFD | trig, IRQ_INDEX_MSIX, 64, 2),
            vec![e1.raw(), e2.raw()],
        ),
        ("start beyond the vectors", set_irqs(IRQ_SET_DATA_NONE | trig, IRQ_INDEX_MSIX, 65, 1), vec![]),
        ("start + count overflows", set_irqs(IRQ_SET_DATA_NONE | trig, IRQ_INDEX_MSIX, u32::MAX, 2), vec![]),
        (
            "INTx has one vector",
            set_irqs(IRQ_SET_DATA_EVENTFD | trig, IRQ_INDEX_INTX, 0, 2),
            vec![e1.raw(), e2.raw()],
        ),
        ("MSI has no vectors", set_irqs(IRQ_SET_DATA_EVENTFD | trig, IRQ_INDEX_MSI, 0, 1), vec![e1.raw()]),
        ("fds with DATA_NONE", set_irqs(IRQ_SET_DATA_NONE | trig, IRQ_INDEX_MSIX, 0, 1), vec![e1.raw()]),
        ("fds with DATA_BOOL", set_irqs(IRQ_SET_DATA_BOOL | trig, IRQ_INDEX_MSIX, 0, 1), vec![e1.raw()]),
        (
            "fd count differs from count",
            set_irqs(IRQ_SET_DATA_EVENTFD | trig, IRQ_INDEX_MSIX, 0, 2),
            vec![e1.raw()],
        ),
    ];
    let mut id = 0x7000;
    for (what, s, fds) in &cases {
        id += 1;
        let payload: Vec<u8> = if s.flags.get() & IRQ_SET_DATA_BOOL != 0 {
            [s.as_bytes(), &[1u8]].concat()
        } else {
            s.as_bytes().to_vec()
        };
        let m = request(c.connection(), id, SET_IRQS, &[&payload], fds);
        assert!(is_error(&m) && m.header.error.get() != 0, "SET_IRQS with {what} was accepted");
    }
    id += 1;
    expect_error(c.connection(), id, SET_IRQS, &[&[0u8; 12]], &[]);
    // The refusals installed nothing: a software trigger of vector 0 reaches no fd.
    id += 1;
    let m = request(
        c.connection(),
        id,
        SET_IRQS,
        &[set_irqs(IRQ_SET_DATA_NONE | trig, IRQ_INDEX_MSIX, 0, 1).as_bytes()],
        &[],
    );
    assert!(!is_error(&m));
    assert_eq!(e1.take() + e2.take(), 0);
    // A valid request still works on the same connection.
    c.set_irq_eventfds(IRQ_INDEX_MSIX, 64, &[e1.fd()]).unwrap();
    server.assert_alive();
}

#[test]
fn msix_eventfd_is_signalled_by_a_software_trigger_and_not_after_deassign() {
    let mut server = Server::start();
    let mut c = server.client();
    let v3 = TestEventFd::new();
    let v4 = TestEventFd::new();
    c.set_irq_eventfds(IRQ_INDEX_MSIX, 3, &[v3.fd(), v4.fd()]).unwrap();
    let trigger = |c: &mut Client, id: u16, start: u32, count: u32| {
        let s = set_irqs(IRQ_SET_DATA_NONE | IRQ_SET_ACTION_TRIGGER, IRQ_INDEX_MSIX, start, count);
        let m = request(c.connection(), id, SET_IRQS, &[s.as_bytes()], &[]);
        assert!(!is_error(&m), "software trigger refused: errno {}", m.header.error.get());
    };
    trigger(&mut c, 0x7100, 3, 1);
    assert_eq!(v3.wait(TIMEOUT), 1, "vector 3 fired once");
    assert_eq!(v4.take(), 0, "vector 4 was not triggered");
    trigger(&mut c, 0x7101, 3, 2);
    assert_eq!(v3.wait(TIMEOUT), 1);
    assert_eq!(v4.wait(TIMEOUT), 1);
    // De-assign vector 3 (DATA_EVENTFD without fds), then trigger it: nothing arrives.
    let s = set_irqs(IRQ_SET_DATA_EVENTFD | IRQ_SET_ACTION_TRIGGER, IRQ_INDEX_MSIX, 3, 1);
    let m = request(c.connection(), 0x7102, SET_IRQS, &[s.as_bytes()], &[]);
    assert!(!is_error(&m));
    trigger(&mut c, 0x7103, 3, 2);
    assert_eq!(v4.wait(TIMEOUT), 1);
    assert_eq!(v3.take(), 0, "a de-assigned vector must not fire its old eventfd");
    // Disable the whole index (count 0, DATA_NONE): vector 4 goes quiet too.
    let m = request(
        c.connection(),
        0x7104,
        SET_IRQS,
        &[set_irqs(IRQ_SET_DATA_NONE | IRQ_SET_ACTION_TRIGGER, IRQ_INDEX_MSIX, 0, 0).as_bytes()],
        &[],
    );
    assert!(!is_error(&m));
    trigger(&mut c, 0x7105, 4, 1);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(v4.take(), 0);
    server.assert_alive();
}

// ---- reset

#[test]
fn device_reset_returns_the_controller_to_its_power_on_state() {
    let mut server = Server::start();
    let mut h = NvmeOverVfioUser::new(server.client());
    h.bring_up(16, false);
    h.write_read_verify(0, 4, 1);
    assert_eq!(h.read32(nvme_spec::regs::offset::CSTS) & 1, 1);
    h.client.reset().unwrap();
    use nvme_spec::regs::offset;
    assert_eq!(h.read32(offset::CSTS), 0, "CSTS after DEVICE_RESET");
    assert_eq!(h.read32(offset::CC), 0, "CC after DEVICE_RESET");
    assert_eq!(h.read32(offset::AQA), 0, "AQA after DEVICE_RESET");
    assert_eq!(h.read64(offset::ASQ), 0, "ASQ after DEVICE_RESET");
    // The DMA map survives a device reset: bring-up works again without re-mapping,
    // and the data written before the reset is still there (the namespace persists).
    h.bring_up(16, false);
    h.write_read_verify(64, 4, 2);
    server.assert_alive();
}

// ---- I/O lifecycles

/// Queues `n` one-page writes and rings the doorbell with a posted write.
fn flood(h: &mut NvmeOverVfioUser, n: u16) {
    for i in 0..n {
        h.mem.fill(NvmeOverVfioUser::slot(i), PAGE, i as u8).unwrap();
        h.queue_rw(true, i, i as u64 * (PAGE / h.lba_size));
    }
    h.ring_io(true);
}

#[test]
fn io_with_msix_interrupts_across_the_socket() {
    let mut server = Server::start();
    let mut h = NvmeOverVfioUser::new(server.client());
    h.bring_up(64, true);
    h.write_read_verify(0, 32, 3);
    let irq = h.irq.as_ref().expect("interrupts were requested");
    assert!(irq.wait(TIMEOUT) > 0, "I/O completions raised MSI-X vector {IO_VECTOR}");
    server.assert_alive();
}

#[test]
fn client_vanishing_mid_io_leaves_the_server_serving_a_fresh_bring_up() {
    let mut server = Server::start();
    for round in 0..3u8 {
        let mut h = NvmeOverVfioUser::new(server.client());
        h.bring_up(256, true);
        flood(&mut h, 255);
        // Gone without waiting for anything: socket, memfd and eventfd close together.
        drop(h);
        server.assert_alive();
        let mut h = NvmeOverVfioUser::new(server.client());
        h.bring_up(64, true);
        h.write_read_verify(1000, 32, round);
        drop(h);
    }
    server.assert_alive();
    still_serving(&mut server);
}

#[test]
fn client_vanishing_with_a_half_sent_doorbell_leaves_the_server_serving() {
    let mut server = Server::start();
    let mut h = NvmeOverVfioUser::new(server.client());
    h.bring_up(128, false);
    flood(&mut h, 100);
    // A doorbell whose data never completes.
    let mut s = h.client.connection().stream().try_clone().unwrap();
    let mut m = raw_header(0x7777, WRITE, 36).to_vec();
    m.extend_from_slice(access(REGION_BAR0, 0x1008, 4).as_bytes());
    m.extend_from_slice(&[1, 0]);
    write_raw(&mut s, &m);
    drop(s);
    drop(h);
    let mut h = NvmeOverVfioUser::new(server.client());
    h.bring_up(64, false);
    h.write_read_verify(0, 16, 9);
    server.assert_alive();
}

#[test]
fn controller_reset_with_io_outstanding_then_reinit_works() {
    let mut server = Server::start();
    let mut h = NvmeOverVfioUser::new(server.client());
    for round in 0..3u8 {
        h.bring_up(256, true);
        flood(&mut h, 255);
        // CC.EN = 0 right behind the doorbell, while the writes are in flight.
        h.disable();
        assert_eq!(h.read32(nvme_spec::regs::offset::CSTS) & 1, 0);
        h.bring_up(64, true);
        h.write_read_verify(2048, 32, round);
    }
    // A doorbell to a queue deleted by the reset is ignored (not ready), not fatal.
    h.disable();
    h.client.region_write(REGION_BAR0, 0x1008, &5u32.to_le_bytes()).unwrap();
    h.bring_up(16, false);
    h.write_read_verify(0, 8, 0x77);
    server.assert_alive();
}

#[test]
fn dma_unmap_all_under_io_does_not_crash_the_server() {
    let mut server = Server::start();
    let mut h = NvmeOverVfioUser::new(server.client());
    h.bring_up(256, true);
    flood(&mut h, 255);
    let all = DmaUnmap { argsz: U32::new(24), flags: U32::new(DMA_UNMAP_FLAG_ALL), ..Default::default() };
    let m = request(h.client.connection(), 0x7e00, DMA_UNMAP, &[all.as_bytes()], &[]);
    assert!(!is_error(&m));
    // Ring the doorbell again for good measure: the queues now point at nothing.
    h.ring_io(false);
    std::thread::sleep(Duration::from_millis(50));
    server.assert_alive();
    drop(h);
    let mut h = NvmeOverVfioUser::new(server.client());
    h.bring_up(32, true);
    h.write_read_verify(0, 8, 0x31);
    server.assert_alive();
}

#[test]
fn clients_leave_no_file_descriptors_or_mappings_behind() {
    let mut server = Server::start();
    let session = |server: &mut Server, seed: u8| {
        let mut h = NvmeOverVfioUser::new(server.client());
        h.bring_up(32, true);
        h.write_read_verify(0, 4, seed);
        let extra = [TestEventFd::new(), TestEventFd::new()];
        h.client.set_irq_eventfds(IRQ_INDEX_MSIX, 10, &[extra[0].fd(), extra[1].fd()]).unwrap();
        h.client.dma_map(0x1_0000_0000, 0x10000, Some(std::os::fd::AsFd::as_fd(&memfd(0x10000))), 0).unwrap();
        drop(h);
    };
    // Warm up (worker threads, lazily opened files), then measure once the server has
    // closed the last client's socket.
    session(&mut server, 0);
    still_serving(&mut server);
    std::thread::sleep(Duration::from_millis(200));
    let before = server.resources();
    for seed in 1..=10 {
        session(&mut server, seed);
    }
    still_serving(&mut server);
    let deadline = std::time::Instant::now() + TIMEOUT;
    let after = loop {
        let now = server.resources();
        if (now.0 <= before.0 && now.1 <= before.1 + 4) || std::time::Instant::now() > deadline {
            break now;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(after.0 <= before.0, "file descriptors grew from {} to {}", before.0, after.0);
    assert!(after.1 <= before.1 + 4, "mappings grew from {} to {}", before.1, after.1);
    server.assert_alive();
}
