//! How many 4 KiB requests per second of wall time the simulator runs through
//! host → card → timing, for a model (default toshiba-mmc32g).
//!
//! `cargo run --release --example speed -- [MODEL] [REQUESTS]`

use std::time::Instant;
use vhost_user_emmc::model::DeviceModel;
use vhost_user_emmc::sim::device::{BlockDevice, CardDevice};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = DeviceModel::load(args.first().map_or("toshiba-mmc32g", String::as_str)).unwrap();
    let n: u64 = args
        .get(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let mut dev = CardDevice::new(&model).unwrap();
    let sectors = dev.sectors() - 8;
    for (name, write, random) in [
        ("sequential writes", true, false),
        ("random writes", true, true),
        ("random reads", false, true),
    ] {
        let start = Instant::now();
        let mut lba = 0u64;
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..n {
            if random {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                lba = (x % (sectors / 8)) * 8;
            } else {
                lba = (lba + 8) % sectors;
            }
            if write {
                dev.write(lba, 8, false).unwrap();
            } else {
                dev.read(lba, 8).unwrap();
            }
        }
        let s = start.elapsed().as_secs_f64();
        println!("{name:<18} {:>10.0} requests/s of wall time", n as f64 / s);
    }
}
