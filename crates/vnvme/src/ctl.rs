//! `vnvme ctl`: one JSON-RPC request to a running server's control socket, its
//! answer printed for people (or as JSON with --json).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::control::api::{self, Request, METHODS, UPGRADE};
use crate::control::client::request;

mod human;
use human::human;

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
    for m in METHODS.iter().filter(|m| m.listed).chain([&UPGRADE]) {
        s.push_str(&format!("  {:<11} {}\n", m.name, m.summary));
    }
    s.push_str(
        "\nPositional forms (KEY=VALUE works for every method):\n  \
         ns.add SPEC [NSID]         e.g. ns.add file:/srv/vm1-data.img:8G\n  \
         ns.remove NSID [force]\n  \
         ns.resize NSID SIZE [force]  e.g. ns.resize 2 16G\n  \
         ns.create SIZE [LBA]       in the pool (--pool), e.g. ns.create 8G 4096; private=true\n  \
         ns.attach NSID [CNTLIDS]   e.g. ns.attach 3 1,2 (default: this controller)\n  \
         ns.detach NSID [CNTLIDS]; ns.delete NSID\n  \
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
    api::method(method).map_or(&[], |m| m.positional)
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
        // Checked here first, as the server will: a typo fails before anything is sent.
        let req = Request::parse(&a.method, &params)
            .map_err(|e| format!("{}: {} (error {})", a.method, e.message, e.code))?;
        let wire = serde_json::to_value(&req)?;
        request(&a.control, req.name(), wire["params"].clone(), a.timeout)
            .map_err(|e| format!("{}: {e}", a.method))?
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        print!("{}", human(&a.method, &result));
    }
    Ok(())
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
        assert_eq!(p("ns.attach", &["3", "1,2"]).unwrap(), json!({"nsid": 3, "controllers": "1,2"}));
        // One CNTLID reads as a number; the server takes it as the list it is.
        let one = p("ns.detach", &["3", "2"]).unwrap();
        assert_eq!(one, json!({"nsid": 3, "controllers": 2}));
        let req = crate::control::api::Request::parse("ns.detach", &one).unwrap();
        let crate::control::api::Request::NsDetach(a) = req else { panic!("{req:?}") };
        assert_eq!(a.controllers(7), Ok(vec![2]));
        assert!(
            a.controllers(7).is_ok()
                && crate::control::api::NsAttach { nsid: 3, controllers: None }.controllers(7) == Ok(vec![7])
        );
        assert!(crate::control::api::NsAttach { nsid: 3, controllers: Some("1,x".into()) }
            .controllers(7)
            .is_err());
        assert_eq!(
            p("ns.resize", &["2", "16G", "force"]).unwrap(),
            json!({"nsid": 2, "size": "16G", "force": true})
        );
        assert_eq!(p("ns.resize", &["nsid=2", "size=4096"]).unwrap(), json!({"nsid": 2, "size": 4096}));
        assert_eq!(
            p("log.set", &["info,vnvme::guest=debug"]).unwrap(),
            json!({"filter": "info,vnvme::guest=debug"})
        );
        assert!(p("ns.remove", &["1", "force", "2"]).unwrap_err().contains("unexpected argument"));
        assert_eq!(p("stats.get", &[]).unwrap(), json!({}));
        assert_eq!(
            p("qos.set", &["1", "iops=2000", "bps_wr=20M"]).unwrap(),
            json!({"nsid": 1, "iops": 2000, "bps_wr": "20M"})
        );
        assert_eq!(p("qos.set", &["group=db", "iops=100"]).unwrap(), json!({"group": "db", "iops": 100}));
    }
}
