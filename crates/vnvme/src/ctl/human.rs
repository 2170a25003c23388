//! `vnvme ctl`'s answers as people read them: labelled, with units. `--json` prints
//! the server's result unchanged (sizes in bytes, times in the unit their key names).

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::control::reply;
use nvme_ctrl::{Shown, StatsSnapshot};

/// The result of `method` for people; an answer this build cannot read as its
/// type is shown key by key.
pub(super) fn human(method: &str, r: &Value) -> String {
    fn typed<T: DeserializeOwned>(r: &Value) -> Option<T> {
        serde_json::from_value(r.clone()).ok()
    }
    let text = match method {
        "ctrl.info" => typed(r).map(|i| ctrl_info(&i)),
        "stats.get" => typed(r).map(|st| stats(&st)),
        "ns.list" => typed(r).map(|l: reply::NsList| {
            let rows = l
                .namespaces
                .iter()
                .map(|n| {
                    vec![
                        n.nsid.to_string(),
                        bytes(n.size),
                        format!("{} B", n.lba_size),
                        n.timeout_ms.map_or("none".to_string(), |ms| format!("{ms} ms")),
                        n.backend.clone(),
                    ]
                })
                .collect();
            table(&["NSID", "SIZE", "LBA", "TIMEOUT", "<BACKEND"], rows)
        }),
        "ns.add" => typed(r).map(|n: reply::NsInfo| {
            format!(
                "added namespace {}: {}, {} ({} blocks of {} bytes)\n",
                n.nsid,
                n.backend,
                bytes(n.size),
                n.blocks,
                n.lba_size
            )
        }),
        "ana.set" => typed(r).map(|a: reply::AnaSet| {
            let which = a.group.map_or("every ANA group".to_string(), |g| format!("ANA group {g}"));
            let changed: Vec<String> = a.changed.iter().map(u32::to_string).collect();
            match changed.len() {
                0 => format!("{which}: {} already\n", a.state),
                _ => format!("{which}: {} (changed: group {})\n", a.state, changed.join(", ")),
            }
        }),
        "ana.get" => typed(r).map(|a: reply::AnaGet| {
            let rows = a
                .groups
                .iter()
                .map(|g| {
                    let nsids: Vec<String> = g.nsids.iter().map(u32::to_string).collect();
                    vec![g.group.to_string(), g.state.clone(), nsids.join(",")]
                })
                .collect();
            table(&["GROUP", "<STATE", "<NSIDS"], rows)
        }),
        "ns.remove" => typed(r).map(|n: reply::NsRemoved| format!("removed namespace {}\n", n.nsid)),
        "pool.forget" => typed(r).map(|f: reply::PoolForgot| {
            let nsids: Vec<String> = f.detached.iter().map(u32::to_string).collect();
            format!(
                "controller {} forgotten by the pool; detached from it: {}\n",
                f.cntlid,
                if nsids.is_empty() { "none".into() } else { nsids.join(", ") }
            )
        }),
        "upgrade" => {
            let u = |k: &str| r.get(k).and_then(Value::as_u64).unwrap_or(0);
            Some(format!(
                "upgraded: pid {} -> {} ({}), guest I/O stalled {:.1} ms, {} ms in all{}\n",
                u("old_pid"),
                u("new_pid"),
                r["binary"].as_str().unwrap_or("?"),
                r["stall_ms"].as_f64().unwrap_or(0.0),
                u("took_ms"),
                if r["client"].as_bool() == Some(true) { "" } else { " (no client connected)" }
            ))
        }
        "ns.resize" => typed(r).map(|n: reply::NsResized| {
            format!("namespace {}: {} -> {}\n", n.nsid, bytes(n.old_size), bytes(n.size))
        }),
        "log.set" => {
            typed(r).map(|l: reply::LogSet| format!("log filter: {} (was {})\n", l.filter, l.previous))
        }
        "qos.get" => typed(r).map(|q: reply::QosGet| {
            let rows = q
                .namespaces
                .iter()
                .map(|n| {
                    vec![
                        n.nsid.to_string(),
                        n.group.clone().unwrap_or_else(|| "-".into()),
                        format!("{:.3} s", n.throttled_s),
                        n.limits.as_ref().map_or("none".into(), limits_text),
                    ]
                })
                .collect();
            let mut s = table(&["NSID", "<GROUP", "HELD BACK", "<LIMITS"], rows);
            for g in &q.groups {
                s.push_str(&format!("group {}: {}\n", g.group, limits_text(&g.limits)));
            }
            s
        }),
        "qos.set" => typed(r).map(|q: reply::QosSet| {
            let limits = q.limits.as_ref().map_or("none".into(), limits_text);
            match (q.nsid, q.group) {
                (Some(n), _) => format!("namespace {n}: {limits}\n"),
                (None, g) => format!("group {}: {limits}\n", g.unwrap_or_default()),
            }
        }),
        _ => None,
    };
    text.unwrap_or_else(|| flat(r, ""))
}

