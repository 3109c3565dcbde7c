//! Findings follow edits: where each line of a file's text went in a newer text.
//!
//! A finding is placed on the line the capture recorded, in the text the file had when the
//! finding was indexed (its *base*). When the user edits, the line moves: [`LineMap::between`]
//! aligns the two texts line by line (common prefix and suffix, then a longest common
//! subsequence of the changed middle). Unchanged lines follow their text. A line edited in place
//! (a changed run of lines replaced by as many lines) keeps its place, so typing on a finding's
//! line does not make it flicker away (its quick fix says when it no longer applies, and a fix
//! already in the text withdraws it); a line cut and pasted elsewhere follows its text when that
//! text is unique. A deleted line maps to nothing and its finding is withdrawn until the text
//! comes back (undo): the map is always computed from the base, never from the previous edit, so
//! it is stateless and reversible.

/// Above this many cells (changed old lines × changed new lines) the middle is aligned by
/// lines whose text is unique on both sides instead of the full LCS (a reformat of a whole
/// 5000-line file would need 25 M cells).
const LCS_CELLS: usize = 4 << 20;

/// Old line → new line, 1-based, for the lines of an old text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LineMap {
    /// `to_new[i]` is where old line `i + 1` is now (1-based), if it is still there.
    to_new: Vec<Option<u32>>,
    /// True when nothing moved and nothing changed.
    identity: bool,
}

impl LineMap {
    /// Align `old` with `new`.
    pub fn between(old: &str, new: &str) -> LineMap {
        let a: Vec<&str> = old.lines().collect();
        let b: Vec<&str> = new.lines().collect();
        if a == b {
            return LineMap {
                to_new: (1..=a.len() as u32).map(Some).collect(),
                identity: true,
            };
        }
        let mut to_new = vec![None; a.len()];
        let prefix = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        let max_suffix = a.len().min(b.len()) - prefix;
        let suffix = a
            .iter()
            .rev()
            .zip(b.iter().rev())
            .take(max_suffix)
            .take_while(|(x, y)| x == y)
            .count();
        for (i, slot) in to_new.iter_mut().enumerate().take(prefix) {
            *slot = Some(i as u32 + 1);
        }
        for k in 0..suffix {
            to_new[a.len() - 1 - k] = Some((b.len() - k) as u32);
        }
        let (am, bm) = (&a[prefix..a.len() - suffix], &b[prefix..b.len() - suffix]);
        let pairs = if am.len().saturating_mul(bm.len()) <= LCS_CELLS {
            lcs(am, bm)
        } else {
            unique_pairs(am, bm)
        };
        for &(i, j) in &pairs {
            to_new[prefix + i] = Some((prefix + j) as u32 + 1);
        }
        // Between two matched lines: a run replaced by as many lines was edited in place.
        let mut taken = vec![false; bm.len()];
        for &(_, j) in &pairs {
            taken[j] = true;
        }
        let mut prev = (0usize, 0usize);
        for &(i, j) in pairs.iter().chain(std::iter::once(&(am.len(), bm.len()))) {
            let (gi, gj) = (i - prev.0, j - prev.1);
            if gi == gj {
                for k in 0..gi {
                    to_new[prefix + prev.0 + k] = Some((prefix + prev.1 + k) as u32 + 1);
                    taken[prev.1 + k] = true;
                }
            }
            prev = (i + 1, j + 1);
        }
        // A line still unplaced whose text is now on exactly one unplaced new line moved there.
        let mut free: std::collections::HashMap<&str, Option<usize>> = Default::default();
        for (j, l) in bm.iter().enumerate().filter(|(j, _)| !taken[*j]) {
            free.entry(l).and_modify(|e| *e = None).or_insert(Some(j));
        }
        for (i, l) in am.iter().enumerate() {
            if to_new[prefix + i].is_none() && !l.trim().is_empty() {
                if let Some(Some(j)) = free.get(l) {
                    to_new[prefix + i] = Some((prefix + j) as u32 + 1);
                }
            }
        }
        LineMap {
            to_new,
            identity: false,
        }
    }

    /// Where old line `line` (1-based) is now, if its text is still there.
    pub fn new_line(&self, line: u32) -> Option<u32> {
        if self.identity {
            return Some(line);
        }
        self.to_new
            .get((line as usize).checked_sub(1)?)
            .copied()
            .flatten()
    }

    pub fn is_identity(&self) -> bool {
        self.identity
    }
}

