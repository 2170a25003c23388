#!/usr/bin/env python3
"""Aggregates a scripts/bench-vfio-user.sh run: reads runs/manifest.tsv and the
per-run `vnvme perf --json` files, and writes results.json, table.md and chart.svg
(hand-written SVG, no plotting library) into the run folder, then prints the table.

Standard library only; what it shares with the guest benchmark's report (the machine
description, run statistics, the SVG panels) is in scripts/lib/vnvme_report.py.
Two paired designs, one set of functions (pair_point, pairs_md, ratio_chart):
- --reference CONFIG (the default, trapped): every other configuration's runs are
  paired by repetition with the reference's run right beside them; ratios
  configuration / reference (chart.svg; the figures go to chart-absolute.svg).
- --baseline (runs/binaries.tsv names a "base" binary): the runs of the two builds
  paired by repetition; ratios new / base (chart.svg; the new build's own figures
  go to chart-new.svg).
Either way: IOPS, server CPU per I/O and client CPU per I/O ratios, each a median
with an interval and a verdict (table.md, and printed at the end), every pair
with its disturbance flags (results.json).

- --peer-spdk (runs/peer.tsv is there): vnvme beside SPDK's vfio-user target,
  paired by repetition as --baseline pairs two builds, once per client (vnvme perf,
  spdk_nvme_perf); ratios vnvme / SPDK (chart.svg for the first client,
  chart-client-spdk.svg for spdk_nvme_perf when both ran).

Run by bench-vfio-user.sh; can be re-run on a folder:
  python3 scripts/bench-vfio-user.py --dir results/vfio-user-perf/<stamp> --root . ...

bench-vfio-user.sh also runs SPDK's client through it, to read the CPU clocks over
the client's own measuring window (run_spdk_perf):
  python3 scripts/bench-vfio-user.py --run-spdk-perf --json FILE --server-pid PID -- spdk_nvme_perf ...
"""

import argparse
import csv
import datetime
import json
import re
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from vnvme_report import (  # noqa: E402
    BOOTSTRAP_MIN_PAIRS, DISTURBED_OTHER_CPUS, DISTURBED_STEAL, bar_panel, bounds, cores_busy, disturbance, legend,
    log, log_panel, machine, machine_line, machine_md, median, other_cpus, ratio_bounds, ratio_summary, ratio_ticks,
    spread, steal_share, sum_opt, svg_doc, title_block)

# The seed's ablation table (QEMU hw/nvme under KVM, fio randread 4 KiB, Linux 5.15
# guest, 96-core Xeon Gold 6248R; seed 002, "NVMe Emulation Performance
# Optimization", KVM Forum 2022). KIOPS. A reference, not a measurement of ours.
SEED_SOURCE = "seed 002 (Jinhao Fan, QEMU hw/nvme, KVM Forum 2022): fio randread 4 KiB, KVM guest, Xeon Gold 6248R"
SEED_QD = [1, 4, 16, 64]
SEED_KIOPS = [
    ("QEMU nvme", [31, 30, 30, 30]),
    ("+shadow db", [35, 121, 176, 153]),
    ("+ioeventfd", [41, 133, 258, 313]),
    ("+irqfd", [41, 136, 242, 338]),
    ("+iothread", [53, 155, 245, 309]),
    ("nvme+polling", [123, 165, 189, 191]),
    ("virtio-blk", [59, 185, 260, 256]),
]

COLORS = {
    "trapped": "#d62728",
    "shadow": "#1f77b4",
    "eventfd": "#2ca02c",
    "mapped": "#9467bd",
    "mapped-poll": "#ff7f0e",
    "shadow-poll": "#17becf",
    "shadow-cpoll": "#aec7e8",
    "eventfd-poll": "#8c564b",
    "inproc": "#555555",
    "inproc-poll": "#000000",
    "inproc-inline": "#bcbd22",
}
FALLBACK = ["#e377c2", "#7f7f7f", "#aec7e8", "#98df8a"]

METRICS = {
    "iops": "I/Os completed / elapsed seconds (vnvme perf)",
    "p50_us": "median submit-to-reap latency, us (log-linear histogram)",
    "p99_us": "99th percentile latency, us",
    "trapped_db_per_io": "server --stats-file delta io_doorbell_writes / io_commands: I/O doorbell writes that "
    "reached the controller as trapped register writes (REGION_WRITE; in-process: function calls)",
    "irq_per_io": "server --stats-file delta interrupts / io_commands",
    "driver_db_per_io": "driver's own SQ+CQ doorbell rings / I/O: REGION_WRITE messages (trapped/shadow), "
    "eventfd signals (eventfd), stores into the mapped page (mapped)",
    "client_cpu_us_per_io": "perf process CPU time (CLOCK_PROCESS_CPUTIME_ID) over the run / I/Os; in-process "
    "minus the controller worker threads",
    "server_cpu_us_per_io": "serve process utime+stime (/proc/PID/stat, USER_HZ ticks) over the same window / "
    "I/Os; in-process: the vnvme-q* worker threads",
    "cores_busy": "(client CPU + server CPU) / elapsed: how many of the machine's CPUs the point kept busy",
    "other_cpus": "CPUs busy system-wide (/proc/stat) minus client and server, over the perf command's wall "
    "time: load from anything else on the machine (includes perf start-up and shutdown, so slightly high)",
}
RUN_FIGURES = {
    "steal": "share of all CPU time the hypervisor stole over the perf command's wall time (/proc/stat steal / "
    "all fields)",
    "other_procs_cpus": "other_cpus without steal: CPUs kept busy by processes other than client and server",
    "c2c_ns": "--pin: a cache line's round trip between the client's CPU and the server's (core_to_core), ns, "
    "before and after the run's target ran",
}
# A pair whose four round trips (two runs, before and after each) differ by more
# than this factor ran on two placements of the host's vCPUs: flagged disturbed.
C2C_MOVED = 2.0


CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---- SPDK's client, run and measured (--run-spdk-perf)


def proc_cpu_s(pid):
    """utime + stime of process pid (all its threads), seconds; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def sys_ticks():
    """/proc/stat's cpu line as (busy, steal, total) ticks, as scripts/lib/host.sh's
    vn_cpu_ticks reads it."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
    return busy, v[7], busy + v[3] + v[4]


# spdk_nvme_perf's summary: "Total : IOPS MiB/s average min max" (latency in µs).
SPDK_TOTAL = re.compile(r"^Total\s*:\s*([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)")


