//! A register-level SDHCI 3.00 controller: the register file behind a PCI function's
//! BAR0 that a guest's own `sdhci` driver programs, with the card behind it (issue 14).
//! It is pure and deterministic: time is card time the caller passes to every call, it
//! never blocks and never reads a clock; [`SdhciMmio::next_event`] says when something
//! will change by itself, [`SdhciMmio::irq_asserted`] is the INTx level.
//!
//! Everything that reaches the card goes through the request-level model's own code
//! (`card_steps.rs` drives its `Run`): the command exchange and its response checks, the
//! data phase's bus rules and card time, the data and busy time-outs, the fault plan and
//! the command log, HS200 tuning blocks. This module adds what the guest's driver sees
//! of it: registers, interrupts, DMA engines walking the guest's memory, and the instants
//! at which results become visible.
//!
//! # Files
//!
//! - `mod.rs`: [`SdhciMmio`], its entry points and the event loop;
//! - `layout.rs`: the register map and bits, named as in Linux's `sdhci.h`;
//! - `caps.rs`: [`Capabilities`] from the host profile (Capabilities, Max Current,
//!   Preset Values);
//! - `registers.rs`: the stored registers and their write masks;
//! - `interrupts.rs`: status, status enable, signal enable, force event, Auto CMD errors;
//! - `access.rs`: byte-lane dispatch of reads and writes, and what a write sets off;
//! - `present.rs`: Present State;
//! - `bus_setup.rs`: power, SDCLK, width and timing from the registers to the core;
//! - `issue.rs`: the Command register: inhibits, decoding, the transfer set up;
//! - `card_steps.rs`: every card-facing step, through the request-level `Run`;
//! - `transfer.rs`: the DAT line: PIO, SDMA and ADMA2 engines, busy, Transfer Complete;
//! - `adma_walk.rs`: the ADMA2 descriptor walk;
//! - `dma.rs`: [`DmaMemory`], the guest memory the DMA engines use;
//! - `reset.rs`: software resets and the device reset;
//! - `records.rs`: [`CommandRecord`], what each completed command did, for an observer
//!   such as the trace (off unless asked for).
//!
//! # Time
//!
//! Each access first runs the model to its `now` ([`SdhciMmio::advance`]). A command
//! written at `now` goes on the bus at once, and its card-side work runs then, in card
//! time, through the shared code: the exchange, a read's blocks (all of them), a write's
//! blocks as soon as the guest has supplied them, Auto CMD12, the start of a busy period.
//! Nothing of it is visible before its instant: the Response registers and Command
//! Complete at the response's end; Buffer Read Ready per block as the blocks arrive (and
//! the previous one has been read out); Buffer Write Ready when the buffer is free; DMA
//! Interrupt at an SDMA boundary or an ADMA2 Int descriptor when its data has moved;
//! Transfer Complete at the data's end or when the card releases DAT0. A busy period is
//! never run ahead: the card stays at the busy's start and the DAT0 level (Present State
//! bit 20) follows [`Card::busy_until`] at each instant, so a CMD13 or an HPI sent during
//! the busy reaches the card at its own instant and can end it early.
//!
//! A command sent while another transfer's card-side work has already run ahead (say, a
//! CMD13 during a multi-block read's data phase) reaches the card at the end of that work:
//! the card is ahead of the guest by at most one data phase, and never by a busy period.
//!
//! # Decisions the specification or Linux leave open
//!
//! - **Accesses.** 1, 2, 4 or 8 bytes at any offset below 0x100, byte lane by byte lane
//!   in ascending order (Linux uses 1, 2 and 4; 8 costs nothing). Anything else reads 0
//!   and writes nothing, with a log line (rate-limited: the 1st, 2nd, 4th, 8th …).
//!   Reserved bits and registers read 0 and ignore writes. (`access.rs`)
//! - **Write side effects** happen once the whole access is in, bus setup first, then an
//!   SDMA restart, the command, and a software reset last. (`access.rs`)
//! - **Inhibits.** A command written while Command Inhibit (CMD) is set is not issued
//!   (the register keeps the value). One with data or busy while Command Inhibit (DAT)
//!   is set is not issued either, unless its Command Type is Abort: that ends the data
//!   phase at once (no Transfer Complete) and goes out. Block Size, Block Count and
//!   Transfer Mode ignore writes while Command Inhibit (DAT) is set. (`issue.rs`,
//!   `access.rs`)
//! - **Response type.** The Command register's response type and Index Check Enable
//!   choose the response the core expects: none, 136 bits (R2), 48 bits with index
//!   check (R1), without (R3: no index check), with busy (R1b). CRC Check Enable is
//!   not otherwise applied: a response the host cannot sample is a CRC error. (`issue.rs`)
//! - **Data a controller refuses.** A block size of 0 or above the capabilities' maximum,
//!   or a block count of 0 with Block Count Enable, moves nothing: the command goes out
//!   and Transfer Complete follows its response. A multi-block transfer without Block
//!   Count Enable uses the Block Count register for SDMA and PIO, and the descriptor
//!   table's length for ADMA2. (`issue.rs`)
//! - **Buffers.** The controller's read buffer holds the whole transfer (at most
//!   65 535 × 2048 bytes, and given back after a transfer above 1 MiB), so the card never
//!   waits for the guest; PIO has one block buffer in each direction. A Buffer Data Port
//!   access without Buffer Read/Write Enable reads 0 and writes nothing. (`transfer.rs`)
//! - **Transfer Complete of a read** comes once the data is where it goes: read out of
//!   the port (PIO), in guest memory (SDMA: after the guest's last restart; ADMA2), and
//!   the Auto CMD12 answered. (`transfer.rs`)
//! - **ADMA2.** The table is walked when the command is issued (a prefetching engine),
//!   reading descriptors only through [`DmaMemory`]; at most
//!   [`MAX_ADMA_DESCRIPTORS`] fetches, so a Link loop ends in an ADMA error. A descriptor
//!   that is not Valid or cannot be read: ADMA Error with ST_FDS and the descriptor's
//!   address; data memory that cannot be read or written: ST_TFR and the next
//!   descriptor's address; a table whose End comes before the transfer's length, or after
//!   more: Length Mismatch. The error is raised when the data before it has moved: a read
//!   delivers what precedes it; a write sends the whole blocks that precede it to the
//!   card, which is then left waiting for a CMD12. Descriptors past the transfer's last
//!   byte only matter when the table's End says the table is longer. The Act value 01 is
//!   a Nop; End on a Link ends the table; data and table alignment are not enforced; DMA
//!   Select 01 (ADMA1) is an ADMA error (ST_STOP). An Int descriptor's DMA Interrupt
//!   comes when its last byte has reached memory (read) or the card (write).
//!   (`adma_walk.rs`, `transfer.rs`)
//! - **SDMA.** 32-bit addresses; a chunk runs to the next Buffer Boundary, where the
//!   engine pauses with DMA Interrupt and the SDMA System Address at the boundary;
//!   writing the register's top byte restarts it at the address written. Memory that is
//!   not mapped is skipped (a read's bytes dropped, a write's sent as zeros) with a log
//!   line: v3 has no SDMA error bit. With Auto CMD23, 0x00 is both the DMA address and
//!   Argument 2, as the register is one. (`transfer.rs`)
//! - **Time-outs.** The data time-out is Timeout Control's 2^(13+n) TMCLK cycles (0xF as
//!   0xE), applied as the request-level model applies its own (per block, a transfer's
//!   budget the block count times it, firing one time-out after the gap began). A busy
//!   that HPI may still shorten is judged at the instant the time-out would fire. While
//!   the Data Timeout Error status is not enabled the controller waits as long as it
//!   takes (Linux's `SDHCI_QUIRK2_DISABLE_HW_TIMEOUT` way). (`issue.rs`, `transfer.rs`)
//! - **Errors end the DAT phase** without Transfer Complete: a command error on a data
//!   or R1b command at its response, a data error at its instant, an Auto CMD12 error at
//!   the stop's response. A failed data phase that should have ended with Auto CMD12
//!   sets Auto CMD12 Not Executed. (`transfer.rs`)
//! - **Tuning.** CMD21 with data while Execute Tuning is set is a tuning command: the
//!   controller reads the block itself through the shared tuning step (the port stays
//!   empty), raises only Buffer Read Ready, and on an intact block clears Execute Tuning
//!   and sets Sampling Clock Select; after 40 tuning blocks without one it clears
//!   Execute Tuning with Sampling Clock Select 0. Setting Execute Tuning, or writing
//!   Sampling Clock Select 0, returns to the fixed sampling clock. (`issue.rs`,
//!   `access.rs`)
//! - **Clock and power.** Internal Clock Stable follows Internal Clock Enable at once.
//!   SDCLK = base / 2N (N = 0: base), from the Preset Value of the mode when Preset Value
//!   Enable is set (a UHS mode's with 1.8 V signalling, else high or default speed). UHS
//!   Mode Select SDR104 is HS200 and DDR50 is DDR52, whatever the signalling voltage
//!   (not modelled); the v4 bits of Host Control 2 read 0. SD Bus Power cannot be set at
//!   a voltage the capabilities do not list. Bus power off cuts the card's power
//!   (sudden, as the request-level model does); on again power-cycles it into idle. No
//!   clock or no power: commands time out; a write's blocks that would go out with
//!   SDCLK stopped (between PIO blocks, at an SDMA boundary) never do: a data time-out.
//!   (`bus_setup.rs`, `access.rs`, `card_steps.rs`)
//! - **Presets** (read-only): 400 kHz, 26 MHz default speed, 52 MHz high speed, SDR12
//!   25 MHz, SDR25 50 MHz, SDR50 100 MHz, SDR104 200 MHz (HS200), DDR50 52 MHz (eMMC
//!   DDR52), each the fastest divided clock not above. (`caps.rs`)
//! - **Interrupts.** Clearing a Status Enable bit clears that status (as QEMU does); the
//!   INTx level is (status & signal enable) ≠ 0; Normal Signal Enable bit 15 is fixed 0.
//!   No card insertion or removal event ever comes (an embedded card, present from
//!   power-on). Auto CMD Error Status clears when the next command with an Auto CMD is
//!   issued. The Block Count register reads what was written and 0 after a multi-block
//!   transfer with Block Count Enable completes. (`interrupts.rs`, `transfer.rs`)
//! - **Resets.** Software Reset bits clear at once. CMD line: the pending response is
//!   dropped, Command Complete clears. DAT line: the data phase or busy wait is dropped
//!   (the card keeps busy), the buffer empties, the data interrupts clear. All: both,
//!   every register but capabilities, presets and version, and SD Bus Power off. The
//!   device reset ([`SdhciMmio::reset`], and [`SdhciMmio::new`]) also powers the card
//!   down and up cleanly (cache written back) and leaves bus power off. (`reset.rs`)
//! - **Command log.** A command without data or busy is logged when its exchange ends;
//!   one with data or busy when its DAT phase ends (its duration then includes the data
//!   and the busy), or when the next command of the same transfer (Auto CMD12) starts.
//!   [`CommandRecord`]s complete at the same instants, one per command the guest issued.
//!
//! [`Card::busy_until`]: emmc_card::Card::busy_until

