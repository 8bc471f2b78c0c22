//! Commands, responses and the command table.
//!
//! One [`CommandSpec`] per CMD index: name, class, type, response, the states in which it
//! is legal, and its handler. The dispatcher in `card/mod.rs` checks legality from the
//! table before a handler runs, so a handler only sees commands that are legal in the
//! current state.

use super::status::{CardState, StateSet};
use super::{Card, Exec, Handled};

/// A command token as it arrives on the CMD line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Command {
    pub index: u8,
    pub arg: u32,
}

impl Command {
    pub fn new(index: u8, arg: u32) -> Command {
        Command { index, arg }
    }
}

/// What the card sends back on the CMD line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Response {
    /// 48-bit response with the card status.
    R1(u32),
    /// R1 followed by busy on DAT0 until the operation finishes (see `Card::busy_until`).
    R1b(u32),
    /// 136-bit response carrying the CID or CSD (16 bytes MSB first, CRC7 in the last byte).
    R2([u8; 16]),
    /// OCR, no CRC.
    R3(u32),
    /// FAST_IO reply.
    R4(u32),
    /// Interrupt request reply.
    R5(u32),
}

impl Response {
    /// The 32-bit payload of a short response (the card status for R1/R1b).
    pub fn payload(&self) -> Option<u32> {
        match *self {
            Response::R1(v)
            | Response::R1b(v)
            | Response::R3(v)
            | Response::R4(v)
            | Response::R5(v) => Some(v),
            Response::R2(_) => None,
        }
    }
}

/// Command type (JESD84-B45 §6.10.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandType {
    /// Broadcast, no response.
    Bc,
    /// Broadcast with response.
    Bcr,
    /// Addressed, no data.
    Ac,
    /// Addressed, with data on DAT.
    Adtc,
}

/// Response type a command is specified with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseType {
    None,
    R1,
    R1b,
    R2,
    R3,
    R4,
    R5,
}

pub type Handler = fn(&mut Card, &mut Exec) -> Handled;

/// One row of the command table.
#[derive(Clone, Copy)]
pub struct CommandSpec {
    pub index: u8,
    pub name: &'static str,
    pub class: u8,
    pub kind: CommandType,
    pub response: ResponseType,
    pub legal: StateSet,
    pub handler: Handler,
}

impl std::fmt::Debug for CommandSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CMD{} {}", self.index, self.name)
    }
}

use CardState::*;
use CommandType::*;
use ResponseType as Rt;

const ANY_BUT_INA: StateSet = StateSet::of(&[
    Idle, Ready, Ident, Stby, Tran, Data, Rcv, Prg, Dis, Btst, Slp, Irq, PreIdle, Boot,
]);
const IDLE: StateSet = StateSet::of(&[Idle, PreIdle]);
const READY: StateSet = StateSet::of(&[Ready]);
const IDENT: StateSet = StateSet::of(&[Ident]);
const STBY: StateSet = StateSet::of(&[Stby]);
const TRAN: StateSet = StateSet::of(&[Tran]);
const BTST: StateSet = StateSet::of(&[Btst]);
const STBY_SLP: StateSet = StateSet::of(&[Stby, Slp]);
const SELECT: StateSet = StateSet::of(&[Stby, Tran, Data, Prg, Dis]);
const STOP: StateSet = StateSet::of(&[Data, Rcv, Prg]);
const STATUS: StateSet = StateSet::of(&[Stby, Tran, Data, Rcv, Prg, Dis, Btst]);
const INACTIVE: StateSet = StateSet::of(&[Stby, Tran, Data, Rcv, Prg, Dis, Btst]);
const APP: StateSet = StateSet::of(&[Stby, Tran, Data, Rcv, Prg, Dis]);

macro_rules! cmd {
    ($index:expr, $name:expr, $class:expr, $kind:expr, $resp:expr, $legal:expr, $handler:path) => {
        Some(CommandSpec {
            index: $index,
            name: $name,
            class: $class,
            kind: $kind,
            response: $resp,
            legal: $legal,
            handler: $handler,
        })
    };
}

