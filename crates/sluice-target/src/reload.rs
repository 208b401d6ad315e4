//! Configuration reload: which subsystems the target exports, who each
//! admits, and the tenants, replaced while the target runs (`sluice
//! target` re-reads its file on SIGHUP).
//!
//! A reload applies:
//! * subsystems **added** (an NQN the running configuration lacks): built
//!   (their backends opened) before anything is applied, so a backend that
//!   cannot be opened refuses the whole file; their namespaces get new
//!   target-wide indices and per-namespace state (`TenantRuntime`), then
//!   they take Connects and appear in discovery log pages;
//! * subsystems **removed** (an NQN the file no longer lists): taken out of
//!   the table (a Connect naming one is refused as an unknown subsystem),
//!   their access closed (a Connect that found one just before is refused,
//!   as for a host removed, below) and their live controllers failed: their
//!   queues close at the next check, as at a keep-alive expiry. Commands in
//!   flight complete or fail as at any lost connection; acknowledged writes
//!   are already in the backend, which is closed once the last queue and
//!   worker holding it let go (a RAM namespace's memory is freed then);
//! * namespaces **added** to a kept subsystem (an NSID it lacks): built
//!   with the added subsystems, so one that cannot be opened refuses the
//!   whole file; then put into the subsystem's namespace set;
//! * namespaces **removed** from a kept subsystem (an NSID the file no
//!   longer lists): taken out of the set, so a queue's next command naming
//!   it gets Invalid Namespace; commands in flight finish, and the backend
//!   closes once they have and the workers let go of it (as for a removed
//!   subsystem). Either way every live controller of the subsystem sends
//!   its host a Namespace Attribute Changed event at its next check (within
//!   200 ms) naming the NSIDs in its Changed Namespace List log page, and
//!   the host rescans (Linux adds and removes the block devices);
//! * namespaces **grown**: every namespace of a kept subsystem looks again
//!   at what backs it, as nvmet's `revalidate_size` (a `file` namespace's
//!   file or block device grown underneath: `truncate`, `lvextend`); a
//!   `file` namespace with `create = true` whose `size` the file raised is
//!   first extended to it (before anything is applied, so a file that
//!   cannot grow refuses the whole file). A namespace that grew takes in
//!   its new size (whole blocks) and its hosts are told by the same event;
//!   namespaces never shrink online (a smaller `size` is refused, a file
//!   found smaller keeps its namespace's size), and the grown part of a
//!   namespace takes no chain-epoch fences (`fence.rs`);
//! * the `hosts`, `allow_any_host`, `dhchap` and `require_auth` of the
//!   subsystems kept;
//! * the `[[tenant]]` entries (new ones created, changed ones replaced
//!   whole, removed ones deleted: their hosts belong to the default tenant
//!   from then on, live connections included, as a host moved between
//!   tenants does; a `default` entry removed reverts to the implicit
//!   default tenant).
//!
//! Nothing else: a file that differs from the configuration in force
//! anywhere else (`[target]`, `[tenants]`, a kept subsystem's serial or
//! model, a kept namespace's settings other than a created file's `size`,
//! a tenant's `charge_cgroup`, or a tenant with one removed) is refused
//! whole, naming what differs, and nothing of it applies. To change a
//! namespace, remove it in one reload and add it back in the next. The
//! order of subsystems and of namespaces does not matter.
//!
//! Applied in steps, those that can fail first: the added subsystems and
//! namespaces are built, the files of grown namespaces extended, then the
//! tenants are replaced (the new ones are
//! checked against the table in force, which the admin API may have
//! changed); then, and these cannot fail, the added subsystems are
//! registered, the removed ones closed, namespaces added and removed, and
//! every kept subsystem's new [`Access`] is swapped in, so the next
//! Connect (admin or I/O queue) and the next discovery log page see it; a
//! live controller whose host the new access would refuse at Connect (no
//! longer listed, or without a secret where one is now required) is
//! failed, and its queues close at their next check. Last, the kept
//! namespaces are revalidated.

