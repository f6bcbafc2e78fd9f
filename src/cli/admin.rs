//! Admin commands against a running walrus, over its metrics endpoint (`metrics.listen`).

use clap::Args;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct CheckpointArgs {
    /// walrus's metrics endpoint, host:port (its `metrics.listen`).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8379")]
    pub metrics: String,
    /// How long to wait for the checkpoint, in seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_secs: u64,
}

/// `walrus checkpoint`: POST /checkpoint, print walrus's answer.
pub fn checkpoint(args: CheckpointArgs) -> ExitCode {
    match post(
        &args.metrics,
        "/checkpoint",
        Duration::from_secs(args.timeout_secs),
    ) {
        Ok((true, body)) => {
            print!("{body}");
            ExitCode::SUCCESS
        }
        Ok((false, body)) => {
            eprint!("walrus: checkpoint refused: {body}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("walrus: cannot reach walrus at {}: {e}", args.metrics);
            ExitCode::FAILURE
        }
    }
}

/// A bodiless HTTP/1.1 POST; returns (2xx, body).
fn post(addr: &str, path: &str, timeout: Duration) -> std::io::Result<(bool, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(timeout))?;
    // One write: the endpoint reads the request once and answers.
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(request.as_bytes())?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let ok = head
        .split_whitespace()
        .nth(1)
        .is_some_and(|code| code.starts_with('2'));
    Ok((ok, body.to_string()))
}
