#!/usr/bin/env perl

# affinity_status: per upstream and peer counters after known traffic, in
# JSON and in the Prometheus text format, exact across four workers.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use IO::Socket::INET;
use JSON::PP;
use List::Util qw(sum);
use Test::More;

use AffinityTest;
use AffinityConf qw(proxy_conf servers log_lines);

my $t = AffinityTest->new;
my ($p1, $p2, $spare) = $t->start_backends(3);
my $status_port = $t->port;

# An upstream named with a double quote, to see label escaping.
my $extra = <<'HTTP' =~ s/STATUS_PORT/$status_port/r;
    upstream "odd\"name" {
        server 127.0.0.1:1;
        session_affinity zone=odd:128k;
    }

    server {
        listen 127.0.0.1:STATUS_PORT;
        location = /status { affinity_status; }
    }
HTTP

my $upstream = servers([ $p1, $p2 ]) . servers([$spare], $spare => 'backup') . <<'UPSTREAM';
        session_affinity zone=st_sessions:1m;
        prefix_affinity zone=st_prefixes:1m;
UPSTREAM

$t->write_conf(proxy_conf($t, $upstream, http => $extra,
                          location => '            proxy_next_upstream_tries 2;'));
$t->start_nginx;

sub status_json {
    my $r = $t->http(GET => '/status', port => $status_port);
    is $r->{status}, 200, 'status answers 200';
    like $r->{headers}{'content-type'}, qr{^application/json}, 'as JSON';
    return decode_json($r->{body});
}

my %json = ('Content-Type' => 'application/json');

