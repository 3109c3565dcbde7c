//! The allocator settings that change what the caching allocator does, and its size rules.

use serde::Serialize;

use crate::torch::model::AllocatorSettings;

/// Requests up to 1 MiB come from the small pool.
pub use crate::torch::model::SMALL_SIZE;
/// Every block size is a multiple of 512 B.
pub const MIN_BLOCK: u64 = 512;
/// Small-pool segments (and small expandable pages) are 2 MiB.
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Requests between 1 and 10 MiB get a 20 MiB segment; large expandable pages are 20 MiB.
pub const LARGE_BUFFER: u64 = 20 << 20;
/// From 10 MiB on, a segment is the request rounded up to 2 MiB.
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Rounding of large segments.
pub const ROUND_LARGE: u64 = 2 << 20;
/// Number of `roundup_power2_divisions` intervals (1 MiB … 32 GiB and above).
pub const ROUNDUP_INTERVALS: usize = 16;

/// The settings the model follows (`PYTORCH_CUDA_ALLOC_CONF`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Settings {
    pub expandable_segments: bool,
    /// Bytes; `u64::MAX` = unlimited (the default).
    pub max_split_size: u64,
    /// `max_non_split_rounding_mb` in bytes (default 20 MiB): how much larger than an oversize
    /// request a cached oversize block may be and still be handed out whole.
    pub max_non_split_rounding: u64,
    /// Divisions per interval (see [`AllocatorSettings::roundup_power2_divisions`]); 0 = none.
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            expandable_segments: false,
            max_split_size: u64::MAX,
            max_non_split_rounding: LARGE_BUFFER,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
        }
    }
}

impl Settings {
    /// The settings recorded in a snapshot (2.3+); `None` when the file has none.
    pub fn from_recorded(s: &AllocatorSettings) -> Settings {
        let mut out = Settings {
            expandable_segments: s.expandable_segments.unwrap_or(false),
            max_split_size: s.max_split_size.unwrap_or(u64::MAX),
            ..Settings::default()
        };
        if let Some(d) = &s.roundup_power2_divisions {
            for (slot, v) in out.roundup_power2_divisions.iter_mut().zip(d) {
                *slot = *v;
            }
        }
        // Not recorded as its own key: read it from the settings string.
        if let Some(conf) = &s.conf {
            for (k, v) in conf_pairs(conf) {
                if k == "max_non_split_rounding_mb"
                    && let Ok(mb) = v.parse::<u64>()
                {
                    out.max_non_split_rounding = mb.max(LARGE_BUFFER >> 20).saturating_mul(1 << 20);
                }
            }
        }
        out
    }

    /// Apply one `key:value` of `PYTORCH_CUDA_ALLOC_CONF` (`expandable_segments:True`,
    /// `max_split_size_mb:N`, `max_non_split_rounding_mb:N`, `roundup_power2_divisions:N` or
    /// `roundup_power2_divisions:[256:4,>:8]`). `false` when the key or value is not understood.
    pub fn apply(&mut self, key: &str, value: &str) -> bool {
        match key.trim() {
            "expandable_segments" => match value.trim() {
                "True" => self.expandable_segments = true,
                "False" => self.expandable_segments = false,
                _ => return false,
            },
            "max_split_size_mb" => match value.trim().parse::<u64>() {
                // PyTorch refuses values below 20 MiB.
                Ok(mb) if mb >= LARGE_BUFFER >> 20 => {
                    self.max_split_size = mb.saturating_mul(1 << 20)
                }
                _ => return false,
            },
            "max_non_split_rounding_mb" => match value.trim().parse::<u64>() {
                Ok(mb) if mb >= LARGE_BUFFER >> 20 => {
                    self.max_non_split_rounding = mb.saturating_mul(1 << 20)
                }
                _ => return false,
            },
            "roundup_power2_divisions" => return self.apply_divisions(value.trim()),
            _ => return false,
        }
        true
    }

    fn apply_divisions(&mut self, v: &str) -> bool {
        let ok = |d: u64| d == 0 || d.is_power_of_two();
        if let Some(inner) = v.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            let mut out = [0u64; ROUNDUP_INTERVALS];
            let mut first = true;
            let mut last = 0usize;
            for item in inner.split(',').filter(|s| !s.trim().is_empty()) {
                let Some((k, d)) = item.split_once(':') else {
                    return false;
                };
                let Ok(d) = d.trim().parse::<u64>() else {
                    return false;
                };
                if !ok(d) {
                    return false;
                }
                if k.trim() == ">" {
                    out[last..].iter_mut().for_each(|s| *s = d);
                    continue;
                }
                let Ok(mb) = k.trim().parse::<u64>() else {
                    return false;
                };
                if !mb.is_power_of_two() {
                    return false;
                }
                let i = (mb.trailing_zeros() as usize).min(ROUNDUP_INTERVALS - 1);
                if first {
                    out[..i].iter_mut().for_each(|s| *s = d);
                    first = false;
                }
                out[i] = d;
                last = i;
            }
            self.roundup_power2_divisions = out;
            true
        } else {
            match v.parse::<u64>() {
                Ok(d) if d.is_power_of_two() => {
                    self.roundup_power2_divisions = [d; ROUNDUP_INTERVALS];
                    true
                }
                _ => false,
            }
        }
    }

    /// Divisions for a request of `size` bytes.
    fn divisions(&self, size: u64) -> u64 {
        let log = 63 - size.max(1).leading_zeros() as i64;
        let idx = (log - 20).clamp(0, ROUNDUP_INTERVALS as i64 - 1) as usize;
        self.roundup_power2_divisions[idx]
    }

    /// `round_size`: the block size a request of `size` bytes gets.
    pub fn round_size(&self, size: u64) -> u64 {
        if size < MIN_BLOCK {
            return MIN_BLOCK;
        }
        let div = self.divisions(size);
        if div > 1 && size > MIN_BLOCK.saturating_mul(div) {
            return roundup_power2_next_division(size, div);
        }
        round_up(size, MIN_BLOCK)
    }

    /// `should_split`: is the rest of a `block` bytes block, handed out for `size`, cut off?
    pub fn should_split(&self, small_pool: bool, block: u64, size: u64) -> bool {
        let remaining = block.saturating_sub(size);
        if small_pool || self.expandable_segments {
            remaining >= MIN_BLOCK
        } else {
            size < self.max_split_size && remaining > SMALL_SIZE
        }
    }
}

