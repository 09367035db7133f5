//! Sweep plots (plotters): output tok/s, TTFT p50/p99 and ITL p50/p99 against the swept
//! value, and throughput against latency; each as PNG and SVG.
//!
//! plotters measures text with a TrueType font it is given (the pure-Rust ab_glyph backend,
//! no fontconfig), so a system font is loaded once: `TOKENMILL_PLOT_FONT`, else a common
//! sans font, else the first .ttf under /usr/share/fonts. Without any font no chart can be
//! laid out; the CSV/JSON summaries are still written and the skip is reported.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::BenchError;
use crate::sweep::{SweepAxis, SweepRow};

const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation/LiberationSans-Regular.ttf",
    "/Library/Fonts/Arial.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];

fn find_font_file() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("TOKENMILL_PLOT_FONT") {
        return Some(PathBuf::from(path));
    }
    if let Some(found) = FONT_CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
    {
        return Some(found);
    }
    let mut pending = vec![PathBuf::from("/usr/share/fonts")];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                pending.push(path);
            } else if path
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("ttf"))
            {
                return Some(path);
            }
        }
    }
    None
}

/// Registers a system font as plotters' "sans-serif" once; the path used, or why none.
fn ensure_font() -> Result<&'static Path, &'static str> {
    static FONT: OnceLock<Result<PathBuf, &'static str>> = OnceLock::new();
    FONT.get_or_init(|| {
        let path = find_font_file().ok_or("no TrueType font found (set TOKENMILL_PLOT_FONT)")?;
        let bytes = std::fs::read(&path).map_err(|_| "the font file could not be read")?;
        // plotters keeps registered fonts for the whole process; one font is leaked once.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| "the font file is not a usable TrueType font")?;
        Ok(path)
    })
    .as_ref()
    .map(PathBuf::as_path)
    .map_err(|reason| *reason)
}

/// One chart: named series of (x, y) points, optional per-point labels.
struct ChartSpec {
    title: String,
    x_label: String,
    y_label: String,
    series: Vec<(String, Vec<(f64, f64)>)>,
    point_labels: Vec<String>,
}

fn padded_range(
    values: impl Iterator<Item = f64> + Clone,
    from_zero: bool,
) -> std::ops::Range<f64> {
    let finite = values.filter(|v| v.is_finite());
    let min = finite.clone().fold(f64::INFINITY, f64::min);
    let max = finite.fold(f64::NEG_INFINITY, f64::max);
    if !min.is_finite() {
        return 0.0..1.0;
    }
    let low = if from_zero { 0.0_f64.min(min) } else { min };
    let span = (max - low).max(max.abs() * 0.1).max(1e-9);
    let pad = span * 0.08;
    (if from_zero { low } else { low - pad })..(max + pad)
}

fn draw_chart<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    spec: &ChartSpec,
) -> Result<(), String> {
    let error = |err: DrawingAreaErrorKind<DB::ErrorType>| err.to_string();
    root.fill(&WHITE).map_err(error)?;
    let points = spec.series.iter().flat_map(|(_, pts)| pts.iter().copied());
    let x_range = padded_range(points.clone().map(|(x, _)| x), false);
    let y_range = padded_range(points.map(|(_, y)| y), true);
    let mut chart = ChartBuilder::on(&root)
        .caption(&spec.title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(x_range, y_range)
        .map_err(error)?;
    chart
        .configure_mesh()
        .x_desc(spec.x_label.as_str())
        .y_desc(spec.y_label.as_str())
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(error)?;
    let palette = [BLUE, RED, GREEN, MAGENTA];
    for (index, (name, series)) in spec.series.iter().enumerate() {
        let color = palette[index % palette.len()];
        chart
            .draw_series(LineSeries::new(
                series.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(error)?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                series
                    .iter()
                    .map(|&(x, y)| Circle::new((x, y), 4, color.filled())),
            )
            .map_err(error)?;
        if index == 0 && !spec.point_labels.is_empty() {
            chart
                .draw_series(
                    series
                        .iter()
                        .zip(&spec.point_labels)
                        .map(|(&(x, y), label)| {
                            Text::new(label.clone(), (x, y), ("sans-serif", 13).into_font())
                        }),
                )
                .map_err(error)?;
        }
    }
    if spec.series.len() > 1 {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(error)?;
    }
    root.present().map_err(error)
}

fn render(dir: &Path, name: &str, spec: &ChartSpec) -> Result<Vec<PathBuf>, BenchError> {
    let size = (900, 560);
    let png = dir.join(format!("{name}.png"));
    draw_chart(BitMapBackend::new(&png, size).into_drawing_area(), spec).map_err(|message| {
        BenchError::Plot {
            path: png.clone(),
            message,
        }
    })?;
    let svg = dir.join(format!("{name}.svg"));
    draw_chart(SVGBackend::new(&svg, size).into_drawing_area(), spec).map_err(|message| {
        BenchError::Plot {
            path: svg.clone(),
            message,
        }
    })?;
    Ok(vec![png, svg])
}

fn axis_text(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value}")
    }
}

/// Draws the four sweep charts into `dir`; returns the files written (none, with a printed
/// reason, when no font is available).
pub fn draw_sweep_plots(
    dir: &Path,
    stem: &str,
    axis: SweepAxis,
    rows: &[SweepRow],
) -> Result<Vec<PathBuf>, BenchError> {
    if let Err(reason) = ensure_font() {
        println!("Plots skipped: {reason}. The sweep summary CSV/JSON has every number.");
        return Ok(Vec::new());
    }
    let along = |value: fn(&SweepRow) -> f64| {
        rows.iter()
            .map(|row| (row.axis_value, value(row)))
            .collect::<Vec<_>>()
    };
    let x_label = axis.label().to_string();
    let charts = [
        (
            "output_throughput",
            ChartSpec {
                title: format!("Output token throughput vs {}", axis.label()),
                x_label: x_label.clone(),
                y_label: "output tokens/s".into(),
                series: vec![("output tok/s".into(), along(|r| r.output_throughput))],
                point_labels: Vec::new(),
            },
        ),
        (
            "ttft",
            ChartSpec {
                title: format!("Time to first token vs {}", axis.label()),
                x_label: x_label.clone(),
                y_label: "TTFT (ms)".into(),
                series: vec![
                    ("TTFT p50".into(), along(|r| r.ttft.p50_ms)),
                    ("TTFT p99".into(), along(|r| r.ttft.p99_ms)),
                ],
                point_labels: Vec::new(),
            },
        ),
        (
            "itl",
            ChartSpec {
                title: format!("Inter-token latency vs {}", axis.label()),
                x_label: x_label.clone(),
                y_label: "ITL (ms)".into(),
                series: vec![
                    ("ITL p50".into(), along(|r| r.itl.p50_ms)),
                    ("ITL p99".into(), along(|r| r.itl.p99_ms)),
                ],
                point_labels: Vec::new(),
            },
        ),
        (
            "throughput_vs_latency",
            ChartSpec {
                title: "Output throughput vs time per output token".into(),
                x_label: "TPOT p50 (ms)".into(),
                y_label: "output tokens/s".into(),
                series: vec![(
                    "output tok/s".into(),
                    rows.iter()
                        .map(|r| (r.tpot.p50_ms, r.output_throughput))
                        .collect(),
                )],
                point_labels: rows
                    .iter()
                    .map(|r| format!("  {}", axis_text(r.axis_value)))
                    .collect(),
            },
        ),
    ];
    let mut files = Vec::new();
    for (name, spec) in &charts {
        files.extend(render(dir, &format!("{stem}-{name}"), spec)?);
    }
    Ok(files)
}
