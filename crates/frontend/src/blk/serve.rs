//! `vhost-user-emmc serve --transport blk`: the card's user area as a vhost-user-blk
//! device. The daemon's lifecycle (socket, sessions, signals) is shared with the mmc
//! transport in [`crate::serve`].

use emmc_host::fault::load_fault_plan;
use std::sync::Arc;

use super::backend::{EmmcBlkBackend, TIMER_EVENT};
use super::target::{CardTarget, DriverPolicy};
use crate::control::{latency_json, pacing_json, Controlled};
use crate::serve::{open_card, open_cmd_log, run_daemon, ServedBackend};
pub use crate::serve::{ServeArgs, TimingArg};

impl ServedBackend for EmmcBlkBackend {
    fn timer_fd(&self) -> i32 {
        EmmcBlkBackend::timer_fd(self)
    }

    fn timer_event(&self) -> u16 {
        TIMER_EVENT
    }

    fn shutdown(&self) {
        EmmcBlkBackend::shutdown(self)
    }

    fn restart(&self) -> Result<(), String> {
        EmmcBlkBackend::restart(self).map_err(|e| e.to_string())
    }
}

impl Controlled for EmmcBlkBackend {
    fn with_host(&self, f: &mut dyn FnMut(&mut dyn crate::control::ControlHost)) {
        self.with_target(|t| f(t.driver_mut().host_mut()));
    }

    fn transport_stats(&self) -> serde_json::Value {
        let pacing = self.pacing_stats();
        self.with_target(|t| {
            let (reads, writes) = t.latencies();
            serde_json::json!({
                "transport": "blk",
                "pacing": pacing_json(&pacing),
                "read_latency": latency_json(reads),
                "write_latency": latency_json(writes),
                "driver": t.driver().stats(),
                "in_flight": t.in_flight(),
            })
        })
    }
}

/// Serve the card as a vhost-user-blk device until a signal.
pub fn serve_blk(args: &ServeArgs) -> Result<(), String> {
    let pacing = args.start_pacing();
    let (card, model) = open_card(args)?;
    let policy = DriverPolicy {
        packing: args.packing.mode(args.wr_threshold),
        elevator: args.elevator(),
    };
    let faults = load_fault_plan(args.fault_plan.as_deref())?;
    let cmd_log = open_cmd_log(args, card.now(), &model.name)?;
    let mut target = CardTarget::with_cmd_log(card, &model, &policy, cmd_log)
        .map_err(|e| format!("card bring-up: {e}"))?;
    target.set_fault_injector(faults);
    log::info!(
        "model {}: {} sectors, serial {}",
        model.name,
        target.limits().capacity,
        String::from_utf8_lossy(&target.serial()).trim_end_matches('\0')
    );
    let backend = Arc::new(EmmcBlkBackend::new(target, pacing).map_err(|e| e.to_string())?);
    backend.set_poll(std::time::Duration::from_micros(args.poll_us));
    backend.set_spin(
        std::time::Duration::from_micros(args.spin_us),
        std::time::Duration::from_micros(args.spin_max_us),
    );
    if let Some(path) = &args.trace {
        let heading = format!("vhost-user-emmc serve, model {}", model.name);
        backend.set_trace(crate::trace::open(path, backend.card_now(), &heading)?);
    }
    run_daemon(backend, &args.socket, args.control.as_deref(), &model.name)
}
