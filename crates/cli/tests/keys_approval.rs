//! `runcell keys create|update --approval` and `keys list`: a key's approval default as the
//! operator sets it, in a real database file (what the server reads at authentication is the
//! store's contract, tested on both backends in crates/store/tests/both.rs, and its effect on
//! requests in crates/server/tests/vendor_approvals.rs).

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

/// The `approval` column of the key named `name`, read from the file itself.
fn column(data: &Path, name: &str) -> Option<String> {
    let db = rusqlite::Connection::open(data.join("runcell.db")).expect("open");
    db.query_row(
        "SELECT approval FROM api_keys WHERE name = ?1",
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

#[test]
fn a_keys_approval_default_is_set_shown_changed_and_cleared() {
    let dir = tempfile::Builder::new()
        .prefix("runcell-keys-approval-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("tempdir");
    let data = dir.path();

    let (key, stderr) = ok(runcell(data)
        .args([
            "keys",
            "create",
            "--name",
            "agent",
            "--tenant",
            "acme",
            "--approval",
            "always",
        ])
        .output()
        .expect("create"));
    assert!(key.trim().starts_with("rc_"), "{key}");
    assert!(
        stderr.contains("for tenant acme, approval always; it is shown once"),
        "{stderr}"
    );
    assert_eq!(column(data, "agent").as_deref(), Some("always"));
    assert!(list_line(data, "agent").contains("approval=always"));

    // The control: a key made without the flag has no default.
    ok(runcell(data)
        .args(["keys", "create", "--name", "plain", "--tenant", "acme"])
        .output()
        .expect("create"));
    assert_eq!(column(data, "plain"), None);
    assert!(list_line(data, "plain").contains("approval=none"));

    let (_, stderr) = ok(runcell(data)
        .args(["keys", "update", "agent", "--approval", "never"])
        .output()
        .expect("update"));
    assert!(stderr.contains("(agent): approval never"), "{stderr}");
    assert_eq!(column(data, "agent").as_deref(), Some("never"));
    ok(runcell(data)
        .args(["keys", "update", "agent", "--approval", "none"])
        .output()
        .expect("update"));
    assert_eq!(column(data, "agent"), None);
    assert!(list_line(data, "agent").contains("approval=none"));

    // Bad words are refused before anything changes.
    let out = runcell(data)
        .args(["keys", "update", "plain", "--approval", "sometimes"])
        .output()
        .expect("update");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("invalid value 'sometimes' for '--approval"),
        "{stderr}"
    );
    assert_eq!(column(data, "plain"), None);
}
