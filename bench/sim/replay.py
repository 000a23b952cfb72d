#!/usr/bin/python3
"""Replays a workload (workloads.py: a Mooncake-style trace, or a
generated one) against an OpenAI-compatible endpoint (nginx in front of the
mock fleet, or the mock directly) and measures what the routing achieved:
prefix-cache hit ratio, time to first token, how evenly requests and
in-flight load were spread over the replicas, and how often sessions
changed replica.

    /usr/bin/python3 bench/sim/replay.py \\
        --url http://127.0.0.1:8080/v1/chat/completions [--trace PATH] \\
        [--limit N] [--start K] [--speed 20] [--session-header] \\
        [--stats-urls http://127.0.0.1:9001/stats,...] [--label NAME] \\
        [--output result.json] [--timeout 120]
    /usr/bin/python3 bench/sim/replay.py --url ... --workload agentic \\
        --seed 2 --size quick --rate-multiplier 4 --sessions on --speed 10

The replay is open loop: request i is sent arrival_i / rate_multiplier /
speed seconds after the start whether or not earlier requests have
finished, as users would.  The mock replicas should run with time_scale =
1 / speed, so that measured TTFTs multiplied by speed are profile seconds
(trace seconds at a rate multiplier of 1), comparable with bounds.py.
With sessions on (--session-header), each request carries its session's
id in X-Session-ID.  The replica that served a request is the X-Replica
header of the answer (the mock's name for itself); moves are counted by
trace.session_moves, in profile seconds.  The replica's own time to first
token, where its answer gives one (X-Replica-TTFT), is summarised next to
the client's.

With --routes FILE (a JSON object: request index -> replica number), each
request carries its replica's number in X-Bench-Replica, for a proxy that
sends it there: bench.py replays the oracle's choices that way, so that
the oracle's TTFT is measured through the same client, proxy and mock as
the policies'.

Each request has a connection of its own (Connection: close), on
asyncio streams (http1.py): thousands of requests may be in flight at
once, and a pooled client library would queue them behind its pool limit
and distort the open-loop arrival times.
"""

import argparse
import asyncio
import json
import math
import resource
import sys
import zlib
from collections import Counter
from pathlib import Path

if __package__ in (None, ''):       # run as a file: bench/sim/replay.py
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench import stamp  # noqa: E402
from bench.sim import http1, trace, workloads  # noqa: E402

START_LEAD_S = 0.05     # so that the first sends are not already late


async def http_json(url, method='GET', timeout=10.0):
    """A small request (stats, reset): (status, parsed JSON body or None).
    """
    async def exchange():
        host, port, target = http1.split_url(url)
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(request_head(method, host, port, target, 0))
            await writer.drain()
            resp = await http1.read_response(reader)
        finally:
            writer.close()
        try:
            return resp.status, json.loads(resp.body) if resp.body else None
        except ValueError:
            return resp.status, None
    return await asyncio.wait_for(exchange(), timeout)


def request_head(method, host, port, target, body_length, extra_headers=()):
    """The head of a request of the replay, one a connection."""
    headers = [('Host', '%s:%d' % (host, port)), ('Connection', 'close'),
               ('Content-Length', body_length)]
    if body_length:
        headers.append(('Content-Type', 'application/json'))
    return http1.request_head(method, target, headers + list(extra_headers))


# --- server-sent events ---------------------------------------------------

class StreamWatcher:
    """Reads an SSE chat-completion stream as it arrives: when the first
    chunk with content came, and the usage of the final chunk.  Only the
    chunks that can matter are JSON-decoded (those before the first
    content, and those mentioning prompt_tokens), because a replay receives
    tens of thousands of chunks per second."""

    def __init__(self):
        self.buffer = b''
        self.first_content_at = None
        self.prompt_tokens = None
        self.cached_tokens = None

    def feed(self, data, now):
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b'\n')
        for line in lines:
            if line.startswith(b'data:'):
                self._event(line[5:].strip(), now)

    def _event(self, payload, now):
        if payload == b'[DONE]':
            return
        if self.first_content_at is not None \
                and b'prompt_tokens' not in payload:
            return
        try:
            chunk = json.loads(payload)
        except ValueError:
            return
        if not isinstance(chunk, dict):
            return
        if self.first_content_at is None and has_content(chunk):
            self.first_content_at = now
        usage = chunk.get('usage')
        if isinstance(usage, dict) and 'prompt_tokens' in usage:
            self.prompt_tokens = usage.get('prompt_tokens')
            details = usage.get('prompt_tokens_details') or {}
            self.cached_tokens = details.get('cached_tokens') or 0


