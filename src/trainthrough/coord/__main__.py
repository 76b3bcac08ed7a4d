r"""``python -m trainthrough.coord [--port N] [-- COMMAND...]``: a throwaway ZooKeeper
server on 127.0.0.1:N (default 2181) for the length of COMMAND, which then exits with
COMMAND's status; without a command it serves until Ctrl-C. The server and its
temporary folder are removed on every exit (SIGTERM included)::

    python -m trainthrough.coord --port 2181 -- \
        trainthrough run --engine ray --consistency async --strategy chain-sync \
        --coordinator zookeeper --zookeeper-hosts 127.0.0.1:2181
"""

from __future__ import annotations

import socket
import subprocess
import sys

from trainthrough.coord.zkserver import ZooKeeperServer
from trainthrough.errors import UserError


def main(argv: list[str] | None = None) -> int:
    """Start the server, run COMMAND (or wait for Ctrl-C), stop the server.

    Returns:
        COMMAND's exit status; 0 after Ctrl-C without a command; 2 when the server
        cannot start (one line on stderr).
    """
    import argparse
    import signal

    parser = argparse.ArgumentParser(
        prog="python -m trainthrough.coord",
        description="A throwaway ZooKeeper server on 127.0.0.1 (stopped and deleted on exit).")
    parser.add_argument("--port", type=int, default=2181, help="client port (default 2181)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- COMMAND...: run it while the server serves, exit with its status")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command

    def _terminate(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds through stop(): no server left behind

    signal.signal(signal.SIGTERM, _terminate)
    try:
        with socket.socket() as s:
            # As the server binds (a recent connection in TIME_WAIT does not hold the port).
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", args.port))
    except OSError as e:
        print(f"trainthrough.coord: error: port {args.port} on 127.0.0.1 is not free ({e.strerror}); "
              "choose another --port", file=sys.stderr)
        return 2
    try:
        with ZooKeeperServer(port=args.port) as server:
            if command:
                return subprocess.run(command).returncode
            print(f"ZooKeeper serving on {server.hosts}; Ctrl-C stops it", flush=True)
            signal.pause()
    except UserError as e:
        print(f"trainthrough.coord: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
