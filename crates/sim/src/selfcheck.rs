//! `vhost-user-emmc selfcheck`: bring a card of a model up on a scratch sparse image the
//! way Linux would, exercise every feature a driver developer relies on, reopen the image
//! and check that what the card promised to keep is there. Reports one line per check.

use std::path::{Path, PathBuf};

use emmc_card::ext_csd as ext;
use emmc_card::model::DeviceModel;
use emmc_card::rpmb::{self, RpmbFrame};
use emmc_card::store::ImageStore;
use emmc_card::{packed, Card, CardState, Command, Partition, PowerDown};
use emmc_host::mmc::{HostCaps, MmcHost, MMC_CMD23_ARG_PACKED, MMC_CMD23_ARG_REL_WR};

/// Outcome of a self-check: one line per check and how many failed.
pub struct Report {
    /// What was checked, and on which scratch image.
    pub heading: String,
    pub lines: Vec<String>,
    pub failures: usize,
}

impl Report {
    /// The report as the command prints it.
    pub fn text(&self) -> String {
        let mut t = format!("{}\n", self.heading);
        for line in &self.lines {
            t += line;
            t.push('\n');
        }
        t += &format!("{} checks, {} failed\n", self.lines.len(), self.failures);
        t
    }
}

struct Checker {
    report: Report,
}

impl Checker {
    fn check(&mut self, name: &str, result: Result<String, String>) {
        let line = match result {
            Ok(detail) => format!(
                "ok    {name}{}",
                if detail.is_empty() {
                    String::new()
                } else {
                    format!(": {detail}")
                }
            ),
            Err(e) => {
                self.report.failures += 1;
                format!("FAIL  {name}: {e}")
            }
        };
        self.report.lines.push(line);
    }
}

fn pattern(seed: u64, blocks: usize) -> Vec<u8> {
    (0..blocks * 512)
        .map(|i| (seed.wrapping_mul(0x9E37_79B9).wrapping_add(i as u64 * 7) >> 3) as u8)
        .collect()
}

/// Scratch directory removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn open_card(model: &DeviceModel, path: &Path, create: bool) -> Result<Card, String> {
    let layout = Card::layout_for(model);
    let store = if create {
        ImageStore::create(path, layout, &model.name)
    } else {
        ImageStore::open(path, layout, &model.name)
    }
    .map_err(|e| e.to_string())?;
    Card::new(model.clone(), Box::new(store)).map_err(|e| e.to_string())
}

