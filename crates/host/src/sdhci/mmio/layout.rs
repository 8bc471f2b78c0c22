//! The SDHCI v3.00 register map (facts §13.1) and the bits of the registers the
//! register-level model gives meaning to, named as Linux's `drivers/mmc/host/sdhci.h`
//! names them so the model reads beside `sdhci.c`. The interrupt status bits are shared
//! with the request-level model ([`super::super::regs`]).

/// Size of the register space (BAR0).
pub const SDHCI_REGS_LEN: u64 = 0x100;

// ---- offsets ------------------------------------------------------------------------------

/// SDMA System Address; in v3 also Argument 2, the Auto CMD23 argument.
pub const SDHCI_DMA_ADDRESS: u64 = 0x00;
pub const SDHCI_ARGUMENT2: u64 = 0x00;
/// Block Size: [11:0] bytes, [14:12] SDMA buffer boundary.
pub const SDHCI_BLOCK_SIZE: u64 = 0x04;
pub const SDHCI_BLOCK_COUNT: u64 = 0x06;
pub const SDHCI_ARGUMENT: u64 = 0x08;
pub const SDHCI_TRANSFER_MODE: u64 = 0x0C;
/// Writing its upper byte (0x0F) issues the command.
pub const SDHCI_COMMAND: u64 = 0x0E;
pub const SDHCI_RESPONSE: u64 = 0x10;
pub const SDHCI_BUFFER: u64 = 0x20;
pub const SDHCI_PRESENT_STATE: u64 = 0x24;
pub const SDHCI_HOST_CONTROL: u64 = 0x28;
pub const SDHCI_POWER_CONTROL: u64 = 0x29;
pub const SDHCI_BLOCK_GAP_CONTROL: u64 = 0x2A;
pub const SDHCI_WAKE_UP_CONTROL: u64 = 0x2B;
pub const SDHCI_CLOCK_CONTROL: u64 = 0x2C;
pub const SDHCI_TIMEOUT_CONTROL: u64 = 0x2E;
pub const SDHCI_SOFTWARE_RESET: u64 = 0x2F;
/// Normal (0x30) and Error (0x32) Interrupt Status; Linux reads both as one dword.
pub const SDHCI_INT_STATUS: u64 = 0x30;
pub const SDHCI_INT_ENABLE: u64 = 0x34;
pub const SDHCI_SIGNAL_ENABLE: u64 = 0x38;
pub const SDHCI_AUTO_CMD_STATUS: u64 = 0x3C;
pub const SDHCI_HOST_CONTROL2: u64 = 0x3E;
pub const SDHCI_CAPABILITIES: u64 = 0x40;
pub const SDHCI_CAPABILITIES_1: u64 = 0x44;
pub const SDHCI_MAX_CURRENT: u64 = 0x48;
/// Force Event for Auto CMD Error Status.
pub const SDHCI_SET_ACMD12_ERROR: u64 = 0x50;
/// Force Event for Error Interrupt Status.
pub const SDHCI_SET_INT_ERROR: u64 = 0x52;
pub const SDHCI_ADMA_ERROR: u64 = 0x54;
pub const SDHCI_ADMA_ADDRESS: u64 = 0x58;
pub const SDHCI_ADMA_ADDRESS_HI: u64 = 0x5C;
/// Preset Value registers: initialization, default speed, high speed, SDR12, SDR25,
/// SDR50, SDR104 (Linux's HS200), DDR50 (Linux's DDR52).
pub const SDHCI_PRESET_FOR_INIT: u64 = 0x60;
pub const SDHCI_PRESET_FOR_DEFAULT: u64 = 0x62;
pub const SDHCI_PRESET_FOR_HIGH_SPEED: u64 = 0x64;
pub const SDHCI_PRESET_FOR_SDR12: u64 = 0x66;
pub const SDHCI_PRESET_FOR_SDR25: u64 = 0x68;
pub const SDHCI_PRESET_FOR_SDR50: u64 = 0x6A;
pub const SDHCI_PRESET_FOR_SDR104: u64 = 0x6C;
pub const SDHCI_PRESET_FOR_DDR50: u64 = 0x6E;
pub const SDHCI_SLOT_INT_STATUS: u64 = 0xFC;
pub const SDHCI_HOST_VERSION: u64 = 0xFE;

