#!/usr/bin/env python3
"""Turn a scripts/bench-guest.sh run into results.json, results.md and chart.svg.

Usage: report.py RESULTS_DIR

RESULTS_DIR holds meta.json and raw/<device>/ with serial.log[.gz] (the guest's
@@RESULT lines and fio JSON), device.json and marks/ or marks.tar.gz (CPU
samples, process ids and vnvme counter snapshots taken at the guest's marks,
see scripts/guest/host-lib.sh). Standard library only; counter deltas, per-I/O
figures and the chart come from scripts/lib/vnvme_report.py, shared with
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib"))
from vnvme_report import bar_chart, per_io, stats_deltas, sum_opt  # noqa: E402

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
    """The files the host's watcher wrote at the marks: raw/<device>/marks/ or,
    once packed by bench-guest.sh, raw/<device>/marks.tar.gz."""

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
    results, fio, info = {}, {}, {}
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        with gzip.open(path + ".gz", "rt", errors="replace") as f:
            text = f.read()
    else:
        with open(path, errors="replace") as f:
            text = f.read()
    for m in re.finditer(r"@@RESULT (\S+) (\d+) ([^@]*)@@", text):
        kv = dict(x.split("=", 1) for x in m.group(3).split())
        results[(m.group(1), int(m.group(2)))] = kv
    for m in re.finditer(r"@@FIO-BEGIN (\S+) (\d+)@@\n(.*?)@@FIO-END@@", text, re.S):
        body = m.group(3)
        try:
            fio[(m.group(1), int(m.group(2)))] = json.loads(body[body.index("{"): body.rindex("}") + 1])
        except (ValueError, json.JSONDecodeError):
            pass
    m = re.search(r"@@INFO ([^@]*)@@", text)
    if m:
        info = dict(x.split("=", 1) for x in m.group(1).split())
    return results, fio, info


def analyse_device(ddir):
    dev = json.load(open(os.path.join(ddir, "device.json")))
    results, fio, info = parse_serial(os.path.join(ddir, "serial.log"))
    marks = Marks(ddir)
    pids = read_pids(marks)
    qpid, vpid, bpid = pids.get("qemu"), pids.get("vnvme"), pids.get("vnvme-back")
    runs = []
    for (name, rep), j in sorted(fio.items()):
        job = j["jobs"][0]
        side = job["write"] if name.startswith("randwrite") else job["read"]
        ios = side.get("total_ios") or 0
        pct = side.get("lat_ns", {}).get("percentile", {})
        a = read_cpu(marks, f"p-{name}-{rep}-start.cpu")
        b = read_cpu(marks, f"p-{name}-{rep}-end.cpu")
        s0 = read_stats(marks, f"p-{name}-{rep}-start.stats0")
        s1 = read_stats(marks, f"p-{name}-{rep}-end.stats1")
        r = results.get((name, rep), {})
        run = {
            "point": name,
            "rep": rep,
            "iops": side.get("iops"),
            "ios": ios,
            "lat_mean_us": side.get("lat_ns", {}).get("mean", 0) / 1000,
            "lat_p99_us": pct.get("99.000000", 0) / 1000 if pct else None,
            "fio_usr_pct": job.get("usr_cpu"),
            "fio_sys_pct": job.get("sys_cpu"),
            "guest_busy_pct": float(r["busy"]) if r.get("busy", "nan") != "nan" else None,
            "guest_irq_per_io": per_io(int(r["irqs"]), ios) if "irqs" in r else None,
            "qemu_non_vcpu_us_per_io": per_io(cpu_delta(a, b, qpid, vcpu=False), ios, 1e-3),
            "qemu_vcpu_us_per_io": per_io(cpu_delta(a, b, qpid, vcpu=True), ios, 1e-3),
            # An nvme:// chain counts both vnvme processes.
            "vnvme_us_per_io": per_io(sum_opt(cpu_delta(a, b, vpid), cpu_delta(a, b, bpid) if bpid else 0),
                                      ios, 1e-3) if vpid else None,
        }
        dv = stats_deltas(s0, s1)
        if dv:
            run["vnvme_io_commands"] = dv["io_commands"]
            run["vnvme_doorbells_per_io"] = dv["doorbells_per_io"]
            run["vnvme_irq_per_io"] = dv["irq_per_io"]
        runs.append(run)
    agg = {}
    for name in sorted({r["point"] for r in runs}, key=lambda n: POINT_ORDER.index(n) if n in POINT_ORDER else 99):
        rs = [r for r in runs if r["point"] == name]
        a = {"point": name, "reps": len(rs), "iops_reps": [r["iops"] for r in rs]}
        for k in rs[0]:
            if k in ("point", "rep"):
                continue
            vals = [r[k] for r in rs if isinstance(r.get(k), (int, float))]
            a[k] = mean(vals) if vals else None
        agg[name] = a
    return {**dev, "engine": info.get("engine"), "fio": info.get("fio"), "runs": runs, "points": agg}


def fmt(v, nd=1, none="n/a"):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return none
    return f"{v:.{nd}f}"


def markdown(meta, devs):
    L = []
    L.append(f"# Guest benchmark {meta['timestamp_utc']}\n")
    if meta.get("note"):
        L.append(f"**{meta['note']}**\n")
    L.append(f"- QEMU: {meta['qemu']}, accelerator **{meta['accel']}**; guest: {meta['guest']}, "
             f"kernel {meta['guest_kernel']}")
    L.append(f"- host: {meta['host_cpu']} ({meta['host_cpus']} CPUs), Linux {meta['host_kernel']}; {meta['vnvme']}")
    eng = next((d["engine"] for d in devs if d.get("engine")), "?")
    fiov = next((d["fio"] for d in devs if d.get("fio")), "?")
    L.append(f"- fio {fiov}, 4 KiB, direct, {eng}, {meta['runtime_s']} s per point, {meta['reps']} reps "
             f"(interleaved; values are means over the reps), device size {meta['size']}, filled first")
    L.append(f"- QEMU devices: `-drive {meta['qemu_drive']}` (tmpfs file = RAM) unless the device list says disk; "
             f"vnvme-<doorbells>-<poll>: `--ns ram:{meta['size']}` (sparse RAM namespace, --workers 1), other vnvme "
             "devices as listed below; null_blk: in-guest, irqmode=0\n")
    pts = [p for p in POINT_ORDER if any(p in d["points"] for d in devs)]
    L.append("## KIOPS\n")
    L.append("| device | " + " | ".join(pts) + " |")
    L.append("| --- | " + " | ".join("---:" for _ in pts) + " |")
    for d in devs:
        row = [fmt(d["points"][p]["iops"] / 1000, 1) if p in d["points"] and d["points"][p]["iops"] else "n/a" for p in pts]
        L.append(f"| {d['device']} | " + " | ".join(row) + " |")
    L.append("\n## Details\n")
    L.append("CPU µs/IO, from /proc/PID/task/*/schedstat between the marks around each fio run, divided by "
             "fio's I/O count: *vnvme* = the vnvme process (all threads); *QEMU non-vCPU* = QEMU's threads other "
             "than the vCPUs (main loop, iothreads, io_uring workers, the vfio-user client), because under TCG the "
             "QEMU process also runs the guest CPUs; *device* = their sum, the device-side cost outside the "
             "vCPUs (MMIO handled synchronously in a vCPU thread, e.g. QEMU nvme doorbells without ioeventfd, is "
             "not in it). guest CPU %: /proc/stat in the guest, all vCPUs. irq/IO: vnvme's own count for vnvme, "
             "the guest's /proc/interrupts for the others. doorbells/IO: doorbell writes that reached vnvme "
             "(trapped REGION_WRITEs, or eventfd kicks; shadow doorbells are on in every vnvme run); not "
             "measurable for QEMU's devices (n/a).\n")
    L.append("| device | test | KIOPS (reps) | mean µs | p99 µs | guest CPU % | vnvme µs/IO | QEMU non-vCPU µs/IO | device µs/IO | irq/IO | doorbells/IO |")
    L.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for d in devs:
        for p in pts:
            a = d["points"].get(p)
            if not a:
                continue
            reps = "/".join(fmt(x / 1000, 1) for x in a["iops_reps"] if x is not None)
            vn = d["device"].startswith("vnvme")
            q = a.get("qemu_non_vcpu_us_per_io")
            v = a.get("vnvme_us_per_io") if vn else None
            devcpu = None if d["device"] == "null_blk" else (q or 0) + (v or 0) if q is not None or v is not None else None
            irq = a.get("vnvme_irq_per_io") if vn else a.get("guest_irq_per_io")
            if d["device"] == "null_blk":
                irq = None
            db = a.get("vnvme_doorbells_per_io") if vn else None
            L.append(f"| {d['device']} | {p} | {fmt(a['iops'] / 1000 if a['iops'] else None, 1)} ({reps}) | "
                     f"{fmt(a['lat_mean_us'])} | {fmt(a['lat_p99_us'])} | {fmt(a['guest_busy_pct'])} | "
                     f"{fmt(v, 2)} | {fmt(q, 2)} | {fmt(devcpu, 2)} | {fmt(irq, 3)} | {fmt(db, 3)} |")
    L.append("\nDevices:\n")
    for d in devs:
        L.append(f"- **{d['device']}**: {d['desc']}; backing: {d['backing']}")
    return "\n".join(L) + "\n"


PALETTE = ["#4e79a7", "#a0cbe8", "#f28e2b", "#ffbe7d", "#59a14f", "#8cd17d", "#b6992d",
           "#499894", "#86bcb6", "#e15759", "#ff9d9a", "#79706e", "#d37295", "#b07aa1"]


def color(d):
    n = d["device"]
    return PALETTE[(DEVICE_ORDER.index(n) if n in DEVICE_ORDER else len(DEVICE_ORDER)) % len(PALETTE)]


def svg_chart(meta, devs):
    pts = [p for p in POINT_ORDER if any(p in d["points"] for d in devs)]
    panels = [("KIOPS (higher is better)", lambda a: (a["iops"] or 0) / 1000),
              ("p99 latency, µs (lower is better)", lambda a: a["lat_p99_us"] or 0)]
    title = f"vnvme guest benchmark {meta['timestamp_utc']}: fio 4 KiB, {meta['guest_kernel']}, QEMU {meta['qemu'].split()[3] if len(meta['qemu'].split()) > 3 else ''}, accel {meta['accel']}"
    series = [{"name": d["device"], "color": color(d), "values": d["points"]} for d in devs]
    return bar_chart(title, meta.get("note"), pts, series, panels)


def main():
    root = sys.argv[1]
    meta = json.load(open(os.path.join(root, "meta.json")))
    raw = os.path.join(root, "raw")
    names = [n for n in os.listdir(raw) if os.path.isfile(os.path.join(raw, n, "device.json"))]
    names.sort(key=lambda n: (DEVICE_ORDER.index(n) if n in DEVICE_ORDER else 50, n))
    devs = [analyse_device(os.path.join(raw, n)) for n in names]
    devs = [d for d in devs if d["points"]]
    with open(os.path.join(root, "results.json"), "w") as f:
        json.dump({"meta": meta, "devices": devs}, f, indent=1)
    md = markdown(meta, devs)
    with open(os.path.join(root, "results.md"), "w") as f:
        f.write(md)
    with open(os.path.join(root, "chart.svg"), "w") as f:
        f.write(svg_chart(meta, devs))
    print(md)


if __name__ == "__main__":
    main()
