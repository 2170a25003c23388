//! `vnvme demo`: the shipped binary drives a controller in its own process with the
//! userspace driver. It must bring the controller up, read back what it wrote on
//! every queue, and report each queue depth's doorbell and interrupt counts.

mod common;

use std::process::Command;
use std::time::Duration;

const VNVME: &str = env!("CARGO_BIN_EXE_vnvme");

/// Runs `vnvme demo ARGS`: its stdout, after checking it exited 0.
fn demo(args: &[&str]) -> String {
    let out = common::output_within(Command::new(VNVME).arg("demo").args(args), Duration::from_secs(60));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "vnvme demo {args:?}: {}\n{stdout}\n{stderr}", out.status);
    stdout.into_owned()
}

/// The closing table: (QD, commands/s, trapped doorbells per command, interrupts per
/// command) for each row.
fn table(stdout: &str) -> Vec<(u32, f64, f64, f64)> {
    stdout
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("QD"))
        .skip(1)
        .map_while(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let [qd, rate, db, irq] = f[..] else { return None };
            Some((qd.parse().ok()?, rate.parse().ok()?, db.parse().ok()?, irq.parse().ok()?))
        })
        .collect()
}

#[test]
fn demo_reads_back_on_every_queue_and_counts_per_depth() {
    let out = demo(&["--ns", "ram:16M", "--ns", "ram:8M:lba=4096", "--queues", "3", "--commands", "300"]);
    assert!(out.contains("shadow doorbells: enabled by the host"), "{out}");
    for ns in 1..=2 {
        assert!(
            out.contains(&format!("namespace {ns}: 64 KiB written and read back on 3 queue(s): ok")),
            "{out}"
        );
    }
    assert!(out.contains("namespace 2 (ram): 8 MiB, 2048 x 4096 B blocks"), "{out}");
    let rows = table(&out);
    assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), [1, 4, 16, 64], "{out}");
    for &(qd, rate, _, irq) in &rows {
        assert!(rate > 0.0, "QD {qd}: no commands/s\n{out}");
        // Every completion is signalled (no coalescing by default), so each command
        // at QD 1 is one interrupt; deeper, one interrupt may cover several.
        assert!(irq > 0.0 && irq <= 1.0 + 1e-9, "QD {qd}: {irq} interrupts per command\n{out}");
    }
    assert!(rows[0].3 >= 0.99, "QD 1: every command interrupts\n{out}");
}

#[test]
fn demo_without_shadow_doorbells_traps_every_submission() {
    let out = demo(&["--ns", "null:64M", "--no-shadow", "--commands", "200"]);
    assert!(out.contains("shadow doorbells: off"), "{out}");
    let rows = table(&out);
    assert_eq!(rows.len(), 4, "{out}");
    // Without a shadow buffer each command's SQ tail is a register write, and at
    // QD 1 so is each CQ head.
    for &(qd, _, db, _) in &rows {
        assert!(db >= 1.0, "QD {qd}: {db} trapped doorbells per command\n{out}");
    }
    assert!(rows[0].2 >= 2.0, "QD 1: SQ tail and CQ head per command\n{out}");
}

#[test]
fn demo_refuses_queues_beyond_the_controller() {
    let out = common::output_within(
        Command::new(VNVME).args(["demo", "--queues", "5000"]),
        Duration::from_secs(30),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--queues 5000"), "{err}");
}