/// The eMMC 4.5 command set. Indices without a row (stream commands 11/20, SET_TIME 49,
/// the 5.x protocol and command-queue commands, SPI-only commands) are illegal in every
/// state.
pub static COMMANDS: [Option<CommandSpec>; 64] = {
    let mut t: [Option<CommandSpec>; 64] = [None; 64];
    t[0] = cmd!(
        0,
        "GO_IDLE_STATE",
        0,
        Bc,
        Rt::None,
        ANY_BUT_INA,
        Card::cmd0_go_idle_state
    );
    t[1] = cmd!(
        1,
        "SEND_OP_COND",
        0,
        Bcr,
        Rt::R3,
        IDLE,
        Card::cmd1_send_op_cond
    );
    t[2] = cmd!(
        2,
        "ALL_SEND_CID",
        0,
        Bcr,
        Rt::R2,
        READY,
        Card::cmd2_all_send_cid
    );
    t[3] = cmd!(
        3,
        "SET_RELATIVE_ADDR",
        0,
        Ac,
        Rt::R1,
        IDENT,
        Card::cmd3_set_relative_addr
    );
    t[4] = cmd!(4, "SET_DSR", 0, Bc, Rt::None, STBY, Card::cmd4_set_dsr);
    t[5] = cmd!(
        5,
        "SLEEP_AWAKE",
        0,
        Ac,
        Rt::R1b,
        STBY_SLP,
        Card::cmd5_sleep_awake
    );
    t[6] = cmd!(6, "SWITCH", 0, Ac, Rt::R1b, TRAN, Card::cmd6_switch);
    t[7] = cmd!(
        7,
        "SELECT_DESELECT_CARD",
        0,
        Ac,
        Rt::R1,
        SELECT,
        Card::cmd7_select_deselect_card
    );
    t[8] = cmd!(
        8,
        "SEND_EXT_CSD",
        0,
        Adtc,
        Rt::R1,
        TRAN,
        Card::cmd8_send_ext_csd
    );
    t[9] = cmd!(9, "SEND_CSD", 0, Ac, Rt::R2, STBY, Card::cmd9_send_csd);
    t[10] = cmd!(10, "SEND_CID", 0, Ac, Rt::R2, STBY, Card::cmd10_send_cid);
    t[12] = cmd!(
        12,
        "STOP_TRANSMISSION",
        0,
        Ac,
        Rt::R1b,
        STOP,
        Card::cmd12_stop_transmission
    );
    t[13] = cmd!(
        13,
        "SEND_STATUS",
        0,
        Ac,
        Rt::R1,
        STATUS,
        Card::cmd13_send_status
    );
    t[14] = cmd!(
        14,
        "BUSTEST_R",
        0,
        Adtc,
        Rt::R1,
        BTST,
        Card::cmd14_bustest_r
    );
    t[15] = cmd!(
        15,
        "GO_INACTIVE_STATE",
        0,
        Ac,
        Rt::None,
        INACTIVE,
        Card::cmd15_go_inactive_state
    );
    t[16] = cmd!(
        16,
        "SET_BLOCKLEN",
        2,
        Ac,
        Rt::R1,
        TRAN,
        Card::cmd16_set_blocklen
    );
    t[17] = cmd!(
        17,
        "READ_SINGLE_BLOCK",
        2,
        Adtc,
        Rt::R1,
        TRAN,
        Card::cmd17_read_single_block
    );
    t[18] = cmd!(
        18,
        "READ_MULTIPLE_BLOCK",
        2,
        Adtc,
        Rt::R1,
        TRAN,
        Card::cmd18_read_multiple_block
    );
    t[19] = cmd!(
        19,
        "BUSTEST_W",
        0,
        Adtc,
        Rt::R1,
        TRAN,
        Card::cmd19_bustest_w
    );
    t[21] = cmd!(
        21,
        "SEND_TUNING_BLOCK",
        2,
        Adtc,
        Rt::R1,
        TRAN,
        Card::cmd21_send_tuning_block
    );
    t[23] = cmd!(
        23,
        "SET_BLOCK_COUNT",
        2,
        Ac,
        Rt::R1,
        TRAN,
        Card::cmd23_set_block_count
    );
    t[24] = cmd!(
        24,
        "WRITE_BLOCK",
        4,
        Adtc,
        Rt::R1,
        TRAN,
        Card::cmd24_write_block
    );
    t[25] = cmd!(
        25,
        "WRITE_MULTIPLE_BLOCK",
        4,
        Adtc,
        Rt::R1,
        TRAN,
        Card::cmd25_write_multiple_block
    );
    t[26] = cmd!(
        26,
        "PROGRAM_CID",
        4,
        Adtc,
        Rt::R1,
        TRAN,
        Card::cmd26_program_cid
    );
    t[27] = cmd!(
        27,
        "PROGRAM_CSD",
        4,
        Adtc,
        Rt::R1,
        TRAN,
        Card::cmd27_program_csd
    );
    t[28] = cmd!(
        28,
        "SET_WRITE_PROT",
        6,
        Ac,
        Rt::R1b,
        TRAN,
        Card::cmd28_set_write_prot
    );
    t[29] = cmd!(
        29,
        "CLR_WRITE_PROT",
        6,
        Ac,
        Rt::R1b,
        TRAN,
        Card::cmd29_clr_write_prot
    );
    t[30] = cmd!(
        30,
        "SEND_WRITE_PROT",
        6,
        Adtc,
        Rt::R1,
        TRAN,
        Card::cmd30_send_write_prot
    );
    t[31] = cmd!(
        31,
        "SEND_WRITE_PROT_TYPE",
        6,
        Adtc,
        Rt::R1,
        TRAN,
        Card::cmd31_send_write_prot_type
    );
    t[35] = cmd!(
        35,
        "ERASE_GROUP_START",
        5,
        Ac,
        Rt::R1,
        TRAN,
        Card::cmd35_erase_group_start
    );
    t[36] = cmd!(
        36,
        "ERASE_GROUP_END",
        5,
        Ac,
        Rt::R1,
        TRAN,
        Card::cmd36_erase_group_end
    );
    t[38] = cmd!(38, "ERASE", 5, Ac, Rt::R1b, TRAN, Card::cmd38_erase);
    t[39] = cmd!(39, "FAST_IO", 9, Ac, Rt::R4, STBY, Card::cmd39_fast_io);
    t[40] = cmd!(
        40,
        "GO_IRQ_STATE",
        9,
        Bcr,
        Rt::R5,
        STBY,
        Card::cmd40_go_irq_state
    );
    t[42] = cmd!(
        42,
        "LOCK_UNLOCK",
        7,
        Adtc,
        Rt::R1,
        TRAN,
        Card::cmd42_lock_unlock
    );
    t[55] = cmd!(55, "APP_CMD", 8, Ac, Rt::R1, APP, Card::cmd55_app_cmd);
    t[56] = cmd!(56, "GEN_CMD", 8, Adtc, Rt::R1, TRAN, Card::cmd56_gen_cmd);
    t
};

