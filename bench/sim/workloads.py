"""Workloads for the simulated fleet: the Mooncake conversation trace and
three generated ones, as one list of requests that the replay
(replay.py, through nginx and the mock replicas) and the offline simulator
(bounds.py) both consume.

    conversation  slices of the Mooncake conversation trace (trace.py)
    shared-docs   sessions asking their own questions about a few long
                  documents shared by many sessions, with follow-up turns
    agentic       a long shared system prompt and tool schemas, many short
                  tool-call turns per session, bursts of sibling requests
    chat          multi-turn chat: thousands of sessions of up to 20 turns,
                  a short shared system prompt, think time between turns
    long-mix      chat with a few sessions that open with a 30,000 to
                  100,000-token prompt

A Request holds its arrival time (seconds from the workload's start, at the
workload's own rate; a profile multiplies the rate, profiles.py), its
session id (sent as X-Session-ID when sessions are on), its chat messages
(and tools) and its output length.  Generated workloads are pure functions
of their parameters and seed (random.Random(seed), texts from SHAKE-128):
the same seed gives the same requests, byte for byte, on every machine.

Where the figures come from.  Lengths are in tokens of model.py (4
characters each).  Quantile tables below were computed from the shared
traces (the traces' README in the project's shared folder): nearest-rank
quantiles of

  AZURE_CONV_*    azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv
                  (19,366 requests, 5.53 req/s over 3,502 s)
  AZURE_CODE_*    azure-llm-inference-2023/AzureLLMInferenceTrace_code.csv
                  (8,819 requests, 2.57 req/s over 3,436 s)
  MOONCAKE_*      mooncake-fast25/conversation_trace.jsonl (12,031
                  requests, 3.40 req/s), grouped into conversations as
                  trace.session_id() does (7,373; 2,259 of 2 turns or more)

and sampled by interpolating linearly between the quantile points.  The
published benchmark defaults used are SGLang bench_serving's
generated-shared-prefix dataset (a shared system prompt of 2,048 tokens, a
question of 128 tokens, 256 output tokens) and LMCache's multi_round_qa
(a shared system prompt, per-user history growing over up to 20 rounds;
its short-input setting's system prompt is "You are a helpful
assistant.").  What no source gives is marked "assumption" where it is set.
"""

import hashlib
import json
import math
import operator
import random
from dataclasses import dataclass, field

from . import model, trace
from .mock_backend import chat_prompt_pieces

MODEL = 'mock-llm'
JSON_SEPARATORS = (',', ':')

# --- figures from the shared traces --------------------------------------
# (quantile in %, value); see the module docstring for the files.

# Prompt tokens of a request (no history: one turn's whole context).
AZURE_CONV_CONTEXT = ((0, 2), (10, 207), (25, 396), (50, 1020), (75, 1189),
                      (90, 2734), (95, 4083), (99, 4142), (100, 14050))
# Output tokens of a chat answer.
AZURE_CONV_OUTPUT = ((0, 7), (10, 54), (25, 85), (50, 129), (75, 395),
                     (90, 424), (95, 451), (99, 601), (100, 1000))
AZURE_CONV_RATE = 5.53          # requests per second, mean
# Output tokens of a code request: short, as tool calls are.
AZURE_CODE_OUTPUT = ((0, 6), (10, 7), (25, 9), (50, 13), (75, 24), (90, 55),
                     (95, 90), (99, 252), (100, 1899))
AZURE_CODE_RATE = 2.57          # requests per second, mean
# Requests that arrive less than 10 ms after the one before form a burst:
# 60 % of the code trace's requests are in bursts of 2 or more, whose
# sizes are these.
AZURE_CODE_BURST = ((0, 2), (10, 2), (25, 2), (50, 2), (75, 3), (90, 4),
                    (95, 5), (99, 7), (100, 13))
AZURE_CODE_BURSTY_SHARE = 0.60
AZURE_CODE_BURST_GAP = 0.010    # seconds
# Turns of the conversations that have more than one.
MOONCAKE_TURNS = ((0, 2), (10, 2), (25, 2), (50, 2), (75, 3), (90, 5),
                  (95, 6), (99, 13), (100, 43))
