//! An SDHCI v3.00 host controller with ADMA2, executing one MMC request at a time the way
//! the controller and Linux's `drivers/mmc/host/sdhci.c` together do: optional CMD23
//! (manual or Auto CMD23), the command, the data phase through an ADMA2 descriptor table,
//! the stop (manual or Auto CMD12), busy waiting, time-outs, and the interrupt and error
//! status a driver would see. Names follow the SD Host Controller specification for
//! register bits ([`regs`]) and the Linux MMC core for requests (`struct mmc_request`,
//! `mmc_command`, `mmc_data`, `mmc_ios`).
//!
//! # Files
//!
//! One concern each, named after the part of `sdhci.c` (or the MMC core) it stands for:
//!
//! - `request.rs`: what a driver hands the controller and gets back — [`MmcCommand`],
//!   [`MmcData`], [`MmcRequest`], [`CommandOutcome`], [`SdhciCompletion`], [`SdhciError`];
//! - `ios.rs`: [`SdhciConfig`], [`MmcIos`], [`SdClock`] (`sdhci_set_ios`, `sdhci_calc_clk`)
//!   and whether the bus as set matches the card;
//! - `host.rs`: [`SdhciHost`], the controller state, and its entry points
//!   (`sdhci_request`);
//! - `run.rs`: one request in flight, CMD23 → command → data → stop;
//! - `cmd.rs`: one command on the CMD line and its response (`sdhci_send_command`,
//!   `sdhci_cmd_irq`, `sdhci_finish_command`);
//! - `data.rs`: the data phase and DAT0 busy (`sdhci_prepare_data`, `sdhci_data_irq`,
//!   `sdhci_finish_data`), over `adma.rs` (the ADMA2 table) with the time-outs of
//!   `timeout.rs` (`sdhci_calc_timeout`, `mmc_set_data_timeout`);
//! - `inject.rs`: the fault plan consulted for every command;
//! - `tuning.rs`: HS200 tuning (`sdhci_execute_tuning`);
//! - `regs.rs`: the status register bits; `owner.rs`: [`Sdhci`], a controller that owns
//!   its card;
//! - `mmio/`: [`SdhciMmio`], the same controller as a register file for a guest's own
//!   `sdhci` driver (BAR0 of the vfio-user function), which reaches the card through the
//!   files above: `Run` and its command, data, busy, fault and tuning steps.
//!
//! # Time
//!
//! The controller keeps no clock of its own: the caller owns the card time `now` and the
//! controller moves it forward by what each step costs, passing it to every card call:
//!
//! - `request_overhead_ns` once per request (host software and controller set-up);
//! - each command exchange [`Bus::command_ns`] at the current ios, the card seeing the
//!   command at the end of the exchange; a command the card does not answer costs the
//!   command token plus the 64-clock response window ([`NCR_MAX`]);
//! - read data: the card's own access and internal read time (what `Card::read_data`
//!   returns), then [`Bus::read_ns`];
//! - write data: [`Bus::write_ns`] (blocks with their CRC status tokens), then the card's
//!   programming busy up to `Card::busy_until`;
//! - R1b: the card's busy up to `Card::busy_until`.
//!
//! For a request without errors this is exactly what `sim::device::CardDevice` charges
//! (tests: `timing_equals_card_device_*`).
//!
//! # Decisions the fact sheet leaves open
//!
//! Every bus error the model produces comes from one of these; the file that makes the
//! decision is named at the end of each.
//!
//! - **Clock above the card's timing.** The card's limit follows HS_TIMING: 26 MHz
//!   backward-compatible, 52 MHz high speed (26 MHz for an HS26-only card) and DDR52,
//!   200 MHz HS200. Up to twice the limit the card still samples what the host drives but
//!   the host cannot sample what the card drives: the card executes the command and the
//!   host sees CMD_CRC (a data command's CMD_CRC is then handled as a data CRC error, as
//!   `sdhci_cmd_irq` does, so no data moves and the stop is sent). Beyond twice the limit
//!   the card cannot sample the command either: it gets `execute_checked(.., false)`,
//!   stays silent and records COM_CRC_ERROR, and the host sees CMD_TIMEOUT. (`ios.rs`
//!   `overspeed`, applied in `cmd.rs` `exchange`.)
//! - **Data bus mismatch.** When the host's width or data rate (DDR52 or not) differs from
//!   the card's BUS_WIDTH, or the block size differs from the card's, every data block is
//!   garbage on the other side: a read delivers the card's first block, the host flags
//!   DATA_CRC and nothing reaches host memory; a written block fails the card's CRC check,
//!   the card takes nothing and answers a negative CRC status (DATA_CRC). (`ios.rs`
//!   `data_bus_problem`, applied in `data.rs`.)
//! - **HS200 before tuning.** Above 52 MHz in HS200 timing, read data sampled before a
//!   successful [`SdhciHost::execute_tuning`] is DATA_CRC. Tuning blocks themselves are
//!   exempt (the controller is sweeping its sampling point); the modelled sweep finds a
//!   point on the first tuning block that arrives intact. (`tuning.rs`, `ios.rs`.)
//! - **Data time-out.** The data time-out is computed as Linux does (`mmc_set_data_timeout`
//!   from TAAC, NSAC and R2W_FACTOR of `Card::csd`, then `sdhci_calc_timeout` against the
//!   timeout clock), unless the request gives its own. The SDHCI counter restarts at every
//!   block, and the card models charge the internal work of a whole transfer as one piece,
//!   so a read's access time or a write's final busy is compared with the time-out times
//!   the block count (the budget Linux's `sdhci_calc_sw_timeout` also uses). When it is
//!   exceeded the host sees DATA_TIMEOUT one time-out after the gap began. (`timeout.rs`,
//!   `data.rs`.)
//! - **R1b busy time-out**: the command's `busy_timeout_ms` through `sdhci_calc_timeout`
//!   (0 or too large: the maximum count, 2^27 TMCLK cycles), unless the controller may
//!   disable its hardware time-out (`disable_hw_timeout`, Linux
//!   `SDHCI_QUIRK2_DISABLE_HW_TIMEOUT`), which leaves Linux's software timer.
//!   (`timeout.rs`, `run.rs`.)
//! - **ADMA2.** The descriptor table is built and checked before the command is issued
//!   (as a controller that prefetches the chain would find it, and before anything reaches
//!   the card): a total length other than block size × block count, a block count the
//!   16-bit register cannot hold, a block size of 0 or above the controller's maximum,
//!   more descriptors than the table holds, or an address 32-bit ADMA2 cannot reach is
//!   ADMA_ERR with the ADMA Error Status, and no command is sent. (`data.rs`
//!   `prepare_adma`, `adma.rs`.)
//! - **Response type mismatch**: a response of the other length is CMD_END_BIT; an R3
//!   (index 0x3F, no CRC) where R1/R1b is expected is CMD_CRC and CMD_INDEX. (`cmd.rs`.)
//! - **Power off** cuts the card's power (`PowerDown::Sudden`); commands then time out.
//!   Power on from off power-cycles the card into idle. A stopped SD clock sends nothing:
//!   commands fail with CMD_TIMEOUT at once and no time passes. (`ios.rs` `set_ios`,
//!   `cmd.rs`.)
//! - **`bytes_xfered`** is the whole transfer on success and 0 on any data error, as
//!   `sdhci_finish_data` reports it. (`run.rs`.)
//! - Not modelled here: SDMA and PIO transfers (tuning uses PIO internally), DMA_INT
//!   (Linux's ADMA2 tables set no Int attribute) — the register-level model (`mmio/`) has
//!   them —, descriptor fetch time, power-up delays, the 400 kHz open-drain limit of
//!   identification, signal voltages, card interrupts.
//!
//! [`Bus::command_ns`]: emmc_card::timing::Bus::command_ns
//! [`Bus::read_ns`]: emmc_card::timing::Bus::read_ns
//! [`Bus::write_ns`]: emmc_card::timing::Bus::write_ns

