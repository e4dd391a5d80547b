//! Line charts as SVG images: the training loss curve, and the benchmarks' figures (log–log where a quantity spans
//! decades).

use std::fmt::Write;

/// A named polyline of (x, y) points.
pub struct Series<'a> {
    pub name: &'a str,
    pub color: &'a str,
    pub points: &'a [(f64, f64)],
}

/// A chart's title, axis names, and whether both axes are logarithmic (base 10).
pub struct Axes<'a> {
    pub title: &'a str,
    pub x: &'a str,
    pub y: &'a str,
    pub log: bool,
}

/// The training loss per step.
pub fn loss_svg(title: &str, series: &[Series]) -> String {
    line_svg(&Axes { title, x: "step", y: "loss", log: false }, series)
}

/// An SVG line chart of the series on shared axes; on log axes points with x or y ≤ 0 are left out.
pub fn line_svg(axes: &Axes, series: &[Series]) -> String {
    let (w, h, left, right, top, bottom) = (800.0, 480.0, 70.0, 20.0, 40.0, 50.0);
    let to_plot = |&(x, y): &(f64, f64)| -> Option<(f64, f64)> {
        match axes.log {
            true if x > 0.0 && y > 0.0 => Some((x.log10(), y.log10())),
            false if y.is_finite() => Some((x, y)),
            _ => None,
        }
        .filter(|(x, y)| x.is_finite() && y.is_finite())
    };
    let shown = |s: &Series| s.points.iter().filter_map(to_plot).collect::<Vec<_>>();
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in series.iter().flat_map(shown) {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    let (x1, y1) = (if x1 > x0 { x1 } else { x0 + 1.0 }, if y1 > y0 { y1 } else { y0 + 1.0 });
    let px = |x: f64| left + (x - x0) / (x1 - x0) * (w - left - right);
    let py = |y: f64| top + (y1 - y) / (y1 - y0) * (h - top - bottom);
    let value = |v: f64| if axes.log { 10f64.powf(v) } else { v };
    let title = axes.title;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="24" text-anchor="middle" font-size="16">{title}</text>
<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="black"/><line x1="{left}" y1="{top}" x2="{left}" y2="{}" stroke="black"/>
"#,
        w / 2.0,
        h - bottom,
        w - right,
        h - bottom,
        h - bottom
    );
    for i in 0..=5 {
        let (fx, fy) = (x0 + (x1 - x0) * i as f64 / 5.0, y0 + (y1 - y0) * i as f64 / 5.0);
        let (lx, ly) = (tick(value(fx), !axes.log), tick(value(fy), false));
        let _ = writeln!(svg, r#"<text x="{:.1}" y="{}" text-anchor="middle">{lx}</text>"#, px(fx), h - bottom + 18.0);
        let _ = writeln!(svg, r#"<text x="{}" y="{:.1}" text-anchor="end">{ly}</text>"#, left - 6.0, py(fy) + 4.0);
    }
    let _ = writeln!(svg, r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#, w / 2.0, h - 10.0, axes.x);
    let _ = writeln!(
        svg,
        r#"<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">{}</text>"#,
        h / 2.0,
        h / 2.0,
        axes.y
    );
    for (i, s) in series.iter().enumerate() {
        let pts: Vec<String> = shown(s).iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{}" stroke-width="1.5" points="{}"/>"#,
            s.color,
            pts.join(" ")
        );
        let ly = top + 16.0 * i as f64 + 10.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            w - 230.0,
            w - 210.0,
            s.color,
            w - 205.0,
            ly + 4.0,
            s.name
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// A tick label: a whole number when `whole`, else three significant digits (two decimals from 1 to 10).
fn tick(v: f64, whole: bool) -> String {
    if whole || v == 0.0 {
        return format!("{v:.0}");
    }
    let decimals = (2 - v.abs().log10().floor() as i64).clamp(0, 6) as usize;
    format!("{v:.decimals$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_every_series_inside_the_canvas() {
        let train = [(0.0, 4.2), (1.0, 3.0), (2.0, 2.5)];
        let val = [(0.0, 4.3), (2.0, 2.7)];
        let svg = loss_svg(
            "loss",
            &[
                Series { name: "train", color: "blue", points: &train },
                Series { name: "val", color: "red", points: &val },
            ],
        );
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains(">val</text>"));
        assert!(svg.contains("70.0,61.7 "), "train starts on the y axis below the top");
        assert!(svg.contains("70.0,40.0 "), "the highest loss touches the top of the plot");
    }

    #[test]
    fn log_axes_space_decades_evenly_and_label_values() {
        let points = [(10.0, 0.001), (100.0, 0.01), (1000.0, 0.1), (0.0, 1.0)];
        let axes = Axes { title: "t", x: "T", y: "s", log: true };
        let svg = line_svg(&axes, &[Series { name: "a", color: "red", points: &points }]);
        assert!(svg.contains(r#"points="70.0,430.0 425.0,235.0 780.0,40.0""#), "{svg}");
        assert!(svg.contains(">1000</text>") && svg.contains(">0.100</text>") && svg.contains(">0.00100</text>"));
    }
}
