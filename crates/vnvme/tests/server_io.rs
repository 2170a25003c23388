//! `vnvme serve` across two processes over a real socket: I/O lifecycles with MSI-X
//! interrupts, clients that vanish or reset mid-I/O, unmapping under I/O, and the
//! descriptors and mappings a client leaves behind.
//!
//! Every test starts its own server process and checks at the end that it is still
//! alive and serving.

mod common;

use std::time::Duration;

use common::nvme_host::{NvmeOverVfioUser, IO_VECTOR, PAGE};
use common::protocol::*;
use common::*;
use test_util::memfd::memfd;
use vfio_user::proto::*;
use zerocopy::little_endian::U32;
use zerocopy::IntoBytes;

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

/// Posted doorbell writes that arrive together (one socket read, many messages)
/// each take effect, and every command they rang completes, inline and with a
/// worker. No shadow doorbells: every SQ tail write is a message.
#[test]
fn doorbells_that_arrive_together_all_run() {
    for workers in ["0", "1"] {
        let mut server = Server::start_with(&["--ns", "ram:16M", "--workers", workers, "--poll", "off"]);
        let mut h = NvmeOverVfioUser::new(server.client());
        h.bring_up(64, false);
        let blocks = PAGE / h.lba_size;
        for round in 0..4u8 {
            // One socket write: 16 posted SQ tail doorbells, one per command.
            let mut burst = Vec::new();
            for i in 0..16u16 {
                let fill = round.wrapping_mul(31).wrapping_add(i as u8 + 1);
                h.mem.fill(NvmeOverVfioUser::slot(i), PAGE, fill).unwrap();
                h.queue_rw(true, i, i as u64 * blocks);
                let mut m =
                    raw_header(0x100 + i, WRITE, (HEADER_SIZE + size_of::<RegionAccess>() + 4) as u32);
                m[8..12].copy_from_slice(&MsgFlags::NO_REPLY.to_le_bytes());
                burst.extend_from_slice(&m);
                // I/O queue 1's SQ tail doorbell (CAP.DSTRD = 0).
                let tail = (round as u32 * 32 + i as u32 + 1) % 64;
                burst.extend_from_slice(access(REGION_BAR0, 0x1008, 4).as_bytes());
                burst.extend_from_slice(&tail.to_le_bytes());
            }
            write_raw(&mut h.client.connection().stream().try_clone().unwrap(), &burst);
            let done = h.reap_io(16);
            assert!(done.iter().all(|c| c.status().is_success()), "workers {workers}, round {round}");
            for i in 0..16u16 {
                h.queue_rw(false, 16 + i, i as u64 * blocks);
            }
            h.ring_io(false);
            assert!(h.reap_io(16).iter().all(|c| c.status().is_success()));
            for i in 0..16u16 {
                let mut got = vec![0u8; PAGE as usize];
                h.mem.read(NvmeOverVfioUser::slot(16 + i), &mut got).unwrap();
                let want = round.wrapping_mul(31).wrapping_add(i as u8 + 1);
                assert!(got.iter().all(|&b| b == want), "workers {workers}, round {round}: write {i}");
            }
        }
        server.assert_alive();
    }
}

/// A posted 4-byte BAR0 write as raw bytes (header, access, value).
fn posted_bar0_write(id: u16, offset: u64, value: u32) -> Vec<u8> {
    let mut m = raw_header(id, WRITE, (HEADER_SIZE + size_of::<RegionAccess>() + 4) as u32).to_vec();
    m[8..12].copy_from_slice(&MsgFlags::NO_REPLY.to_le_bytes());
    m.extend_from_slice(access(REGION_BAR0, offset, 4).as_bytes());
    m.extend_from_slice(&value.to_le_bytes());
    m
}

/// Doorbell writes wait for the ones that come with them, but a message that is not
/// a doorbell write runs them first: writes rung just before a posted CC.EN = 0, in
/// one socket write, reach the namespace before the controller stops (inline, where
/// the doorbell's commands run on the thread that reads the socket).
#[test]
fn a_register_write_after_doorbells_in_one_read_sees_their_effect() {
    let mut server = Server::start_with(&["--ns", "ram:16M", "--workers", "0", "--poll", "off"]);
    let mut h = NvmeOverVfioUser::new(server.client());
    h.bring_up(64, false);
    let blocks = PAGE / h.lba_size;
    for i in 0..8u16 {
        h.mem.fill(NvmeOverVfioUser::slot(i), PAGE, 0x40 + i as u8).unwrap();
        h.queue_rw(true, i, i as u64 * blocks);
    }
    // I/O queue 1's SQ tail doorbell (CAP.DSTRD = 0), then CC = 0.
    let mut burst = posted_bar0_write(0x200, 0x1008, 8);
    burst.extend_from_slice(&posted_bar0_write(0x201, 0x14, 0));
    write_raw(&mut h.client.connection().stream().try_clone().unwrap(), &burst);
    h.wait_ready(false);
    h.bring_up(64, false);
    for i in 0..8u16 {
        h.mem.fill(NvmeOverVfioUser::slot(8 + i), PAGE, 0xee).unwrap();
        h.queue_rw(false, 8 + i, i as u64 * blocks);
    }
    h.ring_io(false);
    assert!(h.reap_io(8).iter().all(|c| c.status().is_success()));
    for i in 0..8u16 {
        let mut got = vec![0u8; PAGE as usize];
        h.mem.read(NvmeOverVfioUser::slot(8 + i), &mut got).unwrap();
        assert!(got.iter().all(|&b| b == 0x40 + i as u8), "write {i} rung before CC.EN = 0 did not land");
    }
    server.assert_alive();
}
