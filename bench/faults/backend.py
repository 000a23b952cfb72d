#!/usr/bin/env python3
"""A backend for the fault benchmark: one HTTP/1.1 server on one port.

It accepts any request, whatever its body (the point is that bad bodies
reach it), and answers 200 with what it received, so the client can check
that the body went through nginx unchanged:

    {"backend": NAME, "req": X-Req-Id, "len": body bytes, "sha1": body SHA-1}

X-Delay-Ms: N     answer after N ms (the request stays in flight)
X-Stream: N       answer in N server-sent-event chunks spread over the delay
                  (Transfer-Encoding: chunked), the JSON above in the last

Every answer carries X-Backend: NAME.  Keep-alive connections are kept.

    backend.py --port 20001 --name b1
"""

import argparse
import asyncio
import hashlib
import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

from bench.sim import http1  # noqa: E402


async def handle(name, reader, writer):
    try:
        while True:
            req = await http1.read_request(reader, writer)
            if req is None:
                break
            headers = req.headers
            keep = req.keep_alive
            delay = int(headers.get('x-delay-ms', '0') or 0) / 1000.0
            chunks = int(headers.get('x-stream', '0') or 0)
            result = json.dumps({'backend': name,
                                 'req': headers.get('x-req-id', ''),
                                 'method': req.method, 'target': req.target,
                                 'len': len(req.body),
                                 'sha1': hashlib.sha1(req.body).hexdigest()
                                 }).encode()
            head = [('X-Backend', name),
                    ('Connection', 'keep-alive' if keep else 'close')]
            if chunks > 0:
                head += [('Content-Type', 'text/event-stream'),
                         ('Transfer-Encoding', 'chunked')]
                writer.write(http1.response_head(200, head))
                await writer.drain()
                for i in range(chunks):
                    await asyncio.sleep(delay / chunks)
                    writer.write(http1.chunk(b'data: {"chunk":%d}\n\n' % i))
                    await writer.drain()
                writer.write(http1.chunk(b'data: ' + result
                                         + b'\n\ndata: [DONE]\n\n')
                             + http1.LAST_CHUNK)
            else:
                if delay:
                    await asyncio.sleep(delay)
                head += [('Content-Type', 'application/json'),
                         ('Content-Length', len(result))]
                writer.write(http1.response_head(200, head) + result)
            await writer.drain()
            if not keep:
                break
    except (ConnectionError, asyncio.IncompleteReadError, http1.HttpError,
            ValueError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def main(args):
    server = await asyncio.start_server(
        lambda r, w: handle(args.name, r, w), args.host, args.port,
        reuse_address=True, backlog=1024, limit=1 << 20)
    print('ready', args.name, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)
    async with server:
        await stop.wait()


if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--host', default='127.0.0.1')
    p.add_argument('--port', type=int, required=True)
    p.add_argument('--name', required=True)
    sys.exit(asyncio.run(main(p.parse_args())))
