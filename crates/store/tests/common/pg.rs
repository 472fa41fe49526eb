//! A real PostgreSQL for the tests: one server per test binary, made with Debian's `initdb`
//! and started with `pg_ctl` in a temporary directory, listening on a Unix socket only. Each
//! test gets a database of its own on it.
//!
//! PostgreSQL refuses to run as root, so as root (CI) the server runs as `nobody`, which owns
//! its directory. A watchdog process outlives nothing: it stops the server (SIGQUIT, an
//! immediate shutdown) and removes the directory once the test binary has exited, however it
//! exited. The binaries are found in `RUNCELL_TEST_PG_BIN` or Debian's
//! `/usr/lib/postgresql/<version>/bin` (`.ci/run` installs the `postgresql` package when
//! they are missing); without them the tests fail, they never pass unrun.

use std::os::unix::fs::chown;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// The running test server.
#[derive(Debug)]
pub struct PgServer {
    bin: PathBuf,
    /// Holds `data/` and the socket; removed by the watchdog.
    dir: PathBuf,
    /// The id PostgreSQL runs as (`None`: as the test itself).
    run_as: Option<(u32, u32)>,
    /// Its TCP port on 127.0.0.1, when it listens there too (the TLS server).
    port: Option<u16>,
}

/// The superuser `initdb` makes; connections over the socket are trusted.
pub const PG_USER: &str = "runcell";

static SERVER: OnceLock<PgServer> = OnceLock::new();

/// The server, started on first use.
pub fn pg_server() -> &'static PgServer {
    SERVER.get_or_init(PgServer::start)
}

fn pg_bin() -> PathBuf {
    if let Some(dir) = std::env::var_os("RUNCELL_TEST_PG_BIN") {
        return PathBuf::from(dir);
    }
    // The newest Debian version installed (the project targets PostgreSQL 15, Debian 12's).
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    found.sort();
    match found.pop() {
        Some((_, bin)) => bin,
        None => panic!(
            "PostgreSQL's server binaries are missing: `apt-get install postgresql` (Debian), \
             or set RUNCELL_TEST_PG_BIN to the directory holding initdb and pg_ctl"
        ),
    }
}

/// `nobody`'s uid and gid, from /etc/passwd.
fn nobody() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    passwd
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.first() == Some(&"nobody") && f.len() > 3)
                .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
                .flatten()
        })
        .expect("a user `nobody` to run PostgreSQL as")
}

fn is_root() -> bool {
    // The owner of a file the test just made is the test's effective uid.
    let probe = tempfile::NamedTempFile::new().expect("probe file");
    std::os::unix::fs::MetadataExt::uid(&probe.as_file().metadata().expect("probe metadata")) == 0
}

impl PgServer {
    /// A server of its own (for a test that stops and restarts it); most tests share
    /// [`pg_server`].
    pub fn start() -> PgServer {
        PgServer::start_with(None)
    }

    /// A server of its own that also listens on 127.0.0.1 and 127.0.0.2 (the port:
    /// [`PgServer::port`])
    /// with TLS, `cert_pem` and `key_pem` its certificate and key, and takes TCP
    /// connections only with TLS (`hostssl`: a plain one is refused).
    pub fn start_tls(cert_pem: &str, key_pem: &str) -> PgServer {
        PgServer::start_with(Some((cert_pem, key_pem)))
    }

    /// The TCP port of a [`PgServer::start_tls`] server.
    pub fn port(&self) -> u16 {
        self.port.expect("a TLS server listens on TCP")
    }