# Seconds between a conversation's consecutive requests (the user's think
# time plus the answer's).
MOONCAKE_THINK = ((0, 0), (10, 42), (25, 66), (50, 123), (75, 264),
                  (90, 480), (95, 615), (99, 1473), (100, 3030))
# Prompt tokens a conversation's next turn adds (the previous answer and
# the new message); the few negative ones (a truncated history) as 0.
MOONCAKE_GROWTH = ((0, 0), (10, 0), (25, 188), (50, 455), (75, 908),
                   (90, 4628), (95, 7457), (99, 17031), (100, 91918))
MOONCAKE_RATE = 3.40            # requests per second, mean

# SGLang bench_serving generated-shared-prefix defaults.
GSP_SYSTEM_TOKENS = 2048
GSP_QUESTION_TOKENS = 128
GSP_OUTPUT_TOKENS = 256
# LMCache multi_round_qa: its short-input system prompt, its round count.
LMCACHE_SYSTEM_PROMPT = 'You are a helpful assistant.'
LMCACHE_ROUNDS = 20


# --- requests ---------------------------------------------------------------

@dataclass(slots=True)
class Request:
    """One request of a workload."""
    index: int              # position in the workload, by arrival
    arrival: float          # seconds from the workload's start (own rate)
    session: str            # sent as X-Session-ID when sessions are on
    output_tokens: int      # max_tokens
    messages: list = None   # chat messages (shared with the session's
                            # other turns: never modified)
    tools: list = None      # chat tools, or None
    record: dict = None     # a Mooncake record: its messages are built
                            # when needed (trace.chat_body)
    turn: int = 0           # 0 for a session's first request

    def body(self, model_name=MODEL, stream=True):
        """The /v1/chat/completions request body."""
        if self.record is not None:
            return trace.chat_body(self.record, model_name, stream)
        body = {'model': model_name, 'messages': self.messages}
        if self.tools:
            body['tools'] = self.tools
        body['max_tokens'] = self.output_tokens
        body['stream'] = stream
        if stream:
            body['stream_options'] = {'include_usage': True}
        return body

    def body_bytes(self, model_name=MODEL):
        """The body as the replay sends it."""
        return json.dumps(self.body(model_name),
                          separators=JSON_SEPARATORS).encode('ascii')

    def prompt_pieces(self):
        """The mock's prompt text of the request, in pieces
        (mock_backend.chat_prompt_pieces)."""
        return chat_prompt_pieces(self.body(stream=False))


@dataclass
class Workload:
    """A workload: its requests by arrival, and what made them."""
    name: str
    seed: int
    requests: list
    params: dict = field(default_factory=dict)

    def sessions(self):
        return len({r.session for r in self.requests})

    def duration(self):
        """Seconds from the first arrival to the last, at the own rate."""
        if not self.requests:
            return 0.0
        return self.requests[-1].arrival - self.requests[0].arrival

    def summary(self):
        """Counts and sizes, for reports."""
        n = len(self.requests)
        duration = self.duration()
        return {'workload': self.name, 'seed': self.seed, 'requests': n,
                'sessions': self.sessions(),
                'duration_s': round(duration, 3),
                'rate_per_s': round(n / duration, 3) if duration else None,
                'params': self.params}


# --- sampling and text --------------------------------------------------------

def from_quantiles(rng, table):
    """A value drawn from the distribution whose quantiles are table
    ((percent, value), ...): inverse CDF, linear between the points."""
    u = rng.random() * 100.0
    for (p0, v0), (p1, v1) in zip(table, table[1:]):
        if u <= p1:
            return v0 + (v1 - v0) * ((u - p0) / (p1 - p0) if p1 > p0 else 0)
    return table[-1][1]


def log_uniform(rng, low, high):
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def zipf_weights(n, s):
    return [1.0 / (k + 1) ** s for k in range(n)]


_WORDS_PER_ROUND = 360


