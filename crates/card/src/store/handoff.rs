//! A copy handed to a helper thread that its owner can take back.
//!
//! The owner hands a copy into its own memory to a helper and later needs it done. If
//! the helper has not begun, the owner withdraws it and copies itself, so it never
//! sleeps waiting for a thread to wake up; if the copy is under way, the owner waits for
//! it (microseconds), so nothing is ever written into memory after the owner has moved
//! on. One `AtomicU8` per copy, shared by both threads, says where the copy stands.

use std::sync::atomic::{AtomicU8, Ordering};

/// Waiting for the helper.
pub(super) const QUEUED: u8 = 0;
/// The helper is copying it.
pub(super) const COPYING: u8 = 1;
pub(super) const COPIED: u8 = 2;
pub(super) const FAILED: u8 = 3;
/// The owner took it back before the helper began: the helper skips it.
pub(super) const WITHDRAWN: u8 = 4;

/// The helper claims a copy: true if it was still queued (it is now COPYING and the
/// helper must [`finish`] it), false if the owner withdrew it.
pub(super) fn begin(state: &AtomicU8) -> bool {
    state
        .compare_exchange(QUEUED, COPYING, Ordering::Acquire, Ordering::Relaxed)
        .is_ok()
}

/// The helper is done with a copy it [`begin`]s; its writes are visible to the owner
/// once the owner sees the new state.
pub(super) fn finish(state: &AtomicU8, ok: bool) {
    state.store(if ok { COPIED } else { FAILED }, Ordering::Release);
}

/// Wait while the copy is under way (a copy takes microseconds: spin, then yield).
fn wait_while_copying(state: &AtomicU8) -> u8 {
    let mut spins = 0u32;
    loop {
        let s = state.load(Ordering::Acquire);
        if s != COPYING {
            return s;
        }
        spins += 1;
        if spins < 1000 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// The owner takes a copy back: withdraw it if it has not begun, wait for it if it is
/// under way. Returns where it ends (WITHDRAWN, COPIED or FAILED); the helper no longer
/// touches the copy's memory.
pub(super) fn withdraw(state: &AtomicU8) -> u8 {
    match state.compare_exchange(QUEUED, WITHDRAWN, Ordering::Acquire, Ordering::Acquire) {
        Ok(_) => WITHDRAWN,
        Err(COPYING) => wait_while_copying(state),
        Err(s) => s,
    }
}

/// Whether the helper has dealt with the copy (tests: wait for the helper).
#[cfg(test)]
pub(super) fn settled(state: &AtomicU8) -> bool {
    !matches!(state.load(Ordering::Acquire), QUEUED | COPYING)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_either_the_helpers_or_the_owners_never_both() {
        // Withdrawn first: the helper may not begin.
        let s = AtomicU8::new(QUEUED);
        assert_eq!(withdraw(&s), WITHDRAWN);
        assert!(!begin(&s));
        // Begun first: the owner gets the helper's outcome, and only once it is final.
        let s = std::sync::Arc::new(AtomicU8::new(QUEUED));
        assert!(begin(&s));
        let helper = {
            let s = std::sync::Arc::clone(&s);
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(20));
                finish(&s, false);
            })
        };
        assert_eq!(withdraw(&s), FAILED);
        helper.join().unwrap();
        let s = AtomicU8::new(QUEUED);
        assert!(begin(&s));
        finish(&s, true);
        assert_eq!(withdraw(&s), COPIED);
        assert!(settled(&s));
    }
}
