//! `walrus journal ...` subcommands: init, inspect, verify, repair, export-aof.
//!
//! Exit codes follow the command's one rule (`cli`'s module doc): 0 success or clean; 1 an
//! error that may pass (I/O, a busy lock); 2 one a person must fix: mid-log corruption, a
//! configuration or geometry mismatch.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};

use crate::config::{Config, ConfigError};
use crate::journal::config::JournalConfig;
use crate::journal::engine::{Journal, OpenOptions};
use crate::journal::error::JournalError;
use crate::journal::format::{HeaderError, RecordHeader, HEADER_BYTES};
use crate::journal::lock::Access;
use crate::journal::manifest::Manifest;
use crate::journal::open::{initialize, scan_dir};
use crate::journal::recovery::{ScanReport, Tail};
use crate::journal::ring::{segment_path, Geometry};

/// The ring's geometry on the command line; each overrides the configuration's.
#[derive(Debug, Args)]
pub struct GeometryArgs {
    /// Segment size (a multiple of 4096, at least 64 KiB), in bytes or with a unit (64mb)
    /// [default: journal.segment_size_bytes, 64 MiB].
    #[arg(long, value_parser = crate::units::parse_size)]
    pub segment_size_bytes: Option<u64>,
    /// Number of segments in the ring [default: journal.segments, 16].
    #[arg(long)]
    pub segments: Option<u32>,
}

#[derive(Debug, Subcommand)]
pub enum JournalCommand {
    /// Create the manifest and pre-initialize (zero-fill) all segments ahead of time.
    ///
    /// Give it the configuration file `walrus serve` will run with: the ring then has that
    /// file's geometry, and is refused for what `serve` would refuse.
    Init {
        /// The journal directory [default: the configuration's data.dir, plus /journal].
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Configuration file (TOML) `walrus serve` will use.
        #[arg(long, short = 'c', value_name = "FILE")]
        config: Option<PathBuf>,
        #[command(flatten)]
        geometry: GeometryArgs,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
    },
    /// Show segments, generations, LSN and offset ranges, checkpoint, durable end, fill.
    Inspect {
        /// walrus's data directory (holding journal/), or its journal/.
        #[arg(long)]
        dir: PathBuf,
        /// How far past the end recovery looks for proof of corruption [default: the whole
        /// ring].
        #[arg(long)]
        recovery_lookahead_bytes: Option<u64>,
    },
    /// Check the log: exit 0 when clean (a torn tail is normal), 2 on mid-log corruption.
    Verify {
        /// walrus's data directory (holding journal/), or its journal/.
        #[arg(long)]
        dir: PathBuf,
        /// [default: the whole ring]
        #[arg(long)]
        recovery_lookahead_bytes: Option<u64>,
    },
    /// Cut the log at mid-log corruption, losing the entries after it.
    Repair {
        /// walrus's data directory (holding journal/), or its journal/.
        #[arg(long)]
        dir: PathBuf,
        /// Required: acknowledges that entries after the corruption are lost.
        #[arg(long)]
        accept_data_loss: bool,
        /// [default: the whole ring]
        #[arg(long)]
        recovery_lookahead_bytes: Option<u64>,
    },
    /// Write the current checkpoint plus the journal after it as one AOF for valkey-server.
    ///
    /// The file is the checkpoint's RDB (as the AOF's preamble) followed by the commands the
    /// journal holds after it, without the replication-only PING and REPLCONF; up to a point
    /// in time with --until, --until-offset or --before-command (as `walrus restore` cuts).
    /// To load it, put it in an empty directory as appendonly.aof and run
    /// `valkey-server --appendonly yes --dir THAT_DIR`. Stop walrus first: the export takes
    /// the journal's lock.
    ExportAof {
        /// walrus's data directory (holding journal/ and checkpoints/), or its journal/.
        #[arg(long)]
        dir: PathBuf,
        /// The AOF to write (replaced atomically if it exists); not inside walrus's journal/
        /// or checkpoints/.
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        until: super::restore::UntilArgs,
    },
}

