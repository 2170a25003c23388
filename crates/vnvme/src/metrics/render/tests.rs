use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use nvme_ctrl::{QueueSnapshot, StatsSnapshot, Verdict, LATENCY_BUCKETS};

use super::*;
use crate::metrics::NsScrape;

/// A backend description with every character the format must escape.
const AWKWARD_BACKEND: &str = "file:/srv/a \"b\"\\c.img\nnext";

fn op(commands: u64, bytes: u64, errors: u64, buckets: &[(usize, u64)], sum_ns: u64) -> OpSnapshot {
    let mut latency = [0; LATENCY_BUCKETS];
    for &(i, n) in buckets {
        latency[i] = n;
    }
    OpSnapshot { commands, bytes, errors, latency, latency_sum_ns: sum_ns }
}

/// Two namespaces, two queues, one worker.
fn fixture() -> Scrape {
    Scrape {
        version: "0.1.0".into(),
        commit: "0123456789ab".into(),
        serial: "VN0001".into(),
        state: "ready".into(),
        client_connected: true,
        dma_regions: 3,
        uptime_s: 42,
        controller: StatsSnapshot {
            admin_commands: 7,
            io_commands: 5,
            errors: 1,
            doorbell_writes: 9,
            io_doorbell_writes: 3,
            shadow_reads: 20,
            eventidx_races: 1,
            interrupts: 4,
            ..Default::default()
        },
        namespaces: vec![
            NsScrape {
                nsid: 1,
                size_bytes: 1 << 30,
                lba_size: 512,
                backend: "ram".into(),
                stats: NsStatsSnapshot {
                    // 5 µs, 8 µs (first bucket) and 700 µs (the 1 ms bucket).
                    read: op(3, 12288, 1, &[(0, 2), (6, 1)], 713_000),
                    // 60 µs (the 100 µs bucket) and 20 s (above every bound).
                    write: op(2, 8192, 0, &[(3, 1), (19, 1)], 20_000_060_000),
                    throttled_commands: 4,
                    throttled_ns: 1_500_000_000,
                    ..Default::default()
                },
                storage: None,
                ana: Some((1, "inaccessible")),
            },
            NsScrape {
                nsid: 2,
                size_bytes: 4 << 30,
                lba_size: 4096,
                backend: AWKWARD_BACKEND.into(),
                stats: NsStatsSnapshot::default(),
                // Waiting for its second outage; the first lasted 2.1 s.
                storage: Some(StorageReport {
                    state: StorageState::Waiting,
                    waiting: 5,
                    outages: 2,
                    outages_past_hold: 0,
                    outage_buckets: [0, 0, 0, 0, 1, 0, 0, 0, 0],
                    outage_ms_sum: 2100,
                }),
                ana: None,
            },
        ],
        queues: vec![
            QueueSnapshot {
                qid: 0,
                worker: None,
                commands: 7,
                completions: 7,
                interrupts: 1,
                ..Default::default()
            },
            QueueSnapshot {
                qid: 1,
                worker: Some(0),
                commands: 5,
                sq_doorbell_writes: 2,
                cq_doorbell_writes: 1,
                completions: 5,
                interrupts: 3,
            },
        ],
        workers: vec![WorkerScrape {
            index: 0,
            sleeps: 4,
            wakeups: 3,
            spin_hits: 10,
            spin_misses: 4,
            spin_contended: 1,
            spin_ns: 1_500_000_000,
            spin_lost_ns: 250_000_000,
        }],
        poll: Some(Verdict {
            choice: Regime::Sleep,
            running: Regime::Sleep,
            cost_ns: [Some(21_000), Some(52_500)],
            epochs: 120,
            changes: 1,
        }),
        keeper_restarts: Some(2),
        pool: Some(crate::metrics::PoolScrape {
            capacity: 64 << 20,
            unallocated: 56 << 20,
            namespaces: 2,
            attached_here: 1,
        }),
    }
}

/// The value of the sample written exactly as `series` (name and labels).
fn sample(text: &str, series: &str) -> Option<String> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ').map(str::to_owned))
}

