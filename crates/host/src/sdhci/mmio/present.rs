//! Present State (0x24), computed when read: the inhibits and transfer bits from the CMD
//! and DAT lines' state, the buffer enables from the PIO engine, an embedded card that is
//! always inserted, stable and writable, and the DAT0 level the card drives low while it
//! is busy (Linux's `card_busy` polls it).

use super::layout::*;
use super::transfer::Engine;
use super::SdhciMmio;

impl SdhciMmio {
    pub(super) fn present_state(&self) -> u32 {
        let mut s = SDHCI_CARD_PRESENT
            | SDHCI_CD_STABLE
            | SDHCI_CD_LVL
            | SDHCI_WRITE_PROTECT
            | SDHCI_CMD_LVL
            | SDHCI_DATA_LVL_MASK;
        if self.cmd.is_some() {
            s |= SDHCI_CMD_INHIBIT;
        }
        if let Some(d) = &self.dat {
            s |= SDHCI_DATA_INHIBIT | SDHCI_DAT_LINE_ACTIVE;
            match d.read {
                Some(true) => s |= SDHCI_DOING_READ,
                Some(false) => s |= SDHCI_DOING_WRITE,
                None => {}
            }
            match d.engine {
                Engine::PioRead { ready: true, .. } => s |= SDHCI_DATA_AVAILABLE,
                Engine::PioWrite { ready: true, .. } => s |= SDHCI_SPACE_AVAILABLE,
                _ => {}
            }
        }
        if self.card_busy() {
            s &= !SDHCI_DATA_0_LVL_MASK;
        }
        s
    }

    /// The card holds DAT0 low now.
    pub(super) fn card_busy(&self) -> bool {
        self.card.busy_until().is_some_and(|end| end > self.now)
    }
}
