//! The injector: given each command about to go on the bus, decide which rules fire.
//!
//! Deterministic: the only randomness is the project's SplitMix64 ([`Prng`]) seeded from
//! the plan, drawn once per probabilistic rule per command that passes its filters (and
//! for bit positions), so the same plan and the same command sequence give the same faults.
//! Every rule sees every command, whatever the others decide, so adding a rule does not
//! shift another rule's counters.

use super::plan::{Direction, Effect, FaultPlan, PlanError, Rule};
use emmc_card::timing::prng::Prng;
use emmc_card::timing::Nanos;

/// What the injector knows about a command about to be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandInfo {
    pub opcode: u8,
    pub arg: u32,
    /// Data phase direction (`Direction::None` without one).
    pub direction: Direction,
    /// First sector and sector count a read, write or erase-range command addresses.
    pub lba: Option<(u64, u64)>,
    /// Bytes of the data phase.
    pub bytes: u64,
    /// Card time at which the command goes out.
    pub now: Nanos,
    /// A CMD25/CMD18 of a packed command (its CMD23 had the packed bit).
    pub packed: bool,
}

/// A rule that fired on a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injection {
    /// 1-based number of the command since the injector was created.
    pub command_number: u64,
    pub opcode: u8,
    /// 0-based index of the rule.
    pub rule: usize,
    pub at_ns: Nanos,
}

#[derive(Debug, Clone)]
struct RuleState {
    rule: Rule,
    matched: u64,
    fired: u64,
}

/// Decides, command by command, which effects of a plan apply. Mutable at run time
/// ([`FaultInjector::add_rule`], [`FaultInjector::clear`]).
#[derive(Debug, Clone)]
pub struct FaultInjector {
    seed: u64,
    prng: Prng,
    rules: Vec<RuleState>,
    commands: u64,
    bytes_written: u64,
    /// Injections since the injector was made (the history keeps only the latest).
    injected: u64,
    history: Vec<Injection>,
}

/// Keep at most this many injections in the history.
const HISTORY_MAX: usize = 4096;

impl FaultInjector {
    /// An injector for a plan (validated again: a plan built in code is user input too).
    pub fn new(plan: FaultPlan) -> Result<FaultInjector, PlanError> {
        plan.validate()?;
        Ok(FaultInjector {
            seed: plan.seed,
            prng: Prng::new(plan.seed),
            rules: plan
                .rules
                .into_iter()
                .map(|rule| RuleState {
                    rule,
                    matched: 0,
                    fired: 0,
                })
                .collect(),
            commands: 0,
            bytes_written: 0,
            injected: 0,
            history: Vec::new(),
        })
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Add a rule at run time; returns its index.
    pub fn add_rule(&mut self, rule: Rule) -> Result<usize, PlanError> {
        let index = self.rules.len();
        rule.validate().map_err(|reason| PlanError::Rule {
            index: index + 1,
            name: rule.name.clone(),
            reason,
        })?;
        log::info!("fault: rule {} added: {:?}", index + 1, rule.effect);
        self.rules.push(RuleState {
            rule,
            matched: 0,
            fired: 0,
        });
        Ok(index)
    }

    /// Remove every rule (counters of commands and bytes written stay).
    pub fn clear(&mut self) {
        log::info!("fault: {} rules cleared", self.rules.len());
        self.rules.clear();
    }

    pub fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.rules.iter().map(|r| &r.rule)
    }

    /// How often rule `index` has fired.
    pub fn fired(&self, index: usize) -> u64 {
        self.rules.get(index).map_or(0, |r| r.fired)
    }

    /// Commands seen so far.
    pub fn commands(&self) -> u64 {
        self.commands
    }

    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    /// Injections so far, over every rule, cleared ones included; never capped.
    pub fn injected(&self) -> u64 {
        self.injected
    }

