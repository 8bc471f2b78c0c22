//! The timer thread: runs the device's events in card time and sets the line after each.
//!
//! It never sleeps holding the lock. Under the lock it runs what is due and reads the
//! device's next event; unlocked, it waits on an epoll set for the earliest of: the
//! timerfd armed a margin before that event's wall-clock instant (then it spins the rest,
//! as the blk transport's pacing does), the session's wake eventfd (the message thread
//! saw a sooner event, or the session is ending), and the client's unmask eventfd if it
//! registered one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vmm_sys_util::epoll::{ControlOperation, EpollEvent, EventSet};
use vmm_sys_util::timerfd::TimerFd;

use super::device::PciMmio;
use super::function::{Function, Session, TIMER, UNMASK, WAKE};
use super::intx::set_nonblocking;
use super::session_times::TimerTimes;
use crate::pacing::{Pacing, SpinMargin};

/// Start the timer thread of one session.
pub(crate) fn spawn<D: PciMmio>(
    function: Arc<Function<D>>,
    session: Arc<Session>,
    spin: SpinMargin,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let timer = TimerFd::new()?;
    set_nonblocking(&timer)?;
    session.epoll.ctl(
        ControlOperation::Add,
        std::os::fd::AsRawFd::as_raw_fd(&timer),
        EpollEvent::new(EventSet::IN, TIMER),
    )?;
    std::thread::Builder::new()
        .name("pci-timer".into())
        .spawn(move || {
            let run = std::panic::AssertUnwindSafe(|| run(&function, &session, timer, spin));
            if std::panic::catch_unwind(run).is_err() {
                log::error!(
                    "the device model panicked on the timer thread: its events stop until \
                     the client reconnects"
                );
            }
        })
}

/// What the thread waits for after a pass under the lock.
enum Wait {
    /// Until woken.
    Idle,
    /// The wall instant of the next event.
    Until(Instant),
    /// Go round again at once (`--timing off` ran an event; let the message thread in).
    Again,
}

fn run<D: PciMmio>(
    function: &Function<D>,
    session: &Session,
    mut timer: TimerFd,
    mut spin: SpinMargin,
) {
    // Measured outside the lock, added to the session's under it at each pass.
    let mut times = TimerTimes {
        margin: spin.get(),
        ..TimerTimes::default()
    };
    let mut events = [EpollEvent::default(); 4];
    while !session.stop.load(std::sync::atomic::Ordering::SeqCst) {
        let wait = pass(function, &mut times);
        let mut armed_at = None;
        let due = match wait {
            Wait::Again => {
                std::thread::yield_now();
                continue;
            }
            Wait::Idle => {
                let _ = timer.clear();
                None
            }
            Wait::Until(due) => {
                let now = Instant::now();
                let sleep = due
                    .saturating_duration_since(now)
                    .saturating_sub(spin.get())
                    .max(Duration::from_nanos(1));
                if let Err(e) = timer.reset(sleep, None) {
                    log::error!("arming the PCI timer: {e}");
                }
                armed_at = Some(now + sleep);
                Some(due)
            }
        };
        let n = match session.epoll.wait(-1, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                log::error!("the PCI timer thread's epoll: {e}");
                break;
            }
        };
        for ev in &events[..n] {
            match ev.data() {
                WAKE => {
                    let _ = session.wake.read();
                }
                TIMER => {
                    let expired = timer.wait().is_ok_and(|n| n > 0);
                    if let Some(at) = armed_at.take().filter(|_| expired) {
                        let woke = Instant::now();
                        let late = woke.saturating_duration_since(at);
                        spin.observe(late);
                        times.woke(late);
                        times.margin = spin.get();
                        if let Some(due) = due {
                            while Instant::now() < due {
                                std::hint::spin_loop();
                            }
                            times.spun += due.saturating_duration_since(woke);
                        }
                    }
                }
                UNMASK => {
                    let mut inner = function.lock();
                    if inner.intx.take_unmask_event() {
                        inner.intx.unmask();
                        inner.update_intx();
                    }
                }
                _ => {}
            }
        }
    }
    function.lock().timer_times.take_from(&mut times);
}

/// One pass under the lock: run what is due, say what to wait for.
fn pass<D: PciMmio>(function: &Function<D>, times: &mut TimerTimes) -> Wait {
    let mut inner = function.lock();
    inner.timer_times.take_from(times);
    let Some(next) = inner.device.next_event() else {
        inner.armed = None;
        return Wait::Idle;
    };
    match inner.time.pacing() {
        Pacing::Off => {
            let now = inner.time.reach(next);
            inner.advance(now);
            inner.stats.timer_events += 1;
            inner.armed = None;
            Wait::Again
        }
        Pacing::Realtime { .. } => {
            // Card time starts with the session's first message; before it nothing is due.
            let Some(clock) = inner.time.clock() else {
                inner.armed = None;
                return Wait::Idle;
            };
            let now = inner.time.now();
            if next <= now {
                inner.advance(now);
                inner.stats.timer_events += 1;
                inner.armed = None;
                return Wait::Again;
            }
            inner.armed = Some(next);
            Wait::Until(clock.wall_at(next))
        }
    }
}
