"""HTTP/1.1 on asyncio streams: the one codec of the simulated fleet and the
benchmarks.  The mock replicas and the fault benchmark's backends read
requests and write responses with it; the trace replay and the fault
benchmark's client write requests and read responses.

It is written on asyncio streams rather than taken from http.server or
http.client so that one thread holds thousands of connections, most of
them waiting on timers, and so that a client sends each request at once on
a connection of its own, where a pooled client library would queue requests
behind its pool limit and distort open-loop arrival times.  It does only
what those tools need: one request at a time on a connection, no
compression, trailers read and dropped.

A connection that ends in the middle of a message raises
asyncio.IncompleteReadError, as StreamReader.readexactly() does; a message
that is not HTTP/1.1 raises HttpError, whose status is the answer a server
owes it.
"""

import asyncio
from dataclasses import dataclass
from urllib.parse import urlsplit

REASONS = {100: 'Continue', 200: 'OK', 400: 'Bad Request', 404: 'Not Found',
           405: 'Method Not Allowed', 413: 'Payload Too Large',
           431: 'Request Header Fields Too Large', 500: 'Internal Server Error',
           501: 'Not Implemented'}

MAX_HEAD_BYTES = 256 * 1024     # a start line and its header lines
PIECE_BYTES = 65536             # the most one read of a body asks for
CONTINUE = b'HTTP/1.1 100 Continue\r\n\r\n'
LAST_CHUNK = b'0\r\n\r\n'


class HttpError(Exception):
    """A message that is not valid HTTP/1.1."""

    def __init__(self, message, status=400):
        super().__init__(message)
        self.message = message
        self.status = status


def closed(partial=b''):
    """The error of a connection that ended in the middle of a message."""
    return asyncio.IncompleteReadError(partial, None)


async def read_line(reader):
    """One line with its end (CRLF, or a bare LF)."""
    try:
        line = await reader.readline()
    except ValueError:              # longer than the stream's limit
        raise HttpError('line too long', 431) from None
    if not line.endswith(b'\n'):
        raise closed(line)
    return line


async def read_start_line(reader):
    """The first line of a message, after any empty lines (RFC 9112, 2.2),
    without its end."""
    while True:
        line = await read_line(reader)
        if line.strip(b'\r\n'):
            return line.rstrip(b'\r\n').decode('latin-1')


async def read_headers(reader):
    """The header lines up to the empty line, as a dict of lower-case names;
    the values of a repeated name are joined with ", "."""
    headers = {}
    size = 0
    while True:
        line = await read_line(reader)
        size += len(line)
        if size > MAX_HEAD_BYTES:
            raise HttpError('header section too large', 431)
        line = line.rstrip(b'\r\n').decode('latin-1')
        if not line:
            return headers
        name, colon, value = line.partition(':')
        if not colon or not name or name != name.strip():
            raise HttpError('malformed header line')
        name = name.lower()
        value = value.strip()
        headers[name] = headers[name] + ', ' + value if name in headers \
            else value


# ---------------------------------------------------------------------------
# Bodies
# ---------------------------------------------------------------------------

def is_chunked(headers):
    return 'chunked' in headers.get('transfer-encoding', '').lower()


def content_length(headers, limit=None):
    """The Content-Length of a message, None without one; HttpError when it
    is malformed or over limit bytes."""
    text = headers.get('content-length')
    if text is None:
        return None
    try:
        length = int(text)
    except ValueError:
        raise HttpError('malformed Content-Length') from None
    if length < 0:
        raise HttpError('malformed Content-Length')
    if limit is not None and length > limit:
        raise HttpError('body too large', 413)
    return length


async def iter_body(reader, headers, to_close=False, limit=None):
    """The body of a message in pieces, as they arrive: chunked, sized by
    Content-Length, or else, with to_close (a response), up to the end of
    the connection, and without it (a request) empty.  HttpError 413 when
    it is over limit bytes."""
    if is_chunked(headers):
        async for data in iter_chunked(reader, limit):
            yield data
        return
    length = content_length(headers, limit)
    if length is None:
        while to_close:
            data = await reader.read(PIECE_BYTES)
            if not data:
                return
            yield data
        return
    async for data in iter_exactly(reader, length):
        yield data


async def iter_exactly(reader, length):
    """length bytes in pieces, as they arrive."""
    while length:
        data = await reader.read(min(length, PIECE_BYTES))
        if not data:
            raise closed()
        length -= len(data)
        yield data


