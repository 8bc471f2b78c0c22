//! Putting one command on the CMD line and judging its response, as Linux's
//! `sdhci_send_command` and `sdhci_cmd_irq` / `sdhci_finish_command` do: the exchange
//! with the card in bus time, a silent card's time-out after [`NCR_MAX`] clocks, the
//! response checks (length, CRC, index), the Response registers, and the status bits a
//! command raises where its role puts them.

use emmc_card::command::ResponseType;
use emmc_card::timing::bus::{ResponseLength, COMMAND_BITS};
use emmc_card::timing::Bus;
use emmc_card::{Command, Response};

use super::run::Run;
use super::{
    auto_cmd_err, error_int, normal_int, CommandOutcome, MmcCommand, PowerMode, SdhciError,
    SdhciHost,
};

/// Clocks the controller waits for a response start bit before Command Timeout (NCR
/// maximum, facts §12.4).
pub const NCR_MAX: u64 = 64;

/// Which role a command has in a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Normal,
    AutoCmd12,
    AutoCmd23,
    Tuning,
}

impl Run<'_> {
    /// Put one command on the CMD line and judge its response.
    pub(super) fn send_command(&mut self, cmd: &MmcCommand, role: Role) -> CommandOutcome {
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
            if let Some((ns, stuck)) = self.injected.extra_busy.take() {
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

impl SdhciHost {
    /// Response registers 0x10, 0x14, 0x18, 0x1C as the last command left them (an R2 in
    /// RESP[119:0] without its CRC byte; an Auto CMD12 response in 0x1C).
    pub fn response_registers(&self) -> [u32; 4] {
        self.response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_keeps_a_short_response_in_word_0_and_an_r2_without_its_crc() {
        assert_eq!(linux_resp(&Response::R1(0x0000_0900)), [0x900, 0, 0, 0]);
        assert_eq!(
            linux_resp(&Response::R3(0xc0ff_8080)),
            [0xc0ff_8080, 0, 0, 0]
        );
        let mut r2 = [0u8; 16];
        for (i, b) in r2.iter_mut().enumerate() {
            *b = 0x10 + i as u8;
        }
        assert_eq!(
            linux_resp(&Response::R2(r2)),
            [0x1011_1213, 0x1415_1617, 0x1819_1a1b, 0x1c1d_1e00]
        );
    }
}
