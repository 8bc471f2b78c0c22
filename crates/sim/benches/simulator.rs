//! Simulator throughput: 4 KiB block requests per second of wall time through the whole
//! host → card → timing path, on one core, for the ideal card and the real-card models.
//! Run with `cargo bench --bench simulator`; figures go to docs/performance.md.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use emmc_card::model::DeviceModel;
use emmc_card::timing::prng::Prng;
use emmc_sim::device::{BlockDevice, CardDevice};

/// Requests per measured batch.
const BATCH: u64 = 10_000;

fn model(name: &str) -> Option<DeviceModel> {
    DeviceModel::load(name).ok()
}

fn bench_model(c: &mut Criterion, name: &str, model: DeviceModel) {
    let mut group = c.benchmark_group(format!("sim/{name}"));
    group.throughput(Throughput::Elements(BATCH));
    let span = 1u64 << 21; // 1 GiB of 512-byte sectors
    for (what, write, random) in [
        ("4k-randwrite", true, true),
        ("4k-seqwrite", true, false),
        ("4k-randread", false, true),
    ] {
        let mut device = CardDevice::new(&model).expect("device");
        let mut rng = Prng::new(1);
        let mut next = 0u64;
        group.bench_function(what, |b| {
            b.iter_batched(
                || (),
                |()| {
                    for _ in 0..BATCH {
                        let lba = if random {
                            rng.below(span / 8) * 8
                        } else {
                            next = (next + 8) % span;
                            next
                        };
                        let r = if write {
                            device.write(lba, 8, false)
                        } else {
                            device.read(lba, 8)
                        };
                        r.expect("request");
                    }
                },
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

fn simulator(c: &mut Criterion) {
    let ideal = model("ideal").unwrap_or_else(|| {
        let mut m = DeviceModel::load("generic-emmc45").expect("default model");
        m.name = "ideal".into();
        m.timing = Default::default();
        m
    });
    bench_model(c, "ideal", ideal);
    for name in ["toshiba-mmc32g", "sandisk-sem32g"] {
        if let Some(m) = model(name) {
            bench_model(c, name, m);
        }
    }
}

criterion_group!(benches, simulator);
criterion_main!(benches);
