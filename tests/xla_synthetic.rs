//! Runtime situations CPU captures cannot show, on XSpaces built here with prost: growth per
//! execution, an OOM with `AllocatorRetry`, other live arrays, capacity.

mod common;

use common::ReportExt;

use std::collections::HashMap;
use std::path::PathBuf;

use memlsp::findings::{Code, FixKind, Severity};
use memlsp::options::Options;
use memlsp::report::CaptureReport;
use memlsp::xla::pb::profiler::{
    XEvent, XEventMetadata, XLine, XPlane, XSpace, XStat, XStatMetadata, x_event, x_stat,
};
use memlsp::xla::pb::xla as h;
use prost::Message;

const MIB: i64 = 1 << 20;

enum V {
    I(i64),
    S(&'static str),
    B(Vec<u8>),
}

#[derive(Default)]
struct PlaneB {
    plane: XPlane,
    metas: HashMap<String, i64>,
    stats: HashMap<String, i64>,
}

impl PlaneB {
    fn new(name: &str) -> Self {
        PlaneB {
            plane: XPlane {
                name: name.into(),
                ..Default::default()
            },
            ..Default::default()
        }
    }
    fn stat_id(&mut self, name: &str) -> i64 {
        let n = self.stats.len() as i64 + 1;
        let id = *self.stats.entry(name.to_string()).or_insert(n);
        self.plane.stat_metadata.insert(
            id,
            XStatMetadata {
                id,
                name: name.into(),
                description: String::new(),
            },
        );
        id
    }
    fn stat(&mut self, name: &str, v: V) -> XStat {
        let id = self.stat_id(name);
        let value = match v {
            V::I(i) => x_stat::Value::Int64Value(i),
            V::S(s) => x_stat::Value::RefValue(self.stat_id(s) as u64),
            V::B(b) => x_stat::Value::BytesValue(b),
        };
        XStat {
            metadata_id: id,
            value: Some(value),
        }
    }
    fn meta(&mut self, name: &str) -> i64 {
        let n = self.metas.len() as i64 + 1;
        let id = *self.metas.entry(name.to_string()).or_insert(n);
        self.plane
            .event_metadata
            .entry(id)
            .or_insert(XEventMetadata {
                id,
                name: name.into(),
                ..Default::default()
            });
        id
    }
    fn line(&mut self, name: &str) -> usize {
        if let Some(i) = self.plane.lines.iter().position(|l| l.name == name) {
            return i;
        }
        self.plane.lines.push(XLine {
            id: self.plane.lines.len() as i64,
            name: name.into(),
            ..Default::default()
        });
        self.plane.lines.len() - 1
    }
    fn event(&mut self, line: &str, name: &str, t: i64, d: i64, stats: Vec<(&str, V)>) {
        let li = self.line(line);
        let metadata_id = self.meta(name);
        let stats = stats.into_iter().map(|(k, v)| self.stat(k, v)).collect();
        self.plane.lines[li].events.push(XEvent {
            metadata_id,
            data: Some(x_event::Data::OffsetPs(t)),
            duration_ps: d,
            stats,
        });
    }
}

/// `jit_step(5)`: params f32[1024,1024] in, a same-shaped output out (not donated), and an
/// 8 MiB forward activation in the temporary block. Total peak 16 MiB.
fn hlo() -> Vec<u8> {
    let shape = |dims: Vec<i64>| h::ShapeProto {
        element_type: 11,
        dimensions: dims,
        ..Default::default()
    };
    let md = |op: &str, frame: i32| {
        Some(h::OpMetadata {
            op_name: op.into(),
            stack_frame_id: frame,
            ..Default::default()
        })
    };
    let instr = |id: i64, name: &str, opcode: &str, s: h::ShapeProto, m| h::HloInstructionProto {
        id,
        name: name.into(),
        opcode: opcode.into(),
        shape: Some(s),
        metadata: m,
        ..Default::default()
    };
    let tuple = h::ShapeProto {
        element_type: 13,
        tuple_shapes: vec![shape(vec![1024, 1024])],
        ..Default::default()
    };
    let module = h::HloModuleProto {
        name: "jit_step".into(),
        entry_computation_name: "main.1".into(),
        entry_computation_id: 1,
        computations: vec![h::HloComputationProto {
            id: 1,
            name: "main.1".into(),
            root_id: 4,
            instructions: vec![
                instr(
                    1,
                    "params.1",
                    "parameter",
                    shape(vec![1024, 1024]),
                    md("params['w']", 0),
                ),
                instr(
                    2,
                    "fusion.1",
                    "fusion",
                    shape(vec![2048, 1024]),
                    md("jit(step)/jvp()/mul", 1),
                ),
                instr(
                    3,
                    "out.1",
                    "fusion",
                    shape(vec![1024, 1024]),
                    md("jit(step)/transpose(jvp())/mul", 3),
                ),
                instr(4, "tuple.1", "tuple", tuple, md("", 0)),
                // A clone made by XLA's rematerialization pass (its buffer is not at the peak).
                instr(
                    5,
                    "fusion.1.remat",
                    "fusion",
                    shape(vec![2048, 1024]),
                    md("jit(step)/jvp()/mul", 1),
                ),
            ],
            ..Default::default()
        }],
        stack_frame_index: Some(h::StackFrameIndexProto {
            file_names: vec!["/w/train.py".into()],
            function_names: vec!["loss".into(), "train_loop".into()],
            file_locations: vec![
                h::stack_frame_index_proto::FileLocation {
                    file_name_id: 1,
                    function_name_id: 1,
                    line: 10,
                    column: 4,
                },
                h::stack_frame_index_proto::FileLocation {
                    file_name_id: 1,
                    function_name_id: 2,
                    line: 30,
                    column: 8,
                },
                h::stack_frame_index_proto::FileLocation {
                    file_name_id: 1,
                    function_name_id: 1,
                    line: 12,
                    column: 4,
                },
            ],
            stack_frames: vec![
                h::stack_frame_index_proto::StackFrame {
                    file_location_id: 1,
                    parent_frame_id: 2,
                },
                h::stack_frame_index_proto::StackFrame {
                    file_location_id: 2,
                    parent_frame_id: 0,
                },
                h::stack_frame_index_proto::StackFrame {
                    file_location_id: 3,
                    parent_frame_id: 2,
                },
            ],
        }),
        ..Default::default()
    };
    let lb = |id: i64, size: i64, instr: i64| h::LogicalBufferProto {
        id,
        size,
        defined_at: Some(h::logical_buffer_proto::Location {
            instruction_id: instr,
            ..Default::default()
        }),
        color: 0,
    };
    let asg = |id: i64, size: i64| h::buffer_allocation_proto::Assigned {
        logical_buffer_id: id,
        offset: 0,
        size,
    };
    let ba = h::BufferAssignmentProto {
        logical_buffers: vec![lb(1, 4 * MIB, 1), lb(2, 8 * MIB, 2), lb(3, 4 * MIB, 3)],
        buffer_allocations: vec![
            h::BufferAllocationProto {
                index: 0,
                size: 4 * MIB,
                is_entry_computation_parameter: true,
                assigned: vec![asg(1, 4 * MIB)],
                ..Default::default()
            },
            h::BufferAllocationProto {
                index: 1,
                size: 4 * MIB,
                maybe_live_out: true,
                assigned: vec![asg(3, 4 * MIB)],
                ..Default::default()
            },
            h::BufferAllocationProto {
                index: 2,
                size: 8 * MIB,
                assigned: vec![asg(2, 8 * MIB)],
                ..Default::default()
            },
        ],
        heap_simulator_traces: vec![h::HeapSimulatorTrace {
            events: vec![
                h::heap_simulator_trace::Event {
                    kind: 0,
                    buffer_id: 2,
                    instruction_name: "fusion.1".into(),
                    ..Default::default()
                },
                h::heap_simulator_trace::Event {
                    kind: 1,
                    buffer_id: 2,
                    instruction_name: "out.1".into(),
                    ..Default::default()
                },
            ],
            whole_module_simulation: true,
            buffer_allocation_index: 2,
        }],
    };
    h::HloProto {
        hlo_module: Some(module),
        buffer_assignment: Some(ba),
    }
    .encode_to_vec()
}

struct Run {
    host: PlaneB,
    gpu: PlaneB,
    in_use: i64,
    capacity: i64,
    addr: i64,
}

impl Run {
    fn new(capacity: i64, before_capture: i64) -> Self {
        let mut gpu = PlaneB::new("/device:GPU:0");
        let st = gpu.stat("memory_size", V::I(80 << 30));
        gpu.plane.stats.push(st);
        gpu.line("Stream #1(Kernel)");
        Run {
            host: PlaneB::new("/host:CPU"),
            gpu,
            in_use: before_capture,
            capacity,
            addr: 0x1000,
        }
    }
    fn mem(&mut self, alloc: bool, t: i64, bytes: i64, addr: i64) {
        self.in_use += if alloc { bytes } else { -bytes };
        let stats = vec![
            ("allocator_name", V::S("GPU_0_bfc")),
            ("bytes_allocated", V::I(self.in_use)),
            ("bytes_available", V::I(self.capacity - self.in_use)),
            ("bytes_reserved", V::I(0)),
            ("peak_bytes_in_use", V::I(self.in_use)),
            ("requested_bytes", V::I(bytes)),
            ("allocation_bytes", V::I(bytes)),
            ("addr", V::I(addr)),
        ];
        let name = if alloc {
            "MemoryAllocation"
        } else {
            "MemoryDeallocation"
        };
        self.host.event("python", name, t, 0, stats);
    }
    fn alloc(&mut self, t: i64, bytes: i64) -> i64 {
        self.addr += 0x10_0000_0000;
        let a = self.addr;
        self.mem(true, t, bytes, a);
        a
    }
    fn device_put(&mut self, t: i64, bytes: i64) {
        self.host.event("python", "DevicePut", t, 100, vec![]);
        self.alloc(t + 10, bytes);
    }
    /// One execution of jit_step(5) at `t`: output, temp block, kernel; or an OOM.
    fn step(&mut self, t: i64, oom: bool) {
        self.host
            .event("python", "PjitFunction(step)", t - 5, 200, vec![]);
        self.host.event(
            "python",
            "PjRtStreamExecutorLoadedExecutable::ExecuteHelper",
            t,
            100,
            vec![],
        );
        self.alloc(t + 10, 4 * MIB);
        if oom {
            self.host.event(
                "python",
                "AllocatorRetry::AllocateRaw",
                t + 20,
                10_000_000_000_000,
                vec![],
            );
            return;
        }
        let tmp = self.alloc(t + 20, 8 * MIB);
        self.host.event(
            "python",
            "GpuExecutable::ExecuteThunks",
            t + 30,
            50,
            vec![("module_name", V::S("jit_step"))],
        );
        self.gpu.event(
            "Stream #1(Kernel)",
            "fusion_1.kd",
            t + 40,
            5,
            vec![("program_id", V::I(5))],
        );
        self.mem(false, t + 90, 8 * MIB, tmp);
    }
    fn write(mut self, end: i64) -> (tempfile::TempDir, PathBuf) {
        self.host
            .event("python", "$train.py:28 train_loop", 0, end, vec![]);
        let mut meta = PlaneB::new("/host:metadata");
        let id = meta.meta("jit_step(5)");
        let s1 = meta.stat("Hlo Proto", V::B(hlo()));
        let s2 = meta.stat("program_id", V::I(5));
        meta.plane.event_metadata.get_mut(&id).unwrap().stats = vec![s1, s2];
        let space = XSpace {
            planes: vec![meta.plane, self.gpu.plane, self.host.plane],
            hostnames: vec!["test".into()],
            ..Default::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("synthetic.xplane.pb");
        std::fs::write(&path, space.encode_to_vec()).unwrap();
        (dir, path)
    }
}

fn analyze(path: &std::path::Path) -> CaptureReport {
    memlsp::analyze::run_file(path, &Options::default()).unwrap_or_else(|e| panic!("{e}"))
}

fn xla(r: &CaptureReport) -> serde_json::Value {
    let v = serde_json::to_value(r).expect("a report serialises");
    v["xla"].clone()
}

#[test]
fn growth_per_execution_equals_the_non_aliased_outputs() {
    let mut run = Run::new(64 * MIB, 2 * MIB);
    run.device_put(100, 4 * MIB);
    for k in 0..4 {
        run.step(1000 + k * 1000, false);
        run.host.event(
            "python",
            "$<unknown> append",
            1000 + k * 1000 + 150,
            1,
            vec![],
        );
    }
    let (_dir, path) = run.write(10_000);
    let r = analyze(&path);
    assert_eq!(xla(&r)["module"], "jit_step(5)");
    assert_eq!(xla(&r)["runtime"]["capacity_bytes"], 64 * MIB);
    let f = r
        .findings
        .iter()
        .find(|f| f.code == Code::JX004)
        .expect("JX004");
    assert_eq!(f.severity, Severity::Warning);
    assert!(
        f.message.contains("grows by 4.00 MiB per execution"),
        "{}",
        f.message
    );
    assert!(
        f.message.contains("(1.00x the non-aliased outputs)"),
        "{}",
        f.message
    );
    assert!(
        f.evidence[0]
            .text
            .ends_with("6.00 MiB → 10.00 MiB → 14.00 MiB → 18.00 MiB"),
        "{}",
        f.evidence[0].text
    );
    // The tracer names the function around the appends by base name; the plan knows its path.
    let loc = f.location.as_ref().unwrap();
    assert_eq!(
        (loc.file.as_str(), loc.line, loc.function.as_str()),
        ("/w/train.py", 28, "train_loop")
    );
    assert_eq!(f.fixes[0].kind, FixKind::DeviceGetAppend);
    let remat = r
        .findings
        .iter()
        .find(|f| f.code == Code::JX008)
        .expect("JX008");
    assert_eq!(remat.severity, Severity::Information);
    assert!(
        remat
            .message
            .starts_with("XLA already rematerialized 1 instructions"),
        "{}",
        remat.message
    );
    // Nothing else is wrong: it fits, so no JX001 and no pool-size advice.
    assert!(
        r.findings
            .iter()
            .all(|f| f.code != Code::JX001 && f.code != Code::JX007)
    );
    assert!(!r.text().contains("XLA_PYTHON_CLIENT_MEM_FRACTION"));
    // Runtime temp block joined to the plan's temporary allocation.
    let x = xla(&r);
    let execs = x["runtime"]["executions"].as_array().unwrap();
    assert_eq!(execs.len(), 4);
    assert!(
        execs
            .iter()
            .all(|e| e["temp_bytes_allocated"] == 8 * MIB && e["kernels"] == 1)
    );
    // Live at the last start, grouped by the host event that allocated them.
    for want in [
        "4.00 MiB in   1 buffer(s)  outputs of jit_step(5) execution 1",
        "4.00 MiB in   1 buffer(s)  outputs of jit_step(5) execution 3",
        "4.00 MiB in   1 buffer(s)  BufferFromHostBuffer (device_put)",
        "2.00 MiB in   0 buffer(s)  allocated before the capture started",
    ] {
        assert!(r.text().contains(want), "missing {want:?} in\n{}", r.text());
    }
}

#[test]
fn oom_with_allocator_retry_is_an_error_on_the_failed_module() {
    let mut run = Run::new(12 * MIB, 0);
    run.device_put(100, 4 * MIB);
    run.step(1000, true);
    let (_dir, path) = run.write(10_000_000_000_100);
    let r = analyze(&path);
    assert_eq!(xla(&r)["module"], "jit_step(5)");
    assert!(
        r.text().contains("its last execution launched no kernel"),
        "{}",
        r.text()
    );
    let codes: Vec<&str> = r.findings.iter().map(|f| f.code.as_str()).collect();
    // Both errors; the cause (the plan does not fit) leads the event (the allocator's retry),
    // as PT008 leads PT009.
    assert_eq!(&codes[..2], ["JX001", "JX007"], "{codes:?}");
    let jx007 = &r.findings[1];
    assert_eq!(jx007.severity, Severity::Error);
    assert!(
        jx007.message.contains("longest 10.0 s"),
        "{}",
        jx007.message
    );
    assert!(jx007.message.contains("launched none"), "{}", jx007.message);
    assert!(jx007.evidence.iter().any(|e| {
        e.text
            .contains("no allocation of the temporary block (8.00 MiB)")
    }));
    let jx001 = &r.findings[0];
    assert!(
        jx001
            .message
            .contains("needs 16.00 MiB > capacity 12.00 MiB"),
        "{}",
        jx001.message
    );
    // The GPU has 80 GiB: raising the pool fraction is a real option.
    assert!(
        jx001
            .fixes
            .iter()
            .any(|f| f.title.contains("XLA_PYTHON_CLIENT_MEM_FRACTION"))
    );
    // The forward activation fix is checked against the capacity: 16 − 4 = 12 MiB fits.
    let jx002 = r.findings.iter().find(|f| f.code == Code::JX002).unwrap();
    assert_eq!(jx002.location.as_ref().unwrap().line, 10);
    assert!(
        r.headline()
            .starts_with("jit_step(5): the step itself doesn't fit"),
        "{}",
        r.headline()
    );
}

#[test]
fn other_live_arrays_are_named_by_the_event_that_made_them() {
    let mut run = Run::new(40 * MIB, 0);
    run.device_put(100, 4 * MIB);
    run.device_put(300, 24 * MIB);
    run.step(1000, false);
    // 28 MiB of device_put data + step 1's output leave no room for step 2's temporary block.
    run.step(2000, true);
    let (_dir, path) = run.write(10_000_000_010_000);
    let r = analyze(&path);
    let f = r
        .findings
        .iter()
        .find(|f| f.code == Code::JX006)
        .unwrap_or_else(|| panic!("{}\n{}", r.headline(), r.text()));
    assert_eq!(f.severity, Severity::Warning);
    assert!(
        f.message
            .contains("the largest (28.00 MiB) came from BufferFromHostBuffer (device_put)"),
        "{}",
        f.message
    );
    assert!(
        f.message
            .contains("32.00 MiB was in use when jit_step(5) started"),
        "{}",
        f.message
    );
    // The plan alone fits (16 MiB ≤ 40 MiB): the OOM is not the step's fault.
    assert!(r.findings.iter().all(|f| f.code != Code::JX001));
    assert_eq!(r.findings[0].code, Code::JX007);
}

#[test]
fn a_damaged_hlo_proto_is_an_error_at_its_metadata_entry() {
    let mut meta = PlaneB::new("/host:metadata");
    let id = meta.meta("jit_step(5)");
    let broken = V::B(vec![0x0a, 0xff, 0xff, 0x03, 0x01]);
    let s = meta.stat("Hlo Proto", broken);
    meta.plane.event_metadata.get_mut(&id).unwrap().stats = vec![s];
    let bytes = XSpace {
        planes: vec![meta.plane],
        ..Default::default()
    }
    .encode_to_vec();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.xplane.pb");
    std::fs::write(&path, &bytes).unwrap();
    let e = memlsp::analyze::run_file(&path, &Options::default()).unwrap_err();
    assert_eq!(e.kind, memlsp::error::ErrorKind::Invalid);
    let off = e.offset.expect("an offset") as usize;
    assert!(off > 0 && off < bytes.len(), "{e}");
    assert!(e.to_string().contains("jit_step(5)"), "{e}");
}
