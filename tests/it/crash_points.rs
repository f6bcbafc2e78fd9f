//! Crashes at the named fail points of the operator's paths (src/fault/points.rs lists them,
//! docs/testing.md says what each test here shows): walrus killed (SIGKILL, by the point's
//! `return(kill)`) at each step of a journal initialization, a repair, a checkpoint, a
//! backup and a restore, and, where a power cut leaves something a kill does not (data
//! written but not synced), the same on faultfs with the unsynced data dropped. The next
//! start recovers with every acknowledged write, or refuses naming the way out, and that
//! way recovers them.
use crate::common;
use common::faultfs::FaultFs;
use common::*;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use bytes::Bytes;
use walrus::journal::{Entry, IoBackendChoice, Journal, JournalConfig, ReplayFrom};

/// `walrus ARGS` run to its end, with the fail point `point` killing it at its `skip`+1-th
/// pass (and this run's own `FAILPOINTS`, if any).
fn walrus_killed_at(args: &[&str], point: &str, skip: u32) -> Output {
    let actions = format!("{point}={skip}*off->return(kill)");
    Command::new(walrus_bin())
        .args(args)
        .env("FAILPOINTS", with_inherited_failpoints(&[actions]))
        .output()
        .unwrap()
}

/// Whether `o` is a run that its fail point killed, as it said it would.
fn killed(o: &Output, point: &str) -> bool {
    let said = String::from_utf8_lossy(&o.stderr).contains(&format!("fail point {point}: SIGKILL"));
    said && o.status.signal() == Some(libc::SIGKILL)
}

/// Where a test's files live: a plain directory, or a faultfs mount whose `crash` drops
/// what was not synced (a power cut).
enum Disk {
    Plain(tempfile::TempDir),
    FaultFs(FaultFs),
}

impl Disk {
    /// faultfs, or `None` (with the reason printed) where FUSE cannot be mounted.
    fn faultfs() -> Option<Disk> {
        FaultFs::mount().map(Disk::FaultFs)
    }

    fn plain() -> Disk {
        Disk::Plain(tempfile::tempdir().unwrap())
    }

    fn path(&self, rel: &str) -> PathBuf {
        match self {
            Disk::Plain(d) => d.path().join(rel),
            Disk::FaultFs(fs) => fs.path(rel),
        }
    }

    /// After a kill: on faultfs, the power cut too (what was not synced is gone). Returns
    /// how many writes and name operations it took (none on a plain disk).
    fn power_cut(&self) -> u64 {
        let Disk::FaultFs(fs) = self else { return 0 };
        let cut = common::faultfs::fields(&fs.ok("crash"));
        fs.ok("recover");
        cut["writes"] + cut["names"]
    }
}

/// The steps of `walrus journal init` of three 64 KiB segments, and how often each comes.
const INIT_POINTS: &[(&str, u32)] = &[
    ("journal::init::created", 3),
    ("journal::init::filled", 3),
    ("journal::init::synced", 3),
    ("journal::init::renamed", 3),
    ("journal::init::dir_synced", 1),
    ("manifest::write", 1),
    ("manifest::written", 1),
    ("manifest::synced", 1),
    ("manifest::replaced", 1),
    ("manifest::dir_synced", 1),
];

