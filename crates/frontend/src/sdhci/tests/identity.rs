//! The default identity, Intel Apollo Lake's eMMC controller: its IDs, its 4 KiB BAR0
//! with vendor registers above the SDHCI space, and RST_n on Power Control bit 4.

use emmc_card::CardState;
use emmc_host::sdhci::mmio::layout::*;

use super::driver::*;
use super::{model, within, Rig, LIMIT};
use crate::pacing::Pacing;
use crate::pci::PciIdentity;

#[test]
fn the_intel_identity_has_its_ids_a_4_kib_bar0_and_vendor_registers_that_hold_values() {
    within(LIMIT, || {
        assert_eq!(PciIdentity::default(), PciIdentity::IntelApl);
        let rig = Rig::generic();
        let mut h = Host::connect(&rig);
        let mut cfg = [0u8; 16];
        h.c.region_read(CONFIG, 0, &mut cfg).unwrap();
        assert_eq!(cfg[0..4], [0x86, 0x80, 0xcc, 0x5a], "8086:5acc");
        assert_eq!(cfg[9..12], [0x01, 0x05, 0x08], "class 08/05/01");
        let mut sub = [0u8; 4];
        h.c.region_read(CONFIG, 0x2c, &mut sub).unwrap();
        assert_eq!(sub, [0x86, 0x80, 0x70, 0x72], "subsystem 8086:7270");
        assert_eq!(h.c.region(BAR0).unwrap().size, 4096);
        // BAR sizing says the same.
        h.c.region_write(CONFIG, 0x10, &u32::MAX.to_le_bytes())
            .unwrap();
        let mut bar = [0u8; 4];
        h.c.region_read(CONFIG, 0x10, &mut bar).unwrap();
        assert_eq!(u32::from_le_bytes(bar) & !0xf, 0xffff_f000);

        // Linux's LTR registers: they hold what was written, and touch nothing else.
        let regs = |h: &mut Host| (h.readl(SDHCI_INT_ENABLE), h.readl(SDHCI_CAPABILITIES));
        let sdhci = regs(&mut h);
        assert_eq!((h.readl(0x804), h.readl(0x808)), (0, 0));
        h.writel(0x8a03_8a03, 0x804);
        h.writel(0x0000_8a03, 0x808);
        h.writeb(0x5a, 0xfff);
        assert_eq!(h.readl(0x804), 0x8a03_8a03);
        assert_eq!(h.readl(0x808), 0x0000_8a03);
        assert_eq!(h.readw(0x806), 0x8a03);
        assert_eq!(h.readb(0xfff), 0x5a);
        assert_eq!(regs(&mut h), sdhci);
        // The standard space is not mirrored above 0x100.
        assert_eq!(h.readw(0x100 + SDHCI_HOST_VERSION), 0);
        // A device reset clears them.
        h.c.reset().unwrap();
        h.c.region_write(CONFIG, 4, &6u16.to_le_bytes()).unwrap();
        assert_eq!(h.readl(0x804), 0);
    });
}

#[test]
fn power_control_bit_4_pulses_rst_n_and_resets_a_card_whose_rst_n_function_is_1() {
    within(LIMIT, || {
        let rig = Rig::generic();
        let mut h = Host::connect(&rig);
        h.bring_up();
        let on = h.readb(SDHCI_POWER_CONTROL);
        let pulse = |h: &mut Host| {
            h.writeb(on | SDHCI_POWER_RST_N, SDHCI_POWER_CONTROL);
            assert_eq!(h.readb(SDHCI_POWER_CONTROL), on | SDHCI_POWER_RST_N);
            h.writeb(on, SDHCI_POWER_CONTROL);
        };
        pulse(&mut h);
        assert_eq!(
            rig.card(|c| c.state()),
            CardState::Tran,
            "RST_n_FUNCTION 0: ignored"
        );
        h.switch(162, 1).expect("RST_n_FUNCTION = 1");
        pulse(&mut h);
        assert_eq!(rig.card(|c| c.state()), CardState::Idle, "reset by RST_n");
        let up = h.bring_up();
        assert!(up.polls >= 2, "powered up afresh");
        assert_eq!(rig.card(|c| c.state()), CardState::Tran);

        // The generic identity has no RST_n: bit 4 is reserved.
        let rig = Rig::start(&model("generic-emmc45"), PciIdentity::Generic, Pacing::Off);
        let mut h = Host::connect(&rig);
        assert_eq!(h.c.region(BAR0).unwrap().size, 256);
        h.bring_up();
        h.switch(162, 1).expect("RST_n_FUNCTION = 1");
        let on = h.readb(SDHCI_POWER_CONTROL);
        h.writeb(on | SDHCI_POWER_RST_N, SDHCI_POWER_CONTROL);
        assert_eq!(h.readb(SDHCI_POWER_CONTROL), on, "reserved: reads 0");
        h.writeb(on, SDHCI_POWER_CONTROL);
        assert_eq!(rig.card(|c| c.state()), CardState::Tran);
    });
}
