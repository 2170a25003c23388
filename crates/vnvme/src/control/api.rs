//! The control methods as types, in one place: each method's name, parameters,
//! summary, positional forms for `vnvme ctl` and whether it changes the server.
//! The server parses a request into [`Request`] (an unknown parameter, a missing
//! one or a value of the wrong kind is refused before anything runs), and `vnvme
//! ctl` builds the same type from its command line, so both sides agree by
//! construction. Adding a method is one line in [`methods!`] and one handler.

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{code, RpcError};

/// A method as `vnvme ctl --help` lists it.
#[derive(Debug)]
pub struct Method {
    pub name: &'static str,
    pub summary: &'static str,
    /// The parameters `vnvme ctl METHOD A B` fills, in order.
    pub positional: &'static [&'static str],
    /// It changes the server (logged at info when it succeeds).
    pub changes: bool,
    /// Listed in the help (the rest are steps of a ctl-side method).
    pub listed: bool,
}

macro_rules! methods {
    ($( $variant:ident($params:ty) = $name:literal, changes: $changes:literal, listed: $listed:literal,
        positional: [$($pos:literal),*], $summary:literal; )*) => {
        /// One control request: the method and its parameters.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "method", content = "params", deny_unknown_fields)]
        pub enum Request {
            $( #[serde(rename = $name)] $variant($params), )*
        }

        /// Every method the server answers.
        pub const METHODS: &[Method] = &[
            $( Method { name: $name, summary: $summary, positional: &[$($pos),*], changes: $changes,
                        listed: $listed }, )*
        ];

        impl Request {
            /// The method's name on the wire.
            pub fn name(&self) -> &'static str {
                match self {
                    $( Request::$variant(_) => $name, )*
                }
            }
        }
    };
}

methods! {
    CtrlInfo(NoParams) = "ctrl.info", changes: false, listed: true, positional: [],
        "the controller: identity, configuration, state, client, log filter";
    NsList(NoParams) = "ns.list", changes: false, listed: true, positional: [],
        "the namespaces: NSID, backend, size, LBA size, timeout, the --ns text";
    NsAdd(NsAdd) = "ns.add", changes: true, listed: true, positional: ["spec", "nsid"],
        "add a namespace: spec (the --ns grammar), nsid (optional)";
    NsRemove(NsRemove) = "ns.remove", changes: true, listed: true, positional: ["nsid", "force"],
        "remove a namespace: nsid, force (even while its guest does I/O on it)";
    NsResize(NsResize) = "ns.resize", changes: true, listed: true, positional: ["nsid", "size", "force"],
        "resize a namespace: nsid, size (bytes or 8G), force (shrink over data)";
    ZoneFail(ZoneFail) = "zone.fail", changes: true, listed: true, positional: ["nsid", "zslba", "state"],
        "fail a zone of a zoned namespace as a medium would: nsid, zslba (the zone's first LBA), state (read-only or offline)";
    AnaSet(AnaSet) = "ana.set", changes: true, listed: true, positional: ["state", "group"],
        "this controller's ANA state (with --cntlid): state (optimized, non-optimized, inaccessible, persistent-loss, change), group (default: every group)";
    AnaGet(NoParams) = "ana.get", changes: false, listed: true, positional: [],
        "the ANA groups with namespaces: ID, state on this controller, NSIDs";
    PoolInfo(NoParams) = "pool.info", changes: false, listed: true, positional: [],
        "the namespace pool (with --pool): capacity, what is left, controllers, namespaces and where each is attached";
    NsCreate(NsCreate) = "ns.create", changes: true, listed: true, positional: ["size", "lba"],
        "create a namespace in the pool: size (bytes or 8G), lba (512 or 4096), private (not shared), group (ANA group); attached nowhere";
    NsDelete(NsDelete) = "ns.delete", changes: true, listed: true, positional: ["nsid"],
        "delete a namespace of the pool and its data: nsid (detached from every controller first)";
    NsAttach(NsAttach) = "ns.attach", changes: true, listed: true, positional: ["nsid", "controllers"],
        "attach a namespace of the pool: nsid, controllers (CNTLIDs, e.g. 1,2; default: this controller)";
    NsDetach(NsAttach) = "ns.detach", changes: true, listed: true, positional: ["nsid", "controllers"],
        "detach a namespace of the pool: nsid, controllers (default: this controller)";
    PoolForget(PoolForget) = "pool.forget", changes: true, listed: true, positional: ["cntlid"],
        "forget a controller of the pool whose process is gone for good: cntlid (detached from every namespace; it joins again if it starts)";
    QosSet(QosSet) = "qos.set", changes: true, listed: true, positional: ["nsid"],
        "QoS limits: nsid and/or group, iops iops_rd iops_wr bps bps_rd bps_wr (+ _burst), clear";
    QosGet(QosGet) = "qos.get", changes: false, listed: true, positional: ["nsid"],
        "QoS limits of every namespace (or nsid) and group, and time held back";
    StatsGet(NoParams) = "stats.get", changes: false, listed: true, positional: [],
        "counters: controller, namespaces (with latency), queues, workers";
    LogSet(LogSet) = "log.set", changes: true, listed: true, positional: ["filter"],
        "set the log filter: filter (tracing EnvFilter syntax)";
    UpgradePrepare(NoParams) = "upgrade.prepare", changes: false, listed: false, positional: [],
        "hand this server's state to a new process (a step of `vnvme ctl upgrade`)";
}

