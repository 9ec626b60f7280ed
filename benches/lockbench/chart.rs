//! The contention chart, written as SVG by hand: p99 wait (log scale) and
//! grants/s against the number of workers, one line per way of waiting.

use std::fmt::Write;

use crate::contention::{Row, Strategy};

const W: f64 = 920.0;
const H: f64 = 400.0;
const PLOT_W: f64 = 340.0;
const PLOT_H: f64 = 250.0;
const TOP: f64 = 80.0;

fn color(s: Strategy) -> (&'static str, &'static str) {
    match s {
        Strategy::Wait => ("#1f6fb4", ""),
        Strategy::Poll => ("#d62728", ""),
        Strategy::Backoff => ("#777777", " stroke-dasharray=\"6 4\""),
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

struct Axis {
    log: bool,
    lo: f64,
    hi: f64,
}

impl Axis {
    fn frac(&self, v: f64) -> f64 {
        if self.log {
            (v.max(self.lo).log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        }
    }
}

fn nice_ceiling(x: f64) -> f64 {
    if x <= 0.0 || !x.is_finite() {
        return 1.0;
    }
    let mag = 10f64.powf(x.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * mag >= x {
            return m * mag;
        }
    }
    10.0 * mag
}

fn fmt_tick(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v >= 1000.0 {
        format!("{}k", v / 1000.0)
    } else if v >= 1.0 {
        format!("{v}")
    } else {
        format!("{v:.1}")
    }
}

#[allow(clippy::too_many_arguments)]
fn panel(
    svg: &mut String,
    left: f64,
    title: &str,
    y_label: &str,
    y: &Axis,
    y_ticks: &[f64],
    workers: &[usize],
    series: &[(Strategy, Vec<(usize, f64)>)],
) {
    let xs: Vec<f64> = workers.iter().map(|&w| (w as f64).log2()).collect();
    let (x_lo, x_hi) = (
        xs.iter().copied().fold(f64::INFINITY, f64::min) - 0.4,
        xs.iter().copied().fold(f64::NEG_INFINITY, f64::max) + 0.4,
    );
    let px = |w: usize| left + ((w as f64).log2() - x_lo) / (x_hi - x_lo) * PLOT_W;
    let py = |v: f64| TOP + PLOT_H - y.frac(v).clamp(0.0, 1.0) * PLOT_H;
    let _ = writeln!(
        svg,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">{}</text>",
        left + PLOT_W / 2.0,
        TOP - 14.0,
        esc(title)
    );
    let _ = writeln!(
        svg,
        "<rect x=\"{left}\" y=\"{TOP}\" width=\"{PLOT_W}\" height=\"{PLOT_H}\" fill=\"none\" stroke=\"#444\"/>"
    );
    for &t in y_ticks {
        let yy = py(t);
        let _ = writeln!(
            svg,
            "<line x1=\"{left}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"#ddd\"/>\n<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" font-size=\"12\">{}</text>",
            left + PLOT_W,
            left - 6.0,
            yy + 4.0,
            fmt_tick(t)
        );
    }
    for &w in workers {
        let xx = px(w);
        let _ = writeln!(
            svg,
            "<line x1=\"{xx:.1}\" y1=\"{TOP}\" x2=\"{xx:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/>\n<text x=\"{xx:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"12\">{w}</text>",
            TOP + PLOT_H,
            TOP + PLOT_H + 18.0
        );
    }
    let _ = writeln!(
        svg,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"13\">workers on one key</text>",
        left + PLOT_W / 2.0,
        TOP + PLOT_H + 38.0
    );
    let _ = writeln!(
        svg,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"13\" transform=\"rotate(-90 {:.1} {:.1})\">{}</text>",
        left - 48.0,
        TOP + PLOT_H / 2.0,
        left - 48.0,
        TOP + PLOT_H / 2.0,
        esc(y_label)
    );
    for (strategy, points) in series {
        let (stroke, dash) = color(*strategy);
        let path: Vec<String> = points
            .iter()
            .filter(|(_, v)| v.is_finite())
            .map(|&(w, v)| format!("{:.1},{:.1}", px(w), py(v)))
            .collect();
        let _ = writeln!(
            svg,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{stroke}\" stroke-width=\"2.5\"{dash}/>",
            path.join(" ")
        );
        for &(w, v) in points.iter().filter(|(_, v)| v.is_finite()) {
            let _ = writeln!(
                svg,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{stroke}\"/>",
                px(w),
                py(v)
            );
        }
    }
}

/// The chart for these contention rows.
pub fn contention_svg(rows: &[Row], subtitle: &str) -> String {
    let mut workers: Vec<usize> = rows.iter().map(|r| r.workers).collect();
    workers.sort_unstable();
    workers.dedup();
    let series = |f: &dyn Fn(&Row) -> f64| -> Vec<(Strategy, Vec<(usize, f64)>)> {
        Strategy::ALL
            .iter()
            .map(|&s| {
                let pts = rows
                    .iter()
                    .filter(|r| r.strategy == s)
                    .map(|r| (r.workers, f(r)))
                    .collect();
                (s, pts)
            })
            .collect()
    };
    let p99 = series(&|r| r.waits.at(99.0) / 1000.0);
    let grants = series(&|r| r.grants_per_sec());
    let all_p99: Vec<f64> = p99
        .iter()
        .flat_map(|(_, p)| p.iter().map(|&(_, v)| v))
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    let lo = all_p99.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = all_p99.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lo = 10f64.powf(lo.max(0.001).log10().floor());
    let hi = 10f64.powf(hi.max(lo * 10.0).log10().ceil());
    let mut log_ticks = Vec::new();
    let mut t = lo;
    while t <= hi * 1.001 {
        log_ticks.push(t);
        t *= 10.0;
    }
    let gmax = grants
        .iter()
        .flat_map(|(_, p)| p.iter().map(|&(_, v)| v))
        .fold(0.0, f64::max);
    let gmax = nice_ceiling(gmax * 1.05);
    let lin_ticks: Vec<f64> = (0..=5).map(|i| gmax * i as f64 / 5.0).collect();

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" font-family=\"Helvetica, Arial, sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>"
    );
    let _ = writeln!(
        svg,
        "<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">redis-lock: contention on one key (acquire -> INCR -> release)</text>\n<text x=\"{}\" y=\"42\" text-anchor=\"middle\" font-size=\"12\" fill=\"#555\">{}</text>",
        W / 2.0,
        W / 2.0,
        esc(subtitle)
    );
    panel(
        &mut svg,
        90.0,
        "p99 wait for the lock (ms, log scale)",
        "p99 wait (ms)",
        &Axis { log: true, lo, hi },
        &log_ticks,
        &workers,
        &p99,
    );
    panel(
        &mut svg,
        540.0,
        "grants per second",
        "grants/s",
        &Axis {
            log: false,
            lo: 0.0,
            hi: gmax,
        },
        &lin_ticks,
        &workers,
        &grants,
    );
    let mut lx = 180.0;
    for s in Strategy::ALL {
        let (stroke, dash) = color(s);
        let _ = writeln!(
            svg,
            "<line x1=\"{lx}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"{stroke}\" stroke-width=\"2.5\"{dash}/>\n<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"13\">{}</text>",
            lx + 30.0,
            lx + 36.0,
            H - 16.0 + 4.0,
            esc(s.label()),
            y = H - 16.0
        );
        lx += 210.0;
    }
    svg.push_str("</svg>\n");
    svg
}