/// `walrus journal init` killed at each of its steps in turn (creating, filling, syncing and
/// renaming every segment, the directory's sync, then each step of writing the MANIFEST; a
/// pod killed during its first start): whatever it left, the next `init`, or the service's
/// open, finishes the job and the journal verifies clean. On faultfs each kill is also a
/// power cut.
fn init_killed_at_every_step(disk: &Disk) {
    let geometry = [
        "--segment-size-bytes",
        "65536",
        "--segments",
        "3",
        "--quiet",
    ];
    let mut kills = 0;
    for &(point, times) in INIT_POINTS {
        for skip in 0.. {
            let dir = disk.path(&format!("{}-{skip}", point.replace("::", "-")));
            let d = dir.to_str().unwrap();
            let init = [&["journal", "init", "--dir", d][..], &geometry[..]].concat();
            let run = walrus_killed_at(&init, point, skip);
            if run.status.success() {
                assert_eq!(skip, times, "{point} comes {times} times");
                break;
            }
            assert!(
                killed(&run, point),
                "{point} #{skip}: {}",
                output_text(&run)
            );
            kills += 1;
            disk.power_cut();
            // Alternate what comes next: the operator's init, or the service starting.
            if kills % 2 == 0 {
                let again = run_walrus(&init);
                assert!(
                    again.status.success(),
                    "{point} #{skip}: {}",
                    output_text(&again)
                );
            } else {
                let (j, rec) = Journal::open(&dir, &journal_config(3))
                    .unwrap_or_else(|e| panic!("{point} #{skip}: open after the kill: {e}"));
                assert_eq!(rec.end.next_lsn, 1);
                drop(j);
            }
            let verify = run_walrus(&["journal", "verify", "--dir", d]);
            assert!(
                verify.status.success(),
                "{point} #{skip}: {}",
                output_text(&verify)
            );
        }
    }
    // 3 segments x (create, fill, fsync, rename) + directory fsync + MANIFEST (write,
    // written, fsync, rename, directory fsync).
    assert_eq!(kills, 3 * 4 + 1 + 5, "every step was tried");
}

#[test]
fn init_killed_at_every_step_is_finished_by_the_next_start() {
    init_killed_at_every_step(&Disk::plain());
}

#[test]
fn init_cut_by_a_power_loss_at_every_step_is_finished_by_the_next_start() {
    let Some(disk) = Disk::faultfs() else { return };
    init_killed_at_every_step(&disk);
}

/// A journal of `segments` 64 KiB segments on the sync backend (faultfs takes no O_DIRECT
/// alignment rules, and repair runs on it too).
fn journal_config(segments: u32) -> JournalConfig {
    JournalConfig {
        io_backend: IoBackendChoice::Sync,
        ..JournalConfig::small_for_tests(65536, segments)
    }
}

/// The steps of a repair: finding the corruption, the cut, each step of storing the
/// MANIFEST, and the end.
const REPAIR_POINTS: &[&str] = &[
    "journal::repair::found",
    "journal::repair::cut",
    "manifest::write",
    "manifest::written",
    "manifest::synced",
    "manifest::replaced",
    "manifest::dir_synced",
    "journal::repair::stored",
];

/// A journal of 40 entries of 1000 bytes (`[i; 1000]` for LSN i) with a byte of entry 11
/// flipped: mid-log corruption, which a start refuses and a repair cuts.
async fn corrupted_journal(dir: &Path) {
    let (j, _) = Journal::open(dir, &journal_config(4)).unwrap();
    let positions = append_numbered_entries(&j).await;
    j.close().unwrap();
    // Entry N starts at the write position after entry N-1.
    flip_journal_byte(dir, positions[9] + 200);
}

/// Opens the journal as the service does: the entries before the corruption (1..=10) are
/// there, and the journal takes and keeps new ones after them. Err: the start's refusal.
async fn opens_with_the_entries_before_the_corruption(dir: &Path) -> Result<(), String> {
    let cfg = journal_config(4);
    let (j, rec) = Journal::open(dir, &cfg).map_err(|e| e.to_string())?;
    assert_eq!(rec.end.last_lsn(), 10, "the log ends before the corruption");
    let entries: Vec<_> = j
        .replay(ReplayFrom::Lsn(1))
        .unwrap()
        .map(|e| e.unwrap())
        .collect();
    assert_eq!(entries.len(), 10);
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(e.payload, vec![i as u8 + 1; 1000], "entry {}", i + 1);
    }
    let t = j
        .try_append(&Entry {
            repl_id: [b'r'; 40],
            repl_offset_end: 11_000,
            payload: Bytes::from_static(b"after"),
        })
        .unwrap();
    assert_eq!(t.lsn(), 11);
    t.wait().await.unwrap();
    j.close().unwrap();
    let (j, rec) = Journal::open(dir, &cfg).expect("a repaired journal opens clean again");
    assert_eq!(rec.end.last_lsn(), 11);
    drop(j);
    Ok(())
}

