//! The MMC core operations a host driver performs, named after the Linux MMC core
//! (`drivers/mmc/core/mmc.c`, `mmc_ops.c`, `core.c`) so the two read side by side: card
//! bring-up (`mmc_init_card`), `mmc_switch` with its CMD13 check, status polling, tuning
//! and block-data requests.
//!
//! Every command goes through the SDHCI controller model ([`SdhciHost`]): it costs bus
//! time at the bus settings the driver chose, and busy, time-outs and CRC errors happen as
//! they would behind a real controller. Bring-up sets the bus as Linux does: 400 kHz on
//! one line for identification, then timing, clock and width after each switch, with
//! tuning for HS200.

use emmc_card::ext_csd as ext;
use emmc_card::timing::Nanos;
use emmc_card::{r1, Card, CardState, DataError, Partition, Response};

use super::sdhci::{
    BusTiming, DataDirection, DmaSegment, MmcCommand, MmcData, MmcIos, MmcRequest, PowerMode,
    ResponseType, SdhciCompletion, SdhciConfig, SdhciError, SdhciHost, TuningError,
};

/// The RCA Linux assigns.
pub const MMC_RCA: u16 = 1;

/// Linux's CMD1 argument: the 2.7–3.6 V and 1.8 V windows plus sector mode.
const HOST_OCR: u32 = 0x40FF_8080;

/// CMD23 argument bits.
pub const MMC_CMD23_ARG_REL_WR: u32 = 1 << 31;
pub const MMC_CMD23_ARG_PACKED: u32 = 1 << 30;

/// Linux's CMD6 time-out when GENERIC_CMD6_TIME is 0 (`DEFAULT_CMD6_TIMEOUT_MS`).
const DEFAULT_CMD6_TIMEOUT_MS: u32 = 500;
/// Linux raises a smaller PARTITION_SWITCH_TIME to this (`MMC_MIN_PART_SWITCH_TIME`).
const MMC_MIN_PART_SWITCH_TIME_MS: u32 = 300;
/// `MMC_CACHE_FLUSH_TIMEOUT_MS` (10 min in current mainline; 30 s before).
const MMC_CACHE_FLUSH_TIMEOUT_MS: u32 = 10 * 60 * 1000;
/// `MMC_BKOPS_TIMEOUT_MS`, `MMC_SANITIZE_TIMEOUT_MS`.
const MMC_BKOPS_TIMEOUT_MS: u32 = 120 * 1000;
const MMC_SANITIZE_TIMEOUT_MS: u32 = 240 * 1000;

/// Identification clock (Linux tries 400 kHz first).
const IDENTIFICATION_HZ: u64 = 400_000;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MmcError {
    #[error("CMD{0}: no response (command timeout)")]
    Timeout(u8),
    #[error("CMD{cmd}: card status {status:#010x} ({desc})", desc = r1::describe(*status))]
    Status { cmd: u8, status: u32 },
    #[error("CMD{cmd}: unexpected response {resp:?}")]
    Response { cmd: u8, resp: Option<Response> },
    #[error("CMD1: card never finished power-up")]
    PowerUp,
    #[error("data: {0}")]
    Data(#[from] DataError),
    /// The controller reported an error other than a command time-out.
    #[error("CMD{cmd}: {error}")]
    Host { cmd: u8, error: SdhciError },
    #[error("switch to a {width}-bit bus failed: EXT_CSD differs")]
    BusWidth { width: u8 },
    #[error("HS200 tuning: {0}")]
    Tuning(#[from] TuningError),
}

/// What the host may switch the card to during bring-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostCaps {
    /// 1, 4 or 8 data lines.
    pub bus_width: u8,
    pub high_speed: bool,
    /// Dual data rate (DDR52) after switching to high speed.
    pub ddr: bool,
    pub hs200: bool,
    pub cache: bool,
    pub hpi: bool,
    /// Enable manual BKOPS (BKOPS_EN is one-time programmable on the card).
    pub bkops: bool,
    /// Enable the PACKED_FAILURE exception event.
    pub packed_event: bool,
    /// Highest card clock the host makes (Linux `f_max`); the card's timing caps it too.
    pub max_clock_hz: u64,
}

impl HostCaps {
    /// Capabilities that bring a card up in the bus mode of a model's `[host]` section.
    pub fn for_model(host: &emmc_card::model::HostProfile) -> HostCaps {
        HostCaps {
            bus_width: host.bus_width,
            high_speed: host.timing != BusTiming::Legacy,
            ddr: host.timing == BusTiming::Ddr52,
            hs200: host.timing == BusTiming::Hs200,
            max_clock_hz: host.clock_hz,
            ..HostCaps::default()
        }
    }
}

impl Default for HostCaps {
    fn default() -> Self {
        HostCaps {
            bus_width: 8,
            high_speed: true,
            ddr: false,
            hs200: false,
            cache: true,
            hpi: true,
            bkops: true,
            packed_event: true,
            max_clock_hz: 200_000_000,
        }
    }
}

/// CMD6 busy time-outs from the EXT_CSD (Linux keeps them in `card->ext_csd`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SwitchTimes {
    generic_ms: u32,
    partition_ms: u32,
    power_off_long_ms: u32,
}

