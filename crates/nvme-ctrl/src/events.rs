//! Asynchronous events and the Error Information log, shared by the admin side
//! (which answers Asynchronous Event Requests and Get Log Page) and the I/O side
//! (which reports invalid doorbells and failed commands). Off the hot path: a mutex.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use nvme_spec::aer::{smart_info, AsyncEvent, EventType};
use nvme_spec::log::{critical_warning, lid, ErrorInformationEntry};
use nvme_spec::Status;
use serde::{Deserialize, Serialize};
use zerocopy::little_endian::{U16, U32, U64};

/// Entries the Error Information log keeps (Identify ELPE + 1).
pub const ERROR_LOG_ENTRIES: usize = 64;

#[derive(Debug, Default)]
struct Inner {
    /// Newest first, as Get Log Page returns them.
    errors: VecDeque<ErrorInformationEntry>,
    error_count: u64,
    /// Events raised and not yet reported.
    queued: VecDeque<AsyncEvent>,
    /// Event types reported and not yet cleared by reading their log page (bit = type).
    masked: u8,
    /// Namespaces whose attributes changed since the host last read the list.
    changed_ns: Vec<u32>,
    /// SMART / Health critical warning bits currently set.
    critical_warning: u8,
    /// Critical warning bits for which the host enabled a SMART / Health event
    /// (Asynchronous Event Configuration, bits 7:0).
    warning_events: u8,
}

/// Called when an event is raised, so a transport can wake its admin side.
pub type Notifier = Box<dyn Fn() + Send + Sync>;

/// Shared event state.
#[derive(Default)]
pub struct Events {
    inner: Mutex<Inner>,
    /// Some event is queued (set under the lock whenever the queue changes): the
    /// admin side looks for one to deliver without taking the lock when none is.
    any_queued: AtomicBool,
    notifier: std::sync::OnceLock<Notifier>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

impl Events {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds an Error Information log entry for a failed command.
    pub fn record_error(&self, sqid: u16, cid: u16, status: Status, nsid: u32, lba: u64) {
        let mut g = self.lock();
        // Base: the count never reads 0h (an invalid entry); past FFFFFFFFFFFFFFFFh
        // it goes on from 1h.
        g.error_count = g.error_count.checked_add(1).unwrap_or(1);
        let e = ErrorInformationEntry {
            error_count: U64::new(g.error_count),
            sqid: U16::new(sqid),
            cid: U16::new(cid),
            status: U16::new(status.raw() << 1),
            parameter_error_location: U16::new(0xffff),
            lba: U64::new(lba),
            nsid: U32::new(nsid),
            ..Default::default()
        };
        g.errors.push_front(e);
        g.errors.truncate(ERROR_LOG_ENTRIES);
    }

    /// The state a hand-over carries (`state.rs`).
    pub(crate) fn save(&self) -> EventsSaved {
        use zerocopy::IntoBytes;
        let g = self.lock();
        EventsSaved {
            errors: g.errors.iter().map(|e| crate::saved::hex(e.as_bytes())).collect(),
            error_count: g.error_count,
            queued: g.queued.iter().map(|e| e.dw0()).collect(),
            masked: g.masked,
            changed_ns: g.changed_ns.clone(),
            critical_warning: g.critical_warning,
            warning_events: g.warning_events,
        }
    }

    /// Puts a checked saved state back ([`EventsSaved::check`]).
    pub(crate) fn restore(&self, c: EventsChecked) {
        let EventsChecked { saved: s, queued, errors } = c;
        let mut g = self.lock();
        g.errors = errors.into();
        g.errors.truncate(ERROR_LOG_ENTRIES);
        g.error_count = s.error_count;
        g.queued = queued.into();
        self.any_queued.store(!g.queued.is_empty(), Ordering::Release);
        g.masked = s.masked;
        g.changed_ns = s.changed_ns;
        g.critical_warning = s.critical_warning;
        g.warning_events = s.warning_events;
    }

