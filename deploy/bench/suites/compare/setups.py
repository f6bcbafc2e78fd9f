"""The compare suite's setups: Valkey with each of its persistence modes, walrus durable on
each journal backend and as a plain proxy, twemproxy and HAProxy, every one with its own
Valkey; and the machine and software they run on, for the report."""
import os
import subprocess

from ... import servers
from ...procs import ROOT, free_port, sbin, valkey_binary
from ...servers import WALRUS_VALKEY_SETTINGS, start_haproxy, start_twemproxy, start_valkey, start_walrus

NO_PERSISTENCE, EVERYSEC, ALWAYS = "Valkey, no persistence", "Valkey appendfsync everysec", "Valkey appendfsync always"
WALRUS, WALRUS_SYNC, WALRUS_OFF = ("walrus durable (io_uring, O_DIRECT)", "walrus durable (sync backend)",
                                   "walrus, durability off")
TWEMPROXY, HAPROXY = "twemproxy", "HAProxy (TCP mode)"
# On a slow disk: the setups that sync, and the two that show what no disk costs.
SLOW_DISK_SETUPS = [NO_PERSISTENCE, ALWAYS, WALRUS, WALRUS_SYNC, WALRUS_OFF]


class Setup:
    """One setup: the port clients use, its Valkey and that Valkey's port, and the proxy in
    front of it (None for Valkey alone); `metrics`: walrus's /metrics address; `durable`:
    walrus with its journal."""

    def __init__(self, name, port, valkey, valkey_port, proxy=None, metrics=None, durable=False, about=""):
        self.name, self.port, self.valkey, self.valkey_port, self.proxy = name, port, valkey, valkey_port, proxy
        self.metrics, self.durable, self.about = metrics, durable, about

    def saving_ports(self):
        """Where INFO persistence shows what it may still be saving: its Valkey, and walrus
        durable (its checkpoints)."""
        return [self.valkey_port] + ([self.port] if self.durable else [])

    def stop(self):
        for p in (self.proxy, self.valkey):
            if p:
                p.stop()


def compare_setups(tmp, baseline=None, names=None, texts=None):
    """Starts the setups (those in `names` only, if given, and whose name contains one of
    `texts`, if given), each with its own Valkey, its files under `tmp`."""
    def valkey_alone(extra, about):
        def start(name):
            v, port = start_valkey(tmp, extra)
            return Setup(name, port, v, port, about=about)
        return start

    def walrus(durable, config, binary=None):
        def start(name):
            v, vport = start_valkey(tmp, WALRUS_VALKEY_SETTINGS)
            metrics = "127.0.0.1:%d" % free_port()
            w, port = start_walrus(tmp, vport, durable, binary=binary, config=config, metrics=metrics)
            toml = ("[durability] enabled = %s %s %s" % (str(durable).lower(), config.replace("\n", " "),
                                                         servers.WALRUS_CONFIG.replace("\n", " "))).strip()
            return Setup(name, port, v, vport, w, metrics, durable,
                         about="walrus%s in external mode, `%s`, data dir beside the others; its Valkey with the "
                         "replication settings walrus asks for" % (" (%s)" % binary if binary else "", toml))
        return start

    def proxy(starter, about):
        def start(name):
            v, vport = start_valkey(tmp)
            p, port = starter(tmp, vport)
            return Setup(name, port, v, vport, p, about=about)
        return start

    uring = '[journal]\nio_backend = "io_uring"\ndirect_io = "on"\n'
    sync = '[journal]\nio_backend = "sync"\n'
    catalogue = [
        (NO_PERSISTENCE, valkey_alone([], "valkey-server, `--save \"\" --appendonly no`")),
        (EVERYSEC, valkey_alone(["--appendonly", "yes", "--appendfsync", "everysec"],
                                "valkey-server, `--appendonly yes --appendfsync everysec`, AOF beside the others")),
        (ALWAYS, valkey_alone(["--appendonly", "yes", "--appendfsync", "always"],
                              "valkey-server, `--appendonly yes --appendfsync always`, AOF beside the others")),
        (WALRUS, walrus(True, uring)),
        (WALRUS_SYNC, walrus(True, sync)),
        (WALRUS_OFF, walrus(False, "")),
    ]
    if baseline:
        catalogue += [("baseline " + WALRUS, walrus(True, uring, baseline)),
                      ("baseline " + WALRUS_SYNC, walrus(True, sync, baseline))]
    catalogue += [
        (TWEMPROXY, proxy(start_twemproxy, "nutcracker: `redis: true`, one server; its defaults otherwise "
                                           "(hash fnv1a_64, ketama, one connection to the server)")),
        (HAPROXY, proxy(start_haproxy, "haproxy -db: `mode tcp`, one frontend, one backend server, maxconn "
                                       "4096, timeouts connect 5s, client/server 10m; its defaults otherwise "
                                       "(as many threads as cores)")),
    ]
    out = []
    for name, start in catalogue:
        own = name.removeprefix("baseline ")  # a baseline's setup goes with this build's
        if (names is None or own in names) and (not texts or any(text in own for text in texts)):
            out.append(start(name))
    return out


def machine_description(tmp):
    """{"machine", "commit", "software"}: where and with what the figures were taken."""
    def run(*args):
        try:
            out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
            return (out.stdout + out.stderr).strip()  # nutcracker prints its version on stderr
        except OSError:
            return ""

    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    mem = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal:")) / (1 << 20)
    fs = run("df", "--output=fstype,source", tmp).splitlines()[-1].split()
    commit = run("git", "rev-parse", "--short", "HEAD")
    if run("git", "status", "--porcelain", "--untracked-files=no"):
        commit += " with uncommitted changes"
    return dict(
        machine="%d cores (%s), %.0f GiB memory, Linux %s" % (os.cpu_count(), model, mem, os.uname().release),
        disk="%s (%s)" % (fs[0], fs[1]), commit=commit,
        software="; ".join([run(valkey_binary(), "--version").split(" sha=")[0], run("redis-benchmark", "--version"),
                            run(sbin("nutcracker"), "--version").splitlines()[0].replace("This is ", ""),
                            run(sbin("haproxy"), "-v").splitlines()[0].split(" - ")[0]]))
