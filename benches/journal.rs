//! Journal benchmark (a bench binary, `harness = false`).
//!
//! cargo bench --bench journal -- [--runs 3] [--seconds 2] [--dir PARENT] [--out FILE]
//!
//! For each run: measures the device's raw 4 KiB O_DIRECT|O_DSYNC pwrite latency at queue
//! depth 1, then appends/s and p50/p99 append-to-durable latency for entries of 100 B,
//! 1 KiB, 16 KiB and 180 KiB, with 1 and 64 concurrent appenders, on four setups:
//! io_uring + O_DIRECT, io_uring buffered + O_DSYNC, the sync fallback, and a naive
//! baseline (append to a growing file, fdatasync per entry). Prints medians over runs and
//! the goal ratios as a markdown table. Timings are reported, never asserted.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use walrus::journal::{DirectIo, Entry, IoBackendChoice, Journal, JournalConfig, JournalError};

const SIZES_BYTES: [usize; 4] = [100, 1024, 16 * 1024, 180 * 1024];
const APPENDERS: [usize; 2] = [1, 64];
const REPL_ID: [u8; 40] = *b"0000000000000000000000000000000000000000";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Setup {
    UringDirect,
    UringBufferedDsync,
    SyncFallback,
    Naive,
}

impl Setup {
    fn name(self) -> &'static str {
        match self {
            Setup::UringDirect => "io_uring O_DIRECT|O_DSYNC",
            Setup::UringBufferedDsync => "io_uring buffered O_DSYNC",
            Setup::SyncFallback => "sync fallback, O_DSYNC pwrite on threads",
            Setup::Naive => "naive: growing file, fdatasync/entry",
        }
    }

    fn config(self) -> Option<JournalConfig> {
        let base = JournalConfig::default();
        match self {
            Setup::UringDirect => Some(JournalConfig {
                io_backend: IoBackendChoice::IoUring,
                direct_io: DirectIo::On,
                ..base
            }),
            Setup::UringBufferedDsync => Some(JournalConfig {
                io_backend: IoBackendChoice::IoUring,
                direct_io: DirectIo::Off,
                ..base
            }),
            Setup::SyncFallback => Some(JournalConfig {
                io_backend: IoBackendChoice::Sync,
                direct_io: DirectIo::Auto,
                ..base
            }),
            Setup::Naive => None,
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    appends_per_s: f64,
    latency_us_p50: f64,
    latency_us_p99: f64,
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted[i])
}

fn summarize(mut lat_us: Vec<u32>, elapsed: Duration) -> Sample {
    lat_us.sort_unstable();
    Sample {
        appends_per_s: lat_us.len() as f64 / elapsed.as_secs_f64(),
        latency_us_p50: percentile(&lat_us, 0.50),
        latency_us_p99: percentile(&lat_us, 0.99),
    }
}

/// A preallocated, zero-filled file for raw device measurements, opened O_DIRECT|O_DSYNC.
struct RawFile {
    file: std::fs::File,
    area_bytes: u64,
    next_off: u64,
}

impl RawFile {
    fn create(dir: &Path) -> RawFile {
        let path = dir.join("raw-4k.dat");
        let area_bytes = 64u64 << 20;
        let mut f = std::fs::File::create(&path).unwrap();
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..(area_bytes >> 20) {
            f.write_all(&zeros).unwrap();
        }
        f.sync_all().unwrap();
        let file = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
            .open(&path)
            .unwrap();
        let _ = std::fs::remove_file(&path); // stays open; removed at exit
        RawFile {
            file,
            area_bytes,
            next_off: 0,
        }
    }

    /// Raw device: 4 KiB O_DIRECT|O_DSYNC pwrite at queue depth 1.
    fn qd1_latency(&mut self, writes: usize) -> Sample {
        let mut buf = walrus::journal::buf::IoBuf::new(4096);
        buf.set_len(4096);
        let mut lat = Vec::with_capacity(writes);
        let start = Instant::now();
        for _ in 0..writes {
            let t = Instant::now();
            self.file
                .write_all_at(buf.as_slice(), self.next_off)
                .unwrap();
            lat.push(t.elapsed().as_micros() as u32);
            self.next_off = (self.next_off + 4096) % self.area_bytes;
        }
        summarize(lat, start.elapsed())
    }
}

