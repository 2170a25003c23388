#!/usr/bin/env python3
"""Turn a scripts/bench-guest.sh run into results.json, results.md and chart.svg.

Usage: bench-guest.py RESULTS_DIR

RESULTS_DIR holds meta.json and raw/<guest>/ (one per boot: a device alone,
or a pair "A+B" booted together) with serial.log[.gz] (the guest's @@RESULT
lines and fio JSON), device.json (the guest's devices by slot, a and b) and
marks/ or marks.tar.gz (CPU samples, process ids, the host's /proc/stat and
vnvme counter snapshots taken at the guest's marks, see bench_watch in
scripts/bench-guest.sh). Runs of older versions (one device per guest, no
slots, no host samples) are read too.

For a pair, every repetition of every point ran on both devices one after
the other; the report gives the per-repetition ratios B/A of IOPS and of
device-side CPU per I/O as a median, an interval and a verdict (the same
rules as scripts/bench-vfio-user.sh --baseline: ratio_summary() in
scripts/lib/vnvme_report.py), over all repetitions and over those no run of
which was disturbed (disturbance(): host steal or other load).

Standard library only; counter deltas, per-I/O figures, the paired
statistics and the chart come from scripts/lib/vnvme_report.py, shared with
scripts/bench-vfio-user.py.
"""

import gzip
import io
import json
import math
import os
import re
import sys
import tarfile
from statistics import mean

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from vnvme_report import (  # noqa: E402
    BOOTSTRAP_MIN_PAIRS, DISTURBED_OTHER_CPUS, DISTURBED_STEAL, bar_chart, disturbance, machine_line, machine_md,
    median, other_cpus, per_io, ratio_summary, stats_deltas, steal_share, sum_opt)

POINT_ORDER = ["randread-qd1", "randread-qd4", "randread-qd16", "randread-qd64", "randwrite-qd16"]
DEVICE_ORDER = [
    "qemu-nvme", "qemu-nvme-ioeventfd", "virtio-blk", "virtio-blk-iothread",
    "vnvme-trapped-off", "vnvme-trapped-adaptive", "vnvme-trapped-always",
    "vnvme-eventfd-off", "vnvme-eventfd-adaptive", "vnvme-eventfd-always",
    "vnvme-mapped-always", "null_blk",
    "qemu-nvme-disk", "vnvme-file-tmpfs", "vnvme-file-disk", "vnvme-chain-tmpfs",
]
VCPU_RE = re.compile(r"^CPU \d+/(TCG|KVM)")


class Marks:
    """The files the host's watcher wrote at the marks: raw/<guest>/marks/ or,
    once packed by bench-guest.sh, raw/<guest>/marks.tar.gz."""

    def __init__(self, ddir):
        self.files = {}
        d = os.path.join(ddir, "marks")
        if os.path.isdir(d):
            for n in os.listdir(d):
                with open(os.path.join(d, n), "rb") as f:
                    self.files[n] = f.read()
        elif os.path.exists(d + ".tar.gz"):
            with tarfile.open(d + ".tar.gz") as t:
                for m in t.getmembers():
                    if m.isfile():
                        self.files[os.path.basename(m.name)] = t.extractfile(m).read()

    def text(self, name):
        b = self.files.get(name)
        return None if b is None else b.decode(errors="replace")

    def has(self, name):
        return name in self.files

    def names(self):
        return sorted(self.files)


def read_cpu(marks, name):
    """{(pid, tid): (ns, comm)} from a NAME.cpu sample."""
    text = marks.text(name)
    if text is None:
        return None
    out = {}
    for line in io.StringIO(text):
        parts = line.rstrip("\n").split(" ", 3)
        if len(parts) == 4:
            out[(parts[0], parts[1])] = (int(parts[2]), parts[3])
    return out