def text(key, chars):
    """chars characters of pseudo-words, a pure function of key (a str):
    the text starts with key itself, so that texts of different keys
    differ from their first characters and share no prefix."""
    out = key + ':'
    round_no = 0
    pieces = [out]
    size = len(out)
    while size < chars:
        picks = hashlib.shake_128(('%s/%d' % (key, round_no)).encode()
                                  ).digest(_WORDS_PER_ROUND)
        piece = ' ' + ' '.join(operator.itemgetter(*picks)(trace.VOCABULARY))
        pieces.append(piece)
        size += len(piece)
        round_no += 1
    return ''.join(pieces)[:chars]


def tokens_text(key, tokens):
    """A text of `tokens` tokens (model.CHARS_PER_TOKEN characters each)."""
    return text(key, max(1, int(tokens)) * model.CHARS_PER_TOKEN)


def _user(content):
    return {'role': 'user', 'content': content}


def _assistant(content):
    return {'role': 'assistant', 'content': content}


def _conversation(sid, system, turns):
    """The requests of a chat session, one per (user text, answer tokens)
    turn: each sends the system message, the history so far and its user
    message; its answer (filler of answer tokens) then joins the history,
    as a chat client keeps it."""
    history = [system]
    out = []
    for k, (text, answer) in enumerate(turns):
        messages = history + [_user(text)]
        out.append(Request(0, 0.0, sid, answer, messages, turn=k))
        history = messages + [_assistant(tokens_text('a-%s-%d' % (sid, k),
                                                     answer))]
    return out


def _window(name, seed, plan_session, rate, duration):
    """The requests of a window of `duration` seconds of a stationary
    stream of sessions, as a slice of a real trace holds them: sessions
    start in a Poisson process, also before the window (their later turns
    fall in it), and only the requests that arrive inside it are kept.

    plan_session(rng, sid) draws a session (every random number it needs)
    and returns (offsets, build): the seconds from the session's start of
    each of its requests, and a function that builds those Requests, with
    their texts, without drawing anything, called only for sessions that
    have a request in the window.  The start rate makes the mean request
    rate `rate`: it is rate / (mean requests a session), the mean taken
    over 1000 pilot sessions drawn with a generator of their own; sessions
    start from the longest pilot session's span before the window.
    Returns the Requests sorted by arrival (ties in session order),
    numbered."""
    pilot_rng = random.Random('%s/%d/pilot' % (name, seed))
    pilot = [plan_session(pilot_rng, 'pilot')[0] for _ in range(1000)]
    per_session = sum(len(offsets) for offsets in pilot) / len(pilot)
    lead = max(offsets[-1] for offsets in pilot)
    start_rate = rate / per_session
    rng = random.Random('%s/%d' % (name, seed))
    placed = []
    t = -lead
    order = 0
    while t < duration:
        sid = '%s-%d-%d' % (name, seed, order)
        offsets, build = plan_session(rng, sid)
        if any(0 <= t + offset < duration for offset in offsets):
            for k, (offset, req) in enumerate(zip(offsets, build())):
                at = t + offset
                if 0 <= at < duration:
                    req.arrival = round(at, 6)
                    placed.append((req.arrival, order, k, req))
        order += 1
        t += rng.expovariate(start_rate)
    placed.sort(key=lambda item: item[:3])
    requests = [item[3] for item in placed]
    for i, req in enumerate(requests):
        req.index = i
    return requests


# --- conversation: the Mooncake trace -------------------------------------

CONVERSATION_SLICE = {'full': 4000, 'quick': 600}