/// `vnvme ctl upgrade`: run by ctl itself (it starts the new process), listed with
/// the methods.
pub const UPGRADE: Method = Method {
    name: "upgrade",
    summary: "replace this server by a new process under the running guest: binary (default: the same path)",
    positional: &["binary"],
    changes: true,
    listed: true,
};

/// The method named `name` (the ctl-side `upgrade` included).
pub fn method(name: &str) -> Option<&'static Method> {
    METHODS.iter().chain(std::iter::once(&UPGRADE)).find(|m| m.name == name)
}

impl Request {
    /// The request `method(params)`; `params` absent or null is no parameters.
    pub fn parse(method: &str, params: &Value) -> Result<Request, RpcError> {
        if METHODS.iter().all(|m| m.name != method) {
            let names: Vec<&str> = METHODS.iter().filter(|m| m.listed).map(|m| m.name).collect();
            return Err(RpcError::new(
                code::METHOD_NOT_FOUND,
                format!("no method {method:?} (methods: {})", names.join(", ")),
            ));
        }
        let params = match params {
            Value::Null => Value::Object(Default::default()),
            Value::Object(_) => params.clone(),
            _ => return Err(RpcError::params("params must be an object of named parameters")),
        };
        let v = serde_json::json!({ "method": method, "params": params });
        Request::deserialize(v).map_err(|e| RpcError::params(wording(&e.to_string())))
    }

    /// Whether it changes the server.
    pub fn changes_state(&self) -> bool {
        METHODS.iter().any(|m| m.name == self.name() && m.changes)
    }
}

/// serde's words for a parameter problem, in the protocol's ("parameter", not
/// "field").
fn wording(e: &str) -> String {
    e.replace("unknown field", "unknown parameter")
        .replace("missing field", "missing parameter")
        .replace("expected `", "the method takes `")
        .replace("there are no fields", "the method takes none")
}

/// No parameters (an empty object, or none at all).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NsAdd {
    /// The `--ns` grammar, e.g. `file:/srv/vm1-data.img:8G`.
    pub spec: String,
    /// The NSID to give it (default: the lowest free one).
    #[serde(default, deserialize_with = "opt_u32", skip_serializing_if = "Option::is_none")]
    pub nsid: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NsRemove {
    #[serde(deserialize_with = "req_u32")]
    pub nsid: u32,
    /// Remove it even while a guest does I/O on it.
    #[serde(default, deserialize_with = "opt_bool", skip_serializing_if = "Option::is_none")]
    pub force: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NsResize {
    #[serde(deserialize_with = "req_u32")]
    pub nsid: u32,
    pub size: Size,
    /// Shrink even over data.
    #[serde(default, deserialize_with = "opt_bool", skip_serializing_if = "Option::is_none")]
    pub force: Option<bool>,
}

/// ns.create: a namespace of the pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NsCreate {
    pub size: Size,
    /// Its logical block size: 512 (default) or 4096.
    #[serde(default, deserialize_with = "opt_u32", skip_serializing_if = "Option::is_none")]
    pub lba: Option<u32>,
    /// Attachable to one controller at a time (default: shared).
    #[serde(default, deserialize_with = "opt_bool", skip_serializing_if = "Option::is_none")]
    pub private: Option<bool>,
    /// Its ANA group (default 1).
    #[serde(default, deserialize_with = "opt_u32", skip_serializing_if = "Option::is_none")]
    pub group: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NsDelete {
    #[serde(deserialize_with = "req_u32")]
    pub nsid: u32,
}

/// pool.forget: controller `cntlid` leaves the pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolForget {
    #[serde(deserialize_with = "req_u32")]
    pub cntlid: u32,
}

/// ns.attach and ns.detach: namespace `nsid` of the pool, for the controllers
/// listed (comma separated CNTLIDs; default: this controller).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NsAttach {
    #[serde(deserialize_with = "req_u32")]
    pub nsid: u32,
    #[serde(default, deserialize_with = "opt_string", skip_serializing_if = "Option::is_none")]
    pub controllers: Option<String>,
}

