//! The TLS configuration client connections get, kept fresh without a restart.
//!
//! The certificate, key and CA files are read again every `tls.reload_interval_ms` and on
//! SIGHUP; a configuration is rebuilt only when their contents changed. A new one is used
//! by the connections accepted after it; a connection keeps the configuration it was
//! accepted with for its whole life (rustls holds it per connection), so a reload never
//! drops or disturbs a client. Files that fail a check (unreadable, an expired certificate,
//! a key that is not the certificate's) are kept out: the configuration in use stays, the
//! error is logged naming the file, and `walrus_tls_reloads_total{result="failed"}` counts
//! it, again at each reading until the files are mended.

use super::{Material, TlsError};
use crate::config::TlsConfig;
use crate::metrics::{TlsReload, TLS_CERT_EXPIRY};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio_rustls::rustls::ServerConfig;

/// The contents of the files a configuration was built from, in a fixed order; `None` for
/// one that could not be read.
type Contents = Vec<(PathBuf, Option<Vec<u8>>)>;

/// The configuration new TLS clients get, and the files it came from.
pub struct ServerTls {
    settings: TlsConfig,
    current: Mutex<Current>,
}

struct Current {
    config: Arc<ServerConfig>,
    contents: Contents,
    serial: String,
}

/// What a reading of the files found.
#[derive(Debug, PartialEq, Eq)]
pub enum Reloaded {
    /// They changed and passed every check: new connections get the new configuration,
    /// whose certificate has this serial number.
    Loaded {
        serial: String,
    },
    Unchanged,
}

impl ServerTls {
    /// Reads and checks the files (at start: an error here stops walrus).
    pub fn load(settings: &TlsConfig) -> Result<ServerTls, TlsError> {
        let contents = read_contents(settings);
        let served = Material::from(settings).served(settings.auth_clients)?;
        TLS_CERT_EXPIRY.set(served.not_after);
        Ok(ServerTls {
            settings: settings.clone(),
            current: Mutex::new(Current {
                config: Arc::new(served.config),
                contents,
                serial: served.serial,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Current> {
        // Held only to read or replace an Arc: a panic cannot leave it half-written.
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The configuration for a connection accepted now.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.lock().config.clone()
    }

    /// The serial number of the certificate served now.
    pub fn serial(&self) -> String {
        self.lock().serial.clone()
    }

    /// Reads the files again; rebuilds the configuration if they changed. On an error the
    /// configuration in use stays. Counted in `walrus_tls_reloads_total`.
    pub fn reload(&self) -> Result<Reloaded, TlsError> {
        let contents = read_contents(&self.settings);
        if self.lock().contents == contents {
            TlsReload::Unchanged.count();
            return Ok(Reloaded::Unchanged);
        }
        let served = match Material::from(&self.settings).served(self.settings.auth_clients) {
            Ok(s) => s,
            Err(e) => {
                TlsReload::Failed.count();
                return Err(e);
            }
        };
        TLS_CERT_EXPIRY.set(served.not_after);
        let serial = served.serial.clone();
        *self.lock() = Current {
            config: Arc::new(served.config),
            contents,
            serial: served.serial,
        };
        TlsReload::Loaded.count();
        Ok(Reloaded::Loaded { serial })
    }
}

/// The files `settings` names, read whole (a few KiB): the certificate, the key, the CA
/// file, and each file of the CA directory in name order.
fn read_contents(settings: &TlsConfig) -> Contents {
    let mut paths: Vec<PathBuf> = [
        &settings.cert_file,
        &settings.key_file,
        &settings.ca_cert_file,
    ]
    .iter()
    .filter(|p| !p.is_empty())
    .map(PathBuf::from)
    .collect();
    if !settings.ca_cert_dir.is_empty() {
        // An unreadable directory reads as a change: the rebuild then names the problem.
        match std::fs::read_dir(&settings.ca_cert_dir) {
            Ok(entries) => {
                let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
                files.sort();
                paths.extend(files);
            }
            Err(_) => paths.push(PathBuf::from(&settings.ca_cert_dir)),
        }
    }
    paths
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).ok();
            (p, bytes)
        })
        .collect()
}

/// Reloads `tls` every `interval` (none when zero) and at each SIGHUP (`hup` changes),
/// logging what each reading found, until `hup`'s sender is gone.
pub async fn keep_fresh(tls: Arc<ServerTls>, interval: Duration, mut hup: watch::Receiver<u64>) {
    let mut tick = (!interval.is_zero()).then(|| {
        let mut t = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        // A process stopped for a while reads the files once on waking, not once per
        // missed interval.
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    loop {
        let why = tokio::select! {
            _ = async { tick.as_mut().expect("guarded").tick().await }, if tick.is_some() => "timer",
            r = hup.changed() => match r {
                Ok(()) => "SIGHUP",
                Err(_) => return,
            },
        };
        let reload = {
            let tls = tls.clone();
            // File reads and a key check: off the event loop's threads.
            tokio::task::spawn_blocking(move || tls.reload()).await
        };
        match reload {
            Ok(Ok(Reloaded::Loaded { serial })) => {
                tracing::info!(%serial, "TLS certificate and key reloaded ({why}): new connections use them")
            }
            Ok(Ok(Reloaded::Unchanged)) => {
                tracing::debug!("TLS files unchanged ({why})")
            }
            Ok(Err(e)) => tracing::error!(
                "TLS reload ({why}) failed, keeping the certificate in use (serial {}): {e}",
                tls.serial()
            ),
            Err(e) => tracing::error!("TLS reload ({why}) failed: {e}"),
        }
    }
}
