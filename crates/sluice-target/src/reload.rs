//! Configuration reload: who each subsystem admits, replaced while the
//! target runs (`sluice target` re-reads its file on SIGHUP).
//!
//! A reload applies the subsystems' `hosts`, `allow_any_host`, `dhchap`
//! and `require_auth`, and nothing else: a file that differs from the
//! configuration in force anywhere else (`[target]`, the list of subsystems,
//! a subsystem's namespaces, serial or model, the tenants) is refused whole,
//! naming what differs, and the running access stays. Tenants change at run
//! time through the admin API (docs/tenants.md).
//!
//! Applied: every subsystem's new [`Access`] is swapped in, so the next
//! Connect (admin or I/O queue) and the next discovery log page see it; a
//! live controller whose host the new access would refuse at Connect (no
//! longer listed, or without a secret where one is now required) is failed,
//! and its queues close at their next check, as a keep-alive expiry closes
//! them. Its commands in flight complete or fail as at any lost connection;
//! acknowledged writes are already in the backend.

use crate::registry::Registry;
use crate::subsystem::Access;
use sluice_config::{Config, SubsystemConfig};
use sluice_runtime::sync::lock;
use std::sync::atomic::Ordering;

/// Why a reload was refused; the configuration in force stays.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReloadError {
    #[error(
        "{what} differs from the running configuration: restart the target to apply it (a reload \
         applies only the subsystems' `hosts`, `allow_any_host`, `dhchap` and `require_auth`)"
    )]
    NeedsRestart { what: String },
}

/// What a reload changed in one subsystem.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessChange {
    pub nqn: String,
    pub hosts_added: Vec<String>,
    pub hosts_removed: Vec<String>,
    /// The new `allow_any_host`, when it changed.
    pub allow_any_host: Option<bool>,
    /// `dhchap` or `require_auth` changed.
    pub auth_changed: bool,
    /// Live controllers failed because their host is refused now:
    /// (CNTLID, host NQN).
    pub controllers_failed: Vec<(u16, String)>,
}

/// A subsystem's configuration without what a reload may change.
fn fixed_part(sc: &SubsystemConfig) -> SubsystemConfig {
    SubsystemConfig {
        allow_any_host: false,
        hosts: Vec::new(),
        dhchap: Vec::new(),
        require_auth: false,
        ..sc.clone()
    }
}

/// The first thing `new` changes that a reload cannot apply.
fn needs_restart(running: &Config, new: &Config) -> Option<String> {
    if new.target != running.target {
        return Some("`[target]`".into());
    }
    if new.tenants != running.tenants {
        return Some("`[tenants]` or a `[[tenant]]`".into());
    }
    for sc in &new.subsystems {
        if !running.subsystems.iter().any(|r| r.nqn == sc.nqn) {
            return Some(format!("subsystem `{}` (new)", sc.nqn));
        }
    }
    for (i, rc) in running.subsystems.iter().enumerate() {
        match new.subsystems.get(i) {
            None => return Some(format!("subsystem `{}` (removed)", rc.nqn)),
            Some(sc) if sc.nqn != rc.nqn => {
                return Some(format!(
                    "the order of the subsystems (`{}` where `{}` was)",
                    sc.nqn, rc.nqn
                ))
            }
            Some(sc) if fixed_part(sc) != fixed_part(rc) => {
                return Some(format!(
                    "subsystem `{}`: its namespaces, serial or model",
                    sc.nqn
                ))
            }
            Some(_) => {}
        }
    }
    None
}

impl Access {
    /// Whether a Connect from `hostnqn` would pass the host checks.
    pub(crate) fn would_admit(&self, hostnqn: &str) -> bool {
        let has_secret = self.auth.contains_key(hostnqn);
        self.admits(hostnqn) && (has_secret || !self.require_auth)
    }
}

