//! Job descriptions: I/O pattern, block size distributions, sizes, and the
//! `--job NAME,key=value,...` syntax.

use std::fmt;
use std::str::FromStr;

use anyhow::{bail, Context};

use crate::{BenchArgs, QD_MAX};

/// Largest block size of one I/O.
pub const BS_MAX_BYTES: u64 = 16 << 20;

/// Access pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RwMode {
    Read,
    Write,
    RandRead,
    RandWrite,
    Rw,
    RandRw,
}

impl RwMode {
    pub fn is_random(self) -> bool {
        matches!(self, RwMode::RandRead | RwMode::RandWrite | RwMode::RandRw)
    }
}

impl FromStr for RwMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "read" => RwMode::Read,
            "write" => RwMode::Write,
            "randread" => RwMode::RandRead,
            "randwrite" => RwMode::RandWrite,
            "rw" | "readwrite" => RwMode::Rw,
            "randrw" => RwMode::RandRw,
            _ => {
                return Err(format!(
                    "unknown --rw `{s}` (read, write, randread, randwrite, rw, randrw)"
                ))
            }
        })
    }
}

impl fmt::Display for RwMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RwMode::Read => "read",
            RwMode::Write => "write",
            RwMode::RandRead => "randread",
            RwMode::RandWrite => "randwrite",
            RwMode::Rw => "rw",
            RwMode::RandRw => "randrw",
        })
    }
}

/// Parses `4096`, `4k`, `4KiB`, `1m`, `2g` (binary units) into bytes with
/// the project's one size parser ([`sluice_config::parse_size`], whose
/// documentation gives the rules).
pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    Ok(sluice_config::parse_size(s)?)
}

/// Block size distribution.
#[derive(Debug, Clone, PartialEq)]
pub enum BlockSizes {
    Fixed(u64),
    /// Uniform over multiples of 512 bytes in [lo, hi].
    Range(u64, u64),
    /// (bytes, weight) pairs.
    Weighted(Vec<(u64, u32)>),
}

impl BlockSizes {
    pub fn fixed(bytes: u64) -> Self {
        BlockSizes::Fixed(bytes)
    }
    pub fn max_bytes(&self) -> u64 {
        match self {
            BlockSizes::Fixed(b) => *b,
            BlockSizes::Range(_, hi) => *hi,
            BlockSizes::Weighted(v) => v.iter().map(|(b, _)| *b).max().unwrap_or(4096),
        }
    }
    /// A block size for random value `r`.
    pub fn pick(&self, r: u64) -> u64 {
        match self {
            BlockSizes::Fixed(b) => *b,
            BlockSizes::Range(lo, hi) => {
                let steps = (hi - lo) / 512 + 1;
                lo + (r % steps) * 512
            }
            BlockSizes::Weighted(v) => {
                let total: u64 = v.iter().map(|(_, w)| *w as u64).sum();
                let mut x = r % total.max(1);
                for (b, w) in v {
                    if x < *w as u64 {
                        return *b;
                    }
                    x -= *w as u64;
                }
                v.last().map(|(b, _)| *b).unwrap_or(4096)
            }
        }
    }
}

fn check_bs(b: u64) -> Result<u64, String> {
    if b == 0 || b > BS_MAX_BYTES || !b.is_multiple_of(512) {
        return Err(format!(
            "block size {b} must be a multiple of 512 up to {BS_MAX_BYTES}"
        ));
    }
    Ok(b)
}

