//! Plots of a comparison's runs, one run being one card model under one driver policy.
//! `write_plots` draws four plots, each as `NAME.png` and `NAME.svg`:
//!
//! - `latency-cdf`: cumulative distribution of request latency (complete − submit), reads
//!   and writes as separate lines (solid for reads, dashed for writes), µs on a log scale;
//! - `throughput`: MB/s (10^6 bytes/s) against card time in s, in bins of equal width;
//! - `latency-offset`: the flashbench view, latency (µs, log scale) against offset (MiB),
//!   reads as dots and writes as crosses, subsampled when a run has many requests;
//! - `packing`: the driver's write packing histogram as grouped bars.
//!
//! Every plot has its legend below the chart, so it never covers data, naming each run by
//! its label in the run's colour; a run keeps its colour in every plot.
//!
//! Output is deterministic, byte for byte: the plots are committed as documentation.
//!
//! Text is drawn with a font compiled into the binary, not found on the system: plotters
//! is built without its default `ttf` feature (font-kit and fontconfig, system libraries)
//! and with `ab_glyph`, which draws from font bytes registered at run time. The bytes are
//! Noto Sans Regular from the `ttf-noto-sans` crate: a 0.5 MB crate without dependencies
//! whose font is under Apache-2.0, the licence the project already offers. The
//! alternatives were worse: the `dejavu` crate downloads 5.5 MB of font variants for one
//! face, a font file in the repository adds 0.75 MB to its history, and Debian's
//! fonts-dejavu-core would be a system dependency again.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{register_font, FontStyle};

/// One completed block request of a run, in card time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub submit_ns: u64,
    pub complete_ns: u64,
    /// Bytes.
    pub offset: u64,
    /// Bytes.
    pub len: u32,
    pub write: bool,
}

/// One run: a model under one driver policy.
#[derive(Debug, Clone)]
pub struct Series {
    /// e.g. "toshiba-mmc32g · packing=always" — names model and policy, used in legends.
    pub label: String,
    pub samples: Vec<Sample>,
    /// Write packing histogram: (requests per packed command, how many times), as the
    /// driver counted it. Empty when packing was off.
    pub packing: Vec<(usize, u64)>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// `write_plots` was given no series.
    #[error("no runs to plot")]
    NoSeries,
    /// No series has a sample: there is nothing to scale the axes to.
    #[error("no run has a completed request to plot")]
    NoSamples,
    /// The embedded font was rejected by the font parser.
    #[error("the embedded font could not be loaded")]
    Font,
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// plotters failed while drawing or writing the file.
    #[error("drawing {}: {message}", path.display())]
    Draw { path: PathBuf, message: String },
}

/// Image width, pixels.
const WIDTH: u32 = 1200;
/// Height of the chart (caption, axes, data) above the legend, pixels; the legend adds
/// `legend_height` below it.
const CHART_HEIGHT: u32 = 640;
/// The family name the embedded font is registered under; SVG viewers use their own.
const FONT: &str = "sans-serif";
/// Colours of the runs, in order, repeating after ten (the "tableau 10" palette).
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];
/// At most this many points per CDF line: quantiles evenly spaced in rank, enough for a
/// smooth line at this width while keeping the SVG small.
const CDF_POINTS: usize = 1000;
/// The throughput plot cuts the longest run into this many bins...
const THROUGHPUT_BINS: u64 = 100;
/// ...but no bin is shorter than this (1 ms), so a short run is not cut into bins holding
/// one request each.
const MIN_BIN_NS: u64 = 1_000_000;
/// The scatter plot shows at most this many requests of one run...
const SCATTER_MAX_PER_SERIES: usize = 20_000;
/// ...and at most this many over all runs, which bounds the SVG to about 5 MB (about
/// 115 bytes a point).
const SCATTER_BUDGET: usize = 40_000;

/// Colour of the minor grid lines: they guide the eye without competing with the data.
const LIGHT_GRID: RGBColor = RGBColor(238, 238, 238);

const LEGEND_ROW: u32 = 26;
const LEGEND_PAD: u32 = 10;

/// The plots, in the order their files are returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plot {
    LatencyCdf,
    Throughput,
    LatencyOffset,
    Packing,
}

impl Plot {
    const ALL: [Plot; 4] = [
        Plot::LatencyCdf,
        Plot::Throughput,
        Plot::LatencyOffset,
        Plot::Packing,
    ];

    /// File name without extension.
    fn name(self) -> &'static str {
        match self {
            Plot::LatencyCdf => "latency-cdf",
            Plot::Throughput => "throughput",
            Plot::LatencyOffset => "latency-offset",
            Plot::Packing => "packing",
        }
    }

    /// What the caption calls the plot.
    fn caption(self) -> &'static str {
        match self {
            Plot::LatencyCdf => "latency CDF",
            Plot::Throughput => "throughput",
            Plot::LatencyOffset => "latency against offset",
            Plot::Packing => "write packing",
        }
    }
}

