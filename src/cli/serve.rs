//! `walrus serve`: load the configuration, bring Valkey up (managed) or find it (external),
//! learn its command table, and proxy until SIGTERM or SIGINT.

use super::durable::start_durability;
use super::learn::{check_cluster, check_settings, cluster_node, learn_upstream};
use super::listeners::{self, Ports};
use super::Fatal;
use super::ServeArgs;
use crate::config::{Config, UpstreamMode};
use crate::durability::{Durability, LinkState};
use crate::proxy::pipeline::PipelineCtx;
use crate::proxy::pool::{PoolKey, Pools};
use crate::proxy::{server, Shared};
use crate::upstream::cluster::{self, ClusterNode};
use crate::upstream::managed::ManagedValkey;
use crate::upstream::tls::UpstreamTls;
use crate::upstream::{binary, Upstream};
use crate::valkey::role::OffsetOracle;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

pub fn run(args: ServeArgs) -> ExitCode {
    let config = match load(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("walrus: {e}");
            return super::exit_code(e.as_ref());
        }
    };
    // The data directory's owner first, before ports, TLS files or Valkey: a second walrus
    // on it must leave it, and the first one's Valkey, as they were.
    let _owner = match uses_data_dir(&config)
        .then(|| super::data_dir::own(&config.data.dir))
        .transpose()
    {
        Ok(lock) => lock,
        Err(e) => {
            eprintln!("walrus: {e}");
            return ExitCode::from(super::EXIT_RETRY);
        }
    };
    init_tracing(&config.log);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.proxy.worker_threads())
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("walrus: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("walrus: {e}");
            super::exit_code(e.as_ref())
        }
    }
}

fn load(args: &ServeArgs) -> Result<Config, Fatal> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    if let Some(l) = &args.listen {
        config.proxy.listen = crate::config::parse_listen(l)
            .map_err(|e| crate::config::ConfigError::Invalid(format!("--listen: {e}")))?;
    }
    if let Some(u) = &args.upstream {
        config.upstream.mode = UpstreamMode::External;
        config.upstream.address = u.clone();
    }
    if let Some(d) = &args.data_dir {
        config.data.dir = d.clone();
    }
    if let Some(m) = &args.metrics_listen {
        config.metrics.listen = m.clone();
    }
    if let Some(ip) = args.cluster_announce_ip {
        config.cluster.announce_ip = ip.to_string();
    }
    config.validate()?;
    Ok(config)
}

/// Whether walrus keeps anything in `data.dir`: the journal and checkpoints, or the managed
/// Valkey's working directory.
fn uses_data_dir(config: &Config) -> bool {
    config.durability.enabled || config.upstream.mode == UpstreamMode::Managed
}

