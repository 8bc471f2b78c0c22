//! emmc-sim: the simulator. Workloads run in card time through host → card → timing,
//! without sleeping and without data (the store is data-less), reporting throughput,
//! latency and the card's counters. The power-cut workload (`powercut`) is the exception:
//! it keeps data, on an image or in memory, to check what survives a power loss.
//!
//! It depends on the card and host crates and on plotting and terminal crates; never on
//! the frontends, vhost, virtio or guest memory. Nothing below it depends on it: the
//! `vhost-user-emmc` binary is its only user besides its tests and benchmark.
//!
//! - `command`: `simulate`; `compare` (every model × policy side by side) and `plot`;
//! - `device`: `CardDevice`, the direct path (one MMC request per block request);
//! - `workload`, `engine`, `procs`, `blkbench`: closed-loop workloads and the processes
//!   that feed the block driver in card time (seed 000's and 004's experiments);
//! - `flashbench`: flashbench's procedures (seed 003);
//! - `fidelity`: every seed figure as a row, measured and held to its tolerance
//!   (`vhost-user-emmc fidelity`, docs/fidelity.md);
//! - `powercut`: power cuts at seeded instants, checked against what the spec promises;
//! - `report`: what a run prints; `selfcheck`: `vhost-user-emmc selfcheck`.

pub mod blkbench;
pub mod command;
pub mod compare;
pub mod device;
pub mod engine;
pub mod fidelity;
pub mod flashbench;
pub mod plot;
pub mod powercut;
pub mod procs;
pub mod report;
pub mod selfcheck;
pub mod workload;