impl FromStr for BlockSizes {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let size = |x: &str| parse_size(x).map_err(|e| e.to_string()).and_then(check_bs);
        if s.contains(':') {
            let mut v = Vec::new();
            for part in s.split(',') {
                let (b, w) = part
                    .split_once(':')
                    .ok_or_else(|| format!("bad weighted block size `{part}` (e.g. 4k:70)"))?;
                let w: u32 = w
                    .trim()
                    .parse()
                    .map_err(|e| format!("bad weight `{w}`: {e}"))?;
                v.push((size(b)?, w));
            }
            if v.iter().all(|(_, w)| *w == 0) {
                return Err("all block size weights are zero".into());
            }
            return Ok(BlockSizes::Weighted(v));
        }
        if let Some((lo, hi)) = s.split_once('-') {
            let (lo, hi) = (size(lo)?, size(hi)?);
            if lo > hi {
                return Err(format!("block size range `{s}` is reversed"));
            }
            return Ok(BlockSizes::Range(lo, hi));
        }
        Ok(BlockSizes::Fixed(size(s)?))
    }
}

/// One job.
#[derive(Debug, Clone)]
pub struct JobSpec {
    pub(crate) name: String,
    pub(crate) hostnqn: String,
    pub(crate) rw: RwMode,
    pub(crate) rwmixread: u8,
    pub(crate) bs: BlockSizes,
    pub(crate) qd: u32,
    pub(crate) queues: u16,
    pub(crate) rate_iops: Option<u64>,
    /// Mark every I/O urgent (host API flag, CDW13 hint).
    pub(crate) urgent: bool,
    /// Submit the job's `qd` I/Os as one batch whose last I/O carries the
    /// Barrier hint, and start the next batch only when the whole batch has
    /// completed (an application that submits a batch and waits for all of
    /// it). Direct engine only.
    pub(crate) batch: bool,
    /// cgroup the job's queue threads join (`--cgroup`, `cgroup=PATH`).
    pub(crate) cgroup: Option<std::path::PathBuf>,
}

/// The jobs a run executes: the `--job` ones, or one from the top-level flags.
pub fn jobs_from_args(a: &BenchArgs) -> anyhow::Result<Vec<JobSpec>> {
    let base = JobSpec {
        name: "job0".into(),
        hostnqn: a.hostnqn.clone(),
        rw: a.rw,
        rwmixread: a.rwmixread,
        bs: a.bs.clone(),
        qd: a.qd,
        queues: a.queues,
        rate_iops: a.rate_iops,
        urgent: a.urgent,
        batch: a.batch,
        cgroup: a.cgroup.clone(),
    };
    let mut jobs = Vec::new();
    if a.jobs.is_empty() {
        jobs.push(base);
    } else {
        for j in &a.jobs {
            jobs.push(parse_job(j, &base)?);
        }
    }
    for j in &jobs {
        if j.qd == 0 || j.qd > QD_MAX {
            bail!("job {}: qd must be 1..={QD_MAX}", j.name);
        }
        if j.queues == 0 || j.queues > sluice_host::controller::IO_QUEUES_MAX {
            bail!(
                "job {}: queues must be 1..={}",
                j.name,
                sluice_host::controller::IO_QUEUES_MAX
            );
        }
        if j.rwmixread > 100 {
            bail!("job {}: rwmixread is a percentage", j.name);
        }
    }
    Ok(jobs)
}

/// Parses `NAME,key=value,...`; keys not given come from `base`.
pub fn parse_job(s: &str, base: &JobSpec) -> anyhow::Result<JobSpec> {
    let mut parts = s.split(',');
    let name = parts.next().unwrap_or_default().trim();
    if name.is_empty() || name.contains('=') {
        bail!("--job `{s}` must start with a name");
    }
    let mut j = JobSpec {
        name: name.to_string(),
        ..base.clone()
    };
    for kv in parts {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("--job {name}: `{kv}` is not key=value"))?;
        let v = v.trim();
        match k.trim() {
            "hostnqn" => j.hostnqn = v.to_string(),
            "cgroup" => {
                if v.is_empty() {
                    bail!("--job {name}: cgroup= needs a path");
                }
                j.cgroup = Some(v.into())
            }
            "rw" => j.rw = v.parse().map_err(anyhow::Error::msg)?,
            "bs" => j.bs = v.parse().map_err(anyhow::Error::msg)?,
            "qd" => j.qd = v.parse().with_context(|| format!("--job {name}: qd"))?,
            "queues" => j.queues = v.parse().with_context(|| format!("--job {name}: queues"))?,
            "rwmixread" => {
                j.rwmixread = v
                    .parse()
                    .with_context(|| format!("--job {name}: rwmixread"))?
            }
            "rate-iops" | "rate_iops" => {
                j.rate_iops = Some(
                    v.parse()
                        .with_context(|| format!("--job {name}: rate-iops"))?,
                )
            }
            "urgent" => j.urgent = flag(name, "urgent", v)?,
            "batch" => j.batch = flag(name, "batch", v)?,
            other => bail!("--job {name}: unknown key `{other}`"),
        }
    }
    Ok(j)
}

