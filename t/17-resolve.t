#!/usr/bin/env perl

# Servers with "resolve" (nginx 1.27.3+, upstream in a zone): the module
# balances the addresses a name resolves to, and keeps doing so when they
# change at run time.  A replica that leaves the DNS answer moves only its
# own sessions; one that joins takes new sessions and nobody else's.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Time::HiRes qw(sleep time);

use AffinityTest;
use AffinityConf qw(proxy_conf routes placement moved);

my $t = AffinityTest->new;

plan skip_all => 'nginx ' . ($t->nginx_version // '?')
    . ' cannot resolve upstream servers at run time (1.27.3+)'
    unless $t->nginx_at_least('1.27.3');

my $port = $t->port;
my @addrs = map { "127.0.0.$_" } 2 .. 5;
$t->start_backend_at($_, $port) for @addrs;

my $dns = $t->start_dns('llm.test' => [ @addrs[0 .. 2] ]);

$t->write_conf(proxy_conf($t,
      "        zone llm_peers 256k;\n"
    . "        server llm.test:$port resolve max_fails=0;\n"
    . "        session_affinity zone=resolve:1m;\n"
    . "        prefix_affinity zone=resolve_prefixes:1m;\n",
    http => "    resolver 127.0.0.1:$dns valid=1s ipv6=off;\n"
          . "    resolver_timeout 2s;\n",
    location => "            location = /status { affinity_status; }\n"));
$t->start_nginx;

my @ids = map { "r-$_" } 1 .. 300;

# Where each session goes now: {id => backend address}.
sub where { placement($t, [@_], by => 'X-Backend-Addr') }

# Waits until requests reach exactly these addresses (nginx re-resolves
# about a second after the TTL).
sub wait_for {
    my (@want) = @_;
    my $want = join ' ', sort @want;
    my $deadline = time + 20;
    my $seen = '';
    while (time < $deadline) {
        my %at;
        for (1 .. 40) {
            my $r = $t->http(GET => '/');
            $at{ $r->{headers}{'x-backend-addr'} // "status $r->{status}" }++;
        }
        $seen = join ' ', sort keys %at;
        return 1 if $seen eq $want;
        sleep 0.5;
    }
    diag "still seeing: $seen";
    return 0;
}


ok wait_for(map { "$_:$port" } @addrs[0 .. 2]), 'the three resolved replicas serve';

my $initial = where(@ids);
my %count;
$count{$_}++ for values %$initial;
is_deeply [ sort keys %count ], [ sort map { "$_:$port" } @addrs[0 .. 2] ],
    'sessions spread over the resolved addresses';
ok !(grep { $_ < 50 } values %count),
    'none gets few: ' . join('/', map { $count{$_} } sort keys %count);

my %route;
$route{ $_->{route} }++ for routes($t);
is $route{session_new}, 300, 'placed by the module, not by round robin';
is_deeply where(@ids), $initial, 'and sticky';

subtest 'a replica leaving the answer moves only its sessions' => sub {
    my $gone = "$addrs[1]:$port";
    my @on_gone = grep { $initial->{$_} eq $gone } @ids;

    $t->set_dns('llm.test' => [ @addrs[0, 2] ]);
    ok wait_for(map { "$_:$port" } @addrs[0, 2]), 'the replica is gone';

    my $after = where(@ids);
    is_deeply [ sort @{ moved($initial, $after) } ], [ sort @on_gone ],
        'exactly its ' . scalar(@on_gone) . ' sessions moved';
    is_deeply where(@ids), $after, 'and stay put';
    $initial = $after;
};

subtest 'a replica joining takes new sessions only' => sub {
    my $new = "$addrs[3]:$port";

    $t->set_dns('llm.test' => [ @addrs[0, 2, 3] ]);
    ok wait_for(map { "$_:$port" } @addrs[0, 2, 3]), 'the new replica serves';

    is_deeply moved($initial, where(@ids)), [],
        'no existing session moved';

    my @fresh = map { "f-$_" } 1 .. 300;
    my $placed = where(@fresh);
    my $on_new = grep { $placed->{$_} eq $new } @fresh;
    ok $on_new > 50, "new sessions reach it ($on_new of 300)";
    is_deeply where(@fresh), $placed, 'and stick';
};

subtest 'status reports the current replicas' => sub {
    my $r = $t->http(GET => '/status');
    is $r->{status}, 200, 'status served';
    like $r->{body}, qr/\Q$addrs[3]:$port\E/, 'the new replica is listed';
    unlike $r->{body}, qr/\Q$addrs[1]:$port\E/, 'the removed one is not';
};

subtest 'a name without addresses, then with them again' => sub {
    my $before = where(@ids);

    $t->set_dns('llm.test' => []);
    my $deadline = time + 20;
    my $status = 200;
    while (time < $deadline && $status == 200) {
        $status = $t->http(GET => '/')->{status};
        sleep 0.2;
    }
    is $status, 502, 'no replica: 502, as with round robin';

    $t->set_dns('llm.test' => [ @addrs[0, 2, 3] ]);
    ok wait_for(map { "$_:$port" } @addrs[0, 2, 3]), 'the replicas are back';
    is_deeply moved($before, where(@ids)), [],
        'and every session with the replica it had';
};

$t->stop_nginx;
is_deeply [ $t->log_problems ], [], 'no alert, crit, emerg or crash in error.log';

done_testing;
