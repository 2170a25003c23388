"""The one module every benchmark report draws its charts and describes its
machine with: the doorbells bench (scripts/bench-doorbells.py, run by
`cargo bench -p nvme-ctrl --bench doorbells`), scripts/bench-cost.py,
scripts/bench-vfio-user.py, scripts/bench-guest.py (bench-guest.sh) and
scripts/stress-wakeup.sh. A bench writes JSON; its report reads it and draws
with this.

- Messages: log() ("[script] message" on stderr, as scripts/lib/log.sh).
- Figures: spread() (mean, min, max of repeated runs), per_io(), stats_deltas()
  (per-I/O figures between two `vnvme serve --stats-file` snapshots, the
  counters scripts/lib/host.sh's vn_io_deltas reads), cores_busy() and
  other_cpus() (how much of the machine a run kept busy), steal_share() and
  disturbance() (was a run disturbed by other load or by the hypervisor).
- Before/after pairs: median(), bootstrap_median_ci(), ratio_summary() (the
  median of paired new/base ratios, an interval, and a verdict that names a
  difference only when the interval excludes 1.0).
- The machine: host() (CPU model and count, kernel), git_commit(), version(),
  machine() (all of it plus the toolchain, for a result file), machine_md()
  (as a report's Markdown head) and machine_line() (as a chart's subtitle).
  `python3 scripts/lib/vnvme_report.py machine [ROOT]` prints machine() as JSON,
  for shell scripts.
- SVG, hand-written (no plotting library): svg_doc(), title_block(),
  legend(), text(), esc(); log_panel() (log-y lines over queue depths, min-max
  whiskers; ratios too) with bounds(), ratio_bounds() and ratio_ticks();
  bar_panel() (grouped bars, whiskers, a guide line, value labels) and
  bar_chart() (a whole SVG of bar panels, one per figure).

Standard library only. Import it from a script with
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), RELATIVE_PATH_TO_scripts/lib))
"""

import datetime
import json
import math
import os
import platform
import random
import subprocess
import sys

# ---- messages


def log(msg, name=None):
    """A message on stderr as "[script] message", the convention of
    scripts/lib/log.sh; stdout is for what a report produces."""
    print(f"[{name or os.path.basename(sys.argv[0])}] {msg}", file=sys.stderr)


# ---- figures


def spread(vals):
    """{"mean", "min", "max", "runs"} of the values that are not None; None if none are."""
    vals = [v for v in vals if v is not None]
    if not vals:
        return None
    return {"mean": sum(vals) / len(vals), "min": min(vals), "max": max(vals), "runs": vals}


def sum_opt(a, b):
    return None if a is None or b is None else a + b


def per_io(x, ios, scale=1.0):
    """x * scale / ios; None if x is unknown or no I/O was done."""
    if x is None or not ios:
        return None
    return x * scale / ios


def stats_deltas(s0, s1):
    """Per-I/O figures between two `vnvme serve --stats-file` snapshots (parsed
    JSON): the I/O commands done, trapped I/O doorbell writes and interrupts
    per I/O. None unless both snapshots are there."""
    if not s0 or not s1:
        return None
    ios = s1["io_commands"] - s0["io_commands"]
    return {
        "io_commands": ios,
        "doorbells_per_io": per_io(s1["io_doorbell_writes"] - s0["io_doorbell_writes"], ios),
        "irq_per_io": per_io(s1["interrupts"] - s0["interrupts"], ios),
    }


def cores_busy(client_s, server_s, elapsed_s):
    """How many CPUs client and server kept busy: their CPU seconds / elapsed."""
    if client_s is None or server_s is None or elapsed_s <= 0:
        return None
    return (client_s + server_s) / elapsed_s


def other_cpus(busy_ticks, wall_s, client_s, server_s, clk_tck):
    """CPUs kept busy by anything but client and server over wall_s, from the
    system-wide busy time in USER_HZ ticks (/proc/stat)."""
    if client_s is None or server_s is None or wall_s <= 0:
        return None
    return max(0.0, (busy_ticks / clk_tck - client_s - server_s) / wall_s)