def has_content(chunk):
    """Whether a completion chunk carries generated text."""
    for choice in chunk.get('choices') or ():
        delta = choice.get('delta') or {}
        if delta.get('content') or delta.get('reasoning_content') \
                or choice.get('text'):
            return True
    return False


# --- one request ------------------------------------------------------------

async def exchange(target, body, headers, rec, clock):
    """Sends one chat request and reads its streamed answer into rec."""
    host, port, path = target
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request_head('POST', host, port, path, len(body),
                                  headers) + body)
        await writer.drain()
        resp = await http1.read_response_head(reader)
        status = rec['status'] = resp.status
        rec['replica'] = resp.headers.get('x-replica')
        rec['replica_ttft'] = _seconds(resp.headers.get('x-replica-ttft'))
        watcher = StreamWatcher()
        error_text = b''
        async for data in http1.iter_body(reader, resp.headers,
                                          to_close=True):
            if status == 200:
                watcher.feed(data, clock())
            elif len(error_text) < 200:
                error_text += data
        if status != 200:
            rec['err'] = 'HTTP %d %s' % (
                status, error_text[:200].decode('utf-8', 'replace').strip())
        if watcher.first_content_at is not None:
            rec['ttft'] = watcher.first_content_at - rec['send']
        rec['pt'] = watcher.prompt_tokens
        rec['ct'] = watcher.cached_tokens
    finally:
        writer.close()


def encode_body(request, options):
    """The request body of a workloads.Request, as bytes."""
    return request.body_bytes(options.model)


async def replay_one(request, at, body, options, clock):
    """Sends one request (body prepared, or the exception that preparing
    it raised) and returns what happened.  Never raises: failures are
    recorded in 'err'."""
    session = request.session
    rec = {'i': request.index, 'sid': session, 'at': at, 'send': None,
           'ttft': None, 'replica_ttft': None, 'end': None, 'status': None,
           'replica': None, 'pt': None, 'ct': None, 'err': None}
    try:
        if isinstance(body, Exception):
            raise body
        headers = [('Accept', 'text/event-stream')]
        if options.session_header:
            headers.append(('X-Session-ID', session))
        replica = options.routes.get(request.index)
        if replica is not None:
            headers.append(('X-Bench-Replica', str(replica)))
        rec['send'] = clock()
        await asyncio.wait_for(
            exchange(options.target_of(request), body, headers, rec, clock),
            options.timeout)
    except asyncio.TimeoutError:
        rec['err'] = 'timeout'
    except Exception as e:          # any failure is one failed request
        rec['err'] = '%s: %s' % (type(e).__name__, e)
    rec['end'] = clock()
    return rec


class ReplayOptions:
    """What every request of a replay shares."""

    def __init__(self, url, speed=1.0, session_header=False, timeout=120.0,
                 model='mock-llm', rate_multiplier=1.0, routes=None,
                 spread='request'):
        # Several URLs: several balancer instances behind a spreader that
        # sends each request to one of them at random (as a cloud load
        # balancer in front of ingress pods does), reproducibly; or, with
        # spread='client', each session's requests to the same one, as a
        # front that hashes the client's address or its session header.
        self.targets = [http1.split_url(u) for u in url.split(',') if u]
        self.spread = spread
        self.target = self.targets[0]
        self.speed = speed
        self.rate_multiplier = rate_multiplier
        self.session_header = session_header
        self.timeout = timeout
        self.model = model
        # request index -> the replica number sent in X-Bench-Replica
        self.routes = routes or {}

    def target_of(self, request):
        """The instance a request goes to: one at random, the same for a
        request index in every run; with spread='client', the same for
        every request of a session."""
        if len(self.targets) == 1:
            return self.target
        if self.spread == 'client':
            # crc32, not hash(): the same in every process.
            key = zlib.crc32(request.session.encode())
        else:
            key = request.index
        pick = (key * 0x9E3779B97F4A7C15 + 12345) % (1 << 64)
        return self.targets[(pick >> 33) % len(self.targets)]


