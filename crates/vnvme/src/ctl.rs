//! `vnvme ctl`: one JSON-RPC request to a running server's control socket, its
//! answer printed for people (or as JSON with --json).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::control::methods::METHODS;

/// `vnvme ctl`'s arguments.
#[derive(Debug, clap::Args)]
#[command(after_help = after_help())]
pub struct CtlArgs {
    /// The server's control socket (`vnvme serve --control PATH`).
    #[arg(long, env = "VNVME_CONTROL")]
    pub control: PathBuf,
    /// Print the result as JSON (for scripts).
    #[arg(long)]
    pub json: bool,
    /// How long to wait for the answer (e.g. 15s).
    #[arg(long, default_value = "15s", value_parser = crate::perf::parse_duration)]
    pub timeout: Duration,
    /// The method, e.g. ns.list.
    pub method: String,
    /// Its parameters: KEY=VALUE, or the positional forms below.
    pub args: Vec<String>,
}

fn after_help() -> String {
    let mut s = String::from("Methods:\n");
    for (m, what) in METHODS {
        s.push_str(&format!("  {m:<11} {what}\n"));
    }
    s.push_str(
        "\nPositional forms (KEY=VALUE works for every method):\n  \
         ns.add SPEC [NSID]         e.g. ns.add file:/srv/vm1-data.img:8G\n  \
         ns.remove NSID\n  \
         ns.resize NSID SIZE [force]  e.g. ns.resize 2 16G\n  \
         log.set FILTER             e.g. log.set info,vnvme::guest=debug\n  \
         qos.set NSID KEY=VALUE...  e.g. qos.set 1 iops=2000 bps_wr=20M bps_wr_burst=4M\n  \
         qos.set group=NAME KEY=VALUE...; qos.set NSID group=NAME; qos.set NSID clear=true\n  \
         qos.get [NSID]\n  \
         upgrade [BINARY]           replace the server under its guest (docs/UPGRADE.md)\n",
    );
    s
}

/// The names of a method's positional parameters, in order.
fn positional(method: &str) -> &'static [&'static str] {
    match method {
        "ns.add" => &["spec", "nsid"],
        "ns.remove" => &["nsid"],
        "ns.resize" => &["nsid", "size", "force"],
        "log.set" => &["filter"],
        "upgrade" => &["binary"],
        "qos.set" | "qos.get" => &["nsid"],
        _ => &[],
    }
}

/// A command-line value as JSON: integers and booleans typed, the rest strings (the
/// server parses sizes such as 8G itself).
fn typed(v: &str) -> Value {
    if let Ok(n) = v.parse::<u64>() {
        return json!(n);
    }
    match v {
        "true" => json!(true),
        "false" => json!(false),
        _ => json!(v),
    }
}

/// The params object from the command line.
fn params(method: &str, args: &[String]) -> Result<Value, String> {
    let names = positional(method);
    // Methods whose every parameter may be given as KEY=VALUE (no spec or filter
    // text that could contain '=').
    let free = names.is_empty() || method.starts_with("qos.");
    let mut m = Map::new();
    for a in args {
        let ident = |k: &str| !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        match a.split_once('=') {
            // A spec or a filter may contain '=' (ram:1G:lba=4096): a KEY=VALUE is a
            // named parameter only when KEY is a plain name the method could take.
            Some((k, v)) if ident(k) && (free || names.contains(&k)) => {
                m.insert(k.to_string(), typed(v));
            }
            _ => {
                let Some(name) = names.iter().find(|n| !m.contains_key(**n)) else {
                    return Err(format!("{method}: unexpected argument {a:?} (use KEY=VALUE)"));
                };
                let v = match *name {
                    // Specs and filters stay text; "force" as a bare word means true.
                    "spec" | "filter" | "binary" => json!(a),
                    "force" if a == "force" => json!(true),
                    _ => typed(a),
                };
                m.insert(name.to_string(), v);
            }
        }
    }
    Ok(Value::Object(m))
}