/// A job's boolean key: 1/true/yes or 0/false/no.
fn flag(job: &str, key: &str, v: &str) -> anyhow::Result<bool> {
    match v {
        "1" | "true" | "yes" => Ok(true),
        "0" | "false" | "no" => Ok(false),
        o => bail!("--job {job}: {key}=`{o}` is not 0 or 1"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4k").ok(), Some(4096));
        assert_eq!(parse_size("4KiB").ok(), Some(4096));
        assert_eq!(parse_size("1m").ok(), Some(1 << 20));
        assert_eq!(parse_size("512").ok(), Some(512));
        assert!(parse_size("x").is_err());
    }

    #[test]
    fn block_size_forms() {
        assert_eq!("4k".parse::<BlockSizes>(), Ok(BlockSizes::Fixed(4096)));
        let r: BlockSizes = "4k-128k".parse().expect("range");
        for i in 0..1000 {
            let b = r.pick(i * 7919);
            assert!((4096..=131072).contains(&b) && b.is_multiple_of(512));
        }
        let w: BlockSizes = "4k:70,128k:30".parse().expect("weights");
        let big = (0..10000u64)
            .filter(|&i| w.pick(crate::tests_support_mix(i)) == 131072)
            .count();
        assert!((2500..3500).contains(&big), "{big}");
        assert!("3000".parse::<BlockSizes>().is_err());
        assert!("128k-4k".parse::<BlockSizes>().is_err());
    }

    #[test]
    fn job_syntax() {
        let base = JobSpec {
            name: "b".into(),
            hostnqn: "nqn.h".into(),
            rw: RwMode::Read,
            rwmixread: 50,
            bs: BlockSizes::Fixed(4096),
            qd: 1,
            queues: 1,
            rate_iops: None,
            urgent: false,
            batch: false,
            cgroup: None,
        };
        let j = parse_job(
            "t1,hostnqn=nqn.x,rw=randwrite,bs=8k,qd=4,rate-iops=100",
            &base,
        )
        .expect("job");
        assert_eq!(
            (j.name.as_str(), j.hostnqn.as_str(), j.rw, j.qd),
            ("t1", "nqn.x", RwMode::RandWrite, 4)
        );
        assert_eq!(j.bs, BlockSizes::Fixed(8192));
        assert_eq!(j.rate_iops, Some(100));
        assert_eq!(j.cgroup, None);
        let j = parse_job("t2,cgroup=/sys/fs/cgroup/cpu/gold", &base).expect("job");
        assert_eq!(
            j.cgroup.as_deref(),
            Some(std::path::Path::new("/sys/fs/cgroup/cpu/gold"))
        );
        assert!(parse_job("t2,cgroup=", &base).is_err());
        let j = parse_job("t3,batch=1,urgent=0", &base).expect("job");
        assert!(j.batch && !j.urgent);
        let e = parse_job("t3,batch=maybe", &base).expect_err("bad flag");
        assert!(e.to_string().contains("batch=`maybe`"), "{e}");
        assert!(parse_job("t1,foo=1", &base).is_err());
        assert!(parse_job("qd=1", &base).is_err());
    }
}
