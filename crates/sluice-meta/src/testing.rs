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

/// Ports below this are left alone (well-known and registered services).
const TEST_PORT_MIN: u16 = 20_000;

/// The first port of the kernel's ephemeral range (`bind(0)`, `connect`).
fn ephemeral_port_min() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768)
}

/// A loopback TCP port that is free now, for a test to hand to a process it
/// starts. It is chosen at random *below* the kernel's ephemeral range, so
/// the outgoing connections other tests open meanwhile cannot take it (a port
/// from `bind(0)` is an ephemeral one, and CI once lost etcd's to a client's
/// connection). Another test may still pick the same port before it is
/// bound, so starters that can tell should retry on "address in use".
pub fn free_loopback_port() -> std::io::Result<u16> {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    let ephemeral_min = ephemeral_port_min();
    if ephemeral_min <= TEST_PORT_MIN + 1_000 {
        // No room below the ephemeral range: take an ephemeral port.
        return Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port());
    }
    let span = u64::from(ephemeral_min - TEST_PORT_MIN);
    for _ in 0..256 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(DRAWS.fetch_add(1, Ordering::Relaxed));
        h.write_u32(std::process::id());
        let port = TEST_PORT_MIN + u16::try_from(h.finish() % span).unwrap_or(0);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        "no free loopback port below the ephemeral range after 256 draws",
    ))
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

    /// Starts etcd on free loopback ports and waits until it answers. A port
    /// taken between its choice and etcd's bind costs a new pair of ports,
    /// up to 5 times.
    pub fn start() -> std::io::Result<EtcdServer> {
        let mut attempt = 1;
        loop {
            match Self::start_once() {
                Err(e) if attempt < 5 && e.to_string().contains("address already in use") => {
                    eprintln!("etcd: a port was taken before etcd bound it; new ports (attempt {attempt})");
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    fn start_once() -> std::io::Result<EtcdServer> {
        let client = free_loopback_port()?;
        let peer = loop {
            let p = free_loopback_port()?;
            if p != client {
                break p;
            }
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_bindable_and_outside_the_ephemeral_range() {
        let ephemeral_min = ephemeral_port_min();
        for _ in 0..20 {
            let port = free_loopback_port().expect("a port");
            if ephemeral_min > TEST_PORT_MIN + 1_000 {
                assert!((TEST_PORT_MIN..ephemeral_min).contains(&port), "{port}");
            }
            TcpListener::bind(("127.0.0.1", port)).expect("the port is free");
        }
    }
}
