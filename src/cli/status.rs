//! `walrus status`: the running walrus's `GET /status`, printed for a person or as its JSON.

use super::admin::Endpoint;
use super::http_client::request;
use crate::http::status::Status;
use clap::{Args, ValueEnum};
use std::process::ExitCode;
use std::time::Duration;

/// A status is read from memory: walrus answers at once, or something is wrong.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned lines for a person.
    Text,
    /// walrus's JSON, one object (the fields are in docs/operations.md).
    Json,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub endpoint: Endpoint,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// Exit 0 with the status (ready or not: the status says which); 1 when walrus cannot be
/// asked.
pub fn run(args: StatusArgs) -> ExitCode {
    let addr = match args.endpoint.resolve(false) {
        Ok((a, _)) => a,
        Err(e) => {
            eprintln!("walrus: {e}");
            return ExitCode::from(super::EXIT_FIX);
        }
    };
    let addr = &addr;
    let answer = match request(addr, "GET", "/status", "", None, ANSWER_TIMEOUT) {
        Ok(a) if a.ok() => a,
        Ok(a) => {
            eprintln!(
                "walrus: {addr} answered /status with {}: {} (a walrus older than `walrus status`?)",
                a.code,
                a.body.trim()
            );
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("walrus: {e}");
            return ExitCode::FAILURE;
        }
    };
    match args.output {
        Output::Json => println!("{}", answer.body.trim_end()),
        Output::Text => match serde_json::from_str::<Status>(&answer.body) {
            Ok(s) => print!("{}", s.human()),
            Err(e) => {
                eprintln!("walrus: {addr}'s /status is not walrus's status JSON: {e}");
                return ExitCode::FAILURE;
            }
        },
    }
    ExitCode::SUCCESS
}