/// `walrus journal repair` killed at each of its steps: the service's next start either
/// opens the journal with every entry before the corruption, or refuses naming `walrus
/// journal repair`, and a repair then does. On faultfs each kill is also a power cut.
async fn repair_killed_at_every_step(disk: &Disk) {
    let template = tempfile::tempdir().unwrap();
    corrupted_journal(template.path()).await;
    for (i, point) in REPAIR_POINTS.iter().enumerate() {
        let dir = disk.path(&format!("repair-{i}"));
        std::fs::create_dir(&dir).unwrap();
        // Copied and synced: a power cut takes nothing of the journal as it was.
        for f in std::fs::read_dir(template.path()).unwrap() {
            let f = f.unwrap();
            let to = dir.join(f.file_name());
            std::fs::copy(f.path(), &to).unwrap();
            std::fs::File::open(&to).unwrap().sync_all().unwrap();
        }
        let d = dir.to_str().unwrap();
        let repair = ["journal", "repair", "--dir", d, "--accept-data-loss"];
        let run = walrus_killed_at(&repair, point, 0);
        assert!(killed(&run, point), "{point}: {}", output_text(&run));
        disk.power_cut();
        let opened = opens_with_the_entries_before_the_corruption(&dir).await;
        eprintln!(
            "{point}: the next start {}",
            match &opened {
                Ok(()) => "opened the journal".to_string(),
                Err(e) => format!("refused ({e}), then a repair recovered"),
            }
        );
        if let Err(refused) = opened {
            assert!(
                refused.contains("`walrus journal repair --dir DIR --accept-data-loss`"),
                "{point}: the refusal names no way out: {refused}"
            );
            let again = run_walrus(&repair);
            assert!(again.status.success(), "{point}: {}", output_text(&again));
            opens_with_the_entries_before_the_corruption(&dir)
                .await
                .unwrap_or_else(|e| panic!("{point}: refused after the repair: {e}"));
        }
    }
}

#[tokio::test]
async fn repair_killed_at_every_step_keeps_every_entry_before_the_corruption() {
    repair_killed_at_every_step(&Disk::plain()).await;
}

#[tokio::test]
async fn repair_cut_by_a_power_loss_at_every_step_keeps_every_entry_before_the_corruption() {
    let Some(disk) = Disk::faultfs() else { return };
    repair_killed_at_every_step(&disk).await;
}

/// What a live walrus is doing when its fail point kills it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `walrus checkpoint`, with writes going on.
    Checkpoint,
    /// `walrus backup`, with writes going on.
    Backup,
    /// Its start, restoring its Valkey (which died with the walrus before it).
    Restore,
    /// Writes that fill its ring, which then waits for the checkpoint the full ring starts
    /// by itself (`[checkpoint]`'s rules), and takes them into the segments it releases.
    Wrap,
}

