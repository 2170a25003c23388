//! DMA_UNMAP is answered only after every use of the memory has ended (vfio-user.rst:
//! the server must release the region, in-flight DMA included, before it replies), and
//! a client that leaves leaves nothing mapped behind, here or in a downstream
//! controller. Across processes, against `vnvme serve`, with requests held in flight
//! by fault injection (`delay=`, `hang`).
//!
//! Each test proves the ordering by what the data shows, not by timing: after the
//! unmap reply the client overwrites the memory it unmapped, so a server still using
//! it would write the client's new bytes to disk, or overwrite them with a read.

mod common;

use std::os::fd::{AsFd, OwnedFd};

use common::nvme_host::{NvmeOverVfioUser, MEM_SIZE, PAGE};
use common::protocol::server_errno;
use common::{temp_dir, Server};
use guest_mem::GuestMemory;
use test_util::memfd::memfd_named;

/// A second region the client maps, uses for one transfer and unmaps.
const IOVA2: u64 = 0x8000_0000;
const LEN2: u64 = 64 << 10;

/// A named sealed memfd of `len` bytes at `iova`, and the client's own view of it.
fn region(name: &str, iova: u64, len: u64) -> (OwnedFd, GuestMemory) {
    let fd = memfd_named(name, len);
    let view = GuestMemory::empty().with_fd_region(iova, len, fd.as_fd(), 0, true).unwrap();
    (fd, view)
}

fn page_of(byte: u8) -> Vec<u8> {
    vec![byte; PAGE as usize]
}

fn unique(tag: &str) -> String {
    format!("vnvme-unmap-{tag}-{}", std::process::id())
}

/// Submits `first` (the command held in flight) and then a one-page read of LBA 512
/// into slot 1 (not held), rings once and waits for the second: the controller fetches
/// in order, so `first` is now at the backend.
fn submit_then_prove_fetched(h: &mut NvmeOverVfioUser, first_is_write: bool, buf: u64, lba: u64) -> u16 {
    let cid = h.queue_rw_at(first_is_write, buf, lba);
    let probe = h.queue_rw(false, 1, 512);
    h.ring_io(false);
    let c = h.reap_io(1);
    assert_eq!(c[0].cid.get(), probe, "the probe completes first: {c:?}");
    cid
}

/// A write whose data sits in the region being unmapped, held back 1.5 s at the
/// backend: the unmap reply comes after the backend has read the data, so what the
/// client writes into its memory afterwards never reaches the disk.
fn unmap_waits_for_a_write(mode: &[&str]) {
    let mut server =
        Server::start_with(&[&["--ns", "ram:16M:fault=write/delay=1500/count=1"], mode].concat());
    let mut h = NvmeOverVfioUser::new(server.client());
    h.bring_up(16, false);
    let (fd, view) = region(&unique("w"), IOVA2, LEN2);
    h.client.dma_map(IOVA2, LEN2, Some(fd.as_fd()), 0).unwrap();
    view.write(IOVA2, &page_of(0xa1)).unwrap();

    let write = submit_then_prove_fetched(&mut h, true, IOVA2, 0);
    h.client.dma_unmap(IOVA2, LEN2).unwrap_or_else(|e| panic!("DMA_UNMAP: {e}\n{}", server.log()));
    view.write(IOVA2, &page_of(0xb2)).unwrap();

    let c = h.reap_io(1);
    assert_eq!(c[0].cid.get(), write);
    assert!(c[0].status().is_success(), "the held write: {:?}", c[0].status());
    h.mem.fill(NvmeOverVfioUser::slot(2), PAGE, 0).unwrap();
    h.queue_rw(false, 2, 0);
    h.ring_io(false);
    assert!(h.reap_io(1)[0].status().is_success());
    let mut got = page_of(0);
    h.mem.read(NvmeOverVfioUser::slot(2), &mut got).unwrap();
    assert!(got == page_of(0xa1), "the disk holds bytes the client wrote after DMA_UNMAP was answered");
    server.assert_alive();
}

