//! `[[subsystem.dhchap]]`: DH-HMAC-CHAP secrets per host.
//!
//! ```toml
//! [[subsystem.dhchap]]
//! host = "nqn.2014-08.org.nvmexpress:uuid:..."
//! secret = "DHHC-1:00:...:"        # the host proves it knows this
//! ctrl_secret = "DHHC-1:00:...:"   # optional: hosts may ask the target to prove this
//! hash = "sha256"                  # preferred hash (default sha256)
//! dhgroup = "ffdhe2048"            # preferred DH group (default null)
//! ```
//!
//! Secrets are parsed here (a mistyped one names its key, never its
//! value) and stay redacted in `Debug`.

use serde::{Deserialize, Serialize};
use sluice_auth::{DhGroup, HashId, Secret};

use crate::{err, ConfigError};

/// One host's DH-HMAC-CHAP settings on one subsystem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(into = "HostAuthFile", try_from = "HostAuthFile")]
pub struct HostAuthConfig {
    pub host: String,
    pub secret: Secret,
    pub ctrl_secret: Option<Secret>,
    pub hash: HashId,
    pub dhgroup: DhGroup,
}

impl HostAuthConfig {
    /// `host` authenticates with `secret`, SHA-256, no DH group.
    pub fn new(host: impl Into<String>, secret: Secret) -> Self {
        HostAuthConfig {
            host: host.into(),
            secret,
            ctrl_secret: None,
            hash: HashId::Sha256,
            dhgroup: DhGroup::Null,
        }
    }
    /// Hosts that ask may make the target prove `secret` (bidirectional).
    pub fn with_ctrl_secret(mut self, secret: Secret) -> Self {
        self.ctrl_secret = Some(secret);
        self
    }
    pub fn with_hash(mut self, hash: HashId) -> Self {
        self.hash = hash;
        self
    }
    pub fn with_dhgroup(mut self, group: DhGroup) -> Self {
        self.dhgroup = group;
        self
    }
}

/// `[[subsystem.dhchap]]` as written.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostAuthFile {
    host: String,
    secret: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ctrl_secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    dhgroup: Option<String>,
}

impl std::fmt::Debug for HostAuthFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostAuthFile")
            .field("host", &self.host)
            .field("hash", &self.hash)
            .field("dhgroup", &self.dhgroup)
            .finish_non_exhaustive()
    }
}

impl From<HostAuthConfig> for HostAuthFile {
    fn from(c: HostAuthConfig) -> Self {
        HostAuthFile {
            host: c.host,
            secret: c.secret.to_dhhc(),
            ctrl_secret: c.ctrl_secret.map(|s| s.to_dhhc()),
            hash: Some(c.hash.name().into()),
            dhgroup: Some(c.dhgroup.name().into()),
        }
    }
}

impl TryFrom<HostAuthFile> for HostAuthConfig {
    type Error = ConfigError;
    fn try_from(f: HostAuthFile) -> Result<Self, ConfigError> {
        parse(f, "dhchap")
    }
}

/// Parses one entry; `k` names it in errors (`subsystem[0].dhchap[1]`).
pub(crate) fn parse(f: HostAuthFile, k: &str) -> Result<HostAuthConfig, ConfigError> {
    let secret = Secret::parse(&f.secret).map_err(|e| err(format!("{k}.secret"), e.to_string()))?;
    let ctrl_secret = match &f.ctrl_secret {
        Some(s) => {
            Some(Secret::parse(s).map_err(|e| err(format!("{k}.ctrl_secret"), e.to_string()))?)
        }
        None => None,
    };
    if ctrl_secret.as_ref() == Some(&secret) {
        return Err(err(
            format!("{k}.ctrl_secret"),
            "must differ from `secret`: with one secret, a host could replay the target's proof as its own",
        ));
    }
    let hash = match &f.hash {
        Some(h) => HashId::parse(h).map_err(|e| err(format!("{k}.hash"), e))?,
        None => HashId::Sha256,
    };
    let dhgroup = match &f.dhgroup {
        Some(g) => DhGroup::parse(g).map_err(|e| err(format!("{k}.dhgroup"), e))?,
        None => DhGroup::Null,
    };
    Ok(HostAuthConfig {
        host: f.host,
        secret,
        ctrl_secret,
        hash,
        dhgroup,
    })
}

/// Takes the raw entry out of a subsystem file (so the subsystem's
/// validation can name `subsystem[i].dhchap[j]`).
pub(crate) fn raw(c: HostAuthConfig) -> HostAuthFile {
    HostAuthFile::from(c)
}