/// `ctrl.info`: one labelled line per fact.
fn ctrl_info(i: &reply::CtrlInfo) -> String {
    let f = &i.facts;
    let on = |b: bool| if b { "on" } else { "off" };
    let mut lines = vec![
        ("server", format!("vnvme {} (commit {}), pid {}, up {} s", f.vnvme, f.commit, f.pid, i.uptime_s)),
        ("binary", f.exe.display().to_string()),
        ("socket", f.socket.display().to_string()),
        (
            "identity",
            match f.cntlid {
                Some(id) => format!(
                    "serial {}, controller {id} of its subsystem, PCI vendor:device {}",
                    f.serial, f.pci_id
                ),
                None => format!("serial {}, PCI vendor:device {}", f.serial, f.pci_id),
            },
        ),
        (
            "state",
            format!("{}, client {}", i.state, if i.client_connected { "connected" } else { "not connected" }),
        ),
        ("namespaces", format!("{} (at most {})", i.namespaces, i.max_namespaces)),
        ("I/O queues", format!("{} (workers {}, polling {})", f.io_queues, f.workers, f.poll)),
        ("doorbells", format!("{}, shadow doorbells {}", f.doorbells, on(f.shadow_doorbells))),
        ("DMA regions", format!("{} mapped (at most {})", i.dma_regions, f.max_dma_regions)),
        ("client deadline", format!("{} ms", f.client_deadline_ms)),
        ("sandbox", on(f.sandbox).to_string()),
        ("log", format!("filter {}, format {}", i.log_filter, f.log_format)),
    ];
    if let Some(k) = &f.keeper {
        lines.push((
            "keeper",
            format!("pid {}, {} restart(s) so far (--restart-on-crash)", k.pid, k.restarts),
        ));
    }
    lines.iter().map(|(k, v)| format!("{k:<16} {v}\n")).collect()
}

