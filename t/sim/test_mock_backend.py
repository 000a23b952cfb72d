"""Tests of bench/sim/mock_backend.py through real HTTP.

The mock is started as a subprocess on ports it picks itself (port 0, so no
other process can take them between choosing and binding), and every
expected cache figure is computed with the functions of bench/sim/model.py,
so that the mock is checked against the model it claims to implement.

Run from the repository root:
    python3 -m unittest discover -s t/sim -t .
"""

import asyncio
import http.client
import json
import os
import re
import signal
import socket
import tempfile
import threading
import time
import unittest

from bench.sim import fleet, mock_backend, model
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


def open_stream(port, path, body):
    """A streamed request whose events are still to read:
    (connection, response)."""
    conn = http.client.HTTPConnection(HOST, port, timeout=20)
    conn.request('POST', path, body=json.dumps(body),
                 headers={'Content-Type': 'application/json'})
    return conn, conn.getresponse()


def read_events(response, count=None):
    """The next `count` Responses API events of a stream (all of them
    when None): [(event name, decoded data)]."""
    events = []
    event_name = None
    while count is None or len(events) < count:
        line = response.readline()
        if not line:
            break
        line = line.decode().rstrip('\n')
        if line.startswith('event: '):
            event_name = line[len('event: '):]
        elif line.startswith('data: '):
            events.append((event_name, json.loads(line[len('data: '):])))
    return events


def get_json(port, path):
    """GETs path: (status, response, decoded JSON)."""
    status, response, data = request(port, 'GET', path)
    return status, response, json.loads(data)


def respond(port, body):
    """A non-streamed /v1/responses request that must succeed: its reply."""
    status, _, reply = post_json(port, '/v1/responses', body)
    assert status == 200, reply
    return reply


def output_text(reply):
    return reply['output'][0]['content'][0]['text']


def user_items_text(text):
    """The prompt text of a string input in the item form."""
    return chat_prompt_text([{'role': 'user', 'content': text}])


def not_found(what, object_id, param=None):
    """vLLM's 404 body for a response or conversation it does not keep."""
    return {'error': {'message': "%s with id '%s' not found."
                      % (what, object_id),
                      'type': 'invalid_request_error', 'param': param,
                      'code': None}}


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
            'mock_queried_tokens_total': (10 + 13 + 5) * BLOCK,
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
        # vLLM's names for what a balancer reads: the prefix cache's
        # counters and its size.
        vllm = '{engine="0",model_name="mock"}'
        self.assertEqual(
            samples[('vllm:prefix_cache_queries_total', vllm)],
            (10 + 13 + 5) * BLOCK)
        self.assertEqual(samples[('vllm:prefix_cache_hits_total', vllm)],
                         10 * BLOCK)
        # the default --cache-tokens, 262144, in blocks of 16 tokens
        self.assertIn('num_gpu_blocks="16384"', data.decode())

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
                    ('GET', '/v1/responses/resp_missing', None),
                    ('POST', '/v1/responses', '{"input": "hi", '
                     '"previous_response_id": "resp_missing"}'),
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