/// `get_allocation_size`: the segment a request of `size` (rounded) bytes makes the allocator ask for.
pub fn allocation_size(size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        round_up(size, ROUND_LARGE)
    }
}

/// `size` rounded up to a multiple of `to` (saturating at the largest multiple).
pub fn round_up(size: u64, to: u64) -> u64 {
    match size.checked_next_multiple_of(to) {
        Some(v) => v,
        None => u64::MAX - u64::MAX % to,
    }
}

fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor.saturating_mul(2);
    }
    let down = size & !(step - 1);
    if down == size {
        size
    } else {
        down.saturating_add(step)
    }
}

/// `key:value` pairs of a settings string (`a:b,c:[d:e,f:g]` keeps the bracketed value whole).
pub fn conf_pairs(conf: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut start = 0usize;
    let bytes = conf.as_bytes();
    let mut push = |s: &str| {
        if let Some((k, v)) = s.split_once(':') {
            out.push((k.trim().to_string(), v.trim().to_string()));
        }
    };
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'[' => depth += 1,
            b']' => depth = depth.saturating_sub(1),
            b',' if depth == 0 => {
                push(&conf[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    push(&conf[start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_size_follows_512_and_power2_divisions() {
        let s = Settings::default();
        assert_eq!(s.round_size(0), 512);
        assert_eq!(s.round_size(1), 512);
        assert_eq!(s.round_size(513), 1024);
        assert_eq!(s.round_size(u64::MAX), u64::MAX - u64::MAX % 512);
        let mut s = Settings::default();
        assert!(s.apply("roundup_power2_divisions", "4"));
        // 1200 B: below 512*4, plain rounding.
        assert_eq!(s.round_size(1200), 1536);
        // 1.2 MiB with 4 divisions between 1 and 2 MiB: 1.25 MiB.
        assert_eq!(s.round_size(1_258_291), 1_310_720);
        assert_eq!(s.round_size(1 << 21), 1 << 21);
        assert_eq!(s.round_size(u64::MAX), u64::MAX, "saturates");
        // As PyTorch parses it: the first value also fills the smaller intervals, `>` fills
        // from the last named interval on.
        assert!(s.apply("roundup_power2_divisions", "[64:2,256:4,>:8]"));
        assert_eq!(s.divisions(1 << 20), 2);
        assert_eq!(s.divisions(100 << 20), 2);
        assert_eq!(s.divisions(300 << 20), 8);
        assert!(!s.apply("roundup_power2_divisions", "3"));
        assert!(
            !s.apply("max_split_size_mb", "10"),
            "PyTorch's minimum is 20"
        );
    }

    #[test]
    fn split_rules_and_segment_sizes() {
        let s = Settings::default();
        assert!(s.should_split(true, 2 << 20, (2 << 20) - 512));
        assert!(!s.should_split(true, 1024, 1024));
        assert!(
            !s.should_split(false, 3 << 20, 2 << 20),
            "1 MiB left: not > 1 MiB"
        );
        assert!(s.should_split(false, (3 << 20) + 512, 2 << 20));
        let mut m = Settings::default();
        assert!(m.apply("max_split_size_mb", "64"));
        assert!(
            !m.should_split(false, 200 << 20, 64 << 20),
            "oversize requests are not split"
        );
        let mut e = Settings::default();
        assert!(e.apply("expandable_segments", "True"));
        assert!(e.should_split(false, (2 << 20) + 512, 2 << 20));
        assert_eq!(allocation_size(512), 2 << 20);
        assert_eq!(allocation_size((1 << 20) + 512), 20 << 20);
        assert_eq!(allocation_size((10 << 20) + 512), 12 << 20);
        assert_eq!(allocation_size(u64::MAX), u64::MAX - u64::MAX % (2 << 20));
        assert_eq!(
            conf_pairs("expandable_segments:True,roundup_power2_divisions:[256:4,>:8]"),
            vec![
                ("expandable_segments".into(), "True".into()),
                ("roundup_power2_divisions".into(), "[256:4,>:8]".into())
            ]
        );
    }
}