async def iter_chunked(reader, limit=None):
    """The data of a chunked body in pieces; its trailers are dropped."""
    total = 0
    while True:
        line = await read_line(reader)
        try:
            size = int(line.split(b';', 1)[0].strip(), 16)
        except ValueError:
            raise HttpError('malformed chunk size') from None
        if size < 0:
            raise HttpError('malformed chunk size')
        if size == 0:
            break
        total += size
        if limit is not None and total > limit:
            raise HttpError('body too large', 413)
        async for data in iter_exactly(reader, size):
            yield data
        if await reader.readexactly(2) != b'\r\n':
            raise HttpError('malformed chunk')
    while (await read_line(reader)).strip(b'\r\n'):
        pass


async def read_body(reader, headers, to_close=False, limit=None):
    """The whole body (see iter_body)."""
    return b''.join([data async for data in iter_body(reader, headers,
                                                      to_close, limit)])


def chunk(data):
    """data as one chunk of a chunked body (never empty: that ends it)."""
    return b'%x\r\n%s\r\n' % (len(data), data)


def head_bytes(start_line, headers):
    """A start line and (name, value) header lines, as bytes."""
    return (start_line + '\r\n'
            + ''.join('%s: %s\r\n' % header for header in headers)
            + '\r\n').encode('latin-1')


# ---------------------------------------------------------------------------
# Servers
# ---------------------------------------------------------------------------

@dataclass
class Request:
    method: str
    target: str             # as sent, with its query
    http10: bool
    headers: dict
    body: bytes

    @property
    def path(self):
        return self.target.split('?', 1)[0]

    @property
    def keep_alive(self):
        """HTTP/1.1 keeps the connection unless told to close; HTTP/1.0
        (nginx's default upstream protocol) only when asked to keep it."""
        tokens = self.headers.get('connection', '').lower()
        if self.http10:
            return 'keep-alive' in tokens
        return 'close' not in tokens


async def read_request(reader, writer, max_body=None):
    """The next request of a connection, or None when the client is done.
    The body is read by Content-Length or chunked, and an
    `Expect: 100-continue` is answered first (curl pauses before sending
    the body otherwise).  HttpError for a request that cannot be read,
    including one cut short."""
    try:
        line = await read_start_line(reader)
    except asyncio.IncompleteReadError as error:
        if error.partial.strip():
            raise HttpError('incomplete request head') from None
        return None
    parts = line.split(' ')
    if len(parts) != 3 or not parts[2].startswith('HTTP/1.'):
        raise HttpError('malformed request line')
    method, target, version = parts
    http10 = version == 'HTTP/1.0'
    try:
        headers = await read_headers(reader)
    except asyncio.IncompleteReadError:
        raise HttpError('incomplete request head') from None
    if not is_chunked(headers) and not content_length(headers, max_body):
        body = b''
    else:
        if not http10 and headers.get('expect', '').lower() == '100-continue':
            writer.write(CONTINUE)
        body = await read_body(reader, headers, limit=max_body)
    return Request(method, target, http10, headers, body)


def response_head(status, headers):
    """The status line and header lines of a response, as bytes."""
    return head_bytes('HTTP/1.1 %d %s' % (status,
                                          REASONS.get(status, 'Unknown')),
                      headers)


# ---------------------------------------------------------------------------
# Clients
# ---------------------------------------------------------------------------

def split_url(url):
    """(host, port, target) of an http:// URL."""
    parts = urlsplit(url)
    if parts.scheme != 'http':
        raise ValueError('only http:// URLs are supported: %s' % url)
    target = parts.path or '/'
    if parts.query:
        target += '?' + parts.query
    return parts.hostname, parts.port or 80, target


def request_head(method, target, headers):
    """The request line and header lines of a request, as bytes."""
    return head_bytes('%s %s HTTP/1.1' % (method, target), headers)


class Response:
    """A response as it is read.  phase tells how far reading got:
    'status', 'headers', 'body', then 'done' (a caller may set phases of
    its own before, such as connecting and sending)."""

    def __init__(self):
        self.status = None
        self.headers = {}
        self.body = b''
        self.phase = 'connect'


async def read_response_head(reader, resp=None):
    """The status and headers of a response (into resp, or a new Response),
    past any interim 1xx responses."""
    resp = resp or Response()
    while True:
        resp.phase = 'status'
        parts = (await read_start_line(reader)).split(None, 2)
        if len(parts) < 2 or not parts[0].startswith('HTTP/') \
                or not parts[1].isdigit():
            raise HttpError('malformed status line')
        resp.status = int(parts[1])
        resp.phase = 'headers'
        resp.headers = await read_headers(reader)
        if not 100 <= resp.status < 200:
            return resp


async def read_response(reader, resp=None):
    """A whole response (into resp, or a new Response)."""
    resp = await read_response_head(reader, resp)
    resp.phase = 'body'
    resp.body = await read_body(reader, resp.headers, to_close=True)
    resp.phase = 'done'
    return resp
