//! A folder where something cannot be read (issue 31): `report DIR` and `compare DIR` report
//! the rest and name what failed, as `--check` does.

mod common;

use std::path::Path;

/// Three real snapshots as ranks 0–2 of one job, rank 1 cut in half.
fn ranks_with_a_truncated_one(dir: &Path) -> bool {
    let real = [
        "torch_snapshots/real/Charran78__dump_snapshot.pickle",
        "torch_snapshots/real/MAGMA27__memory_snapshot.pickle",
        "torch_snapshots/real/JasperSolt__snapshot.pickle",
    ];
    for (rank, rel) in real.iter().enumerate() {
        let Some(src) = common::shared(rel) else {
            return false;
        };
        let mut bytes = std::fs::read(src).unwrap();
        if rank == 1 {
            bytes.truncate(bytes.len() / 2);
        }
        std::fs::write(dir.join(format!("rank{rank}_snapshot.pickle")), bytes).unwrap();
    }
    true
}

#[test]
fn report_dir_reports_the_good_ranks_and_names_the_truncated_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("job");
    std::fs::create_dir(&dir).unwrap();
    if !ranks_with_a_truncated_one(&dir) {
        return;
    }
    let r = common::memlsp(&["report", "job", "--format", "json"], tmp.path());
    assert_eq!(r.code, 2, "{}", r.stderr);
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", r.stderr);
    assert!(lines[0].contains("rank1_snapshot.pickle"), "{}", r.stderr);
    let doc = r.json();
    let paths: Vec<&str> = doc["captures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths.len(), 2, "{paths:?}");
    assert!(paths[0].ends_with("rank0_snapshot.pickle"), "{paths:?}");
    assert!(paths[1].ends_with("rank2_snapshot.pickle"), "{paths:?}");
    // The good ranks are compared with each other.
    let rows = doc["rank_comparisons"][0]["ranks"].as_array().map(Vec::len);
    assert_eq!(rows, Some(2), "{}", doc["rank_comparisons"]);
    let errors = doc["errors"].as_array().expect("errors");
    assert_eq!(errors.len(), 1);
    assert!(errors[0].to_string().contains("rank1_snapshot.pickle"));
    // The text report too, on several jobs.
    let t = common::memlsp(&["report", "job", "-j", "2"], tmp.path());
    assert_eq!(t.code, 2, "{}", t.stderr);
    assert!(t.stdout.contains("rank0_snapshot.pickle"), "{}", t.stdout);
    assert!(t.stdout.contains("rank2_snapshot.pickle"), "{}", t.stdout);
    assert!(t.stderr.contains("rank1_snapshot.pickle"), "{}", t.stderr);
}

#[test]
fn compare_dir_compares_the_readable_summaries_and_names_the_bad_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("job");
    std::fs::create_dir(&dir).unwrap();
    let sums = tmp.path().join("sums");
    std::fs::create_dir(&sums).unwrap();
    let real = [
        "torch_snapshots/real/Charran78__dump_snapshot.pickle",
        "torch_snapshots/real/MAGMA27__memory_snapshot.pickle",
        "torch_snapshots/real/JasperSolt__snapshot.pickle",
    ];
    for (rank, rel) in real.iter().enumerate() {
        let Some(src) = common::shared(rel) else {
            return;
        };
        let snap = dir.join(format!("rank{rank}_snapshot.pickle"));
        std::fs::copy(src, &snap).unwrap();
        let out = sums.join(format!("rank{rank}.json"));
        let r = common::memlsp(
            &[
                "report",
                common::arg(&snap),
                "--format",
                "json",
                "-o",
                common::arg(&out),
            ],
            tmp.path(),
        );
        assert_eq!(r.code, 0, "{}", r.stderr);
    }
    let bad = sums.join("rank1.json");
    let text = std::fs::read(&bad).unwrap();
    std::fs::write(&bad, &text[..text.len() / 2]).unwrap();
    let r = common::memlsp(&["compare", "sums", "--format", "json"], tmp.path());
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("rank1.json"), "{}", r.stderr);
    let doc = r.json();
    let ranks = doc["rank_comparison"]["ranks"].as_array().map(Vec::len);
    assert_eq!(ranks, Some(2), "{}", doc["rank_comparison"]);
}

/// Runs `memlsp args…` in `cwd` as a user the permissions apply to: as root (tests run as root
/// in CI containers) permissions do not stop a read, so the binary runs as `nobody` through
/// `setpriv`. `None` when that is impossible here.
fn memlsp_unprivileged(args: &[&str], cwd: &Path) -> Option<common::Run> {
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    if !root {
        return Some(common::memlsp(args, cwd));
    }
    // nobody must be able to run the binary: a copy beside the test folder.
    let bin = cwd.join("memlsp-bin");
    std::fs::copy(env!("CARGO_BIN_EXE_memlsp"), &bin).ok()?;
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&bin)
        .args(args)
        .current_dir(cwd)
        .env_remove("MEMLSP_PROGRESS")
        .stdin(std::process::Stdio::null())
        .output()
        .ok()?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if stderr.contains("setpriv:") {
        return None;
    }
    Some(common::Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
    })
}

/// `--check DIR` passed over FIFOs, sockets, dangling links and unreadable folders without a
/// word: each is now a line on stderr with the captures that could not be read (exit 2), and the
/// readable capture is still reported.
#[test]
fn check_dir_names_what_it_could_not_read() {
    use std::os::unix::fs::{PermissionsExt, symlink};
    let Some(real) = common::shared("torch_snapshots/real/Charran78__dump_snapshot.pickle") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = tmp.path().join("runs");
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(&real, dir.join("good.pickle")).unwrap();
    let fifo = std::process::Command::new("mkfifo")
        .arg(dir.join("fifo.pickle"))
        .status();
    assert!(fifo.is_ok_and(|s| s.success()), "mkfifo");
    let _sock = std::os::unix::net::UnixListener::bind(dir.join("sock.pickle")).unwrap();
    symlink(dir.join("nowhere.pickle"), dir.join("dangling.pickle")).unwrap();
    let outside = tmp.path().join("outside.pickle");
    std::fs::copy(&real, &outside).unwrap();
    symlink(&outside, dir.join("out.pickle")).unwrap();
    let locked = dir.join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::copy(&real, locked.join("inner.pickle")).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();

    let run = memlsp_unprivileged(&["--check", "runs", "--fail-on", "error"], tmp.path());
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
    let Some(r) = run else {
        common::skip("cannot drop root's permission bypass here (setpriv)");
        return;
    };
    assert_eq!(r.code, 2, "{}\n{}", r.stdout, r.stderr);
    for (name, why) in [
        ("fifo.pickle", "a FIFO"),
        ("sock.pickle", "a socket"),
        ("dangling.pickle", "a dangling link"),
        ("out.pickle", "a link out of the folder"),
        ("locked", "cannot be read"),
    ] {
        let line = r.stderr.lines().find(|l| l.contains(name));
        assert!(
            line.is_some_and(|l| l.contains(why) && l.starts_with("memlsp: ")),
            "{name}: {}",
            r.stderr
        );
    }
    // The readable capture is analysed; the summary counts the others.
    assert!(
        r.stdout.contains("in 1 capture (5 more could not be read)"),
        "{}",
        r.stdout
    );
}
