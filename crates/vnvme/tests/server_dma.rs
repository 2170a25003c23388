//! `vnvme serve` across two processes over a real socket: DMA_MAP and DMA_UNMAP, with
//! overlapping, short-file, read-only, unmapped and multi-fd regions.
//!
//! Every test starts its own server process and checks at the end that it is still
//! alive and serving.

mod common;

use std::os::fd::AsRawFd;
use std::time::Duration;

use common::nvme_host::NvmeOverVfioUser;
use common::protocol::*;
use common::*;
use nvme_spec::regs::Cc;
use test_util::memfd::memfd;
use vfio_user::proto::*;
use zerocopy::little_endian::{U32, U64};
use zerocopy::IntoBytes;

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
