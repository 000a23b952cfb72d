"""Turns the records of a Mooncake-style request trace into concrete
requests, so that the replay tool and the offline bounds see the same
prompts, the same conversations and therefore the same cache behaviour.

The trace releases no text: each record has `input_length` tokens and
`hash_ids`, the ids of its 512-token blocks.  The ids are prefix-chained
(an id always follows the same predecessor), so equal ids mean equal
prefixes.  We synthesise one fixed text per block id; a prompt is the
concatenation of its blocks' texts, cut to its length.  Two prompts then
share their common block prefix and nothing after it (but the leading
digits that the ids of their first differing blocks may have in common, far
less than a 64-character model block), so the replica model's prefix cache
(model.block_chain) sees exactly the reuse the trace records.
"""

import hashlib
import json
import operator
import random
from functools import lru_cache
from pathlib import Path

from . import model

# The Mooncake conversation trace, in the repository (its README there).
DEFAULT_TRACE = str(Path(__file__).resolve().parents[1] / 'traces'
                    / 'mooncake-fast25' / 'conversation_trace.jsonl')

TRACE_BLOCK_TOKENS = 512
TRACE_BLOCK_CHARS = TRACE_BLOCK_TOKENS * model.CHARS_PER_TOKEN   # 2048

# Role of the single chat message a record becomes.  The mock builds its
# prompt text as role + "\n" + content + "\n" for each message, and
# chat_prompt_text() reproduces that so bounds hash what the mock hashes.
PROMPT_ROLE = 'user'


def _build_vocabulary():
    """A fixed vocabulary of pronounceable pseudo-words.  It is generated
    from a constant seed so that block texts never change between runs or
    machines (a changed text would change every cache key)."""
    syllables = ['ka', 'lo', 'mi', 'ren', 'ta', 'vo', 'sul', 'pe', 'dra',
                 'ni', 'qua', 'sto', 'bel', 'fi', 'gor', 'hu', 'jin', 'mar',
                 'ox', 'pla', 'ri', 'sen', 'tu', 'war', 'ze', 'cor', 'dal',
                 'ess', 'ith', 'ul']
    rng = random.Random(20250221)
    words = set()
    while len(words) < 256:
        words.add(''.join(rng.choice(syllables)
                          for _ in range(rng.randint(1, 3))))
    return tuple(sorted(words))


VOCABULARY = _build_vocabulary()
# Words picked per round: at a mean word length near 5.7, one round gives
# about 2400 characters, so it nearly always fills a block.
_WORDS_PER_ROUND = 360


def add_trace_arguments(parser, verb):
    """--trace, --limit and --start, the records a tool reads; verb says
    what it does with them in the help ("replay", "use")."""
    parser.add_argument('--trace', default=DEFAULT_TRACE,
                        help='JSON Lines trace (default: the Mooncake '
                             'conversation trace in bench/traces/)')
    parser.add_argument('--limit', type=int,
                        help='%s at most N records' % verb)
    parser.add_argument('--start', type=int, default=0,
                        help='first record to %s (default 0)' % verb)


def load_trace(path, limit=None, start=0):
    """The records of a JSON Lines trace, from record `start` on, at most
    `limit` of them.  Records are returned as parsed (dicts); the caller
    numbers them start, start+1, ... (see session_id)."""
    records = []
    with open(path, encoding='utf-8') as f:
        index = -1
        for line in f:
            if not line.strip():
                continue
            index += 1
            if index < start:
                continue
            if limit is not None and len(records) >= limit:
                break
            records.append(json.loads(line))
    return records


