//! The `vhost-user-emmc` command line: every subcommand, each handed to the crate of its
//! layer (`serve` and `control` to emmc-frontend, `simulate`, `compare`, `fidelity` and `selfcheck` to
//! emmc-sim, `models`, `inspect` and `image` to emmc-card).

use std::io::{ErrorKind, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use emmc_card::model::{
    builtin_host_names, builtin_model_names, DeviceModel, HostProfile, DEFAULT_MODEL,
};
use emmc_card::store::{read_header, ImageStore, NullStore};
use emmc_card::{inspect, Card};
use emmc_sim::selfcheck;

mod explain;

/// An eMMC 4.5 card behind an emulated SDHCI host, for QEMU guests over vhost-user.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand)]
enum Commands {
    /// List the built-in device models, each with the host profile it was calibrated
    /// with, and the built-in host profiles; with --explain, where each value of one
    /// model comes from.
    Models {
        /// Every knob of MODEL (a built-in name or a model file) and its host profile:
        /// value, provenance tag ([seed NNN], [fitted ROW…], [spec], [linux], [assumed],
        /// [derived]) and reason, by table; then the counts per kind and, for each seed
        /// figure, the knobs fitted to it (docs/device-models.md, "Provenance").
        #[arg(long, value_name = "MODEL")]
        explain: Option<String>,
        /// With --explain: JSON instead of text.
        #[arg(long, requires = "explain")]
        json: bool,
    },
    /// Print the decoded CID, CSD and EXT_CSD of a model (and of an image's saved state).
    Inspect {
        /// Built-in model name or path to a model TOML file. Defaults to the image's model,
        /// or to the default model.
        #[arg(long)]
        model: Option<String>,
        /// A card image: show the registers as that card reports them now.
        #[arg(long)]
        image: Option<PathBuf>,
    },
    /// Card images.
    Image {
        #[command(subcommand)]
        command: ImageCommands,
    },
    /// Serve the card to a QEMU guest: as a block device (vhost-user-blk, the default), as
    /// an SD host controller carrying raw MMC requests (--transport mmc,
    /// docs/virtio-mmc.md), or as an SDHCI controller on PCI over vfio-user that the
    /// guest's own sdhci-pci drives (--transport sdhci, docs/sdhci-transport.md).
    Serve(emmc_frontend::serve::ServeArgs),
    /// Talk to a running daemon's control socket (`serve --control PATH`).
    Control(emmc_frontend::control::ControlArgs),
    /// Run a workload against a card model in card time (no sleeping, no data) and report
    /// throughput, latency percentiles and the card's counters.
    Simulate(Box<emmc_sim::command::SimulateArgs>),
    /// Run the same work (a trace from `serve --trace`, or a workload) through every
    /// card model × driver policy in the simulator and show them side by side: a table,
    /// JSON, and with --out DIR the plots (docs/comparisons.md).
    Compare(Box<emmc_sim::compare::CompareArgs>),
    /// Measure every seed figure on its simulated card the way the seed measured it and
    /// print seed, simulated, error, fitted or predicted and status per row
    /// (docs/fidelity.md). Exits non-zero when a row is outside its tolerance and its
    /// documented gap.
    Fidelity(emmc_sim::fidelity::FidelityArgs),
    /// Bring a card up on a scratch image the way Linux would, exercise its features and
    /// check that the image keeps what the card promised.
    Selfcheck {
        /// Built-in model name or path to a model TOML file.
        #[arg(long, default_value = DEFAULT_MODEL)]
        model: String,
    },
}

#[derive(Subcommand)]
enum ImageCommands {
    /// Create a new sparse image (and its metadata sidecar PATH.emmc.toml) for a model.
    Create {
        #[arg(long, default_value = DEFAULT_MODEL)]
        model: String,
        path: PathBuf,
    },
}

fn run(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Commands::Models {
            explain: Some(model),
            json,
        } => {
            let text = explain::run(&model, json)?;
            out(&text)?;
            if json {
                out("\n")?;
            }
            Ok(())
        }
        Commands::Models { explain: None, .. } => {
            let mut text = String::new();
            for name in builtin_model_names() {
                let m = DeviceModel::load(name).map_err(|e| e.to_string())?;
                text += &format!("{name:<20} {}\n", m.description);
                text += &format!("{:<20} host profile: {}\n", "", m.host.name);
            }
            text += "\nhost profiles (device-models/hosts/; `host = \"NAME\"` in a model):\n";
            for name in builtin_host_names() {
                let h = HostProfile::load(name).map_err(|e| e.to_string())?;
                text += &format!("{name:<20} {}\n", h.description);
            }
            out(&text)
        }
        Commands::Inspect { model, image } => {
            let from_image = image.is_some();
            let card = match image {
                Some(path) => {
                    let header = read_header(&path).map_err(|e| e.to_string())?;
                    let model = DeviceModel::load(model.as_deref().unwrap_or(&header.model))
                        .map_err(|e| e.to_string())?;
                    let store = ImageStore::open(&path, Card::layout_for(&model), &model.name)
                        .map_err(|e| e.to_string())?;
                    Card::new(model, Box::new(store)).map_err(|e| e.to_string())?
                }
                None => {
                    let model = DeviceModel::load(model.as_deref().unwrap_or(DEFAULT_MODEL))
                        .map_err(|e| e.to_string())?;
                    let layout = Card::layout_for(&model);
                    Card::new(model, Box::new(NullStore::new(layout))).map_err(|e| e.to_string())?
                }
            };
            let state = if from_image {
                format!("\n{}", card.describe_saved_state())
            } else {
                String::new()
            };
            out(&format!(
                "model {}: {}\n{}{state}",
                card.model().name,
                card.model().description,
                inspect::render(&card.cid(), &card.csd(), &card.ext_csd())
            ))
        }
        Commands::Image {
            command: ImageCommands::Create { model, path },
        } => {
            let model = DeviceModel::load(&model).map_err(|e| e.to_string())?;
            let layout = Card::layout_for(&model);
            ImageStore::create(&path, layout, &model.name).map_err(|e| e.to_string())?;
            out(&format!(
                "created {} for model {}: {} bytes (sparse), boot {} KiB ×2, RPMB {} KiB, user {} MiB\n",
                path.display(),
                model.name,
                layout.total_bytes(),
                layout.boot_bytes / 1024,
                layout.rpmb_bytes / 1024,
                layout.user_bytes >> 20
            ))
        }
        Commands::Serve(args) => Ok(emmc_frontend::serve::serve(&args)?),
        Commands::Control(args) => Ok(emmc_frontend::control::control(&args)?),
        Commands::Simulate(args) => {
            let output = emmc_sim::command::simulate(&args)?;
            if args.json {
                out(&format!("{}\n", output.to_json()))?;
            } else {
                out(&output.to_text())?;
            }
            if output.failed() {
                return Err(Failure::Message(
                    "simulate: the run found violations or errors (see above)".into(),
                ));
            }
            Ok(())
        }
        Commands::Compare(args) => {
            let text = emmc_sim::compare::run_command(&args)?;
            if args.json {
                out(&format!("{text}\n"))
            } else {
                out(&text)
            }
        }
        Commands::Fidelity(args) => {
            let report = emmc_sim::fidelity::run_command(&args)?;
            out(&report.text)?;
            if !report.text.ends_with('\n') {
                out("\n")?;
            }
            if report.failed > 0 {
                return Err(Failure::Message(format!(
                    "fidelity: {} rows outside their tolerance and documented gap",
                    report.failed
                )));
            }
            Ok(())
        }
        Commands::Selfcheck { model } => {
            let model = DeviceModel::load(&model).map_err(|e| e.to_string())?;
            let report = selfcheck::run(&model)?;
            out(&report.text())?;
            if report.failures > 0 {
                Err(Failure::Message(format!(
                    "self-check failed: {} of {} checks",
                    report.failures,
                    report.lines.len()
                )))
            } else {
                Ok(())
            }
        }
    }
}

/// Why a subcommand stopped without success.
enum Failure {
    /// stdout was closed by its reader (a broken pipe): end quietly.
    OutputClosed,
    Message(String),
}

impl From<String> for Failure {
    fn from(e: String) -> Failure {
        Failure::Message(e)
    }
}

/// Print `text` on stdout. A reader that has gone away ends the command quietly instead
/// of the panic `print!` would give.
fn out(text: &str) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Err(Failure::OutputClosed),
        Err(e) => Err(Failure::Message(format!("writing to stdout: {e}"))),
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of our output went away (`| head`): nothing left to say to anyone.
        Err(Failure::OutputClosed) => ExitCode::SUCCESS,
        Err(Failure::Message(e)) => {
            // Not eprintln!: a closed stderr (`2>&1 | head`) must not turn a failure into
            // a panic. The exit status still says it failed.
            let _ = writeln!(std::io::stderr(), "vhost-user-emmc: {e}");
            ExitCode::FAILURE
        }
    }
}
