//! The RBD block backend: a namespace whose blocks live in a Ceph RBD image, reached
//! through librbd's asynchronous C API.
//!
//! ```text
//! rbd:POOL/IMAGE[@SNAP]  or  rbd:POOL/NAMESPACE/IMAGE[@SNAP]
//!     options (each :NAME=VALUE): conf=PATH id=USER keyring=PATH
//! ```
//!
//! - `ffi`: the C API, declared by hand and loaded at run time (dlopen), so a vnvme
//!   without librbd installed still builds and runs.
//! - `queue`: one queue per I/O worker on the one image handle the namespace opens
//!   (librbd's image is thread-safe and is meant to be shared). Requests go out with
//!   `rbd_aio_*`; librbd calls back on its own thread, which hands the result to the
//!   queue and signals the queue's eventfd, the notifier its owner sleeps on. No
//!   thread per request.
//!
//! Data moves through buffers of our own (write data is copied out of guest memory
//! at submission, read data into it when the request is reaped), so a request given
//! up on never touches guest memory afterwards, and a DMA unmap never waits for
//! librbd.
//!
//! What the guest sees: the image's size; a volatile write cache (librbd's cache);
//! Flush as rbd_aio_flush; FUA as a write then a flush; Deallocate as
//! rbd_aio_discard (which promises no zeroes: partial objects may be left as they
//! were); Write Zeroes as rbd_aio_write_zeroes where librbd has it (Ceph 15 and
//! later).
#![deny(unsafe_code)]

// The FFI and the safe layers over it; the queue is safe code.
#[allow(unsafe_code)]
mod aio;
#[allow(unsafe_code)]
pub mod ffi;
#[allow(unsafe_code)]
mod image;
mod liveness;
mod queue;
mod spec;

pub use spec::RbdSpec;

use std::io;
use std::sync::Arc;

use block_backend::{Backend, BackendInfo, BackendQueue};

use image::Image;

/// An RBD image as a block backend (crate documentation).
#[derive(Debug)]
pub struct RbdBackend {
    image: Arc<Image>,
}

impl RbdBackend {
    /// Loads librbd, connects to the cluster and opens the image. Every failure names
    /// what failed: the library, the configuration, the cluster, the pool, the image.
    pub fn open(spec: &RbdSpec) -> io::Result<RbdBackend> {
        let lib = ffi::lib().map_err(io::Error::other)?;
        let image = Image::open(lib, spec)?;
        tracing::info!(
            target: "vnvme::backend",
            "{spec}: {} bytes, librbd {} ({}){}",
            image.size(),
            lib.version,
            lib.path,
            if spec.snap.is_some() { ", snapshot: read-only" } else { "" }
        );
        Ok(RbdBackend { image: Arc::new(image) })
    }

    /// Whether librbd is loaded in this process already.
    pub fn library_loaded() -> bool {
        ffi::loaded()
    }
}

/// The largest discard or write-zeroes handed to librbd in one call.
const MAX_OTHER: u64 = 1 << 30;

impl Backend for RbdBackend {
    fn info(&self) -> BackendInfo {
        // A snapshot takes no writes: nothing to deallocate or zero either.
        let writable = self.image.spec.snap.is_none();
        BackendInfo {
            read_only: !writable,
            kind: self.image.spec.to_string(),
            size: self.image.size(),
            // librbd takes any byte offset and length.
            block_size: 1,
            volatile_cache: writable,
            discard: writable,
            // A discard of part of an object may leave it as it was
            // (rbd_skip_partial_discard).
            discard_zeroes: false,
            discard_max: MAX_OTHER,
            write_zeroes: writable && self.image.lib.rbd_aio_write_zeroes.is_some(),
            write_zeroes_max: MAX_OTHER,
            // librbd's copy is of whole images: a Copy reads and writes.
            copy: false,
        }
    }

    fn open_queue(&self) -> io::Result<Box<dyn BackendQueue>> {
        Ok(Box::new(queue::RbdQueue::new(self.image.clone())?))
    }

    fn resize(&self, bytes: u64) -> io::Result<()> {
        self.image.resize(bytes)
    }

    fn stats_line(&self) -> Option<String> {
        Some(self.image.stats_line())
    }

    fn storage(&self) -> Option<block_backend::StorageReport> {
        Some(self.image.liveness.report())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_image_names_and_options() {
        let s = RbdSpec::parse_image("rbd/vm1").unwrap();
        assert_eq!(
            (s.pool.as_str(), s.namespace.as_str(), s.image.as_str(), s.snap),
            ("rbd", "", "vm1", None)
        );
        let mut s = RbdSpec::parse_image("pool/tenant/vm1@base").unwrap();
        assert_eq!((s.namespace.as_str(), s.snap.as_deref()), ("tenant", Some("base")));
        assert_eq!(s.to_string(), "rbd:pool/tenant/vm1@base");
        assert!(s.set_option("id", "client.vnvme").unwrap());
        assert_eq!(s.id.as_deref(), Some("vnvme"));
        assert!(s.set_option("conf", "/etc/ceph/ceph.conf").unwrap());
        assert!(!s.set_option("lba", "512").unwrap());
        assert!(s.set_option("keyring", "").is_err());
        for bad in ["vm1", "/vm1", "rbd/", "a/b/c/d", "p//i", "p/i@"] {
            assert!(RbdSpec::parse_image(bad).is_err(), "{bad}");
        }
    }
}