impl NsAttach {
    /// The controllers named, or `this` when none are.
    pub fn controllers(&self, this: u16) -> Result<Vec<u16>, String> {
        let Some(list) = &self.controllers else { return Ok(vec![this]) };
        list.split(',')
            .map(|c| {
                c.trim()
                    .parse::<u16>()
                    .map_err(|_| format!("controllers: {c:?} is not a CNTLID (0 to 65519)"))
            })
            .collect()
    }
}

/// zone.fail: the zone starting at `zslba` of zoned namespace `nsid` made read only
/// or offline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZoneFail {
    #[serde(deserialize_with = "req_u32")]
    pub nsid: u32,
    #[serde(deserialize_with = "req_u64")]
    pub zslba: u64,
    pub state: FailedZoneState,
}

/// ana.set: ANA group `group` (every group if absent) of this controller put in
/// `state`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnaSet {
    pub state: AnaStateName,
    #[serde(default, deserialize_with = "opt_u32", skip_serializing_if = "Option::is_none")]
    pub group: Option<u32>,
}

/// An ANA state as `ana.set` takes it (Linux's sysfs names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AnaStateName {
    Optimized,
    NonOptimized,
    Inaccessible,
    PersistentLoss,
    Change,
}

impl AnaStateName {
    pub fn state(self) -> nvme_spec::ana::AnaState {
        use nvme_spec::ana::AnaState;
        match self {
            AnaStateName::Optimized => AnaState::Optimized,
            AnaStateName::NonOptimized => AnaState::NonOptimized,
            AnaStateName::Inaccessible => AnaState::Inaccessible,
            AnaStateName::PersistentLoss => AnaState::PersistentLoss,
            AnaStateName::Change => AnaState::Change,
        }
    }
}

/// What `zone.fail` makes a zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailedZoneState {
    ReadOnly,
    Offline,
}

/// qos.set: a namespace's own limits (nsid, limits), a named group's (group,
/// limits), a namespace joining a group (nsid, group, limits optional), or limits
/// cleared (nsid, clear). Rates are per second; bursts default to a tenth of a
/// second's worth.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QosSet {
    #[serde(default, deserialize_with = "opt_u32", skip_serializing_if = "Option::is_none")]
    pub nsid: Option<u32>,
    #[serde(default, deserialize_with = "opt_group", skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, deserialize_with = "opt_bool", skip_serializing_if = "Option::is_none")]
    pub clear: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops: Option<Size>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops_burst: Option<Size>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops_rd: Option<Size>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops_rd_burst: Option<Size>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops_wr: Option<Size>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops_wr_burst: Option<Size>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bps: Option<Size>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bps_burst: Option<Size>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bps_rd: Option<Size>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bps_rd_burst: Option<Size>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bps_wr: Option<Size>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bps_wr_burst: Option<Size>,
}

impl QosSet {
    /// Each limit kind's name, rate and burst, in a fixed order.
    pub fn limits(&self) -> [(&'static str, Option<u64>, Option<u64>); 6] {
        let g = |s: Option<Size>| s.map(|s| s.0);
        [
            ("iops", g(self.iops), g(self.iops_burst)),
            ("iops_rd", g(self.iops_rd), g(self.iops_rd_burst)),
            ("iops_wr", g(self.iops_wr), g(self.iops_wr_burst)),
            ("bps", g(self.bps), g(self.bps_burst)),
            ("bps_rd", g(self.bps_rd), g(self.bps_rd_burst)),
            ("bps_wr", g(self.bps_wr), g(self.bps_wr_burst)),
        ]
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QosGet {
    #[serde(default, deserialize_with = "opt_u32", skip_serializing_if = "Option::is_none")]
    pub nsid: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSet {
    /// tracing's EnvFilter syntax, e.g. `info,vnvme::guest=debug`.
    pub filter: String,
}

/// A byte count (or a rate): a number, or a string with an optional binary suffix
/// (`"8G"` = 8 GiB, `"20M"` = 20 MiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Size(pub u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Size, D::Error> {
        match Value::deserialize(d)? {
            Value::Number(n) => {
                n.as_u64().map(Size).ok_or_else(|| de::Error::custom(format!("{n} is not a byte count")))
            }
            Value::String(s) => crate::nsspec::parse_size(&s).map(Size).map_err(de::Error::custom),
            v => Err(de::Error::custom(format!("a size (bytes, or e.g. \"8G\"), not {v}"))),
        }
    }
}

/// An NSID-sized integer, given as a number or as its decimal text.
fn as_u32<E: de::Error>(v: &Value) -> Result<u32, E> {
    v.as_u64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| E::custom(format!("an integer 0..=4294967295, not {v}")))
}

fn req_u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    as_u32(&Value::deserialize(d)?)
}

