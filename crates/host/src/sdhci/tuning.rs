//! HS200 tuning as Linux's `sdhci_execute_tuning` runs it: CMD21 sent until the
//! controller has found a sampling point, each tuning block read by PIO into the
//! controller, and the Sampling Clock Select state the data phase consults.

use emmc_card::command::ResponseType;
use emmc_card::model::BusTiming;
use emmc_card::timing::Nanos;
use emmc_card::Card;

use super::cmd::Role;
use super::run::Run;
use super::{normal_int, MmcCommand, SdhciError, SdhciHost};

/// Linux gives up tuning after this many tuning commands (`MAX_TUNING_LOOP`).
pub const MAX_TUNING_LOOP: u32 = 40;
/// How long Linux waits for the Buffer Read Ready of one tuning command.
pub const TUNING_WAIT_NS: Nanos = 50_000_000;
/// Above this clock HS200 needs a tuned sampling point.
pub const TUNING_NEEDED_ABOVE_HZ: u64 = 52_000_000;

/// Why [`SdhciHost::execute_tuning`] failed (Linux falls back to a fixed sampling clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TuningError {
    #[error("no Buffer Read Ready for tuning command {tries}")]
    NoBufferReadReady { tries: u32 },
    #[error("tuning did not complete in {tries} tuning commands")]
    Failed { tries: u32 },
}

impl SdhciHost {
    /// Sampling Clock Select: a tuning sequence succeeded since the last timing change.
    pub fn tuned(&self) -> bool {
        self.tuned
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
}

impl Run<'_> {
    /// One tuning command: CMD21 with a PIO read of one block into the controller. Returns
    /// whether the block arrived intact.
    pub(super) fn send_tuning(&mut self, blksz: usize) -> bool {
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