impl SwitchTimes {
    const DEFAULT: SwitchTimes = SwitchTimes {
        generic_ms: DEFAULT_CMD6_TIMEOUT_MS,
        partition_ms: 0,
        power_off_long_ms: 0,
    };

    fn from_ext_csd(e: &[u8; ext::EXT_CSD_LEN]) -> SwitchTimes {
        let generic_ms = match e[ext::GENERIC_CMD6_TIME] {
            0 => DEFAULT_CMD6_TIMEOUT_MS,
            n => 10 * u32::from(n),
        };
        let partition_ms = match e[ext::PARTITION_SWITCH_TIME] {
            0 => 0,
            n => (10 * u32::from(n)).max(MMC_MIN_PART_SWITCH_TIME_MS),
        };
        SwitchTimes {
            generic_ms,
            partition_ms,
            power_off_long_ms: 10 * u32::from(e[ext::POWER_OFF_LONG_TIME]),
        }
    }

    /// The time-out Linux's callers pass to `mmc_switch` for this byte (0 falls back to
    /// GENERIC_CMD6_TIME in `__mmc_switch`).
    fn for_switch(&self, index: usize, value: u8) -> u32 {
        let ms = match index {
            ext::PARTITION_CONFIG => self.partition_ms,
            ext::POWER_OFF_NOTIFICATION if value == ext::POWER_OFF_LONG => self.power_off_long_ms,
            ext::FLUSH_CACHE => MMC_CACHE_FLUSH_TIMEOUT_MS,
            ext::BKOPS_START => MMC_BKOPS_TIMEOUT_MS,
            ext::SANITIZE_START => MMC_SANITIZE_TIMEOUT_MS,
            _ => 0,
        };
        if ms == 0 {
            self.generic_ms
        } else {
            ms
        }
    }
}

/// EXT_CSD bytes Linux compares between the 1-bit read and a read at a new bus width
/// (`mmc_compare_ext_csds`).
const BUS_WIDTH_CHECK_BYTES: [usize; 17] = [
    ext::PARTITIONING_SUPPORT,
    ext::ERASED_MEM_CONT,
    ext::EXT_CSD_REV,
    ext::CSD_STRUCTURE,
    ext::DEVICE_TYPE,
    ext::S_A_TIMEOUT,
    ext::HC_WP_GRP_SIZE,
    ext::ERASE_TIMEOUT_MULT,
    ext::HC_ERASE_GRP_SIZE,
    ext::SEC_TRIM_MULT,
    ext::SEC_ERASE_MULT,
    ext::SEC_FEATURE_SUPPORT,
    ext::TRIM_MULT,
    ext::SEC_COUNT,
    ext::SEC_COUNT + 1,
    ext::SEC_COUNT + 2,
    ext::SEC_COUNT + 3,
];

/// How the MMC core reaches a card: Linux's `struct mmc_host_ops` (`request`, `set_ios`,
/// `execute_tuning`, `card_busy`) and the host's clock. Everything above it — bring-up,
/// `mmc_switch`, the block driver's policies in [`crate::blkdrv`] — is written once
/// against this trait: [`MmcHost`] implements it with the in-process SDHCI model and card;
/// a transport that carries MMC requests from elsewhere (virtio-mmc) implements it too.
///
/// Time is card time in nanoseconds. An implementation that runs against a real clock
/// treats `idle_until` and the deadline of `wait_busy_until` as timers.
pub trait MmcHostOps {
    /// The host's current card time.
    fn now(&self) -> Nanos;
    /// Let time pass with nothing on the bus, up to `t` (no-op if `t` is past).
    fn idle_until(&mut self, t: Nanos);
    /// `mmc_host_ops.request` and wait: run one request to its end, busy included.
    fn request<S: DmaSegment>(&mut self, mrq: MmcRequest<'_, S>) -> SdhciCompletion;
    /// Run one request but return when its final busy begins (the completion says whether
    /// the card is still busy); the caller waits with [`MmcHostOps::wait_busy_until`].
    fn start_request<S: DmaSegment>(&mut self, mrq: MmcRequest<'_, S>) -> SdhciCompletion;
    /// Wait for DAT0 busy to end, but not past `deadline`; `true` when it ended.
    fn wait_busy_until(&mut self, deadline: Option<Nanos>) -> bool;
    /// When DAT0 busy will end, if the card holds it (`mmc_host_ops.card_busy`, with the
    /// instant a model can know).
    fn busy_until(&self) -> Option<Nanos>;
    /// `mmc_host_ops.set_ios`.
    fn set_ios(&mut self, ios: MmcIos);
    fn ios(&self) -> MmcIos;
    /// `mmc_host_ops.execute_tuning`.
    fn execute_tuning(&mut self) -> Result<u32, TuningError>;
    /// Linux's `mmc->max_busy_timeout` in ms (0: no limit).
    fn max_busy_timeout_ms(&self) -> u32;
}

/// What bring-up learned about the card (Linux's `struct mmc_card`, the parts the core and
/// the block driver use).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MmcCard {
    /// EXT_CSD as read after bring-up.
    pub ext_csd: [u8; ext::EXT_CSD_LEN],
    /// CSD from CMD9 (without its CRC byte, as SDHCI keeps it).
    pub csd: [u8; 16],
    /// Sector addressing (OCR access mode; Linux `mmc_card_blockaddr`).
    pub blockaddr: bool,
    switch_times: SwitchTimes,
}

impl MmcCard {
    /// The CMD17/18/24/25/35/36 argument for sector `lba`.
    pub fn address(&self, lba: u64) -> u32 {
        if self.blockaddr {
            lba as u32
        } else {
            (lba << 9) as u32
        }
    }