/// Matched `(i, j)` index pairs of a longest common subsequence of lines.
fn lcs(a: &[&str], b: &[&str]) -> Vec<(usize, usize)> {
    let (n, m) = (a.len(), b.len());
    if n == 0 || m == 0 {
        return Vec::new();
    }
    // len[i][j]: LCS length of a[i..] and b[j..], row-major (n + 1) × (m + 1).
    let w = m + 1;
    let mut len = vec![0u32; (n + 1) * w];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            len[i * w + j] = if a[i] == b[j] {
                len[(i + 1) * w + j + 1] + 1
            } else {
                len[(i + 1) * w + j].max(len[i * w + j + 1])
            };
        }
    }
    let mut out = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n && j < m {
        if a[i] == b[j] {
            out.push((i, j));
            i += 1;
            j += 1;
        } else if len[(i + 1) * w + j] >= len[i * w + j + 1] {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// Lines that occur exactly once on each side, kept in order (a longest increasing run of
/// their new positions), for middles too large for [`lcs`].
fn unique_pairs(a: &[&str], b: &[&str]) -> Vec<(usize, usize)> {
    use std::collections::HashMap;
    let mut count: HashMap<&str, (u32, u32, usize, usize)> = HashMap::new();
    for (i, l) in a.iter().enumerate() {
        let e = count.entry(l).or_insert((0, 0, 0, 0));
        e.0 += 1;
        e.2 = i;
    }
    for (j, l) in b.iter().enumerate() {
        let e = count.entry(l).or_insert((0, 0, 0, 0));
        e.1 += 1;
        e.3 = j;
    }
    let mut pairs: Vec<(usize, usize)> = count
        .values()
        .filter(|e| e.0 == 1 && e.1 == 1)
        .map(|e| (e.2, e.3))
        .collect();
    pairs.sort_unstable();
    // Longest increasing subsequence of the new positions (patience sorting).
    let mut tails: Vec<usize> = Vec::new(); // index into pairs
    let mut prev: Vec<Option<usize>> = vec![None; pairs.len()];
    for k in 0..pairs.len() {
        let j = pairs[k].1;
        let pos = tails.partition_point(|&t| pairs[t].1 < j);
        if pos > 0 {
            prev[k] = Some(tails[pos - 1]);
        }
        if pos == tails.len() {
            tails.push(k);
        } else {
            tails[pos] = k;
        }
    }
    let mut out = Vec::new();
    let mut cur = tails.last().copied();
    while let Some(k) = cur {
        out.push(pairs[k]);
        cur = prev[k];
    }
    out.reverse();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "import torch\n\ndef step(model, x):\n    loss = model(x)\n    total += loss\n    return total\n";

    #[test]
    fn lines_inserted_above_move_a_line_down() {
        let new = format!("# a\n# b\n# c\n{BASE}");
        let m = LineMap::between(BASE, &new);
        assert_eq!(m.new_line(5), Some(8));
        assert_eq!(m.new_line(1), Some(4));
    }

    #[test]
    fn a_deleted_line_maps_to_nothing_and_undo_brings_it_back() {
        let deleted = BASE.replace("    total += loss\n", "");
        let m = LineMap::between(BASE, &deleted);
        assert_eq!(m.new_line(5), None);
        assert_eq!(m.new_line(6), Some(5));
        let undone = LineMap::between(BASE, BASE);
        assert!(undone.is_identity());
        assert_eq!(undone.new_line(5), Some(5));
    }

    #[test]
    fn a_line_edited_in_place_keeps_its_place_and_a_moved_line_follows_its_text() {
        let edited = format!(
            "# new\n{}",
            BASE.replace("total += loss", "total += loss.detach()")
        );
        assert_eq!(LineMap::between(BASE, &edited).new_line(5), Some(6));
        // Replaced by two lines: not the same line any more.
        let split = BASE.replace("    total += loss\n", "    a = loss\n    total += a\n");
        let m = LineMap::between(BASE, &split);
        assert_eq!(m.new_line(5), None);
        assert_eq!(m.new_line(6), Some(7));
        // Cut and pasted below `return`.
        let moved = BASE.replace("    total += loss\n", "") + "    total += loss\n";
        assert_eq!(LineMap::between(BASE, &moved).new_line(5), Some(6));
    }

    #[test]
    fn repeated_lines_keep_their_order() {
        let old = "a\nx\nb\nx\nc\n";
        let new = "a\nnew\nx\nb\nx\nc\n";
        let m = LineMap::between(old, new);
        assert_eq!(m.new_line(2), Some(3));
        assert_eq!(m.new_line(4), Some(5));
    }

    #[test]
    fn a_huge_rewrite_aligns_unique_lines() {
        let old: String = (0..3000).map(|i| format!("line {i}\n")).collect();
        let new: String = std::iter::once("top\n".to_string())
            .chain((0..3000).map(|i| {
                if i % 2 == 0 {
                    format!("line {i}\n")
                } else {
                    format!("changed {i}\n")
                }
            }))
            .collect();
        let m = LineMap::between(&old, &new);
        assert_eq!(m.new_line(1), Some(2));
        assert_eq!(m.new_line(2), Some(3)); // edited in place
        assert_eq!(m.new_line(2999), Some(3000));
    }
}
