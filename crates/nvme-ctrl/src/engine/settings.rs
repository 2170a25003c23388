//! The data-path settings admin commands change and every engine honours: the
//! memory page size (CC.MPS), MDTS, the Arbitration Burst, Interrupt Coalescing and
//! the Volatile Write Cache, and whether failed commands carry a Command Retry
//! Delay. The admin side builds them; an engine reads them.

use nvme_spec::Status;

use crate::interrupt::Coalescing;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Settings {
    page_size: u64,
    mdts_bytes: u64,
    /// Commands taken from one SQ per turn (None: no limit).
    burst: Option<u32>,
    coalescing: Coalescing,
    /// Writes need not be durable until a Flush.
    write_cache: bool,
    /// The host enabled Advanced Command Retry (Host Behavior Support): failed
    /// commands carry a Command Retry Delay.
    acre: bool,
}

impl Default for Settings {
    /// A controller before its first enable: 4 KiB pages, 1 MiB transfers, no burst
    /// limit, no coalescing, the write cache on.
    fn default() -> Self {
        Settings {
            page_size: 4096,
            mdts_bytes: 1 << 20,
            burst: None,
            coalescing: Coalescing::default(),
            write_cache: true,
            acre: false,
        }
    }
}

impl Settings {
    /// What the features say (Arbitration, Interrupt Coalescing, Volatile Write
    /// Cache, Host Behavior Support); the page size and MDTS stay at their defaults
    /// until [`Self::paged`].
    pub fn from_features(burst: Option<u32>, coalescing: Coalescing, write_cache: bool, acre: bool) -> Self {
        Settings { burst, coalescing, write_cache, acre, ..Default::default() }
    }

    /// With the page size CC.MPS sets and the MDTS it implies.
    pub fn paged(self, page_size: u64, mdts_bytes: u64) -> Self {
        Settings { page_size, mdts_bytes, ..self }
    }

    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    pub fn mdts_bytes(&self) -> u64 {
        self.mdts_bytes
    }

    pub fn burst(&self) -> Option<u32> {
        self.burst
    }

    pub fn coalescing(&self) -> Coalescing {
        self.coalescing
    }

    pub fn write_cache(&self) -> bool {
        self.write_cache
    }

    /// `status` as the host is told it: with the Command Retry Delay its kind calls
    /// for if the host enabled Advanced Command Retry, without one otherwise.
    #[inline]
    pub fn retry_delayed(&self, status: Status) -> Status {
        if self.acre {
            status.with_crd(crate::error::retry_delay(status))
        } else {
            status
        }
    }
}
