//! Plots of a comparison's runs, one run being one card model under one driver policy.
//! `write_plots` draws four plots, each as `NAME.png` and `NAME.svg`:
//!
//! - `latency-cdf`: cumulative distribution of request latency (complete − submit), reads
//!   and writes as separate lines (solid for reads, dashed for writes), on a log scale;
//! - `throughput`: MB/s (10^6 bytes/s) against card time in s (ms for a run shorter than
//!   a second), in bins of equal width;
//! - `latency-offset`: the flashbench view, latency (log scale) against offset (MiB, GiB
//!   from 4 GiB up), reads as dots and writes as crosses, subsampled when a run has many
//!   requests;
//! - `packing`: the driver's write packing histogram as grouped bars.
//!
//! Every plot has its legend below the chart, so it never covers data, naming each run by
//! its label in the run's colour; a run keeps its colour in every plot.
//!
//! The ticks are chosen here, not by plotters, from the widths of their labels in the
//! font they are drawn in and the pixels the axis gets (`choose_ticks`): labels never
//! overlap or run together, and a log axis labels the whole of its span: its decades, or
//! 1-2-5 or more round values in each, or evenly spaced values when it spans about a
//! decade or less. Latency labels carry their own unit ("500 µs", "20 ms", "1.5 s").
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

use plotters::coord::cartesian::Cartesian2d;
use plotters::coord::ranged1d::{AsRangedCoord, DefaultFormatting, KeyPointHint, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{register_font, FontStyle};

use super::report::{sig3, trimmed};

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

/// Size of the tick labels' font, px.
const LABEL_SIZE: u32 = 18;
/// Size of the axis descriptions' font, px.
const DESC_SIZE: u32 = 20;
/// Margin around a chart, px...
const MARGIN: u32 = 12;
/// ...but wider on the right, for the last x label to reach into.
const MARGIN_RIGHT: u32 = 40;
/// Space between the caption and the chart, px, for the top y label to reach into.
const TOP_PAD: u32 = 10;
/// Height of the x label area under the chart, px: the labels, then the axis description.
const X_LABEL_AREA: u32 = 56;
/// Least width of the y label area left of the chart, px; it grows with the widest label...
const Y_LABEL_AREA: u32 = 80;
/// ...by what it holds besides that label, px: the rotated axis description and white at
/// its left, and the 10 px plotters keeps between a label and the axis.
const Y_LABEL_EXTRA: u32 = 44;
/// A log axis takes the sparsest ticks that leave no stretch of it longer than this part of
/// its length without a label.
const MAX_UNLABELLED: f64 = 0.3;

/// How an axis places values along it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scale {
    Linear,
    Log,
}

/// What an axis's tick labels say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// A number in the unit the axis description names, with the decimals the ticks' step
    /// needs.
    Number,
    /// A whole number (a count): the ticks fall on whole numbers only.
    Integer,
    /// A duration given in µs, each label in a unit of its own: "500 µs", "2 ms", "1.5 s".
    Micros,
}

/// Which way an axis runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Left to right, its labels under it, side by side: their widths share the axis.
    Horizontal,
    /// Bottom to top, its labels left of it, one above the other: their heights share it.
    Vertical,
}

impl Direction {
    /// Least distance between neighbouring ticks, px: any closer, an axis reads as a comb.
    fn min_spacing(self) -> f64 {
        match self {
            Direction::Horizontal => 72.0,
            Direction::Vertical => 44.0,
        }
    }

    /// Least white between neighbouring labels, px.
    fn gap(self) -> f64 {
        match self {
            Direction::Horizontal => 16.0,
            Direction::Vertical => 6.0,
        }
    }

    /// How far a label may reach before the axis's start and past its end, px. An x label
    /// may reach left into the corner under the y labels and right into the margin; a y
    /// label up into the pad under the caption, and down by less than the 10 px plotters
    /// keeps between the x axis and its labels, so that the two never meet in the corner.
    fn room(self) -> (f64, f64) {
        match self {
            Direction::Horizontal => (40.0, f64::from(MARGIN_RIGHT - 4)),
            Direction::Vertical => (8.0, f64::from(TOP_PAD)),
        }
    }
}

/// An axis to put ticks on.
#[derive(Debug, Clone, Copy)]
struct AxisSpec {
    scale: Scale,
    format: Format,
    /// The values at the axis's start and end: start < end, and start > 0 on a log axis.
    range: (f64, f64),
    /// Length, px.
    length: f64,
    direction: Direction,
}

impl AxisSpec {
    /// Where `v` falls, px from the axis's start (its left or bottom end).
    fn at(&self, v: f64) -> f64 {
        let (lo, hi) = self.range;
        let f = match self.scale {
            Scale::Linear => (v - lo) / (hi - lo),
            Scale::Log => (v / lo).ln() / (hi / lo).ln(),
        };
        f * self.length
    }
}

/// A labelled tick.
#[derive(Debug, Clone, PartialEq)]
struct Tick {
    value: f64,
    label: String,
    /// Centre of the tick and its label, px from the axis's start.
    at: f64,
    /// The label's extent along the axis (its width on a horizontal one), px.
    along: f64,
    /// The label's extent across the axis, px.
    across: f64,
}

/// An axis's labelled ticks, each with a grid line, and its light grid lines.
#[derive(Debug, Clone, Default)]
struct Ticks {
    ticks: Vec<Tick>,
    light: Vec<f64>,
}

impl Ticks {
    fn values(&self) -> Vec<f64> {
        self.ticks.iter().map(|t| t.value).collect()
    }