#[test]
fn exact_lines() {
    let text = render(&fixture());
    for line in [
        "# TYPE vnvme_info gauge",
        "vnvme_info{version=\"0.1.0\",commit=\"0123456789ab\",serial=\"VN0001\"} 1",
        "vnvme_controller_state{state=\"disabled\"} 0",
        "vnvme_controller_state{state=\"ready\"} 1",
        "vnvme_controller_state{state=\"shut-down\"} 0",
        "vnvme_controller_state{state=\"fatal\"} 0",
        "vnvme_client_connected 1",
        "vnvme_dma_regions 3",
        "vnvme_uptime_seconds 42",
        "# TYPE vnvme_admin_commands_total counter",
        "vnvme_admin_commands_total 7",
        "vnvme_command_errors_total 1",
        "vnvme_shadow_doorbell_reads_total 20",
        "vnvme_command_timeouts_total 0",
        "vnvme_namespace_size_bytes{nsid=\"2\"} 4294967296",
        "vnvme_pool_capacity_bytes 67108864",
        "vnvme_pool_unallocated_bytes 58720256",
        "vnvme_pool_namespaces{attached=\"any\"} 2",
        "vnvme_pool_namespaces{attached=\"here\"} 1",
        "# TYPE vnvme_keeper_restarts_total counter",
        "vnvme_keeper_restarts_total 2",
        "vnvme_namespace_lba_bytes{nsid=\"1\"} 512",
        "vnvme_namespace_info{nsid=\"1\",backend=\"ram\"} 1",
        "vnvme_namespace_ana_state{nsid=\"1\",group=\"1\",state=\"optimized\"} 0",
        "vnvme_namespace_ana_state{nsid=\"1\",group=\"1\",state=\"inaccessible\"} 1",
        "vnvme_namespace_ana_state{nsid=\"1\",group=\"1\",state=\"change\"} 0",
        "vnvme_namespace_commands_total{nsid=\"1\",op=\"read\"} 3",
        "vnvme_namespace_bytes_total{nsid=\"1\",op=\"write\"} 8192",
        "vnvme_namespace_errors_total{nsid=\"1\",op=\"read\"} 1",
        "vnvme_namespace_commands_total{nsid=\"2\",op=\"other\"} 0",
        "# TYPE vnvme_namespace_latency_seconds histogram",
        "vnvme_namespace_latency_seconds_bucket{nsid=\"1\",op=\"read\",le=\"1e-05\"} 2",
        "vnvme_namespace_latency_seconds_bucket{nsid=\"1\",op=\"read\",le=\"0.0005\"} 2",
        "vnvme_namespace_latency_seconds_bucket{nsid=\"1\",op=\"read\",le=\"0.001\"} 3",
        "vnvme_namespace_latency_seconds_bucket{nsid=\"1\",op=\"write\",le=\"10\"} 1",
        "vnvme_namespace_latency_seconds_bucket{nsid=\"1\",op=\"write\",le=\"+Inf\"} 2",
        "vnvme_namespace_latency_seconds_sum{nsid=\"1\",op=\"read\"} 0.000713",
        "vnvme_namespace_latency_seconds_count{nsid=\"1\",op=\"read\"} 3",
        "vnvme_namespace_qos_throttled_commands_total{nsid=\"1\"} 4",
        "vnvme_namespace_qos_throttled_seconds_total{nsid=\"1\"} 1.5",
        "# TYPE vnvme_namespace_storage_state gauge",
        "vnvme_namespace_storage_state{nsid=\"2\",state=\"up\"} 0",
        "vnvme_namespace_storage_state{nsid=\"2\",state=\"waiting\"} 1",
        "vnvme_namespace_storage_state{nsid=\"2\",state=\"gone\"} 0",
        "vnvme_namespace_storage_waiting_commands{nsid=\"2\"} 5",
        "vnvme_namespace_storage_outages_total{nsid=\"2\"} 2",
        "vnvme_namespace_storage_outages_past_hold_total{nsid=\"2\"} 0",
        "vnvme_namespace_storage_outage_seconds_bucket{nsid=\"2\",le=\"2\"} 0",
        "vnvme_namespace_storage_outage_seconds_bucket{nsid=\"2\",le=\"5\"} 1",
        "vnvme_namespace_storage_outage_seconds_bucket{nsid=\"2\",le=\"+Inf\"} 1",
        "vnvme_namespace_storage_outage_seconds_sum{nsid=\"2\"} 2.1",
        "vnvme_namespace_storage_outage_seconds_count{nsid=\"2\"} 1",
        "vnvme_queue_commands_total{qid=\"0\",worker=\"controller\"} 7",
        "vnvme_queue_sq_doorbell_writes_total{qid=\"1\",worker=\"0\"} 2",
        "vnvme_queue_interrupts_total{qid=\"1\",worker=\"0\"} 3",
        "vnvme_worker_sleeps_total{worker=\"0\"} 4",
        "vnvme_worker_spin_seconds_total{worker=\"0\"} 1.5",
        "vnvme_worker_spin_lost_seconds_total{worker=\"0\"} 0.25",
        "# TYPE vnvme_adaptive_poll_spinning gauge",
        "vnvme_adaptive_poll_spinning 0",
        "vnvme_adaptive_poll_cpu_per_command_seconds{regime=\"sleep\"} 0.000021",
        "vnvme_adaptive_poll_cpu_per_command_seconds{regime=\"spin\"} 0.0000525",
        "vnvme_adaptive_poll_epochs_total 120",
        "vnvme_adaptive_poll_choice_changes_total 1",
    ] {
        assert!(text.lines().any(|l| l == line), "missing line {line:?} in:\n{text}");
    }
    assert!(text.ends_with('\n'));
}

