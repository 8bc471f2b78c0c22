//! An SDHCI v3.00 host controller with ADMA2, executing one MMC request at a time the way
//! the controller and Linux's `drivers/mmc/host/sdhci.c` together do: optional CMD23
//! (manual or Auto CMD23), the command, the data phase through an ADMA2 descriptor table,
//! the stop (manual or Auto CMD12), busy waiting, time-outs, and the interrupt and error
//! status a driver would see. Names follow the SD Host Controller specification for
//! register bits ([`regs`]) and the Linux MMC core for requests (`struct mmc_request`,
//! `mmc_command`, `mmc_data`, `mmc_ios`).
//!
//! # Time
//!
//! The controller keeps no clock of its own: the caller owns the card time `now` and the
//! controller moves it forward by what each step costs, passing it to every card call:
//!
//! - `request_overhead_ns` once per request (host software and controller set-up);
//! - each command exchange [`Bus::command_ns`] at the current ios, the card seeing the
//!   command at the end of the exchange; a command the card does not answer costs the
//!   command token plus the 64-clock response window ([`NCR_MAX`]);
//! - read data: the card's own access and internal read time (what `Card::read_data`
//!   returns), then [`Bus::read_ns`];
//! - write data: [`Bus::write_ns`] (blocks with their CRC status tokens), then the card's
//!   programming busy up to `Card::busy_until`;
//! - R1b: the card's busy up to `Card::busy_until`.
//!
//! For a request without errors this is exactly what `sim::device::CardDevice` charges
//! (tests: `timing_equals_card_device_*`).
//!
//! # Decisions the fact sheet leaves open
//!
//! - **Clock above the card's timing.** The card's limit follows HS_TIMING: 26 MHz
//!   backward-compatible, 52 MHz high speed (26 MHz for an HS26-only card) and DDR52,
//!   200 MHz HS200. Up to twice the limit the card still samples what the host drives but
//!   the host cannot sample what the card drives: the card executes the command and the
//!   host sees CMD_CRC (a data command's CMD_CRC is then handled as a data CRC error, as
//!   `sdhci_cmd_irq` does, so no data moves and the stop is sent). Beyond twice the limit
//!   the card cannot sample the command either: it gets `execute_checked(.., false)`,
//!   stays silent and records COM_CRC_ERROR, and the host sees CMD_TIMEOUT.
//! - **Data bus mismatch.** When the host's width or data rate (DDR52 or not) differs from
//!   the card's BUS_WIDTH, or the block size differs from the card's, every data block is
//!   garbage on the other side: a read delivers the card's first block, the host flags
//!   DATA_CRC and nothing reaches host memory; a written block fails the card's CRC check,
//!   the card takes nothing and answers a negative CRC status (DATA_CRC).
//! - **HS200 before tuning.** Above 52 MHz in HS200 timing, read data sampled before a
//!   successful [`SdhciHost::execute_tuning`] is DATA_CRC. Tuning blocks themselves are
//!   exempt (the controller is sweeping its sampling point); the modelled sweep finds a
//!   point on the first tuning block that arrives intact.
//! - **Data time-out.** The data time-out is computed as Linux does (`mmc_set_data_timeout`
//!   from TAAC, NSAC and R2W_FACTOR of `Card::csd`, then `sdhci_calc_timeout` against the
//!   timeout clock), unless the request gives its own. The SDHCI counter restarts at every
//!   block, and the card models charge the internal work of a whole transfer as one piece,
//!   so a read's access time or a write's final busy is compared with the time-out times
//!   the block count (the budget Linux's `sdhci_calc_sw_timeout` also uses). When it is
//!   exceeded the host sees DATA_TIMEOUT one time-out after the gap began.
//! - **R1b busy time-out**: the command's `busy_timeout_ms` through `sdhci_calc_timeout`
//!   (0 or too large: the maximum count, 2^27 TMCLK cycles), unless the controller may
//!   disable its hardware time-out (`disable_hw_timeout`, Linux
//!   `SDHCI_QUIRK2_DISABLE_HW_TIMEOUT`), which leaves Linux's software timer.
//! - **ADMA2.** The descriptor table is built and checked before the command is issued
//!   (as a controller that prefetches the chain would find it, and before anything reaches
//!   the card): a total length other than block size × block count, a block count the
//!   16-bit register cannot hold, a block size of 0 or above the controller's maximum,
//!   more descriptors than the table holds, or an address 32-bit ADMA2 cannot reach is
//!   ADMA_ERR with the ADMA Error Status, and no command is sent.
//! - **Response type mismatch**: a response of the other length is CMD_END_BIT; an R3
//!   (index 0x3F, no CRC) where R1/R1b is expected is CMD_CRC and CMD_INDEX.
//! - **Power off** cuts the card's power (`PowerDown::Sudden`); commands then time out.
//!   Power on from off power-cycles the card into idle. A stopped SD clock sends nothing:
//!   commands fail with CMD_TIMEOUT at once and no time passes.
//! - **`bytes_xfered`** is the whole transfer on success and 0 on any data error, as
//!   `sdhci_finish_data` reports it.
//! - Not modelled: SDMA and PIO transfers (tuning uses PIO internally), DMA_INT (Linux's
//!   ADMA2 tables set no Int attribute), descriptor fetch time, power-up delays, the
//!   400 kHz open-drain limit of identification, signal voltages, card interrupts.

mod adma;
pub mod regs;
mod timeout;

#[cfg(test)]
mod tests;

use super::cmdlog::{CmdEntry, CmdLog};
use crate::fault::{self, CommandInfo, Effect, FaultInjector};
use emmc_card::model::HostProfile;
use emmc_card::timing::bus::{ResponseLength, COMMAND_BITS};
use emmc_card::timing::{Bus, Nanos};
use emmc_card::{Card, Command, DataError, PowerDown, Response};

pub use adma::{AdmaLimits, DmaBuf, DmaSegment, ADMA2_ALIGN};
pub use emmc_card::command::ResponseType;
pub use emmc_card::model::BusTiming;
pub use regs::{adma2_attr, adma_err, auto_cmd_err, error_int, normal_int, IntStatus};
pub use timeout::{
    calc_timeout_count, hardware_timeout_ns, mmc_data_timeout, target_timeout_us, MAX_TIMEOUT_COUNT,
};

use adma::AdmaDesc;

/// Clocks the controller waits for a response start bit before Command Timeout (NCR
/// maximum, facts §12.4).
pub const NCR_MAX: u64 = 64;
/// The v3 Block Count register is 16 bits wide.
pub const MAX_BLOCK_COUNT: u32 = 65_535;
/// Linux gives up tuning after this many tuning commands (`MAX_TUNING_LOOP`).
pub const MAX_TUNING_LOOP: u32 = 40;
/// How long Linux waits for the Buffer Read Ready of one tuning command.
pub const TUNING_WAIT_NS: Nanos = 50_000_000;
/// Above this clock HS200 needs a tuned sampling point.
pub const TUNING_NEEDED_ABOVE_HZ: u64 = 52_000_000;

/// Transfer direction (Transfer Mode bit 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataDirection {
    /// Card → host.
    Read,
    /// Host → card.
    Write,
}

/// What the controller reports Linux would store in `mmc_command.error` or
/// `mmc_data.error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SdhciError {
    #[error("command timeout")]
    CmdTimeout,
    #[error("command response CRC error")]
    CmdCrc,
    #[error("command response end bit error")]
    CmdEndBit,
    #[error("command response index error")]
    CmdIndex,
    #[error("data timeout")]
    DataTimeout,
    #[error("data CRC error")]
    DataCrc,
    #[error("ADMA error (ADMA error status {0:#04x})")]
    Adma(u8),
}

