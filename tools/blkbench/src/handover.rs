//! The machine's cross-CPU hand-over of freshly written memory, without a daemon.
//!
//! A large write goes through the daemon's device thread (guest memory into the card's
//! buffers and cache) and then its image writer on the other CPU, which reads what the
//! device thread has just written: each 128 KiB travels from one CPU's caches to the
//! other's. On a virtual machine how fast that goes depends on where the host has put the
//! two virtual CPUs at the moment, and it changes over time without the guest seeing it.
//! `ci/bench-vs-qsd.py` measures it here beside each large row, so that a slow stretch of
//! the row can be told apart from a slow daemon.
//!
//! A thread on the first CPU fills each buffer of a ring (copying `block` bytes into it),
//! a thread on the second copies each filled buffer out into a ring of its own, as the
//! device thread and the image writer do; the rate is the bytes the second thread took
//! per second. The reference is the copying out alone, of blocks just written on the same
//! CPU: the hand-over's rate over it says what crossing CPUs costs.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Buffers in flight between the two threads (the daemon's writer queue holds up to 64
/// such writes; a few are enough to keep both threads busy).
const RING: usize = 8;

/// The largest block measured: the probe holds `RING + SINK` of them (640 MiB at most).
const MAX_BLOCK: usize = 16 << 20;

/// Buffers the consumer copies into: a few times the ring, so its writes are not all in
/// one cache-hot buffer (the writer's destination is the image, not a reused buffer).
const SINK: usize = 32;

/// What the probe measured.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Rates {
    /// Bytes handed over (fill on the first CPU, copy out on the second) per second, GB/s.
    pub cross_cpu_gb_per_s: f64,
    /// The copying out alone, of blocks just written on the same CPU, GB/s: what the
    /// hand-over would reach if crossing CPUs cost nothing (the consumer's copy is the
    /// slower of the two, so it sets the hand-over's pace).
    pub same_cpu_gb_per_s: f64,
}

/// Pin the calling thread to `cpu`.
fn pin(cpu: usize) -> io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it (cpu is
    // checked against CPU_SETSIZE); sched_setaffinity reads `size_of::<cpu_set_t>()` bytes
    // of it, and pid 0 is the calling thread.
    unsafe {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(io::Error::other(format!("CPU {cpu} is out of range")));
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The first two CPUs this process may run on.
fn two_cpus() -> io::Result<(usize, usize)> {
    // SAFETY: as in `pin`; sched_getaffinity writes at most `size_of::<cpu_set_t>()`
    // bytes into `set`, and CPU_ISSET reads inside it.
    let cpus: Vec<usize> = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(io::Error::last_os_error());
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .take(2)
            .collect()
    };
    match cpus[..] {
        [a, b] => Ok((a, b)),
        _ => Err(io::Error::other(
            "the hand-over probe needs two CPUs to run on",
        )),
    }
}

/// A ring slot: its buffer and whether it holds a block the consumer has not taken.
struct Slot {
    full: AtomicBool,
    buf: Mutex<Vec<u8>>,
}

/// Spin until `slot.full` is `want`, or `stop` is set (false then).
fn wait_for(slot: &Slot, want: bool, stop: &AtomicBool) -> bool {
    while slot.full.load(Ordering::Acquire) != want {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        std::hint::spin_loop();
    }
    true
}

fn lock(buf: &Mutex<Vec<u8>>) -> std::sync::MutexGuard<'_, Vec<u8>> {
    buf.lock().unwrap_or_else(|p| p.into_inner())
}

