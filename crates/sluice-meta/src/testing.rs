//! A real etcd for tests: Debian's `etcd-server`, started on free ports with
//! its data in a temporary directory, stopped on drop. Never a mock.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running single-node etcd.
#[derive(Debug)]
pub struct EtcdServer {
    child: Child,
    dir: PathBuf,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl EtcdServer {
    /// Whether an `etcd` binary is installed.
    pub fn available() -> bool {
        Command::new("etcd")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Whether tests must have etcd (CI sets `SLUICE_REQUIRE_ETCD=1`, so a
    /// missing etcd fails there instead of skipping).
    pub fn required() -> bool {
        std::env::var("SLUICE_REQUIRE_ETCD").is_ok_and(|v| v == "1")
    }

    /// Starts etcd, or returns None (printing why) when it is not installed
    /// and not required. Panics when required and missing: a test helper.
    pub fn start_or_skip(test: &str) -> Option<EtcdServer> {
        if !Self::available() {
            assert!(!Self::required(), "etcd is required (SLUICE_REQUIRE_ETCD=1) but not installed: apt-get install etcd-server");
            eprintln!(
                "{test}: skipped: etcd not installed (apt-get install etcd-server; CI requires it)"
            );
            return None;
        }
        match Self::start() {
            Ok(s) => Some(s),
            Err(e) => panic!("{test}: starting etcd: {e}"),
        }
    }

    /// Starts etcd on free loopback ports and waits until it answers.
    pub fn start() -> std::io::Result<EtcdServer> {
        let client = free_port()?;
        let peer = free_port()?;
        let dir = std::env::temp_dir().join(format!("sluice-etcd-{}-{client}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.join("etcd.log"))?;
        let child = Command::new("etcd")
            .args(["--name", "sluice-test", "--data-dir"])
            .arg(dir.join("data"))
            .args([
                "--listen-client-urls",
                &endpoint,
                "--advertise-client-urls",
                &endpoint,
            ])
            .args([
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
            ])
            .args(["--initial-cluster", &format!("sluice-test={peer_url}")])
            .args(["--log-level", "warn"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        let mut server = EtcdServer {
            child,
            dir,
            endpoint,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", client)).is_ok() {
                return Ok(server);
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                let log = std::fs::read_to_string(server.dir.join("etcd.log")).unwrap_or_default();
                return Err(std::io::Error::other(format!(
                    "etcd exited with {status}: {log}"
                )));
            }
            if Instant::now() > deadline {
                return Err(std::io::Error::other("etcd did not listen within 20 s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
