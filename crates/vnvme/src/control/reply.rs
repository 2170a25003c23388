//! The control methods' answers as types: the server builds them, `vnvme ctl` (and
//! `vnvme ctl upgrade`) reads them back, so a field is named in one place. Sizes
//! are bytes; a time's unit is in its name.

use serde::{Deserialize, Serialize};

/// What never changes while a server runs (part of `ctrl.info`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Facts {
    pub vnvme: String,
    pub commit: String,
    pub serial: String,
    /// `--cntlid`: this controller's ID in a subsystem of several (docs/subsystems.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cntlid: Option<u16>,
    /// `vendor:device`, hex.
    pub pci_id: String,
    pub socket: std::path::PathBuf,
    pub io_queues: u16,
    pub workers: usize,
    pub poll: String,
    pub doorbells: String,
    pub shadow_doorbells: bool,
    pub sandbox: bool,
    pub client_deadline_ms: u64,
    pub max_dma_regions: usize,
    pub pid: u32,
    pub exe: std::path::PathBuf,
    pub log_format: String,
    /// Under `--restart-on-crash`: the keeper, and how many times it has started a
    /// serving process to stand in for one that died.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keeper: Option<KeeperFacts>,
}

/// `ctrl.info`'s `keeper`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KeeperFacts {
    pub pid: u32,
    pub restarts: u32,
}

/// `ctrl.info`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CtrlInfo {
    #[serde(flatten)]
    pub facts: Facts,
    /// "disabled", "ready", "shut-down" or "fatal".
    pub state: String,
    pub client_connected: bool,
    pub namespaces: usize,
    pub max_namespaces: u32,
    pub dma_regions: usize,
    pub uptime_s: u64,
    pub log_filter: String,
    /// Under `--restart-on-crash`: the keeper is gone (died or killed), and
    /// nothing stands in for this process if it dies. Absent otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keeper_lost: bool,
}

/// One namespace (`ns.list`, `ns.add`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NsInfo {
    pub nsid: u32,
    /// The backend's description.
    pub backend: String,
    pub size: u64,
    pub lba_size: u64,
    pub blocks: u64,
    /// The command timeout; none: commands never time out.
    pub timeout_ms: Option<u64>,
    pub volatile_cache: bool,
    pub discard: bool,
    pub write_zeroes: bool,
    /// The `--ns` text it was made from.
    pub spec: Option<String>,
}

/// `ns.list`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NsList {
    pub namespaces: Vec<NsInfo>,
}

/// `ns.remove`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NsRemoved {
    pub nsid: u32,
}

/// `ns.resize`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NsResized {
    pub nsid: u32,
    pub old_size: u64,
    pub size: u64,
}

/// `pool.info`: the namespace pool as every controller of the subsystem shares it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolInfo {
    pub path: String,
    /// Bytes its namespaces may take together (TNVMCAP).
    pub capacity: u64,
    /// Bytes left (UNVMCAP).
    pub unallocated: u64,
    /// The CNTLIDs of the controllers that have opened it.
    pub controllers: Vec<u16>,
    /// This controller's.
    pub this_controller: u16,
    pub namespaces: Vec<PoolNs>,
}

/// One namespace of the pool.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolNs {
    pub nsid: u32,
    pub size: u64,
    pub lba_size: u64,
    pub shared: bool,
    pub ana_group: u32,
    /// The controllers it is attached to.
    pub attached: Vec<u16>,
}

/// `ns.create`, `ns.attach`, `ns.detach`, `ns.delete`: the namespace after.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolChanged {
    pub nsid: u32,
    /// What was done: created, attached, detached or deleted.
    pub done: String,
    /// The controllers it is attached to now.
    pub attached: Vec<u16>,
}

/// `pool.forget`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolForgot {
    pub cntlid: u16,
    /// The namespaces that were attached to it.
    pub detached: Vec<u32>,
}

/// `zone.fail`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ZoneFailed {
    pub nsid: u32,
    pub zslba: u64,
    /// `read-only` or `offline`.
    pub state: String,
    /// False: the zone was in that state already.
    pub changed: bool,
}

/// `ana.set`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AnaSet {
    /// The state set, as Linux's sysfs names it.
    pub state: String,
    /// The group asked for (none: every group).
    pub group: Option<u32>,
    /// The groups whose state changed.
    pub changed: Vec<u32>,
}

/// One ANA group with namespaces (`ana.get`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AnaGroup {
    pub group: u32,
    pub state: String,
    pub nsids: Vec<u32>,
}

/// `ana.get` (no groups: ANA is not reported, the controller is not of a
/// subsystem).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AnaGet {
    pub groups: Vec<AnaGroup>,
}

