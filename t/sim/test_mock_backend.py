"""Tests of bench/sim/mock_backend.py through real HTTP.

The mock is started as a subprocess on ports it picks itself (port 0, so no
other process can take them between choosing and binding), and every
expected cache figure is computed with the functions of bench/sim/model.py,
so that the mock is checked against the model it claims to implement.

Run from the repository root:
    python3 -m unittest discover -s t/sim -t .
"""

import http.client
import json
import os
import signal
import socket
import tempfile
import threading
import time
import unittest

from bench.sim import model
from bench.sim.mock_backend import MockProcess

HOST = '127.0.0.1'
BLOCK = model.BLOCK_TOKENS


# ---------------------------------------------------------------------------
# Prompts and expectations, from the model
# ---------------------------------------------------------------------------

def block_text(blocks, seed):
    """ASCII text of exactly `blocks` full cache blocks, unique per seed."""
    chars = blocks * model.BLOCK_CHARS
    unit = '<%s>' % seed
    text = unit
    counter = 0
    while len(text) < chars:
        text += '%s%05d ' % (seed, counter)
        counter += 1
    return text[:chars]


def chat_prompt_text(messages):
    """The prompt the mock builds from chat messages (the rule it documents)."""
    pieces = []
    for message in messages:
        content = message['content']
        if isinstance(content, list):
            content = ''.join(part['text'] for part in content
                              if part['type'] in ('text', 'input_text'))
        pieces.append(message['role'] + '\n' + content + '\n')
    return ''.join(pieces)


def expected_cached(earlier_prompts, prompt):
    """Cached tokens of `prompt` after `earlier_prompts` on a large cache."""
    cache = model.PrefixCache(1 << 20)
    for earlier in earlier_prompts:
        cache.insert(model.block_chain(earlier))
    return model.cached_tokens(cache, model.block_chain(prompt),
                               model.prompt_tokens(prompt))


# ---------------------------------------------------------------------------
# HTTP helpers
# ---------------------------------------------------------------------------

def request(port, method, path, body=None, headers=None):
    """One request on a new connection: (status, headers, body bytes)."""
    conn = http.client.HTTPConnection(HOST, port, timeout=20)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response, response.read()
    finally:
        conn.close()


def post_json(port, path, body, headers=None):
    """POSTs body; returns (status, response, decoded JSON)."""
    status, response, data = request(port, 'POST', path, body, headers)
    return status, response, json.loads(data)


def complete(port, prompt, max_tokens=1):
    """A non-streamed completion; returns its usage."""
    status, _, reply = post_json(port, '/v1/completions',
                                 {'prompt': prompt, 'max_tokens': max_tokens})
    assert status == 200, reply
    return reply['usage']


def stats(port):
    status, _, data = request(port, 'GET', '/stats')
    assert status == 200
    return json.loads(data)


def stream(port, path, body):
    """A streamed request: (response, [(seconds since sent, event name,
    data text)]).  Time zero is just before the request is sent."""
    conn = http.client.HTTPConnection(HOST, port, timeout=20)
    try:
        started = time.monotonic()
        conn.request('POST', path, body=json.dumps(body),
                     headers={'Content-Type': 'application/json'})
        response = conn.getresponse()
        events = []
        event_name = None
        while True:
            line = response.readline()
            if not line:
                break
            line = line.decode().rstrip('\n')
            if line.startswith('event: '):
                event_name = line[len('event: '):]
            elif line.startswith('data: '):
                events.append((time.monotonic() - started, event_name,
                               line[len('data: '):]))
                event_name = None
            else:
                assert line == '', 'unexpected SSE line %r' % line
        return response, events
    finally:
        conn.close()


def raw_exchange(port, data, read_until_close=True):
    """Sends raw bytes; returns what the server sent until it closed (or
    until a pause, when not expecting a close)."""
    with socket.create_connection((HOST, port), timeout=5) as sock:
        sock.sendall(data)
        received = b''
        if not read_until_close:
            sock.settimeout(0.5)
        try:
            while True:
                piece = sock.recv(65536)
                if not piece:
                    return received, True
                received += piece
        except socket.timeout:
            return received, False


