//! Block traces: one request per line, written by the daemon (`serve --trace`) and
//! replayed by the simulator. The format lives here, below both.
//!
//! ```text
//! # comment
//! <time_ns> <op> <offset_bytes> <length_bytes> [<completion_ns>]
//! 0        W   0       4096
//! 150000   R   1048576 65536
//! 300000   WF  8192    512      412000
//! 310000   F   0       0
//! ```
//!
//! `time_ns` is the submission time relative to the start of the trace (non-decreasing);
//! `op` is `R` read, `W` write, `WF` write with FUA (reliable write), `F` flush, `D`
//! discard; offset and length are bytes, multiples of 512 (flush takes 0 0). An optional
//! fifth column records when the request completed where the trace was captured; replay
//! ignores it. See `docs/trace-format.md`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{BufRead, Write};

use emmc_card::timing::Nanos;

/// A block request's operation, as a trace line names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    /// Reliable write (FUA).
    WriteReliable,
    Flush,
    Discard,
}

impl Op {
    pub fn is_write(self) -> bool {
        matches!(self, Op::Write | Op::WriteReliable)
    }
}

/// One block request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Earliest submission time (trace replay); `None` submits as soon as a slot is free.
    pub at: Option<Nanos>,
    pub op: Op,
    pub lba: u64,
    pub sectors: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("line {line}: {problem}")]
    Parse { line: usize, problem: String },
    #[error("reading the trace: {0}")]
    Io(#[from] std::io::Error),
}

/// Each operation and its code in the trace.
const TRACE_OPS: [(Op, &str); 5] = [
    (Op::Read, "R"),
    (Op::Write, "W"),
    (Op::WriteReliable, "WF"),
    (Op::Flush, "F"),
    (Op::Discard, "D"),
];

fn trace_code(op: Op) -> &'static str {
    TRACE_OPS
        .iter()
        .find(|(o, _)| *o == op)
        .map(|&(_, code)| code)
        .expect("every Op has a trace code")
}

/// Writes the trace format: the daemon's `serve --trace`. Times are card time relative
/// to `origin`; a request the format has no operation for is kept as a comment line.
///
/// Requests are recorded when they complete, which with several in flight is not the
/// order they arrived in, but the format wants non-decreasing submission times. So lines
/// are held until [`TraceWriter::release`] says no earlier arrival can still come, and
/// then written in arrival order (ties in the order they were recorded).
///
/// Tracing runs on the daemon's request path, so a line costs no allocation: it is held
/// as numbers and formatted into a reused buffer when written (docs/performance.md,
/// "Cost of tracing").
pub struct TraceWriter<W: Write> {
    out: W,
    origin: Nanos,
    /// Lines not yet written, earliest arrival (then earliest recorded) first.
    held: BinaryHeap<Reverse<Held>>,
    recorded: u64,
    /// The line being formatted.
    line: Vec<u8>,
}

/// A line waiting for its turn.
#[derive(Debug)]
struct Held {
    at: Nanos,
    seq: u64,
    done: Nanos,
    what: Line,
}

#[derive(Debug)]
enum Line {
    Request {
        op: Op,
        offset: u64,
        length: u64,
    },
    Note(String),
    /// An MMC command outside the format: `CMD<n> arg=0x<arg>`.
    Command {
        opcode: u8,
        arg: u32,
    },
}

impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Held {}

impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Held {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// "00" to "99": two digits per division.
const DIGIT_PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// Append `n` in decimal.
fn push_decimal(buf: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    while n >= 100 {
        let pair = (n % 100) as usize * 2;
        n /= 100;
        i -= 2;
        digits[i..i + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    }
    if n >= 10 {
        let pair = n as usize * 2;
        i -= 2;
        digits[i..i + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    } else {
        i -= 1;
        digits[i] = b'0' + n as u8;
    }
    buf.extend_from_slice(&digits[i..]);
}

impl<W: Write> TraceWriter<W> {
    pub fn new(mut out: W, origin: Nanos, heading: &str) -> std::io::Result<Self> {
        writeln!(out, "# {heading}")?;
        writeln!(out, "# time_ns op offset_bytes length_bytes completion_ns")?;
        Ok(TraceWriter {
            out,
            origin,
            held: BinaryHeap::new(),
            recorded: 0,
            line: Vec::with_capacity(128),
        })
    }

    fn hold(&mut self, at: Nanos, done: Nanos, what: Line) {
        self.recorded += 1;
        self.held.push(Reverse(Held {
            at,
            seq: self.recorded,
            done,
            what,
        }));
    }

    /// One request: submitted at card time `at`, completed at `done`.
    pub fn record(&mut self, at: Nanos, op: Op, offset: u64, length: u64, done: Nanos) {
        self.hold(at, done, Line::Request { op, offset, length });
    }

    /// A request outside the format (GET_ID, write zeroes, ...), as a comment.
    pub fn note(&mut self, at: Nanos, what: &str, done: Nanos) {
        self.hold(at, done, Line::Note(what.to_string()));
    }

    /// An MMC command the format has no operation for, as the comment
    /// `# <time_ns> CMD<n> arg=0x<arg> <completion_ns>` (the mmc transport's trace).
    pub fn note_command(&mut self, at: Nanos, opcode: u8, arg: u32, done: Nanos) {
        self.hold(at, done, Line::Command { opcode, arg });
    }

    /// A comment line, `# <text>`, written at once: the format allows comments
    /// anywhere, and parsers skip them wherever they fall among the held lines.
    pub fn comment(&mut self, text: &str) -> std::io::Result<()> {
        writeln!(self.out, "# {text}")
    }

    /// Card time `at` as the trace writes it: from the trace's origin.
    pub fn trace_time(&self, at: Nanos) -> Nanos {
        at.saturating_sub(self.origin)
    }

    /// Lines held (recorded, not yet written).
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Write every held line that arrived at or before `upto`: the caller knows that no
    /// request still in flight arrived earlier.
    pub fn release(&mut self, upto: Nanos) -> std::io::Result<()> {
        while self.held.peek().is_some_and(|Reverse(h)| h.at <= upto) {
            let Some(Reverse(h)) = self.held.pop() else {
                break;
            };
            self.write_line(&h)?;
        }
        Ok(())
    }

    /// Write a request's line at once, after any held line that arrived no later: for a
    /// caller that knows no earlier request can still come (the mmc transport executes
    /// requests one at a time, in arrival order). Nothing is held, so nothing is sorted.
    pub fn record_now(
        &mut self,
        at: Nanos,
        op: Op,
        offset: u64,
        length: u64,
        done: Nanos,
    ) -> std::io::Result<()> {
        self.write_now(at, done, Line::Request { op, offset, length })
    }

    /// [`TraceWriter::note_command`], written at once as [`TraceWriter::record_now`] is.
    pub fn note_command_now(
        &mut self,
        at: Nanos,
        opcode: u8,
        arg: u32,
        done: Nanos,
    ) -> std::io::Result<()> {
        self.write_now(at, done, Line::Command { opcode, arg })
    }

    fn write_now(&mut self, at: Nanos, done: Nanos, what: Line) -> std::io::Result<()> {
        self.release(at)?;
        self.recorded += 1;
        let h = Held {
            at,
            seq: self.recorded,
            done,
            what,
        };
        self.write_line(&h)
    }

    fn write_line(&mut self, h: &Held) -> std::io::Result<()> {
        let (t, d) = (
            h.at.saturating_sub(self.origin),
            h.done.saturating_sub(self.origin),
        );
        let line = &mut self.line;
        line.clear();
        match &h.what {
            Line::Request { op, offset, length } => {
                push_decimal(line, t);
                line.push(b' ');
                line.extend_from_slice(trace_code(*op).as_bytes());
                line.push(b' ');
                push_decimal(line, *offset);
                line.push(b' ');
                push_decimal(line, *length);
            }
            Line::Note(what) => {
                line.extend_from_slice(b"# ");
                push_decimal(line, t);
                line.push(b' ');
                line.extend_from_slice(what.as_bytes());
            }
            Line::Command { opcode, arg } => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                line.extend_from_slice(b"# ");
                push_decimal(line, t);
                line.extend_from_slice(b" CMD");
                push_decimal(line, u64::from(*opcode));
                line.extend_from_slice(b" arg=0x");
                line.extend((0..8).rev().map(|k| HEX[(arg >> (4 * k)) as usize & 0xF]));
            }
        }
        line.push(b' ');
        push_decimal(line, d);
        line.push(b'\n');
        self.out.write_all(line)
    }

    /// Write everything held (nothing is in flight any more) and flush.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.release(Nanos::MAX)?;
        self.out.flush()
    }
}

/// A parsed trace, replayed in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trace {
    requests: Vec<Request>,
    next: usize,
}