def conversation(seed=1, size='full', limit=None, start=None,
                 path=trace.DEFAULT_TRACE, arrivals='trace'):
    """A slice of the Mooncake conversation trace, at its own arrival times
    and rate (3.40 requests/s over the whole trace).  Seed s takes slice s:
    `limit` requests (CONVERSATION_SLICE[size] by default) from
    (s - 1) × limit, wrapped to fit the trace, unless `start` is given.
    Sessions are the trace's conversations (trace.session_id).

    arrivals: 'trace', the trace's timestamps, which come in ticks of 3 s,
    so that up to 28 requests arrive in the same millisecond; or 'spread',
    each request at a random moment of its tick (trace.spread_ticks, from
    the seed), as they arrived.  Requests keep their index in the trace."""
    if limit is None:
        limit = CONVERSATION_SLICE[size]
    if start is None:
        total = _trace_length(path)
        span = max(1, total - limit + 1)
        start = ((seed - 1) * limit) % span
    records = trace.load_trace(path, limit, start)
    times = trace.arrival_seconds(records)
    params = {'trace': path.rsplit('/', 1)[-1], 'start': start,
              'limit': limit}
    if arrivals == 'spread':
        times = trace.spread_ticks(times, random.Random(seed))
        params['arrivals'] = arrivals
    elif arrivals != 'trace':
        raise ValueError('unknown arrivals %r' % arrivals)
    requests = [Request(start + i, arrival, trace.session_id(record, start + i),
                        record['output_length'], record=record)
                for i, (record, arrival) in enumerate(zip(records, times))]
    # by arrival; a tick's requests in trace order when not spread
    requests.sort(key=operator.attrgetter('arrival'))
    return Workload('conversation', seed, requests, params)


_trace_lengths = {}


def _trace_length(path):
    if path not in _trace_lengths:
        with open(path, encoding='utf-8') as f:
            _trace_lengths[path] = sum(1 for line in f if line.strip())
    return _trace_lengths[path]


# --- shared-docs --------------------------------------------------------------

# Seconds of the workload (at its own rate) by size.
SHARED_DOCS_SECONDS = {'full': 2400, 'quick': 250}


def shared_docs(seed=1, size='full', duration=None, documents=16,
                doc_chars=(5000, 30000), popularity=1.0, max_turns=8,
                rate=MOONCAKE_RATE):
    """Sessions asking questions about long documents, a few of which are
    shared by many sessions (as SGLang's generated-shared-prefix groups
    share a system prompt), each with follow-up turns that keep the
    previous questions and answers in the messages, as a chat client does.

    - documents: `documents` texts of doc_chars characters, log-uniform
      (5-30 k characters); assumption: 16 of them.
    - which document a session reads: Zipf with exponent `popularity`
      (assumption: 1.0, so the first few documents are each read by many
      sessions, the last by a few).
    - a short shared system prompt; the first user message is the document
      then the question.
    - questions: 128 tokens and answers 256 tokens (the SGLang
      generated-shared-prefix defaults: question_len, output_len).
    - turns per session: the Mooncake conversations of two or more turns
      (MOONCAKE_TURNS), capped at max_turns (assumption: 8).
    - time between turns: MOONCAKE_THINK.
    - rate: the Mooncake conversation trace's, 3.40 requests/s; `duration`
      seconds of it (SHARED_DOCS_SECONDS by size).
    """
    docs_rng = random.Random('shared-docs/%d/documents' % seed)
    system = {'role': 'system', 'content': text('docs-system', 240)}
    docs = [text('doc-%d-%d' % (seed, d),
                 int(log_uniform(docs_rng, *doc_chars)))
            for d in range(documents)]
    weights = zipf_weights(documents, popularity)

    def plan_session(rng, sid):
        doc = rng.choices(range(documents), weights)[0]
        turns = min(max_turns, max(2, round(from_quantiles(
            rng, MOONCAKE_TURNS))))
        offsets = [0.0]
        for _ in range(turns - 1):
            offsets.append(offsets[-1] + from_quantiles(rng, MOONCAKE_THINK))

        def build():
            questions = [tokens_text('q-%s-%d' % (sid, k),
                                     GSP_QUESTION_TOKENS)
                         for k in range(turns)]
            questions[0] = 'Document:\n%s\n\nQuestion: %s' % (
                docs[doc], questions[0])
            return _conversation(sid, system, [
                (q, GSP_OUTPUT_TOKENS) for q in questions])
        return offsets, build

    duration = SHARED_DOCS_SECONDS[size] if duration is None else duration
    requests = _window('shared-docs', seed, plan_session, rate, duration)
    return Workload('shared-docs', seed, requests, {
        'duration_s': duration, 'documents': documents,
        'document_chars': [len(d) for d in docs], 'popularity': popularity,
        'max_turns': max_turns, 'rate': rate})


# --- agentic ------------------------------------------------------------------

