//! The fuzz target bodies (`crates/frontend/src/fuzzing.rs`) on stable: every committed seed under
//! `fuzz/corpus/<target>/`, then seeded random and mutated inputs, a few thousand per
//! target. A violated invariant panics with the input that broke it, so CI catches what
//! the fuzzer would without nightly. `FUZZ_ITERATIONS` overrides the count (ci/fuzz.sh).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use emmc_frontend::fuzzing::TARGETS;

/// xorshift64*: deterministic, so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut out: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| std::fs::read(e.ok()?.path()).ok())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// A random input, or a seed with a few bytes changed, cut or repeated.
fn input(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    if seeds.is_empty() || rng.below(4) == 0 {
        let len = rng.below(1200);
        return (0..len).map(|_| rng.next() as u8).collect();
    }
    let mut v = seeds[rng.below(seeds.len())].clone();
    for _ in 0..=rng.below(8) {
        match rng.below(4) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next() as u8;
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            2 if !v.is_empty() => v.truncate(rng.below(v.len())),
            _ => {
                let i = rng.below(v.len() + 1);
                v.insert(i, rng.next() as u8);
            }
        }
    }
    v
}

fn run(name: &str, body: fn(&[u8]), iterations: usize) {
    let seeds = seeds(name);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ name.len() as u64);
    let mut inputs: Vec<Vec<u8>> = seeds.clone();
    inputs.push(Vec::new());
    for _ in 0..iterations {
        inputs.push(input(&mut rng, &seeds));
    }
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut failure = None;
    for data in &inputs {
        if catch_unwind(AssertUnwindSafe(|| body(data))).is_err() {
            failure = Some(data.clone());
            break;
        }
    }
    std::panic::set_hook(quiet);
    if let Some(data) = failure {
        // Run it again with the panic message shown.
        eprintln!("{name}: failing input ({} bytes): {data:02x?}", data.len());
        body(&data);
        unreachable!("{name}: the input failed once and not the second time");
    }
    println!(
        "{name}: {} inputs ({} seeds), no invariant violated",
        inputs.len(),
        seeds.len()
    );
}

fn iterations(default: usize) -> usize {
    std::env::var("FUZZ_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

macro_rules! corpus_test {
    ($name:ident, $default:expr) => {
        #[test]
        fn $name() {
            let (_, body) = TARGETS
                .iter()
                .find(|(n, _)| *n == stringify!($name))
                .expect("target exists");
            run(stringify!($name), *body, iterations($default));
        }
    };
}

corpus_test!(card_commands, 2000);
corpus_test!(packed_header, 1000);
corpus_test!(rpmb_frames, 3000);
corpus_test!(blk_chain, 3000);
corpus_test!(mmc_chain, 1000);
corpus_test!(model_toml, 500);

#[test]
fn every_target_has_a_test_and_seeds() {
    let tested = [
        "card_commands",
        "packed_header",
        "rpmb_frames",
        "blk_chain",
        "mmc_chain",
        "model_toml",
    ];
    for (name, _) in TARGETS {
        assert!(tested.contains(name), "{name} has no corpus test");
        assert!(!seeds(name).is_empty(), "{name} has no committed seeds");
    }
}
