//! The PCI identity the function presents: which IDs the guest's drivers match on.
//!
//! Linux's `sdhci-pci` binds any function of class 0x0805 (SD host controller), but the
//! bus modes and slot options it uses come from its quirk table in
//! `drivers/mmc/host/sdhci-pci-core.c`, keyed by vendor and device ID. An identity is one
//! row of [`IDENTITIES`]: adding one is a variant of [`PciIdentity`] and its row.
//! docs/sdhci-transport.md, "PCI identities", says what a stock Debian kernel makes of
//! each, with the kernel source lines.

/// `--pci-identity`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PciIdentity {
    /// Intel Apollo Lake eMMC controller (8086:5acc). Linux gives it the Bay Trail eMMC
    /// fixes (`sdhci_intel_byt_emmc`): an 8-bit, non-removable slot with hardware reset,
    /// 1.8 V DDR and waiting while busy; HS200 when the capabilities offer SDR104.
    #[default]
    IntelApl,
    /// Intel Broxton eMMC controller (8086:0acc): the same fixes as Apollo Lake.
    IntelBxt,
    /// Intel Sunrise Point eMMC controller (8086:9d2b): the same fixes as Apollo Lake.
    IntelSpt,
    /// The ID QEMU reserves for an emulated SDHCI controller (1b36:0007, subsystem
    /// 1af4:1100): Linux's generic class match, a 4-bit removable slot.
    Generic,
}

/// The identifying registers of one identity, and what its controller has beyond SDHCI.
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
    /// BAR0's size. Intel's controllers have 4 KiB with vendor registers above the
    /// standard 256 bytes (Linux writes the LTR registers at 0x804 and 0x808).
    pub bar0_size: u64,
    /// Power Control bit 4 drives the card's RST_n (Linux: `sdhci_pci_int_hw_reset`).
    pub rst_n_in_power_control: bool,
}

/// SD host controller, standard interface with DMA.
pub const CLASS_SDHCI_DMA: [u8; 3] = [0x08, 0x05, 0x01];

const INTEL: u16 = 0x8086;

/// An Intel eMMC controller with device ID `device`.
const fn intel_emmc(device: u16) -> PciIds {
    PciIds {
        vendor: INTEL,
        device,
        subsystem_vendor: INTEL,
        subsystem: 0x7270,
        revision: 0x0b,
        class: CLASS_SDHCI_DMA,
        bar0_size: 4096,
        rst_n_in_power_control: true,
    }
}

/// One row per identity.
pub const IDENTITIES: &[(PciIdentity, PciIds)] = &[
    (PciIdentity::IntelApl, intel_emmc(0x5acc)),
    (PciIdentity::IntelBxt, intel_emmc(0x0acc)),
    (PciIdentity::IntelSpt, intel_emmc(0x9d2b)),
    (
        PciIdentity::Generic,
        PciIds {
            vendor: 0x1b36,
            device: 0x0007,
            subsystem_vendor: 0x1af4,
            subsystem: 0x1100,
            revision: 0x00,
            class: CLASS_SDHCI_DMA,
            bar0_size: 256,
            rst_n_in_power_control: false,
        },
    ),
];

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
            let ids = id.ids();
            assert_eq!(ids.class[..2], [0x08, 0x05], "{id:?}");
            assert!(
                ids.bar0_size.is_power_of_two() && ids.bar0_size >= 256,
                "{id:?}: BAR0 holds the SDHCI registers"
            );
        }
    }

    #[test]
    fn the_intel_rows_are_the_ids_linux_gives_its_emmc_fixes() {
        // sdhci-pci.h: PCI_DEVICE_ID_INTEL_APL_EMMC 0x5acc, BXT_EMMC 0x0acc, SPT_EMMC 0x9d2b.
        let ids: Vec<(u16, u16)> = [
            PciIdentity::IntelApl,
            PciIdentity::IntelBxt,
            PciIdentity::IntelSpt,
        ]
        .iter()
        .map(|i| (i.ids().vendor, i.ids().device))
        .collect();
        assert_eq!(ids, [(0x8086, 0x5acc), (0x8086, 0x0acc), (0x8086, 0x9d2b)]);
    }
}
