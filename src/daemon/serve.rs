//! What `walrus serve` runs, in order: the signal handlers and the watchdog; the TLS files
//! and the ports, claimed before anything slow; the managed valkey-server, or the external
//! Valkey's address; the metrics endpoint; what walrus learns of Valkey ([`super::learn`]);
//! the durable half ([`super::durable`]), attached before clients are let in; the proxy,
//! until the stop; then the durable half's stop and the managed Valkey's.

use super::durable::start_durability;
use super::learn::{check_cluster, check_settings, cluster_node, learn_upstream};
use super::listeners::{self, Ports};
use super::readiness::Readiness;
use super::signals::{spawn_signal_handler, spawn_watchdog};
use super::Fatal;
use crate::config::{Config, UpstreamMode};
use crate::proxy::pipeline::PipelineCtx;
use crate::proxy::pool::{PoolKey, Pools};
use crate::proxy::{server, Shared};
use crate::upstream::cluster::{self, ClusterNode};
use crate::upstream::managed::ManagedValkey;
use crate::upstream::tls::UpstreamTls;
use crate::upstream::{binary, Upstream};
use crate::valkey::role::OffsetOracle;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::watch;

pub(super) async fn serve(config: Config) -> Result<(), Fatal> {
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
    if super::uses_data_dir(&config) {
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
        // The stop's bound is twice proxy.shutdown_timeout_ms, and the drain may have taken
        // one: half of one for Valkey, the rest for the journal's close and the exit. A
        // Valkey without persistence exits at once on SIGTERM unless it does not run.
        m.stop_within(Duration::from_millis(config.proxy.shutdown_timeout_ms) / 2)
            .await;
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
        Arc::new(move || r.check().map_err(|e| e.to_string())),
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
            backups: Arc::new(crate::datadir::backup::Backups {
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
        persistence: durable.as_ref().map(|d| {
            Arc::new(crate::proxy::info::Persistence {
                gate: d.durability.clone(),
                journal: Arc::downgrade(&d.journal),
                store: d.store.clone(),
                checkpoint_failing: d.checkpoint_failing.clone(),
                checkpoint_in_progress: d.checkpoint_in_progress.clone(),
            })
        }),
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

/// What Valkey's replication stream may add around a client's write (SELECT, MULTI/EXEC).
const WRAPPING_BYTES: usize = 4096;
