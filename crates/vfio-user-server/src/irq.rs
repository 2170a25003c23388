//! Interrupts leave as eventfd signals: one eventfd per MSI-X vector (under QEMU with
//! KVM these are KVM irqfds, so an interrupt reaches the guest without a VMM exit),
//! or the single INTx eventfd when MSI-X is off.

use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::RwLock;

use nvme_ctrl::InterruptSink;
use tracing::trace;

/// Eventfds installed by DEVICE_SET_IRQS.
#[derive(Debug)]
pub struct EventFdInterrupts {
    msix: RwLock<Vec<Option<File>>>,
    intx: RwLock<Option<File>>,
    /// MSI-X Enable in the config space.
    msix_enabled: AtomicBool,
    /// Signals that found no eventfd (the client had not wired that vector yet).
    pub dropped: AtomicU64,
}

impl EventFdInterrupts {
    pub fn new(vectors: u16) -> Self {
        EventFdInterrupts {
            msix: RwLock::new((0..vectors).map(|_| None).collect()),
            intx: RwLock::new(None),
            msix_enabled: AtomicBool::new(false),
            dropped: AtomicU64::new(0),
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
            v[start + i] = fd.map(File::from);
        }
        Ok(())
    }

    /// Removes every MSI-X eventfd.
    pub fn clear_msix(&self) {
        let mut v = self.msix.write().unwrap_or_else(|p| p.into_inner());
        v.iter_mut().for_each(|f| *f = None);
    }

    pub fn set_intx(&self, fd: Option<OwnedFd>) {
        *self.intx.write().unwrap_or_else(|p| p.into_inner()) = fd.map(File::from);
    }

    /// Tracks the MSI-X Enable bit. A client that installs MSI-X eventfds without ever
    /// touching config space (our own driver) counts as MSI-X enabled too.
    pub fn set_msix_enabled(&self, on: bool) {
        self.msix_enabled.store(on, Ordering::Release);
    }

    fn kick(f: &File) {
        // An eventfd write only fails if the counter would overflow, which means the
        // consumer is gone; nothing to do about it here.
        let _ = (&*f).write(&1u64.to_ne_bytes());
    }
}

impl InterruptSink for EventFdInterrupts {
    fn signal(&self, vector: u16) {
        {
            let v = self.msix.read().unwrap_or_else(|p| p.into_inner());
            if let Some(Some(f)) = v.get(vector as usize) {
                Self::kick(f);
                return;
            }
            let any_msix = v.iter().any(|f| f.is_some());
            if any_msix || self.msix_enabled.load(Ordering::Acquire) {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                trace!(vector, "MSI-X vector has no eventfd: interrupt dropped");
                return;
            }
        }
        match &*self.intx.read().unwrap_or_else(|p| p.into_inner()) {
            Some(f) => Self::kick(f),
            None => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