# Known traffic: 5 sessions twice each; 2 conversations of 2 turns; 3
# requests with neither a session nor a prompt.
for my $round (1, 2) {
    $t->http(GET => '/', headers => { 'X-Session-ID' => "st-$_" }) for 1 .. 5;
}
for my $c (1, 2) {
    my $m1 = qq({"role":"user","content":"conversation $c: ) . ('words ' x 30) . '"}';
    my $m2 = qq({"role":"assistant","content":"reply $c"},{"role":"user","content":"more $c"});
    $t->http(POST => '/', headers => \%json, body => qq({"model":"m","messages":[$m1]}));
    $t->http(POST => '/', headers => \%json, body => qq({"model":"m","messages":[$m1,$m2]}));
}
$t->http(GET => '/') for 1 .. 3;

my $s = status_json();
my $u = $s->{upstreams}{llm};
ok $u, 'the upstream is listed';
ok exists $s->{upstreams}{'odd"name'}, 'every affinity upstream is listed';

subtest 'JSON counters after known traffic' => sub {
    is_deeply $u->{balance}, { factor => 1.25, slack => 2, instances => 1,
                               unheard_presumed => 0, unheard_learned => 0,
                               unheard_met => 0, unheard_beside => 0 },
        'balance parameters: no other instance heard from, none presumed';
    my @peers = @{ $u->{peers} };
    is scalar(@peers), 3, 'three peers';
    is_deeply [ map { $_->{backup} ? 1 : 0 } @peers ], [ 0, 0, 1 ], 'the backup is marked';

    is sum(map { $_->{requests} } @peers), 17, '17 requests in all';
    is sum(map { $_->{inflight} } @peers), 0, 'none in flight';
    is sum(map { $_->{pins} } @peers), 5, 'five sessions pinned';

    my %r = %{ $u->{routes} };
    is $r{session_new}, 5, 'session_new';
    is $r{session_hit}, 5, 'session_hit';
    is $r{prefix_new}, 2, 'prefix_new';
    is $r{prefix_hit}, 2, 'prefix_hit';
    is $r{fallback}, 3, 'fallback';
    is $r{session_moved} + $r{session_spill}, 0, 'nothing moved';

    for my $p (@peers) {
        is sum(values %{ $p->{routes} }), $p->{requests},
            "$p->{name}: routes add up to its requests";
    }

    is $u->{zones}{sessions}{entries}, 5, 'session zone holds 5 entries';
    is $u->{zones}{sessions}{name}, 'st_sessions', 'zone name';
    ok $u->{zones}{sessions}{capacity} > 29000, "1m holds $u->{zones}{sessions}{capacity} pins";
    is $u->{zones}{sessions}{peer_slots}, 3,
        'a counter slot for each server, the backup too';
    is $u->{zones}{sessions}{peer_slots_reclaimed}, 0, 'none handed over';
    # each ~250-character prompt reaches only the 100-character level, which
    # both turns of a conversation share, and has a turn level at the end of
    # each message past it: the first message's (both turns), the reply's
    # and the second question's: four entries per conversation
    is $u->{zones}{prefixes}{entries}, 8, 'prefix zone holds four levels each';
};

subtest 'failures are counted' => sub {
    # New sessions go where the ring puts them: the first one placed on the
    # stopped backend fails there (and is retried on the other), before
    # max_fails marks it down.  40 make missing it a 1 in 2^40 chance.
    $t->stop_backend($p1);
    $t->http(GET => '/', headers => { 'X-Session-ID' => "st-fail-$_" }) for 1 .. 40;
    my ($dead) = grep { $_->{name} eq "127.0.0.1:$p1" } @{ status_json()->{upstreams}{llm}{peers} };
    ok $dead->{failures} >= 1, "the stopped backend has $dead->{failures} failures";
};

subtest 'fallback reasons are counted' => sub {
    # Each kind of body the balancer cannot use, a known number of times,
    # with no session key: counted per request (the log says it once).
    my $before = status_json()->{upstreams}{llm}{fallbacks};
    is_deeply [ sort keys %$before ],
        [ sort qw(not_buffered not_json no_body too_large read_error
                  parse_error no_prompt no_memory) ], 'every reason listed';

    my @sent = (
        [ not_json => 3, { 'Content-Type' => 'text/plain' }, 'just text' ],
        [ parse_error => 2, \%json, '{"messages":[{"role":"user",' ],
        [ no_prompt => 4, \%json, '{"model":"m","temperature":0}' ],
        [ no_body => 1, \%json, '' ],
    );
    for my $case (@sent) {
        my ($reason, $n, $headers, $body) = @$case;
        for (1 .. $n) {
            is $t->http(POST => '/', headers => $headers, body => $body)
                   ->{status}, 200, "$reason: routed all the same";
        }
    }

    my $after = status_json()->{upstreams}{llm}{fallbacks};
    for my $case (@sent) {
        my ($reason, $n) = @$case;
        is $after->{$reason} - $before->{$reason}, $n, "$reason: $n counted";
    }
    is $after->{too_large} - $before->{too_large}, 0, 'nothing else';

    # A request that fails before it is balanced is not counted, though
    # the access log's $affinity_session reads its (partial) body.
    my $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                     PeerPort => $t->listen_port)
        or die "connect: $!";
    print $sock "POST / HTTP/1.1\r\nHost: localhost\r\n"
              . "Content-Type: application/json\r\nContent-Length: 100\r\n"
              . "\r\n{\"messages\":[{\"role\":";
    close $sock;
    my $logged = sub { scalar grep { /\|400$/ } log_lines($t->path('logs/route.log')) };
    for (1 .. 50) { last if $logged->(); select undef, undef, undef, 0.1 }
    ok $logged->(), 'an upload cut short was logged (400)';
    is_deeply status_json()->{upstreams}{llm}{fallbacks}, $after,
        'and counted as no fallback';

    my $log = $t->error_log;
    my @once = $log =~ /is not JSON, balancing without it/g;
    ok @once >= 1 && @once <= scalar($t->worker_pids),
        'logged at most once per worker (' . scalar(@once) . ')';
};

