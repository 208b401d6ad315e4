//! Locking without poison recovery.
//!
//! The project's decision: a panic is a bug, and a storage process must not
//! carry on with an invariant that a panicking thread left half-updated. The
//! shipped binaries are built with `panic = "abort"` (root `Cargo.toml`,
//! `[profile.release]`), so a panic ends the process and no lock is ever seen
//! poisoned there. Poison can only be observed where panics unwind, that is
//! in tests; there, propagating it (instead of recovering the guard with
//! `PoisonError::into_inner`, or skipping the update with `if let Ok(..)`)
//! makes the test fail loudly at the first thread that touches the lock
//! after the bug.
//!
//! Every std `Mutex` and `RwLock` outside the target is locked through
//! [`lock`], [`read()`] and [`write()`].

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

const POISONED: &str = "lock poisoned: a thread panicked while holding it (a bug, propagated)";

/// Locks `m`; panics if a thread panicked while holding it.
#[track_caller]
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().expect(POISONED)
}

/// Takes `l` for reading; panics if a writer panicked while holding it.
#[track_caller]
pub fn read<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().expect(POISONED)
}

/// Takes `l` for writing; panics if a thread panicked while holding it.
#[track_caller]
pub fn write<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().expect(POISONED)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn locks_and_unlocks() {
        let m = Mutex::new(1);
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 2);
        let l = RwLock::new(1);
        *write(&l) += 1;
        assert_eq!(*read(&l), 2);
    }

    #[test]
    fn poison_propagates() {
        let m = Arc::new(Mutex::new(0));
        let m2 = Arc::clone(&m);
        let _ = std::thread::spawn(move || {
            let _g = lock(&m2);
            panic!("bug while holding the lock");
        })
        .join();
        let r = std::panic::catch_unwind(|| *lock(&m));
        assert!(r.is_err(), "a poisoned lock must not be recovered");
    }
}