// ---- Block Size -----------------------------------------------------------------------------

pub const SDHCI_BLOCK_SIZE_MASK: u16 = 0x0FFF;
pub const SDHCI_SDMA_BOUNDARY_SHIFT: u16 = 12;
pub const SDHCI_SDMA_BOUNDARY_MASK: u16 = 0x7000;

/// `SDHCI_MAKE_BLKSZ`: the Block Size register for an SDMA boundary code and a size.
pub const fn sdhci_make_blksz(boundary: u16, blksz: u16) -> u16 {
    (boundary & 0x7) << SDHCI_SDMA_BOUNDARY_SHIFT | (blksz & SDHCI_BLOCK_SIZE_MASK)
}

/// Bytes of SDMA buffer boundary code `code` (0: 4 KiB … 7: 512 KiB).
pub const fn sdma_boundary_bytes(code: u16) -> u64 {
    4096 << (code & 0x7)
}

// ---- Transfer Mode (0x0C) -------------------------------------------------------------------

pub const SDHCI_TRNS_DMA: u16 = 0x01;
pub const SDHCI_TRNS_BLK_CNT_EN: u16 = 0x02;
pub const SDHCI_TRNS_AUTO_CMD12: u16 = 0x04;
pub const SDHCI_TRNS_AUTO_CMD23: u16 = 0x08;
/// Bits [3:2]: 00 none, 01 Auto CMD12, 10 Auto CMD23, 11 reserved.
pub const SDHCI_TRNS_AUTO_MASK: u16 = 0x0C;
pub const SDHCI_TRNS_READ: u16 = 0x10;
pub const SDHCI_TRNS_MULTI: u16 = 0x20;
/// The bits v3 defines.
pub const SDHCI_TRNS_MASK: u16 = 0x3F;

// ---- Command (0x0E) -------------------------------------------------------------------------

pub const SDHCI_CMD_RESP_MASK: u16 = 0x03;
pub const SDHCI_CMD_RESP_NONE: u16 = 0x00;
pub const SDHCI_CMD_RESP_LONG: u16 = 0x01;
pub const SDHCI_CMD_RESP_SHORT: u16 = 0x02;
pub const SDHCI_CMD_RESP_SHORT_BUSY: u16 = 0x03;
pub const SDHCI_CMD_CRC: u16 = 0x08;
pub const SDHCI_CMD_INDEX: u16 = 0x10;
pub const SDHCI_CMD_DATA: u16 = 0x20;
/// Command Type [7:6]; 11 is Abort.
pub const SDHCI_CMD_TYPE_MASK: u16 = 0xC0;
pub const SDHCI_CMD_ABORTCMD: u16 = 0xC0;
/// The bits v3 defines (bit 2 and [15:14] are reserved).
pub const SDHCI_CMD_MASK: u16 = 0x3FFB;

/// `SDHCI_GET_CMD`: the command index of a Command register value.
pub const fn sdhci_get_cmd(command: u16) -> u8 {
    ((command >> 8) & 0x3F) as u8
}

/// `SDHCI_MAKE_CMD`.
pub const fn sdhci_make_cmd(index: u8, flags: u16) -> u16 {
    (index as u16) << 8 | (flags & 0xFF)
}

// ---- Present State (0x24) -------------------------------------------------------------------

pub const SDHCI_CMD_INHIBIT: u32 = 1 << 0;
pub const SDHCI_DATA_INHIBIT: u32 = 1 << 1;
/// DAT Line Active (Linux has no name for it).
pub const SDHCI_DAT_LINE_ACTIVE: u32 = 1 << 2;
pub const SDHCI_DOING_WRITE: u32 = 1 << 8;
pub const SDHCI_DOING_READ: u32 = 1 << 9;
/// Buffer Write Enable.
pub const SDHCI_SPACE_AVAILABLE: u32 = 1 << 10;
/// Buffer Read Enable.
pub const SDHCI_DATA_AVAILABLE: u32 = 1 << 11;
pub const SDHCI_CARD_PRESENT: u32 = 1 << 16;
pub const SDHCI_CD_STABLE: u32 = 1 << 17;
pub const SDHCI_CD_LVL: u32 = 1 << 18;
/// Write Protect Switch Pin Level: 1 = writable.
pub const SDHCI_WRITE_PROTECT: u32 = 1 << 19;
/// DAT[3:0] line signal levels.
pub const SDHCI_DATA_LVL_MASK: u32 = 0x00F0_0000;
pub const SDHCI_DATA_0_LVL_MASK: u32 = 1 << 20;
pub const SDHCI_CMD_LVL: u32 = 1 << 24;

