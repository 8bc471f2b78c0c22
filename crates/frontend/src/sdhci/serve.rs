//! `vhost-user-emmc serve --transport sdhci`: the card behind an SDHCI controller that the
//! guest's own `sdhci-pci` drives, as a PCI function QEMU's `vfio-user-pci` attaches to.
//!
//! One client at a time on the socket (`PciServer`); between clients the card is powered
//! down cleanly and up again. SIGINT and SIGTERM write the card's cache back, sync the
//! image, remove the sockets and exit, as with the other transports.

use std::path::Path;
use std::sync::Arc;

use emmc_host::fault::load_fault_plan;
use emmc_host::sdhci::{SdhciConfig, SdhciMmio};

use super::SdhciBar0;
use crate::control::{ControlHost, ControlSocket, Controlled};
use crate::pacing::SpinMargin;
use crate::pci::{PciHandle, PciOptions, PciServer, SessionEnd};
use crate::serve::{open_card, open_cmd_log, refuse_blk_options, ServeArgs};

/// What the control socket acts on: the controller and card, under the function's lock.
struct SdhciControl {
    handle: PciHandle<SdhciBar0>,
}

impl Controlled for SdhciControl {
    fn with_host(&self, f: &mut dyn FnMut(&mut dyn ControlHost)) {
        self.handle
            .with_device_now(|d, _| f(d.mmio_mut() as &mut dyn ControlHost));
    }

    fn transport_stats(&self) -> serde_json::Value {
        let s = self.handle.stats();
        serde_json::json!({
            "transport": "sdhci",
            "sessions": s.sessions,
            "bar_reads": s.bar_reads,
            "bar_writes": s.bar_writes,
            "config_reads": s.config_reads,
            "config_writes": s.config_writes,
            "intx_signals": s.intx_signals,
            "resets": s.resets,
            "dma_maps_ignored": s.maps_ignored,
            "refused": s.refused,
            "timer_events": s.timer_events,
            // Where the attached client's session has spent its time so far (the line
            // the session logs when it ends).
            "session": self.handle.live_session(),
        })
    }
}

/// The controller for `args`: the card on its image, the fault plan, command log and trace.
fn controller(args: &ServeArgs) -> Result<(SdhciBar0, String), String> {
    let (card, model) = open_card(args)?;
    let config = SdhciConfig::for_model(&model.host.controller_only());
    let mut mmio = SdhciMmio::new(card, config, &model.host);
    mmio.set_fault_injector(load_fault_plan(args.fault_plan.as_deref())?);
    mmio.set_cmd_log(open_cmd_log(args, mmio.now(), &model.name)?);
    let ids = args.pci_identity.ids();
    log::info!(
        "model {}: SDHCI controller {:04x}:{:04x} ({:?}), capabilities {:#018x}, BAR0 {} bytes",
        model.name,
        ids.vendor,
        ids.device,
        args.pci_identity,
        mmio.capabilities().as_u64(),
        ids.bar0_size
    );
    let origin = mmio.now();
    let mut bar0 = SdhciBar0::new(mmio, &ids);
    if let Some(path) = &args.trace {
        let heading = format!(
            "vhost-user-emmc serve --transport sdhci, model {}",
            model.name
        );
        bar0.set_trace(crate::trace::open(path, origin, &heading)?);
    }
    Ok((bar0, model.name))
}

/// Serve the card behind an SDHCI controller over vfio-user until a signal.
pub fn serve_sdhci(args: &ServeArgs) -> Result<(), String> {
    refuse_blk_options(args)?;
    let pacing = args.start_pacing();
    let (device, model_name) = controller(args)?;
    let options = PciOptions {
        identity: args.pci_identity,
        pacing,
        spin: SpinMargin::new(
            std::time::Duration::from_micros(args.spin_us),
            std::time::Duration::from_micros(args.spin_max_us),
        ),
    };
    let server = PciServer::bind(&args.socket, device, options).map_err(|e| e.to_string())?;
    let handle = server.handle();
    let control = args
        .control
        .as_deref()
        .map(|p| {
            ControlSocket::spawn(
                p,
                Arc::new(SdhciControl {
                    handle: handle.clone(),
                }),
            )
        })
        .transpose()?;
    shut_down_on_signals(handle, &args.socket, control.as_ref().map(|c| c.path()))?;
    eprintln!(
        "vhost-user-emmc: serving {model_name} as an SDHCI controller ({:?}) over vfio-user on {}",
        args.pci_identity,
        args.socket.display()
    );
    loop {
        match server.serve_session().map_err(|e| e.to_string())? {
            SessionEnd::Closed => {}
            SessionEnd::Dropped(why) | SessionEnd::Panicked(why) => {
                log::warn!("session ended: {why}; waiting for the next client")
            }
        }
    }
}

/// On SIGINT or SIGTERM: write the card's cache back, sync the image, remove the sockets
/// and exit.
fn shut_down_on_signals(
    handle: PciHandle<SdhciBar0>,
    socket: &Path,
    control: Option<&Path>,
) -> Result<(), String> {
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .map_err(|e| format!("signal handling: {e}"))?;
    let socket = socket.to_path_buf();
    let control = control.map(Path::to_path_buf);
    std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            let _ = handle.log_live_session(&format!("cut short by signal {sig}"));
            log::info!("signal {sig}: writing the cache back and syncing the image");
            handle.with_device_now(|d, now| d.shutdown(now));
            let _ = std::fs::remove_file(&socket);
            if let Some(p) = &control {
                let _ = std::fs::remove_file(p);
            }
            std::process::exit(0);
        }
    });
    Ok(())
}