mod access;
mod adma_walk;
mod bus_setup;
mod caps;
mod card_steps;
mod dma;
mod interrupts;
mod issue;
pub mod layout;
mod present;
mod records;
mod registers;
mod reset;
mod transfer;

pub use adma_walk::MAX_ADMA_DESCRIPTORS;
pub use caps::Capabilities;
pub use dma::{DmaError, DmaMemory, NoDmaMemory};
pub use records::CommandRecord;

use emmc_card::model::HostProfile;
use emmc_card::timing::Nanos;
use emmc_card::Card;

use issue::CmdReveal;
use registers::RegisterFile;
use transfer::DatPhase;

use super::{MmcIos, SdClock, SdhciConfig, SdhciHost};
use crate::cmdlog::CmdLog;
use crate::fault::FaultInjector;

/// Events one `advance` may process before it stops to let the caller breathe (each
/// event consumes state, so this is never reached by a well-formed run).
const MAX_EVENTS_PER_ADVANCE: usize = 1 << 20;

/// The register-level SDHCI 3.00 controller with its card: what a vfio-user server puts
/// behind BAR0.
pub struct SdhciMmio {
    card: Card,
    /// The controller core the request-level model uses: bus settings, tuning, the
    /// Response registers as the last exchange left them, fault plan, command log.
    host: SdhciHost,
    caps: Capabilities,
    regs: RegisterFile,
    ints: interrupts::Interrupts,
    /// The guest's latest card time.
    now: Nanos,
    /// The command on the CMD line, until its response is revealed.
    cmd: Option<CmdReveal>,
    /// The data transfer or busy wait on the DAT line.
    dat: Option<DatPhase>,
    /// The transfer's data on its way between the card and the guest.
    buf: Vec<u8>,
    /// Tuning blocks since Execute Tuning was set.
    tuning_tries: u32,
    /// The argument of a CMD23 just sent (for the next data command's packed flag).
    last_sbc: Option<u32>,
    /// Accesses the model refused, for rate-limited logging.
    bad_accesses: u64,
    /// Power Control bit 4 drives the card's RST_n (Intel's eMMC controllers, Linux's
    /// `sdhci_pci_int_hw_reset`); otherwise the bit is reserved.
    rst_n_in_power_control: bool,
    /// The card's supply: switched by writes to SD Bus Power only. Software Reset for
    /// All clears the register but leaves the supply as it was (`reset.rs`).
    bus_power: bool,
    /// SD Bus Power went off at this instant and the card has not lost power yet: it does
    /// once the supply has been off for [`MIN_POWER_OFF_NS`] (`bus_setup.rs`).
    supply_falling: Option<Nanos>,
    /// Completed commands not yet drained, when recording (`records.rs`).
    records: Option<Vec<records::CommandRecord>>,
}

