//! The PCI identity the function presents: which IDs the guest's drivers match on.
//!
//! Linux's `sdhci-pci` binds any function of class 0x0805 (SD host controller), but the
//! bus modes and slot options it uses come from its quirk table in
//! `drivers/mmc/host/sdhci-pci-core.c`, keyed by vendor and device ID (the Intel eMMC
//! controllers' entries give an 8-bit, non-removable slot with DDR52 and HS200). An
//! identity is one row of [`IDENTITIES`]: adding one is a variant of [`PciIdentity`] and
//! its row.

/// `--pci-identity`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PciIdentity {
    /// The ID QEMU reserves for an emulated SDHCI controller (1b36:0007, subsystem
    /// 1af4:1100): Linux's generic class match, a 4-bit removable slot.
    #[default]
    Generic,
}

/// The identifying registers of one identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciIds {
    pub vendor: u16,
    pub device: u16,
    pub subsystem_vendor: u16,
    pub subsystem: u16,
    pub revision: u8,
    /// Class code: base class, subclass, programming interface (0x08, 0x05, 0x01: an SD
    /// host controller following the standard, with DMA).
    pub class: [u8; 3],
}

/// SD host controller, standard interface with DMA.
pub const CLASS_SDHCI_DMA: [u8; 3] = [0x08, 0x05, 0x01];

/// One row per identity.
pub const IDENTITIES: &[(PciIdentity, PciIds)] = &[(
    PciIdentity::Generic,
    PciIds {
        vendor: 0x1b36,
        device: 0x0007,
        subsystem_vendor: 0x1af4,
        subsystem: 0x1100,
        revision: 0x00,
        class: CLASS_SDHCI_DMA,
    },
)];

impl PciIdentity {
    /// This identity's row.
    pub fn ids(self) -> PciIds {
        IDENTITIES
            .iter()
            .find(|(id, _)| *id == self)
            .map(|(_, ids)| *ids)
            .unwrap_or(IDENTITIES[0].1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    #[test]
    fn every_identity_has_exactly_one_row_of_class_sdhci() {
        for id in PciIdentity::value_variants() {
            let rows = IDENTITIES.iter().filter(|(i, _)| i == id).count();
            assert_eq!(rows, 1, "{id:?}");
            assert_eq!(id.ids().class[..2], [0x08, 0x05], "{id:?}");
        }
    }
}
