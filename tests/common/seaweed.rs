//! SeaweedFS as the tests' S3-compatible store: one `weed server` process (master, volume
//! server, filer and S3 gateway) on free loopback ports, its data in a temporary directory.
//! deploy/setup.sh builds `weed` from its Go module into ~/.cache/walrus/bin (as it does
//! helm); `WALRUS_WEED` names another binary.

use super::{free_port, Proc, START_TIMEOUT};
use std::path::PathBuf;
use std::process::Command;

pub const ACCESS_KEY: &str = "walrusTestKey";
pub const SECRET_KEY: &str = "walrusTestSecret";

pub fn weed_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("WALRUS_WEED") {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache"));
    let p = cache.join("walrus/bin/weed");
    assert!(
        p.is_file(),
        "{} is missing: run deploy/setup.sh --test, which builds SeaweedFS for the archive's tests",
        p.display()
    );
    p
}

pub struct Seaweed {
    pub proc: Proc,
    dir: tempfile::TempDir,
    /// HTTP and gRPC ports of the master, volume server, filer and S3 gateway.
    ports: [u16; 8],
}

impl Seaweed {
    /// Starts a store and returns once its S3 gateway answers.
    pub fn start() -> Seaweed {
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir_all(dir.path().join("data")).unwrap();
            std::fs::write(
                dir.path().join("s3.json"),
                format!(
                    r#"{{"identities":[{{"name":"walrus","credentials":[{{"accessKey":"{ACCESS_KEY}","secretKey":"{SECRET_KEY}"}}],"actions":["Admin","Read","Write","List","Tagging"]}}]}}"#
                ),
            )
            .unwrap();
            // Each gRPC port would be its HTTP one + 10000 unless set: all are set, and kept
            // for a restart.
            let ports = [(); 8].map(|_| free_port());
            let proc = Self::spawn(dir.path(), ports);
            let s = Seaweed { proc, dir, ports };
            if s.ready() {
                return s;
            }
            // One of its eight ports taken between probe and bind, most likely (it then
            // exits: "bind: address already in use"): try others. Dropped, it is killed.
            eprintln!("SeaweedFS did not start; log:\n{}", s.proc.log_text());
        }
        panic!("SeaweedFS failed to start five times");
    }

    fn spawn(dir: &std::path::Path, p: [u16; 8]) -> Proc {
        let mut cmd = Command::new(weed_bin());
        cmd.arg("server")
            .args([
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                "-master.telemetry=false",
            ])
            .arg(format!("-dir={}", dir.join("data").display()))
            .arg(format!("-master.port={}", p[0]))
            .arg(format!("-master.port.grpc={}", p[5]))
            .arg(format!("-volume.port={}", p[1]))
            .arg(format!("-volume.port.grpc={}", p[6]))
            .arg("-master.volumeSizeLimitMB=64")
            .arg("-filer")
            .arg(format!("-filer.port={}", p[2]))
            .arg(format!("-filer.port.grpc={}", p[7]))
            .arg("-s3")
            .arg(format!("-s3.port={}", p[3]))
            .arg(format!("-s3.port.grpc={}", p[4]))
            .args(["-s3.port.iceberg=0", "-s3.port.lance=0"])
            .arg(format!("-s3.config={}", dir.join("s3.json").display()));
        Proc::spawn(cmd, true)
    }

    /// Waits for the S3 gateway and the volume server (which may come in either order);
    /// false when they do not come within the start timeout, or the process ends first.
    fn ready(&self) -> bool {
        [
            "Start Seaweed S3 API Server",
            "Volume server start with seed master",
        ]
        .into_iter()
        .all(|line| {
            self.proc.log_text().contains(line)
                || self.proc.try_wait_line(line, START_TIMEOUT).is_some()
        })
    }

    /// The S3 endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports[3])
    }

    /// Makes a bucket (a directory under the filer's /buckets).
    pub fn bucket(&self, name: &str) {
        let (code, body) = super::http_request(
            &format!("127.0.0.1:{}", self.ports[2]),
            "POST",
            &format!("/buckets/{name}/?op=mkdir"),
        );
        assert!((200..300).contains(&code), "mkdir {name}: {code} {body}");
    }

    /// The `[archive]` table of a walrus archiving to `bucket/prefix` here (credentials come
    /// from [`Self::env`]).
    pub fn archive_toml(&self, bucket: &str, prefix: &str) -> String {
        format!(
            "[archive]\nurl = \"s3://{bucket}/{prefix}\"\nendpoint = \"{}\"\n",
            self.endpoint()
        )
    }

    /// The credentials, as a walrus's environment.
    pub fn env() -> [(&'static str, &'static str); 2] {
        [
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
        ]
    }

    /// Kills the store (its data stays).
    pub fn kill(&mut self) {
        self.proc.signal(libc::SIGKILL);
        self.proc.wait_exit(START_TIMEOUT).unwrap();
    }

    /// Starts the killed store again, on its ports, with its data.
    pub fn restart(&mut self) {
        self.proc = Self::spawn(self.dir.path(), self.ports);
        assert!(
            self.ready(),
            "SeaweedFS did not start again on its ports; log:\n{}",
            self.proc.log_text()
        );
    }

    /// Stops the store answering (SIGSTOP) or lets it go on (SIGCONT): a store that hangs.
    pub fn pause(&self, paused: bool) {
        self.proc
            .signal(if paused { libc::SIGSTOP } else { libc::SIGCONT });
    }
}

impl Drop for Seaweed {
    fn drop(&mut self) {
        self.proc.signal(libc::SIGCONT);
    }
}

/// A TCP proxy in front of the store that can answer every request with an error instead
/// (`503 Slow Down`, as S3 does when it sheds load): a store answering errors.
pub struct ErrorProxy {
    pub addr: String,
    failing: std::sync::Arc<std::sync::atomic::AtomicBool>,
    open: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl ErrorProxy {
    pub fn start(target: &str) -> ErrorProxy {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let failing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let open = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (f, o, target) = (failing.clone(), open.clone(), target.to_string());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(mut client) = client else { return };
                if f.load(Ordering::SeqCst) {
                    // Read the request's head, answer 503 and close.
                    let mut head = Vec::new();
                    let mut b = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match client.read(&mut b) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => head.extend_from_slice(&b[..n]),
                        }
                    }
                    let _ = client.write_all(
                        b"HTTP/1.1 503 Slow Down\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                    continue;
                }
                let Ok(server) = std::net::TcpStream::connect(target.trim_start_matches("http://"))
                else {
                    continue;
                };
                o.lock()
                    .unwrap()
                    .extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        ErrorProxy {
            addr,
            failing,
            open,
        }
    }

    /// From now on every request gets an error (connections open now are closed), or none.
    pub fn fail(&self, on: bool) {
        self.failing.store(on, std::sync::atomic::Ordering::SeqCst);
        if on {
            for s in self.open.lock().unwrap().drain(..) {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }
}
