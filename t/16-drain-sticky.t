#!/usr/bin/env perl

# nginx 1.29.6+ server states and sticky sessions with session_affinity:
# a "drain" server keeps the sessions pinned to it and takes nothing new,
# and returns to full service when "drain" is removed; the sticky module's
# route hint and its cookie (built from the chosen peer's route id) are
# honoured as with nginx's own balancers.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;

use AffinityTest;
use AffinityConf qw(proxy_conf servers routes placement);

my $t = AffinityTest->new;

plan skip_all => 'nginx ' . ($t->nginx_version // '?')
    . ' has no "drain" servers or sticky module (1.29.6+)'
    unless $t->nginx_at_least('1.29.6');

my @ports = $t->start_backends(4);
my @ids = map { "d-$_" } 1 .. 300;

sub conf {
    my (%extra) = @_;
    return proxy_conf($t, servers(\@ports, %extra)
        . "        session_affinity zone=drain:1m;\n");
}


$t->write_conf(conf());
$t->start_nginx;

my $initial = placement($t, \@ids);
my $draining = $ports[2];
my @on_draining = grep { $initial->{$_} eq $draining } @ids;
ok @on_draining > 30, scalar(@on_draining) . ' sessions on the backend to drain';

subtest 'a draining backend keeps its sessions and takes no new ones' => sub {
    $t->write_conf(conf($draining => 'drain'));
    $t->reload_nginx;

    my $after = placement($t, \@ids);
    is_deeply [ grep { $after->{$_} ne $initial->{$_} } @ids ], [],
        'every session stays where it was, on the draining backend too';

    my %route;
    $route{ $_->{route} }++ for routes($t);
    is $route{session_moved} // 0, 0, 'no session moved';

    my @new = map { "n-$_" } 1 .. 200;
    my $fresh = placement($t, \@new);
    is scalar(grep { $fresh->{$_} eq $draining } @new), 0,
        'no new session is placed on it';
    is scalar(grep { $fresh->{$_} !~ /^\d+$/ } @new), 0, 'all are served';

    my %keyless;
    $keyless{ $t->http(GET => '/')->{headers}{'x-backend-port'} // 'none' }++
        for 1 .. 60;
    ok !$keyless{$draining}, 'requests without a key go elsewhere';

    $t->write_conf(conf());
    $t->reload_nginx;

    is_deeply placement($t, \@ids), $initial, 'back in service: nothing moved';
    my @later = map { "l-$_" } 1 .. 200;
    my $placed = placement($t, \@later);
    ok scalar(grep { $placed->{$_} eq $draining } @later) > 20,
        'and it takes new sessions again';
};

subtest 'the sticky module decides for requests bound to a server' => sub {
    my %route_of = map { $ports[$_] => "r$_" } 0 .. $#ports;
    my $servers = servers(\@ports, map { $_ => "route=$route_of{$_}" } @ports);

    $t->write_conf(proxy_conf($t, $servers
        . "        session_affinity zone=sticky:1m;\n"
        . "        sticky route \$http_x_route;\n"));
    $t->reload_nginx;

    my $r = $t->http(GET => '/', headers => { 'X-Session-ID' => 'bound' });
    my $pinned = $r->{headers}{'x-backend-port'};
    my ($other) = grep { $_ != $pinned } @ports;

    for (1 .. 5) {
        $r = $t->http(GET => '/', headers => { 'X-Session-ID' => 'bound',
                                               'X-Route' => $route_of{$other} });
        is $r->{headers}{'x-backend-port'}, $other,
            'a route hint wins over the session pin';
    }
    $r = $t->http(GET => '/', headers => { 'X-Session-ID' => 'bound' });
    is $r->{headers}{'x-backend-port'}, $pinned,
        'without the hint the session is where it was';

    $r = $t->http(GET => '/', headers => { 'X-Route' => 'no-such-route' });
    is $r->{status}, 200, 'an unknown route is balanced as usual';

    $t->write_conf(proxy_conf($t, $servers
        . "        session_affinity zone=sticky:1m;\n"
        . "        sticky cookie srv_id;\n"));
    $t->reload_nginx;

    $r = $t->http(GET => '/', headers => { 'X-Session-ID' => 'cookie' });
    my $port = $r->{headers}{'x-backend-port'};
    my ($cookie) = ($r->{headers}{'set-cookie'} // '') =~ /srv_id=([^;]+)/;
    is $cookie, $route_of{$port}, 'the cookie names the chosen server';

    for (1 .. 3) {
        $r = $t->http(GET => '/', headers => { Cookie => "srv_id=$cookie" });
        is $r->{headers}{'x-backend-port'}, $port,
            'a request with the cookie goes back to that server';
    }
};

$t->stop_nginx;
is_deeply [ $t->log_problems ], [], 'no alert, crit, emerg or crash in error.log';

done_testing;
