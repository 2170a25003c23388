//! Zoned namespaces (NVMe Zoned Namespace Command Set 1.1): the zones of one
//! namespace, their state machine and write pointers, shared by every engine and
//! the admin side.
//!
//! Every zone is Sequential Write Required. A write (Write, Write Zeroes, a Copy's
//! destination, Zone Append) takes its place in its zone when it is started: the
//! zone opens implicitly, its write pointer moves past the write, and at its
//! capacity it becomes full; so writes started one after another land one after
//! another whichever finishes first. The pointer a host sees in Report Zones, and
//! the one kept durably, moves when a write has finished at the backend (or was
//! given up on), to the end of the furthest one: a write the host was told is done
//! is always below it, after a crash too, however the writes finished.
//!
//! Units are bytes inside, logical blocks at the command boundary (the LBA format
//! can change, the zones' layout in bytes does not).

mod store;

use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use nvme_spec::zns::{ZoneDescriptor, ZoneState};
use nvme_spec::Status;

use store::ZoneFile;
pub use store::{made_new as state_file_made_new, read as read_state_file, ZoneFileError, ZoneFileView};

/// The layout and limits of a zoned namespace, as configured.
#[derive(Clone, Debug, Default)]
pub struct ZonedConfig {
    /// Bytes per zone: a power of two, at least 4 KiB (Linux needs a power-of-two
    /// number of sectors per zone).
    pub zone_size: u64,
    /// Bytes of each zone that can be written (ZCAP): a multiple of 4 KiB, at most
    /// `zone_size`.
    pub zone_capacity: u64,
    /// Most zones open at once (MOR + 1; 0: no limit).
    pub max_open: u32,
    /// Most zones active (open or closed) at once (MAR + 1; 0: no limit). At least
    /// `max_open` when both are set.
    pub max_active: u32,
    /// Where the zones' state is kept across restarts (None: in memory only).
    pub state_file: Option<std::sync::Arc<File>>,
}

impl ZonedConfig {
    /// What is wrong with it, for a namespace of `size` bytes.
    pub fn check(&self, size: u64) -> Result<(), String> {
        if !self.zone_size.is_power_of_two() || self.zone_size < 4096 {
            return Err(format!("zone size {} is not a power of two of at least 4 KiB", self.zone_size));
        }
        if self.zone_capacity == 0
            || self.zone_capacity > self.zone_size
            || !self.zone_capacity.is_multiple_of(4096)
        {
            return Err(format!(
                "zone capacity {} is not a multiple of 4 KiB between 4 KiB and the zone size {}",
                self.zone_capacity, self.zone_size
            ));
        }
        if size < self.zone_size {
            return Err(format!("a namespace of {size} bytes holds no zone of {} bytes", self.zone_size));
        }
        if self.max_open > 0 && self.max_active > 0 && self.max_open > self.max_active {
            return Err(format!(
                "max-open={} is more than max-active={}: an open zone is an active one",
                self.max_open, self.max_active
            ));
        }
        Ok(())
    }
}

/// Why a zoned write or zone action cannot be done (each names its status).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ZoneError {
    #[error("the write crosses the end of its zone's capacity")]
    Boundary,
    #[error("the zone is full")]
    Full,
    #[error("the zone is read only")]
    ReadOnly,
    #[error("the zone is offline")]
    Offline,
    #[error("the write is not at the zone's write pointer (at byte {0} of the namespace)")]
    NotAtWritePointer(u64),
    #[error("as many zones are active as the namespace allows")]
    TooManyActive,
    #[error("as many zones are open as the namespace allows")]
    TooManyOpen,
    #[error("a zone {0} cannot be {1}")]
    Transition(&'static str, &'static str),
    #[error("the LBA is not the start of a zone")]
    NotZoneStart,
}

impl ZoneError {
    pub fn status(self) -> Status {
        match self {
            ZoneError::Boundary => Status::ZONE_BOUNDARY_ERROR,
            ZoneError::Full => Status::ZONE_IS_FULL,
            ZoneError::ReadOnly => Status::ZONE_IS_READ_ONLY,
            ZoneError::Offline => Status::ZONE_IS_OFFLINE,
            ZoneError::NotAtWritePointer(_) => Status::ZONE_INVALID_WRITE,
            ZoneError::TooManyActive => Status::TOO_MANY_ACTIVE_ZONES,
            ZoneError::TooManyOpen => Status::TOO_MANY_OPEN_ZONES,
            ZoneError::Transition(..) => Status::INVALID_ZONE_STATE_TRANSITION,
            ZoneError::NotZoneStart => Status::INVALID_FIELD,
        }
        .with_dnr()
    }
}

