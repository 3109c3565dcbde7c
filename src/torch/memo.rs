//! Values computed once and shared between threads: [`Memo`], a small cache by key (the analyses
//! of one snapshot ask for the same walk at the same peak; see `Releases`'s held walks and
//! `Analysis::peak_live`), and [`Claim`], one value made by whichever thread gets to it first
//! (the timeline, when the replay thread is idle before the main thread needs it).

use std::sync::{Arc, Condvar, Mutex};

/// Values by key, each computed by the first caller that asks (a linear scan: a memo holds a
/// handful of keys, a device's peak and OOMs). A cache, not state: it clones empty and compares
/// equal, so the types holding it keep their derives.
pub struct Memo<K, V>(Mutex<Vec<(K, Arc<V>)>>);

impl<K: PartialEq + Copy, V> Memo<K, V> {
    /// The value at `key`, computed with `make` if no caller has yet (two threads asking at once
    /// may both compute it; the values are equal).
    pub fn get_or(&self, key: K, make: impl FnOnce() -> V) -> Arc<V> {
        if let Ok(m) = self.0.lock()
            && let Some((_, v)) = m.iter().find(|(k, _)| *k == key)
        {
            return v.clone();
        }
        let v = Arc::new(make());
        if let Ok(mut m) = self.0.lock() {
            m.push((key, v.clone()));
        }
        v
    }

    pub fn clear(&self) {
        if let Ok(mut m) = self.0.lock() {
            m.clear();
        }
    }
}

impl<K, V> Default for Memo<K, V> {
    fn default() -> Self {
        Memo(Mutex::new(Vec::new()))
    }
}

impl<K, V> Clone for Memo<K, V> {
    fn clone(&self) -> Self {
        Memo::default()
    }
}

impl<K, V> PartialEq for Memo<K, V> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl<K, V> std::fmt::Debug for Memo<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Memo")
    }
}

/// One value that the thread that will use it, or a helper with nothing else to do, computes:
/// whichever claims it first (`help` never waits; `take` waits for a helper that is computing).
pub struct Claim<T> {
    state: Mutex<ClaimState<T>>,
    done: Condvar,
}

enum ClaimState<T> {
    Free,
    /// A helper is computing it.
    Helping,
    Made(T),
    /// Taken, or claimed by `take`.
    Gone,
}

impl<T> Default for Claim<T> {
    fn default() -> Self {
        Claim {
            state: Mutex::new(ClaimState::Free),
            done: Condvar::new(),
        }
    }
}

impl<T> Claim<T> {
    /// Compute the value with `make` unless another thread claimed it first.
    pub fn help(&self, make: impl FnOnce() -> T) {
        {
            let Ok(mut st) = self.state.lock() else {
                return;
            };
            if !matches!(*st, ClaimState::Free) {
                return;
            }
            *st = ClaimState::Helping;
        }
        // Whatever `make` does, the state leaves `Helping` (a panic makes it `Gone`, and `take`
        // then computes the value itself), so `take` never waits for good.
        struct Reset<'a, T>(&'a Claim<T>, Option<T>);
        impl<T> Drop for Reset<'_, T> {
            fn drop(&mut self) {
                let mut st = match self.0.state.lock() {
                    Ok(st) => st,
                    Err(e) => e.into_inner(),
                };
                *st = match self.1.take() {
                    Some(v) => ClaimState::Made(v),
                    None => ClaimState::Gone,
                };
                self.0.done.notify_all();
            }
        }
        let mut reset = Reset(self, None);
        reset.1 = Some(make());
    }

    /// Is a helper computing the value right now (so that `take` would wait for it)?
    pub fn helping(&self) -> bool {
        self.state
            .lock()
            .is_ok_and(|st| matches!(*st, ClaimState::Helping))
    }

    /// The value: the helper's (waiting while it computes it), else computed here with `make`.
    pub fn take(&self, make: impl FnOnce() -> T) -> T {
        let mut st = match self.state.lock() {
            Ok(st) => st,
            Err(_) => return make(),
        };
        loop {
            match std::mem::replace(&mut *st, ClaimState::Gone) {
                ClaimState::Helping => {
                    *st = ClaimState::Helping;
                    st = match self.done.wait(st) {
                        Ok(st) => st,
                        Err(_) => return make(),
                    };
                }
                ClaimState::Made(v) => return v,
                ClaimState::Free | ClaimState::Gone => {
                    drop(st);
                    return make();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_made_once_per_key_until_cleared() {
        let m: Memo<(i64, u64), u64> = Memo::default();
        let mut made = 0;
        for _ in 0..3 {
            assert_eq!(
                *m.get_or((0, 7), || {
                    made += 1;
                    70
                }),
                70
            );
        }
        assert_eq!(
            *m.get_or((1, 7), || {
                made += 1;
                71
            }),
            71
        );
        assert_eq!(made, 2);
        m.clear();
        assert_eq!(
            *m.get_or((0, 7), || {
                made += 1;
                72
            }),
            72
        );
        assert_eq!(made, 3);
    }

    #[test]
    fn a_claim_is_made_once_by_whoever_claims_it_first() {
        // Unclaimed: `take` makes it.
        let c: Claim<u32> = Claim::default();
        assert_eq!(c.take(|| 1), 1);
        // Taken: a helper no longer makes it.
        let mut helped = false;
        c.help(|| {
            helped = true;
            2
        });
        assert!(!helped);
        // A helper first: `take` gets its value, made once.
        let c: Claim<u32> = Claim::default();
        c.help(|| 3);
        assert_eq!(c.take(|| 4), 3);
        // A helper still at work: `take` waits for it.
        let c: Claim<u32> = Claim::default();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                c.help(|| {
                    tx.send(()).unwrap();
                    5
                })
            });
            rx.recv().unwrap();
            assert_eq!(c.take(|| 6), 5);
        });
        // A helper that panics: `take` makes the value itself.
        let c: Claim<u32> = Claim::default();
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            c.help(|| panic!("helper failed"))
        }));
        assert_eq!(c.take(|| 7), 7);
    }
}
