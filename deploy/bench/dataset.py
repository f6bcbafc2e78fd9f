"""The dataset of the restore and archive suites: SETs of keys k:0000000000.. with 200-byte
values of base64 noise that Valkey's LZF cannot shrink (so RDBs are as large as the data),
written pipelined, and counted back after a restart."""
import base64
import random
import socket
import threading

from .resp import call

VALUE_BYTES = 200
SET_HEAD = b"*3\r\n$3\r\nSET\r\n$12\r\nk:"
SET_BYTES = len(SET_HEAD) + 12 + len(b"$200\r\n") + VALUE_BYTES + 2  # one SET in the stream: 240
NOISE = base64.b64encode(random.Random(7).randbytes(3 << 18))  # 1 MiB of printable noise


def set_commands(lo, hi):
    span = len(NOISE) - VALUE_BYTES
    return b"".join(b"%s%010d\r\n$200\r\n%s\r\n" % (SET_HEAD, i, NOISE[i * 7919 % span:i * 7919 % span + VALUE_BYTES])
                    for i in range(lo, hi))


def fill(port, lo, hi, conns=4, block=4096):
    """Writes keys lo..hi-1 over `conns` pipelined connections; every reply must be +OK."""
    errors = []

    def one(a, b):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=900) as s:
                def reader():
                    got, want = 0, 5 * (b - a)  # "+OK\r\n" each
                    try:
                        while got < want:
                            d = s.recv(1 << 20)
                            if not d:
                                raise ConnectionError("connection closed after %d replies" % (got // 5))
                            if b"-" in d:
                                raise RuntimeError(d[d.index(b"-"):][:200].decode(errors="replace"))
                            got += len(d)
                    except Exception as e:  # unblock the writer
                        errors.append(e)
                        s.shutdown(socket.SHUT_RDWR)

                r = threading.Thread(target=reader, daemon=True)
                r.start()
                for i in range(a, b, block):
                    if errors:
                        break
                    s.sendall(set_commands(i, min(b, i + block)))
                r.join()
        except Exception as e:
            errors.append(e)

    cut = [lo + (hi - lo) * k // conns for k in range(conns + 1)]
    threads = [threading.Thread(target=one, args=(cut[k], cut[k + 1]), daemon=True) for k in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError("fill of port %d failed: %s" % (port, errors[0]))


def dbsize_check(port, want, what):
    got = call(port, "DBSIZE")
    if got != want:
        raise RuntimeError("%s: DBSIZE %d after the restart, %d written" % (what, got, want))
    return got