/// How long SD Bus Power must stay off before the card loses power: 10 ms, the power-off
/// Linux's Intel driver holds to be sure a card has reset (`sdhci_intel_set_power`,
/// `usleep_range(10000, 12500)`). Linux clears Power Control just before every new power
/// setting (`sdhci_set_power_noreg`), and the guest's vCPU may be descheduled between
/// the two writes for a millisecond or more under TCG on a loaded host: a supply's
/// capacitance rides through that. Linux's `mmc_power_cycle` (1 ms off) is then not a
/// power loss, which changes nothing it relies on: CMD0 follows, and resets the card.
pub const MIN_POWER_OFF_NS: Nanos = 10_000_000;

impl std::fmt::Debug for SdhciMmio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SdhciMmio")
            .field("now", &self.now)
            .field("caps", &self.caps)
            .field("regs", &self.regs)
            .field("ints", &self.ints)
            .field("cmd", &self.cmd)
            .field("dat", &self.dat)
            .finish_non_exhaustive()
    }
}

impl SdhciMmio {
    /// A controller in its power-on state driving `card`, with the capabilities of
    /// `host`'s controller (its software time does not apply: the guest's kernel is the
    /// host) and `config`'s time-out clock, block size and addressing. The card is
    /// powered down and up cleanly; SD Bus Power is off until the guest turns it on.
    pub fn new(card: Card, config: SdhciConfig, host: &HostProfile) -> SdhciMmio {
        let caps = Capabilities::for_profile(&host.controller_only(), &config);
        let config = SdhciConfig {
            // SDCLK comes from the Clock Control register, exactly.
            sd_clock: SdClock::Exact,
            request_overhead_ns: 0,
            ..config
        };
        let now = card.now();
        let mut m = SdhciMmio {
            card,
            host: SdhciHost::new(config),
            caps,
            regs: RegisterFile::default(),
            ints: interrupts::Interrupts::default(),
            now,
            cmd: None,
            dat: None,
            buf: Vec::new(),
            tuning_tries: 0,
            last_sbc: None,
            bad_accesses: 0,
            rst_n_in_power_control: false,
            bus_power: false,
            supply_falling: None,
            records: None,
        };
        m.reset();
        m
    }