def parse_metrics(text):
    """{(name, labels): value} and the HELP/TYPE names of Prometheus text."""
    samples = {}
    described = {'HELP': set(), 'TYPE': set()}
    for line in text.splitlines():
        if line.startswith('# '):
            kind, name = line.split()[1:3]
            described[kind].add(name)
        elif line:
            series, value = line.rsplit(' ', 1)
            name, _, labels = series.partition('{')
            samples[(name, '{' + labels)] = float(value)
    return samples, described


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------

class InferenceTest(unittest.TestCase):
    """Cache accounting, wire formats and HTTP handling, at a time scale
    small enough for timing not to matter."""

    @classmethod
    def setUpClass(cls):
        cls.mock = MockProcess([0] * 2, '--time-scale', '0.001')
        cls.port, cls.other_port = cls.mock.ports

    @classmethod
    def tearDownClass(cls):
        cls.mock.stop()

    def setUp(self):
        for port in self.mock.ports:
            request(port, 'POST', '/reset')

    def test_extension_reuses_the_shared_full_blocks(self):
        first = block_text(10, 'extend')
        second = first + block_text(3, 'more')
        self.assertEqual(complete(self.port, first)['prompt_tokens_details'],
                         {'cached_tokens': 0})
        usage = complete(self.port, second)
        self.assertEqual(usage['prompt_tokens_details']['cached_tokens'],
                         10 * BLOCK)
        self.assertEqual(usage['prompt_tokens_details']['cached_tokens'],
                         expected_cached([first], second))
        self.assertEqual(usage['prompt_tokens'], model.prompt_tokens(second))

    def test_partial_last_block_is_not_cached(self):
        first = block_text(10, 'partial') + 'x' * 40
        second = first + block_text(2, 'tail')
        complete(self.port, first)
        usage = complete(self.port, second)
        self.assertEqual(usage['prompt_tokens_details']['cached_tokens'],
                         10 * BLOCK)

    def test_repeated_prompt_is_fully_cached(self):
        prompt = block_text(10, 'again')
        complete(self.port, prompt)
        usage = complete(self.port, prompt)
        self.assertEqual(usage['prompt_tokens_details']['cached_tokens'],
                         usage['prompt_tokens'])

    def test_different_prefix_misses(self):
        complete(self.port, block_text(10, 'one'))
        usage = complete(self.port, block_text(10, 'two') + block_text(3, 'one'))
        self.assertEqual(usage['prompt_tokens_details']['cached_tokens'], 0)

    def test_replicas_do_not_share_caches(self):
        prompt = block_text(10, 'shared')
        complete(self.port, prompt)
        other = complete(self.other_port, prompt)
        self.assertEqual(other['prompt_tokens_details']['cached_tokens'], 0)
        again = complete(self.port, prompt)
        self.assertEqual(again['prompt_tokens_details']['cached_tokens'],
                         10 * BLOCK)
        self.assertEqual(stats(self.port)['cache_blocks'], 10)
        self.assertEqual(stats(self.other_port)['cache_blocks'], 10)

    def test_chat_turn_extends_the_previous_prompt(self):
        turn1 = [{'role': 'system', 'content': block_text(20, 'system')},
                 {'role': 'user', 'content': 'What is a prefix cache?'}]
        turn2 = turn1 + [
            {'role': 'assistant', 'content': block_text(4, 'answer')},
            {'role': 'user', 'content': [
                {'type': 'text', 'text': 'And '},
                {'type': 'image_url', 'image_url': {'url': 'x'}},
                {'type': 'input_text', 'text': 'eviction?'}]}]
        status, _, first = post_json(self.port, '/v1/chat/completions',
                                     {'messages': turn1, 'max_tokens': 3})
        self.assertEqual(status, 200)
        self.assertEqual(first['usage']['prompt_tokens'],
                         model.prompt_tokens(chat_prompt_text(turn1)))
        status, _, second = post_json(self.port, '/v1/chat/completions',
                                      {'messages': turn2,
                                       'max_completion_tokens': 5})
        expected = expected_cached([chat_prompt_text(turn1)],
                                   chat_prompt_text(turn2))
        self.assertGreater(expected, 0)
        usage = second['usage']
        self.assertEqual(usage['prompt_tokens_details']['cached_tokens'],
                         expected)
        self.assertEqual(usage['prompt_tokens'],
                         model.prompt_tokens(chat_prompt_text(turn2)))
        self.assertEqual(usage['completion_tokens'], 5)
        self.assertEqual(usage['total_tokens'], usage['prompt_tokens'] + 5)
        choice = second['choices'][0]
        self.assertEqual(second['object'], 'chat.completion')
        self.assertEqual(choice['message']['role'], 'assistant')
        self.assertEqual(len(choice['message']['content']),
                         5 * model.CHARS_PER_TOKEN)
        self.assertEqual(choice['finish_reason'], 'length')

    def test_default_output_is_16_tokens(self):
        status, _, reply = post_json(self.port, '/v1/chat/completions', {
            'messages': [{'role': 'user', 'content': 'hi'}]})
        self.assertEqual(status, 200)
        self.assertEqual(reply['usage']['completion_tokens'], 16)

    def test_completions_endpoint(self):
        prompt = block_text(6, 'completion')
        complete(self.port, prompt)
        status, _, reply = post_json(self.port, '/v1/completions', {
            'model': 'm', 'prompt': [prompt + 'tail', 'ignored'],
            'max_tokens': 7})
        self.assertEqual(status, 200)
        self.assertEqual(reply['object'], 'text_completion')
        self.assertEqual(reply['model'], 'm')
        self.assertEqual(len(reply['choices'][0]['text']),
                         7 * model.CHARS_PER_TOKEN)
        self.assertEqual(reply['usage']['completion_tokens'], 7)
        self.assertEqual(
            reply['usage']['prompt_tokens_details']['cached_tokens'], 6 * BLOCK)

    def test_responses_endpoint(self):
        instructions = block_text(8, 'instructions')
        first = {'instructions': instructions, 'input': 'hello',
                 'max_output_tokens': 4}
        status, _, reply = post_json(self.port, '/v1/responses', first)
        self.assertEqual(status, 200)
        self.assertEqual(reply['object'], 'response')
        self.assertEqual(reply['status'], 'completed')
        text = reply['output'][0]['content'][0]['text']
        self.assertEqual(len(text), 4 * model.CHARS_PER_TOKEN)
        self.assertEqual(reply['usage']['output_tokens'], 4)
        self.assertEqual(reply['usage']['input_tokens_details'],
                         {'cached_tokens': 0})
        items = [{'role': 'user', 'content': [
                    {'type': 'input_text', 'text': 'hello ' * 30}]},
                 {'role': 'assistant', 'content': 'sure'}]
        status, _, reply = post_json(self.port, '/v1/responses', {
            'instructions': instructions, 'input': items})
        prompt = instructions + '\n' + chat_prompt_text(
            [{'role': 'user', 'content': 'hello ' * 30},
             {'role': 'assistant', 'content': 'sure'}])
        self.assertEqual(reply['usage']['input_tokens'],
                         model.prompt_tokens(prompt))
        self.assertEqual(reply['usage']['input_tokens_details'],
                         {'cached_tokens': expected_cached(
                             [instructions + '\nhello'], prompt)})
        self.assertEqual(reply['usage']['input_tokens_details'],
                         {'cached_tokens': 8 * BLOCK})
        self.assertEqual(reply['usage']['output_tokens'], 16)

    def test_chat_stream(self):
        response, events = stream(self.port, '/v1/chat/completions', {
            'messages': [{'role': 'user', 'content': block_text(5, 'sse')}],
            'max_tokens': 50, 'stream': True})
        self.assertEqual(response.status, 200)
        self.assertEqual(response.getheader('Content-Type'),
                         'text/event-stream')
        self.assertEqual(events[-1][2], '[DONE]')
        chunks = [json.loads(data) for _, _, data in events[:-1]]
        for chunk in chunks:
            self.assertEqual(chunk['object'], 'chat.completion.chunk')
        self.assertEqual(chunks[0]['choices'][0]['delta']['role'], 'assistant')
        content_chunks = [c for c in chunks if c['choices']
                          and c['choices'][0]['delta'].get('content')]
        self.assertLessEqual(len(content_chunks), 8)
        content = ''.join(c['choices'][0]['delta']['content']
                          for c in content_chunks)
        self.assertEqual(len(content), 50 * model.CHARS_PER_TOKEN)
        finished = [c for c in chunks
                    if c['choices'] and c['choices'][0]['finish_reason']]
        self.assertEqual(len(finished), 1)
        usage = chunks[-1]
        self.assertEqual(usage['choices'], [])
        self.assertEqual(usage['usage']['completion_tokens'], 50)
        self.assertEqual(usage['usage']['prompt_tokens_details'],
                         {'cached_tokens': 0})

    def test_completions_stream(self):
        _, events = stream(self.port, '/v1/completions', {
            'prompt': 'once upon a time', 'max_tokens': 3, 'stream': True})
        self.assertEqual(events[-1][2], '[DONE]')
        chunks = [json.loads(data) for _, _, data in events[:-1]]
        self.assertTrue(all(c['object'] == 'text_completion' for c in chunks))
        text = ''.join(c['choices'][0]['text'] for c in chunks if c['choices'])
        self.assertEqual(len(text), 3 * model.CHARS_PER_TOKEN)
        self.assertEqual(chunks[-1]['choices'], [])
        self.assertEqual(chunks[-1]['usage']['completion_tokens'], 3)

    def test_responses_stream(self):
        _, events = stream(self.port, '/v1/responses', {
            'input': 'hello', 'max_output_tokens': 5, 'stream': True})
        names = [name for _, name, _ in events]
        payloads = [json.loads(data) for _, _, data in events]
        self.assertEqual([p['type'] for p in payloads], names)
        self.assertEqual(names[0], 'response.created')
        self.assertEqual(names[-1], 'response.completed')
        self.assertEqual(set(names[1:-1]), {'response.output_text.delta'})
        text = ''.join(p['delta'] for p in payloads[1:-1])
        self.assertEqual(len(text), 5 * model.CHARS_PER_TOKEN)
        completed = payloads[-1]['response']
        self.assertEqual(completed['usage']['output_tokens'], 5)
        self.assertEqual(completed['output'][0]['content'][0]['text'], text)

    def test_metrics_after_known_traffic(self):
        first = block_text(10, 'metrics')
        complete(self.port, first)
        complete(self.port, first + block_text(3, 'metrics-more'))
        complete(self.port, block_text(5, 'metrics-other'))
        post_json(self.port, '/v1/completions', {'prompt': 3})  # rejected
        status, response, data = request(self.port, 'GET', '/metrics')
        self.assertEqual(status, 200)
        self.assertTrue(response.getheader('Content-Type').startswith(
            'text/plain'))
        samples, described = parse_metrics(data.decode())
        label = '{replica="%s"}' % self.mock.names[0]
        expected = {
            'mock_requests_total': 3,
            'mock_prompt_tokens_total': (10 + 13 + 5) * BLOCK,
            'mock_cached_tokens_total': 10 * BLOCK,
            'mock_cache_hits_total': 1,
            'mock_cache_misses_total': 2,
            'mock_running': 0,
            'mock_waiting': 0,
            'mock_peak_inflight': 1,
            'mock_cache_blocks': 13 + 5,
        }
        for name, value in expected.items():
            self.assertIn(name, described['HELP'])
            self.assertIn(name, described['TYPE'])
            self.assertEqual(samples[(name, label)], value, name)
        figures = stats(self.port)
        for name, value in expected.items():
            self.assertEqual(figures[name[len('mock_'):]], value, name)

    def test_reset_clears_cache_and_counters(self):
        prompt = block_text(10, 'reset')
        complete(self.port, prompt)
        complete(self.port, prompt)
        status, _, reply = post_json(self.port, '/reset', None)
        self.assertEqual(status, 200)
        figures = stats(self.port)
        for name in ('requests_total', 'prompt_tokens_total',
                     'cached_tokens_total', 'cache_hits_total',
                     'cache_misses_total', 'peak_inflight', 'cache_blocks'):
            self.assertEqual(figures[name], 0, name)
        usage = complete(self.port, prompt)
        self.assertEqual(usage['prompt_tokens_details']['cached_tokens'], 0)

    def test_bad_input_is_answered_and_serving_goes_on(self):
        conn = http.client.HTTPConnection(HOST, self.port, timeout=10)
        bad_bodies = ['{not json', '[1, 2]', '{"messages": []}',
                      '{"messages": "text"}',
                      '{"messages": [{"role": "user", "content": "x"}], '
                      '"max_tokens": -1}',
                      '{"messages": [{"role": "user", "content": {"a": 1}}]}',
                      '{"messages": [{"role": "user", "content": "\\ud800"}]}',
                      '[' * 100000, '\xff\xfe']
        try:
            for body in bad_bodies:
                conn.request('POST', '/v1/chat/completions',
                             body=body.encode('latin-1'))
                response = conn.getresponse()
                error = json.loads(response.read())
                self.assertEqual(response.status, 400, body[:40])
                self.assertIn('message', error['error'])
            conn.request('POST', '/v1/completions', body='{}')
            response = conn.getresponse()
            response.read()
            self.assertEqual(response.status, 400)
            conn.request('POST', '/v1/completions',
                         body=json.dumps({'prompt': 'fine'}))
            response = conn.getresponse()
            response.read()
            self.assertEqual(response.status, 200)
        finally:
            conn.close()
        self.assertEqual(request(self.port, 'GET', '/nowhere')[0], 404)
        self.assertEqual(request(self.port, 'GET', '/v1/completions')[0], 405)
        received, closed = raw_exchange(self.port, b'NONSENSE\r\n\r\n')
        self.assertTrue(received.startswith(b'HTTP/1.1 400 '))
        self.assertTrue(closed)
        self.assertEqual(stats(self.port)['requests_total'], 1)

    def test_every_response_names_its_replica(self):
        for port, name in zip(self.mock.ports, self.mock.names):
            for method, path, body in (
                    ('POST', '/v1/completions', '{"prompt": "hi"}'),
                    ('POST', '/v1/completions', '{'),
                    ('GET', '/metrics', None),
                    ('GET', '/missing', None)):
                _, response, _ = request(port, method, path, body,
                                         {'X-Session-ID': 'session-1'})
                self.assertEqual(response.getheader('X-Replica'), name)
                self.assertEqual(response.getheader('X-Replica-Port'),
                                 str(port))
                self.assertIsNone(response.getheader('X-Session-ID'))
        self.assertEqual(self.mock.names, ['replica-1', 'replica-2'])

    def test_chunked_request_body(self):
        prompt = block_text(12, 'chunked')
        body = json.dumps({'prompt': prompt}).encode()
        pieces = [body[i:i + 100] for i in range(0, len(body), 100)]
        conn = http.client.HTTPConnection(HOST, self.port, timeout=10)
        try:
            for expected in (0, 12 * BLOCK):
                conn.request('POST', '/v1/completions', body=iter(pieces),
                             encode_chunked=True)
                response = conn.getresponse()
                reply = json.loads(response.read())
                self.assertEqual(response.status, 200)
                self.assertEqual(
                    reply['usage']['prompt_tokens_details']['cached_tokens'],
                    expected)
        finally:
            conn.close()

    def test_connection_close_is_honoured(self):
        body = b'{"prompt": "hi", "max_tokens": 1}'
        received, closed = raw_exchange(
            self.port,
            b'POST /v1/completions HTTP/1.1\r\nHost: x\r\n'
            b'Connection: close\r\nContent-Length: %d\r\n\r\n%s'
            % (len(body), body))
        self.assertTrue(closed)
        self.assertIn(b'\r\nConnection: close\r\n', received)
        self.assertEqual(received.count(b'HTTP/1.1 200 OK'), 1)

    def test_http10_keeps_alive_only_when_asked(self):
        body = b'{"prompt": "hi", "max_tokens": 1}'
        plain = (b'POST /v1/completions HTTP/1.0\r\n'
                 b'Content-Length: %d\r\n\r\n%s' % (len(body), body))
        received, closed = raw_exchange(self.port, plain)
        self.assertTrue(closed)
        self.assertIn(b'"text_completion"', received)
        kept = (b'POST /v1/completions HTTP/1.0\r\nConnection: keep-alive\r\n'
                b'Content-Length: %d\r\n\r\n%s' % (len(body), body))
        received, closed = raw_exchange(self.port, kept * 2,
                                        read_until_close=False)
        self.assertFalse(closed)
        self.assertEqual(received.count(b'HTTP/1.1 200 OK'), 2)

    def test_http10_stream_is_not_chunked(self):
        body = json.dumps({'prompt': 'hi', 'max_tokens': 4,
                           'stream': True}).encode()
        received, closed = raw_exchange(
            self.port, b'POST /v1/completions HTTP/1.0\r\n'
            b'Content-Length: %d\r\n\r\n%s' % (len(body), body))
        self.assertTrue(closed)
        head, _, payload = received.partition(b'\r\n\r\n')
        self.assertNotIn(b'chunked', head.lower())
        self.assertTrue(payload.startswith(b'data: {'))
        self.assertTrue(payload.endswith(b'data: [DONE]\n\n'))


