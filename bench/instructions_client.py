#!/usr/bin/env python3
"""The client of bench/bench-instructions.sh: N requests, one at a time, in
turn over a few keep-alive connections, so that nginx under callgrind does
the same work on every run.

    instructions_client.py PORT session|prefix N [CONNECTIONS]

session: GET with X-Session-ID "session-<i mod 1000>" (1000 sessions);
prefix: POST of 4 KB chat bodies, 100 conversations in turn (the bodies of
bench-throughput.sh's chat.lua).  Exits 1 unless every response is a 200.
"""

import http.client
import sys

SESSIONS = 1000
CONVERSATIONS = 100
BODY_BYTES = 4096


def chat_bodies():
    filler = "The quick brown fox jumps over the lazy dog. " * (
        BODY_BYTES // 45 + 1)
    bodies = []
    for c in range(1, CONVERSATIONS + 1):
        text = ("Conversation %d: " % c) + filler
        bodies.append(('{"model":"llm","messages":[{"role":"user",'
                       '"content":"' + text[:BODY_BYTES - 60] + '"}]}')
                      .encode())
    return bodies


def main(argv):
    if len(argv) not in (4, 5) or argv[2] not in ("session", "prefix"):
        sys.exit(__doc__)
    port, mode, n = int(argv[1]), argv[2], int(argv[3])
    conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=120)
             for _ in range(int(argv[4]) if len(argv) == 5 else 4)]
    bodies = chat_bodies()
    codes = {}
    for i in range(n):
        c = conns[i % len(conns)]
        if mode == "session":
            c.request("GET", "/",
                      headers={"X-Session-ID": "session-%d" % (i % SESSIONS)})
        else:
            c.request("POST", "/", body=bodies[i % CONVERSATIONS],
                      headers={"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        codes[r.status] = codes.get(r.status, 0) + 1
    for c in conns:
        c.close()
    if codes.get(200, 0) != n:
        sys.exit("responses by status: %r" % codes)


if __name__ == "__main__":
    main(sys.argv)
