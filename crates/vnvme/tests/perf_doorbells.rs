//! `vnvme perf --doorbells auto` (the default) uses what the controller offers:
//! shadow doorbells where it has Doorbell Buffer Config, else the doorbell page
//! the server maps (as SPDK's target offers it), else trapped writes (issue 50).

mod common;

use std::process::Command;

use common::Server;

const VNVME: &str = env!("CARGO_BIN_EXE_vnvme");

/// `vnvme perf` for a moment against `s` with its default doorbells: what it used.
fn doorbells_used(s: &Server) -> String {
    let out = Command::new(VNVME)
        .args(["perf", "--socket"])
        .arg(&s.socket)
        .args(["--runtime", "300ms", "--qd", "4", "--json", "-"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}\n{}", s.log());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(v["results"]["errors"], 0, "{v}");
    v["knobs"]["doorbells"].as_str().unwrap().to_string()
}

#[test]
fn auto_doorbells_use_what_the_controller_offers() {
    let shadow = Server::start_with(&["--ns", "null:64M"]);
    assert_eq!(doorbells_used(&shadow), "shadow");
    let mapped = Server::start_with(&["--ns", "null:64M", "--no-shadow-doorbells", "--doorbells", "mapped"]);
    assert_eq!(doorbells_used(&mapped), "mapped");
    let trapped = Server::start_with(&["--ns", "null:64M", "--no-shadow-doorbells"]);
    assert_eq!(doorbells_used(&trapped), "trapped");
}