def cpu_delta(a, b, pid, vcpu=None):
    """ns of CPU used by PID's threads between samples a and b. vcpu=True/False
    selects only vCPU / only non-vCPU threads (by thread name)."""
    if a is None or b is None or not pid:
        return None
    total = 0
    for key, (ns, comm) in b.items():
        if key[0] != pid:
            continue
        if vcpu is not None and bool(VCPU_RE.match(comm)) != vcpu:
            continue
        total += ns - a.get(key, (0, comm))[0]
    return total


def read_host(marks, name):
    """(busy, steal, total ticks, time s) of the host at a mark (NAME.host), or None."""
    text = marks.text(name)
    try:
        busy, steal, total, t = text.split()[:4]
        return int(busy), int(steal), int(total), float(t)
    except (AttributeError, ValueError):
        return None


def read_stats(marks, name):
    text = marks.text(name)
    try:
        return json.loads(text) if text else None
    except json.JSONDecodeError:
        return None


def read_pids(marks):
    """{label: pid} from the NAME.pids files the host's watcher wrote at the marks."""
    out = {}
    for n in marks.names():
        if n.endswith(".pids"):
            for line in io.StringIO(marks.text(n)):
                parts = line.split()
                if len(parts) == 2:
                    out.setdefault(parts[0], parts[1])
    return out


def parse_serial(path):
    """{(point, rep, slot): kv} of @@RESULT lines, the same of fio JSON, @@INFO.
    Lines without a slot (older runs: one device per guest) are slot a."""
    results, fio, info = {}, {}, {}
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        with gzip.open(path + ".gz", "rt", errors="replace") as f:
            text = f.read()
    else:
        with open(path, errors="replace") as f:
            text = f.read()
    for m in re.finditer(r"@@RESULT (\S+) (\d+)(?: ([ab])(?= ))? ([^@]*)@@", text):
        kv = dict(x.split("=", 1) for x in m.group(4).split())
        results[(m.group(1), int(m.group(2)), m.group(3) or "a")] = kv
    for m in re.finditer(r"@@FIO-BEGIN (\S+) (\d+)(?: ([ab]))?@@\r?\n(.*?)@@FIO-END@@", text, re.S):
        body = m.group(4)
        try:
            fio[(m.group(1), int(m.group(2)), m.group(3) or "a")] = json.loads(body[body.index("{"): body.rindex("}") + 1])
        except (ValueError, json.JSONDecodeError):
            pass
    m = re.search(r"@@INFO ([^@]*)@@", text)
    if m:
        info = dict(x.split("=", 1) for x in m.group(1).split())
    return results, fio, info


def load_guest(gdir):
    """device.json as {"guest", "design", "neighbour", "slots": [...]}, whatever its version."""
    dev = json.load(open(os.path.join(gdir, "device.json")))
    if "slots" not in dev:  # one device per guest, before pairs
        dev = {"guest": dev["device"], "design": "single", "neighbour": False, "qemu_args": dev.get("qemu_args", []),
               "slots": [{"slot": "a", "device": dev["device"], "desc": dev["desc"], "backing": dev["backing"]}]}
    return dev


