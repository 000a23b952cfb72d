#!/usr/bin/env perl

# session_affinity under failures: a down or dead backend moves only its own
# sessions, and they stay moved when it returns; backup servers take over
# when all primaries fail, then 502.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;

use AffinityTest;
use AffinityConf qw(proxy_conf servers routes placement moved eventually);

my $t = AffinityTest->new;
my @ports = $t->start_backends(4);
my @ids = map { "s-$_" } 1 .. 300;

sub conf {
    my (%extra) = @_;
    $extra{$_} = join ' ', grep { $_ } 'max_fails=1 fail_timeout=2s', $extra{$_}
        for @ports;
    return proxy_conf($t, servers(\@ports, %extra)
        . "        session_affinity zone=failover:1m;\n");
}



$t->write_conf(conf());
$t->start_nginx;

my $initial = placement($t, \@ids);
my $victim = $ports[1];
my @victims = grep { $initial->{$_} eq $victim } @ids;
ok @victims > 30, scalar(@victims) . " sessions on the backend to kill";

subtest 'a killed backend moves only its own sessions' => sub {
    $t->stop_backend($victim);

    my $after = placement($t, \@ids);
    is scalar(grep { $after->{$_} !~ /^\d+$/ } @ids), 0, 'every request served';
    is_deeply [ sort @{ moved($initial, $after) } ], [ sort @victims ],
        'exactly the dead backend\'s sessions moved';
    is scalar(grep { $after->{$_} eq $victim } @ids), 0,
        'none is left on the dead backend';

    my @moved = grep { $_->{route} eq 'session_moved' } routes($t);
    is scalar(@moved), scalar(@victims), 'each was re-pinned once';

    # Past fail_timeout the backend is usable again: new sessions reach it.
    $t->start_backend($victim);
    my $probe = 0;
    ok eventually(sub {
        my $r = $t->http(GET => '/',
                         headers => { 'X-Session-ID' => 'probe-' . $probe++ });
        return ($r->{headers}{'x-backend-port'} // '') eq $victim;
    }, 15), 'the backend is back';

    my $back = placement($t, \@ids);
    is_deeply moved($after, $back), [], 'moved sessions stay where they moved';

    my $fresh = $t->http(GET => '/', headers => { 'X-Session-ID' => 'x' });
    is $fresh->{status}, 200, 'new sessions are served';
    $initial = $back;
};

subtest 'a backend marked down moves only its own sessions' => sub {
    my $down = $ports[2];
    my @on_down = grep { $initial->{$_} eq $down } @ids;
    ok @on_down > 30, scalar(@on_down) . ' sessions on the backend to mark down';

    $t->write_conf(conf($down => 'down'));
    $t->reload_nginx;

    my $after = placement($t, \@ids);
    is_deeply [ sort @{ moved($initial, $after) } ], [ sort @on_down ],
        'exactly its sessions moved';

    $t->write_conf(conf());
    $t->reload_nginx;

    is_deeply moved($after, placement($t, \@ids)), [],
        'they stay moved once it is up again';
};

subtest 'backup servers, then 502' => sub {
    my ($p1, $p2, $backup) = $t->start_backends(3);
    my $conf = proxy_conf($t, servers([ $p1, $p2 ])
        . servers([$backup], $backup => 'backup')
        . "        session_affinity zone=backup:1m;\n");
    $t->write_conf($conf);
    $t->reload_nginx;

    my $r = $t->http(GET => '/', headers => { 'X-Session-ID' => 'b1' });
    ok $r->{headers}{'x-backend-port'} == $p1
       || $r->{headers}{'x-backend-port'} == $p2, 'primaries serve first';

    $t->stop_backend($_) for $p1, $p2;

    for my $i (1 .. 10) {
        $r = $t->http(GET => '/', headers => { 'X-Session-ID' => "b$i" });
        is $r->{headers}{'x-backend-port'}, $backup,
            "session b$i served by the backup";
    }

    $t->stop_backend($backup);
    $r = $t->http(GET => '/', headers => { 'X-Session-ID' => 'b1' });
    is $r->{status}, 502, 'nothing left: 502';
};

$t->stop_nginx;
is_deeply [ $t->log_problems ], [], 'no alert, crit, emerg or crash in error.log';

done_testing;