/// A crash: the point, how many of its passes the walrus lives through first, and what
/// the walrus is doing.
type Row = (&'static str, u32, Op);

/// The points of a managed walrus's checkpoint, backup and restore, in an order that
/// alternates the three (each row's start restores what the row before left). A walrus
/// replaces one manifest before it listens (its journal's MANIFEST, at open); a
/// checkpoint then replaces two: CHECKPOINT, to record its RDB (pass 2), and the journal's
/// MANIFEST, to release the entries it covers (pass 3).
const LIVE_POINTS: &[Row] = &[
    ("rdb::write", 0, Op::Checkpoint),
    ("restore::before_replicaof", 0, Op::Restore),
    ("backup::rdb_copied", 0, Op::Backup),
    ("rdb::written", 0, Op::Checkpoint),
    ("restore::rdb_sent", 0, Op::Restore),
    ("backup::journal_copied", 0, Op::Backup),
    ("rdb::synced", 0, Op::Checkpoint),
    ("restore::stream_sent", 0, Op::Restore),
    ("backup::manifest_written", 0, Op::Backup),
    ("rdb::renamed", 0, Op::Checkpoint),
    ("restore::before_promote", 0, Op::Restore),
    ("backup::renamed", 0, Op::Backup),
    ("manifest::written", 1, Op::Checkpoint),
    ("manifest::replaced", 1, Op::Checkpoint),
    ("checkpoint::manifest_switched", 0, Op::Checkpoint),
    ("checkpoint::recorded", 0, Op::Checkpoint),
    ("manifest::written", 2, Op::Checkpoint),
    ("checkpoint::journal_released", 0, Op::Checkpoint),
];

/// The points where a power cut leaves something a kill does not: the RDB's bytes, or the
/// new CHECKPOINT's text, written and not synced; the RDB's rename, or CHECKPOINT's or the
/// journal MANIFEST's replacement, before its directory is synced (faultfs rolls it back).
/// Everything else walrus writes is synced before the next point.
const POWER_POINTS: &[Row] = &[
    ("rdb::write", 0, Op::Checkpoint),
    ("rdb::written", 0, Op::Checkpoint),
    ("rdb::renamed", 0, Op::Checkpoint),
    ("manifest::written", 1, Op::Checkpoint),
    ("manifest::replaced", 1, Op::Checkpoint),
    ("manifest::replaced", 2, Op::Checkpoint),
];

/// The checkpoint's points again, on a ring of 4 segments of 64 KiB that the writes wrap
/// (`WRAPPING_RING`): every checkpoint is one the full ring started, with writes waiting to
/// take the segments it releases.
const WRAP_POINTS: &[Row] = &[
    ("rdb::write", 0, Op::Wrap),
    ("rdb::written", 0, Op::Wrap),
    ("rdb::synced", 0, Op::Wrap),
    ("rdb::renamed", 0, Op::Wrap),
    ("manifest::written", 1, Op::Wrap),
    ("manifest::replaced", 1, Op::Wrap),
    ("checkpoint::manifest_switched", 0, Op::Wrap),
    ("checkpoint::recorded", 0, Op::Wrap),
    ("manifest::written", 2, Op::Wrap),
    ("checkpoint::journal_released", 0, Op::Wrap),
];

/// A ring of 256 KiB, less than the dataset's 600 KiB: the segments each checkpoint releases
/// are written again soon after, so that entries released too early are gone.
const WRAPPING_RING: Option<&str> =
    Some("[journal]\nsegment_size = 65536\nsegments = 4\nmax_write_bytes = 16384\n");

/// Key `n`'s value: 2 KiB of hex, which the RDB's compression cannot shrink (the RDB must
/// arrive in several pieces past the 64 KiB after which `rdb::write` acts).
fn value(n: u64) -> String {
    let mut rng = Rng(n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    (0..128).map(|_| format!("{:016x}", rng.next())).collect()
}

/// A managed walrus's data directory through crashes: the writes it acknowledged, the
/// walrus running on it, if any.
struct Site {
    disk: Disk,
    /// The managed Valkey's socket directory (never on faultfs: FUSE holds no socket) and
    /// the backups.
    run: tempfile::TempDir,
    /// The journal's configuration, if not the tests' own ([`TEST_JOURNAL`]).
    journal: Option<&'static str>,
    acked: Vec<u64>,
    next: u64,
    walrus: Option<Live>,
}

/// A walrus that listens, and its metrics endpoint.
struct Live {
    w: Walrus,
    metrics: String,
}

impl Site {
    fn new(disk: Disk, journal: Option<&'static str>) -> Site {
        Site {
            disk,
            run: tempfile::tempdir().unwrap(),
            journal,
            acked: Vec::new(),
            next: 0,
            walrus: None,
        }
    }

    /// Spawns walrus on the site, killed at `point`'s pass `skip` + 1 if given.
    fn spawn(&self, point: Option<(&str, u32)>) -> (Proc, tempfile::TempDir, String) {
        let data = self.disk.path("data");
        let metrics = format!("127.0.0.1:{}", free_port());
        let socket_dir = self.run.path().join("sock");
        let config = format!(
            "[upstream]\nsocket_dir = {:?}\n",
            socket_dir.to_str().unwrap()
        );
        let build = Walrus::build()
            .data(&data)
            .config(&config)
            .args(&["--metrics-listen", &metrics]);
        let build = match self.journal {
            Some(journal) => build.journal(journal),
            None => build,
        };
        let (proc, dir) = match point {
            Some((p, skip)) => build
                .failpoint(p, &format!("{skip}*off->return(kill)"))
                .spawn(),
            None => build.spawn(),
        };
        (proc, dir, metrics)
    }

    /// Starts walrus (`point` set, if given), waits until it listens, and checks that
    /// every write acknowledged so far is there: the start recovered them.
    fn start(&mut self, point: Option<(&str, u32)>, after: &str) {
        let (proc, data, metrics) = self.spawn(point);
        let addr = addr_in(
            &proc
                .try_wait_line(LISTENING, START_TIMEOUT)
                .unwrap_or_else(|| {
                    panic!("{after}: walrus did not start; log:\n{}", proc.log_text())
                }),
        );
        let live = Live {
            w: Walrus {
                proc,
                addr,
                data,
                metrics: Some(metrics.clone()),
            },
            metrics,
        };
        let mut c = Raw::connect(&live.w.addr);
        for &n in &self.acked {
            let got = c.cmd(&["GET", &format!("k{n}")]);
            assert!(
                got == bulk(value(n)),
                "{after}: acknowledged k{n} is lost ({}); log:\n{}",
                show(&got[..got.len().min(80)]),
                live.w.proc.log_text()
            );
        }
        self.walrus = Some(live);
    }

    fn live(&self) -> &Live {
        self.walrus.as_ref().expect("a walrus runs")
    }

    /// Writes until `n` keys are acknowledged. A write refused because the ring is full
    /// (`-MISCONF`, until its checkpoint frees room) is not acknowledged: the next key is
    /// tried.
    fn write(&mut self, n: u64) {
        let mut c = Raw::connect(&self.live().w.addr);
        let deadline = std::time::Instant::now() + START_TIMEOUT;
        let mut acked = 0;
        while acked < n {
            let k = self.next;
            self.next += 1;
            let r = c.cmd(&["SET", &format!("k{k}"), &value(k)]);
            if Site::ring_full(&r) && std::time::Instant::now() < deadline {
                continue;
            }
            assert_eq!(show(&r), show(b"+OK\r\n"), "SET k{k}");
            self.acked.push(k);
            acked += 1;
        }
    }

    /// Whether `reply` refused a write because the ring is full.
    fn ring_full(reply: &[u8]) -> bool {
        reply.starts_with(b"-MISCONF")
    }

    /// Writes until the walrus dies under the connection; keeps what was acknowledged.
    fn write_until_killed(&mut self) {
        let mut c = Raw::connect(&self.live().w.addr);
        let deadline = std::time::Instant::now() + START_TIMEOUT;
        loop {
            assert!(
                std::time::Instant::now() < deadline,
                "walrus is still alive; log:\n{}",
                self.live().w.proc.log_text()
            );
            let k = self.next;
            self.next += 1;
            match c.try_cmd(&["SET", &format!("k{k}"), &value(k)]) {
                Some(r) if r == b"+OK\r\n" => self.acked.push(k),
                Some(r) if Site::ring_full(&r) => {}
                Some(r) => panic!("SET k{k}: {}", show(&r)),
                // Killed: this write's fate is unknown.
                None => return,
            }
        }
    }

    /// SIGKILLs the running walrus; returns once its Valkey is gone too.
    fn kill(&mut self) {
        let mut live = self.walrus.take().expect("a walrus runs");
        let pid = valkey_pid(&live.w.addr);
        live.w.proc.signal(libc::SIGKILL);
        live.w.proc.wait_exit(START_TIMEOUT).unwrap();
        wait_dead(pid);
    }

    /// Waits until `proc` dies at `point` by its SIGKILL; returns once its Valkey is gone.
    fn killed_at(proc: &mut Proc, point: &str) {
        proc.wait_line(&format!("fail point {point}: SIGKILL"), START_TIMEOUT);
        let status = proc.wait_exit(START_TIMEOUT).expect("walrus exits");
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{point}: {status:?}");
        wait_dead(valkey_pid_in(&proc.log_text()));
    }

    /// `walrus checkpoint` or `walrus backup --to <to>` against the running walrus.
    fn admin(&self, op: Op, to: &Path) -> Command {
        let mut cmd = Command::new(walrus_bin());
        cmd.args([
            if op == Op::Backup {
                "backup"
            } else {
                "checkpoint"
            },
            "--metrics",
            &self.live().metrics,
        ]);
        if op == Op::Backup {
            cmd.arg("--to").arg(to);
        }
        cmd
    }

    /// The files in the checkpoint directory.
    fn checkpoint_files(&self) -> Vec<String> {
        std::fs::read_dir(self.disk.path("data/checkpoints"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect()
    }

    /// The checkpoint directory holds one RDB, the recorded one, and nothing half-written.
    fn one_checkpoint(&self, after: &str) {
        let names = self.checkpoint_files();
        let rdbs = names.iter().filter(|n| n.ends_with(".rdb")).count();
        let tmp = names.iter().filter(|n| n.ends_with(".tmp")).count();
        assert!(rdbs == 1 && tmp == 0, "{after}: {names:?}");
    }

    /// The row: walrus killed at `point`'s pass `skip` + 1 during `op` (and then, on
    /// faultfs, the power cut), the next start with every acknowledged write, and `op` done
    /// again.
    fn crash(&mut self, (point, skip, op): Row) {
        let after = format!("after a crash at {point} (pass {})", skip + 1);
        // Something in the journal after the checkpoint for a restore to stream.
        self.write(20);
        self.kill();
        let backup = self.run.path().join(point.replace("::", "-"));
        match op {
            Op::Restore => {
                let (mut proc, _dir, _) = self.spawn(Some((point, skip)));
                Site::killed_at(&mut proc, point);
            }
            Op::Wrap => {
                self.start(Some((point, skip)), &format!("the start before {point}"));
                self.write_until_killed();
                let mut live = self.walrus.take().unwrap();
                Site::killed_at(&mut live.w.proc, point);
            }
            Op::Checkpoint | Op::Backup => {
                self.start(Some((point, skip)), &format!("the start before {point}"));
                self.write(20);
                let asked = self
                    .admin(op, &backup)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap();
                self.write_until_killed();
                let mut live = self.walrus.take().unwrap();
                Site::killed_at(&mut live.w.proc, point);
                let asked = asked.wait_with_output().unwrap();
                assert!(
                    !asked.status.success()
                        && String::from_utf8_lossy(&asked.stderr).contains("have died"),
                    "{point}: {}",
                    output_text(&asked)
                );
            }
        }
        if point.starts_with("manifest::") {
            // Killed replacing CHECKPOINT, the new RDB beside the old one; or replacing
            // the journal's MANIFEST, the old RDB deleted.
            let names = self.checkpoint_files();
            let rdbs = names.iter().filter(|n| n.ends_with(".rdb")).count();
            assert_eq!(rdbs, 3 - skip as usize, "{after}: {names:?}");
        }
        let lost = self.disk.power_cut();
        // On faultfs the row is there for what a kill leaves and a power cut does not.
        if matches!(self.disk, Disk::FaultFs(_)) {
            assert!(lost > 0, "{point}: the power cut took nothing: just a kill");
        }
        self.start(None, &after);
        if op == Op::Wrap {
            // The ring may be full enough at the start for a checkpoint to be under way:
            // what the start restored is the check.
            return;
        }
        self.one_checkpoint(&after);
        match op {
            Op::Restore | Op::Wrap => {}
            Op::Checkpoint => {
                let again = self.admin(op, &backup).output().unwrap();
                assert!(again.status.success(), "{after}: {}", output_text(&again));
                self.one_checkpoint(&after);
            }
            Op::Backup => {
                // Never half a backup under the name asked for: the rename is the last step.
                if point != "backup::renamed" {
                    assert!(!backup.exists(), "{after}: {}", backup.display());
                    let again = self.admin(op, &backup).output().unwrap();
                    assert!(again.status.success(), "{after}: {}", output_text(&again));
                }
                let verify = run_walrus(&["verify", "--data-dir", backup.to_str().unwrap()]);
                assert!(verify.status.success(), "{after}: {}", output_text(&verify));
            }
        }
    }
}

/// The managed Valkey's pid, from its start line in walrus's log (`pid=<n>, just started`).
fn valkey_pid_in(log: &str) -> i32 {
    log.lines()
        .rev()
        .filter(|l| l.contains("just started"))
        .filter_map(|l| l.split("pid=").nth(1))
        .filter_map(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .next()
        .unwrap_or_else(|| panic!("no Valkey start in the log:\n{log}"))
}

/// Every row of `points` on one data directory (with `journal`'s configuration, if
/// given), under writes.
fn crash_live(disk: Disk, journal: Option<&'static str>, points: &[Row]) {
    let mut site = Site::new(disk, journal);
    site.start(None, "the first start");
    // A dataset of 600 KiB.
    site.write(300);
    for &row in points {
        site.crash(row);
    }
    eprintln!(
        "{} crashes, {} acknowledged writes, all there after each",
        points.len(),
        site.acked.len()
    );
}

#[test]
fn checkpoint_backup_and_restore_killed_at_every_step_lose_nothing_acknowledged() {
    crash_live(Disk::plain(), None, LIVE_POINTS);
}

#[test]
fn checkpoints_of_a_ring_that_wraps_killed_at_every_step_lose_nothing_acknowledged() {
    crash_live(Disk::plain(), WRAPPING_RING, WRAP_POINTS);
}

#[test]
fn a_checkpoint_cut_by_a_power_loss_loses_nothing_acknowledged() {
    let Some(disk) = Disk::faultfs() else { return };
    crash_live(disk, None, POWER_POINTS);
}

/// Every fail point in the code is in the list (src/fault/points.rs) and the other way
/// round, docs/testing.md names each, and each crash or file-system point has its crash
/// test here (the journal's write points have theirs in io_faults and power_loss).
#[test]
fn every_point_is_listed_placed_documented_and_crashed() {
    use std::collections::BTreeSet;
    use walrus::fault::points::{Kind, POINTS};
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut placed = BTreeSet::new();
    let mut dirs = vec![root.join("src")];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(dir).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for call in ["fail_point!(\"", "io_point!(\"", "fail::eval(\""] {
                for (at, _) in text.match_indices(call) {
                    let rest = &text[at + call.len()..];
                    placed.insert(rest[..rest.find('"').unwrap()].to_string());
                }
            }
        }
    }
    let listed: BTreeSet<String> = POINTS.iter().map(|p| p.name.to_string()).collect();
    assert_eq!(placed, listed, "the points in src/ and the list");
    let doc = std::fs::read_to_string(root.join("docs/testing.md")).unwrap();
    let crashed: BTreeSet<&str> = INIT_POINTS
        .iter()
        .map(|(p, _)| *p)
        .chain(REPAIR_POINTS.iter().copied())
        .chain(LIVE_POINTS.iter().chain(POWER_POINTS).map(|(p, _, _)| *p))
        .collect();
    for p in POINTS {
        assert!(
            doc.contains(&format!("`{}`", p.name)),
            "docs/testing.md lacks {}",
            p.name
        );
        // The archive's points are crashed in tests/it/archive.rs.
        let archive_tests = std::fs::read_to_string(root.join("tests/it/archive.rs")).unwrap();
        if matches!(p.kind, Kind::Crash | Kind::Io) {
            assert!(
                crashed.contains(p.name) || archive_tests.contains(&format!("\"{}\"", p.name)),
                "no crash test at {}",
                p.name
            );
        }
    }
}

/// The fail points are a test build's alone: cargo builds walrus for `cargo build` and
/// `--release` (its dependencies without the dev-dependencies) without the `fail` crate,
/// whose `failpoints` feature only the dev-dependency on walrus itself turns on, and the
/// points then compile to nothing (src/fault/mod.rs). (`command_line` checks that the
/// binary the tests run says it has them.)
#[test]
fn a_build_without_dev_dependencies_has_no_fail_points() {
    let cargo = std::env::var_os("CARGO").unwrap_or("cargo".into());
    let tree = |edges: &str| {
        let o = Command::new(&cargo)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["tree", "--locked", "-e", edges, "-i", "fail"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", output_text(&o));
        String::from_utf8(o.stdout).unwrap()
    };
    assert!(tree("normal,build,dev").contains("fail v0.5"));
    assert_eq!(
        tree("normal,build"),
        "",
        "a release build has the fail crate"
    );
}