/// A Zone Management Send action on zones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneAction {
    Open,
    Close,
    Finish,
    Reset,
    Offline,
}

impl ZoneAction {
    fn verb(self) -> &'static str {
        match self {
            ZoneAction::Open => "opened",
            ZoneAction::Close => "closed",
            ZoneAction::Finish => "finished",
            ZoneAction::Reset => "reset",
            ZoneAction::Offline => "taken offline",
        }
    }

    /// Whether Select All applies it to a zone in `s` (ZNS "Zone Management Send"
    /// per action: Open acts on closed zones, Close on open ones, Finish on open and
    /// closed ones, Reset on those and full ones, Offline on read-only ones).
    fn selects(self, s: ZoneState) -> bool {
        match self {
            ZoneAction::Open => s == ZoneState::Closed,
            ZoneAction::Close => s.is_open(),
            ZoneAction::Finish => s.is_active(),
            ZoneAction::Reset => s.is_active() || s == ZoneState::Full,
            ZoneAction::Offline => s == ZoneState::ReadOnly,
        }
    }
}

/// Where a started write goes: its zone, and its byte offset in the namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZoneWrite {
    pub zone: u32,
    pub offset: u64,
    pub len: u64,
    /// The zone's generation when the write started: a write that finishes after
    /// its zone was reset (or the namespace formatted) moves nothing.
    pub generation: u32,
    /// Durable when done (FUA, or no volatile write cache): its zone record is
    /// synced too before the host hears of it.
    pub durable: bool,
    /// Which [`Zones`] it started in: a write finishing after its namespace was
    /// removed (and another added with the NSID) moves nothing.
    pub owner: u64,
}

#[derive(Debug, Clone, Copy)]
struct Zone {
    state: ZoneState,
    /// Bytes past the zone's start that writes were started on.
    started: u64,
    /// Bytes past the zone's start up to the end of the furthest write that
    /// finished (what the host sees, and what the zone state file keeps).
    written: u64,
    /// Bumped by every reset of the zone.
    generation: u32,
}

#[derive(Debug)]
struct Table {
    zones: Vec<Zone>,
    open: u32,
    active: u32,
    file: Option<ZoneFile>,
    /// Zones the controller changed on its own since the host last read the
    /// Changed Zone List (ascending), and whether more changed than it can name.
    changed: Vec<u32>,
    changed_overflow: bool,
}

/// The zones of one namespace.
#[derive(Debug)]
pub struct Zones {
    /// Unique in the process: what a [`ZoneWrite`] names as its owner.
    id: u64,
    cfg: ZonedConfig,
    count: u32,
    table: Mutex<Table>,
    /// Some zone is offline (reads then look at the zones; otherwise they need not).
    any_offline: AtomicBool,
}

impl Zones {
    /// The zones of a namespace of `size` bytes (the last partial zone, if any, is
    /// not part of it), each empty, or as `state` recorded them. Open zones come
    /// back closed (empty if nothing was written), as after a controller reset.
    pub fn new(cfg: &ZonedConfig, size: u64, state: Option<File>) -> Result<Zones, String> {
        cfg.check(size)?;
        let count = u32::try_from(size / cfg.zone_size).map_err(|_| "more than 2^32 zones".to_string())?;
        let empty = Zone { state: ZoneState::Empty, started: 0, written: 0, generation: 0 };
        let mut zones = vec![empty; count as usize];
        let file = match state {
            Some(f) => {
                let (file, saved) =
                    ZoneFile::open(f, cfg.zone_size, cfg.zone_capacity, count).map_err(|e| e.to_string())?;
                for (z, (state, written)) in zones.iter_mut().zip(saved) {
                    *z = Zone { state, started: written, written, generation: 0 };
                }
                Some(file)
            }
            None => None,
        };
        let mut t = Table { zones, open: 0, active: 0, file, changed: Vec::new(), changed_overflow: false };
        t.after_reset(cfg);
        let any_offline = t.zones.iter().any(|z| z.state == ZoneState::Offline);
        static IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Ok(Zones {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            cfg: cfg.clone(),
            count,
            table: Mutex::new(t),
            any_offline: AtomicBool::new(any_offline),
        })
    }

    pub fn config(&self) -> &ZonedConfig {
        &self.cfg
    }

