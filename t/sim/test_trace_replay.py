"""Tests of the trace synthesis (bench/sim/trace.py), the offline bounds
(bench/sim/bounds.py) and the replay tool (bench/sim/replay.py).

    /usr/bin/python3 -m unittest discover -s t/sim -t .
"""

import asyncio
import contextlib
import io
import json
import os
import tempfile
import threading
import unittest
from pathlib import Path

from bench.sim import bounds, fleet, model, replay, trace, workloads


def record(ids, input_length, output_length=10, timestamp=0):
    return {'timestamp': timestamp, 'input_length': input_length,
            'output_length': output_length, 'hash_ids': list(ids)}


def mock_chain(rec):
    """The chain the mock computes for the chat request of a record."""
    return model.block_chain(trace.chat_prompt_text(trace.prompt_text(rec)))


def shared_blocks(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class BlockTextTest(unittest.TestCase):

    def test_equal_ids_give_equal_text(self):
        self.assertEqual(trace.block_text(42), trace.block_text(42))
        self.assertEqual(trace.block_text(42),
                         trace.block_text.__wrapped__(42))

    def test_different_ids_give_different_text(self):
        texts = {trace.block_text(i) for i in range(300)}
        self.assertEqual(len(texts), 300)
        self.assertNotEqual(trace.block_text(1)[:12],
                            trace.block_text(10)[:12])

    def test_length_and_characters(self):
        for block_id in (0, 1, 7, 182789, 10 ** 12):
            text = trace.block_text(block_id)
            self.assertEqual(len(text), 2048)
            self.assertTrue(text.isascii())
            self.assertEqual(json.dumps(text), '"%s"' % text)
            self.assertTrue(text.startswith('%d:' % block_id))


class PromptTextTest(unittest.TestCase):
    a = record([0, 1, 2], 1500)
    b = record([0, 1, 5], 1400)

    def test_length_is_input_tokens_times_four(self):
        for rec in (self.a, self.b, record([0], 1), record([0, 3], 1024)):
            self.assertEqual(len(trace.prompt_text(rec)),
                             rec['input_length'] * model.CHARS_PER_TOKEN)

    def test_shares_exactly_the_common_block_prefix(self):
        # Block texts start with their id: 2 and 5 differ at once.
        ta, tb = trace.prompt_text(self.a), trace.prompt_text(self.b)
        self.assertEqual(len(os.path.commonprefix([ta, tb])), 2 * 2048)
        self.assertEqual(shared_blocks(model.block_chain(ta),
                                       model.block_chain(tb)), 64)

    def test_mock_chains_share_64_blocks(self):
        # The mock hashes "user\n" + prompt + "\n": 4101 equal characters,
        # still 64 full blocks of 64.
        self.assertEqual(shared_blocks(mock_chain(self.a),
                                       mock_chain(self.b)), 64)

    def test_memoized_chains_equal_block_chain(self):
        builder = bounds.ChainBuilder()
        cases = [self.a, self.b, record([0], 1), record([0], 511),
                 record([0], 512), record([0, 1], 513), record([0, 1], 1023),
                 record([0, 1], 1024), record([0, 1, 2, 3], 2047),
                 record([0, 1, 2, 3], 1537), record([0, 4, 2], 1300)]
        for rec in cases:
            with self.subTest(rec=rec):
                self.assertEqual(builder.chain(rec), mock_chain(rec))


class SessionAndBodyTest(unittest.TestCase):

    def test_sessions_group_records_by_second_block(self):
        first = trace.session_id(record([0, 7, 8], 1300), 0)
        later = trace.session_id(record([0, 7, 8, 9, 10], 2300), 5)
        other = trace.session_id(record([0, 11], 700), 6)
        self.assertEqual(first, 'conv-7')
        self.assertEqual(first, later)
        self.assertNotEqual(first, other)
        self.assertEqual(trace.session_id(record([0], 300), 9), 'single-9')

    def test_hash_ids_must_cover_the_input(self):
        with self.assertRaises(ValueError):
            trace.prompt_text(record([0, 1], 1025))

    def test_chat_body(self):
        rec = record([0, 1, 2], 1500, output_length=77)
        body = json.loads(json.dumps(trace.chat_body(rec)))
        self.assertEqual(body['model'], 'mock-llm')
        self.assertEqual(body['messages'], [
            {'role': 'user', 'content': trace.prompt_text(rec)}])
        self.assertEqual(body['max_tokens'], 77)
        self.assertIs(body['stream'], True)
        self.assertEqual(body['stream_options'], {'include_usage': True})
        self.assertEqual(trace.chat_body(rec, 'm2')['model'], 'm2')

    def test_load_trace_start_and_limit(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / 't.jsonl'
            path.write_text(''.join(json.dumps(record([0, i], 600, i, i))
                                    + '\n' for i in range(1, 6)))
            got = trace.load_trace(str(path), limit=2, start=1)
        self.assertEqual([r['hash_ids'] for r in got], [[0, 2], [0, 3]])


class InfiniteCacheTest(unittest.TestCase):

    def test_hand_computed_ratio(self):
        records = [record([0, 1], 1024), record([0, 1, 2], 1536),
                   record([0, 3], 600)]
        # Mock prompt texts are 4*input + 6 characters: 1026, 1538 and 602
        # prompt tokens.  The second record repeats the first one's 64 full
        # blocks (1024 tokens: "user\n" plus 4091 equal characters hold 64
        # blocks); the third shares only block 0: 2053 characters, 32
        # blocks, 512 tokens.
        requests = bounds.prepare_requests(records)
        self.assertEqual([r.prompt_tokens for r in requests],
                         [1026, 1538, 602])
        result = bounds.infinite_cache(requests)
        self.assertEqual(result['prompt_tokens'], 3166)
        self.assertEqual(result['cached_tokens'], 1536)
        self.assertAlmostEqual(result['hit_ratio'], 1536 / 3166)

    def test_matches_an_unbounded_prefix_cache(self):
        records = [record([0, 1], 1024), record([0, 1, 2], 1536),
                   record([0, 3], 600), record([0, 1, 2, 4], 1900),
                   record([0, 3, 5], 1100)]
        cache = model.PrefixCache(10 ** 9)
        cached = 0
        for rec in records:
            text = trace.chat_prompt_text(trace.prompt_text(rec))
            chain = model.block_chain(text)
            cached += model.cached_tokens(cache, chain,
                                          model.prompt_tokens(text))
            cache.insert(chain)
        result = bounds.infinite_cache(bounds.prepare_requests(records))
        self.assertEqual(result['cached_tokens'], cached)


def slow_params(**kw):
    """Long decodes keep requests in flight for the routing tests."""
    values = dict(max_running=32, prefill_ms_per_token=0.05,
                  decode_ms_per_token=1000.0, cache_tokens=10 ** 6)
    values.update(kw)
    return model.ReplicaParams(**values)


class SimulatorTest(unittest.TestCase):

    def test_queueing_and_cached_prefill(self):
        params = model.ReplicaParams(max_running=1, prefill_ms_per_token=1.0,
                                     decode_ms_per_token=10.0)
        records = [record([0, 1], 1024, 10, 0), record([0, 9], 600, 5, 500)]
        summary, jobs = bounds.simulate(bounds.prepare_requests(records),
                                        'round_robin', 1, params)
        # First: 1026 uncached tokens at 1 ms, decode 10 × 10 ms, leaves at
        # 1.126 s.  Second waits for the slot, finds block 0 (512 tokens)
        # cached, prefills 90 tokens: first token at 1.216 s, 0.716 after
        # its arrival.
        self.assertAlmostEqual(jobs[0].ttft, 1.026)
        self.assertEqual(jobs[1].cached_tokens, 512)
        self.assertAlmostEqual(jobs[1].ttft, 0.716)
        self.assertEqual(summary['peak_inflight'], [2])

    def test_deterministic(self):
        records = [record([0, i % 3 + 1, 10 + i], 1100 + 10 * i, 50, 100 * i)
                   for i in range(40)]
        requests = bounds.prepare_requests(records)
        for policy in bounds.POLICIES:
            first, _ = bounds.simulate(requests, policy, 3)
            second, _ = bounds.simulate(requests, policy, 3)
            self.assertEqual(first, second, policy)
            self.assertEqual(first['requests'], 40)


class OracleTest(unittest.TestCase):

    def test_extension_follows_its_prefix_when_under_the_bound(self):
        # An unrelated request takes replica 0, the conversation's first
        # turn then goes to the idle replica 1.  Later, with both idle and
        # replica 0 first in the least-loaded order, the second turn still
        # goes to replica 1, which holds its prefix.
        records = [record([0, 9], 1024, 5, 0), record([0, 1], 1024, 5, 0),
                   record([0, 1, 2], 1536, 5, 100000)]
        summary, jobs = bounds.simulate(bounds.prepare_requests(records),
                                        'oracle', 2, slow_params(
                                            decode_ms_per_token=1.0))
        self.assertEqual([j.replica for j in jobs], [0, 1, 1])
        self.assertEqual(jobs[2].cached_tokens, 1024)
        self.assertEqual(summary['diverted_by_bound'], 0)

    def test_extension_goes_elsewhere_over_the_bound(self):
        # Turns of one conversation arrive while the earlier ones are still
        # decoding.  With 2 replicas, factor 1.25 and slack 2, replica 0 may
        # hold 4 requests while replica 1 is idle (4 <= max(1.25 × 2,
        # 2 + 2)) but not 5 (5 > max(1.25 × 2.5, 2.5 + 2)).
        records = [record([0, 1], 1024, 1000, 0)] + [
            record([0, 1, 2 + k], 1536, 1000, 1000 * (k + 1))
            for k in range(4)]
        summary, jobs = bounds.simulate(bounds.prepare_requests(records),
                                        'oracle', 2, slow_params())
        self.assertEqual([j.replica for j in jobs], [0, 0, 0, 0, 1])
        self.assertEqual([j.cached_tokens for j in jobs],
                         [0, 1024, 1024, 1024, 0])
        self.assertEqual(summary['diverted_by_bound'], 1)
        self.assertEqual(summary['peak_inflight'], [4, 1])
        # the last turn moved because its replica was full: not unforced
        self.assertEqual([j.could_stay for j in jobs],
                         [None, True, True, True, False])
        self.assertEqual(summary['session_moves']['moves'], 1)
        self.assertEqual(summary['session_moves']['unforced_moves'], 0)
        self.assertEqual(summary['unforced_moved_share_per_min'], 0)

    def test_unforced_moves_are_those_the_load_did_not_call_for(self):
        # (session, time, replica, could the previous replica take it)
        events = [('a', 0, 0, None), ('a', 10, 1, True), ('a', 20, 2, False),
                  ('b', 5, 0, None), ('b', 70, 0, True),
                  ('c', 65, 3, None), ('c', 80, 1, True)]
        moves = trace.session_moves(events)
        self.assertEqual((moves['moves'], moves['unforced_moves']), (3, 2))
        # windows: a and b active in the first minute, b and c in the
        # second; a moved unforced in the first, c in the second
        self.assertEqual(moves['active_session_windows'], 4)
        self.assertEqual(moves['moved_session_share_per_min'], 2 / 4)
        self.assertEqual(moves['unforced_moved_share_per_min'], 2 / 4)
        self.assertIsNone(trace.session_moves(
            [(s, t, r) for s, t, r, _ in events])[
                'unforced_moved_share_per_min'])

    def test_routes_are_given_by_request_index(self):
        # bounds.py's document says where the oracle sent each request, by
        # the request's index in the workload (replay.py --routes).
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / 'trace.jsonl'
            records = [record([0, 1], 1024, 1000, 0)] + [
                record([0, 1, 2 + k], 1536, 1000, 1000 * (k + 1))
                for k in range(4)]
            path.write_text(''.join(json.dumps(r) + '\n'
                                    for r in [record([7], 600)] + records))
            doc = bounds.compute(bounds.parse_args([
                '--trace', str(path), '--start', '1', '--limit', '5',
                '--replicas', '2', '--max-running', '4',
                '--cache-tokens', '100000', '--policies', 'oracle']))
        routes = doc['oracle_routes']
        self.assertEqual(sorted(routes, key=int), ['1', '2', '3', '4', '5'])
        counts = [list(routes.values()).count(r) for r in (0, 1)]
        self.assertEqual(counts, doc['oracle']['replica_requests'])
        # the conversation stays on the replica of its first turn until the
        # bound sends its last turn elsewhere
        self.assertEqual(len({routes[str(i)] for i in range(1, 5)}), 1)
        self.assertNotEqual(routes['5'], routes['1'])

    def test_load_bound(self):
        self.assertEqual(fleet.load_bound(3, 2), 4.0)
        self.assertEqual(fleet.load_bound(59, 4, 1.25, 2), 18.75)


# --- replay against a tiny server ------------------------------------------

class FakeFleet:
    """An HTTP server in its own thread that answers chat requests with SSE
    and an X-Replica header, and /rN/stats and /rN/reset like the mock.
    The answer depends on max_tokens, so that tests can predict it: 13
    fails with 503; otherwise the replica is replica-1 for even values and
    replica-2 for odd ones, which are also sent without chunked encoding,
    and cached_tokens is 16 × max_tokens.  X-Replica-TTFT is max_tokens
    milliseconds on replica-1, not a number on replica-2, and a second on
    the failed answer."""

    FAIL_MAX_TOKENS = 13

    def __init__(self):
        self.accepted = 0
        self.received = []          # (connection number, session, body)
        self.routed = []            # X-Bench-Replica of each chat request
        self.sent_usage = []        # (prompt, cached) of 200 answers
        self.resets = []
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.thread.start()
        self.ready.wait(5)
        return self

    def __exit__(self, *exc):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(
            self._handle, '127.0.0.1', 0, limit=2 ** 20))
        self.port = self.server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()
        self.server.close()

    async def _handle(self, reader, writer):
        number = self.accepted      # connections are numbered as accepted
        self.accepted += 1
        head = (await reader.readuntil(b'\r\n\r\n')).decode('latin-1')
        lines = head.split('\r\n')
        method, path, _ = lines[0].split(' ')
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(':')
                headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers['content-length']))
        if path.endswith('/stats'):
            name = 'replica-' + path[2]
            self._send(writer, 'application/json', json.dumps(
                {'replica': name, 'peak_inflight': int(path[2]) + 4,
                 'requests_total': 3}).encode())
        elif path.endswith('/reset'):
            self.resets.append(path)
            self._send(writer, 'application/json', b'{}')
        else:
            await self._chat(writer, number, headers, json.loads(body))
        await writer.drain()
        writer.close()

    def _send(self, writer, content_type, body, status='200 OK', extra=''):
        writer.write(('HTTP/1.1 %s\r\nContent-Type: %s\r\n%s'
                      'Content-Length: %d\r\nConnection: close\r\n\r\n'
                      % (status, content_type, extra, len(body))).encode()
                     + body)

    async def _chat(self, writer, number, headers, body):
        self.received.append((number, headers.get('x-session-id'), body))
        self.routed.append(headers.get('x-bench-replica'))
        max_tokens = body['max_tokens']
        if max_tokens == self.FAIL_MAX_TOKENS:
            self._send(writer, 'application/json', b'{"error":"busy"}',
                       '503 Service Unavailable', 'X-Replica-TTFT: 1\r\n')
            return
        prompt = len(body['messages'][0]['content']) // 4
        cached = 16 * max_tokens
        self.sent_usage.append((prompt, cached))
        events = [
            {'choices': [{'index': 0, 'delta': {'role': 'assistant'}}]},
            {'choices': [{'index': 0, 'delta': {'content': 'Hi'}}],
             'usage': None},
            {'choices': [], 'usage': {
                'prompt_tokens': prompt, 'completion_tokens': 2,
                'prompt_tokens_details': {'cached_tokens': cached}}}]
        payloads = [b'data: ' + json.dumps(e).encode() + b'\n\n'
                    for e in events] + [b'data: [DONE]\n\n']
        chunked = max_tokens % 2 == 0
        own_ttft = '%g' % (max_tokens / 1000) if chunked else 'soon'
        writer.write(('HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n'
                      'X-Replica: replica-%d\r\nX-Replica-TTFT: %s\r\n'
                      '%sConnection: close\r\n\r\n'
                      % (max_tokens % 2 + 1, own_ttft,
                         'Transfer-Encoding: chunked\r\n'
                         if chunked else '')).encode())
        for payload in payloads:
            # Events split across writes, to exercise the SSE buffering.
            for piece in (payload[:7], payload[7:]):
                writer.write(b'%x\r\n%s\r\n' % (len(piece), piece)
                             if chunked else piece)
                await writer.drain()
                await asyncio.sleep(0.001)
        if chunked:
            writer.write(b'0\r\n\r\n')


