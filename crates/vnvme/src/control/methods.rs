//! The control methods (docs/CONTROL.md): parameters checked strictly (an unknown
//! parameter is an error, so a typo never passes silently), device work handed to
//! the server thread as a job.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use nvme_ctrl::qos::{Limit, QosGroup, QosLimits};
use serde_json::Value;
use vfio_user_server::jobs::{DeviceJobs, JobError};
use vfio_user_server::Device;

use super::api::{
    AnaSet, FailedZoneState, LogSet, NoParams, NsAdd, NsAttach, NsCreate, NsDelete, NsRemove, NsResize,
    QosGet, QosSet, Request, Size, ZoneFail,
};
use super::{code, reply, RpcError, JOB_LIMIT};
use crate::nsspec::NsSpec;

/// What the methods reach.
#[derive(Debug)]
pub struct Context {
    pub jobs: Arc<DeviceJobs>,
    pub stats: Arc<nvme_ctrl::Stats>,
    /// What does not change while the server runs (serial, PCI ID, queues, ...).
    pub facts: reply::Facts,
    /// The `--ns` text each namespace was made from, by NSID.
    pub specs: Mutex<BTreeMap<u32, String>>,
    /// What the sandbox allows, when it is on: what ns.add may open.
    pub sandbox: Option<crate::sandbox::Needs>,
    /// Named QoS groups (qos.set with a group), shared by the namespaces in them.
    pub groups: Mutex<BTreeMap<String, Arc<QosGroup>>>,
    pub started: Instant,
    /// How the files of a namespace added here are locked.
    pub locks: file_lock::Policy,
    /// What handing this server over to a new process takes.
    pub upgrade: crate::upgrade::Source,
}

impl Context {
    /// What handing the server over reads of it.
    pub fn running(&self) -> crate::upgrade::Running<'_> {
        crate::upgrade::Running {
            jobs: &self.jobs,
            specs: &self.specs,
            groups: &self.groups,
            source: &self.upgrade,
        }
    }
}

/// Runs `req`.
pub fn call(ctx: &Context, req: Request) -> Result<Value, RpcError> {
    // What a stand-in after a crash keeps (`--restart-on-crash`): journaled before
    // the operator hears it is done.
    let kept =
        matches!(req, Request::NsAdd(_) | Request::NsRemove(_) | Request::NsResize(_) | Request::QosSet(_));
    let r = dispatch(ctx, req);
    if kept && r.is_ok() {
        let specs = ctx.specs.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let groups = ctx.groups.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Err(e) = job(ctx, move |d| crate::handed::journal(d, &specs, &groups)) {
            tracing::warn!(
                "the keeper's journal does not have this change ({}): a crash would lose it",
                e.message
            );
        }
    }
    r
}

fn dispatch(ctx: &Context, req: Request) -> Result<Value, RpcError> {
    match req {
        Request::CtrlInfo(NoParams {}) => ctrl_info(ctx),
        Request::NsList(NoParams {}) => ns_list(ctx),
        Request::NsAdd(a) => ns_add(ctx, a),
        Request::NsRemove(r) => ns_remove(ctx, r),
        Request::NsResize(r) => ns_resize(ctx, r),
        Request::ZoneFail(r) => zone_fail(ctx, r),
        Request::AnaSet(a) => ana_set(ctx, a),
        Request::PoolInfo(NoParams {}) => pool_info(ctx),
        Request::NsCreate(c) => ns_create(ctx, c),
        Request::NsDelete(NsDelete { nsid }) => {
            pool_change(ctx, nsid, "deleted", move |p, _| Ok(p.delete(nsid).map(drop)?))
        }
        Request::NsAttach(a) => {
            let nsid = a.nsid;
            pool_change(ctx, nsid, "attached", move |p, this| Ok(p.attach(nsid, &controllers(&a, this)?)?))
        }
        Request::NsDetach(a) => {
            let nsid = a.nsid;
            pool_change(ctx, nsid, "detached", move |p, this| Ok(p.detach(nsid, &controllers(&a, this)?)?))
        }
        Request::PoolForget(f) => pool_forget(ctx, f),
        Request::AnaGet(NoParams {}) => ana_get(ctx),
        Request::StatsGet(NoParams {}) => stats_get(ctx),
        Request::QosSet(q) => qos_set(ctx, q),
        Request::QosGet(q) => qos_get(ctx, q),
        Request::LogSet(l) => log_set(l),
        Request::UpgradePrepare(NoParams {}) => crate::upgrade::prepare(&ctx.running()),
    }
}

