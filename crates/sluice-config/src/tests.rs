//! Parsing real TOML text, errors naming keys, builders, and the
//! `Config` ⇄ TOML round trip.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::tenants::{CostKind, RateSpec, SchedulerMode, WEIGHT_MAX};

fn must_fail(toml: &str, key: &str) -> ConfigError {
    let e = Config::from_toml(toml).expect_err("config should be rejected");
    assert_eq!(e.key, key, "{e}");
    e
}

const HOSTS: &str = r#"hosts = ["nqn.2014-08.org.nvmexpress:uuid:1"]"#;

#[test]
fn full_config_parses() {
    let c = Config::from_toml(&format!(
        r#"
        [target]
        listen = "0.0.0.0:4420"
        discovery_listen = ""
        advertise_addr = "10.0.2.2"
        workers = 2
        polling = "busy-poll"
        inline_data_bytes = "16k"
        [[subsystem]]
        nqn = "nqn.2026-11.io.sluice:a"
        {HOSTS}
        [[subsystem.namespace]]
        nsid = 1
        backend = "ram"
        size = "64MiB"
        [[subsystem.namespace]]
        nsid = 2
        backend = "emulated-ssd"
        size = 1048576
        block_size = 4096
        ssd = {{ read_iops_max = 1000 }}
        [[subsystem.namespace]]
        nsid = 3
        backend = "file"
        path = "/tmp/x.img"
        "#
    ))
    .unwrap();
    assert_eq!(c.target.workers, 2);
    assert_eq!(c.target.polling, PollingPolicy::BusyPoll);
    assert_eq!(c.target.discovery_listen, None);
    assert_eq!(c.target.inline_data_bytes, 16384);
    assert_eq!(c.subsystems[0].namespaces.len(), 3);
    assert_eq!(c.subsystems[0].namespaces[0].size_bytes, Some(64 << 20));
    match &c.subsystems[0].namespaces[1].backend {
        BackendConfig::EmulatedSsd(m) => assert_eq!(m.read_iops_max, Some(1000)),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        c.subsystems[0].namespaces[2].backend,
        BackendConfig::file("/tmp/x.img")
    );
}

#[test]
fn errors_name_the_key() {
    must_fail("[target]\nworkers = 0", "target.workers");
    let e = must_fail("[target]\npolling = \"sometimes\"", "target.polling");
    assert!(e.reason.contains("`sometimes` is not one of"), "{e}");
    must_fail("[target]\nlisten = \"nowhere\"", "target.listen");
    must_fail("[target]\nmdts_bytes = \"3k\"", "target.mdts_bytes");
    must_fail("[target]\nmdts_bytes = \"-4k\"", "target.mdts_bytes");
    must_fail(
        "[target]\nwrite_zeroes_bytes_max = \"12k\"",
        "target.write_zeroes_bytes_max",
    );
    must_fail(
        "[target]\nwrite_zeroes_bytes_max = \"4k\"",
        "target.write_zeroes_bytes_max",
    );
    must_fail(
        "[target]\nwrite_zeroes_bytes_max = \"512M\"",
        "target.write_zeroes_bytes_max",
    );
    must_fail("[target]\nbogus = 1", "(file)");
    must_fail(
        "[[subsystem]]\nnqn = \"bad\"\nallow_any_host = true",
        "subsystem[0].nqn",
    );
    must_fail("[[subsystem]]\nnqn = \"nqn.x:y\"", "subsystem[0].hosts");
    let e = must_fail(
        &format!("[[subsystem]]\nnqn = \"nqn.x:y\"\n{HOSTS}\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"ram\"\nsize = \"1000\""),
        "subsystem[0].namespace[0].size",
    );
    assert!(e.reason.contains("multiple of the block size"));
    let e = must_fail(
        &format!("[[subsystem]]\nnqn = \"nqn.x:y\"\n{HOSTS}\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"tape\""),
        "subsystem[0].namespace[0].backend",
    );
    assert!(
        e.reason
            .contains("`tape` is not one of ram, file, emulated-ssd"),
        "{e}"
    );
    must_fail(
        &format!("[[subsystem]]\nnqn = \"nqn.x:y\"\n{HOSTS}\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"ram\"\nsize = 4096\nblock_size = 1024"),
        "subsystem[0].namespace[0].block_size",
    );
    must_fail(
        &format!("[[subsystem]]\nnqn = \"nqn.x:y\"\n{HOSTS}\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"emulated-ssd\"\nsize = 4096\nssd = {{ parallelism = 0 }}"),
        "subsystem[0].namespace[0].ssd.parallelism",
    );
    must_fail(
        &format!("[[subsystem]]\nnqn = \"nqn.x:y\"\n{HOSTS}\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"file\"\npath = \"/x\"\nengine = \"aio\""),
        "subsystem[0].namespace[0].engine",
    );
    must_fail(
        &format!("[[subsystem]]\nnqn = \"nqn.x:y\"\n{HOSTS}\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"file\""),
        "subsystem[0].namespace[0].path",
    );
    must_fail(
        &format!(
            "[[subsystem]]\nnqn = \"nqn.x:y\"\n{HOSTS}\n[[subsystem]]\nnqn = \"nqn.x:y\"\n{HOSTS}"
        ),
        "subsystem[1].nqn",
    );
    must_fail(
        &format!("[[subsystem]]\nnqn = \"nqn.x:y\"\n{HOSTS}\n[[subsystem]]\nnqn = \"nqn.x:z\"\n{HOSTS}\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"file\"\npath = 3"),
        "(file)",
    );
    must_fail(
        &format!("[[subsystem]]\nnqn = \"nqn.x:y\"\n{HOSTS}\n[[subsystem]]\nnqn = \"nqn.x:z\"\n{HOSTS}\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"ram\"\nsize = \"1M\"\npath = \"/x\""),
        "subsystem[1].namespace[0].path",
    );
}

