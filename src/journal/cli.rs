//! `walrus journal ...` subcommands (placeholder).
use clap::Subcommand;
use std::process::ExitCode;

#[derive(Debug, Subcommand)]
pub enum JournalCommand {}

pub fn run(cmd: JournalCommand) -> ExitCode {
    match cmd {}
}
