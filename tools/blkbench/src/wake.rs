//! The machine's wake-up, without a daemon: how long after an eventfd is signalled does a
//! process that sleeps on it run again, when it has slept for a given gap?
//!
//! A client that sleeps on its completions (blkbench without `--poll`, and any guest
//! driver) pays this on every request, and on a virtual machine it grows with the length
//! of the sleep: a CPU that has been idle longer is woken more slowly. Pacing makes the
//! client sleep for the card's time instead of the daemon's few microseconds, so part of
//! what pacing seems to add to a sleeping client's round trip is this growth, and belongs
//! to the machine. `ci/bench-vs-qsd.py` measures it here at the two gaps of each row and
//! reports what is left for the daemon.
//!
//! The waiter is this process and waits as libblkio's completion wait does: `ppoll` on the
//! eventfd, then `read`. The signaller is a second process (this binary again, with
//! `--wake-signaller`), like the daemon: it spins until the waiter has said it is going to
//! sleep, spins for the gap, and writes the current `CLOCK_MONOTONIC` time into the
//! eventfd. The waiter reads that time back as the eventfd's value, so no memory is shared.

use std::io::ErrorKind;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::process::{Command, Stdio};
use std::time::Duration;

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// The value the signaller writes to say it has finished (no real timestamp is 1 ns).
const STOP: u64 = 1;

/// `CLOCK_MONOTONIC` in nanoseconds: the same clock in both processes.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sleep until `fd` is readable, as libblkio's `wait_for_completion_fd` does; `false`
/// if a second passed first (the signaller may have died).
fn ppoll_in(fd: RawFd) -> std::io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let second = libc::timespec {
        tv_sec: 1,
        tv_nsec: 0,
    };
    loop {
        // SAFETY: one valid pollfd and a valid timespec, both living across the call; no
        // signal mask (null).
        let ret = unsafe { libc::ppoll(&mut pfd, 1, &second, std::ptr::null()) };
        if ret >= 0 {
            return Ok(ret > 0);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Wake-up latencies (ns) of a process that slept `gap` each time, for about `seconds`.
pub fn probe(gap: Duration, seconds: f64) -> std::io::Result<Vec<u64>> {
    // Both are inherited by the signaller (no EFD_CLOEXEC). `ready` is non-blocking for
    // the signaller's spin; this side only writes it, and a count of 1 never blocks.
    let ready = EventFd::new(EFD_NONBLOCK)?; // waiter -> signaller: about to sleep
    let go = EventFd::new(0)?; // signaller -> waiter: the time it was signalled
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .arg("--wake-signaller")
        .arg(format!(
            "{},{},{},{}",
            ready.as_raw_fd(),
            go.as_raw_fd(),
            gap.as_nanos(),
            seconds
        ))
        .stdin(Stdio::null())
        .spawn()?;
    let mut late = Vec::with_capacity((seconds * 1e6 / (gap.as_micros() as f64 + 20.0)) as usize);
    loop {
        ready.write(1)?;
        while !ppoll_in(go.as_raw_fd())? {
            // No signal for a second: a signaller that has gone would leave us here.
            if let Some(status) = child.try_wait()? {
                return Err(std::io::Error::other(format!(
                    "the signaller exited with {status} before it finished"
                )));
            }
        }
        let woke = monotonic_ns();
        match go.read()? {
            STOP => break,
            sent => late.push(woke.saturating_sub(sent)),
        }
    }
    let status = child.wait()?;
    if !status.success() {
        return Err(std::io::Error::other(format!(
            "the signaller exited with {status}"
        )));
    }
    Ok(late)
}

/// The signaller's side (`--wake-signaller READY,GO,GAP_NS,SECONDS`): the daemon's part.
pub fn signaller(spec: &str) -> Result<(), String> {
    let bad = || format!("--wake-signaller {spec:?}: expected READY_FD,GO_FD,GAP_NS,SECONDS");
    let parts: Vec<&str> = spec.split(',').collect();
    let [ready, go, gap_ns, seconds] = parts[..] else {
        return Err(bad());
    };
    let ready: RawFd = ready.parse().map_err(|_| bad())?;
    let go: RawFd = go.parse().map_err(|_| bad())?;
    let gap_ns: u64 = gap_ns.parse().map_err(|_| bad())?;
    let seconds: f64 = seconds.parse().map_err(|_| bad())?;
    // SAFETY: descriptors inherited from the parent (`probe`), which nothing else in
    // this process owns; each is owned once, here.
    let (ready, go) = unsafe { (EventFd::from_raw_fd(ready), EventFd::from_raw_fd(go)) };
    let end = monotonic_ns() + (seconds * 1e9) as u64;
    let io = |e: std::io::Error| e.to_string();
    loop {
        // Spin until the waiter is about to sleep, as the daemon's device thread would be
        // busy with the request.
        loop {
            match ready.read() {
                Ok(_) => break,
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) => return Err(io(e)),
            }
        }
        let now = monotonic_ns();
        if now >= end {
            return go.write(STOP).map_err(io);
        }
        let until = now + gap_ns;
        while monotonic_ns() < until {
            std::hint::spin_loop();
        }
        go.write(monotonic_ns()).map_err(io)?;
    }
}
