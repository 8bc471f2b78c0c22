//! The registers part: what the card keeps in its registers and nothing else.
//!
//! Owns the CID, the CSD with its CMD27-programmable byte 14, the 512 EXT_CSD bytes,
//! BUS_WIDTH (write-only in EXT_CSD: it reads 0, so the card remembers it here), the RCA,
//! and the accumulated R1 card status bits. It knows which EXT_CSD bits a reset clears
//! (`_P` access types, and `C_P` at power-on) and which survive power loss; everything
//! else about a field — who may write it and what writing it does — belongs to CMD6
//! (`switch.rs`, driven by `ext_csd::rules`).

use std::collections::BTreeMap;

use crate::ext_csd::{self as x, EXT_CSD_LEN};
use crate::model::DeviceModel;
use crate::partition::Partition;
use crate::registers;
use crate::status::r1;

/// EXT_CSD bytes that survive a power cycle, with the mask of their non-volatile bits:
/// (first byte, bytes, mask).
const NON_VOLATILE: &[(usize, usize, u8)] = &[
    (x::EXT_PARTITIONS_ATTRIBUTE, 2, 0xFF),
    (x::USE_NATIVE_SECTOR, 1, 0xFF),
    (x::VENDOR_SPECIFIC_FIELD, 64, 0xFF),
    (x::PERIODIC_WAKEUP, 1, 0xFF),
    (x::SEC_BAD_BLK_MGMNT, 1, 0xFF),
    // ENH_START_ADDR .. PARTITIONS_ATTRIBUTE (136..=156)
    (x::ENH_START_ADDR, 21, 0xFF),
    (x::RST_N_FUNCTION, 1, 0xFF),
    (x::BKOPS_EN, 1, 0xFF),
    (x::WR_REL_SET, 1, 0xFF),
    (x::FW_CONFIG, 1, 0xFF),
    (
        x::USER_WP,
        1,
        x::US_PERM_WP_EN | x::US_PERM_WP_DIS | x::CD_PERM_WP_DIS | x::PERM_PSWD_DIS,
    ),
    (
        x::BOOT_WP,
        1,
        x::B_PERM_WP_EN | x::B_PERM_WP_SEC_SEL | x::B_PERM_WP_DIS | x::B_SEC_WP_SEL,
    ),
    (x::BOOT_BUS_CONDITIONS, 1, 0xFF),
    (x::BOOT_CONFIG_PROT, 1, x::PERM_BOOT_CONFIG_PROT),
    (x::PARTITION_CONFIG, 1, 0x78),
];

/// Single-byte EXT_CSD fields a power cycle, RST_n and CMD0 return to 0 (access types
/// ending in `_P`). EXCEPTION_EVENTS_CTRL, CONTEXT_CONF and PARTITION_ACCESS are reset
/// too (see [`Registers::soft_reset`]).
const RESET_BYTES: [usize; 13] = [
    x::CACHE_CTRL,
    x::POWER_OFF_NOTIFICATION,
    x::CLASS_6_CTRL,
    x::HPI_MGMT,
    x::ERASE_GROUP_DEF,
    x::HS_TIMING,
    x::POWER_CLASS,
    x::CMD_SET,
    x::TCASE_SUPPORT,
    x::FLUSH_CACHE,
    x::BKOPS_START,
    x::SANITIZE_START,
    x::BUS_WIDTH,
];

/// The card's registers (see the module documentation).
pub(crate) struct Registers {
    cid: [u8; 16],
    csd: [u8; 16],
    /// CSD byte 14 (the CMD27-programmable bits), persistent.
    csd_writable: u8,
    ext_csd: [u8; EXT_CSD_LEN],
    /// BUS_WIDTH as last switched (EXT_CSD reads 0 there).
    bus_width: u8,
    rca: u16,
    /// Accumulated status bits (errors and flags; the state bits are added on response).
    status: u32,
}