async fn journal_case(j: &Arc<Journal>, size: usize, appenders: usize, dur: Duration) -> Sample {
    let payload = Bytes::from(vec![0xABu8; size]);
    let deadline = Instant::now() + dur;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..appenders {
        let j = j.clone();
        let payload = payload.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(1 << 16);
            let mut off = 0u64;
            while Instant::now() < deadline {
                off += payload.len() as u64;
                let e = Entry {
                    repl_id: REPL_ID,
                    repl_offset_end: off,
                    payload: payload.clone(),
                };
                let t0 = Instant::now();
                let ticket = loop {
                    match j.append(e.clone()).await {
                        Ok(t) => break t,
                        Err(JournalError::RingFull { .. }) => {
                            let d = j.durable().borrow().lsn;
                            // Another appender may be releasing too: both are fine.
                            let _ = j.release_through(d).await;
                            tokio::task::yield_now().await;
                        }
                        Err(e) => panic!("append: {e}"),
                    }
                };
                ticket.wait().await.unwrap();
                lat.push(t0.elapsed().as_micros() as u32);
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    summarize(all, start.elapsed())
}

/// Naive baseline: one thread appends each entry to a growing file and fdatasyncs it.
async fn naive_case(dir: &Path, size: usize, appenders: usize, dur: Duration) -> Sample {
    type Job = (usize, tokio::sync::oneshot::Sender<()>);
    let path = dir.join("naive.log");
    let (tx, rx) = std::sync::mpsc::channel::<Job>();
    let writer = std::thread::spawn(move || {
        let mut f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)
            .unwrap();
        let data = vec![0xABu8; 200 * 1024];
        while let Ok((len, done)) = rx.recv() {
            // A 16-byte header (length + offset) like a minimal framed log.
            f.write_all(&(len as u64).to_le_bytes()).unwrap();
            f.write_all(&[0u8; 8]).unwrap();
            f.write_all(&data[..len]).unwrap();
            f.sync_data().unwrap();
            let _ = done.send(());
        }
        drop(f);
        let _ = std::fs::remove_file(&path);
    });
    let deadline = Instant::now() + dur;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..appenders {
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(1 << 14);
            while Instant::now() < deadline {
                let t0 = Instant::now();
                let (dtx, drx) = tokio::sync::oneshot::channel();
                tx.send((size, dtx)).unwrap();
                drx.await.unwrap();
                lat.push(t0.elapsed().as_micros() as u32);
            }
            lat
        }));
    }
    drop(tx);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let s = summarize(all, start.elapsed());
    writer.join().unwrap();
    s
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() {
        f64::NAN
    } else if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    }
}

struct Args {
    runs: usize,
    seconds: f64,
    dir: PathBuf,
    out: Option<PathBuf>,
}

fn parse_args() -> Args {
    let mut a = Args {
        runs: 3,
        seconds: 2.0,
        dir: PathBuf::from("target/journal-bench"),
        out: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        match x.as_str() {
            "--runs" => a.runs = it.next().and_then(|v| v.parse().ok()).expect("--runs N"),
            "--seconds" => a.seconds = it.next().and_then(|v| v.parse().ok()).expect("--seconds S"),
            "--dir" => a.dir = PathBuf::from(it.next().expect("--dir PATH")),
            "--out" => a.out = Some(PathBuf::from(it.next().expect("--out FILE"))),
            "--bench" => {} // passed by `cargo bench`
            other => eprintln!("ignoring argument {other}"),
        }
    }
    a
}