class StreamWatcherTest(unittest.TestCase):

    def test_events_split_anywhere(self):
        stream = (b'data: {"choices":[{"delta":{"role":"assistant"}}]}\r\n\r\n'
                  b': comment\n\n'
                  b'data: {"choices":[{"delta":{"content":"A"}}]}\n\n'
                  b'data: {"choices":[{"delta":{"content":"B"}}]}\n\n'
                  b'data: {"choices":[],"usage":{"prompt_tokens":9,'
                  b'"prompt_tokens_details":{"cached_tokens":4}}}\n\n'
                  b'data: [DONE]\n\n')
        first_content = stream.index(b'"A"')
        watcher = replay.StreamWatcher()
        for at, byte in enumerate(stream):
            watcher.feed(bytes([byte]), at)
        # The event counts when its line is complete.
        self.assertGreater(watcher.first_content_at, first_content)
        self.assertLess(watcher.first_content_at, stream.index(b'"B"'))
        self.assertEqual((watcher.prompt_tokens, watcher.cached_tokens),
                         (9, 4))


class SpreaderTest(unittest.TestCase):
    """Which instance a request goes to (ReplayOptions.target_of)."""

    URLS = ','.join('http://127.0.0.1:%d/v1/chat/completions' % port
                    for port in (9001, 9002, 9003, 9004))

    def requests(self):
        return [workloads.Request(i, 0.0, 'session-%d' % (i % 40), 8)
                for i in range(400)]

    def test_at_random_a_session_meets_several_instances(self):
        options = replay.ReplayOptions(self.URLS)
        by_session = {}
        for r in self.requests():
            by_session.setdefault(r.session, set()).add(
                options.target_of(r))
        self.assertGreater(min(len(t) for t in by_session.values()), 1)
        # the same for a request index in every run
        again = replay.ReplayOptions(self.URLS)
        self.assertEqual([options.target_of(r) for r in self.requests()],
                         [again.target_of(r) for r in self.requests()])

    def test_by_client_a_session_stays_on_one_instance(self):
        options = replay.ReplayOptions(self.URLS, spread='client')
        by_session = {}
        for r in self.requests():
            by_session.setdefault(r.session, set()).add(
                options.target_of(r))
        self.assertEqual({len(t) for t in by_session.values()}, {1})
        # and the sessions are spread over every instance
        used = set().union(*by_session.values())
        self.assertEqual(len(used), 4)


class ReplayTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        # output_length is the fake fleet's max_tokens: it picks the
        # replica (even: replica-1, odd: replica-2), 13 fails.
        self.records = [
            record([0, 1], 1000, 4, 0),
            record([0, 2], 900, 5, 0),          # same time: trace order kept
            record([0, 1, 3], 1500, 6, 40),
            record([0, 4], 700, FakeFleet.FAIL_MAX_TOKENS, 60),
            record(range(200, 200 + 196), 100000, 8, 80),   # a 400 KB body
            record([0, 1, 3, 5], 2000, 9, 100),
        ]
        self.trace_path = Path(self.tmp.name) / 'trace.jsonl'
        lines = [json.dumps(r) + '\n'
                 for r in [record([0, 99], 600)] + self.records]
        self.trace_path.write_text(''.join(lines))

    def run_replay(self, port, *extra):
        output = Path(self.tmp.name) / 'result.json'
        argv = ['--url', 'http://127.0.0.1:%d/v1/chat/completions' % port,
                '--trace', str(self.trace_path), '--start', '1',
                '--speed', '2', '--label', 'unit', '--output', str(output),
                '--timeout', '10'] + list(extra)
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            replay.main(argv)
        return json.loads(output.read_text()), stdout.getvalue()

    def test_replay_against_a_fake_fleet(self):
        with FakeFleet() as fleet:
            stats = ','.join('http://127.0.0.1:%d/r%d/stats' % (fleet.port, n)
                             for n in (1, 2))
            doc, printed = self.run_replay(fleet.port, '--session-header',
                                           '--stats-urls', stats)
        expected_sessions = [trace.session_id(r, 1 + n)
                             for n, r in enumerate(self.records)]
        received = sorted(fleet.received, key=lambda item: item[0])
        self.assertEqual([s for _, s, _ in received], expected_sessions)
        self.assertEqual([b['max_tokens'] for _, _, b in received],
                         [r['output_length'] for r in self.records])
        self.assertEqual([len(b['messages'][0]['content'])
                          for _, _, b in received],
                         [4 * r['input_length'] for r in self.records])
        self.assertEqual(sorted(fleet.resets), ['/r1/reset', '/r2/reset'])

        summary = doc['summary']
        self.assertEqual(summary['requests'], 6)
        self.assertEqual(summary['errors'], 1)
        self.assertEqual(summary['error_kinds'], {'HTTP 503': 1})
        prompt = sum(p for p, _ in fleet.sent_usage)
        cached = sum(c for _, c in fleet.sent_usage)
        self.assertEqual(summary['prompt_tokens'], prompt)
        self.assertAlmostEqual(summary['hit_ratio'], cached / prompt)
        # The failed answer names no replica.
        self.assertEqual(summary['replica_requests'],
                         {'replica-1': 3, 'replica-2': 2})
        self.assertEqual(summary['replica_requests_max'], 3)
        self.assertEqual(summary['server_peak_inflight'],
                         {'replica-1': 5, 'replica-2': 6})
        self.assertEqual(summary['server_peak_inflight_mean'], 5.5)
        self.assertGreaterEqual(summary['client_peak_inflight_max'], 1)
        self.assertEqual(doc['config']['speed'], 2.0)
        self.assertIn('unit: 6 requests, 1 errors', printed)
        # conv-1 went to replica-1, replica-1, then replica-2: one move
        self.assertEqual(summary['session_moves']['moves'], 1)
        self.assertEqual(summary['session_moves']['sessions'], 3)
        self.assertEqual(summary['moves_per_min'], 1 / 3)

        requests = doc['requests']
        self.assertEqual([r['i'] for r in requests], [1, 2, 3, 4, 5, 6])
        self.assertEqual([r['at'] for r in requests],
                         [0.0, 0.0, 0.02, 0.03, 0.04, 0.05])
        ok = [r for r in requests if r['status'] == 200]
        self.assertTrue(all(0 < r['ttft'] <= r['end'] - r['send']
                            for r in ok))
        ttfts = sorted(r['ttft'] for r in ok)
        self.assertAlmostEqual(summary['ttft_wall_s']['p50'], ttfts[2],
                               places=5)
        self.assertAlmostEqual(summary['ttft_trace_s']['p50'],
                               2 * ttfts[2], places=5)
        # The replicas' own figures, where one is given, times the speed;
        # the failed answer's is not counted.
        own = [b['max_tokens'] / 1000 for _, _, b in received
               if b['max_tokens'] % 2 == 0]
        self.assertEqual([r['replica_ttft'] for r in ok
                          if r['replica'] == 'replica-2'], [None, None])
        self.assertAlmostEqual(summary['replica_ttft_trace_s']['p50'],
                               2 * trace.percentile(own, 50), places=6)

    def test_routes_name_each_requests_replica(self):
        # --routes: each request carries the replica number its index maps
        # to; requests the file does not name carry none.
        routes = Path(self.tmp.name) / 'routes.json'
        routes.write_text(json.dumps({'1': 3, '2': 0, '4': 7, '6': 1}))
        with FakeFleet() as fleet:
            doc, _ = self.run_replay(fleet.port, '--routes', str(routes))
        by_tokens = {b['max_tokens']: r
                     for (_, _, b), r in zip(fleet.received, fleet.routed)}
        self.assertEqual([by_tokens[r['output_length']]
                          for r in self.records],
                         ['3', '0', None, '7', None, '1'])
        self.assertTrue(doc['config']['routes'])

    def test_failed_connections_are_errors(self):
        with FakeFleet() as fleet:
            port = fleet.port
        # The fleet is gone: every connection is refused.
        doc, _ = self.run_replay(port, '--limit', '2')
        self.assertEqual(doc['summary']['requests'], 2)
        self.assertEqual(doc['summary']['errors'], 2)
        self.assertIsNone(doc['summary']['hit_ratio'])
        self.assertEqual(doc['summary']['replica_requests'], {})


if __name__ == '__main__':
    unittest.main()
