//! Session workspaces on disk, through a real `runcell serve`: a full workspace is ENOSPC and
//! not an OOM kill, and what was acknowledged (an upload, a file a cell wrote) is in the image
//! on disk at the reply and comes back after `kill -9` and a simulated reboot.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::serve::Serve;
use serde_json::{json, Value};

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client")
}

fn post(c: &reqwest::blocking::Client, url: String, body: Value) -> Value {
    c.post(url)
        .json(&body)
        .send()
        .and_then(|r| r.json())
        .expect("POST")
}

fn execute(c: &reqwest::blocking::Client, srv: &Serve, id: &str, code: &str) -> Value {
    post(
        c,
        format!("{}/v1/sessions/{id}/execute", srv.base),
        json!({ "code": code }),
    )
}

/// 200 MiB in 1 MiB writes (never more than a MiB in the kernel's own memory), then the next
/// 100 MiB until the workspace is full.
const FILL: &str = r#"
import errno, os
block = b"\1" * (1 << 20)
with open("big", "wb") as f:
    for _ in range(200):
        f.write(block)
print("wrote", os.path.getsize("big") >> 20)
"#;
const PAST: &str = r#"
with open("more", "wb") as f:
    for _ in range(100):
        f.write(b"\1" * (1 << 20))
        f.flush()
"#;

#[test]
fn a_full_workspace_is_enospc_and_the_session_lives_on() {
    let data = common::serve::data_dir("runcell-durable-full-");
    let c = http();
    let srv = common::serve::serve(&data, &["--warm-sessions", "0", "--no-zygote"]);
    let create = |srv: &Serve| -> String {
        let s = post(
            &c,
            format!("{}/v1/sessions", srv.base),
            json!({"limits": {"memory_mb": 128, "disk_mb": 256}}),
        );
        s["id"].as_str().expect("id").to_owned()
    };
    let id = create(&srv);
    let e = execute(&c, &srv, &id, FILL);
    assert_eq!(e["status"], "ok", "{e}");
    assert_eq!(e["stdout"], "wrote 200\n", "{e}");
    assert_eq!(e["usage"]["killed_by"], Value::Null, "{e}");
    let e = execute(&c, &srv, &id, "1+1");
    assert_eq!(e["results"][0]["data"]["text/plain"], "2", "{e}");
    // Past the 256 MiB: the cell sees ENOSPC, and the session is still the same one.
    let e = execute(&c, &srv, &id, &format!("x = 41\n{PAST}"));
    assert_eq!(e["status"], "error", "{e}");
    assert_eq!(e["error"]["name"], "OSError", "{e}");
    assert!(
        e["error"]["value"]
            .as_str()
            .unwrap_or_default()
            .starts_with("[Errno 28] No space left on device"),
        "{e}"
    );
    let e = execute(&c, &srv, &id, "x + 1");
    assert_eq!(e["results"][0]["data"]["text/plain"], "42", "{e}");
    // An upload into the full workspace is refused as on a full tmpfs (400 limit_exceeded),
    // not taken from the blocks ext4 keeps for root.
    let put = c
        .put(format!("{}/v1/sessions/{id}/files/upload.bin", srv.base))
        .body(vec![0u8; 1 << 20])
        .send()
        .expect("upload");
    assert_eq!(put.status(), 400);
    let body: Value = put.json().expect("json");
    assert_eq!(body["error"]["code"], "limit_exceeded", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("the workspace is full"),
        "{body}"
    );
    drop(srv);

    // Control: the same cell in a workspace in memory (tmpfs) is the session's memory, and the
    // kernel is OOM-killed.
    let mem = common::serve::serve(
        &data,
        &[
            "--warm-sessions",
            "0",
            "--no-zygote",
            "--workspaces-in-memory",
        ],
    );
    let id = create(&mem);
    let e = execute(&c, &mem, &id, FILL);
    assert_eq!(e["status"], "killed", "{e}");
    assert_eq!(e["usage"]["killed_by"], "oom", "{e}");
}

/// The files of a mounted copy of `image` (taken now: what a power cut would leave), `name`'s
/// bytes or `None`.
fn in_image_copy(image: &Path, name: &str) -> Option<Vec<u8>> {
    let dir = tempfile::tempdir().expect("tmp");
    let copy = dir.path().join("copy.ext4");
    let ok = Command::new("cp")
        .args(["--sparse=always"])
        .arg(image)
        .arg(&copy)
        .status()
        .expect("cp");
    assert!(ok.success());
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    // Mounting replays the copy's journal, as the next boot would.
    let ok = Command::new("mount")
        .args(["-o", "loop"])
        .arg(&copy)
        .arg(&mnt)
        .status()
        .expect("mount");
    assert!(ok.success(), "mount the copy");
    let got = std::fs::read(mnt.join(name)).ok();
    let _ = Command::new("umount").arg(&mnt).status();
    got
}

