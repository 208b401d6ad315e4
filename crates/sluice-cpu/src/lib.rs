//! i-NVMe CPU accounting and throttling (sans-IO), thread CPU clocks, and
//! cgroups (v1 `cpu`, v2 threaded/procs) for charging threads through the
//! kernel. Shared by `sluice-target` (its tenant scheduler and cgroup quota agents) and
//! `sluice-host` / `sluice-export`.
//!
//! **Accounting.** A worker reads its thread CPU clock once per loop batch
//! (`CLOCK_THREAD_CPUTIME_ID` costs ~0.4 µs, too much per I/O) and hands the
//! delta to [`BatchCharger::charge`], which splits it among the tenants in
//! proportion to the work units done for each in that batch (PDUs and
//! bytes; see `worker.rs`). A batch with no tenant work is charged to no one
//! (target overhead).
//!
//! **Throttling** ([`Throttle`], Algorithm 3 with the adaptive threshold of
//! §III-C/D). Per tenant and worker: `quota = cpu_share × period`,
//! `min T = quota / 2`, `T` starts at `min T`. CPU charged since the last
//! sub-throttle is the tenant's `runtime`; when it reaches `T / k` the
//! tenant is throttled for `τ = (period − T) / k` (k-split: k short pauses
//! instead of one long one), during which the worker does not read its
//! sockets (TCP back-pressure holds the host). After k throttles `T += α`
//! (capped at the quota). At the end of each period, if the watched victims
//! failed to use their quota (isolation violation), `T ← max(T − ½(T − min
//! T), min T)`. Without a victim signal, T only rises to the quota, so the
//! tenant's CPU share is the hard cap.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sluice_runtime::cast::nanos;

// The thread clocks live in the shared runtime toolkit; named here because
// cgroup membership and CPU charging are read per thread.
pub use sluice_runtime::clock::{current_thread_cpu_ns, current_tid, thread_cpu_ns};

/// Whom CPU is charged to (a tenant id on the target, an export index on
/// the host).
pub type TenantId = u32;

/// Parameters of the throttle (config `[tenants]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThrottleParams {
    pub period: Duration,
    /// Number of sub-throttles per T (k).
    pub k: u32,
    /// Adaptive increase of T after k throttles (α).
    pub alpha: Duration,
    /// Fraction of the quota used as min T (paper: ½).
    pub min_t_fraction: f64,
}

impl Default for ThrottleParams {
    fn default() -> Self {
        ThrottleParams {
            period: Duration::from_millis(100),
            k: 8,
            alpha: Duration::from_micros(5000),
            min_t_fraction: 0.5,
        }
    }
}

/// Algorithm 3 state for one tenant on one worker.
#[derive(Debug, Clone)]
pub struct Throttle {
    p: ThrottleParams,
    quota_ns: u64,
    min_t_ns: u64,
    t_ns: u64,
    runtime_ns: u64,
    num_throttle: u32,
    until: Option<Instant>,
    throttled_since: Option<Instant>,
    period_end: Option<Instant>,
    /// Throttle events and total throttled time.
    pub events: u64,
    pub throttled: Duration,
}

impl Throttle {
    /// `share` is the fraction of one worker thread (0 < share ≤ 1).
    pub fn new(share: f64, p: ThrottleParams) -> Self {
        let mut t = Throttle {
            p,
            quota_ns: 0,
            min_t_ns: 0,
            t_ns: 0,
            runtime_ns: 0,
            num_throttle: 0,
            until: None,
            throttled_since: None,
            period_end: None,
            events: 0,
            throttled: Duration::ZERO,
        };
        t.set_share(share);
        t
    }