pub fn run(cmd: JournalCommand) -> ExitCode {
    // The data directory's lock for the journal the command works on, before anything
    // else: exclusive where it writes, shared where its verdict must not see files move
    // (init takes it once it knows the directory from the configuration). Inspect takes
    // none: it shows what is on disk at one moment, of a running walrus too.
    let (dir, access) = match &cmd {
        JournalCommand::Init { .. } | JournalCommand::Inspect { .. } => return run_locked(cmd),
        JournalCommand::Verify { dir, .. } => (journal_dir(dir), Access::Shared),
        JournalCommand::Repair { dir, .. } => (journal_dir(dir), Access::Exclusive),
        JournalCommand::ExportAof { dir, .. } => {
            (crate::datadir::data_dirs(dir).0, Access::Exclusive)
        }
    };
    match super::lock_for_command(&dir, access) {
        Ok(_owner) => run_locked(cmd),
        Err(code) => code,
    }
}

fn run_locked(cmd: JournalCommand) -> ExitCode {
    match cmd {
        JournalCommand::Init {
            dir,
            config,
            geometry,
            quiet,
        } => init(dir, config, geometry, quiet),
        JournalCommand::Inspect {
            dir,
            recovery_lookahead_bytes,
        } => inspect(&journal_dir(&dir), recovery_lookahead_bytes),
        JournalCommand::Verify {
            dir,
            recovery_lookahead_bytes,
        } => verify(&journal_dir(&dir), recovery_lookahead_bytes),
        JournalCommand::Repair {
            dir,
            accept_data_loss,
            recovery_lookahead_bytes,
        } => repair(
            &journal_dir(&dir),
            accept_data_loss,
            recovery_lookahead_bytes,
        ),
        JournalCommand::ExportAof { dir, out, until } => export_aof(&dir, &out, &until),
    }
}

/// The journal `--dir` names: walrus's data directory's `journal/`, or the journal itself
/// (as export-aof, verify and backup take them).
fn journal_dir(dir: &Path) -> PathBuf {
    crate::datadir::data_dirs(dir).0
}

fn fail(e: JournalError) -> ExitCode {
    eprintln!("error: {e}");
    super::exit_code(&e)
}

/// Renders a text progress bar on stderr.
fn progress_bar(quiet: bool) -> impl FnMut(u64, u64) {
    let mut last_pct = u64::MAX;
    move |done, total| {
        if quiet || total == 0 {
            return;
        }
        let pct = done * 100 / total;
        if pct == last_pct {
            return;
        }
        last_pct = pct;
        let filled = (pct / 2) as usize;
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r[{}{}] {pct:3}% {} / {} MiB",
            "#".repeat(filled),
            " ".repeat(50 - filled),
            done >> 20,
            total >> 20
        );
        if done == total {
            let _ = writeln!(err);
        }
    }
}