/// Runs `f` on the device thread.
fn job<T: Send + 'static>(
    ctx: &Context,
    f: impl FnOnce(&mut Device) -> T + Send + 'static,
) -> Result<T, RpcError> {
    ctx.jobs.run(JOB_LIMIT, f).map_err(|e| match e {
        JobError::Timeout(_) | JobError::Full => RpcError::new(code::BUSY, e.to_string()),
        JobError::Gone => RpcError::new(code::INTERNAL_ERROR, e.to_string()),
    })
}

fn ctrl_info(ctx: &Context) -> Result<Value, RpcError> {
    let facts = ctx.facts.clone();
    let (uptime_s, log_filter) = (ctx.started.elapsed().as_secs(), crate::logging::filter());
    let info = job(ctx, move |d| reply::CtrlInfo {
        facts,
        state: crate::metrics::state_name(d.ctrl.lifecycle()).into(),
        client_connected: d.client_connected(),
        namespaces: d.ctrl.namespaces().count(),
        max_namespaces: d.ctrl.max_namespaces(),
        dma_regions: d.dma_regions(),
        uptime_s,
        log_filter,
        keeper_lost: d.keeper_lost(),
    })?;
    answer(&info)
}

/// A reply as the result's JSON.
fn answer<T: serde::Serialize>(r: &T) -> Result<Value, RpcError> {
    serde_json::to_value(r).map_err(|e| RpcError::new(code::INTERNAL_ERROR, e.to_string()))
}

/// One namespace as the methods report it.
fn ns_info(ns: &nvme_ctrl::Namespace, spec: Option<String>) -> reply::NsInfo {
    reply::NsInfo {
        nsid: ns.nsid,
        backend: ns.info.kind.clone(),
        size: ns.size(),
        lba_size: 1u64 << ns.lba_shift(),
        blocks: ns.nsze(),
        timeout_ms: (ns.timeout_ns > 0).then_some(ns.timeout_ns / 1_000_000),
        volatile_cache: ns.info.volatile_cache,
        discard: ns.info.discard,
        write_zeroes: ns.info.write_zeroes,
        spec,
    }
}

fn ns_list(ctx: &Context) -> Result<Value, RpcError> {
    let specs = ctx.specs.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let namespaces =
        job(ctx, move |d| d.ctrl.namespaces().map(|n| ns_info(n, specs.get(&n.nsid).cloned())).collect())?;
    answer(&reply::NsList { namespaces })
}

fn ns_add(ctx: &Context, NsAdd { spec: text, nsid }: NsAdd) -> Result<Value, RpcError> {
    let spec: NsSpec = text.parse().map_err(|e: String| RpcError::params(format!("spec: {e}")))?;
    if let Some(installed) = &ctx.sandbox {
        spec.may_add(installed).map_err(|e| RpcError::new(code::NOT_PERMITTED, e))?;
    }
    // Opened here, on the control thread: the device thread only attaches it.
    let opened = spec
        .check_operator_size()
        .and_then(|()| spec.open(nsid, &ctx.locks))
        .map_err(|e| RpcError::failed(format!("cannot open {text:?}: {}", crate::nsspec::with_fix(e))))?;
    let cfg = opened.config();
    let nsid = job(ctx, move |d| {
        d.ctrl.add_namespace(&cfg, nsid).map(|id| ns_info(&d.ctrl.namespace(id).expect("just added"), None))
    })?
    .map_err(RpcError::failed)?;
    ctx.specs.lock().unwrap_or_else(|p| p.into_inner()).insert(nsid.nsid, text.clone());
    answer(&reply::NsInfo { spec: Some(text), ..nsid })
}

