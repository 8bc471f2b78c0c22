//! `serve --cpu-latency-us`: a CPU latency request (Linux PM QoS) held while the daemon
//! serves.
//!
//! An idle CPU that has halted has to be woken before it runs anything, and on a virtual
//! machine that wake-up goes through the hypervisor: on the machine
//! docs/performance.md measured, a process sleeping on an eventfd took 11 µs to run again
//! after a 3 µs sleep and 22 µs after a 186 µs one, where the same process took 3 µs with
//! idle CPUs kept polling. A client that sleeps on its completions pays that on every
//! request, and the daemon's own pacing timer pays it too. Writing a latency limit to
//! `/dev/cpu_dma_latency` and keeping the file open asks cpuidle for no idle state whose
//! exit takes longer (0: idle CPUs poll); closing the file withdraws the request. The
//! request is system-wide and costs power. On that machine it also made memory written on
//! one vCPU cross to the other several times slower, far more often (the host placing the
//! two apart, most likely), and the daemon's large writes cross. So it is only made when
//! asked for.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The kernel's CPU latency request device.
pub const CPU_DMA_LATENCY: &str = "/dev/cpu_dma_latency";

/// A held CPU latency request.
#[derive(Debug)]
pub struct CpuLatencyRequest {
    /// The open request; the kernel drops the request when it is closed.
    _file: File,
    /// The latency asked for, in microseconds.
    pub us: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum CpuLatencyError {
    #[error("{path}: {source} (a CPU latency request needs write access to it: root, usually)")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: writing the request: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--cpu-latency-us {0}: at most {max} µs", max = i32::MAX)]
    OutOfRange(u32),
}

impl CpuLatencyRequest {
    /// Ask for a CPU wake-up latency of at most `us` microseconds until the returned
    /// request is dropped.
    pub fn hold(us: u32) -> Result<CpuLatencyRequest, CpuLatencyError> {
        Self::hold_at(Path::new(CPU_DMA_LATENCY), us)
    }

    /// As [`CpuLatencyRequest::hold`], on the request device at `path`.
    pub fn hold_at(path: &Path, us: u32) -> Result<CpuLatencyRequest, CpuLatencyError> {
        // The device takes one native-endian s32 (or a hex string); the binary form
        // leaves nothing to parse.
        let value = i32::try_from(us).map_err(|_| CpuLatencyError::OutOfRange(us))?;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|source| CpuLatencyError::Open {
                path: path.to_path_buf(),
                source,
            })?;
        file.write_all(&value.to_ne_bytes())
            .map_err(|source| CpuLatencyError::Write {
                path: path.to_path_buf(),
                source,
            })?;
        log::info!(
            "holding a CPU latency request of {us} µs ({}) while serving{}",
            path.display(),
            if us == 0 { ": idle CPUs poll" } else { "" }
        );
        Ok(CpuLatencyRequest { _file: file, us })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_one_native_s32() {
        // That the request is held while serving, and withdrawn at exit, is checked
        // against the kernel's device in tests/serve_socket.rs.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cpu_dma_latency");
        std::fs::write(&path, b"").unwrap();
        let held = CpuLatencyRequest::hold_at(&path, 20).unwrap();
        assert_eq!(held.us, 20);
        assert_eq!(std::fs::read(&path).unwrap(), 20i32.to_ne_bytes());
    }

    #[test]
    fn a_device_that_cannot_be_opened_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing");
        let err = CpuLatencyRequest::hold_at(&path, 0).unwrap_err();
        assert!(matches!(err, CpuLatencyError::Open { .. }), "{err}");
        assert!(err.to_string().contains("missing"), "{err}");
    }

    #[test]
    fn a_latency_beyond_an_s32_is_refused_before_anything_is_opened() {
        let err = CpuLatencyRequest::hold_at(Path::new("/nonexistent"), u32::MAX).unwrap_err();
        assert!(
            matches!(err, CpuLatencyError::OutOfRange(u32::MAX)),
            "{err}"
        );
    }
}