    /// The latest [`HISTORY_MAX`] injections, for replay checks and logs.
    pub fn history(&self) -> &[Injection] {
        &self.history
    }

    /// A data phase wrote `bytes` to the card.
    pub fn note_written(&mut self, bytes: u64) {
        self.bytes_written = self.bytes_written.saturating_add(bytes);
    }

    /// A draw from the plan's PRNG in `0..n` (`n > 0`), for effects that need one.
    pub fn draw(&mut self, n: u64) -> u64 {
        self.prng.below(n.max(1))
    }

    /// The effects that fire on `cmd`, in rule order.
    pub fn on_command(&mut self, cmd: &CommandInfo) -> Vec<Effect> {
        self.commands += 1;
        let mut fired = Vec::new();
        for index in 0..self.rules.len() {
            if self.rule_fires(index, cmd) {
                let state = &mut self.rules[index];
                state.fired += 1;
                self.injected += 1;
                log::info!(
                    "fault: rule {}{} fires on command #{} CMD{} arg {:#010x} at {} ns: {:?}",
                    index + 1,
                    state
                        .rule
                        .name
                        .as_deref()
                        .map(|n| format!(" ({n})"))
                        .unwrap_or_default(),
                    self.commands,
                    cmd.opcode,
                    cmd.arg,
                    cmd.now,
                    state.rule.effect
                );
                if self.history.len() == HISTORY_MAX {
                    self.history.remove(0);
                }
                self.history.push(Injection {
                    command_number: self.commands,
                    opcode: cmd.opcode,
                    rule: index,
                    at_ns: cmd.now,
                });
                fired.push(state.rule.effect.clone());
            }
        }
        fired
    }