class ResponseStoreTest(unittest.TestCase):
    """Each replica keeps its own responses and conversations, as vLLM's
    in-memory store: a follow-up on its previous turn's replica extends the
    cached prompt, elsewhere it is a 404.  Decoding takes 2 ms per token,
    so that a stream of 100 tokens can be looked at while it runs."""

    RESPONSE_ID = re.compile(r'resp_[0-9a-f]{32}')
    MESSAGE_ID = re.compile(r'msg_[0-9a-f]{32}')

    @classmethod
    def setUpClass(cls):
        cls.mock = MockProcess([0] * 2, '--prefill-ms-per-token', '0',
                               '--decode-ms-per-token', '2')
        cls.port, cls.other_port = cls.mock.ports

    @classmethod
    def tearDownClass(cls):
        cls.mock.stop()

    def setUp(self):
        for port in self.mock.ports:
            request(port, 'POST', '/reset')

    def assert_not_found(self, port, method, path, what, object_id,
                         body=None, param=None):
        status, response, data = request(port, method, path, body)
        self.assertEqual(status, 404, data)
        self.assertEqual(json.loads(data), not_found(what, object_id, param))
        self.assertEqual(response.getheader('X-Replica-Port'), str(port))

    def test_ids_are_unique_across_replicas_and_processes(self):
        replies = [respond(port, {'input': 'same prompt',
                                  'max_output_tokens': 1})
                   for port in self.mock.ports * 3]
        other = MockProcess([0], '--time-scale', '0.001')
        try:
            replies.append(respond(other.ports[0], {
                'input': 'same prompt', 'max_output_tokens': 1}))
        finally:
            other.stop()
        ids = [reply['id'] for reply in replies]
        message_ids = [reply['output'][0]['id'] for reply in replies]
        for response_id, message_id in zip(ids, message_ids):
            self.assertRegex(response_id, self.RESPONSE_ID)
            self.assertRegex(message_id, self.MESSAGE_ID)
        self.assertEqual(len(set(ids)), len(ids))
        self.assertEqual(len(set(message_ids)), len(message_ids))

    def test_chain_of_turns_extends_the_cached_prompt(self):
        instructions = block_text(8, 'chain')
        first = respond(self.port, {'instructions': instructions,
                                    'input': 'hello', 'max_output_tokens': 4})
        prompt1 = instructions + '\nhello'
        self.assertIsNone(first['previous_response_id'])
        self.assertTrue(first['store'])
        question = 'next question ' + block_text(3, 'question')
        second = respond(self.port, {'previous_response_id': first['id'],
                                     'instructions': instructions,
                                     'input': question})
        prompt2 = (prompt1 + 'assistant\n' + output_text(first) + '\n'
                   + user_items_text(question))
        self.assertEqual(second['previous_response_id'], first['id'])
        self.assertEqual(second['usage']['input_tokens'],
                         model.prompt_tokens(prompt2))
        cached2 = second['usage']['input_tokens_details']['cached_tokens']
        self.assertEqual(cached2, expected_cached([prompt1], prompt2))
        self.assertEqual(cached2, 8 * BLOCK)
        items = [{'role': 'user', 'content': [
            {'type': 'input_text', 'text': block_text(3, 'third')}]}]
        third = respond(self.port, {'previous_response_id': second['id'],
                                    'input': items})
        prompt3 = (prompt2 + 'assistant\n' + output_text(second) + '\n'
                   + chat_prompt_text(items))
        self.assertEqual(third['usage']['input_tokens'],
                         model.prompt_tokens(prompt3))
        cached3 = third['usage']['input_tokens_details']['cached_tokens']
        self.assertEqual(cached3, expected_cached([prompt1, prompt2], prompt3))
        self.assertGreater(cached3, cached2)
        self.assertEqual(stats(self.port)['not_found_total'], 0)
        self.assertEqual(stats(self.port)['stored_responses'], 3)

    def test_follow_up_on_another_replica_is_not_found(self):
        first = respond(self.port, {'input': block_text(4, 'elsewhere')})
        body = {'previous_response_id': first['id'], 'input': 'more'}
        self.assert_not_found(self.other_port, 'POST', '/v1/responses',
                              'Response', first['id'], body,
                              'previous_response_id')
        status, response, data = request(self.other_port, 'POST',
                                         '/v1/responses',
                                         dict(body, stream=True))
        self.assertEqual(status, 404)          # plain JSON, before any event
        self.assertEqual(response.getheader('Content-Type'),
                         'application/json')
        self.assertEqual(response.getheader('X-Replica'), self.mock.names[1])
        self.assertEqual(json.loads(data), not_found(
            'Response', first['id'], 'previous_response_id'))
        self.assert_not_found(self.other_port, 'GET',
                              '/v1/responses/' + first['id'],
                              'Response', first['id'])
        figures = stats(self.other_port)
        self.assertEqual(figures['not_found_total'], 3)
        self.assertEqual(figures['requests_total'], 0)
        self.assertEqual(stats(self.port)['not_found_total'], 0)
        _, _, metrics = request(self.other_port, 'GET', '/metrics')
        samples, described = parse_metrics(metrics.decode())
        self.assertIn('mock_not_found_total', described['TYPE'])
        self.assertEqual(samples[('mock_not_found_total', '{replica="%s"}'
                                  % self.mock.names[1])], 3)
        self.assertEqual(samples[('mock_stored_responses', '{replica="%s"}'
                                  % self.mock.names[1])], 0)
        # the follow-up where its previous turn is kept still works
        respond(self.port, body)

    def test_get_delete_cancel_and_input_items(self):
        items = [{'role': 'system', 'content': 'be brief', 'id': 'msg_given'},
                 {'type': 'message', 'role': 'user',
                  'content': [{'type': 'input_text', 'text': 'hi'}]}]
        reply = respond(self.port, {'input': items, 'max_output_tokens': 2})
        path = '/v1/responses/' + reply['id']
        status, response, got = get_json(self.port, path)
        self.assertEqual(status, 200)
        self.assertEqual(got, reply)
        self.assertEqual(response.getheader('X-Replica'), self.mock.names[0])
        status, _, cancelled = post_json(self.port, path + '/cancel', None)
        self.assertEqual((status, cancelled), (200, reply))
        status, _, listed = get_json(self.port,
                                     path + '/input_items?order=asc')
        self.assertEqual(status, 200)
        self.assertEqual(listed['object'], 'list')
        self.assertFalse(listed['has_more'])
        data = listed['data']
        self.assertEqual([item['role'] for item in data], ['system', 'user'])
        self.assertEqual(data[0]['id'], 'msg_given')
        self.assertRegex(data[1]['id'], self.MESSAGE_ID)
        self.assertEqual((listed['first_id'], listed['last_id']),
                         ('msg_given', data[1]['id']))
        _, _, newest_first = get_json(self.port, path + '/input_items')
        self.assertEqual(newest_first['data'], data[::-1])
        self.assertEqual(request(self.port, 'GET',
                                 path + '/input_items?order=up')[0], 400)
        self.assertEqual(request(self.port, 'PUT', path)[0], 405)
        status, _, deleted = request(self.port, 'DELETE', path)
        self.assertEqual((status, json.loads(deleted)), (200, {
            'id': reply['id'], 'object': 'response', 'deleted': True}))
        for method, suffix in (('GET', ''), ('DELETE', ''),
                               ('POST', '/cancel'), ('GET', '/input_items')):
            self.assert_not_found(self.port, method, path + suffix,
                                  'Response', reply['id'])
        self.assertEqual(stats(self.port)['not_found_total'], 4)

    def test_stream_is_stored_while_it_runs(self):
        conn, response = open_stream(self.port, '/v1/responses', {
            'input': 'stream me', 'max_output_tokens': 100, 'stream': True})
        try:
            self.assertEqual(response.status, 200)
            [(name, created)] = read_events(response, 1)
            self.assertEqual(name, 'response.created')
            response_id = created['response']['id']
            self.assertRegex(response_id, self.RESPONSE_ID)
            path = '/v1/responses/' + response_id
            status, _, during = get_json(self.port, path)
            self.assertEqual(status, 200)
            self.assertEqual(during['status'], 'in_progress')
            self.assertEqual(during['id'], response_id)
            events = read_events(response)
        finally:
            conn.close()
        self.assertEqual(events[-1][0], 'response.completed')
        completed = events[-1][1]['response']
        _, _, after = get_json(self.port, path)
        self.assertEqual(after, completed)
        self.assertEqual(after['status'], 'completed')
        self.assertEqual(len(output_text(after)), 100 * model.CHARS_PER_TOKEN)
        _, _, listed = get_json(self.port, path + '/input_items')
        self.assertEqual(listed['data'][0]['content'],
                         [{'type': 'input_text', 'text': 'stream me'}])

    def test_cancel_while_in_progress(self):
        conn, response = open_stream(self.port, '/v1/responses', {
            'input': 'cancel me', 'max_output_tokens': 100, 'stream': True})
        try:
            [(_, created)] = read_events(response, 1)
            path = '/v1/responses/' + created['response']['id']
            status, _, cancelled = post_json(self.port, path + '/cancel', None)
            self.assertEqual(status, 200)
            self.assertEqual(cancelled['status'], 'cancelled')
            read_events(response)
        finally:
            conn.close()
        self.assertEqual(get_json(self.port, path)[2]['status'], 'cancelled')

    def test_client_gone_mid_stream_cancels(self):
        conn, response = open_stream(self.port, '/v1/responses', {
            'input': 'hang up', 'max_output_tokens': 100, 'stream': True})
        [(_, created)] = read_events(response, 1)
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        time.sleep(0.4)                         # past the end of decode
        _, _, after = get_json(self.port,
                               '/v1/responses/' + created['response']['id'])
        self.assertEqual(after['status'], 'cancelled')

    def test_conversation(self):
        system = block_text(6, 'conversation')
        status, _, conversation = post_json(self.port, '/v1/conversations', {
            'items': [{'type': 'message', 'role': 'system',
                       'content': system}],
            'metadata': {'topic': 'tests'}})
        self.assertEqual(status, 200)
        conversation_id = conversation['id']
        self.assertRegex(conversation_id, r'conv_[0-9a-f]{32}')
        self.assertEqual(conversation['object'], 'conversation')
        self.assertEqual(conversation['metadata'], {'topic': 'tests'})
        path = '/v1/conversations/' + conversation_id
        self.assertEqual(get_json(self.port, path)[2], conversation)
        first = respond(self.port, {'conversation': conversation_id,
                                    'input': 'q1', 'max_output_tokens': 3})
        self.assertEqual(first['conversation'], {'id': conversation_id})
        history = chat_prompt_text([{'role': 'system', 'content': system}])
        prompt1 = '\n' + history + user_items_text('q1')
        self.assertEqual(first['usage']['input_tokens'],
                         model.prompt_tokens(prompt1))
        second = respond(self.port, {'conversation': {'id': conversation_id},
                                     'input': 'q2', 'max_output_tokens': 2})
        prompt2 = (prompt1 + 'assistant\n' + output_text(first) + '\n'
                   + user_items_text('q2'))
        self.assertEqual(second['usage']['input_tokens'],
                         model.prompt_tokens(prompt2))
        cached = second['usage']['input_tokens_details']['cached_tokens']
        self.assertEqual(cached, expected_cached([prompt1], prompt2))
        self.assertGreater(cached, 0)
        _, _, items = get_json(self.port, path + '/items?order=asc')
        self.assertEqual([(item['type'], item['role'])
                          for item in items['data']],
                         [('message', 'system'), ('message', 'user'),
                          ('message', 'assistant'), ('message', 'user'),
                          ('message', 'assistant')])
        self.assertEqual(items['data'][2]['id'], first['output'][0]['id'])
        self.assertEqual(items['last_id'], second['output'][0]['id'])
        _, _, newest_first = get_json(self.port, path + '/items')
        self.assertEqual(newest_first['data'], items['data'][::-1])
        # another replica does not keep it
        self.assert_not_found(self.other_port, 'POST', '/v1/responses',
                              'Conversation', conversation_id,
                              {'conversation': conversation_id, 'input': 'q'},
                              'conversation')
        self.assert_not_found(self.other_port, 'GET', path, 'Conversation',
                              conversation_id)
        self.assertEqual(stats(self.other_port)['not_found_total'], 2)
        status, _, both = post_json(self.port, '/v1/responses', {
            'conversation': conversation_id, 'input': 'q',
            'previous_response_id': first['id']})
        self.assertEqual(status, 400)
        self.assertIn('Mutually exclusive', both['error']['message'])
        status, _, deleted = request(self.port, 'DELETE', path)
        self.assertEqual((status, json.loads(deleted)), (200, {
            'id': conversation_id, 'object': 'conversation.deleted',
            'deleted': True}))
        for method, suffix in (('GET', ''), ('DELETE', ''), ('GET', '/items')):
            self.assert_not_found(self.port, method, path + suffix,
                                  'Conversation', conversation_id)
        status, _, empty = post_json(self.port, '/v1/conversations', None)
        self.assertEqual((status, empty['metadata']), (200, {}))

    def test_store_false_is_not_stored(self):
        reply = respond(self.port, {'input': 'forget me', 'store': False})
        self.assertFalse(reply['store'])
        self.assert_not_found(self.port, 'GET', '/v1/responses/' + reply['id'],
                              'Response', reply['id'])
        self.assert_not_found(self.port, 'POST', '/v1/responses', 'Response',
                              reply['id'],
                              {'previous_response_id': reply['id'],
                               'input': 'again'},
                              'previous_response_id')
        figures = stats(self.port)
        self.assertEqual(figures['stored_responses'], 0)
        self.assertEqual(figures['not_found_total'], 2)
        status, _, _ = post_json(self.port, '/v1/responses',
                                 {'input': 'x', 'store': 'no'})
        self.assertEqual(status, 400)

    def test_reset_empties_the_stores(self):
        reply = respond(self.port, {'input': 'before reset'})
        _, _, conversation = post_json(self.port, '/v1/conversations', {})
        request(self.port, 'GET', '/v1/responses/resp_unknown')
        figures = stats(self.port)
        self.assertEqual((figures['stored_responses'],
                          figures['stored_conversations'],
                          figures['not_found_total']), (1, 1, 1))
        request(self.port, 'POST', '/reset')
        figures = stats(self.port)
        self.assertEqual((figures['stored_responses'],
                          figures['stored_conversations'],
                          figures['not_found_total']), (0, 0, 0))
        self.assert_not_found(self.port, 'GET', '/v1/responses/' + reply['id'],
                              'Response', reply['id'])
        self.assert_not_found(self.port, 'GET',
                              '/v1/conversations/' + conversation['id'],
                              'Conversation', conversation['id'])