/// One command (`struct mmc_command`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmcCommand {
    /// CMD index; the Command register keeps its low 6 bits.
    pub opcode: u8,
    pub arg: u32,
    /// The response the host expects, which sets the Command register's response type and
    /// its CRC and index checks.
    pub resp_type: ResponseType,
    /// Wait for busy on DAT0 after the response (response type "48-bit with busy").
    pub busy: bool,
    /// Busy time-out in milliseconds (0: unspecified, the controller's maximum).
    pub busy_timeout_ms: u32,
}

impl MmcCommand {
    /// A command expecting `resp_type`, waiting for busy when that is R1b.
    pub fn new(opcode: u8, arg: u32, resp_type: ResponseType) -> MmcCommand {
        MmcCommand {
            opcode,
            arg,
            resp_type,
            busy: resp_type == ResponseType::R1b,
            busy_timeout_ms: 0,
        }
    }

    /// A command with the response the eMMC 4.5 command table gives `opcode` (R1 for an
    /// index the table does not define).
    pub fn for_opcode(opcode: u8, arg: u32) -> MmcCommand {
        let resp = emmc_card::command::spec(opcode & 0x3F).map_or(ResponseType::R1, |s| s.response);
        MmcCommand::new(opcode, arg, resp)
    }

    pub fn with_busy_timeout(mut self, ms: u32) -> MmcCommand {
        self.busy_timeout_ms = ms;
        self
    }
}

/// The data phase of a request (`struct mmc_data`).
#[derive(Debug)]
pub struct MmcData<'a, S> {
    /// Block size in bytes (Block Size register [11:0]).
    pub blksz: u32,
    /// Number of blocks (Block Count register; at most [`MAX_BLOCK_COUNT`]).
    pub blocks: u32,
    pub direction: DataDirection,
    /// Host memory, in order; the total must be `blksz × blocks`. Blocks may straddle
    /// segments.
    pub sg: &'a mut [S],
    /// Data time-out as the MMC core sets it; both 0: computed from the card's CSD as
    /// `mmc_set_data_timeout` does.
    pub timeout_ns: u64,
    pub timeout_clks: u32,
}

impl<'a, S: DmaSegment> MmcData<'a, S> {
    pub fn new(direction: DataDirection, blksz: u32, blocks: u32, sg: &'a mut [S]) -> Self {
        MmcData {
            blksz,
            blocks,
            direction,
            sg,
            timeout_ns: 0,
            timeout_clks: 0,
        }
    }

    pub fn read(blksz: u32, blocks: u32, sg: &'a mut [S]) -> Self {
        MmcData::new(DataDirection::Read, blksz, blocks, sg)
    }

    pub fn write(blksz: u32, blocks: u32, sg: &'a mut [S]) -> Self {
        MmcData::new(DataDirection::Write, blksz, blocks, sg)
    }
}

/// One request (`struct mmc_request`): optional SET_BLOCK_COUNT, the command, optional
/// data, optional stop. Whether CMD23 and CMD12 go out automatically is the controller's
/// choice ([`SdhciConfig::auto_cmd23`], [`SdhciConfig::auto_cmd12`]), as in Linux.
#[derive(Debug)]
pub struct MmcRequest<'a, S> {
    pub sbc: Option<MmcCommand>,
    pub cmd: MmcCommand,
    pub data: Option<MmcData<'a, S>>,
    pub stop: Option<MmcCommand>,
}

impl MmcRequest<'static, Vec<u8>> {
    /// A request of one command without data.
    pub fn command(cmd: MmcCommand) -> Self {
        MmcRequest {
            sbc: None,
            cmd,
            data: None,
            stop: None,
        }
    }
}

/// What happened to one command of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandOutcome {
    pub opcode: u8,
    /// It went out on the CMD line (false: refused or cut short before it).
    pub issued: bool,
    /// Sent by the controller itself (Auto CMD23 / Auto CMD12).
    pub auto: bool,
    /// The response as Linux stores it in `mmc_command.resp`: a short response in
    /// `resp[0]`; an R2 as the 128-bit register, `resp[0]` holding bits 127:96 and the CRC
    /// byte (which SDHCI does not keep) reading 0.
    pub resp: [u32; 4],
    pub error: Option<SdhciError>,
}

impl CommandOutcome {
    fn pending(opcode: u8) -> CommandOutcome {
        CommandOutcome {
            opcode,
            issued: false,
            auto: false,
            resp: [0; 4],
            error: None,
        }
    }

    /// Issued and answered without error.
    pub fn ok(&self) -> bool {
        self.issued && self.error.is_none()
    }
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SdhciCompletion {
    pub sbc: Option<CommandOutcome>,
    pub cmd: CommandOutcome,
    pub stop: Option<CommandOutcome>,
    /// Linux's `mmc_data.error`.
    pub data_error: Option<SdhciError>,
    /// Linux's `mmc_data.bytes_xfered`.
    pub bytes_xfered: u64,
    /// Every interrupt status bit the request raised, accumulated in the order a driver's
    /// interrupt handler would have seen (and cleared) them.
    pub int_status: IntStatus,
    /// Auto CMD Error Status (0x3C), see [`auto_cmd_err`].
    pub auto_cmd_err: u16,
    /// ADMA Error Status (0x54), see [`adma_err`].
    pub adma_err: u8,
    /// Card time at which the request was issued and at which it completed.
    pub start_ns: Nanos,
    pub end_ns: Nanos,
    /// Started with [`SdhciHost::start_request`]: the card still holds DAT0 busy after the
    /// request's last step (write programming or an R1b command); `end_ns` is when the
    /// busy began. The owner waits with [`SdhciHost::wait_busy_until`] or stops waiting to
    /// send an HPI.
    pub busy_pending: bool,
}

impl SdhciCompletion {
    /// The first error of the request, in the order sbc, cmd, data, stop.
    pub fn error(&self) -> Option<SdhciError> {
        self.sbc
            .and_then(|c| c.error)
            .or(self.cmd.error)
            .or(self.data_error)
            .or(self.stop.and_then(|c| c.error))
    }

    pub fn is_ok(&self) -> bool {
        self.error().is_none() && self.cmd.issued
    }

    pub fn duration_ns(&self) -> Nanos {
        self.end_ns - self.start_ns
    }
}

/// Why [`SdhciHost::execute_tuning`] failed (Linux falls back to a fixed sampling clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TuningError {
    #[error("no Buffer Read Ready for tuning command {tries}")]
    NoBufferReadReady { tries: u32 },
    #[error("tuning did not complete in {tries} tuning commands")]
    Failed { tries: u32 },
}

/// Linux's `ios.power_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerMode {
    Off,
    Up,
    On,
}

/// Bus settings the driver chooses (`struct mmc_ios`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmcIos {
    /// Requested card clock in Hz (0: SD clock stopped).
    pub clock: u64,
    /// Data lines: 1, 4 or 8 (anything else is 1: Host Control 1 encodes only these).
    pub bus_width: u8,
    pub timing: BusTiming,
    pub power_mode: PowerMode,
}

impl MmcIos {
    /// Powered, 400 kHz, one line, backward-compatible timing: card identification.
    pub const IDENTIFICATION: MmcIos = MmcIos {
        clock: 400_000,
        bus_width: 1,
        timing: BusTiming::Legacy,
        power_mode: PowerMode::On,
    };
}

/// How SDCLK is made from the requested clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SdClock {
    /// The requested clock exactly (a platform clock set through the host's own clock
    /// driver, as many SoC SDHCI glue drivers do).
    Exact,
    /// The v3 10-bit divided clock mode: base / 1 or base / (2N), the smallest divisor not
    /// above the request (`sdhci_calc_clk`).
    Divided { base_hz: u64 },
}

