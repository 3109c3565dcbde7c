//! The bench's snapshot generators take no option for a path: asked for help they print their
//! usage, given a wrong command line they say so, and either way they write nothing. (Given
//! `--help`, one of them once wrote a 218 MB snapshot named `--help` into the checkout, and it
//! was committed.)

use std::path::Path;
use std::process::Command;

fn run(script: &str, args: &[&str], dir: &Path) -> (i32, String, String) {
    let out = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join(script))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("python3 is not available ({e}); this test needs CPython"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn generators_print_usage_for_help_and_write_nothing_on_a_wrong_command_line() {
    let dir = std::env::temp_dir().join(format!("memlsp-gen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for script in [
        "benches/gen_snapshot.py",
        "benches/gen_inconsistent_named.py",
    ] {
        for help in ["--help", "-h"] {
            let (code, stdout, _) = run(script, &[help], &dir);
            assert_eq!(code, 0, "{script} {help}");
            assert!(stdout.contains("Usage"), "{script} {help}: {stdout}");
        }
    }
    for (script, args) in [
        ("benches/gen_snapshot.py", &["--verbose"][..]),
        ("benches/gen_snapshot.py", &[][..]),
        (
            "benches/gen_snapshot.py",
            &["--scale", "src.pickle", "--help"][..],
        ),
        (
            "benches/gen_inconsistent_named.py",
            &["gen.py", "10", "--out"][..],
        ),
        ("benches/gen_inconsistent_named.py", &["gen.py", "10"][..]),
    ] {
        let (code, _, stderr) = run(script, args, &dir);
        assert_ne!(code, 0, "{script} {args:?}");
        assert!(stderr.contains("Usage"), "{script} {args:?}: {stderr}");
    }
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(left.is_empty(), "the generators wrote {left:?}");
}
