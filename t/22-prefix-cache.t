#!/usr/bin/env perl

# prefix_affinity cache=: a server that has since been sent more prompt
# text than its KV cache holds is presumed to have evicted a prefix.  A
# prompt is then placed as a new one (prefix_new) instead of following its
# old holder, and a session whose whole prompt is presumed evicted on its
# pinned server is placed anew (session_moved).  Without cache= both stay,
# unless the server's engine tells its cache's size (affinity_metrics, a
# mock replica with vLLM's cache_config_info): that size is then used, and
# what the engine says it computed counts the prompts sent past nginx;
# cache=off keeps every holder whatever the engine says.  With neither, a
# server whose replies give their cached tokens (usage.prompt_tokens_details)
# teaches its size: once a conversation's turn comes back to find the last
# one evicted, holders older than that are presumed evicted there too.
# One server per upstream, so that every prompt reaches the same cache and
# only the route tells what the module presumed.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;

use AffinityTest;
use AffinityConf qw(proxy_conf servers log_lines chat proxied_upstream
                    eventually engine_figures text);

my $t = AffinityTest->new;
my @ports = $t->start_backends(1);
# 62 blocks of 16 tokens, 992 tokens: as cache=1000 within 1 %.
my ($replica, $unmodelled, $teaching) = $t->start_mock_replicas(3,
    '--cache-tokens', 1000, '--decode-ms-per-token', 0);
my %port = map { $_ => $t->port }
    qw(bare cached session reported off learned status);
my $log = $t->path('logs/cache.log');

# 1,000 tokens: prompts of about 5,000 characters evict a prefix.
my %body = (
    bare    => 'prefix_affinity zone=bare_prefixes:1m;',
    cached  => 'prefix_affinity cache=1000 zone=cached_prefixes:1m;',
    session => "session_affinity zone=cache_sessions:1m;\n"
             . '        prefix_affinity cache=1000 zone=session_prefixes:1m;',
);

$t->write_conf(proxy_conf($t, servers(\@ports) . "        prefix_affinity;\n",
    http => "    log_format cache '\$affinity_route|\$affinity_prefix_len';\n"
          . join('', map {
                proxied_upstream($_, servers(\@ports) . "        $body{$_}",
                                 $port{$_}, log => qq(access_log "$log" cache;))
            } sort keys %body)
          . proxied_upstream(reported => servers([ $replica ])
                . "        prefix_affinity zone=reported_prefixes:1m;\n"
                . "        affinity_metrics interval=100ms;",
                $port{reported}, log => qq(access_log "$log" cache;))
          . proxied_upstream(learned => servers([ $teaching ])
                . "        prefix_affinity zone=learned_prefixes:1m;",
                $port{learned}, log => qq(access_log "$log" cache;))
          . proxied_upstream(off => servers([ $unmodelled ])
                . "        prefix_affinity cache=off zone=off_prefixes:1m;\n"
                . "        affinity_metrics interval=100ms;",
                $port{off}, log => qq(access_log "$log" cache;))
          . "    server {\n        listen 127.0.0.1:$port{status};\n"
          . "        location / { affinity_status; }\n    }\n"));
$t->start_nginx;

my %json = ('Content-Type' => 'application/json');

sub ask {
    my ($upstream, $body, %headers) = @_;
    my $r = $t->http(POST => '/v1/chat/completions', port => $port{$upstream},
                     headers => { %json, %headers }, body => $body);
    is $r->{status}, 200, 'served' or diag explain $r;
    my @lines = log_lines($log);
    return (split /\|/, $lines[-1])[0];
}

my $n = 0;
sub others {
    my ($upstream, $count) = @_;
    ask($upstream, chat([ user => text('other' . $n++, 2000) ])) for 1 .. $count;
}

my $doc = text('document', 2400);
sub question { chat([ system => $doc ], [ user => "Question $_[0]?" ]) }