    /// User-area size in sectors (SEC_COUNT).
    pub fn sectors(&self) -> u64 {
        u64::from(ext::read_le(&self.ext_csd, ext::SEC_COUNT, 4))
    }
}

/// `mmc_wait_for_cmd`: one command without data; its response words, or the error.
pub fn mmc_wait_for_cmd<H: MmcHostOps>(
    host: &mut H,
    cmd: MmcCommand,
) -> Result<[u32; 4], MmcError> {
    let done = host.request(MmcRequest::command(cmd));
    match done.error() {
        None => Ok(done.cmd.resp),
        Some(SdhciError::CmdTimeout) => Err(MmcError::Timeout(cmd.opcode)),
        Some(error) => Err(MmcError::Host {
            cmd: cmd.opcode,
            error,
        }),
    }
}

/// Send one command with the response the command table gives it; `None` when the
/// controller reports an error or the command has no response. An R2 comes back without
/// its CRC byte (SDHCI drops it).
pub fn mmc_send_command<H: MmcHostOps>(host: &mut H, index: u8, arg: u32) -> Option<Response> {
    let cmd = MmcCommand::for_opcode(index, arg);
    let resp = mmc_wait_for_cmd(host, cmd).ok()?;
    Some(match cmd.resp_type {
        ResponseType::None => return None,
        ResponseType::R1 => Response::R1(resp[0]),
        ResponseType::R1b => Response::R1b(resp[0]),
        ResponseType::R2 => {
            let mut b = [0u8; 16];
            for (i, w) in resp.iter().enumerate() {
                b[4 * i..4 * i + 4].copy_from_slice(&w.to_be_bytes());
            }
            Response::R2(b)
        }
        ResponseType::R3 => Response::R3(resp[0]),
        ResponseType::R4 => Response::R4(resp[0]),
        ResponseType::R5 => Response::R5(resp[0]),
    })
}

/// Check an R1 for error bits.
pub fn check_r1(cmd: u8, status: u32) -> Result<u32, MmcError> {
    if status & r1::ERRORS != 0 {
        Err(MmcError::Status { cmd, status })
    } else {
        Ok(status)
    }
}

/// Send a command that answers R1/R1b and check its error bits.
pub fn mmc_send_r1<H: MmcHostOps>(host: &mut H, index: u8, arg: u32) -> Result<u32, MmcError> {
    let cmd = MmcCommand::for_opcode(index, arg);
    if !matches!(cmd.resp_type, ResponseType::R1 | ResponseType::R1b) {
        let resp = mmc_send_command(host, index, arg);
        return Err(MmcError::Response { cmd: index, resp });
    }
    let resp = mmc_wait_for_cmd(host, cmd)?;
    check_r1(index, resp[0])
}

/// CMD13.
pub fn mmc_send_status<H: MmcHostOps>(host: &mut H) -> Result<u32, MmcError> {
    mmc_send_r1(host, 13, u32::from(MMC_RCA) << 16)
}

/// The CURRENT_STATE field of an R1.
pub fn r1_state(status: u32) -> u32 {
    (status & r1::CURRENT_STATE_MASK) >> r1::CURRENT_STATE_SHIFT
}

/// CMD6 write-byte, wait for busy, then CMD13 and check SWITCH_ERROR, as `mmc_switch()`.
pub fn mmc_switch<H: MmcHostOps>(
    host: &mut H,
    card: &MmcCard,
    index: usize,
    value: u8,
) -> Result<(), MmcError> {
    __mmc_switch(host, &card.switch_times, index, value, None, true)
}

/// `__mmc_switch`: CMD6 with the byte's busy time-out, as R1b when the controller can
/// wait that long and as R1 with DAT0 polling otherwise; then the host timing change,
/// then (with `send_status`) CMD13 and its SWITCH_ERROR check.
fn __mmc_switch<H: MmcHostOps>(
    host: &mut H,
    times: &SwitchTimes,
    index: usize,
    value: u8,
    timing: Option<BusTiming>,
    send_status: bool,
) -> Result<(), MmcError> {
    let arg = 0x0300_0000 | (index as u32) << 16 | u32::from(value) << 8;
    let timeout_ms = times.for_switch(index, value);
    let max_busy = host.max_busy_timeout_ms();
    let use_r1b = max_busy == 0 || timeout_ms <= max_busy;
    let resp_type = if use_r1b {
        ResponseType::R1b
    } else {
        ResponseType::R1
    };
    let cmd = MmcCommand::new(6, arg, resp_type).with_busy_timeout(timeout_ms);
    let resp = mmc_wait_for_cmd(host, cmd)?;
    check_r1(6, resp[0])?;
    if !use_r1b {
        host.wait_busy_until(None);
    }
    if let Some(timing) = timing {
        mmc_set_timing(host, timing);
    }
    if send_status {
        mmc_switch_status(host, true)?;
    }
    Ok(())
}

/// CMD6 that starts a long operation (BKOPS_START) without waiting for its busy: Linux's
/// `__mmc_switch(.., use_busy_signal = false)`. The caller waits or interrupts it.
pub fn mmc_switch_nowait<H: MmcHostOps>(
    host: &mut H,
    index: usize,
    value: u8,
) -> Result<SdhciCompletion, MmcError> {
    let arg = 0x0300_0000 | (index as u32) << 16 | u32::from(value) << 8;
    let cmd = MmcCommand::new(6, arg, ResponseType::R1b);
    let done = host.start_request(MmcRequest::command(cmd));
    completion_result(&done)?;
    Ok(done)
}

/// `mmc_switch_status`: CMD13 after a switch; a CRC error is fatal only when asked.
fn mmc_switch_status<H: MmcHostOps>(host: &mut H, crc_err_fatal: bool) -> Result<(), MmcError> {
    let status = match mmc_send_status(host) {
        Err(MmcError::Host {
            error: SdhciError::CmdCrc,
            ..
        }) if !crc_err_fatal => return Ok(()),
        other => other?,
    };
    if status & r1::SWITCH_ERROR != 0 {
        return Err(MmcError::Status { cmd: 6, status });
    }
    Ok(())
}

/// Read one block-sized register-like transfer (CMD8) into `buf`.
fn adtc_read<H: MmcHostOps>(
    host: &mut H,
    opcode: u8,
    arg: u32,
    buf: &mut [u8],
) -> Result<u32, MmcError> {
    let blksz = buf.len() as u32;
    let mut sg = [buf];
    let mrq = MmcRequest {
        sbc: None,
        cmd: MmcCommand::new(opcode, arg, ResponseType::R1),
        data: Some(MmcData::read(blksz, 1, &mut sg)),
        stop: None,
    };
    let done = host.request(mrq);
    completion_result(&done)?;
    Ok(done.cmd.resp[0])
}

/// CMD8.
pub fn mmc_get_ext_csd<H: MmcHostOps>(host: &mut H) -> Result<[u8; ext::EXT_CSD_LEN], MmcError> {
    let mut buf = [0u8; ext::EXT_CSD_LEN];
    adtc_read(host, 8, 0, &mut buf)?;
    Ok(buf)
}

/// A request's outcome as the MMC core sees it: controller errors first (in request
/// order), then the R1 error bits of CMD23 and of the command.
pub fn completion_result(done: &SdhciCompletion) -> Result<(), MmcError> {
    let failed = |c: &super::sdhci::CommandOutcome| {
        c.error.map(|error| match error {
            SdhciError::CmdTimeout => MmcError::Timeout(c.opcode),
            error => MmcError::Host {
                cmd: c.opcode,
                error,
            },
        })
    };
    if let Some(e) = done.sbc.as_ref().and_then(failed) {
        return Err(e);
    }
    if let Some(e) = failed(&done.cmd) {
        return Err(e);
    }
    if let Some(error) = done.data_error {
        return Err(MmcError::Host {
            cmd: done.cmd.opcode,
            error,
        });
    }
    if let Some(sbc) = &done.sbc {
        check_r1(sbc.opcode, sbc.resp[0])?;
    }
    if !done.cmd.issued {
        return Err(MmcError::Response {
            cmd: done.cmd.opcode,
            resp: None,
        });
    }
    check_r1(done.cmd.opcode, done.cmd.resp[0])?;
    Ok(())
}

fn mmc_set_ios_with<H: MmcHostOps>(host: &mut H, f: impl FnOnce(&mut MmcIos)) {
    let mut ios = host.ios();
    f(&mut ios);
    host.set_ios(ios);
}

/// `mmc_set_clock`.
pub fn mmc_set_clock<H: MmcHostOps>(host: &mut H, hz: u64) {
    mmc_set_ios_with(host, |ios| ios.clock = hz);
}

/// `mmc_set_bus_width`.
pub fn mmc_set_bus_width<H: MmcHostOps>(host: &mut H, width: u8) {
    mmc_set_ios_with(host, |ios| ios.bus_width = width);
}

/// `mmc_set_timing`.
pub fn mmc_set_timing<H: MmcHostOps>(host: &mut H, timing: BusTiming) {
    mmc_set_ios_with(host, |ios| ios.timing = timing);
}

/// `mmc_power_up`: power on at the identification clock, one line, legacy timing.
pub fn mmc_power_up<H: MmcHostOps>(host: &mut H) {
    host.set_ios(MmcIos {
        clock: IDENTIFICATION_HZ,
        bus_width: 1,
        timing: BusTiming::Legacy,
        power_mode: PowerMode::Up,
    });
    host.set_ios(MmcIos {
        power_mode: PowerMode::On,
        ..MmcIos::IDENTIFICATION
    });
}

/// CMD1 until the card reports power-up done (Linux polls for one second).
pub fn mmc_send_op_cond<H: MmcHostOps>(host: &mut H) -> Result<u32, MmcError> {
    for _ in 0..1000 {
        match mmc_send_command(host, 1, HOST_OCR) {
            Some(Response::R3(ocr)) if ocr & (1 << 31) != 0 => return Ok(ocr),
            Some(Response::R3(_)) => {
                let t = host.now() + 1_000_000;
                host.idle_until(t);
            }
            None => return Err(MmcError::Timeout(1)),
            other => {
                return Err(MmcError::Response {
                    cmd: 1,
                    resp: other,
                })
            }
        }
    }
    Err(MmcError::PowerUp)
}

/// `mmc_select_bus_width`: CMD6 BUS_WIDTH, the host follows, then the EXT_CSD read at
/// the new width must match the 1-bit one (SDHCI hosts have no bus-test capability, so
/// Linux compares). Tries 8 then 4 lines, as far as the host allows.
fn mmc_select_bus_width<H: MmcHostOps>(
    host: &mut H,
    times: &SwitchTimes,
    caps: &HostCaps,
    ext_1bit: &[u8; ext::EXT_CSD_LEN],
) -> Result<u8, MmcError> {
    let widths: &[(u8, u8)] = match caps.bus_width {
        8 => &[(8, 2), (4, 1)],
        4 => &[(4, 1)],
        _ => return Ok(1),
    };
    let mut last = MmcError::BusWidth { width: 1 };
    for &(width, bits) in widths {
        if let Err(e) = __mmc_switch(host, times, ext::BUS_WIDTH, bits, None, true) {
            last = e;
            continue;
        }
        mmc_set_bus_width(host, width);
        match mmc_get_ext_csd(host) {
            Ok(e) if BUS_WIDTH_CHECK_BYTES.iter().all(|&i| e[i] == ext_1bit[i]) => {
                return Ok(width)
            }
            Ok(_) => last = MmcError::BusWidth { width },
            Err(e) => last = e,
        }
        log::warn!("switch to bus width {width} failed: {last}");
    }
    Err(last)
}

/// `mmc_init_card()`: identification at 400 kHz on one line, selection, the switches the
/// host's capabilities allow with the host's bus following each, tuning for HS200, then
/// cache, HPI, BKOPS and the packed-failure event as the card supports them.
pub fn mmc_init_card<H: MmcHostOps>(host: &mut H, caps: &HostCaps) -> Result<MmcCard, MmcError> {
    let mut ios = MmcIos::IDENTIFICATION;
    if host.ios().power_mode == PowerMode::Off {
        mmc_power_up(host);
    } else {
        ios.power_mode = host.ios().power_mode;
        host.set_ios(ios);
    }
    mmc_send_command(host, 0, 0);
    let ocr = mmc_send_op_cond(host)?;
    match mmc_send_command(host, 2, 0) {
        Some(Response::R2(_)) => {}
        other => {
            return Err(MmcError::Response {
                cmd: 2,
                resp: other,
            })
        }
    }
    let rca_arg = u32::from(MMC_RCA) << 16;
    mmc_send_r1(host, 3, rca_arg)?;
    let csd = match mmc_send_command(host, 9, rca_arg) {
        Some(Response::R2(b)) => b,
        other => {
            return Err(MmcError::Response {
                cmd: 9,
                resp: other,
            })
        }
    };
    mmc_send_r1(host, 7, rca_arg)?;
    let e = mmc_get_ext_csd(host)?;
    let times = SwitchTimes::from_ext_csd(&e);
    let switch = |host: &mut H, index, value| __mmc_switch(host, &times, index, value, None, true);
    switch(host, ext::ERASE_GROUP_DEF, 1)?;
    if e[ext::PARTITION_CONFIG] & 0x07 != 0 {
        switch(
            host,
            ext::PARTITION_CONFIG,
            e[ext::PARTITION_CONFIG] & !0x07,
        )?;
    }
    switch(host, ext::POWER_OFF_NOTIFICATION, ext::POWERED_ON)?;

    let device_type = e[ext::DEVICE_TYPE];
    let hs200 = caps.hs200
        && matches!(caps.bus_width, 4 | 8)
        && device_type & ext::DEVICE_TYPE_HS200_1V8 != 0;
    if hs200 {
        // mmc_select_hs200: width first, then HS_TIMING, host timing, status (CRC
        // errors tolerated), then the clock, then tuning.
        mmc_select_bus_width(host, &times, caps, &e)?;
        __mmc_switch(host, &times, ext::HS_TIMING, 2, None, false)?;
        mmc_set_timing(host, BusTiming::Hs200);
        mmc_switch_status(host, false)?;
        mmc_set_clock(host, caps.max_clock_hz.min(200_000_000));
        host.execute_tuning()?;
    } else {
        let hs =
            caps.high_speed && device_type & (ext::DEVICE_TYPE_HS_52 | ext::DEVICE_TYPE_HS_26) != 0;
        let max_dtr = if hs {
            __mmc_switch(host, &times, ext::HS_TIMING, 1, Some(BusTiming::Hs), true)?;
            if device_type & ext::DEVICE_TYPE_HS_52 != 0 {
                52_000_000
            } else {
                26_000_000
            }
        } else {
            // The CSD as SDHCI returns it lacks its CRC byte, which TRAN_SPEED does not need.
            emmc_card::registers::decode_csd(&csd)
                .tran_speed_khz()
                .map_or(26_000_000, |k| u64::from(k) * 1000)
        };
        // mmc_set_bus_speed
        mmc_set_clock(host, caps.max_clock_hz.min(max_dtr));
        let width = mmc_select_bus_width(host, &times, caps, &e)?;
        let ddr_capable =
            device_type & (ext::DEVICE_TYPE_DDR_52_1V8 | ext::DEVICE_TYPE_DDR_52_1V2) != 0;
        if width > 1 && caps.ddr && hs && ddr_capable {
            // mmc_select_hs_ddr: BUS_WIDTH 5 (4-bit DDR) or 6 (8-bit DDR).
            let bits = if width == 8 { 6 } else { 5 };
            __mmc_switch(
                host,
                &times,
                ext::BUS_WIDTH,
                bits,
                Some(BusTiming::Ddr52),
                true,
            )?;
        }
    }
    if caps.hpi && e[ext::HPI_FEATURES] & ext::HPI_SUPPORT != 0 {
        switch(host, ext::HPI_MGMT, ext::HPI_EN)?;
    }
    if caps.bkops && e[ext::BKOPS_SUPPORT] & 1 != 0 && e[ext::BKOPS_EN] & ext::BKOPS_MANUAL_EN == 0
    {
        switch(host, ext::BKOPS_EN, ext::BKOPS_MANUAL_EN)?;
    }
    if caps.cache && ext::read_le(&e, ext::CACHE_SIZE, 4) > 0 {
        switch(host, ext::CACHE_CTRL, ext::CACHE_EN)?;
    }
    if caps.packed_event && e[ext::MAX_PACKED_WRITES] >= 3 {
        switch(
            host,
            ext::EXCEPTION_EVENTS_CTRL,
            ext::EE_PACKED_FAILURE as u8,
        )?;
    }
    let status = mmc_send_status(host)?;
    if r1_state(status) != CardState::Tran.number() {
        return Err(MmcError::Status { cmd: 13, status });
    }
    Ok(MmcCard {
        ext_csd: mmc_get_ext_csd(host)?,
        csd,
        blockaddr: ocr & (1 << 30) != 0,
        switch_times: times,
    })
}

/// A card, the card time of the host driving it, and the SDHCI controller in between.
pub struct MmcHost {
    pub card: Card,
    pub now: Nanos,
    /// Host time spent before each command on top of what the controller charges (driver
    /// and interrupt latency); 0 by default.
    pub command_ns: Nanos,
    /// The controller every command goes through.
    pub sdhci: SdhciHost,
    switch_times: SwitchTimes,
}

impl MmcHostOps for MmcHost {
    fn now(&self) -> Nanos {
        self.now
    }

