//! Usage errors: exit 2, one line on stderr, nothing on stdout; help and version on stdout.

mod common;

use common::memlsp;

fn usage_error(args: &[&str], needle: &str) {
    let dir = tempfile::tempdir().unwrap();
    let run = memlsp(args, dir.path());
    run.assert_one_line_error(needle);
    assert_eq!(run.stdout, "", "nothing on stdout for {args:?}");
}

#[test]
fn unknown_flag() {
    usage_error(&["--bogus"], "--bogus");
}

#[test]
fn bad_format_and_severity_values() {
    usage_error(&["--check", "--format", "xml"], "xml");
    usage_error(&["--check", "--fail-on", "fatal"], "fatal");
    usage_error(&["report", "x.pickle", "--format", "sarif"], "sarif");
    usage_error(&["--check", "--path-map", "/no-equals-sign"], "FROM=TO");
    usage_error(&["--check", "--max-file-bytes", "lots"], "lots");
}

#[test]
fn report_needs_a_file() {
    usage_error(&["report"], "<FILE>");
}

#[test]
fn check_options_without_check() {
    usage_error(&["--format", "json"], "need --check");
    usage_error(&["snap.pickle"], "need --check");
}

#[test]
fn workspace_must_be_a_directory() {
    usage_error(
        &["--check", "--workspace", "/definitely/not/here"],
        "/definitely/not/here",
    );
}

#[test]
fn check_and_a_subcommand_do_not_mix() {
    usage_error(&["--check", "report", "x.pickle"], "--check");
}

#[test]
fn help_and_version_go_to_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let help = memlsp(&["--help"], dir.path());
    assert_eq!(help.code, 0);
    assert!(help.stdout.contains("--check"), "{}", help.stdout);
    assert!(help.stdout.contains("report"), "{}", help.stdout);
    assert_eq!(help.stderr, "");
    let report_help = memlsp(&["report", "--help"], dir.path());
    assert_eq!(report_help.code, 0);
    for flag in [
        "--diff",
        "--module",
        "--top",
        "--max-trace-events",
        "--format",
    ] {
        assert!(
            report_help.stdout.contains(flag),
            "report --help lacks {flag}"
        );
    }
    let version = memlsp(&["--version"], dir.path());
    assert_eq!(version.code, 0);
    assert_eq!(
        version.stdout,
        format!("memlsp {}\n", env!("CARGO_PKG_VERSION"))
    );
}