/// The controller's capabilities and the choices its Linux driver makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SdhciConfig {
    pub sd_clock: SdClock,
    /// TMCLK, the data time-out counter's clock (Capabilities [7:0]).
    pub timeout_clock_hz: u64,
    /// Largest block size (Capabilities [17:16]: 512, 1024 or 2048).
    pub max_block_len: u32,
    pub adma: AdmaLimits,
    /// Auto CMD12 for multi-block transfers without CMD23 (Linux `SDHCI_AUTO_CMD12`, set
    /// only by a quirk).
    pub auto_cmd12: bool,
    /// Auto CMD23 for requests with a CMD23 (Linux `SDHCI_AUTO_CMD23`: v3 hosts using ADMA).
    pub auto_cmd23: bool,
    /// The controller may switch its data time-out off for targets beyond its counter
    /// (Linux `SDHCI_QUIRK2_DISABLE_HW_TIMEOUT`); the driver's software timer then applies.
    pub disable_hw_timeout: bool,
    /// Host time per request before its first command.
    pub request_overhead_ns: Nanos,
}

impl Default for SdhciConfig {
    /// An eMMC-only v3 host with 64-bit ADMA2: exact clock, TMCLK 52 MHz (as QEMU's
    /// default capabilities), 2048-byte blocks, Linux's 257-descriptor table, Auto CMD23.
    fn default() -> Self {
        SdhciConfig {
            sd_clock: SdClock::Exact,
            timeout_clock_hz: 52_000_000,
            max_block_len: 2048,
            adma: AdmaLimits {
                table_len: 128 * 2 + 1,
                max_len: 65_536,
                addr64: true,
            },
            auto_cmd12: false,
            auto_cmd23: true,
            disable_hw_timeout: false,
            request_overhead_ns: 0,
        }
    }
}

impl SdhciConfig {
    /// The default controller with a model's per-request host overhead.
    pub fn for_model(host: &HostProfile) -> SdhciConfig {
        SdhciConfig {
            request_overhead_ns: host.request_overhead_ns,
            ..SdhciConfig::default()
        }
    }
}

/// The controller: configuration, ios, tuning state and its buffers. It drives a card it
/// is handed with every call, so that an owner (see [`Sdhci`] and
/// [`crate::mmc::MmcHost`]) keeps the card and the card time.
#[derive(Debug)]
pub struct SdhciHost {
    config: SdhciConfig,
    ios: MmcIos,
    actual_clock: u64,
    /// Host Control 2 Sampling Clock Select: tuning succeeded.
    tuned: bool,
    /// Response registers 0x10..0x1F as four 32-bit words (0x10 first).
    response: [u32; 4],
    staging: Vec<u8>,
    table: Vec<AdmaDesc>,
    /// The card's CSD and the data time-outs derived from it (read, write), as the MMC
    /// core decodes them once rather than per request.
    data_timeouts: Option<([u8; 16], DataTimeouts)>,
    /// A fault plan consulted for every command put on the bus (`None`: no faults, and
    /// no cost beyond this check).
    faults: Option<Box<FaultInjector>>,
    /// The command log (`--cmd-log`): every command sent is written to it (`None`: one
    /// check per command).
    cmd_log: Option<Box<CmdLog>>,
}

/// `(timeout_ns, timeout_clks)` for reads and for writes.
type DataTimeouts = [(u64, u32); 2];

/// Which role a command has in a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Normal,
    AutoCmd12,
    AutoCmd23,
    Tuning,
}

impl SdhciHost {
    pub fn new(config: SdhciConfig) -> SdhciHost {
        let mut host = SdhciHost {
            config,
            ios: MmcIos::IDENTIFICATION,
            actual_clock: 0,
            tuned: false,
            response: [0; 4],
            staging: Vec::new(),
            table: Vec::new(),
            data_timeouts: None,
            faults: None,
            cmd_log: None,
        };
        host.actual_clock = host.sdclk(host.ios.clock);
        host
    }

    pub fn config(&self) -> &SdhciConfig {
        &self.config
    }

    /// Install (or with `None` remove) a fault injector: from now on every command the
    /// controller sends is offered to it first.
    pub fn set_fault_injector(&mut self, faults: Option<FaultInjector>) {
        self.faults = faults.map(Box::new);
    }

    pub fn fault_injector(&self) -> Option<&FaultInjector> {
        self.faults.as_deref()
    }

    /// Remove the injector and hand it back (to carry it over a controller reset).
    pub fn take_fault_injector(&mut self) -> Option<FaultInjector> {
        self.faults.take().map(|b| *b)
    }

    /// The installed injector, to add or clear rules at run time.
    pub fn fault_injector_mut(&mut self) -> Option<&mut FaultInjector> {
        self.faults.as_deref_mut()
    }

    /// Install (or with `None` remove) the command log: from now on every command the
    /// controller sends is written to it.
    pub fn set_cmd_log(&mut self, log: Option<CmdLog>) {
        self.cmd_log = log.map(Box::new);
    }

    /// Remove the command log and hand it back (to carry it over a controller reset).
    pub fn take_cmd_log(&mut self) -> Option<CmdLog> {
        self.cmd_log.take().map(|b| *b)
    }

    /// Write out what the command log holds; a failing log is dropped.
    pub fn flush_cmd_log(&mut self) {
        if let Some(Err(e)) = self.cmd_log.as_mut().map(|l| l.flush()) {
            log::error!("command log: {e}; command logging stops");
            self.cmd_log = None;
        }
    }

    pub fn ios(&self) -> MmcIos {
        self.ios
    }

    /// The SDCLK the controller makes of the requested clock (Linux `actual_clock`).
    pub fn actual_clock(&self) -> u64 {
        self.actual_clock
    }

    /// The bus as the current ios drive it.
    pub fn bus(&self) -> Bus {
        Bus::new(
            self.actual_clock,
            self.ios.bus_width,
            self.ios.timing == BusTiming::Ddr52,
        )
    }

    /// Sampling Clock Select: a tuning sequence succeeded since the last timing change.
    pub fn tuned(&self) -> bool {
        self.tuned
    }

    /// Linux's `mmc->max_busy_timeout` in ms: 2^27 TMCLK cycles, 0 (no limit) when the
    /// hardware time-out may be disabled. A longer CMD6 busy is polled instead of waited
    /// for with R1b.
    pub fn max_busy_timeout_ms(&self) -> u32 {
        if self.config.disable_hw_timeout {
            return 0;
        }
        ((1u64 << 27) / (self.config.timeout_clock_hz / 1000).max(1)).min(u64::from(u32::MAX))
            as u32
    }

    /// Response registers 0x10, 0x14, 0x18, 0x1C as the last command left them (an R2 in
    /// RESP[119:0] without its CRC byte; an Auto CMD12 response in 0x1C).
    pub fn response_registers(&self) -> [u32; 4] {
        self.response
    }

    fn sdclk(&self, requested: u64) -> u64 {
        match self.config.sd_clock {
            SdClock::Exact => requested,
            SdClock::Divided { base_hz } => {
                if requested == 0 {
                    0
                } else if base_hz <= requested {
                    base_hz
                } else {
                    let mut div = 2;
                    while div < 2046 && base_hz / div > requested {
                        div += 2;
                    }
                    base_hz / div
                }
            }
        }
    }