/// Writes the plots into `dir` (created if missing); returns the files written: for each
/// plot in the order latency-cdf, throughput, latency-offset, packing, its PNG then its SVG.
///
/// The same eight files are written for any input that has a sample: when no run has a
/// packing histogram, `packing` holds the note "packing off in every run" instead of bars.
/// A run without samples is named in the legends as having none. No runs at all is
/// `PlotError::NoSeries`, and runs none of which has a sample is `PlotError::NoSamples`;
/// nothing is written then.
pub fn write_plots(dir: &Path, title: &str, series: &[Series]) -> Result<Vec<PathBuf>, PlotError> {
    if series.is_empty() {
        return Err(PlotError::NoSeries);
    }
    if series.iter().all(|s| s.samples.is_empty()) {
        return Err(PlotError::NoSamples);
    }
    load_font()?;
    std::fs::create_dir_all(dir).map_err(|source| PlotError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let data = Prepared::new(series);
    let mut files = Vec::with_capacity(2 * Plot::ALL.len());
    for plot in Plot::ALL {
        let caption = if title.is_empty() {
            plot.caption().to_string()
        } else {
            format!("{title} — {}", plot.caption())
        };
        let legend = data.legend(plot);
        let size = (WIDTH, CHART_HEIGHT + legend_height(legend.len()));

        let png = dir.join(format!("{}.png", plot.name()));
        let root = BitMapBackend::new(&png, size).into_drawing_area();
        draw(plot, &root, &caption, &data, &legend)
            .and_then(|()| root.present().map_err(message))
            .map_err(|message| PlotError::Draw {
                path: png.clone(),
                message,
            })?;
        drop(root);
        files.push(png);

        let svg = dir.join(format!("{}.svg", plot.name()));
        let root = SVGBackend::new(&svg, size).into_drawing_area();
        draw(plot, &root, &caption, &data, &legend)
            .and_then(|()| root.present().map_err(message))
            .map_err(|message| PlotError::Draw {
                path: svg.clone(),
                message,
            })?;
        drop(root);
        files.push(svg);
    }
    Ok(files)
}

/// Registers the embedded font with plotters, once per process.
fn load_font() -> Result<(), PlotError> {
    static LOADED: OnceLock<bool> = OnceLock::new();
    let ok = *LOADED
        .get_or_init(|| register_font(FONT, FontStyle::Normal, ttf_noto_sans::REGULAR).is_ok());
    if ok {
        Ok(())
    } else {
        Err(PlotError::Font)
    }
}

fn message<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Latency of a sample in µs, at least 1 ns so that it has a place on a log scale.
fn latency_us(s: &Sample) -> f64 {
    s.complete_ns.saturating_sub(s.submit_ns).max(1) as f64 / 1e3
}

/// How a legend entry marks its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    Line,
    Dashed,
    Dot,
    Cross,
    Bar,
    /// No mark: the entry only says something about the run (no samples, packing off).
    Nothing,
}

#[derive(Debug, Clone)]
struct LegendEntry {
    label: String,
    color: RGBColor,
    mark: Mark,
}

/// Legend columns for `entries` entries: two, so that a run's read and write lines share
/// a row, and three when there are many.
fn legend_columns(entries: usize) -> u32 {
    if entries > 16 {
        3
    } else {
        2
    }
}

/// Height of the legend below the chart, pixels.
fn legend_height(entries: usize) -> u32 {
    let rows = (entries as u32).div_ceil(legend_columns(entries));
    rows * LEGEND_ROW + 2 * LEGEND_PAD
}

fn color(index: usize) -> RGBColor {
    PALETTE[index % PALETTE.len()]
}

/// What the plots draw, computed once for both the PNG and the SVG.
struct Prepared<'a> {
    series: &'a [Series],
    /// Latency axis, µs: (low, high), both > 0.
    latency_range: (f64, f64),
    /// Per run: the CDF points (µs, %) of its reads and of its writes.
    cdf: Vec<[Vec<(f64, f64)>; 2]>,
    /// Per run: throughput steps (s, MB/s).
    throughput: Vec<Vec<(f64, f64)>>,
    /// Width of a throughput bin, ns.
    bin_ns: u64,
    /// End of the time axis, s.
    time_end_s: f64,
    /// Highest throughput of any bin, MB/s.
    throughput_max: f64,
    /// Per run: the requests shown, (MiB, µs, write).
    scatter: Vec<Vec<(f64, f64, bool)>>,
    /// Most requests shown of one run, when some run has more than that; None when every
    /// request is shown.
    scatter_cap: Option<usize>,
    /// End of the offset axis, MiB.
    offset_end_mib: f64,
}