def run_spdk_perf(argv):
    """Runs spdk_nvme_perf (the command after --), its output line-buffered
    (stdbuf -oL) and copied to stdout; reads the client's, the server's
    (--server-pid) and the machine's CPU clocks when it prints "Launching workers"
    (its I/O starts) and again at its "Total" line (its I/O is over), and writes
    --json in the shape `vnvme perf --json` has (what SPDK's client does not say,
    null), with that window. Exits with the client's status, or 1 without a Total
    line; the JSON then says why ("error")."""
    ap = argparse.ArgumentParser(prog="bench-vfio-user.py --run-spdk-perf")
    ap.add_argument("--json", required=True)
    ap.add_argument("--server-pid", type=int, default=0)
    ap.add_argument("--grace", type=float, default=50, help="seconds past -t before the client is killed")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no spdk_nvme_perf command after --")
    secs = float(cmd[cmd.index("-t") + 1]) if "-t" in cmd else 0.0
    if not shutil.which("stdbuf"):
        # Block-buffered into a pipe, both lines would come at its exit: no window.
        log("--run-spdk-perf needs stdbuf (coreutils) to read spdk_nvme_perf's lines as they come")
        return 2
    cmd = ["stdbuf", "-oL"] + cmd
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def stop(*_):
        p.kill()
    signal.signal(signal.SIGTERM, stop)
    timer = threading.Timer(secs + a.grace, stop)
    timer.daemon = True
    timer.start()

    def sample():
        return {"t": time.monotonic(), "client": proc_cpu_s(p.pid),
                "server": proc_cpu_s(a.server_pid) if a.server_pid else None, "sys": sys_ticks()}

    start = end = total = None
    lines = []
    for raw in p.stdout:
        line = raw.decode(errors="replace").rstrip("\r\n")
        if start is None and "Launching workers" in line:
            start = sample()
        elif start is not None and end is None and SPDK_TOTAL.match(line):
            end = sample()
            total = SPDK_TOTAL.match(line)
        lines.append(line)
        print(line, flush=True)
    rc = p.wait()
    timer.cancel()
    out = {"tool": "spdk_nvme_perf", "command": cmd, "exit_status": rc,
           "transport": "vfio-user (SPDK's NVMe driver, spdk_nvme_perf)",
           "knobs": {"qd": int(cmd[cmd.index("-q") + 1]) if "-q" in cmd else None,
                     "bs": int(cmd[cmd.index("-o") + 1]) if "-o" in cmd else None,
                     "rw": cmd[cmd.index("-w") + 1] if "-w" in cmd else None, "runtime_s": secs,
                     "queues": 1, "completion": "poll (SPDK's client always polls)", "doorbells": None},
           "error": None}
    if total and start and end and start["client"] is not None and end["client"] is not None:
        iops = float(total.group(1))
        ios = iops * secs
        ccpu = end["client"] - start["client"]
        scpu = (end["server"] - start["server"]) if start["server"] is not None and end["server"] is not None \
            else None
        out["results"] = {
            "iops": iops, "mib_per_s": float(total.group(2)), "ios": round(ios),
            "ios_note": "IOPS x -t: spdk_nvme_perf gives no count",
            "elapsed_s": end["t"] - start["t"],
            "latency_us": {"mean": float(total.group(3)), "min": float(total.group(4)),
                           "max": float(total.group(5)), "p50": None, "p99": None, "p99_9": None},
            "client_cpu_s": ccpu, "client_cpu_us_per_io": ccpu * 1e6 / ios if ios else None,
            "client_cpu_source": f"/proc/PID/stat utime+stime (USER_HZ {CLK_TCK})",
            "errors": 0, "driver_sq_doorbell_writes_per_io": None, "driver_cq_doorbell_writes_per_io": None,
            "interrupt_wakeups_per_io": None}
        out["server"] = ({"cpu_s": scpu, "cpu_us_per_io": scpu * 1e6 / ios if ios else None,
                          "cpu_source": f"/proc/PID/stat utime+stime (USER_HZ {CLK_TCK})"}
                         if scpu is not None else {})
        out["window"] = {"from": "its line \"Initialization complete. Launching workers.\"",
                         "to": "its \"Total\" line", "wall_s": end["t"] - start["t"],
                         "sys_busy_ticks": end["sys"][0] - start["sys"][0],
                         "steal_ticks": end["sys"][1] - start["sys"][1],
                         "total_ticks": end["sys"][2] - start["sys"][2]}
        out["total_line"] = total.group(0)
    if rc != 0 or "results" not in out:
        why = [ln.strip() for ln in lines if "*ERROR*" in ln or "failed" in ln]
        out["error"] = (f"spdk_nvme_perf exit {rc}" if rc else "spdk_nvme_perf printed no Total line") + \
            (": " + " / ".join(re.sub(r"^\[[^]]*\] ", "", w) for w in why[:2]) if why else "")
    with open(a.json, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    return rc if rc else (0 if "results" in out else 1)


def perf_log(json_path):
    """The perf log that goes with a run's JSON (runs/X.json -> logs/perf-X.log)."""
    return "logs/perf-" + os.path.basename(json_path)[: -len(".json")] + ".log"


# Why a run's server did not start, by the manifest's rc.
NOT_STARTED = {"serve": "vnvme serve did not start", "nvmf_tgt": "nvmf_tgt did not start"}


def load_c2c(dirpath):
    """runs/c2c.tsv (--pin), by run JSON: [before, after] ns of the CPUs' round
    trip, a probe that failed left out (None when both did)."""
    path = os.path.join(dirpath, "runs", "c2c.tsv")
    if not os.path.exists(path):
        return {}
    out = {}
    with open(path) as f:
        for r in csv.DictReader(f, delimiter="\t"):
            ns = [float(r[k]) for k in ("before_ns", "after_ns") if (r.get(k) or "").strip()]
            out[r["json"]] = ns or None
    return out


def placement_moved(*runs):
    """Why a pair's runs did not run on one placement of the vCPUs (a list, empty
    if they did or nothing was probed): their round trips spread past C2C_MOVED."""
    ns = [v for r in runs for v in (r.get("c2c_ns") or [])]
    if len(ns) < 2 or min(ns) <= 0 or max(ns) / min(ns) <= C2C_MOVED:
        return []
    return [f"CPUs moved: round trip {min(ns):.0f}–{max(ns):.0f} ns"]


def load(dirpath, matrix, side="new", client=None):
    """The points of one binary (side "new" or "base"), in matrix order. With
    --peer-spdk, side is the target (vnvme or spdk) and client who drove it
    (vnvme or spdk); the runs then also say which client and doorbells they
    used and their mean latency."""
    rows = []
    c2c = load_c2c(dirpath)
    with open(os.path.join(dirpath, "runs", "manifest.tsv")) as f:
        for r in csv.DictReader(f, delimiter="\t"):
            if (r.get("side") or "new") == side and (client is None or (r.get("client") or "vnvme") == client):
                rows.append(r)
    points = {}
    for r in rows:
        key = (r["config"], int(r["qd"]))
        p = points.setdefault(key, {"runs": [], "errors": [], "serve_cmd": r["serve_cmd"], "perf_cmd": r["perf_cmd"]})
        path = os.path.join(dirpath, r["json"])
        if r["rc"] != "0" or not os.path.exists(path):
            why = NOT_STARTED.get(r["rc"], f"exit {r['rc']}")
            if client is not None and os.path.exists(path):
                # SPDK's client, run through --run-spdk-perf, says why it failed.
                with open(path) as f:
                    why = json.load(f).get("error") or why
            beside = f" beside {r['beside']}" if r.get("beside") else ""
            p["errors"].append(f"run {r['rep']}{beside}: {why} ({perf_log(r['json'])})")
            continue
        with open(path) as f:
            j = json.load(f)
        res, srv = j["results"], j.get("server") or {}
        el = res["elapsed_s"]
        ccpu, scpu = res.get("client_cpu_s"), srv.get("cpu_s")
        if j.get("window"):
            # spdk_nvme_perf: the machine's clocks over the window its CPU figures cover,
            # not over the whole command (its start-up is long and not measured).
            r = {**r, **{k: str(j["window"][k]) for k in ("sys_busy_ticks", "wall_s", "steal_ticks", "total_ticks")}}
        if "trapped_doorbells_per_io" not in srv and os.path.exists(path[: -len(".json")] + ".server-stats.json"):
            # A vnvme server driven by spdk_nvme_perf: its own counters at exit (one
            # server per run, so they are the run's), less those of the pass that
            # wrote a RAM disk before the run (--peer-backend ram), if there was one.
            with open(path[: -len(".json")] + ".server-stats.json") as f:
                st = json.load(f)
            pre_path = path[: -len(".json")] + ".prefill-stats.json"
            pre = json.load(open(pre_path)) if os.path.exists(pre_path) else {}
            d = {k: (st.get(k) or 0) - (pre.get(k) or 0)
                 for k in ("io_commands", "io_doorbell_writes", "interrupts", "eventidx_races")}
            n = d["io_commands"]
            srv = {**srv, "trapped_doorbells_per_io": d["io_doorbell_writes"] / n if n else None,
                   "interrupts_per_io": d["interrupts"] / n if n else None,
                   "eventidx_races": d["eventidx_races"] if st.get("eventidx_races") is not None else None}
        other = other_procs = steal = None
        if r.get("sys_busy_ticks") and r.get("wall_s"):
            other = other_cpus(int(r["sys_busy_ticks"]), float(r["wall_s"]), ccpu, scpu, CLK_TCK)
            if r.get("steal_ticks"):
                steal = steal_share(int(r["steal_ticks"]), int(r["total_ticks"]))
                other_procs = other_cpus(int(r["sys_busy_ticks"]) - int(r["steal_ticks"]), float(r["wall_s"]),
                                         ccpu, scpu, CLK_TCK)
        p["runs"].append(
            {
                "rep": int(r["rep"]),
                "beside": r.get("beside") or None,
                "json": r["json"],
                "transport": j.get("transport"),
                "iops": res["iops"],
                "p50_us": res["latency_us"]["p50"],
                "p99_us": res["latency_us"]["p99"],
                "p99_9_us": res["latency_us"]["p99_9"],
                "trapped_db_per_io": srv.get("trapped_doorbells_per_io"),
                "irq_per_io": srv.get("interrupts_per_io"),
                "driver_db_per_io": sum_opt(res["driver_sq_doorbell_writes_per_io"],
                                            res["driver_cq_doorbell_writes_per_io"]),
                "driver_sq_db_per_io": res["driver_sq_doorbell_writes_per_io"],
                "driver_cq_db_per_io": res["driver_cq_doorbell_writes_per_io"],
                "irq_wakeups_per_io": res["interrupt_wakeups_per_io"],
                "client_cpu_us_per_io": res["client_cpu_us_per_io"],
                "server_cpu_us_per_io": srv.get("cpu_us_per_io"),
                "cores_busy": cores_busy(ccpu, scpu, el),
                "other_cpus": other,
                "steal": steal,
                "other_procs_cpus": other_procs,
                "c2c_ns": c2c.get(r["json"]),
                "ios": res["ios"],
                "errors": res["errors"],
                "eventidx_races": srv.get("eventidx_races"),
                **({"client": j.get("tool"), "client_doorbells": (j.get("knobs") or {}).get("doorbells"),
                    "mean_us": res["latency_us"].get("mean"), "bs": (j.get("knobs") or {}).get("bs"),
                    "data_fds": r.get("data_fds") or None} if client is not None else {}),
            }
        )
    out = []
    for m in matrix:
        for qd in sorted({k[1] for k in points if k[0] == m["id"]}):
            p = points[(m["id"], qd)]
            agg = {k: spread([r[k] for r in p["runs"]]) for k in METRICS}
            out.append({"config": m["id"], "qd": qd, **agg, "errors": p["errors"], "runs": p["runs"],
                        "serve_command": p["serve_cmd"], "perf_command": p["perf_cmd"]})
    return out


def parse_matrix(text, workers):
    ms = []
    for line in text.strip().splitlines():
        id_, label, sdb, spoll, pdb, compl, inproc = line.split("|")
        inp = inproc != ""
        ms.append(
            {
                "id": id_,
                "label": label,
                "transport": "in-process (no socket, no server process)" if inp else "vfio-user socket",
                "serve_doorbells": None if inp else sdb,
                "server_poll": spoll if spoll != "-" else "n/a (no worker threads: I/O runs inline in the doorbell call)",
                "perf_doorbells": pdb,
                "shadow_doorbells": pdb in ("shadow", "eventfd"),
                "completion": compl,
                "workers": (workers if inproc == "W" else int(inproc)) if inp else workers,
                "in_process": inp,
            }
        )
    return ms


def fmt_bs(n):
    """An I/O size as people write it: 4 KiB, 128 KiB, 1 MiB, else bytes."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def fmt_iops(v):
    if v is None:
        return "–"
    if v >= 1e6:
        return f"{v / 1e6:.2f} M"
    return f"{v / 1e3:.1f} k"


def fmt(s, f):
    if s is None:
        return "–"
    if len(s["runs"]) < 2 or f(s["min"]) == f(s["max"]):
        return f(s["mean"])
    return f"{f(s['mean'])} [{f(s['min'])}–{f(s['max'])}]"


def num(d):
    return lambda v: f"{v:.{d}f}"


def get(points, cfg, qd):
    for p in points:
        if p["config"] == cfg and p["qd"] == qd:
            return p
    return None


def mean(p, k):
    return p[k]["mean"] if p and p.get(k) else None


def targets(points, matrix):
    t = []
    tr, sh16 = get(points, "trapped", 16), get(points, "shadow", 16)
    a, b = mean(tr, "iops"), mean(sh16, "iops")
    if a and b:
        ratio = b / a
        t.append({"target": "shadow doorbells >= 4x trapped IOPS at QD 16", "met": ratio >= 4,
                  "measured": f"shadow {fmt_iops(b)} / trapped {fmt_iops(a)} = {ratio:.2f}x"})
    else:
        t.append({"target": "shadow doorbells >= 4x trapped IOPS at QD 16", "met": None, "measured": "not run"})
    for cfg in ("shadow", "shadow-poll", "eventfd"):
        rows = [p for p in points if p["config"] == cfg and p["qd"] >= 16 and p.get("trapped_db_per_io")]
        if not rows:
            continue
        worst = max(p["trapped_db_per_io"]["max"] for p in rows)
        t.append({"target": f"trapped doorbells per I/O <= 0.1 at QD >= 16 ({cfg})", "met": worst <= 0.1,
                  "measured": ", ".join(f"QD {p['qd']}: {fmt(p['trapped_db_per_io'], num(4))}" for p in rows)
                  + f" (worst run {worst:.4f})"})
    inproc64 = [(m["id"], mean(get(points, m["id"], 64), "iops")) for m in matrix if m["in_process"]]
    inproc64 = [(i, v) for i, v in inproc64 if v]
    ceiling = max(inproc64, key=lambda x: x[1]) if inproc64 else None
    for cfg in ("mapped-poll", "eventfd-poll", "shadow-poll"):
        v = mean(get(points, cfg, 64), "iops")
        if v is None:
            continue
        primary = " (the polling variant)" if cfg == "mapped-poll" else ""
        t.append({"target": f"polling >= 1 M IOPS at QD 64: {cfg}{primary}", "met": v >= 1e6,
                  "measured": fmt_iops(v)})
        if ceiling:
            t.append({"target": f"polling >= 50 % of the in-process ceiling at QD 64: {cfg}{primary}",
                      "met": v >= 0.5 * ceiling[1],
                      "measured": f"{fmt_iops(v)} / {fmt_iops(ceiling[1])} ({ceiling[0]}, the best in-process "
                      f"configuration) = {100 * v / ceiling[1]:.0f} %"})
    return t


# ---- pairs: against the reference configuration (--reference) or before and after (--baseline)


def read_binaries(dirpath):
    """runs/binaries.tsv by side: name (file name only), label, version, sha256."""
    path = os.path.join(dirpath, "runs", "binaries.tsv")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {r["side"]: {k: v for k, v in r.items() if k != "side"} for r in csv.DictReader(f, delimiter="\t")}


def ratio(a, b):
    return a / b if a is not None and b else None


# The paired ratios: key, the run figure it divides, higher is better, what it is.
RATIOS = [
    ("iops_ratio", "iops", True, "IOPS"),
    ("server_cpu_ratio", "server_cpu_us_per_io", False, "server CPU per I/O"),
    ("client_cpu_ratio", "client_cpu_us_per_io", False, "client CPU per I/O"),
]
NO_SERVER = "n/a: in-process, no server process"


def run_summary(r):
    """What a pair records of each of its runs."""
    return {"json": r["json"], "iops": r["iops"], "server_cpu_us_per_io": r["server_cpu_us_per_io"],
            "client_cpu_us_per_io": r["client_cpu_us_per_io"],
            "steal": r["steal"], "other_procs_cpus": r["other_procs_cpus"], "c2c_ns": r.get("c2c_ns"),
            "disturbed": disturbance(r["steal"], r["other_procs_cpus"]) + placement_moved(r)}


def pair_point(config, qd, a, b, a_runs, b_runs, errors, no_server_cpu=False, names=None):
    """One point's pairs: the runs of side a (base, or the reference) and side b
    (new, or the configuration) matched by repetition (run back to back, a first
    on odd repetitions), the ratios b/a of each pair and their summaries.
    no_server_cpu: the two sides' server CPU do not compare (an in-process side
    has no server), so that ratio is None and says why. names: the two sides
    as the "order" of a pair names them (default: a and b)."""
    an, bn = names or (a, b)
    a_by_rep = {r["rep"]: r for r in a_runs}
    pairs = []
    for br in b_runs:
        ar = a_by_rep.get(br["rep"])
        if not ar:
            continue
        x, y = run_summary(ar), run_summary(br)
        pair = {"rep": br["rep"], "order": f"{an}, {bn}" if br["rep"] % 2 else f"{bn}, {an}", a: x, b: y}
        for key, fig, _, _ in RATIOS:
            pair[key] = None if (no_server_cpu and key == "server_cpu_ratio") else ratio(y[fig], x[fig])
        moved = placement_moved(x, y)
        if moved and not (x["disturbed"] or y["disturbed"]):
            # Each run on one placement, but not the same one: the pair says so.
            pair["moved"] = moved
        pair["disturbed"] = bool(x["disturbed"] or y["disturbed"] or moved)
        pairs.append(pair)
    out = {"config": config, "qd": qd, "sides": {a: an, b: bn},
           f"{a}_iops_median": median([p[a]["iops"] for p in pairs]) if pairs else None,
           f"{b}_iops_median": median([p[b]["iops"] for p in pairs]) if pairs else None}
    for key, _, higher, _ in RATIOS:
        out[key] = ratio_summary([p[key] for p in pairs], higher)
    if no_server_cpu:
        out["server_cpu_ratio_note"] = NO_SERVER
    out.update({"disturbed_pairs": sum(p["disturbed"] for p in pairs),
                "disturbed_reps": [p["rep"] for p in pairs if p["disturbed"]],
                "pairs": pairs, "errors": errors})
    return out


def compare(base_points, new_points):
    """--baseline: each point of the new build paired with the base build's."""
    out = []
    for np_ in new_points:
        bp = next((p for p in base_points if p["config"] == np_["config"] and p["qd"] == np_["qd"]), None)
        errors = [f"base {e}" for e in (bp["errors"] if bp else ["not run"])] + [f"new {e}" for e in np_["errors"]]
        out.append(pair_point(np_["config"], np_["qd"], "base", "new", bp["runs"] if bp else [], np_["runs"], errors))
    return out


