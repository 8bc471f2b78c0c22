//! The erase family (erase, trim, discard, secure erase/trim) and sanitize. Each unmaps
//! data in the FTL — AUs left empty are erased, secure variants garbage-collect every AU
//! they touch so no old copy survives — plus a mapping update per erase group. A card
//! must finish within the timeouts its EXT_CSD advertises, or the host times it out, so
//! every duration is capped at its limit: ERASE_TIMEOUT_MULT, TRIM_MULT, SEC_ERASE_MULT
//! and SEC_TRIM_MULT, each × 300 ms per erase group (JEDEC JESD84-B45 §7.4).

use super::ftl::Ftl;
use super::nand::Nand;
use super::{EraseKind, Nanos};
use crate::model::{EraseTimingModel, ExtCsdModel};

const MS_300: Nanos = 300_000_000;

#[derive(Debug, Clone)]
pub struct EraseTiming {
    group_ns: Nanos,
    sanitize_ns: Nanos,
    /// Per-group limits (None: the card advertises none).
    erase_limit: Option<Nanos>,
    trim_limit: Option<Nanos>,
    sec_erase_limit: Option<Nanos>,
    sec_trim_limit: Option<Nanos>,
}

fn per_group(mults: &[u8]) -> Option<Nanos> {
    mults
        .iter()
        .all(|&m| m != 0)
        .then(|| mults.iter().fold(MS_300, |t, &m| t * Nanos::from(m)))
}

impl EraseTiming {
    pub fn new(m: &EraseTimingModel, e: &ExtCsdModel) -> EraseTiming {
        EraseTiming {
            group_ns: m.group_ns,
            sanitize_ns: m.sanitize_ns,
            erase_limit: per_group(&[e.erase_timeout_mult]),
            trim_limit: per_group(&[e.trim_mult]),
            sec_erase_limit: per_group(&[e.erase_timeout_mult, e.sec_erase_mult]),
            sec_trim_limit: per_group(&[e.erase_timeout_mult, e.sec_trim_mult]),
        }
    }

    /// The advertised timeout for `groups` erase groups of `kind`.
    pub fn limit(&self, kind: EraseKind, groups: u64) -> Option<Nanos> {
        let per = match kind {
            EraseKind::Erase => self.erase_limit,
            EraseKind::Trim | EraseKind::Discard => self.trim_limit,
            EraseKind::SecureErase => self.sec_erase_limit,
            EraseKind::SecureTrim1 | EraseKind::SecureTrim2 => self.sec_trim_limit,
        };
        per.map(|p| p.saturating_mul(groups.max(1)))
    }

    /// Erase `[start, end)` of the user area (`range` None: outside it, mapping only).
    pub fn erase(
        &self,
        ftl: &mut Ftl,
        nand: &mut Nand,
        kind: EraseKind,
        range: Option<(u64, u64)>,
        groups: u64,
    ) -> Nanos {
        let mut t = self.group_ns.saturating_mul(groups.max(1));
        if let Some((start, end)) = range {
            t += match kind {
                // Step 1 only marks the blocks; step 2 (or sanitize) purges them.
                EraseKind::SecureTrim1 => 0,
                EraseKind::SecureErase | EraseKind::SecureTrim2 => {
                    ftl.unmap(nand, start, end, true)
                }
                EraseKind::Erase | EraseKind::Trim | EraseKind::Discard => {
                    ftl.unmap(nand, start, end, false)
                }
            };
        }
        match self.limit(kind, groups) {
            Some(limit) => t.min(limit),
            None => t,
        }
    }

    /// SANITIZE: purge everything unmapped, which also finishes all background work.
    pub fn sanitize(&self, ftl: &mut Ftl, nand: &mut Nand) -> Nanos {
        self.sanitize_ns + ftl.work_until(nand, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::DeviceModel;

    fn ext() -> ExtCsdModel {
        DeviceModel::load("generic-emmc45").unwrap().ext_csd
    }

    #[test]
    fn limits_follow_the_ext_csd_multipliers() {
        let mut e = ext();
        e.erase_timeout_mult = 2;
        e.trim_mult = 1;
        e.sec_erase_mult = 3;
        e.sec_trim_mult = 4;
        let t = EraseTiming::new(&EraseTimingModel::default(), &e);
        assert_eq!(t.limit(EraseKind::Erase, 2), Some(2 * 600_000_000));
        assert_eq!(t.limit(EraseKind::Trim, 1), Some(MS_300));
        assert_eq!(t.limit(EraseKind::Discard, 1), Some(MS_300));
        assert_eq!(t.limit(EraseKind::SecureErase, 1), Some(6 * MS_300));
        assert_eq!(t.limit(EraseKind::SecureTrim2, 1), Some(8 * MS_300));
        e.trim_mult = 0;
        let t = EraseTiming::new(&EraseTimingModel::default(), &e);
        assert_eq!(t.limit(EraseKind::Trim, 1), None);
    }
}
