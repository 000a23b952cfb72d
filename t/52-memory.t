#!/usr/bin/env perl

# Large bodies do not leave their memory behind: a second after 15 MB chat
# bodies (read from a temporary file and from memory, one with a million
# escapes, one with millions of numbers), a worker's resident memory is
# back within 8 MB of what it was before them.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Time::HiRes qw(sleep);

use AffinityTest;
use AffinityConf qw(proxy_conf servers routes eventually);

my $t = AffinityTest->new;
my @ports = $t->start_backends(2);
my $in_memory = $t->port;
my $MB = 1024 * 1024;

$t->write_conf(proxy_conf($t, servers(\@ports) . <<'EOF',
        prefix_affinity zone=memory_p:1m;
EOF
    location => '            client_max_body_size 20m;', http => <<"HTTP"),
    server {
        listen 127.0.0.1:$in_memory;
        client_body_buffer_size 16m;
        client_max_body_size 20m;
        access_log "${\ $t->path('logs/route.log') }" route;
        location / { proxy_pass http://llm; }
    }
HTTP
    workers => 1);
$t->start_nginx;

my ($worker) = $t->worker_pids;

sub rss_kb {
    open my $fh, '<', "/proc/$worker/status" or return 0;
    while (<$fh>) {
        return $1 if /^VmRSS:\s+(\d+)\s+kB/;
    }
    return 0;
}

my $json = { 'Content-Type' => 'application/json' };
my $small = '{"model":"m","messages":[{"role":"user","content":"hi"}]}';

# A chat body of about $size bytes: text with escapes (each unescaped), or
# a prompt followed by millions of small numbers (many JSON values).
sub big_body {
    my ($kind, $size) = @_;
    if ($kind eq 'text') {
        my $line = 'The quick brown fox jumps over the lazy dog \\n caf\\u00e9 ';
        my $text = $line x int($size / length $line);
        return qq({"model":"m","messages":[{"role":"user","content":"$text"}]});
    }
    my $n = int($size / 2);
    return '{"model":"m","messages":[{"role":"user","content":"numbers"}],'
           . '"logit_bias":[' . join(',', (0) x $n) . ']}';
}

# warm up: the worker's own buffers and the parser at its retained size
$t->http(POST => '/', headers => $json, body => $small) for 1 .. 20;
$t->http(POST => '/', headers => $json, body => big_body('text', 100_000))
    for 1 .. 5;
my $baseline = rss_kb();
ok $baseline > 0, "baseline: $baseline kB";

my $routed = () = routes($t);

for my $port ($t->listen_port, $in_memory) {
    for my $kind ('text', 'numbers') {
        my $body = big_body($kind, 15 * $MB - 200);
        for (1 .. 3) {
            my $r = $t->http(POST => '/', port => $port, headers => $json,
                             body => $body, timeout => 60);
            is $r->{status}, 200, sprintf '%.1f MB of %s served',
                length($body) / $MB, $kind;
        }
    }
}

my @big = (routes($t))[$routed .. $routed + 11];
is scalar(grep { $_->{route} =~ /^prefix_/ } @big), 12,
    'the large bodies were parsed and routed by their prompt';

# The worker gives the memory back a second after the last large body: its
# size is read until it is back, or for 10 s.
$t->http(POST => '/', headers => $json, body => $small) for 1 .. 5;

SKIP: {
    # AddressSanitizer keeps freed memory in quarantine (up to 256 MB)
    skip 'AddressSanitizer holds freed memory back', 1 if $t->sanitized;

    my ($after, $growth);
    eventually(sub {
        $after = rss_kb();
        $growth = $after - $baseline;
        return $growth < 8 * 1024;
    }, 10);
    ok $growth < 8 * 1024,
        "resident memory $after kB after 12 bodies of 15 MB: "
        . "$growth kB over the baseline (< 8 MB)";
}

$t->stop_nginx;
is_deeply [ $t->log_problems ], [], 'no alert, crit, emerg or crash in error.log';

done_testing;