class TimingTest(unittest.TestCase):
    """Time to first token follows the prefill time of the uncached tokens:
    0.1 ms per token at time scale 1, so 1000 tokens take 0.1 s."""

    PREFILL_MS = 0.1
    DECODE_MS = 2.0

    @classmethod
    def setUpClass(cls):
        cls.mock = MockProcess([0], '--prefill-ms-per-token', str(cls.PREFILL_MS),
                               '--decode-ms-per-token', str(cls.DECODE_MS))
        cls.port = cls.mock.ports[0]

    @classmethod
    def tearDownClass(cls):
        cls.mock.stop()

    def setUp(self):
        request(self.port, 'POST', '/reset')

    def ttft(self, prompt, max_tokens=2):
        """(time to first token, usage) of a streamed completion."""
        _, events = stream(self.port, '/v1/completions', {
            'prompt': prompt, 'max_tokens': max_tokens, 'stream': True})
        return events[0][0], json.loads(events[-2][2])['usage']

    def test_ttft_grows_with_uncached_prompt_length(self):
        small, _ = self.ttft(block_text(62, 'small'))       # 992 tokens
        large_prompt = block_text(250, 'large')             # 4000 tokens
        large, _ = self.ttft(large_prompt)
        cached, usage = self.ttft(large_prompt)
        self.assertEqual(usage['prompt_tokens_details']['cached_tokens'], 4000)
        self.assertGreaterEqual(small, 0.09)
        self.assertGreaterEqual(large, 0.39)
        self.assertGreater(large - small, 0.2)
        self.assertLess(large, 0.4 + 0.25)
        self.assertLess(cached, 0.05)

    def test_first_chunk_comes_before_the_end(self):
        _, events = stream(self.port, '/v1/chat/completions', {
            'messages': [{'role': 'user', 'content': 'tell me'}],
            'max_tokens': 100, 'stream': True})
        decode = 100 * self.DECODE_MS / 1000
        first, last = events[0][0], events[-1][0]
        self.assertGreater(last - first, decode * 0.8)
        self.assertLess(first, decode * 0.5)
        self.assertGreater(len({round(t, 2) for t, _, _ in events}), 3)

    def test_prefill_lane_serves_one_request_at_a_time(self):
        prompts = [block_text(125, 'lane-a'), block_text(125, 'lane-b')]
        results = [None, None]

        def run(index):
            results[index] = self.ttft(prompts[index])[0]

        threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        prefill = 2000 * self.PREFILL_MS / 1000                  # 0.2 s each
        self.assertGreaterEqual(min(results), prefill * 0.95)
        self.assertGreaterEqual(max(results), 2 * prefill * 0.95)

    def test_non_streamed_reply_comes_after_decode(self):
        started = time.monotonic()
        complete(self.port, 'short', max_tokens=100)
        self.assertGreaterEqual(time.monotonic() - started,
                                100 * self.DECODE_MS / 1000 * 0.95)