fn init_tracing(log: &crate::config::LogConfig) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(log.filter().unwrap_or_default()))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match log.format {
        crate::config::LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        crate::config::LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

async fn serve(config: Config) -> Result<(), Fatal> {
    tracing::info!(version = super::VERSION, "walrus starting");
    let (stop_tx, stop) = watch::channel(false);
    let (hup_tx, hup) = watch::channel(0u64);
    let stop_bound = Duration::from_millis(config.proxy.shutdown_timeout_ms).saturating_mul(2);
    spawn_signal_handler(stop_tx, hup_tx, stop_bound)?;
    spawn_watchdog();
    // The TLS files are checked and the ports claimed before anything slow (Valkey's start,
    // the ring's allocation, a restore): a bad certificate or a port in use is reported at
    // once, not after minutes of work.
    let upstream_tls = UpstreamTls::from_config(&config.upstream.tls, &config.upstream.address)?;
    let tls = listeners::load_tls(&config)?;
    match &tls {
        Some(t) => listeners::spawn_reloads(t.clone(), &config, hup),
        None => drop(hup),
    }
    let ports = Ports::claim(&config, tls).await?;
    if uses_data_dir(&config) {
        let dir = &config.data.dir;
        super::data_dir::make_private(dir)
            .map_err(|e| format!("data.dir {}: {e}", dir.display()))?;
    }
    let cluster = match ports.clients_addr()? {
        Some(addr) => cluster_node(&config, addr)?,
        // Validated: cluster mode needs proxy.listen.
        None => None,
    };

    let managed = match config.upstream.mode {
        UpstreamMode::Managed => {
            let bin = binary::find(&config.upstream.valkey_server)?;
            Some(
                ManagedValkey::start(
                    bin,
                    &config.data.dir.join("valkey"),
                    config.socket_path(crate::config::VALKEY_SOCKET)?,
                    config.upstream.extra_args.clone(),
                    cluster.clone(),
                )
                .await?,
            )
        }
        UpstreamMode::External => None,
    };
    let address = managed
        .as_ref()
        .map(|m| m.address.clone())
        .unwrap_or_else(|| config.upstream.address.clone());
    let up = Upstream {
        address,
        credentials: config.credentials()?,
        connect_timeout: Duration::from_millis(config.upstream.connect_timeout_ms),
        reply_timeout: Duration::from_millis(config.upstream.reply_timeout_ms),
        limits: config.proxy.limits(),
        process: managed.as_ref().map(|m| m.process()),
        tls: upstream_tls,
    };
    let result = run_proxy(&config, up, ports, stop, managed.as_ref(), cluster.as_ref()).await;
    if let Some(m) = managed {
        tracing::info!("stopping managed valkey-server");
        m.stop().await;
    }
    result
}

async fn run_proxy(
    config: &Config,
    up: Upstream,
    ports: Ports,
    mut stop: watch::Receiver<bool>,
    managed: Option<&ManagedValkey>,
    cluster: Option<&ClusterNode>,
) -> Result<(), Fatal> {
    // Health and readiness are served from the start: a restore may take minutes, and a
    // liveness probe must not kill walrus meanwhile.
    let readiness = Arc::new(Readiness {
        durable: config.durability.enabled,
        ..Readiness::default()
    });
    let admin = Arc::new(OnceLock::new());
    let r = readiness.clone();
    let status = Arc::new(crate::http::status::Sources::new(
        Arc::new(move || r.check()),
        config.durability.enabled,
    ));
    // A token file that cannot be read is a configuration error, metrics endpoint or not.
    let access = crate::http::AdminAccess {
        allow_remote: config.metrics.admin_allow_remote,
        token: match config.metrics.admin_token_file.as_str() {
            "" => None,
            file => Some(crate::http::token::AdminToken::load(file.as_ref())?),
        },
    };
    if let Some(m) = ports.metrics {
        tracing::info!("metrics on http://{}/metrics", m.local_addr()?);
        tokio::spawn(crate::http::serve(m, status.clone(), admin.clone(), access));
    }
    crate::supervisor::status("starting: connecting to Valkey");
    let (table, databases, server) = tokio::select! {
        r = learn_upstream(&up, Duration::from_millis(config.upstream.reconnect_backoff_max_ms)) => r?,
        _ = stop.wait_for(|s| *s) => return Ok(()),
    };
    tracing::info!(
        server = %server,
        commands = table.len(),
        databases,
        "learned Valkey's command table"
    );
    if config.upstream.mode == UpstreamMode::External {
        check_settings(&up, config.upstream.strict_settings).await?;
    }
    check_cluster(cluster, &up, &server).await?;
    if let Some(node) = cluster {
        tokio::spawn(cluster::watch(cluster::Watch {
            up: up.clone(),
            interval: Duration::from_millis(config.cluster.poll_interval_ms),
            node: node.clone(),
            server: server.clone(),
            peers: config.cluster.peers()?,
            problem: readiness.cluster.clone(),
        }));
    }
    // The link must outlive the client sessions: on SIGTERM they drain replies that are held
    // until the journal covers them, so it is stopped (by `Durable::stop`) only after they are
    // done. Its stop signal never fires; the sender lives until this function returns.
    let (_link_stop_tx, link_stop) = watch::channel(false);
    let mut durable = if config.durability.enabled {
        let d = start_durability(config, &up, link_stop, managed).await?;
        let _ = readiness.gate.set(d.durability.clone());
        let _ = status.durable.set(crate::http::status::DurableSources {
            gate: d.durability.clone(),
            journal: Arc::downgrade(&d.journal),
            store: d.store.clone(),
            archive: d.archive.as_ref().map(|a| a.status.clone()),
        });
        let _ = admin.set(crate::http::Admin {
            checkpoint: d.checkpoint_requests.clone(),
            backups: Arc::new(crate::restore::backup::Backups {
                journal: Arc::downgrade(&d.journal),
                store: d.store.clone(),
                checkpoint: d.checkpoint_requests.clone(),
                pin: d.pin.clone(),
                running: Default::default(),
                stop: stop.clone(),
                high_watermark: config.disk.high_watermark,
            }),
            rewinds: d.rewinds.clone(),
        });
        // Weak: the hook lives as long as the process, the journal must close at shutdown.
        let (gate, journal) = (d.durability.clone(), Arc::downgrade(&d.journal));
        crate::metrics::on_scrape(move || {
            gate.publish_metrics();
            if let Some(s) = journal.upgrade().map(|j| j.status()) {
                crate::metrics::FREE_SEGMENTS.set(i64::from(s.segments) - s.used_segments as i64);
                crate::metrics::RING_FILL.set(s.used_segments as f64 / f64::from(s.segments));
            }
        });
        Some(d)
    } else {
        tracing::warn!("durability.enabled = false: walrus proxies without journaling; acknowledged writes can be lost");
        None
    };
    if let Some(d) = durable.as_mut() {
        // Clients are let in once writes can be acknowledged: a first SET must not meet
        // "-MISCONF not attached" just because walrus started a moment ago, and no read may
        // see a Valkey that still has to be restored.
        tracing::info!("waiting for the replica link to attach before accepting clients");
        crate::supervisor::status(
            "starting: attaching to Valkey's replication stream (restoring Valkey first if it came back empty)",
        );
        tokio::select! {
            _ = d.durability.wait_attached(None) => {}
            r = &mut d.link => return Err(match r {
                Ok(Err(why)) => why.into(),
                Ok(Ok(())) => "the replica link stopped before attaching".into(),
                Err(e) => format!("the replica link failed: {e}").into(),
            }),
            _ = stop.wait_for(|s| *s) => return Ok(()),
        }
    }
    let ctx = Arc::new(PipelineCtx {
        upstream: up.clone(),
        durability: durable.as_ref().map(|d| d.durability.clone()),
        oracle: OffsetOracle::new(),
        max_in_flight: config.upstream.max_in_flight_requests,
    });
    if let Some(d) = &ctx.durability {
        // Writes whose outcome is unknown keep their keys dirty until Valkey's offset after
        // them is known and durable.
        let orphans = d.take_orphans().expect("one resolver per gate");
        let c = ctx.clone();
        tokio::spawn(crate::durability::resolve_orphans(
            d.clone(),
            orphans,
            move || {
                let c = c.clone();
                async move { c.oracle.offset(&c.upstream).await }
            },
        ));
    }
    let pools = Pools::new(
        ctx,
        config.upstream.pool_size,
        Duration::from_millis(config.upstream.reconnect_backoff_max_ms),
    );
    let default_pool = pools
        .get(
            PoolKey {
                user: None,
                resp3: false,
            },
            None,
        )
        .await;
    let shared = Arc::new(Shared {
        table,
        pools,
        default_pool: default_pool.clone(),
        limits: config.proxy.limits(),
        max_query_buffer_bytes: config.proxy.max_query_buffer_bytes,
        max_pipeline_requests: config.proxy.max_pipeline_requests,
        databases,
        max_push_bytes: config.proxy.max_push_bytes,
        max_output_bytes: config.proxy.max_output_bytes(),
        allow_admin_commands: config.proxy.allow_admin_commands,
        allow_monitor: config.proxy.allow_monitor,
        cert_user: config.tls.auth_clients_user,
        max_write_bytes: if config.durability.enabled {
            // Room for the SELECT or MULTI/EXEC Valkey may wrap around it in the stream.
            (config.journal.max_entry() as usize).saturating_sub(WRAPPING_BYTES)
        } else {
            usize::MAX
        },
    });
    let (listeners, addrs) = Ports::listen(ports.clients, ports.tls, config)?;
    // Weak: the pools close with the last session, before walrus stops Valkey, rather than
    // reconnect to a Valkey stopping on purpose (and warn that they cannot).
    let _ = readiness.pool.set(Arc::downgrade(&default_pool));
    let pool = Arc::downgrade(&default_pool);
    drop(default_pool);
    crate::metrics::on_scrape(move || {
        let connected = pool.upgrade().is_some_and(|p| p.is_connected());
        crate::metrics::UPSTREAM_CONNECTED.set(i64::from(connected));
    });
    match config.proxy.listen.and(addrs.last()) {
        Some(addr) => tracing::info!(
            "walrus listening on {addr}, upstream Valkey at {}",
            up.address
        ),
        None => tracing::info!(
            "walrus serves TLS clients only (proxy.listen is \"\"), upstream Valkey at {}",
            up.address
        ),
    }
    crate::supervisor::ready(&format!("serving clients on {}", addrs.join(", ")));
    let max_clients =
        super::fds::size_for_clients(config.proxy.max_clients, config.journal.segments);
    server::serve(
        shared,
        listeners,
        max_clients,
        stop,
        Duration::from_millis(config.proxy.shutdown_timeout_ms),
    )
    .await;
    if let Some(d) = durable {
        d.stop().await;
    }
    Ok(())
}

/// What `/readyz` answers: 200 only when walrus serves data durably.
#[derive(Default)]
struct Readiness {
    durable: bool,
    gate: OnceLock<Arc<Durability>>,
    pool: OnceLock<std::sync::Weak<crate::proxy::pool::Pool>>,
    /// Cluster mode: why Valkey does not announce this walrus ([`cluster::Watch`]).
    cluster: Arc<std::sync::Mutex<Option<String>>>,
}

impl Readiness {
    fn check(&self) -> Result<(), String> {
        if self.durable {
            match self.gate.get().map(|g| g.status()) {
                None => return Err("starting: opening the journal".into()),
                Some(LinkState::Attached) => {}
                Some(LinkState::Detached) => {
                    return Err("the replica link is not attached to Valkey".into())
                }
                Some(LinkState::Restoring) => {
                    return Err("restoring Valkey from the checkpoint and journal".into())
                }
                Some(LinkState::Failed(why)) => {
                    return Err(format!("the journal failed: {why}"));
                }
            }
        }
        if let Some(why) = &*self.cluster.lock().unwrap_or_else(|p| p.into_inner()) {
            return Err(why.clone());
        }
        match self.pool.get().map(|p| p.upgrade()) {
            None => Err("starting: connecting to Valkey".into()),
            Some(None) => Err("stopping".into()),
            Some(Some(p)) if !p.is_connected() => Err("no connection to Valkey".into()),
            Some(Some(_)) => Ok(()),
        }
    }
}

/// What Valkey's replication stream may add around a client's write (SELECT, MULTI/EXEC).
const WRAPPING_BYTES: usize = 4096;

/// Feeds systemd's watchdog from a task on the event loop, twice per interval as sd_notify(3)
/// advises: it is fed while the loop turns, during a restore too, and not once it stops.
fn spawn_watchdog() {
    if let Some(every) = crate::supervisor::watchdog_interval() {
        tracing::info!(?every, "feeding the service manager's watchdog");
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every / 2);
            loop {
                tick.tick().await;
                crate::supervisor::watchdog();
            }
        });
    }
}

