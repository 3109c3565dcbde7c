//! Issue #2's bad-input list, as a user meets it: `memlsp report` on each file prints one line on
//! stderr naming the file and the byte offset, exits 2, does not panic, hang or allocate wildly,
//! and a pickle that calls `os.system` is refused without running anything.

mod common;

use common::{arg, memlsp};

fn write(dir: &std::path::Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn assert_refused_at(dir: &std::path::Path, file: &std::path::Path, offset: u64) -> String {
    let name = file.file_name().unwrap().to_str().unwrap();
    let run = memlsp(&["report", arg(file)], dir);
    run.assert_one_line_error(name);
    let line = run.stderr.trim().to_string();
    assert!(
        line.contains(&format!("at byte {offset}")),
        "{name}: expected byte {offset} in {line:?}"
    );
    line
}

#[test]
fn truncated_snapshot_names_where_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(
        env!("CARGO_MANIFEST_DIR").to_string() + "/fixtures/torch/pt002_retained_graph.pickle",
    )
    .unwrap();
    let cut = write(dir.path(), "cut.pickle", &good[..good.len() / 2]);
    let name = "cut.pickle";
    let run = memlsp(&["report", arg(&cut)], dir.path());
    run.assert_one_line_error(name);
    assert!(run.stderr.contains("at byte"), "{}", run.stderr);
    assert!(
        run.stderr.contains("still be being written") || run.stderr.contains("cut short"),
        "{}",
        run.stderr
    );
}

#[test]
fn os_system_pickle_is_refused_and_never_runs() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("MARKER");
    let cmd = format!("touch {}", marker.display());
    // Protocol 0 GLOBAL + REDUCE, and protocol 4 STACK_GLOBAL + REDUCE.
    let p0 = format!("cos\nsystem\n(S'{cmd}'\ntR.");
    let f0 = write(dir.path(), "evil0.pickle", p0.as_bytes());
    let line = assert_refused_at(dir.path(), &f0, 0);
    assert!(line.contains("os.system"), "{line}");
    let mut p4 = vec![0x80, 4, 0x8c, 2];
    p4.extend(b"os");
    p4.extend([0x8c, 6]);
    p4.extend(b"system");
    p4.push(0x93);
    p4.extend([0x8c, cmd.len() as u8]);
    p4.extend(cmd.as_bytes());
    p4.extend([0x85, b'R', b'.']);
    let f4 = write(dir.path(), "evil4.pickle", &p4);
    let line = assert_refused_at(dir.path(), &f4, 14);
    assert!(line.contains("nothing was imported or run"), "{line}");
    let check = memlsp(&["--check", arg(dir.path())], dir.path());
    assert_eq!(check.code, 2);
    assert!(!marker.exists(), "the pickled os.system call ran");
}

#[test]
fn deep_nesting_and_huge_lengths_are_limits_not_crashes() {
    let dir = tempfile::tempdir().unwrap();
    let mut deep = vec![0x80, 4];
    deep.extend(std::iter::repeat_n(b']', 1_000_000));
    deep.extend(std::iter::repeat_n(b'a', 999_999));
    deep.push(b'.');
    let f = write(dir.path(), "deep.pickle", &deep);
    let line = memlsp(&["report", arg(&f)], dir.path());
    line.assert_one_line_error("deep.pickle");
    assert!(
        line.stderr.contains("nested more than 1000 levels"),
        "{}",
        line.stderr
    );

    // BINUNICODE8 with a length of 2^62 at byte 2.
    let mut huge = vec![0x80, 4, 0x8d];
    huge.extend((1u64 << 62).to_le_bytes());
    huge.extend(b"abc.");
    let f = write(dir.path(), "huge.pickle", &huge);
    let line = assert_refused_at(dir.path(), &f, 2);
    assert!(line.contains("4611686018427387904"), "{line}");
}

#[test]
fn empty_file_and_empty_directory() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(dir.path(), "empty.pickle", b"");
    assert_refused_at(dir.path(), &f, 0);
    let empty = dir.path().join("no_snapshots");
    std::fs::create_dir(&empty).unwrap();
    std::fs::write(empty.join("notes.txt"), "hello").unwrap();
    memlsp(&["report", arg(&empty)], dir.path()).assert_one_line_error("no_snapshots");
}

/// A trace entry written twice as one dict object (`[e, f, e]`): the loader reads each entry
/// once, as it is decoded, so the list holding the second reference is refused at its
/// `APPENDS` (byte 153), never read with an empty entry.
#[test]
fn an_entry_dict_used_twice_is_refused_at_its_second_use() {
    let dir = tempfile::tempdir().unwrap();
    // pickle.dumps({'segments': [], 'device_traces': [[e, f, e]]}, protocol=4) with
    // e = {'action': 'alloc', …}, f = {'action': 'free_requested', …}
    let hex = "\
        80049592000000000000007d94288c087365676d656e7473945d948c0d6465766963655f747261636573945d945d94287d94288c06616374696f6e948c05616c6c6f63948c0461646472944b018c0473697a65944d00028c0673747265616d944b008c0774696d655f7573944b05757d942868078c0e667265655f7265717565737465649468094b01680a4d0002680b4b00680c4b067568066561752e";
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let file = write(dir.path(), "shared_entry.pickle", &bytes);
    let line = assert_refused_at(dir.path(), &file, 153);
    assert!(
        line.contains("same dict object as an earlier item"),
        "{line}"
    );
}
