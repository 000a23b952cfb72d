#!/usr/bin/env perl

# The session zone across reloads: pins survive "nginx -s reload" and a
# reordered server list; a new zone size starts a fresh zone; a zone too
# small for its sessions evicts the least recently used and serves on.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;

use AffinityTest;
use AffinityConf qw(proxy_conf servers routes session_request);

my $t = AffinityTest->new;
my @ports = $t->start_backends(4);
my @ids = map { "r-$_" } 1 .. 400;

sub conf {
    my ($zone, @order) = @_;
    return proxy_conf($t, servers(@order ? \@order : \@ports)
        . "        session_affinity zone=$zone;\n");
}

sub placement {
    my %where;
    $where{$_} = $t->http(GET => '/', headers => { 'X-Session-ID' => $_ })
                   ->{headers}{'x-backend-port'} // 'none'
        for @ids;
    return \%where;
}

sub new_routes_since {
    my ($n) = @_;
    my @r = routes($t);
    return [ @r[$n .. $#r] ];
}

$t->write_conf(conf('reload:2m'));
$t->start_nginx;

my $pins = placement();

subtest 'reload keeps every pin' => sub {
    $t->reload_nginx;
    my $n = () = routes($t);
    is_deeply placement(), $pins, 'every session on its backend';
    my $r = new_routes_since($n);
    is scalar(grep { $_->{route} eq 'session_hit' } @$r), scalar(@ids),
        'all were pin hits';
};

subtest 'a reordered server list keeps every pin' => sub {
    $t->write_conf(conf('reload:2m', reverse @ports));
    $t->reload_nginx;
    is_deeply placement(), $pins, 'pins follow addresses, not positions';
};

subtest 'a new zone size starts a fresh zone' => sub {
    $t->write_conf(conf('reload:3m'));
    my ($rc, $out) = $t->nginx_test;
    is $rc, 0, 'nginx -t accepts it' or diag $out;
    $t->reload_nginx;
    my $n = () = routes($t);
    my $now = placement();
    my $r = new_routes_since($n);
    is scalar(grep { $_->{route} eq 'session_new' } @$r), scalar(@ids),
        'sessions are pinned anew';
    is scalar(grep { $_->{status} != 200 } @$r), 0, 'all served';
    is_deeply $now, $pins,
        'and land where the ring puts them, as before';
};

subtest 'a full zone evicts the least recently used' => sub {
    $t->write_conf(conf('small:128k'));
    $t->reload_nginx;

    # 128k holds a few thousand sessions; send three times more.
    my @many = map { "lru-$_" } 1 .. 12000;
    my $n = () = routes($t);
    my $failed = 0;
    for (my $i = 0; $i < @many; $i += 200) {
        my @batch = @many[$i .. ($i + 199 > $#many ? $#many : $i + 199)];
        $failed += grep { $_->{status} != 200 }
                   $t->parallel([ map { session_request($_) } @batch ]);
    }
    is $failed, 0, 'every request served while the zone is full';

    # The newest sessions are still pinned, the oldest were evicted.
    my @recent = @many[-200 .. -1];
    my @oldest = @many[0 .. 199];
    $n = () = routes($t);
    $t->parallel([ map { session_request($_) } @recent ]);
    my $r = new_routes_since($n);
    # (a burst may spill some over the load bound: they keep their pin)
    my $renew = grep { $_->{route} eq 'session_new' } @$r;
    ok $renew <= 10, "recent sessions still pinned ($renew of 200 pinned anew)";

    $n = () = routes($t);
    $t->parallel([ map { session_request($_) } @oldest ]);
    $r = new_routes_since($n);
    my $new = grep { $_->{route} eq 'session_new' } @$r;
    ok $new >= 190, "oldest sessions were evicted ($new of 200 pinned anew)";
};

$t->stop_nginx;
is_deeply [ $t->log_problems ], [], 'no alert, crit, emerg or crash in error.log';

done_testing;