fn req_u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let v = Value::deserialize(d)?;
    v.as_u64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        .ok_or_else(|| de::Error::custom(format!("a non-negative integer, not {v}")))
}

fn opt_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        v => as_u32(&v).map(Some),
    }
}

/// Text, or a number as its text (ctl sends `1` as a number).
fn opt_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s)),
        Value::Number(n) => Ok(Some(n.to_string())),
        v => Err(de::Error::custom(format!("a list like 1,2, not {v}"))),
    }
}

/// A QoS group's name: text with a printable character, the way it is shown and
/// asked for again (an empty name was taken, and made a group no one could tell).
fn opt_group<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match Option::<String>::deserialize(d)? {
        Some(name) if name.trim().is_empty() || name.chars().any(char::is_control) => Err(de::Error::custom(
            format!("group {name:?}: a QoS group needs a name of printable characters, e.g. group=tenant-a"),
        )),
        name => Ok(name),
    }
}

/// true or false, as JSON or as text.
fn opt_bool<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        Value::Bool(b) => Ok(Some(b)),
        Value::String(s) if s == "true" || s == "false" => Ok(Some(s == "true")),
        v => Err(de::Error::custom(format!("true or false, not {v}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn requests_parse_strictly() {
        let r = Request::parse("ns.add", &json!({"spec": "ram:1G", "nsid": "3"})).unwrap();
        assert_eq!(r, Request::NsAdd(NsAdd { spec: "ram:1G".into(), nsid: Some(3) }));
        assert_eq!(Request::parse("ctrl.info", &Value::Null).unwrap(), Request::CtrlInfo(NoParams {}));
        let r = Request::parse("ns.resize", &json!({"nsid": 2, "size": "16G", "force": "true"})).unwrap();
        assert_eq!(r, Request::NsResize(NsResize { nsid: 2, size: Size(16 << 30), force: Some(true) }));
        let e = Request::parse("ns.add", &json!({"spec": "ram:1G", "verbose": true})).unwrap_err();
        assert_eq!(e.code, code::INVALID_PARAMS);
        assert!(e.message.contains("unknown parameter `verbose`"), "{}", e.message);
        let e = Request::parse("ns.remove", &json!({})).unwrap_err();
        assert!(e.message.contains("missing parameter `nsid`"), "{}", e.message);
        let e = Request::parse("ns.remove", &json!({"nsid": -1})).unwrap_err();
        assert!(e.message.contains("an integer"), "{}", e.message);
        let e = Request::parse("stats.get", &json!({"x": 1})).unwrap_err();
        assert!(e.message.contains("unknown parameter `x`"), "{}", e.message);
        let e = Request::parse("ns.frob", &json!({})).unwrap_err();
        assert_eq!(e.code, code::METHOD_NOT_FOUND);
        assert!(e.message.contains("ns.add") && !e.message.contains("upgrade.prepare"), "{}", e.message);
        let e = Request::parse("ns.list", &json!([1])).unwrap_err();
        assert_eq!(e.code, code::INVALID_PARAMS);
    }

    /// issue 49: qos.set group="" made a group named "".
    #[test]
    fn a_qos_group_has_a_name() {
        for bad in ["", " ", "a\nb"] {
            let e = Request::parse("qos.set", &json!({"group": bad, "iops": 100})).unwrap_err();
            assert_eq!(e.code, code::INVALID_PARAMS);
            assert!(e.message.contains(&format!("group {bad:?}")), "{}", e.message);
            assert!(e.message.contains("group=tenant-a"), "{}", e.message);
        }
        let r = Request::parse("qos.set", &json!({"nsid": 2, "group": "tenant-a"})).unwrap();
        assert!(matches!(r, Request::QosSet(QosSet { group: Some(g), .. }) if g == "tenant-a"));
    }

    #[test]
    fn a_request_goes_over_the_wire_and_back_unchanged() {
        let q = Request::QosSet(QosSet {
            nsid: Some(1),
            iops: Some(Size(2000)),
            bps_wr: Some(Size(20 << 20)),
            ..Default::default()
        });
        let v = serde_json::to_value(&q).unwrap();
        assert_eq!(v, json!({"method": "qos.set", "params": {"nsid": 1, "iops": 2000, "bps_wr": 20 << 20}}));
        assert_eq!(Request::parse(q.name(), &v["params"]).unwrap(), q);
        assert!(q.changes_state() && !Request::StatsGet(NoParams {}).changes_state());
    }

    #[test]
    fn every_method_is_named_once() {
        let mut names: Vec<&str> = METHODS.iter().map(|m| m.name).chain([UPGRADE.name]).collect();
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "a method named twice");
        assert!(method("upgrade").is_some() && method("ns.add").is_some() && method("x").is_none());
    }
}