    pub fn set_share(&mut self, share: f64) {
        let period = self.p.period.as_nanos() as f64;
        // Float to integer casts saturate (NaN gives 0); the share is clamped
        // to 0..=1, so the quota is at most the period.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        {
            self.quota_ns = (share.clamp(0.0, 1.0) * period) as u64;
            self.min_t_ns = (self.quota_ns as f64 * self.p.min_t_fraction) as u64;
        }
        self.t_ns = self
            .t_ns
            .clamp(self.min_t_ns, self.quota_ns.max(self.min_t_ns));
        if self.t_ns == 0 {
            self.t_ns = self.min_t_ns;
        }
    }

    pub fn threshold(&self) -> Duration {
        Duration::from_nanos(self.t_ns)
    }

    /// Whether the tenant may be served now; ends an expired throttle.
    pub fn is_throttled(&mut self, now: Instant) -> bool {
        match self.until {
            Some(u) if now < u => true,
            Some(_) => {
                self.until = None;
                if let Some(s) = self.throttled_since.take() {
                    self.throttled += now.saturating_duration_since(s);
                }
                false
            }
            None => false,
        }
    }

    /// Charges CPU to the tenant (Algorithm 3 lines 4-13).
    pub fn charge(&mut self, ns: u64, now: Instant) {
        self.roll_period(now, None);
        if self.quota_ns >= nanos(self.p.period) {
            return; // a whole thread: never throttled
        }
        self.runtime_ns += ns;
        let k = u64::from(self.p.k.max(1));
        if self.until.is_none() && self.runtime_ns >= self.t_ns / k {
            self.num_throttle += 1;
            if self.num_throttle >= self.p.k.max(1) {
                let alpha = nanos(self.p.alpha);
                self.t_ns = (self.t_ns + alpha).min(self.quota_ns.max(self.min_t_ns));
                self.num_throttle = 0;
            }
            let period = nanos(self.p.period);
            let tau = period.saturating_sub(self.t_ns) / k;
            self.until = Some(now + Duration::from_nanos(tau));
            self.throttled_since = Some(now);
            self.events += 1;
            self.runtime_ns = 0;
        }
    }

    /// Period bookkeeping; `victims_ok = Some(false)` lowers T (violation).
    pub fn roll_period(&mut self, now: Instant, victims_ok: Option<bool>) {
        let end = *self.period_end.get_or_insert(now + self.p.period);
        if now < end && victims_ok.is_none() {
            return;
        }
        if victims_ok == Some(false) {
            self.t_ns = (self.t_ns - (self.t_ns - self.min_t_ns) / 2).max(self.min_t_ns);
        }
        if now >= end {
            self.period_end = Some(now + self.p.period);
        }
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        self.until
    }
}

/// Algorithms 1-2 of i-NVMe from user space: the CPU the workers spent for
/// a tenant is taken out of the tenant's own cgroup quota for the next
/// period (`runtime ← runtime − wq_usage`); usage beyond one period's quota
/// is carried over (lines 10-12). The quota never drops below `QUOTA_MIN`
/// (the kernel refuses less than 1 ms).
#[derive(Debug, Clone)]
pub struct QuotaCharger {
    base_ns: u64,
    debt_ns: u64,
}

pub const QUOTA_MIN: Duration = Duration::from_millis(1);

impl QuotaCharger {
    pub fn new(base_quota: Duration) -> Self {
        QuotaCharger {
            base_ns: nanos(base_quota),
            debt_ns: 0,
        }
    }

    /// The quota for the next period after `charged_ns` of worker CPU.
    pub fn next_quota(&mut self, charged_ns: u64) -> Duration {
        let min = nanos(QUOTA_MIN);
        let usage = self.debt_ns + charged_ns;
        let room = self.base_ns.saturating_sub(min);
        let take = usage.min(room);
        self.debt_ns = usage - take;
        Duration::from_nanos(self.base_ns - take)
    }
}

/// Drives a [`QuotaCharger`] against a real cgroup v1 `cpu` directory.
///
/// Writing `cpu.cfs_quota_us` makes the kernel refill the cgroup's runtime
/// at once. Written at an arbitrary moment, that refill hands the cgroup
/// up to a second quota within the current period (measured: the victim's
/// degrading factor was 1.20 with mid-period writes, 1.01 with aligned
/// ones). So the agent writes only just after a CFS period boundary, seen
/// as `nr_periods` in `cpu.stat` advancing, where the kernel refills the
/// runtime anyway. Call [`poll`](Self::poll) every ~0.5 ms from a thread
/// that does not share a CPU with the cgroup's tasks.
#[derive(Debug)]
pub struct QuotaAgent {
    cgroup: CpuCgroup,
    charger: QuotaCharger,
    period: Duration,
    last_periods: u64,
    last_write: Option<Instant>,
    last_charged_ns: Option<u64>,
}

impl QuotaAgent {
    /// Sets the cgroup's period and base quota and starts from there.
    pub fn new(
        cgroup: CpuCgroup,
        base_quota: Duration,
        period: Duration,
    ) -> Result<Self, CgroupError> {
        cgroup.set_quota(Some(base_quota), period)?;
        let (last_periods, _, _) = cgroup.stat()?;
        Ok(QuotaAgent {
            cgroup,
            charger: QuotaCharger::new(base_quota),
            period,
            last_periods,
            last_write: None,
            last_charged_ns: None,
        })
    }

