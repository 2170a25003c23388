//! The run as an SVG of grouped bar charts, written by hand (no plotting crate):
//! trapped doorbell writes per command, commands per second, and the seed reference in
//! a panel of its own so it is never read as one of our measurements.

use std::fmt::Write;

use super::machine::Machine;
use super::{fmt_rate, Knobs, Point, Workload, SEED_LABEL, SEED_MMIO_DBBUF, SEED_MMIO_QEMU, SEED_QD};

const WIDTH: f64 = 1100.0;
const PANEL_H: f64 = 380.0;
const SEED_PANEL_H: f64 = 300.0;
const TOP: f64 = 80.0;
const FONT: &str = "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\"";

/// One bar per group: its value, and the min/max whisker when the runs differ.
struct Series {
    name: String,
    color: &'static str,
    values: Vec<f64>,
    ranges: Vec<Option<(f64, f64)>>,
}

struct Panel<'a> {
    title: String,
    y_label: &'a str,
    x_label: &'a str,
    groups: Vec<String>,
    series: Vec<Series>,
    value: &'a dyn Fn(f64) -> String,
    tick: &'a dyn Fn(f64) -> String,
    /// A dashed horizontal guide: value and label.
    guide: Option<(f64, &'a str)>,
    background: &'static str,
}

pub(crate) fn render(m: &Machine, k: &Knobs, points: &[Point]) -> String {
    let groups: Vec<String> = k.qd.iter().map(|q| format!("QD {q}")).collect();
    let series = |metric: &dyn Fn(&Point) -> super::Spread| -> Vec<Series> {
        let mut out = Vec::new();
        for &w in &k.workloads {
            for shadow in [false, true] {
                let color = match (w, shadow) {
                    (Workload::RandRead, false) => "#d95f02",
                    (Workload::RandRead, true) => "#1f78b4",
                    (Workload::RandWrite, false) => "#fdb863",
                    (Workload::RandWrite, true) => "#a6cee3",
                };
                let pts: Vec<&Point> = k
                    .qd
                    .iter()
                    .filter_map(|&q| {
                        points.iter().find(|p| p.workload == w && p.qd == q && p.shadow_doorbells == shadow)
                    })
                    .collect();
                out.push(Series {
                    name: format!("{}, {}", w.name(), if shadow { "shadow doorbells" } else { "no shadow" }),
                    color,
                    values: pts.iter().map(|p| metric(p).median).collect(),
                    ranges: pts
                        .iter()
                        .map(|p| {
                            let s = metric(p);
                            (s.min != s.max).then_some((s.min, s.max))
                        })
                        .collect(),
                });
            }
        }
        out
    };
    let per_cmd = |v: f64| format!("{v:.3}");
    let rate = |v: f64| fmt_rate(v).replace(' ', "");
    let two = |v: f64| format!("{v:.2}");
    let plain = |v: f64| format!("{v}");
    let millions = |v: f64| if v == 0.0 { "0".to_string() } else { format!("{}M", v / 1e6) };
    let panels = [
        (
            Panel {
                title: "Trapped I/O doorbell writes per command (lower is better) — measured".into(),
                y_label: "trapped doorbell writes / command",
                x_label: "queue depth (fio iodepth)",
                groups: groups.clone(),
                series: series(&|p| p.trapped_io_doorbells_per_cmd),
                value: &per_cmd,
                tick: &plain,
                guide: Some((0.1, "issue target at QD ≥ 16: < 0.1")),
                background: "#ffffff",
            },
            PANEL_H,
        ),
        (
            Panel {
                title:
                    "Commands per second, one thread running host and device — measured (median; whiskers \
                        min–max)"
                        .into(),
                y_label: "commands / s",
                x_label: "queue depth (fio iodepth)",
                groups,
                series: series(&|p| p.commands_per_sec),
                value: &rate,
                tick: &millions,
                guide: None,
                background: "#ffffff",
            },
            PANEL_H,
        ),
        (
            Panel {
                title: format!(
                    "{SEED_LABEL} — NOT our measurement: MMIO writes per I/O (perf-kvm), fio randread 4 KiB"
                ),
                y_label: "MMIO writes / I/O",
                x_label: "queue depth (fio iodepth)",
                groups: SEED_QD.iter().map(|q| format!("QD {q}")).collect(),
                series: vec![
                    Series {
                        name: "QEMU hw/nvme, no shadow doorbells".into(),
                        color: "#969696",
                        values: SEED_MMIO_QEMU.to_vec(),
                        ranges: vec![None; 4],
                    },
                    Series {
                        name: "QEMU hw/nvme +dbbuf (shadow doorbells)".into(),
                        color: "#525252",
                        values: SEED_MMIO_DBBUF.to_vec(),
                        ranges: vec![None; 4],
                    },
                ],
                value: &two,
                tick: &plain,
                guide: None,
                background: "#f3f3f3",
            },
            SEED_PANEL_H,
        ),
    ];
    let height = TOP + panels.iter().map(|(_, h)| h + 20.0).sum::<f64>() + 10.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         viewBox=\"0 0 {WIDTH} {height}\" {FONT}>"
    );
    let _ = writeln!(s, "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>");
    text(&mut s, 20.0, 28.0, 20, "start", "bold", "vnvme: shadow doorbells in the mock host microbenchmark");
    let sub = format!(
        "nvme-ctrl {} @ git {} · {} · {} · CPU {} ({} online) · kernel {}",
        m.crate_version, m.git_commit, m.date_utc, m.rustc, m.cpu_model, m.cpus_online, m.kernel
    );
    text(&mut s, 20.0, 48.0, 12, "start", "normal", &sub);
    let knobs = format!(
        "{} commands × {} runs per point · null namespace · 4 KiB I/O · 1 I/O queue of {} entries · \
         host and device in one thread (no VM exits)",
        k.commands, k.repeat, k.queue_entries
    );
    text(&mut s, 20.0, 64.0, 12, "start", "normal", &knobs);
    let mut y = TOP;
    for (p, h) in &panels {
        panel(&mut s, 10.0, y, WIDTH - 20.0, *h, p);
        y += h + 20.0;
    }
    s.push_str("</svg>\n");
    s
}

