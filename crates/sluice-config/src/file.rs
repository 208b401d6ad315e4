//! The configuration as written in a TOML file: the whole file's shape,
//! composed of each section's own shape and validation ([`TargetFile`],
//! [`SubsystemFile`], the tenant tables), into [`Config`] and back. The
//! cross-section checks (subsystem limit, unique NQNs, per-subsystem send
//! overrides) are here.

use crate::subsystem::{self, SubsystemFile};
use crate::target::TargetFile;
use crate::tenants::{RawTenant, RawTenants};
use crate::{
    err, Config, ConfigError, TargetSettings, TenantsConfig, NAMESPACES_TOTAL_MAX, SUBSYSTEMS_MAX,
};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

/// A whole file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(default)]
    pub(crate) target: TargetFile,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) subsystem: Vec<SubsystemFile>,
    /// Tenant settings (`[tenants]`) and tenants (`[[tenant]]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tenants: Option<RawTenants>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) tenant: Vec<RawTenant>,
}

impl TryFrom<ConfigFile> for Config {
    type Error = ConfigError;
    fn try_from(raw: ConfigFile) -> Result<Config, ConfigError> {
        let mut t = TargetSettings::try_from(raw.target)?;
        if raw.subsystem.len() > SUBSYSTEMS_MAX {
            return Err(err(
                "subsystem",
                format!("{} subsystems, limit {SUBSYSTEMS_MAX}", raw.subsystem.len()),
            ));
        }
        let mut seen = HashSet::new();
        let mut subsystems = Vec::new();
        for (i, s) in raw.subsystem.into_iter().enumerate() {
            let k = format!("subsystem[{i}]");
            let (sc, send) = subsystem::subsystem(&k, s, &t.send, &mut seen)?;
            if let Some(send) = send {
                t.subsystem_send.insert(sc.nqn.clone(), send);
            }
            subsystems.push(sc);
        }
        let namespaces: usize = subsystems.iter().map(|s| s.namespaces.len()).sum();
        if namespaces > NAMESPACES_TOTAL_MAX {
            return Err(err(
                "subsystem",
                format!(
                    "{namespaces} namespaces in all subsystems together, limit {NAMESPACES_TOTAL_MAX}"
                ),
            ));
        }
        let tenants = TenantsConfig::from_raw(raw.tenants, raw.tenant)?;
        Ok(Config {
            target: t,
            subsystems,
            tenants,
        })
    }
}

impl From<Config> for ConfigFile {
    fn from(c: Config) -> Self {
        let subsystem_send = c.target.subsystem_send.clone();
        let (tenants, tenant) = c.tenants.to_raw();
        let subsystem = c
            .subsystems
            .into_iter()
            .map(|s| {
                let send = subsystem_send.get(&s.nqn);
                SubsystemFile::from_config(s, send)
            })
            .collect();
        ConfigFile {
            target: TargetFile::from(c.target),
            subsystem,
            tenants,
            tenant,
        }
    }
}
