//! The MMC command log (`--cmd-log FILE`): one line for every command the SDHCI model puts
//! on the CMD line, for debugging a driver against the card, as the Linux MMC core's
//! `mmc0: starting CMD25 arg 00001000 flags 000000b5` / `req done (CMD25): ...` debug
//! lines are used. The format is in docs/trace-format.md, "MMC command log":
//!
//! ```text
//! <start_ns> CMD<n> <NAME> [auto] arg=0x<arg> [decoded argument] <response>
//!     [data=<read|write>:<blocks>x<blksz>[:packed]] dur=<ns> [busy-pending]
//!     [err=<command error>] [data-err=<data error>]
//! ```
//!
//! Times are card time from the log's origin (the daemon's or the simulation's start);
//! `dur` runs from the command's start to the start of the request's next command or the
//! request's end, so a data command's includes its data and the card's busy. The host
//! holds the log as an `Option`: with none, the controller pays one check per command.

use std::fmt::Write as _;
use std::io::Write;

use super::sdhci::{DataDirection, ResponseType, SdhciError};
use emmc_card::ext_csd::fields::field_at;
use emmc_card::timing::Nanos;
use emmc_card::{r1, CardState};

/// One command as the controller sent it, kept until its duration is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CmdEntry {
    pub start: Nanos,
    pub opcode: u8,
    pub arg: u32,
    pub resp_type: ResponseType,
    /// The card answered (false: no response arrived; `resp` is meaningless).
    pub answered: bool,
    pub auto: bool,
    pub resp: [u32; 4],
    /// The data phase that followed it: direction, block size, blocks, packed.
    pub data: Option<(DataDirection, u32, u32, bool)>,
    pub error: Option<SdhciError>,
}

/// Where the command log goes, and the card time its times count from.
pub struct CmdLog {
    out: std::io::BufWriter<Box<dyn Write + Send>>,
    origin: Nanos,
    /// The line being formatted (reused: no allocation per command).
    line: String,
}

impl std::fmt::Debug for CmdLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmdLog")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// Bytes buffered before a write reaches the file.
const BUFFER: usize = 1 << 16;

impl CmdLog {
    /// A log writing to `out`, times relative to card time `origin`, opened with a
    /// comment line `# <heading>` and one naming the fields.
    pub fn new(out: Box<dyn Write + Send>, origin: Nanos, heading: &str) -> std::io::Result<Self> {
        let mut out = std::io::BufWriter::with_capacity(BUFFER, out);
        writeln!(out, "# {heading}")?;
        writeln!(
            out,
            "# start_ns CMD<n> NAME [auto] arg=0x<arg> [decoded] response \
             [data=<dir>:<blocks>x<blksz>[:packed]] dur=<ns> [busy-pending] [err=..] [data-err=..]"
        )?;
        Ok(CmdLog {
            out,
            origin,
            line: String::with_capacity(256),
        })
    }