fn panel(s: &mut String, x: f64, y: f64, w: f64, h: f64, p: &Panel) {
    let _ = writeln!(
        s,
        "<rect x=\"{x}\" y=\"{y}\" width=\"{w}\" height=\"{h}\" fill=\"{}\" stroke=\"#bbbbbb\"/>",
        p.background
    );
    text(s, x + 12.0, y + 22.0, 15, "start", "bold", &p.title);
    // Legend: one row of swatches under the title.
    let mut lx = x + 80.0;
    for se in &p.series {
        let _ = writeln!(
            s,
            "<rect x=\"{lx}\" y=\"{}\" width=\"14\" height=\"14\" fill=\"{}\"/>",
            y + 34.0,
            se.color
        );
        text(s, lx + 19.0, y + 46.0, 12, "start", "normal", &se.name);
        lx += 19.0 + 6.6 * se.name.chars().count() as f64 + 18.0;
    }
    if let Some((_, label)) = p.guide {
        let _ = writeln!(
            s,
            "<line x1=\"{lx}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#c00\" stroke-width=\"2\" \
             stroke-dasharray=\"6 4\"/>",
            y + 41.0,
            lx + 28.0,
            y + 41.0
        );
        text(s, lx + 34.0, y + 46.0, 12, "start", "normal", label);
    }
    let (px, py) = (x + 80.0, y + 64.0);
    let (pw, ph) = (w - 100.0, h - 64.0 - 52.0);
    let top = p
        .series
        .iter()
        .flat_map(|se| se.values.iter().copied().chain(se.ranges.iter().flatten().map(|r| r.1)))
        .chain(p.guide.map(|g| g.0))
        .fold(0.0f64, f64::max);
    let (ymax, step) = axis(top * 1.12);
    let ys = |v: f64| py + ph - v / ymax * ph;
    // Y grid and tick labels.
    let mut t = 0.0;
    while t <= ymax + step / 2.0 {
        let ty = ys(t);
        let _ =
            writeln!(s, "<line x1=\"{px}\" y1=\"{ty}\" x2=\"{}\" y2=\"{ty}\" stroke=\"#e0e0e0\"/>", px + pw);
        // Round so that steps like 0.1 print as 0.3, not 0.30000000000000004.
        text(s, px - 6.0, ty + 4.0, 11, "end", "normal", &(p.tick)(round_sig(t)));
        t += step;
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\" \
         transform=\"rotate(-90 {} {})\">{}</text>",
        x + 18.0,
        py + ph / 2.0,
        x + 18.0,
        py + ph / 2.0,
        esc(p.y_label)
    );
    // Bars, each group centred in its slot.
    let gw = pw / p.groups.len() as f64;
    let bw = gw * 0.8 / p.series.len() as f64;
    for (gi, g) in p.groups.iter().enumerate() {
        let gx = px + gi as f64 * gw + gw * 0.1;
        for (si, se) in p.series.iter().enumerate() {
            let Some(&v) = se.values.get(gi) else { continue };
            let bx = gx + si as f64 * bw;
            let by = ys(v);
            let _ = writeln!(
                s,
                "<rect x=\"{:.1}\" y=\"{by:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"/>",
                bx + 1.0,
                bw - 2.0,
                (py + ph - by).max(0.0),
                se.color
            );
            let mut label_y = by - 4.0;
            if let Some(Some((lo, hi))) = se.ranges.get(gi) {
                let cx = bx + bw / 2.0;
                let _ = writeln!(
                    s,
                    "<path d=\"M{cx:.1} {:.1}V{:.1}M{:.1} {:.1}h8M{:.1} {:.1}h8\" stroke=\"#222\" fill=\"none\"/>",
                    ys(*lo),
                    ys(*hi),
                    cx - 4.0,
                    ys(*lo),
                    cx - 4.0,
                    ys(*hi)
                );
                label_y = label_y.min(ys(*hi) - 4.0);
            }
            // A white halo keeps the value legible where it crosses a grid or guide line.
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{label_y:.1}\" font-size=\"11\" text-anchor=\"middle\" \
                 stroke=\"#fff\" stroke-width=\"3\" paint-order=\"stroke\">{}</text>",
                bx + bw / 2.0,
                esc(&(p.value)(v))
            );
        }
        text(s, px + gi as f64 * gw + gw / 2.0, py + ph + 18.0, 13, "middle", "bold", g);
    }
    let _ = writeln!(
        s,
        "<line x1=\"{px}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333\"/>",
        py + ph,
        px + pw,
        py + ph
    );
    let _ = writeln!(s, "<line x1=\"{px}\" y1=\"{py}\" x2=\"{px}\" y2=\"{}\" stroke=\"#333\"/>", py + ph);
    if let Some((v, _)) = p.guide {
        let gy = ys(v);
        let _ = writeln!(
            s,
            "<line x1=\"{px}\" y1=\"{gy}\" x2=\"{}\" y2=\"{gy}\" stroke=\"#c00\" stroke-dasharray=\"6 4\"/>",
            px + pw
        );
    }
    text(s, px + pw / 2.0, py + ph + 40.0, 12, "middle", "normal", p.x_label);
}

/// `v` with at most 6 significant digits, so tick arithmetic does not show.
fn round_sig(v: f64) -> f64 {
    format!("{v:.6e}").parse().unwrap_or(v)
}

/// A round axis maximum at or above `top`, and its tick step (1, 2 or 5 × 10^n).
fn axis(top: f64) -> (f64, f64) {
    let top = if top > 0.0 { top } else { 1.0 };
    let raw = top / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|&st| st >= raw).unwrap_or(10.0 * mag);
    ((top / step).ceil() * step, step)
}

fn text(s: &mut String, x: f64, y: f64, size: u32, anchor: &str, weight: &str, t: &str) {
    let _ = writeln!(
        s,
        "<text x=\"{x:.1}\" y=\"{y:.1}\" font-size=\"{size}\" text-anchor=\"{anchor}\" \
         font-weight=\"{weight}\">{}</text>",
        esc(t)
    );
}

fn esc(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