    fn idle_until(&mut self, t: Nanos) {
        if t > self.now {
            self.now = t;
        }
        self.card.advance(self.now);
    }

    fn request<S: DmaSegment>(&mut self, mrq: MmcRequest<'_, S>) -> SdhciCompletion {
        self.mmc_wait_for_req(mrq)
    }

    fn start_request<S: DmaSegment>(&mut self, mrq: MmcRequest<'_, S>) -> SdhciCompletion {
        self.now = self.now.saturating_add(self.command_ns);
        self.sdhci.start_request(&mut self.card, &mut self.now, mrq)
    }

    fn wait_busy_until(&mut self, deadline: Option<Nanos>) -> bool {
        self.sdhci
            .wait_busy_until(&mut self.card, &mut self.now, deadline)
    }

    fn busy_until(&self) -> Option<Nanos> {
        self.card.busy_until().filter(|&t| t > self.now)
    }

    fn set_ios(&mut self, ios: MmcIos) {
        self.sdhci.set_ios(&mut self.card, self.now, ios);
    }

    fn ios(&self) -> MmcIos {
        self.sdhci.ios()
    }

    fn execute_tuning(&mut self) -> Result<u32, TuningError> {
        self.sdhci.execute_tuning(&mut self.card, &mut self.now)
    }

