#!/usr/bin/env python3
"""The report of the mock-host doorbell microbenchmark
(`cargo bench -p nvme-ctrl --bench doorbells`, crates/nvme-ctrl/benches/doorbells.rs).

Usage: bench-doorbells.py DIR

The bench measures and writes DIR/results.json (its knobs, the facts only it
knows: crate version, git commit, rustc, build profile, command line; every
point's median/min/max and raw counters; the seed reference), then runs this
script, which
- completes the machine description in results.json from
  scripts/lib/vnvme_report.py (host(): CPU, cores, kernel), unless the file
  already has one (a run drawn again later keeps the machine it ran on);
- writes DIR/table.md (printed too) and DIR/chart.svg, drawn by the same
  module as every other benchmark's chart.

Standard library only.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from vnvme_report import bar_chart, host, log, machine_line, machine_md  # noqa: E402

COLORS = {("randread", False): "#d95f02", ("randread", True): "#1f78b4",
          ("randwrite", False): "#fdb863", ("randwrite", True): "#a6cee3"}


def describe(doc):
    """Adds host() to the bench's own facts, once; True if it did."""
    m = doc.setdefault("machine", {})
    if m.get("cpu_model"):
        return False
    m.update(host())
    m["crate"] = "nvme-ctrl"
    m["described_by"] = "the bench (crate, commit, rustc, build, date); scripts/lib/vnvme_report.py host() (the rest)"
    return True


def rate(v):
    return f"{v / 1e6:.2f} M" if v >= 1e6 else f"{v / 1e3:.1f} k"


def spread(s, f):
    """`median [min–max]`, or the value alone when every run agreed."""
    if s["min"] == s["max"]:
        return f(s["median"])
    return f"{f(s['median'])} [{f(s['min'])}–{f(s['max'])}]"


def header(doc):
    m, k = doc["machine"], doc["knobs"]
    m = dict(m, crate=m.get("crate", "nvme-ctrl"))
    L = ["- benchmark: nvme-ctrl/benches/doorbells.rs (null namespace, mock host, one thread)"]
    L += machine_md(m)
    if m.get("command_line"):
        L.append(f"- command: `{' '.join(m['command_line'])}`")
    L += [
        f"- commands per run: {k['commands']}",
        f"- runs per point: {k['repeat']} (median [min–max] shown)",
        f"- queue depths: {', '.join(str(q) for q in k['qd'])}",
        f"- workloads: {', '.join(k['workloads'])}, {k['block_bytes']} B each",
        f"- controller: default ControllerConfig, {k['io_queues']} I/O queue pair of {k['queue_entries']} entries, "
        f"admin queue {k['admin_queue_entries']}, {k['interrupts']}",
        f"- namespace: {k['backend']} of {k['namespace_bytes'] >> 30} GiB, LBA format {k['lba_format']} (4 KiB)",
        f"- offsets: {k['rng']}",
        f"- host model: {k['host_model']}",
        f"- commands/s: {k['timing']}",
    ]
    return L


def table(doc):
    seed = doc["seed_reference"]
    L = ["## vnvme mock host doorbell microbenchmark", ""] + header(doc)
    L += ["", "### Measured (this run)", "",
          "| workload | QD | shadow doorbells | commands/s (1 thread, host+device) | trapped I/O doorbell writes/cmd | "
          "all doorbell writes/cmd (incl. admin) | interrupts/cmd | EventIdx races caught | shadow reads/cmd |",
          "|---|--:|---|--:|--:|--:|--:|--:|--:|"]
    r3, r4 = (lambda v: f"{v:.3f}"), (lambda v: f"{v:.4f}")
    for p in doc["measured"]:
        L.append(f"| {p['workload']} | {p['qd']} | {'on' if p['shadow_doorbells'] else 'off'} | "
                 f"{spread(p['commands_per_sec'], rate)} | {spread(p['trapped_io_doorbells_per_cmd'], r4)} | "
                 f"{spread(p['total_doorbells_per_cmd'], r4)} | {spread(p['interrupts_per_cmd'], r3)} | "
                 f"{spread(p['eventidx_races'], lambda v: f'{v:.0f}')} | {spread(p['shadow_reads_per_cmd'], r3)} |")
    L += ["", f"### {seed['label']}: not measured here", "", f"{seed['source']}. {seed['setup']}.", "",
          "| | " + " | ".join(f"QD {q}" for q in seed["qd"]) + " |", "|---|" + "--:|" * len(seed["qd"])]
    for name, key, f in [("QEMU, MMIO writes per I/O", "mmio_per_io_qemu", lambda v: f"{v:.2f}"),
                         ("QEMU +dbbuf, MMIO writes per I/O", "mmio_per_io_qemu_dbbuf", lambda v: f"{v:.2f}"),
                         ("QEMU, IOPS", "iops_qemu", lambda v: f"{v / 1e3:.1f} k"),
                         ("QEMU +dbbuf, IOPS", "iops_qemu_dbbuf", lambda v: f"{v / 1e3:.1f} k")]:
        L.append(f"| {name} | " + " | ".join(f(v) for v in seed[key]) + " |")
    return "\n".join(L) + "\n"