/// How long a namespace must have been idle to be removed without `force`.
const IDLE_FOR_REMOVAL: std::time::Duration = std::time::Duration::from_secs(1);

fn ns_remove(ctx: &Context, NsRemove { nsid, force }: NsRemove) -> Result<Value, RpcError> {
    // In use: a guest drives the controller and did I/O on the namespace within
    // the last second (its commands would fail Invalid Namespace, a mounted file
    // system under it). Shrinking asks for force on the same grounds.
    let activity = move |d: &mut Device| {
        let driven = d.client_connected() && d.ctrl.lifecycle() == nvme_ctrl::Lifecycle::Ready;
        let done = d.ctrl.namespace(nsid).map(|n| {
            let s = n.stats.snapshot();
            s.read.commands + s.write.commands + s.flush.commands + s.other.commands
        });
        (driven, done)
    };
    if !force.unwrap_or(false) {
        if let (true, Some(before)) = job(ctx, activity)? {
            std::thread::sleep(IDLE_FOR_REMOVAL);
            if let (true, Some(after)) = job(ctx, activity)? {
                if after != before {
                    return Err(RpcError::failed(format!(
                        "namespace {nsid} is in use: a client is connected and its guest did I/O on it in the \
                         last second ({} commands). Its guest's commands would fail Invalid Namespace: stop \
                         that I/O first (unmount it in the guest), or remove it anyway with force (vnvme ctl \
                         ns.remove {nsid} force)",
                        after - before
                    )));
                }
            }
        }
    }
    let backend = job(ctx, move |d| {
        let backend = d.ctrl.namespace(nsid).map(|n| Arc::downgrade(&n.backend));
        d.ctrl.remove_namespace(nsid).map(|()| backend)
    })?
    .map_err(RpcError::failed)?;
    // Answered once its files are let go of (its commands back from the backend),
    // so that another server may take them at once; bounded.
    let deadline = Instant::now() + crate::upgrade::QUIESCE_LIMIT;
    while backend.as_ref().is_some_and(|b| b.strong_count() > 0) && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    ctx.specs.lock().unwrap_or_else(|p| p.into_inner()).remove(&nsid);
    answer(&reply::NsRemoved { nsid })
}

fn ns_resize(ctx: &Context, NsResize { nsid, size: Size(size), force }: NsResize) -> Result<Value, RpcError> {
    let force = force.unwrap_or(false);
    let old = job(ctx, move |d| d.ctrl.resize_namespace(nsid, size, force))?.map_err(RpcError::failed)?;
    answer(&reply::NsResized { nsid, old_size: old, size })
}

fn zone_fail(ctx: &Context, ZoneFail { nsid, zslba, state }: ZoneFail) -> Result<Value, RpcError> {
    let (to, name) = match state {
        FailedZoneState::ReadOnly => (nvme_spec::zns::ZoneState::ReadOnly, "read-only"),
        FailedZoneState::Offline => (nvme_spec::zns::ZoneState::Offline, "offline"),
    };
    let changed = job(ctx, move |d| d.ctrl.fail_zone(nsid, zslba, to))?.map_err(RpcError::failed)?;
    answer(&reply::ZoneFailed { nsid, zslba, state: name.into(), changed })
}

fn ana_set(ctx: &Context, AnaSet { state, group }: AnaSet) -> Result<Value, RpcError> {
    let to = state.state();
    let changed = job(ctx, move |d| {
        let r = d.ctrl.set_ana_state(group, to);
        // A process standing in after a crash keeps it (`--restart-on-crash`).
        d.journal_now();
        r
    })?
    .map_err(RpcError::failed)?;
    answer(&reply::AnaSet { state: to.name().into(), group, changed })
}

const NO_POOL: &str = "this server has no namespace pool (start it with --pool DIR:SIZE)";