async def replay(requests, options):
    """Replays workloads.Requests open-loop; returns one result dict per
    request, in the workload's order, times in wall seconds from the
    replay's start.  One dispatcher starts the requests in order (requests
    with equal arrival times too), each at its time, and does not wait for
    them.  It builds each body before waiting for its time, so that the
    send itself is not delayed by synthesising a 50-500 KB prompt."""
    loop = asyncio.get_running_loop()
    origin = loop.time() + START_LEAD_S

    def clock():
        return loop.time() - origin
    tasks = []
    first = requests[0].arrival if requests else 0.0
    scale = options.rate_multiplier * options.speed
    for request in requests:
        try:
            body = encode_body(request, options)
        except Exception as e:      # reported by replay_one as an error
            body = e
        at = (request.arrival - first) / scale
        # Sleeping even when late lets the requests already started run.
        await asyncio.sleep(max(0.0, at - clock()))
        tasks.append(asyncio.create_task(
            replay_one(request, at, body, options, clock)))
    return list(await asyncio.gather(*tasks))


# --- mock statistics ------------------------------------------------------

def replica_stats(doc, name=None):
    """{replica name: stats dict} from a /stats document, accepting one
    replica's object, a list of them, {"replicas": ...} or a mapping of
    names to objects."""
    if isinstance(doc, dict) and 'peak_inflight' in doc:
        label = doc.get('replica') or doc.get('name') or doc.get('id')
        return {str(label or name): doc}
    if isinstance(doc, dict) and 'replicas' in doc:
        return replica_stats(doc['replicas'], name)
    found = {}
    if isinstance(doc, list):
        for i, item in enumerate(doc):
            found.update(replica_stats(item, '%s#%d' % (name, i)))
    elif isinstance(doc, dict):
        for key, item in doc.items():
            if isinstance(item, (dict, list)):
                found.update(replica_stats(item, key))
    return found


async def collect_stats(urls):
    """{replica name: stats} from every stats URL; failures are warned
    about on stderr and skipped."""
    found = {}
    for url in urls:
        try:
            status, doc = await http_json(url)
            if status != 200:
                raise RuntimeError('HTTP %d' % status)
            found.update(replica_stats(doc, url))
        except Exception as e:
            print('warning: stats %s: %s' % (url, e), file=sys.stderr)
    return found


async def reset_stats(urls):
    """POST /reset next to each /stats URL, so that peaks and counters
    cover this replay only."""
    for url in urls:
        reset = url[:-len('/stats')] + '/reset' if url.endswith('/stats') \
            else url.rstrip('/') + '/reset'
        try:
            status, _ = await http_json(reset, 'POST')
            if status != 200:
                raise RuntimeError('HTTP %d' % status)
        except Exception as e:
            print('warning: reset %s: %s' % (reset, e), file=sys.stderr)


def _seconds(text):
    """A header's figure of seconds, or None if absent or not one."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value >= 0 else None


# --- summary ----------------------------------------------------------------

def summarize(results, speed, stats_before=None, stats_after=None):
    """The figures of a replay (see the keys)."""
    ok = [r for r in results if _succeeded(r)]
    errors = [r for r in results if not _succeeded(r)]
    with_usage = [r for r in ok if r['pt'] is not None]
    prompt = sum(r['pt'] for r in with_usage)
    cached = sum(r['ct'] or 0 for r in with_usage)
    ttfts = [r['ttft'] for r in ok if r['ttft'] is not None]
    # The replicas' own figure (X-Replica-TTFT): what the client measures
    # less the client's, nginx's and the connections' time, which the
    # replay multiplies by its speed with the rest.
    replica_ttfts = [r['replica_ttft'] for r in ok
                     if r['replica_ttft'] is not None]
    lags = [r['send'] - r['at'] for r in results if r['send'] is not None]
    summary = {
        'requests': len(results),
        'ok': len(ok),
        'errors': len(errors),
        'error_kinds': dict(Counter(_error_kind(r) for r in errors)),
        'missing_usage': len(ok) - len(with_usage),
        'prompt_tokens': prompt,
        'cached_tokens': cached,
        'hit_ratio': cached / prompt if prompt else None,
        'ttft_trace_s': _scaled(trace.percentiles(ttfts), speed),
        'ttft_wall_s': _scaled(trace.percentiles(ttfts), 1.0),
        'replica_ttft_trace_s': _scaled(trace.percentiles(replica_ttfts),
                                        speed),
        'send_lag_wall_s': _scaled(trace.percentiles(lags, (50, 99, 100)),
                                   1.0),
        'wall_s': round(max((r['end'] for r in results), default=0.0), 3),
    }
    # profile seconds: the scheduled arrival, times the speed
    moves = trace.session_moves((r['sid'], r['at'] * speed, r['replica'])
                                for r in ok if r['replica'] is not None)
    summary.update(session_moves=moves,
                   moves_per_min=moves['moves_per_min'],
                   moved_session_share_per_min=moves[
                       'moved_session_share_per_min'])
    summary.update(replica_summary(results, stats_after or {}))
    summary.update(server_summary(stats_before or {}, stats_after or {}))
    return summary


def _succeeded(rec):
    return rec['status'] == 200 and not rec['err']


def _error_kind(rec):
    """'HTTP 502', 'timeout', or the exception's type name."""
    if not rec['err'] or rec['err'].startswith('HTTP'):
        return 'HTTP %s' % rec['status']
    return rec['err'].split(':')[0]