def compare_reference(points, matrix, reference):
    """--reference: each other configuration's point paired with the reference's
    runs made beside it (the reference point gathers all of them)."""
    inproc = {m["id"]: m["in_process"] for m in matrix}
    out = []
    for p in points:
        if p["config"] == reference:
            continue
        rp = get(points, reference, p["qd"])
        ref_runs = [r for r in rp["runs"] if r["beside"] == p["config"]] if rp else []
        ref_errors = [e for e in (rp["errors"] if rp else []) if f" beside {p['config']}:" in e]
        errors = [f"{reference} {e}" for e in ref_errors] + [f"{p['config']} {e}" for e in p["errors"]]
        if not rp:
            errors.insert(0, f"{reference}: not run")
        out.append(pair_point(p["config"], p["qd"], "ref", "cfg", ref_runs, p["runs"], errors,
                              no_server_cpu=inproc.get(p["config"], False) or inproc.get(reference, False),
                              names=(reference, p["config"])))
    return out


def fmt_ratio(s):
    if s is None:
        return "–"
    lo, hi = s["interval"]
    return f"{s['median']:.3f} [{lo:.3f}–{hi:.3f}]"


def fmt_verdict(s, note=None):
    if s is None:
        return note or "–"
    v = s["verdict"]
    return f"**{v}**" if v in ("ahead", "behind") else v


def fmt_flags(run):
    return "; ".join(run["disturbed"])


def verdict_counts(comparison):
    """Per ratio: how many rows are ahead, level, behind (and without a verdict or n/a)."""
    L = []
    for key, _, _, what in RATIOS:
        v = [c[key]["verdict"] if c[key] else ("n/a" if c.get(key + "_note") else "no pairs") for c in comparison]
        level = v.count("level (inside the noise)")
        rest = {k: v.count(k) for k in sorted(set(v)) if k not in ("ahead", "behind", "level (inside the noise)")}
        L.append(f"- {what}: **{v.count('ahead')} ahead, {level} level, {v.count('behind')} behind**"
                 + "".join(f", {n} {k}" for k, n in rest.items()) + f" (of {len(v)} rows)")
    return L


def pairs_md(comparison, spec, knobs):
    """The paired comparison as Markdown: (summary, every pair). spec: the two
    sides' keys a and b, their column names and the words for the design."""
    a, b, an, bn = spec["a"], spec["b"], spec["a_name"], spec["b_name"]
    row, head = spec.get("row") or (lambda c: c["config"]), spec.get("row_head", "config")
    npairs = sum(len(c["pairs"]) for c in comparison)
    flagged = sum(c["disturbed_pairs"] for c in comparison)
    S = [f"- {knobs['repeat']} pairs per point, each pair run back to back ({spec['order']}); " + spec["servers"],
         f"- ratio = {bn} / {an} of the pair, for IOPS (higher is better) and for server and client CPU per I/O "
         f"(lower is better: \"ahead\" = {bn} uses less); median [interval]: with ≥ {BOOTSTRAP_MIN_PAIRS} pairs a "
         f"bootstrap 90 % interval of the median (seeded, reproducible), else min–max of the pairs (one pair: no "
         f"verdict). The verdict names a difference only when the interval excludes 1.0, else level (inside the "
         f"noise)"]
    probed = any(p[side].get("c2c_ns") for c in comparison for p in c["pairs"] for side in (a, b))
    moved = sum(bool(placement_moved(p[a], p[b])) for c in comparison for p in c["pairs"])
    placed = (f"; the CPUs' placement moved within {moved} of them (their cache line round trips, before and "
              f"after each run, differ by more than {C2C_MOVED:g}x)") if probed else ""
    S += [f"- **{flagged} of {npairs} pairs disturbed** (⚠: a run of the pair saw steal > "
          f"{100 * DISTURBED_STEAL:.0f} % or other processes keeping > {DISTURBED_OTHER_CPUS} CPUs busy, or the "
          f"client's and server's CPUs moved{placed}); they are in the ratios, listed per row and marked under "
          f"\"Every pair\"" if flagged else
          f"- 0 of {npairs} pairs disturbed (steal ≤ {100 * DISTURBED_STEAL:.0f} %, other processes "
          f"≤ {DISTURBED_OTHER_CPUS} CPUs in every run"
          + (f", the CPUs' cache line round trip within {C2C_MOVED:g}x across each pair" if probed else "") + ")"]
    if knobs.get("moved_runs"):
        S.append(f"- pairs run again because the client's and server's CPUs moved "
                 f"under them (cache line round trips more than {C2C_MOVED:g}x apart): {knobs['moved_runs'] // 2}; the "
                 f"runs set aside are kept in runs/moved/")
    if any(c.get("server_cpu_ratio_note") for c in comparison):
        S.append(f"- server CPU per I/O of an in-process configuration: {NO_SERVER} (its controller runs on worker "
                 f"threads of the client), so no ratio")
    if knobs["repeat"] < BOOTSTRAP_MIN_PAIRS:
        S.append(f"- **note: {knobs['repeat']} pairs per point**: the interval is min–max, and all of n pairs fall on "
                 f"one side of 1.0 by chance with probability 2/2^n ({200 / 2 ** knobs['repeat']:.0f} % for "
                 f"n = {knobs['repeat']}) even with no difference; use ≥ {BOOTSTRAP_MIN_PAIRS} for a verdict")
    S += ["", f"| {head} | QD | {an} IOPS | {bn} IOPS | IOPS {bn}/{an} | verdict | server CPU/IO {bn}/{an} | verdict "
          f"| client CPU/IO {bn}/{an} | verdict | disturbed pairs |", "|---|--:|--:|--:|--:|---|--:|---|--:|---|---|"]
    for c in comparison:
        ir, sr, cr = c["iops_ratio"], c["server_cpu_ratio"], c["client_cpu_ratio"]
        dist = f"{c['disturbed_pairs']}/{len(c['pairs'])}"
        if c["disturbed_reps"]:
            dist = f"⚠ {dist} (rep {', '.join(map(str, c['disturbed_reps']))})"
        S.append(f"| {row(c)} | {c['qd']} | {fmt_iops(c[a + '_iops_median'])} | "
                 f"{fmt_iops(c[b + '_iops_median'])} | {fmt_ratio(ir)} | {fmt_verdict(ir)} | "
                 f"{fmt_ratio(sr)} | {fmt_verdict(sr, 'n/a (in-process)' if c.get('server_cpu_ratio_note') else None)}"
                 f" | {fmt_ratio(cr)} | {fmt_verdict(cr)} | {dist} |"
                 + (f" ⚠ {'; '.join(c['errors'])}" if c["errors"] else ""))
    S += ["", f"{an} and {bn} IOPS: medians of the paired runs. Rows by verdict:", ""] + verdict_counts(comparison)

    def opt(v, f):
        return f(v) if v is not None else "–"

    P = ["#### Every pair", "",
         f"| {head} | QD | rep | order | {an} IOPS | {bn} IOPS | ratio | {an} server CPU µs/IO | {bn} server CPU µs/IO "
         f"| ratio | {an} client CPU µs/IO | {bn} client CPU µs/IO | ratio |"
         + (f" CPUs' round trip ns, {an} / {bn} |" if probed else "") + " disturbed |",
         "|---|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|" + ("---|" if probed else "") + "---|"]

    def trips(run):
        ns = run.get("c2c_ns")
        return "→".join(f"{v:.0f}" for v in ns) if ns else "–"

    for c in comparison:
        for p in c["pairs"]:
            flags = "; ".join([f"{c['sides'][side]}: {fmt_flags(p[side])}" for side in (a, b)
                               if p[side]["disturbed"]] + p.get("moved", []))
            P.append(f"| {row(c)} | {c['qd']} | {p['rep']} | {p['order']} | {fmt_iops(p[a]['iops'])} | "
                     f"{fmt_iops(p[b]['iops'])} | {opt(p['iops_ratio'], num(3))} | "
                     f"{opt(p[a]['server_cpu_us_per_io'], num(2))} | {opt(p[b]['server_cpu_us_per_io'], num(2))} | "
                     f"{opt(p['server_cpu_ratio'], num(3))} | {opt(p[a]['client_cpu_us_per_io'], num(2))} | "
                     f"{opt(p[b]['client_cpu_us_per_io'], num(2))} | {opt(p['client_cpu_ratio'], num(3))} | "
                     + (f"{trips(p[a])} / {trips(p[b])} | " if probed else "")
                     + f"{'⚠ ' + flags if flags else ''} |")
    return S, P