    fn max_busy_timeout_ms(&self) -> u32 {
        self.sdhci.max_busy_timeout_ms()
    }
}

impl MmcHost {
    /// A host with the default SDHCI controller.
    pub fn new(card: Card) -> MmcHost {
        MmcHost::with_config(card, SdhciConfig::default())
    }

    pub fn with_config(card: Card, config: SdhciConfig) -> MmcHost {
        let now = card.now();
        MmcHost {
            card,
            now,
            command_ns: 0,
            sdhci: SdhciHost::new(config),
            switch_times: SwitchTimes::DEFAULT,
        }
    }

    /// Give the card back (e.g. to power-cycle it or reopen its image).
    pub fn into_card(self) -> Card {
        self.card
    }

    // ---- requests -----------------------------------------------------------------------

    /// `mmc_wait_for_req`: run one request through the controller.
    pub fn mmc_wait_for_req<S: DmaSegment>(&mut self, mrq: MmcRequest<'_, S>) -> SdhciCompletion {
        self.now = self.now.saturating_add(self.command_ns);
        self.sdhci.request(&mut self.card, &mut self.now, mrq)
    }

    /// `mmc_wait_for_cmd`: one command without data; its response words, or the error.
    pub fn mmc_wait_for_cmd(&mut self, cmd: MmcCommand) -> Result<[u32; 4], MmcError> {
        mmc_wait_for_cmd(self, cmd)
    }