fn main() {
    let args = parse_args();
    std::fs::create_dir_all(&args.dir).unwrap();
    let tmp = tempfile::tempdir_in(&args.dir).unwrap();
    let dur = Duration::from_secs_f64(args.seconds);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let setups = [
        Setup::UringDirect,
        Setup::UringBufferedDsync,
        Setup::SyncFallback,
        Setup::Naive,
    ];
    // results[(setup, size, appenders)] -> samples per run
    let mut results: std::collections::BTreeMap<(usize, usize, usize), Vec<Sample>> =
        Default::default();
    let mut raw: Vec<Sample> = Vec::new();
    let mut backends: Vec<String> = vec![String::new(); setups.len()];
    let mut journals: Vec<Option<Arc<Journal>>> = Vec::new();
    for (i, s) in setups.iter().enumerate() {
        journals.push(s.config().map(|cfg| {
            let d = tmp.path().join(format!("setup-{i}"));
            eprintln!(
                "initializing {} ({} x {} MiB)",
                s.name(),
                cfg.segments,
                cfg.segment_size_bytes >> 20
            );
            let (j, rec) = Journal::open(&d, &cfg).unwrap();
            backends[i] = rec.backend.to_string();
            Arc::new(j)
        }));
    }
    let mut rawf = RawFile::create(tmp.path());
    // raw_before[(setup, size)]: raw QD1 latency measured right before that QD1 case, so
    // both see the device in the same state (it is slower for a while after heavy load).
    let mut raw_before: std::collections::BTreeMap<(usize, usize), Vec<Sample>> =
        Default::default();
    for run in 0..args.runs {
        for (si, s) in setups.iter().enumerate() {
            for &size in &SIZES_BYTES {
                let r = rawf.qd1_latency(1000);
                eprintln!(
                    "run {run}: raw 4 KiB O_DIRECT|O_DSYNC QD1: p50 {} us, p99 {} us, {:.0}/s",
                    r.latency_us_p50, r.latency_us_p99, r.appends_per_s
                );
                raw.push(r);
                raw_before.entry((si, size)).or_default().push(r);
                for &n in &APPENDERS {
                    let sample = rt.block_on(async {
                        match &journals[si] {
                            Some(j) => journal_case(j, size, n, dur).await,
                            None => naive_case(tmp.path(), size, n, dur).await,
                        }
                    });
                    eprintln!(
                        "run {run}: {:40} {:>7} B x{:<3} {:>9.0}/s p50 {:>7} us p99 {:>7} us",
                        s.name(),
                        size,
                        n,
                        sample.appends_per_s,
                        sample.latency_us_p50,
                        sample.latency_us_p99
                    );
                    results.entry((si, size, n)).or_default().push(sample);
                }
            }
        }
    }
    for j in journals.into_iter().flatten() {
        if let Ok(j) = Arc::try_unwrap(j) {
            let _ = j.close();
        }
    }

    let med = |si: usize, size: usize, n: usize| -> Sample {
        let v = &results[&(si, size, n)];
        Sample {
            appends_per_s: median(v.iter().map(|s| s.appends_per_s).collect()),
            latency_us_p50: median(v.iter().map(|s| s.latency_us_p50).collect()),
            latency_us_p99: median(v.iter().map(|s| s.latency_us_p99).collect()),
        }
    };
    let raw_p50 = median(raw.iter().map(|s| s.latency_us_p50).collect());
    let raw_p99 = median(raw.iter().map(|s| s.latency_us_p99).collect());
    let raw_rate = median(raw.iter().map(|s| s.appends_per_s).collect());
    let mut md = String::new();
    md += &format!(
        "Medians of {} runs, {} s per case. Raw device 4 KiB O_DIRECT|O_DSYNC pwrite at QD1 (1000 writes before each QD1 case, median of all): p50 {raw_p50:.0} us, p99 {raw_p99:.0} us, {raw_rate:.0} writes/s.\n\n",
        args.runs, args.seconds
    );
    for (i, s) in setups.iter().enumerate() {
        if !backends[i].is_empty() {
            md += &format!("- {}: {}\n", s.name(), backends[i]);
        }
    }
    md += "\n| setup | entry | appenders | appends/s | p50 us | p99 us |\n|---|---:|---:|---:|---:|---:|\n";
    for (si, s) in setups.iter().enumerate() {
        for &size in &SIZES_BYTES {
            for &n in &APPENDERS {
                let m = med(si, size, n);
                let label = if size >= 1024 {
                    format!("{} KiB", size / 1024)
                } else {
                    format!("{size} B")
                };
                md += &format!(
                    "| {} | {label} | {n} | {:.0} | {:.0} | {:.0} |\n",
                    s.name(),
                    m.appends_per_s,
                    m.latency_us_p50,
                    m.latency_us_p99
                );
            }
        }
    }
    let naive = med(3, 1024, 64).appends_per_s;
    // Ratio of the QD1 p50 to the raw p50 measured just before it, median over runs.
    let qd1_ratio = |si: usize, size: usize| -> f64 {
        let raws = &raw_before[&(si, size)];
        let cases = &results[&(si, size, 1)];
        median(
            raws.iter()
                .zip(cases)
                .map(|(r, c)| c.latency_us_p50 / r.latency_us_p50)
                .collect(),
        )
    };
    md += "\nGoals (QD1 ratios: p50 of the 1-appender case over the raw 4 KiB QD1 p50 measured right before it, median over runs):\n\n| setup | 1 KiB x64 appends/s vs naive (goal >= 5x) | QD1 100 B | QD1 1 KiB (goal <= 1.5x) | QD1 16 KiB | QD1 180 KiB |\n|---|---:|---:|---:|---:|---:|\n";
    for (si, s) in setups.iter().enumerate() {
        md += &format!(
            "| {} | {:.1}x | {:.2}x | {:.2}x | {:.2}x | {:.2}x |\n",
            s.name(),
            med(si, 1024, 64).appends_per_s / naive,
            qd1_ratio(si, 100),
            qd1_ratio(si, 1024),
            qd1_ratio(si, 16 * 1024),
            qd1_ratio(si, 180 * 1024)
        );
    }
    println!("{md}");
    if let Some(out) = args.out {
        std::fs::write(out, &md).unwrap();
    }
}