    /// Whether a quota write is due: a period boundary was crossed since
    /// the last write, or (the cgroup idle, its period timer stopped) two
    /// periods of wall time passed.
    pub fn due(&self, periods: u64, now: Instant) -> bool {
        periods != self.last_periods
            || self
                .last_write
                .is_none_or(|w| now.saturating_duration_since(w) >= self.period * 2)
    }

    /// `charged_total_ns`: the tenant's cumulative charged worker CPU.
    /// Returns the quota written, if any.
    pub fn poll(
        &mut self,
        charged_total_ns: u64,
        now: Instant,
    ) -> Result<Option<Duration>, CgroupError> {
        let (periods, _, _) = self.cgroup.stat()?;
        if !self.due(periods, now) {
            return Ok(None);
        }
        let prev = self.last_charged_ns.replace(charged_total_ns);
        let charged = prev.map_or(0, |p| charged_total_ns.saturating_sub(p));
        let quota = self.charger.next_quota(charged);
        self.cgroup
            .write("cpu.cfs_quota_us", &quota.as_micros().max(1000).to_string())?;
        self.last_periods = periods;
        self.last_write = Some(now);
        Ok(Some(quota))
    }
}

/// Splits one batch's CPU among tenants by work units.
#[derive(Debug, Default, Clone)]
pub struct BatchCharger {
    units: Vec<u64>,
    touched: Vec<TenantId>,
}

impl BatchCharger {
    pub fn add(&mut self, t: TenantId, units: u64) {
        let i = t as usize;
        if self.units.len() <= i {
            self.units.resize(i + 1, 0);
        }
        if self.units[i] == 0 {
            self.touched.push(t);
        }
        self.units[i] += units.max(1);
    }

    /// Splits `cpu_ns` in proportion to the units of this batch and resets.
    /// The shares sum to `cpu_ns` exactly when any work was recorded.
    pub fn charge(&mut self, cpu_ns: u64, out: &mut Vec<(TenantId, u64)>) {
        out.clear();
        let total: u128 = self
            .touched
            .iter()
            .map(|t| u128::from(self.units[*t as usize]))
            .sum();
        if total == 0 {
            return;
        }
        let mut given = 0u64;
        for (j, t) in self.touched.iter().enumerate() {
            let u = u128::from(self.units[*t as usize]);
            let share = if j + 1 == self.touched.len() {
                cpu_ns - given
            } else {
                // u <= total, so the share is at most cpu_ns.
                #[allow(clippy::cast_possible_truncation)]
                let share = (u128::from(cpu_ns) * u / total) as u64;
                share
            };
            given += share;
            out.push((*t, share));
            self.units[*t as usize] = 0;
        }
        self.touched.clear();
    }
}

/// Errors of the cgroup controller, naming the path.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cgroup `{0}` does not exist (is the cgroup `cpu` controller mounted there?)")]
    Missing(PathBuf),
    #[error("cannot write `{path}`: {source}")]
    Write { path: PathBuf, source: io::Error },
    #[error("cannot read `{path}`: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("cannot create cgroup `{path}`: {source}")]
    Create { path: PathBuf, source: io::Error },
    #[error("`{0}` is not a valid cgroup name (one path component, no `/` or `..`)")]
    BadName(String),
    #[error("`{0}` is not a cgroup directory (no `tasks` or `cgroup.procs`)")]
    NotCgroup(PathBuf),
    #[error("cgroup v2 `{0}` is a domain cgroup: single threads cannot join it; make it threaded (`echo threaded > cgroup.type`) or opt in to moving the whole process (`cgroup.procs`)")]
    V2Domain(PathBuf),
}

/// A cgroup v1 `cpu` cgroup (e.g. under `/sys/fs/cgroup/cpu`).
#[derive(Debug, Clone)]
pub struct CpuCgroup {
    path: PathBuf,
}