    fn rule_fires(&mut self, index: usize, cmd: &CommandInfo) -> bool {
        let bytes_written = self.bytes_written;
        let state = &mut self.rules[index];
        let rule = &state.rule;
        // A power loss happens once unless the plan says otherwise.
        let limit = rule.count.or(match rule.effect {
            Effect::PowerLoss { .. } => Some(1),
            _ => None,
        });
        if limit.is_some_and(|c| state.fired >= c) {
            return false;
        }
        if !filters_match(rule, cmd, bytes_written) {
            return false;
        }
        state.matched += 1;
        let n = state.matched;
        if let Some(nth) = rule.nth {
            return n == nth;
        }
        if let Some(every) = rule.every {
            return n % every == 0;
        }
        if let Some(p) = rule.probability {
            // 53 random bits as a uniform in [0, 1).
            let u = (self.prng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            return u < p;
        }
        true
    }
}

fn filters_match(rule: &Rule, cmd: &CommandInfo, bytes_written: u64) -> bool {
    if rule
        .command
        .as_ref()
        .is_some_and(|c| !c.contains(cmd.opcode))
    {
        return false;
    }
    if rule.direction.is_some_and(|d| d != cmd.direction) {
        return false;
    }
    if let Some(range) = rule.lba {
        match cmd.lba {
            Some((lba, count)) if range.overlaps(lba, count) => {}
            _ => return false,
        }
    }
    if rule.time_ns.is_some_and(|w| !w.contains(cmd.now)) {
        return false;
    }
    if rule.after_bytes_written.is_some_and(|b| bytes_written < b) {
        return false;
    }
    // Effects that act on something the command lacks do not count it.
    if rule.effect.needs_data() && cmd.direction == Direction::None {
        return false;
    }
    if matches!(rule.effect, Effect::BitFlip { .. }) && cmd.direction != Direction::Read {
        return false;
    }
    if matches!(rule.effect, Effect::PackedFailure { .. }) && !(cmd.packed && cmd.opcode == 25) {
        return false;
    }
    if let Effect::PowerLoss {
        at_ns: Some(at), ..
    } = rule.effect
    {
        if cmd.now < at {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::super::plan::{Commands, Range};
    use super::*;

    fn cmd(opcode: u8, now: Nanos) -> CommandInfo {
        CommandInfo {
            opcode,
            arg: 0,
            direction: Direction::None,
            lba: None,
            bytes: 0,
            now,
            packed: false,
        }
    }

    fn write(lba: u64, count: u64, now: Nanos) -> CommandInfo {
        CommandInfo {
            opcode: 25,
            arg: lba as u32,
            direction: Direction::Write,
            lba: Some((lba, count)),
            bytes: count * 512,
            now,
            packed: false,
        }
    }

    fn injector(rules: Vec<Rule>, seed: u64) -> FaultInjector {
        FaultInjector::new(FaultPlan { seed, rules }).expect("valid plan")
    }

    /// Command numbers (1-based) at which anything fired.
    fn firing(inj: &mut FaultInjector, cmds: &[CommandInfo]) -> Vec<usize> {
        cmds.iter()
            .enumerate()
            .filter(|(_, c)| !inj.on_command(c).is_empty())
            .map(|(i, _)| i + 1)
            .collect()
    }

    #[test]
    fn nth_fires_once_on_the_nth_matching_command() {
        let mut r = Rule::new(Effect::CmdCrc);
        r.nth = Some(3);
        r.command = Some(Commands::One(13));
        let mut inj = injector(vec![r], 0);
        let cmds: Vec<_> = [13, 17, 13, 13, 13, 13]
            .iter()
            .map(|&c| cmd(c, 0))
            .collect();
        assert_eq!(firing(&mut inj, &cmds), vec![4]);
    }

    #[test]
    fn every_fires_periodically_and_count_limits_it() {
        let mut r = Rule::new(Effect::CmdCrc);
        r.every = Some(2);
        let cmds: Vec<_> = (0..10).map(|_| cmd(13, 0)).collect();
        let mut inj = injector(vec![r.clone()], 0);
        assert_eq!(firing(&mut inj, &cmds), vec![2, 4, 6, 8, 10]);
        r.count = Some(2);
        let mut inj = injector(vec![r], 0);
        assert_eq!(firing(&mut inj, &cmds), vec![2, 4]);
        assert_eq!(inj.fired(0), 2);
    }

    #[test]
    fn the_injection_total_counts_past_the_history_and_across_a_clear() {
        let mut inj = injector(vec![Rule::new(Effect::CmdCrc)], 0);
        let n = HISTORY_MAX as u64 + 100;
        for _ in 0..n {
            inj.on_command(&cmd(13, 0));
        }
        assert_eq!(inj.history().len(), HISTORY_MAX);
        assert_eq!(inj.history().last().unwrap().command_number, n);
        inj.clear();
        inj.add_rule(Rule::new(Effect::CmdCrc)).unwrap();
        inj.on_command(&cmd(13, 0));
        assert_eq!(inj.injected(), n + 1);
        assert_eq!(inj.fired(0), 1, "the new rule's own count");
    }

    #[test]
    fn probability_replays_with_its_seed_and_differs_with_another() {
        let mut r = Rule::new(Effect::DataCrc);
        r.probability = Some(0.3);
        let cmds: Vec<_> = (0..200).map(|i| write(i, 1, i)).collect();
        let a = firing(&mut injector(vec![r.clone()], 11), &cmds);
        let b = firing(&mut injector(vec![r.clone()], 11), &cmds);
        let c = firing(&mut injector(vec![r], 12), &cmds);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!((30..90).contains(&a.len()), "{} of 200 at p = 0.3", a.len());
    }

    #[test]
    fn lba_range_matches_overlapping_transfers_only() {
        let mut r = Rule::new(Effect::DataCrc);
        r.lba = Some(Range {
            start: 100,
            end: 108,
        });
        let mut inj = injector(vec![r], 0);
        let cmds = [
            write(0, 100, 0), // ends just before
            write(96, 8, 0),  // overlaps the start
            write(108, 8, 0), // starts at the end
            write(107, 1, 0), // inside
            cmd(13, 0),       // no address
        ];
        assert_eq!(firing(&mut inj, &cmds), vec![2, 4]);
    }

    #[test]
    fn command_index_and_direction_filter() {
        let mut r = Rule::new(Effect::CmdTimeout);
        r.command = Some(Commands::Many(vec![6, 25]));
        r.direction = Some(Direction::Write);
        let mut inj = injector(vec![r], 0);
        let cmds = [cmd(6, 0), write(0, 1, 0), cmd(13, 0)];
        assert_eq!(firing(&mut inj, &cmds), vec![2]);
    }

    #[test]
    fn card_time_window_is_half_open() {
        let mut r = Rule::new(Effect::Latency { ns: 1 });
        r.time_ns = Some(Range {
            start: 1000,
            end: 2000,
        });
        let mut inj = injector(vec![r], 0);
        let cmds = [cmd(13, 999), cmd(13, 1000), cmd(13, 1999), cmd(13, 2000)];
        assert_eq!(firing(&mut inj, &cmds), vec![2, 3]);
    }

    #[test]
    fn after_bytes_written_waits_for_the_writes() {
        let mut r = Rule::new(Effect::CmdCrc);
        r.after_bytes_written = Some(4096);
        let mut inj = injector(vec![r], 0);
        assert!(inj.on_command(&cmd(13, 0)).is_empty());
        inj.note_written(4095);
        assert!(inj.on_command(&cmd(13, 0)).is_empty());
        inj.note_written(1);
        assert_eq!(inj.on_command(&cmd(13, 0)), vec![Effect::CmdCrc]);
    }

    #[test]
    fn data_effects_skip_commands_without_data_and_packed_needs_a_packed_write() {
        let mut d = Rule::new(Effect::DataCrc);
        d.nth = Some(1);
        let mut p = Rule::new(Effect::PackedFailure { index: 2 });
        p.nth = Some(1);
        let mut inj = injector(vec![d, p], 0);
        assert!(inj.on_command(&cmd(13, 0)).is_empty());
        assert_eq!(inj.on_command(&write(0, 8, 0)), vec![Effect::DataCrc]);
        let mut packed = write(0, 9, 0);
        packed.packed = true;
        assert_eq!(
            inj.on_command(&packed),
            vec![Effect::PackedFailure { index: 2 }]
        );
    }

    #[test]
    fn power_loss_waits_for_its_instant_and_happens_once_unless_counted() {
        let r = Rule::new(Effect::PowerLoss {
            at_ns: Some(5000),
            restore: true,
        });
        let cmds = [cmd(13, 4999), cmd(13, 6000), cmd(13, 7000)];
        let mut inj = injector(vec![r.clone()], 0);
        assert_eq!(firing(&mut inj, &cmds), vec![2]);
        let twice = Rule {
            count: Some(2),
            ..r
        };
        let mut inj = injector(vec![twice], 0);
        assert_eq!(firing(&mut inj, &cmds), vec![2, 3]);
    }

    #[test]
    fn rules_can_be_added_and_cleared_at_run_time() {
        let mut inj = injector(Vec::new(), 0);
        assert!(inj.on_command(&cmd(13, 0)).is_empty());
        let i = inj.add_rule(Rule::new(Effect::CmdEndBit)).expect("valid");
        assert_eq!(i, 0);
        assert_eq!(inj.on_command(&cmd(13, 0)), vec![Effect::CmdEndBit]);
        let bad = Rule {
            nth: Some(0),
            ..Rule::new(Effect::CmdCrc)
        };
        assert!(inj.add_rule(bad).is_err());
        inj.clear();
        assert!(inj.on_command(&cmd(13, 0)).is_empty());
        assert_eq!(inj.commands(), 3);
        assert_eq!(inj.history().len(), 1);
        assert_eq!(inj.history()[0].command_number, 2);
    }
}
