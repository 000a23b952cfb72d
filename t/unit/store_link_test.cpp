// The store's replies as a link reads them (affinity_store_link_*): RESP2
// in pieces of any size, each reply with its command, bounded whatever a
// reply declares, and anything else a broken link; and the stream entries
// of XREAD and XREVRANGE replies.
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "affinity_core.h"

namespace {

class Link {
public:
    explicit Link(affinity_resp_limits_t lim = {256, 4096, 1024, 8, 16})
        : memory_(affinity_store_link_size(&lim) / 8 + 1)
    {
        link_ = affinity_store_link_init(memory_.data(), memory_.size() * 8,
                                         &lim);
        EXPECT_NE(link_, nullptr);
    }

    affinity_store_link_t *get() { return link_; }

    void expect(uint32_t tag, uint64_t arg = 0)
    {
        ASSERT_EQ(affinity_store_link_expect(link_, tag, arg), 0);
    }

    // Feeds text in pieces of step bytes; the replies whole, as text.
    std::vector<std::string> feed(const std::string &text, size_t step,
                                  int *status = nullptr)
    {
        std::vector<std::string> out;
        size_t pos = 0;
        int rc = AFFINITY_LINK_MORE;

        while (pos < text.size()) {
            size_t n = std::min(step, text.size() - pos), used;
            affinity_store_reply_t reply;
            rc = affinity_store_link_feed(link_, text.data() + pos, n, &used,
                                          &reply);
            if (rc == AFFINITY_LINK_BROKEN) {
                error = reply.error ? reply.error : "";
                break;
            }
            pos += used;
            if (rc == AFFINITY_LINK_REPLY) {
                tags.push_back(reply.tag);
                out.push_back(show(reply.root));
            }
        }
        if (status) {
            *status = rc;
        }
        return out;
    }

    // A reply as text: types, values, and ! for what was cut.
    std::string show(const affinity_resp_node_t *n)
    {
        if (n == nullptr) {
            return "?";
        }
        std::string cut = n->flags & AFFINITY_RESP_CUT ? "!" : "";
        switch (n->type) {
        case AFFINITY_RESP_SIMPLE:
            return "+" + std::string(n->str, n->len) + cut;
        case AFFINITY_RESP_ERROR:
            return "-" + std::string(n->str, n->len) + cut;
        case AFFINITY_RESP_INTEGER:
            return ":" + std::to_string(n->integer);
        case AFFINITY_RESP_BULK:
            return "$" + std::string(n->str, n->len) + cut;
        case AFFINITY_RESP_NIL:
            return "nil";
        default: {
            std::string s = "[";
            for (const affinity_resp_node_t *e =
                     affinity_resp_node(link_, n->first);
                 e; e = affinity_resp_node(link_, e->next))
            {
                s += (s.size() > 1 ? " " : "") + show(e);
            }
            return s + "]" + cut;
        }
        }
    }