    /// Total errors recorded since reset (the newest entry's Error Count).
    pub fn error_count(&self) -> u64 {
        self.lock().error_count
    }

    /// The Error Information log, newest first.
    pub fn error_log(&self) -> Vec<ErrorInformationEntry> {
        self.lock().errors.iter().copied().collect()
    }

    /// Queues an event for the next Asynchronous Event Request (duplicates of an event
    /// already waiting are dropped).
    pub fn raise(&self, ev: AsyncEvent) {
        {
            let mut g = self.lock();
            if g.queued.contains(&ev) {
                return;
            }
            g.queued.push_back(ev);
            self.any_queued.store(true, Ordering::Release);
        }
        if let Some(n) = self.notifier.get() {
            n();
        }
    }

    /// Installs the function called whenever an event is raised (once).
    pub fn set_notifier(&self, n: Notifier) -> Result<(), Notifier> {
        self.notifier.set(n)
    }

    /// Takes the oldest event whose type is not masked, and masks its type until the
    /// host reads the log page (Base §5.1.2: events of a type are not reported again
    /// until the associated log page is read).
    pub fn take_deliverable(&self) -> Option<AsyncEvent> {
        if !self.any_queued.load(Ordering::Acquire) {
            return None;
        }
        let mut g = self.lock();
        let masked = g.masked;
        let idx = g.queued.iter().position(|e| masked & (1 << e.kind as u8) == 0)?;
        let ev = g.queued.remove(idx)?;
        self.any_queued.store(!g.queued.is_empty(), Ordering::Release);
        g.masked |= 1 << ev.kind as u8;
        Some(ev)
    }

    /// Some event is queued (whether or not its type is masked now).
    pub fn any_queued(&self) -> bool {
        self.any_queued.load(Ordering::Acquire)
    }

    /// The host read log page `log_id` without Retain Asynchronous Event: unmask the
    /// event type that page clears.
    pub fn log_read(&self, log_id: u8) {
        let kind = match log_id {
            lid::ERROR_INFORMATION => EventType::ErrorStatus,
            lid::SMART_HEALTH => EventType::SmartHealth,
            lid::CHANGED_NAMESPACE_LIST | lid::CHANGED_ZONE_LIST | lid::ANA => EventType::Notice,
            nvme_spec::resv::LID_NOTIFICATION => EventType::IoCommandSpecific,
            _ => return,
        };
        let mut g = self.lock();
        g.masked &= !(1 << kind as u8);
        if log_id == lid::CHANGED_NAMESPACE_LIST {
            g.changed_ns.clear();
        }
    }

    /// Records that namespace `nsid` changed. The list stays in increasing order, as
    /// the Changed Namespace List log page reports it (Base §5.1.12.1.5).
    pub fn namespace_changed(&self, nsid: u32) {
        let mut g = self.lock();
        if let Err(pos) = g.changed_ns.binary_search(&nsid) {
            g.changed_ns.insert(pos, nsid);
        }
    }

    pub fn changed_namespaces(&self) -> Vec<u32> {
        self.lock().changed_ns.clone()
    }

    pub fn set_critical_warning(&self, bits: u8, on: bool) {
        let mut g = self.lock();
        if on {
            g.critical_warning |= bits;
        } else {
            g.critical_warning &= !bits;
        }
    }

    /// Sets critical warning `bits` (they stay set: media does not heal) and, for
    /// bits newly set that the host asked to hear about, raises a SMART / Health
    /// event (NVM Subsystem Reliability, or the temperature code for that bit).
    pub fn raise_critical_warning(&self, bits: u8) {
        let fresh = {
            let mut g = self.lock();
            let fresh = bits & !g.critical_warning & g.warning_events;
            g.critical_warning |= bits;
            fresh
        };
        if fresh != 0 {
            let info = if fresh == critical_warning::TEMPERATURE {
                smart_info::TEMPERATURE_THRESHOLD
            } else if fresh == critical_warning::SPARE {
                smart_info::SPARE_BELOW_THRESHOLD
            } else {
                smart_info::NVM_SUBSYSTEM_RELIABILITY
            };
            self.raise(AsyncEvent { kind: EventType::SmartHealth, info, log_page: lid::SMART_HEALTH });
        }
    }