impl<'a> Prepared<'a> {
    fn new(series: &'a [Series]) -> Prepared<'a> {
        let mut lo = f64::INFINITY;
        let mut hi = 0f64;
        for s in series.iter().flat_map(|s| &s.samples) {
            let l = latency_us(s);
            lo = lo.min(l);
            hi = hi.max(l);
        }
        if lo > hi {
            // No samples at all; the caller rejects that, but keep the range valid.
            lo = 1.0;
            hi = 1.0;
        }
        let latency_range = (lo / 1.3, hi * 1.3);

        let cdf = series
            .iter()
            .map(|s| [cdf_points(s, false), cdf_points(s, true)])
            .collect();

        let end_ns = series
            .iter()
            .flat_map(|s| &s.samples)
            .map(|s| s.complete_ns)
            .max()
            .unwrap_or(0);
        let bin_ns = end_ns.div_ceil(THROUGHPUT_BINS).max(MIN_BIN_NS);
        let bins = end_ns.div_ceil(bin_ns).max(1);
        let throughput: Vec<Vec<(f64, f64)>> =
            series.iter().map(|s| throughput_steps(s, bin_ns)).collect();
        let throughput_max = throughput
            .iter()
            .flatten()
            .map(|&(_, v)| v)
            .fold(0f64, f64::max);

        let cap = SCATTER_MAX_PER_SERIES
            .min(SCATTER_BUDGET / series.len())
            .max(1);
        let scatter = series.iter().map(|s| scatter_points(s, cap)).collect();
        let scatter_cap = series.iter().any(|s| s.samples.len() > cap).then_some(cap);
        let offset_end = series
            .iter()
            .flat_map(|s| &s.samples)
            .map(|s| s.offset.saturating_add(u64::from(s.len)))
            .max()
            .unwrap_or(0);

        Prepared {
            series,
            latency_range,
            cdf,
            throughput,
            bin_ns,
            time_end_s: (bins * bin_ns) as f64 / 1e9,
            throughput_max,
            scatter,
            scatter_cap,
            offset_end_mib: (offset_end as f64 / 1048576.0).max(1.0),
        }
    }

    fn legend(&self, plot: Plot) -> Vec<LegendEntry> {
        let mut entries = Vec::new();
        for (i, s) in self.series.iter().enumerate() {
            let c = color(i);
            let entry = |suffix: &str, mark| LegendEntry {
                label: if suffix.is_empty() {
                    s.label.clone()
                } else {
                    format!("{} — {suffix}", s.label)
                },
                color: c,
                mark,
            };
            if plot == Plot::Packing {
                if s.packing.is_empty() {
                    entries.push(entry("packing off", Mark::Nothing));
                } else {
                    entries.push(entry("", Mark::Bar));
                }
                continue;
            }
            if s.samples.is_empty() {
                entries.push(entry("no samples", Mark::Nothing));
                continue;
            }
            let reads = s.samples.iter().any(|x| !x.write);
            let writes = s.samples.iter().any(|x| x.write);
            match plot {
                Plot::LatencyCdf => {
                    if reads {
                        entries.push(entry("read", Mark::Line));
                    }
                    if writes {
                        entries.push(entry("write", Mark::Dashed));
                    }
                }
                Plot::LatencyOffset => {
                    if reads {
                        entries.push(entry("read", Mark::Dot));
                    }
                    if writes {
                        entries.push(entry("write", Mark::Cross));
                    }
                }
                Plot::Throughput => entries.push(entry("", Mark::Line)),
                Plot::Packing => {}
            }
        }
        entries
    }
}

/// The CDF of one run's reads (`write` false) or writes: points (µs, % of requests at or
/// below), at most `CDF_POINTS` of them, always including the fastest and the slowest.
fn cdf_points(s: &Series, write: bool) -> Vec<(f64, f64)> {
    let mut lat: Vec<u64> = s
        .samples
        .iter()
        .filter(|x| x.write == write)
        .map(|x| x.complete_ns.saturating_sub(x.submit_ns).max(1))
        .collect();
    lat.sort_unstable();
    let n = lat.len();
    let point = |i: usize| (lat[i] as f64 / 1e3, 100.0 * (i + 1) as f64 / n as f64);
    if n <= CDF_POINTS {
        (0..n).map(point).collect()
    } else {
        (0..CDF_POINTS)
            .map(|j| point(j * (n - 1) / (CDF_POINTS - 1)))
            .collect()
    }
}

/// One run's throughput as steps (s, MB/s): each request's bytes count in the bin of its
/// completion; the steps end with the bin of the run's last completion.
fn throughput_steps(s: &Series, bin_ns: u64) -> Vec<(f64, f64)> {
    let Some(last) = s.samples.iter().map(|x| x.complete_ns).max() else {
        return Vec::new();
    };
    let mut bytes = vec![0u64; (last / bin_ns) as usize + 1];
    for x in &s.samples {
        bytes[(x.complete_ns / bin_ns) as usize] += u64::from(x.len);
    }
    let bin_s = bin_ns as f64 / 1e9;
    let mut steps = Vec::with_capacity(2 * bytes.len());
    for (i, &b) in bytes.iter().enumerate() {
        let mbps = b as f64 / bin_s / 1e6;
        steps.push((i as f64 * bin_s, mbps));
        steps.push(((i + 1) as f64 * bin_s, mbps));
    }
    steps
}

/// The requests of one run shown in the scatter plot, (MiB, µs, write): all of them, or
/// `cap` of them evenly spaced in submission order.
fn scatter_points(s: &Series, cap: usize) -> Vec<(f64, f64, bool)> {
    let n = s.samples.len();
    let point = |x: &Sample| (x.offset as f64 / 1048576.0, latency_us(x), x.write);
    if n <= cap {
        s.samples.iter().map(point).collect()
    } else {
        (0..cap).map(|j| point(&s.samples[j * n / cap])).collect()
    }
}

/// Tick label: no more digits than the value needs.
fn tick(v: f64) -> String {
    let a = v.abs();
    let s = if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// The caption's font: 28 px, or smaller down to 14 px until `caption` fits the width of
/// `area` (a longer one is clipped at 14 px).
fn caption_font<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    caption: &str,
) -> Result<FontDesc<'static>, String> {
    let room = area.dim_in_pixel().0.saturating_sub(24);
    for size in (15..=28).rev() {
        let font = (FONT, size).into_font();
        let (w, _) = area
            .estimate_text_size(caption, &TextStyle::from(font.clone()))
            .map_err(message)?;
        if w <= room {
            return Ok(font);
        }
    }
    Ok((FONT, 14).into_font())
}