    /// The label of the tick at `v`: plotters asks for the labels of the values it was given.
    fn label(&self, v: f64) -> String {
        self.ticks
            .iter()
            .find(|t| t.value == v)
            .map(|t| t.label.clone())
            .unwrap_or_default()
    }

    /// Width of the widest label on a vertical axis, px.
    fn widest(&self) -> f64 {
        self.ticks.iter().map(|t| t.across).fold(0.0, f64::max)
    }

    /// `range` with these ticks, for plotters.
    fn on<R: AsRangedCoord<Value = f64>>(&self, range: R) -> Ticked<R::CoordDescType> {
        Ticked {
            inner: range.into(),
            bold: self.values(),
            light: self.light.clone(),
        }
    }
}

/// A plotters coordinate with the ticks chosen here (plotters' own key points crowd their
/// labels): bold ones, labelled, and light ones. Unlike plotters' `WithKeyPoints` it takes
/// any label formatter, as a linear `f64` range does not.
struct Ticked<R> {
    inner: R,
    bold: Vec<f64>,
    light: Vec<f64>,
}

impl<R: Ranged<ValueType = f64>> Ranged for Ticked<R> {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.light.clone()
        } else {
            self.bold.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.inner.range()
    }

    fn axis_pixel_range(&self, limit: (i32, i32)) -> std::ops::Range<i32> {
        self.inner.axis_pixel_range(limit)
    }
}

/// Tick values to try: evenly spaced by `step`, or (None) on round values of a log axis.
struct Candidate {
    values: Vec<f64>,
    step: Option<f64>,
}

/// The ticks of `axis`: no two closer than `Direction::min_spacing`, no two labels closer
/// than `Direction::gap`, none reaching beyond `Direction::room`; `measure` gives a label's
/// (width, height) in px.
///
/// A linear axis takes the finest step of 1, 2 or 5 times a power of ten that fits. A log
/// axis tries, in this order: its decades; 1, 2 and 5 in each decade; 1, 2, 3, 5 and 7;
/// those and 1.5; 1 to 9; evenly spaced values, by steps of 1, 2, 2.5 or 5 times a power
/// of ten (for a span of about a decade or less, where round values per decade crowd each
/// decade's end); every second, third... decade from the first (for many decades). It
/// takes the first of those that fits and leaves no stretch longer than `MAX_UNLABELLED`
/// of the axis without a label, or else the one that fits and leaves the shortest such
/// stretch.
fn choose_ticks(axis: &AxisSpec, measure: &dyn Fn(&str) -> (f64, f64)) -> Ticks {
    let (lo, hi) = axis.range;
    if !(lo < hi && lo.is_finite() && hi.is_finite() && axis.length > 0.0)
        || (axis.scale == Scale::Log && lo <= 0.0)
    {
        return Ticks::default();
    }
    let most = (axis.length / axis.direction.min_spacing()) as usize + 2;
    let evenly = |step: f64| Candidate {
        values: multiples(step, lo, hi, most),
        step: Some(step),
    };
    match axis.scale {
        Scale::Linear => {
            let mut from = (hi - lo) * axis.direction.min_spacing() / axis.length;
            if axis.format == Format::Integer {
                from = from.max(1.0);
            }
            let whole = |s: &f64| axis.format != Format::Integer || s.fract() == 0.0;
            for step in nice_steps(from, &[1.0, 2.0, 5.0]).filter(whole) {
                if let Some(ticks) = place(axis, &evenly(step), measure) {
                    if !ticks.is_empty() {
                        return Ticks {
                            light: linear_light(axis, step),
                            ticks,
                        };
                    }
                }
                if step > hi - lo {
                    // At most one value from here on, and that one has no room.
                    break;
                }
            }
            Ticks::default()
        }
        Scale::Log => {
            let (e0, e1) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
            // Every stride-th decade from the first on the axis.
            let first = (lo.log10() - 1e-9).ceil() as i32;
            let round = |mantissas: &[f64], stride: i32| Candidate {
                values: (e0..=e1)
                    .filter(|e| (e - first).rem_euclid(stride) == 0)
                    .flat_map(|e| mantissas.iter().map(move |m| m * 10f64.powi(e)))
                    .filter(|&v| v >= lo && v <= hi)
                    .collect(),
                step: None,
            };
            let mut candidates = vec![
                round(&[1.0], 1),
                round(&[1.0, 2.0, 5.0], 1),
                round(&[1.0, 2.0, 3.0, 5.0, 7.0], 1),
                round(&[1.0, 1.5, 2.0, 3.0, 5.0, 7.0], 1),
                round(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0], 1),
            ];
            // The finest step that could fit where values are closest, at the top.
            let from =
                hi * (1.0 - (-axis.direction.min_spacing() / axis.length * (hi / lo).ln()).exp());
            candidates.extend(
                nice_steps(from, &[1.0, 2.0, 2.5, 5.0])
                    .take_while(|&s| s <= hi - lo)
                    .map(evenly)
                    .filter(|c| c.values.len() < most),
            );
            candidates.extend((2..=(e1 - e0).max(2)).map(|stride| round(&[1.0], stride)));

            let enough = MAX_UNLABELLED * axis.length;
            let mut best: Option<(f64, Option<f64>, Vec<Tick>)> = None;
            for c in &candidates {
                let Some(ticks) = place(axis, c, measure) else {
                    continue;
                };
                if ticks.is_empty() {
                    continue;
                }
                let stretch = longest_unlabelled(&ticks, axis.length);
                if best.as_ref().is_none_or(|b| stretch < b.0) {
                    best = Some((stretch, c.step, ticks));
                }
                if stretch <= enough {
                    break;
                }
            }
            let Some((_, step, ticks)) = best else {
                return Ticks::default();
            };
            let light = match step {
                Some(step) => linear_light(axis, step),
                None => log_light(axis, &ticks),
            };
            Ticks { ticks, light }
        }
    }
}