    /// Apply the driver's bus settings. Power going off cuts the card's power; power coming
    /// back power-cycles it into idle. A timing change or power loss forgets the tuning.
    pub fn set_ios(&mut self, card: &mut Card, now: Nanos, ios: MmcIos) {
        let mut ios = ios;
        if !matches!(ios.bus_width, 1 | 4 | 8) {
            ios.bus_width = 1;
        }
        let was_on = self.ios.power_mode != PowerMode::Off;
        let is_on = ios.power_mode != PowerMode::Off;
        if was_on && !is_on {
            log::debug!("SDHCI: bus power off");
            card.power_off(now, PowerDown::Sudden);
            self.tuned = false;
        } else if !was_on && is_on {
            log::debug!("SDHCI: bus power on");
            card.power_cycle(now, PowerDown::Sudden);
            self.tuned = false;
        }
        if ios.timing != self.ios.timing {
            self.tuned = false;
        }
        self.ios = ios;
        self.actual_clock = self.sdclk(ios.clock);
        log::trace!(
            "SDHCI ios: {} Hz (actual {}), {}-bit, {:?}, {:?}",
            ios.clock,
            self.actual_clock,
            ios.bus_width,
            ios.timing,
            ios.power_mode
        );
    }

    /// Execute one request on `card`, moving `now` to its completion.
    pub fn request<S: DmaSegment>(
        &mut self,
        card: &mut Card,
        now: &mut Nanos,
        mrq: MmcRequest<'_, S>,
    ) -> SdhciCompletion {
        let mut run = Run::new(self, card, *now, mrq.cmd.opcode);
        run.request(mrq);
        *now = run.now;
        run.finish()
    }

    /// Like [`SdhciHost::request`], but return as soon as the request's final busy period
    /// begins (the programming after a closed-ended write, the R1b busy of a command or of
    /// the stop) instead of waiting for it: a driver that waits for busy itself, and may
    /// interrupt it with HPI (Linux's `card_busy` polling path). No busy time-out applies;
    /// the driver's own time-out does. Busy before the final step (an open-ended write
    /// before its CMD12) is waited for as usual.
    pub fn start_request<S: DmaSegment>(
        &mut self,
        card: &mut Card,
        now: &mut Nanos,
        mrq: MmcRequest<'_, S>,
    ) -> SdhciCompletion {
        let mut run = Run::new(self, card, *now, mrq.cmd.opcode);
        run.defer_final_busy = true;
        run.request(mrq);
        *now = run.now;
        run.finish()
    }

    /// Wait while the card holds DAT0 busy (the controller's DAT0 level, Linux `card_busy`),
    /// but not past `deadline`. Returns whether the busy ended; `now` is then its end,
    /// otherwise the deadline (or `now`, if that is later).
    pub fn wait_busy_until(
        &mut self,
        card: &mut Card,
        now: &mut Nanos,
        deadline: Option<Nanos>,
    ) -> bool {
        let released = match card.busy_until() {
            Some(end) if end > *now => match deadline {
                Some(d) if d < end => {
                    *now = (*now).max(d);
                    false
                }
                _ => {
                    *now = end;
                    true
                }
            },
            _ => true,
        };
        card.advance(*now);
        released
    }

    /// Linux's `sdhci_execute_tuning`: in HS200, send CMD21 (128-byte blocks on 8 lines, 64
    /// on 4) until the controller has found its sampling point, at most
    /// [`MAX_TUNING_LOOP`] times. Returns how many tuning commands it took (0: the timing
    /// needs no tuning).
    pub fn execute_tuning(&mut self, card: &mut Card, now: &mut Nanos) -> Result<u32, TuningError> {
        if self.ios.timing != BusTiming::Hs200 {
            return Ok(0);
        }
        self.tuned = false;
        let blksz = if self.ios.bus_width == 8 { 128 } else { 64 };
        for tries in 1..=MAX_TUNING_LOOP {
            let mut run = Run::new(self, card, *now, 21);
            let block = run.send_tuning(blksz);
            *now = run.now;
            let done = run.finish();
            if !done.int_status.has(normal_int::BUF_READ_READY) {
                // Linux waits for Buffer Read Ready, then gives up.
                *now += TUNING_WAIT_NS;
                card.advance(*now);
                log::debug!("tuning: no Buffer Read Ready for CMD21 #{tries}");
                return Err(TuningError::NoBufferReadReady { tries });
            }
            if block {
                self.tuned = true;
                log::debug!("tuning: sampling point found after {tries} CMD21");
                return Ok(tries);
            }
        }
        log::info!("tuning failed, falling back to fixed sampling clock");
        Err(TuningError::Failed {
            tries: MAX_TUNING_LOOP,
        })
    }

    /// The clock the card's HS_TIMING allows.
    fn card_max_clock(card: &Card) -> u64 {
        let (hs_timing, bus_width) = card.bus_config();
        match hs_timing & 0x0F {
            0 => 26_000_000,
            1 => {
                let device_type = card.model().ext_csd.device_type;
                let ddr = matches!(bus_width & 0x0F, 5 | 6);
                if ddr || device_type & emmc_card::ext_csd::DEVICE_TYPE_HS_52 != 0 {
                    52_000_000
                } else {
                    26_000_000
                }
            }
            _ => 200_000_000,
        }
    }

    /// 0: within the card's timing; 1: the host cannot sample the card; 2: neither side
    /// can sample the other.
    fn overspeed(&self, card: &Card) -> u8 {
        let max = Self::card_max_clock(card);
        if self.actual_clock <= max {
            0
        } else if self.actual_clock <= 2 * max {
            1
        } else {
            2
        }
    }

    /// Why data blocks would be garbage on the other side, if they would.
    fn data_bus_problem(&self, card: &Card, read: bool, tuning: bool) -> Option<&'static str> {
        let (_, bus_width) = card.bus_config();
        let (width, ddr) = match bus_width & 0x0F {
            1 => (4, false),
            2 => (8, false),
            5 => (4, true),
            6 => (8, true),
            _ => (1, false),
        };
        if width != self.ios.bus_width {
            return Some("bus width differs from the card's BUS_WIDTH");
        }
        if ddr != (self.ios.timing == BusTiming::Ddr52) {
            return Some("data rate differs from the card's BUS_WIDTH");
        }
        if self.overspeed(card) > 0 {
            return Some("clock above the card's timing");
        }
        if read
            && !tuning
            && self.ios.timing == BusTiming::Hs200
            && self.actual_clock > TUNING_NEEDED_ABOVE_HZ
            && !self.tuned
        {
            return Some("HS200 sampling point not tuned");
        }
        None
    }

    /// The time-out the controller applies for a target of `target_us`.
    fn effective_timeout_ns(&self, target_us: u64) -> Nanos {
        let (count, too_big) = calc_timeout_count(target_us, self.config.timeout_clock_hz / 1000);
        if too_big && self.config.disable_hw_timeout {
            if target_us == 0 {
                timeout::SOFTWARE_TIMEOUT_NS
            } else {
                target_us.saturating_mul(1000)
            }
        } else {
            hardware_timeout_ns(count, self.config.timeout_clock_hz)
        }
    }
}

/// One request in flight.
struct Run<'h> {
    host: &'h mut SdhciHost,
    card: &'h mut Card,
    now: Nanos,
    out: SdhciCompletion,
    /// Leave the request's final busy to the caller ([`SdhciHost::start_request`]).
    defer_final_busy: bool,
    /// The busy being waited for now is the final one.
    defer_now: bool,
    /// The data phase of the command being sent, while it is the request's data command:
    /// (direction, block size, blocks, packed).
    data_cmd: Option<(DataDirection, u32, u32, bool)>,
    /// Injected faults waiting for the data phase or the busy they act on.
    data_fault: Option<Effect>,
    bit_flips: u32,
    /// Extra busy or access time, and whether it yields to HPI (stuck busy).
    extra_busy: Option<(Nanos, bool)>,
    /// With a command log: the last command sent, written once the next starts or the
    /// request ends.
    logged: Option<CmdEntry>,
}