def analyse_guest(gdir, clk_tck):
    """One entry per device of the guest: its runs (every repetition) and their
    means per point."""
    g = load_guest(gdir)
    results, fio, info = parse_serial(os.path.join(gdir, "serial.log"))
    marks = Marks(gdir)
    pids = read_pids(marks)
    qpid, bpid, npid = pids.get("qemu"), pids.get("vnvme-back"), pids.get("neighbour")
    vpids = {s: pids.get(f"vnvme-{s}") for s in ("a", "b")}
    if not vpids["a"] and pids.get("vnvme"):
        vpids["a"] = pids["vnvme"]
    paired = len(g["slots"]) == 2
    entries = []
    for sl in g["slots"]:
        s, name_dev = sl["slot"], sl["device"]
        beside = next((x["device"] for x in g["slots"] if x["slot"] != s), None)
        vpid = vpids.get(s)
        is_vnvme = name_dev.startswith("vnvme")
        runs = []
        for (name, rep, slot), j in sorted(fio.items()):
            if slot != s:
                continue
            job = j["jobs"][0]
            side = job["write"] if name.startswith("randwrite") else job["read"]
            ios = side.get("total_ios") or 0
            pct = side.get("lat_ns", {}).get("percentile", {})
            base = f"p-{name}-{rep}-{s}"
            if not marks.has(f"{base}-start.cpu"):
                base = f"p-{name}-{rep}"  # older runs: no slot in the mark names
            sfx = f"-{s}" if marks.has(f"{base}-start.stats0-{s}") else ""
            a = read_cpu(marks, f"{base}-start.cpu")
            b = read_cpu(marks, f"{base}-end.cpu")
            s0 = read_stats(marks, f"{base}-start.stats0{sfx}")
            s1 = read_stats(marks, f"{base}-end.stats1{sfx}")
            h0, h1 = read_host(marks, f"{base}-start.host"), read_host(marks, f"{base}-end.host")
            r = results.get((name, rep, s), {})
            q_non_vcpu = per_io(cpu_delta(a, b, qpid, vcpu=False), ios, 1e-3)
            # An nvme:// chain counts both vnvme processes.
            vn = (per_io(sum_opt(cpu_delta(a, b, vpid), cpu_delta(a, b, bpid) if bpid else 0), ios, 1e-3)
                  if vpid and is_vnvme else None)
            run = {
                "point": name,
                "rep": rep,
                "order": None,
                "iops": side.get("iops"),
                "ios": ios,
                "lat_mean_us": side.get("lat_ns", {}).get("mean", 0) / 1000,
                "lat_p99_us": pct.get("99.000000", 0) / 1000 if pct else None,
                "fio_usr_pct": job.get("usr_cpu"),
                "fio_sys_pct": job.get("sys_cpu"),
                "fio_rc": int(r["rc"]) if r.get("rc", "").isdigit() else None,
                "guest_busy_pct": float(r["busy"]) if r.get("busy", "nan") != "nan" else None,
                "guest_irq_per_io": per_io(int(r["irqs"]), ios) if "irqs" in r else None,
                "qemu_non_vcpu_us_per_io": q_non_vcpu,
                "qemu_vcpu_us_per_io": per_io(cpu_delta(a, b, qpid, vcpu=True), ios, 1e-3),
                "vnvme_us_per_io": vn,
                # The device side outside the vCPUs: QEMU's other threads, plus the server for vnvme.
                "device_us_per_io": (None if name_dev == "null_blk" or q_non_vcpu is None
                                     else q_non_vcpu + (vn or 0)),
            }
            if paired:
                run["order"] = "first" if (rep % 2 == 1) == (s == "a") else "second"
            # The host around the run: steal, and CPUs busy with anything but the
            # processes under test (QEMU, every vnvme server) and the neighbour.
            steal = other = neigh = wall = None
            if h0 and h1 and h1[3] > h0[3]:
                wall = h1[3] - h0[3]
                steal = steal_share(h1[1] - h0[1], h1[2] - h0[2])
                known = [cpu_delta(a, b, p) for p in (qpid, vpids["a"], vpids["b"], bpid, npid) if p]
                if a is not None and b is not None and qpid:
                    explained = sum(x for x in known if x is not None) / 1e9
                    other = other_cpus((h1[0] - h0[0]) - (h1[1] - h0[1]), wall, explained, 0.0, clk_tck)
                if npid:
                    nd = cpu_delta(a, b, npid)
                    neigh = nd / 1e9 / wall if nd is not None else None
            run["host_wall_s"] = wall
            run["host_steal"] = steal
            run["host_other_cpus"] = other
            run["neighbour_cpus"] = neigh
            run["disturbed"] = disturbance(steal, other)
            dv = stats_deltas(s0, s1)
            if dv:
                run["vnvme_io_commands"] = dv["io_commands"]
                run["vnvme_doorbells_per_io"] = dv["doorbells_per_io"]
                run["vnvme_irq_per_io"] = dv["irq_per_io"]
            runs.append(run)
        agg = {}
        for name in sorted({r["point"] for r in runs}, key=lambda n: POINT_ORDER.index(n) if n in POINT_ORDER else 99):
            rs = [r for r in runs if r["point"] == name]
            pa = {"point": name, "reps": len(rs), "iops_reps": [r["iops"] for r in rs],
                  "flagged_reps": [r["rep"] for r in rs if r["disturbed"]]}
            for k in rs[0]:
                if k in ("point", "rep", "order", "disturbed"):
                    continue
                vals = [r[k] for r in rs if isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)]
                pa[k] = mean(vals) if vals else None
            agg[name] = pa
        label = name_dev if not paired else f"{name_dev} (beside {beside})"
        entries.append({"device": name_dev, "label": label, "guest": g["guest"], "slot": s,
                        "design": g["design"], "neighbour": g.get("neighbour", False),
                        "desc": sl["desc"], "backing": sl["backing"], "serial": sl.get("serial"),
                        "paused_when_idle": sl.get("paused_when_idle", False),
                        "engine": info.get("engine"), "fio": info.get("fio"), "runs": runs, "points": agg})
    return g, entries


