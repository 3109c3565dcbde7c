//! Resource limits on hostile input (see `docs/LIMITS.md`): lengths are checked against the bytes
//! left before anything is allocated, nesting and memo growth are capped, files above
//! `--max-file-bytes` are refused unread.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use memlsp::pickle::{Limits, PickleErrorKind, decode, decode_with};

/// Counts the largest single allocation made by a thread while it is tracking.
struct Tracking;
static LARGEST: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static TRACK: Cell<bool> = const { Cell::new(false) };
}
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if TRACK.with(|t| t.get()) {
            LARGEST.fetch_max(l.size(), Ordering::Relaxed);
        }
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if TRACK.with(|t| t.get()) {
            LARGEST.fetch_max(n, Ordering::Relaxed);
        }
        unsafe { System.realloc(p, l, n) }
    }
}
#[global_allocator]
static ALLOC: Tracking = Tracking;

/// Largest single allocation `f` makes on this thread (other threads may raise it, never lower).
fn largest_alloc<T>(f: impl FnOnce() -> T) -> (T, usize) {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = ONE.lock().unwrap_or_else(|e| e.into_inner());
    LARGEST.store(0, Ordering::Relaxed);
    TRACK.with(|t| t.set(true));
    let r = f();
    TRACK.with(|t| t.set(false));
    (r, LARGEST.load(Ordering::Relaxed))
}

const HUGE: u64 = 1 << 62;

#[test]
fn pickle_lengths_of_2_pow_62_allocate_nothing() {
    let h = HUGE.to_le_bytes();
    let h32 = 0xffff_fff0u32.to_le_bytes();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("BINUNICODE8", [&[0x80, 4, 0x8d][..], &h, b"abc."].concat()),
        ("BINBYTES8", [&[0x80, 4, 0x8e][..], &h, b"abc."].concat()),
        ("BYTEARRAY8", [&[0x80, 5, 0x96][..], &h, b"abc."].concat()),
        ("FRAME", [&[0x80, 4, 0x95][..], &h, b"N."].concat()),
        ("BINUNICODE", [&[0x80, 4, b'X'][..], &h32, b"abc."].concat()),
        ("BINBYTES", [&[0x80, 4, b'B'][..], &h32, b"abc."].concat()),
        (
            "LONG4",
            [&[0x80, 4, 0x8b][..], &0x7fff_fff0u32.to_le_bytes(), b"a."].concat(),
        ),
        (
            "BINSTRING",
            [&[0x80, 2, b'T'][..], &0x7fff_fff0u32.to_le_bytes(), b"a."].concat(),
        ),
    ];
    // The tracker sees a large allocation when there is one.
    let (_, seen) = largest_alloc(|| std::hint::black_box(vec![1u8; 2 << 20]));
    assert!(seen >= 2 << 20, "{seen}");
    for (name, data) in cases {
        let (r, largest) = largest_alloc(|| decode(&data));
        let e = r.expect_err(name);
        assert_eq!(e.kind, PickleErrorKind::Truncated, "{name}: {e}");
        assert_eq!(e.offset, 2, "{name}: offset of the opcode");
        assert!(
            largest < 1 << 20,
            "{name}: allocated {largest} bytes at once"
        );
    }
}

#[test]
fn pickle_nesting_memo_and_stack_are_capped() {
    // 1001 nested lists: refused at the limit, as a Limit error (no recursion, no stack overflow).
    let nest = |n: usize| {
        let mut d = vec![0x80, 4];
        d.extend(std::iter::repeat_n(b']', n));
        d.extend(std::iter::repeat_n(b'a', n - 1));
        d.push(b'.');
        d
    };
    assert!(decode(&nest(1000)).is_ok());
    let e = decode(&nest(1002)).unwrap_err();
    assert_eq!(e.kind, PickleErrorKind::Limit, "{e}");
    // Nested MARKs are capped too.
    let mut marks = vec![0x80, 4];
    marks.extend(std::iter::repeat_n(b'(', 5000));
    assert_eq!(decode(&marks).unwrap_err().kind, PickleErrorKind::Limit);
    // A memo index far beyond what the bytes read so far could have filled.
    let e = decode(b"\x80\x04N\x72\xff\xff\xff\x7f.").unwrap_err();
    assert_eq!(e.kind, PickleErrorKind::Limit, "{e}");
    let (r, largest) = largest_alloc(|| decode(b"\x80\x04N\x72\xff\xff\xff\x7f."));
    assert!(r.is_err() && largest < 1 << 20, "{largest}");
    // Stack size, with a small configured limit.
    let limits = Limits {
        max_stack: 100,
        ..Limits::default()
    };
    let mut many = vec![0x80, 4];
    many.extend(std::iter::repeat_n(b'N', 200));
    let e = decode_with(&many, &limits).unwrap_err();
    assert_eq!(e.kind, PickleErrorKind::Limit, "{e}");
    // A cycle (a list appended to itself, repeatedly) cannot nest past the limit either.
    let mut cyc = b"\x80\x04]q\x00".to_vec();
    for _ in 0..2000 {
        cyc.extend_from_slice(b"h\x00a");
    }
    cyc.push(b'.');
    assert_eq!(decode(&cyc).unwrap_err().kind, PickleErrorKind::Limit);
}

