#!/usr/bin/env python3
"""Mock OpenAI-compatible inference replicas, for benchmarking the balancer.

One asyncio process serves several independent replicas, one per port.  Each
replica follows the model of model.py and fleet.py: its own LRU prefix
cache of chained block hashes, at most --max-running admitted requests (the
others wait in FIFO order), one FIFO prefill lane whose duration depends on
the uncached prompt tokens, then a concurrent decode phase.  Nothing is
generated for real, so a laptop can stand in for a fleet of GPUs while the
figures that matter to a balancer -- cached tokens, time to first token,
queueing -- behave as on a real fleet.

    python3 bench/sim/mock_backend.py --ports 9001,9002,9003,9004 \\
        [--host 127.0.0.1] [--max-running 32] [--prefill-ms-per-token 0.05] \\
        [--decode-ms-per-token 20] [--cache-tokens 262144] \\
        [--time-scale 1.0] [--slowdowns 1,3] [--stream-usage always|asked] \\
        [--name-prefix replica] [--pidfile FILE]

Replicas are named <prefix>-1, <prefix>-2, ... in the order of --ports.  A
port of 0 picks a free port.  Once every port listens, one line
"listening <name> <host>:<port>" per replica and then "ready" are printed.

Endpoints, per replica:
    POST /v1/chat/completions, /v1/completions, /v1/responses
                   simulated inference, "stream": true for server-sent events
    GET, DELETE    /v1/responses/{id}
    POST /v1/responses/{id}/cancel
    GET  /v1/responses/{id}/input_items
    POST /v1/conversations
    GET, DELETE    /v1/conversations/{id}
    GET  /v1/conversations/{id}/items
                   lists take ?order=desc (the default, as OpenAI's) or asc
    GET  /metrics  Prometheus text: cache, queue and store counters
    GET  /stats    the same figures as JSON, and how many /metrics pages
                   were served (scrapes)
    POST /reset    empties the prefix cache and the stores, zeroes the counters
    GET  /health, /v1/models
Every response carries X-Replica and X-Replica-Port.  Inference replies
that are served (200) also carry X-Replica-TTFT: the seconds, in the
model's time, from the request's arrival (its body read) to its first
token, the time to first token as the engine itself sees it (vLLM's
time_to_first_token_seconds), without the client's, the proxy's and the
connections' time, nor the mock's timers' lateness (ServedReplica).

Like vLLM with its default in-memory store, each replica keeps its own
responses (unless "store": false) and conversations, so a follow-up routed
to another replica than its previous turn's gets vLLM's 404 ("Response with
id '...' not found.").  A response is stored when it arrives, in progress,
and completed when its reply is out.  A follow-up's prompt is its previous
turn's prompt, then that turn's output as an assistant message, then its
own input items (in the chat message form; its instructions are not
repeated, as vLLM drops the previous ones and the same instructions come
first again): it extends the previous prompt, whose blocks the replica
cached.  In a conversation the prompt is the instructions, a newline, then
the conversation's items and the input items; the input and the output are
appended to the conversation's items.  Ids are prefix + uuid4 hex, unique
across replicas and runs.  The lookups that fail count in not_found_total.

HTTP/1.1 is http1.py's, on asyncio streams: thousands of requests wait on
timers in one thread, and the work per request stays small (one
json.loads, one block_chain) -- the mock must not be the bottleneck of the
benchmark it serves.
"""

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote

if __package__ in (None, ''):       # run as a file: bench/sim/mock_backend.py
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))

from bench.sim import fleet, http1, model  # noqa: E402
from bench.sim.http1 import HttpError  # noqa: E402

DEFAULT_OUTPUT_TOKENS = 16
MAX_STREAM_CHUNKS = 8            # content chunks per streamed reply
MAX_BODY_BYTES = 64 * 1024 * 1024
STREAM_LIMIT = 256 * 1024        # asyncio buffer: the longest header line
JSON_SEPARATORS = (',', ':')
# The responses and the conversations a replica keeps at most, each store
# dropping its least recently used first.
RESPONSE_STORE_LIMIT = 100000
CONVERSATION_STORE_LIMIT = 100000
TEXT_PART_TYPES = ('text', 'input_text', 'output_text')


# ---------------------------------------------------------------------------
# Requests: what to simulate
# ---------------------------------------------------------------------------

# With AFFINITY_MOCK_TRACE=FILE, a line "MA <time> <replica> <in flight>"
# as each request arrives and "MF ..." as it ends, beside the module's own
# trace (bench/diagnostics/decisions.py reads both).
_TRACE = open(os.environ['AFFINITY_MOCK_TRACE'], 'a', buffering=1) \
    if os.environ.get('AFFINITY_MOCK_TRACE') else None


def trace(what, name, inflight):
    if _TRACE:
        _TRACE.write('%s %.6f %s %d\n' % (what, time.time(), name, inflight))


class BadRequest(Exception):
    """A request body the OpenAI API would reject with 400."""


@dataclass
class Job:
    """One inference request, reduced to what the replica model needs."""
    kind: str               # 'chat', 'completion' or 'response'
    model_name: str
    prompt_tokens: int
    chain: list             # model.block_chain of the prompt text
    output_tokens: int
    limited: bool           # the client set the output length
    stream: bool
    stream_usage: bool = True   # a stream ends with its usage


def content_text(content):
    """Text of a message content: a string, or the text parts of a list
    (TEXT_PART_TYPES), as the chat template would see them."""
    if isinstance(content, str):
        return content
    if content is None:
        return ''
    if not isinstance(content, list):
        raise BadRequest('message content must be a string or a list')
    texts = []
    for part in content:
        if isinstance(part, dict) and part.get('type') in TEXT_PART_TYPES:
            text = part.get('text', '')
            if not isinstance(text, str):
                raise BadRequest('content part text must be a string')
            texts.append(text)
    return ''.join(texts)


def message_pieces(messages):
    """role + newline + text + newline for each message, so that a
    conversation's next turn extends the previous turn's prompt."""
    pieces = []
    for message in messages:
        if not isinstance(message, dict):
            raise BadRequest('each message must be an object')
        role = message.get('role', '')
        if not isinstance(role, str):
            raise BadRequest('message role must be a string')
        pieces.append(role + '\n' + content_text(message.get('content')) + '\n')
    return pieces