impl Trace {
    pub fn parse(reader: impl BufRead) -> Result<Trace, TraceError> {
        let mut requests = Vec::new();
        let mut last_time = 0;
        for (i, line) in reader.lines().enumerate() {
            let line = line?;
            let n = i + 1;
            let text = line.split('#').next().unwrap_or("").trim();
            if text.is_empty() {
                continue;
            }
            let bad = |problem: String| TraceError::Parse { line: n, problem };
            let fields: Vec<&str> = text.split_whitespace().collect();
            if !(4..=5).contains(&fields.len()) {
                return Err(bad(format!(
                    "expected 4 or 5 fields, found {}",
                    fields.len()
                )));
            }
            let number = |s: &str, what: &str| {
                s.parse::<u64>()
                    .map_err(|_| bad(format!("{what} {s:?} is not a non-negative integer")))
            };
            let time: Nanos = number(fields[0], "time")?;
            if time < last_time {
                return Err(bad(format!("time {time} goes back (previous {last_time})")));
            }
            last_time = time;
            let op = TRACE_OPS
                .iter()
                .find(|(_, code)| *code == fields[1])
                .map(|&(op, _)| op)
                .ok_or_else(|| bad(format!("unknown op {:?} (R, W, WF, F, D)", fields[1])))?;
            let offset = number(fields[2], "offset")?;
            let length = number(fields[3], "length")?;
            if fields.len() == 5 {
                number(fields[4], "completion time")?;
            }
            if offset % 512 != 0 || length % 512 != 0 {
                return Err(bad("offset and length must be multiples of 512".into()));
            }
            if op != Op::Flush && length == 0 {
                return Err(bad("length 0".into()));
            }
            let sectors = u32::try_from(length / 512)
                .ok()
                .filter(|&s| s <= 65_535)
                .ok_or_else(|| {
                    bad(format!(
                        "length {length} exceeds one request (65535 sectors)"
                    ))
                })?;
            requests.push(Request {
                at: Some(time),
                op,
                lba: offset / 512,
                sectors,
            });
        }
        Ok(Trace { requests, next: 0 })
    }

    pub fn len(&self) -> usize {
        self.requests.len()
    }

    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// The next request in the trace's order (`None` past the last).
    pub fn next_request(&mut self) -> Option<Request> {
        let r = self.requests.get(self.next).copied();
        self.next += 1;
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_writer_writes_parses_back() {
        let mut w = TraceWriter::new(Vec::new(), 1_000, "test").unwrap();
        w.record(1_000, Op::Write, 4096, 8192, 90_000);
        w.note(2_000, "GET_ID", 3_000);
        w.note_command(2_500, 13, 0x0001_0000, 2_600);
        w.record(5_000, Op::Flush, 0, 0, 6_000);
        w.record(7_000, Op::Discard, 0, 512, 9_000);
        w.flush().unwrap();
        let text = w.out.clone();
        let t = Trace::parse(&text[..]).unwrap();
        let ops: Vec<(Option<Nanos>, Op, u64, u32)> = t
            .requests
            .iter()
            .map(|r| (r.at, r.op, r.lba, r.sectors))
            .collect();
        assert_eq!(
            ops,
            vec![
                (Some(0), Op::Write, 8, 16),
                (Some(4_000), Op::Flush, 0, 0),
                (Some(6_000), Op::Discard, 0, 1)
            ]
        );
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("0 W 4096 8192 89000\n"), "{text}");
        assert!(text.contains("# 1000 GET_ID 2000\n"), "{text}");
        assert!(
            text.contains("# 1500 CMD13 arg=0x00010000 1600\n"),
            "{text}"
        );
    }

    /// Completion order is not arrival order; the file is in arrival order, and a line
    /// is written only once nothing earlier can still arrive.
    #[test]
    fn lines_recorded_out_of_order_are_written_in_arrival_order() {
        let mut w = TraceWriter::new(Vec::new(), 0, "test").unwrap();
        let header = w.out.len();
        w.record(3_000, Op::Read, 0, 512, 4_000);
        w.record(1_000, Op::Write, 512, 512, 5_000);
        w.release(999).unwrap();
        assert_eq!(w.out.len(), header, "nothing before the oldest in flight");
        assert_eq!(w.held(), 2);
        w.note(2_000, "GET_ID", 2_000);
        w.release(2_500).unwrap();
        assert_eq!(w.held(), 1, "the read at 3000 waits");
        w.record(3_000, Op::Flush, 0, 0, 6_000);
        w.flush().unwrap();
        assert_eq!(w.held(), 0);
        let text = String::from_utf8(w.out.clone()).unwrap();
        let body: Vec<&str> = text.lines().skip(2).collect();
        assert_eq!(
            body,
            [
                "1000 W 512 512 5000",
                "# 2000 GET_ID 2000",
                "3000 R 0 512 4000",
                "3000 F 0 0 6000"
            ]
        );
        Trace::parse(text.as_bytes()).unwrap();
    }