def ratio(x, y):
    return x / y if x is not None and y else None


def compare(a, b):
    """The pair (a, b) of one guest: per point, the repetitions side by side and
    the ratios b/a, summarised over all repetitions and over the undisturbed ones."""
    out = []
    for name in [p for p in POINT_ORDER if p in b["points"]] + [p for p in b["points"] if p not in POINT_ORDER]:
        ra = {r["rep"]: r for r in a["runs"] if r["point"] == name}
        reps = []
        for rb in [r for r in b["runs"] if r["point"] == name]:
            r_a = ra.get(rb["rep"])
            if not r_a:
                continue
            reps.append({
                "rep": rb["rep"],
                "order": f"{a['device']}, {b['device']}" if rb["rep"] % 2 else f"{b['device']}, {a['device']}",
                "a_iops": r_a["iops"], "b_iops": rb["iops"],
                "iops_ratio": ratio(rb["iops"], r_a["iops"]),
                "a_device_us_per_io": r_a["device_us_per_io"], "b_device_us_per_io": rb["device_us_per_io"],
                "device_cpu_ratio": ratio(rb["device_us_per_io"], r_a["device_us_per_io"]),
                "a_steal": r_a["host_steal"], "b_steal": rb["host_steal"],
                "a_other_cpus": r_a["host_other_cpus"], "b_other_cpus": rb["host_other_cpus"],
                "disturbed": [f"{a['device']}: {w}" for w in r_a["disturbed"]] + [f"{b['device']}: {w}" for w in rb["disturbed"]],
            })
        clean = [p for p in reps if not p["disturbed"]]
        out.append({
            "point": name,
            "a_iops_median": median([p["a_iops"] for p in reps if p["a_iops"] is not None]),
            "b_iops_median": median([p["b_iops"] for p in reps if p["b_iops"] is not None]),
            "iops_ratio": ratio_summary([p["iops_ratio"] for p in reps], True),
            "iops_ratio_unflagged": ratio_summary([p["iops_ratio"] for p in clean], True),
            "device_cpu_ratio": ratio_summary([p["device_cpu_ratio"] for p in reps], False),
            "device_cpu_ratio_unflagged": ratio_summary([p["device_cpu_ratio"] for p in clean], False),
            "flagged_reps": [p["rep"] for p in reps if p["disturbed"]],
            "reps": reps,
        })
    return {"guest": a["guest"], "a": a["device"], "b": b["device"], "ratio": f"{b['device']} / {a['device']}",
            "neighbour": a["neighbour"], "points": out}


