//! Device capacities a user can name: bytes (`85899345920`), a size (`24GiB`, `80G`, `512M`), or
//! a GPU from [`GPUS`], less the memory the CUDA context takes ([`DEFAULT_CONTEXT_RESERVE`]
//! unless the user sets another). Shared by `memlsp fit`/`predict`, the editor's
//! `memlsp.capacity` setting and the MCP tool `fit`.

/// Memory the CUDA context (and the libraries loaded with it) takes before the allocator sees
/// any: typically 300–600 MiB with lazy module loading (CUDA ≥ 11.7); the default takes 512 MiB.
pub const DEFAULT_CONTEXT_RESERVE: u64 = 512 << 20;

/// A GPU of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// Names it is asked by (compared without case, spaces, `-` and `_`).
    pub names: &'static [&'static str],
    /// Shown name.
    pub shown: &'static str,
    /// Device memory in bytes, as the driver reports its total (`nvidia-smi`'s
    /// `memory.total`, ECC on) where known; otherwise the datasheet's.
    pub total_bytes: u64,
    /// Where the number comes from.
    pub source: &'static str,
}

const MIB: u64 = 1 << 20;

/// The GPUs `--on` knows. Totals: the vendor's datasheet for the size, and the total the
/// driver reports (which is below the nominal size where ECC takes its share, as on T4).
pub const GPUS: &[Gpu] = &[
    Gpu {
        names: &["T4"],
        shown: "T4 (16 GB)",
        total_bytes: 15_360 * MIB,
        source: "nvidia.com/en-us/data-center/tesla-t4 (16 GB GDDR6); nvidia-smi total 15,360 MiB with ECC",
    },
    Gpu {
        names: &["L4"],
        shown: "L4 (24 GB)",
        total_bytes: 23_034 * MIB,
        source: "nvidia.com/en-us/data-center/l4 (24 GB GDDR6); nvidia-smi total 23,034 MiB",
    },
    Gpu {
        names: &["A10", "A10G"],
        shown: "A10 (24 GB)",
        total_bytes: 23_028 * MIB,
        source: "nvidia.com/en-us/data-center/products/a10-gpu (24 GB GDDR6); nvidia-smi total 23,028 MiB",
    },
    Gpu {
        names: &["A100-40GB", "A100 40GB", "A10040", "A100-40"],
        shown: "A100 40 GB",
        total_bytes: 40_960 * MIB,
        source: "nvidia.com/en-us/data-center/a100 (40 GB HBM2); nvidia-smi total 40,960 MiB",
    },
    Gpu {
        names: &["A100-80GB", "A100 80GB", "A10080", "A100-80"],
        shown: "A100 80 GB",
        total_bytes: 81_920 * MIB,
        source: "nvidia.com/en-us/data-center/a100 (80 GB HBM2e); nvidia-smi total 81,920 MiB",
    },
    Gpu {
        names: &["H100", "H100-80GB", "H100 80GB", "H10080"],
        shown: "H100 80 GB",
        total_bytes: 81_559 * MIB,
        source: "nvidia.com/en-us/data-center/h100 (80 GB HBM3, SXM and PCIe); nvidia-smi total 81,559 MiB",
    },
    Gpu {
        names: &["H200", "H200-141GB"],
        shown: "H200 141 GB",
        total_bytes: 143_771 * MIB,
        source: "nvidia.com/en-us/data-center/h200 (141 GB HBM3e); nvidia-smi total 143,771 MiB",
    },
    Gpu {
        names: &["B200"],
        shown: "B200 180 GB",
        total_bytes: 183_359 * MIB,
        source: "nvidia.com/en-us/data-center/dgx-b200 (1,440 GB over 8 GPUs); nvidia-smi total 183,359 MiB",
    },
    Gpu {
        names: &["MI300X"],
        shown: "MI300X 192 GB",
        total_bytes: 192 * 1024 * MIB,
        source: "amd.com/en/products/accelerators/instinct/mi300/mi300x (192 GB HBM3; datasheet size)",
    },
];

/// A capacity as the user named it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Bytes the allocator may reserve.
    pub bytes: u64,
    /// How to show it: `24 GiB`, or `H100 80 GB (79.15 GiB after a 512 MiB CUDA context)`.
    pub shown: String,
}

fn key(s: &str) -> String {
    s.chars()
        .filter(|c| !matches!(c, ' ' | '-' | '_'))
        .flat_map(char::to_uppercase)
        .collect()
}

/// The GPU of the table named `name`.
pub fn gpu(name: &str) -> Option<&'static Gpu> {
    let k = key(name);
    GPUS.iter().find(|g| g.names.iter().any(|n| key(n) == k))
}

/// A size: bytes, or a number (decimals allowed) with K/M/G/T (binary, `GiB` and `GB` alike).
pub fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim();
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(end);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    if num.contains('.') {
        let v: f64 = num.parse().ok()?;
        let b = v * (1u64 << shift) as f64;
        (b.is_finite() && b >= 0.0 && b < u64::MAX as f64).then(|| b.round() as u64)
    } else {
        num.parse::<u64>().ok()?.checked_mul(1u64 << shift)
    }
}

/// `name` (bytes, a size, or a GPU) as a capacity; a GPU's total less `reserve`.
pub fn parse(name: &str, reserve: u64) -> Result<Capacity, String> {
    if let Some(b) = parse_size(name) {
        return Ok(Capacity {
            bytes: b,
            shown: crate::findings::fmt_bytes(b),
        });
    }
    match gpu(name) {
        Some(g) => {
            let bytes = g.total_bytes.saturating_sub(reserve);
            Ok(Capacity {
                bytes,
                shown: format!(
                    "{} ({} after a {} CUDA context)",
                    g.shown,
                    crate::findings::fmt_bytes(bytes),
                    crate::findings::fmt_bytes(reserve)
                ),
            })
        }
        None => {
            let known: Vec<&str> = GPUS.iter().map(|g| g.names[0]).collect();
            Err(format!(
                "`{name}` is neither a size (24GiB, 85899345920) nor a GPU this table knows ({})",
                known.join(", ")
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacities_parse() {
        assert_eq!(parse_size("24GiB"), Some(24 << 30));
        assert_eq!(parse_size("1.5G"), Some(3 << 29));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("lots"), None);
        let h = parse("h100", DEFAULT_CONTEXT_RESERVE).unwrap();
        assert_eq!(h.bytes, 81_559 * MIB - DEFAULT_CONTEXT_RESERVE);
        assert!(h.shown.starts_with("H100 80 GB ("), "{}", h.shown);
        assert_eq!(parse("A100-40GB", 0).unwrap().bytes, 40 << 30);
        assert_eq!(parse("a100 80gb", 0).unwrap().bytes, 80 << 30);
        let e = parse("A100", 0).unwrap_err();
        assert!(e.contains("A100-40GB"), "{e}");
    }
}