#[test]
fn label_values_are_escaped() {
    let text = render(&fixture());
    let want = r#"vnvme_namespace_info{nsid="2",backend="file:/srv/a \"b\"\\c.img\nnext"} 1"#;
    assert!(text.lines().any(|l| l == want), "no {want} in:\n{text}");
}

#[test]
fn histogram_buckets_are_cumulative_and_end_at_the_count() {
    let s = fixture();
    let text = render(&s);
    for ns in &s.namespaces {
        for (name, of) in OPS {
            let labels = format!("nsid=\"{}\",op=\"{name}\"", ns.nsid);
            let prefix = format!("vnvme_namespace_latency_seconds_bucket{{{labels},le=");
            let buckets: Vec<(String, u64)> = text
                .lines()
                .filter_map(|l| l.strip_prefix(&prefix))
                .map(|rest| {
                    let (le, v) = rest.split_once("} ").expect("le and value");
                    (le.trim_matches('"').to_owned(), v.parse().expect("an integer"))
                })
                .collect();
            assert_eq!(buckets.len(), LATENCY_BUCKETS, "{labels}");
            assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "not cumulative: {buckets:?}");
            let (last_le, inf) = buckets.last().expect("buckets").clone();
            assert_eq!(last_le, "+Inf");
            let count = sample(&text, &format!("vnvme_namespace_latency_seconds_count{{{labels}}}"));
            assert_eq!(count, Some(inf.to_string()), "{labels}: +Inf must equal _count");
            assert_eq!(inf, of(&ns.stats).commands, "{labels}");
        }
    }
}

#[test]
fn every_family_has_help_then_type_and_every_sample_a_family() {
    let text = render(&fixture());
    let lines: Vec<&str> = text.lines().collect();
    let mut families = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            let (name, _) = rest.split_once(' ').expect("name and type");
            let help = lines[i - 1].strip_prefix("# HELP ").expect("HELP before TYPE");
            assert!(help.starts_with(&format!("{name} ")) && help.len() > name.len() + 20, "{help}");
            families.push(name.to_owned());
        }
    }
    // Every controller counter is its own family (from nvme-ctrl's `counters!`).
    assert_eq!(families.len(), 40 + StatsSnapshot::COUNTERS.len(), "{families:?}");
    for c in StatsSnapshot::COUNTERS {
        let name = format!("vnvme_{}_total", c.metric);
        assert!(families.contains(&name), "{name} missing: {families:?}");
    }
    for l in lines.iter().filter(|l| !l.starts_with('#')) {
        let name = l.split(['{', ' ']).next().expect("a name");
        let base = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s));
        assert!(families.iter().any(|f| f == name || Some(f.as_str()) == base), "{name} has no HELP/TYPE");
    }
}

/// promtool on PATH, or where scripts/lib/promtool.sh keeps it.
fn promtool() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let cache = std::env::var_os("VNVME_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/vnvme")))
        .map(|c| c.join("promtool/bin/promtool"));
    std::env::split_paths(&path).map(|d| d.join("promtool")).chain(cache).find(|p| p.is_file())
}

#[test]
fn promtool_check_metrics_accepts_it() {
    let Some(promtool) = promtool() else {
        test_util::skip(
            "promtool not found on PATH or in the vnvme cache, so the exposition text was not \
             validated by Prometheus's own checker; `bash scripts/lib/promtool.sh` fetches it \
             (Debian's prometheus package, downloaded, not installed)",
        );
        return;
    };
    let empty = Scrape { state: "disabled".into(), ..Default::default() };
    for s in [fixture(), empty] {
        let text = render(&s);
        let mut child = Command::new(&promtool)
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run promtool");
        child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write to promtool");
        let out = child.wait_with_output().expect("promtool exits");
        assert!(
            out.status.success(),
            "promtool check metrics refused:\n{}{}\n--- the text:\n{text}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        println!("promtool ({}) accepted {} lines", promtool.display(), text.lines().count());
    }
}
