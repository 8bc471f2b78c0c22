//! The partitions part: the partition geometry in effect and whether a completed
//! partitioning has been applied.
//!
//! Owns the [`PartitionTable`] (where each partition lives in the image) and the
//! `applied` flag. The host's partitioning settings themselves are EXT_CSD bytes (the
//! registers part); they take effect here at the power cycle after
//! PARTITION_SETTING_COMPLETED, once, and the geometry is then saved with the card's
//! persistent state.

use crate::partition::{Extent, Partition, PartitionTable};
use crate::store::ImageLayout;

/// The card's partitions (see the module documentation).
pub(crate) struct Partitions {
    layout: ImageLayout,
    table: PartitionTable,
    /// General purpose partitions from a completed partitioning are in effect.
    applied: bool,
}

impl Partitions {
    /// The geometry of a card as shipped on `layout`: no general purpose partitions.
    /// `None` if the layout cannot hold even that.
    pub fn new(layout: ImageLayout) -> Option<Partitions> {
        let table = PartitionTable::new(&layout, [0; 4])?;
        Some(Partitions {
            layout,
            table,
            applied: false,
        })
    }

    /// Where `partition` lives (a zero-sized extent if it does not exist).
    #[inline]
    pub fn extent(&self, partition: Partition) -> Extent {
        self.table.extent(partition)
    }

    pub fn exists(&self, partition: Partition) -> bool {
        self.table.exists(partition)
    }

    /// Whether a completed partitioning is in effect.
    pub fn applied(&self) -> bool {
        self.applied
    }

    /// Sizes of GP1..GP4 in sectors (0 for an absent one).
    pub fn gp_sectors(&self) -> [u64; 4] {
        std::array::from_fn(|i| self.table.extent(Partition::Gp(i as u8)).sectors)
    }

    /// Load the saved geometry: `applied` with GP partitions of `gp_sectors`, or the
    /// shipped geometry. False (and nothing changed) if the GP partitions do not fit.
    pub fn restore(&mut self, applied: bool, gp_sectors: [u64; 4]) -> bool {
        if applied {
            match PartitionTable::new(&self.layout, gp_sectors) {
                Some(table) => self.table = table,
                None => return false,
            }
        }
        self.applied = applied;
        true
    }

    /// A completed partitioning takes effect: GP partitions of `gp_sectors` appear after
    /// the user area, which shrinks by their total. False (nothing changes) if they do
    /// not fit.
    pub fn apply(&mut self, gp_sectors: [u64; 4]) -> bool {
        match PartitionTable::new(&self.layout, gp_sectors) {
            Some(table) => {
                self.table = table;
                self.applied = true;
                true
            }
            None => false,
        }
    }
}

/// The checks PARTITION_SETTING_COMPLETED makes on the host's settings: the GP
/// partitions (`gp_size_mults` × `unit`, the HC write-protect group in sectors) must
/// leave some of the `user_sectors` the card ships with, and ENH_SIZE_MULT must not
/// exceed MAX_ENH_SIZE_MULT.
pub(crate) fn check_settings(
    unit: u64,
    gp_size_mults: [u64; 4],
    user_sectors: u64,
    enh_size_mult: u64,
    max_enh_size_mult: u64,
) -> Result<(), String> {
    if unit == 0 {
        return Err("HC_WP_GRP_SIZE × HC_ERASE_GRP_SIZE is zero".into());
    }
    let gp: u64 = gp_size_mults.iter().sum::<u64>() * unit;
    if gp >= user_sectors {
        return Err(format!(
            "general purpose partitions ({gp} sectors) do not fit the user area ({user_sectors})"
        ));
    }
    if enh_size_mult > max_enh_size_mult {
        return Err("enhanced user area exceeds MAX_ENH_SIZE_MULT".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> ImageLayout {
        ImageLayout {
            boot_bytes: 1 << 20,
            rpmb_bytes: 1 << 20,
            user_bytes: 16 << 20,
        }
    }

    #[test]
    fn a_shipped_card_has_no_gp_partitions_until_partitioning_is_applied() {
        let mut p = Partitions::new(layout()).unwrap();
        assert!(!p.applied());
        assert_eq!(p.gp_sectors(), [0; 4]);
        assert_eq!(p.extent(Partition::User).sectors, 32768);
        assert!(!p.exists(Partition::Gp(0)));

        assert!(p.apply([1024, 0, 2048, 0]));
        assert!(p.applied());
        assert_eq!(p.gp_sectors(), [1024, 0, 2048, 0]);
        assert_eq!(p.extent(Partition::User).sectors, 32768 - 3072);
        assert!(p.exists(Partition::Gp(2)) && !p.exists(Partition::Gp(1)));
    }

    #[test]
    fn partitioning_that_does_not_fit_changes_nothing() {
        let mut p = Partitions::new(layout()).unwrap();
        assert!(!p.apply([32769, 0, 0, 0]));
        assert!(!p.applied());
        assert_eq!(p.extent(Partition::User).sectors, 32768);
        assert!(!p.restore(true, [0, 0, 0, 40000]));
        assert!(!p.applied());
    }

    #[test]
    fn restore_takes_the_saved_geometry_only_when_it_was_applied() {
        let mut p = Partitions::new(layout()).unwrap();
        assert!(p.restore(false, [512, 0, 0, 0]));
        assert_eq!(
            p.gp_sectors(),
            [0; 4],
            "not applied: the sizes are not in effect"
        );
        assert!(p.restore(true, [512, 0, 0, 0]));
        assert!(p.applied());
        assert_eq!(p.extent(Partition::Gp(0)).sectors, 512);
    }

    #[test]
    fn settings_checks_name_what_is_wrong() {
        assert_eq!(check_settings(1024, [1, 2, 0, 0], 10_000, 3, 3), Ok(()));
        assert!(check_settings(0, [0; 4], 10_000, 0, 0)
            .unwrap_err()
            .contains("zero"));
        assert!(check_settings(1024, [5, 5, 0, 0], 10_240, 0, 0)
            .unwrap_err()
            .contains("do not fit"));
        assert!(check_settings(1024, [0; 4], 10_240, 4, 3)
            .unwrap_err()
            .contains("MAX_ENH_SIZE_MULT"));
    }
}
