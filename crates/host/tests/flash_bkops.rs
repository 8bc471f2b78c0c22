//! The flash timing model seen through the host: the card reports the model's background
//! debt in BKOPS_STATUS and URGENT_BKOPS, and a BKOPS the host starts works it off.

use emmc_card::model::DeviceModel;
use emmc_card::store::NullStore;
use emmc_card::{ext_csd as x, Card, Partition};
use emmc_host::mmc::{HostCaps, MmcHost};

fn model(name: &str) -> DeviceModel {
    DeviceModel::load(name).unwrap()
}

/// The card asks the model for its debt: BKOPS_STATUS and URGENT_BKOPS follow it, and a
/// host-started BKOPS works it off in card time.
#[test]
fn card_reports_the_models_debt_and_manual_bkops_works_it_off() {
    let mut m = model("sandisk-sem32g");
    {
        let f = m.timing.flash_mut();
        f.bkops.level_ns = [100_000_000, 500_000_000, 0];
    }
    let card = Card::new(m.clone(), Box::new(NullStore::new(Card::layout_for(&m)))).unwrap();
    let mut host = MmcHost::new(card);
    host.mmc_init_card(&HostCaps::for_model(&m.host)).unwrap();
    assert_eq!(
        host.card.partition_sectors(Partition::User),
        m.user_bytes() / 512
    );
    let data = vec![0u8; 4096];
    for i in 0..4u64 {
        // Sequential fill of an AU, then a random 4 KiB write into it.
        for s in (0..4096u64).step_by(8) {
            host.mmc_write_blocks(i * 4096 + s, &data, 0).unwrap();
        }
    }
    for i in 0..4u64 {
        host.mmc_write_blocks(i * 4096 + 1000, &data, 0).unwrap();
    }
    let debt = host.card.bkops_outstanding_ns();
    assert!(debt > 500_000_000, "{debt}");
    let e = host.mmc_get_ext_csd().unwrap();
    assert_eq!(e[x::BKOPS_STATUS], 2);
    let ee = u16::from_le_bytes([
        e[x::EXCEPTION_EVENTS_STATUS],
        e[x::EXCEPTION_EVENTS_STATUS + 1],
    ]);
    assert_ne!(ee & x::EE_URGENT_BKOPS, 0);
    let before = host.now;
    host.mmc_switch(x::BKOPS_START, 1).unwrap();
    assert!(
        host.now - before >= debt,
        "BKOPS kept the card busy while it worked"
    );
    assert_eq!(host.card.bkops_outstanding_ns(), 0);
    let e = host.mmc_get_ext_csd().unwrap();
    assert_eq!(e[x::BKOPS_STATUS], 0);
    let s = host.card.timing().flash_stats().unwrap();
    assert!(s.ftl.background_ns > 0);
    assert_eq!(s.debt_ns, 0);
}
