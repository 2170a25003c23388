//! Flexible Data Placement (Base §8.1.10): endurance group 1, its reclaim unit
//! handles and what each one's reclaim unit can still take, the group's statistics
//! and its host events.
//!
//! The model: there is no media behind the reclaim units, so nothing is moved or
//! erased. Each handle points at a reclaim unit of `ru_size` bytes; a write through
//! it (data and metadata) uses the unit up, and when it is used up the handle moves
//! to a fresh one, as a drive would. Media bytes written equal host bytes written
//! (no garbage collection, so no write amplification) and Media Bytes Erased stays
//! 0. A Reclaim Unit Handle Update moves a handle to a fresh unit at once, and
//! records "reclaim unit not fully written" if the host enabled that event.
//!
//! Shared by the admin side (logs, features) and every I/O engine (writes, I/O
//! Management): the counters are atomics; events, rare, take a lock.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use nvme_spec::fdp::{
    event, event_flags, fdpa, ruha, ruht, ConfigDescriptor, ConfigLogHeader, Event, EventsHeader,
    RuhStatusDescriptor, RuhStatusHeader, Statistics,
};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromZeros, IntoBytes};

use crate::config::FdpConfig;

/// The one endurance group's identifier.
pub const ENDGID: u16 = 1;

/// Host events kept: the oldest goes when another comes.
pub const EVENT_LOG_ENTRIES: usize = 63;

/// The event types a placement handle can enable, each with its bit in a handle's
/// enabled mask. Only these can happen here: there is no time limit on a reclaim
/// unit and a reset moves no handle.
const EVENT_TYPES: [(u8, u8); 2] = [(event::RU_NOT_FULLY_WRITTEN, 1 << 0), (event::INVALID_PID, 1 << 1)];

fn event_bit(etype: u8) -> Option<u8> {
    EVENT_TYPES.iter().find(|(t, _)| *t == etype).map(|(_, b)| *b)
}

/// One host event as kept (the log page's record is built when read).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EventRecord {
    pub etype: u8,
    /// A placement identifier is named (PIV).
    pub pid: Option<u16>,
    pub nsid: u32,
    pub ruhid: u16,
    /// The controller's clock when it happened (ns).
    pub at_ns: u64,
}

#[derive(Debug, Default)]
struct Events {
    /// Per reclaim unit handle: the event types enabled (bits of [`EVENT_TYPES`]).
    enabled: Vec<u8>,
    log: VecDeque<EventRecord>,
}

impl Events {
    fn record(&mut self, r: EventRecord) {
        if self.log.len() == EVENT_LOG_ENTRIES {
            self.log.pop_front();
        }
        self.log.push_back(r);
    }
}

/// Endurance group 1 with FDP enabled.
#[derive(Debug)]
pub struct Fdp {
    cfg: FdpConfig,
    /// Bytes each handle's reclaim unit can still take (1..=ru_size).
    left: Box<[AtomicU64]>,
    /// Host bytes with metadata written.
    host_written: AtomicU64,
    events: Mutex<Events>,
}

/// What a write named: the placement identifier of a Data Placement directive, or
/// none (it goes through placement handle 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    Default,
    Pid(u16),
}

impl Placement {
    /// A write's placement from its Directive Type and Directive Specific fields.
    #[inline]
    pub fn of(dtype: u8, dspec: u16) -> Placement {
        if dtype == nvme_spec::fdp::DTYPE_DATA_PLACEMENT {
            Placement::Pid(dspec)
        } else {
            Placement::Default
        }
    }
}

impl Fdp {
    pub fn new(cfg: FdpConfig) -> Fdp {
        Fdp {
            left: (0..cfg.ruhs).map(|_| AtomicU64::new(cfg.ru_size)).collect(),
            host_written: AtomicU64::new(0),
            events: Mutex::new(Events { enabled: vec![0; cfg.ruhs as usize], log: VecDeque::new() }),
            cfg,
        }
    }

    pub fn config(&self) -> FdpConfig {
        self.cfg
    }

    fn ruhs(&self) -> u16 {
        self.cfg.ruhs
    }

