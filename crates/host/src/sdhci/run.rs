//! One request in flight ([`Run`]) and its sequence, as `sdhci_request` and the
//! interrupt handlers of Linux's `sdhci.c` take a `struct mmc_request` through the
//! controller: optional CMD23 (manual or Auto CMD23), the command, the data phase, the
//! stop (manual or Auto CMD12), the busy waits between them, and the command log entry of
//! each command once the next one starts.

use emmc_card::command::ResponseType;
use emmc_card::timing::Nanos;
use emmc_card::Card;

use super::cmd::Role;
use super::inject::PendingFaults;
use super::{
    auto_cmd_err, error_int, normal_int, target_timeout_us, CommandOutcome, DataDirection,
    DmaSegment, IntStatus, MmcCommand, MmcRequest, SdhciCompletion, SdhciError, SdhciHost,
};
use crate::cmdlog::CmdEntry;

impl SdhciHost {
    /// Write one command to the command log, if there is one: it ran until `end`; a
    /// failing log is dropped.
    pub(super) fn write_log(
        &mut self,
        e: &CmdEntry,
        end: Nanos,
        data_error: Option<SdhciError>,
        busy_pending: bool,
    ) {
        let Some(log) = self.cmd_log.as_mut() else {
            return;
        };
        if let Err(err) = log.command(e, end, data_error, busy_pending) {
            log::error!("command log: {err}; command logging stops");
            self.cmd_log = None;
        }
    }

    /// Tell the fault plan a write's data phase completed (its `after_bytes_written`).
    pub(super) fn note_written(&mut self, bytes: u64) {
        if let Some(f) = self.faults.as_deref_mut() {
            f.note_written(bytes);
        }
    }
}

/// One request in flight.
pub(super) struct Run<'h> {
    pub(super) host: &'h mut SdhciHost,
    pub(super) card: &'h mut Card,
    pub(super) now: Nanos,
    pub(super) out: SdhciCompletion,
    /// Leave the request's final busy to the caller ([`SdhciHost::start_request`]).
    pub(super) defer_final_busy: bool,
    /// The busy being waited for now is the final one.
    pub(super) defer_now: bool,
    /// The data phase of the command being sent, while it is the request's data command:
    /// (direction, block size, blocks, packed).
    pub(super) data_cmd: Option<(DataDirection, u32, u32, bool)>,
    /// Injected faults waiting for the data phase or the busy they act on.
    pub(super) injected: PendingFaults,
    /// With a command log: the last command sent, written once the next starts or the
    /// request ends.
    pub(super) logged: Option<CmdEntry>,
}

impl<'h> Run<'h> {
    pub(super) fn new(
        host: &'h mut SdhciHost,
        card: &'h mut Card,
        now: Nanos,
        opcode: u8,
    ) -> Run<'h> {
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
            injected: PendingFaults::default(),
            logged: None,
        }
    }

    pub(super) fn finish(mut self) -> SdhciCompletion {
        self.out.end_ns = self.now;
        if self.host.cmd_log.is_some() {
            self.log_previous(self.now, self.out.busy_pending);
        }
        self.out
    }

    /// Write the command held for the log: it lasted until `end`.
    pub(super) fn log_previous(&mut self, end: Nanos, busy_pending: bool) {
        let Some(e) = self.logged.take() else {
            return;
        };
        if self.host.cmd_log.is_none() {
            return;
        }
        let data_error = if e.data.is_some() {
            self.out.data_error
        } else {
            None
        };
        self.host.write_log(&e, end, data_error, busy_pending);
    }

    /// Hold a command just sent for the log (the previous one ends now).
    pub(super) fn log_command(&mut self, cmd: &MmcCommand, start: Nanos, out: &CommandOutcome) {
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

    pub(super) fn request<S: DmaSegment>(&mut self, mrq: MmcRequest<'_, S>) {
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
                let (ns, clks) = self.host.data_timeouts.get(self.card.csd(), d.direction);
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
                    self.note_written(u64::from(d.blksz) * u64::from(d.blocks));
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

    /// Auto CMD12 could not go out because the data phase failed.
    pub(super) fn auto_cmd12_not_executed(&mut self) {
        self.out.auto_cmd_err |= auto_cmd_err::ACMD12_NOT_EXEC;
        self.out.int_status.raise_error(error_int::AUTO_CMD_ERR);
    }

    /// Tell the fault plan a write's data phase completed (its `after_bytes_written`).
    pub(super) fn note_written(&mut self, bytes: u64) {
        self.host.note_written(bytes);
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
}