fn pool_info(ctx: &Context) -> Result<Value, RpcError> {
    let info = job(ctx, |d| {
        d.ctrl.pool().map(|p| {
            let s = p.state();
            reply::PoolInfo {
                path: p.path().display().to_string(),
                capacity: s.capacity,
                unallocated: s.unallocated(),
                controllers: s.controllers.iter().copied().collect(),
                this_controller: p.cntlid(),
                namespaces: s
                    .namespaces
                    .iter()
                    .map(|(&nsid, n)| reply::PoolNs {
                        nsid,
                        size: n.bytes(),
                        lba_size: n.lba_bytes(),
                        shared: n.shared,
                        ana_group: n.ana_group,
                        attached: n.attached.iter().copied().collect(),
                    })
                    .collect(),
            }
        })
    })?
    .ok_or_else(|| RpcError::new(code::NOT_PERMITTED, NO_POOL))?;
    answer(&info)
}

/// The controllers an attach or detach names, as a status the pool refuses.
fn controllers(a: &NsAttach, this: u16) -> Result<Vec<u16>, PoolRefusal> {
    a.controllers(this).map_err(PoolRefusal::Params)
}

/// Why a pool operation was refused.
enum PoolRefusal {
    Params(String),
    Status(nvme_spec::Status),
}

impl From<nvme_spec::Status> for PoolRefusal {
    fn from(s: nvme_spec::Status) -> Self {
        PoolRefusal::Status(s)
    }
}

/// Runs `f` on the pool as this controller, then brings this controller's
/// namespaces in line at once (the others follow within their next look).
fn pool_forget(ctx: &Context, f: super::api::PoolForget) -> Result<Value, RpcError> {
    let cntlid = u16::try_from(f.cntlid)
        .map_err(|_| RpcError::new(code::INVALID_PARAMS, format!("cntlid {} is not a CNTLID", f.cntlid)))?;
    let r = job(ctx, move |d| -> Result<Vec<u32>, String> {
        let Some(pool) = d.ctrl.pool().cloned() else { return Err(NO_POOL.into()) };
        if cntlid == pool.cntlid() {
            return Err(format!(
                "controller {cntlid} is this one, which is running: forget it through another"
            ));
        }
        let detached = pool.forget(cntlid).map_err(|_| format!("the pool has no controller {cntlid}"))?;
        d.ctrl.sync_pool();
        Ok(detached)
    })?;
    let detached = r.map_err(|m| RpcError::new(code::NOT_PERMITTED, m))?;
    tracing::info!(cntlid, ?detached, "controller forgotten by the pool (the operator)");
    answer(&reply::PoolForgot { cntlid, detached })
}

fn pool_change(
    ctx: &Context,
    nsid: u32,
    done: &'static str,
    f: impl FnOnce(&nvme_ctrl::pool::NamespacePool, u16) -> Result<(), PoolRefusal> + Send + 'static,
) -> Result<Value, RpcError> {
    let r = job(ctx, move |d| -> Result<Vec<u16>, PoolRefusal> {
        let Some(pool) = d.ctrl.pool().cloned() else {
            return Err(PoolRefusal::Params(NO_POOL.into()));
        };
        f(&pool, pool.cntlid())?;
        d.ctrl.sync_pool();
        Ok(pool
            .state()
            .namespaces
            .get(&nsid)
            .map(|n| n.attached.iter().copied().collect())
            .unwrap_or_default())
    })?;
    let attached = r.map_err(|e| match e {
        PoolRefusal::Params(m) => RpcError::new(code::NOT_PERMITTED, m),
        PoolRefusal::Status(s) => RpcError::failed(format!("namespace {nsid}: {}", pool_refusal(s))),
    })?;
    tracing::info!(nsid, ?attached, "namespace {done} by the operator");
    answer(&reply::PoolChanged { nsid, done: done.into(), attached })
}

