"""RESP on a plain socket: a command's bytes, a reply read back, one call, INFO as a dict."""
import socket


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def read_reply(f):
    line = f.readline()
    if not line:
        raise ConnectionError("connection closed")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        return None if n < 0 else f.read(n + 2)[:-2].decode(errors="replace")
    if kind in (b"*", b">"):  # an array, or a RESP3 push
        n = int(rest)
        return None if n < 0 else [read_reply(f) for _ in range(n)]
    if kind == b"%":  # a RESP3 map, as a flat list
        return [read_reply(f) for _ in range(2 * int(rest))]
    if kind == b"_":
        return None
    raise RuntimeError("unexpected reply %r" % line)


def call(port, *args, timeout=900):
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(resp(*args))
        return read_reply(s.makefile("rb"))


def info(port, section):
    return dict(line.split(":", 1) for line in call(port, "INFO", section).splitlines()
                if ":" in line and not line.startswith("#"))