class QueueTest(unittest.TestCase):
    """--max-running 2 with 5 slow requests: 2 run, 3 wait, in 3 waves."""

    MAX_RUNNING = 2
    REQUESTS = MAX_RUNNING + 3
    DECODE_SECONDS = 0.3                       # 15 tokens at 20 ms

    @classmethod
    def setUpClass(cls):
        cls.mock = MockProcess([0], '--max-running', str(cls.MAX_RUNNING),
                               '--name-prefix', 'gpu')
        cls.port = cls.mock.ports[0]

    @classmethod
    def tearDownClass(cls):
        cls.mock.stop()

    def test_max_running_makes_a_queue(self):
        finished = []

        def run(index):
            complete(self.port, 'queued request %d' % index, max_tokens=15)
            finished.append(time.monotonic())

        started = time.monotonic()
        threads = [threading.Thread(target=run, args=(i,))
                   for i in range(self.REQUESTS)]
        for thread in threads:
            thread.start()
        time.sleep(self.DECODE_SECONDS / 2)
        during = stats(self.port)
        _, _, metrics = request(self.port, 'GET', '/metrics')
        for thread in threads:
            thread.join()
        after = stats(self.port)
        self.assertEqual(during['replica'], 'gpu-1')
        self.assertEqual(during['running'], self.MAX_RUNNING)
        self.assertEqual(during['waiting'], self.REQUESTS - self.MAX_RUNNING)
        self.assertIn('mock_waiting{replica="gpu-1"} 3\n', metrics.decode())
        self.assertEqual(after['peak_inflight'], self.REQUESTS)
        self.assertEqual((after['running'], after['waiting']), (0, 0))
        waves = -(-self.REQUESTS // self.MAX_RUNNING)
        self.assertGreaterEqual(max(finished) - started,
                                waves * self.DECODE_SECONDS * 0.95)


class EvictionTest(unittest.TestCase):
    """A cache of 20 blocks holds two 10-block prompts; a third evicts the
    least recently used one."""

    @classmethod
    def setUpClass(cls):
        cls.mock = MockProcess([0], '--cache-tokens', str(20 * BLOCK),
                               '--time-scale', '0.001')
        cls.port = cls.mock.ports[0]

    @classmethod
    def tearDownClass(cls):
        cls.mock.stop()

    def cached(self, prompt):
        return complete(self.port, prompt)['prompt_tokens_details'][
            'cached_tokens']

    def test_least_recently_used_prompt_is_evicted(self):
        a, b, c = (block_text(10, name) for name in ('lru-a', 'lru-b', 'lru-c'))
        self.assertEqual(self.cached(a), 0)
        self.assertEqual(self.cached(b), 0)
        self.assertEqual(self.cached(a), 10 * BLOCK)    # a is now the newest
        self.assertEqual(self.cached(c), 0)             # evicts b
        self.assertEqual(stats(self.port)['cache_blocks'], 20)
        self.assertEqual(self.cached(a), 10 * BLOCK)
        self.assertEqual(self.cached(b), 0)
        self.assertLessEqual(stats(self.port)['cache_blocks'], 20)


class LifecycleTest(unittest.TestCase):
    """The process writes its pidfile and exits cleanly on a signal, even
    with idle keep-alive connections and a request in flight."""

    def check_clean_exit(self, signum):
        with tempfile.TemporaryDirectory() as directory:
            pidfile = os.path.join(directory, 'mock.pid')
            mock = MockProcess([0], '--pidfile', pidfile)
            with open(pidfile) as handle:
                self.assertEqual(int(handle.read()), mock.process.pid)
            idle = socket.create_connection((HOST, mock.ports[0]))
            busy = socket.create_connection((HOST, mock.ports[0]))
            body = b'{"prompt": "slow", "max_tokens": 1000}'
            busy.sendall(b'POST /v1/completions HTTP/1.1\r\n'
                         b'Content-Length: %d\r\n\r\n%s' % (len(body), body))
            time.sleep(0.1)
            started = time.monotonic()
            self.assertEqual(mock.stop(signum), 0)
            self.assertLess(time.monotonic() - started, 3)
            self.assertFalse(os.path.exists(pidfile))
            idle.close()
            busy.close()

    def test_sigterm(self):
        self.check_clean_exit(signal.SIGTERM)

    def test_sigint(self):
        self.check_clean_exit(signal.SIGINT)


if __name__ == '__main__':
    unittest.main()