    /// See [`mmc_send_command`].
    pub fn mmc_send_command(&mut self, index: u8, arg: u32) -> Option<Response> {
        mmc_send_command(self, index, arg)
    }

    /// Send a command that answers R1/R1b and check its error bits.
    pub fn mmc_send_r1(&mut self, index: u8, arg: u32) -> Result<u32, MmcError> {
        mmc_send_r1(self, index, arg)
    }

    /// Wait until DAT0 busy is released, polling the line as Linux's `mmc_poll_for_busy`
    /// does through the controller's `card_busy`.
    pub fn mmc_wait_busy(&mut self) {
        MmcHostOps::wait_busy_until(self, None);
    }

    /// CMD13.
    pub fn mmc_send_status(&mut self) -> Result<u32, MmcError> {
        mmc_send_status(self)
    }

    /// CMD6 write-byte, wait for busy, then CMD13 and check SWITCH_ERROR, as
    /// `mmc_switch()` does.
    pub fn mmc_switch(&mut self, index: usize, value: u8) -> Result<(), MmcError> {
        let times = self.switch_times;
        __mmc_switch(self, &times, index, value, None, true)
    }

    /// CMD8.
    pub fn mmc_get_ext_csd(&mut self) -> Result<[u8; ext::EXT_CSD_LEN], MmcError> {
        mmc_get_ext_csd(self)
    }

