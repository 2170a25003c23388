//! Real servers for the tests of the network backends, each fetched and cached by
//! the project's own scripts, each reported as a loud skip when it cannot be had:
//!
//! - [`nbd`]: qemu-nbd serving a qcow2 image, and nbdkit's memory plugin;
//! - [`ceph`]: a one-host Ceph cluster (monitor, manager, OSDs) for librbd.
#![forbid(unsafe_code)]

pub mod ceph;
pub mod nbd;
