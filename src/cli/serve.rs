//! `walrus serve`: the flags over the configuration file, then the daemon
//! ([`crate::daemon::run`]) until it stops.

use super::Fatal;
use super::ServeArgs;
use crate::config::{Config, UpstreamMode};
use std::process::ExitCode;

pub fn run(args: ServeArgs) -> ExitCode {
    match load(&args).and_then(crate::daemon::run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
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
