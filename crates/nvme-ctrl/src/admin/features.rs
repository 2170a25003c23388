//! Set Features and Get Features (Base §5.1.25, §5.1.11), and the feature values
//! the controller honours.

use nvme_spec::admin::{FeatureSelect, Features};
use nvme_spec::aer::{smart_info, AsyncEvent, EventType};
use nvme_spec::features::{
    capability, fid, host_behavior, Arbitration, AsyncEventConfig, ErrorRecovery, InterruptCoalescing,
    InterruptVectorConfig, NumberOfQueues, PowerManagement, TemperatureThreshold,
};
use nvme_spec::log::{critical_warning, lid};
use nvme_spec::{Sqe, Status};

use super::{status, Admin, AdminDone};
use crate::config::ControllerConfig;
use crate::engine::Settings;
use crate::error::{CmdResult, CommandError};
use crate::interrupt::Coalescing;

/// Default over-temperature threshold: the warning composite temperature (WCTEMP).
pub(crate) const WCTEMP_K: u16 = 343;
pub(crate) const CCTEMP_K: u16 = 358;

/// Current feature values (all volatile: nothing is saveable).
#[derive(Clone, Debug)]
pub(crate) struct FeatureState {
    defaults: Box<FeatureValues>,
    pub(crate) cur: FeatureValues,
    pub(crate) nsq_granted_z: u16,
    pub(crate) ncq_granted_z: u16,
    pub(crate) aec: AsyncEventConfig,
    /// A volatile write cache exists behind some namespace.
    pub(crate) vwc_present: bool,
    /// Host-set timestamp (ms) and the clock reading when it was set.
    pub(crate) timestamp: Option<(u64, u64)>,
    /// Clock reading at the last Controller Level Reset: an unset Timestamp counts
    /// from here (Base §5.1.25.1.13, Timestamp Origin 000b).
    pub(crate) reset_ns: u64,
    /// When the Keep Alive Timer expires (clock ns; None: stopped, KATO 0).
    pub(crate) keep_alive_until: Option<u64>,
}

/// The Keep Alive Timer's granularity (Identify Controller KAS, in 100 ms units):
/// a KATO is rounded up to a multiple of it.
pub(crate) const KAS_100MS: u16 = 1;

/// The value of each feature the controller keeps (what a saved state carries too).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FeatureValues {
    pub arbitration: u32,
    pub power_management: u32,
    /// Over and under thresholds of the composite temperature.
    pub temp_over: u16,
    pub temp_under: u16,
    pub error_recovery: u32,
    pub write_cache: bool,
    pub coalescing: u32,
    pub write_atomicity: u32,
    pub aec: u32,
    /// Host Behavior Support: Advanced Command Retry Enable (absent from a state
    /// saved before it existed: off).
    #[serde(default)]
    pub acre: bool,
    /// Keep Alive Timer (KATO), in ms; 0: off, the default over PCIe (absent from
    /// a state saved before it existed: off).
    #[serde(default)]
    pub kato_ms: u32,
}

impl FeatureState {
    /// The defaults of a controller of `cfg` that has a volatile write cache if
    /// `vwc_present` (`Capabilities::of`).
    pub(crate) fn new(cfg: &ControllerConfig, vwc_present: bool) -> Self {
        let defaults = FeatureValues {
            // AB = 7: no burst limit.
            arbitration: 7,
            power_management: 0,
            temp_over: WCTEMP_K,
            temp_under: 0,
            error_recovery: 0,
            write_cache: vwc_present,
            coalescing: 0,
            write_atomicity: 0,
            aec: 0,
            acre: false,
            kato_ms: 0,
        };
        let z = cfg.max_io_queues - 1;
        FeatureState {
            cur: defaults.clone(),
            defaults: Box::new(defaults),
            nsq_granted_z: z,
            ncq_granted_z: z,
            aec: AsyncEventConfig(0),
            vwc_present,
            timestamp: None,
            reset_ns: 0,
            keep_alive_until: None,
        }
    }

