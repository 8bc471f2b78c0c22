//! `vhost-user-emmc serve --transport mmc`: the card behind the emulated SDHCI host as a
//! virtio-mmc device (docs/virtio-mmc.md). The daemon's lifecycle (socket, sessions,
//! signals) is the one the blk transport uses ([`crate::serve`]).

use emmc_host::fault::load_fault_plan;
use std::sync::Arc;

use super::backend::{EmmcMmcBackend, TIMER_EVENT};
use super::device::MmcDevice;
use crate::control::{pacing_json, Controlled};
use crate::serve::{
    open_card, open_cmd_log, refuse_blk_options, run_daemon, ServeArgs, ServedBackend,
};

impl ServedBackend for EmmcMmcBackend {
    fn timer_fd(&self) -> i32 {
        EmmcMmcBackend::timer_fd(self)
    }

    fn timer_event(&self) -> u16 {
        TIMER_EVENT
    }

    fn shutdown(&self) {
        EmmcMmcBackend::shutdown(self)
    }

    fn restart(&self) -> Result<(), String> {
        EmmcMmcBackend::restart(self);
        Ok(())
    }
}

impl Controlled for EmmcMmcBackend {
    fn with_host(&self, f: &mut dyn FnMut(&mut dyn crate::control::ControlHost)) {
        self.with_device(|d| f(d.host_mut()));
    }

    fn transport_stats(&self) -> serde_json::Value {
        serde_json::json!({
            "transport": "mmc",
            "pacing": pacing_json(&self.pacing_stats()),
        })
    }
}

/// Serve the card as a virtio-mmc device until a signal.
pub fn serve_mmc(args: &ServeArgs) -> Result<(), String> {
    refuse_blk_options(args)?;
    let pacing = args.start_pacing();
    let (card, model) = open_card(args)?;
    let mut device = MmcDevice::new(card, &model);
    device.set_fault_injector(load_fault_plan(args.fault_plan.as_deref())?);
    device.set_cmd_log(open_cmd_log(args, device.now(), &model.name)?);
    let c = device.config();
    log::info!(
        "model {}: virtio-mmc, caps {:#x}, {}..{} Hz, {} segments of {} bytes, \
         {} bytes per request",
        model.name,
        c.caps,
        c.f_min,
        c.f_max,
        c.max_segs,
        c.max_seg_size,
        c.max_req_size
    );
    let backend = Arc::new(EmmcMmcBackend::new(device, pacing).map_err(|e| e.to_string())?);
    backend.set_poll(std::time::Duration::from_micros(args.poll_us));
    backend.set_spin(
        std::time::Duration::from_micros(args.spin_us),
        std::time::Duration::from_micros(args.spin_max_us),
    );
    if let Some(path) = &args.trace {
        let heading = format!(
            "vhost-user-emmc serve --transport mmc, model {}",
            model.name
        );
        backend.set_trace(crate::trace::open(path, backend.card_now(), &heading)?);
    }
    run_daemon(backend, &args.socket, args.control.as_deref(), &model.name)
}
