//! The control socket: one command per line, one reply line ("ok ..." or "err ...").
//! docs/faultfs.md lists the commands; tests/common/faultfs.rs is a client.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::crash::{Mode, Rng};
use crate::faults;
use crate::state::Shared;

/// Binds the socket, replacing a stale one a killed faultfs left (never another file).
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if m.file_type().is_socket() {
            std::fs::remove_file(path)?;
        }
    }
    UnixListener::bind(path)
}

/// Serves every connection on a thread of its own, for the life of the process.
pub fn serve(listener: UnixListener, sh: Arc<Shared>) {
    std::thread::Builder::new()
        .name("faultfs-control".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let sh = sh.clone();
                let _ = std::thread::Builder::new()
                    .name("faultfs-client".into())
                    .spawn(move || client(stream, &sh));
            }
        })
        .expect("spawn the control thread");
}

fn client(stream: UnixStream, sh: &Shared) {
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    for line in BufReader::new(stream).lines().map_while(Result::ok) {
        let reply = command(sh, line.trim());
        if writeln!(out, "{reply}").is_err() {
            return;
        }
    }
}

/// Runs one command; returns its reply line.
pub fn command(sh: &Shared, line: &str) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["crash"] => crash(sh, Mode::Drop),
        ["crash", "tear"] => crash(sh, Mode::Tear),
        ["crash", "reorder"] => crash(sh, Mode::Reorder),
        ["recover"] => {
            sh.lock().fenced = false;
            "ok recovered".into()
        }
        ["seed", n] => match n.parse::<u64>() {
            Ok(seed) => {
                sh.lock().rng = Rng::new(seed);
                format!("ok seed {seed}")
            }
            Err(_) => format!("err bad seed {n}"),
        },
        ["fail", rest @ ..] => match faults::parse_rule(rest) {
            Ok(rule) => {
                sh.lock().faults.add(rule);
                format!("ok {line}")
            }
            Err(e) => format!("err {e}"),
        },
        ["clear"] => {
            sh.lock().faults.clear();
            "ok cleared".into()
        }
        ["latency", us] => match us.parse::<u64>() {
            Ok(us) => {
                sh.lock().faults.latency = Duration::from_micros(us);
                format!("ok latency {us}")
            }
            Err(_) => format!("err bad latency {us}"),
        },
        ["stall"] => {
            sh.sched.stall();
            "ok stalled".into()
        }
        ["freeze"] => {
            sh.sched.freeze();
            "ok frozen".into()
        }
        ["resume"] => format!("ok resumed {}", sh.sched.resume()),
        ["status"] => sh.lock().status(&sh.sched),
        [] => "err empty command".into(),
        _ => format!("err unknown command: {line}"),
    }
}

/// The crash itself is atomic under the state lock; the requests it left waiting (held
/// by a stall, or in their latency) are failed right after, with the stall ended, so
/// that the processes the harness kills next are not left blocked.
fn crash(sh: &Shared, mode: Mode) -> String {
    let reply = sh.lock().crash(mode);
    sh.sched.run_all_now();
    reply
}