    #[test]
    fn decimal_formatting_matches_std() {
        let mut values: Vec<u64> = (0..1_000).collect();
        for k in 1..20 {
            let p = 10u64.pow(k);
            values.extend([p - 1, p, p + 1, p / 7 * 3]);
        }
        values.push(u64::MAX);
        for n in values {
            let mut buf = Vec::new();
            push_decimal(&mut buf, n);
            assert_eq!(String::from_utf8(buf).unwrap(), n.to_string());
        }
    }

    /// Lines written at once come after held lines that arrived no later, before held
    /// lines that arrived later.
    #[test]
    fn lines_written_at_once_keep_arrival_order() {
        let mut w = TraceWriter::new(Vec::new(), 0, "test").unwrap();
        w.record(1_000, Op::Write, 0, 512, 2_000);
        w.record(5_000, Op::Read, 512, 512, 6_000);
        w.record_now(3_000, Op::Read, 1024, 512, 3_500).unwrap();
        w.note_command_now(3_000, 13, 0x0001_0000, 3_600).unwrap();
        assert_eq!(w.held(), 1);
        w.flush().unwrap();
        let text = String::from_utf8(w.out.clone()).unwrap();
        let body: Vec<&str> = text.lines().skip(2).collect();
        assert_eq!(
            body,
            [
                "1000 W 0 512 2000",
                "3000 R 1024 512 3500",
                "# 3000 CMD13 arg=0x00010000 3600",
                "5000 R 512 512 6000"
            ]
        );
    }

    #[test]
    fn numbers_are_written_in_full() {
        let mut w = TraceWriter::new(Vec::new(), 0, "test").unwrap();
        w.record(0, Op::Read, u64::MAX - 511, 512, u64::MAX);
        w.record(9, Op::Write, 10, 99, 1_000_000_007);
        w.record(10, Op::Write, 0, 100, 1_000);
        w.flush().unwrap();
        let text = String::from_utf8(w.out.clone()).unwrap();
        let body: Vec<&str> = text.lines().skip(2).collect();
        assert_eq!(
            body,
            [
                "0 R 18446744073709551104 512 18446744073709551615",
                "9 W 10 99 1000000007",
                "10 W 0 100 1000"
            ]
        );
    }

    #[test]
    fn parses_every_op_and_ignores_comments_and_completion_times() {
        let text = "# header\n0 W 0 4096\n\n150000 R 1048576 65536 # inline\n300000 WF 8192 512 412000\n310000 F 0 0\n320000 D 0 1048576\n";
        let t = Trace::parse(text.as_bytes()).unwrap();
        assert_eq!(t.len(), 5);
        let r: Vec<Request> = t.requests.clone();
        assert_eq!(
            r[0],
            Request {
                at: Some(0),
                op: Op::Write,
                lba: 0,
                sectors: 8
            }
        );
        assert_eq!(
            r[1],
            Request {
                at: Some(150_000),
                op: Op::Read,
                lba: 2048,
                sectors: 128
            }
        );
        assert_eq!(r[2].op, Op::WriteReliable);
        assert_eq!(r[3].op, Op::Flush);
        assert_eq!(
            r[4],
            Request {
                at: Some(320_000),
                op: Op::Discard,
                lba: 0,
                sectors: 2048
            }
        );
    }

    #[test]
    fn errors_name_the_line_and_the_problem() {
        let cases = [
            ("0 W 0\n", "expected 4 or 5 fields"),
            ("0 X 0 512\n", "unknown op"),
            ("0 W 100 512\n", "multiples of 512"),
            ("10 W 0 512\n5 W 0 512\n", "goes back"),
            ("0 W 0 0\n", "length 0"),
            ("0 W 0 67108864\n", "exceeds one request"),
            ("-1 W 0 512\n", "non-negative integer"),
        ];
        for (text, want) in cases {
            let err = Trace::parse(text.as_bytes()).unwrap_err().to_string();
            assert!(err.contains(want), "{text:?}: {err}");
            assert!(err.starts_with("line "), "{err}");
        }
    }
}