def _scaled(figures, factor):
    return {k: None if v is None else round(v * factor, 6)
            for k, v in figures.items()}


def replica_summary(results, stats):
    """Requests per replica (X-Replica) and client-side peak in-flight per
    replica (the most of its requests open at once, from send and end
    times).  Replicas that /stats lists but that served nothing count as
    zero when /stats names replicas as X-Replica does."""
    served = {}
    for r in results:
        if r['replica'] is not None and r['send'] is not None:
            served.setdefault(r['replica'], []).append(r)
    names = set(served)
    if names & set(stats):
        names |= set(stats)
    names = sorted(names)
    counts = {n: len(served.get(n, ())) for n in names}
    peaks = {n: trace.peak_overlap((r['send'], r['end'])
                                   for r in served.get(n, ()))
             for n in names}
    count_mm = trace.max_mean(list(counts.values()))
    peak_mm = trace.max_mean(list(peaks.values()))
    return {
        'replica_requests': counts,
        'replica_requests_max': count_mm['max'],
        'replica_requests_mean': count_mm['mean'],
        'client_peak_inflight': peaks,
        'client_peak_inflight_max': peak_mm['max'],
        'client_peak_inflight_mean': peak_mm['mean'],
    }


def _counter(stats, field):
    """A mock counter, named with or without the Prometheus-style _total
    suffix."""
    value = stats.get(field + '_total', stats.get(field))
    return value if isinstance(value, (int, float)) else 0


def server_summary(before, after):
    """Peak in-flight per replica as the mock counted it, and the hit
    ratio from the mock's counters (after minus before)."""
    if not after:
        return {'server_peak_inflight': None,
                'server_peak_inflight_max': None,
                'server_peak_inflight_mean': None,
                'server_requests': None,
                'server_hit_ratio': None}
    peaks = {n: s.get('peak_inflight') for n, s in sorted(after.items())}
    mm = trace.max_mean([p for p in peaks.values() if p is not None])

    def delta(field):
        return sum(_counter(s, field) - _counter(before.get(n, {}), field)
                   for n, s in after.items())
    prompt = delta('prompt_tokens')
    return {
        'server_peak_inflight': peaks,
        'server_peak_inflight_max': mm['max'],
        'server_peak_inflight_mean': mm['mean'],
        'server_requests': delta('requests'),
        'server_hit_ratio': delta('cached_tokens') / prompt if prompt
        else None,
    }


# --- command line -----------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--url', required=True,
                   help='chat completions URL, e.g. '
                        'http://127.0.0.1:8080/v1/chat/completions; '
                        'several, comma-separated: each request goes to one '
                        'of them at random (--spread)')
    p.add_argument('--spread', choices=('request', 'client'),
                   default='request',
                   help='with several URLs: each request to one at random '
                        '(request, the default), or every request of a '
                        'session to the same one, as a front that hashes '
                        'the client (client)')
    trace.add_trace_arguments(p, 'replay')
    workloads.add_workload_arguments(p)
    p.add_argument('--rate-multiplier', type=float, default=1.0,
                   help='arrivals at this many times the workload\'s rate '
                        '(default %(default)s)')
    p.add_argument('--speed', type=float, default=20.0,
                   help='profile time / wall time (default %(default)s)')
    p.add_argument('--session-header', action='store_true',
                   help='send X-Session-ID: <session id> (--sessions on)')
    p.add_argument('--sessions', choices=('on', 'off'),
                   help='send the session ids or not (default: off '
                        'unless --session-header)')
    p.add_argument('--stats-urls', default='',
                   help='comma-separated mock /stats URLs')
    p.add_argument('--no-reset', action='store_true',
                   help='do not POST /reset to the mock before replaying '
                        '(its peaks then include earlier runs)')
    p.add_argument('--label', default='replay')
    p.add_argument('--model', default='mock-llm')
    p.add_argument('--output', help='write the result JSON here, stamped '
                   'with the run\'s command, commit, version and date')
    p.add_argument('--timeout', type=float, default=120.0,
                   help='seconds (wall) per request (default %(default)s)')
    p.add_argument('--routes',
                   help='JSON file of {request index: replica number}: '
                        'each request carries its number in '
                        'X-Bench-Replica')
    return p.parse_args(argv)


