//! HLO modules from the `/host:metadata` plane: names as xprof writes them, decoded `HloProto`s,
//! source locations (OpMetadata / stack-frame index) and shape strings.

use std::path::Path;

use prost::Message;

use super::pb::profiler as xpb;
use super::pb::xla as hpb;
use super::space::Plane;
use crate::error::{CaptureError, ErrorKind};
use crate::findings::Location;

/// One HLO module of the capture, undecoded until its plan is needed.
pub struct ModuleEntry {
    /// `<hlo module name>(<program id>)`, exactly as xprof names it.
    pub name: String,
    /// HLO module name without the program id.
    pub hlo_name: String,
    pub program_id: u64,
    /// Serialized `xla.HloProto`.
    pub proto: Vec<u8>,
    /// Absolute offset of the metadata entry holding it (errors point there).
    pub offset: Option<u64>,
}

/// Modules listed in `/host:metadata` that carry an HLO proto (`"Hlo Proto"` or legacy `"HLO Proto"`).
pub fn modules(plane: &Plane) -> Vec<ModuleEntry> {
    let mut out = Vec::new();
    for (id, meta) in &plane.event_meta {
        let mut proto = None;
        let mut program_id = None;
        for s in &meta.stats {
            let name = plane.stat_name(s.metadata_id);
            match (name, s.value.as_ref()) {
                ("Hlo Proto" | "HLO Proto", Some(xpb::x_stat::Value::BytesValue(b))) => {
                    proto = Some(b.clone())
                }
                ("program_id", Some(xpb::x_stat::Value::Uint64Value(v))) => program_id = Some(*v),
                ("program_id", Some(xpb::x_stat::Value::Int64Value(v))) => {
                    program_id = Some(*v as u64)
                }
                _ => {}
            }
        }
        let Some(proto) = proto else { continue };
        let (hlo_name, from_name) = split_program_id(&meta.name);
        let program_id = program_id.or(from_name).unwrap_or(*id as u64);
        let name = if from_name.is_some() {
            meta.name.clone()
        } else {
            format!("{hlo_name}({program_id})")
        };
        out.push(ModuleEntry {
            name,
            hlo_name: hlo_name.to_string(),
            program_id,
            proto,
            offset: plane.event_meta_offset.get(id).copied(),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// `jit_f(123)` → (`jit_f`, Some(123)); a name without a trailing `(digits)` → (name, None).
pub fn split_program_id(name: &str) -> (&str, Option<u64>) {
    if let Some(rest) = name.strip_suffix(')') {
        if let Some(open) = rest.rfind('(') {
            if let Ok(v) = rest[open + 1..].parse::<u64>() {
                return (&rest[..open], Some(v));
            }
        }
    }
    (name, None)
}

/// Decode a module's `HloProto`; errors point at the file (the proto sits inside the metadata plane).
pub fn decode(path: &Path, m: &ModuleEntry) -> Result<hpb::HloProto, CaptureError> {
    hpb::HloProto::decode(m.proto.as_slice()).map_err(|e| {
        CaptureError::new(
            path,
            ErrorKind::Invalid,
            m.offset,
            format!(
                "the HLO proto of module {} (in the /host:metadata entry here) does not decode: {e}",
                m.name
            ),
            "the capture's /host:metadata plane is damaged; re-capture it",
        )
    })
}

/// A source position with its column, as the stack-frame index stores it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub file: String,
    pub line: i32,
    pub column: i32,
    pub function: String,
}

impl Frame {
    pub fn location(&self) -> Location {
        Location::new(
            self.file.clone(),
            self.line.max(0) as u32,
            self.function.clone(),
        )
    }
}

/// Frames of `frame_id` (1-based) and its callers, innermost first.
pub fn stack_frames(idx: Option<&hpb::StackFrameIndexProto>, mut frame_id: i32) -> Vec<Frame> {
    let mut out = Vec::new();
    let Some(idx) = idx else { return out };
    let mut guard = 0;
    while frame_id > 0 && (frame_id as usize) <= idx.stack_frames.len() && guard < 1000 {
        guard += 1;
        let fr = &idx.stack_frames[frame_id as usize - 1];
        frame_id = fr.parent_frame_id;
        let mut f = Frame {
            file: String::new(),
            line: -1,
            column: -1,
            function: String::new(),
        };
        let loc_id = fr.file_location_id;
        if loc_id > 0 && (loc_id as usize) <= idx.file_locations.len() {
            let loc = &idx.file_locations[loc_id as usize - 1];
            f.line = loc.line;
            f.column = loc.column;
            if let Some(n) = usize::try_from(loc.file_name_id - 1)
                .ok()
                .and_then(|i| idx.file_names.get(i))
            {
                f.file = n.clone();
            }
            if let Some(n) = usize::try_from(loc.function_name_id - 1)
                .ok()
                .and_then(|i| idx.function_names.get(i))
            {
                f.function = n.clone();
            }
        }
        out.push(f);
    }
    out
}

/// xprof's rule: the innermost stack frame when it has a file and a line, else
/// `source_file:source_line`; `None` when neither names a file.
pub fn source_of(
    instr: &hpb::HloInstructionProto,
    idx: Option<&hpb::StackFrameIndexProto>,
) -> (Option<Frame>, Vec<Frame>) {
    let md = instr.metadata.as_ref();
    let frames = stack_frames(idx, md.map(|m| m.stack_frame_id).unwrap_or(0));
    // xprof's order: the op's own source_file/source_line first, then its stack frame.
    if let Some(m) = md.filter(|m| !m.source_file.is_empty()) {
        let function = frames
            .first()
            .filter(|f| f.file == m.source_file && f.line == m.source_line)
            .map(|f| f.function.clone())
            .unwrap_or_default();
        let f = Frame {
            file: m.source_file.clone(),
            line: m.source_line,
            column: m.source_column,
            function,
        };
        let stack = if frames.is_empty() {
            vec![f.clone()]
        } else {
            frames
        };
        return (Some(f), stack);
    }
    match frames.first() {
        Some(f) if !f.file.is_empty() && f.line != 0 => (Some(f.clone()), frames),
        _ => (None, frames),
    }
}

/// Lower-case element type name as XLA prints it (`f32`, `bf16`, `s8`, …).
pub fn element_type_name(t: i32) -> &'static str {
    match t {
        1 => "pred",
        2 => "s8",
        3 => "s16",
        4 => "s32",
        5 => "s64",
        6 => "u8",
        7 => "u16",
        8 => "u32",
        9 => "u64",
        10 => "f16",
        11 => "f32",
        12 => "f64",
        13 => "tuple",
        14 => "opaque",
        15 => "c64",
        16 => "bf16",
        17 => "token",
        18 => "c128",
        19 => "f8e5m2",
        20 => "f8e4m3fn",
        21 => "s4",
        22 => "u4",
        23 => "f8e4m3b11fnuz",
        24 => "f8e5m2fnuz",
        25 => "f8e4m3fnuz",
        26 => "s2",
        27 => "u2",
        28 => "f8e4m3",
        29 => "f8e3m4",
        30 => "s1",
        31 => "u1",
        32 => "f4e2m1fn",
        33 => "f8e8m0fnu",
        34 => "buffer",
        _ => "unknown",
    }
}

/// The sub-shape a logical buffer denotes (xprof: the last shape-index element, one level).
pub fn resolve_shape<'a>(shape: &'a hpb::ShapeProto, index: &[i64]) -> &'a hpb::ShapeProto {
    if let Some(&i) = index.last() {
        if let Some(s) = usize::try_from(i)
            .ok()
            .and_then(|i| shape.tuple_shapes.get(i))
        {
            return s;
        }
    }
    shape
}

/// `f32[8,4,256,256]{3,2,1,0}`, tuples as `(a, b)`.
pub fn shape_string(s: &hpb::ShapeProto) -> String {
    if s.element_type == 13 {
        let parts: Vec<String> = s.tuple_shapes.iter().map(shape_string).collect();
        return format!("({})", parts.join(", "));
    }
    let dims: Vec<String> = s.dimensions.iter().map(|d| d.to_string()).collect();
    let mut out = format!("{}[{}]", element_type_name(s.element_type), dims.join(","));
    if let Some(l) = &s.layout {
        if !s.dimensions.is_empty() {
            let m: Vec<String> = l.minor_to_major.iter().map(|d| d.to_string()).collect();
            out.push_str(&format!("{{{}}}", m.join(",")));
        }
    }
    out
}

/// A shape string without its layouts: `(f32[2,3]{1,0}, s8[4]{0})` → `(f32[2,3], s8[4])`.
pub fn without_layout(shape: &str) -> String {
    let mut out = String::with_capacity(shape.len());
    let mut depth = 0;
    for c in shape.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}