    /// Let Power Control bit 4 drive the card's RST_n line, as Intel's eMMC controllers
    /// do: the bit reads back what was written, and its falling edge is a hardware reset
    /// pulse ([`Card::hardware_reset`], which acts only while the card's RST_n_FUNCTION
    /// enables it).
    pub fn set_rst_n_in_power_control(&mut self, on: bool) {
        self.rst_n_in_power_control = on;
        if !on {
            self.regs.power_control &= !layout::SDHCI_POWER_RST_N;
        }
    }

    /// Read `data.len()` bytes of the register space at `offset` at card time `now`.
    pub fn read(&mut self, now: Nanos, offset: u64, data: &mut [u8], dma: &dyn DmaMemory) {
        self.advance(now, dma);
        if !access::valid_access(offset, data.len()) {
            data.fill(0);
            self.bad_access(&format!("read of {} bytes at {offset:#x}", data.len()));
            return;
        }
        let present = self.present_state();
        for (i, b) in data.iter_mut().enumerate() {
            *b = self.read_byte(offset + i as u64, present);
        }
        self.run_due();
    }

    /// Write `data` to the register space at `offset` at card time `now`.
    pub fn write(&mut self, now: Nanos, offset: u64, data: &[u8], dma: &dyn DmaMemory) {
        self.advance(now, dma);
        if !access::valid_access(offset, data.len()) {
            self.bad_access(&format!("write of {} bytes at {offset:#x}", data.len()));
            return;
        }
        let mut fx = access::Effects::default();
        for (i, &b) in data.iter().enumerate() {
            self.write_byte(offset + i as u64, b, &mut fx);
        }
        self.apply_effects(fx, dma);
        self.run_due();
    }

    /// Run to card time `now` (earlier than the last call: the last call's): reveal what
    /// is due, in order, and let the card's time pass.
    pub fn advance(&mut self, now: Nanos, _dma: &dyn DmaMemory) {
        let target = now.max(self.now);
        self.run_until(target);
        self.now = target;
        self.supply_decay(target);
        self.card.advance(target);
    }

