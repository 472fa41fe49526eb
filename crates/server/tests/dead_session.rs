//! A session whose kernel died and could not be restarted (the process was out of
//! descriptors) is `dead` while the engine still holds it: DELETE must end it there, not only
//! forget its row, or it stays listed and its workspace mounted. Its own test binary: it
//! lowers the whole process's open-files limit for a moment.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};

use serde_json::{json, Value};

/// One request on `tcp`, a keep-alive connection; the status and the JSON reply (or null).
fn send(
    tcp: &mut TcpStream,
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, Value) {
    tcp.write_all(
        format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .expect("write");
    let text = common::read_response(tcp);
    let (head, rest) = text.split_once("\r\n\r\n").expect("a response head");
    let status = head[9..12].parse().expect("status");
    (status, serde_json::from_str(rest).unwrap_or(Value::Null))
}

fn nofile() -> libc::rlimit {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid out-pointer.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    lim
}

fn set_nofile(lim: &libc::rlimit) {
    // SAFETY: `lim` is a valid rlimit; only the soft limit changes, within the hard one.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, lim) }, 0);
}

/// Takes every descriptor the process may still open, until dropped.
fn exhaust_descriptors() -> (libc::rlimit, Vec<std::fs::File>) {
    let before = nofile();
    let highest = std::fs::read_dir("/proc/self/fd")
        .expect("fds")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
        .max()
        .expect("an fd");
    set_nofile(&libc::rlimit {
        rlim_cur: highest + 1,
        rlim_max: before.rlim_max,
    });
    let mut fillers = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        fillers.push(f);
    }
    (before, fillers)
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_a_session_whose_kernel_could_not_restart_ends_it() {
    let srv = common::start().await;
    let addr = srv.addr;
    let workspaces = srv.engine.config().workspaces_dir();
    tokio::task::spawn_blocking(move || {
        let mut tcp = TcpStream::connect(addr).expect("connect");
        let (status, s) = send(&mut tcp, addr, "POST", "/v1/sessions", "{}");
        assert_eq!(status, 201, "{s}");
        let id = s["id"].as_str().expect("id").to_owned();
        let execute = format!("/v1/sessions/{id}/execute");
        let (status, e) = send(&mut tcp, addr, "POST", &execute, r#"{"code": "1"}"#);
        assert_eq!((status, &e["status"]), (200, &json!("ok")), "{e}");

        // The kernel dies while no descriptor is left for its successor.
        let (limit, fillers) = exhaust_descriptors();
        let code = r#"{"code": "import os; os.kill(os.getpid(), 9)"}"#;
        let _ = send(&mut tcp, addr, "POST", &execute, code);
        drop(fillers);
        set_nofile(&limit);

        let (status, info) = send(&mut tcp, addr, "GET", &format!("/v1/sessions/{id}"), "");
        assert_eq!((status, &info["status"]), (200, &json!("dead")), "{info}");
        assert!(workspaces.join(&id).exists());

        let (status, _) = send(&mut tcp, addr, "DELETE", &format!("/v1/sessions/{id}"), "");
        assert_eq!(status, 204);
        let (_, list) = send(&mut tcp, addr, "GET", "/v1/sessions", "");
        assert_eq!(
            list["sessions"],
            json!([]),
            "a deleted session is still listed"
        );
        let (status, _) = send(&mut tcp, addr, "GET", &format!("/v1/sessions/{id}"), "");
        assert_eq!(status, 404);
        assert!(
            !workspaces.join(&id).exists(),
            "a deleted session's workspace is still there"
        );
    })
    .await
    .expect("join");
}
