#!/usr/bin/env perl

# Two nginx instances in front of the same four mock replicas share what
# they learn through a real redis-server (affinity_store).  Instance A
# sees three of the replicas as down, so everything it routes goes to the
# fourth; instance B sees all four up, so on its own it would place
# sessions and prompts on the ring and miss responses stored by A's
# replica.  With the store, B follows A: sessions, prompts and response
# ids learned on A route the same way on B.  Then the store is killed
# under load (no request fails, each worker says so once) and restarted
# (what A learned meanwhile reaches B within seconds).  A's workers take
# turns on an accept mutex, which has a worker post the events it gathers
# and handle them after: the store's two connections, lost together, are
# then handled one after the other, and the first loss frees both.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use AffinityTest;
use AffinityConf qw(proxy_conf servers routes chat eventually);

plan skip_all => 'redis-server not installed'
    unless AffinityTest::redis_server();

my $a = AffinityTest->new(workers => 2);
my $b = AffinityTest->new(workers => 2);
my @replicas = $a->start_mock_replicas(4, '--decode-ms-per-token', 0.5);
my $redis = $a->port;
my $stream = "affinity-test-$$";

# The store asks for a password, and both instances hold the same secret,
# in files as the shipped snippet has them.
my $password = "store-password-$$";
my ($auth, $secret) = ($a->path('store.password'),
                       $a->path('store.secret'));
for ([$auth, "$password\n"], [$secret, "secret-of-the-instances-$$\n"]) {
    open my $fh, '>', $_->[0] or die "$_->[0]: $!";
    print {$fh} $_->[1];
    close $fh;
    chmod 0600, $_->[0];
}

sub start_redis { $a->start_redis($redis, '--requirepass', $password) }

start_redis();

my $only = $replicas[3];
my %down = map { $_ => 'down' } @replicas[0 .. 2];

sub upstream {
    my (%extra) = @_;
    return servers(\@replicas, %extra)
        . "        session_affinity header=X-Session-ID zone=s:1m generate;\n"
        . "        prefix_affinity zone=p:4m;\n"
        . "        response_affinity zone=r:1m;\n"
        . "        affinity_store 127.0.0.1:$redis stream=$stream\n"
        . "                       auth=$auth secret=$secret;\n";
}

# Instance B uses the shipped snippet, as a deployment would (the store's
# port aside).
my $snippet = do {
    local $/;
    open my $fh, '<', "$FindBin::Bin/../conf-examples/multi-instance/upstream.conf"
        or die "conf-examples/multi-instance/upstream.conf: $!";
    <$fh>;
};
like $snippet, qr{^affinity_store 127\.0\.0\.1:6379 auth=/etc/nginx/affinity-store\.password\s+secret=/etc/nginx/affinity-store\.secret;$}m,
    'the snippet names the store at 127.0.0.1:6379, its password and secret';
(my $b_upstream = $snippet) =~ s/127\.0\.0\.1:6379 /127.0.0.1:$redis stream=$stream /;
$b_upstream =~ s{/etc/nginx/affinity-store\.password}{$auth};
$b_upstream =~ s{/etc/nginx/affinity-store\.secret}{$secret};
$b_upstream =~ s/zone=llm_(\w+):\d+m/zone=b_$1:1m/g;

my $b_status = $b->port;

$a->write_conf(proxy_conf($a, upstream(%down)),
               events_conf => '    accept_mutex on;');
$b->write_conf(proxy_conf($b, servers(\@replicas) . $b_upstream,
                          http => <<"HTTP"));
    server {
        listen 127.0.0.1:$b_status;
        location / { affinity_status; }
    }
HTTP
$a->start_nginx;
$b->start_nginx;

my $json = JSON::PP->new;
my %ct = ('Content-Type' => 'application/json');