subtest 'Prometheus text format' => sub {
    my $r = $t->http(GET => '/status?format=prometheus', port => $status_port);
    is $r->{status}, 200, 'served';
    like $r->{headers}{'content-type'}, qr{^text/plain; version=0\.0\.4}, 'content type';

    my (%help, %type, %samples, @bad, %done, $current);
    for my $line (split /\n/, $r->{body}) {
        # a family's lines form one group (the text format requires it)
        my ($family) = $line =~ /^(?:# (?:HELP|TYPE) )?([a-z_]+)/;
        if (defined $family && ($current // '') ne $family) {
            push @bad, "$family again after other families" if $done{$family};
            $done{$current} = 1 if defined $current;
            $current = $family;
        }
        if ($line =~ /^# HELP (\S+) \S/) { $help{$1}++; next }
        if ($line =~ /^# TYPE (\S+) (counter|gauge)$/) {
            push @bad, "TYPE after samples: $line" if $samples{$1};
            $type{$1}++;
            next;
        }
        if ($line =~ /^([a-z_]+)\{((?:[a-z]+="(?:[^"\\]|\\.)*",?)*)\} (\d+(?:\.\d+)?)$/) {
            push @bad, "sample before its TYPE: $line" unless $type{$1};
            $samples{$1}{$2} = $3;
            next;
        }
        push @bad, $line;
    }
    is_deeply \@bad, [], 'every line is HELP, TYPE or a well-formed sample';
    is scalar(grep { $help{$_} != 1 || ($type{$_} // 0) != 1 } keys %help), 0,
        'each family has one HELP and one TYPE';

    my $json = status_json()->{upstreams}{llm};
    my $req = $samples{nginx_upstream_affinity_peer_requests_total};
    for my $p (@{ $json->{peers} }) {
        my $labels = sprintf 'upstream="llm",peer="%s",backup="%s"',
            $p->{name}, $p->{backup} ? 'true' : 'false';
        is $req->{$labels}, $p->{requests}, "requests of $p->{name} as in JSON";
        is $samples{nginx_upstream_affinity_peer_pins}{$labels}, $p->{pins}, '  pins';
    }

    my $routes = $samples{nginx_upstream_affinity_routes_total};
    for my $route (qw(session_new session_hit prefix_new prefix_hit fallback)) {
        is sum(map { $routes->{$_} }
               grep { /upstream="llm"/ && /route="$route"/ } keys %$routes),
           $json->{routes}{$route}, "routes_total of $route as in JSON";
    }

    ok exists $samples{nginx_upstream_affinity_zone_entries}{'zone="st_sessions",kind="sessions",upstream="llm"'},
        'zone metrics';
    is $samples{nginx_upstream_affinity_zone_peer_slots}{'zone="st_sessions",kind="sessions",upstream="llm"'},
        3, 'peer slots as in JSON';
    is $samples{nginx_upstream_affinity_zone_peer_slots_reclaimed_total}{'zone="st_sessions",kind="sessions",upstream="llm"'},
        0, 'slots handed over as in JSON';
    is $samples{nginx_upstream_affinity_zone_worker_rows_used}{'zone="st_sessions",kind="sessions",upstream="llm"'},
        scalar($t->worker_pids), 'a worker row per worker';
    is $samples{nginx_upstream_affinity_zone_workers_reaped_total}{'zone="st_sessions",kind="sessions",upstream="llm"'},
        0, 'no worker died';
    ok scalar(grep { /upstream="odd\\"name"/ } keys %$req), 'label values are escaped';

    my $fallbacks = $samples{nginx_upstream_affinity_fallbacks_total};
    for my $reason (sort keys %{ $json->{fallbacks} }) {
        is $fallbacks->{qq(upstream="llm",reason="$reason")},
            $json->{fallbacks}{$reason}, "fallbacks_total of $reason as in JSON";
    }
    is $samples{nginx_upstream_affinity_balance_factor}{'upstream="llm"'}, '1.250',
        'the bound\'s factor';
    is $samples{nginx_upstream_affinity_balance_slack}{'upstream="llm"'}, 2,
        'and its slack';
    my $info = $samples{nginx_upstream_affinity_info};
    my $version = status_json()->{version};
    like $version, qr/^\d+\.\d+\.\d+$/, "version $version in JSON";
    is scalar(grep { /^version="\Q$version\E",nginx="[\d.]+"$/ } keys %$info), 1,
        'and in the info metric';
};

$t->stop_nginx;
is_deeply [ $t->log_problems ], [], 'no alert, crit, emerg or crash in error.log';

done_testing;