impl Registers {
    /// The registers of a fresh card of `model`. The CSD is built when the persistent
    /// byte 14 is known ([`Registers::set_csd_writable`]).
    pub fn new(model: &DeviceModel) -> Registers {
        Registers {
            cid: registers::build_cid(&model.cid, model.ext_csd.ext_csd_rev),
            csd: [0; 16],
            csd_writable: 0,
            ext_csd: x::build_ext_csd(model),
            bus_width: 0,
            rca: 0,
            status: 0,
        }
    }

    // ---- CID and CSD --------------------------------------------------------------------

    pub fn cid(&self) -> [u8; 16] {
        self.cid
    }

    pub fn csd(&self) -> [u8; 16] {
        self.csd
    }

    pub fn csd_writable(&self) -> u8 {
        self.csd_writable
    }

    /// Set CSD byte 14 (as loaded from the saved state) and rebuild the CSD.
    pub fn set_csd_writable(&mut self, model: &DeviceModel, writable: u8) {
        self.csd_writable = writable & registers::CSD_WRITABLE_MASK;
        self.csd = registers::build_csd(model, self.csd_writable);
    }

    /// CMD27: only the programmable bits of CSD byte 14 may differ from the CSD, and the
    /// one-time programmable ones (COPY, PERM_WRITE_PROTECT, FILE_FORMAT_GRP,
    /// FILE_FORMAT) cannot be cleared once set. Returns false (CID_CSD_OVERWRITE) when
    /// the block asks for anything else; nothing changes then.
    pub fn program_csd(&mut self, model: &DeviceModel, data: &[u8]) -> bool {
        let new = data[14];
        let fixed_differs = data[..14] != self.csd[..14];
        let otp = registers::CSD_ONE_TIME_PROGRAMMABLE;
        let cleared_otp = self.csd_writable & otp & !new != 0;
        if fixed_differs || cleared_otp {
            return false;
        }
        self.csd_writable = new;
        self.csd = registers::build_csd(model, self.csd_writable);
        true
    }

    /// Whole-card write protection from the CSD (TMP_ or PERM_WRITE_PROTECT).
    #[inline]
    pub fn csd_write_protected(&self) -> bool {
        self.csd_writable & (registers::CSD_TMP_WRITE_PROTECT | registers::CSD_PERM_WRITE_PROTECT)
            != 0
    }

    // ---- RCA ----------------------------------------------------------------------------

    pub fn rca(&self) -> u16 {
        self.rca
    }

    pub fn set_rca(&mut self, rca: u16) {
        self.rca = rca;
    }

    /// Whether an addressed command's argument (RCA in bits 31:16) names this card.
    #[inline]
    pub fn rca_matches(&self, arg: u32) -> bool {
        (arg >> 16) as u16 == self.rca
    }

    // ---- card status --------------------------------------------------------------------

    /// Record status bits; they show from the next response on.
    #[inline]
    pub fn raise(&mut self, bits: u32) {
        self.status |= bits;
    }

    /// The accumulated bits, for a response that reports them: the "c" bits (cleared by
    /// being read) and the "b" bits (about the previous command) are cleared.
    #[inline]
    pub fn take_reported(&mut self) -> u32 {
        let s = self.status;
        self.status &= !(r1::CLEAR_ON_READ | r1::PREVIOUS_COMMAND);
        s
    }

    /// A valid command ended: the "b" bits describe the command before it and go; the
    /// command's own "x" bits (`after`) show from the next response on.
    #[inline]
    pub fn end_command(&mut self, after: u32) {
        self.status &= !r1::PREVIOUS_COMMAND;
        self.status |= after;
    }

    // ---- EXT_CSD ------------------------------------------------------------------------

    /// The stored EXT_CSD (without the live fields the card fills in on CMD8).
    pub fn ext_csd(&self) -> &[u8; EXT_CSD_LEN] {
        &self.ext_csd
    }

    #[inline]
    pub fn byte(&self, offset: usize) -> u8 {
        self.ext_csd[offset]
    }

