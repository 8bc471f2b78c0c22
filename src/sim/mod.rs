//! The simulator: workloads run in card time through host → card → timing, without
//! sleeping and without data (the store is data-less), reporting throughput, latency and
//! the card's counters. The power-cut workload (`powercut`) is the exception: it keeps
//! data, on an image or in memory, to check what survives a power loss.

pub mod blkbench;
pub mod command;
pub mod compare;
pub mod device;
pub mod engine;
pub mod flashbench;
pub mod histogram;
pub mod plot;
pub mod powercut;
pub mod procs;
pub mod report;
pub mod trace;
pub mod workload;