/// A read into the region being unmapped, held back 1.5 s: the data is in the
/// client's memory when the unmap is answered, and nothing lands there afterwards.
fn unmap_waits_for_a_read(mode: &[&str]) {
    let mut server = Server::start_with(&[&["--ns", "ram:16M:fault=read/delay=1500/count=1"], mode].concat());
    let mut h = NvmeOverVfioUser::new(server.client());
    h.bring_up(16, false);
    h.mem.write(NvmeOverVfioUser::slot(0), &page_of(0xc3)).unwrap();
    h.queue_rw(true, 0, 0);
    h.ring_io(false);
    assert!(h.reap_io(1)[0].status().is_success());
    let (fd, view) = region(&unique("r"), IOVA2, LEN2);
    h.client.dma_map(IOVA2, LEN2, Some(fd.as_fd()), 0).unwrap();
    view.fill(IOVA2, PAGE, 0xee).unwrap();

    let read = submit_then_prove_fetched(&mut h, false, IOVA2, 0);
    h.client.dma_unmap(IOVA2, LEN2).unwrap_or_else(|e| panic!("DMA_UNMAP: {e}\n{}", server.log()));
    let mut got = page_of(0);
    view.read(IOVA2, &mut got).unwrap();
    assert!(got == page_of(0xc3), "DMA_UNMAP was answered before the read's data arrived");
    view.fill(IOVA2, PAGE, 0x55).unwrap();

    let c = h.reap_io(1);
    assert_eq!(c[0].cid.get(), read);
    assert!(c[0].status().is_success(), "the held read: {:?}", c[0].status());
    view.read(IOVA2, &mut got).unwrap();
    assert!(got == page_of(0x55), "the server wrote into memory after DMA_UNMAP was answered");
    server.assert_alive();
}

#[test]
fn dma_unmap_waits_for_a_write_in_flight_with_a_worker() {
    unmap_waits_for_a_write(&["--workers", "1"]);
}

#[test]
fn dma_unmap_waits_for_a_write_in_flight_inline() {
    unmap_waits_for_a_write(&["--workers", "0"]);
}

#[test]
fn dma_unmap_waits_for_a_read_in_flight_with_a_worker() {
    unmap_waits_for_a_read(&["--workers", "1"]);
}

#[test]
fn dma_unmap_waits_for_a_read_in_flight_inline() {
    unmap_waits_for_a_read(&["--workers", "0"]);
}

