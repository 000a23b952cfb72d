#!/usr/bin/env perl

# Several instances behind a random spreader each place a request without
# the others' requests of that moment.  Each presumes that every other
# instance places, unseen, twice as many as this one routes while its news
# is on the way (its unheard requests, in the recent mean).  Spread one by
# one, that is next to none, and a new prompt goes to the least loaded
# replica.  In a burst, were each sent there, a burst through every
# instance would meet there: so the room the burst fills is dealt, each
# replica drawn with odds by its room (docs/routing.md, "Several
# instances").  Here the store pauses writes (CLIENT PAUSE WRITE): A's
# announcements wait, and its requests stay unheard, as in a burst.  Long
# requests (600 tokens at 50 ms) keep the load while short ones are
# placed; the engines are polled once, at the start, and the figure stays
# fresh (three intervals).

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use List::Util qw(min);
use POSIX ();
use Test::More;
use Time::HiRes qw(time sleep);

use AffinityTest;
use AffinityConf qw(proxy_conf servers eventually engine_figures);

plan skip_all => 'redis-server not installed'
    unless AffinityTest::redis_server();

my $a = AffinityTest->new(workers => 1);
my $b = AffinityTest->new(workers => 1);
my @replicas = $a->start_mock_replicas(4, '--decode-ms-per-token', 50);
my $redis = $a->port;
my $stream = "affinity-dealt-$$";
my $status = $a->port;

$a->start_redis($redis);

# The store pauses writes for 15 s below: A waits for its answers.
my $upstream = servers(\@replicas)
    . "        prefix_affinity zone=p:4m;\n"
    . "        affinity_store 127.0.0.1:$redis stream=$stream timeout=20s;\n"
    . "        affinity_metrics interval=300s timeout=1s;\n";

$a->write_conf(proxy_conf($a, $upstream,
    http => "    server {\n        listen 127.0.0.1:$status;\n"
          . "        location / { affinity_status; }\n    }\n"));
$b->write_conf(proxy_conf($b, $upstream));
$a->start_nginx;
$b->start_nginx;

my $codec = JSON::PP->new;
my %json = ('Content-Type' => 'application/json');
my @clients;

sub state_of_a {
    my $res = $a->http(GET => '/', port => $status);
    return $res->{status} == 200
        ? $codec->decode($res->{body})->{upstreams}{llm} : {};
}

# A's requests in flight by replica port.
sub inflight {
    return { map { (($_->{name} =~ /:(\d+)$/)[0] => $_->{inflight}) }
             @{ state_of_a()->{peers} // [] } };
}

sub total { my $n = 0; $n += $_ for values %{ $_[0] }; return $n }

sub body {
    my ($tag, $tokens) = @_;
    return '{"model":"llm-test","messages":[{"role":"user","content":'
        . AffinityConf::json_string("$tag: " . ('a question of its own ' x 20))
        . "}],\"max_tokens\":$tokens}";
}

# A prompt of its own, answered at once: the port of the replica that
# answered, or "failed".
sub ask {
    my ($t, $tag) = @_;
    my $res = $t->http(POST => '/v1/chat/completions', headers => \%json, body => body($tag, 1));
    return $res->{status} == 200
        ? $res->{headers}{'x-replica-port'} // 'unnamed' : 'failed';
}

sub redis_command { AffinityTest::redis_command($redis, @_) }

# A long request through A in a process of its own, counted in flight
# before this returns.
sub hold {
    my ($tag) = @_;
    my $before = total(inflight());
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        $a->http(POST => '/v1/chat/completions', headers => \%json, body => body($tag, 600),
                 timeout => 60);
        POSIX::_exit(0);
    }
    push @clients, $pid;
    return eventually(sub { total(inflight()) > $before }, 10);
}

ok eventually(sub {
        my $e = engine_figures($a, $status, 'llm');
        4 == grep { defined $e->{$_} } @replicas
    }, 10), "A has every engine's figure";
isnt ask($b, 'from B'), 'failed', 'B routes a request';
ok eventually(sub { (state_of_a()->{balance}{instances} // 0) == 2 }, 10),
    'A hears from B through the store';

# Three long requests: one on each of three replicas, the fourth idle.
ok hold("long $_"), "long request $_ in flight" for 1 .. 3;
my $load = inflight();
my @idle = grep { $load->{$_} == 0 } @replicas;
is scalar(@idle), 1, 'one replica holds none' or diag explain $load;

subtest 'spread one by one: the least loaded replica takes each' => sub {
    my %n;
    $n{ ask($a, "quiet $_") }++ for 1 .. 20;
    is $n{ $idle[0] } // 0, 20, 'all 20 on the idle replica'
        or diag explain \%n;
    my $beside = state_of_a()->{balance}{unheard_beside};
    cmp_ok $beside, '<', 0.5, "next to none unheard in the mean ($beside)";
};

subtest 'in a burst, new prompts are dealt over the room' => sub {
    like redis_command(qw(CLIENT PAUSE 15000 WRITE)),
        qr/^\+OK/, 'the store pauses writes';
    my $start = time;

    # Three more long requests, unheard while the store pauses.
    ok hold("burst long $_"), "burst long request $_ in flight" for 1 .. 3;
    my $load = inflight();
    my $least = min(values %$load);
    my %above = map { $_ => 1 } grep { $load->{$_} > $least } @replicas;
    note explain $load;
    ok scalar(keys %above), 'some replicas hold more than the least';

    my (%n, $above);
    for my $k (1 .. 40) {
        my $r = ask($a, "burst $k");
        $n{$r}++;
        $above++ if $above{$r};
    }
    note explain \%n;
    cmp_ok time - $start, '<', 15, 'all placed while the store paused';
    my $beside = state_of_a()->{balance}{unheard_beside};
    cmp_ok $beside, '>', 1, "the status shows A's unheard requests ($beside)";
    cmp_ok $above // 0, '>=', 3,
        'some went to replicas above the least loaded: dealt, not all '
        . 'sent to the least loaded';
    like redis_command(qw(CLIENT UNPAUSE)),
        qr/^\+OK/, 'the store takes writes';
};

kill 'TERM', @clients;
waitpid $_, 0 for @clients;
$a->stop_nginx;
$b->stop_nginx;
is_deeply [ $a->log_problems ], [], 'A: no alert, crit, emerg or crash';
is_deeply [ $b->log_problems ], [], 'B: no alert, crit, emerg or crash';

done_testing;