    /// Number of zones.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Bytes the zones span (the namespace's size).
    pub fn span(&self) -> u64 {
        self.count as u64 * self.cfg.zone_size
    }

    /// Whether the zones' state is kept in a file.
    pub fn durable(&self) -> bool {
        self.lock().file.is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // A panic while holding it leaves the table as consistent as any single
        // step leaves it: go on with it.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The zone holding byte `offset`.
    fn zone_of(&self, offset: u64) -> u32 {
        (offset / self.cfg.zone_size) as u32
    }

    /// Starts a write of `len` bytes at byte `offset` (for an append: `offset` is
    /// the zone's start, and the write goes at its write pointer); `durable`: the
    /// write is durable when it completes (FUA, or no volatile write cache).
    pub fn start_write(
        &self,
        offset: u64,
        len: u64,
        append: bool,
        durable: bool,
    ) -> Result<ZoneWrite, ZoneError> {
        let zi = self.zone_of(offset);
        let zstart = zi as u64 * self.cfg.zone_size;
        if append && offset != zstart {
            return Err(ZoneError::NotZoneStart);
        }
        let mut t = self.lock();
        let Some(z) = t.zones.get(zi as usize).copied() else { return Err(ZoneError::Boundary) };
        match z.state {
            ZoneState::Full => return Err(ZoneError::Full),
            ZoneState::ReadOnly => return Err(ZoneError::ReadOnly),
            ZoneState::Offline => return Err(ZoneError::Offline),
            _ => {}
        }
        let at = zstart + z.started;
        if !append && offset != at {
            return Err(ZoneError::NotAtWritePointer(at));
        }
        if z.started + len > self.cfg.zone_capacity {
            return Err(ZoneError::Boundary);
        }
        if !z.state.is_open() {
            t.make_open(&self.cfg, zi, ZoneState::ImplicitlyOpened)?;
        }
        let z = &mut t.zones[zi as usize];
        z.started += len;
        let generation = z.generation;
        if z.started == self.cfg.zone_capacity {
            t.set_state(zi, ZoneState::Full);
        }
        Ok(ZoneWrite { zone: zi, offset: at, len, generation, durable, owner: self.id })
    }

    /// A started write finished at the backend, well or not, or was given up on:
    /// its place is taken either way, as on a device that failed to program it. The
    /// zone's pointer moves to its end if that is further; a durable write's record
    /// is synced before this returns.
    pub fn finish_write(&self, w: ZoneWrite) {
        if w.owner != self.id {
            return;
        }
        let mut t = self.lock();
        let zstart = w.zone as u64 * self.cfg.zone_size;
        let Some(z) = t.zones.get_mut(w.zone as usize) else { return };
        // The zone was reset (or formatted) while the write was out: it is not part
        // of what the zone holds now.
        if z.generation != w.generation {
            return;
        }
        let end = (w.offset + w.len - zstart).min(z.started);
        if end <= z.written {
            return;
        }
        z.written = end;
        t.save(w.zone);
        if w.durable {
            t.sync_file();
        }
    }

    /// Reads of `len` bytes at `offset` touch no offline zone.
    #[inline]
    pub fn check_read(&self, offset: u64, len: u64) -> Result<(), ZoneError> {
        if !self.any_offline.load(Ordering::Relaxed) || len == 0 {
            return Ok(());
        }
        let t = self.lock();
        let (first, last) = (self.zone_of(offset), self.zone_of(offset + len - 1));
        if (first..=last).any(|i| t.zones.get(i as usize).is_some_and(|z| z.state == ZoneState::Offline)) {
            return Err(ZoneError::Offline);
        }
        Ok(())
    }

    /// Does `action` on the zone starting at byte `offset`, or with `all` on every
    /// zone it applies to. Returns the byte ranges whose data a reset leaves behind
    /// (to be deallocated).
    pub fn act(&self, action: ZoneAction, offset: u64, all: bool) -> Result<Vec<(u64, u64)>, ZoneError> {
        let mut t = self.lock();
        let mut stale = Vec::new();
        if all {
            // Opening every closed zone: all of them within the open limit, or none.
            if action == ZoneAction::Open && self.cfg.max_open > 0 {
                let closed = t.zones.iter().filter(|z| z.state == ZoneState::Closed).count() as u32;
                if t.open + closed > self.cfg.max_open {
                    return Err(ZoneError::TooManyOpen);
                }
            }
            for zi in 0..self.count {
                if action.selects(t.zones[zi as usize].state) {
                    // Each selected zone holds the resources its new state needs.
                    t.act_on(&self.cfg, zi, action, &mut stale)?;
                }
            }
        } else {
            if !offset.is_multiple_of(self.cfg.zone_size) || offset >= self.span() {
                return Err(ZoneError::NotZoneStart);
            }
            t.act_on(&self.cfg, self.zone_of(offset), action, &mut stale)?;
        }
        if action == ZoneAction::Offline {
            self.any_offline.store(t.zones.iter().any(|z| z.state == ZoneState::Offline), Ordering::Relaxed);
        }
        Ok(stale)
    }

    /// The controller, on its own, makes the zone starting at byte `offset` read
    /// only (the medium can no longer write it) or offline (nor read it): only the
    /// operator does this, to see how a host copes. The zone is listed in the
    /// Changed Zone List. Returns whether the zone changed.
    pub fn fail_zone(&self, offset: u64, to: ZoneState) -> Result<bool, ZoneError> {
        let mut t = self.lock();
        let zi = self.zone_of(offset);
        if !offset.is_multiple_of(self.cfg.zone_size) || zi >= self.count {
            return Err(ZoneError::NotZoneStart);
        }
        let from = t.zones[zi as usize].state;
        match (from, to) {
            (f, t) if f == t => return Ok(false),
            (ZoneState::Offline, _) => return Err(ZoneError::Transition("offline", "made read only")),
            (_, ZoneState::ReadOnly | ZoneState::Offline) => {}
            _ => return Err(ZoneError::Transition(from.name(), "failed into that state")),
        }
        t.set_state(zi, to);
        if let Err(at) = t.changed.binary_search(&zi) {
            if t.changed.len() < nvme_spec::zns::CHANGED_ZONE_LIST_MAX {
                t.changed.insert(at, zi);
            } else {
                t.changed_overflow = true;
            }
        }
        self.any_offline.store(t.zones.iter().any(|z| z.state == ZoneState::Offline), Ordering::Relaxed);
        Ok(true)
    }

    /// The Changed Zone List with LBAs of `1 << shift` bytes: the ZSLBAs of the zones
    /// changed, and whether more changed than it names.
    pub fn changed_zones(&self, shift: u32) -> (Vec<u64>, bool) {
        let t = self.lock();
        let list = t.changed.iter().map(|&zi| (zi as u64 * self.cfg.zone_size) >> shift).collect();
        (list, t.changed_overflow)
    }

    /// Empties the Changed Zone List (the host read it without Retain Asynchronous
    /// Event).
    pub fn clear_changed_zones(&self) {
        let mut t = self.lock();
        t.changed.clear();
        t.changed_overflow = false;
    }

    /// Zone descriptors from the zone holding byte `offset` on, those in `filter`'s
    /// state (None: all), with LBAs of `1 << shift` bytes: at most `max`, and how
    /// many match in all.
    pub fn report(
        &self,
        offset: u64,
        filter: Option<ZoneState>,
        shift: u32,
        max: usize,
    ) -> (u64, Vec<ZoneDescriptor>) {
        let t = self.lock();
        let (mut matching, mut out) = (0u64, Vec::new());
        let cap = self.cfg.zone_capacity >> shift;
        for zi in self.zone_of(offset)..self.count {
            let z = t.zones[zi as usize];
            if filter.is_some_and(|f| f != z.state) {
                continue;
            }
            matching += 1;
            if out.len() < max {
                let start = (zi as u64 * self.cfg.zone_size) >> shift;
                // Full, read-only and offline zones have no write pointer to speak
                // of: all ones, as the specification has it for the last two.
                let wp = match z.state {
                    ZoneState::Full | ZoneState::ReadOnly | ZoneState::Offline => u64::MAX,
                    _ => start + (z.written >> shift),
                };
                out.push(ZoneDescriptor::new(z.state, start, cap, wp));
            }
        }
        (matching, out)
    }

    /// How many zones are open and active now.
    pub fn resources(&self) -> (u32, u32) {
        let t = self.lock();
        (t.open, t.active)
    }

    /// A controller reset, or a format: open zones close (or empty, if nothing was
    /// written); with `erase` every zone but read-only and offline ones is emptied.
    pub fn reset_controller(&self, erase: bool) {
        let mut t = self.lock();
        if erase {
            for zi in 0..self.count {
                if !matches!(t.zones[zi as usize].state, ZoneState::ReadOnly | ZoneState::Offline) {
                    t.set_state(zi, ZoneState::Empty);
                }
            }
        }
        t.after_reset(&self.cfg);
    }

    /// Each zone's state and bytes written, for a saved controller state (taken
    /// quiesced: no write is between its start and its finish).
    pub fn save(&self) -> Vec<(u8, u64)> {
        let cap = self.cfg.zone_capacity;
        let t = self.lock();
        t.zones
            .iter()
            .map(|z| (z.state as u8, if z.state == ZoneState::Full { cap } else { z.written }))
            .collect()
    }

    /// Bytes per zone and writable bytes per zone, for a saved state.
    pub fn layout(&self) -> (u64, u64) {
        (self.cfg.zone_size, self.cfg.zone_capacity)
    }

    /// Whether `saved` ([`Zones::save`], zones of `layout`, LBAs of `1 << shift`
    /// bytes) fits these zones: the same layout and count, each a state with a
    /// pointer it can have, open and active ones within the limits.
    pub fn check_saved(
        &self,
        saved: &[(u8, u64)],
        layout: Option<(u64, u64)>,
        shift: u32,
    ) -> Result<(), String> {
        if layout.is_some_and(|l| l != self.layout()) {
            return Err(format!("zones (size, capacity) {layout:?} in the state, {:?} here", self.layout()));
        }
        if saved.len() != self.count as usize {
            return Err(format!("{} zones in the state, {} here", saved.len(), self.count));
        }
        let cap = self.cfg.zone_capacity;
        let (mut open, mut active) = (0, 0);
        for (i, &(raw, written)) in saved.iter().enumerate() {
            let state = ZoneState::from_raw(raw).ok_or_else(|| format!("zone {i}: state {raw:#x}"))?;
            let fits = match state {
                ZoneState::Empty => written == 0,
                ZoneState::Full => written == cap,
                // A pointer at the capacity is a full zone's.
                ZoneState::ImplicitlyOpened | ZoneState::ExplicitlyOpened | ZoneState::Closed => {
                    written < cap && written.is_multiple_of(1 << shift)
                }
                _ => written <= cap && written.is_multiple_of(1 << shift),
            };
            if !fits {
                return Err(format!("zone {i}: {} with {written} bytes written", state.name()));
            }
            open += state.is_open() as u32;
            active += state.is_active() as u32;
        }
        let over = |n: u32, max: u32| max > 0 && n > max;
        if over(open, self.cfg.max_open) || over(active, self.cfg.max_active) {
            return Err(format!(
                "{open} open and {active} active zones, the limits are {} and {}",
                self.cfg.max_open, self.cfg.max_active
            ));
        }
        Ok(())
    }

    /// Takes `saved` (checked by [`Zones::check_saved`]) as the zones' state,
    /// recorded in the state file too.
    pub fn restore(&self, saved: &[(u8, u64)]) {
        let mut t = self.lock();
        for (zi, &(raw, written)) in saved.iter().enumerate() {
            let state = ZoneState::from_raw(raw).unwrap_or(ZoneState::Offline);
            let generation = t.zones[zi].generation.wrapping_add(1);
            t.zones[zi] = Zone { state, started: written, written, generation };
            t.save(zi as u32);
        }
        t.open = t.zones.iter().filter(|z| z.state.is_open()).count() as u32;
        t.active = t.zones.iter().filter(|z| z.state.is_active()).count() as u32;
        self.any_offline.store(t.zones.iter().any(|z| z.state == ZoneState::Offline), Ordering::Relaxed);
    }

    /// Makes the recorded zone state durable (a Flush).
    pub fn sync(&self) -> std::io::Result<()> {
        let t = self.lock();
        t.file.as_ref().map_or(Ok(()), ZoneFile::sync)
    }
}

impl Table {
    /// Sets zone `zi`'s state, keeping the counts of open and active zones and the
    /// pointers a state implies (empty: at the start; full: at the capacity).
    fn set_state(&mut self, zi: u32, to: ZoneState) {
        let z = &mut self.zones[zi as usize];
        let from = z.state;
        self.open = self.open + to.is_open() as u32 - from.is_open() as u32;
        self.active = self.active + to.is_active() as u32 - from.is_active() as u32;
        z.state = to;
        if to == ZoneState::Empty {
            (z.started, z.written) = (0, 0);
            z.generation = z.generation.wrapping_add(1);
        }
        self.save(zi);
    }