    std::vector<uint32_t> tags;
    std::string error;

private:
    std::vector<uint64_t> memory_;
    affinity_store_link_t *link_;
};

const std::string kReplies =
    "+OK\r\n-ERR wrong\r\n:-42\r\n$5\r\nhello\r\n$0\r\n\r\n$-1\r\n*-1\r\n"
    "*0\r\n*3\r\n:1\r\n*2\r\n$1\r\na\r\n+b\r\n$2\r\nc\n\r\n";

const std::vector<std::string> kShown = {
    "+OK", "-ERR wrong", ":-42", "$hello", "$", "nil", "nil", "[]",
    "[:1 [$a +b] $c\n]"};

TEST(StoreLink, ReadsEveryTypeInPiecesOfAnySize)
{
    for (size_t step = 1; step <= kReplies.size(); step++) {
        SCOPED_TRACE(step);
        Link link;
        for (uint32_t i = 0; i < kShown.size(); i++) {
            link.expect(i + 1, i);
        }
        int rc;
        EXPECT_EQ(link.feed(kReplies, step, &rc), kShown);
        EXPECT_EQ(link.error, "");
        EXPECT_EQ(link.tags.size(), kShown.size());
        for (uint32_t i = 0; i < link.tags.size(); i++) {
            EXPECT_EQ(link.tags[i], i + 1);
        }
        EXPECT_EQ(affinity_store_link_pending(link.get()), 0u);
    }
}

// Each reply comes with the command that asked for it, in order; what is
// still pending is taken back when the connection goes.
TEST(StoreLink, PairsRepliesWithTheirCommands)
{
    Link link(affinity_resp_limits_t{64, 1024, 256, 8, 3});
    link.expect(7, 70);
    link.expect(8, 80);
    link.expect(9, 90);
    EXPECT_EQ(affinity_store_link_expect(link.get(), 10, 100), -1);

    affinity_store_reply_t reply;
    size_t used;
    ASSERT_EQ(affinity_store_link_feed(link.get(), "+a\r\n+b", 6, &used,
                                       &reply),
              AFFINITY_LINK_REPLY);
    EXPECT_EQ(used, 4u);
    EXPECT_EQ(reply.tag, 7u);
    EXPECT_EQ(reply.arg, 70u);

    uint32_t tag;
    uint64_t arg;
    ASSERT_EQ(affinity_store_link_feed(link.get(), "+b", 2, &used, &reply),
              AFFINITY_LINK_MORE);
    ASSERT_EQ(affinity_store_link_forget(link.get(), &tag, &arg), 1);
    EXPECT_EQ(arg, 80u);
    ASSERT_EQ(affinity_store_link_forget(link.get(), &tag, &arg), 1);
    EXPECT_EQ(arg, 90u);
    EXPECT_EQ(affinity_store_link_forget(link.get(), &tag, &arg), 0);

    affinity_store_link_reset(link.get());
    link.expect(1);
    EXPECT_EQ(link.feed("+again\r\n", 3), std::vector<std::string>{"+again"});
}

// A reply nobody asked for (a proxy's greeting, a stray +OK right after
// connecting, a second reply to one command) breaks the link before any
// of it is read.
TEST(StoreLink, AReplyNobodyAskedForBreaksTheLink)
{
    Link link;
    EXPECT_TRUE(link.feed("+OK\r\n", 5).empty());
    EXPECT_EQ(link.error, "a reply nobody asked for");

    Link second;
    second.expect(1);
    EXPECT_EQ(second.feed("+OK\r\n+OK\r\n", 10),
              std::vector<std::string>{"+OK"});
    EXPECT_EQ(second.error, "a reply nobody asked for");

    // Broken, it stays broken until reset.
    second.expect(2);
    affinity_store_reply_t reply;
    size_t used;
    EXPECT_EQ(affinity_store_link_feed(second.get(), "+OK\r\n", 5, &used,
                                       &reply),
              AFFINITY_LINK_BROKEN);
}

TEST(StoreLink, AnythingButResp2BreaksTheLink)
{
    const char *bad[] = {
        "%1\r\n",                   // RESP3 map
        "_\r\n",                    // RESP3 null
        "#t\r\n",                   // RESP3 boolean
        "+OK\n",                    // no carriage return
        "+OK\rX",                   // carriage return, no line feed
        ":12a\r\n",                 // not a number
        ":\r\n",
        "$-2\r\n",                  // no such length
        "$3\r\nabcd\r\n",           // longer than it said
        "$999999999999\r\n",        // beyond any bulk
        "*-5\r\n",
        ":123456789012345678901234567890123\r\n",   // a header too long
        "*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
        "HTTP/1.1 400 Bad Request\r\n",
    };

    for (const char *text : bad) {
        SCOPED_TRACE(text);
        Link link;
        link.expect(1);
        int rc;
        EXPECT_TRUE(link.feed(text, 1, &rc).empty());
        EXPECT_EQ(rc, AFFINITY_LINK_BROKEN);
        EXPECT_NE(link.error, "");
    }
}

// However large a reply says it is, the link keeps no more than its
// limits: a string beyond them is read past, none of it kept; elements
// without room are read to their end, and their array says so.
TEST(StoreLink, KeepsNoMoreThanItsLimits)
{
    Link link(affinity_resp_limits_t{6, 256, 16, 8, 4});
    std::string big(1 << 20, 'x');
    std::string text = "*3\r\n$" + std::to_string(big.size()) + "\r\n" + big
                       + "\r\n$3\r\nabc\r\n+" + std::string(100, 'y')
                       + "\r\n";
    link.expect(1);
    EXPECT_EQ(link.feed(text, 4096), std::vector<std::string>{"[$! $abc +!]"});

    // Nodes run out: the rest is read, not kept.
    link.expect(2);
    EXPECT_EQ(link.feed("*8\r\n:1\r\n:2\r\n:3\r\n:4\r\n:5\r\n:6\r\n*2\r\n:7\r\n"
                        ":8\r\n:9\r\n", 7),
              std::vector<std::string>{"[:1 :2 :3 :4 :5]!"});
    link.expect(3);
    EXPECT_EQ(link.feed("+after\r\n", 7), std::vector<std::string>{"+after"});

    // Bytes run out across strings: each one that does not fit is cut.
    Link bytes(affinity_resp_limits_t{16, 256, 200, 8, 4});
    bytes.expect(1);
    std::string s150(150, 's');
    EXPECT_EQ(bytes.feed("*3\r\n$150\r\n" + s150 + "\r\n$150\r\n" + s150
                         + "\r\n$3\r\nend\r\n", 64),
              std::vector<std::string>{"[$" + s150 + " $! $end]"});
}

TEST(StoreLink, WritesCommands)
{
    const char *argv[] = {"XADD", "s", "*", "m", "a\r\nb"};
    size_t lens[] = {4, 1, 1, 1, 4};
    char out[128];
    size_t n = affinity_resp_command(out, sizeof(out), 5, argv, lens);
    EXPECT_EQ(std::string(out, n),
              "*5\r\n$4\r\nXADD\r\n$1\r\ns\r\n$1\r\n*\r\n$1\r\nm\r\n"
              "$4\r\na\r\nb\r\n");
    EXPECT_EQ(affinity_resp_command(out, n - 1, 5, argv, lens), 0u);
}

// The entries of a stream in XREAD's reply and XREVRANGE's: ids parsed,
// the field "m" found among others, entries with ids that are not ids
// skipped, entries not wholly kept marked.
TEST(StoreLink, WalksStreamEntries)
{
    Link link;
    std::string xread =
        "*1\r\n*2\r\n$6\r\nstream\r\n*4\r\n"
        "*2\r\n$5\r\n1-0\r\n\r\n*2\r\n$1\r\nm\r\n$3\r\none\r\n"
        "*2\r\n$6\r\nnot-id\r\n*2\r\n$1\r\nm\r\n$1\r\nx\r\n"
        "*2\r\n$15\r\n1700000000000-7\r\n*4\r\n$1\r\nt\r\n$1\r\n5\r\n"
        "$1\r\nm\r\n$3\r\ntwo\r\n"
        "*2\r\n$3\r\n2-1\r\n*2\r\n$1\r\nq\r\n$1\r\nz\r\n";
    // (the first id's length is wrong on purpose: "1-0\r\n" is 5 bytes)
    link.expect(1);
    affinity_store_reply_t reply;
    size_t used;
    ASSERT_EQ(affinity_store_link_feed(link.get(), xread.data(), xread.size(),
                                       &used, &reply),
              AFFINITY_LINK_REPLY);

    affinity_store_entries_t it;
    ASSERT_EQ(affinity_store_entries(link.get(), reply.root, 0, &it), 0);
    affinity_store_entry_t e;
    std::vector<std::string> got;
    while (affinity_store_entries_next(link.get(), &it, &e)) {
        got.push_back(std::to_string(e.ms) + "-" + std::to_string(e.seq) + ":"
                      + (e.message ? std::string(e.message, e.message_len)
                                   : "none")
                      + (e.cut ? "!" : ""));
    }
    EXPECT_EQ(got, (std::vector<std::string>{"1700000000000-7:two",
                                             "2-1:none"}));

    // Nothing new: nil.  An error is not a reply with entries.
    link.expect(2);
    ASSERT_EQ(affinity_store_link_feed(link.get(), "*-1\r\n", 5, &used,
                                       &reply),
              AFFINITY_LINK_REPLY);
    ASSERT_EQ(affinity_store_entries(link.get(), reply.root, 0, &it), 0);
    EXPECT_EQ(affinity_store_entries_next(link.get(), &it, &e), 0);
    link.expect(3);
    ASSERT_EQ(affinity_store_link_feed(link.get(), "-WRONGTYPE x\r\n", 14,
                                       &used, &reply),
              AFFINITY_LINK_REPLY);
    EXPECT_EQ(affinity_store_entries(link.get(), reply.root, 0, &it), -1);

    // XREVRANGE: the entries themselves.
    link.expect(4);
    std::string range = "*1\r\n*2\r\n$4\r\n9-42\r\n*2\r\n$1\r\nm\r\n$1\r\nx\r\n";
    ASSERT_EQ(affinity_store_link_feed(link.get(), range.data(), range.size(),
                                       &used, &reply),
              AFFINITY_LINK_REPLY);
    ASSERT_EQ(affinity_store_entries(link.get(), reply.root, 1, &it), 0);
    ASSERT_EQ(affinity_store_entries_next(link.get(), &it, &e), 1);
    EXPECT_EQ(e.ms, 9u);
    EXPECT_EQ(e.seq, 42u);

    // An entry whose message found no room: marked, without its message.
    Link small(affinity_resp_limits_t{32, 512, 64, 8, 4});
    small.expect(1);
    std::string big(1000, 'b');
    std::string cut = "*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*2\r\n$3\r\n5-5\r\n"
                      "*2\r\n$1\r\nm\r\n$1000\r\n" + big + "\r\n";
    ASSERT_EQ(affinity_store_link_feed(small.get(), cut.data(), cut.size(),
                                       &used, &reply),
              AFFINITY_LINK_REPLY);
    ASSERT_EQ(affinity_store_entries(small.get(), reply.root, 0, &it), 0);
    ASSERT_EQ(affinity_store_entries_next(small.get(), &it, &e), 1);
    EXPECT_EQ(e.ms, 5u);
    EXPECT_TRUE(e.cut);
    EXPECT_FALSE(e.full) << "longer than any message: skipped, not read again";
    EXPECT_EQ(e.message, nullptr);

    // Entries after the reply's room ran out: cut and full, to read again.
    Link tight(affinity_resp_limits_t{13, 512, 64, 8, 4});
    tight.expect(1);
    std::string two = "*1\r\n*2\r\n$1\r\ns\r\n*2\r\n"
                      "*2\r\n$3\r\n6-1\r\n*2\r\n$1\r\nm\r\n$1\r\na\r\n"
                      "*2\r\n$3\r\n6-2\r\n*2\r\n$1\r\nm\r\n$1\r\nb\r\n";
    ASSERT_EQ(affinity_store_link_feed(tight.get(), two.data(), two.size(),
                                       &used, &reply),
              AFFINITY_LINK_REPLY);
    ASSERT_EQ(affinity_store_entries(tight.get(), reply.root, 0, &it), 0);
    ASSERT_EQ(affinity_store_entries_next(tight.get(), &it, &e), 1);
    EXPECT_FALSE(e.cut);
    EXPECT_EQ(std::string(e.message, e.message_len), "a");
    ASSERT_EQ(affinity_store_entries_next(tight.get(), &it, &e), 1);
    EXPECT_EQ(e.ms, 6u);
    EXPECT_EQ(e.seq, 2u);
    EXPECT_TRUE(e.cut);
    EXPECT_TRUE(e.full);
}

TEST(StoreLink, ParsesStreamIds)
{
    uint64_t ms, seq;
    EXPECT_EQ(affinity_store_parse_id("0-0", 3, &ms, &seq), 0);
    EXPECT_EQ(affinity_store_parse_id("18446744073709551615-18446744073709551615",
                                      41, &ms, &seq),
              0);
    EXPECT_EQ(ms, UINT64_MAX);
    for (const char *bad : {"", "-", "1-", "-1", "1", "1-2-3", "a-1",
                            "18446744073709551616-0", "1 -2"}) {
        EXPECT_EQ(affinity_store_parse_id(bad, std::strlen(bad), &ms, &seq),
                  -1)
            << bad;
    }
}

}  // namespace
