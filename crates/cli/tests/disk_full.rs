//! `runcell serve` on a data dir whose filesystem fills up: every write is a 507
//! `insufficient_storage` a client can act on, reads keep working, the server starts on the
//! full disk, and writes work again once space is freed — without a restart.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::serve::Serve;
use serde_json::{json, Value};

/// A small tmpfs mounted on a fresh directory for the test's data dir; unmounted on drop.
struct SmallDisk {
    dir: PathBuf,
}

impl SmallDisk {
    fn mount(size: &str) -> SmallDisk {
        let dir = tempfile::Builder::new()
            .prefix("runcell-disk-full-")
            .tempdir()
            .expect("tempdir")
            .keep();
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(&dir)
            .status()
            .expect("mount");
        assert!(ok.success(), "mount a tmpfs (the test runs as root)");
        SmallDisk { dir }
    }

    /// Fills what is left with `name`, to the last byte the filesystem takes.
    fn fill(&self, name: &str) {
        let mut f = std::fs::File::create(self.dir.join(name)).expect("filler");
        let block = vec![0u8; 64 << 10];
        loop {
            match f.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
                Err(e) => panic!("fill: {e}"),
            }
        }
        // Single bytes after the last whole block.
        while f.write(&[0]).is_ok_and(|n| n == 1) {}
        let _ = f.sync_all();
    }

    fn free(&self, name: &str) {
        std::fs::remove_file(self.dir.join(name)).expect("free");
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn serve(data: &Path) -> Serve {
    common::serve::serve(data, &["--warm-sessions", "0", "--no-zygote"])
}

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
}

/// The status and JSON body of a request.
fn send(req: reqwest::blocking::RequestBuilder) -> (u16, Value) {
    let resp = req.send().expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().unwrap_or(Value::Null))
}

/// A 507 in the error envelope.
fn assert_no_space(what: &str, (status, body): (u16, Value)) {
    assert_eq!(status, 507, "{what}: {body}");
    assert_eq!(
        body["error"]["code"], "insufficient_storage",
        "{what}: {body}"
    );
}

#[test]
fn a_full_data_dir_refuses_writes_with_507_serves_reads_and_recovers() {
    let disk = SmallDisk::mount("8m");
    let data = &disk.dir;
    runcell_engine::testing::python_runtime(Path::new(env!("CARGO_TARGET_TMPDIR")));
    std::os::unix::fs::symlink(
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("runcell-test-runtimes/runtimes"),
        data.join("runtimes"),
    )
    .expect("link runtimes");
    let c = http();

    let srv = serve(data);
    let b = &srv.base;
    let (status, s) = send(c.post(format!("{b}/v1/sessions")).json(&json!({})));
    assert_eq!(status, 201, "{s}");
    let sid = s["id"].as_str().expect("id").to_owned();
    let execute = |code: &str| {
        c.post(format!("{b}/v1/sessions/{sid}/execute"))
            .json(&json!({ "code": code }))
    };
    let (status, first) = send(execute("x = 40\nx + 2"));
    assert_eq!(status, 200, "{first}");

    disk.fill("filler");
    assert_no_space("execute", send(execute("x + 1")));
    assert_no_space(
        "upload",
        send(
            c.put(format!("{b}/v1/sessions/{sid}/files/a.txt"))
                .body("hello"),
        ),
    );
    assert_no_space(
        "create",
        send(c.post(format!("{b}/v1/sessions")).json(&json!({}))),
    );
    // The refused create ended its session, whose workspace image (on this disk) goes with it,
    // off the request's path: once it is gone, full again.
    let images = data.join("workspace-images");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::fs::read_dir(&images)
        .expect("images")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .any(|n| n.ends_with(".ext4") && n != format!("{sid}.ext4"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the refused create's image stays"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    disk.fill("filler-after-create");
    assert_no_space(
        "one-shot",
        send(
            c.post(format!("{b}/v1/execute"))
                .json(&json!({"code": "print(1)"})),
        ),
    );
    // The refused create left no session behind.
    let (status, list) = send(c.get(format!("{b}/v1/sessions")));
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["sessions"].as_array().map(Vec::len), Some(1), "{list}");
    // Reads: what was recorded before is all there, and nothing refused was recorded.
    let (status, ex) = send(c.get(format!("{b}/v1/executions")));
    assert_eq!(status, 200, "{ex}");
    let ids: Vec<&str> = ex["executions"]
        .as_array()
        .expect("executions")
        .iter()
        .filter_map(|e| e["id"].as_str())
        .collect();
    assert_eq!(ids, vec![first["id"].as_str().expect("id")], "{ex}");
    let (status, _) = send(c.get(format!("{b}/v1/sessions/{sid}/files")));
    assert_eq!(status, 200);
    // A delete the store cannot record changes nothing: the session is still there.
    assert_no_space("delete", send(c.delete(format!("{b}/v1/sessions/{sid}"))));
    let (status, s) = send(c.get(format!("{b}/v1/sessions/{sid}")));
    assert_eq!((status, &s["status"]), (200, &json!("ready")), "{s}");
    let (status, e) = send(execute("x"));
    assert_no_space("execute after the refused delete", (status, e));
    drop(srv);

    // A server starts on the full disk (filled again: stopping may have freed a little).
    disk.fill("filler2");
    let srv = serve(data);
    let b = &srv.base;
    let (status, ex) = send(c.get(format!("{b}/v1/executions")));
    assert_eq!(status, 200, "{ex}");
    assert_eq!(ex["executions"].as_array().map(Vec::len), Some(1), "{ex}");
    let (status, verify) = send(c.get(format!("{b}/v1/audit/verify")));
    assert_eq!((status, &verify["ok"]), (200, &json!(true)), "{verify}");
    assert_no_space(
        "create on a full disk after a restart",
        send(c.post(format!("{b}/v1/sessions")).json(&json!({}))),
    );

    // Space freed: writes work again, with no restart.
    disk.free("filler");
    disk.free("filler-after-create");
    disk.free("filler2");
    let (status, s) = send(c.post(format!("{b}/v1/sessions")).json(&json!({})));
    assert_eq!(status, 201, "{s}");
    let sid = s["id"].as_str().expect("id");
    let (status, e) = send(
        c.post(format!("{b}/v1/sessions/{sid}/execute"))
            .json(&json!({"code": "6 * 7"})),
    );
    assert_eq!(status, 200, "{e}");
    assert_eq!(e["results"][0]["data"]["text/plain"], "42", "{e}");
    let (status, up) = send(
        c.put(format!("{b}/v1/sessions/{sid}/files/a.txt"))
            .body("hi"),
    );
    assert_eq!(status, 201, "{up}");
    let (status, ex) = send(c.get(format!("{b}/v1/executions")));
    assert_eq!(status, 200);
    assert_eq!(ex["executions"].as_array().map(Vec::len), Some(2), "{ex}");
    drop(srv);
}