sub replica { $_[0]{headers}{'x-replica-port'} // 'none' }

sub ask {
    my ($t, $session, %opt) = @_;
    return $t->http(POST => '/v1/chat/completions',
        headers => { %ct, defined $session ? ('X-Session-ID' => $session) : () },
        body => $opt{body} // chat([ user => "Hello from $session" ]));
}

# The keys B holds in its zone of $kind (sessions, responses).
sub known_on_b {
    my ($kind) = @_;
    my $r = $b->http(GET => '/', port => $b_status);
    return 0 unless $r->{status} == 200;
    return $json->decode($r->{body})->{upstreams}{llm}{zones}{$kind}{entries};
}

# Whether B comes to hold $n keys of $kind more than $before, from what A
# learned: B asks nothing meanwhile, so they are A's, read from the store.
sub learned_by_b {
    my ($kind, $before, $n) = @_;
    return eventually(sub { known_on_b($kind) >= $before + $n }, 10);
}

sub last_routes {
    my ($t, $n) = @_;
    my @r = routes($t);
    return @r[-$n .. -1];
}

# ---- sessions --------------------------------------------------------------

my @sessions = map { "shared-$_" } 1 .. 20;
my $known = known_on_b('sessions');
is scalar(grep { replica(ask($a, $_)) eq $only } @sessions), 20,
    'instance A pins every session to the one replica it sees';
ok learned_by_b(sessions => $known, 20), 'B learns the 20 pins';

my @on_b = map { replica(ask($b, $_)) } @sessions;
is scalar(grep { $_ eq $only } @on_b), 20,
    'instance B routes them to the same replica';
is_deeply [ map { $_->{route} } last_routes($b, 20) ], [ ('session_hit') x 20 ],
    '... as sessions it knows (session_hit)';

# Every worker appends through a connection of its own.  Only the first
# worker of each instance waits on the stream (XREAD BLOCK): it applies
# what the other learned to the zones its workers share and, with
# affinity_metrics (B's snippet), reads every worker's announcements back.
{
    my @clients;
    ok eventually(sub {
            @clients = AffinityTest::redis_clients($redis);
            return 2 == grep { ($_->{cmd} // '') eq 'xread' } @clients;
        }, 5), 'the store has one reader per instance';
    is scalar(@clients), 6, '... beside the four workers\' writers'
        or diag join "\n", map { 'cmd=' . ($_->{cmd} // '') } @clients;
}

# Without the store B would have spread them: where its ring puts new ones.
my @fresh = map { replica(ask($b, "b-only-$_")) } 1 .. 20;
cmp_ok scalar(grep { $_ ne $only } @fresh), '>', 5,
    'sessions B places itself land elsewhere too (the test can tell)';

# A generated id is pinned and shared too, though its first request is
# reported by what placed it (its prompt).
{
    my $known = known_on_b('sessions');
    my @generated = map {
        ask($a, undef, body => chat([ user => "Generated id, question $_" ]))
            ->{headers}{'x-session-id'} // ''
    } 1 .. 8;
    like $_, qr/^[0-9a-f-]{36}$/, 'A generated an id' for @generated;
    ok learned_by_b(sessions => $known, 8), 'B learns their pins';
    my @there = map {
        replica(ask($b, $_, body => chat([ user => "Another turn of $_" ])))
    } @generated;
    is scalar(grep { $_ eq $only } @there), 8,
        'B routes the generated ids to A\'s replica';
    is_deeply [ map { $_->{route} } last_routes($b, 8) ],
        [ ('session_hit') x 8 ], '... as sessions it knows';
}

# ---- prompts ---------------------------------------------------------------

{
    my $prompt = chat([ system => 'Shared instructions. ' x 40 ],
                      [ user => 'A question only A has seen.' ]);
    my $known = known_on_b('prefixes');
    is replica(ask($a, undef, body => $prompt)), $only,
        'a prompt without a session goes to A\'s replica';
    ok learned_by_b('prefixes', $known, 1), 'B reads where A sent it';
    is replica(ask($b, undef, body => $prompt)), $only,
        'B sends the same prompt there';
    is((last_routes($b, 1))[0]{route}, 'prefix_hit', '... as prefix_hit');
}

# ---- response ids ----------------------------------------------------------

{
    my @ids;
    my $known = known_on_b('responses');
    for my $i (1 .. 10) {
        my $res = $a->http(POST => '/v1/responses', headers => \%ct,
            body => $json->encode({ model => 'm', input => "chain $i",
                                    max_output_tokens => 4 }));
        push @ids, $json->decode($res->{body})->{id} if $res->{status} == 200;
    }
    is scalar(@ids), 10, 'responses created through A';
    ok learned_by_b(responses => $known, 10), 'B learns their ids';
    my @res = map {
        $b->http(POST => '/v1/responses', headers => \%ct,
            body => $json->encode({ model => 'm', input => 'next',
                                    previous_response_id => $_,
                                    max_output_tokens => 4 }))
    } @ids;
    is scalar(grep { $_->{status} == 200 } @res), 10,
        'their follow-ups through B find them';
    is_deeply [ map { $_->{route} } last_routes($b, 10) ],
        [ ('response_hit') x 10 ], '... as response_hit';
}

# ---- the store goes away under load, and comes back ------------------------

{
    my @load = map {
        my $t = $_ % 2 ? $a : $b;
        { method => 'POST', path => '/v1/chat/completions', port => $t->listen_port,
          headers => { %ct, 'X-Session-ID' => "load-$_" },
          body => chat([ user => "load $_" ]) }
    } 1 .. 40;

    my @first = $a->parallel([ @load[0 .. 19] ]);
    $a->stop_service('redis', 'KILL');
    my @second = $a->parallel([ @load[20 .. 39] ]);
    is scalar(grep { $_->{status} == 200 } @first, @second), 40,
        'no request fails while the store goes away';

    # Learned on A while the store is away.
    my @outage = map { "outage-$_" } 1 .. 10;
    is scalar(grep { replica(ask($a, $_)) eq $only } @outage), 10,
        'A keeps routing on its own state';

    for my $t ($a, $b) {
        ok eventually(sub { $t->error_log =~ /store of upstream "llm" unavailable/ }, 5),
            'the store\'s absence is logged';
    }

    start_redis();
    ok eventually(sub { $a->error_log =~ /store of upstream "llm" is back/ }, 10),
        'A finds the store back';
    ok eventually(sub { $b->error_log =~ /store of upstream "llm" is back/ }, 10),
        'B finds the store back';

    # Each of A's workers keeps what it learned meanwhile and writes it
    # before anything newer once its own connection is back; B reads the
    # stream in order.  So once every worker of A that lost the store is
    # back, and B knows a pin A made after that (a session_hit, not one B
    # placed itself), B has read them.
    ok eventually(sub {
        my $lost = () = $a->error_log =~ /store of upstream "llm" unavailable/g;
        my $back = () = $a->error_log =~ /store of upstream "llm" is back/g;
        return $back >= $lost;
    }, 30), 'every worker of A finds the store back';
    my $caught = 0;
    for my $k (1 .. 50) {
        ask($a, "after-outage-$k");
        my $there = replica(ask($b, "after-outage-$k"));
        if ($there eq $only && (last_routes($b, 1))[0]{route} eq 'session_hit') {
            $caught = 1;
            last;
        }
        sleep 0.2;
    }
    ok $caught, 'B reads a pin A made after the store came back';

    is scalar(grep { replica(ask($b, $_)) eq $only } @outage), 10,
        'what A learned while the store was away reaches B';

    for my $t ($a, $b) {
        my $n = () = $t->error_log =~ /store of upstream "llm" unavailable/g;
        cmp_ok $n, '<=', 2, "logged once per worker, not per request ($n)";
    }
}

is_deeply [ $a->log_problems ], [], 'A: no alerts, crashes or sanitizer reports';
is_deeply [ $b->log_problems ], [], 'B: no alerts, crashes or sanitizer reports';

done_testing;