/// Sends `method(params)` to the socket at `path` and returns the result, or the
/// error message.
pub fn request(
    path: &std::path::Path,
    method: &str,
    params: Value,
    timeout: Duration,
) -> Result<Value, String> {
    let stream =
        UnixStream::connect(path).map_err(|e| format!("cannot connect to {}: {e}", path.display()))?;
    stream.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    stream.set_write_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    let req = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
    let mut line = req.to_string();
    line.push('\n');
    (&stream).write_all(line.as_bytes()).map_err(|e| format!("sending the request: {e}"))?;
    let mut reply = String::new();
    BufReader::new(&stream).read_line(&mut reply).map_err(|e| format!("reading the reply: {e}"))?;
    if reply.is_empty() {
        return Err("the server closed the connection without answering".into());
    }
    let v: Value = serde_json::from_str(&reply).map_err(|e| format!("the reply is not JSON: {e}"))?;
    if let Some(e) = v.get("error") {
        let msg = e.get("message").and_then(Value::as_str).unwrap_or("(no message)");
        let code = e.get("code").and_then(Value::as_i64).unwrap_or(0);
        return Err(format!("{msg} (error {code})"));
    }
    v.get("result").cloned().ok_or_else(|| "the reply has neither result nor error".into())
}

pub fn run(a: CtlArgs) -> Result<(), Box<dyn std::error::Error>> {
    let params = params(&a.method, &a.args)?;
    let result = if a.method == "upgrade" {
        let binary = match params.as_object().map(|m| m.iter().collect::<Vec<_>>()).unwrap_or_default()[..] {
            [] => None,
            [(k, v)] if k == "binary" => Some(PathBuf::from(v.as_str().ok_or("binary must be a path")?)),
            _ => return Err("upgrade takes one optional parameter: binary=PATH".into()),
        };
        let o = crate::upgrade::UpgradeOptions { control: a.control.clone(), binary, timeout: a.timeout };
        crate::upgrade::ctl_upgrade(&o).map_err(|e| format!("upgrade: {e}"))?
    } else {
        request(&a.control, &a.method, params, a.timeout).map_err(|e| format!("{}: {e}", a.method))?
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        print!("{}", human(&a.method, &result));
    }
    Ok(())
}