class ModelTimeTest(unittest.TestCase):
    """A replica hands its running slot and its prefill lane on at the
    model time they are freed: a timer that fires late (the loop was busy)
    delays its own request, not the first token of the requests queued
    behind it."""

    def test_a_late_timer_is_not_passed_on(self):
        # One running slot; 2000-token prompts prefill in 0.2 s and 10
        # output tokens decode in 0.1 s.  The second request waits for the
        # first to end (0.3 s), then prefills: its first token at 0.5 s.
        params = model.ReplicaParams(max_running=1, prefill_ms_per_token=0.1,
                                     decode_ms_per_token=10.0,
                                     cache_tokens=1 << 20)
        served = mock_backend.ServedReplica(
            fleet.Fleet(params, names=['late-1']).replicas[0], 0)
        jobs = [mock_backend.make_job('completion', {'max_tokens': 10},
                                      block_text(125, 'late-' + name))
                for name in ('a', 'b')]

        async def serve(job, arrived):
            ready = await served.admit(job, arrived)
            _, first_token = await served.prefill(job, ready)
            end = first_token + params.decode_seconds(job.output_tokens)
            await mock_backend.sleep_until(end)
            served.finish(end)
            return first_token - arrived

        async def main():
            arrived = asyncio.get_running_loop().time()
            tasks = [asyncio.create_task(serve(job, arrived))
                     for job in jobs]
            await asyncio.sleep(0.1)
            # Busy for 0.4 s: every timer due meanwhile fires late; the
            # first prefill's, due at 0.2 s, fires at 0.5 s.
            time.sleep(0.4)
            return [await task for task in tasks]

        first, second = asyncio.run(main())
        self.assertAlmostEqual(first, 0.2, delta=0.01)
        # Reckoned from the late timers' wake-ups it would be 0.7 s or more.
        self.assertAlmostEqual(second, 0.5, delta=0.01)
        self.assertEqual(served.replica.inflight, 0)


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

    def test_replica_ttft_is_the_prefill_and_the_queue(self):
        # The second request arrives while the first prefills on the one
        # lane: its own time to first token includes that wait and its own
        # prefill, from its arrival, not from the client's send.
        long_prompt = block_text(625, 'own-long')              # 10000 tokens
        short_prompt = block_text(125, 'own-short')            # 2000 tokens
        long_prefill = 10000 * self.PREFILL_MS / 1000           # 1 s
        short_prefill = 2000 * self.PREFILL_MS / 1000           # 0.2 s
        replies = {}

        def run(name, prompt):
            replies[name] = stream(self.port, '/v1/completions', {
                'prompt': prompt, 'max_tokens': 2, 'stream': True})

        first = threading.Thread(target=run, args=('long', long_prompt))
        first.start()
        deadline = time.monotonic() + 5
        while stats(self.port)['running'] == 0:
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.01)
        run('short', short_prompt)
        first.join()

        own = {name: float(response.getheader('X-Replica-TTFT'))
               for name, (response, _) in replies.items()}
        self.assertGreaterEqual(own['long'], long_prefill * 0.95)
        self.assertGreaterEqual(own['short'],
                                short_prefill + long_prefill / 2)
        for name, (_, events) in replies.items():
            self.assertLessEqual(own[name], events[0][0])

        # Not streamed: the first token's time too, though the reply comes
        # after the decode (0.4 s); the prompt is cached now.
        status, response, _ = post_json(self.port, '/v1/completions', {
            'prompt': short_prompt, 'max_tokens': 200})
        self.assertEqual(status, 200)
        self.assertLess(float(response.getheader('X-Replica-TTFT')),
                        short_prefill / 2)

        # The Responses API's replies carry it as well.
        response, events = stream(self.port, '/v1/responses', {
            'input': short_prompt, 'max_output_tokens': 2, 'stream': True})
        self.assertLessEqual(float(response.getheader('X-Replica-TTFT')),
                             events[0][0])

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


