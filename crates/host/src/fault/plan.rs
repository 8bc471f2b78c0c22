//! The fault plan: a TOML file of rules, each a set of filters (which commands), a
//! selector (which of those: the Nth, every Nth, with probability p), an optional limit
//! and one effect. `docs/faults.md` documents the schema with examples.

use std::path::Path;

use serde::{Deserialize, Serialize};

use emmc_card::r1;
use emmc_card::timing::Nanos;

/// Why a plan was refused.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("reading fault plan {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("fault plan is not valid TOML for the schema: {0}")]
    Parse(String),
    #[error("fault plan rule {index}{name}: {reason}", name = .name.as_deref().map(|n| format!(" ({n:?})")).unwrap_or_default())]
    Rule {
        /// 1-based position of the rule in the plan.
        index: usize,
        name: Option<String>,
        reason: String,
    },
}

/// A whole plan.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultPlan {
    /// Seed of the plan's PRNG (probabilistic rules and bit positions).
    #[serde(default)]
    pub seed: u64,
    #[serde(default, rename = "rule")]
    pub rules: Vec<Rule>,
}

/// One or several CMD indices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Commands {
    One(u8),
    Many(Vec<u8>),
}

impl Commands {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            Commands::One(c) => std::slice::from_ref(c),
            Commands::Many(v) => v,
        }
    }

    pub fn contains(&self, opcode: u8) -> bool {
        self.as_slice().contains(&opcode)
    }
}

/// Direction of a command's data phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Read,
    Write,
    /// No data phase.
    None,
}

/// A half-open range `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Range {
    pub start: u64,
    pub end: u64,
}

impl Range {
    pub fn contains(&self, v: u64) -> bool {
        self.start <= v && v < self.end
    }

    /// `[lba, lba + count)` overlaps the range.
    pub fn overlaps(&self, lba: u64, count: u64) -> bool {
        lba < self.end && lba.saturating_add(count.max(1)) > self.start
    }
}

/// One rule: filters (all given must match), at most one selector, a limit, an effect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// For logs and error messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// CMD index or indices the rule applies to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Commands>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direction: Option<Direction>,
    /// Sectors (of the current partition) a read/write/erase command must touch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lba: Option<Range>,
    /// Card-time window, in ns, the command must arrive in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_ns: Option<Range>,
    /// Only once this many bytes have been written (data phases that completed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_bytes_written: Option<u64>,
    /// Fire on the Nth command that passes the filters (1-based).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nth: Option<u64>,
    /// Fire on every Nth command that passes the filters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<u64>,
    /// Fire with this probability on each command that passes the filters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probability: Option<f64>,
    /// Fire at most this many times (unlimited without).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    pub effect: Effect,
}

/// What happens when a rule fires.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Effect {
    /// The card executes the command; its response fails the host's CRC check.
    CmdCrc,
    /// The command is corrupted on the CMD line: the card ignores it (COM_CRC_ERROR in
    /// its next response) and the host sees no response.
    CmdTimeout,
    /// The card executes the command; its response has a bad end bit.
    CmdEndBit,
    /// A data block fails its CRC: a read delivers nothing, a write is refused by the card
    /// with a negative CRC status.
    DataCrc,
    /// The data phase stalls: the host's data time-out fires.
    DataTimeout,
    /// The card refuses the command with these R1 error bits.
    R1Error { bits: Vec<String> },
    /// The next packed write fails at this entry (1-based).
    PackedFailure { index: u32 },
    /// The card holds DAT0 busy until HPI, or until `max_ns` have passed.
    StuckBusy {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_ns: Option<u64>,
    },
    /// The command's busy period or read access takes `ns` longer.
    Latency { ns: u64 },
    /// Foreground garbage collection: `ns` more busy and `work_ns` (default `ns`) more
    /// background debt.
    GcStorm {
        ns: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        work_ns: Option<u64>,
    },
    /// Background debt up to BKOPS_STATUS `level` (2, the default: URGENT_BKOPS; 3).
    UrgentBkops {
        #[serde(default = "default_bkops_level")]
        level: u8,
    },
    /// The health fields move: DEVICE_LIFE_TIME_EST_TYP_A/B and PRE_EOL_INFO.
    WearOut {
        life_time_est_a: u8,
        life_time_est_b: u8,
        pre_eol_info: u8,
    },
    /// `bits` random bits of the read data flip on their way to the host.
    BitFlip {
        #[serde(default = "default_bit_flips")]
        bits: u32,
    },
    /// Sudden power loss at card time `at_ns` (at the command's arrival without); power
    /// returns at once unless `restore = false`.
    PowerLoss {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at_ns: Option<u64>,
        #[serde(default = "default_true")]
        restore: bool,
    },
}