    pub fn set_byte(&mut self, offset: usize, value: u8) {
        self.ext_csd[offset] = value;
    }

    /// The stored byte at `offset`, or 0 past the register's end.
    pub fn byte_or_zero(&self, offset: usize) -> u8 {
        self.ext_csd.get(offset).copied().unwrap_or(0)
    }

    pub fn read_le(&self, offset: usize, len: usize) -> u32 {
        x::read_le(&self.ext_csd, offset, len)
    }

    /// PARTITION_CONFIG.PARTITION_ACCESS: the partition data commands address.
    #[inline]
    pub fn partition_access(&self) -> Partition {
        Partition::from_access(self.ext_csd[x::PARTITION_CONFIG])
    }

    /// PARTITION_CONFIG.BOOT_PARTITION_ENABLE.
    pub fn boot_partition_enable(&self) -> u8 {
        (self.ext_csd[x::PARTITION_CONFIG] >> 3) & 0x7
    }

    pub fn hs_timing(&self) -> u8 {
        self.ext_csd[x::HS_TIMING]
    }

    /// CACHE_CTRL.CACHE_EN.
    #[inline]
    pub fn cache_on(&self) -> bool {
        self.ext_csd[x::CACHE_CTRL] & x::CACHE_EN != 0
    }

    /// ERASE_GROUP_DEF: high-capacity erase and write-protect group sizes.
    pub fn hc_erase_groups(&self) -> bool {
        self.ext_csd[x::ERASE_GROUP_DEF] & 1 != 0
    }

    /// Whether HPI is supported, enabled (HPI_MGMT) and carried by command `index` (12 or
    /// 13, as HPI_FEATURES.HPI_IMPLEMENTATION says).
    pub fn hpi_carrier(&self, index: u8) -> bool {
        let features = self.ext_csd[x::HPI_FEATURES];
        if features & x::HPI_SUPPORT == 0 || self.ext_csd[x::HPI_MGMT] & x::HPI_EN == 0 {
            return false;
        }
        let via_cmd12 = features & x::HPI_IMPLEMENTATION_CMD12 != 0;
        (index == 12) == via_cmd12
    }

    pub fn exception_events_ctrl(&self) -> u16 {
        x::read_le(&self.ext_csd, x::EXCEPTION_EVENTS_CTRL, 2) as u16
    }

    pub fn user_wp(&self) -> u8 {
        self.ext_csd[x::USER_WP]
    }

    /// BOOT_CONFIG_PROT: power-on or permanent protection of the boot configuration.
    pub fn boot_config_protected(&self) -> bool {
        self.ext_csd[x::BOOT_CONFIG_PROT] & (x::PWR_BOOT_CONFIG_PROT | x::PERM_BOOT_CONFIG_PROT)
            != 0
    }

    /// PARTITION_SETTING_COMPLETED.
    pub fn partitioning_completed(&self) -> bool {
        self.ext_csd[x::PARTITION_SETTING_COMPLETED] & 1 != 0
    }

    /// GP_SIZE_MULT_1..4 as written by the host.
    pub fn gp_size_mults(&self) -> [u64; 4] {
        std::array::from_fn(|i| u64::from(x::read_le(&self.ext_csd, x::GP_SIZE_MULT + 3 * i, 3)))
    }

    /// Report a packed command's failure: PACKED_COMMAND_STATUS Error, plus Indexed Error
    /// and PACKED_FAILURE_INDEX when entry `index` (1-based) failed.
    pub fn set_packed_failure(&mut self, index: Option<usize>) {
        let mut status = x::PACKED_STATUS_ERROR;
        if let Some(i) = index {
            status |= x::PACKED_STATUS_INDEXED_ERROR;
            self.ext_csd[x::PACKED_FAILURE_INDEX] = i.min(255) as u8;
        }
        self.ext_csd[x::PACKED_COMMAND_STATUS] = status;
    }

