"""The model of an inference replica, shared by the mock backend
(mock_backend.py) and the offline simulations (bounds.py), so that measured
and computed figures use one definition.

Tokens are approximated from characters (CHARS_PER_TOKEN).  The prompt is cut
into blocks of BLOCK_TOKENS tokens, and each block is identified by a hash
chained over every block before it, as vLLM's prefix cache does: a block is
reusable only if the whole prefix up to it is equal.

Timing: a replica admits at most `max_running` requests; the others wait in
FIFO order.  Prefill is compute-bound, so an admitted request waits for the
replica's single prefill lane, then takes `prefill_ms_per_token` for each
uncached prompt token; its first token is emitted when its prefill ends
(time to first token).  Decoding then takes `decode_ms_per_token` per output
token, concurrently with the other running requests.  All durations are
multiplied by `time_scale`, so a trace replayed N times faster keeps its
queueing behaviour with time_scale = 1/N.  fleet.py holds these states,
for the mock and the simulator alike.
"""

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

CHARS_PER_TOKEN = 4
BLOCK_TOKENS = 16
BLOCK_CHARS = BLOCK_TOKENS * CHARS_PER_TOKEN


@dataclass
class ReplicaParams:
    """What one replica can do.  Defaults: an 8B model on one modern GPU."""
    max_running: int = 32
    prefill_ms_per_token: float = 0.05      # 20k prompt tokens/s
    decode_ms_per_token: float = 20.0       # 50 tokens/s per sequence
    cache_tokens: int = 262144              # KV cache capacity
    time_scale: float = 1.0

    @property
    def cache_blocks(self):
        return max(1, self.cache_tokens // BLOCK_TOKENS)

    def prefill_seconds(self, uncached_tokens):
        return uncached_tokens * self.prefill_ms_per_token / 1000.0 \
            * self.time_scale

    def decode_seconds(self, output_tokens):
        return output_tokens * self.decode_ms_per_token / 1000.0 \
            * self.time_scale


def prompt_tokens(text):
    """Approximate token count of a prompt text."""
    return max(1, (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN)


def block_chain(text):
    """Chained hashes of the full blocks of text (a partial last block is
    never cached, as in vLLM)."""
    data = text.encode('utf-8')
    chain = []
    prev = b''
    for start in range(0, len(data) - BLOCK_CHARS + 1, BLOCK_CHARS):
        prev = hashlib.blake2b(prev + data[start:start + BLOCK_CHARS],
                               digest_size=12).digest()
        chain.append(prev)
    return chain


class PrefixCache:
    """An LRU cache of blocks, keyed by chained block hash."""

    def __init__(self, capacity_blocks):
        self.capacity = capacity_blocks
        self.blocks = OrderedDict()

    def cached_prefix(self, chain):
        """How many leading blocks of chain are cached (no update)."""
        n = 0
        for h in chain:
            if h not in self.blocks:
                break
            n += 1
        return n

    def insert(self, chain):
        """Records chain as most recently used, evicting the least recently
        used blocks beyond capacity.  The chain is touched from its end, so
        a prefix is never evicted before a block that extends it."""
        for h in reversed(chain):
            if h in self.blocks:
                self.blocks.move_to_end(h, last=False)
            else:
                self.blocks[h] = True
                self.blocks.move_to_end(h, last=False)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=True)

    def __len__(self):
        return len(self.blocks)


def cached_tokens(cache, chain, total_tokens):
    """Prompt tokens served from cache for a prompt with this chain."""
    return min(total_tokens, cache.cached_prefix(chain) * BLOCK_TOKENS)
