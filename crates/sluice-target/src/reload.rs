//! Configuration reload: who each subsystem admits, and the tenants,
//! replaced while the target runs (`sluice target` re-reads its file on
//! SIGHUP).
//!
//! A reload applies the subsystems' `hosts`, `allow_any_host`, `dhchap`
//! and `require_auth`, and the `[[tenant]]` entries (new ones created,
//! changed ones replaced whole, removed ones deleted: their hosts belong
//! to the default tenant from then on, live connections included, as a
//! host moved between tenants does; a `default` entry removed reverts to
//! the implicit default tenant), and nothing else: a file that differs
//! from the configuration in force anywhere else (`[target]`, `[tenants]`,
//! the list of subsystems, a subsystem's namespaces, serial or model, a
//! tenant's `charge_cgroup`, or a tenant with one removed) is refused
//! whole, naming what differs, and nothing of it applies.
//!
//! Applied in two steps, tenants first (the one that can still fail: the
//! new tenants are checked against the table in force, which the admin API
//! may have changed), then access, which cannot fail. Every subsystem's new
//! [`Access`] is swapped in, so the next Connect (admin or I/O queue) and
//! the next discovery log page see it; a live controller whose host the new
//! access would refuse at Connect (no longer listed, or without a secret
//! where one is now required) is failed, and its queues close at their next
//! check, as a keep-alive expiry closes them. Its commands in flight
//! complete or fail as at any lost connection; acknowledged writes are
//! already in the backend.

use crate::registry::Registry;
use crate::subsystem::Access;
use crate::tenant::TenantRuntime;
use sluice_config::{Config, SubsystemConfig};
use sluice_runtime::sync::lock;
use std::sync::atomic::Ordering;

/// Why a reload was refused; the configuration in force stays.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReloadError {
    #[error(
        "{what} differs from the running configuration: restart the target to apply it (a reload \
         applies only the subsystems' `hosts`, `allow_any_host`, `dhchap` and `require_auth`, and \
         the `[[tenant]]` entries, and deletes the tenants it no longer lists)"
    )]
    NeedsRestart { what: String },
    /// The new tenants do not fit the table in force (changed through the
    /// admin API since the file was read, say).
    #[error("the tenants: {0}")]
    Tenants(String),
}

/// What a reload changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// One entry per subsystem whose access changed.
    pub access: Vec<AccessChange>,
    /// Tenants created or replaced.
    pub tenants: Vec<String>,
    /// Tenants deleted (no longer in the file).
    pub tenants_removed: Vec<String>,
}

impl ReloadReport {
    pub fn is_empty(&self) -> bool {
        self.access.is_empty() && self.tenants.is_empty() && self.tenants_removed.is_empty()
    }
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
    let (rt, nt) = (&running.tenants, &new.tenants);
    if nt.settings != rt.settings || nt.default_tenant != rt.default_tenant {
        return Some("`[tenants]`".into());
    }
    for r in &rt.tenants {
        match nt.tenants.iter().find(|t| t.name == r.name) {
            None if r.charge_cgroup.is_some() => {
                return Some(format!(
                    "`[[tenant]]` `{}` (removed, with a `charge_cgroup`)",
                    r.name
                ))
            }
            None => {}
            Some(t) if t.charge_cgroup != r.charge_cgroup => {
                return Some(format!("`[[tenant]]` `{}`: its `charge_cgroup`", r.name));
            }
            Some(_) => {}
        }
    }
    for t in &nt.tenants {
        if t.charge_cgroup.is_some() && !rt.tenants.iter().any(|r| r.name == t.name) {
            return Some(format!(
                "`[[tenant]]` `{}` (new, with a `charge_cgroup`)",
                t.name
            ));
        }
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

/// Applies `new` (see the module docs) to the target whose registry is
/// `reg` and whose tenants are `tenants`; refuses the whole file if it
/// changes anything a reload cannot apply.
pub fn reload(
    reg: &Registry,
    tenants: &TenantRuntime,
    new: &Config,
) -> Result<ReloadReport, ReloadError> {
    let r = apply(reg, tenants, new);
    reg.reloads.record(r.is_ok());
    r
}

fn apply(
    reg: &Registry,
    tenants: &TenantRuntime,
    new: &Config,
) -> Result<ReloadReport, ReloadError> {
    let mut running = lock(&reg.running);
    if let Some(what) = needs_restart(&running, new) {
        return Err(ReloadError::NeedsRestart { what });
    }
    let changed: Vec<_> = new
        .tenants
        .tenants
        .iter()
        .filter(|t| !running.tenants.tenants.contains(t))
        .cloned()
        .collect();
    let removed: Vec<String> = running
        .tenants
        .tenants
        .iter()
        .filter(|r| !new.tenants.tenants.iter().any(|t| t.name == r.name))
        .map(|r| r.name.clone())
        .collect();
    let (tenants, tenants_removed) = tenants
        .replace_tenants(&changed, &removed)
        .map_err(|e| ReloadError::Tenants(e.to_string()))?;
    let access = reg.replace_access(&running, new);
    *running = new.clone();
    Ok(ReloadReport {
        access,
        tenants,
        tenants_removed,
    })
}

impl Registry {
    /// Swaps in `new`'s access for every subsystem whose access differs
    /// from `running`'s and fails the controllers it refuses. `new` has
    /// the same subsystems as `running` ([`needs_restart`] said so).
    fn replace_access(&self, running: &Config, new: &Config) -> Vec<AccessChange> {
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
        changes
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
        assert_eq!(
            needs_restart(&running, &tenants).as_deref(),
            Some("`[tenants]`")
        );
        // Tenants may be added, changed and removed; their `charge_cgroup`
        // stays, and one with a `charge_cgroup` stays too.
        let mut gold = tenants.clone();
        gold.tenants
            .tenants
            .push(sluice_config::tenants::TenantSpec::new("gold"));
        assert_eq!(needs_restart(&tenants, &gold), None);
        assert_eq!(needs_restart(&gold, &tenants), None);
        let mut charged = gold.clone();
        charged.tenants.tenants[0].charge_cgroup = Some("/sys/fs/cgroup/cpu/gold".into());
        assert!(needs_restart(&gold, &charged).is_some_and(|w| w.contains("charge_cgroup")));
        assert!(needs_restart(&charged, &tenants)
            .is_some_and(|w| w.contains("`gold` (removed, with a `charge_cgroup`)")));
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