/// What a pool's refusal means, in an operator's words.
fn pool_refusal(s: nvme_spec::Status) -> String {
    use nvme_spec::Status as S;
    let why = match s.code() {
        c if c == S::NAMESPACE_INSUFFICIENT_CAPACITY => "not enough capacity left in the pool (pool.info)",
        c if c == S::NAMESPACE_IDENTIFIER_UNAVAILABLE => "no NSID left to give (raise --max-namespaces)",
        c if c == S::NAMESPACE_ALREADY_ATTACHED => "already attached to one of those controllers",
        c if c == S::NAMESPACE_IS_PRIVATE => "it is private: one controller at a time",
        c if c == S::NAMESPACE_NOT_ATTACHED => "not attached to one of those controllers",
        c if c == S::CONTROLLER_LIST_INVALID => {
            "a controller named is not one the pool knows (each joins when it starts), or is named twice"
        }
        c if c == S::INVALID_NAMESPACE => "there is no such namespace in the pool",
        c if c == S::INVALID_FIELD => "it is an operator's namespace (--ns or ns.add), not the pool's",
        _ => return s.to_string(),
    };
    why.into()
}

fn ns_create(ctx: &Context, c: NsCreate) -> Result<Value, RpcError> {
    let lba_format = match c.lba.unwrap_or(512) {
        512 => 0,
        4096 => 1,
        n => return Err(RpcError::params(format!("lba: {n}: 512 or 4096"))),
    };
    let lba = if lba_format == 1 { 4096 } else { 512 };
    let Size(size) = c.size;
    if size == 0 || size % lba != 0 {
        return Err(RpcError::params(format!(
            "size: {size} bytes is not a whole number of {lba}-byte blocks"
        )));
    }
    let new = nvme_ctrl::pool::NewNamespace {
        nsze: size / lba,
        lba_format,
        shared: !c.private.unwrap_or(false),
        ana_group: c.group.unwrap_or(1),
    };
    if !(1..=nvme_ctrl::ana::MAX_GROUPS).contains(&new.ana_group) {
        return Err(RpcError::params(format!("group: 1 to {}", nvme_ctrl::ana::MAX_GROUPS)));
    }
    let made = job(ctx, move |d| {
        let nn = d.ctrl.max_namespaces();
        d.ctrl.pool().map(|p| p.create(new, nn))
    })?
    .ok_or_else(|| RpcError::new(code::NOT_PERMITTED, NO_POOL))?
    .map_err(|s| RpcError::failed(format!("cannot create the namespace: {}", pool_refusal(s))))?;
    tracing::info!(nsid = made, size, "namespace created by the operator");
    answer(&reply::PoolChanged { nsid: made, done: "created".into(), attached: Vec::new() })
}

fn ana_get(ctx: &Context) -> Result<Value, RpcError> {
    let groups = job(ctx, |d| d.ctrl.ana_groups())?;
    let groups = groups
        .into_iter()
        .map(|(group, state, nsids)| reply::AnaGroup { group, state: state.name().into(), nsids })
        .collect();
    answer(&reply::AnaGet { groups })
}

/// The limits a qos.set gives (None if none is given).
fn take_limits(q: &QosSet) -> Result<Option<QosLimits>, RpcError> {
    let mut l = QosLimits::default();
    let mut any = false;
    for (key, rate, burst) in q.limits() {
        let slot = match key {
            "iops" => &mut l.iops,
            "iops_rd" => &mut l.read_iops,
            "iops_wr" => &mut l.write_iops,
            "bps" => &mut l.bps,
            "bps_rd" => &mut l.read_bps,
            _ => &mut l.write_bps,
        };
        match (rate, burst) {
            (Some(0), _) | (None, None) => {}
            (Some(rate), burst) => {
                *slot = Some(Limit { rate, burst: burst.unwrap_or(0) });
                any = true;
            }
            (None, Some(_)) => return Err(RpcError::params(format!("{key}_burst without {key}"))),
        }
        if rate == Some(0) {
            any = true;
        }
    }
    l.check().map_err(RpcError::params)?;
    Ok(any.then_some(l))
}

