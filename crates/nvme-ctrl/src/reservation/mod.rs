//! Reservations (Base §8.1.22): a namespace given a reservation state file
//! (`resv=PATH`) takes Reservation Register, Report, Acquire and Release, and
//! refuses a host's commands that its reservation keeps out (Reservation
//! Conflict). Every controller of the subsystem is its own process, so the state
//! is shared through that file: each update takes the file's lock, reads the
//! state, applies the rules (`rules`), writes it back and moves a change counter
//! that every process maps; a command's check reads that counter (one load) and
//! reloads the state only when it moved. A change is visible to every controller
//! before the command that made it completes.
//!
//! Registrants are hosts, named by the Host Identifier feature each controller's
//! host sets ([`HostIdentity`]); a host that has not set one may not register
//! (Command Sequence Error). The file keeps the state across restarts of every
//! controller (Persist Through Power Loss is always in effect; the host's PTPL
//! setting is recorded and reported).

mod notices;
pub mod rules;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

pub use crate::shared_file::StoreError;
pub use notices::NotificationLog;
pub use rules::{Access, Ask, HostId, Requester, ResvState};

/// A namespace's reservation state file, shared by every controller.
pub type ResvFile = crate::shared_file::SharedFile<ResvState>;

/// Writes a new reservation state file (no registrants, no reservation): for the
/// process that has just created `file`.
pub fn initialize(file: &std::fs::File) -> Result<(), StoreError> {
    crate::shared_file::initialize::<ResvState>(file)
}

/// The Host Identifier one controller's host set (Set Features 81h): all zero
/// until it does.
#[derive(Debug)]
pub struct HostIdentity {
    id: RwLock<HostId>,
    /// Set as the 128-bit form (EXHID).
    extended: AtomicBool,
    cntlid: u16,
    /// Held by each reservation command and by a change of the identifier, so a
    /// command never registers under an identifier being replaced.
    one_at_a_time: std::sync::Mutex<()>,
}

impl HostIdentity {
    pub fn new(cntlid: u16) -> Self {
        HostIdentity {
            id: RwLock::new([0; 16]),
            extended: AtomicBool::new(false),
            cntlid,
            one_at_a_time: Default::default(),
        }
    }

    pub fn get(&self) -> (HostId, bool) {
        (*self.id.read().unwrap_or_else(|p| p.into_inner()), self.extended.load(Ordering::Acquire))
    }

    pub fn set(&self, id: HostId, extended: bool) {
        *self.id.write().unwrap_or_else(|p| p.into_inner()) = id;
        self.extended.store(extended, Ordering::Release);
    }

    /// Back to unset (a controller reset: features return to their defaults).
    pub fn clear(&self) {
        self.set([0; 16], false);
    }

    /// Held over a reservation command, or a change of the identifier.
    pub fn serialize(&self) -> std::sync::MutexGuard<'_, ()> {
        self.one_at_a_time.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }

    /// The requester for a reservation command, or Command Sequence Error: a host
    /// must name itself before it registers.
    pub fn requester(&self) -> Result<Requester, nvme_spec::Status> {
        let (host, _) = self.get();
        if host == [0; 16] {
            return Err(nvme_spec::Status::COMMAND_SEQUENCE_ERROR);
        }
        Ok(Requester { host, cntlid: self.cntlid })
    }
}

/// One namespace's reservations, as one controller sees them.
#[derive(Debug)]
pub struct Reservations {
    file: ResvFile,
    host: Arc<HostIdentity>,
}

impl Reservations {
    pub fn new(file: ResvFile, host: Arc<HostIdentity>) -> Self {
        Reservations { file, host }
    }

    /// Whether this controller's host may run a command of kind `access` now:
    /// Reservation Conflict if not, Internal Error once the state file is not to be
    /// trusted (it shrank or was damaged under us: a fence it held is not known).
    #[inline]
    pub fn check(&self, access: Access) -> Result<(), nvme_spec::Status> {
        let ok = self
            .file
            .with_current(|state, _| state.rtype.is_none() || state.allows(&self.host.get().0, access));
        if self.file.broken().is_some() {
            return Err(nvme_spec::Status::INTERNAL_ERROR);
        }
        // Not retried: the same command would conflict again.
        ok.then_some(()).ok_or(nvme_spec::Status::RESERVATION_CONFLICT.with_dnr())
    }

    /// The state as it is now.
    pub fn current(&self) -> Arc<ResvState> {
        self.file.current()
    }

    /// Applies `f` to the shared state as this controller's host, under the file's
    /// lock; the change is visible to every controller when this returns.
    pub fn update<T>(
        &self,
        f: impl FnOnce(&mut ResvState, &Requester) -> Result<T, nvme_spec::Status>,
    ) -> Result<T, nvme_spec::Status> {
        let _one = self.host.serialize();
        let me = self.host.requester()?;
        self.file.update(|s| f(s, &me)).map_err(|e| match e {
            crate::shared_file::UpdateError::Rules(s) => s,
            crate::shared_file::UpdateError::Store(e) => {
                log_limit::limited_warn!(target: "vnvme::backend", "reservation state file: {e}");
                nvme_spec::Status::INTERNAL_ERROR
            }
        })
    }

    /// Records in the shared state that this controller's host is `id` (Set
    /// Features Host Identifier; the caller holds [`HostIdentity::serialize`]), so
    /// the notifications owed to that host reach this controller too.
    pub fn name_host(&self, id: HostId) {
        let cntlid = self.host.cntlid();
        let r = self.file.update(|s| {
            s.name_host(cntlid, id);
            Ok(())
        });
        if let Err(crate::shared_file::UpdateError::Store(e)) = r {
            log_limit::limited_warn!(target: "vnvme::backend", "reservation state file: {e}");
        }
    }

    /// Takes the notifications owed to this controller, if the state moved since
    /// it last looked.
    pub fn take_notices(&self) -> Vec<u8> {
        if !self.file.changed_since_last_look() {
            return Vec::new();
        }
        let cntlid = self.host.cntlid();
        let any = self.file.with_current(|s, _| s.notices.iter().any(|&(c, _)| c == cntlid));
        if !any {
            return Vec::new();
        }
        self.file.update(|s| Ok::<_, nvme_spec::Status>(s.take_notices(cntlid))).unwrap_or_default()
    }

    pub fn host(&self) -> &HostIdentity {
        &self.host
    }
}

#[cfg(test)]
mod tests;
