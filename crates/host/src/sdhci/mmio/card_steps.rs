//! Every step that reaches the card, taken through the request-level model's own code
//! (`Run` and its command, data, busy, fault and tuning steps), so the bus rules, the
//! card's time, the fault plan and the command log are the same on both paths. Each
//! step runs eagerly in card time from the instant it starts and hands back what it did
//! and when; the register model reveals it once the guest's time gets there. A busy
//! period is never waited for here (`defer_now`): the card is left at the busy's start,
//! so a command arriving later (CMD13, an HPI) reaches the card at its own instant.

use emmc_card::command::ResponseType;
use emmc_card::timing::Nanos;
use emmc_card::Card;

use super::transfer::{Failure, StopReveal};
use crate::cmdlog::CmdEntry;
use crate::sdhci::cmd::Role;
use crate::sdhci::data::{DataFault, DataStart};
use crate::sdhci::inject::PendingFaults;
use crate::sdhci::run::Run;
use crate::sdhci::{error_int, normal_int, DataDirection, MmcCommand, SdhciError, SdhciHost};

/// A command exchange (with its Auto CMD23), as the register model reveals it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Exchange {
    /// The end of the response, or when the controller gave up waiting for it.
    pub(super) at: Nanos,
    /// The command went out (a failed Auto CMD23 keeps it back).
    pub(super) issued: bool,
    pub(super) error: Option<SdhciError>,
    /// Status the exchange raises at `at` (ERROR_INT is the register's own).
    pub(super) normal: u16,
    pub(super) error_bits: u16,
    pub(super) auto_cmd_err: u16,
    /// The Response registers after the exchange.
    pub(super) response: [u32; 4],
}

/// The data phase of the command being sent: direction, block size, blocks, packed.
pub(super) type DataInfo = (DataDirection, u32, u32, bool);

fn run<'h>(host: &'h mut SdhciHost, card: &'h mut Card, at: Nanos, opcode: u8) -> Run<'h> {
    let mut run = Run::new(host, card, at, opcode);
    run.defer_final_busy = true;
    run.defer_now = true;
    run
}

/// Optional Auto CMD23, then the command, from `at`. The command's log entry is left in
/// `log` (the Auto CMD23's is written when the command starts, as on the request path),
/// the fault plan's pending data effects in `injected`.
#[allow(clippy::too_many_arguments)]
pub(super) fn exchange(
    host: &mut SdhciHost,
    card: &mut Card,
    at: Nanos,
    sbc: Option<MmcCommand>,
    cmd: &MmcCommand,
    data: Option<DataInfo>,
    log: &mut Option<CmdEntry>,
    injected: &mut PendingFaults,
) -> Exchange {
    let mut run = run(host, card, at, cmd.opcode);
    let mut issued = true;
    let mut error = None;
    if let Some(sbc) = sbc {
        let o = run.send_command(&sbc, Role::AutoCmd23);
        if o.error.is_some() {
            issued = false;
            error = o.error;
        }
    }
    if issued {
        run.data_cmd = data;
        let o = run.send_command(cmd, Role::Normal);
        run.data_cmd = None;
        error = o.error;
    }
    *injected = std::mem::take(&mut run.injected);
    *log = run.logged.take();
    Exchange {
        at: run.now,
        issued,
        error,
        normal: run.out.int_status.normal & !normal_int::ERROR_INT,
        error_bits: run.out.int_status.error,
        auto_cmd_err: run.out.auto_cmd_err,
        response: run.host.response,
    }
}

/// A fault the shared data steps reported, as the register model reveals it: a time-out
/// at the instant it fires (the card is not run ahead to it), a CRC error at once.
fn failure_of(run: &mut Run<'_>, fault: DataFault) -> Failure {
    match fault {
        DataFault::Timeout { after } => Failure::new(
            run.now.saturating_add(after),
            error_int::DATA_TIMEOUT,
            SdhciError::DataTimeout,
        ),
        DataFault::Crc => {
            let e = run.data_crc();
            Failure::new(run.now, error_int::DATA_CRC, e)
        }
        DataFault::Raised(e) => Failure::new(run.now, run.out.int_status.error, e),
    }
}

