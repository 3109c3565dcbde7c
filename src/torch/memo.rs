//! A small cache of values computed once per key and shared between threads (the analyses of one
//! snapshot ask for the same walk at the same peak; see `Releases`'s held walks and
//! `Analysis::peak_live`).

use std::sync::{Arc, Mutex};

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
}