impl CpuCgroup {
    /// An existing cgroup directory.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, CgroupError> {
        let path = path.into();
        if !path.join("cpu.cfs_quota_us").exists() {
            return Err(CgroupError::Missing(path));
        }
        Ok(CpuCgroup { path })
    }

    /// Creates (or reuses) child `name` of the cgroup at `parent`.
    pub fn create(parent: &Path, name: &str) -> Result<Self, CgroupError> {
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(CgroupError::BadName(name.into()));
        }
        if !parent.join("cpu.cfs_quota_us").exists() {
            return Err(CgroupError::Missing(parent.into()));
        }
        let path = parent.join(name);
        match fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(source) => return Err(CgroupError::Create { path, source }),
        }
        Self::open(path)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(&self, file: &str, v: &str) -> Result<(), CgroupError> {
        let path = self.path.join(file);
        fs::write(&path, v).map_err(|source| CgroupError::Write { path, source })
    }

    /// `cpu.cfs_period_us` and `cpu.cfs_quota_us` (None: unlimited, -1).
    pub fn set_quota(&self, quota: Option<Duration>, period: Duration) -> Result<(), CgroupError> {
        self.write("cpu.cfs_period_us", &period.as_micros().to_string())?;
        let q = quota.map_or("-1".to_string(), |q| q.as_micros().max(1000).to_string());
        self.write("cpu.cfs_quota_us", &q)
    }

    /// `cpu.cfs_quota_us` (None: no quota, -1) and `cpu.cfs_period_us`.
    pub fn quota(&self) -> Result<(Option<Duration>, Duration), CgroupError> {
        let read = |f: &str| -> Result<i64, CgroupError> {
            let path = self.path.join(f);
            let s = fs::read_to_string(&path).map_err(|source| CgroupError::Read {
                path: path.clone(),
                source,
            })?;
            s.trim().parse().map_err(|_| CgroupError::Read {
                path,
                source: io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("`{}` is not a number", s.trim()),
                ),
            })
        };
        let quota = read("cpu.cfs_quota_us")?;
        // Negative values (-1: no quota) read as none / zero.
        let period = Duration::from_micros(u64::try_from(read("cpu.cfs_period_us")?).unwrap_or(0));
        Ok((
            u64::try_from(quota)
                .ok()
                .filter(|&q| q > 0)
                .map(Duration::from_micros),
            period,
        ))
    }

    /// Moves one thread (TID) into the cgroup (`tasks`).
    pub fn add_thread(&self, tid: i32) -> Result<(), CgroupError> {
        self.write("tasks", &tid.to_string())
    }

    /// (nr_periods, nr_throttled, throttled_time ns) from `cpu.stat`.
    pub fn stat(&self) -> Result<(u64, u64, u64), CgroupError> {
        let path = self.path.join("cpu.stat");
        let s = fs::read_to_string(&path).map_err(|source| CgroupError::Read { path, source })?;
        let get = |k: &str| {
            s.lines()
                .find_map(|l| l.strip_prefix(k).and_then(|v| v.trim().parse().ok()))
                .unwrap_or(0)
        };
        Ok((
            get("nr_periods "),
            get("nr_throttled "),
            get("throttled_time "),
        ))
    }

    /// Removes the (empty) cgroup.
    pub fn remove(self) -> Result<(), CgroupError> {
        fs::remove_dir(&self.path).map_err(|source| CgroupError::Write {
            path: self.path.clone(),
            source,
        })
    }
}

/// Watches CPU-bound victims' cgroups: a period in which a victim was not
/// throttled by its own quota means it could not use its quota (violation).
#[derive(Debug)]
pub struct VictimWatch {
    groups: Vec<(CpuCgroup, u64, u64)>,
}

impl VictimWatch {
    pub fn new(paths: &[PathBuf]) -> Result<Self, CgroupError> {
        let mut groups = Vec::new();
        for p in paths {
            let g = CpuCgroup::open(p)?;
            let (np, nt, _) = g.stat()?;
            groups.push((g, np, nt));
        }
        Ok(VictimWatch { groups })
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Some(true) when every victim used its quota in (most of) the periods
    /// since the last call; Some(false) on a violation; None without victims.
    pub fn victims_ok(&mut self) -> Option<bool> {
        if self.groups.is_empty() {
            return None;
        }
        let mut ok = true;
        for (g, np, nt) in &mut self.groups {
            if let Ok((p, t, _)) = g.stat() {
                let dp = p.saturating_sub(*np);
                let dt = t.saturating_sub(*nt);
                if dp > 0 && dt * 10 < dp * 9 {
                    ok = false;
                }
                *np = p;
                *nt = t;
            }
        }
        Some(ok)
    }
}

/// How [`join_cgroup`] moved the thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupJoin {
    /// cgroup v1: the TID written to `tasks` (this thread only).
    V1Tasks,
    /// cgroup v2 threaded cgroup: the TID written to `cgroup.threads`.
    V2Threads,
    /// cgroup v2 domain cgroup: the PID written to `cgroup.procs`, which
    /// moves the **whole process** (only when the caller opted in).
    V2Procs,
}

