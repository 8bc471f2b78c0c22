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

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The value the signaller writes to say it has finished (no real timestamp is 1 ns).
const STOP: u64 = 1;

/// `CLOCK_MONOTONIC` in nanoseconds: the same clock in both processes.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A new eventfd that a child process inherits (no `EFD_CLOEXEC`).
fn eventfd(flags: libc::c_int) -> std::io::Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers; a non-negative return is a new descriptor.
    let fd = unsafe { libc::eventfd(0, flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by eventfd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn write_u64(fd: RawFd, value: u64) -> std::io::Result<()> {
    let bytes = value.to_ne_bytes();
    // SAFETY: `bytes` is 8 readable bytes, as an eventfd write needs.
    let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
    if n != 8 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Read an eventfd's value; `None` if it is non-blocking and has none.
fn read_u64(fd: RawFd) -> std::io::Result<Option<u64>> {
    let mut bytes = [0u8; 8];
    // SAFETY: `bytes` is 8 writable bytes, as an eventfd read needs.
    let n = unsafe { libc::read(fd, bytes.as_mut_ptr().cast(), bytes.len()) };
    if n == 8 {
        return Ok(Some(u64::from_ne_bytes(bytes)));
    }
    let e = std::io::Error::last_os_error();
    if e.kind() == std::io::ErrorKind::WouldBlock {
        Ok(None)
    } else {
        Err(e)
    }
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
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Wake-up latencies (ns) of a process that slept `gap` each time, for about `seconds`.
pub fn probe(gap: Duration, seconds: f64) -> std::io::Result<Vec<u64>> {
    let ready = eventfd(0)?; // waiter -> signaller: about to sleep
    let go = eventfd(0)?; // signaller -> waiter: the time it was signalled
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
        write_u64(ready.as_raw_fd(), 1)?;
        while !ppoll_in(go.as_raw_fd())? {
            // No signal for a second: a signaller that has gone would leave us here.
            if let Some(status) = child.try_wait()? {
                return Err(std::io::Error::other(format!(
                    "the signaller exited with {status} before it finished"
                )));
            }
        }
        let woke = monotonic_ns();
        match read_u64(go.as_raw_fd())? {
            Some(STOP) => break,
            Some(sent) => late.push(woke.saturating_sub(sent)),
            None => {}
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
    // The waiter's descriptor is blocking; this side polls it without blocking.
    // SAFETY: F_SETFL on a descriptor inherited from the parent; no pointers.
    if unsafe { libc::fcntl(ready, libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
        return Err(format!("fd {ready}: {}", std::io::Error::last_os_error()));
    }
    let end = monotonic_ns() + (seconds * 1e9) as u64;
    let io = |e: std::io::Error| e.to_string();
    loop {
        // Spin until the waiter is about to sleep, as the daemon's device thread would be
        // busy with the request.
        while read_u64(ready).map_err(io)?.is_none() {
            std::hint::spin_loop();
        }
        let now = monotonic_ns();
        if now >= end {
            return write_u64(go, STOP).map_err(io);
        }
        let until = now + gap_ns;
        while monotonic_ns() < until {
            std::hint::spin_loop();
        }
        write_u64(go, monotonic_ns()).map_err(io)?;
    }
}