#[test]
fn sizes() {
    assert_eq!(parse_size("4k"), Ok(4096));
    assert_eq!(parse_size("1GiB"), Ok(1 << 30));
    assert_eq!(parse_size("1.5M"), Ok(3 << 19));
    assert!(parse_size("1.5").is_err());
    assert!(parse_size("k").is_err());
    assert!(parse_size("9999999999T").is_err());
}

#[test]
fn example_file_parses() {
    let text = include_str!("../../../examples/target.toml");
    let c = Config::from_toml(text).expect("examples/target.toml is valid");
    assert_eq!(Config::from_toml(&c.to_toml().expect("toml")), Ok(c));
}

#[test]
fn polling_words() {
    assert_eq!(PollingPolicy::parse("busy", 1), Ok(PollingPolicy::BusyPoll));
    assert_eq!(
        PollingPolicy::parse("adaptive", 7),
        Ok(PollingPolicy::Adaptive { spin_us: 7 })
    );
    assert!(PollingPolicy::parse("never", 1).is_err());
}

/// A configuration built in Rust equals the same written in TOML.
#[test]
fn builders_match_toml() {
    let built = Config::default()
        .with_target(
            TargetSettings::default()
                .with_listen("0.0.0.0:4420".parse().unwrap())
                .with_discovery_listen(None)
                .with_workers(2)
                .with_polling(PollingPolicy::BusyPoll)
                .with_inline_data_bytes(16384),
        )
        .with_subsystem(
            SubsystemConfig::new("nqn.2026-11.io.sluice:a")
                .with_host("nqn.2014-08.org.nvmexpress:uuid:1")
                .with_namespace(NamespaceConfig::ram(1, 64 << 20))
                .with_namespace(
                    NamespaceConfig::emulated_ssd(
                        2,
                        1 << 20,
                        SsdConfig::default().with_read_iops_max(1000),
                    )
                    .with_block_size(4096),
                )
                .with_namespace(
                    NamespaceConfig::file(3, "/tmp/x.img")
                        .with_engine(Engine::Sync)
                        .with_direct(false),
                ),
        )
        .with_tenants(
            TenantsConfig::fair().with_tenant(
                TenantSpec::new("gold")
                    .with_host("nqn.2014-08.org.nvmexpress:uuid:a")
                    .with_weight(4)
                    .with_limit(RateSpec::default().with_iops(50_000)),
            ),
        )
        .validated()
        .unwrap();
    let parsed = Config::from_toml(&format!(
        r#"
        [target]
        listen = "0.0.0.0:4420"
        discovery_listen = ""
        workers = 2
        polling = "busy-poll"
        inline_data_bytes = "16k"
        [[subsystem]]
        nqn = "nqn.2026-11.io.sluice:a"
        {HOSTS}
        [[subsystem.namespace]]
        nsid = 1
        backend = "ram"
        size = "64MiB"
        [[subsystem.namespace]]
        nsid = 2
        backend = "emulated-ssd"
        size = "1M"
        block_size = 4096
        ssd = {{ read_iops_max = 1000 }}
        [[subsystem.namespace]]
        nsid = 3
        backend = "file"
        path = "/tmp/x.img"
        engine = "sync"
        direct = false
        [tenants]
        [[tenant]]
        name = "gold"
        hosts = ["nqn.2014-08.org.nvmexpress:uuid:a"]
        weight = 4
        limit = {{ iops = 50000 }}
        "#
    ))
    .unwrap();
    assert_eq!(built, parsed);
    assert_eq!(
        Config::embedded_default().validated(),
        Ok(Config::embedded_default())
    );
}

#[test]
fn builder_errors_name_the_key() {
    let e = Config::default()
        .with_subsystem(
            SubsystemConfig::new("nqn.x:y")
                .allow_any_host()
                .with_namespace(NamespaceConfig::ram(1, 1000)),
        )
        .validated()
        .expect_err("size not a multiple of 512");
    assert_eq!(e.key, "subsystem[0].namespace[0].size");
}

