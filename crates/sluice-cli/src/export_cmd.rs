//! `sluice nbd` and `sluice fuse`: export a remote namespace to unmodified
//! tools (see docs/exports.md).

use anyhow::{bail, Context, Result};
use clap::Args;
use sluice_export::fuse::{FuseConfig, SluiceFs};
use sluice_export::nbd::server::UnixSocketPath;
use sluice_export::nbd::{NbdConfig, NbdServer};
use sluice_export::ByteDevice;
use sluice_host::{ConnectOptions, Controller, Namespace};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;
use tracing::info;

/// How to reach the namespace.
#[derive(Debug, Args)]
pub struct RemoteArgs {
    /// NVMe/TCP target address, e.g. 127.0.0.1:4420.
    #[arg(long)]
    pub target: String,
    /// Subsystem NQN.
    #[arg(long)]
    pub nqn: String,
    /// Namespace ID (default: the first active namespace).
    #[arg(long)]
    pub nsid: Option<u32>,
    /// Host NQN to present.
    #[arg(long)]
    pub hostnqn: Option<String>,
    /// I/O queues (TCP connections) to the target.
    #[arg(long, default_value_t = 2)]
    pub io_queues: u16,
    /// Export read-only.
    #[arg(long)]
    pub read_only: bool,
}

#[derive(Debug, Args)]
pub struct NbdArgs {
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Serve on this Unix socket path.
    #[arg(long, conflicts_with = "listen", required_unless_present = "listen")]
    pub unix: Option<PathBuf>,
    /// Serve on this TCP address:port.
    #[arg(long)]
    pub listen: Option<String>,
    /// Export name (clients may also ask for "", the default export).
    #[arg(long, default_value = "sluice")]
    pub export_name: String,
}

#[derive(Debug, Args)]
pub struct FuseArgs {
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Directory to mount on.
    pub mountpoint: PathBuf,
    /// Name of the file inside the mount.
    #[arg(long, default_value = "disk.img")]
    pub file_name: String,
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")
}

async fn connect(r: &RemoteArgs) -> Result<(Controller, Namespace, String)> {
    let addr: SocketAddr = r
        .target
        .to_socket_addrs()
        .with_context(|| format!("resolving --target `{}` (expected host:port)", r.target))?
        .next()
        .with_context(|| format!("`{}` resolves to no address", r.target))?;
    let mut opts = ConnectOptions {
        io_queues: r.io_queues.max(1),
        ..ConnectOptions::default()
    };
    if let Some(h) = &r.hostnqn {
        opts.hostnqn = h.clone();
    }
    let hostnqn = opts.hostnqn.clone();
    let ctrl = Controller::connect(addr, &r.nqn, opts)
        .await
        .with_context(|| format!("connecting to {} at {addr}", r.nqn))?;
    let nsid = match r.nsid {
        Some(n) => n,
        None => match ctrl.namespaces().first() {
            Some(ns) => ns.nsid,
            None => bail!("subsystem {} has no active namespace", r.nqn),
        },
    };
    let ns = ctrl
        .namespace(nsid)
        .with_context(|| format!("namespace {nsid} of {}", r.nqn))?;
    info!(
        hostnqn = %hostnqn,
        nsid,
        block_size_bytes = ns.block_size_bytes(),
        size_blocks = ns.size_blocks(),
        "connected"
    );
    Ok((ctrl, ns, hostnqn))
}

pub fn nbd(a: NbdArgs) -> Result<()> {
    let rt = runtime()?;
    rt.block_on(async {
        let (ctrl, ns, hostnqn) = connect(&a.remote).await?;
        let server = NbdServer::new(
            ByteDevice::new(ns),
            NbdConfig {
                export_name: a.export_name.clone(),
                description: format!("sluice {} nsid via {}", a.remote.nqn, a.remote.target),
                read_only: a.remote.read_only,
                hostnqn,
            },
        );
        let serve = async {
            if let Some(path) = &a.unix {
                let (l, _guard) = UnixSocketPath::bind(path)
                    .with_context(|| format!("binding Unix socket {}", path.display()))?;
                info!(socket = %path.display(), export = %a.export_name, "NBD server ready");
                server
                    .serve_unix(l)
                    .await
                    .context("accepting on the Unix socket")
            } else if let Some(addr) = &a.listen {
                let l = tokio::net::TcpListener::bind(addr.as_str())
                    .await
                    .with_context(|| format!("binding TCP {addr}"))?;
                info!(addr = %l.local_addr()?, export = %a.export_name, "NBD server ready");
                server.serve_tcp(l).await.context("accepting on TCP")
            } else {
                bail!("give --unix PATH or --listen ADDR:PORT")
            }
        };
        let r = tokio::select! {
            r = serve => r,
            s = sluice_export::shutdown_signal() => {
                s.context("installing signal handlers")?;
                info!("signal received, shutting down");
                Ok(())
            }
        };
        ctrl.disconnect(Duration::from_secs(5)).await;
        r
    })
}

pub fn fuse(a: FuseArgs) -> Result<()> {
    let rt = runtime()?;
    let (ctrl, ns, hostnqn) = rt.block_on(connect(&a.remote))?;
    let fs = SluiceFs::new(
        ByteDevice::new(ns),
        rt.handle().clone(),
        FuseConfig {
            file_name: a.file_name.clone(),
            read_only: a.remote.read_only,
            hostnqn,
        },
    );
    let session = sluice_export::fuse::mount(fs, &a.mountpoint).with_context(|| {
        format!(
            "mounting FUSE on {} (needs /dev/fuse and fusermount3)",
            a.mountpoint.display()
        )
    })?;
    info!(mountpoint = %a.mountpoint.display(), file = %a.file_name, "FUSE export mounted");
    rt.block_on(async {
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        let signal = sluice_export::shutdown_signal();
        tokio::pin!(signal);
        loop {
            tokio::select! {
                s = &mut signal => {
                    s.context("installing signal handlers")?;
                    info!("signal received, unmounting");
                    break;
                }
                _ = tick.tick() => {
                    if session.guard.is_finished() {
                        info!("filesystem unmounted externally");
                        break;
                    }
                }
            }
        }
        anyhow::Ok(())
    })?;
    drop(session);
    rt.block_on(ctrl.disconnect(Duration::from_secs(5)));
    Ok(())
}