# A run counts as disturbed when the hypervisor stole more than this share of the
# machine's CPU time meanwhile...
DISTURBED_STEAL = 0.05
# ...or when processes other than the benchmark's kept more than this many CPUs
# busy (0.2: a tenth of a 2-CPU machine, enough to move a polling point).
DISTURBED_OTHER_CPUS = 0.2


def steal_share(steal_ticks, total_ticks):
    """The share of all CPU time (/proc/stat "cpu" line, every field) the
    hypervisor stole over a window; None if the window is empty."""
    if steal_ticks is None or not total_ticks:
        return None
    return steal_ticks / total_ticks


def disturbance(steal, other):
    """The reasons a run is disturbed (a list, empty if it is not): steal above
    DISTURBED_STEAL, other load above DISTURBED_OTHER_CPUS. Unknown figures
    flag nothing."""
    why = []
    if steal is not None and steal > DISTURBED_STEAL:
        why.append(f"steal {100 * steal:.0f} %")
    if other is not None and other > DISTURBED_OTHER_CPUS:
        why.append(f"other load {other:.2f} CPUs")
    return why


# ---- before/after pairs


def median(vals):
    v = sorted(vals)
    n = len(v)
    if n == 0:
        return None
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


# Fixed, so the same runs give the same report.
BOOTSTRAP_SEED = 20261124
BOOTSTRAP_RESAMPLES = 4000


def bootstrap_median_ci(vals, level=0.90):
    """A percentile-bootstrap interval of the median of vals (resampled with
    replacement BOOTSTRAP_RESAMPLES times, seeded, so it is reproducible)."""
    rng = random.Random(BOOTSTRAP_SEED)
    n = len(vals)
    meds = sorted(median([vals[rng.randrange(n)] for _ in range(n)]) for _ in range(BOOTSTRAP_RESAMPLES))
    tail = (1 - level) / 2
    lo = meds[int(math.floor(tail * (len(meds) - 1)))]
    hi = meds[int(math.ceil((1 - tail) * (len(meds) - 1)))]
    return lo, hi


# Below this many pairs the interval is min–max of the pairs: a bootstrap of a
# median of 3 or 4 values only reshuffles them.
BOOTSTRAP_MIN_PAIRS = 5


def ratio_summary(ratios, higher_is_better=True):
    """Paired new/base ratios -> median, min, max, the interval the verdict is
    read from (bootstrap 90 % of the median with >= BOOTSTRAP_MIN_PAIRS pairs,
    else min–max) and the verdict: "ahead" or "behind" only when that interval
    lies wholly on one side of 1.0 (which side is better: higher_is_better),
    else "level (inside the noise)"; one ratio gives no interval and so "no
    verdict (one pair)". None without ratios."""
    r = [x for x in ratios if x is not None]
    if not r:
        return None
    if len(r) >= BOOTSTRAP_MIN_PAIRS:
        lo, hi = bootstrap_median_ci(r)
        kind = "bootstrap 90 % of the median"
    else:
        lo, hi = min(r), max(r)
        kind = "min–max of the pairs"
    if lo > 1.0:
        verdict = "ahead" if higher_is_better else "behind"
    elif hi < 1.0:
        verdict = "behind" if higher_is_better else "ahead"
    else:
        verdict = "level (inside the noise)"
    if len(r) < 2:
        verdict = "no verdict (one pair)"
    return {"median": median(r), "min": min(r), "max": max(r), "pairs": len(r),
            "interval": [lo, hi], "interval_kind": kind, "verdict": verdict, "ratios": r}


# ---- the machine