/// A chart in `area` laid out as every plot is: the caption sized to fit, margins, room
/// for the axis labels.
fn chart_in<'a, 'b, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    caption: &str,
) -> Result<ChartBuilder<'a, 'b, DB>, String> {
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(caption, caption_font(area, caption)?)
        .margin(12)
        .margin_right(40)
        .x_label_area_size(56)
        .y_label_area_size(80);
    Ok(builder)
}

fn draw<DB: DrawingBackend>(
    plot: Plot,
    root: &DrawingArea<DB, Shift>,
    caption: &str,
    data: &Prepared,
    legend: &[LegendEntry],
) -> Result<(), String> {
    root.fill(&WHITE).map_err(message)?;
    let (chart, legend_area) = root.split_vertically(CHART_HEIGHT);
    match plot {
        Plot::LatencyCdf => draw_cdf(&chart, caption, data)?,
        Plot::Throughput => draw_throughput(&chart, caption, data)?,
        Plot::LatencyOffset => draw_scatter(&chart, caption, data)?,
        Plot::Packing => draw_packing(&chart, caption, data)?,
    }
    draw_legend(&legend_area, legend)
}

fn draw_cdf<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    caption: &str,
    data: &Prepared,
) -> Result<(), String> {
    let (lo, hi) = data.latency_range;
    let mut chart = chart_in(area, caption)?
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..100f64)
        .map_err(message)?;
    chart
        .configure_mesh()
        .x_desc("latency (µs, log scale)")
        .y_desc("requests at or below (%)")
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .light_line_style(LIGHT_GRID)
        .max_light_lines(4)
        .axis_desc_style((FONT, 20))
        .label_style((FONT, 18))
        .draw()
        .map_err(message)?;
    for (i, [reads, writes]) in data.cdf.iter().enumerate() {
        let style = color(i).stroke_width(2);
        chart
            .draw_series(LineSeries::new(reads.iter().copied(), style))
            .map_err(message)?;
        chart
            .draw_series(DashedLineSeries::new(writes.iter().copied(), 10, 6, style))
            .map_err(message)?;
    }
    Ok(())
}

fn draw_throughput<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    caption: &str,
    data: &Prepared,
) -> Result<(), String> {
    let top = if data.throughput_max > 0.0 {
        data.throughput_max * 1.1
    } else {
        1.0
    };
    let mut chart = chart_in(area, caption)?
        .build_cartesian_2d(0f64..data.time_end_s, 0f64..top)
        .map_err(message)?;
    let x_desc = format!(
        "card time (s), in bins of {} ms",
        tick(data.bin_ns as f64 / 1e6)
    );
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("throughput (MB/s, 10⁶ bytes/s)")
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .light_line_style(LIGHT_GRID)
        .max_light_lines(4)
        .axis_desc_style((FONT, 20))
        .label_style((FONT, 18))
        .draw()
        .map_err(message)?;
    for (i, steps) in data.throughput.iter().enumerate() {
        chart
            .draw_series(LineSeries::new(
                steps.iter().copied(),
                color(i).stroke_width(2),
            ))
            .map_err(message)?;
    }
    Ok(())
}

