//! Differential test of the pickle VM against CPython.
//!
//! `tests/support/pickle_gen.py` builds random nested values (dicts with str/int keys, lists,
//! tuples, sets, non-ASCII strs, bytes, ints of any size, floats incl. NaN/-0.0, None/bools, shared
//! and repeated sub-objects, PyTorch's shared frame dicts inside shared stack lists), pickles them
//! with CPython at protocols 2–5 and prints a canonical JSON description. We decode each pickle and
//! must produce the same description — including which lists and dicts are one shared object.

mod common;

use std::collections::HashMap;
use std::process::Command;

use memlsp::pickle::{Kind, Tree, Val, decode};
use serde_json::{Value, json};

const CASES: usize = 320;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Little-endian two's complement bytes → decimal text, any size.
fn bigint_decimal(le: &[u8]) -> String {
    let neg = le.last().is_some_and(|b| b & 0x80 != 0);
    // Magnitude as little-endian u32 limbs.
    let mut bytes: Vec<u8> = le.to_vec();
    if neg {
        // two's complement negate
        let mut carry = 1u16;
        for b in bytes.iter_mut() {
            let v = (!*b) as u16 + carry;
            *b = v as u8;
            carry = v >> 8;
        }
    }
    let mut limbs: Vec<u32> = bytes
        .chunks(4)
        .map(|c| {
            let mut a = [0u8; 4];
            a[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(a)
        })
        .collect();
    let mut digits = Vec::new();
    while limbs.iter().any(|&l| l != 0) {
        let mut rem = 0u64;
        for l in limbs.iter_mut().rev() {
            let cur = (rem << 32) | *l as u64;
            *l = (cur / 1_000_000_000) as u32;
            rem = cur % 1_000_000_000;
        }
        digits.push(rem as u32);
    }
    let mut s = String::new();
    if neg {
        s.push('-');
    }
    match digits.split_last() {
        None => return "0".into(),
        Some((top, rest)) => {
            s.push_str(&top.to_string());
            for d in rest.iter().rev() {
                s.push_str(&format!("{d:09}"));
            }
        }
    }
    s
}

struct Canon<'t, 'a> {
    tree: &'t Tree<'a>,
    ids: HashMap<Val, u64>,
}

impl Canon<'_, '_> {
    fn of(&mut self, v: Val) -> Value {
        let t = self.tree;
        match t.kind(v) {
            Kind::None => json!({"t": "none"}),
            Kind::Bool(b) => json!({"t": "bool", "v": b}),
            Kind::Int(i) => json!({"t": "int", "v": i.to_string()}),
            Kind::BigInt(b) => json!({"t": "int", "v": bigint_decimal(b)}),
            Kind::Float(f) => json!({"t": "float", "bits": f.to_bits().to_string()}),
            Kind::Str => json!({"t": "str", "v": t.str(v).expect("str")}),
            Kind::Bytes => {
                let b = t.bytes(v).expect("bytes");
                let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
                json!({"t": "bytes", "hex": h})
            }
            Kind::Tuple => {
                json!({"t": "tuple", "items": t.items(v).iter().map(|&x| self.of(x)).collect::<Vec<_>>()})
            }
            Kind::Set => {
                json!({"t": "set", "items": t.items(v).iter().map(|&x| self.of(x)).collect::<Vec<_>>()})
            }
            Kind::List | Kind::Dict => {
                if let Some(id) = self.ids.get(&v) {
                    return json!({"t": "ref", "id": id});
                }
                let me = self.ids.len() as u64;
                self.ids.insert(v, me);
                if t.kind(v) == Kind::List {
                    let items: Vec<Value> = t.items(v).iter().map(|&x| self.of(x)).collect();
                    json!({"t": "list", "id": me, "items": items})
                } else {
                    let items: Vec<Value> = t
                        .pairs(v)
                        .map(|(k, x)| json!([self.of(k), self.of(x)]))
                        .collect();
                    json!({"t": "dict", "id": me, "items": items})
                }
            }
            other => json!({"t": format!("unexpected {other:?}")}),
        }
    }
}

/// Where two canonical values first differ (for a readable failure).
fn first_difference(a: &Value, b: &Value, path: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, va) in x {
                match y.get(k) {
                    Some(vb) => {
                        if let Some(d) = first_difference(va, vb, &format!("{path}.{k}")) {
                            return Some(d);
                        }
                    }
                    None => return Some(format!("{path}.{k} missing on one side")),
                }
            }
            (x.len() != y.len()).then(|| format!("{path}: keys differ"))
        }
        (Value::Array(x), Value::Array(y)) => {
            if x.len() != y.len() {
                return Some(format!("{path}: {} vs {} items", x.len(), y.len()));
            }
            x.iter()
                .zip(y)
                .enumerate()
                .find_map(|(i, (va, vb))| first_difference(va, vb, &format!("{path}[{i}]")))
        }
        _ => (a != b).then(|| format!("{path}: ours {a} vs CPython {b}")),
    }
}

#[test]
fn vm_decodes_what_cpython_pickled_protocols_2_to_5() {
    let seed: u64 = std::env::var("MEMLSP_DIFF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_130);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/pickle_gen.py");
    let out = match Command::new("python3")
        .arg(script)
        .arg(seed.to_string())
        .arg(CASES.to_string())
        .output()
    {
        Ok(o) if o.status.success() => o,
        Ok(o) => panic!(
            "pickle_gen.py failed: {}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => {
            common::skip(&format!(
                "python3 is not available ({e}); the differential test needs CPython"
            ));
            return;
        }
    };
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let mut per_proto = [0usize; 6];
    let mut n = 0;
    for line in text.lines() {
        let case: Value = serde_json::from_str(line).expect("json line");
        let proto = case["proto"].as_u64().expect("proto") as usize;
        let data = hex(case["pickle"].as_str().expect("pickle"));
        let tree = decode(&data).unwrap_or_else(|e| {
            panic!(
                "seed {seed} case {} (protocol {proto}): CPython's pickle is refused: {e}",
                case["case"]
            )
        });
        assert_eq!(tree.protocol, Some(proto as u8));
        let mut c = Canon {
            tree: &tree,
            ids: HashMap::new(),
        };
        let ours = c.of(tree.root);
        if let Some(d) = first_difference(&ours, &case["expect"], "root") {
            panic!(
                "seed {seed} case {} (protocol {proto}) differs from CPython at {d}",
                case["case"]
            );
        }
        // Every strict prefix is an error, never a panic or a different value.
        if n % 16 == 0 {
            for cut in [1, data.len() / 3, data.len() / 2, data.len() - 1] {
                assert!(decode(&data[..cut]).is_err(), "prefix {cut} of case {n}");
            }
        }
        per_proto[proto] += 1;
        n += 1;
    }
    assert_eq!(n, CASES);
    assert!(per_proto[2..].iter().all(|&c| c > 0), "{per_proto:?}");
}

#[test]
fn bigint_decimal_helper_is_right() {
    assert_eq!(bigint_decimal(&[]), "0");
    assert_eq!(bigint_decimal(&[0xff]), "-1");
    assert_eq!(bigint_decimal(&[0x00, 0x01]), "256");
    assert_eq!(
        bigint_decimal(&[0, 0, 0, 0, 0, 0, 0, 0, 1]),
        "18446744073709551616"
    );
    assert_eq!(
        bigint_decimal(&[0, 0, 0, 0, 0, 0, 0, 0x80]),
        "-9223372036854775808"
    );
}