    /// The handle a valid placement identifier names (one reclaim group, so the
    /// identifier is the placement handle, and placement handle i is RUH i).
    fn handle(&self, pid: u16) -> Option<u16> {
        (pid < self.ruhs()).then_some(pid)
    }

    fn events(&self) -> std::sync::MutexGuard<'_, Events> {
        self.events.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Charges a write of `bytes` (data and metadata) on namespace `nsid` to the
    /// reclaim unit its placement names. An identifier the namespace lacks does not
    /// fail the write: it goes through placement handle 0, and records an Invalid
    /// Placement Identifier event if handle 0 has that event enabled.
    pub fn write(&self, nsid: u32, placement: Placement, bytes: u64, now_ns: impl FnOnce() -> u64) {
        let ruh = match placement {
            Placement::Default => 0,
            Placement::Pid(pid) => match self.handle(pid) {
                Some(h) => h,
                None => {
                    let mut ev = self.events();
                    if ev.enabled[0] & event_bit(event::INVALID_PID).unwrap_or(0) != 0 {
                        let r = EventRecord {
                            etype: event::INVALID_PID,
                            pid: Some(pid),
                            nsid,
                            ruhid: 0,
                            at_ns: now_ns(),
                        };
                        ev.record(r);
                    }
                    0
                }
            },
        };
        self.host_written.fetch_add(bytes, Ordering::Relaxed);
        let ru = self.cfg.ru_size;
        // A write longer than what is left fills this unit and goes on in fresh ones.
        let _ = self.left[ruh as usize].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
            Some(if bytes < left { left - bytes } else { ru - (bytes - left) % ru })
        });
    }

    /// Why `pids` cannot all be updated, if one is not a placement identifier of the
    /// namespace.
    pub fn check_pids(&self, pids: &[u16]) -> Result<(), u16> {
        match pids.iter().find(|&&p| self.handle(p).is_none()) {
            Some(&p) => Err(p),
            None => Ok(()),
        }
    }

    /// Reclaim Unit Handle Update: each handle named moves to a fresh reclaim unit
    /// (the caller checked them with [`Fdp::check_pids`]).
    pub fn update(&self, nsid: u32, pids: &[u16], now_ns: u64) {
        let mut ev = self.events();
        for &pid in pids {
            let Some(h) = self.handle(pid) else { continue };
            let was = self.left[h as usize].swap(self.cfg.ru_size, Ordering::Relaxed);
            let bit = event_bit(event::RU_NOT_FULLY_WRITTEN).unwrap_or(0);
            if was < self.cfg.ru_size && ev.enabled[h as usize] & bit != 0 {
                ev.record(EventRecord {
                    etype: event::RU_NOT_FULLY_WRITTEN,
                    pid: Some(pid),
                    nsid,
                    ruhid: h,
                    at_ns: now_ns,
                });
            }
        }
    }

    /// I/O Management Receive, Reclaim Unit Handle Status, for a namespace of
    /// `2^shift`-byte blocks with `ms` bytes of metadata each: a descriptor per
    /// placement handle.
    pub fn status(&self, shift: u32, ms: u16) -> Vec<u8> {
        let mut v =
            RuhStatusHeader { nruhsd: U16::new(self.ruhs()), ..Default::default() }.as_bytes().to_vec();
        let block = (1u64 << shift) + ms as u64;
        for h in 0..self.ruhs() {
            let left = self.left[h as usize].load(Ordering::Relaxed);
            let d = RuhStatusDescriptor {
                pid: U16::new(h),
                ruhid: U16::new(h),
                earutr: U32::new(0),
                ruamw: U64::new(left / block),
                ..Default::default()
            };
            v.extend_from_slice(d.as_bytes());
        }
        v
    }

    /// The FDP Configurations log page (LID 20h): one configuration, valid, one
    /// reclaim group, for `nnss` namespaces.
    pub fn configurations_log(&self, nnss: u32) -> Vec<u8> {
        let n = self.ruhs() as usize;
        let dsze = std::mem::size_of::<ConfigDescriptor>() + 4 * n;
        let desc = ConfigDescriptor {
            dsze: U16::new(dsze as u16),
            fdpa: fdpa::VALID,
            nrg: U32::new(1),
            nruh: U16::new(self.ruhs()),
            maxpids_z: U16::new(self.ruhs() - 1),
            nnss: U32::new(nnss),
            runs: U64::new(self.cfg.ru_size),
            ..FromZeros::new_zeroed()
        };
        let hdr = ConfigLogHeader {
            numfdpc_z: U16::new(0),
            sze: U32::new((std::mem::size_of::<ConfigLogHeader>() + dsze) as u32),
            ..Default::default()
        };
        let mut v = hdr.as_bytes().to_vec();
        v.extend_from_slice(desc.as_bytes());
        for _ in 0..n {
            v.extend_from_slice(&[ruht::INITIALLY_ISOLATED, 0, 0, 0]);
        }
        v
    }

    /// The Reclaim Unit Handle Usage log page (LID 21h): every handle is a
    /// namespace's placement handle, named by the host.
    pub fn usage_log(&self) -> Vec<u8> {
        let mut v = vec![0u8; 8];
        v[..2].copy_from_slice(&self.ruhs().to_le_bytes());
        for _ in 0..self.ruhs() {
            let mut d = [0u8; 8];
            d[0] = ruha::HOST_SPECIFIED;
            v.extend_from_slice(&d);
        }
        v
    }

    /// The FDP Statistics log page (LID 22h).
    pub fn statistics_log(&self) -> Vec<u8> {
        let w = self.host_written.load(Ordering::Relaxed);
        let s = Statistics {
            hbmw: [U64::new(w), U64::new(0)],
            mbmw: [U64::new(w), U64::new(0)],
            ..Default::default()
        };
        s.as_bytes().to_vec()
    }

    /// The FDP Events log page (LID 23h): host events, or (none happen here)
    /// controller events; `timestamp` turns a clock reading into the Timestamp
    /// feature's form.
    pub fn events_log(&self, host: bool, timestamp: impl Fn(u64) -> [u8; 8]) -> Vec<u8> {
        let ev = self.events();
        let records: Vec<Event> = if host {
            ev.log
                .iter()
                .map(|r| Event {
                    etype: r.etype,
                    // The handle (and its reclaim group, 0) is always named: LV.
                    flags: event_flags::NSIDV
                        | event_flags::LV
                        | if r.pid.is_some() { event_flags::PIV } else { 0 },
                    pid: U16::new(r.pid.unwrap_or(0)),
                    timestamp: timestamp(r.at_ns),
                    nsid: U32::new(r.nsid),
                    ruhid: U16::new(r.ruhid),
                    ..Default::default()
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut v = EventsHeader { nevents: U32::new(records.len() as u32), ..FromZeros::new_zeroed() }
            .as_bytes()
            .to_vec();
        for r in &records {
            v.extend_from_slice(r.as_bytes());
        }
        v
    }

    /// Get Features, FDP Events: up to `noet` of the event types placement handle
    /// `phndl` supports, two bytes each (the type, and bit 0 set if enabled); and
    /// how many.
    pub fn get_events(&self, phndl: u16, noet: u8) -> Result<(Vec<u8>, u32), &'static str> {
        let h = self.handle(phndl).ok_or("no such placement handle")?;
        let enabled = self.events().enabled[h as usize];
        let mut v = Vec::new();
        for (t, bit) in EVENT_TYPES.iter().take(noet as usize) {
            v.extend_from_slice(&[*t, (enabled & bit != 0) as u8]);
        }
        let n = (v.len() / 2) as u32;
        Ok((v, n))
    }

    /// Set Features, FDP Events: enables or disables `types` on placement handle
    /// `phndl`. A type this controller does not have is refused, and nothing changes.
    pub fn set_events(&self, phndl: u16, types: &[u8], enable: bool) -> Result<(), &'static str> {
        let h = self.handle(phndl).ok_or("no such placement handle")?;
        let mut mask = 0u8;
        for &t in types {
            mask |= event_bit(t).ok_or("an FDP event type this controller does not have")?;
        }
        let mut ev = self.events();
        let e = &mut ev.enabled[h as usize];
        *e = if enable { *e | mask } else { *e & !mask };
        Ok(())
    }

    pub fn save(&self) -> FdpSaved {
        let ev = self.events();
        FdpSaved {
            config: self.cfg,
            left: self.left.iter().map(|l| l.load(Ordering::Relaxed)).collect(),
            host_written: self.host_written.load(Ordering::Relaxed),
            enabled: ev.enabled.clone(),
            events: ev.log.iter().copied().collect(),
        }
    }

    /// Puts a checked ([`FdpSaved::check`]) record in place.
    pub fn restore(&self, s: &FdpSaved) {
        for (l, v) in self.left.iter().zip(&s.left) {
            l.store(*v, Ordering::Relaxed);
        }
        self.host_written.store(s.host_written, Ordering::Relaxed);
        let mut ev = self.events();
        ev.enabled.clone_from(&s.enabled);
        ev.log = s.events.iter().copied().collect();
    }
}

