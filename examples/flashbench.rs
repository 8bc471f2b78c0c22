//! Run a flashbench test against a simulated card and print flashbench's rows.
//!
//! ```text
//! cargo run --release --example flashbench -- MODEL align-write [BLOCKSIZE] [TRIES] [--split PAGE]
//! cargo run --release --example flashbench -- MODEL align-read [BLOCKSIZE] [TRIES]
//! cargo run --release --example flashbench -- MODEL open-au N [--random] [--smallest BYTES]
//! cargo run --release --example flashbench -- MODEL size-sweep
//! cargo run --release --example flashbench -- MODEL seq-write [REQUEST_BYTES] [TOTAL_BYTES]
//! ```
//! Every run starts from a card whose user area was written once sequentially (a used
//! card: garbage collection has valid data to copy), then prints the card's counters.

use vhost_user_emmc::model::DeviceModel;
use vhost_user_emmc::sim::device::{BlockDevice, CardDevice};
use vhost_user_emmc::sim::flashbench::{self, AlignOptions, OpenAuOptions, PageSplit, Region};

fn arg<T: std::str::FromStr>(args: &[String], flag: &str) -> Option<T> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = DeviceModel::load(args.first().map_or("toshiba-mmc32g", String::as_str))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut dev = CardDevice::new(&model).expect("card");
    let test = args.get(1).map_or("size-sweep", String::as_str);
    let region_bytes: u64 = arg(&args, "--region").unwrap_or(1 << 30);
    let region = Region {
        start: arg(&args, "--start").unwrap_or(0),
        sectors: region_bytes / 512,
    };
    if !args.iter().any(|a| a == "--fresh") {
        let mut lba = region.start;
        while lba < region.start + region.sectors {
            let n = 1024.min(region.start + region.sectors - lba) as u32;
            dev.write(lba, n, false).expect("precondition");
            lba += u64::from(n);
        }
    }
    let positional = |i: usize| args.get(i).and_then(|v| v.parse::<u64>().ok());
    match test {
        "align-read" | "align-write" => {
            let o = AlignOptions {
                blocksize: positional(2).unwrap_or(1024),
                tries: positional(3).unwrap_or(8) as u32,
                write: test == "align-write",
                ..Default::default()
            };
            if args.iter().any(|a| a == "--warm") {
                flashbench::align(&mut dev, region, &o).expect("warm-up run");
            }
            let r = match arg::<u32>(&args, "--split") {
                Some(page) => {
                    let mut split = PageSplit {
                        inner: &mut dev,
                        page_sectors: page / 512,
                    };
                    flashbench::align(&mut split, region, &o)
                }
                None => flashbench::align(&mut dev, region, &o),
            }
            .expect("align");
            print!("{r}");
        }
        "open-au" => {
            let o = OpenAuOptions {
                open_aus: positional(2).unwrap_or(2) as u32,
                random: args.iter().any(|a| a == "--random"),
                smallest: arg(&args, "--smallest"),
                ..Default::default()
            };
            let whole = Region::whole(&dev);
            let r = flashbench::open_au(&mut dev, whole, &o).expect("open-au");
            print!("{r}");
        }
        "seq-write" => {
            // lmdd-like: sequential writes of one request size, no packing.
            let req = positional(2).unwrap_or(64 << 10) / 512;
            let total = positional(3).unwrap_or(64 << 20) / 512;
            let start_ns = dev.now();
            let mut lba = region.start + region.sectors;
            let end = lba + total;
            while lba < end {
                dev.write(lba, req as u32, false).expect("write");
                lba += req;
            }
            let ns = dev.now() - start_ns;
            println!(
                "{} KiB requests: {:.2} MB/s",
                req / 2,
                (total * 512) as f64 * 1e3 / ns as f64
            );
        }
        _ => {
            let o = OpenAuOptions::default();
            let whole = Region::whole(&dev);
            let r = flashbench::size_sweep(&mut dev, whole, &o).expect("sweep");
            println!("linear");
            print!("{}", r.linear);
            println!("random");
            print!("{}", r.random);
        }
    }
    if let Some(s) = dev.card().timing().flash_stats() {
        eprintln!("{s:#?}");
    }
}
