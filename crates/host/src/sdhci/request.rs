//! The request the driver hands the controller and what comes back, named after the
//! Linux MMC core's `struct mmc_command`, `struct mmc_data` and `struct mmc_request`
//! (`include/linux/mmc/core.h`): the command and the response it expects, the data phase
//! over a scatter-gather list, and the completion with the errors Linux would store and
//! the status registers a driver's interrupt handler would have seen.

use emmc_card::command::ResponseType;
use emmc_card::timing::Nanos;

use super::{DmaSegment, IntStatus};

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
    /// Number of blocks (Block Count register; at most [`MAX_BLOCK_COUNT`](super::MAX_BLOCK_COUNT)).
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
/// choice ([`SdhciConfig::auto_cmd23`](super::SdhciConfig::auto_cmd23), [`SdhciConfig::auto_cmd12`](super::SdhciConfig::auto_cmd12)), as in Linux.
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
    pub(super) fn pending(opcode: u8) -> CommandOutcome {
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
    /// Auto CMD Error Status (0x3C), see [`auto_cmd_err`](super::auto_cmd_err).
    pub auto_cmd_err: u16,
    /// ADMA Error Status (0x54), see [`adma_err`](super::adma_err).
    pub adma_err: u8,
    /// Card time at which the request was issued and at which it completed.
    pub start_ns: Nanos,
    pub end_ns: Nanos,
    /// Started with [`SdhciHost::start_request`](super::SdhciHost::start_request): the card still holds DAT0 busy after the
    /// request's last step (write programming or an R1b command); `end_ns` is when the
    /// busy began. The owner waits with [`SdhciHost::wait_busy_until`](super::SdhciHost::wait_busy_until) or stops waiting to
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

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(opcode: u8, error: Option<SdhciError>) -> CommandOutcome {
        CommandOutcome {
            issued: true,
            error,
            ..CommandOutcome::pending(opcode)
        }
    }

    #[test]
    fn r1b_commands_wait_for_busy_and_the_table_gives_the_response() {
        let switch = MmcCommand::for_opcode(6, 0x03b7_0100);
        assert_eq!((switch.resp_type, switch.busy), (ResponseType::R1b, true));
        let status = MmcCommand::for_opcode(13, 1 << 16);
        assert_eq!((status.resp_type, status.busy), (ResponseType::R1, false));
        assert_eq!(MmcCommand::for_opcode(9, 0).resp_type, ResponseType::R2);
        // Only the low six bits name the command.
        assert_eq!(
            MmcCommand::for_opcode(0x40 | 6, 0).resp_type,
            ResponseType::R1b
        );
        assert_eq!(
            MmcCommand::new(38, 0, ResponseType::R1b)
                .with_busy_timeout(300)
                .busy_timeout_ms,
            300
        );
    }

    #[test]
    fn the_first_error_counts_in_request_order() {
        let mut done = SdhciCompletion {
            sbc: Some(outcome(23, None)),
            cmd: outcome(25, None),
            stop: Some(outcome(12, Some(SdhciError::CmdTimeout))),
            data_error: Some(SdhciError::DataCrc),
            bytes_xfered: 0,
            int_status: IntStatus::default(),
            auto_cmd_err: 0,
            adma_err: 0,
            start_ns: 1_000,
            end_ns: 4_000,
            busy_pending: false,
        };
        assert_eq!(done.error(), Some(SdhciError::DataCrc));
        assert!(!done.is_ok());
        assert_eq!(done.duration_ns(), 3_000);
        done.cmd.error = Some(SdhciError::CmdCrc);
        assert_eq!(done.error(), Some(SdhciError::CmdCrc));
        done.sbc = Some(outcome(23, Some(SdhciError::CmdEndBit)));
        assert_eq!(done.error(), Some(SdhciError::CmdEndBit));
        // A request whose command never went out is not ok, error or not.
        let refused = SdhciCompletion {
            sbc: None,
            cmd: CommandOutcome::pending(25),
            stop: None,
            data_error: None,
            ..done
        };
        assert_eq!(refused.error(), None);
        assert!(!refused.is_ok() && !refused.cmd.ok());
    }
}