def side_ns(side, other):
    """', namespace SPEC' when the two sides served different namespaces (--baseline-ns)."""
    ns = side.get("ns")
    return f", namespace `{ns}`" if ns and ns != other.get("ns") else ""


def pair_spec(knobs, binaries):
    """The two sides of the pairs and how they ran, for the report."""
    if knobs.get("baseline"):
        bb, nb = binaries["base"], binaries["new"]
        return {"a": "base", "b": "new", "a_name": "base", "b_name": "new", "ratio": "new / base",
                "title": "Before and after: this build (new) against the baseline (base)",
                "intro": [f"- base: `{bb['name']}`{' (' + bb['label'] + ')' if bb['label'] else ''}, {bb['version']}, "
                          f"sha256 {bb['sha256']}{side_ns(bb, nb)}",
                          f"- new: `{nb['name']}` built from this checkout (the git commit above), {nb['version']}, "
                          f"sha256 {nb['sha256']}{side_ns(nb, bb)}"],
                "order": "base first on odd repetitions, new first on even ones",
                "servers": "every run against a fresh `vnvme serve` of its own binary"}
    ref = knobs["reference"]
    return {"a": "ref", "b": "cfg", "a_name": ref, "b_name": "config", "ratio": f"config / {ref}",
            "title": f"Each configuration against the reference, {ref}, measured beside it",
            "intro": [f"- reference: {ref}; for every other configuration, QD and repetition its run and the "
                      f"configuration's run went back to back, so both saw the same host state"],
            "order": f"{ref} first on odd repetitions, the configuration first on even ones",
            "servers": "every run against a fresh `vnvme serve`, started for it and stopped after it, so the two "
                       "never ran at once"}


def header_lines(mach, knobs):
    L = machine_md(mach) + [
        f"- workload: vnvme perf --rw {knobs['rw']} --bs {knobs['bs']} --queues 1 (one I/O queue pair of 1024 entries, "
        f"one client thread), QD {knobs['qd']}, {knobs['seconds']} s per run, {knobs['repeat']} run(s) per point "
        f"(mean [min–max] shown)" + (f"; the reference {knobs['reference']}: {knobs['repeat']} runs per point beside "
                                     f"each other configuration, all in its rows" if knobs.get("reference") else ""),
        f"- namespace: {knobs['ns']}" + (" (null backend: no data copied, so this measures the doorbell / interrupt / "
        "queue path, not a disk)" if knobs['ns'].startswith("null") else "") + "; the chain configuration serves it "
        "from a back server that a front server reaches through nvme:// (server CPU counts the front only)",
        f"- server: vnvme serve --workers {knobs['workers']}; "
        f"{'a fresh server per run, stopped after it (pairs)' if knobs.get('baseline') or knobs.get('reference') else 'one server per configuration'}; "
        f"pinning: {'server on CPU 1, client on CPU 0 (taskset)' if knobs['pin'] else 'none (scheduler decides)'}",
        f"- command: `{knobs['command']}`",
    ]
    if mach["cpus_usable"] <= 2:
        L.append(
            f"- **note: this machine has {mach['cpus_usable']} usable CPU(s).** The client thread, the server's main "
            f"(socket) thread and its {knobs['workers']} worker thread(s) compete for them; polling on either side "
            f"takes a whole CPU, so polling configurations are CPU-bound here and differ from a many-core host. "
            f"Knobs: `--workers N`, `--pin` (taskset: server CPU 1, client CPU 0)."
        )
    return L


def summary_md(comparison, spec, knobs):
    """The paired comparison's summary: what was paired, per configuration and QD
    the ratios with their verdicts, the counts, the flags."""
    S, _ = pairs_md(comparison, spec, knobs)
    return [f"### {spec['title']}", ""] + spec["intro"] + S