fn draw_scatter<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    caption: &str,
    data: &Prepared,
) -> Result<(), String> {
    let caption = match data.scatter_cap {
        Some(cap) => format!("{caption} (at most {cap} requests of a run shown)"),
        None => caption.to_string(),
    };
    let (lo, hi) = data.latency_range;
    let mut chart = chart_in(area, &caption)?
        .build_cartesian_2d(0f64..data.offset_end_mib, (lo..hi).log_scale())
        .map_err(message)?;
    chart
        .configure_mesh()
        .x_desc("offset (MiB)")
        .y_desc("latency (µs, log scale)")
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .light_line_style(LIGHT_GRID)
        .max_light_lines(4)
        .axis_desc_style((FONT, 20))
        .label_style((FONT, 18))
        .draw()
        .map_err(message)?;
    for (i, points) in data.scatter.iter().enumerate() {
        let c = color(i);
        chart
            .draw_series(
                points
                    .iter()
                    .filter(|p| !p.2)
                    .map(|&(x, y, _)| Circle::new((x, y), 2, c.filled())),
            )
            .map_err(message)?;
        chart
            .draw_series(
                points
                    .iter()
                    .filter(|p| p.2)
                    .map(|&(x, y, _)| Cross::new((x, y), 3, c.stroke_width(1))),
            )
            .map_err(message)?;
    }
    Ok(())
}