/// Protobuf varint.
fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[test]
fn protobuf_lengths_of_2_pow_62_allocate_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // XSpace.planes (field 1, wire type 2) claiming 2^62 bytes, then a few bytes.
    let mut top = vec![0x0a];
    varint(HUGE, &mut top);
    top.extend_from_slice(b"abcdef");
    // A plane that fits, whose name (field 2) claims 2^62 bytes inside it.
    let mut inner = vec![0x12];
    varint(HUGE, &mut inner);
    inner.extend_from_slice(b"xyz");
    let mut nested = vec![0x0a];
    varint(inner.len() as u64, &mut nested);
    nested.extend_from_slice(&inner);
    // A plane of 2^62 *events* would be a length too; and a length of u64::MAX.
    let mut max = vec![0x0a];
    varint(u64::MAX, &mut max);
    max.push(0);
    for (name, bytes) in [("top", top), ("nested", nested), ("u64max", max)] {
        let path = dir.path().join(format!("{name}.xplane.pb"));
        std::fs::write(&path, &bytes).unwrap();
        let opts = memlsp::options::Options::default();
        let start = Instant::now();
        let (r, largest) = largest_alloc(|| memlsp::analyze::analyze_file(&path, &opts));
        let e = r.err().unwrap_or_else(|| panic!("{name}: accepted"));
        assert!(
            e.to_string().contains(&format!("{name}.xplane.pb")),
            "{name}: {e}"
        );
        assert!(
            largest < 1 << 20,
            "{name}: allocated {largest} bytes at once"
        );
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}

#[test]
fn max_file_bytes_refuses_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    // A sparse 3 GiB snapshot over a 1 KiB limit: refused by size alone, without a byte read.
    let p = dir.path().join("big_snapshot.pickle");
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(3 << 30).unwrap();
    drop(f);
    let start = Instant::now();
    let r = common::memlsp(
        &["--check", "big_snapshot.pickle", "--max-file-bytes", "1024"],
        dir.path(),
    );
    r.assert_one_line_error("big_snapshot.pickle");
    assert!(r.stderr.contains("1024"), "{}", r.stderr);
    assert!(start.elapsed() < Duration::from_secs(5));
    // The library default is 4 GiB.
    assert_eq!(
        memlsp::options::Options::default().decode.max_file_bytes,
        4 << 30
    );
    let mut opts = memlsp::options::Options::default();
    opts.decode.max_file_bytes = 1 << 30;
    let e = memlsp::analyze::analyze_file(Path::new(&p), &opts).unwrap_err();
    assert!(e.to_string().contains("above the limit"), "{e}");
}

#[test]
fn protobuf_nesting_is_capped_by_prost() {
    use prost::Message;
    // ShapeProto.tuple_shapes (field 4) nested `depth` levels: 50 decodes, 5000 hits prost's
    // recursion limit (100) as an error, not a stack overflow.
    let nested = |depth: usize| {
        let mut msg: Vec<u8> = Vec::new();
        for _ in 0..depth {
            let mut outer = vec![0x22];
            varint(msg.len() as u64, &mut outer);
            outer.extend_from_slice(&msg);
            msg = outer;
        }
        msg
    };
    type Shape = memlsp::xla::pb::xla::ShapeProto;
    assert!(Shape::decode(nested(50).as_slice()).is_ok());
    let e = Shape::decode(nested(5000).as_slice()).unwrap_err();
    assert!(e.to_string().contains("recursion"), "{e}");
}

#[test]
fn a_fifo_named_like_a_capture_is_refused_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["stuck_snapshot.pickle", "stuck.xplane.pb"] {
        let p = dir.path().join(name);
        let made = std::process::Command::new("mkfifo").arg(&p).status();
        if !made.is_ok_and(|s| s.success()) {
            common::skip("mkfifo is not available");
            return;
        }
        let start = Instant::now();
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_memlsp"))
            .args(["report", name])
            .current_dir(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        while child.try_wait().unwrap().is_none() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if child.try_wait().unwrap().is_none() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`memlsp report {name}` blocked on a FIFO");
        }
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(name) && err.contains("not a regular file"),
            "{err}"
        );
    }
}

#[test]
fn a_capped_address_space_still_gets_the_whole_report() {
    // Clusters often run jobs under `ulimit -v`; memlsp then reserves its trace for a likelier
    // entry count (one per 64 bytes of file) instead of an upper bound (one per 24 bytes), as
    // `MEMLSP_TIMINGS` shows. The report a user reads there is the same, to the byte.
    let Some(file) = common::shared(
        "torch_snapshots/real/sidsoc12__8169e1e6_mem_snapshot_ctx128_fp32_train.pickle",
    ) else {
        return;
    };
    let dir = file.parent().unwrap();
    let name = file.file_name().unwrap().to_str().unwrap();
    let len = std::fs::metadata(&file).unwrap().len();
    let run = |limit: &str| {
        let out = std::process::Command::new("sh")
            .args([
                "-c",
                &format!("{limit} exec \"$0\" report \"$1\" --format json"),
                env!("CARGO_BIN_EXE_memlsp"),
                name,
            ])
            .current_dir(dir)
            .env("MEMLSP_TIMINGS", "1")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "{limit}: {err}");
        let reserved: u64 = err
            .lines()
            .find_map(|l| l.strip_prefix("count trace entries reserved "))
            .unwrap_or_else(|| panic!("{limit}: no reservation in the timings: {err}"))
            .trim()
            .parse()
            .unwrap();
        (String::from_utf8_lossy(&out.stdout).into_owned(), reserved)
    };
    let (plain, plain_reserved) = run("ulimit -v unlimited 2>/dev/null;");
    let (capped, capped_reserved) = run("ulimit -v 2000000 &&");
    // (Where this test itself runs under a cap that cannot be lifted, both runs are capped.)
    let uncapped = if memlsp::process_memory::address_space_limited() {
        len / 64
    } else {
        len / 24
    };
    assert_eq!(plain_reserved, uncapped, "no cap: the upper bound");
    assert_eq!(capped_reserved, len / 64, "under a cap: the likelier count");
    assert_eq!(capped, plain);
}