impl Registry {
    /// Applies `new`'s subsystem access (see the module docs); refuses the
    /// whole file if it changes anything else. Returns what changed, one
    /// entry per subsystem whose access changed.
    pub fn reload_access(&self, new: &Config) -> Result<Vec<AccessChange>, ReloadError> {
        let mut running = lock(&self.running);
        if let Some(what) = needs_restart(&running, new) {
            return Err(ReloadError::NeedsRestart { what });
        }
        let mut changes = Vec::new();
        for (rc, sc) in running.subsystems.iter().zip(&new.subsystems) {
            if rc == sc {
                continue;
            }
            let Some(sub) = self.subsystems.get(&sc.nqn) else {
                continue;
            };
            let access = Access::from_config(sc);
            let mut change = AccessChange {
                nqn: sc.nqn.clone(),
                hosts_added: sc
                    .hosts
                    .iter()
                    .filter(|h| !rc.hosts.contains(h))
                    .cloned()
                    .collect(),
                hosts_removed: rc
                    .hosts
                    .iter()
                    .filter(|h| !sc.hosts.contains(h))
                    .cloned()
                    .collect(),
                allow_any_host: (sc.allow_any_host != rc.allow_any_host)
                    .then_some(sc.allow_any_host),
                auth_changed: sc.dhchap != rc.dhchap || sc.require_auth != rc.require_auth,
                controllers_failed: Vec::new(),
            };
            let refused: Vec<_> = self
                .live_controllers(sub)
                .into_iter()
                .filter(|c| !access.would_admit(&c.hostnqn))
                .collect();
            sub.set_access(access);
            for c in refused {
                c.fail();
                tracing::warn!(
                    subsystem = %sc.nqn,
                    cntlid = c.cntlid,
                    hostnqn = %c.hostnqn,
                    "reload: the host is refused now; its controller is failed and its queues close"
                );
                change
                    .controllers_failed
                    .push((c.cntlid, c.hostnqn.clone()));
            }
            if change.allow_any_host == Some(true) {
                tracing::warn!(
                    subsystem = %sc.nqn,
                    "SECURITY: reload: subsystem admits ANY host now (allow_any_host = true)"
                );
            }
            tracing::info!(
                subsystem = %sc.nqn,
                hosts_added = ?change.hosts_added,
                hosts_removed = ?change.hosts_removed,
                allow_any_host = sc.allow_any_host,
                auth_changed = change.auth_changed,
                controllers_failed = change.controllers_failed.len(),
                "reload: subsystem access replaced"
            );
            changes.push(change);
        }
        if !changes.is_empty() {
            // Discovery log pages list what each host may reach.
            self.discovery_genctr.fetch_add(1, Ordering::Relaxed);
        }
        *running = new.clone();
        Ok(changes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_config::{NamespaceConfig, SubsystemConfig};

    fn config(hosts: &[&str]) -> Config {
        let mut sc = SubsystemConfig::new("nqn.2026-12.io.sluice:reload");
        for h in hosts {
            sc = sc.with_host(*h);
        }
        sc.namespaces.push(NamespaceConfig::ram(1, 1 << 20));
        Config {
            subsystems: vec![sc],
            ..Config::default()
        }
    }

    #[test]
    fn only_access_may_change() {
        let running = config(&["h1"]);
        assert_eq!(needs_restart(&running, &config(&["h1", "h2"])), None);
        let mut open = config(&[]);
        open.subsystems[0].allow_any_host = true;
        open.subsystems[0].require_auth = true;
        assert_eq!(needs_restart(&running, &open), None);

        let mut t = config(&["h1"]);
        t.target.queue_depth_max = 64;
        assert_eq!(needs_restart(&running, &t).as_deref(), Some("`[target]`"));
        let mut ns = config(&["h1"]);
        ns.subsystems[0].namespaces[0].nsid = 2;
        assert!(needs_restart(&running, &ns).is_some_and(|w| w.contains("namespaces")));
        let mut more = config(&["h1"]);
        more.subsystems
            .push(SubsystemConfig::new("nqn.2026-12.io.sluice:other"));
        assert!(needs_restart(&running, &more).is_some_and(|w| w.contains("(new)")));
        assert!(needs_restart(&more, &running).is_some_and(|w| w.contains("(removed)")));
        let mut tenants = config(&["h1"]);
        tenants.tenants = sluice_config::TenantsConfig::fair();
        assert!(needs_restart(&running, &tenants).is_some_and(|w| w.contains("tenant")));
    }

    #[test]
    fn would_admit_follows_the_list_and_required_auth() {
        let a = Access::from_config(&config(&["h1"]).subsystems[0]);
        assert!(a.would_admit("h1"));
        assert!(!a.would_admit("h2"));
        let mut sc = config(&["h1"]).subsystems.remove(0);
        sc.require_auth = true;
        assert!(!Access::from_config(&sc).would_admit("h1"));
    }
}