/// The candidate's ticks on `axis`, less those whose label would reach beyond the axis's
/// room; None when two come too close.
fn place(
    axis: &AxisSpec,
    c: &Candidate,
    measure: &dyn Fn(&str) -> (f64, f64),
) -> Option<Vec<Tick>> {
    let (before, after) = axis.direction.room();
    let mut ticks: Vec<Tick> = Vec::with_capacity(c.values.len());
    for &value in &c.values {
        let label = tick_label(axis.format, value, c.step);
        let (w, h) = measure(&label);
        let (along, across) = match axis.direction {
            Direction::Horizontal => (w, h),
            Direction::Vertical => (h, w),
        };
        let at = axis.at(value);
        if at - along / 2.0 < -before || at + along / 2.0 > axis.length + after {
            continue;
        }
        if let Some(prev) = ticks.last() {
            if at - prev.at < axis.direction.min_spacing()
                || (at - along / 2.0) - (prev.at + prev.along / 2.0) < axis.direction.gap()
            {
                return None;
            }
        }
        ticks.push(Tick {
            value,
            label,
            at,
            along,
            across,
        });
    }
    Some(ticks)
}

/// The longest stretch of an axis `length` px long without a tick, px, counting its ends.
fn longest_unlabelled(ticks: &[Tick], length: f64) -> f64 {
    let mut edges = vec![0.0];
    edges.extend(ticks.iter().map(|t| t.at));
    edges.push(length);
    edges.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max)
}

/// Steps of one of the `mantissas` times a power of ten, ascending, from the first at or
/// above `from`.
fn nice_steps(from: f64, mantissas: &'static [f64]) -> impl Iterator<Item = f64> {
    let from = if from.is_finite() && from > 0.0 {
        from
    } else {
        1e-9
    };
    let e0 = from.log10().floor() as i32 - 1;
    (e0..e0 + 40)
        .flat_map(move |e| mantissas.iter().map(move |m| m * 10f64.powi(e)))
        .filter(move |&s| s >= from * (1.0 - 1e-9))
}

/// The multiples of `step` from `lo` to `hi`, or none when there are more than `most`.
fn multiples(step: f64, lo: f64, hi: f64, most: usize) -> Vec<f64> {
    let first = (lo / step - 1e-9).ceil();
    let last = (hi / step + 1e-9).floor();
    // Also none for a step of 0 or NaN, whose count is not a number.
    let fits = (last - first + 1.0).partial_cmp(&(most as f64));
    if !matches!(
        fits,
        Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal)
    ) {
        return Vec::new();
    }
    (first as i64..=last as i64)
        .map(|n| n as f64 * step)
        .collect()
}

/// Light grid lines between ticks `step` apart: at a fifth of the step (a quarter of a step
/// of 2), or at half of it where that would be closer than 8 px, or none; on whole numbers
/// only on an axis of them.
fn linear_light(axis: &AxisSpec, step: f64) -> Vec<f64> {
    let (lo, hi) = axis.range;
    // Ticks are closest at the top of a log axis.
    let spacing = axis.at(hi) - axis.at((hi - step).max(lo));
    let mantissa = step / 10f64.powf(step.log10().floor());
    let parts = if (mantissa - 2.0).abs() < 0.01 { 4 } else { 5 };
    let whole = |n: usize| axis.format != Format::Integer || (step / n as f64).fract() == 0.0;
    let Some(parts) = [parts, 2]
        .into_iter()
        .find(|&n| spacing / n as f64 >= 8.0 && whole(n))
    else {
        return Vec::new();
    };
    let sub = step / parts as f64;
    multiples(sub, lo, hi, 2000)
        .into_iter()
        .filter(|v| {
            let n = v / step;
            (n - n.round()).abs() > 1e-6
        })
        .collect()
}

/// Light grid lines on a log axis: at 2 to 9 in each decade, or at the decades alone where
/// those would be closer than 4 px; none where a tick is.
fn log_light(axis: &AxisSpec, ticks: &[Tick]) -> Vec<f64> {
    let (lo, hi) = axis.range;
    let per_decade = axis.length / (hi / lo).log10();
    let mantissas: &[f64] = if per_decade * (10f64 / 9.0).log10() >= 4.0 {
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    } else {
        &[1.0]
    };
    (lo.log10().floor() as i32..=hi.log10().ceil() as i32)
        .flat_map(|e| mantissas.iter().map(move |m| m * 10f64.powi(e)))
        .filter(|&v| v >= lo && v <= hi)
        .filter(|&v| !ticks.iter().any(|t| (t.value / v - 1.0).abs() < 1e-9))
        .collect()
}

/// The label of a tick at `v`; `step`, when the ticks are evenly spaced, sets the decimals.
fn tick_label(format: Format, v: f64, step: Option<f64>) -> String {
    match format {
        Format::Integer => format!("{v:.0}"),
        Format::Number => trimmed(v, step.map_or(3, decimals)),
        Format::Micros => {
            let (scale, unit) = duration_unit(v);
            let places = step.map_or(3, |s| decimals(s / scale));
            format!("{} {unit}", trimmed(v / scale, places))
        }
    }
}