def table_md(mach, knobs, matrix, points, tgts, comparison=None, spec=None):
    L = ["## vnvme over vfio-user: doorbell modes, `vnvme perf` vs `vnvme serve`", ""]
    L += header_lines(mach, knobs)
    if comparison is not None:
        L += [""] + summary_md(comparison, spec, knobs) + [""] + pairs_md(comparison, spec, knobs)[1]
        L += ["", "### The new build's figures" if knobs.get("baseline") else "### Absolute figures", ""]
    disturbed = [p for p in points if p.get("other_cpus") and p["other_cpus"]["max"] > 0.2]
    if disturbed:
        worst = max(p["other_cpus"]["max"] for p in disturbed)
        L.append(f"- **disturbed: {len(disturbed)} of {len(points)} points ran while something else on the machine "
                 f"kept up to {worst:.2f} CPUs busy** (column \"other load\"; runs/environment.txt lists the top "
                 f"processes at start and end). Their numbers, polling ones above all, are low.")
    L += ["", "### Configurations", "",
          "| config | what | serve --doorbells | server --poll | perf --doorbells | shadow | completion |",
          "|---|---|---|---|---|---|---|"]
    for m in matrix:
        L.append(f"| {m['id']} | {m['label']} | {m['serve_doorbells'] or 'in-process'} | "
                 f"{m['server_poll'] if not m['server_poll'].startswith('n/a') else 'n/a (inline)'} | "
                 f"{m['perf_doorbells']} | {'on' if m['shadow_doorbells'] else 'off'} | {m['completion']} |")
    L += ["", "`mapped` forces the server's workers to poll always (mapped stores notify nobody), so it has no "
          "irq+adaptive point; its irq row is irq+always. In-process doorbells are function calls "
          "(`mmio_write` + `process`, routed to the worker's mailbox), counted as trapped.", ""]
    cost = {(c["config"], c["qd"]): c["instr_per_io"] for c in knobs.get("cost") or []}
    L += ["### IOPS (mean of runs)" + (", and the server's instructions per I/O" if cost else ""), "",
          "| config | " + " | ".join(f"QD {q}" for q in knobs["qd_list"]) + " |",
          "|---|" + "--:|" * len(knobs["qd_list"])]
    for m in matrix:
        cells = [fmt_iops(mean(get(points, m["id"], q), "iops")) for q in knobs["qd_list"]]
        if cost:
            cells = [c + (f" · {cost[(m['id'], q)]:,.0f} instr" if (m["id"], q) in cost else "")
                     for c, q in zip(cells, knobs["qd_list"])]
        if any(c != "–" for c in cells):
            L.append(f"| {m['id']} | " + " | ".join(cells) + " |")
    if cost:
        L += ["", "instr: the server's own instructions per I/O, the payload copy apart (scripts/bench-cost.sh "
              "under callgrind, `--poll off`, median of 2 repetitions, in cost/ with the per-function tables); "
              "a count, not a time: it does not move with the machine's load."]
    L += ["", "### Every point", "",
          "| config | QD | IOPS | p50 µs | p99 µs | trapped db/IO (server) | driver db/IO | irq/IO | "
          "client CPU µs/IO | server CPU µs/IO | CPUs busy | other load |",
          "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for p in points:
        L.append(
            f"| {p['config']} | {p['qd']} | {fmt(p['iops'], fmt_iops)} | {fmt(p['p50_us'], num(1))} | "
            f"{fmt(p['p99_us'], num(1))} | {fmt(p['trapped_db_per_io'], num(4))} | "
            f"{fmt(p['driver_db_per_io'], num(4))} | {fmt(p['irq_per_io'], num(4))} | "
            f"{fmt(p['client_cpu_us_per_io'], num(2))} | {fmt(p['server_cpu_us_per_io'], num(2))} | "
            f"{fmt(p['cores_busy'], num(2))} | {fmt(p['other_cpus'], num(2))} |"
            + (f" ⚠ {'; '.join(p['errors'])}" if p["errors"] else "")
        )
    L += ["", "driver db/IO: the driver's own SQ+CQ doorbell rings per I/O — REGION_WRITE messages for "
          "trapped/shadow, eventfd signals for eventfd, page stores for mapped. CPUs busy: (client + server CPU "
          "time) / elapsed. Other load: CPUs kept busy by anything else on the machine meanwhile (/proc/stat "
          "minus client and server; > 0.2 means the point was disturbed)."
          + (f" {knobs['reference']}, the reference: its rows gather every run it made beside another "
             f"configuration ({knobs['repeat']} per configuration and QD)." if knobs.get("reference") else ""), ""]
    L += ["### Targets (issue 3)", "", "| target | measured | met |", "|---|---|---|"]
    for t in tgts:
        met = "n/a" if t["met"] is None else ("**yes**" if t["met"] else "**no**")
        L.append(f"| {t['target']} | {t['measured']} | {met} |")
    L += ["", f"### Seed reference — NOT measured here", "", SEED_SOURCE + ". KIOPS.", "",
          "| | " + " | ".join(f"QD {q}" for q in SEED_QD) + " |", "|---|" + "--:|" * len(SEED_QD)]
    for name, v in SEED_KIOPS:
        L.append(f"| {name} | " + " | ".join(str(x) for x in v) + " |")
    return "\n".join(L) + "\n"


# ---- the chart


def chart(mach, knobs, matrix, points):
    qds = knobs["qd_list"]
    cfgs = [m for m in matrix if any(p["config"] == m["id"] for p in points)]

    def series(metric, transform=None):
        out = []
        for i, m in enumerate(cfgs):
            vals, ranges = [], []
            for q in qds:
                p = get(points, m["id"], q)
                s = p.get(metric) if p else None
                if transform and p:
                    s = transform(p)
                vals.append(s["mean"] if s else None)
                ranges.append((s["min"], s["max"]) if s else None)
            out.append({"name": m["id"], "color": COLORS.get(m["id"], FALLBACK[i % len(FALLBACK)]),
                        "values": vals, "ranges": ranges, "dashed": m["in_process"]})
        return out

    def total_cpu(p):
        c, s = p.get("client_cpu_us_per_io"), p.get("server_cpu_us_per_io")
        if not c or not s:
            return None
        tot = [a + b for a, b in zip(c["runs"], s["runs"])]
        return spread(tot)

    W, PW, PH, GAP = 1500, 730, 430, 14
    ref = (f" ({knobs['reference']}, the reference: {knobs['repeat']} beside each configuration)"
           if knobs.get("reference") else "")
    sub2 = (f"{knobs['seconds']} s × {knobs['repeat']} runs per point{ref} (line = mean, whisker = min–max) · "
            f"serve --workers {knobs['workers']} · pinning {'on' if knobs['pin'] else 'off'} · 1 I/O queue, "
            f"1 client thread · squares/dashed = in-process (no socket)")
    notes = []
    if mach["cpus_usable"] <= 2:
        notes.append(f"only {mach['cpus_usable']} CPUs: client, server main thread and workers compete "
                     f"(a polling side takes a whole CPU)")
    disturbed = [p for p in points if p.get("other_cpus") and p["other_cpus"]["max"] > 0.2]
    if disturbed:
        notes.append(f"{len(disturbed)} of {len(points)} points disturbed by other load on the machine (up to "
                     f"{max(p['other_cpus']['max'] for p in disturbed):.1f} CPUs; see table.md)")
    head, y = title_block(20, 8, f"vnvme over vfio-user: vnvme perf vs vnvme serve, {knobs['ns'].split(':')[0]} "
                          f"namespace, {fmt_bs(knobs['bs'])} {knobs['rw']}", [machine_line(mach), sub2],
                          " · ".join(notes) or None, size=21)
    keys, top = legend(30, y, [{"name": f"{m['id']}: {m['label']}", "line": True, "dashed": m["in_process"],
                                "color": COLORS.get(m["id"], FALLBACK[i % len(FALLBACK)])}
                               for i, m in enumerate(cfgs)], cols=3, col_w=490, row_h=22)
    top += 12
    seed_h = 300
    H = top + 2 * (PH + GAP) + seed_h + 30
    o = [head, keys]

    s_iops = series("iops")
    lo, hi = bounds([v for s in s_iops for v in s["values"]])
    o.append(log_panel(20, top, PW, PH, "IOPS (higher is better)", "IOPS (log scale)", s_iops, qds, "iops",
                   lo, max(hi, 2e6), guide=(1e6, "target: polling ≥ 1 M at QD 64", "left-below")))
    s_db = series("trapped_db_per_io")
    lo, hi = bounds([v for s in s_db for v in s["values"]], floor=1e-4)
    o.append(log_panel(20 + PW + GAP, top, PW, PH, "Trapped I/O doorbell writes per I/O (server)",
                   "doorbell writes / I/O (log)", s_db, qds, "", 1e-4, max(hi, 10),
                   guide=(0.1, "target with shadow doorbells at QD ≥ 16: ≤ 0.1"), floor_label="≤1e-4 (0)",
                   note="0 (eventfd, mapped: no trapped writes) is drawn at the floor"))
    s_cpu = series("total_cpu", total_cpu)
    lo, hi = bounds([v for s in s_cpu for v in s["values"]])
    o.append(log_panel(20, top + PH + GAP, PW, PH, "CPU per I/O, client + server (lower is better)",
                   "µs of CPU / I/O (log)", s_cpu, qds, "", lo, hi,
                   note="client: process CPU time; server: /proc/PID/stat (in-process: worker threads)"))
    s_p99 = series("p99_us")
    lo, hi = bounds([v for s in s_p99 for v in s["values"]])
    o.append(log_panel(20 + PW + GAP, top + PH + GAP, PW, PH, "p99 latency (lower is better)", "µs (log)",
                   s_p99, qds, "", lo, hi))

    # the seed reference, apart and grey
    greys = ["#bdbdbd", "#969696", "#737373", "#525252", "#252525", "#6a51a3", "#d9a066"]
    seed = [{"name": name, "color": greys[i % len(greys)], "values": {f"QD {q}": v for q, v in zip(SEED_QD, vals)}}
            for i, (name, vals) in enumerate(SEED_KIOPS)]
    o.append(bar_panel(20, top + 2 * (PH + GAP), W - 40, seed_h,
                       "Seed reference — NOT measured here: QEMU hw/nvme ablation (KIOPS)",
                       [f"QD {q}" for q in SEED_QD], seed, labels=lambda v: f"{v:g}", tick=lambda v: f"{v:g}k",
                       note=SEED_SOURCE, background="#ececec", legend_w=250))
    return svg_doc(W, H, o, background="#f7f7f7")


def ratio_chart(mach, knobs, matrix, comparison, spec, binaries):
    """The paired ratios per point (spec: which two sides): IOPS, server CPU per
    I/O and client CPU per I/O, the median with its interval as a whisker, a
    line at 1.0."""
    qds = knobs["qd_list"]
    cfgs = [m for m in matrix if any(c["config"] == m["id"] for c in comparison)]
    an, bn = spec["a_name"], spec["b_name"]

    def series(key):
        out = []
        for i, m in enumerate(cfgs):
            vals, ranges = [], []
            for q in qds:
                c = next((c for c in comparison if c["config"] == m["id"] and c["qd"] == q), None)
                s = c[key] if c else None
                vals.append(s["median"] if s else None)
                ranges.append(tuple(s["interval"]) if s else None)
            out.append({"name": m["id"], "color": COLORS.get(m["id"], FALLBACK[i % len(FALLBACK)]),
                        "values": vals, "ranges": ranges, "dashed": m["in_process"]})
        return out

    W, PW, PH, GAP = 1500, 480, 470, 10
    npairs = sum(len(c["pairs"]) for c in comparison)
    flagged = sum(c["disturbed_pairs"] for c in comparison)
    if spec.get("chart_title"):
        title, sub = spec["chart_title"], spec["chart_sub"]
    elif knobs.get("baseline"):
        b, n = binaries["base"], binaries["new"]
        title = (f"vnvme over vfio-user, before/after: new ({mach['git_commit'][:12]}) / base "
                 f"({b['label'] or b['name']}), {knobs['ns'].split(':')[0]} ns, {fmt_bs(knobs['bs'])} {knobs['rw']}")
        sub = f"{machine_line(mach)} · base sha256 {b['sha256']}, new sha256 {n['sha256']}"
    else:
        title = (f"vnvme over vfio-user: each configuration / {an} (the reference, run beside it), "
                 f"{knobs['ns'].split(':')[0]} ns, {fmt_bs(knobs['bs'])} {knobs['rw']}")
        sub = machine_line(mach)
    kind = (f"bootstrap 90 % interval of the median (seeded)" if knobs["repeat"] >= BOOTSTRAP_MIN_PAIRS
            else "min–max of the pairs")
    how = (f"{knobs['seconds']} s per run, {knobs['repeat']} pairs per point run back to back · "
           f"dot = median of the paired ratios, whisker = {kind} · a difference only where the whisker "
           f"misses 1.0 · serve --workers {knobs['workers']}")
    disturbed = (f"{flagged} of {npairs} pairs disturbed (steal > {100 * DISTURBED_STEAL:.0f} % or other "
                 f"load > {DISTURBED_OTHER_CPUS} CPUs; see table.md)" if flagged else None)
    quiet = None if flagged else f"no pair disturbed (0 of {npairs})"
    head, y = title_block(20, 8, title, [sub, how, quiet], disturbed, size=21)
    keys, top = legend(30, y, [{"name": f"{m['id']}: {m['label']}", "line": True, "dashed": m["in_process"],
                                "color": COLORS.get(m["id"], FALLBACK[i % len(FALLBACK)])}
                               for i, m in enumerate(cfgs)], cols=3, col_w=490, row_h=22)
    top += 12
    H = top + PH + 30
    o = [head, keys]
    dodge = min(12, 100 / max(1, len(cfgs)))
    na = " · in-process: n/a (no server)" if any(c.get("server_cpu_ratio_note") for c in comparison) else ""
    for k, (key, title, better) in enumerate([
            ("iops_ratio", f"IOPS, {bn} / {an}", f"above 1.0: {bn} is faster"),
            ("server_cpu_ratio", f"Server CPU per I/O, {bn} / {an}", f"below 1.0: {bn} uses less CPU{na}"),
            ("client_cpu_ratio", f"Client CPU per I/O, {bn} / {an}", f"below 1.0: {bn} uses less CPU")]):
        s = series(key)
        lo, hi = ratio_bounds([v for ser in s for r in ser["ranges"] if r for v in r])
        o.append(log_panel(20 + k * (PW + GAP), top, PW, PH, title, "ratio (log scale)", s, qds, "", lo, hi,
                           guide=(1.0, "1.0: no difference"), note=better, ticks=ratio_ticks(lo, hi), dodge=dodge,
                           whisker=2.5))
    return svg_doc(W, H, o, background="#f7f7f7")


# ---- beside SPDK's vfio-user target (--peer-spdk)


CLIENT_NAMES = {"vnvme": "vnvme perf", "spdk": "spdk_nvme_perf"}
PEER_MODES = {
    "poll": ("SPDK polling", "nvmf_tgt's default: its reactor polls; BAR0 doorbells mapped into the client, no "
             "shadow doorbells"),
    "interrupt": ("SPDK --interrupt-mode", "nvmf_tgt --interrupt-mode, its transport created with -M "
                  "(--disable-mappable-bar0, which interrupt mode needs): doorbell writes reach it as vfio-user "
                  "messages, and it offers shadow doorbells with EventIdx"),
}


def read_peer(dirpath):
    """runs/peer.tsv (what bench-vfio-user.sh --peer-spdk knew of SPDK), plus what
    nvmf_tgt's logs say: its version line with DPDK's, and every *ERROR* it logged,
    counted. None without --peer-spdk."""
    path = os.path.join(dirpath, "runs", "peer.tsv")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        peer = {r["key"]: r["value"] for r in csv.DictReader(f, delimiter="\t")}
    logs = os.path.join(dirpath, "logs")
    names = sorted(os.listdir(logs)) if os.path.isdir(logs) else []
    for name in names:
        if name.startswith("nvmf_tgt-"):
            with open(os.path.join(logs, name), errors="replace") as f:
                m = re.search(r"Starting SPDK (.+?) / DPDK (\S+) initialization", f.read())
            if m:
                peer["spdk_log_version"], peer["dpdk_version"] = m.group(1), m.group(2)
                break
    peer["errors_logged"] = logged_errors(logs, names)
    return peer


def logged_errors(logs, names):
    """The *ERROR* lines of nvmf_tgt's logs and of spdk_nvme_perf's, by message
    (numbers made N to group them), with how many lines and logs, and which runs."""
    groups = {}
    for name in names:
        if name.startswith("nvmf_tgt-"):
            who, run = "nvmf_tgt", name[len("nvmf_tgt-"):-len(".log")]
        elif name.startswith("perf-") and "-spdk-" in name:
            who, run = "spdk_nvme_perf", name[len("perf-"):-len(".log")]
        else:
            continue
        with open(os.path.join(logs, name), errors="replace") as f:
            for line in f:
                if "*ERROR*" not in line:
                    continue
                msg = re.sub(r"^\[[^]]*\] ", "", line.strip())
                key = (who, re.sub(r"\d+", "N", msg))
                g = groups.setdefault(key, {"who": who, "example": msg, "lines": 0, "runs": []})
                g["lines"] += 1
                if run not in g["runs"]:
                    g["runs"].append(run)
    return sorted(groups.values(), key=lambda g: (g["who"], -len(g["runs"])))


def group_errors(side, errors):
    """A side's failed runs, one line per reason: "SIDE runs 1, 3: reason (logs)"."""
    by = {}
    for e in errors:
        m = re.match(r"run (\d+)(?: beside \S+)?: (.*) \((logs/[^)]*)\)$", e)
        rep_, why = (m.group(1), m.group(2)) if m else ("?", e)
        by.setdefault(why, []).append(rep_)
    return [f"{side} run{'s' if len(r) > 1 else ''} {', '.join(r)}: {why}" for why, r in by.items()]


def compare_peer(spdk_points, vnvme_points):
    """Each point of vnvme paired with SPDK's, run by run (the same client)."""
    keys = [(p["config"], p["qd"]) for p in vnvme_points]
    keys += [(p["config"], p["qd"]) for p in spdk_points if (p["config"], p["qd"]) not in keys]
    out = []
    for cfg, qd in keys:
        sp, vp = get(spdk_points, cfg, qd), get(vnvme_points, cfg, qd)
        errors = (group_errors("SPDK", sp["errors"]) if sp else ["SPDK: not run"]) + \
            (group_errors("vnvme", vp["errors"]) if vp else ["vnvme: not run"])
        out.append(pair_point(cfg, qd, "base", "new", sp["runs"] if sp else [], vp["runs"] if vp else [], errors,
                              names=("SPDK", "vnvme")))
    return out


def peer_mode(peer, cfg):
    return peer.get(f"mode.{cfg}", "?")


def client_doorbells(points, cfg):
    """The doorbells vnvme perf's runs of a configuration used (auto: what it chose)."""
    seen = sorted({r.get("client_doorbells") for p in points if p["config"] == cfg for r in p["runs"]
                   if r.get("client_doorbells")})
    return ", ".join(seen) or "–"


def peer_versions(peer):
    return (f"SPDK {peer.get('spdk_version', '?').removeprefix('SPDK ')}, DPDK {peer.get('dpdk_version', '?')}")


def pair_spec_peer(knobs, peer, client, mach):
    """The two sides of the pairs beside SPDK, for the report and the chart."""
    cn = CLIENT_NAMES[client]
    how = ("`vnvme perf` against vnvme with the configuration's --doorbells and --completion, against SPDK "
           "--doorbells auto --completion poll" if client == "vnvme" else
           f"`{peer.get('spdk_nvme_perf', 'spdk_nvme_perf')}` against both (it polls; its \"Total\" line's IOPS; "
           f"client and server CPU from /proc over its window, \"Launching workers\" to \"Total\")")
    return {"a": "base", "b": "new", "a_name": "SPDK", "b_name": "vnvme", "ratio": "vnvme / SPDK",
            "title": f"vnvme beside SPDK's vfio-user target, driven by {cn}",
            "intro": [f"- client: {how}", f"- SPDK: {peer_versions(peer)}; vnvme: {mach.get('vnvme')}"],
            "order": "SPDK first on odd repetitions, vnvme first on even ones",
            "servers": "every run against a fresh target (vnvme serve, or nvmf_tgt set up over RPC) started for "
                       "it and stopped after it, so the two never ran at once",
            "row": lambda c: f"{c['config']} / {PEER_MODES.get(peer_mode(peer, c['config']), ('?',))[0]}",
            "row_head": "vnvme configuration / SPDK mode",
            "chart_title": (f"vnvme / SPDK's vfio-user target ({peer_versions(peer)}), client {cn}, "
                            f"{knobs['ns'].split(':')[0]} ns, {fmt_bs(knobs['bs'])} {knobs['rw']}"),
            "chart_sub": machine_line(mach) + " · pinned: servers CPU 1, clients CPU 0"}


def peer_header(mach, knobs, matrix, peer, per):
    ids = {m["id"]: m for m in matrix}
    L = [f"## vnvme beside SPDK's vfio-user target: {fmt_bs(knobs['bs'])} {knobs['rw']}, one queue pair", ""]
    L += machine_md(mach)
    L += [
        f"- peer: {peer_versions(peer)} (`nvmf_tgt --version`: {peer.get('spdk_version', '?')}; DPDK from "
        f"nvmf_tgt's log), nvmf_tgt sha256 {peer.get('nvmf_tgt_sha256', '?')}"
        + (f", spdk_nvme_perf sha256 {peer['spdk_nvme_perf_sha256']}" if peer.get("spdk_nvme_perf_sha256") else "")
        + f"; built by scripts/build-spdk-peer.sh, set up over RPC by its scripts/rpc.py ({peer.get('rpc_python')})",
        f"- pinning: servers on {peer.get('server_pin')}, clients on {peer.get('client_pin')}",
        f"- workload: {knobs['rw']}, {fmt_bs(knobs['bs'])} ({knobs['bs']} bytes) per I/O, one I/O queue pair, one "
        f"client thread; QD {knobs['qd']}; "
        f"{knobs['seconds']:g} s per run; {knobs['repeat']} pairs per point and client (a fresh target per run, "
        f"the two targets never at once)",
        f"- clients: {', '.join(CLIENT_NAMES[x['client']] for x in per)}"
        + (" (each repetition runs a pair of each, one after the other)" if len(per) > 1 else ""),
        f"- vnvme: `vnvme serve --ns {knobs['ns']} --workers {knobs['workers']}` with the configuration's "
        f"--doorbells and --poll (below)",
        f"- SPDK: `{peer.get('spdk_bdev', 'bdev_null_create null0 65536 4096')}` in subsystem "
        f"{peer.get('spdk_nqn')}, one VFIOUSER listener; spdk_nvme_perf names vnvme's subsystem "
        f"{peer.get('vnvme_nqn')}",
    ]
    L += peer_backend_lines(peer, knobs, per)
    for m in ("poll", "interrupt"):
        if any(peer_mode(peer, c) == m for c in ids if any(p["config"] == c for x in per for p in x["vnvme_points"])):
            L.append(f"- {PEER_MODES[m][0]}: `{peer.get('nvmf_tgt.' + m)}`, then rpc.py `{peer.get('rpc.' + m)}`")
    L.append(f"- command: `{knobs['command']}`")
    if mach["cpus_usable"] <= 2:
        L.append(f"- **note: this machine has {mach['cpus_usable']} usable CPUs**, shared: a polling server or "
                 f"client takes a whole one, and this host's speed moves by ±25 % within a run, so only the paired "
                 f"ratios below carry a verdict")
    L += ["", "### Who meets whom", "",
          "| vnvme configuration | vnvme serve | vnvme perf against vnvme | SPDK mode | nvmf_tgt | vnvme perf "
          "against SPDK (doorbells it chose) |", "|---|---|---|---|---|---|"]
    cfgs = [c for c in ids if any(p["config"] == c for x in per for p in x["vnvme_points"] + x["spdk_points"])]
    vn = next((x for x in per if x["client"] == "vnvme"), None)
    for c in cfgs:
        m, mode = ids[c], peer_mode(peer, c)
        chose = client_doorbells(vn["spdk_points"], c) if vn else "not run"
        L.append(f"| {c}: {m['label']} | `--doorbells {m['serve_doorbells']} --poll {m['server_poll']}` | "
                 f"`--doorbells {m['perf_doorbells']} --completion {m['completion']}` | {PEER_MODES[mode][0]} | "
                 f"{PEER_MODES[mode][1]} | `--doorbells auto --completion poll` ({chose}) |")
    return L


def peer_points_md(per):
    L = ["### Every point, each side's own figures", "",
         "| client | configuration | target | QD | IOPS mean [min–max] | mean latency µs | p50 µs | p99 µs | client "
         "CPU µs/IO | server CPU µs/IO | trapped db/IO (vnvme) | irq/IO (vnvme) | other load |",
         "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for x in per:
        for side, pts in (("SPDK", x["spdk_points"]), ("vnvme", x["vnvme_points"])):
            for p in pts:
                mean_us = spread([r.get("mean_us") for r in p["runs"]])
                L.append(f"| {CLIENT_NAMES[x['client']]} | {p['config']} | {side} | {p['qd']} | "
                         f"{fmt(p['iops'], fmt_iops)} | {fmt(mean_us, num(1))} | {fmt(p['p50_us'], num(1))} | "
                         f"{fmt(p['p99_us'], num(1))} | {fmt(p['client_cpu_us_per_io'], num(2))} | "
                         f"{fmt(p['server_cpu_us_per_io'], num(2))} | {fmt(p['trapped_db_per_io'], num(4))} | "
                         f"{fmt(p['irq_per_io'], num(4))} | {fmt(p['other_cpus'], num(2))} |"
                         + (f" ⚠ {len(p['errors'])} run(s) failed" if p["errors"] else ""))
    L += ["", "Client CPU: vnvme perf's process CPU time over its run; spdk_nvme_perf's /proc utime+stime over its "
          "window. Server CPU: /proc utime+stime of vnvme serve or nvmf_tgt over the same window. spdk_nvme_perf "
          "gives no percentiles (–), only its mean; a vnvme server's counters under it are its totals at exit (less "
          "those of the pass that wrote a RAM disk before the run). "
          "Other load: CPUs kept busy by anything else meanwhile (> 0.2: disturbed)."]
    return L


def peer_errors_md(peer):
    errs = peer.get("errors_logged") or []
    L = ["### What SPDK logged as errors", ""]
    if not errs:
        return L + ["No *ERROR* line in nvmf_tgt's or spdk_nvme_perf's logs.", ""]
    L += ["| who | message (first seen) | lines | runs (logs/) |", "|---|---|--:|---|"]
    for g in errs:
        runs = ", ".join(g["runs"][:6]) + (f" and {len(g['runs']) - 6} more" if len(g["runs"]) > 6 else "")
        L.append(f"| {g['who']} | `{g['example']}` | {g['lines']} | {len(g['runs'])}: {runs} |")
    return L + [""]


def peer_backend_lines(peer, knobs, per):
    """What each target serves (--peer-backend), what a read goes through on each
    side, and, for a file, how each held it open in every run (/proc/PID/fdinfo)."""
    backend = peer.get("backend", "null")
    L = [f"- backend: **{backend}** (--peer-backend), the same on both sides"]
    if backend == "null":
        if not knobs["ns"].startswith("null:"):
            return L + [f"  - **vnvme serves `{knobs['ns']}`, not a null namespace: the two sides do not do the same "
                        f"work** (--peer-backend ram or file gives both the same backend)"]
        return L + ["  - reads go nowhere: no data is moved on either side (SPDK's null bdev leaves the buffer "
                    "untouched; vnvme's null namespace too with reads=untouched, else it zero-fills it)"]
    if backend == "ram":
        L += [f"  - vnvme: `{knobs['ns']}`, a memfd in 1 MiB chunks: a read is a CPU copy (memcpy) from the chunk "
              f"into the client's buffer",
              f"  - SPDK: `{peer.get('spdk_bdev')}` (the same size, 4 KiB blocks), out of nvmf_tgt's memory (its -s "
              f"grown by the disk's size): a read is a CPU copy by SPDK's accel framework (software module: "
              f"memcpy on the reactor's core) into the client's buffer",
              f"  - before every run, on either side: `{peer.get('prefill')}` writes the whole disk (vnvme reads a "
              f"chunk never written as zeroes, with no copy); not measured, checked to have covered the disk; "
              f"a vnvme server's counters from that pass are taken off what spdk_nvme_perf's run reports"]
    elif backend == "file":
        seen = {}
        for x in per:
            for side, pts in (("SPDK", x["spdk_points"]), ("vnvme", x["vnvme_points"])):
                for p in pts:
                    for r in p["runs"]:
                        seen.setdefault(side, set()).add(r.get("data_fds") or "?")
        held = "; ".join(f"{side}: {', '.join(sorted(v))}" for side, v in sorted(seen.items())) or "no run"
        L += [f"  - the file (<peer-file> here): {peer.get('peer_file', '?')}",
              f"  - vnvme: `{knobs['ns']}`: io_uring, O_DIRECT (direct=on: vnvme refuses to serve without it); a read "
              f"goes from the disk straight into the client's buffer (both clients' buffers are page-aligned; a "
              f"misaligned one would go through a bounce buffer), bypassing the page cache",
              f"  - SPDK: `{peer.get('spdk_bdev')}`: opens the file O_DIRECT where the file system allows it (else "
              f"silently without); a read goes into the client's buffer, bypassing the page cache",
              f"  - as each run found them (/proc/PID/fdinfo of the target, each descriptor for the file; a run "
              f"without an O_DIRECT one stops the benchmark): {held}",
              "  - O_DIRECT on both sides: neither target copies the data with the CPU (the disk's DMA puts it in "
              "the client's buffer), so the memcpy bandwidth below bounds neither; the disk does"]
    return L


def read_memcpy(dirpath):
    """runs/memcpy.tsv and the memcpy_bw JSON it names, by (config, qd): the
    repetitions before and after the point's runs, pooled, and the other load
    meanwhile (the machine's busy CPUs less the one memcpy_bw keeps busy)."""
    path = os.path.join(dirpath, "runs", "memcpy.tsv")
    if not os.path.exists(path):
        return {}
    out = {}
    with open(path) as f:
        for r in csv.DictReader(f, delimiter="\t"):
            with open(os.path.join(dirpath, r["json"])) as g:
                j = json.load(g)
            wall = float(r["wall_s"])
            other = max(0.0, int(r["sys_busy_ticks"]) / CLK_TCK / wall - 1) if wall > 0 else None
            m = out.setdefault((r["config"], int(r["qd"])), {"gb_per_s": [], "when": {}})
            m["gb_per_s"] += j["gb_per_s"]
            m["when"][r["when"]] = {"json": r["json"], "median_gb_per_s": j["median_gb_per_s"],
                                    "min_gb_per_s": j["min_gb_per_s"], "max_gb_per_s": j["max_gb_per_s"],
                                    "other_cpus": other, "cpus_allowed": j.get("cpus_allowed"),
                                    "steal": steal_share(int(r["steal_ticks"]), int(r["total_ticks"]))}
            m["knobs"] = {k: j.get(k) for k in ("copy", "chunk_bytes", "dst_bytes", "src_bytes", "src_pattern",
                                                "seconds_per_repeat", "repeat", "warm_up_s")}
    for m in out.values():
        v = m["gb_per_s"]
        m.update({"median_gb_per_s": median(v), "min_gb_per_s": min(v), "max_gb_per_s": max(v), "n": len(v)})
    return out


def peer_bandwidth(per, mem, bs):
    """Per client and point: each target's MB/s (IOPS x bs / 10^6) over its runs
    and each run's as a ratio to the point's memcpy median."""
    rows = []
    for x in per:
        for c in x["comparison"]:
            m = mem.get((c["config"], c["qd"]))
            limit = m["median_gb_per_s"] * 1e3 if m else None
            row = {"client": x["client"], "config": c["config"], "qd": c["qd"], "memcpy": m}
            for side, pts in (("spdk", x["spdk_points"]), ("vnvme", x["vnvme_points"])):
                p = get(pts, c["config"], c["qd"])
                mbs = [r["iops"] * bs / 1e6 for r in p["runs"]] if p else []
                row[side] = {"mb_per_s": spread(mbs), "mb_per_s_median": median(mbs) if mbs else None,
                             "of_memcpy": spread([v / limit for v in mbs]) if limit else None,
                             "of_memcpy_median": median([v / limit for v in mbs]) if limit and mbs else None}
            rows.append(row)
    return rows


def peer_bandwidth_md(rows, knobs, peer, row_name):
    """The bandwidth table: each side's MB/s beside the host's memcpy bandwidth."""
    cmd = peer.get("memcpy", "memcpy_bw")
    L = [f"### Bandwidth beside the host's memcpy, {fmt_bs(knobs['bs'])} {knobs['rw']}", "",
         f"- memcpy: `{cmd}` (crates/guest-mem/examples/memcpy_bw.rs, release build), on the servers' CPU, before and "
         f"after each point's runs: `<[u8]>::copy_from_slice` of {knobs['bs']}-byte chunks from a source far larger "
         f"than the caches into a destination set of QD x {knobs['bs']} bytes (the buffers a client keeps in "
         f"flight), the copy a RAM backend makes per read; GB/s = 10^9 bytes copied per second",
         "- target MB/s: IOPS x I/O size / 10^6 per run; \"/ memcpy\": each run's MB/s over the point's memcpy "
         "median, as median [min–max] of the runs", "",
         "| client | configuration / SPDK mode | QD | memcpy GB/s median [min–max] (n) | before / after | other load "
         "| SPDK MB/s | SPDK / memcpy | vnvme MB/s | vnvme / memcpy |",
         "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|"]

    def mbs(s):
        return fmt(s, num(0)) if s else "–"

    def share(s):
        return fmt(s, num(3)) if s else "–"
    for r in rows:
        m = r["memcpy"]
        if m:
            w = m["when"]
            mem_cell = f"{m['median_gb_per_s']:.2f} [{m['min_gb_per_s']:.2f}–{m['max_gb_per_s']:.2f}] ({m['n']})"
            ba = " / ".join(f"{w[k]['median_gb_per_s']:.2f}" if k in w else "–" for k in ("before", "after"))
            others = [v["other_cpus"] for v in w.values() if v["other_cpus"] is not None]
            other = f"{max(others):.2f}" if others else "–"
        else:
            mem_cell, ba, other = "not measured", "–", "–"
        L.append(f"| {CLIENT_NAMES[r['client']]} | {row_name(r)} | {r['qd']} | {mem_cell} | {ba} | {other} | "
                 f"{mbs(r['spdk']['mb_per_s'])} | {share(r['spdk']['of_memcpy'])} | {mbs(r['vnvme']['mb_per_s'])} | "
                 f"{share(r['vnvme']['of_memcpy'])} |")
    L += ["", "MB/s: mean [min–max] of each side's runs. Other load: CPUs busy besides memcpy_bw while it ran "
          "(> 0.2: disturbed). The ratio vnvme / SPDK of MB/s is that of IOPS in the pairs above (the same I/O "
          "size on both sides)."]
    return L


def main_peer(a, mach, knobs, matrix, peer):
    """The report of a --peer-spdk run: per client, vnvme / SPDK pairs."""
    clients = [c for c in ("vnvme", "spdk") if c in peer.get("clients", "vnvme").split(",")]
    per = []
    for c in clients:
        sp, vp = load(a.dir, matrix, "spdk", c), load(a.dir, matrix, "vnvme", c)
        per.append({"client": c, "spdk_points": sp, "vnvme_points": vp, "comparison": compare_peer(sp, vp),
                    "spec": pair_spec_peer(knobs, peer, c, mach)})
    knobs["peer_spdk"] = True
    L = peer_header(mach, knobs, matrix, peer, per)
    for x in per:
        S, P = pairs_md(x["comparison"], x["spec"], knobs)
        L += ["", f"### {x['spec']['title']}", ""] + x["spec"]["intro"] + S + [""] + P
    mem = read_memcpy(a.dir)
    bandwidth = peer_bandwidth(per, mem, knobs["bs"]) if mem else None
    if bandwidth:
        L += [""] + peer_bandwidth_md(bandwidth, knobs, peer, per[0]["spec"]["row"])
    L += [""] + peer_points_md(per) + [""] + peer_errors_md(peer)
    md = "\n".join(L) + "\n"
    env_path = os.path.join(a.dir, "runs", "environment.txt")
    mach["environment"] = open(env_path).read() if os.path.exists(env_path) else None
    report = {"benchmark": "scripts/bench-vfio-user.sh --peer-spdk", "machine": mach, "knobs": knobs,
              "configurations": matrix, "metrics": {**METRICS, **RUN_FIGURES}, "peer": peer,
              "pairs_design": {
                  "kind": "peer", "ratio": "vnvme / SPDK", "sides": {"base": "SPDK", "new": "vnvme"},
                  "order": "SPDK first on odd repetitions, vnvme first on even ones",
                  "servers": per[0]["spec"]["servers"] if per else None,
                  "modes": {c: peer_mode(peer, c) for c in {p["config"] for x in per for p in x["vnvme_points"]}},
                  "ratios": {key: f"{what}, vnvme / SPDK, {'higher' if higher else 'lower'} is better"
                             for key, _, higher, what in RATIOS},
                  "interval": f"seeded bootstrap 90 % interval of the median with >= {BOOTSTRAP_MIN_PAIRS} pairs, "
                              f"else min–max of the pairs; one pair: no verdict",
                  "verdict": "ahead / behind only when the interval excludes 1.0, else level (inside the noise)"},
              "clients": {x["client"]: {"comparison": x["comparison"], "spdk_points": x["spdk_points"],
                                        "vnvme_points": x["vnvme_points"]} for x in per},
              "memcpy": ({"command": peer.get("memcpy"),
                          "points": [{"config": k[0], "qd": k[1], **v} for k, v in sorted(mem.items())]}
                         if mem else None),
              "bandwidth": bandwidth,
              "disturbance": {"steal_above": DISTURBED_STEAL, "other_procs_cpus_above": DISTURBED_OTHER_CPUS,
                              "pair": "disturbed when either of its runs is"}}
    with open(os.path.join(a.dir, "results.json"), "w") as f:
        f.write(scrub(json.dumps(report, indent=2), a.root) + "\n")
    with open(os.path.join(a.dir, "table.md"), "w") as f:
        f.write(scrub(md, a.root))
    # The chart's legend names each configuration with the SPDK mode it met.
    legend_matrix = [{**m, "label": f"{m['label']} / {PEER_MODES[peer_mode(peer, m['id'])][0]}"}
                     if peer_mode(peer, m["id"]) in PEER_MODES else m for m in matrix]
    charts = {}
    for i, x in enumerate(per):
        name = "chart.svg" if i == 0 else f"chart-client-{x['client']}.svg"
        charts[name] = ratio_chart(mach, knobs, legend_matrix, x["comparison"], x["spec"], {})
    for name, svg in charts.items():
        with open(os.path.join(a.dir, name), "w") as f:
            f.write(svg)
    print(md)
    print("## Summary (as in table.md)\n")
    for x in per:
        print("\n".join([f"### {x['spec']['title']}", ""] + x["spec"]["intro"]
                        + pairs_md(x["comparison"], x["spec"], knobs)[0]) + "\n")
    if bandwidth:
        print("\n".join(peer_bandwidth_md(bandwidth, knobs, peer, per[0]["spec"]["row"])) + "\n")
    log(f"wrote {a.dir}/{{results.json,table.md,{','.join(charts)}}}")
    return 0


def scrub(text, root):
    """Keeps this machine's paths out of the results: the checkout becomes relative,
    the run's temporary directory becomes <work>."""
    text = text.replace(root.rstrip("/") + "/", "")
    return re.sub(r"/tmp/vnvme-vfio-user-bench\.[A-Za-z0-9]+", "<work>", text)


def main():
    if sys.argv[1:2] == ["--run-spdk-perf"]:
        return run_spdk_perf(sys.argv[2:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--seconds", default="3")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--qd", default="1,4,16,64")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--pin", type=int, default=0)
    ap.add_argument("--ns", default="null:64G:lba=4096")
    ap.add_argument("--rw", default="randread")
    ap.add_argument("--bs", type=int, default=4096, help="bytes per I/O")
    ap.add_argument("--reference", default="none", help="the configuration the others were run beside, or none")
    ap.add_argument("--matrix", required=True)
    ap.add_argument("--command", default="scripts/bench-vfio-user.sh")
    ap.add_argument("--started", help="run start, UTC, as YYYYmmddTHHMMSSZ")
    a = ap.parse_args()
    knobs = {"seconds": float(a.seconds), "repeat": a.repeat, "qd": a.qd,
             "qd_list": [int(q) for q in a.qd.split(",")], "workers": a.workers, "pin": bool(a.pin), "ns": a.ns,
             "command": a.command, "rw": a.rw, "bs": a.bs, "queues": 1,
             "queue_entries": "1024 (perf: max(qd + 1, 1024))"}
    moved_path = os.path.join(a.dir, "runs", "moved", "moved.tsv")
    if os.path.exists(moved_path):
        # Runs set aside because the CPUs moved under their pair (two per pair run again).
        with open(moved_path) as f:
            knobs["moved_runs"] = sum(1 for _ in csv.DictReader(f, delimiter="\t"))
    started = None
    if a.started:
        started = datetime.datetime.strptime(a.started, "%Y%m%dT%H%M%SZ").strftime("%Y-%m-%d %H:%M:%S UTC")
    mach = machine(a.root, started)
    cost_path = os.path.join(a.dir, "cost", "results.json")
    if os.path.exists(cost_path):
        # bench-cost's server points: "server <doorbells> qd<N>[ inline]".
        knobs["cost"] = [{"config": p["doorbells"], "qd": p["qd"], "instr_per_io": p["controller_per_io"],
                          "instr_per_io_range": p.get("controller_per_io_range"),
                          "syscalls_per_io": p.get("syscalls_per_io")}
                         for p in json.load(open(cost_path))["points"] if p.get("kind") == "server"]
    matrix = parse_matrix(a.matrix, a.workers)
    peer = read_peer(a.dir)
    if peer:
        return main_peer(a, mach, knobs, matrix, peer)
    points = load(a.dir, matrix)
    tgts = targets(points, matrix)
    binaries = read_binaries(a.dir)
    comparison = spec = None
    # A folder of runs made without pairs (or before --reference) has no "beside".
    paired = any(r["beside"] for p in points for r in p["runs"])
    knobs["reference"] = a.reference if a.reference != "none" and paired else None
    if "base" in binaries:
        knobs["baseline"] = True
        base_points = load(a.dir, matrix, side="base")
        comparison = compare(base_points, points)
    elif knobs["reference"]:
        comparison = compare_reference(points, matrix, knobs["reference"])
    if comparison is not None:
        spec = pair_spec(knobs, binaries)
    md = table_md(mach, knobs, matrix, points, tgts, comparison, spec)
    env_path = os.path.join(a.dir, "runs", "environment.txt")
    mach["environment"] = open(env_path).read() if os.path.exists(env_path) else None
    report = {"benchmark": "scripts/bench-vfio-user.sh", "machine": mach, "knobs": knobs,
              "configurations": matrix, "metrics": METRICS, "points": points, "targets": tgts,
              "seed_reference": {"source": SEED_SOURCE, "qd": SEED_QD, "kiops": dict(SEED_KIOPS),
                                 "note": "not measured here"}}
    if comparison is not None:
        report["metrics"] = {**METRICS, **RUN_FIGURES}
        if knobs.get("baseline"):
            report["binaries"] = binaries
            report["baseline_points"] = base_points
        report["pairs_design"] = {
            "kind": "baseline" if knobs.get("baseline") else "reference", "ratio": spec["ratio"],
            "sides": {spec["a"]: spec["a_name"], spec["b"]: spec["b_name"]}, "order": spec["order"],
            "servers": spec["servers"],
            "ratios": {key: f"{what}, {spec['ratio']}, {'higher' if higher else 'lower'} is better"
                       for key, _, higher, what in RATIOS},
            "interval": f"seeded bootstrap 90 % interval of the median with >= {BOOTSTRAP_MIN_PAIRS} pairs, else "
                        f"min–max of the pairs; one pair: no verdict",
            "verdict": "ahead / behind only when the interval excludes 1.0, else level (inside the noise)"}
        report["comparison"] = comparison
        report["disturbance"] = {"steal_above": DISTURBED_STEAL, "other_procs_cpus_above": DISTURBED_OTHER_CPUS,
                                 "pair": "disturbed when either of its runs is"}
    with open(os.path.join(a.dir, "results.json"), "w") as f:
        f.write(scrub(json.dumps(report, indent=2), a.root) + "\n")
    with open(os.path.join(a.dir, "table.md"), "w") as f:
        f.write(scrub(md, a.root))
    charts = {"chart.svg": chart(mach, knobs, matrix, points)}
    if comparison is not None:
        charts = {"chart.svg": ratio_chart(mach, knobs, matrix, comparison, spec, binaries),
                  "chart-new.svg" if knobs.get("baseline") else "chart-absolute.svg": charts["chart.svg"]}
    for name, svg in charts.items():
        with open(os.path.join(a.dir, name), "w") as f:
            f.write(svg)
    print(md)
    if comparison is not None:
        # The answer last, where the eye lands when the run ends.
        print("## Summary (as in table.md)\n")
        print("\n".join(summary_md(comparison, spec, knobs)) + "\n")
    log(f"wrote {a.dir}/{{results.json,table.md,{','.join(charts)}}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