fn default_bkops_level() -> u8 {
    2
}

fn default_bit_flips() -> u32 {
    1
}

fn default_true() -> bool {
    true
}

/// Default limit of a stuck busy.
pub const STUCK_BUSY_DEFAULT_MAX_NS: Nanos = 10_000_000_000;
/// Most bits one bit-flip effect may flip.
pub const MAX_BIT_FLIPS: u32 = 4096;

/// The R1 error bits a plan may name (JESD84-B45 §6.13 names).
pub const R1_ERROR_NAMES: &[(&str, u32)] = &[
    ("ADDRESS_OUT_OF_RANGE", r1::ADDRESS_OUT_OF_RANGE),
    ("ADDRESS_MISALIGN", r1::ADDRESS_MISALIGN),
    ("BLOCK_LEN_ERROR", r1::BLOCK_LEN_ERROR),
    ("ERASE_SEQ_ERROR", r1::ERASE_SEQ_ERROR),
    ("ERASE_PARAM", r1::ERASE_PARAM),
    ("WP_VIOLATION", r1::WP_VIOLATION),
    ("LOCK_UNLOCK_FAILED", r1::LOCK_UNLOCK_FAILED),
    ("DEVICE_ECC_FAILED", r1::DEVICE_ECC_FAILED),
    ("CC_ERROR", r1::CC_ERROR),
    ("ERROR", r1::ERROR),
];

impl Effect {
    /// Acts on the bus (the controller reports it) rather than on the card.
    pub fn is_bus(&self) -> bool {
        matches!(
            self,
            Effect::CmdCrc
                | Effect::CmdTimeout
                | Effect::CmdEndBit
                | Effect::DataCrc
                | Effect::DataTimeout
        )
    }

    /// Needs a data phase to act on.
    pub fn needs_data(&self) -> bool {
        matches!(
            self,
            Effect::DataCrc | Effect::DataTimeout | Effect::BitFlip { .. }
        )
    }

    /// The R1 bits of an `r1_error` effect (0 for any other).
    pub fn r1_bits(&self) -> u32 {
        match self {
            Effect::R1Error { bits } => bits
                .iter()
                .filter_map(|n| R1_ERROR_NAMES.iter().find(|(name, _)| name == n))
                .fold(0, |acc, (_, b)| acc | b),
            _ => 0,
        }
    }
}

impl FaultPlan {
    /// Parse and validate a plan.
    pub fn from_toml_str(text: &str) -> Result<FaultPlan, PlanError> {
        let plan: FaultPlan = toml::from_str(text).map_err(|e| PlanError::Parse(e.to_string()))?;
        plan.validate()?;
        Ok(plan)
    }

    /// Read, parse and validate a plan file.
    pub fn load(path: &Path) -> Result<FaultPlan, PlanError> {
        let text = std::fs::read_to_string(path).map_err(|source| PlanError::Io {
            path: path.display().to_string(),
            source,
        })?;
        FaultPlan::from_toml_str(&text)
    }

    /// Check every rule.
    pub fn validate(&self) -> Result<(), PlanError> {
        for (i, rule) in self.rules.iter().enumerate() {
            rule.validate().map_err(|reason| PlanError::Rule {
                index: i + 1,
                name: rule.name.clone(),
                reason,
            })?;
        }
        Ok(())
    }
}

impl Rule {
    /// A rule with no filters and no selector: fires on every command.
    pub fn new(effect: Effect) -> Rule {
        Rule {
            name: None,
            command: None,
            direction: None,
            lba: None,
            time_ns: None,
            after_bytes_written: None,
            nth: None,
            every: None,
            probability: None,
            count: None,
            effect,
        }
    }