/// The configuration the ring is made for: the file's (or the defaults), with the flags'
/// geometry over it, validated as `serve` validates it, so that what `init` accepts `serve`
/// accepts.
fn init_config(file: Option<&Path>, g: &GeometryArgs) -> Result<Config, ConfigError> {
    let mut config = match file {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    if g.segment_size_bytes.is_some() || g.segments.is_some() {
        let j = &config.journal;
        let sized = JournalConfig::for_geometry(
            g.segment_size_bytes.unwrap_or(j.segment_size_bytes),
            g.segments.unwrap_or(j.segments),
        );
        config.journal = JournalConfig {
            max_write_bytes: j.max_write_bytes.min(sized.max_write_bytes),
            ..sized
        };
    }
    config.validate()?;
    Ok(config)
}

fn init(dir: Option<PathBuf>, file: Option<PathBuf>, g: GeometryArgs, quiet: bool) -> ExitCode {
    let config = match init_config(file.as_deref(), &g) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return super::exit_code(&e);
        }
    };
    let dir = dir.unwrap_or_else(|| config.data.dir.join("journal"));
    let _owner = match super::lock_for_command(&dir, Access::Exclusive) {
        Ok(lock) => lock,
        Err(code) => return code,
    };
    let (dir, cfg) = (dir.as_path(), &config.journal);
    match initialize(dir, cfg, &mut progress_bar(quiet)) {
        Ok((_, created)) => {
            println!(
                "journal in {}: {} segments of {} bytes ({created} created now)",
                dir.display(),
                cfg.segments,
                cfg.segment_size_bytes
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

/// Config for read-only scans: geometry comes from the manifest.
fn scan_cfg(lookahead: Option<u64>) -> JournalConfig {
    JournalConfig {
        recovery_lookahead_bytes: lookahead,
        ..Default::default()
    }
}

fn describe_tail(t: &Tail) -> String {
    match t {
        Tail::End { pos, reason } => format!("clean end at log position {pos} ({reason})"),
        Tail::Corrupt(c) => format!("CORRUPT: {c}"),
    }
}

/// What a segment outside the live log holds: its first record's lap, if any.
fn peek_segment(dir: &Path, index: u32) -> String {
    use std::os::unix::fs::FileExt;
    let mut hdr = [0u8; HEADER_BYTES];
    let read =
        std::fs::File::open(segment_path(dir, index)).and_then(|f| f.read_exact_at(&mut hdr, 0));
    match read.map(|()| RecordHeader::parse(&hdr)) {
        Ok(Ok(h)) => format!("stale, seg_seq {} (first LSN {})", h.seg_seq, h.lsn),
        Ok(Err(HeaderError::Magic)) => "empty (zeros or junk at offset 0)".into(),
        Ok(Err(e)) => format!("junk ({e:?})"),
        Err(e) => format!("unreadable: {e}"),
    }
}

fn print_report(dir: &Path, m: &Manifest, r: &ScanReport) {
    let geo = Geometry {
        segment_size_bytes: m.segment_size_bytes,
        segments: m.segments,
    };
    println!("journal: {}", dir.display());
    println!(
        "layout v{}: {} segments x {} bytes = {} bytes; epoch {}",
        m.layout_version,
        m.segments,
        m.segment_size_bytes,
        geo.ring_bytes(),
        m.epoch
    );
    match &m.data_dir_id {
        Some(id) => println!("data directory: {id} (checkpoints/CHECKPOINT must carry the same)"),
        None => println!("data directory: no identity yet (written before walrus recorded one)"),
    }
    let cp = &m.checkpoint;
    println!(
        "checkpoint: released through LSN {}; log starts at position {} (seg_seq {}) with LSN {}",
        cp.released_through_lsn,
        cp.start_pos,
        geo.seg_seq(cp.start_pos),
        cp.start_lsn
    );
    println!(
        "durable end: LSN {} at position {}, repl offset {}, repl id {}",
        r.end.last_lsn(),
        r.end.end_pos,
        r.end.last_repl_offset,
        String::from_utf8_lossy(&r.end.last_repl_id).trim_end_matches('\0')
    );
    println!("entries retained: {} in {} records", r.entries, r.records);
    let used = geo
        .seg_seq(r.end.end_pos.max(1) - 1)
        .saturating_sub(geo.seg_seq(cp.start_pos))
        + 1;
    let live_bytes = r.end.end_pos - cp.start_pos;
    println!(
        "fill: {live_bytes} bytes in {used} of {} segments ({:.1}%)",
        m.segments,
        live_bytes as f64 * 100.0 / geo.ring_bytes() as f64
    );
    println!("tail: {}", describe_tail(&r.tail));
    println!("segments:");
    for i in 0..m.segments {
        match r.segments.iter().find(|s| geo.seg_index(geo.seq_start(s.seg_seq)) == i) {
            Some(s) => println!(
                "  {i:5}  seg_seq {:6} (lap {})  LSN {}..={}  repl offset ..{}..={}  {} records  {:.1}% full",
                s.seg_seq,
                s.seg_seq / u64::from(m.segments),
                s.first_lsn,
                s.last_lsn,
                s.first_repl_offset_end,
                s.last_repl_offset_end,
                s.records,
                s.used_bytes as f64 * 100.0 / m.segment_size_bytes as f64
            ),
            None => println!("  {i:5}  free: {}", peek_segment(dir, i)),
        }
    }
}

fn inspect(dir: &Path, lookahead: Option<u64>) -> ExitCode {
    match scan_dir(dir, &scan_cfg(lookahead)) {
        Ok((m, r)) => {
            print_report(dir, &m, &r);
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

fn verify(dir: &Path, lookahead: Option<u64>) -> ExitCode {
    match scan_dir(dir, &scan_cfg(lookahead)) {
        Ok((_, r)) => {
            if let Some(corrupt) = r.corruption(dir) {
                eprintln!("{corrupt}");
                return ExitCode::from(super::EXIT_FIX);
            }
            let range = if r.entries == 0 {
                "no entries".to_string()
            } else {
                format!(
                    "{} entries, LSN {}..={}",
                    r.entries,
                    r.start.lsn,
                    r.end.last_lsn()
                )
            };
            println!("OK: {range}, {}", describe_tail(&r.tail));
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

fn repair(dir: &Path, accept_data_loss: bool, lookahead: Option<u64>) -> ExitCode {
    if !accept_data_loss {
        eprintln!(
            "error: repair cuts the log and loses entries; pass --accept-data-loss to confirm"
        );
        return ExitCode::FAILURE;
    }
    let m = match Manifest::load(dir) {
        Ok(Some(m)) => m,
        Ok(None) => {
            return fail(JournalError::Layout(format!(
                "no MANIFEST in {}",
                dir.display()
            )))
        }
        Err(e) => return fail(e),
    };
    // Sync backend: repair needs no performance and must work everywhere.
    let cfg = JournalConfig {
        io_backend: crate::journal::config::IoBackendChoice::Sync,
        recovery_lookahead_bytes: lookahead,
        ..JournalConfig::for_geometry(m.segment_size_bytes, m.segments)
    };
    match Journal::open_with(
        dir,
        &cfg,
        OpenOptions {
            accept_data_loss: true,
            ..OpenOptions::default()
        },
    ) {
        Ok((j, rec)) => {
            match &rec.cut_corruption {
                Some(c) => println!("cut the log at: {c}"),
                None => println!("no corruption found; nothing cut"),
            }
            println!("log now ends at LSN {}", rec.end.last_lsn());
            match j.close() {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => fail(e),
            }
        }
        Err(e) => fail(e),
    }
}

fn export_aof(dir: &Path, out: &Path, until: &super::restore::UntilArgs) -> ExitCode {
    let until = match until.until() {
        Ok(u) => u,
        Err(e) => {
            eprintln!("walrus: {e}");
            return ExitCode::from(super::EXIT_FIX);
        }
    };
    match crate::datadir::export::export_aof(dir, out, &until) {
        Ok(s) => {
            if let Some(cut) = &s.cut {
                print!("{cut}");
            }
            println!("wrote {}: {} bytes", s.out.display(), s.file_bytes());
            println!(
                "checkpoint: {} ({} bytes of RDB), history {} at offset {}",
                s.checkpoint.display(),
                s.rdb_bytes,
                s.replids[0],
                s.start_offset
            );
            println!(
                "journal: {} entries, offsets {}..{}{}; {} commands kept ({} bytes), {} replication-only commands dropped ({} bytes of PING/REPLCONF)",
                s.journal_entries,
                s.start_offset,
                s.end_offset,
                if s.replids.len() > 1 {
                    format!(" (continued as {})", s.replids[1..].join(", "))
                } else {
                    String::new()
                },
                s.commands_kept,
                s.stream_bytes,
                s.commands_dropped,
                s.bytes_dropped
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("walrus: {e}");
            super::exit_code(&e)
        }
    }
}