/// One QoS limit: per second, and the burst allowed above it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Rate {
    pub rate: u64,
    pub burst: u64,
}

/// A set of QoS limits (none: no limit of that kind).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    pub iops: Option<Rate>,
    pub iops_rd: Option<Rate>,
    pub iops_wr: Option<Rate>,
    pub bps: Option<Rate>,
    pub bps_rd: Option<Rate>,
    pub bps_wr: Option<Rate>,
}

impl Limits {
    /// Each kind with its name, in a fixed order.
    pub fn all(&self) -> [(&'static str, Option<Rate>); 6] {
        [
            ("iops", self.iops),
            ("iops_rd", self.iops_rd),
            ("iops_wr", self.iops_wr),
            ("bps", self.bps),
            ("bps_rd", self.bps_rd),
            ("bps_wr", self.bps_wr),
        ]
    }
}

impl From<&nvme_ctrl::qos::QosLimits> for Limits {
    fn from(l: &nvme_ctrl::qos::QosLimits) -> Limits {
        let one = |x: Option<nvme_ctrl::qos::Limit>| x.map(|l| Rate { rate: l.rate, burst: l.burst() });
        Limits {
            iops: one(l.iops),
            iops_rd: one(l.read_iops),
            iops_wr: one(l.write_iops),
            bps: one(l.bps),
            bps_rd: one(l.read_bps),
            bps_wr: one(l.write_bps),
        }
    }
}

/// `qos.set`: the namespace (with its group, if any) or the group changed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QosSet {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nsid: Option<u32>,
    pub group: Option<String>,
    pub limits: Option<Limits>,
}

/// One namespace in `qos.get`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QosNamespace {
    pub nsid: u32,
    pub group: Option<String>,
    pub limits: Option<Limits>,
    pub throttled_commands: u64,
    /// Time its commands were held back in all.
    pub throttled_s: f64,
}

/// One named group in `qos.get`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QosGroup {
    pub group: String,
    pub limits: Limits,
}

/// `qos.get`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QosGet {
    pub namespaces: Vec<QosNamespace>,
    pub groups: Vec<QosGroup>,
}

/// `log.set`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LogSet {
    pub filter: String,
    pub previous: String,
}

/// One kind of command of a namespace in `stats.get`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OpStats {
    pub commands: u64,
    pub bytes: u64,
    pub errors: u64,
    /// Submission to completion, averaged, to 0.1 us.
    pub latency_avg_us: f64,
}

/// One namespace in `stats.get`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NsStats {
    pub nsid: u32,
    pub read: OpStats,
    pub write: OpStats,
    pub flush: OpStats,
    pub other: OpStats,
    pub throttled_commands: u64,
    pub throttled_s: f64,
    /// The storage behind a namespace whose backend can lose it (nbd://, rbd:);
    /// absent for the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageStats>,
}

/// A namespace's storage in `stats.get`: whether it is there, what waits for it,
/// its outages.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StorageStats {
    /// "up", "waiting" (lost: commands wait, within the hold) or "gone" (past the
    /// hold: commands fail Namespace Not Ready until it is back).
    pub state: String,
    /// Commands waiting for it now.
    pub waiting: u64,
    pub outages: u64,
    /// Outages that outlasted the hold.
    pub outages_past_hold: u64,
    /// Their total length, until the storage was back or the hold ran out.
    pub outage_s: f64,
}

/// One I/O queue pair in `stats.get` (doorbell writes: trapped ones): the
/// controller's own snapshot of it, serialised as it is.
pub use nvme_ctrl::QueueSnapshot as QueueStats;

/// One I/O worker thread in `stats.get`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerStats {
    pub worker: usize,
    pub sleeps: u64,
    pub wakeups: u64,
    pub spin_hits: u64,
    pub spin_misses: u64,
    pub spin_contended: u64,
    pub spin_ns: u64,
    pub spin_lost_ns: u64,
}

/// CPU per command adaptive polling measured in each regime (none: not yet).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PollCost {
    pub sleep: Option<u64>,
    pub spin: Option<u64>,
}

/// Adaptive polling's verdict in `stats.get`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AdaptivePoll {
    pub choice: String,
    pub running: String,
    pub cpu_per_command_ns: PollCost,
    pub epochs: u64,
    pub changes: u64,
}

/// `stats.get`: one scrape of the controller.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub controller: nvme_ctrl::StatsSnapshot,
    pub namespaces: Vec<NsStats>,
    pub queues: Vec<QueueStats>,
    pub workers: Vec<WorkerStats>,
    /// None with `--poll off` or `always`.
    pub adaptive_poll: Option<AdaptivePoll>,
}
