//! `walrus completions SHELL` and `walrus man`: generated from the command's own definition
//! (clap), so that they list every command and flag this build has.

use super::{Cli, EXIT_RETRY};
use clap::{Args, CommandFactory};
use clap_complete::Shell;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write walrus.1 and one page per subcommand (walrus-serve.1, ...) into this directory,
    /// instead of printing walrus.1.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Prints the completion script, e.g. `walrus completions bash > /etc/bash_completion.d/walrus`.
pub fn completions(args: CompletionsArgs) -> ExitCode {
    clap_complete::generate(
        args.shell,
        &mut Cli::command(),
        "walrus",
        &mut std::io::stdout(),
    );
    ExitCode::SUCCESS
}

/// Prints walrus.1, or writes every page into `--dir` (`man -l walrus.1` reads one).
pub fn man(args: ManArgs) -> ExitCode {
    let result = match &args.dir {
        None => clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout()),
        Some(dir) => std::fs::create_dir_all(dir)
            .and_then(|()| clap_mangen::generate_to(Cli::command(), dir)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("walrus: cannot write the man page: {e}");
            ExitCode::from(EXIT_RETRY)
        }
    }
}