use crate::registry::{NoVolumes, Registry, VolumeOpener};
use crate::subsystem::{Access, Subsystem};
use crate::tenant::{configured_namespaces, TenantRuntime};
use sluice_config::{BackendConfig, Config, NamespaceConfig, SubsystemConfig};
use sluice_runtime::sync::lock;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Why a reload was refused; the configuration in force stays.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReloadError {
    #[error(
        "{what} differs from the running configuration: restart the target to apply it (a reload \
         adds and removes subsystems and namespaces, grows `file` namespaces, applies the kept \
         subsystems' `hosts`, `allow_any_host`, `dhchap` and `require_auth`, and the \
         `[[tenant]]` entries, and deletes the tenants it no longer lists)"
    )]
    NeedsRestart { what: String },
    /// The new tenants do not fit the table in force (changed through the
    /// admin API since the file was read, say).
    #[error("the tenants: {0}")]
    Tenants(String),
    /// A subsystem or namespace the file adds cannot be built (a backend
    /// that does not open, the target's namespace limit).
    #[error("what the file adds: {0}")]
    Add(String),
    /// A file the reload was to extend (a raised `size`) could not grow.
    #[error("a namespace the file grows: {0}")]
    Grow(String),
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
    /// Subsystems added, by NQN.
    pub subsystems_added: Vec<String>,
    /// Subsystems removed, with the controllers that were live on them.
    pub subsystems_removed: Vec<RemovedSubsystem>,
    /// Namespaces added to kept subsystems: (NQN, NSID).
    pub namespaces_added: Vec<(String, u32)>,
    /// Namespaces removed from kept subsystems: (NQN, NSID).
    pub namespaces_removed: Vec<(String, u32)>,
    /// Namespaces of kept subsystems that grew.
    pub namespaces_grown: Vec<NamespaceGrowth>,
}

/// A namespace a reload found larger (its file or device grown, or its
/// created file extended to a raised `size`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceGrowth {
    pub nqn: String,
    pub nsid: u32,
    pub size_bytes_before: u64,
    pub size_bytes: u64,
}

impl ReloadReport {
    pub fn is_empty(&self) -> bool {
        self.access.is_empty()
            && self.tenants.is_empty()
            && self.tenants_removed.is_empty()
            && self.subsystems_added.is_empty()
            && self.subsystems_removed.is_empty()
            && self.namespaces_added.is_empty()
            && self.namespaces_removed.is_empty()
            && self.namespaces_grown.is_empty()
    }
}

impl ReloadReport {
    /// The report as the admin endpoint's `POST /v1/reload` answers it.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "subsystems_added": self.subsystems_added,
            "subsystems_removed": self.subsystems_removed.iter().map(|r| serde_json::json!({
                "nqn": r.nqn,
                "controllers_failed": controllers_json(&r.controllers_failed),
            })).collect::<Vec<_>>(),
            "access": self.access.iter().map(|a| serde_json::json!({
                "nqn": a.nqn,
                "hosts_added": a.hosts_added,
                "hosts_removed": a.hosts_removed,
                "allow_any_host": a.allow_any_host,
                "auth_changed": a.auth_changed,
                "controllers_failed": controllers_json(&a.controllers_failed),
            })).collect::<Vec<_>>(),
            "namespaces_added": namespaces_json(&self.namespaces_added),
            "namespaces_removed": namespaces_json(&self.namespaces_removed),
            "namespaces_grown": self.namespaces_grown.iter().map(|g| serde_json::json!({
                "nqn": g.nqn,
                "nsid": g.nsid,
                "size_bytes_before": g.size_bytes_before,
                "size_bytes": g.size_bytes,
            })).collect::<Vec<_>>(),
            "tenants": self.tenants,
            "tenants_removed": self.tenants_removed,
        })
    }
}

/// (NQN, NSID) pairs as JSON.
fn namespaces_json(list: &[(String, u32)]) -> serde_json::Value {
    list.iter()
        .map(|(nqn, nsid)| serde_json::json!({"nqn": nqn, "nsid": nsid}))
        .collect()
}

/// Controllers a reload failed, as JSON.
fn controllers_json(failed: &[(u16, String)]) -> serde_json::Value {
    failed
        .iter()
        .map(|(cntlid, host)| serde_json::json!({"cntlid": cntlid, "hostnqn": host}))
        .collect()
}

/// A subsystem a reload removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemovedSubsystem {
    pub nqn: String,
    /// Its live controllers, failed: (CNTLID, host NQN).
    pub controllers_failed: Vec<(u16, String)>,
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