/// Moves the calling thread into the cgroup directory `path`, so the
/// kernel's CFS bandwidth control of that cgroup covers its CPU.
///
/// * v1 (the directory has `tasks`): the TID goes to `tasks`.
/// * v2 threaded cgroup (`cgroup.type` is `threaded`): the TID goes to
///   `cgroup.threads` (the process must already be in the threaded subtree's
///   domain).
/// * v2 domain cgroup: threads cannot be placed alone; with `allow_procs`
///   the PID goes to `cgroup.procs` (the whole process moves), otherwise it
///   is an error.
///
/// Errors name the path: missing directory, not a cgroup, unwritable file.
pub fn join_cgroup(path: &Path, allow_procs: bool) -> Result<CgroupJoin, CgroupError> {
    if !path.is_dir() {
        return Err(CgroupError::Missing(path.to_path_buf()));
    }
    let write = |file: &str, v: String| {
        let p = path.join(file);
        fs::write(&p, v).map_err(|source| CgroupError::Write { path: p, source })
    };
    if path.join("tasks").exists() {
        write("tasks", current_tid().to_string())?;
        return Ok(CgroupJoin::V1Tasks);
    }
    if !path.join("cgroup.procs").exists() {
        return Err(CgroupError::NotCgroup(path.to_path_buf()));
    }
    let ty = fs::read_to_string(path.join("cgroup.type")).unwrap_or_default();
    if ty.trim() == "threaded" && path.join("cgroup.threads").exists() {
        write("cgroup.threads", current_tid().to_string())?;
        return Ok(CgroupJoin::V2Threads);
    }
    if allow_procs {
        write("cgroup.procs", std::process::id().to_string())?;
        return Ok(CgroupJoin::V2Procs);
    }
    Err(CgroupError::V2Domain(path.to_path_buf()))
}

/// The cgroup paths (one line per hierarchy) of thread `tid` of this process,
/// from `/proc/self/task/<tid>/cgroup`.
pub fn thread_cgroups(tid: i32) -> io::Result<String> {
    fs::read_to_string(format!("/proc/self/task/{tid}/cgroup"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn thread_clock_of_self_matches_and_advances() {
        let tid = current_tid();
        let a = thread_cpu_ns(tid).unwrap();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let b = thread_cpu_ns(tid).unwrap();
        let c = current_thread_cpu_ns();
        assert!(b > a, "{a} -> {b}");
        assert!(c >= b);
        assert_eq!(thread_cpu_ns(-5), None);
    }

    #[test]
    fn join_errors_name_the_path() {
        let e = join_cgroup(Path::new("/nonexistent/cg"), false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/nonexistent/cg") && e.contains("does not exist"),
            "{e}"
        );
        let d = std::env::temp_dir().join(format!("sluice-cpu-join-{}", std::process::id()));
        fs::create_dir_all(&d).unwrap();
        let e = join_cgroup(&d, true).unwrap_err().to_string();
        assert!(e.contains("not a cgroup"), "{e}");
        // A fake v2 domain cgroup: refused without the opt-in.
        fs::write(d.join("cgroup.procs"), "").unwrap();
        fs::write(d.join("cgroup.type"), "domain\n").unwrap();
        let e = join_cgroup(&d, false).unwrap_err().to_string();
        assert!(
            e.contains("domain cgroup") && e.contains(d.to_str().unwrap()),
            "{e}"
        );
        // Threaded: the TID goes to cgroup.threads (a plain file here).
        fs::write(d.join("cgroup.type"), "threaded\n").unwrap();
        fs::write(d.join("cgroup.threads"), "").unwrap();
        assert_eq!(join_cgroup(&d, false).unwrap(), CgroupJoin::V2Threads);
        assert_eq!(
            fs::read_to_string(d.join("cgroup.threads")).unwrap(),
            current_tid().to_string()
        );
        // Domain with opt-in: the PID goes to cgroup.procs.
        fs::write(d.join("cgroup.type"), "domain\n").unwrap();
        assert_eq!(join_cgroup(&d, true).unwrap(), CgroupJoin::V2Procs);
        assert_eq!(
            fs::read_to_string(d.join("cgroup.procs")).unwrap(),
            std::process::id().to_string()
        );
        let _ = fs::remove_dir_all(&d);
    }
}
