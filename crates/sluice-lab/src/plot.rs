//! The experiments' charts, drawn with `plotters` into SVG text: lines or
//! grouped bars over categorical x positions, an optional dashed reference
//! line, and the legend to the right of the plot. Text stays `<text>` in the
//! SVG (no fonts are loaded).

use anyhow::{anyhow, Result};
use plotters::coord::ranged1d::{KeyPointHint, NoDefaultFormatting, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::ops::Range;

const W: u32 = 640;
const H: u32 = 360;
/// Width of the legend column on the right.
const LEGEND: u32 = 150;
const FONT: &str = "sans-serif";
const COLORS: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
];

fn color(k: usize) -> RGBColor {
    COLORS[k % COLORS.len()]
}

/// Data series: (name, one y per x position; non-finite values are skipped).
pub type Series = (String, Vec<f64>);

#[derive(Debug, Clone, Copy)]
enum Kind {
    Lines,
    Bars,
}

/// Lines over categorical x positions, one per series, with a dot per value.
pub fn lines(
    title: &str,
    xlabel: &str,
    ylabel: &str,
    xs: &[String],
    series: &[Series],
    hline: Option<f64>,
) -> Result<String> {
    chart(Kind::Lines, title, xlabel, ylabel, xs, series, hline)
}

/// Grouped bars: one group per x label, one bar per series.
pub fn bars(
    title: &str,
    xlabel: &str,
    ylabel: &str,
    xs: &[String],
    series: &[Series],
    hline: Option<f64>,
) -> Result<String> {
    chart(Kind::Bars, title, xlabel, ylabel, xs, series, hline)
}

/// Top of the y axis: the largest value (or reference line) plus 10 %.
fn y_max(series: &[Series], hline: Option<f64>) -> f64 {
    let m = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .chain(hline)
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max)
        * 1.1;
    if m > 0.0 {
        m
    } else {
        1.0
    }
}

fn tick(v: f64) -> String {
    if v.abs() >= 10000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// Categorical x axis: category `i` spans `[i, i + 1)`, and the axis' key
/// points (labels, ticks) are the centres `i + 0.5`.
#[derive(Debug, Clone, Copy)]
struct Categories {
    n: usize,
}

impl Categories {
    fn linear(&self) -> RangedCoordf64 {
        (0.0..self.n as f64).into()
    }
}

impl Ranged for Categories {
    type ValueType = f64;
    type FormatOption = NoDefaultFormatting;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.linear().map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, _hint: Hint) -> Vec<f64> {
        (0..self.n).map(|i| i as f64 + 0.5).collect()
    }

    fn range(&self) -> Range<f64> {
        self.linear().range()
    }
}

impl ValueFormatter<f64> for Categories {
    /// The chart labels categories through its own formatter; this is the
    /// fallback (the category index).
    fn format(value: &f64) -> String {
        format!("{}", value.floor())
    }
}

fn err<E: std::fmt::Debug>(what: &'static str) -> impl FnOnce(E) -> anyhow::Error {
    move |e| anyhow!("plot: {what}: {e:?}")
}

fn chart(
    kind: Kind,
    title: &str,
    xlabel: &str,
    ylabel: &str,
    xs: &[String],
    series: &[Series],
    hline: Option<f64>,
) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        root.fill(&WHITE).map_err(err("background"))?;
        let root = root.titled(title, (FONT, 16)).map_err(err("title"))?;
        let (plot_area, legend_area) = root.split_horizontally(W - LEGEND);
        draw(kind, &plot_area, xlabel, ylabel, xs, series, hline)?;
        legend(&legend_area, series)?;
        root.present().map_err(err("finish"))?;
    }
    Ok(svg)
}