ok eventually(sub { (engine_figures($t, $port{status}, 'reported')
                        ->{$replica}{cache_tokens} // 0) == 992 }, 5),
    'the replica\'s engine told its KV cache\'s size: 992 tokens';
like $t->http(GET => '/?format=prometheus', port => $port{status})->{body},
    qr/^nginx_upstream_affinity_peer_engine_cache_tokens\{upstream="reported",peer="127\.0\.0\.1:$replica",backup="false"\} 992$/m,
    'prometheus: the size';

for my $upstream (qw(bare cached reported off)) {
    subtest "a shared document, $upstream" => sub {
        is ask($upstream, question(1)), 'prefix_new', 'first seen';
        is ask($upstream, question(2)), 'prefix_hit', 'then followed';

        # 4,000 characters of other prompts since: still cached.
        others($upstream, 2);
        is ask($upstream, question(3)), 'prefix_hit', 'still followed';

        # 6,000 since: presumed evicted, with cache= only.
        others($upstream, 3);
        my $sized = $upstream eq 'cached' || $upstream eq 'reported';
        is ask($upstream, question(4)),
            $sized ? 'prefix_new' : 'prefix_hit',
            $sized ? 'presumed evicted: placed as new'
                   : 'without a size, followed';
        is ask($upstream, question(5)), 'prefix_hit', 'cached again';
    };
}

# Other nginx instances and clients that bypass this one fill the engine's
# cache too: what the engine says it computed moves the server's count.
subtest 'prompts sent past this nginx count, as the engine reports them' => sub {
    my $doc = text('bypassed', 2400);
    my $q = sub { chat([ system => $doc ], [ user => "Question $_[0]?" ]) };

    is ask(reported => $q->(1)), 'prefix_new', 'first seen';
    is ask(reported => $q->(2)), 'prefix_hit', 'then followed';

    # 6,000 characters straight to the replica, not through nginx.
    for my $k (1 .. 3) {
        my $r = $t->http(POST => '/v1/chat/completions', port => $replica,
                         headers => \%json,
                         body => chat([ user => text("bypass$k", 2000) ]));
        is $r->{status}, 200, 'sent past nginx';
    }
    # The first page served after the bypass holds it; two more polls
    # (every 100 ms) and nginx has read it.
    my $scrapes = sub {
        JSON::PP->new->decode(
            $t->http(GET => '/stats', port => $replica)->{body})->{scrapes};
    };
    my $since = $scrapes->();
    ok eventually(sub { $scrapes->() >= $since + 3 }, 10),
        'the engine was polled since';

    is ask(reported => $q->(3)), 'prefix_new',
        'presumed evicted by what the engine computed';
};

# The replica's cache holds 992 tokens; the prompts here are about 4
# characters a token.  A conversation's second turn, 6,000 characters of
# other prompts after its first, finds it evicted, and says so.
subtest 'a size learned from the replies' => sub {
    my $first = [ user => text('learning', 1500) ];
    my $turn2 = chat($first, [ assistant => 'Noted.' ],
                     [ user => 'And then?' ]);

    is ask(learned => chat($first)), 'prefix_new', 'a first turn';
    others('learned', 3);
    my $learned = sub {
        my $s = JSON::PP->new->decode(
            $t->http(GET => '/', port => $port{status})->{body});
        return $s->{upstreams}{learned}{peers}[0]{learned_cache_tokens};
    };
    is $learned->(), undef, 'no size learned before an eviction';
    is ask(learned => $turn2), 'prefix_hit',
        'its second turn: followed, nothing learned yet';
    my $tokens = $learned->() // 0;
    ok $tokens >= 1200 && $tokens <= 1600,
        "its reply said it was evicted: $tokens tokens learned";
    like $t->http(GET => '/?format=prometheus', port => $port{status})->{body},
        qr/^nginx_upstream_affinity_peer_learned_cache_tokens\{upstream="learned",peer="127\.0\.0\.1:$teaching",backup="false"\} $tokens$/m,
        'prometheus: the size learned';

    # 6,000 characters is now about what a prefix lasts there (7,500
    # with the margin).
    my $doc = text('learned', 2400);
    my $q = sub { chat([ system => $doc ], [ user => "Question $_[0]?" ]) };
    is ask(learned => $q->(1)), 'prefix_new', 'first seen';
    others('learned', 2);
    is ask(learned => $q->(2)), 'prefix_hit', '4,000 characters later: held';
    others('learned', 4);
    is ask(learned => $q->(3)), 'prefix_new',
        '8,000 characters later: presumed evicted';
    is ask(learned => $q->(4)), 'prefix_hit', 'cached again';

    # The servers of backend.pl give no usage: nothing is learned there.
    is ask(bare => $q->(1)), 'prefix_new', 'a server without usage';
    others('bare', 4);
    is ask(bare => $q->(2)), 'prefix_hit', 'followed, its size unknown';
};

subtest 'a session whose prompt is presumed evicted is placed anew' => sub {
    my %id = ('X-Session-ID' => 'cache-session-1');
    my $body = chat([ user => text('session', 1500) ]);

    is ask(session => $body, %id), 'session_new', 'pinned';
    is ask(session => $body, %id), 'session_hit', 'stays';
    others('session', 3);
    is ask(session => $body, %id), 'session_moved',
        'its pinned server is presumed to have evicted it';
    is ask(session => $body, %id), 'session_hit', 'pinned where it went';
};

is_deeply [ $t->log_problems ], [], 'no alert, crit, emerg or crash in error.log';

done_testing;
