"""The HTTP/1.x framing the fault benchmark's client and backends share."""

import asyncio


async def read_headers(reader):
    """Header lines up to the empty line, as a dict of lower-case names."""
    headers = {}
    while True:
        line = await reader.readline()
        if not line:
            raise asyncio.IncompleteReadError(b'', None)
        if line in (b'\r\n', b'\n'):
            return headers
        name, _, value = line.decode('latin-1').partition(':')
        headers[name.strip().lower()] = value.strip()