/// Serializing writes every setting; reading it back gives the same
/// configuration, also through the per-subsystem send overrides and
/// tenants.
#[test]
fn toml_round_trip() {
    let text = format!(
        r#"
        [target]
        workers = 3
        polling = "adaptive"
        adaptive_spin_us = 7
        mdts_bytes = "256k"
        write_zeroes_bytes_max = "64k"
        send_scheduler = "isolated"
        send = {{ latency_size = "1k", data_degree = 4, flush_when_idle = false, responses_after_data = false }}
        coalescing = {{ mode = "static", threshold = 4, timeout_us = 20, urgent = "flush-all" }}
        [[subsystem]]
        nqn = "nqn.2026-11.io.sluice:a"
        {HOSTS}
        serial = "S1"
        send_scheduler = "unified"
        [[subsystem.namespace]]
        nsid = 7
        backend = "ram"
        size = "1M"
        uuid = "00112233-4455-6677-8899-aabbccddeeff"
        [[subsystem]]
        nqn = "nqn.2026-11.io.sluice:b"
        allow_any_host = true
        [tenants]
        cost = "bytes"
        cpu_k = 16
        split_bytes = "64k"
        admin_listen = "127.0.0.1:0"
        default = "gold"
        [[tenant]]
        name = "gold"
        hosts = ["nqn.2014-08.org.nvmexpress:uuid:a"]
        reservation = {{ iops = 10 }}
        limit = {{ iops = 50000, read_bytes_per_sec = "200MiB" }}
        cpu_share = 0.5
        "#
    );
    let c = Config::from_toml(&text).unwrap();
    assert_eq!(c.target.write_zeroes_bytes_max, Some(64 << 10));
    assert!(!c.target.send.flush_when_idle);
    assert!(Config::default().target.send.flush_when_idle);
    assert!(!c.target.send.responses_after_data);
    assert!(Config::default().target.send.responses_after_data);
    let written = c.to_toml().unwrap();
    assert_eq!(Config::from_toml(&written), Ok(c.clone()), "{written}");
    // Also through JSON (serde, not just TOML).
    let json = serde_json::to_string(&c).unwrap();
    assert_eq!(serde_json::from_str::<Config>(&json).unwrap(), c);
    // Deserializing validates.
    let bad = written.replace("workers = 3", "workers = 0");
    let e = toml::from_str::<Config>(&bad)
        .expect_err("invalid")
        .to_string();
    assert!(e.contains("target.workers"), "{e}");
    assert_eq!(
        Config::from_toml(&Config::default().to_toml().unwrap()),
        Ok(Config::default())
    );
}

fn cfg(extra: &str) -> Result<Config, ConfigError> {
    Config::from_toml(&format!(
        r#"
[[subsystem]]
nqn = "nqn.2026-11.io.sluice:t"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "1MiB"
{extra}
"#
    ))
}

fn tenants_must_fail(extra: &str, key: &str, words: &str) {
    let e = cfg(extra).expect_err("config should be refused");
    assert_eq!(e.key, key, "{e}");
    assert!(e.reason.contains(words), "{e}");
}