def sh(cmd):
    """The first line a command prints; "unknown" if it fails or prints nothing."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        line = out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
        return line if out.returncode == 0 and line else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def version(binary):
    """`BINARY --version`, first line."""
    return sh([binary, "--version"])


def host():
    """CPU model, CPUs online and usable (this process's affinity), kernel, OS."""
    cpu = "unknown"
    online = 0
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k.strip() in ("model name", "Model", "cpu model") and cpu == "unknown":
                    cpu = v.strip()
                if k.strip() == "processor":
                    online += 1
    except OSError:
        pass
    return {
        "cpu_model": cpu,
        "cpus_online": online,
        "cpus_usable": len(os.sched_getaffinity(0)),
        "kernel": platform.release(),
        "os": f"{platform.system()}-{platform.machine()}",
    }


def git_commit(root):
    """HEAD's (commit, ref) from .git files (no git binary is run)."""
    gitdir = os.path.join(root, ".git")
    try:
        if os.path.isfile(gitdir):  # a worktree: "gitdir: PATH"
            with open(gitdir) as f:
                gitdir = os.path.join(root, f.read().split(":", 1)[1].strip())
        with open(os.path.join(gitdir, "HEAD")) as f:
            head = f.read().strip()
        if not head.startswith("ref:"):
            return head, "detached"
        ref = head.split(None, 1)[1]
        common = gitdir
        cd = os.path.join(gitdir, "commondir")
        if os.path.exists(cd):
            with open(cd) as f:
                common = os.path.join(gitdir, f.read().strip())
        for base in (gitdir, common):
            p = os.path.join(base, ref)
            if os.path.exists(p):
                with open(p) as f:
                    return f.read().strip(), ref
        with open(os.path.join(common, "packed-refs")) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and parts[1] == ref:
                    return parts[0], ref
        return "unknown", ref
    except OSError:
        return "unknown", "unknown"


def machine(root, started=None):
    """Everything needed to re-run a figure of the checkout at root: commit,
    vnvme and toolchain versions, host(), dates."""
    h = host()
    commit, ref = git_commit(root)
    now = datetime.datetime.now(datetime.timezone.utc)
    return {
        "git_commit": commit,
        "git_ref": ref,
        "git_note": "read from .git (HEAD); uncommitted changes are not detected",
        "vnvme": version(os.path.join(root, "target", "release", "vnvme")),
        "build": "cargo build --release (opt-level 3, debug = 1)",
        "rustc": sh(["rustc", "--version"]),
        "cargo": sh(["cargo", "--version"]),
        **h,
        "clk_tck": os.sysconf("SC_CLK_TCK"),
        "taskset": sh(["sh", "-c", "command -v taskset"]),
        "python": platform.python_version(),
        "date_utc": started or now.strftime("%Y-%m-%d %H:%M:%S UTC"),
        "report_written_utc": now.strftime("%Y-%m-%d %H:%M:%S UTC"),
    }


def machine_md(m):
    """A machine description (machine(), or a bench's own facts completed by
    host()) as Markdown list items, for the head of a report; what m lacks is
    left out."""
    L = []
    if m.get("date_utc"):
        L.append(f"- date (UTC): {m['date_utc']}")
    if m.get("git_commit"):
        how = "; ".join(x for x in (m.get("git_ref"), m.get("git_note")) if x)
        L.append(f"- git commit: {m['git_commit']}" + (f" ({how})" if how else ""))
    if m.get("vnvme"):
        L.append(f"- vnvme: {m['vnvme']}" + (f", {m['build']}" if m.get("build") else ""))
    if m.get("crate_version"):
        L.append(f"- {m.get('crate', 'crate')} version: {m['crate_version']}")
    if m.get("rustc"):
        L.append(f"- rustc: {m['rustc']}" + (f"; {m['cargo']}" if m.get("cargo") else ""))
    if m.get("profile"):
        L.append(f"- build: {m['profile']}")
    if m.get("cpu_model"):
        L.append(f"- CPU: {m['cpu_model']}")
    if m.get("cpus_online") or m.get("cpus_usable"):
        L.append(f"- cores: {m.get('cpus_online', '?')} online, {m.get('cpus_usable', '?')} usable by this process")
    if m.get("kernel"):
        extra = ", ".join(x for x in (m.get("os"), f"USER_HZ {m['clk_tck']}" if m.get("clk_tck") else None) if x)
        L.append(f"- kernel: {m['kernel']}" + (f" ({extra})" if extra else ""))
    if m.get("python"):
        L.append(f"- report: Python {m['python']}, scripts/lib/vnvme_report.py")
    return L


def machine_line(m):
    """The same in one line, for a chart's subtitle."""
    parts = [m.get("date_utc")]
    if m.get("git_commit"):
        parts.append(f"commit {m['git_commit'][:12]}")
    if m.get("cpu_model"):
        parts.append(f"{m['cpu_model']} ({m.get('cpus_usable', '?')} CPUs)")
    if m.get("kernel"):
        parts.append(f"kernel {m['kernel']}")
    parts.append(m.get("rustc"))
    return " · ".join(p for p in parts if p)


# ---- SVG

FONT = 'font-family="DejaVu Sans, Helvetica, Arial, sans-serif"'


def esc(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def text(x, y, s, size=12, anchor="start", weight="normal", fill="#222", extra=""):
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
            f'font-weight="{weight}" fill="{fill}" {extra}>{esc(s)}</text>')


def log_ticks(lo, hi):
    ticks = []
    e = math.floor(math.log10(lo))
    while 10**e <= hi * 1.0001:
        for m in (1, 2, 5):
            v = m * 10**e
            if lo * 0.9999 <= v <= hi * 1.0001:
                ticks.append(v)
        e += 1
    return ticks


def tick_label(v, unit):
    if unit == "iops":
        return f"{v / 1e6:g}M" if v >= 1e6 else (f"{v / 1e3:g}k" if v >= 1e3 else f"{v:g}")
    return f"{v:g}"


def log_panel(x0, y0, w, h, title, ylabel, series, qds, unit, lo, hi, guide=None, floor_label=None, note=None,
              ticks=None, dodge=0.0, whisker=1.0):
    """A log-y line chart: x = queue depth (categorical), one line per series
    ({"color", "values", "ranges": [(min, max)], "dashed"}; dashed lines get
    square markers). guide: (value, label[, "left-below"]), a dashed red line.
    ticks: the y grid values (default 1-2-5 per decade; ratio_ticks() for
    ratios). dodge: each series' x offset in px, so whiskers at one QD stay apart.
    whisker: their stroke width (wider, with caps, where they are the message)."""
    o = [f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="#ffffff" stroke="#cccccc"/>']
    o.append(text(x0 + 12, y0 + 24, title, 15, weight="bold"))
    if note:
        o.append(text(x0 + 12, y0 + 42, note, 11, fill="#555"))
    L, R, T, B = x0 + 78, x0 + w - 24, y0 + 56, y0 + h - 48
    lo_l, hi_l = math.log10(lo), math.log10(hi)

    def ypos(v):
        v = min(max(v, lo), hi)
        return B - (math.log10(v) - lo_l) / (hi_l - lo_l) * (B - T)

    def xpos(i):
        return L + (i + 0.5) * (R - L) / len(qds)

    for v in ticks or log_ticks(lo, hi):
        y = ypos(v)
        major = abs(v - 1.0) < 1e-9 if ticks else abs(math.log10(v) - round(math.log10(v))) < 1e-9
        o.append(f'<line x1="{L}" y1="{y:.1f}" x2="{R}" y2="{y:.1f}" stroke="{"#d0d0d0" if major else "#eeeeee"}"/>')
        lab = floor_label if (floor_label and abs(v - lo) < 1e-12) else tick_label(v, unit)
        o.append(text(L - 6, y + 4, lab, 12 if major else 10, "end", fill="#333" if major else "#777"))
    o.append(f'<line x1="{L}" y1="{B}" x2="{R}" y2="{B}" stroke="#444"/>')
    o.append(f'<line x1="{L}" y1="{T}" x2="{L}" y2="{B}" stroke="#444"/>')
    for i, q in enumerate(qds):
        o.append(text(xpos(i), B + 18, f"QD {q}", 13, "middle"))
    o.append(text(x0 + 16, (T + B) / 2, ylabel, 12, "middle", extra=f'transform="rotate(-90 {x0 + 16} {(T + B) / 2:.1f})"'))
    if guide:
        gv, gl, where = guide if len(guide) == 3 else (*guide, "right")
        y = ypos(gv)
        o.append(f'<line x1="{L}" y1="{y:.1f}" x2="{R}" y2="{y:.1f}" stroke="#c00" stroke-width="1.5" stroke-dasharray="7,4"/>')
        # A white halo keeps the label readable where lines cross it.
        gx, gy, anchor = (L + 6, y + 17, "start") if where == "left-below" else (R - 4, y - 6, "end")
        o.append(text(gx, gy, gl, 12, anchor, "bold", "#c00",
                      extra='paint-order="stroke" stroke="#ffffff" stroke-width="5" stroke-linejoin="round"'))
    for si, s in enumerate(series):
        dx = (si - (len(series) - 1) / 2) * dodge
        pts = [(xpos(i) + dx, ypos(v)) for i, v in enumerate(s["values"]) if v is not None]
        dash = ' stroke-dasharray="6,3"' if s.get("dashed") else ""
        if len(pts) > 1:
            d = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            o.append(f'<polyline points="{d}" fill="none" stroke="{s["color"]}" stroke-width="2.2"{dash}/>')
        for (x, y) in pts:
            if s.get("dashed"):
                o.append(f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" fill="{s["color"]}"/>')
            else:
                o.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{s["color"]}"/>')
        # whiskers: min–max of the runs
        for i, r in enumerate(s.get("ranges", [])):
            if r and r[0] != r[1]:
                x = xpos(i) + dx
                o.append(f'<line x1="{x:.1f}" y1="{ypos(r[0]):.1f}" x2="{x:.1f}" y2="{ypos(r[1]):.1f}" '
                         f'stroke="{s["color"]}" stroke-width="{whisker:g}" opacity="0.6"/>')
                if whisker > 1:
                    for v in r:
                        o.append(f'<line x1="{x - 2 * whisker:.1f}" y1="{ypos(v):.1f}" x2="{x + 2 * whisker:.1f}" '
                                 f'y2="{ypos(v):.1f}" stroke="{s["color"]}" stroke-width="{whisker:g}" opacity="0.6"/>')
    return "\n".join(o)


def bounds(values, floor=None, pad=1.6):
    """Log-axis limits (powers of ten) around the positive values, padded;
    values below floor are drawn at it."""
    vs = [v for v in values if v is not None and v > 0]
    if floor is not None:
        vs = [max(v, floor) for v in vs] + [floor]
    if not vs:
        return 1, 10
    lo, hi = min(vs) / pad, max(vs) * pad
    lo = floor if floor is not None else 10 ** math.floor(math.log10(lo))
    hi = 10 ** math.ceil(math.log10(hi))
    return lo, hi


def ratio_ticks(lo, hi):
    """Grid values for a log axis of ratios between lo and hi: 1.0 and steps of
    5, 10, 25 or 50 % (whichever gives at most about 9 lines)."""
    for step in (0.05, 0.1, 0.25, 0.5, 1.0):
        t = [round(1 + k * step, 4) for k in range(-int(1 / step) + 1, int(hi / step) + 2)]
        t = [v for v in t if lo * 0.9999 <= v <= hi * 1.0001]
        if len(t) <= 9:
            return t
    return [1.0]


def ratio_bounds(values, pad=1.05):
    """Log-axis limits for ratios: around the values and always around 1.0,
    symmetric in log (x and 1/x), at least 0.8–1.25."""
    vs = [v for v in values if v is not None and v > 0] + [1.0]
    m = max(max(vs), 1 / min(vs), 1.25) * pad
    return 1 / m, m


def svg_doc(w, h, parts, background="#ffffff"):
    """A whole SVG document of w x h px: a background, then parts (strings)."""
    return "\n".join([f'<svg xmlns="http://www.w3.org/2000/svg" width="{w:g}" height="{h:g}" '
                      f'viewBox="0 0 {w:g} {h:g}" {FONT}>',
                      f'<rect width="100%" height="100%" fill="{background}"/>', *parts, "</svg>"]) + "\n"


def title_block(x, y, title, lines=(), note=None, size=20):
    """A chart's head at (x, y): the title in bold, then lines in grey (the
    machine, the knobs), then a note in bold red (what to be wary of). Returns
    (svg, the y below it)."""
    o = [text(x, y + size, title, size, weight="bold")]
    y += size + 8
    for line in lines:
        if line:
            o.append(text(x, y + 13, line, 13, fill="#444"))
            y += 20
    if note:
        o.append(text(x, y + 13, note, 13, weight="bold", fill="#b00"))
        y += 20
    return "\n".join(o), y + 8


def legend(x, y, items, cols=1, col_w=250, row_h=20):
    """Legend entries ({"name", "color"}; "line": a line swatch, dashed with
    square markers when "dashed", else a box) in cols columns from (x, y).
    Returns (svg, the y below it)."""
    o = []
    for i, it in enumerate(items):
        lx, ly = x + (i % cols) * col_w, y + (i // cols) * row_h
        c = it["color"]
        if it.get("line"):
            dash = ' stroke-dasharray="6,3"' if it.get("dashed") else ""
            o.append(f'<line x1="{lx}" y1="{ly + 6}" x2="{lx + 30}" y2="{ly + 6}" stroke="{c}" '
                     f'stroke-width="2.5"{dash}/>')
            if it.get("dashed"):
                o.append(f'<rect x="{lx + 11}" y="{ly + 2}" width="8" height="8" fill="{c}"/>')
            else:
                o.append(f'<circle cx="{lx + 15}" cy="{ly + 6}" r="4" fill="{c}"/>')
            o.append(text(lx + 38, ly + 11, it["name"], 13))
        else:
            o.append(f'<rect x="{lx}" y="{ly}" width="12" height="12" fill="{c}"/>')
            o.append(text(lx + 18, ly + 10, it["name"], 12))
    rows = (len(items) + cols - 1) // cols
    return "\n".join(o), y + rows * row_h


def wrap(s, width):
    """s in lines of at most width characters, broken at spaces (a longer word
    keeps its own line)."""
    lines = []
    for word in str(s).split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines or [""]


def axis_ticks(top, most=6):
    """A linear axis from 0 to at least top: its ticks, in steps of 1, 2, 2.5
    or 5 times a power of ten, at most `most` steps."""
    if top <= 0:
        top = 1
    e = 10 ** math.floor(math.log10(top / most))
    step = next(m * e for m in (1, 2, 2.5, 5, 10, 20) if top / (m * e) <= most)
    n = math.ceil(top / step - 1e-9)
    return [float(f"{k * step:.10g}") for k in range(n + 1)]


def bar_panel(x0, y0, w, h, title, groups, series, value=lambda d: d, spread=None, guide=None, labels=None,
              tick=None, ylabel=None, xlabel=None, note=None, background="#ffffff", legend_w=0):
    """One panel of grouped bars in the box (x0, y0, w, h): in each group a bar
    per series ({"name", "color", "values": {group: data}}; a series without
    the group's data leaves a gap), value(data) its height. spread(data) ->
    (min, max) or None: a min–max whisker. guide (value, label): a dashed red
    line, named in the legend. labels(v) -> the text printed over each bar.
    tick(v): the y axis labels (default "{v:g}"). ylabel, xlabel: the axes'
    names. legend_w > 0: the series' legend in a column that wide at the
    panel's right."""
    o = [f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="{background}" stroke="#cccccc"/>']
    o.append(text(x0 + 12, y0 + 22, title, 15, weight="bold"))
    top = y0 + 34
    if note:
        o.append(text(x0 + 12, y0 + 40, note, 11, fill="#555"))
        top = y0 + 50
    L, R = x0 + 70, x0 + w - legend_w - 16
    gw = (R - L) / max(1, len(groups))
    # Group names wider than their slot go on more lines (about 6.5 px a character).
    names = [wrap(g, max(4, int(gw / 6.5))) for g in groups]
    extra = 13 * (max((len(n) for n in names), default=1) - 1)
    T, B = top + 18, y0 + h - (48 if xlabel else 30) - extra
    vals, highs = [], []
    for s in series:
        for g in groups:
            if g in s["values"]:
                d = s["values"][g]
                vals.append(value(d))
                r = spread(d) if spread else None
                if r:
                    highs.append(r[1])
    ticks = axis_ticks(max(vals + highs + ([guide[0]] if guide else []) or [1]) * (1.08 if labels else 1))
    vmax = ticks[-1]
    fmt_tick = tick or (lambda v: f"{v:g}")

    def ypos(v):
        return B - (B - T) * v / vmax if vmax else B

    for v in ticks:
        y = ypos(v)
        o.append(f'<line x1="{L}" y1="{y:.1f}" x2="{R}" y2="{y:.1f}" stroke="#dddddd"/>')
        o.append(text(L - 6, y + 4, fmt_tick(v), 11, "end", fill="#333"))
    if xlabel:
        o.append(text((L + R) / 2, B + 36 + extra, xlabel, 12, "middle"))
    if ylabel:
        o.append(text(x0 + 16, (T + B) / 2, ylabel, 12, "middle",
                      extra=f'transform="rotate(-90 {x0 + 16} {(T + B) / 2:.1f})"'))
    bw = gw * 0.84 / max(1, len(series))
    for gi, g in enumerate(groups):
        gx = L + gi * gw + gw * 0.08
        for li, line in enumerate(names[gi]):
            o.append(text(L + gi * gw + gw / 2, B + 17 + 13 * li, line, 12, "middle"))
        for si, s in enumerate(series):
            if g not in s["values"]:
                continue
            d = s["values"][g]
            v = value(d)
            x, y = gx + si * bw, ypos(v)
            o.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(bw - 1.5, 1):.1f}" height="{max(B - y, 0):.1f}" '
                     f'fill="{s["color"]}"><title>{esc(s["name"])} {esc(g)}: {v:g}</title></rect>')
            label_y = y - 4
            r = spread(d) if spread else None
            if r and r[0] != r[1]:
                cx = x + bw / 2
                o.append(f'<path d="M{cx:.1f} {ypos(r[0]):.1f}V{ypos(r[1]):.1f}M{cx - 4:.1f} {ypos(r[0]):.1f}h8'
                         f'M{cx - 4:.1f} {ypos(r[1]):.1f}h8" stroke="#222" fill="none"/>')
                label_y = min(label_y, ypos(r[1]) - 4)
            if labels:
                # A white halo keeps the value legible where it crosses a line.
                o.append(text(x + bw / 2, label_y, labels(v), 10, "middle",
                              extra='paint-order="stroke" stroke="#ffffff" stroke-width="3"'))
    o.append(f'<line x1="{L}" y1="{B}" x2="{R}" y2="{B}" stroke="#333"/>')
    o.append(f'<line x1="{L}" y1="{T}" x2="{L}" y2="{B}" stroke="#333"/>')
    if guide:
        y = ypos(guide[0])
        o.append(f'<line x1="{L}" y1="{y:.1f}" x2="{R}" y2="{y:.1f}" stroke="#c00" stroke-width="1.5" '
                 f'stroke-dasharray="7,4"/>')
    if legend_w:
        svg, ly = legend(R + 16, T, series, col_w=legend_w)
        o.append(svg)
        if guide:
            o.append(f'<line x1="{R + 16}" y1="{ly + 6}" x2="{R + 44}" y2="{ly + 6}" stroke="#c00" stroke-width="1.5" '
                     f'stroke-dasharray="7,4"/>')
            o.append(text(R + 50, ly + 10, guide[1], 12, fill="#c00"))
    return "\n".join(o)


def bar_chart(title, note, groups, series, panels, legend_w=230, subtitle=()):
    """A whole SVG of grouped bar panels, one under the other, the series'
    legend at the right of each panel (legend_w px wide). series: [{"name", "color",
    "values": {group: data}}]. panels: (label, value-of-data) pairs, or dicts
    {"label", "value"} with any of bar_panel()'s options ("spread", "guide",
    "labels", "tick", "ylabel", "xlabel", "note", "background"), their own "groups"
    and "series" for a panel of other data (a reference that is not ours),
    and "height" (px). subtitle: grey lines under the title (the
    machine, the knobs); note: one red line under them."""
    W, PH, left = 1180, 330, 10
    head, top = title_block(left + 10, 4, title, subtitle, note, size=15)
    panels = [p if isinstance(p, dict) else {"label": p[0], "value": p[1]} for p in panels]
    heights = [p.get("height", PH) for p in panels]
    H = top + sum(h + 16 for h in heights) + 4
    out = [head]
    y = top
    for p, ph in zip(panels, heights):
        opts = {k: p[k] for k in ("spread", "guide", "labels", "tick", "ylabel", "xlabel", "note", "background")
                if k in p}
        out.append(bar_panel(left, y, W - 2 * left, ph, p["label"], p.get("groups", groups), p.get("series", series),
                             p["value"], legend_w=legend_w, **opts))
        y += ph + 16
    return svg_doc(W, H, out)


def main(argv):
    if len(argv) >= 2 and argv[1] == "machine" and len(argv) <= 3:
        root = argv[2] if len(argv) == 3 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
        print(json.dumps(machine(os.path.abspath(root)), indent=1))
        return 0
    print("usage: vnvme_report.py machine [ROOT]   (the machine as JSON; import the module for the rest)",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