/// A subsystem's configuration without what a reload may change (its
/// access and which namespaces it has).
fn fixed_part(sc: &SubsystemConfig) -> SubsystemConfig {
    SubsystemConfig {
        allow_any_host: false,
        hosts: Vec::new(),
        dhchap: Vec::new(),
        require_auth: false,
        namespaces: Vec::new(),
        ..sc.clone()
    }
}

/// What of a subsystem's configuration decides who it admits.
fn access_part(
    sc: &SubsystemConfig,
) -> (
    bool,
    &[String],
    &[sluice_config::auth::HostAuthConfig],
    bool,
) {
    (sc.allow_any_host, &sc.hosts, &sc.dhchap, sc.require_auth)
}

/// The namespaces of `new` that `running` (the same subsystem) lacks.
fn namespaces_added<'a>(
    running: &SubsystemConfig,
    new: &'a SubsystemConfig,
) -> Vec<&'a NamespaceConfig> {
    new.namespaces
        .iter()
        .filter(|n| !running.namespaces.iter().any(|r| r.nsid == n.nsid))
        .collect()
}

/// The NSIDs of `running` that `new` (the same subsystem) no longer lists.
fn namespaces_removed(running: &SubsystemConfig, new: &SubsystemConfig) -> Vec<u32> {
    running
        .namespaces
        .iter()
        .filter(|r| !new.namespaces.iter().any(|n| n.nsid == r.nsid))
        .map(|r| r.nsid)
        .collect()
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
        let Some(rc) = running.subsystems.iter().find(|r| r.nqn == sc.nqn) else {
            continue; // added
        };
        if fixed_part(sc) != fixed_part(rc) {
            return Some(format!("subsystem `{}`: its serial or model", sc.nqn));
        }
        for n in &sc.namespaces {
            let Some(r) = rc.namespaces.iter().find(|r| r.nsid == n.nsid) else {
                continue; // added
            };
            if r == n || grows_created_file(r, n) {
                continue;
            }
            let why = if (NamespaceConfig {
                size_bytes: r.size_bytes,
                ..n.clone()
            }) != *r
            {
                "settings (to change a namespace, remove it in one reload and add it back in the \
                 next)"
            } else if matches!(n.backend, BackendConfig::File { create: true, .. }) {
                "`size`, which is smaller: a namespace never shrinks online"
            } else {
                "`size`: only a `file` namespace with `create = true` changes size online (its \
                 file is extended); a `file` without it grows with its file or device, which the \
                 reload looks at again"
            };
            return Some(format!(
                "subsystem `{}`: namespace {}'s {why}",
                sc.nqn, n.nsid
            ));
        }
    }
    None
}

/// Whether kept namespace `r` becomes `n` by a reload that grows its
/// created file: a `file` with `create = true`, the same but for a `size`
/// at least as large.
fn grows_created_file(r: &NamespaceConfig, n: &NamespaceConfig) -> bool {
    matches!(n.backend, BackendConfig::File { create: true, .. })
        && n.size_bytes >= r.size_bytes
        && (NamespaceConfig {
            size_bytes: r.size_bytes,
            ..n.clone()
        }) == *r
}

/// Applies `new` (see the module docs) to the target whose registry is
/// `reg` and whose tenants are `tenants`; refuses the whole file if it
/// changes anything a reload cannot apply. Added `volume` namespaces
/// cannot be opened (see [`reload_with`]).
pub fn reload(
    reg: &Registry,
    tenants: &TenantRuntime,
    new: &Config,
) -> Result<ReloadReport, ReloadError> {
    reload_with(reg, tenants, new, &NoVolumes)
}

/// [`reload`], opening the `volume` namespaces of added subsystems through
/// `volumes`.
pub fn reload_with(
    reg: &Registry,
    tenants: &TenantRuntime,
    new: &Config,
    volumes: &dyn VolumeOpener,
) -> Result<ReloadReport, ReloadError> {
    let r = apply(reg, tenants, new, volumes);
    reg.reloads.record(r.is_ok());
    r
}

