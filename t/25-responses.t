#!/usr/bin/env perl

# Responses API continuations (response_affinity) against four mock
# replicas that each keep the responses they produced, as vLLM does: a
# follow-up that names a response another replica produced gets 404.
#
# Two workers; 40 chains of 4 turns, half of them streamed, then a GET of
# each chain's last response: no miss through the module, many behind
# random balancing.  Then: the table survives a reload; a chain whose replica
# went away is routed as usual and says response_lost; a stream is not
# held back while its id is read; and responses the module cannot learn
# from (malformed, truncated, ids too long, compressed) pass unchanged,
# teach nothing and are logged once per worker.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use IO::Socket::INET;
use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use AffinityTest;
use AffinityConf qw(proxy_conf servers routes proxied_upstream);

my $t = AffinityTest->new(workers => 2);
my @replicas = $t->start_mock_replicas(4, '--decode-ms-per-token', 10);
my $random = $t->port;
my $status = $t->port;
my $junk = $t->port;
my $junk_proxy = $t->port;
my $both = $t->port;

my $long_id = 'resp_' . ('x' x 300);

# An upstream of nginx's own that answers what replicas should not.
my $junk_server = <<"EOF";
    server {
        listen 127.0.0.1:$junk;
        default_type application/json;
        location = /v1/ok { return 200 '{"id":"resp_junk_ok","object":"response"}'; }
        location = /v1/malformed { return 200 '{"id":"resp_m","object":"response",,}'; }
        location = /v1/truncated { return 200 '{"id":"resp_t","object":"response"'; }
        location = /v1/long { return 200 '{"id":"$long_id","object":"response"}'; }
        location = /v1/escaped { return 200 '{"id":"resp_\\\\u0041","object":"response"}'; }
        location = /v1/chat { return 200 '{"id":"chatcmpl-1","object":"chat.completion"}'; }
        location = /v1/gzip {
            add_header Content-Encoding gzip;
            return 200 '{"id":"resp_gz","object":"response"}';
        }
        location = /v1/no-id {
            default_type text/event-stream;
            return 200 'event: response.created\\ndata: {"type":"response.created","response":{"object":"response"}}\\n\\n';
        }
        location = /v1/done {
            default_type text/event-stream;
            return 200 'data: [DONE]\\n\\n';
        }
    }
EOF

$t->write_conf(proxy_conf($t,
    servers(\@replicas) . "        zone llm 64k;\n"
        . "        response_affinity zone=llm_responses:1m;\n",
    location => "            proxy_buffering off;\n",
    http => proxied_upstream(random => servers(\@replicas) . "        random;",
                             $random)
        . proxied_upstream(junk => "        server 127.0.0.1:$junk;\n"
                                   . "        response_affinity zone=junk_responses:1m;",
                           $junk_proxy)
        . proxied_upstream(both => servers(\@replicas)
                                   . "        session_affinity header=X-Session-ID zone=both_sessions:1m;\n"
                                   . "        response_affinity zone=both_responses:1m;",
                           $both,
                           log => 'access_log "' . $t->path('logs/both.log')
                                  . '" route;')
        . $junk_server
        . "    server {\n        listen 127.0.0.1:$status;\n"
        . "        location / { affinity_status; }\n    }\n"));
$t->start_nginx;

my $json = JSON::PP->new->canonical;
my %ct = ('Content-Type' => 'application/json');

sub create_body {
    my ($input, $previous, $stream) = @_;
    return $json->encode({
        model => 'llm-test', input => $input, max_output_tokens => 8,
        stream => $stream ? JSON::PP::true : JSON::PP::false,
        defined $previous ? (previous_response_id => $previous) : () });
}