    /// Syncs the zone state file (a durable write's record); a failure is logged
    /// once and remembered, and every later Flush fails.
    fn sync_file(&mut self) {
        if let Some(f) = &mut self.file {
            f.sync_or_remember();
        }
    }

    fn save(&mut self, zi: u32) {
        let z = self.zones[zi as usize];
        if let Some(f) = &mut self.file {
            f.save(zi, z.state, z.written);
        }
    }

    /// Opens zone `zi` (empty or closed, or implicitly open for an explicit open)
    /// into `to`, within the open and active limits: an implicitly opened zone is
    /// closed to make room where the open limit is reached.
    fn make_open(&mut self, cfg: &ZonedConfig, zi: u32, to: ZoneState) -> Result<(), ZoneError> {
        let from = self.zones[zi as usize].state;
        if from.is_open() {
            self.set_state(zi, to);
            return Ok(());
        }
        if from == ZoneState::Empty && cfg.max_active > 0 && self.active >= cfg.max_active {
            return Err(ZoneError::TooManyActive);
        }
        if cfg.max_open > 0 && self.open >= cfg.max_open {
            let Some(victim) = self.zones.iter().position(|z| z.state == ZoneState::ImplicitlyOpened) else {
                return Err(ZoneError::TooManyOpen);
            };
            self.set_state(victim as u32, ZoneState::Closed);
        }
        self.set_state(zi, to);
        Ok(())
    }

