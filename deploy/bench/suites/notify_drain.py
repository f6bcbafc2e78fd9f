"""The notifications suite's background listeners, a process of their own:

    python3 -m bench.suites.notify_drain PORT SUBSCRIBERS TRACKERS

Every connection subscribes to the keyspace channels of the written keys (RESP2, a pattern)
or tracks them (RESP3, BCAST), and reads and drops what it gets; "ready" once all are set
up, then until it is killed."""
import socket
import sys
import threading

from ..resp import resp


def drain(port, setup):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(setup)
    while s.recv(1 << 20):
        pass


def main():
    port, subscribers, trackers = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    setups = [resp("PSUBSCRIBE", "__keyspace@0__:key:*")] * subscribers + \
        [resp("HELLO", "3") + resp("CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", "key:")] * trackers
    for setup in setups:
        threading.Thread(target=drain, args=(port, setup), daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