AGENTIC_SECONDS = {'full': 3000, 'quick': 320}


def agent_tools(count=12):
    """`count` function tools in the OpenAI chat format, of 200-400 tokens
    each (assumption: a coding agent's dozen tools)."""
    rng = random.Random('agentic-tools')
    tools = []
    for n in range(count):
        tools.append({'type': 'function', 'function': {
            'name': 'tool_%02d' % n,
            'description': tokens_text('tool-%d' % n, rng.randint(150, 300)),
            'parameters': {
                'type': 'object',
                'properties': {
                    'arg_%d' % a: {'type': 'string',
                                   'description': tokens_text(
                                       'tool-%d-arg-%d' % (n, a), 16)}
                    for a in range(rng.randint(2, 5))},
                'required': ['arg_0']}}})
    return tools


def agentic(seed=1, size='full', duration=None, turns=(8, 24),
            task_tokens=(64, 512), result_tokens=(64, 2048),
            tool_seconds=(0.5, 4.0), max_burst=8, rate=AZURE_CODE_RATE,
            decode_ms_per_token=model.ReplicaParams.decode_ms_per_token):
    """Agent sessions: the same long system prompt and tool schemas in
    every request (in the body's `tools`), then the session's task, then
    one assistant tool call and its tool result per turn.

    - system prompt: 2,048 tokens (SGLang generated-shared-prefix's
      system_prompt_len), shared by every session; 12 tools of 200-400
      tokens each (agent_tools; assumption).
    - turns: uniform in `turns` (assumption: 8-24 model calls a task).
    - task: log-uniform `task_tokens` (assumption); tool results:
      log-uniform `result_tokens` (assumption: a command's output or part
      of a file).
    - output of each call: AZURE_CODE_OUTPUT (median 13 tokens: calls are
      short), capped at its p99, 252.
    - time between turns: the call's decode time (decode_ms_per_token, the
      model's) plus the tool's run time, log-uniform `tool_seconds`
      (assumption).
    - sibling bursts: a turn is, with probability p, a burst of several
      requests of the session sent within 10 ms (sub-agents or n-way
      sampling: the same history plus each its own short instruction; the
      session goes on from the first).  Burst sizes are the code trace's
      (AZURE_CODE_BURST, capped at max_burst) and p makes 60 % of requests
      part of a burst, as in the code trace (AZURE_CODE_BURSTY_SHARE).
    - rate: the Azure code trace's, 2.57 requests/s; `duration` seconds of
      it (AGENTIC_SECONDS by size).
    """
    system = {'role': 'system', 'content': tokens_text(
        'agent-system', GSP_SYSTEM_TOKENS)}
    tools = agent_tools()
    mean_burst = _table_mean(AZURE_CODE_BURST, max_burst)
    share = AZURE_CODE_BURSTY_SHARE
    # share = p m / (p m + 1 - p)  =>  p = share / (m - share (m - 1))
    p_burst = share / (mean_burst - share * (mean_burst - 1))

    def plan_session(rng, sid):
        task = log_uniform(rng, *task_tokens)
        offsets = []
        plan = []           # per turn: call, tool, result, sibling lengths
        offset = 0.0
        for k in range(rng.randint(*turns)):
            call = min(252, max(1, round(from_quantiles(
                rng, AZURE_CODE_OUTPUT))))
            siblings = 1
            if rng.random() < p_burst:
                siblings = min(max_burst, max(2, round(from_quantiles(
                    rng, AZURE_CODE_BURST))))
            at = offset
            extra = []
            for j in range(siblings):
                offsets.append(at)
                at += rng.uniform(0, AZURE_CODE_BURST_GAP)
                extra.append(rng.randint(32, 128) if j else 0)
            plan.append((call, rng.randrange(len(tools)),
                         log_uniform(rng, *result_tokens), extra))
            offset += call * decode_ms_per_token / 1000.0 \
                + log_uniform(rng, *tool_seconds)

        def build():
            history = [system, _user(tokens_text('task-%s' % sid, task))]
            out = []
            for k, (call, tool, result, extra) in enumerate(plan):
                for j, tokens in enumerate(extra):
                    messages = history if j == 0 else history + [_user(
                        tokens_text('sub-%s-%d-%d' % (sid, k, j), tokens))]
                    out.append(Request(0, 0.0, sid, call, messages, tools,
                                       turn=k))
                history = history + [
                    _assistant('call tool_%02d: %s' % (
                        tool, tokens_text('call-%s-%d' % (sid, k), call))),
                    {'role': 'tool', 'tool_call_id': 'call-%d' % k,
                     'content': tokens_text('result-%s-%d' % (sid, k),
                                            result)}]
            return out
        return offsets, build

    duration = AGENTIC_SECONDS[size] if duration is None else duration
    requests = _window('agentic', seed, plan_session, rate, duration)
    return Workload('agentic', seed, requests, {
        'duration_s': duration, 'tools': len(tools), 'turns': list(turns),
        'burst_probability': round(p_burst, 4), 'rate': rate})


