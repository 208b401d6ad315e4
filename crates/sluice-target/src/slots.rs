//! Per-namespace state that grows while the workers read it: a fixed
//! number of slots, each filled at most once, read without a lock.
//!
//! A namespace's index is handed out once and never reused, so its slot is
//! written once (when the namespace is built, at start or by a reload that
//! adds a subsystem) and read on every I/O after that. The capacity is the
//! target's namespace limit ([`sluice_config::NAMESPACES_TOTAL_MAX`]); an
//! empty slot costs one pointer.

use std::sync::OnceLock;

/// Fixed-capacity table of write-once entries, indexed by namespace index.
pub struct Slots<T> {
    slots: Box<[OnceLock<Box<T>>]>,
}

impl<T> Slots<T> {
    /// `capacity` empty slots.
    pub fn new(capacity: usize) -> Self {
        Slots {
            slots: (0..capacity).map(|_| OnceLock::new()).collect(),
        }
    }

    /// The entry at `index`, once it is set.
    pub fn get(&self, index: usize) -> Option<&T> {
        self.slots.get(index)?.get().map(|b| &**b)
    }

    /// Sets the entry at `index`; gives `value` back when the slot is
    /// taken or beyond the capacity.
    pub fn set(&self, index: usize, value: T) -> Result<(), T> {
        match self.slots.get(index) {
            Some(slot) => slot.set(Box::new(value)).map_err(|b| *b),
            None => Err(value),
        }
    }

    /// The entries set, with their indices, in index order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &T)> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.get().map(|b| (i, &**b)))
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Slots<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_set_once_and_read_back() {
        let s = Slots::new(4);
        assert_eq!(s.get(1), None);
        assert_eq!(s.set(1, "a"), Ok(()));
        assert_eq!(s.set(1, "b"), Err("b"), "set once");
        assert_eq!(s.get(1), Some(&"a"));
        assert_eq!(s.set(3, "c"), Ok(()));
        assert_eq!(s.set(4, "d"), Err("d"), "beyond the capacity");
        assert_eq!(s.get(4), None);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![(1, &"a"), (3, &"c")]);
    }

    #[test]
    fn readers_see_a_slot_another_thread_sets() {
        let s = std::sync::Arc::new(Slots::new(64));
        let w = {
            let s = s.clone();
            std::thread::spawn(move || {
                for i in 0..64 {
                    assert_eq!(s.set(i, i * 10), Ok(()));
                }
            })
        };
        let mut seen = 0;
        while seen < 64 {
            if let Some(v) = s.get(seen) {
                assert_eq!(*v, seen * 10);
                seen += 1;
            }
        }
        w.join().expect("writer");
    }
}
