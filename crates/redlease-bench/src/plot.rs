//! PNG plots next to the JSON file: one bar chart per scenario, and the handoff
//! latency distribution (CDF, log scale).

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::scenarios::Outcome;

const FONT_PATHS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/Library/Fonts/Arial.ttf",
];

const COLORS: [RGBColor; 4] = [
    RGBColor(120, 120, 120), // raw-redis
    RGBColor(200, 40, 40),   // redlease
    RGBColor(40, 90, 200),   // rslock
    RGBColor(90, 160, 230),  // rslock-10ms
];

fn color(contender: &str) -> RGBColor {
    match contender {
        "raw-redis" => COLORS[0],
        "redlease" => COLORS[1],
        "rslock" => COLORS[2],
        "redlease-fair" => RGBColor(240, 140, 40),
        _ => COLORS[3],
    }
}

/// Registers a system TrueType font for text; plots need one.
fn register_font() -> Result<(), String> {
    for path in FONT_PATHS {
        if let Ok(bytes) = std::fs::read(path) {
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            return plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                .map_err(|_| format!("cannot load font {path}"));
        }
    }
    Err("no TrueType font found (install fonts-dejavu-core)".into())
}

/// Writes every plot; returns the files written.
pub fn write_all(json: &Path, outcomes: &[Outcome]) -> Result<Vec<PathBuf>, String> {
    register_font()?;
    let stem = json.with_extension("");
    let mut files = Vec::new();
    for o in outcomes {
        let file = PathBuf::from(format!("{}-{}.png", stem.display(), o.name));
        bars(&file, o).map_err(|e| format!("{}: {e}", file.display()))?;
        files.push(file);
        if !o.samples.is_empty() {
            let file = PathBuf::from(format!("{}-{}-cdf.png", stem.display(), o.name));
            cdf(&file, o).map_err(|e| format!("{}: {e}", file.display()))?;
            files.push(file);
        }
    }
    Ok(files)
}

fn bars(file: &Path, o: &Outcome) -> Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::new(file, (900, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let names: Vec<&String> = o.results.keys().collect();
    let max = o.results.values().copied().fold(0.0f64, f64::max).max(1e-9);
    let caption = format!(
        "{} ({}, {})",
        o.name,
        o.unit,
        if o.higher_is_better {
            "higher is better"
        } else {
            "lower is better"
        }
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0..names.len(), 0.0..max * 1.15)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(names.len())
        .x_label_formatter(&|i| names.get(*i).map(|s| s.to_string()).unwrap_or_default())
        .y_desc(o.unit.as_str())
        .draw()?;
    for (i, name) in names.iter().enumerate() {
        let v = o.results[*name];
        let c = color(name);
        chart.draw_series(std::iter::once(Rectangle::new(
            [(i, 0.0), (i + 1, v)],
            c.filled(),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            format!("{v:.0}"),
            (i, v + max * 0.03),
            ("sans-serif", 16),
        )))?;
    }
    root.present()?;
    Ok(())
}

fn cdf(file: &Path, o: &Outcome) -> Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::new(file, (900, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let lo = o
        .samples
        .values()
        .flatten()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .max(1.0);
    let hi = o
        .samples
        .values()
        .flatten()
        .copied()
        .fold(0.0f64, f64::max)
        .max(lo * 10.0);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{}: distribution (µs, log scale)", o.name),
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((lo * 0.8..hi * 1.2).log_scale(), 0.0..1.0)?;
    chart
        .configure_mesh()
        .x_desc("µs from release to the next holder")
        .y_desc("fraction of handoffs")
        .draw()?;
    for (name, samples) in &o.samples {
        let mut s = samples.clone();
        s.sort_by(f64::total_cmp);
        let n = s.len() as f64;
        let c = color(name);
        chart
            .draw_series(LineSeries::new(
                s.iter().enumerate().map(|(i, v)| (*v, (i + 1) as f64 / n)),
                c.stroke_width(2),
            ))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    root.present()?;
    Ok(())
}