def _table_mean(table, cap):
    """The mean of a quantile table's distribution, values capped."""
    total = 0.0
    for (p0, v0), (p1, v1) in zip(table, table[1:]):
        total += (p1 - p0) / 100.0 * (min(v0, cap) + min(v1, cap)) / 2
    return total


# --- chat -----------------------------------------------------------------------

def _chat_session(rng, sid, system, turns, first_tokens, max_message_tokens):
    """(offsets, build) of a chat session of `turns` turns: its first
    message of first_tokens() tokens, each later one what a Mooncake
    conversation's turn adds (MOONCAKE_GROWTH) less the answer before it,
    at least 16 tokens and at most max_message_tokens; answers of
    AZURE_CONV_OUTPUT tokens, MOONCAKE_THINK seconds apart."""
    offsets = []
    plan = []               # per turn: message tokens, answer tokens
    offset = 0.0
    answer = 0
    for k in range(turns):
        if k == 0:
            tokens = first_tokens()
        else:
            tokens = min(max_message_tokens,
                         max(16, from_quantiles(rng, MOONCAKE_GROWTH)
                             - answer))
        answer = max(1, round(from_quantiles(rng, AZURE_CONV_OUTPUT)))
        plan.append((tokens, answer))
        offsets.append(offset)
        offset += from_quantiles(rng, MOONCAKE_THINK)

    def build():
        return _conversation(sid, system, [
            (tokens_text('u-%s-%d' % (sid, k), tokens), answer)
            for k, (tokens, answer) in enumerate(plan)])
    return offsets, build


CHAT_SECONDS = {'full': 1800, 'quick': 180}


def chat(seed=1, size='full', duration=None, max_turns=LMCACHE_ROUNDS,
         max_message_tokens=4096, rate=AZURE_CONV_RATE):
    """Multi-turn chat in the shape of LMCache's multi_round_qa and
    Dynamo's multi-turn session replay: sessions of up to 20 turns whose
    history grows turn after turn, a short system prompt shared by all,
    think time between turns.

    - system prompt: LMCache's short-input one, "You are a helpful
      assistant.".
    - turns: uniform from 1 to max_turns (LMCache's 20 rounds; uniform is
      an assumption).
    - first message: AZURE_CONV_CONTEXT (a single request's prompt, median
      1,020 tokens), capped at max_message_tokens; later messages: what a
      Mooncake conversation's turn adds (MOONCAKE_GROWTH) less the answer
      before it, at least 16 tokens, capped likewise.
    - answers: AZURE_CONV_OUTPUT (median 129 tokens).
    - time between turns: MOONCAKE_THINK.
    - rate: the Azure conversation trace's, 5.53 requests/s; `duration`
      seconds of it (CHAT_SECONDS by size).
    """
    system = {'role': 'system', 'content': LMCACHE_SYSTEM_PROMPT}

    def plan_session(rng, sid):
        turns = rng.randint(1, max_turns)
        return _chat_session(
            rng, sid, system, turns,
            lambda: min(max_message_tokens,
                        from_quantiles(rng, AZURE_CONV_CONTEXT)),
            max_message_tokens)

    duration = CHAT_SECONDS[size] if duration is None else duration
    requests = _window('chat', seed, plan_session, rate, duration)
    return Workload('chat', seed, requests, {
        'duration_s': duration, 'max_turns': max_turns, 'rate': rate})