fn apply(
    reg: &Registry,
    tenants: &TenantRuntime,
    new: &Config,
    volumes: &dyn VolumeOpener,
) -> Result<ReloadReport, ReloadError> {
    let mut running = lock(&reg.running);
    if let Some(what) = needs_restart(&running, new) {
        return Err(ReloadError::NeedsRestart { what });
    }
    let added: Vec<&SubsystemConfig> = new
        .subsystems
        .iter()
        .filter(|sc| !running.subsystems.iter().any(|r| r.nqn == sc.nqn))
        .collect();
    let removed: Vec<String> = running
        .subsystems
        .iter()
        .filter(|r| !new.subsystems.iter().any(|sc| sc.nqn == r.nqn))
        .map(|r| r.nqn.clone())
        .collect();
    // Kept subsystems whose namespaces change, with the NSIDs removed.
    let mut to_build: Vec<(&SubsystemConfig, Vec<&NamespaceConfig>)> = Vec::new();
    let mut to_remove: Vec<Vec<u32>> = Vec::new();
    for sc in &new.subsystems {
        let Some(rc) = running.subsystems.iter().find(|r| r.nqn == sc.nqn) else {
            continue;
        };
        let (adds, removes) = (namespaces_added(rc, sc), namespaces_removed(rc, sc));
        if !adds.is_empty() || !removes.is_empty() {
            to_build.push((sc, adds));
            to_remove.push(removes);
        }
    }
    // What can fail, first: nothing is applied yet (a subsystem or
    // namespace built here and dropped closes its backends).
    let built = reg
        .build_added(&added, &to_build, volumes)
        .map_err(|e| ReloadError::Add(e.to_string()))?;
    extend_grown_files(reg, &running, new)?;
    let changed: Vec<_> = new
        .tenants
        .tenants
        .iter()
        .filter(|t| !running.tenants.tenants.contains(t))
        .cloned()
        .collect();
    let tenants_deleted: Vec<String> = running
        .tenants
        .tenants
        .iter()
        .filter(|r| !new.tenants.tenants.iter().any(|t| t.name == r.name))
        .map(|r| r.name.clone())
        .collect();
    let (tenants_changed, tenants_removed) = tenants
        .replace_tenants(&changed, &tenants_deleted)
        .map_err(|e| ReloadError::Tenants(e.to_string()))?;
    // From here on nothing fails.
    for (sub, sc) in built.subsystems.iter().zip(&added) {
        tenants.add_namespaces(&sc.nqn, &configured_namespaces(sub, sc));
    }
    let gone = reg.swap_subsystems(&built.subsystems, &removed);
    let subsystems_removed = gone.iter().map(|sub| reg.close_removed(sub)).collect();
    let (namespaces_added, namespaces_removed) =
        reshape(reg, tenants, &to_build, &to_remove, &built.namespaces);
    if !gone.is_empty() || !namespaces_removed.is_empty() {
        // Every worker looks for queues of the retired namespaces, also
        // one asleep with no connection left.
        reg.removals.fetch_add(1, Ordering::AcqRel);
        for i in 0..tenants.workers {
            tenants.wake(i);
        }
    }
    for (sub, sc) in built.subsystems.iter().zip(&added) {
        crate::registry::log_access(sc);
        tracing::info!(
            subsystem = %sub.nqn,
            namespaces = sub.namespaces.len(),
            "reload: subsystem added"
        );
    }
    let access = reg.replace_access(&running, new);
    if !built.subsystems.is_empty() || !gone.is_empty() {
        // Discovery log pages list the subsystems.
        reg.discovery_genctr.fetch_add(1, Ordering::Relaxed);
    }
    let namespaces_grown = revalidate_kept(reg, &running, new);
    *running = new.clone();
    Ok(ReloadReport {
        access,
        tenants: tenants_changed,
        tenants_removed,
        subsystems_added: built.subsystems.iter().map(|s| s.nqn.clone()).collect(),
        subsystems_removed,
        namespaces_added,
        namespaces_removed,
        namespaces_grown,
    })
}

/// Extends the files of kept `file` namespaces with `create = true` whose
/// `size` the new file raised ([`grows_created_file`]), for
/// [`revalidate_kept`] to take in. Nothing else is applied yet.
fn extend_grown_files(reg: &Registry, running: &Config, new: &Config) -> Result<(), ReloadError> {
    let subsystems = reg.subsystems();
    for sc in &new.subsystems {
        let (Some(rc), Some(sub)) = (
            running.subsystems.iter().find(|r| r.nqn == sc.nqn),
            subsystems.get(&sc.nqn),
        ) else {
            continue;
        };
        for n in &sc.namespaces {
            let raised = rc
                .namespaces
                .iter()
                .any(|r| r.nsid == n.nsid && r.size_bytes < n.size_bytes);
            let (true, Some(size), Some(ns)) = (raised, n.size_bytes, sub.namespaces.get(n.nsid))
            else {
                continue;
            };
            ns.backend.extend(size).map_err(|e| {
                ReloadError::Grow(format!(
                    "subsystem `{}` namespace {} to {size} bytes: {}",
                    sc.nqn,
                    n.nsid,
                    crate::registry::in_config_terms(e)
                ))
            })?;
        }
    }
    Ok(())
}

