//! Physical partitions: user area, two boot partitions, RPMB and up to four general
//! purpose partitions, each with its own address space starting at 0, and where each one
//! lives in the image.
//!
//! General purpose partitions are carved out of the user area as shipped: after
//! partitioning is completed and the card power-cycled, the user area shrinks by their
//! total size and GP1..GP4 follow it, in order, inside the image's user region. Without
//! GP partitions the image layout is QEMU's `boot1 | boot2 | RPMB | user`.

use crate::store::ImageLayout;

/// A physical partition, as selected by PARTITION_CONFIG.PARTITION_ACCESS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Partition {
    User,
    Boot1,
    Boot2,
    Rpmb,
    /// General purpose partition 1..=4, stored as 0..=3.
    Gp(u8),
}

impl Partition {
    /// Decode PARTITION_ACCESS (PARTITION_CONFIG bits 2:0).
    pub fn from_access(bits: u8) -> Partition {
        match bits & 0x7 {
            0 => Partition::User,
            1 => Partition::Boot1,
            2 => Partition::Boot2,
            3 => Partition::Rpmb,
            n => Partition::Gp(n - 4),
        }
    }

    /// PARTITION_ACCESS value selecting this partition.
    pub fn access_bits(self) -> u8 {
        match self {
            Partition::User => 0,
            Partition::Boot1 => 1,
            Partition::Boot2 => 2,
            Partition::Rpmb => 3,
            Partition::Gp(n) => 4 + n,
        }
    }

    /// Index into per-partition tables (user 0, boot1 1, boot2 2, RPMB 3, GP1..4 4..7).
    pub fn index(self) -> usize {
        usize::from(self.access_bits())
    }

    pub fn name(self) -> &'static str {
        match self {
            Partition::User => "user",
            Partition::Boot1 => "boot1",
            Partition::Boot2 => "boot2",
            Partition::Rpmb => "rpmb",
            Partition::Gp(0) => "gp1",
            Partition::Gp(1) => "gp2",
            Partition::Gp(2) => "gp3",
            Partition::Gp(_) => "gp4",
        }
    }

    /// Partitions whose data can be protected with CMD28 write-protect groups.
    pub fn has_wp_groups(self) -> bool {
        matches!(self, Partition::User | Partition::Gp(_))
    }

    pub const ALL: [Partition; 8] = [
        Partition::User,
        Partition::Boot1,
        Partition::Boot2,
        Partition::Rpmb,
        Partition::Gp(0),
        Partition::Gp(1),
        Partition::Gp(2),
        Partition::Gp(3),
    ];
}

/// Where one partition lives in the image, in 512-byte sectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Extent {
    /// First absolute sector in the image.
    pub start: u64,
    /// Size in sectors (0: the partition does not exist).
    pub sectors: u64,
}

impl Extent {
    pub fn exists(&self) -> bool {
        self.sectors > 0
    }

    /// Absolute sector of partition-relative `lba`, if `[lba, lba+count)` fits.
    pub fn translate(&self, lba: u64, count: u64) -> Option<u64> {
        let end = lba.checked_add(count)?;
        (end <= self.sectors).then_some(self.start + lba)
    }
}

/// The effective partition geometry of a card.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionTable {
    extents: [Extent; 8],
}

impl PartitionTable {
    /// Geometry for `layout` with general purpose partitions of `gp_sectors` (0 = absent).
    /// Returns `None` if the GP partitions do not fit in the user area.
    pub fn new(layout: &ImageLayout, gp_sectors: [u64; 4]) -> Option<PartitionTable> {
        let sectors = |bytes: u64| bytes / 512;
        let gp_total: u64 = gp_sectors.iter().try_fold(0u64, |a, &b| a.checked_add(b))?;
        let user_total = sectors(layout.user_bytes);
        let user_sectors = user_total.checked_sub(gp_total)?;
        let mut extents = [Extent::default(); 8];
        extents[Partition::Boot1.index()] = Extent {
            start: sectors(layout.boot1_offset()),
            sectors: sectors(layout.boot_bytes),
        };
        extents[Partition::Boot2.index()] = Extent {
            start: sectors(layout.boot2_offset()),
            sectors: sectors(layout.boot_bytes),
        };
        extents[Partition::Rpmb.index()] = Extent {
            start: sectors(layout.rpmb_offset()),
            sectors: sectors(layout.rpmb_bytes),
        };
        let user_start = sectors(layout.user_offset());
        extents[Partition::User.index()] = Extent {
            start: user_start,
            sectors: user_sectors,
        };
        let mut next = user_start + user_sectors;
        for (i, &size) in gp_sectors.iter().enumerate() {
            extents[Partition::Gp(i as u8).index()] = Extent {
                start: next,
                sectors: size,
            };
            next += size;
        }
        Some(PartitionTable { extents })
    }

    pub fn extent(&self, partition: Partition) -> Extent {
        self.extents[partition.index()]
    }

    pub fn exists(&self, partition: Partition) -> bool {
        self.extent(partition).exists()
    }

    /// The partition containing absolute sector `sector`, and the partition-relative LBA.
    pub fn locate(&self, sector: u64) -> Option<(Partition, u64)> {
        Partition::ALL.iter().find_map(|&p| {
            let e = self.extent(p);
            (sector >= e.start && sector < e.start + e.sectors).then(|| (p, sector - e.start))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> ImageLayout {
        ImageLayout {
            boot_bytes: 4 << 20,
            rpmb_bytes: 4 << 20,
            user_bytes: 64 << 20,
        }
    }

    #[test]
    fn without_gp_partitions_the_layout_is_qemus() {
        let t = PartitionTable::new(&layout(), [0; 4]).unwrap();
        assert_eq!(
            t.extent(Partition::Boot1),
            Extent {
                start: 0,
                sectors: 8192
            }
        );
        assert_eq!(
            t.extent(Partition::Boot2),
            Extent {
                start: 8192,
                sectors: 8192
            }
        );
        assert_eq!(
            t.extent(Partition::Rpmb),
            Extent {
                start: 16384,
                sectors: 8192
            }
        );
        assert_eq!(
            t.extent(Partition::User),
            Extent {
                start: 24576,
                sectors: 131072
            }
        );
        assert!(!t.exists(Partition::Gp(0)));
    }

    #[test]
    fn gp_partitions_follow_the_shrunk_user_area() {
        let t = PartitionTable::new(&layout(), [1024, 0, 2048, 0]).unwrap();
        let user = t.extent(Partition::User);
        assert_eq!(user.sectors, 131072 - 3072);
        assert_eq!(t.extent(Partition::Gp(0)).start, user.start + user.sectors);
        assert_eq!(
            t.extent(Partition::Gp(2)).start,
            user.start + user.sectors + 1024
        );
        assert_eq!(
            t.locate(user.start + user.sectors + 1030),
            Some((Partition::Gp(2), 6))
        );
        assert!(PartitionTable::new(&layout(), [131073, 0, 0, 0]).is_none());
    }

    #[test]
    fn translate_rejects_ranges_past_the_end_and_overflow() {
        let e = Extent {
            start: 100,
            sectors: 10,
        };
        assert_eq!(e.translate(0, 10), Some(100));
        assert_eq!(e.translate(9, 1), Some(109));
        assert_eq!(e.translate(9, 2), None);
        assert_eq!(e.translate(u64::MAX, 2), None);
    }

    #[test]
    fn access_bits_round_trip() {
        for p in Partition::ALL {
            assert_eq!(Partition::from_access(p.access_bits()), p);
        }
    }
}