    fn completion_result(&self, done: &SdhciCompletion) -> Result<(), MmcError> {
        completion_result(done)
    }

    // ---- bus settings -------------------------------------------------------------------

    /// `mmc_set_ios`: hand the controller new bus settings.
    pub fn mmc_set_ios(&mut self, ios: MmcIos) {
        MmcHostOps::set_ios(self, ios);
    }

    pub fn mmc_set_clock(&mut self, hz: u64) {
        mmc_set_clock(self, hz);
    }

    pub fn mmc_set_bus_width(&mut self, width: u8) {
        mmc_set_bus_width(self, width);
    }

    pub fn mmc_set_timing(&mut self, timing: BusTiming) {
        mmc_set_timing(self, timing);
    }

    /// `mmc_power_off`: bus power off (the card loses power suddenly).
    pub fn mmc_power_off(&mut self) {
        let ios = MmcIos {
            clock: 0,
            power_mode: PowerMode::Off,
            ..self.sdhci.ios()
        };
        self.mmc_set_ios(ios);
    }

    /// `mmc_power_up`: power on at the identification clock, one line, legacy timing.
    pub fn mmc_power_up(&mut self) {
        mmc_power_up(self);
    }

    /// `mmc_execute_tuning`.
    pub fn mmc_execute_tuning(&mut self) -> Result<u32, MmcError> {
        Ok(MmcHostOps::execute_tuning(self)?)
    }