fn draw_packing<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    caption: &str,
    data: &Prepared,
) -> Result<(), String> {
    let packed: Vec<(usize, &Series)> = data
        .series
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.packing.is_empty())
        .collect();
    if packed.is_empty() {
        let area = area.margin(12, 0, 0, 0);
        area.titled(caption, caption_font(&area, caption)?)
            .map_err(message)?;
        let (w, h) = area.dim_in_pixel();
        let note = TextStyle::from((FONT, 22).into_font())
            .pos(Pos::new(HPos::Center, VPos::Center))
            .color(&BLACK);
        area.draw(&Text::new(
            "packing off in every run",
            (w as i32 / 2, h as i32 / 2),
            note,
        ))
        .map_err(message)?;
        return Ok(());
    }
    let all = || packed.iter().flat_map(|(_, s)| s.packing.iter());
    let kmin = all().map(|&(k, _)| k).min().unwrap_or(1);
    let kmax = all().map(|&(k, _)| k).max().unwrap_or(1);
    let top = all().map(|&(_, n)| n).max().unwrap_or(0).max(1) as f64 * 1.1;
    let mut chart = chart_in(area, caption)?
        .build_cartesian_2d(kmin as f64 - 0.5..kmax as f64 + 0.5, 0f64..top)
        .map_err(message)?;
    let integer = |v: &f64| {
        if (v - v.round()).abs() < 1e-9 {
            format!("{:.0}", v)
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels((kmax - kmin).saturating_add(2).min(40))
        .x_desc("requests per packed command")
        .y_desc("packed commands")
        .x_label_formatter(&integer)
        .y_label_formatter(&integer)
        .light_line_style(LIGHT_GRID)
        .max_light_lines(4)
        .axis_desc_style((FONT, 20))
        .label_style((FONT, 18))
        .draw()
        .map_err(message)?;
    let width = 0.8 / packed.len() as f64;
    for (slot, (i, s)) in packed.iter().enumerate() {
        let c = color(*i);
        chart
            .draw_series(s.packing.iter().map(|&(k, n)| {
                let x0 = k as f64 - 0.4 + slot as f64 * width;
                Rectangle::new([(x0, 0.0), (x0 + width, n as f64)], c.filled())
            }))
            .map_err(message)?;
    }
    Ok(())
}

/// Draws the legend entries in rows of `legend_columns`, each a mark in the run's colour
/// and its label.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[LegendEntry],
) -> Result<(), String> {
    let columns = legend_columns(entries.len());
    let column_width = (WIDTH - 2 * LEGEND_PAD) / columns;
    let text = TextStyle::from((FONT, 18).into_font())
        .pos(Pos::new(HPos::Left, VPos::Center))
        .color(&BLACK);
    for (n, e) in entries.iter().enumerate() {
        let n = n as u32;
        let x = (LEGEND_PAD + (n % columns) * column_width + 40) as i32;
        let y = (LEGEND_PAD + (n / columns) * LEGEND_ROW + LEGEND_ROW / 2) as i32;
        let line = e.color.stroke_width(2);
        let (a, b) = (x, x + 30);
        match e.mark {
            Mark::Line => area.draw(&PathElement::new([(a, y), (b, y)], line)),
            Mark::Dashed => area
                .draw(&PathElement::new([(a, y), (a + 10, y)], line))
                .and_then(|()| area.draw(&PathElement::new([(a + 16, y), (b, y)], line))),
            Mark::Dot => area.draw(&Circle::new((a + 15, y), 3, e.color.filled())),
            Mark::Cross => area.draw(&Cross::new((a + 15, y), 4, e.color.stroke_width(1))),
            Mark::Bar => area.draw(&Rectangle::new(
                [(a + 5, y - 7), (b - 5, y + 7)],
                e.color.filled(),
            )),
            Mark::Nothing => Ok(()),
        }
        .map_err(message)?;
        area.draw(&Text::new(e.label.as_str(), (b + 10, y), text.clone()))
            .map_err(message)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    const TITLE: &str = "lmdd-write 64 MiB";
    const LABEL_A: &str = "toshiba-mmc32g · packing=off";
    const LABEL_B: &str = "sandisk-sdin5 · packing=always";

    /// `n` requests of 64 KiB, one after the other (queue depth one), sweeping a 64 MiB
    /// range; every `write_every`-th is a write. Reads take 100–400 µs, writes 0.3–2 ms and
    /// one write in 50 stalls 20–50 ms, all scaled by `percent` / 100; the jitter comes
    /// from a fixed pseudo-random sequence, so the series is the same every time.
    fn synthetic(
        label: &str,
        n: u64,
        write_every: u64,
        percent: u64,
        packing: Vec<(usize, u64)>,
    ) -> Series {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut random = |below: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % below
        };
        let mut now = 0;
        let mut samples = Vec::new();
        for i in 0..n {
            let write = i % write_every == 0;
            let latency = if !write {
                100_000 + random(300_000)
            } else if i % (50 * write_every) == 0 {
                20_000_000 + random(30_000_000)
            } else {
                300_000 + random(1_700_000)
            } * percent
                / 100;
            let submit_ns = now + 20_000;
            now = submit_ns + latency;
            samples.push(Sample {
                submit_ns,
                complete_ns: now,
                offset: (i * 65536) % (64 << 20),
                len: 65536,
                write,
            });
        }
        Series {
            label: label.to_string(),
            samples,
            packing,
        }
    }

    fn two_series() -> Vec<Series> {
        vec![
            synthetic(LABEL_A, 2000, 2, 100, Vec::new()),
            synthetic(
                LABEL_B,
                3000,
                3,
                60,
                vec![(1, 40), (2, 25), (4, 10), (8, 3)],
            ),
        ]
    }

    const NAMES: [&str; 4] = ["latency-cdf", "throughput", "latency-offset", "packing"];

    fn read(path: &Path) -> Vec<u8> {
        std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn svg(dir: &Path, name: &str) -> String {
        String::from_utf8(read(&dir.join(format!("{name}.svg")))).unwrap()
    }

    /// Whether `svg` has a text element saying exactly `text` (plotters writes it on a line
    /// of its own).
    fn has_text(svg: &str, text: &str) -> bool {
        svg.contains(&format!(">\n{text}\n</text>"))
    }

    #[test]
    fn writes_a_png_and_an_svg_of_every_plot() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("new/sub");
        let files = write_plots(&out, TITLE, &two_series()).unwrap();
        let expected: Vec<PathBuf> = NAMES
            .iter()
            .flat_map(|n| [out.join(format!("{n}.png")), out.join(format!("{n}.svg"))])
            .collect();
        assert_eq!(files, expected);
        for f in &files {
            assert!(f.is_file(), "{} missing", f.display());
        }
    }

    #[test]
    fn svgs_carry_title_axis_labels_and_legend() {
        let dir = tempfile::tempdir().unwrap();
        write_plots(dir.path(), TITLE, &two_series()).unwrap();
        let expect = [
            (
                "latency-cdf",
                vec![
                    "lmdd-write 64 MiB — latency CDF",
                    "latency (µs, log scale)",
                    "requests at or below (%)",
                    "toshiba-mmc32g · packing=off — read",
                    "toshiba-mmc32g · packing=off — write",
                    "sandisk-sdin5 · packing=always — read",
                    "sandisk-sdin5 · packing=always — write",
                ],
            ),
            (
                "throughput",
                vec![
                    "lmdd-write 64 MiB — throughput",
                    // The longer run ends after 2.09 s: 100 bins of 20.9 ms.
                    "card time (s), in bins of 20.9 ms",
                    "throughput (MB/s, 10⁶ bytes/s)",
                    LABEL_A,
                    LABEL_B,
                ],
            ),
            (
                "latency-offset",
                vec![
                    "lmdd-write 64 MiB — latency against offset",
                    "offset (MiB)",
                    "latency (µs, log scale)",
                    "toshiba-mmc32g · packing=off — write",
                    "sandisk-sdin5 · packing=always — read",
                ],
            ),
            (
                "packing",
                vec![
                    "lmdd-write 64 MiB — write packing",
                    "requests per packed command",
                    "packed commands",
                    "toshiba-mmc32g · packing=off — packing off",
                    LABEL_B,
                ],
            ),
        ];
        for (name, texts) in expect {
            let s = svg(dir.path(), name);
            for t in texts {
                assert!(has_text(&s, t), "{name}.svg lacks text {t:?}");
            }
        }
        // Not subsampled, so the caption says nothing about it.
        assert!(!svg(dir.path(), "latency-offset").contains("at most"));
    }

    /// Points of each polyline drawn in colour `c` in `svg`.
    fn polylines(svg: &str, c: RGBColor) -> Vec<usize> {
        let stroke = format!("stroke=\"#{:02X}{:02X}{:02X}\"", c.0, c.1, c.2);
        svg.lines()
            .filter(|l| l.starts_with("<polyline") && l.contains(&stroke))
            .filter_map(|l| l.split("points=\"").nth(1))
            .map(|p| p.split_whitespace().take_while(|w| *w != "\"/>").count())
            .collect()
    }

    #[test]
    fn svgs_draw_a_line_of_each_run() {
        let dir = tempfile::tempdir().unwrap();
        write_plots(dir.path(), TITLE, &two_series()).unwrap();
        let (cdf, throughput) = (
            svg(dir.path(), "latency-cdf"),
            svg(dir.path(), "throughput"),
        );
        for c in &PALETTE[..2] {
            // Reads: one long solid line; writes: dashes of a few points each; legend
            // marks: two points each.
            let lines = polylines(&cdf, *c);
            assert!(lines.iter().any(|&n| n > 50), "no read CDF in {c:?}");
            let dashes = lines.iter().filter(|&&n| n > 2 && n < 50).count();
            assert!(dashes > 10, "{dashes} dashes of the write CDF in {c:?}");
            let steps = polylines(&throughput, *c);
            assert!(steps.iter().any(|&n| n > 50), "no throughput line in {c:?}");
        }
    }

    /// The PNG's width and height from its IHDR chunk, after checking the signature.
    fn png_size(bytes: &[u8]) -> (u32, u32) {
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
        assert_eq!(&bytes[12..16], b"IHDR");
        let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        (be(&bytes[16..20]), be(&bytes[20..24]))
    }

    /// The distinct RGB colours of a PNG's pixels: of the whole image, and of the chart
    /// above the legend alone.
    fn png_colours(bytes: &[u8]) -> (BTreeSet<[u8; 3]>, BTreeSet<[u8; 3]>) {
        let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
            .read_info()
            .unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!(info.color_type, png::ColorType::Rgb);
        assert_eq!(info.bit_depth, png::BitDepth::Eight);
        let pixels = &buf[..info.buffer_size()];
        let colours = |b: &[u8]| b.chunks_exact(3).map(|p| [p[0], p[1], p[2]]).collect();
        let chart = 3 * (info.width * CHART_HEIGHT) as usize;
        (colours(pixels), colours(&pixels[..chart]))
    }

    #[test]
    fn pngs_have_their_size_and_show_every_run() {
        let dir = tempfile::tempdir().unwrap();
        write_plots(dir.path(), TITLE, &two_series()).unwrap();
        // Legend entries: read and write of both runs; one line each; read and write of
        // both; one bar and one "packing off".
        for (name, entries) in [
            ("latency-cdf", 4),
            ("throughput", 2),
            ("latency-offset", 4),
            ("packing", 2),
        ] {
            let bytes = read(&dir.path().join(format!("{name}.png")));
            assert_eq!(
                png_size(&bytes),
                (WIDTH, CHART_HEIGHT + legend_height(entries)),
                "{name}.png"
            );
            let (colours, chart) = png_colours(&bytes);
            // White, black text, grey grid, anti-aliasing: far more than a blank image.
            assert!(
                colours.len() > 20,
                "{name}.png has {} colours",
                colours.len()
            );
            // Each run's data is drawn in the chart, not only its mark in the legend; the
            // first run has no packing histogram, so no bar.
            let runs = if name == "packing" { 1..2 } else { 0..2 };
            for c in &PALETTE[runs] {
                assert!(
                    chart.contains(&[c.0, c.1, c.2]),
                    "{name}.png has no data in the colour {c:?}"
                );
            }
            if name == "packing" {
                let c = PALETTE[0];
                assert!(
                    !chart.contains(&[c.0, c.1, c.2]),
                    "packing.png: a bar of run 0"
                );
            }
        }
    }

    #[test]
    fn output_is_identical_when_written_twice() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let fa = write_plots(a.path(), TITLE, &two_series()).unwrap();
        let fb = write_plots(b.path(), TITLE, &two_series()).unwrap();
        assert_eq!(fa.len(), fb.len());
        for (x, y) in fa.iter().zip(&fb) {
            assert!(read(x) == read(y), "{} differs between runs", x.display());
        }
    }

    #[test]
    fn no_series_or_no_samples_is_an_error_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("plots");
        assert!(matches!(
            write_plots(&out, TITLE, &[]),
            Err(PlotError::NoSeries)
        ));
        let empty = synthetic(LABEL_A, 0, 1, 100, vec![(2, 1)]);
        assert!(matches!(
            write_plots(&out, TITLE, &[empty.clone(), empty]),
            Err(PlotError::NoSamples)
        ));
        assert!(!out.exists());
    }

    #[test]
    fn a_run_without_samples_is_named_in_the_legend() {
        let dir = tempfile::tempdir().unwrap();
        let series = [
            synthetic(LABEL_A, 0, 1, 100, Vec::new()),
            synthetic(LABEL_B, 10, 1, 100, Vec::new()),
        ];
        let files = write_plots(dir.path(), TITLE, &series).unwrap();
        assert_eq!(files.len(), 8);
        for name in ["latency-cdf", "throughput", "latency-offset"] {
            let s = svg(dir.path(), name);
            assert!(has_text(&s, &format!("{LABEL_A} — no samples")), "{name}");
        }
        // Neither run packed.
        assert!(has_text(
            &svg(dir.path(), "packing"),
            "packing off in every run"
        ));
    }

    #[test]
    fn a_large_run_is_subsampled_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let series = [synthetic(LABEL_A, 50_000, 4, 100, Vec::new())];
        write_plots(dir.path(), TITLE, &series).unwrap();
        let s = svg(dir.path(), "latency-offset");
        assert!(s.contains("(at most 20000 requests of a run shown)"));
        // Every point is a circle (read) or a two-line cross (write); one dot in the legend.
        let circles = s.matches("<circle").count();
        assert!(
            (14_000..=15_001).contains(&circles),
            "{circles} circles for 15000 reads shown"
        );
    }

    #[test]
    fn throughput_counts_bytes_in_the_bin_of_completion() {
        // Two 1 MB requests completing in the first 1 ms bin, none in the second, one in
        // the third: 2000, 0 and 1000 MB/s.
        let s = |complete_ns| Sample {
            submit_ns: 0,
            complete_ns,
            offset: 0,
            len: 1_000_000,
            write: true,
        };
        let series = Series {
            label: LABEL_A.into(),
            samples: vec![s(100), s(999_999), s(2_500_000)],
            packing: Vec::new(),
        };
        let steps = throughput_steps(&series, MIN_BIN_NS);
        let mbps: Vec<f64> = steps.iter().step_by(2).map(|p| p.1).collect();
        assert_eq!(mbps, [2000.0, 0.0, 1000.0]);
        assert_eq!(steps.last().map(|p| p.0), Some(0.003));
    }

    #[test]
    fn cdf_spans_fastest_to_slowest_and_ends_at_100() {
        let series = synthetic(LABEL_A, 5000, 2, 100, Vec::new());
        for write in [false, true] {
            let p = cdf_points(&series, write);
            assert_eq!(p.len(), CDF_POINTS);
            assert!(p.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
            assert_eq!(p.last().map(|q| q.1), Some(100.0));
        }
        let fastest_read = series
            .samples
            .iter()
            .filter(|x| !x.write)
            .map(latency_us)
            .fold(f64::INFINITY, f64::min);
        assert_eq!(cdf_points(&series, false)[0].0, fastest_read);
    }

    #[test]
    fn a_long_caption_shrinks_to_fit() {
        load_font().unwrap();
        let mut buf = vec![0; (WIDTH * CHART_HEIGHT * 3) as usize];
        let area = BitMapBackend::with_buffer(&mut buf, (WIDTH, CHART_HEIGHT)).into_drawing_area();
        let size = |text: &str| caption_font(&area, text).unwrap().get_size();
        assert_eq!(size("lmdd-write 64 MiB — latency CDF"), 28.0);
        let long = "flashbench open-au write over 16 MiB, toshiba-mmc32g and sandisk-sdin5 \
                    — latency against offset (at most 20000 requests of a run shown)";
        let fitted = caption_font(&area, long).unwrap();
        assert!(fitted.get_size() < 28.0);
        let (w, _) = area
            .estimate_text_size(long, &TextStyle::from(fitted))
            .unwrap();
        assert!(w <= WIDTH - 24, "{w} px wide");
    }

    /// Not a check: renders the two synthetic runs into `$PLOT_SAMPLE_DIR` to look at, with
    /// `PLOT_SAMPLE_DIR=/tmp/plots-sample cargo test --lib sim::plot -- --ignored`.
    #[test]
    #[ignore]
    fn render_sample() {
        let dir = std::env::var_os("PLOT_SAMPLE_DIR").expect("set PLOT_SAMPLE_DIR");
        let files = write_plots(Path::new(&dir), TITLE, &two_series()).unwrap();
        for f in files {
            println!("{}", f.display());
        }
    }
}