# The id of a response: a JSON body's, or the first event's.
sub response_id {
    my ($res) = @_;
    return undef unless $res->{status} == 200;
    if (($res->{headers}{'content-type'} // '') =~ m{event-stream}) {
        my ($data) = $res->{body} =~ /^data: *(.*)$/m or return undef;
        return $json->decode($data)->{response}{id};
    }
    return $json->decode($res->{body})->{id};
}

sub replica { $_[0]{headers}{'x-replica-port'} // 'none' }

# Runs 40 chains of $turns turns through $port, the chains of a turn at
# once; returns (the last response id and replica of each chain, misses).
sub run_chains {
    my ($port, $turns) = @_;
    my (@last, @owner);
    my $misses = 0;
    for my $turn (1 .. $turns) {
        my @res = $t->parallel([ map {
            { method => 'POST', path => '/v1/responses', port => $port,
              headers => \%ct,
              body => create_body("chain $_ turn $turn", $last[$_], $_ % 2) }
        } 0 .. 39 ]);
        for my $c (0 .. 39) {
            my $id = response_id($res[$c]);
            if (!defined $id) {
                $misses++;
                next;
            }
            $last[$c] = $id;
            $owner[$c] = replica($res[$c]);
        }
    }
    return (\@last, \@owner, $misses);
}

sub get_all {
    my ($port, $ids) = @_;
    return $t->parallel([ map {
        { method => 'GET', path => "/v1/responses/$_", port => $port }
    } @$ids ]);
}

sub status_json {
    my $res = $t->http(GET => '/', port => $status);
    return $json->decode($res->{body});
}

# ---- 40 chains x 4 turns, half streamed -----------------------------------

my ($last, $owner, $misses) = run_chains($t->listen_port, 4);
is $misses, 0, '40 chains of 4 turns, half streamed: no response missed';

my @got = get_all($t->listen_port, $last);
is scalar(grep { $_->{status} == 200 } @got), 40,
    'the last response of every chain is found';
is scalar(grep { response_id($got[$_]) eq ($last->[$_] // '') } 0 .. 39),
    40, 'each GET returns the response asked for';

my @r = routes($t);
is scalar(grep { $_->{route} eq 'response_hit' } @r), 160,
    '120 follow-ups and 40 GETs: response_hit';
is scalar(grep { $_->{route} eq 'response_lost' } @r), 0, 'none lost';
my %used = map { $_ => 1 } @$owner;
cmp_ok scalar(keys %used), '>=', 3, 'chains spread over the replicas';

my $s = status_json();
my $zone = $s->{upstreams}{llm}{zones}{responses};
is $zone->{entries}, 160, 'status: 160 response ids held';
is $zone->{inserts}, 160, 'status: 160 ids learned';
is $s->{upstreams}{llm}{routes}{response_hit}, 160, 'status: 160 hits';

my $prom = $t->http(GET => '/?format=prometheus', port => $status)->{body};
like $prom,
    qr/^nginx_upstream_affinity_zone_entries\{zone="llm_responses",kind="responses",upstream="llm"\} 160$/m,
    'prometheus: the responses zone';
like $prom, qr/route="response_hit"\} \d+$/m, 'prometheus: response_hit';

# ---- the same behind random balancing --------------------------------------

# Not round robin: its per-worker counters can meet each chain's replica
# again every turn when a turn's requests arrive in order.  Each follow-up
# finds its replica by chance with p = 1/4; none missing out of 120 has
# p = 4^-120.
my (undef, undef, $random_misses) = run_chains($random, 4);
cmp_ok $random_misses, '>', 0, 'behind random balancing, follow-ups miss';
note "random: $random_misses of 160 turns missed";

# ---- with sessions: the pin follows where the responses live -------------

{
    my $log = $t->path('logs/both.log');
    my $ask = sub {
        my ($session, $previous) = @_;
        my $res = $t->http(POST => '/v1/responses', port => $both,
            headers => { %ct, 'X-Session-ID' => $session },
            body => create_body("from $session", $previous, 0));
        return ($res, replica($res));
    };
    my $route = sub { (AffinityConf::route_lines($log))[-1]{route} };

    # Two sessions on two different replicas.
    my ($first, $a) = $ask->('session-a');
    is $route->(), 'session_new', 'a session is pinned';
    my ($other, $b, $n) = (undef, $a, 0);
    while ($b eq $a && $n++ < 50) {
        ($other, $b) = $ask->("session-b$n");
    }
    isnt $b, $a, 'another session is on another replica';

    # Session a continues a response that session b's replica stored.
    my ($res, $where) = $ask->('session-a', response_id($other));
    is $res->{status}, 200, 'a session continuing another replica\'s response';
    is $where, $b, '... goes to that replica';
    is $route->(), 'response_hit', '... as response_hit';
    (undef, $where) = $ask->('session-a');
    is $where, $b, '... and its pin followed: the next turn goes there too';
    is $route->(), 'session_hit', '... as session_hit';
}

# ---- a continuation at any path of the API --------------------------------

{
    my $id = $last->[3];
    my $res = $t->http(GET => "/v1/responses/$id/input_items",
                       port => $t->listen_port);
    is $res->{status}, 200, 'input_items of a stored response';
    is replica($res), $owner->[3], '... from its replica';
    $res = $t->http(POST => "/v1/responses/$id/cancel",
                    port => $t->listen_port, headers => \%ct, body => '{}');
    is $res->{status}, 200, 'cancel reaches its replica';

    # Not a response named "compact": the body says what it continues.
    $t->http(POST => '/v1/responses/compact', port => $t->listen_port,
             headers => \%ct,
             body => $json->encode({ model => 'llm-test',
                                     previous_response_id => $id }));
    my $last = (routes($t))[-1];
    is $last->{route}, 'response_hit',
        'POST /v1/responses/compact is routed by its previous_response_id';
    like $last->{upstream}, qr/:$owner->[3]$/, '... to its replica';
}

# ---- conversations ---------------------------------------------------------

{
    my $res = $t->http(POST => '/v1/conversations', port => $t->listen_port,
                       headers => \%ct, body => '{"metadata":{"topic":"t"}}');
    is $res->{status}, 200, 'a conversation is created';
    my $conv = $json->decode($res->{body})->{id};
    my $home = replica($res);

    my @turns = map {
        $t->http(POST => '/v1/responses', port => $t->listen_port,
                 headers => \%ct,
                 body => $json->encode({ model => 'llm-test',
                                         input => "turn $_",
                                         conversation => $_ % 2
                                             ? $conv : { id => $conv },
                                         max_output_tokens => 4 }))
    } 1 .. 4;
    is scalar(grep { $_->{status} == 200 && replica($_) eq $home } @turns), 4,
        'its turns (by id or by object) reach the replica that holds it';
    my $items = $t->http(GET => "/v1/conversations/$conv/items",
                         port => $t->listen_port);
    is $items->{status}, 200, '... and so do its items';
    is_deeply [ map { $_->{route} } (routes($t))[-5 .. -1] ],
        [ ('response_hit') x 5 ], '... as response_hit';
}

# ---- reload keeps the table -----------------------------------------------

$t->reload_nginx;
@got = get_all($t->listen_port, $last);
is scalar(grep { $_->{status} == 200 } @got), 40,
    'after a reload every last response is still found';

# ---- the replica of a chain goes away --------------------------------------

{
    my $gone = $owner->[0];
    $t->stop_mock_replica($gone);
    my $before = () = routes($t);

    my @res = map {
        $t->http(POST => '/v1/responses', port => $t->listen_port,
                 headers => \%ct,
                 body => create_body('after the loss', $last->[0], 0))
    } 1 .. 2;
    my @new = (routes($t))[$before .. $before + 1];
    is_deeply [ map { $_->{route} } @new ], [ ('response_lost') x 2 ],
        'a chain whose replica is gone: response_lost';
    unlike $new[1]{upstream}, qr/:$gone\b/,
        '... and, once nginx knows (the peers\' state is shared), it is '
        . 'not tried there';
    is $res[$_]{status}, 404, "... served elsewhere (the response is gone)"
        for 0 .. 1;

    my ($fresh) = response_id($t->http(POST => '/v1/responses',
        port => $t->listen_port, headers => \%ct,
        body => create_body('a new chain', undef, 0)));
    ok defined $fresh, 'new chains still start';
    my $next = $t->http(POST => '/v1/responses', port => $t->listen_port,
                        headers => \%ct, body => create_body('on', $fresh, 1));
    is $next->{status}, 200, '... and continue';
    is((routes($t))[-1]{route}, 'response_hit', '... as response_hit');
}

# ---- a stream is not held back while its id is read ------------------------

# Reads a streamed response; returns the times (from the request) at which
# its first event and its end arrived.
sub stream_times {
    my ($port) = @_;
    my $body = $json->encode({ model => 'llm-test', input => 'stream timing',
                               max_output_tokens => 40,
                               stream => JSON::PP::true });
    my $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                     PeerPort => $port, Timeout => 10)
        or return;
    my $start = time;
    print {$sock} "POST /v1/responses HTTP/1.1\r\nHost: localhost\r\n"
        . "Content-Type: application/json\r\nConnection: close\r\n"
        . 'Content-Length: ' . length($body) . "\r\n\r\n$body";
    my ($in, $first) = ('');
    while (sysread $sock, $in, 65536, length $in) {
        $first //= time - $start if $in =~ /response\.created/;
    }
    return ($first, time - $start);
}

{
    my ($alive) = grep { $_ != $owner->[0] } @replicas;
    my ($direct_first, $direct_end) = stream_times($alive);
    my ($first, $end) = stream_times($t->listen_port);
    ok defined $first && defined $direct_first, 'streams read';
    note sprintf 'first event: %.1f ms direct, %.1f ms through nginx; '
        . 'end %.1f ms, %.1f ms', map { 1000 * ($_ // 0) }
        $direct_first, $first, $direct_end, $end;
    cmp_ok $first, '<', $direct_first + 0.1,
        'the first event arrives as fast as from the replica';
    cmp_ok $end - $first, '>', 0.5 * ($direct_end - $direct_first),
        '... long before the stream ends';
}

# ---- responses the module cannot learn from --------------------------------

{
    my %expect = (
        ok => '{"id":"resp_junk_ok","object":"response"}',
        malformed => '{"id":"resp_m","object":"response",,}',
        truncated => '{"id":"resp_t","object":"response"',
        long => qq({"id":"$long_id","object":"response"}),
        escaped => '{"id":"resp_\\u0041","object":"response"}',
        chat => '{"id":"chatcmpl-1","object":"chat.completion"}',
        gzip => '{"id":"resp_gz","object":"response"}',
        'no-id' => qq(event: response.created\ndata: {"type":"response.created","response":{"object":"response"}}\n\n),
        done => "data: [DONE]\n\n",
    );
    my @names = sort keys %expect;
    for my $round (1 .. 3) {
        my @res = $t->parallel([ map {
            { method => 'GET', path => "/v1/$_", port => $junk_proxy }
        } @names ]);
        for my $i (0 .. $#names) {
            is $res[$i]{status}, 200, "$names[$i]: served";
            is $res[$i]{body}, $expect{ $names[$i] },
                "$names[$i]: passed on unchanged";
        }
    }

    my $z = status_json()->{upstreams}{junk}{zones}{responses};
    is $z->{inserts}, 1, 'only the well-formed response was learned';

    my $log = $t->error_log;
    for my $why ('malformed JSON in a response',
                 'ended inside its JSON object',
                 'longer than 256 bytes or escaped',
                 'Content-Encoding "gzip"')
    {
        my $n = () = $log =~ /\Q$why\E/g;
        ok $n >= 1 && $n <= 2, "logged once per worker: $why ($n)";
    }
    unlike $log, qr/without an id/, 'bodies without an id are not logged';

    # A continuation of an id too long to learn is routed as usual.
    my $res = $t->http(GET => "/v1/responses/$long_id", port => $junk_proxy);
    is $res->{status}, 404, 'an unknown id is routed as usual';
}

# ---- a client that goes away mid-stream ------------------------------------

{
    my $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                     PeerPort => $t->listen_port);
    my $body = create_body('abandoned', undef, 1);
    print {$sock} "POST /v1/responses HTTP/1.1\r\nHost: localhost\r\n"
        . "Content-Type: application/json\r\n"
        . 'Content-Length: ' . length($body) . "\r\n\r\n$body";
    close $sock;
    sleep 0.3;
    my $res = $t->http(POST => '/v1/responses', port => $t->listen_port,
                       headers => \%ct, body => create_body('next', undef, 0));
    is $res->{status}, 200, 'an abandoned stream changes nothing';
}

is_deeply [ $t->log_problems ], [], 'no alerts, crashes or sanitizer reports';

done_testing;