    /// Controller Level Reset at clock reading `now_ns`: every feature is volatile, so
    /// all return to their defaults.
    pub(crate) fn reset(&mut self, now_ns: u64) {
        self.cur = (*self.defaults).clone();
        self.aec = AsyncEventConfig(self.cur.aec);
        self.timestamp = None;
        self.reset_ns = now_ns;
        self.keep_alive_until = None;
    }

    /// Restarts the Keep Alive Timer at clock reading `now_ns` (a Keep Alive
    /// command, a new KATO); stopped while KATO is 0.
    pub(crate) fn restart_keep_alive(&mut self, now_ns: u64) {
        self.keep_alive_until = (self.cur.kato_ms > 0).then(|| now_ns + self.cur.kato_ms as u64 * 1_000_000);
    }

    /// The values the data path honours (page size and MDTS are filled in by the
    /// controller).
    pub(crate) fn engine_settings(&self) -> Settings {
        let ic = InterruptCoalescing(self.cur.coalescing);
        Settings::from_features(
            Arbitration(self.cur.arbitration).burst(),
            Coalescing { thr_z: ic.thr_z(), time: ic.time() },
            !self.vwc_present || self.cur.write_cache,
            self.cur.acre,
        )
    }
}

impl Admin<'_> {
    pub(crate) fn set_features(&mut self, sqe: &Sqe) -> CmdResult<AdminDone> {
        let f = Features(sqe);
        if f.fid() == fid::FDP {
            // Saved or not, it is what the configuration made it.
            return self.set_fdp(sqe);
        }
        if f.sv() {
            return status(Status::FEATURE_NOT_SAVEABLE);
        }
        if let Some(r) = self.set_resv_feature(sqe) {
            return r;
        }
        let v = f.value();
        let now = self.clock.now_ns();
        let cur = &mut self.admin.features.cur;
        let mut dw0 = 0;
        match f.fid() {
            fid::KEEP_ALIVE_TIMER => {
                // Rounded up to the granularity (KAS); the timer starts again.
                let unit = KAS_100MS as u32 * 100;
                cur.kato_ms = v.div_ceil(unit).saturating_mul(unit);
                self.admin.features.restart_keep_alive(now);
            }
            fid::ARBITRATION => cur.arbitration = v,
            fid::POWER_MANAGEMENT => {
                // NPSS = 0: power state 0 is the only one.
                if PowerManagement(v).ps() != 0 {
                    return Err(CommandError::InvalidField("power state above NPSS"));
                }
                cur.power_management = v;
            }
            fid::TEMPERATURE_THRESHOLD => {
                let t = TemperatureThreshold(v);
                if !matches!(t.tmpsel(), 0 | 0xf) {
                    return Err(CommandError::InvalidField("only the composite temperature has a sensor"));
                }
                match t.thsel() {
                    0 => cur.temp_over = t.tmpth(),
                    1 => cur.temp_under = t.tmpth(),
                    _ => return Err(CommandError::InvalidField("THSEL reserved value")),
                }
                self.check_temperature();
            }
            fid::ERROR_RECOVERY => {
                if ErrorRecovery(v).dulbe() {
                    // NSFEAT.DAE = 0: deallocated block errors are not supported.
                    return Err(CommandError::InvalidField("DULBE is not supported"));
                }
                cur.error_recovery = v;
            }
            fid::VOLATILE_WRITE_CACHE => {
                if !self.admin.features.vwc_present {
                    return Err(CommandError::InvalidField("no volatile write cache is present"));
                }
                cur.write_cache = v & 1 != 0;
            }
            fid::NUMBER_OF_QUEUES => {
                let n = NumberOfQueues(v);
                if n.nsqr_z() == u16::MAX || n.ncqr_z() == u16::MAX {
                    return Err(CommandError::InvalidField("65535 queues requested"));
                }
                if self.admin.io_queues_created {
                    return Err(CommandError::Sequence("Number of Queues set after I/O queues were created"));
                }
                // Allocated counts: all we have (the host uses min(requested, allocated)).
                let max_z = self.cfg.max_io_queues - 1;
                self.admin.features.nsq_granted_z = max_z;
                self.admin.features.ncq_granted_z = max_z;
                dw0 = NumberOfQueues::new(max_z, max_z).0;
            }
            fid::INTERRUPT_COALESCING => cur.coalescing = v & 0xffff,
            fid::INTERRUPT_VECTOR_CONFIG => {
                let c = InterruptVectorConfig(v);
                if c.iv() >= self.cfg.msix_vectors {
                    return Err(CommandError::InvalidField("interrupt vector out of range"));
                }
                if c.iv() == 0 && c.cd() {
                    // The admin vector is never coalesced; CD is accepted and moot.
                }
                self.runtime.set_vector_coalescing_disabled(self.engine, c.iv(), c.cd());
            }
            fid::WRITE_ATOMICITY_NORMAL => cur.write_atomicity = v & 1,
            fid::ASYNC_EVENT_CONFIG => {
                cur.aec = v;
                self.admin.features.aec = AsyncEventConfig(v);
                self.events.set_warning_events(AsyncEventConfig(v).critical_warnings());
            }
            fid::HOST_BEHAVIOR_SUPPORT => {
                // Only ACRE is supported; the other fields (ETDAS, LBAFEE, ...) read
                // back as 0, which tells the host they are not in effect.
                let data = self.copy_from_host(sqe, host_behavior::LEN)?;
                let acre = data[host_behavior::ACRE] & 1 != 0;
                self.admin.features.cur.acre = acre;
                tracing::info!(
                    acre,
                    "host behavior: advanced command retry {}",
                    if acre { "enabled" } else { "disabled" }
                );
            }
            fid::TIMESTAMP => {
                let data = self.copy_from_host(sqe, 8)?;
                let mut ms = [0u8; 8];
                ms[..6].copy_from_slice(&data[..6]);
                self.admin.features.timestamp = Some((u64::from_le_bytes(ms), self.clock.now_ns()));
            }
            // Only combination 0 of Identify CNS 1Ch exists.
            fid::IO_COMMAND_SET_PROFILE if v & 0x1ff != 0 => {
                return status(Status::IO_COMMAND_SET_COMBINATION_REJECTED.with_dnr())
            }
            fid::IO_COMMAND_SET_PROFILE => {}
            fid::FDP_EVENTS => {
                let fdp = self.fdp_of(f.nsid())?;
                let e = nvme_spec::fdp::EventsFeature(v);
                if e.noet() == 0 {
                    return Err(CommandError::InvalidField("no FDP event types given"));
                }
                let enable = sqe.cdw12.get() & 1 != 0;
                let types = self.copy_from_host(sqe, e.noet() as usize)?;
                fdp.set_events(e.phndl(), &types, enable).map_err(CommandError::InvalidField)?;
            }
            _ => return Err(CommandError::InvalidField("unsupported feature identifier")),
        }
        self.apply_settings();
        Ok(AdminDone::Complete(dw0))
    }

    pub(crate) fn get_features(&mut self, sqe: &Sqe) -> CmdResult<AdminDone> {
        if let Some(r) = self.get_resv_feature(sqe) {
            return r;
        }
        let f = Features(sqe);
        let fid_ = f.fid();
        let current = f.sel() == FeatureSelect::Current;
        let vals = match f.sel() {
            FeatureSelect::Current => self.admin.features.cur.clone(),
            FeatureSelect::Default | FeatureSelect::Saved => (*self.admin.features.defaults).clone(),
            FeatureSelect::SupportedCapabilities => {
                return match fid_ {
                    fid::ARBITRATION
                    | fid::POWER_MANAGEMENT
                    | fid::TEMPERATURE_THRESHOLD
                    | fid::ERROR_RECOVERY
                    | fid::NUMBER_OF_QUEUES
                    | fid::INTERRUPT_COALESCING
                    | fid::INTERRUPT_VECTOR_CONFIG
                    | fid::WRITE_ATOMICITY_NORMAL
                    | fid::ASYNC_EVENT_CONFIG
                    | fid::HOST_BEHAVIOR_SUPPORT
                    | fid::KEEP_ALIVE_TIMER
                    | fid::TIMESTAMP => Ok(AdminDone::Complete(capability::CHANGEABLE)),
                    fid::VOLATILE_WRITE_CACHE if self.admin.features.vwc_present => {
                        Ok(AdminDone::Complete(capability::CHANGEABLE))
                    }
                    fid::VOLATILE_WRITE_CACHE | fid::IO_COMMAND_SET_PROFILE => Ok(AdminDone::Complete(0)),
                    fid::FDP if self.admin.fdp.is_some() => Ok(AdminDone::Complete(0)),
                    fid::FDP_EVENTS if self.admin.fdp.is_some() => {
                        Ok(AdminDone::Complete(capability::CHANGEABLE | capability::NAMESPACE_SPECIFIC))
                    }
                    _ => Err(CommandError::InvalidField("unsupported feature identifier")),
                };
            }
            FeatureSelect::Reserved(_) => return Err(CommandError::InvalidField("SEL reserved value")),
        };
        let dw0 = match fid_ {
            fid::ARBITRATION => vals.arbitration,
            fid::POWER_MANAGEMENT => vals.power_management,
            fid::TEMPERATURE_THRESHOLD => {
                let t = TemperatureThreshold(f.value());
                if !matches!(t.tmpsel(), 0 | 0xf) {
                    return Err(CommandError::InvalidField("only the composite temperature has a sensor"));
                }
                let th = match t.thsel() {
                    0 => vals.temp_over,
                    1 => vals.temp_under,
                    _ => return Err(CommandError::InvalidField("THSEL reserved value")),
                };
                th as u32 | (f.value() & 0x003f_0000)
            }
            fid::ERROR_RECOVERY => vals.error_recovery,
            fid::VOLATILE_WRITE_CACHE => (self.admin.features.vwc_present && vals.write_cache) as u32,
            fid::NUMBER_OF_QUEUES => {
                NumberOfQueues::new(self.admin.features.nsq_granted_z, self.admin.features.ncq_granted_z).0
            }
            fid::INTERRUPT_COALESCING => vals.coalescing,
            fid::INTERRUPT_VECTOR_CONFIG => {
                let iv = InterruptVectorConfig(f.value()).iv();
                if iv >= self.cfg.msix_vectors {
                    return Err(CommandError::InvalidField("interrupt vector out of range"));
                }
                // The admin vector is never coalesced, so it always reads CD = 1; the
                // other vectors default to CD = 0.
                let cd = iv == 0 || (current && self.engine.vector_coalescing_disabled(iv));
                iv as u32 | ((cd as u32) << 16)
            }
            fid::WRITE_ATOMICITY_NORMAL => vals.write_atomicity,
            fid::KEEP_ALIVE_TIMER => vals.kato_ms,
            fid::IO_COMMAND_SET_PROFILE => 0,
            fid::ASYNC_EVENT_CONFIG => vals.aec,
            fid::HOST_BEHAVIOR_SUPPORT => {
                let mut data = [0u8; host_behavior::LEN];
                data[host_behavior::ACRE] = vals.acre as u8;
                self.copy_to_host(sqe, &data)?;
                0
            }
            fid::TIMESTAMP => {
                let data = self.timestamp_at(self.clock.now_ns());
                self.copy_to_host(sqe, &data)?;
                0
            }
            fid::FDP => {
                if self.admin.fdp.is_none() {
                    return Err(CommandError::InvalidField("Flexible Data Placement is not offered"));
                }
                if f.value() as u16 != crate::fdp::ENDGID {
                    return Err(CommandError::InvalidField("no such endurance group"));
                }
                // Enabled, in configuration 0 (the only one).
                nvme_spec::fdp::feature::FDPE
            }
            fid::FDP_EVENTS => {
                let fdp = self.fdp_of(f.nsid())?;
                let e = nvme_spec::fdp::EventsFeature(f.value());
                let (data, n) = fdp.get_events(e.phndl(), e.noet()).map_err(CommandError::InvalidField)?;
                self.copy_to_host(sqe, &data)?;
                n
            }
            _ => return Err(CommandError::InvalidField("unsupported feature identifier")),
        };
        Ok(AdminDone::Complete(dw0))
    }

    /// The controller's time at clock reading `at_ns` as the Timestamp feature gives
    /// it: milliseconds (48 bits) from what the host set, or since the last reset if
    /// it set none (origin 0).
    pub(crate) fn timestamp_at(&self, at_ns: u64) -> [u8; 8] {
        let (ms, origin) = match self.admin.features.timestamp {
            Some((ms, at)) => (super::timestamp_now(ms, at, at_ns), 1u8),
            None => (at_ns.saturating_sub(self.admin.features.reset_ns) / 1_000_000, 0u8),
        };
        let mut data = [0u8; 8];
        data[..6].copy_from_slice(&ms.to_le_bytes()[..6]);
        data[6] = origin << 1;
        data
    }

    /// Set Features, Flexible Data Placement: the configuration fixed it (enabled,
    /// configuration 0) and the endurance group has namespaces, so only what is in
    /// effect may be set again.
    fn set_fdp(&mut self, sqe: &Sqe) -> CmdResult<AdminDone> {
        if self.admin.fdp.is_none() {
            return Err(CommandError::InvalidField("Flexible Data Placement is not offered"));
        }
        if Features(sqe).value() as u16 != crate::fdp::ENDGID {
            return Err(CommandError::InvalidField("no such endurance group"));
        }
        let v = sqe.cdw12.get();
        let fdpe = v & nvme_spec::fdp::feature::FDPE != 0;
        if !fdpe || nvme_spec::fdp::feature::config_index(v) != 0 {
            return Err(CommandError::Sequence("FDP changed while the endurance group has namespaces"));
        }
        Ok(AdminDone::Complete(0))
    }

    /// Compares the composite temperature with the thresholds; sets or clears the
    /// SMART temperature warning and raises the SMART / Health event when enabled.
    pub(crate) fn check_temperature(&mut self) {
        let t = self.cfg.temperature_k;
        let cur = &self.admin.features.cur;
        let over = t > cur.temp_over || (cur.temp_under != 0 && t < cur.temp_under);
        let was = self.events.critical_warning() & critical_warning::TEMPERATURE != 0;
        self.events.set_critical_warning(critical_warning::TEMPERATURE, over);
        if over && !was && self.admin.features.aec.critical_warnings() & critical_warning::TEMPERATURE != 0 {
            self.events.raise(AsyncEvent {
                kind: EventType::SmartHealth,
                info: smart_info::TEMPERATURE_THRESHOLD,
                log_page: lid::SMART_HEALTH,
            });
        }
    }

    /// FDP of namespace `nsid` (FDP Events is per namespace), or why not.
    fn fdp_of(&self, nsid: u32) -> CmdResult<std::sync::Arc<crate::fdp::Fdp>> {
        let ns = self.active_ns(nsid)?;
        match (&self.admin.fdp, &ns.placement) {
            (Some(f), Some(_)) => Ok(f.clone()),
            (Some(_), None) => Err(CommandError::InvalidField("the namespace has no placement handles")),
            (None, _) => Err(CommandError::InvalidField("Flexible Data Placement is not offered")),
        }
    }
}