/// Looks again at the size of every namespace of the subsystems `running`
/// and `new` both have (after the reload's namespaces were added and
/// removed), and takes in growth; returns the namespaces that grew.
fn revalidate_kept(reg: &Registry, running: &Config, new: &Config) -> Vec<NamespaceGrowth> {
    let subsystems = reg.subsystems();
    let mut grown = Vec::new();
    for sc in &new.subsystems {
        let Some(sub) = subsystems.get(&sc.nqn) else {
            continue;
        };
        if !running.subsystems.iter().any(|r| r.nqn == sc.nqn) {
            continue; // added: just opened
        }
        for ns in sub.namespaces.snapshot().values() {
            let before = ns.size_bytes();
            if let Err(e) = ns.backend.revalidate() {
                tracing::warn!(subsystem = %sc.nqn, nsid = ns.nsid, error = %e, "reload: cannot look at the namespace's size again; it keeps its size");
                continue;
            }
            // Growth is judged by the size before and after, not by which
            // caller took it in: a controller's periodic check may take it
            // in between the two lines.
            ns.take_in_size();
            let size_bytes = ns.size_bytes();
            if size_bytes > before {
                tracing::info!(
                    subsystem = %sc.nqn,
                    nsid = ns.nsid,
                    size_bytes_before = before,
                    size_bytes,
                    "reload: namespace grew; the subsystem's hosts are told (Namespace Attribute Changed)"
                );
                grown.push(NamespaceGrowth {
                    nqn: sc.nqn.clone(),
                    nsid: ns.nsid,
                    size_bytes_before: before,
                    size_bytes,
                });
            }
        }
    }
    grown
}

/// Namespaces named by (NQN, NSID).
type NamespaceRefs = Vec<(String, u32)>;

/// Adds and removes the namespaces of kept subsystems: `to_build` and
/// `built` are the namespaces each adds (configured and built), `to_remove`
/// the NSIDs each removes; returns them as (NQN, NSID).
fn reshape(
    reg: &Registry,
    tenants: &TenantRuntime,
    to_build: &[(&SubsystemConfig, Vec<&NamespaceConfig>)],
    to_remove: &[Vec<u32>],
    built: &[Vec<Arc<crate::subsystem::Namespace>>],
) -> (NamespaceRefs, NamespaceRefs) {
    let subsystems = reg.subsystems();
    let (mut added, mut removed) = (Vec::new(), Vec::new());
    for (((sc, ncs), nsids), nss) in to_build.iter().zip(to_remove).zip(built) {
        let Some(sub) = subsystems.get(&sc.nqn) else {
            continue;
        };
        // Per-namespace state first: a queue may use them at once.
        let pairs: Vec<_> = ncs.iter().copied().zip(nss.iter().cloned()).collect();
        tenants.add_namespaces(&sc.nqn, &pairs);
        let gone = reg.replace_namespaces(sub, nss, nsids);
        for ns in nss {
            tracing::info!(
                subsystem = %sc.nqn,
                nsid = ns.nsid,
                size_bytes = ns.size_bytes(),
                "reload: namespace added; the subsystem's hosts are told (Namespace Attribute Changed)"
            );
            added.push((sc.nqn.clone(), ns.nsid));
        }
        for ns in gone {
            ns.retire();
            tracing::warn!(
                subsystem = %sc.nqn,
                nsid = ns.nsid,
                "reload: namespace removed; its commands in flight finish, new ones get Invalid Namespace, and the subsystem's hosts are told (Namespace Attribute Changed)"
            );
            removed.push((sc.nqn.clone(), ns.nsid));
        }
    }
    (added, removed)
}

