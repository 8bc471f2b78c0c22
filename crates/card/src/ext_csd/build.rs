//! Initial EXT_CSD contents from a device model.
//!
//! This is the register of a fresh card: every properties-segment byte from the model, the
//! few read-only bytes of the modes segment that describe the device (PARTITIONING_SUPPORT,
//! MAX_ENH_SIZE_MULT, WR_REL_PARAM, RPMB_SIZE_MULT, ERASED_MEM_CONT), the vendor's power-on
//! PARTITION_CONFIG, and zero everywhere else: every other modes field is 0 at power-on
//! (facts §6.2 "Reading rules"), BKOPS_STATUS and CORRECTLY_PRG_SECTORS_NUM start at 0, and
//! every reserved byte — including those that 5.0/5.1 later assigned — reads 0 on REV 6.
//! The card overlays its persistent state and live fields on top of this image.
use super::*;
use crate::model::DeviceModel;

/// The EXT_CSD of a fresh card of this model: every property byte from the model, modes
/// bytes at their power-on defaults.
pub fn build_ext_csd(model: &DeviceModel) -> [u8; EXT_CSD_LEN] {
    let e = &model.ext_csd;
    let mut r = [0u8; EXT_CSD_LEN];

    // Modes segment: read-only descriptions of the device, and the power-on boot
    // configuration. PARTITION_ACCESS (bits 2:0) is always 0 at power-on.
    write_le(&mut r, MAX_ENH_SIZE_MULT, 3, e.max_enh_size_mult);
    r[PARTITIONING_SUPPORT] = e.partitioning_support;
    r[WR_REL_PARAM] = e.wr_rel_param;
    r[RPMB_SIZE_MULT] = e.rpmb_size_mult;
    r[PARTITION_CONFIG] = e.partition_config & 0x78;
    r[ERASED_MEM_CONT] = e.erased_mem_cont;

    // Properties segment.
    r[EXT_CSD_REV] = e.ext_csd_rev;
    r[CSD_STRUCTURE] = 2; // CSD version 1.2, as for every 4.1 … 5.1 device (facts §6.2)
    r[DEVICE_TYPE] = e.device_type;
    r[DRIVER_STRENGTH] = e.driver_strength;
    r[OUT_OF_INTERRUPT_TIME] = e.out_of_interrupt_time;
    r[PARTITION_SWITCH_TIME] = e.partition_switch_time;
    r[PWR_CL_52_195] = e.pwr_cl_52_195;
    r[PWR_CL_26_195] = e.pwr_cl_26_195;
    r[PWR_CL_52_360] = e.pwr_cl_52_360;
    r[PWR_CL_26_360] = e.pwr_cl_26_360;
    r[MIN_PERF_R_4_26] = e.min_perf_r_4_26;
    r[MIN_PERF_W_4_26] = e.min_perf_w_4_26;
    r[MIN_PERF_R_8_26_4_52] = e.min_perf_r_8_26_4_52;
    r[MIN_PERF_W_8_26_4_52] = e.min_perf_w_8_26_4_52;
    r[MIN_PERF_R_8_52] = e.min_perf_r_8_52;
    r[MIN_PERF_W_8_52] = e.min_perf_w_8_52;
    write_le(&mut r, SEC_COUNT, 4, e.sec_count);
    r[S_A_TIMEOUT] = e.s_a_timeout;
    r[S_C_VCCQ] = e.s_c_vccq;
    r[S_C_VCC] = e.s_c_vcc;
    r[HC_WP_GRP_SIZE] = e.hc_wp_grp_size;
    r[REL_WR_SEC_C] = e.rel_wr_sec_c;
    r[ERASE_TIMEOUT_MULT] = e.erase_timeout_mult;
    r[HC_ERASE_GRP_SIZE] = e.hc_erase_grp_size;
    r[ACC_SIZE] = e.acc_size;
    r[BOOT_SIZE_MULT] = e.boot_size_mult;
    r[BOOT_INFO] = e.boot_info;
    r[SEC_TRIM_MULT] = e.sec_trim_mult;
    r[SEC_ERASE_MULT] = e.sec_erase_mult;
    r[SEC_FEATURE_SUPPORT] = e.sec_feature_support;
    r[TRIM_MULT] = e.trim_mult;
    r[MIN_PERF_DDR_R_8_52] = e.min_perf_ddr_r_8_52;
    r[MIN_PERF_DDR_W_8_52] = e.min_perf_ddr_w_8_52;
    r[PWR_CL_200_195] = e.pwr_cl_200_195;
    r[PWR_CL_200_360] = e.pwr_cl_200_360;
    r[PWR_CL_DDR_52_195] = e.pwr_cl_ddr_52_195;
    r[PWR_CL_DDR_52_360] = e.pwr_cl_ddr_52_360;
    r[INI_TIMEOUT_AP] = e.ini_timeout_ap;
    // CORRECTLY_PRG_SECTORS_NUM [242..245] and BKOPS_STATUS [246] are live, 0 when fresh.
    r[POWER_OFF_LONG_TIME] = e.power_off_long_time;
    r[GENERIC_CMD6_TIME] = e.generic_cmd6_time;
    write_le(&mut r, CACHE_SIZE, 4, e.cache_size);
    r[EXT_SUPPORT] = e.ext_support;
    r[LARGE_UNIT_SIZE_M1] = e.large_unit_size_m1;
    r[CONTEXT_CAPABILITIES] = e.context_capabilities;
    r[TAG_RES_SIZE] = e.tag_res_size;
    r[TAG_UNIT_SIZE] = e.tag_unit_size;
    r[DATA_TAG_SUPPORT] = e.data_tag_support;
    r[MAX_PACKED_WRITES] = e.max_packed_writes;
    r[MAX_PACKED_READS] = e.max_packed_reads;
    r[BKOPS_SUPPORT] = e.bkops_support;
    r[HPI_FEATURES] = e.hpi_features;
    r[S_CMD_SET] = e.s_cmd_set;
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ext_csd::fields::{field_at, FIELDS};

    fn generic() -> DeviceModel {
        DeviceModel::load("generic-emmc45").unwrap()
    }

    #[test]
    fn generic_model_properties_match_the_model() {
        let m = generic();
        let r = build_ext_csd(&m);
        assert_eq!(r[EXT_CSD_REV], 6);
        assert_eq!(r[CSD_STRUCTURE], 2);
        assert_eq!(read_le(&r, SEC_COUNT, 4), 15_269_888);
        assert_eq!(&r[SEC_COUNT..SEC_COUNT + 4], &[0x00, 0x00, 0xE9, 0x00]);
        assert_eq!(read_le(&r, CACHE_SIZE, 4), 4096);
        assert_eq!(&r[CACHE_SIZE..CACHE_SIZE + 4], &[0x00, 0x10, 0x00, 0x00]);
        assert_eq!(read_le(&r, MAX_ENH_SIZE_MULT, 3), 0x800);
        assert_eq!(r[DEVICE_TYPE], 0x17);
        assert_eq!(r[BOOT_SIZE_MULT], 32);
        assert_eq!(r[RPMB_SIZE_MULT], 32);
        assert_eq!(r[WR_REL_PARAM], HS_CTRL_REL | EN_REL_WR);
        assert_eq!(r[SEC_FEATURE_SUPPORT], 0x55);
        assert_eq!(r[HPI_FEATURES], HPI_SUPPORT);
        assert_eq!(r[MAX_PACKED_WRITES], 63);
        assert_eq!(r[MAX_PACKED_READS], 63);
        assert_eq!(r[GENERIC_CMD6_TIME], 0x0A);
        assert_eq!(r[POWER_OFF_LONG_TIME], 0x3C);
        assert_eq!(r[PARTITION_SWITCH_TIME], 0x03);
        assert_eq!(r[OUT_OF_INTERRUPT_TIME], 0x0A);
        assert_eq!(r[S_A_TIMEOUT], 0x10);
        assert_eq!(r[S_CMD_SET], 0x01);
        assert_eq!(r[BOOT_INFO], 0x07);
        assert_eq!(r[PARTITIONING_SUPPORT], 0x07);
    }

    #[test]
    fn every_model_key_reaches_its_byte() {
        // Give every EXT_CSD key a distinct value and find it at its offset.
        let mut m = generic();
        let e = &mut m.ext_csd;
        let singles: Vec<(usize, &mut u8)> = vec![
            (RPMB_SIZE_MULT, &mut e.rpmb_size_mult),
            (PARTITIONING_SUPPORT, &mut e.partitioning_support),
            (WR_REL_PARAM, &mut e.wr_rel_param),
            (ERASED_MEM_CONT, &mut e.erased_mem_cont),
            (EXT_CSD_REV, &mut e.ext_csd_rev),
            (DEVICE_TYPE, &mut e.device_type),
            (DRIVER_STRENGTH, &mut e.driver_strength),
            (OUT_OF_INTERRUPT_TIME, &mut e.out_of_interrupt_time),
            (PARTITION_SWITCH_TIME, &mut e.partition_switch_time),
            (PWR_CL_52_195, &mut e.pwr_cl_52_195),
            (PWR_CL_26_195, &mut e.pwr_cl_26_195),
            (PWR_CL_52_360, &mut e.pwr_cl_52_360),
            (PWR_CL_26_360, &mut e.pwr_cl_26_360),
            (MIN_PERF_R_4_26, &mut e.min_perf_r_4_26),
            (MIN_PERF_W_4_26, &mut e.min_perf_w_4_26),
            (MIN_PERF_R_8_26_4_52, &mut e.min_perf_r_8_26_4_52),
            (MIN_PERF_W_8_26_4_52, &mut e.min_perf_w_8_26_4_52),
            (MIN_PERF_R_8_52, &mut e.min_perf_r_8_52),
            (MIN_PERF_W_8_52, &mut e.min_perf_w_8_52),
            (S_A_TIMEOUT, &mut e.s_a_timeout),
            (S_C_VCCQ, &mut e.s_c_vccq),
            (S_C_VCC, &mut e.s_c_vcc),
            (HC_WP_GRP_SIZE, &mut e.hc_wp_grp_size),
            (REL_WR_SEC_C, &mut e.rel_wr_sec_c),
            (ERASE_TIMEOUT_MULT, &mut e.erase_timeout_mult),
            (HC_ERASE_GRP_SIZE, &mut e.hc_erase_grp_size),
            (ACC_SIZE, &mut e.acc_size),
            (BOOT_SIZE_MULT, &mut e.boot_size_mult),
            (BOOT_INFO, &mut e.boot_info),
            (SEC_TRIM_MULT, &mut e.sec_trim_mult),
            (SEC_ERASE_MULT, &mut e.sec_erase_mult),
            (SEC_FEATURE_SUPPORT, &mut e.sec_feature_support),
            (TRIM_MULT, &mut e.trim_mult),
            (MIN_PERF_DDR_R_8_52, &mut e.min_perf_ddr_r_8_52),
            (MIN_PERF_DDR_W_8_52, &mut e.min_perf_ddr_w_8_52),
            (PWR_CL_200_195, &mut e.pwr_cl_200_195),
            (PWR_CL_200_360, &mut e.pwr_cl_200_360),
            (PWR_CL_DDR_52_195, &mut e.pwr_cl_ddr_52_195),
            (PWR_CL_DDR_52_360, &mut e.pwr_cl_ddr_52_360),
            (INI_TIMEOUT_AP, &mut e.ini_timeout_ap),
            (POWER_OFF_LONG_TIME, &mut e.power_off_long_time),
            (GENERIC_CMD6_TIME, &mut e.generic_cmd6_time),
            (EXT_SUPPORT, &mut e.ext_support),
            (LARGE_UNIT_SIZE_M1, &mut e.large_unit_size_m1),
            (CONTEXT_CAPABILITIES, &mut e.context_capabilities),
            (TAG_RES_SIZE, &mut e.tag_res_size),
            (TAG_UNIT_SIZE, &mut e.tag_unit_size),
            (DATA_TAG_SUPPORT, &mut e.data_tag_support),
            (MAX_PACKED_WRITES, &mut e.max_packed_writes),
            (MAX_PACKED_READS, &mut e.max_packed_reads),
            (BKOPS_SUPPORT, &mut e.bkops_support),
            (HPI_FEATURES, &mut e.hpi_features),
            (S_CMD_SET, &mut e.s_cmd_set),
        ];
        let mut expected = Vec::new();
        for (i, (offset, byte)) in singles.into_iter().enumerate() {
            *byte = 0x80 + i as u8;
            expected.push((offset, 0x80 + i as u8));
        }
        e.sec_count = 0x1122_3344;
        e.cache_size = 0x5566_7788;
        e.max_enh_size_mult = 0x99AABB;
        e.partition_config = 0x48;
        let r = build_ext_csd(&m);
        for (offset, value) in expected {
            assert_eq!(r[offset], value, "offset {offset}");
        }
        assert_eq!(read_le(&r, SEC_COUNT, 4), 0x1122_3344);
        assert_eq!(read_le(&r, CACHE_SIZE, 4), 0x5566_7788);
        assert_eq!(read_le(&r, MAX_ENH_SIZE_MULT, 3), 0x99AABB);
        assert_eq!(r[PARTITION_CONFIG], 0x48);
    }

    #[test]
    fn partition_access_is_zero_at_power_on() {
        let mut m = generic();
        m.ext_csd.partition_config = 0x7F;
        assert_eq!(build_ext_csd(&m)[PARTITION_CONFIG], 0x78);
    }

    #[test]
    fn reserved_and_later_revision_bytes_are_zero() {
        // Fill every model byte with non-zero values so a stray write would show.
        let mut m = generic();
        let e = &mut m.ext_csd;
        e.pwr_cl_52_195 = 0xFF;
        e.pwr_cl_ddr_52_360 = 0xFF;
        e.min_perf_ddr_w_8_52 = 0xFF;
        e.ini_timeout_ap = 0xFF;
        let r = build_ext_csd(&m);
        for (offset, byte) in r.iter().enumerate() {
            if field_at(offset).is_none() {
                assert_eq!(*byte, 0, "reserved byte {offset} must read 0 on REV 6");
            }
        }
        // Some [5.0]/[5.1] bytes by name: STROBE_SUPPORT, SECURE_WP_INFO,
        // SLEEP_NOTIFICATION_TIME, CACHE_FLUSH_POLICY, PWR_CL_DDR_200_360,
        // FIRMWARE_VERSION, DEVICE_LIFE_TIME_EST_TYP_A/B, PRE_EOL_INFO, CMDQ_*, SUPPORTED_MODES.
        for offset in [
            15, 16, 17, 26, 29, 30, 31, 133, 184, 211, 216, 218, 240, 253, 254, 267, 268, 269, 307,
            308, 486, 493, 505,
        ] {
            assert_eq!(r[offset], 0, "offset {offset}");
            assert!(
                field_at(offset).is_none(),
                "offset {offset} is not a 4.5 field"
            );
        }
    }

    #[test]
    fn modes_segment_is_at_power_on_defaults() {
        let r = build_ext_csd(&generic());
        let from_model = [
            MAX_ENH_SIZE_MULT,
            MAX_ENH_SIZE_MULT + 1,
            MAX_ENH_SIZE_MULT + 2,
            PARTITIONING_SUPPORT,
            WR_REL_PARAM,
            RPMB_SIZE_MULT,
            PARTITION_CONFIG,
            ERASED_MEM_CONT,
        ];
        for (offset, byte) in r[..PROPERTIES_SEGMENT].iter().enumerate() {
            if !from_model.contains(&offset) {
                assert_eq!(*byte, 0, "modes byte {offset} must be 0 at power-on");
            }
        }
        // Every field the table lists is covered by the image (sanity on the table's reach).
        assert!(FIELDS.iter().all(|f| f.offset + f.len <= EXT_CSD_LEN));
    }
}