mod adma;
mod cmd;
mod data;
mod host;
mod inject;
mod ios;
pub mod mmio;
mod owner;
pub mod regs;
mod request;
mod run;
mod timeout;
mod tuning;

#[cfg(test)]
mod tests;

pub use adma::{AdmaLimits, DmaBuf, DmaSegment, ADMA2_ALIGN};
pub use cmd::NCR_MAX;
pub use data::MAX_BLOCK_COUNT;
pub use emmc_card::command::ResponseType;
pub use emmc_card::model::BusTiming;
pub use host::SdhciHost;
pub use ios::{MmcIos, PowerMode, SdClock, SdhciConfig};
pub use mmio::{Capabilities, DmaError, DmaMemory, SdhciMmio};
pub use owner::Sdhci;
pub use regs::{adma2_attr, adma_err, auto_cmd_err, error_int, normal_int, IntStatus};
pub use request::{
    CommandOutcome, DataDirection, MmcCommand, MmcData, MmcRequest, SdhciCompletion, SdhciError,
};
pub use timeout::{
    calc_timeout_count, hardware_timeout_ns, mmc_data_timeout, target_timeout_us, MAX_TIMEOUT_COUNT,
};
pub use tuning::{TuningError, MAX_TUNING_LOOP, TUNING_NEEDED_ABOVE_HZ, TUNING_WAIT_NS};
