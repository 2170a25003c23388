//! Zero copy: the front's guest memory regions DMA-mapped into the downstream device,
//! so downstream PRPs can point straight at guest pages.
//!
//! A [`GuestMaps`] is shared by every queue of a backend; its table is locked only when
//! a queue meets a guest memory snapshot whose map it has not seen. Each snapshot gets
//! a [`MemView`]: its regions with the mapping that reaches each (if any). A mapping
//! lives as long as some view holds it — the current one, a queue's cached one, or an
//! in-flight command's — so a region that left the guest's map is never unmapped under
//! a command still using it.

use std::sync::{Arc, Mutex, Weak};

use block_backend::{Segment, SegmentCursor, SegmentMark};
use guest_mem::GuestMemory;
use nvme_driver::DeviceHandle;
use tracing::{debug, warn};

use crate::lock;
use crate::stats::{bump, Counters};
use crate::uri::NvmeTarget;

/// A region is known by its guest address, length and host address: the same region
/// in a later snapshot has all three unchanged.
type RegionKey = (u64, u64, usize);

/// One guest memory region mapped into the downstream device; unmapped on drop.
#[derive(Debug)]
struct Mapped {
    iova: u64,
    len: u64,
    device: DeviceHandle,
    stats: Arc<Counters>,
}

impl Drop for Mapped {
    fn drop(&mut self) {
        match self.device.unmap_external(self.iova, self.len) {
            Ok(()) => bump(&self.stats.regions_unmapped, 1),
            Err(e) => debug!(iova = format_args!("{:#x}", self.iova), "unmapping guest memory: {e}"),
        }
    }
}

#[derive(Debug)]
struct ViewRegion {
    gpa: u64,
    len: u64,
    map: Option<Arc<Mapped>>,
}

/// How the device reaches the regions of one guest memory snapshot.
#[derive(Debug)]
pub(crate) struct MemView {
    /// In guest address order. Declared (so dropped) before `mem`: a region leaves
    /// the downstream device before our last reference to its memory goes, so once
    /// the front sees the memory unused (DMA_UNMAP's wait), the downstream has
    /// unmapped it too.
    regions: Vec<ViewRegion>,
    pub(crate) mem: GuestMemory,
}

impl MemView {
    /// The device address of `gpa` and the bytes from there to the end of its region.
    fn translate(&self, gpa: u64) -> Option<(u64, u64)> {
        let i = self.regions.partition_point(|r| r.gpa <= gpa).checked_sub(1)?;
        let r = &self.regions[i];
        let into = gpa - r.gpa;
        (into < r.len).then_some(())?;
        Some((r.map.as_ref()?.iova + into, r.len - into))
    }

    /// The device addresses of `n` bytes of `segs` from `at`, merged where contiguous,
    /// into `out`; false if any byte is outside shared memory or in a bit bucket.
    pub(crate) fn device_ranges(
        &self,
        segs: &[Segment],
        at: SegmentMark,
        n: u64,
        out: &mut Vec<(u64, u64)>,
    ) -> bool {
        out.clear();
        let mut covered = 0;
        for (_, piece) in SegmentCursor::resume(segs, at).pieces(n) {
            let Segment::Guest { gpa, len } = piece else { return false };
            let (mut a, mut left) = (gpa, len);
            while left > 0 {
                let Some((iova, room)) = self.translate(a) else { return false };
                let k = room.min(left);
                match out.last_mut() {
                    Some(last) if last.0 + last.1 == iova => last.1 += k,
                    _ => out.push((iova, k)),
                }
                a += k;
                left -= k;
            }
            covered += len;
        }
        covered == n
    }
}

#[derive(Debug, Default)]
struct MapTable {
    last: Option<Arc<MemView>>,
    /// Every mapping still alive somewhere, for reuse by later snapshots.
    live: Vec<(RegionKey, Weak<Mapped>)>,
    /// Regions the transport could not share (not retried while they exist).
    failed: Vec<RegionKey>,
}

/// The guest memory mapped into one downstream device, shared by a backend's queues.
#[derive(Debug)]
pub(crate) struct GuestMaps {
    device: DeviceHandle,
    stats: Arc<Counters>,
    /// Named in messages.
    target: NvmeTarget,
    table: Mutex<MapTable>,
}

impl GuestMaps {
    pub(crate) fn new(device: DeviceHandle, stats: Arc<Counters>, target: NvmeTarget) -> Self {
        GuestMaps { device, stats, target, table: Mutex::new(MapTable::default()) }
    }

    /// The view for `mem`, mapping its regions if this map is new.
    pub(crate) fn view_for(&self, mem: &GuestMemory) -> Arc<MemView> {
        let mut t = lock(&self.table);
        if let Some(v) = t.last.as_ref().filter(|v| v.mem.same_map(mem)) {
            return v.clone();
        }
        t.live.retain(|(_, w)| w.strong_count() > 0);
        let keys: Vec<RegionKey> = mem.region_sources().map(|s| (s.gpa, s.len, s.host as usize)).collect();
        t.failed.retain(|k| keys.contains(k));
        let mut regions = Vec::with_capacity(keys.len());
        for key @ (gpa, len, _) in keys {
            let reuse = t.live.iter().find(|(k, _)| *k == key).and_then(|(_, w)| w.upgrade());
            let map = if reuse.is_some() {
                reuse
            } else if t.failed.contains(&key) {
                None
            } else {
                match self.device.map_external(mem, gpa, len) {
                    Ok(Some(iova)) => {
                        bump(&self.stats.regions_mapped, 1);
                        let m = Arc::new(Mapped {
                            iova,
                            len,
                            device: self.device.clone(),
                            stats: self.stats.clone(),
                        });
                        t.live.push((key, Arc::downgrade(&m)));
                        Some(m)
                    }
                    Ok(None) => {
                        t.failed.push(key);
                        None
                    }
                    Err(e) => {
                        warn!(
                            gpa = format_args!("{gpa:#x}"),
                            len, "{}: cannot share guest memory, copying instead: {e}", self.target
                        );
                        bump(&self.stats.map_failures, 1);
                        t.failed.push(key);
                        None
                    }
                }
            };
            regions.push(ViewRegion { gpa, len, map });
        }
        let v = Arc::new(MemView { regions, mem: mem.clone() });
        t.last = Some(v.clone());
        v
    }

    /// The guest's map is now `mem`: if a view of an older map is current, a view of
    /// `mem` replaces it, keeping the mappings of regions both have. Regions `mem`
    /// no longer has are unmapped downstream once no command in flight holds them.
    pub(crate) fn follow(&self, mem: &GuestMemory) {
        let stale = lock(&self.table).last.as_ref().is_some_and(|v| !v.mem.same_map(mem));
        if stale {
            self.view_for(mem);
        }
    }

    /// Lets go of the current view: its regions are unmapped once no queue or
    /// command holds them.
    pub(crate) fn forget(&self) {
        lock(&self.table).last = None;
    }
}
