//! Interrupts leave as eventfd signals: one eventfd per MSI-X vector (under QEMU with
//! KVM these are KVM irqfds, so an interrupt reaches the guest without a VMM exit),
//! or the single INTx eventfd when MSI-X is off.
//!
//! The eventfds come from the client, which is untrusted: `Device` accepts only
//! eventfds and makes them non-blocking before they get here. A signal then never
//! blocks: a counter the client let fill up answers EAGAIN, which means the
//! interrupt is already pending, so it counts as delivered. The signalling thread
//! (any I/O worker) takes the descriptor out from under the lock before it writes,
//! so no thread writes to a client's descriptor while holding a lock another needs.

use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use nvme_ctrl::InterruptSink;
use tracing::trace;

/// Eventfds installed by DEVICE_SET_IRQS.
#[derive(Debug)]
pub struct EventFdInterrupts {
    msix: RwLock<Vec<Option<Arc<File>>>>,
    intx: RwLock<Option<Arc<File>>>,
    /// MSI-X Enable in the config space.
    msix_enabled: AtomicBool,
    /// Signals that found no eventfd (the client had not wired that vector yet).
    pub dropped: AtomicU64,
    /// Signals whose eventfd counter was full: the interrupt was already pending.
    pub already_pending: AtomicU64,
    /// Signals whose eventfd write failed otherwise.
    pub failed: AtomicU64,
}

impl EventFdInterrupts {
    pub fn new(vectors: u16) -> Self {
        EventFdInterrupts {
            msix: RwLock::new((0..vectors).map(|_| None).collect()),
            intx: RwLock::new(None),
            msix_enabled: AtomicBool::new(false),
            dropped: AtomicU64::new(0),
            already_pending: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }

    pub fn vectors(&self) -> usize {
        self.msix.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Installs (Some) or removes (None) the eventfds of vectors `start..`.
    pub fn set_msix(&self, start: usize, fds: Vec<Option<OwnedFd>>) -> Result<(), String> {
        let mut v = self.msix.write().unwrap_or_else(|p| p.into_inner());
        if start.checked_add(fds.len()).is_none_or(|e| e > v.len()) {
            return Err(format!(
                "vectors {start}..{} beyond the {} MSI-X vectors",
                start + fds.len(),
                v.len()
            ));
        }
        for (i, fd) in fds.into_iter().enumerate() {
            v[start + i] = fd.map(|fd| Arc::new(File::from(fd)));
        }
        Ok(())
    }

    /// Removes every MSI-X eventfd.
    /// Duplicates of the installed descriptors (a hand-over): every MSI-X vector's,
    /// INTx's, and whether MSI-X is enabled.
    pub fn export(&self) -> std::io::Result<(Vec<Option<OwnedFd>>, Option<OwnedFd>, bool)> {
        let dup = |f: &Option<Arc<File>>| f.as_ref().map(|f| f.try_clone().map(OwnedFd::from)).transpose();
        let msix =
            self.msix.read().unwrap_or_else(|p| p.into_inner()).iter().map(dup).collect::<Result<_, _>>()?;
        let intx = dup(&self.intx.read().unwrap_or_else(|p| p.into_inner()))?;
        Ok((msix, intx, self.msix_enabled.load(Ordering::Acquire)))
    }

    pub fn clear_msix(&self) {
        let mut v = self.msix.write().unwrap_or_else(|p| p.into_inner());
        v.iter_mut().for_each(|f| *f = None);
    }

    pub fn set_intx(&self, fd: Option<OwnedFd>) {
        *self.intx.write().unwrap_or_else(|p| p.into_inner()) = fd.map(|fd| Arc::new(File::from(fd)));
    }

    /// Tracks the MSI-X Enable bit. A client that installs MSI-X eventfds without ever
    /// touching config space (our own driver) counts as MSI-X enabled too.
    pub fn set_msix_enabled(&self, on: bool) {
        self.msix_enabled.store(on, Ordering::Release);
    }

    fn kick(&self, f: &File) {
        match (&*f).write(&1u64.to_ne_bytes()) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                self.already_pending.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                // Only an eventfd gets here, and its write fails only as above;
                // counted and logged in case a kernel does otherwise.
                self.failed.fetch_add(1, Ordering::Relaxed);
                log_limit::limited_warn!(target: "vnvme::client", "interrupt eventfd write failed: {e}");
            }
        }
    }

    /// The eventfd for `vector`: Ok(Some) to signal, Ok(None) to drop the interrupt
    /// (MSI-X in use but that vector unwired), Err(()) to fall back to INTx.
    fn msix_target(&self, vector: u16) -> Result<Option<Arc<File>>, ()> {
        let v = self.msix.read().unwrap_or_else(|p| p.into_inner());
        if let Some(Some(f)) = v.get(vector as usize) {
            return Ok(Some(f.clone()));
        }
        if v.iter().any(|f| f.is_some()) || self.msix_enabled.load(Ordering::Acquire) {
            return Ok(None);
        }
        Err(())
    }
}

impl InterruptSink for EventFdInterrupts {
    fn signal(&self, vector: u16) {
        let target = match self.msix_target(vector) {
            Ok(t) => t,
            Err(()) => self.intx.read().unwrap_or_else(|p| p.into_inner()).clone(),
        };
        match target {
            Some(f) => self.kick(&f),
            None => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                trace!(vector, "interrupt has no eventfd: dropped");
            }
        }
    }
}