/// Decimals that the multiples of `step` need.
fn decimals(step: f64) -> usize {
    (0..12)
        .find(|&d| {
            let x = step * 10f64.powi(d);
            (x - x.round()).abs() < 1e-6 * x.max(1.0)
        })
        .unwrap_or(12) as usize
}

/// The unit to say a duration of `us` µs in: (µs in one of it, its symbol).
fn duration_unit(us: f64) -> (f64, &'static str) {
    const UNITS: [(f64, &str); 4] = [(1e6, "s"), (1e3, "ms"), (1.0, "µs"), (1e-3, "ns")];
    UNITS
        .into_iter()
        .find(|&(scale, _)| us >= scale * (1.0 - 1e-9))
        .unwrap_or(UNITS[3])
}

/// A duration of `ns` ns to three significant digits in its unit: "20.9 ms", "1.54 s".
fn duration_text(ns: f64) -> String {
    let us = ns / 1e3;
    let (scale, unit) = duration_unit(us);
    format!("{} {unit}", sig3(us / scale))
}

fn label_font() -> FontDesc<'static> {
    (FONT, LABEL_SIZE).into_font()
}

/// (width, height) of `text` in the tick labels' font, px, as plotters lays it out.
fn label_size(text: &str) -> (f64, f64) {
    match label_font().box_size(text) {
        Ok((w, h)) => (f64::from(w), f64::from(h)),
        // The font is registered before anything is drawn; were it not, guess wide.
        Err(_) => (
            0.7 * f64::from(LABEL_SIZE) * text.chars().count() as f64,
            f64::from(LABEL_SIZE),
        ),
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

/// A chart's frame: the area under its caption, and the ticks of both axes, chosen for the
/// pixels each axis gets there.
struct Frame<DB: DrawingBackend> {
    area: DrawingArea<DB, Shift>,
    x: Ticks,
    y: Ticks,
    /// Width of the y label area, px: room for the widest y label and the description.
    y_area: u32,
}

/// An axis of a frame: how it places values, what its labels say, its range.
type Axis = (Scale, Format, (f64, f64));

/// Lays out a chart in `area` as every plot is: margins, the caption sized to fit, label
/// areas under and left of the chart, the y one as wide as its labels need; and chooses the
/// ticks of axes `x` and `y` for the pixels they get.
fn frame<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    caption: &str,
    x: Axis,
    y: Axis,
) -> Result<Frame<DB>, String> {
    let font = caption_font(area, caption)?;
    let inner = area
        .margin(MARGIN, MARGIN, MARGIN, MARGIN_RIGHT)
        .titled(caption, font)
        .map_err(message)?;
    let (w, h) = inner.dim_in_pixel();
    let y = choose_ticks(
        &AxisSpec {
            scale: y.0,
            format: y.1,
            range: y.2,
            length: f64::from(h.saturating_sub(TOP_PAD + X_LABEL_AREA)),
            direction: Direction::Vertical,
        },
        &label_size,
    );
    let y_area = Y_LABEL_AREA.max(y.widest().ceil() as u32 + Y_LABEL_EXTRA);
    let x = choose_ticks(
        &AxisSpec {
            scale: x.0,
            format: x.1,
            range: x.2,
            length: f64::from(w.saturating_sub(y_area)),
            direction: Direction::Horizontal,
        },
        &label_size,
    );
    Ok(Frame {
        area: inner,
        x,
        y,
        y_area,
    })
}

impl<DB: DrawingBackend> Frame<DB> {
    /// The chart builder of this frame's layout.
    fn builder(&self) -> ChartBuilder<'_, '_, DB> {
        let mut builder = ChartBuilder::on(&self.area);
        builder
            .margin_top(TOP_PAD)
            .x_label_area_size(X_LABEL_AREA)
            .y_label_area_size(self.y_area);
        builder
    }

    /// Draws the axes, their labels and descriptions, and the grid (without its vertical
    /// lines unless `x_grid`).
    fn mesh<X, Y>(
        &self,
        chart: &mut ChartContext<'_, DB, Cartesian2d<X, Y>>,
        x_desc: &str,
        y_desc: &str,
        x_grid: bool,
    ) -> Result<(), String>
    where
        X: Ranged<ValueType = f64> + ValueFormatter<f64>,
        Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
    {
        let x_label = |v: &f64| self.x.label(*v);
        let y_label = |v: &f64| self.y.label(*v);
        let mut mesh = chart.configure_mesh();
        if !x_grid {
            mesh.disable_x_mesh();
        }
        mesh.x_desc(x_desc)
            .y_desc(y_desc)
            .x_label_formatter(&x_label)
            .y_label_formatter(&y_label)
            .light_line_style(LIGHT_GRID)
            .axis_desc_style((FONT, DESC_SIZE))
            .label_style(label_font())
            .draw()
            .map_err(message)
    }
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
    let frame = frame(
        area,
        caption,
        (Scale::Log, Format::Micros, (lo, hi)),
        (Scale::Linear, Format::Number, (0.0, 100.0)),
    )?;
    let mut chart = frame
        .builder()
        .build_cartesian_2d(frame.x.on((lo..hi).log_scale()), frame.y.on(0f64..100f64))
        .map_err(message)?;
    frame.mesh(
        &mut chart,
        "latency (log scale)",
        "requests at or below (%)",
        true,
    )?;
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
    // A run shorter than a second in ms, so that its labels are not all decimals.
    let (per_s, unit) = if data.time_end_s < 1.0 {
        (1e3, "ms")
    } else {
        (1.0, "s")
    };
    let end = data.time_end_s * per_s;
    let frame = frame(
        area,
        caption,
        (Scale::Linear, Format::Number, (0.0, end)),
        (Scale::Linear, Format::Number, (0.0, top)),
    )?;
    let mut chart = frame
        .builder()
        .build_cartesian_2d(frame.x.on(0f64..end), frame.y.on(0f64..top))
        .map_err(message)?;
    let x_desc = format!(
        "card time ({unit}), in bins of {}",
        duration_text(data.bin_ns as f64)
    );
    frame.mesh(&mut chart, &x_desc, "throughput (MB/s, 10⁶ bytes/s)", true)?;
    for (i, steps) in data.throughput.iter().enumerate() {
        chart
            .draw_series(LineSeries::new(
                steps.iter().map(|&(t, v)| (t * per_s, v)),
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
    // From 4 GiB up in GiB, so that the labels keep to a few digits.
    let (per_mib, unit) = if data.offset_end_mib >= 4096.0 {
        (1.0 / 1024.0, "GiB")
    } else {
        (1.0, "MiB")
    };
    let end = data.offset_end_mib * per_mib;
    let (lo, hi) = data.latency_range;
    let frame = frame(
        area,
        &caption,
        (Scale::Linear, Format::Number, (0.0, end)),
        (Scale::Log, Format::Micros, (lo, hi)),
    )?;
    let mut chart = frame
        .builder()
        .build_cartesian_2d(frame.x.on(0f64..end), frame.y.on((lo..hi).log_scale()))
        .map_err(message)?;
    frame.mesh(
        &mut chart,
        &format!("offset ({unit})"),
        "latency (log scale)",
        true,
    )?;
    for (i, points) in data.scatter.iter().enumerate() {
        let c = color(i);
        chart
            .draw_series(
                points
                    .iter()
                    .filter(|p| !p.2)
                    .map(|&(x, y, _)| Circle::new((x * per_mib, y), 2, c.filled())),
            )
            .map_err(message)?;
        chart
            .draw_series(
                points
                    .iter()
                    .filter(|p| p.2)
                    .map(|&(x, y, _)| Cross::new((x * per_mib, y), 3, c.stroke_width(1))),
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
        let area = area.margin(MARGIN, 0, 0, 0);
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
    let (left, right) = (kmin as f64 - 0.5, kmax as f64 + 0.5);
    let frame = frame(
        area,
        caption,
        (Scale::Linear, Format::Integer, (left, right)),
        (Scale::Linear, Format::Integer, (0.0, top)),
    )?;
    let mut chart = frame
        .builder()
        .build_cartesian_2d(frame.x.on(left..right), frame.y.on(0f64..top))
        .map_err(message)?;
    frame.mesh(
        &mut chart,
        "requests per packed command",
        "packed commands",
        false,
    )?;
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
                    "latency (log scale)",
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
                    "latency (log scale)",
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

    /// A run of reads taking the `latencies` (ns), one after the other, over 64 MiB.
    fn with_latencies(label: &str, latencies: &[u64]) -> Series {
        let mut now = 0;
        let samples = latencies
            .iter()
            .enumerate()
            .map(|(i, &latency)| {
                let submit_ns = now + 20_000;
                now = submit_ns + latency;
                Sample {
                    submit_ns,
                    complete_ns: now,
                    offset: (i as u64 * 65536) % (64 << 20),
                    len: 65536,
                    write: false,
                }
            })
            .collect();
        Series {
            label: label.to_string(),
            samples,
            packing: Vec::new(),
        }
    }

    /// `n` latencies (ns) spread evenly on a log scale from `lo` to `hi`.
    fn spread(lo: f64, hi: f64, n: usize) -> Vec<u64> {
        (0..n)
            .map(|i| (lo * (hi / lo).powf(i as f64 / (n - 1) as f64)) as u64)
            .collect()
    }

    /// Runs whose latencies span what the plots meet: the user's report (15 ms to 1.5 s,
    /// where plotters ran 500000600000700000800000900001000000 together and labelled
    /// nothing left of 100000), a narrow span about 1 ms, and a wide one, 2 µs to 3 s.
    fn latency_cases() -> Vec<(&'static str, Vec<Series>)> {
        vec![
            (
                "reported",
                vec![with_latencies(LABEL_A, &spread(15e6, 1.5e9, 300))],
            ),
            (
                "narrow",
                vec![with_latencies(LABEL_A, &spread(0.9e6, 1.1e6, 300))],
            ),
            (
                "wide",
                vec![
                    with_latencies(LABEL_A, &spread(2e3, 3e9, 300)),
                    with_latencies(LABEL_B, &spread(50e3, 5e6, 300)),
                ],
            ),
            ("two-series", two_series()),
        ]
    }

    /// The value a tick label says, in the axis's unit (µs for a duration).
    fn said(format: Format, label: &str) -> f64 {
        if format != Format::Micros {
            return label.parse().unwrap_or_else(|e| panic!("{label:?}: {e}"));
        }
        let (number, unit) = label
            .split_once(' ')
            .unwrap_or_else(|| panic!("{label:?} has no unit"));
        let scale = match unit {
            "ns" => 1e-3,
            "µs" => 1.0,
            "ms" => 1e3,
            "s" => 1e6,
            _ => panic!("{label:?}: unit {unit:?}"),
        };
        number.parse::<f64>().unwrap() * scale
    }

    /// The extents along the axis, px, of the labels of `ticks`: measured afresh in the
    /// labels' font and placed by log10 (not ln) arithmetic, not taken from the ticks.
    fn label_boxes(axis: &AxisSpec, ticks: &Ticks) -> Vec<(f64, f64)> {
        let (lo, hi) = axis.range;
        ticks
            .ticks
            .iter()
            .map(|t| {
                let (w, h) = label_font().box_size(&t.label).unwrap();
                let size = f64::from(match axis.direction {
                    Direction::Horizontal => w,
                    Direction::Vertical => h,
                });
                let part = match axis.scale {
                    Scale::Linear => (t.value - lo) / (hi - lo),
                    Scale::Log => (t.value.log10() - lo.log10()) / (hi.log10() - lo.log10()),
                };
                let centre = part * axis.length;
                (centre - size / 2.0, centre + size / 2.0)
            })
            .collect()
    }

    /// The ticks of `axis`, after checking what every axis must have: labels that say
    /// their tick's value, are distinct, do not overlap or come within the direction's gap
    /// of each other, stay within the axis's room; ticks no closer than the least spacing;
    /// at least two labels (one on an axis of one whole number); and no stretch of more
    /// than 40 % of the axis, its ends included, without a label (or of one unit, on an
    /// axis of whole numbers).
    fn checked_ticks(axis: &AxisSpec) -> Ticks {
        let ticks = choose_ticks(axis, &label_size);
        let labels: Vec<&str> = ticks.ticks.iter().map(|t| t.label.as_str()).collect();
        let what = format!("{axis:?}: {labels:?}");
        let (lo, hi) = axis.range;
        let one_value = axis.format == Format::Integer && hi - lo <= 1.0;
        assert!(
            ticks.ticks.len() >= 2 || (one_value && ticks.ticks.len() == 1),
            "{what}: too few labels"
        );
        for t in &ticks.ticks {
            let v = said(axis.format, &t.label);
            assert!(
                (v - t.value).abs() <= 1e-9 * t.value.abs().max(1e-3),
                "{what}: {:?} is not {}",
                t.label,
                t.value
            );
            assert!(
                t.value >= lo && t.value <= hi,
                "{what}: {} off the axis",
                t.value
            );
        }
        let boxes = label_boxes(axis, &ticks);
        let (before, after) = axis.direction.room();
        for (b, label) in boxes.iter().zip(&labels) {
            assert!(
                b.0 >= -before - 1e-6 && b.1 <= axis.length + after + 1e-6,
                "{what}: {label:?} at {b:?} sticks out"
            );
        }
        for i in 0..boxes.len() {
            for j in i + 1..boxes.len() {
                let (a, b) = (boxes[i], boxes[j]);
                assert!(
                    b.0 - a.1 >= axis.direction.gap() - 1e-6,
                    "{what}: {:?} at {a:?} and {:?} at {b:?} overlap or touch",
                    labels[i],
                    labels[j]
                );
                assert_ne!(labels[i], labels[j], "{what}: a label twice");
                let spacing = (b.0 + b.1 - a.0 - a.1) / 2.0;
                assert!(
                    spacing >= axis.direction.min_spacing() - 1e-6,
                    "{what}: ticks {spacing} px apart"
                );
            }
        }
        if !one_value {
            let mut edges = vec![0.0];
            edges.extend(boxes.iter().map(|b| (b.0 + b.1) / 2.0));
            edges.push(axis.length);
            let longest = edges.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
            // Whole numbers may be further apart than that on a short range.
            let unit = match axis.format {
                Format::Integer => axis.length / (hi - lo),
                _ => 0.0,
            };
            assert!(
                longest <= (0.4 * axis.length).max(unit) + 1e-6,
                "{what}: {longest} px of {} without a label",
                axis.length
            );
        }
        ticks
    }

    /// Length of the x axis of a chart whose y labels fit the least y label area, px.
    const X_AXIS: f64 = (WIDTH - MARGIN - MARGIN_RIGHT - Y_LABEL_AREA) as f64;
    /// Length of the y axis under a 28 px caption, about, px.
    const Y_AXIS: f64 = (CHART_HEIGHT - 2 * MARGIN - 44 - TOP_PAD - X_LABEL_AREA) as f64;

    #[test]
    fn the_reported_latency_axis_is_labelled_from_its_left_end_without_labels_running_together() {
        load_font().unwrap();
        // The report's latency-cdf ran 0.01 s to 2 s; and a few spans about it.
        for range in [(1.1e4, 2e6), (3e4, 1.3e6), (1.0, 1e6), (1e5, 1e6)] {
            let axis = AxisSpec {
                scale: Scale::Log,
                format: Format::Micros,
                range,
                length: X_AXIS,
                direction: Direction::Horizontal,
            };
            let ticks = checked_ticks(&axis);
            let first = &ticks.ticks[0];
            assert!(
                first.at < 0.25 * axis.length,
                "{range:?}: the first label, {:?}, is {} px in",
                first.label,
                first.at
            );
            for t in &ticks.ticks {
                let digits = t.label.chars().take_while(|c| c.is_ascii_digit()).count();
                assert!(
                    digits <= 3,
                    "{range:?}: {:?} is not in a readable unit",
                    t.label
                );
            }
        }
        // Labels of the report's span, 1.1e4 to 2e6 µs.
        let axis = AxisSpec {
            scale: Scale::Log,
            format: Format::Micros,
            range: (1.1e4, 2e6),
            length: X_AXIS,
            direction: Direction::Horizontal,
        };
        let labels: Vec<String> = choose_ticks(&axis, &label_size)
            .ticks
            .into_iter()
            .map(|t| t.label)
            .collect();
        assert_eq!(
            labels,
            ["20 ms", "50 ms", "100 ms", "200 ms", "500 ms", "1 s", "2 s"],
            "1-2-5 in each decade"
        );
        // A linear axis over the same 0 to 10⁶.
        checked_ticks(&AxisSpec {
            scale: Scale::Linear,
            format: Format::Number,
            range: (0.0, 1e6),
            length: X_AXIS,
            direction: Direction::Horizontal,
        });
    }

    #[test]
    fn labels_never_overlap_on_any_axis_span() {
        load_font().unwrap();
        let lengths = [
            (Direction::Horizontal, X_AXIS),
            (Direction::Horizontal, 0.6 * X_AXIS),
            (Direction::Vertical, Y_AXIS),
            (Direction::Vertical, 0.7 * Y_AXIS),
        ];
        let mut axes = 0;
        for (direction, length) in lengths {
            let axis = |scale, format, range| AxisSpec {
                scale,
                format,
                range,
                length,
                direction,
            };
            // Latency: from under a ns to seconds, spans from the least the plots draw
            // (1.69, the fastest / 1.3 to the slowest × 1.3) to twelve decades.
            for lo in [
                7.7e-4, 0.05, 1.0, 7.0, 30.0, 77.0, 130.0, 850.0, 1e4, 3e4, 1e5, 2e6,
            ] {
                for ratio in [
                    1.69, 2.0, 3.0, 5.0, 8.0, 10.0, 20.0, 43.0, 100.0, 1e3, 1e4, 1e6, 1e9, 1e12,
                ] {
                    checked_ticks(&axis(Scale::Log, Format::Micros, (lo, lo * ratio)));
                    axes += 1;
                }
            }
            // Percent, MB/s, s or ms, MiB or GiB, counts.
            for hi in [
                1e-3, 6.6e-3, 0.066, 1.0, 1.17, 1.69, 2.09, 10.0, 37.7, 66.0, 100.0, 153.0, 999.0,
                2000.0, 4095.0, 32768.0, 1e6, 3.3e7,
            ] {
                checked_ticks(&axis(Scale::Linear, Format::Number, (0.0, hi)));
                axes += 1;
            }
            // Packed commands and requests per packed command.
            for top in [1.1, 2.2, 7.7, 44.0, 64.9, 1100.0, 1e5] {
                checked_ticks(&axis(Scale::Linear, Format::Integer, (0.0, top)));
                axes += 1;
            }
            for (kmin, kmax) in [
                (1, 1),
                (2, 2),
                (1, 2),
                (1, 8),
                (2, 17),
                (1, 40),
                (1, 63),
                (3, 200),
            ] {
                let range = (kmin as f64 - 0.5, kmax as f64 + 0.5);
                let ticks = checked_ticks(&axis(Scale::Linear, Format::Integer, range));
                assert!(ticks.ticks.iter().all(|t| t.value.fract() == 0.0));
                assert!(ticks.light.iter().all(|v| v.fract() == 0.0));
                axes += 1;
            }
        }
        assert_eq!(axes, 4 * (12 * 14 + 18 + 7 + 8));
    }

    #[test]
    fn a_log_axis_labels_its_decades_or_round_values_between_them() {
        load_font().unwrap();
        let labels = |range, length| -> Vec<String> {
            let axis = AxisSpec {
                scale: Scale::Log,
                format: Format::Micros,
                range,
                length,
                direction: Direction::Horizontal,
            };
            checked_ticks(&axis)
                .ticks
                .into_iter()
                .map(|t| t.label)
                .collect()
        };
        // Several decades: the decades alone, from the first.
        assert_eq!(
            labels((73.0, 3e5), X_AXIS),
            ["100 µs", "1 ms", "10 ms", "100 ms"]
        );
        // Twelve decades on half the width: every other decade.
        let sparse = labels((1e-3, 1e9), 0.5 * X_AXIS);
        assert_eq!(
            sparse,
            ["1 ns", "100 ns", "10 µs", "1 ms", "100 ms", "10 s", "1000 s"]
        );
        // Under a decade: round values between, each in its own unit.
        assert_eq!(
            labels((730.0, 1650.0), X_AXIS),
            [
                "800 µs", "900 µs", "1 ms", "1.1 ms", "1.2 ms", "1.3 ms", "1.4 ms", "1.5 ms",
                "1.6 ms"
            ]
        );
    }

    #[test]
    fn labels_say_their_value_in_a_readable_unit() {
        assert_eq!(tick_label(Format::Micros, 1500.0, Some(500.0)), "1.5 ms");
        assert_eq!(tick_label(Format::Micros, 1e6, None), "1 s");
        assert_eq!(tick_label(Format::Micros, 0.5, None), "500 ns");
        assert_eq!(tick_label(Format::Micros, 1050.0, Some(50.0)), "1.05 ms");
        assert_eq!(tick_label(Format::Micros, 999.0 + 1.0, Some(1.0)), "1 ms");
        assert_eq!(
            tick_label(Format::Number, 3.0 * 0.0002, Some(0.0002)),
            "0.0006"
        );
        assert_eq!(tick_label(Format::Number, 3.0 * 0.1, Some(0.1)), "0.3");
        assert_eq!(tick_label(Format::Number, 30000.0, Some(10000.0)), "30000");
        assert_eq!(tick_label(Format::Integer, 17.0, Some(1.0)), "17");
        assert_eq!(duration_text(20.9e6), "20.9 ms");
        assert_eq!(duration_text(1e6), "1 ms");
        assert_eq!(duration_text(1.537e9), "1.54 s");
        assert_eq!(duration_text(118e6), "118 ms");
    }

    /// The tick labels an SVG draws in the labels' font: (x, y, text) of those centred
    /// under the x axis, and of those right-aligned left of the y axis.
    #[allow(clippy::type_complexity)]
    fn svg_tick_labels(svg: &str) -> (Vec<(f64, f64, String)>, Vec<(f64, f64, String)>) {
        let attr = |tag: &str, name: &str| -> String {
            let start = tag.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
            tag[start..].split('"').next().unwrap().to_string()
        };
        // The SVG backend writes a font's size as plotters' layout height, size / 1.24.
        let size = f64::from(LABEL_SIZE) / 1.24;
        let (mut x, mut y) = (Vec::new(), Vec::new());
        let mut lines = svg.lines();
        while let Some(line) = lines.next() {
            if !line.starts_with("<text ") {
                continue;
            }
            let text = lines.next().unwrap().to_string();
            if (attr(line, "font-size").parse::<f64>().unwrap() - size).abs() > 0.01 {
                continue;
            }
            let at = (
                attr(line, "x").parse().unwrap(),
                attr(line, "y").parse().unwrap(),
                text,
            );
            match attr(line, "text-anchor").as_str() {
                "middle" => x.push(at),
                "end" => y.push(at),
                _ => {} // the legend's
            }
        }
        (x, y)
    }

    #[test]
    fn drawn_axis_labels_do_not_overlap_and_span_the_axis() {
        load_font().unwrap();
        for (case, series) in latency_cases() {
            let dir = tempfile::tempdir().unwrap();
            write_plots(dir.path(), TITLE, &series).unwrap();
            for name in NAMES {
                if name == "packing" && series.iter().all(|s| s.packing.is_empty()) {
                    continue; // a note, no axes
                }
                let (x, y) = svg_tick_labels(&svg(dir.path(), name));
                let what = format!("{case}: {name}");
                assert!(x.len() >= 2 && y.len() >= 2, "{what}: labels {x:?} {y:?}");
                for (labels, horizontal) in [(&x, true), (&y, false)] {
                    let mut boxes: Vec<(f64, f64, &str)> = labels
                        .iter()
                        .map(|(px, py, text)| {
                            let (w, h) = label_font().box_size(text).unwrap();
                            let (centre, size) = if horizontal {
                                (*px, f64::from(w))
                            } else {
                                (*py, f64::from(h))
                            };
                            (centre - size / 2.0, centre + size / 2.0, text.as_str())
                        })
                        .collect();
                    boxes.sort_by(|a, b| a.0.total_cmp(&b.0));
                    for pair in boxes.windows(2) {
                        assert!(
                            pair[1].0 - pair[0].1 >= 4.0,
                            "{what}: labels {:?} and {:?} overlap or touch",
                            pair[0],
                            pair[1]
                        );
                    }
                }
            }
            // The latency axes: labels in units, increasing left to right (bottom to top),
            // the first of them near the axis's start.
            let (cdf_x, _) = svg_tick_labels(&svg(dir.path(), "latency-cdf"));
            let (_, offset_y) = svg_tick_labels(&svg(dir.path(), "latency-offset"));
            let values = |labels: &[(f64, f64, String)]| -> Vec<f64> {
                labels.iter().map(|l| said(Format::Micros, &l.2)).collect()
            };
            let xs = values(&cdf_x);
            assert!(xs.windows(2).all(|w| w[0] < w[1]), "{case}: {cdf_x:?}");
            assert!(
                cdf_x.windows(2).all(|w| w[0].0 < w[1].0),
                "{case}: {cdf_x:?}"
            );
            let ys = values(&offset_y);
            assert!(ys.windows(2).all(|w| w[0] < w[1]), "{case}: {offset_y:?}");
            assert!(
                offset_y.windows(2).all(|w| w[0].1 > w[1].1),
                "{case}: {offset_y:?}"
            );
            let left = f64::from(MARGIN + Y_LABEL_AREA);
            assert!(
                cdf_x[0].0 < left + 0.3 * X_AXIS,
                "{case}: the first latency label {:?}",
                cdf_x[0]
            );
            if case == "reported" {
                assert!(xs[0] < 1e5, "{case}: nothing left of 100 ms: {cdf_x:?}");
                assert!(ys[0] < 1e5, "{case}: nothing under 100 ms: {offset_y:?}");
            }
        }
    }

    /// Not a check: renders the synthetic runs into `$PLOT_SAMPLE_DIR` to look at (two runs
    /// there, the other latency cases in subdirectories), with
    /// `PLOT_SAMPLE_DIR=/tmp/plots-sample cargo test -p emmc-sim --lib plot -- --ignored`.
    #[test]
    #[ignore]
    fn render_sample() {
        let dir = std::env::var_os("PLOT_SAMPLE_DIR").expect("set PLOT_SAMPLE_DIR");
        let dir = Path::new(&dir);
        for (case, series) in latency_cases() {
            let out = if case == "two-series" {
                dir.to_path_buf()
            } else {
                dir.join(case)
            };
            for f in write_plots(&out, TITLE, &series).unwrap() {
                println!("{}", f.display());
            }
        }
    }
}
