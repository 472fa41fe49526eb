//! `runcell keys create|update --egress-allow` and `keys list`: a key's own egress bound as the
//! operator sets it, in a real database file (the store's contract is tested on both backends
//! in crates/store/tests/both.rs, its effect on requests in crates/server/tests/egress_keys.rs).

use std::path::Path;
use std::process::{Command, Output};

fn runcell(data: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_runcell"));
    c.env("RUNCELL_DATA_DIR", data).env("NO_COLOR", "1");
    c
}

fn ok(out: Output) -> (String, String) {
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "stdout={stdout} stderr={stderr}");
    (stdout, stderr)
}

/// The `egress_allow` column of the key named `name`, read from the file itself.
fn column(data: &Path, name: &str) -> Option<String> {
    let db = rusqlite::Connection::open(data.join("runcell.db")).expect("open");
    db.query_row(
        "SELECT egress_allow FROM api_keys WHERE name = ?1",
        [name],
        |r| r.get(0),
    )
    .expect("row")
}

fn list_line(data: &Path, name: &str) -> String {
    let (list, _) = ok(runcell(data).args(["keys", "list"]).output().expect("list"));
    list.lines()
        .find(|l| l.contains(&format!(" {name} ")))
        .unwrap_or_else(|| panic!("no {name} in {list}"))
        .to_owned()
}

fn refused(out: Output) -> String {
    assert!(!out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_keys_egress_bound_is_set_normalized_shown_changed_and_cleared() {
    let dir = tempfile::Builder::new()
        .prefix("runcell-keys-egress-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("tempdir");
    let data = dir.path();

    // Two flags' worth, one with two patterns: normalized (case, trailing dot), deduplicated.
    let (key, stderr) = ok(runcell(data)
        .args([
            "keys",
            "create",
            "--name",
            "agent",
            "--tenant",
            "acme",
            "--egress-allow",
            "PyPI.org.,*.Example.com",
            "--egress-allow",
            "pypi.org",
        ])
        .output()
        .expect("create"));
    assert!(key.trim().starts_with("rc_"), "{key}");
    assert!(
        stderr.contains(
            "(agent): egress pypi.org, *.example.com (within the server's --egress-allow)"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("it is shown once"), "{stderr}");
    assert_eq!(
        column(data, "agent").as_deref(),
        Some(r#"["pypi.org","*.example.com"]"#)
    );
    assert!(list_line(data, "agent").contains("  egress=pypi.org,*.example.com  "));

    // The control: a key made without the flag has no bound of its own.
    ok(runcell(data)
        .args(["keys", "create", "--name", "plain", "--tenant", "acme"])
        .output()
        .expect("create"));
    assert_eq!(column(data, "plain"), None);
    assert!(list_line(data, "plain").contains("  egress=server  "));

    // No network at all, then back to the server's bound.
    let (_, stderr) = ok(runcell(data)
        .args(["keys", "update", "agent", "--egress-allow", "none"])
        .output()
        .expect("update"));
    assert!(stderr.contains("(agent): egress no network"), "{stderr}");
    assert_eq!(column(data, "agent").as_deref(), Some("[]"));
    assert!(list_line(data, "agent").contains("  egress=none  "));
    let (_, stderr) = ok(runcell(data)
        .args(["keys", "update", "agent", "--egress-allow", "server"])
        .output()
        .expect("update"));
    assert!(
        stderr.contains("(agent): egress the server's bound (serve --egress-allow)"),
        "{stderr}"
    );
    assert_eq!(column(data, "agent"), None);
    assert!(list_line(data, "agent").contains("  egress=server  "));
    ok(runcell(data)
        .args(["keys", "update", "agent", "--egress-allow", "127.0.0.2"])
        .output()
        .expect("update"));
    assert_eq!(column(data, "agent").as_deref(), Some(r#"["127.0.0.2"]"#));

    // Bad patterns and mixed words are refused before anything changes, and a create with
    // one makes no key.
    for (args, says) in [
        (
            vec!["keys", "update", "agent", "--egress-allow", "a..b"],
            "--egress-allow: invalid domain pattern \"a..b\": each label is 1 to 63 characters",
        ),
        (
            vec!["keys", "update", "agent", "--egress-allow", "pypi.org,none"],
            "--egress-allow none stands alone",
        ),
        (
            vec!["keys", "update", "agent", "--egress-allow", "*x.com"],
            "invalid domain pattern \"*x.com\"",
        ),
        (
            vec![
                "keys",
                "create",
                "--name",
                "bad",
                "--egress-allow",
                "a b.com",
            ],
            "invalid domain pattern \"a b.com\"",
        ),
    ] {
        let stderr = refused(runcell(data).args(&args).output().expect("run"));
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    assert_eq!(column(data, "agent").as_deref(), Some(r#"["127.0.0.2"]"#));
    let (list, _) = ok(runcell(data).args(["keys", "list"]).output().expect("list"));
    assert!(!list.contains(" bad "), "{list}");
}
