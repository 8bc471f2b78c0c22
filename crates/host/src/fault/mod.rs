//! Fault injection at the host/card boundary (issue 7): a [`FaultPlan`] (TOML, see
//! `docs/faults.md`) turned into a [`FaultInjector`] that the SDHCI controller model
//! consults for every command it puts on the bus. Bus-level effects appear as the
//! controller reports them (interrupt status, `SdhciError`); card-level effects go through
//! the card's own fault entry points (`card/fault.rs`).

pub mod engine;
pub mod plan;

pub use engine::{CommandInfo, FaultInjector, Injection};
pub use plan::{Commands, Direction, Effect, FaultPlan, PlanError, Range, Rule};

/// Load and validate `--fault-plan` into an injector.
pub fn load_fault_plan(path: Option<&std::path::Path>) -> Result<Option<FaultInjector>, String> {
    let Some(path) = path else { return Ok(None) };
    let plan = FaultPlan::load(path).map_err(|e| format!("{}: {e}", path.display()))?;
    log::info!(
        "fault plan {}: seed {}, {} rules",
        path.display(),
        plan.seed,
        plan.rules.len()
    );
    FaultInjector::new(plan)
        .map(Some)
        .map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests;
