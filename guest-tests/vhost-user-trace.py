#!/usr/bin/env python3
"""Summarise a vhost-user session from QEMU's trace (-trace vhost_user_write
-trace vhost_user_read, QEMU's log backend writing to its stderr).

Prints the messages QEMU sent to the backend and the replies it read, by name, and
exits non-zero unless QEMU sent GET_FEATURES and GET_PROTOCOL_FEATURES and read the
backend's reply to both: the handshake every vhost-user device makes when QEMU
realizes it. Standard library only.

    vhost-user-trace.py QEMU_LOG
"""

import re
import sys

# Front-end message types of the vhost-user protocol (QEMU's docs/interop/vhost-user.rst),
# for a QEMU whose trace gives the number only.
REQUESTS = {
    1: "GET_FEATURES", 2: "SET_FEATURES", 3: "SET_OWNER", 4: "RESET_OWNER",
    5: "SET_MEM_TABLE", 6: "SET_LOG_BASE", 7: "SET_LOG_FD", 8: "SET_VRING_NUM",
    9: "SET_VRING_ADDR", 10: "SET_VRING_BASE", 11: "GET_VRING_BASE",
    12: "SET_VRING_KICK", 13: "SET_VRING_CALL", 14: "SET_VRING_ERR",
    15: "GET_PROTOCOL_FEATURES", 16: "SET_PROTOCOL_FEATURES", 17: "GET_QUEUE_NUM",
    18: "SET_VRING_ENABLE", 19: "SEND_RARP", 20: "NET_SET_MTU",
    21: "SET_BACKEND_REQ_FD", 22: "IOTLB_MSG", 23: "SET_VRING_ENDIAN",
    24: "GET_CONFIG", 25: "SET_CONFIG", 26: "CREATE_CRYPTO_SESSION",
    27: "CLOSE_CRYPTO_SESSION", 28: "POSTCOPY_ADVISE", 29: "POSTCOPY_LISTEN",
    30: "POSTCOPY_END", 31: "GET_INFLIGHT_FD", 32: "SET_INFLIGHT_FD",
    33: "GPU_SET_SOCKET", 34: "RESET_DEVICE", 35: "VRING_KICK",
    36: "GET_MAX_MEM_SLOTS", 37: "ADD_MEM_REG", 38: "REM_MEM_REG",
    39: "SET_STATUS", 40: "GET_STATUS", 41: "GET_SHARED_OBJECT",
    42: "SET_DEVICE_STATE_FD", 43: "CHECK_DEVICE_STATE",
}

# QEMU 11 prints "req:1 (GET_FEATURES) flags:0x1"; older ones the number only.
TRACE = re.compile(r"vhost_user_(write|read) req:(\d+)(?: \((\w+)\))? flags:(0x[0-9a-fA-F]+)")


NAMES = dict(REQUESTS)


def name(req):
    return NAMES.get(req, f"request {req}")


def runs(seq):
    """Consecutive repeats collapsed: A, B x3, C."""
    out = []
    for item in seq:
        if out and out[-1][0] == item:
            out[-1][1] += 1
        else:
            out.append([item, 1])
    return ", ".join(n if c == 1 else f"{n} x{c}" for n, c in out)


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    sent, read = [], []
    with open(sys.argv[1], encoding="utf-8", errors="replace") as f:
        for line in f:
            m = TRACE.search(line)
            if m:
                req = int(m.group(2))
                if m.group(3):
                    NAMES[req] = m.group(3)
                (sent if m.group(1) == "write" else read).append(req)
    print(f"QEMU sent {len(sent)} messages: {runs(name(r) for r in sent) or '-'}")
    print(f"QEMU read {len(read)} replies: {runs(name(r) for r in read) or '-'}")
    needed = (1, 15)  # GET_FEATURES, GET_PROTOCOL_FEATURES
    missing = [name(r) for r in needed if r not in sent or r not in read]
    if missing:
        print(f"no handshake: QEMU did not send, or got no reply to, {', '.join(missing)}")
        return 1
    print("handshake: features and protocol features exchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