@lru_cache(maxsize=4096)
def block_text(block_id):
    """The text of one 512-token trace block: exactly TRACE_BLOCK_CHARS
    ASCII characters (letters, digits, spaces, ':' and '.'), a pure function
    of the id.  The text starts with the id itself, which guarantees that
    different ids give different texts (and, for ids whose first digits
    differ, texts that differ from their first character, so that two
    prompts share no more than their common blocks); the rest are
    pseudo-words picked by
    SHAKE-128 of the id, so that the prompt looks like text rather than
    padding.  SHAKE rather than random.Random(id): it gives the same bytes
    on every Python version and is several times faster to seed, which
    matters when bounds.py synthesises the ~180k distinct blocks of the
    full trace.  Cached because the shared head block (id 0) is in every
    prompt."""
    text = '%d:' % block_id
    round_no = 0
    while len(text) < TRACE_BLOCK_CHARS:
        picks = hashlib.shake_128(b'%d/%d' % (block_id, round_no)).digest(
            _WORDS_PER_ROUND)
        text += ' ' + ' '.join(operator.itemgetter(*picks)(VOCABULARY))
        round_no += 1
    return text[:TRACE_BLOCK_CHARS - 1] + '.'


def prompt_chars(record):
    """Length of the record's prompt text: input_length tokens.  Raises
    ValueError when hash_ids has fewer blocks than that needs (never the
    case in the Mooncake traces), rather than producing a shorter prompt
    than the record says."""
    size = record['input_length'] * model.CHARS_PER_TOKEN
    if len(record['hash_ids']) * TRACE_BLOCK_CHARS < size:
        raise ValueError('%d hash_ids cannot hold %d input tokens'
                         % (len(record['hash_ids']), record['input_length']))
    return size


def prompt_text(record):
    """The prompt of a record: its blocks' texts, cut to input_length
    tokens (the last trace block is usually partial)."""
    size = prompt_chars(record)
    full_blocks, rest = divmod(size, TRACE_BLOCK_CHARS)
    ids = record['hash_ids']
    parts = [block_text(b) for b in ids[:full_blocks]]
    if rest and full_blocks < len(ids):
        parts.append(block_text(ids[full_blocks])[:rest])
    return ''.join(parts)[:size]


def chat_prompt_text(content, role=PROMPT_ROLE):
    """The text the mock replica tokenizes and hashes for a one-message
    chat request: role + "\\n" + content + "\\n"."""
    return role + '\n' + content + '\n'


def session_id(record, index):
    """The conversation a record belongs to, for session-affinity routing.

    The trace has no session ids, but its block ids are prefix-chained, so
    two records with the same second block id have the same first 1024
    tokens.  Every record starts with block 0 (a head shared by all), so
    the second block is the first one that tells conversations apart: a
    later turn extends an earlier request beyond the shared head and keeps
    its second block.  A record with a single block shares nothing beyond
    the head and is its own conversation, named by its trace index."""
    ids = record['hash_ids']
    if len(ids) >= 2:
        return 'conv-%d' % ids[1]
    return 'single-%d' % index


def chat_body(record, model='mock-llm', stream=True):
    """The OpenAI chat-completions request body for a record.  Usage is
    requested in the stream because the tools read prompt_tokens and
    cached_tokens from it."""
    body = {
        'model': model,
        'messages': [{'role': PROMPT_ROLE, 'content': prompt_text(record)}],
        'max_tokens': record['output_length'],
        'stream': stream,
    }
    if stream:
        body['stream_options'] = {'include_usage': True}
    return body


def arrival_seconds(records):
    """Arrival time of each record in trace seconds, relative to the first
    record, so that a replay started at record K begins at once."""
    if not records:
        return []
    origin = records[0]['timestamp']
    return [(r['timestamp'] - origin) / 1000.0 for r in records]


