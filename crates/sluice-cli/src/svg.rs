//! Minimal SVG charts for the experiment reports (no plotting dependency).

use std::fmt::Write as _;

const W: f64 = 640.0;
const H: f64 = 360.0;
const L: f64 = 70.0;
const R: f64 = 150.0;
const T: f64 = 40.0;
const B: f64 = 60.0;
const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

fn header(title: &str, xlabel: &str, ylabel: &str) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="20" text-anchor="middle" font-size="14">{title}</text>
<text x="{}" y="{}" text-anchor="middle">{xlabel}</text>
<text x="15" y="{}" text-anchor="middle" transform="rotate(-90 15 {})">{ylabel}</text>
<line x1="{L}" y1="{}" x2="{}" y2="{}" stroke="black"/>
<line x1="{L}" y1="{T}" x2="{L}" y2="{}" stroke="black"/>
"#,
        W / 2.0,
        L + (W - L - R) / 2.0,
        H - 15.0,
        H / 2.0,
        H / 2.0,
        H - B,
        W - R,
        H - B,
        H - B
    );
    s
}

fn y_axis(s: &mut String, ymax: f64) {
    for i in 0..=4 {
        let v = ymax * i as f64 / 4.0;
        let y = H - B - (H - T - B) * i as f64 / 4.0;
        let _ = writeln!(
            s,
            r##"<line x1="{L}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            W - R,
            L - 5.0,
            y + 4.0,
            fmt(v)
        );
    }
}

fn fmt(v: f64) -> String {
    if v.abs() >= 10000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn legend(s: &mut String, names: &[String]) {
    for (i, n) in names.iter().enumerate() {
        let y = T + 15.0 + i as f64 * 18.0;
        let _ = writeln!(
            s,
            r#"<rect x="{}" y="{}" width="12" height="12" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            W - R + 10.0,
            y - 10.0,
            COLORS[i % COLORS.len()],
            W - R + 28.0,
            y,
            n
        );
    }
}

/// Lines over categorical x positions. `series`: (name, y per x).
pub fn lines(
    title: &str,
    xlabel: &str,
    ylabel: &str,
    xs: &[String],
    series: &[(String, Vec<f64>)],
    hline: Option<f64>,
) -> String {
    let mut s = header(title, xlabel, ylabel);
    let ymax = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .chain(hline)
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max)
        * 1.1;
    let ymax = if ymax <= 0.0 { 1.0 } else { ymax };
    y_axis(&mut s, ymax);
    let n = xs.len().max(1);
    let px = |i: usize| L + (W - L - R) * (i as f64 + 0.5) / n as f64;
    let py = |v: f64| H - B - (H - T - B) * v / ymax;
    for (i, x) in xs.iter().enumerate() {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{x}</text>"#,
            px(i),
            H - B + 16.0
        );
    }
    if let Some(h) = hline {
        let _ = writeln!(
            s,
            r##"<line x1="{L}" y1="{0}" x2="{1}" y2="{0}" stroke="#888" stroke-dasharray="4 3"/>"##,
            py(h),
            W - R
        );
    }
    for (k, (_, v)) in series.iter().enumerate() {
        let pts: Vec<String> = v
            .iter()
            .enumerate()
            .filter(|(_, y)| y.is_finite())
            .map(|(i, y)| format!("{:.1},{:.1}", px(i), py(*y)))
            .collect();
        let c = COLORS[k % COLORS.len()];
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        for p in &pts {
            let (x, y) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(s, r#"<circle cx="{x}" cy="{y}" r="3" fill="{c}"/>"#);
        }
    }
    legend(
        &mut s,
        &series.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
    );
    s.push_str("</svg>\n");
    s
}

/// Grouped bars: one group per x label, one bar per series.
pub fn bars(
    title: &str,
    xlabel: &str,
    ylabel: &str,
    xs: &[String],
    series: &[(String, Vec<f64>)],
    hline: Option<f64>,
) -> String {
    let mut s = header(title, xlabel, ylabel);
    let ymax = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .chain(hline)
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max)
        * 1.1;
    let ymax = if ymax <= 0.0 { 1.0 } else { ymax };
    y_axis(&mut s, ymax);
    let n = xs.len().max(1);
    let gw = (W - L - R) / n as f64;
    let bw = gw * 0.8 / series.len().max(1) as f64;
    let py = |v: f64| H - B - (H - T - B) * v / ymax;
    for (i, x) in xs.iter().enumerate() {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{x}</text>"#,
            L + gw * (i as f64 + 0.5),
            H - B + 16.0
        );
        for (k, (_, v)) in series.iter().enumerate() {
            let y = v.get(i).copied().unwrap_or(0.0);
            if !y.is_finite() {
                continue;
            }
            let _ = writeln!(
                s,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"/>"#,
                L + gw * i as f64 + gw * 0.1 + bw * k as f64,
                py(y),
                bw,
                (H - B) - py(y),
                COLORS[k % COLORS.len()]
            );
        }
    }
    if let Some(h) = hline {
        let _ = writeln!(
            s,
            r##"<line x1="{L}" y1="{0}" x2="{1}" y2="{0}" stroke="#888" stroke-dasharray="4 3"/>"##,
            py(h),
            W - R
        );
    }
    legend(
        &mut s,
        &series.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
    );
    s.push_str("</svg>\n");
    s
}
