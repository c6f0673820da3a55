//! SVG charts of a run, written beside `results.md`: for each guard, throughput against
//! operations in flight beside its peers and Redis's ceiling for the same script, and the
//! latency percentiles. SVG text only (plotters without its font features): no system font
//! is needed to draw them, and the browser showing them picks one.

use std::error::Error;
use std::path::Path;

use plotters::prelude::*;

use crate::Row;

/// One chart per guard: its file name, title, and the cases it shows (by the start of their
/// names; peers included).
const CHARTS: [(&str, &str, &[&str]); 5] = [
    (
        "rate",
        "GCRA check, random keys",
        &["rate gcra random keys", "peer rate-limiter-flexible"],
    ),
    (
        "lock",
        "Lock acquire+release, random keys",
        &[
            "lock acquire+release random keys",
            "peer redlock acquire+release",
            "peer rslock acquire+release",
        ],
    ),
    (
        "lock-contended",
        "One lock, contenders (sections/s)",
        &[
            "lock one key",
            "peer redlock one key",
            "peer rslock one key",
        ],
    ),
    (
        "idempotency",
        "Idempotency",
        &["idempotency replay (", "idempotency first (begin+finish) ("],
    ),
    (
        "in-process",
        "In-process GCRA, 1M live keys (x: threads)",
        &["gcra in-process, 1M", "peer governor in-process, 1M"],
    ),
];

/// A line: one case on one store, by operations in flight.
struct Series<'a> {
    label: String,
    rows: Vec<&'a Row>,
}

/// Writes `<guard>-throughput.svg` and `<guard>-latency.svg` into `dir` for every guard
/// with rows in this run.
pub(crate) fn write(dir: &Path, rows: &[Row]) -> Result<(), Box<dyn Error>> {
    for (name, title, cases) in CHARTS {
        let series = series(rows, cases);
        if series.is_empty() {
            continue;
        }
        throughput(&dir.join(format!("{name}-throughput.svg")), title, &series)?;
        latency(&dir.join(format!("{name}-latency.svg")), title, &series)?;
    }
    Ok(())
}

fn series<'a>(rows: &'a [Row], cases: &[&str]) -> Vec<Series<'a>> {
    let mut series: Vec<Series<'a>> = Vec::new();
    for row in rows
        .iter()
        .filter(|r| cases.iter().any(|c| r.case.starts_with(c)))
    {
        let label = format!("{} @{}", row.case, row.store);
        match series.iter_mut().find(|s| s.label == label) {
            Some(line) => line.rows.push(row),
            None => series.push(Series {
                label,
                rows: vec![row],
            }),
        }
    }
    series
}

/// In flight on a log2 axis: 1, 16 and 64 evenly apart from their neighbours' ratios.
fn x(row: &Row) -> f64 {
    (row.in_flight.max(1) as f64).log2()
}

/// The label of a point of the x axis: the in-flight count at whole powers of two only.
fn in_flight(x: &f64) -> String {
    if (x - x.round()).abs() < 1e-9 {
        format!("{:.0}", x.exp2())
    } else {
        String::new()
    }
}

fn x_range(series: &[Series<'_>]) -> std::ops::Range<f64> {
    let xs = || series.iter().flat_map(|s| s.rows.iter().map(|r| x(r)));
    let hi = xs().fold(0.0, f64::max);
    -0.3..hi + 0.3
}

/// A log range around every value, with a margin.
fn y_range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values
        .filter(|v| *v > 0.0)
        .fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if hi == 0.0 {
        return 1.0..10.0;
    }
    lo / 2.0..hi * 2.0
}

fn throughput(path: &Path, title: &str, series: &[Series<'_>]) -> Result<(), Box<dyn Error>> {
    let ceilings: Vec<f64> = {
        let mut all: Vec<f64> = series
            .iter()
            .flat_map(|s| s.rows.iter().filter_map(|r| r.ceiling))
            .collect();
        all.sort_by(f64::total_cmp);
        all.dedup();
        all
    };
    let values = series
        .iter()
        .flat_map(|s| s.rows.iter().map(|r| r.sample.ops_per_sec))
        .chain(ceilings.iter().copied());
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let xr = x_range(series);
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("{title}: throughput"), ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(xr.clone(), y_range(values).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("in flight")
        .y_desc("operations/s")
        .x_labels(8)
        .x_label_formatter(&in_flight)
        .y_label_formatter(&|y| si(*y))
        .draw()?;
    for (i, line) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points: Vec<(f64, f64)> = line
            .rows
            .iter()
            .map(|r| (x(r), r.sample.ops_per_sec))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(&line.label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 3, color.filled())),
        )?;
    }
    for ceiling in ceilings {
        let points = [(xr.start, ceiling), (xr.end, ceiling)];
        chart
            .draw_series(DashedLineSeries::new(points, 6, 4, BLACK.stroke_width(1)))?
            .label(format!("Redis ceiling (-c 16 -P 16): {}", si(ceiling)))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], BLACK));
    }
    legend(&mut chart)?;
    root.present()?;
    Ok(())
}

fn latency(path: &Path, title: &str, series: &[Series<'_>]) -> Result<(), Box<dyn Error>> {
    let values = series.iter().flat_map(|s| {
        s.rows
            .iter()
            .flat_map(|r| [r.sample.p50_us, r.sample.p99_us])
    });
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{title}: latency, p50 (solid) and p99 (dashed)"),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x_range(series), y_range(values).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("in flight")
        .y_desc("µs")
        .x_labels(8)
        .x_label_formatter(&in_flight)
        .y_label_formatter(&|y| si(*y))
        .draw()?;
    for (i, line) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let at = |pick: fn(&Row) -> f64| -> Vec<(f64, f64)> {
            line.rows.iter().map(|r| (x(r), pick(r))).collect()
        };
        chart
            .draw_series(LineSeries::new(
                at(|r| r.sample.p50_us),
                color.stroke_width(2),
            ))?
            .label(&line.label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
        chart.draw_series(DashedLineSeries::new(
            at(|r| r.sample.p99_us),
            6,
            4,
            color.stroke_width(2),
        ))?;
    }
    legend(&mut chart)?;
    root.present()?;
    Ok(())
}

fn legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<
        'a,
        DB,
        Cartesian2d<
            plotters::coord::types::RangedCoordf64,
            plotters::coord::combinators::LogCoord<f64>,
        >,
    >,
) -> Result<(), Box<dyn Error>>
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 12))
        .draw()?;
    Ok(())
}

/// 1234567 as "1.2M", 950 as "950".
fn si(v: f64) -> String {
    match v {
        v if v >= 1e6 => format!("{:.1}M", v / 1e6),
        v if v >= 1e3 => format!("{:.0}k", v / 1e3),
        v if v >= 10.0 => format!("{v:.0}"),
        v => format!("{v:.1}"),
    }
}