    // ---- bring-up -----------------------------------------------------------------------

    /// CMD1 until the card reports power-up done (Linux polls for one second).
    pub fn mmc_send_op_cond(&mut self) -> Result<u32, MmcError> {
        mmc_send_op_cond(self)
    }

    /// See [`mmc_init_card`]. Returns the EXT_CSD as read after bring-up.
    pub fn mmc_init_card(&mut self, caps: &HostCaps) -> Result<[u8; ext::EXT_CSD_LEN], MmcError> {
        let card = mmc_init_card(self, caps)?;
        self.switch_times = card.switch_times;
        Ok(card.ext_csd)
    }

    /// Select a physical partition (PARTITION_CONFIG access bits).
    pub fn mmc_select_partition(&mut self, partition: Partition) -> Result<(), MmcError> {
        let cfg = self.card.ext_csd()[ext::PARTITION_CONFIG];
        let value = (cfg & !0x07) | partition.access_bits();
        if value != cfg {
            self.mmc_switch(ext::PARTITION_CONFIG, value)?;
        }
        Ok(())
    }

    fn address(&self, lba: u64) -> u32 {
        if self.card.model().sector_addressing() {
            lba as u32
        } else {
            (lba * 512) as u32
        }
    }

    /// CMD23 + CMD18 (or CMD17 for one block), with CMD12 as the stop Linux provides.
    pub fn mmc_read_blocks(&mut self, lba: u64, buf: &mut [u8]) -> Result<(), MmcError> {
        let blocks = (buf.len() / 512) as u32;
        let address = self.address(lba);
        let mut sg = [buf];
        let mrq = if blocks == 1 {
            MmcRequest {
                sbc: None,
                cmd: MmcCommand::new(17, address, ResponseType::R1),
                data: Some(MmcData::read(512, 1, &mut sg)),
                stop: None,
            }
        } else {
            MmcRequest {
                sbc: Some(MmcCommand::new(23, blocks, ResponseType::R1)),
                cmd: MmcCommand::new(18, address, ResponseType::R1),
                data: Some(MmcData::read(512, blocks, &mut sg)),
                stop: Some(MmcCommand::new(12, 0, ResponseType::R1)),
            }
        };
        let done = self.mmc_wait_for_req(mrq);
        self.completion_result(&done)
    }

    /// CMD23 (with `cmd23_flags`, e.g. reliable write) + CMD25, wait for programming,
    /// then CMD13 as Linux's `card_busy_detect` does.
    pub fn mmc_write_blocks(
        &mut self,
        lba: u64,
        data: &[u8],
        cmd23_flags: u32,
    ) -> Result<(), MmcError> {
        let blocks = (data.len() / 512) as u32;
        let address = self.address(lba);
        let mut sg = [data];
        let mrq = MmcRequest {
            sbc: Some(MmcCommand::new(23, blocks | cmd23_flags, ResponseType::R1)),
            cmd: MmcCommand::new(25, address, ResponseType::R1),
            data: Some(MmcData::new(DataDirection::Write, 512, blocks, &mut sg)),
            stop: Some(MmcCommand::new(12, 0, ResponseType::R1b)),
        };
        let done = self.mmc_wait_for_req(mrq);
        self.completion_result(&done)?;
        self.mmc_wait_busy();
        let status = self.mmc_send_status()?;
        if status & r1::ERRORS != 0 {
            return Err(MmcError::Status { cmd: 25, status });
        }
        Ok(())
    }

    /// FLUSH_CACHE.
    pub fn mmc_flush_cache(&mut self) -> Result<(), MmcError> {
        self.mmc_switch(ext::FLUSH_CACHE, 1)
    }
}
