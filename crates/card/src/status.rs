//! Device states and the R1 card status register.

use std::fmt;

/// The device states of JESD84-B45 §7 (R1 CURRENT_STATE numbers where reportable).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CardState {
    Idle,
    Ready,
    Ident,
    Stby,
    Tran,
    Data,
    Rcv,
    Prg,
    Dis,
    Btst,
    Slp,
    /// Inactive: reached by CMD15 or a voltage mismatch; only a power cycle leaves it.
    Ina,
    /// Interrupt mode (CMD40).
    Irq,
    /// Pre-idle / pre-boot / boot: the boot-mode states.
    PreIdle,
    PreBoot,
    Boot,
}

impl CardState {
    /// Number reported in R1 bits 12:9. The states that cannot be reported through CMD13
    /// (ina, irq, boot mode) never answer one, so their number is never seen.
    pub fn number(self) -> u32 {
        match self {
            CardState::Idle | CardState::PreIdle | CardState::PreBoot | CardState::Boot => 0,
            CardState::Ready => 1,
            CardState::Ident => 2,
            CardState::Stby | CardState::Ina | CardState::Irq => 3,
            CardState::Tran => 4,
            CardState::Data => 5,
            CardState::Rcv => 6,
            CardState::Prg => 7,
            CardState::Dis => 8,
            CardState::Btst => 9,
            CardState::Slp => 10,
        }
    }

    /// Bit of this state in a [`StateSet`].
    pub const fn bit(self) -> u32 {
        1 << (self as u32)
    }

    /// The spec's name of R1 CURRENT_STATE `number` (bits 12:9): "tran", "prg", ... and
    /// "reserved" for the numbers no state reports.
    pub fn name_of_number(number: u32) -> &'static str {
        match number {
            0 => "idle",
            1 => "ready",
            2 => "ident",
            3 => "stby",
            4 => "tran",
            5 => "data",
            6 => "rcv",
            7 => "prg",
            8 => "dis",
            9 => "btst",
            10 => "slp",
            _ => "reserved",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CardState::Idle => "idle",
            CardState::Ready => "ready",
            CardState::Ident => "ident",
            CardState::Stby => "stby",
            CardState::Tran => "tran",
            CardState::Data => "data",
            CardState::Rcv => "rcv",
            CardState::Prg => "prg",
            CardState::Dis => "dis",
            CardState::Btst => "btst",
            CardState::Slp => "slp",
            CardState::Ina => "ina",
            CardState::Irq => "irq",
            CardState::PreIdle => "pre-idle",
            CardState::PreBoot => "pre-boot",
            CardState::Boot => "boot",
        }
    }
}

impl fmt::Display for CardState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of states, used by the command table for "legal in".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateSet(pub u32);

impl StateSet {
    pub const fn of(states: &[CardState]) -> StateSet {
        let mut bits = 0;
        let mut i = 0;
        while i < states.len() {
            bits |= states[i].bit();
            i += 1;
        }
        StateSet(bits)
    }

    pub const fn contains(self, state: CardState) -> bool {
        self.0 & state.bit() != 0
    }
}

/// R1 card status bits (JESD84-B45 §6.13), named as the spec names them.
pub mod r1 {
    pub const ADDRESS_OUT_OF_RANGE: u32 = 1 << 31;
    pub const ADDRESS_MISALIGN: u32 = 1 << 30;
    pub const BLOCK_LEN_ERROR: u32 = 1 << 29;
    pub const ERASE_SEQ_ERROR: u32 = 1 << 28;
    pub const ERASE_PARAM: u32 = 1 << 27;
    pub const WP_VIOLATION: u32 = 1 << 26;
    pub const DEVICE_IS_LOCKED: u32 = 1 << 25;
    pub const LOCK_UNLOCK_FAILED: u32 = 1 << 24;
    pub const COM_CRC_ERROR: u32 = 1 << 23;
    pub const ILLEGAL_COMMAND: u32 = 1 << 22;
    pub const DEVICE_ECC_FAILED: u32 = 1 << 21;
    pub const CC_ERROR: u32 = 1 << 20;
    pub const ERROR: u32 = 1 << 19;
    pub const CID_CSD_OVERWRITE: u32 = 1 << 16;
    pub const WP_ERASE_SKIP: u32 = 1 << 15;
    pub const ERASE_RESET: u32 = 1 << 13;
    pub const CURRENT_STATE_SHIFT: u32 = 9;
    pub const CURRENT_STATE_MASK: u32 = 0xf << CURRENT_STATE_SHIFT;
    pub const READY_FOR_DATA: u32 = 1 << 8;
    pub const SWITCH_ERROR: u32 = 1 << 7;
    pub const EXCEPTION_EVENT: u32 = 1 << 6;
    pub const APP_CMD: u32 = 1 << 5;

