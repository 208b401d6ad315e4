//! Wrong flags and bad files give a clear error that names what is wrong,
//! a non-zero exit, and never a panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn fails_naming(args: &[&str], needle: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .expect("sluice runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "`sluice {}` should fail",
        args.join(" ")
    );
    assert!(
        !err.contains("panicked"),
        "`sluice {}` panicked: {err}",
        args.join(" ")
    );
    assert!(
        err.contains(needle),
        "`sluice {}`: error should name `{needle}`: {err}",
        args.join(" ")
    );
}

#[test]
fn target_flags() {
    fails_naming(&["target", "--workers", "0"], "--workers");
    fails_naming(&["target", "--polling", "sometimes"], "--polling");
    fails_naming(&["target", "--listen", "nowhere"], "--listen");
    fails_naming(&["target", "--ram-size", "1000"], "--ram-size");
    fails_naming(&["target", "--ram-size", "lots"], "--ram-size");
    fails_naming(&["target", "--allow-host", "not-an-nqn"], "--allow-host");
    fails_naming(
        &["target", "--config", "/nonexistent/sluice.toml"],
        "/nonexistent/sluice.toml",
    );
}

#[test]
fn config_files() {
    let dir = std::env::temp_dir().join(format!("sluice-cli-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        ("[target]\nworkers = 0\n", "target.workers"),
        ("[target]\nunknown_key = 1\n", "unknown_key"),
        ("[[subsystem]]\nnqn = \"nqn.x:y\"\n", "subsystem[0].hosts"),
        ("not toml at all [", "(file)"),
        (
            "[target]\ntcp_congestion = \"cu bic\"\n",
            "target.tcp_congestion",
        ),
    ];
    for (i, (text, key)) in cases.iter().enumerate() {
        let p = dir.join(format!("c{i}.toml"));
        std::fs::write(&p, text).unwrap();
        fails_naming(&["check-config", p.to_str().unwrap()], key);
        fails_naming(&["target", "--config", p.to_str().unwrap()], key);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A congestion control the kernel lacks passes the config's name check
/// and stops the start: the error names the key and what the kernel
/// offers, and prints the kernel's reason once.
#[test]
fn an_unknown_tcp_congestion_stops_the_target() {
    let dir = std::env::temp_dir().join(format!("sluice-cli-cc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("t.toml");
    std::fs::write(
        &p,
        "[target]\nlisten = \"127.0.0.1:0\"\ndiscovery_listen = \"\"\ntcp_congestion = \"no-such-cc\"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["target", "--config", p.to_str().unwrap()])
        .output()
        .expect("sluice runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the target started: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains("target.tcp_congestion: cannot use `no-such-cc`") && err.contains("reno"),
        "{err}"
    );
    let reason = std::io::Error::from_raw_os_error(2).to_string();
    assert_eq!(err.matches(&reason).count(), 1, "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn host_flags() {
    fails_naming(
        &[
            "bench",
            "--target",
            "127.0.0.1:1",
            "--nqn",
            "x",
            "--bs",
            "3x",
        ],
        "--bs",
    );
    fails_naming(
        &[
            "bench",
            "--target",
            "127.0.0.1:1",
            "--nqn",
            "x",
            "--rw",
            "sideways",
        ],
        "--rw",
    );
    // Nothing listens on port 1: a clear connection error, no hang.
    fails_naming(
        &[
            "bench",
            "--target",
            "127.0.0.1:1",
            "--nqn",
            "x",
            "--runtime",
            "1",
        ],
        "127.0.0.1:1",
    );
    let bench = ["bench", "--target", "127.0.0.1:1", "--nqn", "x"];
    let nbd = [
        "nbd",
        "--unix",
        "/nonexistent/s",
        "--target",
        "127.0.0.1:1",
        "--nqn",
        "x",
    ];
    for cc in ["cu bic", "", "sixteen-bytes-xx"] {
        for command in [&bench[..], &nbd[..]] {
            let mut args = command.to_vec();
            args.extend(["--tcp-congestion", cc]);
            fails_naming(&args, "--tcp-congestion");
        }
    }
    // Keeping SQ flow control is a switch of every host command.
    for command in ["bench", "nbd", "fuse"] {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args([command, "--help"])
            .output()
            .expect("sluice runs");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(
            help.contains("--sq-flow-control"),
            "{command} --help:\n{help}"
        );
        fails_naming(&[command, "--sq-flow-control=yes"], "--sq-flow-control");
    }
    fails_naming(&["discover", "-a", "nowhere"], "nowhere");
    fails_naming(&["nbd", "--target", "127.0.0.1:1", "--nqn", "x"], "--unix");
}

#[test]
fn export_accounting_flags() {
    let fuse = [
        "fuse",
        "--target",
        "127.0.0.1:1",
        "--nqn",
        "x",
        "/nonexistent",
    ];
    for share in ["0", "1.5", "NaN", "-0.1", "inf", "lots", ""] {
        let mut args = fuse.to_vec();
        args.extend(["--cpu-share", share]);
        fails_naming(&args, "--cpu-share");
    }
    for flag in ["--cpu-batch-ms", "--cpu-period-ms", "--cpu-k"] {
        let mut args = fuse.to_vec();
        args.extend([flag, "0"]);
        fails_naming(&args, flag);
    }
    let mut args = fuse.to_vec();
    args.extend(["--metrics", "nowhere"]);
    fails_naming(&args, "--metrics");
    // The FUSE transport: auto, fuser or uring, and nothing else.
    for t in ["sometimes", "URING2", ""] {
        let mut args = fuse.to_vec();
        args.extend(["--transport", t]);
        fails_naming(&args, "--transport");
    }
    fails_naming(
        &[
            "nbd",
            "--target",
            "127.0.0.1:1",
            "--unix",
            "/nonexistent/s",
            "--export",
            "a,nqn=s,hostnqn=h,cpu-share=0",
        ],
        "cpu-share",
    );
}