// ---- Host Control 1 (0x28) ------------------------------------------------------------------

pub const SDHCI_CTRL_LED: u8 = 0x01;
pub const SDHCI_CTRL_4BITBUS: u8 = 0x02;
pub const SDHCI_CTRL_HISPD: u8 = 0x04;
pub const SDHCI_CTRL_DMA_MASK: u8 = 0x18;
pub const SDHCI_CTRL_SDMA: u8 = 0x00;
pub const SDHCI_CTRL_ADMA1: u8 = 0x08;
pub const SDHCI_CTRL_ADMA32: u8 = 0x10;
pub const SDHCI_CTRL_ADMA64: u8 = 0x18;
pub const SDHCI_CTRL_8BITBUS: u8 = 0x20;

// ---- Power Control (0x29) -------------------------------------------------------------------

pub const SDHCI_POWER_ON: u8 = 0x01;
/// SD Bus Voltage Select [3:1] values, with bit 0 clear.
pub const SDHCI_POWER_180: u8 = 0x0A;
pub const SDHCI_POWER_300: u8 = 0x0C;
pub const SDHCI_POWER_330: u8 = 0x0E;
pub const SDHCI_POWER_VOLTAGE_MASK: u8 = 0x0E;
/// Reserved in SDHCI 3.00; Intel's eMMC controllers drive the card's RST_n with it
/// (`SdhciMmio::set_rst_n_in_power_control`).
pub const SDHCI_POWER_RST_N: u8 = 0x10;

// ---- Clock Control (0x2C) -------------------------------------------------------------------

pub const SDHCI_CLOCK_INT_EN: u16 = 1 << 0;
pub const SDHCI_CLOCK_INT_STABLE: u16 = 1 << 1;
pub const SDHCI_CLOCK_CARD_EN: u16 = 1 << 2;
pub const SDHCI_PROG_CLOCK_MODE: u16 = 1 << 5;
pub const SDHCI_DIVIDER_SHIFT: u16 = 8;
pub const SDHCI_DIVIDER_HI_SHIFT: u16 = 6;
pub const SDHCI_DIV_MASK: u16 = 0xFF;
pub const SDHCI_DIV_HI_MASK: u16 = 0x300;
/// Linux's largest v3 divisor (N = 1023).
pub const SDHCI_MAX_DIV_SPEC_300: u64 = 2046;

/// The 10-bit divider N of a Clock Control value: SDCLK = base / (2N), N = 0: base.
pub const fn clock_divider(clock: u16) -> u16 {
    (clock >> SDHCI_DIVIDER_SHIFT) & SDHCI_DIV_MASK | ((clock >> SDHCI_DIVIDER_HI_SHIFT) & 0x3) << 8
}

/// A Clock Control value holding divider `n` (bits [15:8] and [7:6]).
pub const fn clock_with_divider(n: u16) -> u16 {
    (n & SDHCI_DIV_MASK) << SDHCI_DIVIDER_SHIFT
        | ((n & SDHCI_DIV_HI_MASK) >> 8) << SDHCI_DIVIDER_HI_SHIFT
}

// ---- Timeout Control (0x2E), Software Reset (0x2F) -----------------------------------------

pub const SDHCI_TIMEOUT_MASK: u8 = 0x0F;
pub const SDHCI_RESET_ALL: u8 = 0x01;
pub const SDHCI_RESET_CMD: u8 = 0x02;
pub const SDHCI_RESET_DATA: u8 = 0x04;

// ---- Host Control 2 (0x3E) ------------------------------------------------------------------

