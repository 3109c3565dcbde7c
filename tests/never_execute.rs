//! memlsp never executes a pickle and never writes where captures live.
//!
//! Every code opcode (`GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `INST`, `OBJ`, `NEWOBJ`, `NEWOBJ_EX`,
//! `BUILD`) becomes inert data in the generic VM and a clear refusal in the snapshot loader;
//! `PERSID`, `BINPERSID` and `EXT1/2/4` are refused outright. A real `os.system('touch MARKER')`
//! pickle run through `report` and `--check` leaves no MARKER and exits 2 with one line naming the
//! file and the byte offset of the first code opcode.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use common::{arg, memlsp};
use memlsp::options::DecodeOptions;
use memlsp::pickle::{Kind, PickleErrorKind, decode};
use memlsp::torch::load::decode_snapshot;

/// `pickle.dumps(Evil(), protocol=2)` where `Evil.__reduce__` returns `(os.system, ('touch MARKER',))`:
/// GLOBAL at byte 2 (after PROTO).
const OS_SYSTEM_P2: &[u8] =
    b"\x80\x02cposix\nsystem\nq\x00X\x0c\x00\x00\x00touch MARKERq\x01\x85q\x02Rq\x03.";
/// The same at protocol 4: FRAME, then SHORT_BINUNICODE 'posix', 'system', STACK_GLOBAL at 28.
const OS_SYSTEM_P4: &[u8] = b"\x80\x04\x95\x27\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\x93\x94\x8c\x0ctouch MARKER\x94\x85\x94R\x94.";

/// Each code opcode as a minimal pickle, with the kind of value the generic VM must record.
fn code_pickles() -> Vec<(&'static str, Vec<u8>, Kind<'static>)> {
    vec![
        ("GLOBAL", b"\x80\x02cos\nsystem\n.".to_vec(), Kind::Global),
        (
            "STACK_GLOBAL",
            b"\x80\x04\x8c\x02os\x8c\x06system\x93.".to_vec(),
            Kind::Global,
        ),
        (
            "REDUCE",
            b"\x80\x02cos\nsystem\nX\x01\x00\x00\x00x\x85R.".to_vec(),
            Kind::Call,
        ),
        (
            "INST",
            b"(S'touch MARKER'\nios\nsystem\n.".to_vec(),
            Kind::Call,
        ),
        (
            "OBJ",
            b"\x80\x02(cos\nsystem\nX\x01\x00\x00\x00xo.".to_vec(),
            Kind::Call,
        ),
        (
            "NEWOBJ",
            b"\x80\x02cbuiltins\nobject\n)\x81.".to_vec(),
            Kind::Call,
        ),
        (
            "NEWOBJ_EX",
            b"\x80\x04cbuiltins\nobject\n)}\x92.".to_vec(),
            Kind::Call,
        ),
        ("BUILD", b"\x80\x02}}b.".to_vec(), Kind::Call),
    ]
}

#[test]
fn code_opcodes_are_inert_records_in_the_vm() {
    for (name, data, kind) in code_pickles() {
        let t = decode(&data).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(t.kind(t.root), kind, "{name}");
    }
    let t = decode(OS_SYSTEM_P4).unwrap();
    assert_eq!(t.describe(t.root), "a call to posix.system");
}

#[test]
fn code_opcodes_are_refused_by_the_snapshot_loader() {
    for (name, data, _) in code_pickles() {
        if name == "BUILD" {
            // BUILD on two dicts names no code; the loader must still not accept a Call as data.
            let e = decode_snapshot(Path::new("x.pickle"), &data, &DecodeOptions::default());
            assert!(e.is_err(), "{name} accepted as a snapshot");
            continue;
        }
        let e = decode_snapshot(Path::new("x.pickle"), &data, &DecodeOptions::default())
            .err()
            .unwrap_or_else(|| panic!("{name} accepted as a snapshot"));
        let msg = e.to_string();
        assert!(msg.contains("x.pickle"), "{name}: {msg}");
        assert!(
            msg.contains("references code") && msg.contains("nothing was imported or run"),
            "{name}: {msg}"
        );
    }
}

#[test]
fn persistent_ids_and_extension_registry_are_refused() {
    for (name, data, at) in [
        ("PERSID", b"\x80\x02P1\n.".to_vec(), 2),
        ("BINPERSID", b"\x80\x02K\x01Q.".to_vec(), 4),
        ("EXT1", b"\x80\x02\x82\x01.".to_vec(), 2),
        ("EXT2", b"\x80\x02\x83\x01\x00.".to_vec(), 2),
        ("EXT4", b"\x80\x02\x84\x01\x00\x00\x00.".to_vec(), 2),
        ("NEXT_BUFFER", b"\x80\x05\x97.".to_vec(), 2),
        ("READONLY_BUFFER", b"\x80\x05\x98.".to_vec(), 2),
    ] {
        let e = decode(&data).expect_err(name);
        assert_eq!(e.kind, PickleErrorKind::Refused, "{name}: {e}");
        assert_eq!(e.offset, at, "{name}: the opcode's offset");
        assert!(
            decode_snapshot(Path::new("x.pickle"), &data, &DecodeOptions::default()).is_err(),
            "{name}"
        );
    }
}