/// The table row of a command index, if the card implements that index at all.
pub fn spec(index: u8) -> Option<&'static CommandSpec> {
    COMMANDS.get(usize::from(index)).and_then(Option::as_ref)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_rows_sit_at_their_own_index() {
        for (i, row) in COMMANDS.iter().enumerate() {
            if let Some(spec) = row {
                assert_eq!(usize::from(spec.index), i, "{spec:?}");
                assert!(spec.class <= 11);
            }
        }
    }

    #[test]
    fn obsolete_and_later_revision_commands_have_no_row() {
        for index in [
            11u8, 20, 22, 32, 33, 34, 37, 41, 43, 44, 45, 46, 47, 48, 49, 53, 54, 57, 58, 59, 63,
        ] {
            assert!(
                spec(index).is_none(),
                "CMD{index} must be illegal on a 4.5 card"
            );
        }
        assert!(spec(64).is_none());
    }

    #[test]
    fn data_commands_are_adtc_and_busy_commands_r1b() {
        for index in [8u8, 14, 17, 18, 19, 21, 24, 25, 26, 27, 30, 31, 42, 56] {
            assert_eq!(spec(index).unwrap().kind, CommandType::Adtc, "CMD{index}");
        }
        for index in [5u8, 6, 28, 29, 38] {
            assert_eq!(
                spec(index).unwrap().response,
                ResponseType::R1b,
                "CMD{index}"
            );
        }
    }
}
