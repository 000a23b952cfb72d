#!/usr/bin/env perl

# Two nginx instances in front of the same server, with prefix_affinity
# cache= and a shared redis-server (affinity_store): a prefix one instance
# presumes the server holds ages with the prompts the other instance sends
# it, as with its own.  Instance B learns a shared document; instance A
# then sends other prompts.  4,000 characters of them leave the document
# cached (counted once, though two workers read every message); 6,000 more
# put it past the server's 1,000 tokens (5,000 characters), and B places it
# as new, as one instance that had sent them all would.  Across a reload
# of B, while its old workers finish a request, they are counted once.
# One server per upstream, so that every prompt reaches the same cache and
# only the route tells what B presumed.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use POSIX ();
use Test::More;
use Time::HiRes qw(sleep);

use AffinityTest;
use AffinityConf qw(proxy_conf servers routes chat text proxied_upstream
                    eventually);

plan skip_all => 'redis-server not installed'
    unless AffinityTest::redis_server();

my $a = AffinityTest->new(workers => 2);
my $b = AffinityTest->new(workers => 2);
my @ports = $a->start_backends(1);
my $redis = $a->port;
my $stream = "affinity-cache-test-$$";
my $b_status = $b->port;

$a->start_redis($redis);

# And a slow server, which B proxies to without the module, to keep B's
# workers busy across a reload.
my $slow = $b->start_backends(1, delay_ms => 4000);
my $slow_listen = $b->port;

for my $t ($a, $b) {
    $t->write_conf(proxy_conf($t, servers(\@ports)
        . "        prefix_affinity cache=1000 zone=p:1m;\n"
        . "        affinity_store 127.0.0.1:$redis stream=$stream;\n",
        http => $t == $b
            ? proxied_upstream(slow => servers([ $slow ]), $slow_listen)
              . "    server {\n        listen 127.0.0.1:$b_status;\n"
              . "        location / { affinity_status; }\n    }\n"
            : ''));
    $t->start_nginx;
}

my %json = ('Content-Type' => 'application/json');

sub ask {
    my ($t, $body) = @_;
    my $r = $t->http(POST => '/v1/chat/completions', headers => \%json,
                     body => $body);
    is $r->{status}, 200, 'served' or diag explain $r;
    return (routes($t))[-1]{route};
}

# B's store counters (affinity_status).
sub store_of_b {
    my $r = $b->http(GET => '/', port => $b_status);
    return JSON::PP->new->decode($r->{body})->{upstreams}{llm}{store};
}

my $n = 0;
sub others {
    my ($count) = @_;
    my $applied = store_of_b()->{applied};
    ask($a, chat([ user => text('other' . $n++, 2000) ])) for 1 .. $count;
    # What A announced reaches B (the store is on this machine): each
    # prompt's fill and levels, applied.
    ok eventually(sub { store_of_b()->{applied} >= $applied + 2 * $count },
                  15), "B applies what A announced of $count prompts"
        or diag explain store_of_b();
    sleep 0.5;      # time for a second count, were any counted twice, to show
}

my $doc = text('document', 2400);
sub question { chat([ system => $doc ], [ user => "Question $_[0]?" ]) }

is ask($b, question(1)), 'prefix_new', 'B: the document first seen';
is ask($b, question(2)), 'prefix_hit', 'B: then followed';

others(2);
is ask($b, question(3)), 'prefix_hit',
    'B: still followed after 4,000 characters sent through A';

others(3);
is ask($b, question(4)), 'prefix_new',
    'B: presumed evicted after 6,000 more sent through A';
is ask($b, question(5)), 'prefix_hit', 'B: cached again';

# A reload of B while a slow request keeps its old workers: they read the
# stream no more, and what A sends next is counted once, by the new ones.
{
    sleep 2.5;      # nothing A announced before is news any more
    my $child = fork // die "fork: $!";
    if ($child == 0) {
        $b->http(GET => '/', port => $slow_listen);
        POSIX::_exit(0);
    }
    ok eventually(sub { $b->backend_stats($slow)->{inflight} == 1 }, 10),
        'B\'s workers have the slow request';
    my %old = map { $_ => 1 } $b->worker_pids;
    kill 'HUP', $b->master_pid or die "kill HUP: $!";
    ok eventually(sub { grep({ !$old{$_} } $b->worker_pids) >= 2 }, 10),
        'B reloaded';
    ok scalar(grep { $old{$_} } $b->worker_pids),
        'B\'s old workers still finish the slow request';

    others(2);
    is ask($b, question(6)), 'prefix_hit',
        'B: still followed after 4,000 characters sent through A, '
        . 'counted once across the reload';
    waitpid $child, 0;
}

is_deeply [ $a->log_problems ], [], 'A: no alerts, crashes or sanitizer reports';
is_deeply [ $b->log_problems ], [], 'B: no alerts, crashes or sanitizer reports';

done_testing;