    /// Bits cleared once they have been sent in a response (clear condition "c").
    pub const CLEAR_ON_READ: u32 = ADDRESS_OUT_OF_RANGE
        | ADDRESS_MISALIGN
        | BLOCK_LEN_ERROR
        | ERASE_SEQ_ERROR
        | ERASE_PARAM
        | WP_VIOLATION
        | LOCK_UNLOCK_FAILED
        | DEVICE_ECC_FAILED
        | CC_ERROR
        | ERROR
        | CID_CSD_OVERWRITE
        | WP_ERASE_SKIP
        | ERASE_RESET
        | SWITCH_ERROR
        | APP_CMD;

    /// Bits about the previous command, cleared when a valid command is received
    /// (clear condition "b"): visible exactly once, in the next response.
    pub const PREVIOUS_COMMAND: u32 = COM_CRC_ERROR | ILLEGAL_COMMAND;

    /// The error bits, all of which a host treats as a failed command.
    pub const ERRORS: u32 = ADDRESS_OUT_OF_RANGE
        | ADDRESS_MISALIGN
        | BLOCK_LEN_ERROR
        | ERASE_SEQ_ERROR
        | ERASE_PARAM
        | WP_VIOLATION
        | LOCK_UNLOCK_FAILED
        | COM_CRC_ERROR
        | ILLEGAL_COMMAND
        | DEVICE_ECC_FAILED
        | CC_ERROR
        | ERROR
        | CID_CSD_OVERWRITE;

    /// Every named bit and its name, most significant first.
    pub const NAMES: &[(u32, &str)] = &[
        (ADDRESS_OUT_OF_RANGE, "ADDRESS_OUT_OF_RANGE"),
        (ADDRESS_MISALIGN, "ADDRESS_MISALIGN"),
        (BLOCK_LEN_ERROR, "BLOCK_LEN_ERROR"),
        (ERASE_SEQ_ERROR, "ERASE_SEQ_ERROR"),
        (ERASE_PARAM, "ERASE_PARAM"),
        (WP_VIOLATION, "WP_VIOLATION"),
        (DEVICE_IS_LOCKED, "DEVICE_IS_LOCKED"),
        (LOCK_UNLOCK_FAILED, "LOCK_UNLOCK_FAILED"),
        (COM_CRC_ERROR, "COM_CRC_ERROR"),
        (ILLEGAL_COMMAND, "ILLEGAL_COMMAND"),
        (DEVICE_ECC_FAILED, "DEVICE_ECC_FAILED"),
        (CC_ERROR, "CC_ERROR"),
        (ERROR, "ERROR"),
        (CID_CSD_OVERWRITE, "CID_CSD_OVERWRITE"),
        (WP_ERASE_SKIP, "WP_ERASE_SKIP"),
        (ERASE_RESET, "ERASE_RESET"),
        (READY_FOR_DATA, "READY_FOR_DATA"),
        (SWITCH_ERROR, "SWITCH_ERROR"),
        (EXCEPTION_EVENT, "EXCEPTION_EVENT"),
        (APP_CMD, "APP_CMD"),
    ];

    /// The CURRENT_STATE number (bits 12:9).
    pub fn current_state(status: u32) -> u32 {
        (status & CURRENT_STATE_MASK) >> CURRENT_STATE_SHIFT
    }

    /// Names of the set bits, for logs and `inspect`.
    pub fn describe(status: u32) -> String {
        let mut parts: Vec<String> = NAMES
            .iter()
            .filter(|(bit, _)| status & bit != 0)
            .map(|(_, name)| (*name).to_string())
            .collect();
        parts.push(format!(
            "state={}",
            (status & CURRENT_STATE_MASK) >> CURRENT_STATE_SHIFT
        ));
        parts.join("|")
    }
}
