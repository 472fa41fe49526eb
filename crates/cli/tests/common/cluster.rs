//! Several `runcell serve` nodes on one real PostgreSQL (the store tests' server, started by
//! the test binary): a database of their own, the shared audit keys and cluster secret, API
//! keys made with `runcell keys`, and nodes on free ports, each `http://127.0.0.1:PORT`.

use std::path::Path;

use super::serve::{data_dir, runcell, DataDir, Serve, UnmountOnDrop};

#[path = "../../../store/tests/common/pg.rs"]
#[allow(dead_code, reason = "the store tests use the rest")]
pub mod pg;

/// One database and what its nodes share.
pub struct Cluster {
    /// `--database` and the audit keys: what every command on the database takes.
    pub flags: Vec<String>,
    /// `--cluster-secret-file FILE`.
    pub secret: Vec<String>,
    keys: tempfile::TempDir,
}

/// A node of a [`Cluster`]: stopped (SIGTERM) when dropped, then its data dir unmounted and
/// removed.
pub struct Node {
    pub serve: Serve,
    _unmount: UnmountOnDrop,
    _data: DataDir,
}

impl Node {
    /// `http://127.0.0.1:PORT`, the node's URL and id.
    pub fn url(&self) -> &str {
        &self.serve.base
    }
}

impl Cluster {
    pub fn new() -> Cluster {
        let server = pg::pg_server();
        let conninfo = server.new_database();
        let db = conninfo.rsplit("dbname=").next().expect("dbname");
        let url = format!(
            "postgres://{}@/{db}?host={}",
            pg::PG_USER,
            server.socket_dir().display()
        );
        let keys = tempfile::tempdir().expect("tempdir");
        let flags = vec![
            "--database".into(),
            url,
            "--audit-key-file".into(),
            keys.path().join("audit-chain.key").display().to_string(),
            "--audit-signing-key-file".into(),
            keys.path().join("audit-signing.key").display().to_string(),
        ];
        let file = keys.path().join("cluster.secret");
        std::fs::write(&file, "0123456789abcdef0123456789abcdef-cluster\n").expect("secret");
        let secret = vec!["--cluster-secret-file".into(), file.display().to_string()];
        Cluster {
            flags,
            secret,
            keys,
        }
    }

    /// `runcell keys create --name NAME ARGS...` on the database: the key.
    pub fn key(&self, name: &str, args: &[&str]) -> String {
        let args = [&["--name", name][..], args].concat();
        super::serve::create_key(self.keys.path(), &self.flags, &args)
    }

    /// A node with `extra` flags beside the database, the secret and `--node-url`.
    pub fn node(&self, extra: &[&str]) -> Node {
        let data = data_dir("runcell-cluster-");
        let unmount = UnmountOnDrop(data.to_path_buf());
        let serve = node_on(&data, &[&self.flags[..], &self.secret[..]].concat(), extra);
        Node {
            serve,
            _unmount: unmount,
            _data: data,
        }
    }
}

/// `runcell serve` on a free port, as node `http://127.0.0.1:PORT`.
fn node_on(data: &Path, flags: &[String], extra: &[&str]) -> Serve {
    use std::io::{BufRead, BufReader};
    let port = super::serve::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut child = runcell(data)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--node-url", &url])
        .args(flags)
        .args(extra)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("serve");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut log = Vec::new();
    loop {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("serve exited early:\n{}", log.join("\n")))
            .expect("log line");
        if line.contains("runcell serving on") {
            break;
        }
        log.push(line);
    }
    std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
    Serve::adopt(child, url)
}