def messages_text(messages):
    """The text of chat messages (message_pieces() concatenated)."""
    return ''.join(message_pieces(messages))


def tool_pieces(tools):
    """"tool" + newline + compact JSON + newline for each tool definition of
    a chat body: chat templates render the tools before the conversation,
    so they are part of the prompt, and of its cached prefix."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be a list")
    pieces = []
    for tool in tools:
        if not isinstance(tool, dict):
            raise BadRequest('each tool must be an object')
        pieces.append('tool\n' + json.dumps(tool, separators=JSON_SEPARATORS)
                      + '\n')
    return pieces


def chat_prompt_pieces(body):
    """The prompt text of a /v1/chat/completions body in pieces, one per
    tool and one per message, in order: what the offline simulator hashes
    (bench/sim/bounds.py), piece by piece, so that the chains of a
    conversation's turns are computed once for their common messages."""
    messages = body.get('messages')
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    return tool_pieces(body.get('tools')) + message_pieces(messages)


def chat_prompt(body):
    """Prompt text of a /v1/chat/completions body: its tools, then its
    messages."""
    return ''.join(chat_prompt_pieces(body))


def completion_prompt(body):
    """Prompt text of a /v1/completions body: a batch of prompts is
    simulated as its first prompt, one request being one sequence here."""
    prompt = body.get('prompt')
    if isinstance(prompt, list) and prompt:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest("'prompt' must be a non-empty string or list of strings")
    return prompt


def response_prompt(body):
    """Prompt text of a /v1/responses body: instructions, a newline, then
    the input string or its items in the chat message form."""
    instructions = body.get('instructions') or ''
    items = body.get('input')
    if not isinstance(instructions, str):
        raise BadRequest("'instructions' must be a string")
    if isinstance(items, list):
        items = messages_text(items)
    elif items is None:
        items = ''
    elif not isinstance(items, str):
        raise BadRequest("'input' must be a string or a list of items")
    if not instructions and not items:
        raise BadRequest("'input' is required")
    return instructions + '\n' + items


def input_items(body):
    """The input of a /v1/responses body (checked by response_prompt()) as
    the stores keep it: a list of items, a string being one user message."""
    items = body.get('input')
    if isinstance(items, str):
        items = [{'type': 'message', 'role': 'user',
                  'content': [{'type': 'input_text', 'text': items}]}]
    return [stored_item(item) for item in items or ()]


def stored_item(item):
    """A copy of an input item with a type and an id, as stored."""
    if not isinstance(item, dict):
        raise BadRequest('each input item must be an object')
    item = dict(item)
    item.setdefault('type', 'message')
    item.setdefault('id', new_id('msg_'))
    return item


def response_links(body):
    """(previous_response_id, conversation id, store) of a /v1/responses
    body; the conversation is an id or an object with an id."""
    previous_id = body.get('previous_response_id')
    if previous_id is not None and not isinstance(previous_id, str):
        raise BadRequest("'previous_response_id' must be a string")
    conversation_id = body.get('conversation')
    if isinstance(conversation_id, dict):
        conversation_id = conversation_id.get('id')
        if not isinstance(conversation_id, str):
            raise BadRequest("'conversation' must have a string 'id'")
    elif conversation_id is not None and not isinstance(conversation_id, str):
        raise BadRequest("'conversation' must be an id or an object")
    if previous_id is not None and conversation_id is not None:
        raise BadRequest("Mutually exclusive parameters: Ensure you are only "
                         "providing one of: 'previous_response_id' or "
                         "'conversation'.")
    store = body.get('store')
    if store is not None and not isinstance(store, bool):
        raise BadRequest("'store' must be a boolean")
    return previous_id, conversation_id, store is not False


def conversation_fields(body):
    """(items, metadata) of a /v1/conversations body, checked."""
    items = body.get('items')
    if items is None:
        items = []
    if not isinstance(items, list):
        raise BadRequest("'items' must be a list")
    items = [stored_item(item) for item in items]
    messages_text(items)        # the checks of a prompt that will hold them
    metadata = body.get('metadata')
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise BadRequest("'metadata' must be an object")
    return items, metadata


PROMPT_READERS = {              # /v1/responses: ServedReplica.open_response
    'chat': chat_prompt,
    'completion': completion_prompt,
}


def output_tokens_of(body):
    """The requested output length, and whether the client gave one."""
    for field in ('max_completion_tokens', 'max_tokens', 'max_output_tokens'):
        value = body.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BadRequest("'%s' must be a positive integer" % field)
        return value, True
    return DEFAULT_OUTPUT_TOKENS, False


def parse_body(raw_body):
    """Decodes a request body, which must be a JSON object; raises
    BadRequest."""
    try:
        body = json.loads(raw_body)
    except (ValueError, RecursionError):
        raise BadRequest('request body is not valid JSON') from None
    if not isinstance(body, dict):
        raise BadRequest('request body must be a JSON object')
    return body


def make_job(kind, body, text, usage_if_asked=False):
    """The job of a checked body whose prompt is text; raises BadRequest.
    With usage_if_asked, a chat or completion stream ends with its usage
    only when its stream_options ask for it (include_usage), as vLLM's."""
    try:
        chain = model.block_chain(text)
    except UnicodeEncodeError:
        raise BadRequest('prompt is not valid Unicode') from None
    output_tokens, limited = output_tokens_of(body)
    model_name = body.get('model')
    return Job(kind=kind,
               model_name=model_name if isinstance(model_name, str) else 'mock',
               prompt_tokens=model.prompt_tokens(text),
               chain=chain,
               output_tokens=output_tokens,
               limited=limited,
               stream=body.get('stream') is True,
               stream_usage=not usage_if_asked or include_usage(body))


def include_usage(body):
    """Whether a body's stream_options ask for the usage at the end."""
    options = body.get('stream_options')
    return isinstance(options, dict) and options.get('include_usage') is True


# ---------------------------------------------------------------------------
# Stores: the Responses API objects a replica keeps
# ---------------------------------------------------------------------------

def new_id(prefix):
    """An id unique across replicas, processes and restarts, as vLLM's
    prefix + random_uuid()."""
    return prefix + uuid.uuid4().hex