pub const SDHCI_CTRL_UHS_MASK: u16 = 0x0007;
pub const SDHCI_CTRL_UHS_SDR12: u16 = 0x0000;
pub const SDHCI_CTRL_UHS_SDR25: u16 = 0x0001;
pub const SDHCI_CTRL_UHS_SDR50: u16 = 0x0002;
pub const SDHCI_CTRL_UHS_SDR104: u16 = 0x0003;
pub const SDHCI_CTRL_UHS_DDR50: u16 = 0x0004;
pub const SDHCI_CTRL_VDD_180: u16 = 0x0008;
pub const SDHCI_CTRL_DRV_TYPE_MASK: u16 = 0x0030;
pub const SDHCI_CTRL_EXEC_TUNING: u16 = 0x0040;
/// Sampling Clock Select: set by the controller when tuning succeeds.
pub const SDHCI_CTRL_TUNED_CLK: u16 = 0x0080;
pub const SDHCI_CTRL_ASYNC_INT_ENABLE: u16 = 0x4000;
pub const SDHCI_CTRL_PRESET_VAL_ENABLE: u16 = 0x8000;
/// The bits v3 defines ([13:8] are v4 and read 0 here).
pub const SDHCI_CTRL2_MASK: u16 = 0xC0FF;

// ---- Capabilities (0x40, 0x44) and Maximum Current (0x48) -----------------------------------

pub const SDHCI_TIMEOUT_CLK_MASK: u32 = 0x3F;
pub const SDHCI_TIMEOUT_CLK_UNIT: u32 = 1 << 7;
pub const SDHCI_CLOCK_V3_BASE_SHIFT: u32 = 8;
pub const SDHCI_CLOCK_V3_BASE_MASK: u32 = 0xFF00;
pub const SDHCI_MAX_BLOCK_SHIFT: u32 = 16;
pub const SDHCI_MAX_BLOCK_MASK: u32 = 0x3_0000;
pub const SDHCI_CAN_DO_8BIT: u32 = 1 << 18;
pub const SDHCI_CAN_DO_ADMA2: u32 = 1 << 19;
pub const SDHCI_CAN_DO_ADMA1: u32 = 1 << 20;
pub const SDHCI_CAN_DO_HISPD: u32 = 1 << 21;
pub const SDHCI_CAN_DO_SDMA: u32 = 1 << 22;
pub const SDHCI_CAN_VDD_330: u32 = 1 << 24;
pub const SDHCI_CAN_VDD_300: u32 = 1 << 25;
pub const SDHCI_CAN_VDD_180: u32 = 1 << 26;
pub const SDHCI_CAN_64BIT: u32 = 1 << 28;
pub const SDHCI_SLOT_TYPE_SHIFT: u32 = 30;
/// Slot Type 01: an embedded slot for one device.
pub const SDHCI_SLOT_TYPE_EMBEDDED: u32 = 1;

pub const SDHCI_SUPPORT_SDR50: u32 = 1 << 0;
pub const SDHCI_SUPPORT_SDR104: u32 = 1 << 1;
pub const SDHCI_SUPPORT_DDR50: u32 = 1 << 2;
pub const SDHCI_USE_SDR50_TUNING: u32 = 1 << 13;

pub const SDHCI_MAX_CURRENT_330_SHIFT: u32 = 0;
pub const SDHCI_MAX_CURRENT_300_SHIFT: u32 = 8;
pub const SDHCI_MAX_CURRENT_180_SHIFT: u32 = 16;
/// The Maximum Current fields count in 4 mA.
pub const SDHCI_MAX_CURRENT_MULTIPLIER: u32 = 4;

// ---- Preset Value, Host Controller Version --------------------------------------------------

pub const SDHCI_PRESET_SDCLK_FREQ_MASK: u16 = 0x03FF;
pub const SDHCI_PRESET_CLKGEN_SEL: u16 = 1 << 10;
pub const SDHCI_PRESET_DRV_MASK: u16 = 0xC000;
/// Specification Version Number 2: SD Host Controller 3.00.
pub const SDHCI_SPEC_300: u16 = 2;

// ---- the interrupt registers' defined bits ---------------------------------------------------

/// Normal Interrupt Status bits v3 defines for a single-slot controller without shared
/// bus (INT_A..C and the v4 bits read 0); bit 15 is the read-only Error Interrupt.
pub const NORMAL_INT_MASK: u16 = 0x11FF;
/// Error Interrupt Status bits v3 defines (the vendor bits [15:12] read 0).
pub const ERROR_INT_MASK: u16 = 0x07FF;
/// Auto CMD Error Status bits v3 defines.
pub const AUTO_CMD_ERR_MASK: u16 = 0x009F;
/// ADMA Error Status bits v3 defines.
pub const ADMA_ERR_MASK: u8 = 0x07;