def load_routes(path):
    """{request index: replica number} from a --routes file."""
    if not path:
        return {}
    with open(path) as f:
        return {int(index): int(replica)
                for index, replica in json.load(f).items()}


def raise_open_file_limit():
    """Each in-flight request holds a socket."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass


async def run(args):
    """The whole replay: reset, replay, collect, summarize."""
    workload = workloads.from_args(args)
    session_header = args.sessions == 'on' if args.sessions \
        else args.session_header
    options = ReplayOptions(args.url, args.speed, session_header,
                            args.timeout, args.model, args.rate_multiplier,
                            load_routes(args.routes), args.spread)
    stats_urls = [u for u in args.stats_urls.split(',') if u]
    if stats_urls and not args.no_reset:
        await reset_stats(stats_urls)
    before = await collect_stats(stats_urls) if stats_urls else {}
    results = await replay(workload.requests, options)
    after = await collect_stats(stats_urls) if stats_urls else {}
    config = {'url': args.url, 'spread': args.spread,
              'workload': workload.summary(),
              'trace': Path(args.trace).name
              if workload.name == 'conversation' else None,
              'start': args.start, 'limit': args.limit,
              'records': len(workload.requests), 'speed': args.speed,
              'rate_multiplier': args.rate_multiplier,
              'session_header': session_header,
              'timeout': args.timeout, 'model': args.model,
              'stats_urls': stats_urls, 'reset': not args.no_reset,
              'routes': bool(options.routes)}
    return {'label': args.label, 'config': config,
            'summary': summarize(results, args.speed, before, after),
            'stats': after,
            'requests': [compact(r) for r in results]}


def compact(rec):
    """A request record with times rounded to the microsecond."""
    out = dict(rec)
    for key in ('at', 'send', 'ttft', 'end'):
        if out[key] is not None:
            out[key] = round(out[key], 6)
    return out


def write_result(doc, path):
    """The result as JSON: readable header, one request per line."""
    head = {k: v for k, v in doc.items() if k != 'requests'}
    text = json.dumps(head, indent=2)[:-2]
    lines = ',\n'.join('    ' + json.dumps(r, separators=(',', ':'))
                       for r in doc['requests'])
    text += ',\n  "requests": [\n' + lines + '\n  ]\n}\n'
    Path(path).write_text(text)


def one_line(doc):
    """The summary in one line."""
    s = doc['summary']

    def fmt(v, spec='.3f'):
        return '-' if v is None else format(v, spec)

    def num(v):
        return '-' if v is None else '%g' % v
    t = s['ttft_trace_s']
    return ('%s: %d requests, %d errors, hit %s (server %s), TTFT trace s '
            'p50/p90/p99 %s/%s/%s (at the replicas p50 %s), '
            'replica requests max/mean %s/%s, '
            'peak in-flight server max/mean %s/%s client %s/%s, wall %ss'
            % (doc['label'], s['requests'], s['errors'], fmt(s['hit_ratio']),
               fmt(s['server_hit_ratio']), fmt(t['p50']), fmt(t['p90']),
               fmt(t['p99']), fmt(s['replica_ttft_trace_s']['p50']),
               num(s['replica_requests_max']),
               fmt(s['replica_requests_mean'], '.1f'),
               num(s['server_peak_inflight_max']),
               fmt(s['server_peak_inflight_mean'], '.1f'),
               num(s['client_peak_inflight_max']),
               fmt(s['client_peak_inflight_mean'], '.1f'), s['wall_s']))


def main(argv=None):
    args = parse_args(argv)
    raise_open_file_limit()
    stamped = stamp.stamp(program=__file__, argv=argv)
    doc = {'stamp': stamped, **asyncio.run(run(args))}
    if args.output:
        write_result(doc, args.output)
    print(one_line(doc))


if __name__ == '__main__':
    main()
