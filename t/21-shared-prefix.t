#!/usr/bin/env perl

# A long document shared by many sessions: 200 sessions ask about one
# 20,000-character document, eight at a time, against eight backends.  The
# document is followed to the backends that hold it while they are under
# the load bound, so it ends up cached on a few backends - not on one (the
# bound spreads it) and not on all (placing each session as if new would
# copy it everywhere).  Every session's follow-up then stays on the backend
# of its first turn: with session ids by its pin, and without them by the
# level at the end of its first turn's last message (a turn level: a
# session's own question is shorter than the spacing of the scheduled
# levels there, which recognise only the document; with turns=0 the
# follow-ups go to any backend that holds it).

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use List::Util qw(max);
use POSIX qw(floor);
use Test::More;

use AffinityTest;
use AffinityConf qw(proxy_conf servers routes chat proxied_upstream);

my $t = AffinityTest->new;
my @ports = $t->start_backends(8);
my $sessions = $t->port;
my $no_turns = $t->port;

$t->write_conf(proxy_conf($t,
    servers(\@ports) . "        prefix_affinity zone=doc_prefixes:4m;\n",
    http => proxied_upstream(with_sessions => servers(\@ports)
        . "        session_affinity zone=doc_sessions:1m;\n"
        . "        prefix_affinity zone=doc_both:4m;", $sessions)
      . proxied_upstream(no_turns => servers(\@ports)
        . "        prefix_affinity zone=doc_no_turns:4m turns=0;",
        $no_turns)));
$t->start_nginx;

my %json = ('Content-Type' => 'application/json');
my $wave = 8;
my $delay_ms = 300;

my $document = join ' ', map { "clause-$_ of the supply agreement" } 1 .. 700;
$document = substr $document, 0, 20_000;

# Session $s about the document: its own question, then a follow-up.
sub turn {
    my ($s, $turn) = @_;
    my @m = ([ system => "Answer from this document.\n$document" ],
             [ user => "Session $s asks about clause " . ($s * 7 % 700) ]);
    push @m, [ assistant => "Session $s: the clause says this." ],
             [ user => "Session $s follows up on it." ] if $turn > 1;
    return chat(@m);
}

sub backend { $_[0]{headers}{'x-backend-port'} // 'none' }

sub check {
    my ($port, $id_of, %opt) = @_;
    $t->backend_reset($_) for @ports;

    # First turns, eight sessions at a time, each held 300 ms by its backend.
    my (%first, %used);
    for (my $s = 0; $s < 200; $s += $wave) {
        my @batch = $s .. $s + $wave - 1;
        my @r = $t->parallel([ map {
            { method => 'POST', path => '/', port => $port,
              headers => { %json, 'X-Delay-Ms' => $delay_ms, $id_of->($_) },
              body => turn($_, 1) }
        } @batch ]);
        for my $i (0 .. $#batch) {
            is $r[$i]{status}, 200, "session $batch[$i] served"
                or next;
            $first{ $batch[$i] } = backend($r[$i]);
            $used{ backend($r[$i]) }++;
        }
    }
    is scalar(keys %first), 200, 'all first turns served';

    my @peaks = map { $t->backend_stats($_)->{max_inflight} } @ports;
    my $bound = floor(max(1.25 * $wave / @ports, $wave / @ports + 2));
    note 'sessions per backend: ', join ' ', map { $used{$_} // 0 } @ports;
    note "peak in-flight per backend: @peaks";
    is scalar(grep { $_ > $bound } @peaks), 0, "no backend above $bound";
    my $holders = scalar keys %used;
    ok $holders >= 2, "the document is held by $holders backends, not one";
    ok $holders <= 5, "the document is held by $holders backends, not all 8";

    # Follow-ups, as clients send them.
    my ($moved, $elsewhere) = (0, 0);
    for my $s (0 .. 199) {
        my $r = $t->http(POST => '/', port => $port,
                         headers => { %json, $id_of->($s) },
                         body => turn($s, 2));
        $moved++ if backend($r) ne $first{$s};
        $elsewhere++ unless $used{ backend($r) };
    }
    is $elsewhere, 0, 'every follow-up went to a backend holding the document';
    if ($opt{no_turns}) {
        note "$moved of 200 follow-ups went to another backend";
        ok $moved >= 50, 'without turn levels a follow-up finds only the '
            . "document, held by several backends: $moved moved";
    } else {
        is $moved, 0, 'every follow-up went to the backend of its first turn';
    }
}

subtest 'prefix_affinity alone, no session ids' => sub {
    check($t->listen_port, sub { () });

    my @r = grep { $_->{status} eq '200' } routes($t);
    my $hits = grep { $_->{route} eq 'prefix_hit' } @r;
    ok $hits >= 390, "$hits of 400 requests found their prefix held";
};

subtest 'prefix_affinity turns=0, no session ids' => sub {
    check($no_turns, sub { () }, no_turns => 1);
};

subtest 'session_affinity and prefix_affinity' => sub {
    check($sessions, sub { ('X-Session-ID' => "doc-session-$_[0]") });
};

done_testing;