/// `stats.get`: the controller's counters, then a table per namespace, queue and
/// worker.
fn stats(r: &reply::Stats) -> String {
    let c = &r.controller;
    let per = |n: u64| {
        if c.io_commands == 0 {
            String::new()
        } else {
            format!(" ({:.3} per I/O command)", n as f64 / c.io_commands as f64)
        }
    };
    let mut s = String::from("controller\n");
    // Each counter as its row in nvme-ctrl's `counters!` labels and shows it.
    for (k, v) in StatsSnapshot::COUNTERS.iter().zip(c.values()) {
        let v = match k.shown {
            Shown::Count => v.to_string(),
            Shown::PerIo => format!("{v}{}", per(v)),
            Shown::Bytes => bytes(v),
        };
        s.push_str(&format!("  {:<24} {v}\n", k.label));
    }

    let mut rows = Vec::new();
    let mut held = Vec::new();
    for ns in &r.namespaces {
        for (op, o) in [("read", &ns.read), ("write", &ns.write), ("flush", &ns.flush), ("other", &ns.other)]
        {
            rows.push(vec![
                ns.nsid.to_string(),
                op.to_string(),
                o.commands.to_string(),
                bytes(o.bytes),
                o.errors.to_string(),
                format!("{:.1} us", o.latency_avg_us),
            ]);
        }
        if ns.throttled_commands > 0 {
            held.push(format!(
                "namespace {}: QoS held back {} commands for {:.3} s in all\n",
                ns.nsid, ns.throttled_commands, ns.throttled_s
            ));
        }
        if let Some(st) = &ns.storage {
            held.push(format!(
                "namespace {}: storage {}{}; {} outage(s) ({} past the hold), {:.3} s in all\n",
                ns.nsid,
                st.state,
                if st.waiting > 0 { format!(", {} command(s) waiting", st.waiting) } else { String::new() },
                st.outages,
                st.outages_past_hold,
                st.outage_s
            ));
        }
    }
    s.push_str("\nnamespaces\n");
    s.push_str(&table(&["NSID", "<KIND", "COMMANDS", "DATA", "ERRORS", "AVG LATENCY"], rows));
    s.extend(held);

    let rows = r
        .queues
        .iter()
        .map(|q| {
            vec![
                q.qid.to_string(),
                q.worker.map_or("inline".to_string(), |w| w.to_string()),
                q.commands.to_string(),
                q.completions.to_string(),
                q.interrupts.to_string(),
                q.sq_doorbell_writes.to_string(),
                q.cq_doorbell_writes.to_string(),
            ]
        })
        .collect();
    s.push_str("\nqueues (doorbell writes: trapped ones)\n");
    s.push_str(&table(
        &["QID", "WORKER", "COMMANDS", "COMPLETIONS", "INTERRUPTS", "SQ DOORBELLS", "CQ DOORBELLS"],
        rows,
    ));

    if !r.workers.is_empty() {
        let ms = |ns: u64| format!("{:.1} ms", ns as f64 / 1e6);
        let rows = r
            .workers
            .iter()
            .map(|w| {
                vec![
                    w.worker.to_string(),
                    w.sleeps.to_string(),
                    w.wakeups.to_string(),
                    w.spin_hits.to_string(),
                    w.spin_misses.to_string(),
                    w.spin_contended.to_string(),
                    ms(w.spin_ns),
                    ms(w.spin_lost_ns),
                ]
            })
            .collect();
        s.push_str("\nworkers\n");
        s.push_str(&table(
            &["WORKER", "SLEEPS", "WAKE-UPS", "SPIN HITS", "MISSES", "CONTENDED", "SPINNING", "SPUN IN VAIN"],
            rows,
        ));
    }

    if let Some(p) = &r.adaptive_poll {
        let ns = |v: Option<u64>| v.map_or("not measured".to_string(), |x| format!("{x} ns"));
        s.push_str(&format!(
            "\nadaptive polling: {} now, {} chosen; CPU per command: sleeping {}, spinning {}; {} epochs, {} \
             changes\n",
            p.running,
            p.choice,
            ns(p.cpu_per_command_ns.sleep),
            ns(p.cpu_per_command_ns.spin),
            p.epochs,
            p.changes
        ));
    }
    s
}

/// Rows under a header, columns right-aligned (left-aligned where the header's
/// name starts with '<', which is not printed).
fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let names: Vec<&str> = header.iter().map(|h| h.trim_start_matches('<')).collect();
    let left: Vec<bool> = header.iter().map(|h| h.starts_with('<')).collect();
    let mut width: Vec<usize> = names.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, cell) in width.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (i, cell) in cells.enumerate() {
            if i > 0 {
                l.push_str("  ");
            }
            if left[i] {
                l.push_str(&format!("{cell:<w$}", w = width[i]));
            } else {
                l.push_str(&format!("{cell:>w$}", w = width[i]));
            }
        }
        l.truncate(l.trim_end().len());
        l.push('\n');
        l
    };
    let mut s = line(&mut names.iter().copied());
    for r in &rows {
        s.push_str(&line(&mut r.iter().map(String::as_str)));
    }
    s
}