class NotFound(Exception):
    """A response or conversation that the replica does not keep: 404,
    worded as vLLM words it; param names the body field that named it."""

    def __init__(self, what, object_id, param=None):
        super().__init__("%s with id '%s' not found." % (what, object_id))
        self.param = param


class LruStore:
    """At most `limit` objects by id; the least recently used goes first."""

    def __init__(self, limit):
        self.limit = limit
        self.objects = OrderedDict()

    def get(self, object_id):
        found = self.objects.get(object_id)
        if found is not None:
            self.objects.move_to_end(object_id)
        return found

    def put(self, object_id, value):
        self.objects[object_id] = value
        self.objects.move_to_end(object_id)
        if len(self.objects) > self.limit:
            self.objects.popitem(last=False)

    def pop(self, object_id):
        return self.objects.pop(object_id, None)

    def __len__(self):
        return len(self.objects)


class StoredResponse:
    """A response as its replica keeps it: obj, the object that GET
    returns; its input items; its prompt and output text, which a follow-up
    extends.  The prompt is held as the text added to the previous turn's
    prompt, so that a long chain of turns holds each text once."""

    def __init__(self, previous, prompt_tail, items, conversation, stored):
        self.obj = None             # ServedReplica.start_response sets it
        self.previous = previous
        self.prompt_tail = prompt_tail
        self.input_items = items
        self.conversation = conversation
        self.stored = stored        # False for "store": false
        self.output_text = ''

    def prompt(self):
        tails = []
        turn = self
        while turn is not None:
            tails.append(turn.prompt_tail)
            turn = turn.previous
        return ''.join(reversed(tails))

    def answer_piece(self):
        """The output, as the assistant message a follow-up's prompt has
        after this prompt."""
        return 'assistant\n' + self.output_text + '\n'

    def links(self):
        """The fields of the response object that name the turn's context."""
        conversation = self.conversation
        return {'previous_response_id':
                self.previous.obj['id'] if self.previous else None,
                'conversation':
                {'id': conversation.id} if conversation else None,
                'store': self.stored}

    @property
    def in_progress(self):
        return self.obj['status'] in ('queued', 'in_progress')

    def complete(self, obj, text):
        """The reply is out: keeps its object unless the response was
        cancelled meanwhile, and appends the turn to its conversation."""
        if not self.in_progress:
            return
        self.obj = obj
        self.output_text = text
        if self.conversation is not None:
            self.conversation.items.extend(self.input_items + obj['output'])

    def cancel(self):
        """Cancels the response if still in progress (a request that ends
        without its reply, its client gone, is cancelled too)."""
        if self.obj is not None and self.in_progress:
            self.obj = dict(self.obj, status='cancelled')


class Conversation:
    """A conversation as its replica keeps it: its object and its items."""

    def __init__(self, items, metadata):
        self.id = new_id('conv_')
        self.obj = {'id': self.id, 'object': 'conversation',
                    'created_at': int(time.time()), 'metadata': metadata}
        self.items = items


# What the stores count, in the form of fleet.METRICS.
STORE_METRICS = (
    ('not_found_total', 'counter',
     'Responses and conversations looked up and not kept here (404).'),
    ('stored_responses', 'gauge', 'Responses kept in the store.'),
    ('stored_conversations', 'gauge', 'Conversations kept in the store.'),
)


# ---------------------------------------------------------------------------
# Replicas: the timing model
# ---------------------------------------------------------------------------

async def wait_turn(slots, waiter):
    """Waits until waiter, queued in slots (fleet.Slots), is handed a slot
    by free_slot(): strictly in arrival order, where asyncio.Semaphore lets
    a newcomer overtake a woken waiter.  Returns the model time the slot was
    freed at.  A wait cancelled meanwhile leaves the queue, or gives back
    the slot handed to it already."""
    try:
        return await waiter
    except asyncio.CancelledError:
        if waiter.done() and not waiter.cancelled():
            free_slot(slots, asyncio.get_running_loop().time())
        else:
            slots.withdraw(waiter)
        raise


def free_slot(slots, when):
    """Frees a slot of slots at model time when: the oldest waiter still
    waiting has it, from then."""
    waiter = slots.release()
    while waiter is not None and waiter.done():
        waiter = slots.release()
    if waiter is not None:
        waiter.set_result(when)


class Once:
    """Wraps a callback so that only its first call has an effect; the slot
    of a request is freed by a timer or by an error, whichever comes first."""

    def __init__(self, callback):
        self.callback = callback

    def __call__(self, *args):
        callback, self.callback = self.callback, None
        if callback is not None:
            callback(*args)


