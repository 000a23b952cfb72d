"""The requests of the fault benchmark: good traffic of the shapes an
inference balancer sees, and bad bodies that must still be served.

Every request is a Request: method, path, headers, body, and the SHA-1 of
the body, which the backend echoes so that the client can tell that the
body reached a backend unchanged.

Good classes
    session_header  chat bodies of a multi-turn conversation, X-Session-ID
    session_field   the same, keyed by the body field prompt_cache_key
    keyless_chat    chat bodies without a key; conversations start from a
                    few shared system prompts and few-shot preambles, so
                    prompts share prefixes (prefix_affinity routes them)
    large_tmpfile   chat bodies of 64 KB to 768 KB sent to the location
                    with client_body_buffer_size 16k (a temporary file);
                    half of them keyed
    get_keyed       GET with X-Session-ID, no body
    huge            a body over 16 MB (the module reads no key from it)

Bad classes (keyless unless named keyed_bad): see BAD_CLASSES.  Each is sent
to either location at random, so the larger ones go to temporary files.
Files of fuzz/corpus/fuzz_prompt are bodies; files of fuzz/corpus/fuzz_field
are "PATH\\nBODY", of which the body is sent.
"""

import hashlib
import json
import os
import random

MODELS = ['llama-3.1-8b-instruct', 'qwen2.5-7b-instruct', 'mistral-7b']

WORDS = ('the of and to in is that for it as with was on be by this are at '
         'from or an which have not has but all were one can more their '
         'model token cache prefix replica session request latency batch '
         'decode prefill memory kernel tensor gradient attention layer head '
         'query key value softmax vector matrix sparse dense sample '
         'temperature schedule queue worker upstream balancer nginx zone '
         'caf\u00e9 na\u00efve \u00fcber \u65e5\u672c\u8a9e \u0444\u0430\u0439\u043b '
         '\U0001f600 \u00e9t\u00e9 r\u00e9sum\u00e9').split()

LOC_MEM = '/v1/chat/completions'                  # client_body_buffer_size 1m
LOC_FILE = '/small-buffer/v1/chat/completions'    # client_body_buffer_size 16k


class Request:
    __slots__ = ('cls', 'sub', 'method', 'path', 'headers', 'body', 'sha1',
                 'delay_ms', 'stream')

    def __init__(self, cls, sub, method, path, headers, body):
        self.cls = cls
        self.sub = sub
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body
        self.sha1 = hashlib.sha1(body).hexdigest()
        self.delay_ms = 0
        self.stream = 0


def text(rng, nchars):
    out = []
    n = 0
    while n < nchars:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return ' '.join(out)


_ascii = [False]


def dumps(obj):
    # Every other body escapes non-ASCII (\u00e9), the others send UTF-8:
    # turns of one conversation come both ways, which must hash alike.
    _ascii[0] = not _ascii[0]
    return json.dumps(obj, ensure_ascii=_ascii[0]).encode()


class Conversation:
    """A chat that grows a user and an assistant turn at each request."""

    def __init__(self, rng, key, preamble):
        self.key = key
        self.model = rng.choice(MODELS)
        self.messages = [dict(m) for m in preamble]
        self.turns = 0

    def next_body(self, rng, stream, extra=None):
        if self.turns:
            self.messages.append({'role': 'assistant',
                                  'content': text(rng, rng.randint(50, 600))})
        self.messages.append({'role': 'user',
                              'content': text(rng, rng.randint(20, 400))})
        self.turns += 1
        body = {'model': self.model, 'messages': self.messages,
                'max_tokens': rng.randint(16, 256)}
        if stream:
            body['stream'] = True
        if extra:
            body.update(extra)
        return dumps(body)