/// Processes whose real uid is `uid`.
fn processes_of(uid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let real = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next()?.parse::<u32>().ok());
        if real == Some(uid) {
            out.push(pid);
        }
    }
    out
}

/// Mount points under `dir`, deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let prefix = format!("{}/", dir.display());
    let mut m: Vec<PathBuf> = std::fs::read_to_string("/proc/self/mounts")
        .expect("mounts")
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .filter(|m| m.starts_with(&prefix))
        .map(PathBuf::from)
        .collect();
    m.sort();
    m.reverse();
    m
}

/// Loop devices reading a file under `dir`.
fn loops_under(dir: &Path) -> Vec<String> {
    let real = std::fs::canonicalize(dir).expect("real");
    let prefix = format!("{}/", real.display());
    std::fs::read_dir("/sys/block")
        .expect("sys")
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let f = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            f.starts_with(&prefix).then_some(name)
        })
        .collect()
}

#[test]
fn acknowledged_files_survive_kill_9_and_a_reboot() {
    let data = common::serve::data_dir("runcell-durable-reboot-");
    let c = http();
    let mut first = common::serve::serve(&data, &["--warm-sessions", "0", "--no-zygote"]);
    let s = post(&c, format!("{}/v1/sessions", first.base), json!({}));
    let id = s["id"].as_str().expect("id").to_owned();
    let put = c
        .put(format!(
            "{}/v1/sessions/{id}/files/in/upload.txt",
            first.base
        ))
        .body("uploaded before the crash")
        .send()
        .expect("upload");
    assert_eq!(put.status(), 201);
    let e = execute(
        &c,
        &first,
        &id,
        "v = 7\nopen('written.txt', 'w').write('written by a cell')",
    );
    assert_eq!(e["status"], "ok", "{e}");
    // At the reply, both are in the image on disk (a copy of it has them), well before the
    // kernel's own writeback (30 s) would have put them there.
    let image = data.join("workspace-images").join(format!("{id}.ext4"));
    assert_eq!(
        in_image_copy(&image, "in/upload.txt").as_deref(),
        Some(&b"uploaded before the crash"[..])
    );
    assert_eq!(
        in_image_copy(&image, "written.txt").as_deref(),
        Some(&b"written by a cell"[..])
    );
    // Control: a file written after the last reply, by a process the cell left behind, is not
    // (yet) in the image: the copy would show a missing sync.
    let e = execute(
        &c,
        &first,
        &id,
        "import subprocess\nsubprocess.Popen(['sh', '-c', 'sleep 0.3; echo late > late.txt'], start_new_session=True)",
    );
    assert_eq!(e["status"], "ok", "{e}");
    std::thread::sleep(Duration::from_secs(1));
    let uid = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(data.join("workspaces").join(&id))
            .expect("workspace")
            .uid()
    };
    assert_ne!(
        in_image_copy(&image, "late.txt").as_deref(),
        Some(&b"late\n"[..]),
        "control: unsynced data is not in the image yet"
    );

    // The crash: the server, then every sandbox process, then every mount runcell made (what
    // a reboot does), and the loop devices with them.
    first.kill9();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = processes_of(uid);
        if left.is_empty() {
            break;
        }
        for pid in left {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        assert!(Instant::now() < deadline, "sandbox processes left");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mounts = mounts_under(&data);
    assert!(
        mounts.iter().any(|m| m.ends_with(&id)),
        "control: the workspace was mounted: {mounts:?}"
    );
    for m in mounts {
        let ok = Command::new("umount").arg(&m).status().expect("umount");
        assert!(ok.success(), "umount {}", m.display());
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while !loops_under(&data).is_empty() {
        assert!(
            Instant::now() < deadline,
            "loop devices left: {:?}",
            loops_under(&data)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(mounts_under(&data).is_empty());

    // The next start finds the image and mounts it again: the session comes back paused with
    // its files, and resumes on its first request.
    let second = common::serve::serve(&data, &["--warm-sessions", "0", "--no-zygote"]);
    let s: Value = c
        .get(format!("{}/v1/sessions/{id}", second.base))
        .send()
        .and_then(|r| r.json())
        .expect("session");
    assert_eq!(s["status"], "paused", "{s}");
    let body = c
        .get(format!(
            "{}/v1/sessions/{id}/files/in/upload.txt",
            second.base
        ))
        .send()
        .and_then(|r| r.text())
        .expect("download");
    assert_eq!(body, "uploaded before the crash");
    let e = execute(&c, &second, &id, "print(open('written.txt').read())\nv");
    assert_eq!(e["stdout"], "written by a cell\n", "{e}");
    // What came back of the variables (from the last idle snapshot, if one was taken before
    // the kill: crates/cli/tests/durable_sessions.rs checks that) is said.
    assert!(e["restored"].is_object(), "{e}");
    // A clean stop pauses it and unmounts its workspace, keeping the image.
    drop(second);
    assert!(mounts_under(&data).is_empty(), "{:?}", mounts_under(&data));
}
