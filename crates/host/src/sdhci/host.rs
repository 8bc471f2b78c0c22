//! [`SdhciHost`], the controller (Linux's `struct sdhci_host`): its configuration, ios,
//! tuning state, Response registers and buffers, the fault injector and command log it
//! offers every command to, and the entry points that run one request on a card it is
//! handed (`sdhci_request`).

use emmc_card::timing::Nanos;
use emmc_card::Card;

use super::adma::AdmaDesc;
use super::run::Run;
use super::timeout::CsdTimeouts;
use super::{DmaSegment, MmcIos, MmcRequest, SdhciCompletion, SdhciConfig};
use crate::cmdlog::CmdLog;
use crate::fault::FaultInjector;

/// The controller: configuration, ios, tuning state and its buffers. It drives a card it
/// is handed with every call, so that an owner (see [`Sdhci`](super::Sdhci) and
/// [`crate::mmc::MmcHost`]) keeps the card and the card time.
#[derive(Debug)]
pub struct SdhciHost {
    pub(super) config: SdhciConfig,
    pub(super) ios: MmcIos,
    pub(super) actual_clock: u64,
    /// Host Control 2 Sampling Clock Select: tuning succeeded.
    pub(super) tuned: bool,
    /// Response registers 0x10..0x1F as four 32-bit words (0x10 first).
    pub(super) response: [u32; 4],
    pub(super) staging: Vec<u8>,
    pub(super) table: Vec<AdmaDesc>,
    /// The card's CSD and the data time-outs derived from it (read, write), as the MMC
    /// core decodes them once rather than per request.
    pub(super) data_timeouts: CsdTimeouts,
    /// A fault plan consulted for every command put on the bus (`None`: no faults, and
    /// no cost beyond this check).
    pub(super) faults: Option<Box<FaultInjector>>,
    /// The command log (`--cmd-log`): every command sent is written to it (`None`: one
    /// check per command).
    pub(super) cmd_log: Option<Box<CmdLog>>,
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
            data_timeouts: CsdTimeouts::default(),
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
}