    /// The critical warning bits the host enabled events for (Set Features,
    /// Asynchronous Event Configuration).
    pub fn set_warning_events(&self, bits: u8) {
        self.lock().warning_events = bits;
    }

    pub fn critical_warning(&self) -> u8 {
        self.lock().critical_warning
    }

    /// Forgets queued events and masks (controller reset). The error log survives.
    pub fn reset(&self) {
        let mut g = self.lock();
        g.queued.clear();
        self.any_queued.store(false, Ordering::Release);
        g.masked = 0;
        // Asynchronous Event Configuration returns to its default: no events.
        g.warning_events = 0;
    }
}

/// Most events a restored controller may have queued: one per event type and
/// information value it can raise is far fewer.
const MAX_QUEUED_EVENTS: usize = 256;

/// A saved events part, decoded.
#[derive(Debug)]
pub(crate) struct EventsChecked {
    saved: EventsSaved,
    queued: Vec<AsyncEvent>,
    errors: Vec<ErrorInformationEntry>,
}

impl EventsSaved {
    /// Decodes the queued events and the error log, refusing what a controller with
    /// `nn` NSIDs could not hold.
    pub(crate) fn check(&self, nn: u32) -> Result<EventsChecked, String> {
        use zerocopy::FromBytes;
        if self.queued.len() > MAX_QUEUED_EVENTS {
            return Err(format!("{} events queued", self.queued.len()));
        }
        let mut queued = Vec::with_capacity(self.queued.len());
        for &dw0 in &self.queued {
            let kind = event_type(dw0 as u8 & 7).ok_or_else(|| format!("event {dw0:#x}"))?;
            queued.push(AsyncEvent { kind, info: (dw0 >> 8) as u8, log_page: (dw0 >> 16) as u8 });
        }
        if self.errors.len() > ERROR_LOG_ENTRIES {
            return Err(format!("{} error log entries", self.errors.len()));
        }
        let mut errors = Vec::with_capacity(self.errors.len());
        for e in &self.errors {
            let b = crate::saved::unhex(e, 64).map_err(|why| format!("error log entry: {why}"))?;
            errors
                .push(ErrorInformationEntry::read_from_bytes(&b).map_err(|_| "error log entry".to_string())?);
        }
        let ns = &self.changed_ns;
        if ns.len() > 1024
            || ns.windows(2).any(|w| w[0] >= w[1])
            || ns.iter().any(|&n| n == 0 || n > nn.max(1))
        {
            return Err(format!("changed namespace list {ns:?}"));
        }
        Ok(EventsChecked { saved: self.clone(), queued, errors })
    }
}

/// The event type of an Asynchronous Event's type field, if it names one.
fn event_type(v: u8) -> Option<EventType> {
    Some(match v {
        0 => EventType::ErrorStatus,
        1 => EventType::SmartHealth,
        2 => EventType::Notice,
        3 => EventType::Immediate,
        4 => EventType::OneShot,
        6 => EventType::IoCommandSpecific,
        7 => EventType::VendorSpecific,
        _ => return None,
    })
}

/// The events' part of a saved controller state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EventsSaved {
    /// Error Information log entries, newest first, each as 128 hex digits.
    pub errors: Vec<String>,
    pub error_count: u64,
    /// Events raised and not yet reported: completion dword 0 of each.
    pub queued: Vec<u32>,
    pub masked: u8,
    pub changed_ns: Vec<u32>,
    pub critical_warning: u8,
    pub warning_events: u8,
}
