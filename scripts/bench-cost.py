#!/usr/bin/env python3
"""The report of scripts/bench-cost.sh: instructions and system calls per I/O from
the raw files it wrote (callgrind_annotate listings, perf JSON, perf stat CSV).

Instructions per I/O are differences: (Ir of the long run - Ir of the short run) /
(I/Os of the long run - I/Os of the short run), in total and per function, so what
a run costs once (start, connection, shutdown) cancels. Payload = libc's memset,
memcpy and memmove (the 4 KiB zero fill or copy of each I/O, and the few small
copies they also do); the rest is the controller's own work. The same differences
are also split by step of a command's round trip through the server (STEPS: wait,
receive, handle, reply, run, complete, interrupt, clock, the loop), from callgrind's
call graph, with the system calls each step makes."""

import argparse
import collections
import gzip
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from vnvme_report import bar_chart, log, machine, machine_line, machine_md  # noqa: E402

PAYLOAD = re.compile(r"(^|[^a-z])(__)?(memset|memcpy|memmove|mempcpy)")
CRATES = ["nvme_ctrl", "guest_mem", "block_backend", "vfio_user_server", "vfio_user", "nvme_driver",
          "nvme_spec", "nvme_inproc", "vnvme", "tracing", "std", "core", "alloc"]


def annotate(path):
    """{function: Ir} (self cost) and the program total from a callgrind_annotate
    listing; a function listed under several source files is summed."""
    total, fns = 0, {}
    line_re = re.compile(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(.*)$")
    with open(path) as f:
        for line in f:
            if line.startswith("-- Auto-annotated") or line.startswith("-- User-annotated"):
                break  # only the function summary
            m = line_re.match(line)
            if not m:
                continue
            ir = int(m.group(1).replace(",", ""))
            what = m.group(2).strip()
            if what == "PROGRAM TOTALS":
                total = ir
                continue
            if what.endswith("]") and " [" in what:
                what = what[:what.rfind(" [")]
            fn = what.split(":", 1)[1] if ":" in what and not what.startswith("<") else what
            fns[fn] = fns.get(fn, 0) + ir
    return total, fns


# The steps of a command's round trip through the server, each named by the functions
# that begin it (a regular expression on the function's name). A function's cost goes
# to the innermost step on its call path: the clock read inside a run is the clock's,
# a completion posted inside a run is the completion's. What no step claims is the
# loop around them (the idle loop, the serve loop's own bookkeeping).
STEPS = [
    ("wait (epoll_wait)", r"Epoll>?::wait$|^epoll_wait"),
    ("receive (recvmsg, parse)", r"vfio_user::socket::Connection::(fill|read|next_message|recv)$"
                                 r"|vfio_user::rx::RecvBuffer::take$"),
    ("handle (decode, doorbell)", r"vfio_user_server::device::Device::(access|handle)$"
                                  r"|nvme_ctrl::controller::Controller::mmio_(write|read)$"),
    ("reply (sendmsg)", r"vfio_user::socket::Connection::send(_bytes)?$"),
    ("run (fetch, dispatch, backend)", r"nvme_ctrl::controller::Controller::process$"
                                       r"|IoEngine>::poll$"),
    ("complete (CQE)", r"IoEngine>::complete_wide$"),
    ("interrupt (decision, eventfd write)", r"IoEngine>::signal_interrupts$"),
    ("clock", r"Timespec>::(now|sub_timespec)$|Clock>::now_ns$"),
]
LOOP_STEP = "loop (the rest)"
# Which step each system call belongs to (the rest: the loop's).
STEP_SYSCALLS = {"epoll_wait": STEPS[0][0], "epoll_pwait": STEPS[0][0], "recvmsg": STEPS[1][0],
                 "recvfrom": STEPS[1][0], "sendmsg": STEPS[3][0], "sendto": STEPS[3][0], "write": STEPS[6][0]}


def call_graph(path):
    """Self cost per function and the inclusive cost of each call (caller, callee)
    from a callgrind output file. A function is (name, object): the loader's
    and libc's "(below main)" are two functions, not a recursion. The source file is
    ignored: an inlined part of a function is that function's."""
    opener = gzip.open if path.endswith(".gz") else open
    names = {"fn": {}, "ob": {}}
    ob, cob, cur, callee, in_call = None, None, None, None, False
    self_cost, edges = collections.Counter(), collections.Counter()
    spec = re.compile(r"^(fn|cfn|ob|cob)=(?:\((\d+)\))?\s*(.*)$")
    with opener(path, "rt") as f:
        for line in f:
            c = line[:1]
            if c.isdigit() or c in "+-*":
                parts = line.split()
                if len(parts) < 2:
                    continue
                if in_call:
                    edges[(cur, callee)] += int(parts[1])
                    in_call = False
                else:
                    self_cost[cur] += int(parts[1])
            elif line.startswith("calls="):
                in_call = True
            else:
                m = spec.match(line.rstrip("\n"))
                if not m:
                    continue
                kind, ident, name = m.groups()
                table = names["ob" if kind in ("ob", "cob") else "fn"]
                if ident is not None and name:
                    table[ident] = name
                name = table.get(ident, name) if ident is not None else name
                if kind == "ob":
                    ob = cob = name
                elif kind == "cob":
                    cob = name
                elif kind == "fn":
                    cur, cob = (name, ob), ob
                else:
                    callee, cob = (name, cob), ob
    return self_cost, edges


def steps_of(raw, short, long_, dn):
    """Instructions per I/O of each step (STEPS), the difference of the long and the
    short run. A function's inclusive cost is split among its callees in proportion
    to what each call cost, so a function called from two steps is shared between them
    as its callers used it."""
    def one(tag):
        path = os.path.join(raw, tag + ".callgrind.gz")
        if not os.path.exists(path):
            path = os.path.join(raw, tag + ".callgrind")
        self_cost, edges = call_graph(path)
        out_edges = collections.defaultdict(list)
        incl = collections.Counter(self_cost)
        for (a, b), v in edges.items():
            if a != b:
                out_edges[a].append((b, v))
                incl[a] += v
        anchor = {}
        for fn in incl:
            for step, rx in STEPS:
                if fn and fn[0] and re.search(rx, fn[0]):
                    anchor[fn] = step
        memo, path = {}, set()

        def dist(fn, label):
            """Fractions of fn's inclusive cost per step, entered under `label`. A call
            back into a function already on the path (recursion) stays with the
            caller's step."""
            label = anchor.get(fn, label)
            key = (fn, label)
            if key in memo:
                return memo[key]
            total = incl[fn]
            d = collections.Counter()
            if total <= 0:
                return d
            d[label] += self_cost[fn] / total
            path.add(fn)
            for callee, v in out_edges.get(fn, ()):
                if callee in path:
                    d[label] += v / total
                    continue
                for s, x in dist(callee, label).items():
                    d[s] += x * v / total
            path.discard(fn)
            memo[key] = d
            return d

        called = {b for (a, b) in edges if a != b}
        by = collections.Counter()
        for fn in incl:
            if fn not in called:
                for s, x in dist(fn, LOOP_STEP).items():
                    by[s] += x * incl[fn]
        return by
    sys.setrecursionlimit(10000)
    a, b = one(short), one(long_)
    return {s: (b[s] - a[s]) / dn for s in [st for st, _ in STEPS] + [LOOP_STEP]}


def crate_of(fn):
    if PAYLOAD.search(fn):
        return "payload (memset/memcpy)"
    for c in CRATES:
        if re.search(r"(^|[<\s&(])" + c + "::", fn):
            return c
    return "other (libc, runtime)"


def ios_of(path):
    with open(path) as f:
        return json.load(f)["results"]["ios"]


def per_io_diff(raw, short, long_):
    t0, f0 = annotate(os.path.join(raw, short + ".annotate"))
    t1, f1 = annotate(os.path.join(raw, long_ + ".annotate"))
    n0 = ios_of(os.path.join(raw, short + ".perf.json"))
    n1 = ios_of(os.path.join(raw, long_ + ".perf.json"))
    dn = n1 - n0
    if dn <= 0:
        raise SystemExit(f"bench-cost: {long_} did no more I/O than {short} ({n1} vs {n0})")
    fns = {k: (f1.get(k, 0) - f0.get(k, 0)) / dn for k in set(f0) | set(f1)}
    return {"ios_short": n0, "ios_long": n1, "ir_short": t0, "ir_long": t1,
            "instr_per_io": (t1 - t0) / dn, "functions": fns}


def split(fns):
    by = {}
    for k, v in fns.items():
        c = crate_of(k)
        by[c] = by.get(c, 0) + v
    return by


def syscalls(raw, tag):
    counts = {}
    with open(os.path.join(raw, tag + ".perfstat")) as f:
        for line in f:
            parts = line.strip().split(",")
            if len(parts) < 3 or not parts[0].strip().isdigit():
                continue
            ev = parts[2]
            name = "total" if ev == "raw_syscalls:sys_enter" else ev.replace("syscalls:sys_enter_", "")
            counts[name] = int(parts[0])
    ios = ios_of(os.path.join(raw, tag + ".perf.json"))
    return {"ios": ios, "per_io": {k: v / ios for k, v in counts.items() if v}}


def main():
    ap = argparse.ArgumentParser()
    for a in ["--root", "--out", "--qd", "--doorbells", "--ns", "--short", "--long", "--syscall-run",
              "--inprocess", "--reps", "--workers", "--command"]:
        ap.add_argument(a, required=True)
    ap.add_argument("--poll", default="off")
    ap.add_argument("--history")
    ap.add_argument("--peer", help="the SPDK build measured beside (bench-cost.sh --peer-spdk)")
    a = ap.parse_args()
    raw = os.path.join(a.out, "raw")
    qds = [int(q) for q in a.qd.split(",")]
    dbs = a.doorbells.split(",")
    reps = int(a.reps)
    workers = int(a.workers)
    # Points of a server in inline mode (or with several workers) are named apart,
    # so the history compares like with like.
    suffix = " inline" if workers == 0 else ("" if workers == 1 else f" workers{workers}")
    if a.poll != "off":
        suffix += f" poll {a.poll}"

    def server_rep(db, qd, r):
        tag = f"server-{db}-qd{qd}-r{r}"
        d = per_io_diff(raw, tag + "-short", tag + "-long")
        by = split(d["functions"])
        payload = by.get("payload (memset/memcpy)", 0.0)
        s = syscalls(raw, tag + "-sys")
        dn = d["ios_long"] - d["ios_short"]
        return {"instr_per_io": d["instr_per_io"], "payload_per_io": payload,
                "controller_per_io": d["instr_per_io"] - payload, "by_crate": by,
                "syscalls_per_io": s["per_io"].get("total", 0.0), "syscalls": s["per_io"],
                "ios": [d["ios_short"], d["ios_long"]], "ir": [d["ir_short"], d["ir_long"]],
                "steps": steps_of(raw, tag + "-short", tag + "-long", dn), "top": sorted(d["functions"].items(), key=lambda kv: -kv[1])[:15]}

    def inproc_rep(qd, r):
        tag = f"inproc-qd{qd}-r{r}"
        d = per_io_diff(raw, tag + "-short", tag + "-long")
        by = split(d["functions"])
        payload = by.get("payload (memset/memcpy)", 0.0)
        return {"instr_per_io": d["instr_per_io"], "payload_per_io": payload,
                "controller_per_io": by.get("nvme_ctrl", 0.0) + by.get("guest_mem", 0.0)
                + by.get("block_backend", 0.0) + by.get("nvme_spec", 0.0),
                "client_per_io": by.get("nvme_driver", 0.0) + by.get("vnvme", 0.0) + by.get("nvme_inproc", 0.0),
                "by_crate": by, "ios": [d["ios_short"], d["ios_long"]], "ir": [d["ir_short"], d["ir_long"]],
                "top": sorted(d["functions"].items(), key=lambda kv: -kv[1])[:15]}

    def spdk_rep(qd, r):
        """SPDK's nvmf_tgt for the same work: C functions, so no crates or steps;
        libc's memset/memcpy are its payload as they are vnvme's."""
        tag = f"spdk-shadow-qd{qd}-r{r}"
        d = per_io_diff(raw, tag + "-short", tag + "-long")
        payload = sum(v for k, v in d["functions"].items() if PAYLOAD.search(k))
        # A dump taken while the target runs lists the functions on its call stack
        # then (main, the reactor loop) with the whole count as their own: left out
        # of the top list (the total is callgrind's own sum, unaffected).
        fns = {k: v for k, v in d["functions"].items() if v < 0.9 * d["instr_per_io"]}
        return {"instr_per_io": d["instr_per_io"], "payload_per_io": payload,
                "controller_per_io": d["instr_per_io"] - payload, "by_crate": {},
                "ios": [d["ios_short"], d["ios_long"]], "ir": [d["ir_short"], d["ir_long"]],
                "top": sorted(fns.items(), key=lambda kv: -kv[1])[:15]}

    def summarize(base, runs):
        """The median repetition (by controller instructions) stands for the point;
        every figure also gets its min and max over the repetitions."""
        runs = sorted(runs, key=lambda r: r["controller_per_io"])
        mid = runs[len(runs) // 2]
        p = dict(base, **mid)
        for k in ["instr_per_io", "payload_per_io", "controller_per_io", "syscalls_per_io"]:
            if k in mid:
                vals = sorted(r[k] for r in runs)
                p[k] = vals[len(vals) // 2]
                p[k + "_range"] = [vals[0], vals[-1]]
        p["reps"] = [{k: v for k, v in r.items() if k != "top"} for r in runs]
        return p

    points = []
    for db in dbs:
        for qd in qds:
            runs = [server_rep(db, qd, r) for r in range(1, reps + 1)]
            points.append(summarize({"point": f"server {db} qd{qd}{suffix}", "kind": "server", "doorbells": db, "qd": qd},
                                    runs))
    if a.peer:
        for qd in qds:
            runs = [spdk_rep(qd, r) for r in range(1, reps + 1)]
            points.append(summarize({"point": f"spdk interrupt qd{qd}", "kind": "peer", "doorbells": "shadow",
                                     "qd": qd, "peer": a.peer}, runs))
    if a.inprocess == "1":
        for qd in qds:
            runs = [inproc_rep(qd, r) for r in range(1, reps + 1)]
            points.append(summarize({"point": f"in-process qd{qd}", "kind": "in-process", "qd": qd}, runs))
    m = machine(a.root)
    knobs = {"namespace": a.ns, "rw": "randread", "bs": 4096, "server": f"--poll {a.poll} --workers {workers}, one queue",
             "perf": "--completion irq (in-process: --workers 0 --completion poll --doorbells shadow)",
             "qd": qds, "doorbells": dbs, "callgrind_runs_s": [float(a.short), float(a.long)],
             "syscall_run_s": float(a.syscall_run), "reps": reps, "command": a.command}
    if a.peer:
        knobs["peer"] = (f"{a.peer}: nvmf_tgt --no-huge -s 1024 --no-pci -m 0x2 --interrupt-mode, transport -M "
                         "(shadow doorbells), bdev_null_create null0 65536 4096; counters zeroed once it serves, "
                         "dumped when the client has left (callgrind_control)")
    prev = {}
    if a.history and os.path.exists(a.history):
        with open(a.history) as f:
            for line in f:
                try:
                    h = json.loads(line)
                except ValueError:
                    continue
                if h.get("namespace") == a.ns:
                    prev[h["point"]] = h
    lines = [f"# Cost per I/O ({m['date_utc']}, commit {m['git_commit'][:12]})", ""] + machine_md(m) + [
             f"- command: `{a.command}`", "",
             f"4 KiB randread, namespace `{a.ns}`, server `--poll {a.poll} --workers {workers}`, one queue. "
             "Instructions: callgrind, (long - short run) / (I/O difference). "
             "Payload: libc memset/memcpy/memmove. System calls: perf stat, whole server life, full speed.", "",
             f"Median of {reps} repetitions, [min–max] beside it: how many messages or completions one wake-up "
             "brings, and so the work per I/O, depends on timing.", ""] + ([
             f"Beside it, for the same work (points \"spdk interrupt qdN\"): {knobs['peer']}; the same client, "
             "`vnvme perf --doorbells shadow --completion irq`. Its payload column counts libc's memset/memcpy as "
             "vnvme's does; the rest is the target's own work, every thread of nvmf_tgt (its reactor, DPDK's).",
             ""] if a.peer else []) + [
             "| point | instructions/I/O | payload | controller (rest) [min–max] | vs last recorded | "
             "syscalls/I/O [min–max] | per kind (median rep) |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for p in points:
        old = prev.get(p["point"])
        delta = "—"
        if old and old.get("controller_per_io"):
            delta = f"{(p['controller_per_io'] / old['controller_per_io'] - 1) * 100:+.1f} % ({old['commit'][:8]})"
        kinds = ", ".join(f"{k} {v:.3f}" for k, v in sorted(p.get("syscalls", {}).items(), key=lambda kv: -kv[1])
                          if k != "total")
        rng = p["controller_per_io_range"]
        sc = "—"
        if p["kind"] == "server":
            sr = p["syscalls_per_io_range"]
            sc = f"{p['syscalls_per_io']:.3f} [{sr[0]:.3f}–{sr[1]:.3f}]"
        lines.append(f"| {p['point']} | {p['instr_per_io']:.0f} | {p['payload_per_io']:.0f} | "
                     f"{p['controller_per_io']:.0f} [{rng[0]:.0f}–{rng[1]:.0f}] | {delta} | {sc} | {kinds or '—'} |")
    step_names = [st for st, _ in STEPS] + [LOOP_STEP]
    lines += ["", "Steps of a command (instructions per I/O of the median repetition, each function's cost "
              "in the innermost step on its call path; system calls per I/O after the slash where the step "
              "makes them):", "",
              "| point | " + " | ".join(step_names) + " |", "|---|" + "---:|" * len(step_names)]
    for p in points:
        if "steps" not in p:
            continue
        per_step = collections.Counter()
        for k, v in p.get("syscalls", {}).items():
            if k != "total":
                per_step[STEP_SYSCALLS.get(k, LOOP_STEP)] += v
        cells = []
        for st in step_names:
            cell = f"{p['steps'].get(st, 0.0):.0f}"
            if per_step[st] >= 0.0005:
                cell += f" / {per_step[st]:.3f}"
            cells.append(cell)
        lines.append(f"| {p['point']} | " + " | ".join(cells) + " |")
    lines += ["", "By crate (instructions per I/O, self cost):", "",
              "| point | " + " | ".join(CRATES + ["payload (memset/memcpy)", "other (libc, runtime)"]) + " |",
              "|---|" + "---:|" * (len(CRATES) + 2)]
    for p in points:
        if p["kind"] == "peer":
            continue
        lines.append(f"| {p['point']} | " + " | ".join(
            f"{p['by_crate'].get(c, 0):.0f}" for c in CRATES + ["payload (memset/memcpy)", "other (libc, runtime)"]) + " |")
    for p in points:
        lines += ["", f"Top functions, {p['point']} (instructions per I/O, self cost):", ""]
        lines += [f"- {v:8.1f}  `{k[:140]}`" for k, v in p["top"]]
    retries = os.path.join(a.out, "retries.txt")
    if os.path.exists(retries):
        with open(retries) as f:
            lines += ["", "Pairs run again because other load held the long run to less than twice the "
                      "short run's I/O:", ""] + [f"- {ln.strip()}" for ln in f if ln.strip()]
    table = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(table)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"benchmark": "bench-cost", "machine": m, "knobs": knobs, "points": points}, f, indent=1)
    groups = [p["point"] for p in points]
    # Each bar: (median, [min, max]) over the repetitions.
    series = [
        {"name": "controller (rest)", "color": "#3b6ea5",
         "values": {p["point"]: (p["controller_per_io"], p["controller_per_io_range"]) for p in points}},
        {"name": "payload (memset/memcpy)", "color": "#c9a227",
         "values": {p["point"]: (p["payload_per_io"], p["payload_per_io_range"]) for p in points}},
    ]
    svg = bar_chart(f"vnvme cost per I/O, {a.ns}, commit {m['git_commit'][:12]}",
                    "callgrind instructions (no hardware counters here); lower is better",
                    groups, series, [{"label": "instructions per I/O", "value": lambda d: d[0],
                                      "spread": lambda d: d[1], "labels": lambda v: f"{v:,.0f}"}],
                    subtitle=[machine_line(m), f"server --poll {a.poll} --workers {workers}, one queue; median of "
                              f"{reps} repetitions, whiskers min–max"])
    with open(os.path.join(a.out, "chart.svg"), "w") as f:
        f.write(svg)
    if a.history:
        with open(a.history, "a") as f:
            for p in points:
                if p["kind"] == "peer":
                    continue
                f.write(json.dumps({
                    "date": m["date_utc"], "commit": m["git_commit"], "namespace": a.ns, "point": p["point"],
                    "instr_per_io": round(p["instr_per_io"], 1), "payload_per_io": round(p["payload_per_io"], 1),
                    "controller_per_io": round(p["controller_per_io"], 1),
                    "controller_range": [round(x, 1) for x in p["controller_per_io_range"]], "reps": reps,
                    "syscalls_per_io": round(p.get("syscalls_per_io", 0.0), 4) if p["kind"] == "server" else None,
                }) + "\n")
    print(table)
    log(f"results in {a.out}/{{table.md,results.json,chart.svg}}"
        + (f"; history appended to {a.history}" if a.history else ""))


if __name__ == "__main__":
    main()