    fn act_on(
        &mut self,
        cfg: &ZonedConfig,
        zi: u32,
        action: ZoneAction,
        stale: &mut Vec<(u64, u64)>,
    ) -> Result<(), ZoneError> {
        use ZoneState as S;
        let z = self.zones[zi as usize];
        let refuse = || Err(ZoneError::Transition(z.state.name(), action.verb()));
        match (action, z.state) {
            (ZoneAction::Open, S::ExplicitlyOpened) => {}
            (ZoneAction::Open, S::Empty | S::Closed | S::ImplicitlyOpened) => {
                self.make_open(cfg, zi, S::ExplicitlyOpened)?
            }
            (ZoneAction::Close, S::Closed) => {}
            (ZoneAction::Close, S::ImplicitlyOpened | S::ExplicitlyOpened) => {
                // Nothing written: back to empty rather than holding a resource.
                self.set_state(zi, if z.started == 0 { S::Empty } else { S::Closed })
            }
            (ZoneAction::Finish, S::Full) => {}
            (ZoneAction::Finish, S::Empty | S::ImplicitlyOpened | S::ExplicitlyOpened | S::Closed) => {
                let z = &mut self.zones[zi as usize];
                (z.started, z.written) = (cfg.zone_capacity, cfg.zone_capacity);
                self.set_state(zi, S::Full)
            }
            (ZoneAction::Reset, S::Empty) => {}
            (ZoneAction::Reset, S::ImplicitlyOpened | S::ExplicitlyOpened | S::Closed | S::Full) => {
                // What writes reached (a finished zone: up to where they stopped,
                // which the pointer no longer says: the whole capacity).
                let start = zi as u64 * cfg.zone_size;
                let used = if z.state == S::Full { cfg.zone_capacity } else { z.started };
                if used > 0 {
                    stale.push((start, used));
                }
                self.set_state(zi, S::Empty)
            }
            (ZoneAction::Offline, S::Offline) => {}
            (ZoneAction::Offline, S::ReadOnly) => self.set_state(zi, S::Offline),
            _ => return refuse(),
        }
        Ok(())
    }

    /// Open zones close (empty if nothing was written to them); the counts are
    /// rebuilt from the states.
    fn after_reset(&mut self, cfg: &ZonedConfig) {
        self.open = self.zones.iter().filter(|z| z.state.is_open()).count() as u32;
        self.active = self.zones.iter().filter(|z| z.state.is_active()).count() as u32;
        for zi in 0..self.zones.len() as u32 {
            let z = &mut self.zones[zi as usize];
            // A zone that filled while its last write was out is full all the same.
            if z.state == ZoneState::Full {
                z.written = cfg.zone_capacity;
            }
            z.started = z.written.min(cfg.zone_capacity);
            z.written = z.started;
            if z.state.is_open() {
                let to = if z.written == 0 { ZoneState::Empty } else { ZoneState::Closed };
                self.set_state(zi, to);
            }
        }
    }
}

#[cfg(test)]
mod tests;