/// Hand `block`-byte buffers from the first CPU to the second for `seconds`; GB/s.
fn cross_cpu(block: usize, seconds: f64, (a, b): (usize, usize)) -> io::Result<f64> {
    let slots: Vec<Slot> = (0..RING)
        .map(|_| Slot {
            full: AtomicBool::new(false),
            buf: Mutex::new(vec![0u8; block]),
        })
        .collect();
    let stop = AtomicBool::new(false);
    let duration = Duration::from_secs_f64(seconds);
    std::thread::scope(|s| {
        let producer = s.spawn(|| -> io::Result<()> {
            if let Err(e) = pin(a) {
                stop.store(true, Ordering::Relaxed);
                return Err(e);
            }
            let src = vec![0x5Au8; block];
            for i in 0.. {
                let slot = &slots[i % RING];
                if !wait_for(slot, false, &stop) {
                    break;
                }
                lock(&slot.buf).copy_from_slice(&src);
                slot.full.store(true, Ordering::Release);
            }
            Ok(())
        });
        let consumer = s.spawn(|| -> io::Result<f64> {
            let pinned = pin(b);
            let result = pinned.map(|()| {
                let mut sink = vec![0u8; block * SINK];
                let start = Instant::now();
                let mut taken = 0u64;
                while start.elapsed() < duration {
                    let slot = &slots[taken as usize % RING];
                    if !wait_for(slot, true, &stop) {
                        break;
                    }
                    let at = (taken as usize % SINK) * block;
                    sink[at..at + block].copy_from_slice(&lock(&slot.buf));
                    slot.full.store(false, Ordering::Release);
                    taken += 1;
                }
                (taken * block as u64) as f64 / start.elapsed().as_secs_f64() / 1e9
            });
            stop.store(true, Ordering::Relaxed);
            result
        });
        // The consumer sets `stop` on every way out, so the producer ends too.
        let rate = consumer.join().expect("the consumer does not panic");
        producer.join().expect("the producer does not panic")?;
        rate
    })
}

/// The consumer's copy without the crossing: each block is written on this CPU and then
/// copied out on it, and only the copying out is timed; GB/s.
fn same_cpu(block: usize, seconds: f64, cpu: usize) -> io::Result<f64> {
    std::thread::scope(|s| {
        s.spawn(|| -> io::Result<f64> {
            pin(cpu)?;
            let src = vec![0x5Au8; block];
            let mut ring = vec![0u8; block * RING];
            let mut sink = vec![0u8; block * SINK];
            let start = Instant::now();
            let duration = Duration::from_secs_f64(seconds);
            let mut copying = Duration::ZERO;
            let mut done = 0u64;
            while start.elapsed() < duration {
                let r = (done as usize % RING) * block;
                let k = (done as usize % SINK) * block;
                ring[r..r + block].copy_from_slice(&src);
                let t = Instant::now();
                sink[k..k + block].copy_from_slice(&ring[r..r + block]);
                copying += t.elapsed();
                done += 1;
            }
            Ok((done * block as u64) as f64 / copying.as_secs_f64().max(1e-9) / 1e9)
        })
        .join()
        .expect("the copying thread does not panic")
    })
}

/// Measure both rates, `seconds` each, for blocks of `block` bytes.
pub fn probe(block: usize, seconds: f64) -> io::Result<Rates> {
    if block == 0 || !(seconds.is_finite() && seconds > 0.0) {
        return Err(io::Error::other(format!(
            "a block of {block} bytes for {seconds} s is nothing to measure"
        )));
    }
    if block > MAX_BLOCK {
        return Err(io::Error::other(format!(
            "a block of {block} bytes is over the {MAX_BLOCK} the probe copies \
             (it holds {} of them)",
            RING + SINK
        )));
    }
    let cpus = two_cpus()?;
    Ok(Rates {
        cross_cpu_gb_per_s: cross_cpu(block, seconds, cpus)?,
        same_cpu_gb_per_s: same_cpu(block, seconds, cpus.0)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_to_measure_is_refused() {
        assert!(probe(0, 1.0).is_err());
        assert!(probe(4096, 0.0).is_err());
        assert!(probe(4096, f64::NAN).is_err());
        let too_big = probe(MAX_BLOCK + 1, 1.0).unwrap_err().to_string();
        assert!(too_big.contains("is over"), "{too_big}");
    }
}