impl Registry {
    /// Closes a subsystem a reload took out of the table: no host is
    /// admitted any more (a Connect that found it just before is refused,
    /// see the handshake) and its live controllers are failed.
    fn close_removed(&self, sub: &Subsystem) -> RemovedSubsystem {
        sub.set_access(Access::default());
        for ns in sub.namespaces.snapshot().values() {
            ns.retire();
        }
        let removed = RemovedSubsystem {
            nqn: sub.nqn.clone(),
            controllers_failed: self.fail_controllers_of_removed(sub),
        };
        tracing::warn!(
            subsystem = %sub.nqn,
            controllers_failed = removed.controllers_failed.len(),
            "reload: subsystem removed; its controllers are failed and their queues close"
        );
        removed
    }

    /// Swaps in `new`'s access for every subsystem in both `running` and
    /// `new` whose access differs, and fails the controllers it refuses
    /// (the kept subsystems differ in nothing else: [`needs_restart`]).
    fn replace_access(&self, running: &Config, new: &Config) -> Vec<AccessChange> {
        let mut changes = Vec::new();
        let subsystems = self.subsystems();
        for sc in &new.subsystems {
            let Some(rc) = running.subsystems.iter().find(|r| r.nqn == sc.nqn) else {
                continue;
            };
            if access_part(rc) == access_part(sc) {
                continue;
            }
            let Some(sub) = subsystems.get(&sc.nqn) else {
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
    fn the_report_names_namespaces_by_nqn_and_nsid() {
        let r = ReloadReport {
            namespaces_added: vec![("nqn.a".into(), 2)],
            namespaces_removed: vec![("nqn.b".into(), 7)],
            ..ReloadReport::default()
        };
        assert!(!r.is_empty());
        let v = r.to_json();
        assert_eq!(
            v["namespaces_added"],
            serde_json::json!([{"nqn": "nqn.a", "nsid": 2}])
        );
        assert_eq!(
            v["namespaces_removed"],
            serde_json::json!([{"nqn": "nqn.b", "nsid": 7}])
        );
    }

    #[test]
    fn subsystems_access_and_tenants_may_change() {
        let running = config(&["h1"]);
        assert_eq!(needs_restart(&running, &config(&["h1", "h2"])), None);
        let mut open = config(&[]);
        open.subsystems[0].allow_any_host = true;
        open.subsystems[0].require_auth = true;
        assert_eq!(needs_restart(&running, &open), None);

        let mut t = config(&["h1"]);
        t.target.queue_depth_max = 64;
        assert_eq!(needs_restart(&running, &t).as_deref(), Some("`[target]`"));
        // Namespaces may come and go (NSID 1 removed, 2 added); a kept
        // one may not change, but for a created file's `size` growing.
        let mut ns = config(&["h1"]);
        ns.subsystems[0].namespaces[0].nsid = 2;
        assert_eq!(needs_restart(&running, &ns), None);
        let mut grown = config(&["h1"]);
        grown.subsystems[0].namespaces[0] = NamespaceConfig::ram(1, 2 << 20);
        assert!(needs_restart(&running, &grown)
            .is_some_and(|w| w.contains("namespace 1's `size`: only a `file` namespace")));
        let mut other = config(&["h1"]);
        other.subsystems[0].namespaces[0] = NamespaceConfig::ram(1, 1 << 20).with_block_size(4096);
        assert!(
            needs_restart(&running, &other).is_some_and(|w| w.contains("namespace 1's settings"))
        );
        let file = |bytes: u64| {
            let mut c = config(&["h1"]);
            c.subsystems[0].namespaces[0] = NamespaceConfig::file(1, "/tmp/x.img")
                .with_create(true)
                .with_size(bytes);
            c
        };
        assert_eq!(needs_restart(&file(1 << 20), &file(2 << 20)), None);
        assert!(needs_restart(&file(2 << 20), &file(1 << 20))
            .is_some_and(|w| w.contains("never shrinks online")));
        // Whole subsystems may come and go, in any order; a kept one's
        // serial may not change.
        let mut more = config(&["h1"]);
        more.subsystems
            .insert(0, SubsystemConfig::new("nqn.2026-12.io.sluice:other"));
        assert_eq!(needs_restart(&running, &more), None);
        assert_eq!(needs_restart(&more, &running), None);
        let mut serial = more.clone();
        serial.subsystems[1].serial = "other".into();
        assert_eq!(
            needs_restart(&more, &serial).as_deref(),
            Some("subsystem `nqn.2026-12.io.sluice:reload`: its serial or model")
        );
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