def fmt(v, nd=1, none="n/a"):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return none
    return f"{v:.{nd}f}"


def fmt_summary(s, bold=True):
    """median [interval] verdict; "(n = N, min–max)" when the interval is min–max."""
    if s is None:
        return "–"
    if s["pairs"] < 2:
        return f"{s['median']:.3f} (one pair: no interval, no verdict)"
    lo, hi = s["interval"]
    v = s["verdict"]
    if bold and v in ("ahead", "behind"):
        v = f"**{v}**"
    n = f" (n = {s['pairs']}, min–max)" if s["pairs"] < BOOTSTRAP_MIN_PAIRS else ""
    return f"{s['median']:.3f} [{lo:.3f}–{hi:.3f}] {v}{n}"


def fmt_flags(p):
    return "⚠ " + "; ".join(p["disturbed"]) if p["disturbed"] else ""


def pct(v):
    return "–" if v is None else f"{100 * v:.1f}"


def ratio_md(meta, pairs):
    L = ["## Paired ratios\n"]
    L.append(f"Each row: a pair of devices booted in one guest (B beside A); every repetition ran the point on "
             f"both, A first on odd repetitions and B first on even ones. Ratio = B / A of the same repetition. "
             f"Cells: median [interval] verdict, the interval a seeded bootstrap 90 % interval of the median with "
             f"≥ {BOOTSTRAP_MIN_PAIRS} pairs, else min–max of the pairs. The verdict is **ahead** (B better) or "
             f"**behind** (B worse) only when the whole interval lies on one side of 1.0, else level (inside the "
             f"noise). IOPS: higher is better; device CPU µs/IO (QEMU's non-vCPU threads, plus the vnvme "
             f"process for vnvme): lower is better, so a CPU ratio below 1 is \"ahead\". *all reps*: every "
             f"pair; *unflagged*: without the pairs one of whose runs was disturbed (host steal > "
             f"{100 * DISTURBED_STEAL:.0f} % or > {DISTURBED_OTHER_CPUS} CPUs of other load; see \"flagged\").\n")
    if meta["reps"] < BOOTSTRAP_MIN_PAIRS:
        L.append(f"**Only {meta['reps']} repetitions: the intervals are min–max, and all n pairs fall on one side "
                 f"of 1.0 by chance with probability 2/2^n even with no difference; use --reps ≥ "
                 f"{BOOTSTRAP_MIN_PAIRS} for a verdict.**\n")
    L.append("| B / A | test | A KIOPS | B KIOPS | IOPS B/A, all reps | IOPS B/A, unflagged | device CPU/IO B/A, "
             "all reps | device CPU/IO B/A, unflagged | flagged |")
    L.append("| --- | --- | ---: | ---: | --- | --- | --- | --- | --- |")
    for c in pairs:
        for p in c["points"]:
            n = len(p["reps"])
            fl = p["flagged_reps"]
            same = "= all (none flagged)"
            L.append(f"| {c['b']} / {c['a']} | {p['point']} | {fmt((p['a_iops_median'] or 0) / 1000)} | "
                     f"{fmt((p['b_iops_median'] or 0) / 1000)} | {fmt_summary(p['iops_ratio'])} | "
                     f"{fmt_summary(p['iops_ratio_unflagged']) if fl else same} | "
                     f"{fmt_summary(p['device_cpu_ratio'])} | "
                     f"{fmt_summary(p['device_cpu_ratio_unflagged']) if fl else same} | "
                     f"{len(fl)}/{n}{' (rep ' + ', '.join(map(str, fl)) + ')' if fl else ''} |")
    L.append("\nA and B KIOPS: medians over the repetitions.\n")
    for key, what in (("iops_ratio", "IOPS"), ("device_cpu_ratio", "device CPU per I/O")):
        for sfx, which in (("", "all reps"), ("_unflagged", "unflagged reps")):
            v = [p[key + sfx]["verdict"] for c in pairs for p in c["points"] if p[key + sfx]]
            L.append(f"- {what}, {which}: B ahead in {v.count('ahead')}, behind in {v.count('behind')}, level "
                     f"(inside the noise) in {v.count('level (inside the noise)')}"
                     + (f", no verdict in {len(v) - v.count('ahead') - v.count('behind') - v.count('level (inside the noise)')}"
                        if len(v) > v.count('ahead') + v.count('behind') + v.count('level (inside the noise)') else "")
                     + f" of {len(v)} rows")
    L.append("")
    L.append("### Every repetition\n")
    L.append("| B / A | test | rep | order | A KIOPS | B KIOPS | IOPS B/A | A device µs/IO | B device µs/IO | "
             "CPU B/A | steal % A / B | other load CPUs A / B | flagged |")
    L.append("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for c in pairs:
        for p in c["points"]:
            for r in p["reps"]:
                L.append(f"| {c['b']} / {c['a']} | {p['point']} | {r['rep']} | {r['order']} | "
                         f"{fmt((r['a_iops'] or 0) / 1000)} | {fmt((r['b_iops'] or 0) / 1000)} | "
                         f"{fmt(r['iops_ratio'], 3, '–')} | {fmt(r['a_device_us_per_io'], 2)} | "
                         f"{fmt(r['b_device_us_per_io'], 2)} | {fmt(r['device_cpu_ratio'], 3, '–')} | "
                         f"{pct(r['a_steal'])} / {pct(r['b_steal'])} | {fmt(r['a_other_cpus'], 2, '–')} / "
                         f"{fmt(r['b_other_cpus'], 2, '–')} | {fmt_flags(r)} |")
    return L


def markdown(meta, devs, pairs):
    L = []
    L.append(f"# Guest benchmark {meta['timestamp_utc']}\n")
    if meta.get("note"):
        L.append(f"**{meta['note']}**\n")
    L.append(f"- QEMU: {meta['qemu']}, accelerator **{meta['accel']}**; guest: {meta['guest']}, "
             f"kernel {meta['guest_kernel']}")
    if meta.get("machine"):
        L.append(f"- vnvme under test: {meta['vnvme']}")
        L += machine_md(meta["machine"])
    else:  # a run from before the machine was recorded
        L.append(f"- host: {meta['host_cpu']} ({meta['host_cpus']} CPUs), Linux {meta['host_kernel']}; {meta['vnvme']}")
    eng = next((d["engine"] for d in devs if d.get("engine")), "?")
    fiov = next((d["fio"] for d in devs if d.get("fio")), "?")
    L.append(f"- fio {fiov}, 4 KiB, direct, {eng}, {meta['runtime_s']} s per point, {meta['reps']} reps "
             f"(interleaved; the tables below the ratios give means over the reps), device size {meta['size']}, "
             f"filled first")
    L.append(f"- QEMU devices: `-drive {meta['qemu_drive']}` (tmpfs file = RAM; one per device of a guest) unless "
             f"the device list says disk; vnvme-<doorbells>-<poll>: `--ns ram:{meta['size']}` (sparse RAM "
             "namespace, --workers 1), other vnvme devices as listed below; null_blk: in-guest, irqmode=0")
    if pairs:
        L.append(f"- design: {meta.get('design', 'paired')}; reference for vnvme devices: "
                 f"{meta.get('reference', '?')}")
    else:
        L.append("- design: one guest per device (no pairs in this run, so no ratios)")
    L.append("- host load: " + (f"**neighbour: {meta['neighbour']}**" if meta.get("neighbour") else
                                "no neighbour (the host as it was)"))
    runs = [r for d in devs for r in d["runs"]]
    flagged = [r for r in runs if r["disturbed"]]
    known = [r for r in runs if r.get("host_other_cpus") is not None or r.get("host_steal") is not None]
    if known:
        L.append(f"- disturbed runs: **{len(flagged)} of {len(runs)}** (host /proc/stat at the start and end of "
                 f"each run: steal > {100 * DISTURBED_STEAL:.0f} % or > {DISTURBED_OTHER_CPUS} CPUs busy with "
                 f"anything but QEMU, vnvme and the neighbour)")
    else:
        L.append("- disturbed runs: not measured (no host samples in this run)")
    if meta.get("command"):
        L.append(f"- command: `{meta['command']}`")
    L.append("")
    if pairs:
        L += ratio_md(meta, pairs)
        L.append("")
    pts = [p for p in POINT_ORDER if any(p in d["points"] for d in devs)]
    pts += sorted({p for d in devs for p in d["points"]} - set(pts))
    L.append("## KIOPS\n")
    L.append("Means over the repetitions.\n")
    L.append("| device | " + " | ".join(pts) + " |")
    L.append("| --- | " + " | ".join("---:" for _ in pts) + " |")
    for d in devs:
        row = [fmt(d["points"][p]["iops"] / 1000, 1) if p in d["points"] and d["points"][p]["iops"] else "n/a" for p in pts]
        L.append(f"| {d['label']} | " + " | ".join(row) + " |")
    L.append("\n## Details\n")
    L.append("CPU µs/IO, from /proc/PID/task/*/schedstat between the marks around each fio run, divided by "
             "fio's I/O count: *vnvme* = the vnvme process (all threads); *QEMU non-vCPU* = QEMU's threads other "
             "than the vCPUs (main loop, iothreads, io_uring workers, the vfio-user client), because under TCG the "
             "QEMU process also runs the guest CPUs; *device* = their sum, the device-side cost outside the "
             "vCPUs (MMIO handled synchronously in a vCPU thread, e.g. QEMU nvme doorbells without ioeventfd, is "
             "not in it). In a paired guest only one device is busy at a time, so QEMU's threads count for the "
             "device of the run. guest CPU %: /proc/stat in the guest, all vCPUs. irq/IO: vnvme's own count for "
             "vnvme, the guest's /proc/interrupts for the others. doorbells/IO: doorbell writes that reached vnvme "
             "(trapped REGION_WRITEs, or eventfd kicks; shadow doorbells are on in every vnvme run); not "
             "measurable for QEMU's devices (n/a). KIOPS (reps): every repetition, ⚠ after a disturbed one.\n")
    L.append("| device | test | KIOPS (reps) | mean µs | p99 µs | guest CPU % | vnvme µs/IO | QEMU non-vCPU µs/IO | device µs/IO | irq/IO | doorbells/IO | flagged |")
    L.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for d in devs:
        for p in pts:
            a = d["points"].get(p)
            if not a:
                continue
            runs = [r for r in d["runs"] if r["point"] == p]
            reps = "/".join(fmt(r["iops"] / 1000, 1) + ("⚠" if r["disturbed"] else "") for r in runs
                            if r["iops"] is not None)
            vn = d["device"].startswith("vnvme")
            q = a.get("qemu_non_vcpu_us_per_io")
            v = a.get("vnvme_us_per_io") if vn else None
            irq = a.get("vnvme_irq_per_io") if vn else a.get("guest_irq_per_io")
            if d["device"] == "null_blk":
                irq = None
            db = a.get("vnvme_doorbells_per_io") if vn else None
            measured = any(r.get("host_steal") is not None or r.get("host_other_cpus") is not None for r in runs)
            flagged = f"{len(a['flagged_reps'])}/{a['reps']}" if measured else "n/a"
            L.append(f"| {d['label']} | {p} | {fmt(a['iops'] / 1000 if a['iops'] else None, 1)} ({reps}) | "
                     f"{fmt(a['lat_mean_us'])} | {fmt(a['lat_p99_us'])} | {fmt(a['guest_busy_pct'])} | "
                     f"{fmt(v, 2)} | {fmt(q, 2)} | {fmt(a.get('device_us_per_io'), 2)} | {fmt(irq, 3)} | "
                     f"{fmt(db, 3)} | {flagged} |")
    L.append("\nDevices:\n")
    seen = set()
    for d in devs:
        if d["device"] in seen:
            continue
        seen.add(d["device"])
        extra = "; stopped (SIGSTOP) while the other device of its guest ran (it spins when idle)" \
            if d.get("paused_when_idle") and d["design"] == "paired" else ""
        L.append(f"- **{d['device']}**: {d['desc']}; backing: {d['backing']}{extra}")
    return "\n".join(L) + "\n"


PALETTE = ["#4e79a7", "#a0cbe8", "#f28e2b", "#ffbe7d", "#59a14f", "#8cd17d", "#b6992d",
           "#499894", "#86bcb6", "#e15759", "#ff9d9a", "#79706e", "#d37295", "#b07aa1"]


def svg_chart(meta, devs):
    pts = [p for p in POINT_ORDER if any(p in d["points"] for d in devs)]
    panels = [("KIOPS (higher is better)", lambda a: (a["iops"] or 0) / 1000),
              ("p99 latency, µs (lower is better)", lambda a: a["lat_p99_us"] or 0)]
    qv = meta["qemu"].split()
    title = (f"vnvme guest benchmark {meta['timestamp_utc']}: fio 4 KiB, {meta['guest_kernel']}, "
             f"QEMU {qv[3] if len(qv) > 3 else ''}, accel {meta['accel']}, {meta['reps']} reps (means)")
    note = meta.get("note") or ""
    if meta.get("neighbour"):
        note = (note + " " if note else "") + "With a CPU-bound neighbour on the host."
    series = [{"name": d["label"], "color": PALETTE[i % len(PALETTE)], "values": d["points"]}
              for i, d in enumerate(devs)]
    # Paired devices have long names ("A (beside B)"): a legend wide enough for them.
    legend_w = max(230, 7 * max((len(d["label"]) for d in devs), default=0) + 30)
    sub = [machine_line(meta["machine"])] if meta.get("machine") else [
        f"{meta['host_cpu']} ({meta['host_cpus']} CPUs) · kernel {meta['host_kernel']} · {meta['vnvme']}"]
    return bar_chart(title, note or None, pts, series, panels, legend_w=legend_w, subtitle=sub)


def guest_order(meta, names):
    order = meta.get("guests") or []

    def key(n):
        if n in order:
            return (0, order.index(n), n)
        return (1, DEVICE_ORDER.index(n) if n in DEVICE_ORDER else 50, n)
    return sorted(names, key=key)


def main():
    root = sys.argv[1]
    meta = json.load(open(os.path.join(root, "meta.json")))
    meta.setdefault("reps", 1)
    clk_tck = meta.get("clk_tck") or os.sysconf("SC_CLK_TCK")
    raw = os.path.join(root, "raw")
    names = [n for n in os.listdir(raw) if os.path.isfile(os.path.join(raw, n, "device.json"))]
    devs, pairs = [], []
    for n in guest_order(meta, names):
        _, entries = analyse_guest(os.path.join(raw, n), clk_tck)
        entries = [e for e in entries if e["points"]]
        devs += entries
        if len(entries) == 2:
            pairs.append(compare(entries[0], entries[1]))
    with open(os.path.join(root, "results.json"), "w") as f:
        json.dump({"meta": meta, "pairs": pairs, "devices": devs}, f, indent=1)
    md = markdown(meta, devs, pairs)
    with open(os.path.join(root, "results.md"), "w") as f:
        f.write(md)
    with open(os.path.join(root, "chart.svg"), "w") as f:
        f.write(svg_chart(meta, devs))
    print(md)


if __name__ == "__main__":
    main()
