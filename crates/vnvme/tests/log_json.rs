//! `--log-format json`: every line vnvme writes to stderr is one JSON object, shaped
//! as tracing's (timestamp, level, fields.message, target), so `2>&1 | jq` reads
//! the whole log: the start-up, stop and summary lines vnvme writes itself, a
//! keeper's, and an error that ends the program, as well as the tracing lines.

mod common;

use std::process::{Command, Stdio};

use common::Server;

/// Each line of `log` as JSON, checked for tracing's shape; panics naming the
/// first line that is not.
fn json_lines(log: &str) -> Vec<serde_json::Value> {
    assert!(!log.is_empty(), "nothing was logged");
    log.lines()
        .map(|line| {
            let v: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}\n\n{log}"));
            for key in ["timestamp", "level", "target"] {
                assert!(v[key].is_string(), "no {key}: {line}");
            }
            assert!(v["fields"]["message"].is_string(), "no fields.message: {line}");
            v
        })
        .collect()
}

fn messages(lines: &[serde_json::Value]) -> Vec<&str> {
    lines.iter().filter_map(|v| v["fields"]["message"].as_str()).collect()
}

/// A server's whole life: start-up, a client's I/O (tracing lines at info), a stop
/// by SIGTERM and the summary.
#[test]
fn a_served_session_logs_json_lines_only() {
    let dir = common::temp_dir("log-json");
    let control = dir.join("c.ctl");
    let control = control.to_str().unwrap();
    let mut s = Server::start_in(&dir, "s", &["--log-format", "json", "--control", control]).owning_dir();
    {
        let opts = common::opts(1, true, nvme_driver::CompletionMode::Polling);
        let mut d = s.driver(nvme_driver::DoorbellMode::Trapped, opts);
        let data = test_util::pattern(5, 8192);
        d.write(1, 0, &data).unwrap();
        d.shutdown().unwrap();
    }
    s.signal(libc::SIGTERM);
    let st = s.wait_exit().unwrap_or_else(|| panic!("did not stop:\n{}", s.log()));
    assert!(st.success(), "{st}:\n{}", s.log());
    let lines = json_lines(&s.log());
    let said = messages(&lines);
    for needle in ["serving 1 namespace(s)", "stopped by SIGTERM", "I/O commands"] {
        assert!(said.iter().any(|m| m.contains(needle)), "no line says {needle:?}:\n{}", s.log());
    }
    assert!(lines.iter().any(|v| v["target"] == "vnvme" && v["level"] == "INFO"), "{}", s.log());
    assert!(lines.iter().any(|v| v["target"] != "vnvme"), "no tracing line:\n{}", s.log());
}

/// Under --restart-on-crash the keeper writes to the same stderr.
#[test]
fn a_keeper_logs_json_lines_too() {
    let mut s = Server::start_with(&["--log-format", "json", "--restart-on-crash"]);
    s.stats_after(0);
    s.signal(libc::SIGTERM);
    let st = s.wait_exit().unwrap_or_else(|| panic!("did not stop:\n{}", s.log()));
    assert!(st.success(), "{st}:\n{}", s.log());
    let lines = json_lines(&s.log());
    assert!(lines.iter().any(|v| v["target"] == "vnvme::keeper"), "no keeper line:\n{}", s.log());
}

/// The error that ends a command is an ERROR line; only clap's own errors about
/// the command line come before the format is known (docs/USAGE.md says so).
#[test]
fn an_error_that_ends_the_program_is_a_json_line() {
    let dir = common::temp_dir("log-json-error");
    let out = Command::new(env!("CARGO_BIN_EXE_vnvme"))
        .args(["--log-format", "json", "--log", "x=[", "serve", "--socket", "no/such/dir/s.sock"])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let log = String::from_utf8_lossy(&out.stderr);
    let lines = json_lines(&log);
    assert_eq!(lines.last().unwrap()["level"], "ERROR", "{log}");
    assert!(messages(&lines).last().unwrap().contains("no/such/dir"), "{log}");
    assert!(lines
        .iter()
        .any(|v| v["level"] == "WARN" && v["fields"]["message"].as_str().unwrap().contains("--log")));
    let _ = std::fs::remove_dir_all(&dir);
}
