//! `vnvme serve` across two processes over a real socket: the vfio-user VERSION
//! handshake, the device description (DEVICE_GET_INFO, region info) and PCI config space.
//!
//! Every test starts its own server process and checks at the end that it is still
//! alive and serving.

mod common;

use std::os::fd::AsRawFd;

use common::protocol::*;
use common::*;
use test_util::memfd::memfd;
use vfio_user::proto::*;
use vfio_user::{Command, Connection};
use zerocopy::little_endian::{U32, U64};
use zerocopy::IntoBytes;

/// QEMU's VERSION JSON, byte for byte (hw/vfio-user/proxy.c `caps_json`).
const QEMU_CAPS: &str = r#"{"capabilities":{"migration":{"pgsize":4096,"max_bitmap_size":268435456},"max_msg_fds":16,"max_data_xfer_size":1048576,"pgsizes":4096,"max_dma_maps":65535,"write_multiple":true}}"#;

fn qemu_version_payload(major: u16, minor: u16, json: &str) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&major.to_le_bytes());
    p.extend_from_slice(&minor.to_le_bytes());
    p.extend_from_slice(json.as_bytes());
    p.push(0);
    p
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