/// A read's card side from `at`: what the bus makes of it, then every block off the card
/// into `buf` (a controller whose buffer holds the whole transfer). `Ok`: when the last
/// block is in.
#[allow(clippy::too_many_arguments)]
pub(super) fn read_blocks(
    host: &mut SdhciHost,
    card: &mut Card,
    at: Nanos,
    opcode: u8,
    blksz: usize,
    blocks: u32,
    per_block: Nanos,
    budget: Nanos,
    injected: &mut PendingFaults,
    buf: &mut Vec<u8>,
) -> Result<Nanos, Failure> {
    let mut run = run(host, card, at, opcode);
    run.injected = std::mem::take(injected);
    let bus = run.host.bus();
    let len = blksz * blocks as usize;
    let result = match run.data_start(true, false, blksz, &bus, per_block) {
        Err(fault) => Err(fault),
        Ok(DataStart {
            card_len,
            problem: Some(why),
        }) => Err(run.garble_read(buf, card_len, &bus, why)),
        Ok(DataStart { problem: None, .. }) => {
            buf.clear();
            buf.resize(len, 0);
            run.receive_blocks(
                &mut buf[..len],
                blksz,
                u64::from(blocks),
                &bus,
                per_block,
                budget,
            )
        }
    };
    *injected = std::mem::take(&mut run.injected);
    match result {
        Ok(()) => Ok(run.now),
        Err(fault) => Err(failure_of(&mut run, fault)),
    }
}

/// A write's start at `at`: whether the card takes data at all (else the time-out), and
/// why its blocks would be garbage (a mismatched bus or a planned CRC error), if so.
pub(super) fn write_start(
    host: &mut SdhciHost,
    card: &mut Card,
    at: Nanos,
    opcode: u8,
    blksz: usize,
    per_block: Nanos,
    injected: &mut PendingFaults,
) -> Result<Option<&'static str>, Failure> {
    let mut run = run(host, card, at, opcode);
    run.injected = std::mem::take(injected);
    let bus = run.host.bus();
    let result = run.data_start(false, false, blksz, &bus, per_block);
    *injected = std::mem::take(&mut run.injected);
    match result {
        Ok(start) => Ok(start.problem),
        Err(fault) => Err(failure_of(&mut run, fault)),
    }
}

/// Send `data` (whole blocks) to the card from `at`; `garbled`: the first block fails
/// instead. `Ok`: when the last of them is out (the card's busy is left to the caller).
/// With SDCLK stopped (the guest may stop it between two PIO blocks or at an SDMA
/// boundary) nothing goes out: the data times out, and the card's time is not run to the
/// end of a bus that never clocks.
#[allow(clippy::too_many_arguments)]
pub(super) fn send_blocks(
    host: &mut SdhciHost,
    card: &mut Card,
    at: Nanos,
    opcode: u8,
    data: &[u8],
    blksz: usize,
    per_block: Nanos,
    budget: Nanos,
    injected: Option<&mut PendingFaults>,
    garbled: Option<&'static str>,
) -> Result<Nanos, Failure> {
    if host.bus().clock_hz == 0 {
        // SDCLK stopped in the middle of a transfer: the blocks never go out.
        log::debug!("CMD{opcode}: SD clock stopped during the data phase");
        return Err(Failure::new(
            at.saturating_add(per_block),
            error_int::DATA_TIMEOUT,
            SdhciError::DataTimeout,
        ));
    }
    let mut run = run(host, card, at, opcode);
    let mut injected = injected;
    if let Some(i) = injected.as_deref_mut() {
        run.injected = std::mem::take(i);
    }
    let bus = run.host.bus();
    let blocks = (data.len() / blksz.max(1)) as u64;
    let result = match garbled {
        Some(why) => Err(run.garble_write(blksz, &bus, why)),
        None => run.send_blocks(data, blksz, blocks, &bus, per_block, budget),
    };
    if let Some(i) = injected {
        *i = std::mem::take(&mut run.injected);
    }
    match result {
        Ok(()) => Ok(run.now),
        Err(fault) => Err(failure_of(&mut run, fault)),
    }
}

/// Auto CMD12 from `at`. The data command's log entry in `log` ends where it starts; the
/// stop's own is left there. Returns what to reveal and the stop's error.
pub(super) fn auto_cmd12(
    host: &mut SdhciHost,
    card: &mut Card,
    at: Nanos,
    log: &mut Option<CmdEntry>,
) -> (StopReveal, Option<SdhciError>) {
    let mut run = run(host, card, at, 12);
    run.logged = log.take();
    let stop = MmcCommand::new(12, 0, ResponseType::R1b);
    let o = run.send_command(&stop, Role::AutoCmd12);
    *log = run.logged.take();
    (
        StopReveal {
            at: run.now,
            response: run.host.response[3],
            error_bits: run.out.int_status.error,
            auto_cmd_err: run.out.auto_cmd_err,
        },
        o.error,
    )
}

/// One tuning command (CMD21, its block read into the controller) from `at`, written to
/// the command log at once. Returns when it ended, whether Buffer Read Ready came, and
/// whether the block arrived intact.
pub(super) fn tuning_block(
    host: &mut SdhciHost,
    card: &mut Card,
    at: Nanos,
    blksz: usize,
) -> (Nanos, bool, bool) {
    let mut run = run(host, card, at, 21);
    let intact = run.send_tuning(blksz);
    let brr = run.out.int_status.has(normal_int::BUF_READ_READY);
    let end = run.now;
    run.log_previous(end, false);
    (end, brr, intact)
}