class ServedReplica:
    """A replica of the fleet (fleet.Replica) served on one port: its
    requests go through the model's states in real time.

    The model's times are kept apart from the timers that carry them out:
    a slot or the prefill lane is handed on at the model time it is freed
    (a running request's end of decode, a prefill's end), and the next
    request's prefill and first token are reckoned from there, as the
    fleet simulator reckons them.  A timer that fires late, on cores that
    the proxy and the client share, then delays that request's own reply,
    not every request queued behind it: on a replay many times faster than
    real time, a fraction of a millisecond per hand-over would otherwise
    add up to more than the prefills of an agent's mostly cached prompts.

    requests_total and prompt_tokens_total count requests when they arrive;
    the cache counters count them when their prefill starts, the moment the
    cache is looked up.  The replica keeps its own responses and
    conversations (Stores), and counts the lookups that miss them."""

    def __init__(self, replica, port, usage_if_asked=False):
        self.replica = replica
        self.name = replica.name
        self.port = port
        self.usage_if_asked = usage_if_asked    # --stream-usage asked
        self.params = replica.params
        self.sequence = 0
        self.lane_free = 0.0        # model time the last prefill ends
        self.scrapes = 0            # /metrics pages served
        self.empty_stores()

    def empty_stores(self):
        self.responses = LruStore(RESPONSE_STORE_LIMIT)
        self.conversations = LruStore(CONVERSATION_STORE_LIMIT)
        self.not_found = 0

    def next_id(self):
        self.sequence += 1
        return '%s-%d' % (self.name, self.sequence)

    async def admit(self, job, arrived):
        """Counts the request in (arrived: loop time) and waits for a
        running slot; returns the model time it has one from."""
        waiter = asyncio.get_running_loop().create_future()
        admitted = self.replica.arrive(waiter, job.prompt_tokens)
        trace('MA', self.name, self.replica.inflight)
        if admitted:
            return arrived
        return max(arrived, await wait_turn(self.replica.admission, waiter))

    def finish(self, when):
        """Frees the running slot of a request at model time when."""
        free_slot(self.replica.admission, when)
        trace('MF', self.name, self.replica.inflight)

    async def prefill(self, job, ready):
        """Waits for the prefill lane, then spends the prefill time of the
        uncached tokens from when both the request (ready, model time) and
        the lane (lane_free, whoever held it last) are; returns the cached
        token count and the model time the prefill ends, the first token."""
        replica = self.replica
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        if not replica.lane.take(waiter):
            await wait_turn(replica.lane, waiter)
        end = loop.time()
        try:
            cached, seconds = replica.start_prefill(job.chain,
                                                    job.prompt_tokens)
            end = max(ready, self.lane_free) + seconds
            self.lane_free = end
            await sleep_until(end)
            replica.end_prefill(job.chain)
        finally:
            # Before the prefill's end only when the request failed.
            freed = min(end, loop.time())
            self.lane_free = min(self.lane_free, freed)
            free_slot(replica.lane, freed)
        return cached, end

    def reset(self):
        self.replica.reset()
        self.empty_stores()

    def stats(self):
        """The figures of /stats and /metrics, by name without "mock_"."""
        figures = self.replica.stats()
        figures.update(not_found_total=self.not_found,
                       stored_responses=len(self.responses),
                       stored_conversations=len(self.conversations))
        return figures

    def metrics_text(self):
        figures = self.stats()
        label = '{replica="%s"}' % self.name
        lines = []
        for name, kind, help_text in fleet.METRICS + STORE_METRICS:
            full = 'mock_' + name
            lines.append('# HELP %s %s' % (full, help_text))
            lines.append('# TYPE %s %s' % (full, kind))
            lines.append('%s%s %d' % (full, label, figures[name]))
        lines.extend(self.vllm_metrics(figures))
        return '\n'.join(lines) + '\n'

    def vllm_metrics(self, figures):
        """The scheduler gauges of vLLM's /metrics, under its names and
        labels, that a balancer polls for the replica's own load."""
        label = '{engine="0",model_name="mock"}'
        capacity = self.replica.params.cache_blocks
        usage = figures['cache_blocks'] / capacity if capacity else 0.0
        gauges = (
            ('vllm:num_requests_running',
             'Number of requests in model execution batches.',
             float(figures['running'])),
            ('vllm:num_requests_waiting',
             'Number of requests waiting to be processed.',
             float(figures['waiting'])),
            ('vllm:kv_cache_usage_perc',
             'KV-cache usage. 1 means 100 percent usage.', usage),
        )
        lines = []
        for name, help_text, value in gauges:
            lines.append('# HELP %s %s' % (name, help_text))
            lines.append('# TYPE %s gauge' % name)
            lines.append('%s%s %r' % (name, label, value))
        # The prefix cache's counters, in tokens, both counted when a
        # prefill starts, as vLLM counts them when it schedules a request:
        # what the engine computed is the queries less the hits.
        for name, help_text, value in (
                ('vllm:prefix_cache_queries_total',
                 'Prefix cache queries, in terms of number of queried '
                 'tokens.', figures['queried_tokens_total']),
                ('vllm:prefix_cache_hits_total',
                 'Prefix cache hits, in terms of number of cached tokens.',
                 figures['cached_tokens_total'])):
            lines.append('# HELP %s %s' % (name, help_text))
            lines.append('# TYPE %s counter' % name)
            lines.append('%s%s %r' % (name, label, float(value)))
        # The KV cache's size, in the labels of an info metric, as vLLM
        # gives it: blocks of block_size tokens.
        lines.append('# HELP vllm:cache_config_info Information of the '
                     'LLMEngine CacheConfig')
        lines.append('# TYPE vllm:cache_config_info gauge')
        lines.append('vllm:cache_config_info{block_size="%d",'
                     'cache_dtype="auto",enable_prefix_caching="True",'
                     'engine="0",num_cpu_blocks="None",'
                     'num_gpu_blocks="%d"} 1.0'
                     % (model.BLOCK_TOKENS, capacity))
        return lines

    # Stores

    def find(self, store, what, object_id, param=None):
        """The object of the store under object_id, or NotFound, counted."""
        found = store.get(object_id)
        if found is None:
            self.not_found += 1
            raise NotFound(what, object_id, param)
        return found

    def find_response(self, response_id, param=None):
        return self.find(self.responses, 'Response', response_id, param)

    def find_conversation(self, conversation_id, param=None):
        return self.find(self.conversations, 'Conversation', conversation_id,
                         param)

    def open_response(self, body):
        """The StoredResponse-to-be of a /v1/responses body, its prompt
        after its previous turn's or its conversation's, when the body
        names one: NotFound if this replica does not keep it."""
        text = response_prompt(body)
        previous_id, conversation_id, stored = response_links(body)
        items = input_items(body)
        previous = conversation = None
        if previous_id is not None:
            previous = self.find_response(previous_id, 'previous_response_id')
            text = previous.answer_piece() + messages_text(items)
        elif conversation_id is not None:
            conversation = self.find_conversation(conversation_id,
                                                  'conversation')
            text = (body.get('instructions') or '') + '\n' + messages_text(
                conversation.items + items)
        return StoredResponse(previous, text, items, conversation, stored)

    def start_response(self, record, reply):
        """The response is being served under the id of its reply
        (ResponseFormat): stored now, in progress, unless "store": false."""
        reply.record = record
        reply.fields = record.links()
        record.obj = reply.response('in_progress')
        if record.stored:
            self.responses.put(reply.id, record)

    def get_response(self, response_id):
        return self.find_response(response_id).obj

    def delete_response(self, response_id):
        self.find_response(response_id)
        self.responses.pop(response_id)
        return {'id': response_id, 'object': 'response', 'deleted': True}

    def cancel_response(self, response_id):
        record = self.find_response(response_id)
        record.cancel()
        return record.obj

    def response_input_items(self, response_id):
        return self.find_response(response_id).input_items

    def create_conversation(self, body):
        conversation = Conversation(*conversation_fields(body))
        self.conversations.put(conversation.id, conversation)
        return conversation.obj

    def get_conversation(self, conversation_id):
        return self.find_conversation(conversation_id).obj

    def delete_conversation(self, conversation_id):
        self.find_conversation(conversation_id)
        self.conversations.pop(conversation_id)
        return {'id': conversation_id, 'object': 'conversation.deleted',
                'deleted': True}

    def conversation_items(self, conversation_id):
        return self.find_conversation(conversation_id).items