# --- long prompts among chats ------------------------------------------------

# Assumptions, as no shared trace holds such prompts: one session in fifty
# opens with a whole document or codebase of 30,000 to 100,000 tokens
# (log-uniform), and asks one to three questions about it.
LONG_MIX_SHARE = 0.02
LONG_MIX_TOKENS = (30000, 100000)
LONG_MIX_TURNS = 3


def long_mix(seed=1, size='full', duration=None, share=LONG_MIX_SHARE,
             rate=AZURE_CONV_RATE):
    """Chat (chat()'s sessions, system prompt, answers, think times and
    rate) with a few long prompts among the short ones: a share of the
    sessions open with a first message of LONG_MIX_TOKENS tokens
    (log-uniform) and have 1 to LONG_MIX_TURNS turns, whose later messages
    are chat's.  What a router must not do with them: queue short chats
    behind a long prefill, or copy a long prompt's cache around."""
    system = {'role': 'system', 'content': LMCACHE_SYSTEM_PROMPT}

    def plan_session(rng, sid):
        long = rng.random() < share
        turns = rng.randint(1, LONG_MIX_TURNS if long else LMCACHE_ROUNDS)
        return _chat_session(
            rng, sid, system, turns,
            lambda: (log_uniform(rng, *LONG_MIX_TOKENS) if long
                     else min(4096, from_quantiles(rng, AZURE_CONV_CONTEXT))),
            4096)

    duration = CHAT_SECONDS[size] if duration is None else duration
    requests = _window('long-mix', seed, plan_session, rate, duration)
    return Workload('long-mix', seed, requests, {
        'duration_s': duration, 'share': share, 'rate': rate,
        'long_tokens': list(LONG_MIX_TOKENS)})


# --- by name --------------------------------------------------------------------

GENERATORS = {
    'conversation': conversation,
    'shared-docs': shared_docs,
    'agentic': agentic,
    'chat': chat,
    'long-mix': long_mix,
}
NAMES = tuple(GENERATORS)


def load(name, seed=1, size='full', **params):
    """The workload `name` (NAMES) of this seed and size ('full' or
    'quick')."""
    try:
        generator = GENERATORS[name]
    except KeyError:
        raise ValueError('unknown workload %r; known: %s'
                         % (name, ', '.join(NAMES))) from None
    return generator(seed=seed, size=size, **params)


def add_workload_arguments(parser):
    """--workload, --seed and --size for the tools that read a workload
    (bounds.py, replay.py); --trace, --start and --limit (added by
    trace.add_trace_arguments) choose a slice of the conversation trace."""
    parser.add_argument('--workload', choices=NAMES, default='conversation',
                        help='default: %(default)s')
    parser.add_argument('--seed', type=int, default=1,
                        help='generated workloads: the random seed; '
                             'conversation: which slice (default 1)')
    parser.add_argument('--size', choices=('full', 'quick'),
                        help='workload size (default full; conversation: '
                             'without --size, --start and --limit choose '
                             'the records, by default the whole trace)')
    parser.add_argument('--arrivals', choices=('trace', 'spread'),
                        default='trace',
                        help='conversation: the trace\'s timestamps, in '
                             'ticks of 3 s (default), or each request at a '
                             'random moment of its tick')


def from_args(args):
    """The workload that add_workload_arguments' and the trace's options
    select."""
    arrivals = getattr(args, 'arrivals', 'trace')
    if args.workload != 'conversation':
        if arrivals != 'trace':
            raise ValueError('--arrivals spread: the conversation workload '
                             'only (the others are not in ticks)')
        return load(args.workload, args.seed, args.size or 'full')
    if args.size is None or args.limit is not None or args.start:
        start = args.start or 0
        limit = args.limit
        if limit is None:
            limit = max(0, _trace_length(args.trace) - start)
        return conversation(args.seed, limit=limit, start=start,
                            path=args.trace, arrivals=arrivals)
    return conversation(args.seed, args.size, path=args.trace,
                        arrivals=arrivals)