/// File name → (length, mtime) of everything under `dir`.
fn listing(dir: &Path) -> BTreeMap<PathBuf, (u64, SystemTime)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let m = std::fs::symlink_metadata(&d).unwrap();
        out.insert(d.clone(), (0, m.modified().unwrap()));
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = e.metadata().unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else {
                out.insert(e.path(), (m.len(), m.modified().unwrap()));
            }
        }
    }
    out
}

#[test]
fn os_system_pickle_leaves_no_marker_and_names_the_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path();
    for (name, bytes, offset) in [
        ("evil_p2.pickle", OS_SYSTEM_P2, 2),
        ("evil_p4.pickle", OS_SYSTEM_P4, 28),
    ] {
        std::fs::write(ws.join(name), bytes).unwrap();
        let before = listing(ws);
        let report = memlsp(&["report", name], ws);
        report.assert_one_line_error(name);
        assert!(
            report.stderr.contains(&format!("byte {offset}")),
            "{name}: no byte offset {offset} in {:?}",
            report.stderr
        );
        assert!(report.stderr.contains("system"), "{}", report.stderr);
        let check = memlsp(&["--check", name], ws);
        check.assert_one_line_error(name);
        assert!(
            check.stderr.contains(&format!("byte {offset}")),
            "{}",
            check.stderr
        );
        // The whole workspace, as `--check` with no path scans it.
        let scan = memlsp(&["--check"], ws);
        assert_eq!(scan.code, 2, "{}", scan.stderr);
        assert!(scan.stderr.contains(name), "{}", scan.stderr);
        assert!(!ws.join("MARKER").exists(), "MARKER was created");
        assert_eq!(listing(ws), before, "the workspace changed");
        std::fs::remove_file(ws.join(name)).unwrap();
    }
}

#[test]
fn capture_directories_are_never_written() {
    let Some(shared) = common::shared("") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let caps = tmp.path().join("captures");
    let prof = caps.join("plugins/profile/run1");
    std::fs::create_dir_all(&prof).unwrap();
    let pickle = shared.join("torch_snapshots/real/bcrafton__memory_snapshot.pickle");
    let xplane = shared.join("jax-real-captures/tracelens_mi300_jax08_gemm/tw003.xplane.pb");
    if !pickle.is_file() || !xplane.is_file() {
        common::skip("the shared captures this test copies are missing");
        return;
    }
    std::fs::copy(&pickle, caps.join("memory_snapshot.pickle")).unwrap();
    std::fs::copy(&xplane, prof.join("host.xplane.pb")).unwrap();
    std::fs::write(caps.join("evil.pickle"), OS_SYSTEM_P4).unwrap();
    std::fs::write(caps.join("train.py"), "x = 1\n").unwrap();
    // Old mtimes, so an in-place rewrite would show even within the same second.
    let old = SystemTime::now() - std::time::Duration::from_secs(3600);
    set_perms(&caps, 0o555, Some(old));
    let before = listing(&caps);

    let runs = [
        memlsp(&["report", "memory_snapshot.pickle"], &caps),
        memlsp(&["report", "plugins/profile/run1/host.xplane.pb"], &caps),
        memlsp(&["--check"], &caps),
        memlsp(&["--check", arg(&caps), "--format", "json"], tmp.path()),
        memlsp(&["--check", arg(&caps), "--format", "sarif"], tmp.path()),
    ];
    for r in &runs {
        assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    }
    let after = listing(&caps);
    set_perms(&caps, 0o755, None);
    assert_eq!(after, before, "memlsp wrote inside the capture directory");
    assert!(!caps.join("MARKER").exists());
}

/// chmod every directory under `dir` (files to read-only), optionally setting mtimes first.
fn set_perms(dir: &Path, mode: u32, mtime: Option<SystemTime>) {
    use std::os::unix::fs::PermissionsExt;
    let mut dirs = vec![dir.to_path_buf()];
    let mut all = Vec::new();
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                dirs.push(e.path());
            } else if let Some(t) = mtime {
                let f = std::fs::File::options().write(true).open(e.path()).unwrap();
                f.set_modified(t).unwrap();
                drop(f);
                std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(0o444)).unwrap();
            }
        }
        all.push(d);
    }
    // Children before parents, so a parent's mtime is not bumped afterwards.
    for d in all.iter().rev() {
        if let Some(t) = mtime {
            let f = std::fs::File::open(d).unwrap();
            f.set_modified(t).unwrap();
        }
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode)).unwrap();
    }
}
