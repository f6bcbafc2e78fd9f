//! `walrus config check` and `walrus config schema`: a configuration checked before it is
//! deployed, by the same validation `serve` runs (the TLS files too); and its JSON Schema, generated from the
//! configuration's own types, which the Helm chart's `values.schema.json` embeds for its
//! `config:` value (tests/it/deployment_kubernetes.rs checks that they are equal).

use super::{exit_code, EXIT_FIX};
use crate::config::Config;
use crate::upstream::tls::UpstreamTls;
use clap::Subcommand;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Load and validate a configuration file as `walrus serve` would; exit 2 on an error.
    Check {
        /// Configuration file (TOML).
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Print the JSON Schema of walrus.toml.
    Schema,
}

pub fn run(cmd: ConfigCommand) -> ExitCode {
    match cmd {
        ConfigCommand::Check { file } => match check(&file) {
            Ok(c) => {
                println!(
                    "{}: valid ({} mode, ring of {} x {} bytes, data in {})",
                    file.display(),
                    match c.upstream.mode {
                        crate::config::UpstreamMode::Managed => "managed",
                        crate::config::UpstreamMode::External => "external",
                    },
                    c.journal.segments,
                    c.journal.segment_size_bytes,
                    c.data.dir.display()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("walrus: {e}");
                exit_code(e.as_ref())
            }
        },
        ConfigCommand::Schema => match serde_json::to_string_pretty(&schema()) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("walrus: cannot render the schema: {e}");
                ExitCode::from(EXIT_FIX)
            }
        },
    }
}

/// The configuration in `file`, validated as `walrus serve` validates it before it starts:
/// the settings, and the TLS certificate, key and CA files they name.
fn check(file: &std::path::Path) -> Result<Config, super::Fatal> {
    let c = Config::load(file)?;
    c.validate()?;
    // The TLS files, as `serve` reads them at start (expired, key mismatch, no CA).
    crate::daemon::listeners::check_tls(&c)?;
    UpstreamTls::from_config(&c.upstream.tls, &c.upstream.address)?;
    Ok(c)
}

/// walrus.toml's JSON Schema, draft 7 with every definition inlined, so that it can be
/// embedded under another document (the chart's values schema) with no `$ref` to resolve.
pub fn schema() -> serde_json::Value {
    let generator = schemars::generate::SchemaSettings::draft07()
        .with(|s| s.inline_subschemas = true)
        .into_generator();
    let mut schema = generator.into_root_schema_for::<Config>().to_value();
    if let Some(o) = schema.as_object_mut() {
        o.remove("$schema");
        o.remove("definitions");
    }
    plain_descriptions(&mut schema);
    schema
}

/// The descriptions come from the doc comments, whose intra-doc links (`` [`x`] ``) mean
/// nothing to a reader of the schema: they keep the name and lose the brackets.
fn plain_descriptions(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(o) => {
            for (key, value) in o.iter_mut() {
                match value {
                    serde_json::Value::String(text) if key == "description" => {
                        *text = text.replace("[`", "`").replace("`]", "`");
                    }
                    _ => plain_descriptions(value),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(plain_descriptions),
        _ => {}
    }
}
