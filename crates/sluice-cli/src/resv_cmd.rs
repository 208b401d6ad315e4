//! `sluice resv`: a namespace's reservations from the command line (as
//! `nvme resv-register`, `resv-acquire`, `resv-release` and `resv-report`
//! do for a Linux host): register a key, acquire, preempt, release, clear,
//! and report who is registered and who holds what.

use anyhow::{Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use sluice_host::{ConnectOptions, Controller, Namespace};
use sluice_proto::reservation::{AcquireAction, RegisterAction, ReleaseAction, ReservationType};
use std::time::Duration;

/// Where the namespace is and who this host is.
#[derive(Debug, Args)]
pub struct ResvTarget {
    /// Target address (HOST:PORT).
    #[arg(long, short = 'a')]
    pub target: String,
    /// Subsystem NQN.
    #[arg(long)]
    pub nqn: String,
    /// Namespace ID.
    #[arg(long, default_value_t = 1)]
    pub nsid: u32,
    /// Host NQN: the host whose registration this is.
    #[arg(long)]
    pub hostnqn: Option<String>,
    /// Host Identifier as a UUID (default: derived from the host NQN, so
    /// one host NQN is one host).
    #[arg(long, value_parser = parse_hostid)]
    pub hostid: Option<[u8; 16]>,
    /// DH-HMAC-CHAP, for a subsystem that requires it.
    #[command(flatten)]
    pub dhchap: sluice_bench::DhchapArgs,
}

#[derive(Debug, Subcommand)]
pub enum ResvCmd {
    /// Print the registrants and the reservation (Reservation Report).
    Report {
        #[command(flatten)]
        t: ResvTarget,
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Register this host's key, replace it, or unregister (Reservation
    /// Register).
    Register {
        #[command(flatten)]
        t: ResvTarget,
        #[arg(long, value_enum, default_value_t = RegisterArg::Register)]
        action: RegisterArg,
        /// The key this host holds now (replace, unregister).
        #[arg(long, default_value = "0", value_parser = parse_key)]
        crkey: u64,
        /// The new key (register, replace).
        #[arg(long, default_value = "0", value_parser = parse_key)]
        nrkey: u64,
        /// Ignore the existing key (replace, unregister without CRKEY).
        #[arg(long)]
        iekey: bool,
    },
    /// Acquire a reservation, or preempt other registrants (Reservation
    /// Acquire).
    Acquire {
        #[command(flatten)]
        t: ResvTarget,
        #[arg(long, value_enum, default_value_t = AcquireArg::Acquire)]
        action: AcquireArg,
        #[arg(long, value_enum)]
        rtype: RtypeArg,
        /// This host's key.
        #[arg(long, value_parser = parse_key)]
        crkey: u64,
        /// The key of the registrants to preempt (preempt, preempt-abort).
        #[arg(long, default_value = "0", value_parser = parse_key)]
        prkey: u64,
    },
    /// Release this host's reservation, or clear every registration and
    /// the reservation (Reservation Release).
    Release {
        #[command(flatten)]
        t: ResvTarget,
        #[arg(long, value_enum, default_value_t = ReleaseArg::Release)]
        action: ReleaseArg,
        /// The reservation's type (release).
        #[arg(long, value_enum, default_value_t = RtypeArg::WriteExclusive)]
        rtype: RtypeArg,
        /// This host's key.
        #[arg(long, value_parser = parse_key)]
        crkey: u64,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum RegisterArg {
    Register,
    Unregister,
    Replace,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum AcquireArg {
    Acquire,
    Preempt,
    PreemptAbort,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ReleaseArg {
    Release,
    Clear,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum RtypeArg {
    WriteExclusive,
    ExclusiveAccess,
    WriteExclusiveRegistrantsOnly,
    ExclusiveAccessRegistrantsOnly,
    WriteExclusiveAllRegistrants,
    ExclusiveAccessAllRegistrants,
}

impl RtypeArg {
    fn rtype(self) -> ReservationType {
        match self {
            RtypeArg::WriteExclusive => ReservationType::WriteExclusive,
            RtypeArg::ExclusiveAccess => ReservationType::ExclusiveAccess,
            RtypeArg::WriteExclusiveRegistrantsOnly => {
                ReservationType::WriteExclusiveRegistrantsOnly
            }
            RtypeArg::ExclusiveAccessRegistrantsOnly => {
                ReservationType::ExclusiveAccessRegistrantsOnly
            }
            RtypeArg::WriteExclusiveAllRegistrants => ReservationType::WriteExclusiveAllRegistrants,
            RtypeArg::ExclusiveAccessAllRegistrants => {
                ReservationType::ExclusiveAccessAllRegistrants
            }
        }
    }
}

/// A key: decimal, or hexadecimal with `0x`.
fn parse_key(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("`{s}` is not a 64-bit key (decimal or 0x hex): {e}"))
}

/// A Host Identifier: a UUID (32 hex digits, dashes allowed).
fn parse_hostid(s: &str) -> Result<[u8; 16], String> {
    sluice_proto::fabrics::parse_uuid(s)
        .ok_or_else(|| format!("--hostid: `{s}` is not a 128-bit hex UUID"))
}

fn type_name(rtype: u8) -> &'static str {
    match ReservationType::from_u8(rtype) {
        None => "none",
        Some(ReservationType::WriteExclusive) => "write-exclusive",
        Some(ReservationType::ExclusiveAccess) => "exclusive-access",
        Some(ReservationType::WriteExclusiveRegistrantsOnly) => "write-exclusive-registrants-only",
        Some(ReservationType::ExclusiveAccessRegistrantsOnly) => {
            "exclusive-access-registrants-only"
        }
        Some(ReservationType::WriteExclusiveAllRegistrants) => "write-exclusive-all-registrants",
        Some(ReservationType::ExclusiveAccessAllRegistrants) => "exclusive-access-all-registrants",
    }
}

pub fn run(cmd: ResvCmd) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(run_async(cmd))
}

async fn with_namespace(t: &ResvTarget) -> Result<(Controller, Namespace)> {
    let addr = crate::host_cmd::resolve(&t.target)?;
    let mut opts = ConnectOptions::default();
    if let Some(h) = &t.hostnqn {
        opts.hostnqn = h.clone();
    }
    if let Some(id) = t.hostid {
        opts.hostid = id;
    }
    (opts.dhchap_secret, opts.dhchap_ctrl_secret) = t.dhchap.load()?;
    let c = Controller::connect(addr, &t.nqn, opts)
        .await
        .with_context(|| format!("connecting to {} at {addr}", t.nqn))?;
    let ns = c
        .namespace(t.nsid)
        .with_context(|| format!("opening namespace {} of {}", t.nsid, t.nqn))?;
    Ok((c, ns))
}

async fn run_async(cmd: ResvCmd) -> Result<()> {
    let t = match &cmd {
        ResvCmd::Report { t, .. }
        | ResvCmd::Register { t, .. }
        | ResvCmd::Acquire { t, .. }
        | ResvCmd::Release { t, .. } => t,
    };
    let (c, ns) = with_namespace(t).await?;
    let what = format!("namespace {} of {}", t.nsid, t.nqn);
    let r = match &cmd {
        ResvCmd::Report { json, .. } => {
            let rep = ns
                .reservation_report()
                .await
                .with_context(|| format!("reading the reservations of {what}"))?;
            if *json {
                let regs: Vec<String> = rep
                    .registrants
                    .iter()
                    .map(|r| {
                        format!(
                            r#"{{"hostid":"{}","key":{},"holds":{}}}"#,
                            sluice_proto::fabrics::format_uuid(&r.hostid),
                            r.key,
                            r.holds
                        )
                    })
                    .collect();
                println!(
                    r#"{{"generation":{},"rtype":{},"type":"{}","ptpl":{},"registrant_count":{},"registrants":[{}]}}"#,
                    rep.generation,
                    rep.rtype,
                    type_name(rep.rtype),
                    rep.ptpl,
                    rep.registrant_count,
                    regs.join(",")
                );
            } else {
                println!("generation:  {}", rep.generation);
                println!("reservation: {} ({})", type_name(rep.rtype), rep.rtype);
                println!("registrants: {}", rep.registrant_count);
                for r in &rep.registrants {
                    let holds = if r.holds { "  holds" } else { "" };
                    println!(
                        "  hostid {}  key {:#x}{holds}",
                        sluice_proto::fabrics::format_uuid(&r.hostid),
                        r.key
                    );
                }
            }
            Ok(())
        }
        ResvCmd::Register {
            action,
            crkey,
            nrkey,
            iekey,
            ..
        } => {
            let action = match action {
                RegisterArg::Register => RegisterAction::Register,
                RegisterArg::Unregister => RegisterAction::Unregister,
                RegisterArg::Replace => RegisterAction::Replace,
            };
            ns.reservation_register(action, *crkey, *nrkey, *iekey)
                .await
                .with_context(|| format!("registering with {what}"))
        }
        ResvCmd::Acquire {
            action,
            rtype,
            crkey,
            prkey,
            ..
        } => {
            let action = match action {
                AcquireArg::Acquire => AcquireAction::Acquire,
                AcquireArg::Preempt => AcquireAction::Preempt,
                AcquireArg::PreemptAbort => AcquireAction::PreemptAndAbort,
            };
            ns.reservation_acquire(action, rtype.rtype(), *crkey, *prkey)
                .await
                .with_context(|| format!("acquiring a reservation of {what}"))
        }
        ResvCmd::Release {
            action,
            rtype,
            crkey,
            ..
        } => {
            let action = match action {
                ReleaseArg::Release => ReleaseAction::Release,
                ReleaseArg::Clear => ReleaseAction::Clear,
            };
            ns.reservation_release(action, rtype.rtype(), *crkey)
                .await
                .with_context(|| format!("releasing the reservation of {what}"))
        }
    };
    c.disconnect(Duration::from_secs(1)).await;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_host_ids_parse_or_name_the_value() {
        assert_eq!(parse_key("0xa1"), Ok(0xa1));
        assert_eq!(parse_key("161"), Ok(161));
        assert!(parse_key("0xzz").unwrap_err().contains("`0xzz`"));
        let id = parse_hostid("5c1a1ce0-0000-4000-8000-0000000000ab").unwrap();
        assert_eq!((id[0], id[15]), (0x5c, 0xab));
        assert!(parse_hostid("5c1a").unwrap_err().contains("--hostid"));
        assert!(parse_hostid("5c1a1ce0-0000-4000-8000-0000000000ag").is_err());
    }
}