    /// A log in a new file at `path`.
    pub fn create(path: &std::path::Path, origin: Nanos, heading: &str) -> Result<Self, String> {
        let file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
        CmdLog::new(Box::new(file), origin, heading).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Write one command: it ran from `e.start` to `end`; `data_error` is its data
    /// phase's error, `busy_pending` that the request returned with the card busy.
    pub(crate) fn command(
        &mut self,
        e: &CmdEntry,
        end: Nanos,
        data_error: Option<SdhciError>,
        busy_pending: bool,
    ) -> std::io::Result<()> {
        self.line.clear();
        format_entry(
            &mut self.line,
            e,
            e.start.saturating_sub(self.origin),
            end.saturating_sub(e.start),
            data_error,
            busy_pending,
        );
        self.line.push('\n');
        self.out.write_all(self.line.as_bytes())
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

fn error_name(e: SdhciError) -> String {
    match e {
        SdhciError::CmdTimeout => "cmd-timeout".into(),
        SdhciError::CmdCrc => "cmd-crc".into(),
        SdhciError::CmdEndBit => "cmd-end-bit".into(),
        SdhciError::CmdIndex => "cmd-index".into(),
        SdhciError::DataTimeout => "data-timeout".into(),
        SdhciError::DataCrc => "data-crc".into(),
        SdhciError::Adma(status) => format!("adma(0x{status:02x})"),
    }
}

/// What the argument means, for the commands whose argument is more than an address.
fn decode_arg(s: &mut String, opcode: u8, arg: u32) {
    use emmc_card::packed::*;
    match opcode {
        23 => {
            let _ = write!(s, " blocks={}", arg & CMD23_BLOCK_COUNT_MASK);
            for (bit, name) in [
                (CMD23_RELIABLE_WRITE, "reliable"),
                (CMD23_PACKED, "packed"),
                (CMD23_TAG_REQUEST, "tag"),
                (CMD23_FORCED_PROGRAMMING, "forced"),
            ] {
                if arg & bit != 0 {
                    s.push(' ');
                    s.push_str(name);
                }
            }
            let context = (arg >> CMD23_CONTEXT_ID_SHIFT) & 0xF;
            if context != 0 {
                let _ = write!(s, " context={context}");
            }
        }
        6 => {
            let access = (arg >> 24) & 0x3;
            let index = ((arg >> 16) & 0xFF) as usize;
            let value = (arg >> 8) & 0xFF;
            let field = || field_at(index).map_or("reserved", |f| f.name);
            let _ = match access {
                0 => write!(s, " command-set={}", arg & 0x7),
                1 => write!(s, " set-bits {}[{index}] 0x{value:02x}", field()),
                2 => write!(s, " clear-bits {}[{index}] 0x{value:02x}", field()),
                _ => write!(s, " write-byte {}[{index}]=0x{value:02x}", field()),
            };
        }
        38 => {
            let kind = match arg {
                0x0000_0000 => "erase",
                0x0000_0001 => "trim",
                0x0000_0003 => "discard",
                0x8000_0000 => "secure-erase",
                0x8000_0001 => "secure-trim-1",
                0x8000_8000 => "secure-trim-2",
                _ => "",
            };
            if !kind.is_empty() {
                s.push(' ');
                s.push_str(kind);
            }
        }
        3 | 7 | 9 | 10 | 13 | 15 | 55 => {
            let _ = write!(s, " rca={}", arg >> 16);
            if opcode == 13 && arg & 1 != 0 {
                s.push_str(" hpi");
            }
        }
        _ => {}
    }
}

/// Append `n` in decimal (the log's lines are formatted without `fmt` on the hot path).
fn push_decimal(s: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    s.extend(digits[i..].iter().map(|&d| char::from(d)));
}

/// Append `n` as 8 lower-case hex digits.
fn push_hex8(s: &mut String, n: u32) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    s.extend(
        (0..8)
            .rev()
            .map(|k| char::from(HEX[(n >> (4 * k)) as usize & 0xF])),
    );
}

fn format_r1(s: &mut String, status: u32) {
    let state = CardState::name_of_number(r1::current_state(status));
    s.push_str(" 0x");
    push_hex8(s, status);
    s.push(' ');
    s.push_str(state);
    let mut first = true;
    for &(bit, name) in r1::NAMES {
        if status & bit != 0 && bit != r1::READY_FOR_DATA {
            s.push(if first { ' ' } else { '|' });
            s.push_str(name);
            first = false;
        }
    }
}

pub(crate) fn format_entry(
    s: &mut String,
    e: &CmdEntry,
    start: Nanos,
    dur: Nanos,
    data_error: Option<SdhciError>,
    busy_pending: bool,
) {
    let opcode = e.opcode & 0x3F;
    let name = emmc_card::command::spec(opcode).map_or("reserved", |c| c.name);
    push_decimal(s, start);
    s.push_str(" CMD");
    push_decimal(s, u64::from(opcode));
    s.push(' ');
    s.push_str(name);
    if e.auto {
        s.push_str(" auto");
    }
    s.push_str(" arg=0x");
    push_hex8(s, e.arg);
    decode_arg(s, opcode, e.arg);
    let kind = match e.resp_type {
        ResponseType::None => "none",
        ResponseType::R1 => "R1",
        ResponseType::R1b => "R1b",
        ResponseType::R2 => "R2",
        ResponseType::R3 => "R3",
        ResponseType::R4 => "R4",
        ResponseType::R5 => "R5",
    };
    s.push(' ');
    s.push_str(kind);
    if e.resp_type != ResponseType::None {
        if !e.answered {
            s.push_str(" -");
        } else {
            match e.resp_type {
                ResponseType::R1 | ResponseType::R1b => format_r1(s, e.resp[0]),
                ResponseType::R2 => {
                    for w in e.resp {
                        s.push_str(" 0x");
                        push_hex8(s, w);
                    }
                }
                _ => {
                    s.push_str(" 0x");
                    push_hex8(s, e.resp[0]);
                }
            }
        }
    }
    if let Some((dir, blksz, blocks, packed)) = e.data {
        let dir = match dir {
            DataDirection::Read => "read",
            DataDirection::Write => "write",
        };
        let _ = write!(s, " data={dir}:{blocks}x{blksz}");
        if packed {
            s.push_str(":packed");
        }
    }
    s.push_str(" dur=");
    push_decimal(s, dur);
    if busy_pending {
        s.push_str(" busy-pending");
    }
    if let Some(err) = e.error {
        let _ = write!(s, " err={}", error_name(err));
    }
    if let Some(err) = data_error {
        let _ = write!(s, " data-err={}", error_name(err));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::{FaultInjector, FaultPlan};
    use crate::mmc::{HostCaps, MmcHost};
    use crate::sdhci::SdhciConfig;
    use emmc_card::model::DeviceModel;
    use emmc_card::store::MemStore;
    use emmc_card::Card;
    use std::sync::{Arc, Mutex};

    /// A writer the test can read back.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Shared {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    /// A host with a command log from power-on, and what the log wrote.
    fn logged_host() -> (MmcHost, Shared, Nanos) {
        let m = DeviceModel::load("generic-emmc45").unwrap();
        let layout = Card::layout_for(&m);
        let card = Card::new(m.clone(), Box::new(MemStore::new(layout))).unwrap();
        let mut h = MmcHost::with_config(card, SdhciConfig::for_model(&m.host));
        let out = Shared::default();
        let origin = h.now;
        h.sdhci.set_cmd_log(Some(
            CmdLog::new(Box::new(out.clone()), origin, "test").unwrap(),
        ));
        h.mmc_init_card(&HostCaps::for_model(&m.host)).unwrap();
        (h, out, origin)
    }

    /// The field after `key=` in `line`.
    fn field<'a>(line: &'a str, key: &str) -> &'a str {
        line.split(' ')
            .find_map(|w| w.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in {line}"))
    }

    #[test]
    fn the_log_of_bring_up_a_cmd23_write_and_cmd13_shows_every_command() {
        let (mut h, out, origin) = logged_host();
        let mark = h.now - origin;
        h.mmc_write_blocks(16, &[0x5a; 4096], 0).unwrap();
        h.mmc_send_status().unwrap();
        h.sdhci.flush_cmd_log();
        let text = out.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "# test");
        assert!(lines[1].starts_with("# start_ns CMD<n>"), "{text}");
        let body = &lines[2..];
        // Bring-up as Linux's mmc_init_card sends it.
        assert!(
            body[0].contains(" CMD0 GO_IDLE_STATE arg=0x00000000 none dur="),
            "{text}"
        );
        let cmd1 = body.iter().find(|l| l.contains(" CMD1 ")).unwrap();
        assert!(cmd1.contains("SEND_OP_COND arg=0x40ff8080 R3 0x"), "{cmd1}");
        let cmd2 = body.iter().find(|l| l.contains(" CMD2 ")).unwrap();
        assert_eq!(cmd2.matches(" 0x").count(), 4, "four R2 words: {cmd2}");
        assert!(
            body.iter()
                .any(|l| l
                    .contains(" CMD3 SET_RELATIVE_ADDR arg=0x00010000 rca=1 R1 0x00000500 ident ")),
            "{text}"
        );
        assert!(
            body.iter().any(|l| l.contains(
                " CMD8 SEND_EXT_CSD arg=0x00000000 R1 0x00000900 tran data=read:1x512 dur="
            )),
            "{text}"
        );
        assert!(body.iter().any(|l| l.contains(" CMD6 SWITCH arg=0x03b90100 write-byte HS_TIMING[185]=0x01 R1b 0x00000900 tran dur=")), "{text}");
        // The write: Auto CMD23, CMD25 with its data, the CMD13 of mmc_write_blocks'
        // busy check, then ours, both in tran.
        let n = body.len();
        let tail = &body[n - 4..];
        assert_eq!(
            tail[2].split_once(' ').unwrap().1,
            tail[3].split_once(' ').unwrap().1
        );
        assert!(
            tail[0].contains(
                " CMD23 SET_BLOCK_COUNT auto arg=0x00000008 blocks=8 R1 0x00000900 tran dur="
            ),
            "{text}"
        );
        assert!(tail[1].contains(" CMD25 WRITE_MULTIPLE_BLOCK arg=0x00000010 R1 0x00000900 tran data=write:8x512 dur="), "{text}");
        assert!(
            tail[2].contains(" CMD13 SEND_STATUS arg=0x00010000 rca=1 R1 0x00000900 tran dur="),
            "{text}"
        );
        // Times: card time from the origin, in order; the write's duration covers its
        // data and programming, which a command alone does not take.
        let start = |l: &str| l.split(' ').next().unwrap().parse::<u64>().unwrap();
        let dur = |l: &str| field(l, "dur=").parse::<u64>().unwrap();
        assert!(
            body.windows(2).all(|w| start(w[0]) <= start(w[1])),
            "{text}"
        );
        assert!(start(tail[0]) >= mark, "{text}");
        assert_eq!(start(tail[0]) + dur(tail[0]), start(tail[1]), "{text}");
        assert!(dur(tail[1]) > 10 * dur(tail[0]), "{text}");
        assert!(start(tail[2]) >= start(tail[1]) + dur(tail[1]), "{text}");
        assert!(body.iter().all(|l| !l.contains("err=")), "{text}");
    }

    #[test]
    fn errors_a_fault_plan_injects_appear_in_the_log() {
        let (mut h, out, _) = logged_host();
        let plan = FaultPlan::from_toml_str(
            "[[rule]]\ncommand = 18\nnth = 1\neffect = { kind = \"data_crc\" }\n\
             [[rule]]\ncommand = 13\nnth = 1\neffect = { kind = \"cmd_timeout\" }\n",
        )
        .unwrap();
        h.sdhci
            .set_fault_injector(Some(FaultInjector::new(plan).unwrap()));
        let mut buf = [0u8; 4096];
        assert!(h.mmc_read_blocks(0, &mut buf).is_err());
        assert!(h.mmc_send_status().is_err());
        h.sdhci.flush_cmd_log();
        let text = out.text();
        let body: Vec<&str> = text.lines().collect();
        let tail = &body[body.len() - 4..];
        assert!(
            tail[0].contains(
                " CMD23 SET_BLOCK_COUNT auto arg=0x00000008 blocks=8 R1 0x00000900 tran dur="
            ),
            "{text}"
        );
        assert!(
            tail[1].contains(
                " CMD18 READ_MULTIPLE_BLOCK arg=0x00000000 R1 0x00000900 tran data=read:8x512 dur="
            ),
            "{text}"
        );
        assert!(tail[1].ends_with(" data-err=data-crc"), "{text}");
        assert!(
            tail[2].contains(" CMD12 STOP_TRANSMISSION arg=0x00000000 R1 0x00000"),
            "{text}"
        );
        assert!(!tail[2].contains("err="), "{text}");
        assert!(
            tail[3].contains(" CMD13 SEND_STATUS arg=0x00010000 rca=1 R1 - dur="),
            "{text}"
        );
        assert!(tail[3].ends_with(" err=cmd-timeout"), "{text}");
    }

    fn entry(opcode: u8, arg: u32, resp_type: ResponseType, resp0: u32) -> CmdEntry {
        CmdEntry {
            start: 1_000,
            opcode,
            arg,
            resp_type,
            answered: true,
            auto: false,
            resp: [resp0, 0, 0, 0],
            data: None,
            error: None,
        }
    }

    fn line(e: &CmdEntry, data_error: Option<SdhciError>) -> String {
        let mut s = String::new();
        format_entry(&mut s, e, e.start, 250, data_error, false);
        s
    }

    #[test]
    fn lines_name_the_command_decode_the_argument_and_the_r1() {
        let mut e = entry(23, 0x8000_0008, ResponseType::R1, 0x0000_0900);
        e.auto = true;
        assert_eq!(
            line(&e, None),
            "1000 CMD23 SET_BLOCK_COUNT auto arg=0x80000008 blocks=8 reliable R1 0x00000900 tran dur=250"
        );
        let mut e = entry(25, 0x1000, ResponseType::R1, 0x8000_0900);
        e.data = Some((DataDirection::Write, 512, 9, true));
        assert_eq!(
            line(&e, Some(SdhciError::DataCrc)),
            "1000 CMD25 WRITE_MULTIPLE_BLOCK arg=0x00001000 R1 0x80000900 tran \
             ADDRESS_OUT_OF_RANGE data=write:9x512:packed dur=250 data-err=data-crc"
        );
        let e = entry(
            6,
            0x03b3_0100,
            ResponseType::R1b,
            0x0000_0e00 | r1::SWITCH_ERROR,
        );
        assert_eq!(
            line(&e, None),
            "1000 CMD6 SWITCH arg=0x03b30100 write-byte PARTITION_CONFIG[179]=0x01 R1b \
             0x00000e80 prg SWITCH_ERROR dur=250"
        );
        let mut e = entry(13, 0x1_0000, ResponseType::R1, 0);
        e.answered = false;
        e.error = Some(SdhciError::CmdTimeout);
        assert_eq!(
            line(&e, None),
            "1000 CMD13 SEND_STATUS arg=0x00010000 rca=1 R1 - dur=250 err=cmd-timeout"
        );
        let e = entry(0, 0, ResponseType::None, 0);
        assert_eq!(
            line(&e, None),
            "1000 CMD0 GO_IDLE_STATE arg=0x00000000 none dur=250"
        );
    }
}