def chart(doc):
    m, k, seed = doc["machine"], doc["knobs"], doc["seed_reference"]
    groups = [f"QD {q}" for q in k["qd"]]
    series = []
    for w in k["workloads"]:
        for shadow in (False, True):
            pts = {f"QD {p['qd']}": p for p in doc["measured"]
                   if p["workload"] == w and p["shadow_doorbells"] == shadow}
            series.append({"name": f"{w}, {'shadow doorbells' if shadow else 'no shadow'}",
                           "color": COLORS.get((w, shadow), "#888888"), "values": pts})

    def metric(key):
        return {"value": lambda p: p[key]["median"], "spread": lambda p: (p[key]["min"], p[key]["max"])}

    seed_series = [
        {"name": "QEMU hw/nvme, no shadow doorbells", "color": "#969696",
         "values": {f"QD {q}": v for q, v in zip(seed["qd"], seed["mmio_per_io_qemu"])}},
        {"name": "QEMU hw/nvme +dbbuf (shadow doorbells)", "color": "#525252",
         "values": {f"QD {q}": v for q, v in zip(seed["qd"], seed["mmio_per_io_qemu_dbbuf"])}},
    ]
    panels = [
        dict(metric("trapped_io_doorbells_per_cmd"), label="Trapped I/O doorbell writes per command "
             "(lower is better) — measured", ylabel="trapped doorbell writes / command",
             xlabel="queue depth (fio iodepth)",
             guide=(0.1, "issue target at QD ≥ 16: < 0.1"), labels=lambda v: f"{v:.3f}"),
        dict(metric("commands_per_sec"), label="Commands per second, one thread running host and device — "
             "measured (median; whiskers min–max)", ylabel="commands / s",
             xlabel="queue depth (fio iodepth)",
             labels=lambda v: rate(v).replace(" ", ""), tick=lambda v: f"{v / 1e6:g}M" if v else "0"),
        {"label": f"{seed['label']} — NOT our measurement: MMIO writes per I/O (perf-kvm), fio randread 4 KiB",
         "value": lambda v: v, "groups": [f"QD {q}" for q in seed["qd"]], "series": seed_series,
         "ylabel": "MMIO writes / I/O", "xlabel": "queue depth (fio iodepth)", "labels": lambda v: f"{v:.2f}", "background": "#f3f3f3", "height": 300},
    ]
    knobs = (f"{k['commands']} commands × {k['repeat']} runs per point · null namespace · 4 KiB I/O · 1 I/O queue "
             f"of {k['queue_entries']} entries · host and device in one thread (no VM exits)")
    return bar_chart("vnvme: shadow doorbells in the mock host microbenchmark", None, groups, series, panels,
                     legend_w=300, subtitle=[f"nvme-ctrl {m.get('crate_version', '?')} · " + machine_line(m), knobs])


def main():
    if len(sys.argv) != 2:
        log("usage: bench-doorbells.py DIR")
        return 2
    d = sys.argv[1]
    path = os.path.join(d, "results.json")
    with open(path) as f:
        doc = json.load(f)
    if describe(doc):
        with open(path, "w") as f:
            f.write(json.dumps(doc, indent=2) + "\n")
    md = table(doc)
    with open(os.path.join(d, "table.md"), "w") as f:
        f.write(md)
    with open(os.path.join(d, "chart.svg"), "w") as f:
        f.write(chart(doc))
    print(md)
    log(f"wrote {d}/{{results.json,table.md,chart.svg}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
