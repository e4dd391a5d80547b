//! The loss curve as an SVG image: training loss per step, and the train / val evaluation points.

use std::fmt::Write;

/// A named polyline of (step, loss) points.
pub struct Series<'a> {
    pub name: &'a str,
    pub color: &'a str,
    pub points: &'a [(f64, f64)],
}

/// An SVG line chart of the series on shared axes.
pub fn loss_svg(title: &str, series: &[Series]) -> String {
    let (w, h, left, right, top, bottom) = (800.0, 480.0, 70.0, 20.0, 40.0, 50.0);
    let all = series.iter().flat_map(|s| s.points.iter()).filter(|p| p.1.is_finite());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    let (x1, y1) = (if x1 > x0 { x1 } else { x0 + 1.0 }, if y1 > y0 { y1 } else { y0 + 1.0 });
    let px = |x: f64| left + (x - x0) / (x1 - x0) * (w - left - right);
    let py = |y: f64| top + (y1 - y) / (y1 - y0) * (h - top - bottom);
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
        let _ =
            writeln!(svg, r#"<text x="{:.1}" y="{}" text-anchor="middle">{fx:.0}</text>"#, px(fx), h - bottom + 18.0);
        let _ = writeln!(svg, r#"<text x="{}" y="{:.1}" text-anchor="end">{fy:.2}</text>"#, left - 6.0, py(fy) + 4.0);
    }
    let _ = writeln!(svg, r#"<text x="{}" y="{}" text-anchor="middle">step</text>"#, w / 2.0, h - 10.0);
    for (i, s) in series.iter().enumerate() {
        let pts: Vec<String> =
            s.points.iter().filter(|p| p.1.is_finite()).map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
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
            w - 150.0,
            w - 130.0,
            s.color,
            w - 125.0,
            ly + 4.0,
            s.name
        );
    }
    svg.push_str("</svg>\n");
    svg
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
}
