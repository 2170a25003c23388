//! Shared-memory files for tests: what a VMM hands a vfio-user device as guest RAM or
//! DMA memory. They are sealed against shrinking by default, so a peer that mapped
//! them cannot be made to fault by a truncate behind its back.

use std::os::fd::OwnedFd;

use rustix::fs::{fcntl_add_seals, ftruncate, memfd_create, MemfdFlags, SealFlags};

/// An anonymous shared-memory file of `len` bytes, sealed with F_SEAL_SHRINK.
pub fn memfd(len: u64) -> OwnedFd {
    let fd = memfd_unsealed(len);
    fcntl_add_seals(&fd, SealFlags::SHRINK).expect("seal the memfd against shrinking");
    fd
}

/// An anonymous shared-memory file of `len` bytes that may still be resized and
/// sealed (a test of what happens when it shrinks).
pub fn memfd_unsealed(len: u64) -> OwnedFd {
    memfd_unsealed_named("vnvme-test-mem", len)
}

/// [`memfd`] under a name of the caller's, which `/proc/PID/maps` of every process
/// that maps it shows (`/memfd:NAME (deleted)`): how a test finds its memory in a
/// server.
pub fn memfd_named(name: &str, len: u64) -> OwnedFd {
    let fd = memfd_unsealed_named(name, len);
    fcntl_add_seals(&fd, SealFlags::SHRINK).expect("seal the memfd against shrinking");
    fd
}

fn memfd_unsealed_named(name: &str, len: u64) -> OwnedFd {
    let fd = memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).expect("memfd_create");
    ftruncate(&fd, len).expect("size the memfd");
    fd
}