impl<'h> Run<'h> {
    fn new(host: &'h mut SdhciHost, card: &'h mut Card, now: Nanos, opcode: u8) -> Run<'h> {
        Run {
            host,
            card,
            now,
            out: SdhciCompletion {
                sbc: None,
                cmd: CommandOutcome::pending(opcode),
                stop: None,
                data_error: None,
                bytes_xfered: 0,
                int_status: IntStatus::default(),
                auto_cmd_err: 0,
                adma_err: 0,
                start_ns: now,
                end_ns: now,
                busy_pending: false,
            },
            defer_final_busy: false,
            defer_now: false,
            data_cmd: None,
            data_fault: None,
            bit_flips: 0,
            extra_busy: None,
            logged: None,
        }
    }

    fn finish(mut self) -> SdhciCompletion {
        self.out.end_ns = self.now;
        if self.host.cmd_log.is_some() {
            self.log_previous(self.now, self.out.busy_pending);
        }
        self.out
    }

    /// Write the command held for the log: it lasted until `end`.
    fn log_previous(&mut self, end: Nanos, busy_pending: bool) {
        let (Some(e), Some(log)) = (self.logged.take(), self.host.cmd_log.as_mut()) else {
            return;
        };
        let data_error = if e.data.is_some() {
            self.out.data_error
        } else {
            None
        };
        if let Err(err) = log.command(&e, end, data_error, busy_pending) {
            log::error!("command log: {err}; command logging stops");
            self.host.cmd_log = None;
        }
    }

    /// Hold a command just sent for the log (the previous one ends now).
    fn log_command(&mut self, cmd: &MmcCommand, start: Nanos, out: &CommandOutcome) {
        self.log_previous(start, false);
        self.logged = Some(CmdEntry {
            start,
            opcode: cmd.opcode,
            arg: cmd.arg,
            resp_type: cmd.resp_type,
            answered: out.error != Some(SdhciError::CmdTimeout),
            auto: out.auto,
            resp: out.resp,
            data: self.data_cmd,
            error: out.error,
        });
    }

    fn request<S: DmaSegment>(&mut self, mrq: MmcRequest<'_, S>) {
        let MmcRequest {
            sbc,
            cmd,
            data,
            stop,
        } = mrq;
        self.now = self
            .now
            .saturating_add(self.host.config.request_overhead_ns);
        self.out.sbc = sbc.map(|c| CommandOutcome::pending(c.opcode));
        self.out.stop = stop.map(|c| CommandOutcome::pending(c.opcode));

        let mut data = data;
        if let Some(d) = data.as_mut() {
            if let Err(status) = self.prepare_adma(d) {
                self.out.adma_err = status;
                self.out.int_status.raise_error(error_int::ADMA_ERR);
                self.out.data_error = Some(SdhciError::Adma(status));
                log::debug!(
                    "CMD{}: ADMA2 table refused (status {status:#04x}), nothing issued",
                    cmd.opcode
                );
                return;
            }
            if d.timeout_ns == 0 && d.timeout_clks == 0 {
                let csd = self.card.csd();
                let timeouts = match self.host.data_timeouts {
                    Some((cached, t)) if cached == csd => t,
                    _ => {
                        let t = [
                            mmc_data_timeout(&csd, DataDirection::Read),
                            mmc_data_timeout(&csd, DataDirection::Write),
                        ];
                        self.host.data_timeouts = Some((csd, t));
                        t
                    }
                };
                let (ns, clks) = timeouts[usize::from(d.direction == DataDirection::Write)];
                d.timeout_ns = ns;
                d.timeout_clks = clks;
            }
        }
        let multi = data
            .as_ref()
            .is_some_and(|d| d.blocks > 1 || matches!(cmd.opcode, 18 | 25));
        let auto_cmd23 = sbc.is_some() && self.host.config.auto_cmd23 && multi;
        let auto_cmd12 = sbc.is_none() && self.host.config.auto_cmd12 && multi;

        if let Some(sbc) = sbc {
            let role = if auto_cmd23 {
                Role::AutoCmd23
            } else {
                Role::Normal
            };
            let o = self.send_command(&sbc, role);
            self.out.sbc = Some(o);
            if o.error.is_some() {
                return;
            }
        }

        self.data_cmd = data.as_ref().map(|d| {
            let packed = sbc.is_some_and(|s| s.arg & crate::mmc::MMC_CMD23_ARG_PACKED != 0);
            (d.direction, d.blksz, d.blocks, packed)
        });
        let o = self.send_command(&cmd, Role::Normal);
        self.data_cmd = None;
        self.out.cmd = o;
        match o.error {
            // sdhci_cmd_irq: a data command's response CRC error is a data CRC error; the
            // card may well have started the transfer, so the stop goes out.
            Some(SdhciError::CmdCrc) if data.is_some() => {
                self.out.data_error = Some(SdhciError::DataCrc);
                self.send_stop(stop);
                return;
            }
            Some(_) => return,
            None => {}
        }

        let Some(mut d) = data else {
            if cmd.busy {
                self.defer_now = self.defer_final_busy;
                let target = target_timeout_us(None, cmd.busy_timeout_ms, self.host.ios.clock);
                let limit = self.host.effective_timeout_ns(target);
                if self.wait_busy(limit) {
                    self.out.int_status.raise(normal_int::TRANSFER_COMPLETE);
                }
            }
            return;
        };

        let target =
            target_timeout_us(Some((d.timeout_ns, d.timeout_clks)), 0, self.host.ios.clock);
        let per_block = self.host.effective_timeout_ns(target);
        let budget = per_block.saturating_mul(u64::from(d.blocks));
        // A closed-ended transfer ends with its data: its programming busy is the last.
        self.defer_now = self.defer_final_busy && sbc.is_some();
        match self.data_phase(&mut d, per_block, budget) {
            Ok(()) => {
                if d.direction == DataDirection::Write {
                    if let Some(f) = self.host.faults.as_deref_mut() {
                        f.note_written(u64::from(d.blksz) * u64::from(d.blocks));
                    }
                }
                if auto_cmd12 {
                    self.defer_now = self.defer_final_busy;
                    let stop_cmd = MmcCommand::new(12, 0, ResponseType::R1b);
                    let o = self.send_command(&stop_cmd, Role::AutoCmd12);
                    self.out.stop = Some(o);
                    if let Some(e) = o.error {
                        // sdhci_cmd_irq treats an Auto CMD12 error as a data error.
                        self.out.data_error = Some(if e == SdhciError::CmdTimeout {
                            SdhciError::DataTimeout
                        } else {
                            SdhciError::DataCrc
                        });
                        self.send_stop(stop);
                        return;
                    }
                    if !self.wait_busy_within(per_block, budget) {
                        self.out.data_error = Some(SdhciError::DataTimeout);
                        self.send_stop(stop);
                        return;
                    }
                }
                self.out.int_status.raise(normal_int::TRANSFER_COMPLETE);
                self.out.bytes_xfered = u64::from(d.blksz) * u64::from(d.blocks);
                if sbc.is_none() && !auto_cmd12 {
                    self.send_stop(stop);
                }
            }
            Err(e) => {
                self.out.data_error = Some(e);
                if auto_cmd12 {
                    self.auto_cmd12_not_executed();
                }
                self.send_stop(stop);
            }
        }
    }

    fn auto_cmd12_not_executed(&mut self) {
        self.out.auto_cmd_err |= auto_cmd_err::ACMD12_NOT_EXEC;
        self.out.int_status.raise_error(error_int::AUTO_CMD_ERR);
    }

    /// A manual CMD12 (after an open-ended transfer, or after any data error).
    fn send_stop(&mut self, stop: Option<MmcCommand>) {
        let Some(stop) = stop else { return };
        let o = self.send_command(&stop, Role::Normal);
        self.out.stop = Some(o);
        self.defer_now = self.defer_final_busy;
        if o.error.is_none() && stop.busy {
            let target = target_timeout_us(None, stop.busy_timeout_ms, self.host.ios.clock);
            let limit = self.host.effective_timeout_ns(target);
            if self.wait_busy(limit) {
                self.out.int_status.raise(normal_int::TRANSFER_COMPLETE);
            }
        }
    }

    /// Check the request's geometry and build its ADMA2 table.
    fn prepare_adma<S: DmaSegment>(&mut self, d: &MmcData<'_, S>) -> Result<(), u8> {
        let mismatch = adma_err::LENGTH_MISMATCH | adma_err::ST_TFR;
        if d.blksz == 0 || d.blksz > self.host.config.max_block_len {
            log::debug!("ADMA2: block size {} not supported", d.blksz);
            return Err(mismatch);
        }
        if d.blocks == 0 || d.blocks > MAX_BLOCK_COUNT {
            log::debug!(
                "ADMA2: {} blocks do not fit the 16-bit block count",
                d.blocks
            );
            return Err(mismatch);
        }
        let mut table = std::mem::take(&mut self.host.table);
        let built = adma::build_table(d.sg, &self.host.config.adma, &mut table);
        self.host.table = table;
        let total = built?;
        let wanted = u64::from(d.blksz) * u64::from(d.blocks);
        if total != wanted {
            log::debug!("ADMA2: table holds {total} bytes, transfer is {wanted}");
            return Err(mismatch);
        }
        Ok(())
    }

    /// Put one command on the CMD line and judge its response.
    fn send_command(&mut self, cmd: &MmcCommand, role: Role) -> CommandOutcome {
        let mut out = CommandOutcome {
            opcode: cmd.opcode,
            issued: true,
            auto: matches!(role, Role::AutoCmd12 | Role::AutoCmd23),
            resp: [0; 4],
            error: None,
        };
        let start = self.now;
        let bus = self.host.bus();
        let bus_fault = if self.host.faults.is_some() {
            self.consult_faults(cmd)
        } else {
            None
        };
        let error = if bus.clock_hz == 0 {
            log::debug!("CMD{}: SD clock stopped", cmd.opcode);
            Some(SdhciError::CmdTimeout)
        } else {
            self.exchange(cmd, &bus, &mut out, bus_fault)
        };
        if self.data_cmd.is_none() {
            if let Some((ns, stuck)) = self.extra_busy.take() {
                if !self.card.extend_busy(ns, stuck) {
                    log::debug!("fault: CMD{} holds no busy to lengthen", cmd.opcode);
                }
            }
        }
        out.error = error;
        if let Some(e) = error {
            log::debug!("CMD{} arg {:#010x}: {e}", cmd.opcode, cmd.arg);
        }
        self.report_command(role, error);
        if self.host.cmd_log.is_some() {
            self.log_command(cmd, start, &out);
        }
        out
    }

    /// Offer the command to the fault injector; apply the card-level effects that fire,
    /// keep the data-phase ones, and return a command-level bus error to produce.
    fn consult_faults(&mut self, cmd: &MmcCommand) -> Option<SdhciError> {
        let info = self.command_info(cmd);
        let effects = self.host.faults.as_deref_mut()?.on_command(&info);
        let mut bus = None;
        for effect in effects {
            match effect {
                Effect::CmdCrc => bus = bus.or(Some(SdhciError::CmdCrc)),
                Effect::CmdTimeout => bus = bus.or(Some(SdhciError::CmdTimeout)),
                Effect::CmdEndBit => bus = bus.or(Some(SdhciError::CmdEndBit)),
                Effect::DataCrc | Effect::DataTimeout => {
                    self.data_fault = self.data_fault.take().or(Some(effect));
                }
                Effect::BitFlip { bits } => self.bit_flips = self.bit_flips.saturating_add(bits),
                Effect::R1Error { .. } => self.card.inject_r1_error(effect.r1_bits()),
                Effect::PackedFailure { index } => {
                    self.card.inject_packed_failure(index as usize);
                }
                Effect::StuckBusy { max_ns } => {
                    let ns = max_ns.unwrap_or(fault::plan::STUCK_BUSY_DEFAULT_MAX_NS);
                    self.extra_busy = Some((ns, true));
                }
                Effect::Latency { ns } => self.add_extra_busy(ns),
                Effect::GcStorm { ns, work_ns } => {
                    self.card.add_background_work(work_ns.unwrap_or(ns));
                    self.add_extra_busy(ns);
                }
                Effect::UrgentBkops { level } => {
                    self.card.raise_bkops_level(level);
                }
                Effect::WearOut {
                    life_time_est_a,
                    life_time_est_b,
                    pre_eol_info,
                } => self
                    .card
                    .set_wear(life_time_est_a, life_time_est_b, pre_eol_info),
                Effect::PowerLoss { at_ns, restore } => {
                    let at = at_ns.unwrap_or(self.now).min(self.now);
                    self.card.sudden_power_loss(at, restore);
                    self.host.tuned = false;
                }
            }
        }
        bus
    }

    fn add_extra_busy(&mut self, ns: Nanos) {
        let (prev, stuck) = self.extra_busy.unwrap_or((0, false));
        self.extra_busy = Some((prev.saturating_add(ns), stuck));
    }

    /// What the fault injector is told about a command.
    fn command_info(&self, cmd: &MmcCommand) -> CommandInfo {
        let (direction, bytes, blocks, packed) = match self.data_cmd {
            Some((dir, blksz, blocks, packed)) => (
                match dir {
                    DataDirection::Read => fault::Direction::Read,
                    DataDirection::Write => fault::Direction::Write,
                },
                u64::from(blksz) * u64::from(blocks),
                u64::from(blocks),
                packed,
            ),
            None => (fault::Direction::None, 0, 0, false),
        };
        let opcode = cmd.opcode & 0x3F;
        let lba = match opcode {
            17 | 18 | 24 | 25 if !packed => Some(blocks.max(1)),
            35 | 36 => Some(1),
            _ => None,
        }
        .map(|count| {
            let lba = if self.card.model().sector_addressing() {
                u64::from(cmd.arg)
            } else {
                u64::from(cmd.arg) / 512
            };
            (lba, count)
        });
        CommandInfo {
            opcode,
            arg: cmd.arg,
            direction,
            lba,
            bytes,
            now: self.now,
            packed,
        }
    }

    fn exchange(
        &mut self,
        cmd: &MmcCommand,
        bus: &Bus,
        out: &mut CommandOutcome,
        fault: Option<SdhciError>,
    ) -> Option<SdhciError> {
        let expected = match cmd.resp_type {
            ResponseType::None => ResponseLength::None,
            ResponseType::R2 => ResponseLength::Long,
            _ => ResponseLength::Short,
        };
        let start = self.now;
        let at = start.saturating_add(bus.command_ns(expected));
        let token = Command::new(cmd.opcode & 0x3F, cmd.arg);
        let tier = self.host.overspeed(self.card);
        let response = if self.host.ios.power_mode == PowerMode::Off {
            self.card.advance(at);
            None
        } else if tier >= 2 || fault == Some(SdhciError::CmdTimeout) {
            // The card cannot make sense of the command (overspeed, or a plan's corrupted
            // command): it stays silent and records COM_CRC_ERROR.
            self.card.execute_checked(at, token, false)
        } else {
            self.card.execute(at, token)
        };
        if expected == ResponseLength::None {
            self.now = at;
            return None;
        }
        let Some(r) = response else {
            let window = bus.clocks_ns(COMMAND_BITS + NCR_MAX);
            self.now = at.max(start.saturating_add(window));
            return Some(SdhciError::CmdTimeout);
        };
        self.now = at;
        out.resp = linux_resp(&r);
        self.store_response(&r, cmd.opcode == 12 && out.auto);
        let got = match r {
            Response::R2(_) => ResponseLength::Long,
            _ => ResponseLength::Short,
        };
        if got != expected || fault == Some(SdhciError::CmdEndBit) {
            return Some(SdhciError::CmdEndBit);
        }
        if tier == 1 || fault == Some(SdhciError::CmdCrc) {
            return Some(SdhciError::CmdCrc);
        }
        if matches!(cmd.resp_type, ResponseType::R1 | ResponseType::R1b)
            && matches!(r, Response::R3(_))
        {
            // R3 carries index 111111 and no CRC: both checks fail.
            return Some(SdhciError::CmdIndex);
        }
        None
    }

    /// Raise a command's status bits where its role puts them.
    fn report_command(&mut self, role: Role, error: Option<SdhciError>) {
        let bits = match error {
            None => 0,
            Some(SdhciError::CmdTimeout) => error_int::CMD_TIMEOUT,
            Some(SdhciError::CmdCrc) => error_int::CMD_CRC,
            Some(SdhciError::CmdEndBit) => error_int::CMD_END_BIT,
            Some(SdhciError::CmdIndex) => error_int::CMD_INDEX | error_int::CMD_CRC,
            Some(_) => 0,
        };
        match role {
            Role::Normal => {
                if bits == 0 {
                    self.out.int_status.raise(normal_int::CMD_COMPLETE);
                } else {
                    self.out.int_status.raise_error(bits);
                }
            }
            Role::AutoCmd12 | Role::AutoCmd23 => {
                if bits != 0 {
                    let mut acmd = 0;
                    if bits & error_int::CMD_TIMEOUT != 0 {
                        acmd |= auto_cmd_err::TIMEOUT;
                    }
                    if bits & error_int::CMD_CRC != 0 {
                        acmd |= auto_cmd_err::CRC;
                    }
                    if bits & error_int::CMD_END_BIT != 0 {
                        acmd |= auto_cmd_err::END_BIT;
                    }
                    if bits & error_int::CMD_INDEX != 0 {
                        acmd |= auto_cmd_err::INDEX;
                    }
                    self.out.auto_cmd_err |= acmd;
                    self.out.int_status.raise_error(error_int::AUTO_CMD_ERR);
                }
            }
            // Only Buffer Read Ready is enabled while tuning.
            Role::Tuning => {}
        }
    }

    /// Keep a response in the Response registers as SDHCI does (facts §13.9): a short
    /// response's payload in 0x10 (an Auto CMD12's in 0x1C); an R2's register bits 127:8
    /// (the 15 bytes before the CRC byte) in RESP[119:0].
    fn store_response(&mut self, r: &Response, auto_cmd12: bool) {
        match (r, auto_cmd12) {
            (Response::R2(b), _) => {
                for (k, word) in self.host.response.iter_mut().enumerate() {
                    // Word k holds bytes 11-4k ..= 14-4k; byte -1 (above bit 127) is 0.
                    *word = (0..4usize).fold(0u32, |v, i| {
                        let byte = (11 + i).checked_sub(4 * k).map_or(0, |idx| b[idx]);
                        v << 8 | u32::from(byte)
                    });
                }
            }
            (r, true) => self.host.response[3] = r.payload().unwrap_or(0),
            (r, false) => self.host.response[0] = r.payload().unwrap_or(0),
        }
    }

    /// Wait while the card holds DAT0 busy, at most `limit`. `false`: data time-out.
    fn wait_busy(&mut self, limit: Nanos) -> bool {
        self.wait_busy_within(limit, limit)
    }

    /// Busy after data: allowed `budget` in all, the time-out firing `per_block` after the
    /// busy began when the budget is exceeded.
    fn wait_busy_within(&mut self, per_block: Nanos, budget: Nanos) -> bool {
        let mut ok = true;
        if self.defer_now {
            self.out.busy_pending = self.card.busy_until().is_some_and(|end| end > self.now);
            self.card.advance(self.now);
            return true;
        }
        if let Some(end) = self.card.busy_until() {
            if end > self.now {
                let busy = end - self.now;
                if busy > budget {
                    log::debug!("busy of {busy} ns exceeds the {budget} ns time-out");
                    self.now = self.now.saturating_add(per_block);
                    self.out.int_status.raise_error(error_int::DATA_TIMEOUT);
                    ok = false;
                } else {
                    self.now = end;
                }
            }
        }
        self.card.advance(self.now);
        ok
    }

    fn data_timeout(&mut self, after: Nanos) -> SdhciError {
        self.now = self.now.saturating_add(after);
        self.card.advance(self.now);
        self.out.int_status.raise_error(error_int::DATA_TIMEOUT);
        SdhciError::DataTimeout
    }

    fn data_crc(&mut self) -> SdhciError {
        self.card.advance(self.now);
        self.out.int_status.raise_error(error_int::DATA_CRC);
        SdhciError::DataCrc
    }

    fn adma_error(&mut self, status: u8) -> SdhciError {
        self.out.adma_err = status;
        self.out.int_status.raise_error(error_int::ADMA_ERR);
        SdhciError::Adma(status)
    }

    fn data_phase<S: DmaSegment>(
        &mut self,
        d: &mut MmcData<'_, S>,
        per_block: Nanos,
        budget: Nanos,
    ) -> Result<(), SdhciError> {
        let bus = self.host.bus();
        let blksz = d.blksz as usize;
        let blocks = u64::from(d.blocks);
        let len = blksz * d.blocks as usize;
        let read = d.direction == DataDirection::Read;
        let Some(card_len) = self.card.transfer_block_len() else {
            // The card started no transfer: no data, no CRC status token.
            log::debug!(
                "data phase: the card is not transferring ({})",
                self.card.state()
            );
            let wait = if read {
                per_block
            } else {
                bus.write_ns(blksz, 1).saturating_add(per_block)
            };
            return Err(self.data_timeout(wait));
        };
        let mut problem = self.host.data_bus_problem(self.card, read, false);
        if problem.is_none() && card_len != blksz {
            problem = Some("block size differs from the card's");
        }
        match self.data_fault.take() {
            Some(Effect::DataCrc) => problem = Some("fault plan: data CRC error"),
            Some(_) => {
                // The data stalls: the card sends no block, or never answers the written one.
                log::debug!("data phase: fault plan stalls the data");
                let wait = if read {
                    per_block
                } else {
                    bus.write_ns(blksz, 1).saturating_add(per_block)
                };
                return Err(self.data_timeout(wait));
            }
            None => {}
        }
        // One plain-memory segment holding exactly the transfer: the DMA engine's view and
        // the card's are the same bytes, so skip the staging copy.
        let direct = problem.is_none() && d.sg.len() == 1 && d.sg[0].len() == len;
        if direct && !read {
            if let Some(data) = d.sg[0].as_slice() {
                return self.write_blocks(data, blksz, blocks, &bus, per_block, budget);
            }
        }
        let mut staging = std::mem::take(&mut self.host.staging);
        let result = if read {
            match problem {
                Some(why) => self.garbled_read(&mut staging, card_len, &bus, why),
                None => self.read_blocks(d, &mut staging, len, &bus, per_block, budget),
            }
        } else {
            staging.resize(len, 0);
            match adma::gather(&self.host.table, d.sg, &mut staging[..len]) {
                Err(status) => Err(self.adma_error(status)),
                Ok(()) => match problem {
                    Some(why) => {
                        log::debug!("write data garbled: {why}");
                        self.now = self.now.saturating_add(bus.write_ns(blksz, 1));
                        Err(self.data_crc())
                    }
                    None => {
                        self.write_blocks(&staging[..len], blksz, blocks, &bus, per_block, budget)
                    }
                },
            }
        };
        self.host.staging = staging;
        result
    }

    /// The card sends its first block; the host cannot make sense of it.
    fn garbled_read(
        &mut self,
        staging: &mut Vec<u8>,
        card_len: usize,
        bus: &Bus,
        why: &str,
    ) -> Result<(), SdhciError> {
        log::debug!("read data garbled: {why}");
        staging.resize(card_len, 0);
        let internal = self
            .card
            .read_data(self.now, &mut staging[..card_len])
            .unwrap_or(0);
        self.now = self
            .now
            .saturating_add(internal)
            .saturating_add(bus.read_ns(card_len, 1));
        Err(self.data_crc())
    }

    fn read_blocks<S: DmaSegment>(
        &mut self,
        d: &mut MmcData<'_, S>,
        staging: &mut Vec<u8>,
        len: usize,
        bus: &Bus,
        per_block: Nanos,
        budget: Nanos,
    ) -> Result<(), SdhciError> {
        let blksz = d.blksz as usize;
        let direct = d.sg.len() == 1 && d.sg[0].len() == len && d.sg[0].as_mut_slice().is_some();
        let target: &mut [u8] = if direct {
            d.sg[0].as_mut_slice().expect("checked: plain memory")
        } else {
            staging.resize(len, 0);
            &mut staging[..len]
        };
        match self.card.read_data(self.now, target) {
            Ok(internal) => {
                let internal = match self.extra_busy.take() {
                    Some((ns, _)) => internal.saturating_add(ns),
                    None => internal,
                };
                if self.bit_flips > 0 {
                    let flips = std::mem::take(&mut self.bit_flips);
                    if let Some(f) = self.host.faults.as_deref_mut() {
                        let bits = target.len() as u64 * 8;
                        for _ in 0..flips {
                            let bit = f.draw(bits);
                            target[(bit / 8) as usize] ^= 1 << (bit % 8);
                        }
                        log::info!("fault: {flips} bits flipped in {} bytes read", target.len());
                    }
                }
                if internal > budget {
                    log::debug!("read access of {internal} ns exceeds the {budget} ns time-out");
                    return Err(self.data_timeout(per_block));
                }
                self.now = self
                    .now
                    .saturating_add(internal)
                    .saturating_add(bus.read_ns(blksz, u64::from(d.blocks)));
                self.card.advance(self.now);
                if direct {
                    return Ok(());
                }
                adma::scatter(&self.host.table, d.sg, &staging[..len])
                    .map_err(|status| self.adma_error(status))
            }
            Err(DataError::Stopped { blocks_done, .. }) => {
                // The card stopped sending; the host waits for the next block in vain.
                let sent = bus.read_ns(blksz, blocks_done);
                Err(self.data_timeout(sent.saturating_add(per_block)))
            }
            Err(e) => {
                log::debug!("read data: {e}");
                Err(self.data_timeout(per_block))
            }
        }
    }

    fn write_blocks(
        &mut self,
        data: &[u8],
        blksz: usize,
        blocks: u64,
        bus: &Bus,
        per_block: Nanos,
        budget: Nanos,
    ) -> Result<(), SdhciError> {
        let sent = self.now.saturating_add(bus.write_ns(blksz, blocks));
        match self.card.write_data(sent, data) {
            Ok(()) => {
                self.now = sent;
                if let Some((ns, stuck)) = self.extra_busy.take() {
                    self.card.extend_busy(ns, stuck);
                }
                if self.wait_busy_within(per_block, budget) {
                    Ok(())
                } else {
                    Err(SdhciError::DataTimeout)
                }
            }
            Err(DataError::Stopped { blocks_done, .. }) => {
                // Negative CRC status on the first block the card refused.
                let n = (blocks_done + 1).min(blocks);
                self.now = self.now.saturating_add(bus.write_ns(blksz, n));
                Err(self.data_crc())
            }
            Err(DataError::NoTransfer(state)) => {
                log::debug!("write data: card in {state}");
                self.now = self.now.saturating_add(bus.write_ns(blksz, 1));
                Err(self.data_timeout(per_block))
            }
            Err(e) => {
                log::debug!("write data refused: {e}");
                self.now = self.now.saturating_add(bus.write_ns(blksz, 1));
                Err(self.data_crc())
            }
        }
    }

    /// One tuning command: CMD21 with a PIO read of one block into the controller. Returns
    /// whether the block arrived intact.
    fn send_tuning(&mut self, blksz: usize) -> bool {
        let cmd = MmcCommand::new(21, 0, ResponseType::R1);
        let o = self.send_command(&cmd, Role::Tuning);
        self.out.cmd = o;
        if o.error.is_some() {
            return false;
        }
        let bus = self.host.bus();
        let Some(card_len) = self.card.transfer_block_len() else {
            return false;
        };
        let mut staging = std::mem::take(&mut self.host.staging);
        staging.resize(card_len.max(blksz), 0);
        let problem =
            self.host.data_bus_problem(self.card, true, true).is_some() || card_len != blksz;
        let intact = match self.card.read_data(self.now, &mut staging[..card_len]) {
            Ok(internal) => {
                self.now = self
                    .now
                    .saturating_add(internal)
                    .saturating_add(bus.read_ns(card_len, 1));
                self.card.advance(self.now);
                self.out.int_status.raise(normal_int::BUF_READ_READY);
                !problem
            }
            Err(e) => {
                log::debug!("tuning block: {e}");
                false
            }
        };
        self.host.staging = staging;
        if !intact {
            self.out.data_error = Some(SdhciError::DataCrc);
        }
        intact
    }
}

