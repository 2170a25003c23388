//! The guest memory map every engine of a controller uses, published once and
//! adopted by each engine on its own thread.
//!
//! The transport publishes a new map when the host's memory changes (vfio-user
//! DMA_MAP / DMA_UNMAP). Each engine checks the generation before it fetches a
//! command and adopts the newest map when it changed, so a map that only adds
//! regions needs no round trip to any worker: the host can only place a command in
//! new memory after it learns of the map, which is after the publish, and the
//! engine looks at the generation after reading that command's doorbell or shadow
//! tail and before reading the command. A map that removes regions is published the
//! same way, and then every worker is made to adopt it before the transport answers
//! (`Controller::set_memory`), so no new command can use the old one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use guest_mem::GuestMemory;

/// The newest guest memory map of a controller and its generation.
#[derive(Debug, Default)]
pub struct SharedMemory {
    generation: AtomicU64,
    map: Mutex<GuestMemory>,
}

impl SharedMemory {
    pub fn new(mem: GuestMemory) -> Self {
        SharedMemory { generation: AtomicU64::new(0), map: Mutex::new(mem) }
    }

    /// Makes `mem` the newest map.
    pub fn publish(&self, mem: GuestMemory) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        *m = mem;
        // Under the lock, so a reader that sees this generation gets this map.
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// The current generation: one load, for the check before each fetch.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The newest map and its generation.
    pub fn latest(&self) -> (u64, GuestMemory) {
        let m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        (self.generation.load(Ordering::Acquire), m.clone())
    }
}