/// Endurance group 1's state, saved.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FdpSaved {
    pub config: FdpConfig,
    /// Bytes each handle's reclaim unit can still take.
    pub left: Vec<u64>,
    pub host_written: u64,
    /// Each handle's enabled event types (bits).
    pub enabled: Vec<u8>,
    pub events: Vec<EventRecord>,
}

impl FdpSaved {
    /// Why it cannot be restored into a controller with FDP as `cfg`, if it cannot.
    pub fn check(&self, cfg: FdpConfig) -> Result<(), String> {
        if self.config != cfg {
            return Err(format!("FDP {:?} in the state, {cfg:?} here", self.config));
        }
        let n = cfg.ruhs as usize;
        if self.left.len() != n || self.enabled.len() != n {
            return Err(format!("FDP state for {} handles, {n} here", self.left.len()));
        }
        if self.left.iter().any(|&l| l == 0 || l > cfg.ru_size) {
            return Err("a reclaim unit with more left than it holds".into());
        }
        let all = EVENT_TYPES.iter().fold(0, |m, (_, b)| m | b);
        if self.enabled.iter().any(|&e| e & !all != 0) {
            return Err("an FDP event type this controller does not have is enabled".into());
        }
        if self.events.len() > EVENT_LOG_ENTRIES
            || self.events.iter().any(|e| event_bit(e.etype).is_none() || e.ruhid >= cfg.ruhs)
        {
            return Err("FDP events this controller could not have recorded".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fdp() -> Fdp {
        Fdp::new(FdpConfig { ruhs: 4, ru_size: 1 << 20 })
    }

    fn ruamw(f: &Fdp, h: usize) -> u64 {
        let s = f.status(12, 0);
        let d = &s[16 + 32 * h..16 + 32 * (h + 1)];
        u64::from_le_bytes(d[8..16].try_into().unwrap())
    }

    #[test]
    fn writes_use_up_the_unit_their_placement_names_and_roll_over() {
        let f = fdp();
        assert_eq!(ruamw(&f, 1), 256);
        f.write(1, Placement::Pid(1), 8192, || 0);
        assert_eq!((ruamw(&f, 0), ruamw(&f, 1)), (256, 254));
        f.write(1, Placement::Default, 4096, || 0);
        assert_eq!(ruamw(&f, 0), 255);
        // 254 blocks left, 256 written: the unit fills and the next takes 2.
        f.write(1, Placement::Pid(1), 256 * 4096, || 0);
        assert_eq!(ruamw(&f, 1), 254);
        // Exactly what is left: the handle is on a fresh unit.
        f.write(1, Placement::Pid(1), 254 * 4096, || 0);
        assert_eq!(ruamw(&f, 1), 256);
        let st = f.statistics_log();
        let hbmw = u64::from_le_bytes(st[..8].try_into().unwrap());
        assert_eq!(hbmw, 8192 + 4096 + 256 * 4096 + 254 * 4096);
        assert_eq!(st[16..24], st[..8], "media bytes written = host bytes written");
    }

    #[test]
    fn an_invalid_pid_goes_to_handle_0_with_an_event_only_if_enabled() {
        let f = fdp();
        f.write(3, Placement::Pid(9), 4096, || 5);
        assert_eq!(ruamw(&f, 0), 255);
        assert_eq!(f.save().events, vec![]);
        f.set_events(0, &[event::INVALID_PID], true).unwrap();
        f.write(3, Placement::Pid(9), 4096, || 5);
        let e = f.save().events;
        assert_eq!(
            e,
            vec![EventRecord { etype: event::INVALID_PID, pid: Some(9), nsid: 3, ruhid: 0, at_ns: 5 }]
        );
    }

    #[test]
    fn an_update_moves_handles_and_reports_a_unit_left_unfilled() {
        let f = fdp();
        f.set_events(2, &[event::RU_NOT_FULLY_WRITTEN], true).unwrap();
        f.update(1, &[2], 7);
        assert!(f.save().events.is_empty(), "an empty unit moved: nothing to report");
        f.write(1, Placement::Pid(2), 4096, || 0);
        assert_eq!(f.check_pids(&[0, 4]), Err(4));
        f.update(1, &[2], 9);
        assert_eq!(ruamw(&f, 2), 256);
        let log = f.events_log(true, |ns| ns.to_le_bytes());
        assert_eq!(u32::from_le_bytes(log[..4].try_into().unwrap()), 1);
        let r = &log[64..128];
        assert_eq!(
            (r[0], r[1]),
            (event::RU_NOT_FULLY_WRITTEN, event_flags::PIV | event_flags::NSIDV | event_flags::LV)
        );
        assert_eq!(u64::from_le_bytes(r[4..12].try_into().unwrap()), 9);
        assert_eq!(u16::from_le_bytes(r[34..36].try_into().unwrap()), 2);
        assert_eq!(f.events_log(false, |_| [0; 8]).len(), 64, "no controller events");
    }

    #[test]
    fn the_event_log_keeps_the_newest_63() {
        let f = fdp();
        f.set_events(0, &[event::INVALID_PID], true).unwrap();
        for i in 0..70u64 {
            f.write(1, Placement::Pid(100), 512, || i);
        }
        let e = f.save().events;
        assert_eq!((e.len(), e[0].at_ns, e[62].at_ns), (63, 7, 69));
    }

    #[test]
    fn event_features_refuse_what_is_not_there() {
        let f = fdp();
        assert!(f.set_events(4, &[0], true).is_err());
        assert!(f.set_events(0, &[event::MEDIA_REALLOCATED], true).is_err());
        f.set_events(1, &[0, 3], true).unwrap();
        f.set_events(1, &[0], false).unwrap();
        assert_eq!(f.get_events(1, 255).unwrap(), (vec![0, 0, 3, 1], 2));
        assert_eq!(f.get_events(1, 1).unwrap(), (vec![0, 0], 1));
    }

    #[test]
    fn the_configuration_log_is_one_valid_configuration_of_the_handles() {
        let f = fdp();
        let v = f.configurations_log(1024);
        let sze = u32::from_le_bytes(v[4..8].try_into().unwrap()) as usize;
        assert_eq!(sze, v.len());
        assert_eq!(sze, 16 + 64 + 16);
        let d = &v[16..];
        assert_eq!(u16::from_le_bytes(d[..2].try_into().unwrap()), 64 + 16);
        assert_eq!(d[2], fdpa::VALID);
        assert_eq!(u32::from_le_bytes(d[4..8].try_into().unwrap()), 1, "NRG");
        assert_eq!(u16::from_le_bytes(d[8..10].try_into().unwrap()), 4, "NRUH");
        assert_eq!(u64::from_le_bytes(d[16..24].try_into().unwrap()), 1 << 20, "RUNS");
        assert_eq!(d[64], ruht::INITIALLY_ISOLATED);
    }

    #[test]
    fn saved_state_round_trips_and_is_checked() {
        let f = fdp();
        f.set_events(0, &[event::INVALID_PID], true).unwrap();
        f.write(1, Placement::Pid(7), 4096, || 3);
        f.write(1, Placement::Pid(2), 4096 * 3, || 3);
        let s = f.save();
        let g = fdp();
        s.check(g.config()).unwrap();
        g.restore(&s);
        assert_eq!(g.save(), s);
        assert!(s.check(FdpConfig { ruhs: 5, ru_size: 1 << 20 }).is_err());
        let mut bad = s.clone();
        bad.left[1] = 0;
        assert!(bad.check(g.config()).is_err());
        let mut bad = s;
        bad.enabled[0] = 0x80;
        assert!(bad.check(g.config()).is_err());
    }
}