    fn start_with(tls: Option<(&str, &str)>) -> PgServer {
        let bin = pg_bin();
        let dir = tempfile::Builder::new()
            .prefix("runcell-pg-")
            .tempdir()
            .expect("tempdir")
            .keep();
        let run_as = is_root().then(nobody);
        if let Some((uid, gid)) = run_as {
            chown(&dir, Some(uid), Some(gid)).expect("chown the server's directory");
        }
        let port = tls.map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("a free port")
        });
        let server = PgServer {
            bin,
            dir,
            run_as,
            port,
        };
        server.watch();
        let data = server.dir.join("data");
        server.run(
            Command::new(server.bin.join("initdb"))
                .arg("-D")
                .arg(&data)
                .args(["-U", PG_USER, "--auth=trust", "-E", "UTF8", "--locale=C"])
                // No fsync of the new cluster: it lives as long as this test binary.
                .arg("--no-sync"),
        );
        // Socket only (no TCP), room for many stores' connections, and no fsync: a test
        // server, killed at the end anyway. Commits still go through the WAL as usual.
        let mut options = format!(
            "-k {} -c listen_addresses='' -c max_connections=300 -c fsync=off \
             -c full_page_writes=off",
            server.dir.display()
        );
        if let (Some((cert, key)), Some(port)) = (tls, port) {
            use std::os::unix::fs::PermissionsExt;
            for (name, pem) in [("server.crt", cert), ("server.key", key)] {
                let path = server.dir.join(name);
                std::fs::write(&path, pem).expect("write the server's TLS files");
                // PostgreSQL refuses a key others can read.
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                    .expect("chmod");
                if let Some((uid, gid)) = run_as {
                    chown(&path, Some(uid), Some(gid)).expect("chown");
                }
            }
            std::fs::write(
                data.join("pg_hba.conf"),
                "local all all trust\nhostssl all all 127.0.0.0/8 trust\n",
            )
            .expect("write pg_hba.conf");
            options = format!(
                "-k {dir} -c listen_addresses=127.0.0.1,127.0.0.2 -p {port} -c max_connections=100 \
                 -c fsync=off -c ssl=on -c ssl_cert_file={dir}/server.crt \
                 -c ssl_key_file={dir}/server.key",
                dir = server.dir.display()
            );
        }
        std::fs::write(server.dir.join("options"), options).expect("write the server options");
        server.pg_start();
        server
    }

    /// Starts the server (`pg_ctl start`, waiting until it accepts connections).
    pub fn pg_start(&self) {
        let options = std::fs::read_to_string(self.dir.join("options")).expect("options");
        self.run(
            Command::new(self.bin.join("pg_ctl"))
                .arg("-D")
                .arg(self.dir.join("data"))
                .args(["-o", &options, "-w", "-t", "60", "-l"])
                .arg(self.dir.join("log"))
                .arg("start"),
        );
    }

    /// Stops the server the way a restart does (`pg_ctl stop -m fast`: connections are
    /// closed, open transactions rolled back).
    pub fn pg_stop(&self) {
        self.run(
            Command::new(self.bin.join("pg_ctl"))
                .arg("-D")
                .arg(self.dir.join("data"))
                .args(["-m", "fast", "-w", "stop"]),
        );
    }

    /// Runs a server binary as the server's user; panics with its output if it fails.
    fn run(&self, cmd: &mut Command) {
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid);
        }
        let out = cmd
            .current_dir(&self.dir)
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
        let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
        assert!(
            out.status.success(),
            "{cmd:?}: {}\n{}\n{}\nserver log:\n{log}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts the process that stops the server and removes its directory once this test
    /// binary is gone (its own process group, so a ^C to the tests does not take it too).
    fn watch(&self) {
        // In the background of a shell that exits at once (so nothing is left to wait for).
        let script = r#"(
            while kill -0 "$1" 2>/dev/null; do sleep 1; done
            pid=$(head -n 1 "$2/data/postmaster.pid" 2>/dev/null)
            [ -n "$pid" ] && kill -QUIT "$pid" 2>/dev/null
            for _ in 1 2 3 4 5 6 7 8 9 10; do [ -e "$2/data/postmaster.pid" ] || break; sleep 0.5; done
            rm -rf "$2"
        ) &"#;
        let status = Command::new("sh")
            .args(["-c", script, "runcell-pg-watchdog"])
            .arg(std::process::id().to_string())
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .status()
            .expect("start the test server's watchdog");
        assert!(status.success(), "the watchdog's shell: {status}");
    }

    /// The directory holding the server's Unix socket.
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    /// A fresh, empty database and its connection string.
    pub fn new_database(&self) -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "t{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        self.psql("postgres", &format!("CREATE DATABASE {name}"))
            .unwrap_or_else(|e| panic!("create database {name}: {e}"));
        match self.port {
            Some(port) => format!(
                "host={} port={port} user={PG_USER} dbname={name}",
                self.dir.display()
            ),
            None => format!("host={} user={PG_USER} dbname={name}", self.dir.display()),
        }
    }

    /// Runs `sql` with `psql` in database `db`; its output (unaligned, tuples only), or its
    /// error.
    pub fn psql(&self, db: &str, sql: &str) -> Result<String, String> {
        let out = Command::new(self.bin.join("psql"))
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(&self.dir)
            .args(self.port.map(|p| format!("-p{p}")))
            .args(["-U", PG_USER, "-d", db, "-c", sql])
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .output()
            .expect("run psql");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// Everything in database `db`, as `pg_dump` writes it.
    pub fn dump(&self, db: &str) -> Vec<u8> {
        let out = Command::new(self.bin.join("pg_dump"))
            .arg("-h")
            .arg(&self.dir)
            .args(["-U", PG_USER, db])
            .stdin(Stdio::null())
            .output()
            .expect("run pg_dump");
        assert!(
            out.status.success(),
            "pg_dump: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }
}
