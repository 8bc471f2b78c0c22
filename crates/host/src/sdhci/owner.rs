//! [`Sdhci`]: a controller that owns its card and the card time, what a frontend or the
//! simulator drives. ([`crate::mmc::MmcHost`] is the other owner: the MMC core helpers
//! with their card, time and controller.)

use emmc_card::timing::Nanos;
use emmc_card::Card;

use super::{
    DmaSegment, MmcCommand, MmcIos, MmcRequest, SdhciCompletion, SdhciConfig, SdhciHost,
    TuningError,
};

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