/// The same through io_uring on a file (a buffered descriptor, so the kernel copies
/// from the guest's pages itself).
#[test]
fn dma_unmap_waits_for_an_io_uring_read_in_flight() {
    let dir = temp_dir("unmap-uring");
    let img = dir.join("disk.img");
    let ns = format!("file:{}:16M:engine=uring:direct=off:fault=read/delay=1500/count=1", img.display());
    let mut server = Server::start_in(&dir, "s", &["--ns", &ns]);
    let mut h = NvmeOverVfioUser::new(server.client());
    h.bring_up(16, false);
    h.mem.write(NvmeOverVfioUser::slot(0), &page_of(0x3c)).unwrap();
    h.queue_rw(true, 0, 8);
    h.ring_io(false);
    assert!(h.reap_io(1)[0].status().is_success());
    let (fd, view) = region(&unique("u"), IOVA2, LEN2);
    h.client.dma_map(IOVA2, LEN2, Some(fd.as_fd()), 0).unwrap();

    let read = submit_then_prove_fetched(&mut h, false, IOVA2, 8);
    h.client.dma_unmap(IOVA2, LEN2).unwrap_or_else(|e| panic!("DMA_UNMAP: {e}\n{}", server.log()));
    let mut got = page_of(0);
    view.read(IOVA2, &mut got).unwrap();
    assert!(got == page_of(0x3c), "DMA_UNMAP was answered before the read's data arrived");
    view.fill(IOVA2, PAGE, 0x77).unwrap();
    assert_eq!(h.reap_io(1)[0].cid.get(), read);
    view.read(IOVA2, &mut got).unwrap();
    assert!(got == page_of(0x77), "the server wrote into memory after DMA_UNMAP was answered");
    server.assert_alive();
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A request that never ends (`hang`: a stuck device that may still DMA) keeps the
/// memory in use: the unmap is answered EBUSY within the client deadline, the region
/// is gone from the map, and the server and the next client go on.
#[test]
fn dma_unmap_of_memory_a_hung_request_holds_is_refused_in_bounded_time() {
    let mut server =
        Server::start_with(&["--ns", "ram:16M:fault=read/hang/count=1", "--client-deadline", "1s"]);
    let name = unique("hang");
    {
        let mut h = NvmeOverVfioUser::new(server.client());
        h.bring_up(16, false);
        let (fd, _view) = region(&name, IOVA2, LEN2);
        h.client.dma_map(IOVA2, LEN2, Some(fd.as_fd()), 0).unwrap();
        submit_then_prove_fetched(&mut h, false, IOVA2, 0);
        let e = h.client.dma_unmap(IOVA2, LEN2).expect_err("memory a hung request holds");
        assert_eq!(server_errno(e), libc::EBUSY as u32);
        assert!(server.log().contains("still in use"), "the refusal says why:\n{}", server.log());
        let e = h.client.dma_unmap(IOVA2, LEN2).expect_err("the region left the map all the same");
        assert_eq!(server_errno(e), libc::ENOENT as u32);
        assert!(server.holds(&name).0 > 0, "still mapped while the hung request holds it");
        h.write_read_verify(64, 4, 9);
    }
    // The next client is served (the leaving client's wait is bounded too).
    let mut h = NvmeOverVfioUser::new(server.client());
    h.bring_up(16, false);
    h.write_read_verify(128, 4, 10);
    server.assert_alive();
}

/// `nvme://` in front of a second vnvme: the guest's memory is DMA-mapped into the
/// downstream controller (zero copy). An unmap, and a client leaving, take it out of
/// both processes: neither keeps a mapping or a descriptor of it.
#[test]
fn an_nvme_front_leaves_nothing_mapped_here_or_downstream() {
    let dir = temp_dir("unmap-chain");
    let back = Server::start_in(&dir, "back", &["--ns", "ram:16M"]);
    let uri = format!("nvme://{}", dir.join("back.sock").display());
    let mut front = Server::start_in(&dir, "front", &["--ns", &uri]);
    let main = unique("chain-main");
    let extra = unique("chain-extra");
    {
        let mut h = NvmeOverVfioUser::with_memfd(front.client(), memfd_named(&main, MEM_SIZE));
        h.bring_up(16, false);
        h.write_read_verify(0, 4, 1);
        let (fd, view) = region(&extra, IOVA2, LEN2);
        h.client.dma_map(IOVA2, LEN2, Some(fd.as_fd()), 0).unwrap();
        drop(fd);
        view.write(IOVA2, &page_of(0x42)).unwrap();
        h.queue_rw_at(true, IOVA2, 256);
        h.ring_io(false);
        assert!(h.reap_io(1)[0].status().is_success());
        assert!(front.holds(&extra).0 > 0, "the front maps the region");
        assert!(back.holds(&extra).0 > 0, "zero copy: the downstream maps the guest's memory too");

        h.client.dma_unmap(IOVA2, LEN2).unwrap_or_else(|e| panic!("DMA_UNMAP: {e}\n{}", front.log()));
        assert_eq!(front.holds(&extra), (0, 0), "the front still maps or holds the unmapped region");
        assert_eq!(back.holds(&extra), (0, 0), "the downstream still maps or holds the unmapped region");
        assert!(back.holds(&main).0 > 0, "the rest stays shared");
        drop(view);
        h.write_read_verify(8, 4, 2);
    }
    // The next client's VERSION is answered only once the last one is cleaned up.
    let _next = front.client();
    assert_eq!(front.holds(&main), (0, 0), "the front kept the departed client's memory");
    assert_eq!(back.holds(&main), (0, 0), "the downstream kept the departed client's memory");
    drop((front, back));
    let _ = std::fs::remove_dir_all(&dir);
}
