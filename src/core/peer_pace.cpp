#include "peer_pace.h"

#include <algorithm>

#include "zone.h"

namespace affinity {

namespace {

// Each reply moves a figure by an eighth of the way to what it showed, and
// what it showed counts as at most twice, at least half the figure: a
// reply far off the rest (a pause, a retry inside the engine) moves it by
// an eighth of its size at most, while a peer that really became slower
// is learned again within tens of replies.
constexpr uint32_t kStepShift = 3;

// Prefill is learned from replies sent to a peer with nothing in flight,
// whose prompts have this many tokens it did not hold: shorter ones time
// the engine's fixed costs more than its prefill.
constexpr uint64_t kPrefillTokensMin = 256;

// Decode is learned from streams of at least this many output tokens.
constexpr uint32_t kDecodeTokensMin = 4;

// A wait goes up by at most what the figure was and this much more: the
// first replies at a new depth, and after a queue formed, are believed.
constexpr uint64_t kWaitLeapUs = 1000;

// A pooled wait of this many decode tokens or more is a queue: below it,
// the engine's own scheduling and other prompts' prefills.
constexpr double kKneeTokens = 16.0;

// A decode faster than this a token is no engine's: a proxy in front of
// the peer that delivers a stream at once.  Such a peer's waits, in its
// decode time, would swamp the pooled shape.
constexpr uint32_t kDecodeUsPlausible = 100;

// Estimates are clamped here (about eleven days): sums and margins of
// two stay far inside int64_t.
constexpr double kEstimateMaxUs = 1e12;

constexpr uint32_t kCharsPerTokenUnit = 256;
constexpr uint32_t kCharsPerTokenDefault =
    AFFINITY_CHARS_PER_TOKEN * kCharsPerTokenUnit;

uint32_t load(const uint32_t *figure) noexcept
{
    return atomic_load(figure);
}

uint32_t clamp32(uint64_t v) noexcept
{
    return uint32_t(std::min<uint64_t>(v, UINT32_MAX - 1));
}

// The prefill of uncached characters at prefill nanoseconds a token, in
// microseconds: tokens from the learned characters per token.
double prefill_us(const PeerPace &pace, uint32_t prefill, uint64_t uncached)
    noexcept
{
    uint32_t ratio = load(&pace.chars_per_token);
    double tokens = double(uncached) * kCharsPerTokenUnit
                    / double(ratio ? ratio : kCharsPerTokenDefault);

    return double(prefill) * tokens / 1000.0;
}

// A positive figure moved towards what a reply showed (bounded, above).
void learn_ratio(uint32_t *figure, uint64_t shown) noexcept
{
    uint64_t was = load(figure);

    if (shown == 0) {
        shown = 1;
    }

    if (was == 0) {
        atomic_store(figure, clamp32(shown));
        return;
    }

    shown = std::clamp<uint64_t>(shown, was / 2, was * 2);

    int64_t step = (int64_t(shown) - int64_t(was)) >> kStepShift;

    if (step == 0) {
        step = shown > was ? 1 : shown < was ? -1 : 0;
    }

    atomic_store(figure, clamp32(uint64_t(std::max<int64_t>(
        int64_t(was) + step, 1))));
}

// A wait (stored + 1, 0: unknown) moved towards what a reply showed.
void learn_wait(uint32_t *figure, uint64_t shown) noexcept
{
    uint64_t was = load(figure);

    if (was == 0) {
        atomic_store(figure, clamp32(shown + 1));
        return;
    }

    was--;
    shown = std::min<uint64_t>(shown, 2 * was + kWaitLeapUs);

    int64_t step = (int64_t(shown) - int64_t(was)) / (1 << kStepShift);

    atomic_store(figure, clamp32(uint64_t(std::max<int64_t>(
        int64_t(was) + step, 0)) + 1));
}

}  // namespace

void pace_learn(PeerPace &pace, const affinity_reply_times_t &t) noexcept
{
    if (t.total_ms < t.first_ms) {
        return;
    }

    uint64_t tokens = t.prompt_tokens;

    if (tokens && t.prompt_chars) {
        learn_ratio(&pace.chars_per_token,
                    uint64_t(t.prompt_chars) * kCharsPerTokenUnit / tokens);

    } else if (t.prompt_chars) {
        uint32_t ratio = load(&pace.chars_per_token);

        tokens = uint64_t(t.prompt_chars) * kCharsPerTokenUnit
                 / (ratio ? ratio : kCharsPerTokenDefault);
    }

    uint64_t uncached = tokens - std::min<uint64_t>(t.cached_tokens, tokens);
    uint64_t first_us = uint64_t(t.first_ms) * 1000;
    uint64_t total_us = uint64_t(t.total_ms) * 1000;

    if (t.streamed && t.output_tokens >= kDecodeTokensMin) {
        learn_ratio(&pace.decode_us,
                    (total_us - first_us) / (t.output_tokens - 1));
    }

    if (!t.streamed) {
        // A whole body comes with its last token: its first came the
        // decode of the others earlier, if the decode is known.
        uint64_t decode = load(&pace.decode_us);

        if (decode == 0 || t.output_tokens == 0) {
            atomic_add<uint32_t>(&pace.replies, 1);
            return;
        }

        first_us -= std::min<uint64_t>(
            first_us, decode * (t.output_tokens - 1));
    }

    if (t.queued == 0 && uncached >= kPrefillTokensMin) {
        learn_ratio(&pace.prefill_ns, first_us * 1000 / uncached);
    }

    uint64_t prefill_us = uint64_t(load(&pace.prefill_ns)) * uncached / 1000;
    uint32_t queue = std::min(t.queued, kPaceQueues - 1);

    learn_wait(&pace.wait_us[queue],
               first_us - std::min(first_us, prefill_us));
    atomic_add<uint32_t>(&pace.replies, 1);
}

int64_t pace_wait(const PeerPace &pace, uint32_t queued) noexcept
{
    uint32_t queue = std::min(queued, kPaceQueues - 1);
    int64_t most = -1;          // the most a shallower queue waited
    int64_t slope = 0;          // growth per request between the two
    int64_t last = -1;          // deepest ones learned below
    uint32_t last_at = 0;

    for (uint32_t q = 0; q < queue; q++) {
        uint32_t w = load(&pace.wait_us[q]);

        if (w == 0) {
            continue;
        }

        int64_t wait = int64_t(w) - 1;

        if (last >= 0 && wait > last) {
            slope = (wait - last) / int64_t(q - last_at);
        }

        last = wait;
        last_at = q;
        most = std::max(most, wait);
    }

    // A deeper queue never waits less than a shallower one; one not
    // learned yet waits as the deepest learned, grown as it grew.
    uint32_t own = load(&pace.wait_us[queue]);

    if (own != 0) {
        return std::max<int64_t>(int64_t(own) - 1, most);
    }

    if (last < 0) {
        return -1;
    }

    return std::max(most, last + slope * int64_t(queue - last_at));
}

QueueShape pace_shape(const PeerPace *const *paces, size_t n) noexcept
{
    double sum[kPaceQueues] = {};
    uint32_t count[kPaceQueues] = {};

    for (size_t i = 0; i < n; i++) {
        if (paces[i] == nullptr) {
            continue;
        }

        uint32_t decode = load(&paces[i]->decode_us);

        if (decode < kDecodeUsPlausible) {
            continue;
        }

        for (uint32_t q = 0; q < kPaceQueues; q++) {
            uint32_t w = load(&paces[i]->wait_us[q]);

            if (w != 0) {
                sum[q] += double(w - 1) / double(decode);
                count[q]++;
            }
        }
    }

    // The knee: the first depth whose pooled wait is a queue.  The step:
    // the mean growth a request beyond it, over the depths learned.
    QueueShape shape;
    double growth = 0.0;
    uint32_t grown = 0;

    for (uint32_t q = 0; q < kPaceQueues; q++) {
        if (count[q] == 0) {
            continue;
        }

        double wait = sum[q] / count[q];

        if (shape.knee == 0 && wait >= kKneeTokens) {
            shape.knee = std::max<uint32_t>(q, 1);
        }

        if (shape.knee != 0 && q >= shape.knee) {
            growth += wait / double(q + 1 - shape.knee);
            grown++;
        }
    }

    if (grown) {
        shape.step = growth / grown;
    }

    return shape;
}

int64_t pace_estimate(const PeerPace &pace, const QueueShape &shape,
                      uint32_t queued, uint64_t uncached) noexcept
{
    uint32_t decode = load(&pace.decode_us);
    uint32_t prefill = load(&pace.prefill_ns);

    if (decode == 0 || prefill == 0) {
        return -1;
    }

    double wait = 0.0;

    if (shape.knee != 0 && queued + 1 > shape.knee) {
        wait = double(queued + 1 - shape.knee) * shape.step * double(decode);
    }

    // In double, and at most kEstimateMaxUs: learned figures at their
    // extremes must not overflow what they are compared as.
    return int64_t(std::min(wait + prefill_us(pace, prefill, uncached),
                            kEstimateMaxUs));
}

int64_t pace_prefill(const PeerPace &pace, uint64_t uncached) noexcept
{
    uint32_t prefill = load(&pace.prefill_ns);

    if (prefill == 0) {
        return -1;
    }

    return int64_t(std::min(prefill_us(pace, prefill, uncached),
                            kEstimateMaxUs));
}

}  // namespace affinity
