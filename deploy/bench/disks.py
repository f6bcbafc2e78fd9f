"""The disks a setup runs on: the temp dir's own, or a slow one emulated by faultfs
(examples/faultfs) in latency mode; and what one synchronous write costs on a disk."""
import mmap
import os
import socket
import statistics
import sys
import tempfile
import time

from .procs import TARGET, Proc

FAULTFS = os.path.join(TARGET, "release", "examples", "faultfs")
# The disk regimes (--disks): faultfs's latency per synchronous write in µs, None for the
# temp dir's own disk.
LATENCY_US = {"local": None, "1ms": 1000, "5ms": 5000}


class SlowDisk:
    """A faultfs mount in latency mode: every synchronous write (O_SYNC/O_DSYNC, RWF_DSYNC) and
    every fsync/fdatasync is answered `latency_us` later; concurrent ones overlap."""

    def __init__(self, tmp, latency_us):
        if not os.path.exists(FAULTFS):
            sys.exit("%s missing: cargo build --release --example faultfs" % FAULTFS)
        backing = tempfile.mkdtemp(dir=tmp, prefix="faultfs-backing-")
        self.root = tempfile.mkdtemp(dir=tmp, prefix="faultfs-mnt-")
        self.sock = os.path.join(tmp, "faultfs-%d.sock" % latency_us)
        self.proc = Proc([FAULTFS, backing, self.root, "--control", self.sock], "faultfs ready")
        reply = self.command("latency %d" % latency_us)
        if not reply.startswith("ok"):
            sys.exit("faultfs: latency %d: %s" % (latency_us, reply))

    def command(self, line):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(self.sock)
            s.sendall(line.encode() + b"\n")
            return s.makefile().readline().strip()

    def stop(self):
        self.proc.stop()


def sync_write_floor(directory, writes=400):
    """The device's own latency: the median of `writes` 4 KiB O_DIRECT|O_DSYNC writes (ms), what
    one durable write cannot go below."""
    path = os.path.join(directory, "floor.probe")
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_DIRECT | os.O_DSYNC, 0o600)
    try:
        os.posix_fallocate(fd, 0, 64 * 4096)
        block = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT needs
        block.write(b"x" * 4096)
        times = []
        for i in range(writes):
            t = time.perf_counter()
            os.pwritev(fd, [block], (i % 64) * 4096)
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1000
    finally:
        os.close(fd)
        os.unlink(path)