/// A byte count in the largest binary unit that keeps it at least 1.
pub(super) fn bytes(n: u64) -> String {
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

/// QoS limits as `iops=2000/s (burst 200) bps_wr=20 MiB/s (burst 2 MiB)`, or "none".
fn limits_text(l: &reply::Limits) -> String {
    let parts: Vec<String> = l
        .all()
        .into_iter()
        .filter_map(|(k, r)| r.map(|r| (k, r)))
        .map(|(k, r)| {
            if k.starts_with("bps") {
                format!("{k}={}/s (burst {})", bytes(r.rate), bytes(r.burst))
            } else {
                format!("{k}={}/s (burst {})", r.rate, r.burst)
            }
        })
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
    use serde_json::json;

    #[test]
    fn byte_counts_carry_their_unit() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(4096), "4 KiB");
        assert_eq!(bytes(3 << 29), "1.50 GiB");
        assert_eq!(bytes(16 << 40), "16 TiB");
    }

    #[test]
    fn qos_limits_name_their_rate_and_burst_units() {
        let l = json!({"iops": {"rate": 2000, "burst": 200}, "bps_wr": {"rate": 20 << 20, "burst": 2 << 20}, "bps": null});
        let l: reply::Limits = serde_json::from_value(l).unwrap();
        assert_eq!(limits_text(&l), "iops=2000/s (burst 200) bps_wr=20 MiB/s (burst 2 MiB)");
        assert_eq!(limits_text(&reply::Limits::default()), "none");
    }

    #[test]
    fn ctrl_info_labels_every_fact_with_its_unit() {
        let r = json!({
            "vnvme": "0.1.0", "commit": "abc1234", "pid": 42, "uptime_s": 7, "exe": "/usr/bin/vnvme",
            "socket": "/run/vm1.sock", "serial": "VM1", "pci_id": "4e58:0001", "state": "ready",
            "client_connected": true, "namespaces": 2, "max_namespaces": 1024, "io_queues": 4, "workers": 1,
            "poll": "adaptive", "doorbells": "eventfd", "shadow_doorbells": true, "dma_regions": 3,
            "max_dma_regions": 64, "client_deadline_ms": 5000, "sandbox": false, "log_filter": "info",
            "log_format": "text",
        });
        let s = human("ctrl.info", &r);
        for want in [
            "server           vnvme 0.1.0 (commit abc1234), pid 42, up 7 s\n",
            "state            ready, client connected\n",
            "namespaces       2 (at most 1024)\n",
            "I/O queues       4 (workers 1, polling adaptive)\n",
            "doorbells        eventfd, shadow doorbells on\n",
            "DMA regions      3 mapped (at most 64)\n",
            "client deadline  5000 ms\n",
            "sandbox          off\n",
        ] {
            assert!(s.contains(want), "{want:?} missing from\n{s}");
        }
        assert!(!s.contains('{') && !s.contains('"'), "no JSON in the people's form:\n{s}");
    }

    #[test]
    fn stats_are_tables_with_units() {
        let op = |c: u64, b: u64| json!({"commands": c, "bytes": b, "errors": 0, "latency_avg_us": 12.25});
        let r = json!({
            "controller": {"io_commands": 200, "read_commands": 150, "write_commands": 50, "admin_commands": 9,
                "bytes_read": 150 * 4096, "bytes_written": 50 << 20, "errors": 1, "backend_errors": 1,
                "media_errors": 0, "timeouts": 0, "doorbell_writes": 60, "io_doorbell_writes": 50,
                "io_cq_doorbell_writes": 10, "shadow_reads": 300, "eventidx_races": 2, "interrupts": 100},
            "namespaces": [{"nsid": 1, "read": op(150, 150 * 4096), "write": op(50, 50 << 20), "flush": op(0, 0),
                "other": op(0, 0), "throttled_commands": 3, "throttled_s": 0.5,
                "storage": {"state": "waiting", "waiting": 4, "outages": 2, "outages_past_hold": 1, "outage_s": 27.5}}],
            "queues": [{"qid": 1, "worker": null, "commands": 200, "completions": 200, "interrupts": 100,
                "sq_doorbell_writes": 50, "cq_doorbell_writes": 10}],
            "workers": [],
            "adaptive_poll": {"choice": "spin", "running": "spin", "cpu_per_command_ns": {"sleep": 2100, "spin": null},
                "epochs": 4, "changes": 1},
        });
        let s = human("stats.get", &r);
        for want in [
            "  data read                600 KiB\n",
            "  data written             50 MiB\n",
            "  I/O doorbell writes      50 (0.250 per I/O command)\n",
            "    of them CQ heads       10 (0.050 per I/O command)\n",
            "  interrupts               100 (0.500 per I/O command)\n",
            "  EventIdx races           2\n",
            "NSID  KIND   COMMANDS     DATA  ERRORS  AVG LATENCY\n",
            "   1  write        50   50 MiB       0      12.2 us\n",
            "namespace 1: QoS held back 3 commands for 0.500 s in all\n",
            "namespace 1: storage waiting, 4 command(s) waiting; 2 outage(s) (1 past the hold), 27.500 s in all\n",
            "  1  inline       200          200         100            50            10\n",
            "CPU per command: sleeping 2100 ns, spinning not measured",
        ] {
            assert!(s.contains(want), "{want:?} missing from\n{s}");
        }
        assert!(!s.contains("workers\n"), "no worker table without workers:\n{s}");
    }
}