# ---------------------------------------------------------------------------
# Replies: OpenAI wire formats
# ---------------------------------------------------------------------------

FILLER_SENTENCE = ('The mock replica writes this sentence again and again '
                   'in place of generated text. ')
_filler = FILLER_SENTENCE


def filler_text(tokens):
    """Deterministic text of `tokens` tokens (CHARS_PER_TOKEN each)."""
    global _filler
    chars = tokens * model.CHARS_PER_TOKEN
    while len(_filler) < chars:
        _filler += _filler
    return _filler[:chars]


def to_json(obj):
    return json.dumps(obj, separators=JSON_SEPARATORS)


def sse_data(obj):
    return b'data: ' + to_json(obj).encode() + b'\n\n'


def sse_event(obj):
    """A Responses API event: named by its type, as OpenAI sends it."""
    return ('event: %s\ndata: %s\n\n' % (obj['type'], to_json(obj))).encode()


SSE_DONE = b'data: [DONE]\n\n'


class ChatFormat:
    """chat.completion and chat.completion.chunk objects."""

    def __init__(self, job, replica_id):
        self.job = job
        self.id = 'chatcmpl-' + replica_id
        self.created = int(time.time())
        self.cached = 0             # known when prefill starts

    def finish_reason(self):
        return 'length' if self.job.limited else 'stop'

    def usage(self):
        job = self.job
        return {'prompt_tokens': job.prompt_tokens,
                'completion_tokens': job.output_tokens,
                'total_tokens': job.prompt_tokens + job.output_tokens,
                'prompt_tokens_details': {'cached_tokens': self.cached}}

    def envelope(self, obj_type, choices):
        return {'id': self.id, 'object': obj_type, 'created': self.created,
                'model': self.job.model_name, 'choices': choices}

    def complete(self, text):
        reply = self.envelope('chat.completion', [{
            'index': 0,
            'message': {'role': 'assistant', 'content': text},
            'logprobs': None,
            'finish_reason': self.finish_reason()}])
        reply['usage'] = self.usage()
        return reply

    def chunk(self, delta, finish_reason=None):
        return self.envelope('chat.completion.chunk', [{
            'index': 0, 'delta': delta, 'logprobs': None,
            'finish_reason': finish_reason}])

    def opening(self, text):
        return sse_data(self.chunk({'role': 'assistant', 'content': text}))

    def delta(self, text):
        return sse_data(self.chunk({'content': text}))

    def closing(self, text):
        closing = sse_data(self.chunk({}, self.finish_reason()))
        if self.job.stream_usage:
            usage = self.envelope('chat.completion.chunk', [])
            usage['usage'] = self.usage()
            closing += sse_data(usage)
        return closing + SSE_DONE


class CompletionFormat(ChatFormat):
    """text_completion objects, streamed or not."""

    def __init__(self, job, replica_id):
        super().__init__(job, replica_id)
        self.id = 'cmpl-' + replica_id

    def choice(self, text, finish_reason):
        return {'index': 0, 'text': text, 'logprobs': None,
                'finish_reason': finish_reason}

    def complete(self, text):
        reply = self.envelope('text_completion',
                              [self.choice(text, self.finish_reason())])
        reply['usage'] = self.usage()
        return reply

    def opening(self, text):
        return self.delta(text)

    def delta(self, text):
        return sse_data(self.envelope('text_completion',
                                      [self.choice(text, None)]))

    def closing(self, text):
        final = self.envelope('text_completion',
                              [self.choice('', self.finish_reason())])
        closing = sse_data(final)
        if self.job.stream_usage:
            usage = self.envelope('text_completion', [])
            usage['usage'] = self.usage()
            closing += sse_data(usage)
        return closing + SSE_DONE


class ResponseFormat:
    """Responses API objects; streamed as the minimal event sequence
    response.created, response.output_text.delta..., response.completed.
    Their ids are unique across replicas and runs, as vLLM's; the completed
    object goes to the record (StoredResponse) of the response, if any,
    before it goes out."""

    def __init__(self, job, replica_id):
        self.job = job
        self.id = new_id('resp_')
        self.message_id = new_id('msg_')
        self.created = int(time.time())
        self.cached = 0
        self.sequence = 0
        self.fields = {}            # previous_response_id, conversation...
        self.record = None

    def usage(self):
        job = self.job
        return {'input_tokens': job.prompt_tokens,
                'input_tokens_details': {'cached_tokens': self.cached},
                'output_tokens': job.output_tokens,
                'output_tokens_details': {'reasoning_tokens': 0},
                'total_tokens': job.prompt_tokens + job.output_tokens}

    def response(self, status, text=None):
        obj = {'id': self.id, 'object': 'response',
               'created_at': self.created, 'status': status,
               'model': self.job.model_name, 'output': [], 'usage': None}
        obj.update(self.fields)
        if text is not None:
            obj['output'] = [{
                'type': 'message', 'id': self.message_id,
                'status': 'completed', 'role': 'assistant',
                'content': [{'type': 'output_text', 'text': text,
                             'annotations': []}]}]
            obj['usage'] = self.usage()
        return obj

    def complete(self, text):
        obj = self.response('completed', text)
        if self.record is not None:
            self.record.complete(obj, text)
        return obj

    def event(self, event_type, **fields):
        event = {'type': event_type, 'sequence_number': self.sequence}
        event.update(fields)
        self.sequence += 1
        return sse_event(event)

    def opening(self, text):
        return (self.event('response.created',
                           response=self.response('in_progress'))
                + self.delta(text))

    def delta(self, text):
        return self.event('response.output_text.delta',
                          item_id=self.message_id, output_index=0,
                          content_index=0, delta=text)

    def closing(self, text):
        return self.event('response.completed',
                          response=self.complete(text))