fn draw(
    kind: Kind,
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    xlabel: &str,
    ylabel: &str,
    xs: &[String],
    series: &[Series],
    hline: Option<f64>,
) -> Result<()> {
    let n = xs.len().max(1);
    let ymax = y_max(series, hline);
    let mut chart = ChartBuilder::on(area)
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(Categories { n }, 0f64..ymax)
        .map_err(err("axes"))?;
    let x_label = |x: &f64| {
        let i = x.floor();
        if i >= 0.0 {
            // A float to integer cast saturates; out of range gives no label.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let i = i as usize;
            xs.get(i).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_labels(5)
        .max_light_lines(1)
        .x_label_formatter(&x_label)
        .y_label_formatter(&|y| tick(*y))
        .x_desc(xlabel)
        .y_desc(ylabel)
        .label_style((FONT, 12))
        .draw()
        .map_err(err("mesh"))?;
    if let Some(h) = hline {
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, h), (n as f64, h)],
                4,
                3,
                RGBColor(0x88, 0x88, 0x88).stroke_width(1),
            ))
            .map_err(err("reference line"))?;
    }
    let groups = series.len().max(1) as f64;
    for (k, (_, ys)) in series.iter().enumerate() {
        let c = color(k);
        match kind {
            Kind::Lines => {
                let pts: Vec<(f64, f64)> = ys
                    .iter()
                    .enumerate()
                    .filter(|(_, y)| y.is_finite())
                    .map(|(i, y)| (i as f64 + 0.5, *y))
                    .collect();
                chart
                    .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
                    .map_err(err("line"))?;
                chart
                    .draw_series(pts.iter().map(|p| Circle::new(*p, 3, c.filled())))
                    .map_err(err("points"))?;
            }
            Kind::Bars => {
                let bw = 0.8 / groups;
                chart
                    .draw_series(
                        ys.iter()
                            .enumerate()
                            .take(n)
                            .filter(|(_, y)| y.is_finite())
                            .map(|(i, y)| {
                                let x0 = i as f64 + 0.1 + bw * k as f64;
                                Rectangle::new([(x0, 0.0), (x0 + bw, *y)], c.filled())
                            }),
                    )
                    .map_err(err("bars"))?;
            }
        }
    }
    Ok(())
}

fn legend(area: &DrawingArea<SVGBackend<'_>, Shift>, series: &[Series]) -> Result<()> {
    for ((k, (name, _)), row) in series.iter().enumerate().zip(0i32..) {
        let y = 25 + row * 18;
        area.draw(&Rectangle::new([(10, y), (22, y + 12)], color(k).filled()))
            .map_err(err("legend"))?;
        area.draw(&Text::new(name.as_str(), (28, y), (FONT, 12)))
            .map_err(err("legend"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (Vec<String>, Vec<Series>) {
        (
            vec!["2".into(), "4".into(), "8".into()],
            vec![
                ("p99".into(), vec![120.0, 95.5, f64::NAN]),
                ("p99.9 <tail>".into(), vec![300.0, 210.0, 180.0]),
            ],
        )
    }

    /// The SVG parses as XML, has an `<svg>` root, and shows the title, the
    /// axis descriptions, the x labels and every series (legend text, and at
    /// least `min` `<shapes>` elements in the series' colour).
    fn check_svg(text: &str, shapes: &str, min: usize) {
        let doc = roxmltree::Document::parse(text).expect("well-formed SVG");
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        assert_eq!(
            root.tag_name().namespace(),
            Some("http://www.w3.org/2000/svg")
        );
        let texts: Vec<String> = doc
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text().map(|t| t.trim().to_string()))
            .collect();
        for want in ["Tail vs k", "k", "µs", "2", "4", "8", "p99", "p99.9 <tail>"] {
            assert!(
                texts.iter().any(|t| t == want),
                "no text `{want}` in {texts:?}"
            );
        }
        for c in ["#1F77B4", "#D62728"] {
            let n = doc
                .descendants()
                .filter(|n| n.has_tag_name(shapes))
                .filter(|n| {
                    ["stroke", "fill"]
                        .iter()
                        .any(|a| n.attribute(*a).is_some_and(|v| v.eq_ignore_ascii_case(c)))
                })
                .count();
            assert!(n >= min, "series colour {c}: {n} <{shapes}> elements");
        }
    }

    #[test]
    fn lines_render_to_a_valid_svg_file() {
        let (xs, s) = sample();
        let dir = std::env::temp_dir().join(format!("sluice-lab-plot-{}", std::process::id()));
        let svg = lines("Tail vs k", "k", "µs", &xs, &s, Some(100.0)).unwrap();
        crate::report::write(&dir, "ksplit-latency.svg", &svg).unwrap();
        let text = std::fs::read_to_string(dir.join("ksplit-latency.svg")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        check_svg(&text, "polyline", 1);
        check_svg(&text, "circle", 2);
    }

    #[test]
    fn bars_render_every_series() {
        let (xs, s) = sample();
        let svg = bars("Tail vs k", "k", "µs", &xs, &s, None).unwrap();
        check_svg(&svg, "rect", 3);
    }

    #[test]
    fn empty_series_still_render() {
        let svg = lines("t", "x", "y", &[], &[], None).unwrap();
        roxmltree::Document::parse(&svg).unwrap();
    }
}