/// A response as Linux keeps it in `mmc_command.resp`.
fn linux_resp(r: &Response) -> [u32; 4] {
    match r {
        Response::R2(b) => {
            let mut resp = [0u32; 4];
            for (i, word) in resp.iter_mut().enumerate() {
                let mut bytes = [b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]];
                if i == 3 {
                    bytes[3] = 0; // the CRC byte is not kept
                }
                *word = u32::from_be_bytes(bytes);
            }
            resp
        }
        r => [r.payload().unwrap_or(0), 0, 0, 0],
    }
}

/// An SDHCI controller that owns its card and the card time: what a frontend or the
/// simulator drives.
pub struct Sdhci {
    pub card: Card,
    /// Card time of the host.
    pub now: Nanos,
    pub host: SdhciHost,
}

impl Sdhci {
    /// A controller at the identification bus settings, driving `card` from the card's
    /// current time.
    pub fn new(card: Card, config: SdhciConfig) -> Sdhci {
        let now = card.now();
        Sdhci {
            card,
            now,
            host: SdhciHost::new(config),
        }
    }

    pub fn into_card(self) -> Card {
        self.card
    }

    pub fn request<S: DmaSegment>(&mut self, mrq: MmcRequest<'_, S>) -> SdhciCompletion {
        self.host.request(&mut self.card, &mut self.now, mrq)
    }

    /// See [`SdhciHost::start_request`].
    pub fn start_request<S: DmaSegment>(&mut self, mrq: MmcRequest<'_, S>) -> SdhciCompletion {
        self.host.start_request(&mut self.card, &mut self.now, mrq)
    }

    /// See [`SdhciHost::wait_busy_until`].
    pub fn wait_busy_until(&mut self, deadline: Option<Nanos>) -> bool {
        self.host
            .wait_busy_until(&mut self.card, &mut self.now, deadline)
    }

    /// One command without data.
    pub fn command(&mut self, cmd: MmcCommand) -> SdhciCompletion {
        self.request(MmcRequest::command(cmd))
    }

    pub fn set_ios(&mut self, ios: MmcIos) {
        self.host.set_ios(&mut self.card, self.now, ios);
    }

    pub fn ios(&self) -> MmcIos {
        self.host.ios()
    }

    pub fn execute_tuning(&mut self) -> Result<u32, TuningError> {
        self.host.execute_tuning(&mut self.card, &mut self.now)
    }

    /// Let card time pass with no request outstanding.
    pub fn idle(&mut self, ns: Nanos) {
        self.now = self.now.saturating_add(ns);
        self.card.advance(self.now);
    }
}