FORMATS = {'chat': ChatFormat, 'completion': CompletionFormat,
           'response': ResponseFormat}


def stream_plan(output_tokens):
    """(end token, fraction of the decode time) of each content chunk after
    the first, which carries one token at the end of prefill.  At most
    MAX_STREAM_CHUNKS chunks in all keep the CPU cost per request flat."""
    rest = output_tokens - 1
    pieces = min(MAX_STREAM_CHUNKS - 1, rest)
    return [(1 + rest * i // pieces, i / pieces)
            for i in range(1, pieces + 1)]


def error_body(message, error_type='invalid_request_error', param=None):
    return {'error': {'message': message, 'type': error_type,
                      'param': param, 'code': None}}


def list_order(target):
    """The order of a list request (?order=): "desc", newest first, by
    default as OpenAI's, or "asc"."""
    values = parse_qs(target.partition('?')[2]).get('order')
    order = values[-1] if values else 'desc'
    if order not in ('asc', 'desc'):
        raise BadRequest("'order' must be 'asc' or 'desc'")
    return order


def list_object(items, order):
    """A list object of items (kept oldest first) in the order asked."""
    data = items if order == 'asc' else items[::-1]
    return {'object': 'list', 'data': data,
            'first_id': data[0].get('id') if data else None,
            'last_id': data[-1].get('id') if data else None,
            'has_more': False}


async def sleep_until(when):
    """Sleeps to an absolute loop time, so successive waits do not drift."""
    delay = when - asyncio.get_running_loop().time()
    if delay > 0:
        await asyncio.sleep(delay)


class Connection:
    """One client connection to one replica: reads requests in turn and
    answers each."""

    GET_ROUTES = ('/metrics', '/stats', '/health', '/v1/models')
    POST_ROUTES = ('/reset',)
    INFERENCE_ROUTES = {'/v1/chat/completions': 'chat',
                        '/v1/completions': 'completion',
                        '/v1/responses': 'response'}
    # The stored objects, by path pattern (the id, URL-encoded, is the
    # group): the replica's method of each HTTP method.  A method that
    # returns a list is answered with a list object.
    STORE_ROUTES = (
        (re.compile(r'/v1/responses/([^/]+)'),
         {'GET': ServedReplica.get_response,
          'DELETE': ServedReplica.delete_response}),
        (re.compile(r'/v1/responses/([^/]+)/cancel'),
         {'POST': ServedReplica.cancel_response}),
        (re.compile(r'/v1/responses/([^/]+)/input_items'),
         {'GET': ServedReplica.response_input_items}),
        (re.compile(r'/v1/conversations/([^/]+)'),
         {'GET': ServedReplica.get_conversation,
          'DELETE': ServedReplica.delete_conversation}),
        (re.compile(r'/v1/conversations/([^/]+)/items'),
         {'GET': ServedReplica.conversation_items}),
    )

    def __init__(self, replica, reader, writer):
        self.replica = replica
        self.reader = reader
        self.writer = writer

    async def serve(self):
        try:
            while True:
                try:
                    request = await http1.read_request(
                        self.reader, self.writer, MAX_BODY_BYTES)
                except HttpError as error:
                    await self.send_error(None, error.status, error.message)
                    break
                if request is None or not await self.dispatch(request):
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.writer.close()

    async def dispatch(self, request):
        """Answers one request; returns whether to read another."""
        try:
            return await self.route(request)
        except ConnectionError:
            raise
        except Exception:
            traceback.print_exc()
            await self.send_error(None, 500, 'internal error', 'server_error')
            return False

    async def route(self, request):
        path = request.path
        kind = self.INFERENCE_ROUTES.get(path)
        if kind is not None:
            if request.method != 'POST':
                return await self.send_not_allowed(request, 'POST')
            return await self.serve_inference(request, kind)
        if path in self.GET_ROUTES:
            if request.method not in ('GET', 'HEAD'):
                return await self.send_not_allowed(request, 'GET')
            return await self.serve_info(request, path)
        if path in self.POST_ROUTES:
            if request.method != 'POST':
                return await self.send_not_allowed(request, 'POST')
            self.replica.reset()
            return await self.send_json(
                request, 200, {'reset': True, 'replica': self.replica.name})
        if path == '/v1/conversations':
            if request.method != 'POST':
                return await self.send_not_allowed(request, 'POST')
            return await self.create_conversation(request)
        for pattern, methods in self.STORE_ROUTES:
            match = pattern.fullmatch(path)
            if match:
                return await self.serve_stored(request, methods,
                                               unquote(match.group(1)))
        return await self.send_error(request, 404, 'no route for %s %s'
                                     % (request.method, path), 'not_found')

    async def create_conversation(self, request):
        """POST /v1/conversations; the body may be empty."""
        try:
            body = parse_body(request.body) if request.body.strip() else {}
            conversation = self.replica.create_conversation(body)
        except BadRequest as error:
            return await self.send_error(request, 400, str(error))
        return await self.send_json(request, 200, conversation)

    async def serve_stored(self, request, methods, object_id):
        """A request on a stored response or conversation."""
        method = 'GET' if request.method == 'HEAD' else request.method
        handler = methods.get(method)
        if handler is None:
            return await self.send_not_allowed(request, ', '.join(methods))
        try:
            result = handler(self.replica, object_id)
            if isinstance(result, list):
                result = list_object(result, list_order(request.target))
        except NotFound as error:
            return await self.send_not_found(request, error)
        except BadRequest as error:
            return await self.send_error(request, 400, str(error))
        return await self.send_json(request, 200, result)

    async def serve_info(self, request, path):
        replica = self.replica
        if path == '/metrics':
            replica.scrapes += 1
            return await self.send(request, 200, replica.metrics_text().encode(),
                                   'text/plain; version=0.0.4; charset=utf-8')
        if path == '/stats':
            figures = {'replica': replica.name, 'port': replica.port,
                       'scrapes': replica.scrapes}
            figures.update(replica.stats())
            return await self.send_json(request, 200, figures)
        if path == '/health':
            return await self.send_json(request, 200, {'status': 'ok'})
        return await self.send_json(request, 200, {'object': 'list', 'data': [
            {'id': 'mock', 'object': 'model', 'owned_by': replica.name}]})

    async def serve_inference(self, request, kind):
        """Simulates one request through admission, prefill and decode.  A
        response (/v1/responses) is stored when it arrives, after the
        lookup of its previous turn or conversation (404 if this replica
        does not keep it), and completed when its reply goes out."""
        replica = self.replica
        arrived = asyncio.get_running_loop().time()
        record = None
        try:
            body = parse_body(request.body)
            if kind == 'response':
                record = replica.open_response(body)
                text = record.prompt()
            else:
                text = PROMPT_READERS[kind](body)
            job = make_job(kind, body, text,
                           usage_if_asked=replica.usage_if_asked)
        except BadRequest as error:
            return await self.send_error(request, 400, str(error))
        except NotFound as error:
            return await self.send_not_found(request, error)
        reply = FORMATS[kind](job, replica.next_id())
        if record is None:
            return await self.run(request, job, reply, arrived)
        # vLLM names a response after the request's "request_id" when the
        # client gives one: a client may choose its response's id.
        if isinstance(body.get('request_id'), str) and body['request_id']:
            reply.id = body['request_id']
        replica.start_response(record, reply)
        try:
            return await self.run(request, job, reply, arrived)
        finally:
            record.cancel()         # a no-op once completed

    async def run(self, request, job, reply, arrived):
        """Admission, prefill and decode of a job, then its reply, which
        says in X-Replica-TTFT the seconds from the request's arrival (its
        body read) to its first token, as an engine measures its own time
        to first token: without the client's and the proxy's time."""
        replica = self.replica
        loop = asyncio.get_running_loop()
        ready = await replica.admit(job, arrived)
        release = Once(replica.finish)
        decode_end = float('inf')
        try:
            reply.cached, decode_start = await replica.prefill(job, ready)
            decode_end = decode_start + \
                replica.params.decode_seconds(job.output_tokens)
            ttft = [('X-Replica-TTFT', '%.6f' % (decode_start - arrived))]
            # The slot is freed at the end of decode even if the client
            # is slow to take the reply.
            loop.call_at(decode_end, release, decode_end)
            text = filler_text(job.output_tokens)
            if job.stream:
                return await self.stream(request, reply, text,
                                         decode_start, decode_end, ttft)
            await sleep_until(decode_end)
            return await self.send_json(request, 200, reply.complete(text),
                                        ttft)
        finally:
            # Before the end of decode only when the request failed.
            release(min(decode_end, loop.time()))

    async def stream(self, request, reply, text, decode_start, decode_end,
                     extra=()):
        """Server-sent events: the head and the first token at the end of
        prefill (so a proxy's header time is the time to first token), then
        a few chunks spread over the decode time."""
        sent = model.CHARS_PER_TOKEN
        chunked = not request.http10
        keep_alive = chunked and request.keep_alive
        head = self.head(200, keep_alive, 'text/event-stream',
                         [('Cache-Control', 'no-cache'),
                          ('X-Accel-Buffering', 'no'), *extra]
                         + ([('Transfer-Encoding', 'chunked')] if chunked
                            else []))
        await self.write(head, reply.opening(text[:sent]), chunked)
        duration = decode_end - decode_start
        tokens = len(text) // model.CHARS_PER_TOKEN
        for end_token, fraction in stream_plan(tokens):
            await sleep_until(decode_start + duration * fraction)
            end = end_token * model.CHARS_PER_TOKEN
            await self.write(b'', reply.delta(text[sent:end]), chunked)
            sent = end
        await sleep_until(decode_end)
        await self.write(b'', reply.closing(text), chunked,
                         last=chunked)
        return keep_alive

    async def write(self, prefix, payload, chunked, last=False):
        """Writes payload as one chunk when chunked, after prefix."""
        if chunked:
            payload = http1.chunk(payload)
            if last:
                payload += http1.LAST_CHUNK
        self.writer.write(prefix + payload)
        await self.writer.drain()

    def head(self, status, keep_alive, content_type, extra=()):
        return http1.response_head(status, [
            ('Content-Type', content_type),
            ('X-Replica', self.replica.name),
            ('X-Replica-Port', self.replica.port),
            ('Connection', 'keep-alive' if keep_alive else 'close'),
            *extra])

    async def send(self, request, status, body, content_type, extra=()):
        """A complete reply; returns whether the connection stays open."""
        keep_alive = request is not None and request.keep_alive
        head = self.head(status, keep_alive, content_type,
                         [('Content-Length', len(body)), *extra])
        if request is not None and request.method == 'HEAD':
            body = b''
        self.writer.write(head + body)
        await self.writer.drain()
        return keep_alive

    async def send_json(self, request, status, obj, extra=()):
        return await self.send(request, status, to_json(obj).encode(),
                               'application/json', extra)

    async def send_error(self, request, status, message,
                         error_type='invalid_request_error'):
        return await self.send_json(request, status,
                                    error_body(message, error_type))

    async def send_not_found(self, request, error):
        """404 for a response or conversation this replica does not keep."""
        return await self.send_json(request, 404, error_body(
            str(error), param=error.param))

    async def send_not_allowed(self, request, allowed):
        return await self.send_error(
            request, 405, '%s %s: use %s' % (request.method, request.path,
                                             allowed))


# ---------------------------------------------------------------------------
# Process
# ---------------------------------------------------------------------------

def port_list(text):
    """An argparse type: comma-separated ports, 0 meaning any free port."""
    try:
        ports = [int(item) for item in text.split(',') if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError('ports: comma-separated numbers')
    if not ports or any(not 0 <= port <= 65535 for port in ports):
        raise argparse.ArgumentTypeError('ports: numbers from 0 to 65535')
    fixed = [port for port in ports if port]
    if len(fixed) != len(set(fixed)):
        raise argparse.ArgumentTypeError('ports: each port once')
    return ports


def positive(kind):
    """An argparse type: a number of `kind` above zero."""
    def convert(text):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError('must be positive')
        return value
    convert.__name__ = kind.__name__
    return convert


def non_negative_float(text):
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError('must not be negative')
    return value


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description='Mock OpenAI-compatible inference replicas, one per port.')
    parser.add_argument('--ports', type=port_list, required=True,
                        help='comma-separated ports, one replica each '
                             '(0: any free port)')
    parser.add_argument('--host', default='127.0.0.1')
    parser.add_argument('--max-running', type=positive(int), default=32)
    parser.add_argument('--prefill-ms-per-token', type=non_negative_float,
                        default=0.05)
    parser.add_argument('--decode-ms-per-token', type=non_negative_float,
                        default=20.0)
    parser.add_argument('--cache-tokens', type=positive(int), default=262144)
    parser.add_argument('--time-scale', type=non_negative_float, default=1.0)
    parser.add_argument('--slowdowns', type=slowdown_list, default=(),
                        help='comma-separated factors, one per port in '
                             'order: that replica\'s prefill and decode '
                             'take that many times as long (a mixed '
                             'fleet); missing ones are 1')
    parser.add_argument('--stream-usage', choices=('always', 'asked'),
                        default='always',
                        help='whether a chat or completion stream ends '
                             'with its usage always, or only when its '
                             'stream_options ask (include_usage), as '
                             'vLLM\'s do')
    parser.add_argument('--name-prefix', default='replica')
    parser.add_argument('--pidfile')
    return parser.parse_args(argv)


def slowdown_list(text):
    """An argparse type: comma-separated factors of at least 1."""
    try:
        factors = tuple(float(x) for x in text.split(',') if x)
    except ValueError:
        raise argparse.ArgumentTypeError('slowdowns: comma-separated numbers')
    if any(f < 1 for f in factors):
        raise argparse.ArgumentTypeError('slowdowns: each at least 1')
    return factors


def make_replicas(args):
    """One replica per port, named in the order of --ports, slowed down
    by --slowdowns."""
    params = model.ReplicaParams(
        max_running=args.max_running,
        prefill_ms_per_token=args.prefill_ms_per_token,
        decode_ms_per_token=args.decode_ms_per_token,
        cache_tokens=args.cache_tokens,
        time_scale=args.time_scale)
    replicas = fleet.Fleet(params, names=[
        '%s-%d' % (args.name_prefix, index)
        for index in range(1, len(args.ports) + 1)],
        slowdowns=args.slowdowns).replicas
    return [ServedReplica(replica, port,
                          usage_if_asked=args.stream_usage == 'asked')
            for replica, port in zip(replicas, args.ports)]


class Listeners:
    """The replicas' listeners and open connections, closed together."""

    def __init__(self, replicas, host):
        self.replicas = replicas
        self.host = host
        self.servers = []
        self.tasks = set()

    async def start(self):
        for replica in self.replicas:
            # A deep backlog: trace bursts open hundreds of connections at
            # once, and the default (100) resets some of them.
            server = await asyncio.start_server(
                self.connection_handler(replica), self.host, replica.port,
                limit=STREAM_LIMIT, backlog=4096)
            replica.port = server.sockets[0].getsockname()[1]
            self.servers.append(server)

    def connection_handler(self, replica):
        async def handle(reader, writer):
            task = asyncio.current_task()
            self.tasks.add(task)
            try:
                await Connection(replica, reader, writer).serve()
            finally:
                self.tasks.discard(task)
        return handle

    async def close(self):
        for server in self.servers:
            server.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for server in self.servers:
            await server.wait_closed()


async def run(args):
    """Serves until SIGTERM or SIGINT; "ready" is printed last, so a
    caller that waits for it knows every port is listening."""
    listeners = Listeners(make_replicas(args), args.host)
    await listeners.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    for replica in listeners.replicas:
        print('listening %s %s:%d' % (replica.name, args.host, replica.port))
    try:
        if args.pidfile:
            write_pidfile(args.pidfile)
        print('ready', flush=True)
        await stop.wait()
    finally:
        await listeners.close()
        if args.pidfile:
            remove_pidfile(args.pidfile)


class MockProcess:
    """This mock in a child process, for tests and benchmarks:
    MockProcess(ports, *options) returns once every replica listens, with
    the names and ports it reported (a port of 0 picks a free one).  Its
    output goes to the file log, or its errors to stderr."""

    START_TIMEOUT = 10.0

    def __init__(self, ports, *options, host='127.0.0.1', log=None):
        command = [sys.executable, os.path.abspath(__file__),
                   '--host', host, '--ports', ','.join(map(str, ports))]
        self.host = host
        self.log = open(log, 'w') if log else None
        self.process = subprocess.Popen(
            command + [str(option) for option in options],
            stdout=subprocess.PIPE, stderr=self.log or None, text=True)
        self.ports = []
        self.names = []
        self._wait_ready()

    def _wait_ready(self):
        """Reads the "listening name host:port" lines up to "ready"."""
        timer = threading.Timer(self.START_TIMEOUT, self.process.kill)
        timer.start()
        try:
            for line in self.process.stdout:
                if self.log:
                    self.log.write(line)
                    self.log.flush()
                words = line.split()
                if words == ['ready']:
                    return
                if words and words[0] == 'listening':
                    self.names.append(words[1])
                    self.ports.append(int(words[2].rsplit(':', 1)[1]))
        finally:
            timer.cancel()
        self.stop()
        raise RuntimeError('mock_backend.py did not start'
                           + (' (see %s)' % self.log.name if self.log else ''))

    def stats_urls(self):
        return ['http://%s:%d/stats' % (self.host, port)
                for port in self.ports]

    def stop(self, signum=signal.SIGTERM):
        """Stops the mock; returns its exit status."""
        try:
            if self.process.poll() is None:
                self.process.send_signal(signum)
            try:
                return self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                return self.process.wait()
        finally:
            self.process.stdout.close()
            if self.log:
                self.log.close()


def write_pidfile(path):
    with open(path, 'w') as pidfile:
        pidfile.write('%d\n' % os.getpid())


def remove_pidfile(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        asyncio.run(run(args))
    except OSError as error:
        print('mock_backend: %s' % error, file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