fn bytes(n: u64) -> String {
    const UNITS: [(u64, &str); 4] = [(1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (u, name) in UNITS {
        if n >= u {
            return if n.is_multiple_of(u) {
                format!("{} {name}", n / u)
            } else {
                format!("{:.2} {name}", n as f64 / u as f64)
            };
        }
    }
    format!("{n} B")
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// The result as people read it.
fn human(method: &str, r: &Value) -> String {
    let u = |k: &str| r.get(k).and_then(Value::as_u64).unwrap_or(0);
    match method {
        "ns.list" => {
            let mut s =
                format!("{:>5}  {:>10}  {:>5}  {:>8}  {}\n", "NSID", "SIZE", "LBA", "TIMEOUT", "BACKEND");
            for n in r["namespaces"].as_array().into_iter().flatten() {
                let t = n["timeout_ms"].as_u64().map_or("none".to_string(), |ms| format!("{ms} ms"));
                s.push_str(&format!(
                    "{:>5}  {:>10}  {:>5}  {:>8}  {}\n",
                    scalar(&n["nsid"]),
                    bytes(n["size"].as_u64().unwrap_or(0)),
                    scalar(&n["lba_size"]),
                    t,
                    n["backend"].as_str().unwrap_or("?")
                ));
            }
            s
        }
        "ns.add" => format!(
            "added namespace {}: {}, {} ({} blocks of {} bytes)\n",
            u("nsid"),
            r["backend"].as_str().unwrap_or("?"),
            bytes(u("size")),
            u("blocks"),
            u("lba_size")
        ),
        "ns.remove" => format!("removed namespace {}\n", u("nsid")),
        "upgrade" => format!(
            "upgraded: pid {} -> {} ({}), guest I/O stalled {:.1} ms, {} ms in all{}\n",
            u("old_pid"),
            u("new_pid"),
            r["binary"].as_str().unwrap_or("?"),
            r["stall_ms"].as_f64().unwrap_or(0.0),
            u("took_ms"),
            if r["client"].as_bool() == Some(true) { "" } else { " (no client connected)" }
        ),
        "ns.resize" => format!("namespace {}: {} -> {}\n", u("nsid"), bytes(u("old_size")), bytes(u("size"))),
        "log.set" => format!("log filter: {} (was {})\n", scalar(&r["filter"]), scalar(&r["previous"])),
        "qos.get" => {
            let mut s = format!("{:>5}  {:<12}  {:>12}  {}\n", "NSID", "GROUP", "HELD (s)", "LIMITS");
            for n in r["namespaces"].as_array().into_iter().flatten() {
                s.push_str(&format!(
                    "{:>5}  {:<12}  {:>12.3}  {}\n",
                    scalar(&n["nsid"]),
                    scalar(&n["group"]),
                    n["throttled_s"].as_f64().unwrap_or(0.0),
                    limits_text(&n["limits"])
                ));
            }
            for g in r["groups"].as_array().into_iter().flatten() {
                s.push_str(&format!("group {}: {}\n", scalar(&g["group"]), limits_text(&g["limits"])));
            }
            s
        }
        "qos.set" => match r.get("nsid") {
            Some(n) => format!("namespace {n}: {}\n", limits_text(&r["limits"])),
            None => format!("group {}: {}\n", scalar(&r["group"]), limits_text(&r["limits"])),
        },
        _ => flat(r, ""),
    }
}

/// QoS limits as `iops=2000/200 bps_wr=20971520/2097152` (rate/burst), or "none".
fn limits_text(l: &Value) -> String {
    let parts: Vec<String> = l
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| format!("{k}={}/{}", scalar(&v["rate"]), scalar(&v["burst"])))
        .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(" ")
    }
}

/// Nested objects as `path: value` lines, arrays of objects numbered.
fn flat(v: &Value, prefix: &str) -> String {
    let mut s = String::new();
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let p = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                s.push_str(&flat(x, &p));
            }
        }
        Value::Array(a) if a.iter().any(Value::is_object) => {
            for (i, x) in a.iter().enumerate() {
                s.push_str(&flat(x, &format!("{prefix}[{i}]")));
            }
        }
        other => s.push_str(&format!("{prefix}: {}\n", scalar(other))),
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_arguments_become_named_parameters() {
        let p = |m: &str, a: &[&str]| params(m, &a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(p("ns.add", &["ram:1G:lba=4096"]).unwrap(), json!({"spec": "ram:1G:lba=4096"}));
        assert_eq!(
            p("ns.add", &["file:/x.img:8G", "3"]).unwrap(),
            json!({"spec": "file:/x.img:8G", "nsid": 3})
        );
        assert_eq!(p("ns.add", &["spec=null:1G", "nsid=2"]).unwrap(), json!({"spec": "null:1G", "nsid": 2}));
        assert_eq!(
            p("ns.resize", &["2", "16G", "force"]).unwrap(),
            json!({"nsid": 2, "size": "16G", "force": true})
        );
        assert_eq!(p("ns.resize", &["nsid=2", "size=4096"]).unwrap(), json!({"nsid": 2, "size": 4096}));
        assert_eq!(
            p("log.set", &["info,vnvme::guest=debug"]).unwrap(),
            json!({"filter": "info,vnvme::guest=debug"})
        );
        assert!(p("ns.remove", &["1", "2"]).unwrap_err().contains("unexpected argument"));
        assert_eq!(p("stats.get", &[]).unwrap(), json!({}));
        assert_eq!(
            p("qos.set", &["1", "iops=2000", "bps_wr=20M"]).unwrap(),
            json!({"nsid": 1, "iops": 2000, "bps_wr": "20M"})
        );
        assert_eq!(p("qos.set", &["group=db", "iops=100"]).unwrap(), json!({"group": "db", "iops": 100}));
    }
}