    /// A new packed command starts: PACKED_COMMAND_STATUS and PACKED_FAILURE_INDEX clear.
    pub fn clear_packed_failure(&mut self) {
        self.ext_csd[x::PACKED_COMMAND_STATUS] = 0;
        self.ext_csd[x::PACKED_FAILURE_INDEX] = 0;
    }

    /// CORRECTLY_PRG_SECTORS_NUM after an HPI.
    pub fn set_correctly_programmed(&mut self, sectors: u64) {
        x::write_le(
            &mut self.ext_csd,
            x::CORRECTLY_PRG_SECTORS_NUM,
            4,
            u32::try_from(sectors).unwrap_or(u32::MAX),
        );
    }

    // ---- bus ----------------------------------------------------------------------------

    pub fn bus_width(&self) -> u8 {
        self.bus_width
    }

    pub fn set_bus_width(&mut self, value: u8) {
        self.bus_width = value;
    }

    /// Bytes per bus clock: the unit of the bus-test pattern.
    pub fn bus_width_bytes(&self) -> usize {
        match self.bus_width & 0x0F {
            1 | 5 => 4,
            2 | 6 => 8,
            _ => 1,
        }
    }

    // ---- resets -------------------------------------------------------------------------

    /// CMD0, RST_n or power cycle: every `_P` field returns to 0, and so do BUS_WIDTH, the
    /// RCA and the status bits.
    pub fn soft_reset(&mut self) {
        for offset in RESET_BYTES {
            self.ext_csd[offset] = 0;
        }
        self.ext_csd[x::EXCEPTION_EVENTS_CTRL] = 0;
        self.ext_csd[x::EXCEPTION_EVENTS_CTRL + 1] = 0;
        for b in &mut self.ext_csd[x::CONTEXT_CONF..x::CONTEXT_CONF + 15] {
            *b = 0;
        }
        self.ext_csd[x::PARTITION_CONFIG] &= !0x07;
        self.bus_width = 0;
        self.rca = 0;
        self.status = 0;
    }

    /// Power-on only: the R/W/C_P bits (power-on write protection and its disables, the
    /// power-on boot configuration protection) clear as well.
    pub fn power_on_reset(&mut self) {
        self.soft_reset();
        self.ext_csd[x::USER_WP] &= !(x::US_PWR_WP_EN | x::US_PWR_WP_DIS);
        self.ext_csd[x::BOOT_WP] &= !(x::B_PWR_WP_EN | x::B_PWR_WP_SEC_SEL | x::B_PWR_WP_DIS);
        self.ext_csd[x::BOOT_CONFIG_PROT] &= !x::PWR_BOOT_CONFIG_PROT;
    }

    // ---- persistence --------------------------------------------------------------------

    /// The non-volatile EXT_CSD bits by offset (only bytes whose saved bits are not 0).
    pub fn non_volatile(&self) -> BTreeMap<String, u8> {
        let mut saved = BTreeMap::new();
        for &(start, len, mask) in NON_VOLATILE {
            for offset in start..start + len {
                let v = self.ext_csd[offset] & mask;
                if v != 0 {
                    saved.insert(offset.to_string(), v);
                }
            }
        }
        saved
    }

