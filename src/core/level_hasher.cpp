#include "level_hasher.h"

#include <algorithm>

#include "utf8.h"

namespace affinity {

namespace {

// Fixed: a prefix hashes alike in every nginx instance, so that several
// instances place a cold prompt on the same peer.
constexpr uint64_t kPrefixSeed = 0x70726566'69783031ULL;    // "prefix01"

}  // namespace

LevelHasher::LevelHasher(const uint32_t *schedule, size_t nschedule,
                         size_t turns, affinity_level_t *out,
                         size_t out_cap) noexcept
    : schedule_(schedule), nschedule_(nschedule), out_(out), out_cap_(out_cap),
      turns_cap_(std::min(turns, kMaxTurnLevels))
{
    XXH3_INITSTATE(&state_);
    XXH3_64bits_reset_withSeed(&state_, kPrefixSeed);
}

void LevelHasher::emit(uint32_t length) noexcept
{
    if (nout_ < out_cap_) {
        out_[nout_++] = {length, 0, XXH3_64bits_digest(&state_)};
    }
}

void LevelHasher::end_of_turn() noexcept
{
    // Shorter than the first scheduled length: too short a prefix to be
    // worth following (a system prompt of a few words that every
    // conversation shares would draw new ones to its holders).
    if (turns_cap_ == 0 || done() || code_points_ < schedule_[0]) {
        return;
    }

    auto length = static_cast<uint32_t>(code_points_);

    // Ending where a scheduled level or the previous message did: that
    // level is there already.
    if ((next_ > 0 && schedule_[next_ - 1] == length)
        || (nturns_ > 0
            && turns_[(nturns_ - 1) % turns_cap_].length == length))
    {
        return;
    }

    turns_[nturns_ % turns_cap_] = {length, 1, XXH3_64bits_digest(&state_)};
    nturns_++;
}

bool LevelHasher::append(std::string_view text) noexcept
{
    const char *p = text.data();
    size_t n = text.size();
    uint64_t count = n ? count_code_points(p, n) : 0;

    while (n > 0 && !done()) {
        uint64_t need = schedule_[next_] - code_points_;

        if (count < need) {
            XXH3_64bits_update(&state_, p, n);
            code_points_ += count;
            return true;
        }

        // A level ends inside this text; in ASCII, after `need` bytes.
        size_t end = count == n ? need : code_point_offset(p, n, need);

        XXH3_64bits_update(&state_, p, end);
        code_points_ += need;
        emit(schedule_[next_]);
        next_++;

        p += end;
        n -= end;
        count -= need;
    }

    return !done();
}

size_t LevelHasher::finish() noexcept
{
    if (nout_ == 0 && code_points_ > 0) {
        emit(static_cast<uint32_t>(
            std::min<uint64_t>(code_points_, UINT32_MAX)));
    }

    // The turn levels kept, oldest first, and as many of the most recent
    // as out has room for.  (A text shorter than the first level, which
    // has a level of its own length, has none: they start at that level.)
    size_t kept = std::min(nturns_, turns_cap_);
    size_t first = nturns_ - kept;
    size_t room = out_cap_ - nout_;

    if (kept > room) {
        first += kept - room;
        kept = room;
    }

    // Merged from the back: both runs are in order of length, and no
    // length is in both (end_of_turn() skips a scheduled level's).
    size_t i = nout_;
    size_t j = kept;
    size_t k = nout_ + kept;

    while (j > 0) {
        const affinity_level_t &turn = turns_[(first + j - 1) % turns_cap_];

        if (i > 0 && out_[i - 1].length > turn.length) {
            out_[--k] = out_[--i];
        } else {
            out_[--k] = turn;
            j--;
        }
    }

    nout_ += kept;
    return nout_;
}


size_t level_schedule(const uint32_t *lengths, size_t nlengths, uint32_t step,
                      uint32_t growth_percent, uint32_t max, uint32_t *out,
                      size_t out_cap) noexcept
{
    size_t n = 0;
    uint32_t last = 0;

    // The given lengths, sorted and without duplicates (insertion: a few).
    for (size_t i = 0; i < nlengths; i++) {
        uint32_t length = lengths[i];
        if (length == 0) {
            continue;
        }
        size_t at = 0;
        while (at < n && out[at] < length) {
            at++;
        }
        if ((at < n && out[at] == length) || at == out_cap) {
            continue;
        }
        if (n == out_cap) {
            n--;        // full: the longest given length makes room
        }
        for (size_t k = n; k > at; k--) {
            out[k] = out[k - 1];
        }
        out[at] = length;
        n++;
    }

    if (n > 0) {
        last = out[n - 1];
    }

    if (step == 0) {
        return n;
    }

    while (n < out_cap) {
        uint64_t gap = std::max<uint64_t>(
            step, uint64_t{last} * growth_percent / 100);
        uint64_t next = uint64_t{last} + gap;

        if (next > max) {
            break;
        }

        last = static_cast<uint32_t>(next);
        out[n++] = last;
    }

    return n;
}

}  // namespace affinity
