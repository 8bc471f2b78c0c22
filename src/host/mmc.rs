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

use crate::card::ext_csd as ext;
use crate::card::{r1, Card, CardState, DataError, Partition, Response};
use crate::timing::Nanos;

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
    pub fn for_model(host: &crate::model::HostModel) -> HostCaps {
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
        let done = self.mmc_wait_for_req(MmcRequest::command(cmd));
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
    /// controller reports an error (a time-out, or a response it could not take) or the
    /// command has no response. An R2 comes back without its CRC byte (SDHCI drops it).
    pub fn mmc_send_command(&mut self, index: u8, arg: u32) -> Option<Response> {
        let cmd = MmcCommand::for_opcode(index, arg);
        let resp = self.mmc_wait_for_cmd(cmd).ok()?;
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
    fn check_r1(cmd: u8, status: u32) -> Result<u32, MmcError> {
        if status & r1::ERRORS != 0 {
            Err(MmcError::Status { cmd, status })
        } else {
            Ok(status)
        }
    }

    /// Send a command that answers R1/R1b and check its error bits.
    pub fn mmc_send_r1(&mut self, index: u8, arg: u32) -> Result<u32, MmcError> {
        let cmd = MmcCommand::for_opcode(index, arg);
        if !matches!(cmd.resp_type, ResponseType::R1 | ResponseType::R1b) {
            let resp = self.mmc_send_command(index, arg);
            return Err(MmcError::Response { cmd: index, resp });
        }
        let resp = self.mmc_wait_for_cmd(cmd)?;
        Self::check_r1(index, resp[0])
    }

    /// Wait until DAT0 busy is released, polling the line as Linux's `mmc_poll_for_busy`
    /// does through the controller's `card_busy`.
    pub fn mmc_wait_busy(&mut self) {
        if let Some(end) = self.card.busy_until() {
            self.now = self.now.max(end);
        }
        self.card.advance(self.now);
    }

    /// CMD13.
    pub fn mmc_send_status(&mut self) -> Result<u32, MmcError> {
        self.mmc_send_r1(13, u32::from(MMC_RCA) << 16)
    }

    /// CMD6 write-byte, wait for busy, then CMD13 and check SWITCH_ERROR, as
    /// `mmc_switch()` does.
    pub fn mmc_switch(&mut self, index: usize, value: u8) -> Result<(), MmcError> {
        self.__mmc_switch(index, value, None, true)
    }

    /// `__mmc_switch`: CMD6 with the byte's busy time-out, as R1b when the controller can
    /// wait that long and as R1 with DAT0 polling otherwise; then the host timing change,
    /// then (with `send_status`) CMD13 and its SWITCH_ERROR check.
    fn __mmc_switch(
        &mut self,
        index: usize,
        value: u8,
        timing: Option<BusTiming>,
        send_status: bool,
    ) -> Result<(), MmcError> {
        let arg = 0x0300_0000 | (index as u32) << 16 | u32::from(value) << 8;
        let timeout_ms = self.switch_times.for_switch(index, value);
        let max_busy = self.sdhci.max_busy_timeout_ms();
        let use_r1b = max_busy == 0 || timeout_ms <= max_busy;
        let resp_type = if use_r1b {
            ResponseType::R1b
        } else {
            ResponseType::R1
        };
        let cmd = MmcCommand::new(6, arg, resp_type).with_busy_timeout(timeout_ms);
        let resp = self.mmc_wait_for_cmd(cmd)?;
        Self::check_r1(6, resp[0])?;
        if !use_r1b {
            self.mmc_wait_busy();
        }
        if let Some(timing) = timing {
            self.mmc_set_timing(timing);
        }
        if send_status {
            self.mmc_switch_status(true)?;
        }
        Ok(())
    }

    /// `mmc_switch_status`: CMD13 after a switch; a CRC error is fatal only when asked.
    fn mmc_switch_status(&mut self, crc_err_fatal: bool) -> Result<(), MmcError> {
        let status = match self.mmc_send_status() {
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
    fn adtc_read(&mut self, opcode: u8, arg: u32, buf: &mut [u8]) -> Result<u32, MmcError> {
        let blksz = buf.len() as u32;
        let mut sg = [buf];
        let mrq = MmcRequest {
            sbc: None,
            cmd: MmcCommand::new(opcode, arg, ResponseType::R1),
            data: Some(MmcData::read(blksz, 1, &mut sg)),
            stop: None,
        };
        let done = self.mmc_wait_for_req(mrq);
        self.completion_result(&done)?;
        Ok(done.cmd.resp[0])
    }

    /// CMD8.
    pub fn mmc_get_ext_csd(&mut self) -> Result<[u8; ext::EXT_CSD_LEN], MmcError> {
        let mut buf = [0u8; ext::EXT_CSD_LEN];
        self.adtc_read(8, 0, &mut buf)?;
        Ok(buf)
    }

    /// A request's outcome as the MMC core sees it: controller errors first (in request
    /// order), then the R1 error bits of CMD23 and of the command.
    fn completion_result(&self, done: &SdhciCompletion) -> Result<(), MmcError> {
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
            Self::check_r1(sbc.opcode, sbc.resp[0])?;
        }
        if !done.cmd.issued {
            return Err(MmcError::Response {
                cmd: done.cmd.opcode,
                resp: None,
            });
        }
        Self::check_r1(done.cmd.opcode, done.cmd.resp[0])?;
        Ok(())
    }

    // ---- bus settings -------------------------------------------------------------------

    /// `mmc_set_ios`: hand the controller new bus settings.
    pub fn mmc_set_ios(&mut self, ios: MmcIos) {
        self.sdhci.set_ios(&mut self.card, self.now, ios);
    }

    pub fn mmc_set_clock(&mut self, hz: u64) {
        let ios = MmcIos {
            clock: hz,
            ..self.sdhci.ios()
        };
        self.mmc_set_ios(ios);
    }

    pub fn mmc_set_bus_width(&mut self, width: u8) {
        let ios = MmcIos {
            bus_width: width,
            ..self.sdhci.ios()
        };
        self.mmc_set_ios(ios);
    }

    pub fn mmc_set_timing(&mut self, timing: BusTiming) {
        let ios = MmcIos {
            timing,
            ..self.sdhci.ios()
        };
        self.mmc_set_ios(ios);
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
        self.mmc_set_ios(MmcIos {
            clock: IDENTIFICATION_HZ,
            bus_width: 1,
            timing: BusTiming::Legacy,
            power_mode: PowerMode::Up,
        });
        self.mmc_set_ios(MmcIos {
            power_mode: PowerMode::On,
            ..MmcIos::IDENTIFICATION
        });
    }

    /// `mmc_execute_tuning`.
    pub fn mmc_execute_tuning(&mut self) -> Result<u32, MmcError> {
        Ok(self.sdhci.execute_tuning(&mut self.card, &mut self.now)?)
    }

    // ---- bring-up -----------------------------------------------------------------------

    /// CMD1 until the card reports power-up done (Linux polls for one second).
    pub fn mmc_send_op_cond(&mut self) -> Result<u32, MmcError> {
        for _ in 0..1000 {
            match self.mmc_send_command(1, HOST_OCR) {
                Some(Response::R3(ocr)) if ocr & (1 << 31) != 0 => return Ok(ocr),
                Some(Response::R3(_)) => {
                    self.now += 1_000_000;
                    self.card.advance(self.now);
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
    fn mmc_select_bus_width(
        &mut self,
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
            if let Err(e) = self.mmc_switch(ext::BUS_WIDTH, bits) {
                last = e;
                continue;
            }
            self.mmc_set_bus_width(width);
            match self.mmc_get_ext_csd() {
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

    /// `mmc_init_card()`: identification at 400 kHz on one line, selection, the switches
    /// the host's capabilities allow with the host's bus following each, tuning for HS200.
    /// Returns the EXT_CSD as read after bring-up.
    pub fn mmc_init_card(&mut self, caps: &HostCaps) -> Result<[u8; ext::EXT_CSD_LEN], MmcError> {
        let mut ios = MmcIos::IDENTIFICATION;
        if self.sdhci.ios().power_mode == PowerMode::Off {
            self.mmc_power_up();
        } else {
            ios.power_mode = self.sdhci.ios().power_mode;
            self.mmc_set_ios(ios);
        }
        self.mmc_send_command(0, 0);
        self.mmc_send_op_cond()?;
        match self.mmc_send_command(2, 0) {
            Some(Response::R2(_)) => {}
            other => {
                return Err(MmcError::Response {
                    cmd: 2,
                    resp: other,
                })
            }
        }
        let rca_arg = u32::from(MMC_RCA) << 16;
        self.mmc_send_r1(3, rca_arg)?;
        match self.mmc_send_command(9, rca_arg) {
            Some(Response::R2(_)) => {}
            other => {
                return Err(MmcError::Response {
                    cmd: 9,
                    resp: other,
                })
            }
        }
        self.mmc_send_r1(7, rca_arg)?;
        let e = self.mmc_get_ext_csd()?;
        self.switch_times = SwitchTimes::from_ext_csd(&e);
        self.mmc_switch(ext::ERASE_GROUP_DEF, 1)?;
        if e[ext::PARTITION_CONFIG] & 0x07 != 0 {
            self.mmc_switch(ext::PARTITION_CONFIG, e[ext::PARTITION_CONFIG] & !0x07)?;
        }
        self.mmc_switch(ext::POWER_OFF_NOTIFICATION, ext::POWERED_ON)?;

        let device_type = e[ext::DEVICE_TYPE];
        let hs200 = caps.hs200
            && matches!(caps.bus_width, 4 | 8)
            && device_type & ext::DEVICE_TYPE_HS200_1V8 != 0;
        if hs200 {
            // mmc_select_hs200: width first, then HS_TIMING, host timing, status (CRC
            // errors tolerated), then the clock, then tuning.
            self.mmc_select_bus_width(caps, &e)?;
            self.__mmc_switch(ext::HS_TIMING, 2, None, false)?;
            self.mmc_set_timing(BusTiming::Hs200);
            self.mmc_switch_status(false)?;
            self.mmc_set_clock(caps.max_clock_hz.min(200_000_000));
            self.mmc_execute_tuning()?;
        } else {
            let hs = caps.high_speed
                && device_type & (ext::DEVICE_TYPE_HS_52 | ext::DEVICE_TYPE_HS_26) != 0;
            let max_dtr = if hs {
                self.__mmc_switch(ext::HS_TIMING, 1, Some(BusTiming::Hs), true)?;
                if device_type & ext::DEVICE_TYPE_HS_52 != 0 {
                    52_000_000
                } else {
                    26_000_000
                }
            } else {
                let csd = crate::card::registers::decode_csd(&self.card.csd());
                csd.tran_speed_khz()
                    .map_or(26_000_000, |k| u64::from(k) * 1000)
            };
            // mmc_set_bus_speed
            self.mmc_set_clock(caps.max_clock_hz.min(max_dtr));
            let width = self.mmc_select_bus_width(caps, &e)?;
            let ddr_capable =
                device_type & (ext::DEVICE_TYPE_DDR_52_1V8 | ext::DEVICE_TYPE_DDR_52_1V2) != 0;
            if width > 1 && caps.ddr && hs && ddr_capable {
                // mmc_select_hs_ddr: BUS_WIDTH 5 (4-bit DDR) or 6 (8-bit DDR).
                let bits = if width == 8 { 6 } else { 5 };
                self.__mmc_switch(ext::BUS_WIDTH, bits, Some(BusTiming::Ddr52), true)?;
            }
        }
        if caps.hpi && e[ext::HPI_FEATURES] & ext::HPI_SUPPORT != 0 {
            self.mmc_switch(ext::HPI_MGMT, ext::HPI_EN)?;
        }
        if caps.bkops
            && e[ext::BKOPS_SUPPORT] & 1 != 0
            && e[ext::BKOPS_EN] & ext::BKOPS_MANUAL_EN == 0
        {
            self.mmc_switch(ext::BKOPS_EN, ext::BKOPS_MANUAL_EN)?;
        }
        if caps.cache && ext::read_le(&e, ext::CACHE_SIZE, 4) > 0 {
            self.mmc_switch(ext::CACHE_CTRL, ext::CACHE_EN)?;
        }
        if caps.packed_event && e[ext::MAX_PACKED_WRITES] >= 3 {
            self.mmc_switch(ext::EXCEPTION_EVENTS_CTRL, ext::EE_PACKED_FAILURE as u8)?;
        }
        if self.card.state() != CardState::Tran {
            return Err(MmcError::Response {
                cmd: 13,
                resp: None,
            });
        }
        self.mmc_get_ext_csd()
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