class Traffic:
    """Draws requests.  Not thread-safe; one per client loop is enough."""

    def __init__(self, seed, corpus_dir=None, huge_every=0):
        self.rng = random.Random(seed)
        rng = self.rng
        self.sessions = {}
        self.keyless = {}
        self.serial = 0
        # Shared system prompts (some long) and few-shot preambles built on
        # them: many conversations share these prefixes.
        self.systems = [{'role': 'system',
                         'content': 'You are assistant %d. ' % i
                         + text(rng, rng.choice([200, 1500, 4000]))}
                        for i in range(6)]
        self.preambles = [[]]
        for s in self.systems:
            self.preambles.append([s])
            shots = [s]
            for _ in range(2):
                shots.append({'role': 'user', 'content': text(rng, 300)})
                shots.append({'role': 'assistant', 'content': text(rng, 300)})
            self.preambles.append(shots)
        self.documents = [text(rng, 64 * 1024) for _ in range(8)]
        self.corpus = load_corpus(corpus_dir) if corpus_dir else []
        self.corpus_next = 0
        self.huge_body = None
        self.huge_every = huge_every
        self.bad = [(name, fn) for name, fn in BAD_CLASSES]
        self.bad_next = 0

    # -- good traffic -----------------------------------------------------

    def conversation(self, table, prefix, npool):
        rng = self.rng
        slot = rng.randrange(npool)
        conv = table.get(slot)
        if conv is None or conv.turns >= rng.randint(6, 14):
            self.serial += 1
            key = '%s-%d-%d' % (prefix, slot, self.serial)
            conv = Conversation(rng, key, rng.choice(self.preambles))
            table[slot] = conv
        return conv

    def session_header(self):
        stream = self.rng.random() < 0.25
        conv = self.conversation(self.sessions, 'sess', 300)
        body = conv.next_body(self.rng, stream)
        r = Request('session_header', '', 'POST', LOC_MEM,
                    [('Content-Type', 'application/json'),
                     ('X-Session-ID', conv.key)], body)
        r.stream = stream
        return r

    def session_field(self):
        stream = self.rng.random() < 0.25
        conv = self.conversation(self.sessions, 'field', 300)
        body = conv.next_body(self.rng, stream,
                              {'prompt_cache_key': conv.key})
        r = Request('session_field', '', 'POST', LOC_MEM,
                    [('Content-Type', 'application/json')], body)
        r.stream = stream
        return r

    def keyless_chat(self):
        stream = self.rng.random() < 0.25
        conv = self.conversation(self.keyless, 'anon', 300)
        body = conv.next_body(self.rng, stream)
        r = Request('keyless_chat', '', 'POST', LOC_MEM,
                    [('Content-Type', 'application/json; charset=utf-8')],
                    body)
        r.stream = stream
        return r

    def large_tmpfile(self):
        rng = self.rng
        size = rng.choice([64, 128, 256, 512, 768]) * 1024
        doc = rng.choice(self.documents)
        doc = (doc * (size // len(doc) + 1))[:size]
        body = {'model': rng.choice(MODELS),
                'messages': [self.systems[0],
                             {'role': 'user',
                              'content': doc + '\n\nQuestion: '
                              + text(rng, 100)}]}
        headers = [('Content-Type', 'application/json')]
        if rng.random() < 0.5:
            headers.append(('X-Session-ID', 'large-%d' % rng.randrange(50)))
        return Request('large_tmpfile', '%dk' % (size // 1024), 'POST',
                       LOC_FILE, headers, dumps(body))

    def get_keyed(self):
        return Request('get_keyed', '', 'GET', '/v1/models',
                       [('X-Session-ID', 'get-%d' % self.rng.randrange(100))],
                       b'')

    def huge(self):
        if self.huge_body is None:
            doc = self.documents[0]
            n = 17 * 1024 * 1024
            content = (doc * (n // len(doc) + 1))[:n]
            self.huge_body = dumps({'model': MODELS[0], 'messages': [
                {'role': 'user', 'content': content}]})
        return Request('huge', '17m', 'POST', LOC_FILE,
                       [('Content-Type', 'application/json')], self.huge_body)

    # -- bad bodies -------------------------------------------------------

    def bad_body(self, keyed=False):
        rng = self.rng
        name, fn = self.bad[self.bad_next % len(self.bad)]
        self.bad_next += 1
        sub, body, ctype = fn(self)
        headers = []
        if ctype is not None:
            headers.append(('Content-Type', ctype))
        cls = 'bad:' + name
        if keyed:
            cls = 'keyed_bad'
            headers.append(('X-Session-ID', 'badkey-%d' % rng.randrange(40)))
        path = LOC_FILE if rng.random() < 0.5 else LOC_MEM
        return Request(cls, sub, 'POST', path, headers, body)

    def corpus_body(self):
        name, body = self.corpus[self.corpus_next % len(self.corpus)]
        self.corpus_next += 1
        path = LOC_FILE if self.rng.random() < 0.5 else LOC_MEM
        return Request('corpus', name, 'POST', path,
                       [('Content-Type', 'application/json')], body)

    # -- the mix ----------------------------------------------------------

    def draw(self):
        """One request of the steady mix, with its backend delay."""
        rng = self.rng
        x = rng.random()
        if x < 0.28:
            r = self.session_header()
        elif x < 0.34:
            r = self.session_field()
        elif x < 0.58:
            r = self.keyless_chat()
        elif x < 0.66:
            r = self.large_tmpfile()
        elif x < 0.70:
            r = self.get_keyed()
        elif x < 0.72:
            r = self.bad_body(keyed=True)
        elif x < 0.86 or not self.corpus:
            r = self.bad_body()
        else:
            r = self.corpus_body()
        # Backend delays: half answer at once, some take seconds, so that
        # requests are in flight when workers or backends die.
        y = rng.random()
        if y < 0.5:
            r.delay_ms = 0
        elif y < 0.8:
            r.delay_ms = rng.randint(20, 300)
        elif y < 0.95:
            r.delay_ms = rng.randint(500, 2000)
        else:
            r.delay_ms = rng.randint(3000, 8000)
        if not r.stream and r.cls != 'get_keyed' and rng.random() < 0.1:
            r.stream = 1        # a streamed answer whatever the body says
        return r


def load_corpus(root):
    """(name, body) of every corpus file that holds a request body."""
    out = []
    if not root or not os.path.isdir(root):
        return out
    for target in sorted(os.listdir(root)):
        d = os.path.join(root, target)
        if not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
            path = os.path.join(d, name)
            if not os.path.isfile(path):
                continue
            with open(path, 'rb') as f:
                data = f.read()
            if target == 'fuzz_field':
                # PATH\nBODY: the body is what a client would send
                nl = data.find(b'\n')
                if nl < 0:
                    continue
                data = data[nl + 1:]
            elif target != 'fuzz_prompt' and not looks_like_body(data):
                continue        # Cookie lines and session keys
            out.append(('%s/%s' % (target, name), data))
    return out


def looks_like_body(data):
    s = data.lstrip(b' \t\r\n')
    return s[:1] in (b'{', b'[')


# ---------------------------------------------------------------------------
# Bad bodies: each function returns (subclass, body, content type or None)
# ---------------------------------------------------------------------------

def _chat(t, nchars=None, **extra):
    rng = t.rng
    body = {'model': rng.choice(MODELS),
            'messages': [rng.choice(t.systems),
                         {'role': 'user',
                          'content': text(rng, nchars or rng.randint(50, 2000))}]}
    body.update(extra)
    return json.dumps(body, ensure_ascii=False).encode()


def bad_truncated(t):
    b = _chat(t)
    return 'cut', b[:t.rng.randrange(1, len(b))], 'application/json'


def bad_truncated_large(t):
    b = _chat(t, t.rng.randint(40000, 200000))
    return 'cut-large', b[:t.rng.randrange(len(b) // 2, len(b))], \
        'application/json'


def bad_mismatched(t):
    rng = t.rng
    fixed = [b'{"messages":[{"role":"user","content":"hi"}}',
             b'{"messages":[{"role":"user","content":"hi"]]}',
             b'{"messages":[{"role":"user","content":"hi"}]]',
             b'{"tools":[{"type":"function"]},"messages":[]}',
             b'{"input":[{"role":"user","content":"x"}}',
             b'{"model":"m","messages":}{[',
             b']}',
             b'{"messages":[[[[{]]]]}']
    if rng.random() < 0.4:
        i = rng.randrange(len(fixed))
        return 'fixed-%d' % i, fixed[i], 'application/json'
    b = bytearray(_chat(t))
    swaps = {ord('['): ord('{'), ord('{'): ord('['), ord(']'): ord('}'),
             ord('}'): ord(']')}
    pos = [i for i, c in enumerate(b) if c in swaps]
    i = rng.choice(pos)
    b[i] = swaps[b[i]]
    return 'swap', bytes(b), 'application/json'


def bad_nul(t):
    rng = t.rng
    b = bytearray(_chat(t))
    for _ in range(rng.randint(1, 5)):
        b.insert(rng.randrange(len(b)), 0)
    return 'nul', bytes(b), 'application/json'


def bad_tools_nul15(t):
    body = b'{"tools":[{\x00]}}'
    assert len(body) == 15
    return 'tools-nul-15', body, 'application/json'


def bad_control(t):
    rng = t.rng
    ctl = bytes([rng.choice(list(range(1, 32)) + [127])
                 for _ in range(rng.randint(1, 20))])
    body = (b'{"model":"m","messages":[{"role":"user","content":"abc'
            + ctl + b'def"}]}')
    # DEL (127) alone is valid in a JSON string
    return 'del-only' if set(ctl) == {127} else 'ctl', body, \
        'application/json'


def bad_utf8(t):
    rng = t.rng
    seqs = [b'\xff', b'\xfe\xff', b'\xc0\x80', b'\xc3', b'\x80\x80',
            b'\xed\xa0\x80', b'\xf4\x90\x80\x80', b'\xe2\x82', b'\xf0\x9f\x98']
    s = rng.choice(seqs)
    where = rng.choice(['content', 'role', 'key', 'model'])
    if where == 'content':
        body = (b'{"model":"m","messages":[{"role":"user","content":"caf'
                + s + b' au lait"}]}')
    elif where == 'role':
        body = b'{"model":"m","messages":[{"role":"us' + s + b'er","content":"x"}]}'
    elif where == 'key':
        body = b'{"mod' + s + b'el":"m","messages":[{"role":"user","content":"x"}]}'
    else:
        body = b'{"model":"' + s + b'","messages":[{"role":"user","content":"x"}]}'
    return 'utf8-' + where, body, 'application/json'


def bad_deep(t):
    rng = t.rng
    k = rng.randrange(5)
    if k == 0:
        n = rng.choice([1000, 10000, 100000])
        return 'open-%d' % n, b'[' * n, 'application/json'
    if k == 1:
        n = rng.choice([500, 5000, 50000])
        return 'balanced-%d' % n, b'[' * n + b']' * n, 'application/json'
    if k == 2:
        n = rng.choice([1000, 20000])
        return 'objects-%d' % n, b'{"a":' * n + b'1' + b'}' * n, \
            'application/json'
    if k == 3:
        n = rng.choice([1000, 20000])
        return 'content-%d' % n, (b'{"messages":[{"role":"user","content":'
                                  + b'[' * n + b'"x"' + b']' * n + b'}]}'), \
            'application/json'
    n = rng.choice([1000, 20000])
    return 'messages-%d' % n, b'{"messages":' + b'[' * n + b']' * n + b'}', \
        'application/json'


def bad_numbers(t):
    rng = t.rng
    nums = [b'1e999999', b'-1e309', b'123456789012345678901234567890',
            b'0.' + b'1' * 5000, b'9' * 20000, b'1E+2147483648',
            b'-0.0e-99999', b'18446744073709551616', b'-9223372036854775809',
            b'01', b'1.', b'.5', b'+1', b'NaN', b'Infinity']
    n = rng.choice(nums)
    where = rng.choice(['max_tokens', 'model', 'content', 'user',
                        'prompt_cache_key'])
    label = n.decode() if len(n) < 24 else '%s...(%d)' % (n[:6].decode(),
                                                          len(n))
    if where == 'content':
        body = b'{"model":"m","messages":[{"role":"user","content":' + n + b'}]}'
    else:
        body = (b'{"' + where.encode() + b'":' + n
                + b',"messages":[{"role":"user","content":"x"}]}')
    return 'num-%s %s' % (where, label), body, 'application/json'


def bad_types(t):
    rng = t.rng
    cases = [
        ('messages-str', {'model': 'm', 'messages': 'hello'}),
        ('messages-num', {'model': 'm', 'messages': 42}),
        ('messages-obj', {'model': 'm', 'messages': {'role': 'user'}}),
        ('messages-null', {'model': 'm', 'messages': None}),
        ('messages-ints', {'model': 'm', 'messages': [1, 2, 3]}),
        ('messages-nested', {'model': 'm', 'messages': [[{'role': 'u'}]]}),
        ('messages-empty', {'model': 'm', 'messages': []}),
        ('content-num', {'model': 'm', 'messages': [{'role': 'user',
                                                     'content': 7}]}),
        ('content-obj', {'model': 'm', 'messages': [{'role': 'user',
                                                     'content': {'a': 1}}]}),
        ('content-ints', {'model': 'm', 'messages': [{'role': 'user',
                                                      'content': [1, 2]}]}),
        ('content-parts-bad', {'model': 'm', 'messages': [
            {'role': 'user', 'content': [{'type': 'text', 'text': 5},
                                         {'type': 'image_url',
                                          'image_url': 3},
                                         {'type': None}]}]}),
        ('role-num', {'model': 'm', 'messages': [{'role': 1,
                                                  'content': 'x'}]}),
        ('tools-str', {'model': 'm', 'tools': 'all',
                       'messages': [{'role': 'user', 'content': 'x'}]}),
        ('tools-obj', {'model': 'm', 'tools': {'type': 'function'},
                       'messages': [{'role': 'user', 'content': 'x'}]}),
        ('tools-ints', {'tools': [1, None, True]}),
        ('tool-calls-str', {'messages': [{'role': 'assistant',
                                          'tool_calls': 'x'}]}),
        ('model-obj', {'model': {'name': 'm'}, 'messages': [
            {'role': 'user', 'content': 'x'}]}),
        ('prompt-obj', {'model': 'm', 'prompt': {'a': [1]}}),
        ('prompt-ints-nested', {'model': 'm', 'prompt': [[1, [2]], 'x']}),
        ('input-num', {'model': 'm', 'input': 5, 'instructions': ['x']}),
        ('key-obj', {'prompt_cache_key': {'a': 1}, 'messages': [
            {'role': 'user', 'content': 'x'}]}),
        ('key-null', {'prompt_cache_key': None, 'metadata': 'x',
                      'messages': [{'role': 'user', 'content': 'x'}]}),
        ('key-long', {'prompt_cache_key': 'k' * 20000, 'messages': [
            {'role': 'user', 'content': 'x'}]}),
        ('key-nul', {'prompt_cache_key': 'a\u0000b', 'metadata': {
            'session_id': ['x']}, 'messages': [{'role': 'user',
                                               'content': 'x'}]}),
    ]
    name, obj = rng.choice(cases)
    return name, json.dumps(obj).encode(), 'application/json'


def bad_empty(t):
    return 'empty', b'', rng_choice(t, ['application/json', None])


def rng_choice(t, seq):
    return t.rng.choice(seq)


def bad_content_type(t):
    ct = t.rng.choice(['text/plain', 'application/x-www-form-urlencoded',
                       'multipart/form-data; boundary=x', None,
                       'application/jsonx', 'application/octet-stream'])
    return 'ct-%s' % (ct or 'none').split(';')[0], _chat(t), ct


def bad_not_object(t):
    rng = t.rng
    b = rng.choice([b'[]', b'"str"', b'42', b'null', b'true', b'[{"messages":[]}]',
                    b'"' + b'x' * 30000 + b'"'])
    return 'not-object', b, 'application/json'


def bad_trailing(t):
    b = _chat(t) + t.rng.choice([b'}}}', b'garbage', b'\x00', b'{"a":1}', b']'])
    return 'trailing', b, 'application/json'


def bad_escapes(t):
    rng = t.rng
    esc = rng.choice([b'\\x41', b'\\u12', b'\\ud800', b'\\udc00\\ud800',
                      b'\\', b'\\uZZZZ', b'\\U0001F600', b'\\u0000'])
    body = (b'{"model":"m","messages":[{"role":"user","content":"a'
            + esc + b'Z"}]}')
    return 'escape ' + esc.decode(), body, 'application/json'


def bad_unterminated(t):
    rng = t.rng
    n = rng.choice([10, 1000, 200000])
    body = b'{"model":"m","messages":[{"role":"user","content":"' + b'a' * n
    return 'unterminated-%d' % n, body, 'application/json'


def bad_bom(t):
    return 'bom', b'\xef\xbb\xbf' + _chat(t), 'application/json'


def bad_duplicate(t):
    body = (b'{"messages":[{"role":"user","content":"one"}],"model":"m",'
            b'"messages":[{"role":"user","content":"two"}],"messages":7}')
    return 'duplicate', body, 'application/json'


def bad_whitespace(t):
    return 'whitespace', t.rng.choice([b' ', b'\n\t\r ', b' ' * 20000]), \
        'application/json'


def bad_random(t):
    n = t.rng.choice([1, 100, 4096, 65536])
    return 'random-%d' % n, t.rng.randbytes(n), \
        'application/json'


BAD_CLASSES = [
    ('truncated', bad_truncated),
    ('truncated_large', bad_truncated_large),
    ('mismatched', bad_mismatched),
    ('nul_bytes', bad_nul),
    ('tools_nul_15', bad_tools_nul15),
    ('control_chars', bad_control),
    ('invalid_utf8', bad_utf8),
    ('deep_nesting', bad_deep),
    ('huge_numbers', bad_numbers),
    ('wrong_types', bad_types),
    ('empty', bad_empty),
    ('non_json_type', bad_content_type),
    ('not_object', bad_not_object),
    ('trailing_garbage', bad_trailing),
    ('bad_escapes', bad_escapes),
    ('unterminated', bad_unterminated),
    ('bom', bad_bom),
    ('duplicate_keys', bad_duplicate),
    ('whitespace', bad_whitespace),
    ('random_bytes', bad_random),
]