/// SIGTERM and SIGINT stop walrus, within `stop_bound` ([`bound_the_stop`]); SIGHUP reads
/// the TLS files again (`hup` counts them). Without a handler, SIGHUP would end the
/// process: it is handled whatever the configuration, and said to have nothing to reload
/// when there is no TLS listener.
fn spawn_signal_handler(
    stop: watch::Sender<bool>,
    hup: watch::Sender<u64>,
    stop_bound: Duration,
) -> Result<(), Fatal> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hangup = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            if hup.receiver_count() == 0 {
                tracing::info!("SIGHUP received: nothing to reload (no tls.listen)");
            } else {
                tracing::info!(
                    "SIGHUP received: reading the TLS certificate, key and CA files again"
                );
                hup.send_modify(|n| *n += 1);
            }
        }
    });
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
        crate::supervisor::stopping("stopping: draining held replies, then closing the journal");
        bound_the_stop(stop_bound);
        let _ = stop.send(true);
    });
    Ok(())
}

/// Ends the process `bound` from now if the stop has not: walrus never hangs, not even on its
/// way out. Cut there, it is as after a SIGKILL (what it acknowledged is journaled; a managed
/// Valkey dies with it), and status 1 tells a supervisor to start it again. Watched from a
/// thread of its own and written with plain system calls, so that it works even when the
/// runtime's threads, or the log's writer, are stuck.
fn bound_the_stop(bound: Duration) {
    std::thread::spawn(move || {
        // A timer, not synchronization: nothing is awaited but the bound.
        std::thread::sleep(bound);
        let line = format!(
            "walrus: the stop did not finish within {} ms (twice proxy.shutdown_timeout_ms): \
             exiting now, as a SIGKILL would end it; the next start restores from the journal\n",
            bound.as_millis()
        );
        // SAFETY: a write of a live buffer to stderr, then an exit that runs nothing that
        // could wait on the stuck threads.
        unsafe {
            libc::write(2, line.as_ptr().cast(), line.len());
            libc::_exit(1);
        }
    });
}