    /// Load a saved non-volatile byte: only its non-volatile bits are taken. An offset
    /// that holds no non-volatile bits is an error.
    pub fn restore_non_volatile(&mut self, offset: usize, value: u8) -> Result<(), String> {
        let mask = NON_VOLATILE
            .iter()
            .find(|(start, len, _)| (*start..start + len).contains(&offset))
            .map(|&(_, _, mask)| mask)
            .ok_or_else(|| format!("EXT_CSD[{offset}] is not a non-volatile byte"))?;
        self.ext_csd[offset] = (self.ext_csd[offset] & !mask) | (value & mask);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> DeviceModel {
        DeviceModel::load("generic-emmc45").unwrap()
    }

    fn fresh() -> (DeviceModel, Registers) {
        let m = model();
        let mut r = Registers::new(&m);
        r.set_csd_writable(&m, 0);
        (m, r)
    }

    #[test]
    fn soft_reset_clears_every_p_field_and_keeps_the_rest() {
        let (_, mut r) = fresh();
        for offset in RESET_BYTES {
            r.set_byte(offset, 0x5A);
        }
        x::write_le(&mut r.ext_csd, x::EXCEPTION_EVENTS_CTRL, 2, 0x0108);
        r.set_byte(x::CONTEXT_CONF + 14, 3);
        r.set_byte(x::PARTITION_CONFIG, 0x4B); // BOOT_ACK, boot from boot 1, access RPMB
        r.set_byte(x::BKOPS_EN, 1);
        r.set_byte(x::USER_WP, x::US_PWR_WP_EN | x::US_PERM_WP_DIS);
        r.set_bus_width(2);
        r.set_rca(7);
        r.raise(r1::ERROR);
        r.soft_reset();
        for offset in RESET_BYTES {
            assert_eq!(r.byte(offset), 0, "EXT_CSD[{offset}]");
        }
        assert_eq!(r.exception_events_ctrl(), 0);
        assert_eq!(r.byte(x::CONTEXT_CONF + 14), 0);
        assert_eq!(r.byte(x::PARTITION_CONFIG), 0x48, "boot bits stay");
        assert_eq!(r.partition_access(), Partition::User);
        assert_eq!(r.byte(x::BKOPS_EN), 1);
        assert_eq!(
            r.user_wp(),
            x::US_PWR_WP_EN | x::US_PERM_WP_DIS,
            "C_P bits survive CMD0"
        );
        assert_eq!((r.bus_width(), r.rca(), r.status), (0, 0, 0));
    }

    #[test]
    fn power_on_reset_also_clears_the_power_on_bits() {
        let (_, mut r) = fresh();
        r.set_byte(x::USER_WP, 0xFF);
        r.set_byte(x::BOOT_WP, 0xFF);
        r.set_byte(x::BOOT_CONFIG_PROT, 0x11);
        r.power_on_reset();
        assert_eq!(r.user_wp(), !(x::US_PWR_WP_EN | x::US_PWR_WP_DIS));
        assert_eq!(
            r.byte(x::BOOT_WP),
            !(x::B_PWR_WP_EN | x::B_PWR_WP_SEC_SEL | x::B_PWR_WP_DIS)
        );
        assert_eq!(r.byte(x::BOOT_CONFIG_PROT), x::PERM_BOOT_CONFIG_PROT);
        assert!(r.boot_config_protected());
    }

    #[test]
    fn cmd27_programs_only_byte_14_and_keeps_one_time_bits() {
        let (m, mut r) = fresh();
        let mut block = r.csd();
        block[14] = registers::CSD_TMP_WRITE_PROTECT | registers::CSD_COPY;
        assert!(r.program_csd(&m, &block));
        assert!(r.csd_write_protected());
        assert_eq!(r.csd_writable(), block[14]);
        assert_eq!(
            r.csd()[14],
            block[14],
            "the CSD is rebuilt with the new byte"
        );

        // TMP_WRITE_PROTECT is erasable, COPY is not.
        let mut block = r.csd();
        block[14] = registers::CSD_COPY;
        assert!(r.program_csd(&m, &block));
        assert!(!r.csd_write_protected());
        block[14] = 0;
        assert!(!r.program_csd(&m, &block), "COPY cannot be cleared");
        assert_eq!(r.csd_writable(), registers::CSD_COPY);

        let mut block = r.csd();
        block[3] ^= 1;
        assert!(!r.program_csd(&m, &block), "read-only bytes must match");
    }

    #[test]
    fn reported_bits_clear_once_read_and_previous_command_bits_at_the_next_command() {
        let (_, mut r) = fresh();
        r.raise(r1::ERROR | r1::ILLEGAL_COMMAND);
        assert_eq!(r.take_reported(), r1::ERROR | r1::ILLEGAL_COMMAND);
        assert_eq!(r.status, 0);

        r.raise(r1::COM_CRC_ERROR);
        r.end_command(r1::SWITCH_ERROR);
        assert_eq!(r.status, r1::SWITCH_ERROR, "b bits go, x bits arrive");
        assert_eq!(r.take_reported(), r1::SWITCH_ERROR);
        assert_eq!(r.take_reported(), 0);
    }

    #[test]
    fn non_volatile_bits_round_trip_and_volatile_bytes_are_refused() {
        let (m, mut r) = fresh();
        r.set_byte(x::BKOPS_EN, 1);
        r.set_byte(x::PARTITION_CONFIG, 0x49); // boot bits persist, access does not
        r.set_byte(x::USER_WP, x::US_PWR_WP_EN | x::US_PERM_WP_EN);
        r.set_byte(x::HS_TIMING, 1);
        let saved = r.non_volatile();
        assert_eq!(saved.get("163"), Some(&1));
        assert_eq!(saved.get("179"), Some(&0x48));
        assert_eq!(saved.get("171"), Some(&x::US_PERM_WP_EN));
        assert!(!saved.contains_key("185"), "HS_TIMING is volatile");

        let mut back = Registers::new(&m);
        for (offset, &v) in &saved {
            back.restore_non_volatile(offset.parse().unwrap(), v)
                .unwrap();
        }
        assert_eq!(back.non_volatile(), saved);
        assert!(back
            .restore_non_volatile(x::HS_TIMING, 1)
            .unwrap_err()
            .contains("not a non-volatile byte"));
        back.restore_non_volatile(x::BOOT_CONFIG_PROT, 0xFF)
            .unwrap();
        assert_eq!(back.byte(x::BOOT_CONFIG_PROT), x::PERM_BOOT_CONFIG_PROT);
    }

    #[test]
    fn hpi_is_carried_by_the_command_hpi_features_names_once_enabled() {
        let (_, mut r) = fresh();
        r.set_byte(x::HPI_FEATURES, x::HPI_SUPPORT);
        assert!(!r.hpi_carrier(13), "HPI_MGMT not set");
        r.set_byte(x::HPI_MGMT, x::HPI_EN);
        assert!(r.hpi_carrier(13) && !r.hpi_carrier(12));
        r.set_byte(
            x::HPI_FEATURES,
            x::HPI_SUPPORT | x::HPI_IMPLEMENTATION_CMD12,
        );
        assert!(r.hpi_carrier(12) && !r.hpi_carrier(13));
        r.set_byte(x::HPI_FEATURES, x::HPI_IMPLEMENTATION_CMD12);
        assert!(!r.hpi_carrier(12), "no HPI_SUPPORT");
    }

    #[test]
    fn packed_status_and_bus_width_views() {
        let (_, mut r) = fresh();
        r.set_packed_failure(Some(300));
        assert_eq!(r.byte(x::PACKED_COMMAND_STATUS), 0x03);
        assert_eq!(r.byte(x::PACKED_FAILURE_INDEX), 255);
        r.clear_packed_failure();
        r.set_packed_failure(None);
        assert_eq!(r.byte(x::PACKED_COMMAND_STATUS), 0x01);
        assert_eq!(r.byte(x::PACKED_FAILURE_INDEX), 0);

        for (width, bytes) in [(0, 1), (1, 4), (2, 8), (5, 4), (6, 8)] {
            r.set_bus_width(width);
            assert_eq!(r.bus_width_bytes(), bytes, "BUS_WIDTH {width}");
        }
        assert!(r.rca_matches(0) && !r.rca_matches(1 << 16));
        r.set_rca(1);
        assert!(r.rca_matches(1 << 16 | 0xFFFF));
        assert_eq!(r.byte_or_zero(4096), 0);
    }
}
