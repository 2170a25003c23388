//! Where a controller is in its life (Base §3.5.1 initialization, §3.6 shutdown,
//! §3.7 reset), and what exists only in some of those states.

/// Where the controller is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// CC.EN = 0: registers may be programmed, no queues exist.
    Disabled,
    /// CSTS.RDY = 1: the admin queue (and any I/O queues) run.
    Ready,
    /// A shutdown notification was processed; CSTS.SHST = complete. Only a reset
    /// (CC.EN = 0) leaves this state.
    ShutDown,
    /// CSTS.CFS = 1: something the host did (or the memory it gave us) made the
    /// controller unable to go on. Only a reset leaves this state.
    Fatal,
}

impl Lifecycle {
    /// The name a saved state gives it.
    pub fn name(self) -> &'static str {
        match self {
            Lifecycle::Disabled => "disabled",
            Lifecycle::Ready => "ready",
            Lifecycle::ShutDown => "shut-down",
            Lifecycle::Fatal => "fatal",
        }
    }

    /// The lifecycle a saved state names.
    pub fn from_name(name: &str) -> Option<Lifecycle> {
        [Lifecycle::Disabled, Lifecycle::Ready, Lifecycle::ShutDown, Lifecycle::Fatal]
            .into_iter()
            .find(|l| l.name() == name)
    }
}

/// The lifecycle with what exists only in a state: the memory page size CC.MPS chose
/// exists while the controller is enabled (ready, or shut down until a reset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Disabled,
    Ready { page_size: u64 },
    ShutDown { page_size: u64 },
    Fatal,
}

impl Phase {
    /// `lifecycle`, enabled with `page_size` if it is an enabled state (a restore).
    pub(crate) fn of(lifecycle: Lifecycle, page_size: u64) -> Phase {
        match lifecycle {
            Lifecycle::Disabled => Phase::Disabled,
            Lifecycle::Ready => Phase::Ready { page_size },
            Lifecycle::ShutDown => Phase::ShutDown { page_size },
            Lifecycle::Fatal => Phase::Fatal,
        }
    }

    pub(crate) fn lifecycle(self) -> Lifecycle {
        match self {
            Phase::Disabled => Lifecycle::Disabled,
            Phase::Ready { .. } => Lifecycle::Ready,
            Phase::ShutDown { .. } => Lifecycle::ShutDown,
            Phase::Fatal => Lifecycle::Fatal,
        }
    }

    /// The memory page size, while enabled.
    pub(crate) fn page_size(self) -> Option<u64> {
        match self {
            Phase::Ready { page_size } | Phase::ShutDown { page_size } => Some(page_size),
            Phase::Disabled | Phase::Fatal => None,
        }
    }
}