def spread_ticks(arrivals, rng):
    """The arrival times of records, each moved to a random moment of its
    tick.  The conversation trace's timestamps come in ticks of about 3 s
    (1,180 distinct values for 12,031 records, 2,997-3,003 ms apart): the
    records of one tick arrived somewhere within it, not all in the same
    millisecond.  A tick lasts until the next distinct timestamp (the last
    one, as long as the median tick); rng: a random.Random."""
    ticks = sorted(set(arrivals))
    if not ticks:
        return []
    lengths = [b - a for a, b in zip(ticks, ticks[1:])]
    last = sorted(lengths)[len(lengths) // 2] if lengths else 0.0
    length = dict(zip(ticks, lengths + [last]))
    return [round(t + rng.random() * length[t], 6) for t in arrivals]


# --- summary statistics shared by the replay tool and the bounds --------

def percentile(values, q):
    """The q-th percentile (0..100) with linear interpolation between the
    closest ranks (as numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def percentiles(values, qs=(50, 90, 99)):
    """{"p50": ..., "p90": ..., "p99": ...} of values."""
    return {'p%d' % q: percentile(values, q) for q in qs}


def peak_overlap(intervals):
    """The largest number of (start, end) intervals open at one time.  An
    interval ending when another starts does not overlap it."""
    events = []
    for start, end in intervals:
        events.append((start, 1))
        events.append((end, -1))
    events.sort()          # at equal times -1 sorts before +1
    peak = current = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak


def max_mean(values):
    """{"max", "mean"} of a list of numbers (None when empty)."""
    if not values:
        return {'max': None, 'mean': None}
    return {'max': max(values), 'mean': sum(values) / len(values)}


def session_moves(events, window=60.0):
    """How often sessions changed replica: the one definition the offline
    simulator (bounds.py) and the replay (replay.py) report.

    events: (session, time, replica) of each request served, in any order;
    time in seconds (profile time: the simulator's, or the replay's wall
    time multiplied by its speed).  A session's requests are taken in time
    order (ties in the order given); each one after the first *moves* when
    its replica differs from that of the request before it.  An event may
    carry a fourth element, whether the replica of the session's request
    before it could have taken it (was under the load bound when it
    arrived): a move when it could is *unforced*, one the load did not
    call for.

    The run is cut into windows of `window` seconds (a minute: the figures
    are per minute only then) from its first request;
    a session is *active* in a window when one of its requests arrives in
    it.  With A the sum over windows of the sessions active in each (the
    run's length in minutes times the mean number of sessions active):

    - moves_per_min: moves / A, moves per active session per minute;
    - moved_session_share_per_min: (sum over windows of the sessions that
      moved at least once in the window) / A, the share of active sessions
      that moved in a minute.

    - unforced_moved_share_per_min: the same share, counting unforced
      moves only (None when no event says whether it could stay).

    Also returned: the totals (moves, unforced_moves, sessions,
    sessions_moved: that moved at least once in the run), the windows and
    active_session_windows (A).
    """
    by_session = {}
    first = None
    last = None
    flagged = False
    for order, (session, time, replica, *could_stay) in enumerate(events):
        stay = could_stay[0] if could_stay else None
        flagged = flagged or stay is not None
        by_session.setdefault(session, []).append((time, order, replica,
                                                   stay))
        first = time if first is None else min(first, time)
        last = time if last is None else max(last, time)
    if first is None:
        return {'moves': 0, 'unforced_moves': 0, 'sessions': 0,
                'sessions_moved': 0, 'windows': 0,
                'active_session_windows': 0, 'moves_per_min': None,
                'moved_session_share_per_min': None,
                'unforced_moved_share_per_min': None}
    active = set()
    moved = set()
    unforced = set()
    moves = 0
    unforced_moves = 0
    sessions_moved = 0
    for session, requests in by_session.items():
        requests.sort()
        previous = None
        has_moved = False
        for time, _, replica, stay in requests:
            w = int((time - first) // window)
            active.add((session, w))
            if previous is not None and replica != previous:
                moves += 1
                moved.add((session, w))
                has_moved = True
                if stay:
                    unforced_moves += 1
                    unforced.add((session, w))
            previous = replica
        sessions_moved += has_moved
    a = len(active)
    return {
        'moves': moves,
        'unforced_moves': unforced_moves,
        'sessions': len(by_session),
        'sessions_moved': sessions_moved,
        'windows': int((last - first) // window) + 1,
        'active_session_windows': a,
        'moves_per_min': moves / a,
        'moved_session_share_per_min': len(moved) / a,
        'unforced_moved_share_per_min': len(unforced) / a if flagged
        else None,
    }
