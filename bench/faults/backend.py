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
import signal
import sys

import http1


class BadFraming(Exception):
    pass


async def read_body(reader, headers):
    h = hashlib.sha1()
    n = 0
    te = headers.get('transfer-encoding', '').lower()
    if 'chunked' in te:
        while True:
            line = await reader.readline()
            if not line:
                raise asyncio.IncompleteReadError(b'', None)
            size = int(line.split(b';')[0].strip() or b'0', 16)
            if size == 0:
                while True:     # trailers
                    t = await reader.readline()
                    if t in (b'\r\n', b'\n', b''):
                        break
                break
            data = await reader.readexactly(size)
            h.update(data)
            n += size
            await reader.readexactly(2)
    else:
        remaining = int(headers.get('content-length', '0') or 0)
        while remaining > 0:
            data = await reader.read(min(remaining, 1 << 18))
            if not data:
                raise asyncio.IncompleteReadError(b'', remaining)
            h.update(data)
            n += len(data)
            remaining -= len(data)
    return n, h.hexdigest()


async def handle(name, reader, writer):
    try:
        while True:
            line = await reader.readline()
            if not line:
                break
            parts = line.decode('latin-1').split()
            if len(parts) != 3:
                raise BadFraming(line)
            method, target, version = parts
            headers = await http1.read_headers(reader)
            n, sha1 = await read_body(reader, headers)
            conn = headers.get('connection', '').lower()
            keep = (version == 'HTTP/1.1' and conn != 'close') or \
                   (version == 'HTTP/1.0' and conn == 'keep-alive')
            delay = int(headers.get('x-delay-ms', '0') or 0) / 1000.0
            chunks = int(headers.get('x-stream', '0') or 0)
            result = json.dumps({'backend': name,
                                 'req': headers.get('x-req-id', ''),
                                 'method': method, 'target': target,
                                 'len': n, 'sha1': sha1}).encode()
            head = ['HTTP/1.1 200 OK', 'X-Backend: ' + name,
                    'Connection: ' + ('keep-alive' if keep else 'close')]
            if chunks > 0:
                head += ['Content-Type: text/event-stream',
                         'Transfer-Encoding: chunked']
                writer.write(('\r\n'.join(head) + '\r\n\r\n').encode())
                await writer.drain()
                for i in range(chunks):
                    await asyncio.sleep(delay / chunks)
                    data = b'data: {"chunk":%d}\n\n' % i
                    writer.write(b'%x\r\n%s\r\n' % (len(data), data))
                    await writer.drain()
                data = b'data: ' + result + b'\n\ndata: [DONE]\n\n'
                writer.write(b'%x\r\n%s\r\n0\r\n\r\n' % (len(data), data))
            else:
                if delay:
                    await asyncio.sleep(delay)
                head += ['Content-Type: application/json',
                         'Content-Length: %d' % len(result)]
                writer.write(('\r\n'.join(head) + '\r\n\r\n').encode()
                             + result)
            await writer.drain()
            if not keep:
                break
    except (ConnectionError, asyncio.IncompleteReadError, BadFraming,
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
