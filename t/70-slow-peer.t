#!/usr/bin/env perl

# A replica three times slower than the others: four mock replicas of two
# running slots each, the last one's prefill and decode three times as
# long.  Batches of 16 streamed chat completions, each a question about one
# shared document, are sent at once, so that queues form.
#
# First the streams end without usage (stream_options not set, as vLLM
# answers them): the module learns no decode time and compares the peers
# by their requests in flight.  Then the same batches ask for the usage:
# the module learns each peer's pace, compares the peers by the estimated
# time to first token, and sends the slow replica clearly fewer requests;
# the clients' time to first token at p90 is lower than by counts.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;

use AffinityTest;
use AffinityConf qw(proxy_conf servers text);

my @pace = ('--max-running', 2, '--prefill-ms-per-token', 0.05,
            '--decode-ms-per-token', 4, '--stream-usage', 'asked');

my $t = AffinityTest->new(workers => 2);
my @fast = $t->start_mock_replicas(3, @pace);
my ($slow) = $t->start_mock_replicas(1, @pace, '--slowdowns', 3);

$t->write_conf(proxy_conf($t,
    servers([ @fast, $slow ])
        . "        prefix_affinity zone=slow_prefixes:1m;\n"));
$t->start_nginx;

my $json = JSON::PP->new->canonical;

my $BATCH = 16;
my $DOCUMENT = text('document', 4500);
my $asked = 0;

# A batch of questions about the document, streamed, with or without the
# usage at their end.  Returns the responses.
sub batch {
    my ($usage, $size) = @_;
    my @requests = map {
        my $question = text('question-' . $asked++, 300);
        {
            method  => 'POST',
            path    => '/v1/chat/completions',
            headers => { 'Content-Type' => 'application/json' },
            body    => $json->encode({
                model      => 'llm-test',
                messages   => [
                    { role => 'system', content => $DOCUMENT },
                    { role => 'user',   content => $question },
                ],
                max_tokens => 40,
                stream     => JSON::PP::true,
                $usage ? (stream_options => {
                              include_usage => JSON::PP::true }) : (),
            }),
        }
    } 1 .. ($size // $BATCH);

    return $t->parallel(\@requests, timeout => 60);
}

sub percentile {
    my ($p, @values) = @_;
    my @sorted = sort { $a <=> $b } @values;
    return $sorted[ int($p * $#sorted + 0.5) ];
}

# $n batches; returns the slow replica's share of the requests and the
# clients' time to first token at p50 and p90 (seconds).
sub measure {
    my ($label, $usage, $n) = @_;
    my (@first, $to_slow, $served);

    for (1 .. $n) {
        for my $r (batch($usage)) {
            $served++ if $r->{status} == 200;
            $to_slow++ if ($r->{headers}{'x-replica-port'} // '') eq $slow;
            push @first, $r->{first_byte} // 60;
        }
    }

    is $served, $n * $BATCH, "$label: every request served";
    my %m = (share => ($to_slow // 0) / ($n * $BATCH),
             p50 => percentile(0.5, @first), p90 => percentile(0.9, @first));
    diag sprintf '%s: slow replica %.3f of requests, TTFT p50 %.3f s, '
               . 'p90 %.3f s', $label, @m{qw(share p50 p90)};
    return \%m;
}

# Every replica comes to hold the document, by counts: bursts of twice
# the batch overflow the holders' bound until each replica served it.
my %holders;
for (1 .. 5) {
    $holders{ $_->{headers}{'x-replica-port'} // '' }++
        for grep { $_->{status} == 200 } batch(0, 2 * $BATCH);
    last if 4 == grep { $holders{$_} } @fast, $slow;
}
is scalar(grep { $holders{$_} } @fast, $slow), 4,
    'every replica served the document';
my $counted = measure('by counts', 0, 10);

# The paces are learned, then the same batches are routed by them.
batch(1) for 1 .. 3;
my $timed = measure('by estimates', 1, 10);

cmp_ok $counted->{share}, '>', 0.15,
    'by counts, the slow replica takes about its count share';
cmp_ok $timed->{share}, '<', 0.85 * $counted->{share},
    'by estimates, the slow replica takes clearly fewer requests';
cmp_ok $timed->{p90}, '<', 0.85 * $counted->{p90},
    "and the clients' TTFT p90 is lower than by counts";

is_deeply [ $t->log_problems ], [], 'no alerts or crashes in error.log';

done_testing;