/// qos.set: a namespace's own limits ({nsid, limits}), a named group's ({group,
/// limits}), a namespace joining a group ({nsid, group}, limits optional), or
/// limits cleared ({nsid, clear: true}). Limits given replace the whole set.
fn qos_set(ctx: &Context, q: QosSet) -> Result<Value, RpcError> {
    let limits = take_limits(&q)?;
    let QosSet { nsid, group, clear, .. } = q;
    let clear = clear.unwrap_or(false);
    if nsid.is_none() && group.is_none() {
        return Err(RpcError::params("give nsid, group or both"));
    }
    if clear && (limits.is_some() || group.is_some() || nsid.is_none()) {
        return Err(RpcError::params("clear takes an nsid and nothing else"));
    }
    let target: Option<Arc<QosGroup>> = match (&group, nsid) {
        _ if clear => None,
        (Some(name), _) => {
            let mut groups = ctx.groups.lock().unwrap_or_else(|p| p.into_inner());
            match (groups.get(name), limits) {
                (Some(g), Some(l)) => {
                    g.set_limits(l).map_err(RpcError::params)?;
                    Some(g.clone())
                }
                (Some(g), None) => Some(g.clone()),
                (None, Some(l)) => {
                    let g = Arc::new(QosGroup::new(name.clone(), l).map_err(RpcError::params)?);
                    groups.insert(name.clone(), g.clone());
                    Some(g)
                }
                (None, None) => {
                    return Err(RpcError::failed(format!("no QoS group {name:?}: give its limits")))
                }
            }
        }
        (None, Some(n)) => {
            let l = limits.ok_or_else(|| RpcError::params("give limits, a group, or clear"))?;
            Some(Arc::new(QosGroup::new(format!("ns{n}"), l).map_err(RpcError::params)?))
        }
        (None, None) => unreachable!("checked above"),
    };
    let Some(nsid) = nsid else {
        let limits = Some((&target.expect("a group").limits()).into());
        return answer(&reply::QosSet { nsid: None, group, limits });
    };
    let g = target.clone();
    job(ctx, move |d| d.ctrl.set_qos(nsid, g))?.map_err(RpcError::failed)?;
    answer(&reply::QosSet {
        nsid: Some(nsid),
        group: target.as_ref().map(|g| g.name.clone()),
        limits: target.map(|g| (&g.limits()).into()),
    })
}

fn qos_get(ctx: &Context, QosGet { nsid: only }: QosGet) -> Result<Value, RpcError> {
    let namespaces = job(ctx, move |d| {
        d.ctrl
            .namespaces()
            .filter(|n| only.is_none_or(|o| o == n.nsid))
            .map(|n| {
                let g = d.ctrl.qos(n.nsid);
                let s = n.stats.snapshot();
                reply::QosNamespace {
                    nsid: n.nsid,
                    group: g.as_ref().map(|g| g.name.clone()),
                    limits: g.map(|g| (&g.limits()).into()),
                    throttled_commands: s.throttled_commands,
                    throttled_s: s.throttled_ns as f64 / 1e9,
                }
            })
            .collect::<Vec<_>>()
    })?;
    if let Some(n) = only {
        if namespaces.is_empty() {
            return Err(RpcError::failed(format!("there is no namespace {n}")));
        }
    }
    let groups: Vec<reply::QosGroup> = ctx
        .groups
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .map(|g| reply::QosGroup { group: g.name.clone(), limits: (&g.limits()).into() })
        .collect();
    answer(&reply::QosGet { namespaces, groups })
}

/// stats.get: one scrape of the controller (the report Prometheus renders too), as
/// JSON.
fn stats_get(ctx: &Context) -> Result<Value, RpcError> {
    let stats = ctx.stats.clone();
    let serial = ctx.facts.serial.clone();
    let started = ctx.started;
    let scrape = job(ctx, move |d| crate::metrics::collect(d, &stats, &serial, started))?;
    Ok(crate::metrics::json(&scrape))
}

fn log_set(LogSet { filter }: LogSet) -> Result<Value, RpcError> {
    let previous = crate::logging::set_filter(&filter).map_err(RpcError::params)?;
    answer(&reply::LogSet { filter, previous })
}
