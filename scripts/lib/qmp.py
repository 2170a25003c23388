#!/usr/bin/env python3
"""Runs one QMP command against a QEMU monitor socket and prints the reply.

    qmp.py SOCKET 'JSON-COMMAND'

Exit status 0 if QEMU answered with "return", 1 with "error" (printed), 2 if the
monitor could not be reached. Events QEMU sends meanwhile are skipped. Used by the
guest tests to hot-plug a vfio-user-pci device the way an operator would
(device_add / device_del), see scripts/lib/guest-host.sh (vn_qmp_action).
"""
import json
import socket
import sys


def recv_json(f):
    """The next JSON object from the monitor that is not an event."""
    while True:
        line = f.readline()
        if not line:
            raise ConnectionError("the monitor closed the connection")
        msg = json.loads(line)
        if "event" not in msg:
            return msg


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    path, command = sys.argv[1], json.loads(sys.argv[2])
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(path)
        f = s.makefile("rw")
        greeting = recv_json(f)
        if "QMP" not in greeting:
            raise ConnectionError(f"not a QMP monitor: {greeting}")
        f.write(json.dumps({"execute": "qmp_capabilities"}) + "\n")
        f.flush()
        recv_json(f)
        f.write(json.dumps(command) + "\n")
        f.flush()
        reply = recv_json(f)
    except (OSError, ValueError, ConnectionError) as e:
        print(f"qmp.py: {path}: {e}", file=sys.stderr)
        return 2
    print(json.dumps(reply))
    return 0 if "return" in reply else 1


if __name__ == "__main__":
    sys.exit(main())