    /// Take every model event due by `limit`, earliest first.
    fn run_until(&mut self, limit: Nanos) {
        for _ in 0..MAX_EVENTS_PER_ADVANCE {
            let cmd_at = self.cmd.map(|c| c.at).filter(|&t| t <= limit);
            let dat_at = self.dat_next_instant().filter(|&t| t <= limit);
            let progressed = match (cmd_at, dat_at) {
                (Some(c), Some(d)) if d < c => self.dat_step(limit),
                (Some(_), _) => self.cmd_step(),
                (None, Some(_)) => self.dat_step(limit),
                (None, None) => return,
            };
            if !progressed {
                return;
            }
        }
        log::error!("SDHCI: more than {MAX_EVENTS_PER_ADVANCE} events at once; stopping here");
    }

    /// Events due now (after an access changed something).
    fn run_due(&mut self) {
        let now = self.now;
        self.run_until(now);
    }

    /// Reveal the command on the CMD line.
    fn cmd_step(&mut self) -> bool {
        let Some(c) = self.cmd.take() else {
            return false;
        };
        for (i, word) in c.response.iter().enumerate() {
            if c.words & 1 << i != 0 {
                self.regs.response[i] = *word;
            }
        }
        self.ints.raise(c.normal);
        self.ints.raise_error(c.error);
        self.ints.auto_cmd_err |= c.auto_cmd_err;
        true
    }

    /// Card time of the next thing that will change a register or the interrupt line by
    /// itself (a response, a block, the end of the data or of the card's busy, DAT0).
    pub fn next_event(&self) -> Option<Nanos> {
        let dat0 = self.card.busy_until().filter(|&t| t > self.now);
        let supply_gone = self
            .supply_falling
            .map(|t| t.saturating_add(MIN_POWER_OFF_NS));
        [
            self.cmd.map(|c| c.at),
            self.dat_next_instant(),
            dat0,
            supply_gone,
        ]
        .into_iter()
        .flatten()
        .filter(|&t| t != Nanos::MAX)
        .min()
    }

    /// The INTx level: a status bit that is latched and signal-enabled.
    pub fn irq_asserted(&self) -> bool {
        self.ints.asserted()
    }

    pub fn card(&self) -> &Card {
        &self.card
    }

    pub fn card_mut(&mut self) -> &mut Card {
        &mut self.card
    }

    /// Give the card back.
    pub fn into_card(self) -> Card {
        self.card
    }

    /// The guest's latest card time.
    pub fn now(&self) -> Nanos {
        self.now
    }

    pub fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    /// Replace the capabilities (say, to offer SDMA or PIO only); they apply from the
    /// next read of the registers.
    pub fn set_capabilities(&mut self, caps: Capabilities) {
        self.caps = caps;
    }

    /// The bus the registers have set up.
    pub fn ios(&self) -> MmcIos {
        self.host.ios()
    }

    /// The controller core shared with the request-level model (its configuration,
    /// tuning state, fault injector and command log).
    pub fn host(&self) -> &SdhciHost {
        &self.host
    }

    /// Install (or with `None` remove) a fault injector: every command put on the bus is
    /// offered to it first.
    pub fn set_fault_injector(&mut self, faults: Option<FaultInjector>) {
        self.host.set_fault_injector(faults);
    }

    pub fn fault_injector(&self) -> Option<&FaultInjector> {
        self.host.fault_injector()
    }

    pub fn fault_injector_mut(&mut self) -> Option<&mut FaultInjector> {
        self.host.fault_injector_mut()
    }

    pub fn take_fault_injector(&mut self) -> Option<FaultInjector> {
        self.host.take_fault_injector()
    }

    /// Install (or with `None` remove) the command log.
    pub fn set_cmd_log(&mut self, log: Option<CmdLog>) {
        self.host.set_cmd_log(log);
    }

    pub fn take_cmd_log(&mut self) -> Option<CmdLog> {
        self.host.take_cmd_log()
    }

    pub fn flush_cmd_log(&mut self) {
        self.host.flush_cmd_log();
    }

    /// Log an access or command the model refused: the 1st, 2nd, 4th, 8th … of them.
    fn bad_access(&mut self, what: &str) {
        self.bad_accesses += 1;
        if self.bad_accesses.is_power_of_two() {
            log::warn!("SDHCI: {what} (ignored; {} such so far)", self.bad_accesses);
        }
    }
}

#[cfg(test)]
mod tests;