#[test]
fn tenants_parse() {
    let c = cfg(r#"
[tenants]
scheduler = "fair"
cost = "bytes"
dispatch_depth = 4
admin_listen = "127.0.0.1:0"
cpu_isolation = true
cpu_k = 16
[[tenant]]
name = "gold"
hosts = ["nqn.2014-08.org.nvmexpress:uuid:a"]
weight = 4
reservation = { iops = 1000 }
limit = { iops = 50000, read_bytes_per_sec = "200MiB" }
cpu_share = 0.5
[[tenant]]
name = "bronze"
hosts = ["nqn.2014-08.org.nvmexpress:uuid:b"]
"#)
    .expect("valid");
    let t = &c.tenants;
    assert_eq!(t.tenants.len(), 2);
    assert_eq!(t.tenants[0].weight, 4);
    assert_eq!(t.tenants[0].limit.read_bytes_per_sec, Some(200 << 20));
    assert_eq!(t.tenants[1].weight, 1);
    assert_eq!(t.settings.throttle.k, Some(16));
    assert_eq!(t.settings.cost, CostKind::Bytes);
    assert!(t.settings.cpu_isolation);
    // No tenants at all: stock behaviour.
    assert_eq!(
        cfg("").expect("valid").tenants.settings.scheduler,
        SchedulerMode::None
    );
    assert_eq!(
        cfg("[tenants]\nscheduler = \"off\"")
            .expect("valid")
            .tenants
            .settings
            .scheduler,
        SchedulerMode::None
    );
}

#[test]
fn bad_tenants_name_the_key() {
    tenants_must_fail(
        "[[tenant]]\nname = \"a\"\nweight = 0",
        "tenant[0].weight",
        "from 1",
    );
    tenants_must_fail(
        "[[tenant]]\nname = \"a\"\nweight = -3",
        "tenant[0].weight",
        "from 1",
    );
    tenants_must_fail(
        "[[tenant]]\nname = \"a\"\nlimit = { iops = 0 }",
        "tenant[0].limit.iops",
        "below one I/O",
    );
    tenants_must_fail(
        "[[tenant]]\nname = \"a\"\nlimit = { bytes_per_sec = 100 }",
        "tenant[0].limit.bytes_per_sec",
        "below one I/O",
    );
    tenants_must_fail(
        "[[tenant]]\nname = \"a\"\nreservation = { iops = 10 }\nlimit = { iops = 5 }",
        "tenant[0].reservation.iops",
        "above the limit",
    );
    tenants_must_fail(
        "[[tenant]]\nname = \"a\"\ncpu_share = 1.5",
        "tenant[0].cpu_share",
        "(0, 1]",
    );
    tenants_must_fail(
        "[[tenant]]\nname = \"a\"\n[[tenant]]\nname = \"a\"",
        "tenant[1].name",
        "twice",
    );
    tenants_must_fail("[[tenant]]\nname = \"a\"\nhosts = [\"nqn.x:h\"]\n[[tenant]]\nname = \"b\"\nhosts = [\"nqn.x:h\"]", "tenant[1].hosts[0]", "already belongs");
    tenants_must_fail(
        "[tenants]\nsplit_bytes = 5000",
        "tenants.split_bytes",
        "multiple of 4096",
    );
    tenants_must_fail(
        "[tenants]\nsplit_bytes = \"1GiB\"",
        "tenants.split_bytes",
        "multiple of 4096",
    );
    tenants_must_fail(
        "[tenants]\ndefault = \"nope\"",
        "tenants.default",
        "unknown tenant `nope`",
    );
    tenants_must_fail(
        "[tenants]\nscheduler = \"wfq\"",
        "tenants.scheduler",
        "not one of",
    );
    tenants_must_fail("[tenants]\ncost = \"time\"", "tenants.cost", "not one of");
    tenants_must_fail(
        "[tenants]\nvictim_cgroups = [\"/nonexistent\"]",
        "tenants.victim_cgroups[0]",
        "not a cgroup",
    );
    tenants_must_fail(
        "[[tenant]]\nname = \"a\"\ncharge_cgroup = \"/nonexistent-cgroup\"",
        "tenant[0].charge_cgroup",
        "nonexistent-cgroup",
    );
    tenants_must_fail("[[tenant]]\nname = \"a b\"", "tenant[0].name", "must be");
    tenants_must_fail(
        "[[tenant]]\nname = \"a\"\nhosts = [\"host\"]",
        "tenant[0].hosts[0]",
        "nqn.",
    );
    let e = cfg("[[tenant]]\nname = \"a\"\nwheight = 2").expect_err("unknown key");
    assert!(e.reason.contains("wheight"), "{e}");
}

/// The run-time update request: JSON with absent fields kept.
#[test]
fn tenant_update_request() {
    let base = TenantSpec::new("a").with_host("nqn.x:a").with_weight(2);
    let raw: tenants::RawTenant = serde_json::from_str(r#"{"limit": {"iops": 100}}"#).unwrap();
    let t = tenants::validate_tenant("tenant[a]", &raw, Some(&base)).unwrap();
    assert_eq!((t.weight, t.limit.iops, t.hosts.len()), (2, Some(100), 1));
    assert!(serde_json::from_str::<tenants::RawTenant>(r#"{"colour": 1}"#).is_err());
}

#[test]
fn word_errors_list_the_choices() {
    let e = cfg("[target]\npolling = \"sometimes\"").expect_err("bad word");
    assert_eq!(e.key, "target.polling");
    assert!(
        e.reason
            .contains("`sometimes` is not one of interrupt, busy-poll, adaptive"),
        "{e}"
    );
    let e = cfg("[tenants]\nscheduler = \"wfq\"").expect_err("bad word");
    assert!(e.reason.contains("`wfq` is not one of none"), "{e}");
}

#[test]
fn huge_pages_is_for_ram_only_and_off_by_default() {
    let ns = |backend: &str, extra: &str| {
        format!(
            r#"
            [[subsystem]]
            nqn = "nqn.2026-11.io.sluice:a"
            {HOSTS}
            [[subsystem.namespace]]
            nsid = 1
            backend = "{backend}"
            size = "64MiB"
            {extra}
            "#
        )
    };
    let c = Config::from_toml(&ns("ram", "huge_pages = true")).unwrap();
    assert!(c.subsystems[0].namespaces[0].huge_pages);
    let c = Config::from_toml(&ns("ram", "")).unwrap();
    assert!(!c.subsystems[0].namespaces[0].huge_pages, "off by default");
    let e = must_fail(
        &ns("emulated-ssd", "huge_pages = true"),
        "subsystem[0].namespace[0].huge_pages",
    );
    assert!(e.reason.contains("only for backend `ram`"), "{e}");
    let e = must_fail(&ns("ram", "huge_pages = \"yes\""), "(file)");
    assert!(e.reason.contains("expected a boolean"), "{e}");
    // A parse error names the line, hence the key, that the parser's own
    // message (a wrong type) does not.
    assert!(e.reason.contains("huge_pages = \"yes\""), "{e}");
    let e = must_fail(
        "[target]\nsend_scheduler = \"isolated\"\n[target.send]\nflush_when_idle = \"yes\"",
        "(file)",
    );
    assert!(
        e.reason.contains("expected a boolean")
            && e.reason.contains("at line 4: `flush_when_idle = \"yes\"`"),
        "{e}"
    );
    let e = must_fail("[target.send]\nresponses_after_data = 1", "(file)");
    assert!(
        e.reason.contains("expected a boolean") && e.reason.contains("`responses_after_data = 1`"),
        "{e}"
    );
}

mod round_trip {
    use super::*;
    use proptest::prelude::*;

    fn namespace() -> impl Strategy<Value = NamespaceConfig> {
        (
            1u32..=1024,
            1u64..4096,
            any::<bool>(),
            0u8..4,
            any::<Option<u64>>(),
            any::<bool>(),
        )
            .prop_map(|(nsid, blocks, big, kind, iops, direct)| {
                let bs = if big { 4096 } else { 512 };
                let size = blocks * u64::from(bs);
                let ns = match kind {
                    0 => NamespaceConfig::ram(nsid, size).with_huge_pages(direct),
                    1 => {
                        let mut m = SsdConfig::default().with_parallelism(4);
                        m.read_iops_max = iops.map(|v| (v >> 1).max(1));
                        NamespaceConfig::emulated_ssd(nsid, size, m)
                    }
                    2 => {
                        let v = NamespaceConfig::volume(
                            nsid,
                            format!("vol{nsid}"),
                            "10.0.0.1:9500,10.0.0.2:9500",
                        );
                        return v.with_block_size(bs);
                    }
                    _ => NamespaceConfig::file(nsid, format!("/tmp/ns{nsid}.img"))
                        .with_size(size)
                        .with_direct(direct)
                        .with_engine(if direct {
                            Engine::IoUring
                        } else {
                            Engine::Sync
                        })
                        .with_create(!direct),
                };
                ns.with_block_size(bs)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever valid configuration the builders make, writing it as
        /// TOML and reading it back gives it again.
        #[test]
        fn builders_to_toml_and_back(
            workers in 1usize..=WORKERS_MAX,
            polling in 0u8..3,
            spin in 1u32..1_000_000,
            inline in 0u32..=(INLINE_DATA_BYTES_MAX / 16),
            mdts_shift in 12u32..=23,
            qd in 32u16..=QUEUE_DEPTH_MAX,
            nss in proptest::collection::vec(namespace(), 0..4),
            hosts in proptest::collection::vec("[a-z0-9]{1,12}", 0..3),
            tenants in proptest::option::of((1u32..=WEIGHT_MAX, proptest::option::of(1u64..1_000_000))),
        ) {
            let polling = match polling {
                0 => PollingPolicy::Interrupt,
                1 => PollingPolicy::BusyPoll,
                _ => PollingPolicy::Adaptive { spin_us: spin },
            };
            let mut sub = SubsystemConfig::new("nqn.2026-11.io.sluice:p");
            for h in &hosts {
                sub = sub.with_host(format!("nqn.2014-08.org.nvmexpress:{h}"));
            }
            if hosts.is_empty() {
                sub = sub.allow_any_host();
            }
            let mut seen = std::collections::HashSet::new();
            for ns in nss {
                if seen.insert(ns.nsid) {
                    sub = sub.with_namespace(ns);
                }
            }
            let mut c = Config::default()
                .with_target(
                    TargetSettings::default()
                        .with_workers(workers)
                        .with_polling(polling)
                        .with_inline_data_bytes(inline * 16)
                        .with_mdts_bytes(1 << mdts_shift)
                        .with_queue_depth_max(qd),
                )
                .with_subsystem(sub);
            if let Some((w, iops)) = tenants {
                let mut t = TenantSpec::new("t").with_weight(w).with_host("nqn.2014-08.org.nvmexpress:tenant");
                if let Some(i) = iops {
                    t = t.with_limit(RateSpec::default().with_iops(i));
                }
                c = c.with_tenants(TenantsConfig::fair().with_tenant(t));
            }
            let c = c.validated().map_err(|e| TestCaseError::fail(e.to_string()))?;
            let text = c.to_toml().map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(Config::from_toml(&text), Ok(c), "{}", text);
        }
    }
}

/// A file namespace without `block_size` leaves it to the file (its
/// filesystem's block, or a block device's logical block); RAM and the
/// emulated SSD default to 512; written back, the key stays out.
#[test]
fn a_file_namespace_takes_its_block_size_from_the_file() {
    let ns = |backend: &str, body: &str| {
        format!(
            "[[subsystem]]\nnqn = \"nqn.2026-11.io.sluice:f\"\nallow_any_host = true\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"{backend}\"\n{body}\n"
        )
    };
    let c = Config::from_toml(&ns("file", "path = \"/tmp/f.img\"")).unwrap();
    assert_eq!(c.subsystems[0].namespaces[0].block_size_bytes, None);
    assert!(!c.to_toml().unwrap().contains("block_size"));
    assert_eq!(Config::from_toml(&c.to_toml().unwrap()).unwrap(), c);
    let c = Config::from_toml(&ns("file", "path = \"/tmp/f.img\"\nblock_size = 512")).unwrap();
    assert_eq!(c.subsystems[0].namespaces[0].block_size_bytes, Some(512));
    // `create` sizes are checked against 512 (the file's block is known
    // when it is opened).
    let c = Config::from_toml(&ns(
        "file",
        "path = \"/tmp/f.img\"\ncreate = true\nsize = 1536",
    ));
    assert_eq!(
        c.unwrap().subsystems[0].namespaces[0].size_bytes,
        Some(1536)
    );
    must_fail(
        &ns("file", "path = \"/tmp/f.img\"\ncreate = true\nsize = 1000"),
        "subsystem[0].namespace[0].size",
    );
    let c = Config::from_toml(&ns("ram", "size = \"1MiB\"")).unwrap();
    assert_eq!(c.subsystems[0].namespaces[0].block_size_bytes, Some(512));
    assert_eq!(
        NamespaceConfig::file(1, "/tmp/f.img").block_size_bytes,
        None
    );
    assert_eq!(NamespaceConfig::ram(1, 1 << 20).block_size_bytes, Some(512));
}

/// The connection limits and the handshake timeout: defaults, TOML,
/// builders, and out-of-range values refused naming the key.
#[test]
fn volume_namespaces() {
    let ns = |body: &str| {
        format!(
            "[[subsystem]]\nnqn = \"nqn.2026-11.io.sluice:v\"\nallow_any_host = true\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"volume\"\n{body}\n"
        )
    };
    let c = Config::from_toml(&ns("volume = \"db\"")).unwrap();
    let n = &c.subsystems[0].namespaces[0];
    assert_eq!(
        n.backend,
        BackendConfig::Volume {
            name: "db".into(),
            control: crate::subsystem::CONTROL_DEFAULT.into(),
            token_file: None
        }
    );
    assert_eq!((n.block_size_bytes, n.size_bytes), (Some(4096), None));
    let c = Config::from_toml(&ns(
        "volume = \"db\"\ncontrol = \"a:1, b:2\"\nblock_size = 512",
    ))
    .unwrap();
    assert_eq!(c.subsystems[0].namespaces[0].block_size_bytes, Some(512));
    // Each mistake names its key.
    must_fail(&ns(""), "subsystem[0].namespace[0].volume");
    must_fail(&ns("volume = \"\""), "subsystem[0].namespace[0].volume");
    must_fail(
        &ns("volume = \"db\"\nsize = \"1GiB\""),
        "subsystem[0].namespace[0].size",
    );
    must_fail(
        &ns("volume = \"db\"\npath = \"/x\""),
        "subsystem[0].namespace[0].path",
    );
    for bad in ["nowhere", "h:0", ":9500", "a:1,b", "h:99999"] {
        must_fail(
            &ns(&format!("volume = \"db\"\ncontrol = \"{bad}\"")),
            "subsystem[0].namespace[0].control",
        );
    }
}

#[test]
fn send_within_cwnd() {
    assert!(TargetSettings::default().send_within_cwnd);
    let c = Config::from_toml("[target]\nsend_within_cwnd = false").unwrap();
    assert!(!c.target.send_within_cwnd);
    let back = Config::from_toml(&c.to_toml().unwrap()).unwrap();
    assert!(!back.target.send_within_cwnd, "round trip");
    assert!(
        !TargetSettings::default()
            .with_send_within_cwnd(false)
            .send_within_cwnd
    );
    let e = Config::from_toml("[target]\nsend_within_cwnd = 1").unwrap_err();
    assert!(e.to_string().contains("send_within_cwnd"), "{e}");
}

#[test]
fn ram_reads_in_place() {
    assert!(TargetSettings::default().ram_reads_in_place);
    let c = Config::from_toml("[target]\nram_reads_in_place = false").unwrap();
    assert!(!c.target.ram_reads_in_place);
    assert_eq!(
        c,
        Config::default()
            .with_target(TargetSettings::default().with_ram_reads_in_place(false))
            .validated()
            .unwrap()
    );
    assert_eq!(Config::from_toml(&c.to_toml().unwrap()), Ok(c));
    assert!(Config::from_toml("[target]\nram_reads_in_place = 1").is_err());
}

#[test]
fn tcp_congestion() {
    assert_eq!(TargetSettings::default().tcp_congestion, None);
    let c = Config::from_toml("[target]\ntcp_congestion = \"cubic\"").unwrap();
    assert_eq!(c.target.tcp_congestion.as_deref(), Some("cubic"));
    assert_eq!(
        c,
        Config::default()
            .with_target(TargetSettings::default().with_tcp_congestion(Some("cubic")))
            .validated()
            .unwrap()
    );
    assert_eq!(Config::from_toml(&c.to_toml().unwrap()), Ok(c));
    // Unset stays unset through a round trip (the system's default).
    let d = Config::default().validated().unwrap();
    assert!(!d.to_toml().unwrap().contains("tcp_congestion"));
    must_fail("[target]\ntcp_congestion = \"\"", "target.tcp_congestion");
    must_fail(
        "[target]\ntcp_congestion = \"cu bic\"",
        "target.tcp_congestion",
    );
    must_fail(
        "[target]\ntcp_congestion = \"a-name-too-long-1\"",
        "target.tcp_congestion",
    );
    assert!(Config::from_toml("[target]\ntcp_congestion = 1").is_err());
    let e = Config::default()
        .with_target(TargetSettings::default().with_tcp_congestion(Some("x\0")))
        .validated()
        .unwrap_err();
    assert_eq!(e.key, "target.tcp_congestion", "{e}");
}

#[test]
fn connection_limits() {
    let d = TargetSettings::default();
    assert_eq!(d.connections_max, CONNECTIONS_MAX_DEFAULT);
    assert_eq!(
        d.connections_per_source_max,
        CONNECTIONS_PER_SOURCE_MAX_DEFAULT
    );
    assert_eq!(
        d.connections_handshaking_max,
        CONNECTIONS_HANDSHAKING_MAX_DEFAULT
    );
    assert_eq!(d.handshake_timeout_ms, HANDSHAKE_TIMEOUT_MS_DEFAULT);
    let c = Config::from_toml(
        "[target]\nconnections_max = 100\nconnections_per_source_max = 10\n\
         connections_handshaking_max = 5\nhandshake_timeout_ms = 2500",
    )
    .unwrap();
    let built = Config::default()
        .with_target(
            TargetSettings::default()
                .with_connections_max(100)
                .with_connections_per_source_max(10)
                .with_connections_handshaking_max(5)
                .with_handshake_timeout_ms(2500),
        )
        .validated()
        .unwrap();
    assert_eq!(c, built);
    assert_eq!(Config::from_toml(&c.to_toml().unwrap()), Ok(c));
    for key in [
        "connections_max",
        "connections_per_source_max",
        "connections_handshaking_max",
    ] {
        let e = must_fail(&format!("[target]\n{key} = 0"), &format!("target.{key}"));
        assert!(e.reason.contains("outside 1..=1048576"), "{e}");
        must_fail(
            &format!("[target]\n{key} = 2000000"),
            &format!("target.{key}"),
        );
    }
    let e = must_fail(
        "[target]\nhandshake_timeout_ms = 10",
        "target.handshake_timeout_ms",
    );
    assert!(e.reason.contains("outside 100..=600000"), "{e}");
    assert_eq!(d.slow_io_ms, SLOW_IO_MS_DEFAULT);
    let c = Config::from_toml("[target]\nslow_io_ms = 250").unwrap();
    assert_eq!(c.target.slow_io_ms, 250);
    assert_eq!(Config::from_toml(&c.to_toml().unwrap()), Ok(c));
    let e = must_fail("[target]\nslow_io_ms = 0", "target.slow_io_ms");
    assert!(e.reason.contains("outside 1..=600000"), "{e}");
    must_fail("[target]\nslow_io_ms = 600001", "target.slow_io_ms");
    let e = Config::default()
        .with_target(TargetSettings::default().with_connections_per_source_max(0))
        .validated()
        .expect_err("zero connections per source");
    assert_eq!(e.key, "target.connections_per_source_max");
}

/// The admin endpoint reads and changes tenants: beyond loopback it needs a
/// token, and a config without one is refused naming the key.
#[test]
fn admin_endpoint_beyond_loopback_needs_a_token() {
    tenants_must_fail(
        "[tenants]\nadmin_listen = \"0.0.0.0:9400\"",
        "tenants.admin_token_file",
        "beyond loopback",
    );
    tenants_must_fail(
        "[tenants]\nadmin_listen = \"[::]:9400\"",
        "tenants.admin_token_file",
        "beyond loopback",
    );
    let c = cfg("[tenants]\nadmin_listen = \"0.0.0.0:9400\"\nadmin_token_file = \"/etc/sluice/admin.token\"")
        .unwrap();
    assert!(c.tenants.settings.admin_token_file.is_some());
    for local in ["127.0.0.1:9400", "[::1]:9400"] {
        cfg(&format!("[tenants]\nadmin_listen = \"{local}\"")).unwrap();
    }
}

#[test]
fn dhchap_entries_parse_round_trip_and_name_their_keys() {
    use sluice_auth::{DhGroup, HashId, Secret};
    let host = "nqn.2014-08.org.nvmexpress:uuid:a";
    let s1 = Secret::new(vec![1; 32], Some(HashId::Sha256))
        .unwrap()
        .to_dhhc();
    let s2 = Secret::new(vec![2; 48], None).unwrap().to_dhhc();
    let doc = |entry: &str, extra: &str| {
        format!(
            r#"
            [[subsystem]]
            nqn = "nqn.2026-11.io.sluice:a"
            hosts = ["{host}"]
            {extra}
            [[subsystem.dhchap]]
            {entry}
            [[subsystem.namespace]]
            nsid = 1
            backend = "ram"
            size = "1MiB"
            "#
        )
    };
    let ok = doc(
        &format!("host = \"{host}\"\nsecret = \"{s1}\"\nctrl_secret = \"{s2}\"\nhash = \"hmac(sha512)\"\ndhgroup = \"ffdhe4096\""),
        "require_auth = true",
    );
    let c = Config::from_toml(&ok).unwrap();
    let sub = &c.subsystems[0];
    assert!(sub.require_auth);
    let a = &sub.dhchap[0];
    assert_eq!((a.hash, a.dhgroup), (HashId::Sha512, DhGroup::Ffdhe4096));
    assert_eq!(a.secret, Secret::parse(&s1).unwrap());
    // Round trip through TOML and JSON.
    let written = c.to_toml().unwrap();
    assert_eq!(Config::from_toml(&written).unwrap(), c);
    let json = serde_json::to_string(&c).unwrap();
    assert_eq!(serde_json::from_str::<Config>(&json).unwrap(), c);
    // Debug never shows a secret.
    let dbg = format!("{c:?}");
    assert!(
        !dbg.contains(&s1[10..30]) && !dbg.contains(&s2[10..30]),
        "{dbg}"
    );

    let bad = |entry: String, extra: &str, key: &str| {
        let e = Config::from_toml(&doc(&entry, extra)).unwrap_err();
        assert_eq!(e.key, key, "{e}");
        assert!(!e.to_string().contains(&s1[10..30]), "{e}");
    };
    let typo = s1.replacen('A', "B", 1).replacen('a', "b", 1);
    bad(
        format!("host = \"{host}\"\nsecret = \"{typo}\""),
        "",
        "subsystem[0].dhchap[0].secret",
    );
    bad(
        format!("host = \"{host}\"\nsecret = \"{s1}\"\nctrl_secret = \"{s1}\""),
        "",
        "subsystem[0].dhchap[0].ctrl_secret",
    );
    bad(
        format!("host = \"{host}\"\nsecret = \"{s1}\"\nhash = \"md5\""),
        "",
        "subsystem[0].dhchap[0].hash",
    );
    bad(
        format!("host = \"{host}\"\nsecret = \"{s1}\"\ndhgroup = \"ffdhe1024\""),
        "",
        "subsystem[0].dhchap[0].dhgroup",
    );
    bad(
        format!("host = \"nqn.2014-08.org.nvmexpress:uuid:b\"\nsecret = \"{s1}\""),
        "",
        "subsystem[0].dhchap[0].host",
    );
    bad(
        format!("host = \"{host}\"\nsecret = \"{s1}\"\n[[subsystem.dhchap]]\nhost = \"{host}\"\nsecret = \"{s2}\""),
        "",
        "subsystem[0].dhchap[1].host",
    );
    // require_auth with no secret at all.
    let none = r#"
        [[subsystem]]
        nqn = "nqn.2026-11.io.sluice:a"
        allow_any_host = true
        require_auth = true
        "#;
    assert_eq!(
        Config::from_toml(none).unwrap_err().key,
        "subsystem[0].require_auth"
    );
}

/// All subsystems together hold at most `NAMESPACES_TOTAL_MAX` namespaces
/// (each has state in every worker); the error names the limit.
#[test]
fn namespaces_of_all_subsystems_have_a_limit() {
    let file = |subsystems: usize, per: usize| {
        let mut t = String::new();
        for s in 0..subsystems {
            t.push_str(&format!(
                "[[subsystem]]\nnqn = \"nqn.2026-12.io.sluice:s{s}\"\nallow_any_host = true\n"
            ));
            for n in 1..=per {
                t.push_str(&format!(
                    "[[subsystem.namespace]]\nnsid = {n}\nbackend = \"ram\"\nsize = \"1MiB\"\n"
                ));
            }
        }
        t
    };
    let per = 1024;
    let full = NAMESPACES_TOTAL_MAX / per;
    assert!(Config::from_toml(&file(full, per)).is_ok(), "at the limit");
    let e = must_fail(&file(full + 1, per), "subsystem");
    assert!(e.reason.contains(&NAMESPACES_TOTAL_MAX.to_string()), "{e}");
}