/// Run the self-check for `model`.
pub fn run(model: &DeviceModel) -> Result<Report, String> {
    let dir =
        std::env::temp_dir().join(format!("vhost-user-emmc-selfcheck-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let scratch = Scratch(dir);
    let image = scratch.0.join("card.img");
    let mut c = Checker {
        report: Report {
            heading: format!(
                "self-check of model {} on a sparse scratch image {}",
                model.name,
                image.display()
            ),
            lines: Vec::new(),
            failures: 0,
        },
    };

    let mut host = MmcHost::new(open_card(model, &image, true)?);
    let caps = HostCaps::default();
    let e = host.mmc_init_card(&caps);
    c.check(
        "bring-up (CMD0, CMD1 loop, CMD2, CMD3, CMD9, CMD7, CMD8, CMD6 switches)",
        e.map(|e| {
            let sectors = ext::read_le(&e, ext::SEC_COUNT, 4);
            format!(
                "EXT_CSD_REV {}, {} sectors ({} MiB), bus 8-bit HS",
                e[ext::EXT_CSD_REV],
                sectors,
                u64::from(sectors) / 2048
            )
        })
        .map_err(|e| e.to_string()),
    );

    for partition in [Partition::User, Partition::Boot1, Partition::Boot2] {
        c.check(
            &format!("write/read/verify {} start and end", partition.name()),
            rw_check(&mut host, partition),
        );
    }
    c.check("packed write of 4 entries", packed_check(&mut host));
    c.check(
        "cache: acknowledged, volatile until FLUSH_CACHE",
        cache_check(&mut host),
    );
    c.check(
        "reliable write survives a sudden power loss",
        reliable_check(&mut host, &caps),
    );
    c.check("HPI interrupts a long write", hpi_check(&mut host));
    if model.ext_csd.rpmb_size_mult > 0 {
        c.check(
            "RPMB key programming and write counter",
            rpmb_check(&mut host),
        );
    }
    // Persistence: a clean shutdown, then a new card process on the same image.
    let mut card = host.into_card();
    card.power_off(card.now(), PowerDown::Clean);
    drop(card);
    c.check(
        "image reopens with data and persistent state",
        reopen_check(model, &image, &caps),
    );
    Ok(c.report)
}

fn rw_check(h: &mut MmcHost, partition: Partition) -> Result<String, String> {
    h.mmc_select_partition(partition)
        .map_err(|e| e.to_string())?;
    let size = h.card.partition_sectors(partition);
    let blocks = 128usize;
    for (i, lba) in [0, size - blocks as u64].into_iter().enumerate() {
        let data = pattern(i as u64 + partition.index() as u64 * 10, blocks);
        h.mmc_write_blocks(lba, &data, 0)
            .map_err(|e| e.to_string())?;
        let mut back = vec![0u8; data.len()];
        h.mmc_read_blocks(lba, &mut back)
            .map_err(|e| e.to_string())?;
        if back != data {
            return Err(format!("data read back at {lba} differs"));
        }
    }
    h.mmc_select_partition(Partition::User)
        .map_err(|e| e.to_string())?;
    Ok(format!("{} sectors", size))
}

fn packed_check(h: &mut MmcHost) -> Result<String, String> {
    let entries: Vec<(u64, usize)> = vec![(4096, 8), (100, 1), (20_000, 16), (9, 3)];
    let header = packed::Header {
        direction: packed::Direction::Write,
        entries: entries
            .iter()
            .map(|&(lba, n)| packed::Entry::new(n as u16, lba as u32, false))
            .collect(),
    };
    let mut data = header.encode().to_vec();
    for (i, &(_, n)) in entries.iter().enumerate() {
        data.extend_from_slice(&pattern(50 + i as u64, n));
    }
    let total = (data.len() / 512) as u32;
    h.mmc_send_r1(23, MMC_CMD23_ARG_PACKED | total)
        .map_err(|e| e.to_string())?;
    h.mmc_send_r1(25, entries[0].0 as u32)
        .map_err(|e| e.to_string())?;
    h.card.write_data(h.now, &data).map_err(|e| e.to_string())?;
    h.mmc_wait_busy();
    let e = h.mmc_get_ext_csd().map_err(|e| e.to_string())?;
    if e[ext::PACKED_COMMAND_STATUS] != 0 {
        return Err(format!(
            "PACKED_COMMAND_STATUS {:#x}",
            e[ext::PACKED_COMMAND_STATUS]
        ));
    }
    for (i, &(lba, n)) in entries.iter().enumerate() {
        let mut back = vec![0u8; n * 512];
        h.mmc_read_blocks(lba, &mut back)
            .map_err(|e| e.to_string())?;
        if back != pattern(50 + i as u64, n) {
            return Err(format!("entry {} at {lba} differs", i + 1));
        }
    }
    Ok(format!("{} data blocks in one CMD25", total - 1))
}

fn cache_check(h: &mut MmcHost) -> Result<String, String> {
    h.mmc_write_blocks(30_000, &pattern(7, 16), 0)
        .map_err(|e| e.to_string())?;
    if h.card.model().ext_csd.cache_size == 0 {
        return Ok("the model has no cache (CACHE_SIZE 0): writes are durable at once".into());
    }
    let volatile: u64 = h.card.volatile_sectors().iter().map(|r| r.1).sum();
    if volatile < 16 {
        return Err(format!(
            "{volatile} volatile sectors after a cached write of 16"
        ));
    }
    h.mmc_flush_cache().map_err(|e| e.to_string())?;
    if !h.card.volatile_sectors().is_empty() {
        return Err("sectors still volatile after FLUSH_CACHE".into());
    }
    Ok(format!(
        "{volatile} sectors volatile before the flush, 0 after"
    ))
}

fn reliable_check(h: &mut MmcHost, caps: &HostCaps) -> Result<String, String> {
    let data = pattern(9, 8);
    let cached = pattern(10, 8);
    h.mmc_write_blocks(40_000, &data, MMC_CMD23_ARG_REL_WR)
        .map_err(|e| e.to_string())?;
    h.mmc_write_blocks(40_100, &cached, 0)
        .map_err(|e| e.to_string())?;
    h.card.power_cycle(h.now, PowerDown::Sudden);
    h.mmc_init_card(caps).map_err(|e| e.to_string())?;
    let mut back = vec![0u8; data.len()];
    h.mmc_read_blocks(40_000, &mut back)
        .map_err(|e| e.to_string())?;
    if back != data {
        return Err("reliable write lost".into());
    }
    if h.card.model().ext_csd.cache_size == 0 {
        return Ok("the reliable write survived (the model has no cache)".into());
    }
    h.mmc_read_blocks(40_100, &mut back)
        .map_err(|e| e.to_string())?;
    if back == cached {
        return Err("an unflushed cached write survived power loss".into());
    }
    Ok("the unflushed cached write was lost, as it may be".into())
}

fn hpi_check(h: &mut MmcHost) -> Result<String, String> {
    let cache = h.card.model().ext_csd.cache_size > 0;
    if cache {
        h.mmc_switch(ext::CACHE_CTRL, 0)
            .map_err(|e| e.to_string())?;
    }
    let blocks = 2048u32;
    h.mmc_send_r1(23, blocks).map_err(|e| e.to_string())?;
    h.mmc_send_r1(25, 60_000).map_err(|e| e.to_string())?;
    h.card
        .write_data(h.now, &pattern(11, blocks as usize))
        .map_err(|e| e.to_string())?;
    let (start, end) = (h.now, h.card.busy_until().unwrap_or(h.now));
    if end == start {
        if cache {
            h.mmc_switch(ext::CACHE_CTRL, ext::CACHE_EN)
                .map_err(|e| e.to_string())?;
        }
        return Ok("the model programs in zero time: nothing to interrupt".into());
    }
    h.now = start + (end - start) / 2;
    h.card.execute(
        h.now,
        Command::new(13, u32::from(emmc_host::mmc::MMC_RCA) << 16 | 1),
    );
    h.mmc_wait_busy();
    if h.card.state() != CardState::Tran {
        return Err(format!("card in {} after HPI", h.card.state()));
    }
    let e = h.mmc_get_ext_csd().map_err(|e| e.to_string())?;
    let done = ext::read_le(&e, ext::CORRECTLY_PRG_SECTORS_NUM, 4);
    if cache {
        h.mmc_switch(ext::CACHE_CTRL, ext::CACHE_EN)
            .map_err(|e| e.to_string())?;
    }
    if done == 0 || done >= blocks {
        return Err(format!("CORRECTLY_PRG_SECTORS_NUM {done} of {blocks}"));
    }
    Ok(format!(
        "CORRECTLY_PRG_SECTORS_NUM {done} of {blocks} at half the programming time"
    ))
}

const RPMB_KEY: [u8; 32] = [0x5A; 32];

fn rpmb_send(h: &mut MmcHost, frame: &RpmbFrame, rel: u32) -> Result<(), String> {
    h.mmc_send_r1(23, 1 | rel).map_err(|e| e.to_string())?;
    h.mmc_send_r1(25, 0).map_err(|e| e.to_string())?;
    h.card
        .write_data(h.now, &frame.to_bytes())
        .map_err(|e| e.to_string())?;
    h.mmc_wait_busy();
    Ok(())
}

fn rpmb_receive(h: &mut MmcHost) -> Result<[u8; rpmb::FRAME_LEN], String> {
    h.mmc_send_r1(23, 1).map_err(|e| e.to_string())?;
    h.mmc_send_r1(18, 0).map_err(|e| e.to_string())?;
    let mut buf = [0u8; rpmb::FRAME_LEN];
    h.card
        .read_data(h.now, &mut buf)
        .map_err(|e| e.to_string())?;
    Ok(buf)
}

/// Read the RPMB write counter and check the response's nonce, result and MAC.
fn rpmb_read_counter(h: &mut MmcHost) -> Result<u32, String> {
    h.mmc_select_partition(Partition::Rpmb)
        .map_err(|e| e.to_string())?;
    let mut request = RpmbFrame::with_type(rpmb::READ_WRITE_COUNTER);
    request.nonce = [0xA5; 16];
    rpmb_send(h, &request, 0)?;
    let bytes = rpmb_receive(h)?;
    h.mmc_select_partition(Partition::User)
        .map_err(|e| e.to_string())?;
    let response = RpmbFrame::parse(&bytes);
    if response.result != rpmb::OPERATION_OK {
        return Err(format!("counter read result {:#06x}", response.result));
    }
    if response.nonce != request.nonce
        || !rpmb::rpmb_mac_matches(&RPMB_KEY, &bytes, &response.key_mac)
    {
        return Err("counter response nonce or MAC wrong".into());
    }
    Ok(response.write_counter)
}

fn rpmb_check(h: &mut MmcHost) -> Result<String, String> {
    h.mmc_select_partition(Partition::Rpmb)
        .map_err(|e| e.to_string())?;
    let mut program = RpmbFrame::with_type(rpmb::AUTHENTICATION_KEY_PROGRAMMING);
    program.key_mac = RPMB_KEY;
    rpmb_send(h, &program, MMC_CMD23_ARG_REL_WR)?;
    rpmb_send(h, &RpmbFrame::with_type(rpmb::RESULT_READ), 0)?;
    let result = RpmbFrame::parse(&rpmb_receive(h)?);
    if result.result != rpmb::OPERATION_OK {
        return Err(format!("key programming result {:#06x}", result.result));
    }
    let counter = rpmb_read_counter(h)?;
    Ok(format!("write counter {counter}, MAC verified"))
}

fn reopen_check(model: &DeviceModel, image: &Path, caps: &HostCaps) -> Result<String, String> {
    let mut h = MmcHost::new(open_card(model, image, false)?);
    let e = h.mmc_init_card(caps).map_err(|e| e.to_string())?;
    let mut back = vec![0u8; 16 * 512];
    h.mmc_read_blocks(30_000, &mut back)
        .map_err(|e| e.to_string())?;
    if back != pattern(7, 16) {
        return Err("flushed data not in the reopened image".into());
    }
    if e[ext::BKOPS_EN] & ext::BKOPS_MANUAL_EN == 0 {
        return Err("BKOPS_EN (one-time programmable) was not kept".into());
    }
    if model.ext_csd.rpmb_size_mult > 0 {
        rpmb_read_counter(&mut h).map_err(|e| format!("RPMB key not kept: {e}"))?;
        return Ok("flushed data, BKOPS_EN and the RPMB key kept".into());
    }
    Ok("flushed data and BKOPS_EN kept".into())
}