class StreamUsageTest(unittest.TestCase):
    """With --stream-usage asked, a chat or completion stream ends with its
    usage only when its stream_options ask for it, as vLLM's streams."""

    @classmethod
    def setUpClass(cls):
        cls.mock = MockProcess([0], '--stream-usage', 'asked',
                               '--time-scale', '0.001')
        cls.port = cls.mock.ports[0]

    @classmethod
    def tearDownClass(cls):
        cls.mock.stop()

    def usage_chunks(self, path, body):
        _, events = stream(self.port, path, dict(body, stream=True,
                                                 max_tokens=5))
        self.assertEqual(events[-1][2], '[DONE]')
        chunks = [json.loads(data) for _, _, data in events[:-1]]
        return [c['usage'] for c in chunks if 'usage' in c]

    def test_chat_stream_without_options_has_no_usage(self):
        body = {'messages': [{'role': 'user', 'content': block_text(2, 'u')}]}
        self.assertEqual(self.usage_chunks('/v1/chat/completions', body), [])
        body['stream_options'] = {'include_usage': False}
        self.assertEqual(self.usage_chunks('/v1/chat/completions', body), [])

    def test_chat_stream_that_asks_ends_with_usage(self):
        body = {'messages': [{'role': 'user', 'content': block_text(2, 'v')}],
                'stream_options': {'include_usage': True}}
        usages = self.usage_chunks('/v1/chat/completions', body)
        self.assertEqual(len(usages), 1)
        self.assertEqual(usages[0]['completion_tokens'], 5)

    def test_completion_stream_follows_the_options(self):
        body = {'prompt': block_text(2, 'w')}
        self.assertEqual(self.usage_chunks('/v1/completions', body), [])
        body['stream_options'] = {'include_usage': True}
        self.assertEqual(len(self.usage_chunks('/v1/completions', body)), 1)

    def test_unstreamed_reply_keeps_its_usage(self):
        status, _, reply = post_json(self.port, '/v1/chat/completions', {
            'messages': [{'role': 'user', 'content': 'hi'}], 'max_tokens': 3})
        self.assertEqual(status, 200)
        self.assertEqual(reply['usage']['completion_tokens'], 3)


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
