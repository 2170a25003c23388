//! Guest memory over sealed memfds (the files themselves: [`test_util::memfd`]).

use std::os::fd::AsFd;

use guest_mem::GuestMemory;
use test_util::memfd::memfd;

/// Guest memory backed by sealed memfds, one per `(gpa, len)` range, mapped shared
/// (what QEMU hands a vfio-user device).
pub fn memfd_memory(ranges: &[(u64, u64)]) -> GuestMemory {
    let mut mem = GuestMemory::empty();
    for &(gpa, len) in ranges {
        let fd = memfd(len);
        mem = mem.with_fd_region(gpa, len, fd.as_fd(), 0, true).expect("map the memfd");
    }
    mem
}