    /// The rule's defects, named after the rule they break.
    pub fn validate(&self) -> Result<(), String> {
        let selectors = [
            self.nth.is_some(),
            self.every.is_some(),
            self.probability.is_some(),
        ];
        if selectors.iter().filter(|&&s| s).count() > 1 {
            return Err("at most one of `nth`, `every`, `probability` may be given".into());
        }
        if self.nth == Some(0) {
            return Err("`nth` counts from 1".into());
        }
        if self.every == Some(0) {
            return Err("`every` must be at least 1".into());
        }
        if let Some(p) = self.probability {
            if !(p.is_finite() && p > 0.0 && p <= 1.0) {
                return Err(format!("`probability` must be in (0, 1], not {p}"));
            }
        }
        if self.count == Some(0) {
            return Err("`count` must be at least 1 (remove the rule to disable it)".into());
        }
        if let Some(c) = &self.command {
            if c.as_slice().is_empty() {
                return Err("`command` lists no CMD index".into());
            }
            if let Some(bad) = c.as_slice().iter().find(|&&c| c > 63) {
                return Err(format!("`command` {bad} is not a CMD index (0..=63)"));
            }
        }
        for (field, r) in [("lba", self.lba), ("time_ns", self.time_ns)] {
            if let Some(r) = r {
                if r.start >= r.end {
                    return Err(format!(
                        "`{field}` range is empty: start {} is not below end {}",
                        r.start, r.end
                    ));
                }
            }
        }
        if self.effect.needs_data() && self.direction == Some(Direction::None) {
            return Err("a data effect cannot apply to commands without data".into());
        }
        match &self.effect {
            Effect::R1Error { bits } => {
                if bits.is_empty() {
                    return Err("`r1_error` needs at least one bit in `bits`".into());
                }
                for b in bits {
                    if !R1_ERROR_NAMES.iter().any(|(n, _)| n == b) {
                        let known: Vec<&str> = R1_ERROR_NAMES.iter().map(|(n, _)| *n).collect();
                        return Err(format!(
                            "`{b}` is not an R1 error bit a card reports for a refused command (one of {})",
                            known.join(", ")
                        ));
                    }
                }
            }
            Effect::PackedFailure { index } => {
                if !(1..=255).contains(index) {
                    return Err(format!(
                        "packed failure `index` {index} must be 1..=255 (PACKED_FAILURE_INDEX is one byte, entries count from 1)"
                    ));
                }
                if self.direction == Some(Direction::Read)
                    || self.direction == Some(Direction::None)
                {
                    return Err("a packed failure applies to packed writes only".into());
                }
                if let Some(c) = &self.command {
                    if !c.contains(25) {
                        return Err(
                            "a packed failure applies to CMD25; `command` excludes it".into()
                        );
                    }
                }
            }
            Effect::StuckBusy { max_ns: Some(0) } => {
                return Err("stuck busy `max_ns` must be above 0".into())
            }
            Effect::Latency { ns: 0 } | Effect::GcStorm { ns: 0, .. } => {
                return Err("`ns` must be above 0".into())
            }
            Effect::UrgentBkops { level } if !matches!(level, 2 | 3) => {
                return Err(format!(
                    "urgent BKOPS `level` must be 2 (urgent) or 3 (critical), not {level}"
                ));
            }
            Effect::WearOut {
                life_time_est_a,
                life_time_est_b,
                pre_eol_info,
            } => {
                for (n, v) in [
                    ("life_time_est_a", life_time_est_a),
                    ("life_time_est_b", life_time_est_b),
                ] {
                    if *v > 0x0B {
                        return Err(format!(
                            "`{n}` {v:#04x} is not a DEVICE_LIFE_TIME_EST value (0x00..=0x0B)"
                        ));
                    }
                }
                if *pre_eol_info > 3 {
                    return Err(format!(
                        "`pre_eol_info` {pre_eol_info} is not a PRE_EOL_INFO value (0..=3)"
                    ));
                }
            }
            Effect::BitFlip { bits } => {
                if *bits == 0 || *bits > MAX_BIT_FLIPS {
                    return Err(format!("bit flip `bits` must be 1..={MAX_BIT_FLIPS}"));
                }
                if self.direction == Some(Direction::Write) {
                    return Err("bit flips apply to read data; `direction` is write".into());
                }
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule_err(text: &str) -> String {
        match FaultPlan::from_toml_str(text) {
            Err(e) => e.to_string(),
            Ok(p) => panic!("accepted: {p:?}"),
        }
    }

    #[test]
    fn parses_every_effect_kind() {
        let text = r#"
            seed = 7
            [[rule]]
            effect = { kind = "cmd_crc" }
            [[rule]]
            effect = { kind = "cmd_timeout" }
            [[rule]]
            effect = { kind = "cmd_end_bit" }
            [[rule]]
            effect = { kind = "data_crc" }
            [[rule]]
            effect = { kind = "data_timeout" }
            [[rule]]
            effect = { kind = "r1_error", bits = ["ERROR", "CC_ERROR"] }
            [[rule]]
            effect = { kind = "packed_failure", index = 2 }
            [[rule]]
            effect = { kind = "stuck_busy" }
            [[rule]]
            effect = { kind = "latency", ns = 1000 }
            [[rule]]
            effect = { kind = "gc_storm", ns = 1000 }
            [[rule]]
            effect = { kind = "urgent_bkops" }
            [[rule]]
            effect = { kind = "wear_out", life_time_est_a = 9, life_time_est_b = 2, pre_eol_info = 2 }
            [[rule]]
            effect = { kind = "bit_flip" }
            [[rule]]
            effect = { kind = "power_loss", at_ns = 5 }
        "#;
        let plan = FaultPlan::from_toml_str(text).expect("valid");
        assert_eq!(plan.seed, 7);
        assert_eq!(plan.rules.len(), 14);
        assert_eq!(plan.rules[5].effect.r1_bits(), r1::ERROR | r1::CC_ERROR);
        assert_eq!(
            plan.rules[12].effect,
            Effect::BitFlip { bits: 1 },
            "bit_flip defaults to one bit"
        );
        assert_eq!(
            plan.rules[13].effect,
            Effect::PowerLoss {
                at_ns: Some(5),
                restore: true
            }
        );
    }

    #[test]
    fn unknown_fields_are_refused() {
        let e = rule_err("[[rule]]\nnht = 3\neffect = { kind = \"cmd_crc\" }\n");
        assert!(e.contains("nht"), "{e}");
        let e = rule_err("[[rule]]\neffect = { kind = \"latency\", ns = 5, extra = 1 }\n");
        assert!(e.contains("extra"), "{e}");
        let e = rule_err("seeds = 1\n");
        assert!(e.contains("seeds"), "{e}");
        let e = rule_err("[[rule]]\neffect = { kind = \"meteor_strike\" }\n");
        assert!(e.contains("meteor_strike"), "{e}");
    }

    #[test]
    fn validation_names_the_rule_and_the_reason() {
        let cases = [
            ("nth = 1\nevery = 2", "at most one of"),
            ("nth = 0", "`nth` counts from 1"),
            ("every = 0", "`every` must be at least 1"),
            ("probability = 1.5", "`probability` must be in (0, 1]"),
            ("probability = 0.0", "`probability` must be in (0, 1]"),
            ("count = 0", "`count` must be at least 1"),
            ("command = 64", "not a CMD index"),
            ("command = []", "lists no CMD index"),
            ("lba = { start = 8, end = 8 }", "`lba` range is empty"),
            (
                "time_ns = { start = 9, end = 1 }",
                "`time_ns` range is empty",
            ),
        ];
        for (filters, want) in cases {
            let text = format!(
                "[[rule]]\nname = \"ok\"\neffect = {{ kind = \"cmd_crc\" }}\n[[rule]]\nname = \"bad\"\n{filters}\neffect = {{ kind = \"cmd_crc\" }}\n"
            );
            let e = rule_err(&text);
            assert!(e.starts_with("fault plan rule 2 (\"bad\"): "), "{e}");
            assert!(e.contains(want), "{filters}: {e}");
        }
        let effects = [
            ("{ kind = \"r1_error\", bits = [] }", "at least one bit"),
            ("{ kind = \"r1_error\", bits = [\"READY_FOR_DATA\"] }", "not an R1 error bit"),
            ("{ kind = \"packed_failure\", index = 0 }", "1..=255"),
            ("{ kind = \"stuck_busy\", max_ns = 0 }", "above 0"),
            ("{ kind = \"latency\", ns = 0 }", "above 0"),
            ("{ kind = \"urgent_bkops\", level = 1 }", "must be 2"),
            (
                "{ kind = \"wear_out\", life_time_est_a = 12, life_time_est_b = 1, pre_eol_info = 1 }",
                "DEVICE_LIFE_TIME_EST",
            ),
            (
                "{ kind = \"wear_out\", life_time_est_a = 1, life_time_est_b = 1, pre_eol_info = 4 }",
                "PRE_EOL_INFO",
            ),
            ("{ kind = \"bit_flip\", bits = 0 }", "1..=4096"),
        ];
        for (effect, want) in effects {
            let e = rule_err(&format!("[[rule]]\neffect = {effect}\n"));
            assert!(e.starts_with("fault plan rule 1: "), "{e}");
            assert!(e.contains(want), "{effect}: {e}");
        }
        let e = rule_err("[[rule]]\ndirection = \"none\"\neffect = { kind = \"data_crc\" }\n");
        assert!(e.contains("without data"), "{e}");
        let e =
            rule_err("[[rule]]\ncommand = 18\neffect = { kind = \"packed_failure\", index = 1 }\n");
        assert!(e.contains("CMD25"), "{e}");
    }

    #[test]
    fn plan_round_trips_through_toml() {
        let mut rule = Rule::new(Effect::Latency { ns: 5 });
        rule.command = Some(Commands::Many(vec![24, 25]));
        rule.every = Some(3);
        let plan = FaultPlan {
            seed: 3,
            rules: vec![rule],
        };
        let text = toml::to_string(&plan).expect("serialises");
        assert_eq!(FaultPlan::from_toml_str(&text).expect("parses"), plan);
    }
}
