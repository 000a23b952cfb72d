#!/usr/bin/env perl

# A peer's pace, learned from its replies: two mock replicas, one three
# times slower to decode than the other, answer streamed and whole chat
# completions with usage.  The status then gives each peer's pace (the
# replies it was learned from, its prefill, decode and wait), in JSON and
# in the Prometheus format, the slower replica's decode the larger; a
# backup that served nothing has learned nothing (nulls, no samples).  The
# access log's $affinity_reason says why each peer was chosen: what it
# held, its requests in flight and, once learned, the estimates.
#
# Requests go one at a time, so each is sent with nothing in flight (the
# prefill is learned from such replies), with distinct prompts of ~500
# tokens until each replica served a few: where a prompt goes depends on
# the ring, whose points depend on the ports.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;

use AffinityTest;
use AffinityConf qw(proxy_conf servers log_lines text);

my $t = AffinityTest->new(workers => 2);
my ($fast) = $t->start_mock_replicas(1, '--decode-ms-per-token', 3);
my ($slow) = $t->start_mock_replicas(1, '--decode-ms-per-token', 9);
my ($spare) = $t->start_backends(1);
my $status = $t->port;
my $buffered = $t->port;
my $log = $t->path('logs/pace.log');

$t->write_conf(proxy_conf($t,
    servers([ $fast, $slow ]) . servers([$spare], $spare => 'backup')
        . "        prefix_affinity zone=pace_prefixes:1m;\n",
    http => "    log_format pace '\$affinity_route \"\$affinity_reason\" "
          . "\$upstream_addr';\n"
          . "    server {\n        listen 127.0.0.1:$status;\n"
          . "        location / { affinity_status; }\n    }\n"
          . "    server {\n        listen 127.0.0.1:$buffered;\n"
          . "        location / {\n"
          . "            proxy_pass http://llm;\n"
          . "            proxy_http_version 1.1;\n"
          . "            proxy_ignore_headers X-Accel-Buffering;\n"
          . "        }\n    }\n",
    location => qq(            access_log "$log" pace;\n)));
$t->start_nginx;

my $json = JSON::PP->new->canonical;
my %name = ($fast => 'fast', $slow => 'slow', $spare => 'backup');

# A chat completion of $messages ([role, text] pairs), streamed or not.
sub ask {
    my ($stream, @messages) = @_;
    my %port = ref $messages[0] eq 'HASH' ? %{ shift @messages } : ();
    my $body = {
        model      => 'llm-test',
        messages   => [ map { { role => $_->[0], content => $_->[1] } }
                        @messages ],
        max_tokens => 32,
        $stream ? (stream => JSON::PP::true,
                   stream_options => { include_usage => JSON::PP::true })
                : (),
    };
    my $r = $t->http(POST => '/v1/chat/completions',
                     headers => { 'Content-Type' => 'application/json' },
                     body => $json->encode($body), %port);
    is $r->{status}, 200, ($stream ? 'streamed' : 'whole') . ': served'
        or diag explain $r;
    like $r->{body}, $stream ? qr/"completion_tokens":32\b.*\[DONE\]/s
                             : qr/"completion_tokens":32\b/,
        '  with its usage';
}

# The log: [route, reason, backend port] per request, oldest first.
sub logged {
    return map { /^(\S+) "([^"]*)" 127\.0\.0\.1:(\d+)$/ ? [ $1, $2, $3 ] : () }
           log_lines($log);
}

# Requests each replica served, by the log.
sub served {
    my %n = ($fast => 0, $slow => 0);
    $n{ $_->[2] }++ for logged();
    return \%n;
}

# {port => the peer's pace} from the status.
sub paces {
    my $r = $t->http(GET => '/', port => $status);
    my $s = $json->decode($r->{body});
    return { map { ($_->{name} =~ /:(\d+)$/)[0] => $_->{pace} }
             @{ $s->{upstreams}{llm}{peers} } };
}

# Distinct prompts, streamed or not, until each replica served $each more.
my $n = 0;
sub until_each {
    my ($stream, $each) = @_;
    my $before = served();
    for (1 .. 40) {
        my $now = served();
        last unless grep { $now->{$_} - $before->{$_} < $each } $fast, $slow;
        ask($stream, [ user => text('prompt' . $n++, 2000) ]);
    }
    my $now = served();
    ok !grep({ $now->{$_} - $before->{$_} < $each } $fast, $slow),
        "each replica served $each more"
        or diag explain $now;
}

subtest 'nothing learned yet' => sub {
    my $pace = paces();
    for my $port ($fast, $slow, $spare) {
        is_deeply $pace->{$port},
            { replies => 0, prefill_ms_per_ktoken => undef,
              decode_ms_per_token => undef, wait_ms => undef,
              chars_per_token => undef, backlog_chars => 0 },
            "$name{$port}: an empty pace";
    }
};

subtest 'streams teach the decode' => sub {
    until_each(1, 3);
    my ($pace, $served) = (paces(), served());
    for my $port ($fast, $slow) {
        my $p = $pace->{$port};
        is $p->{replies}, $served->{$port},
            "$name{$port}: learned from each of its $served->{$port} replies";
        ok defined $p->{decode_ms_per_token} && $p->{decode_ms_per_token} > 0,
            '  its decode is known: '
            . ($p->{decode_ms_per_token} // 'null') . ' ms a token';
        ok defined $p->{prefill_ms_per_ktoken}
           && $p->{prefill_ms_per_ktoken} > 0,
            '  its prefill too, sent with nothing in flight: '
            . ($p->{prefill_ms_per_ktoken} // 'null') . ' ms per 1000 tokens';
        ok defined $p->{wait_ms} && $p->{wait_ms} >= 0,
            '  and its wait with nothing in flight: '
            . ($p->{wait_ms} // 'null') . ' ms';
        ok defined $p->{chars_per_token} && $p->{chars_per_token} > 0,
            '  characters per token, from the usage: '
            . ($p->{chars_per_token} // 'null');
    }
    cmp_ok $pace->{$slow}{decode_ms_per_token}, '>',
        $pace->{$fast}{decode_ms_per_token} // 0,
        'the slower replica decodes slower';
    is $pace->{$spare}{replies}, 0, 'the backup learned nothing';
};

subtest 'whole replies count too' => sub {
    my $before = paces();
    until_each(0, 2);
    my ($pace, $served) = (paces(), served());
    for my $port ($fast, $slow) {
        cmp_ok $pace->{$port}{replies}, '>', $before->{$port}{replies},
            "$name{$port}: more replies learned from";
        is $pace->{$port}{replies}, $served->{$port},
            '  each of its replies';
    }
    cmp_ok $pace->{$slow}{decode_ms_per_token}, '>',
        $pace->{$fast}{decode_ms_per_token} // 0,
        'the slower replica still decodes slower';
    diag sprintf '%s: %s', $name{$_}, $json->encode($pace->{$_})
        for $fast, $slow;
};

subtest 'Prometheus' => sub {
    my $text = $t->http(GET => '/?format=prometheus', port => $status)->{body};
    my $pace = paces();
    my %sample;
    while ($text =~ /^nginx_upstream_affinity_peer_(\w+)\{upstream="llm",peer="127\.0\.0\.1:(\d+)",backup="(?:true|false)"\} (\S+)$/mg) {
        $sample{$1}{$2} = $3;
    }
    for my $family (qw(pace_replies_total prefill_seconds_per_token
                       decode_seconds_per_token estimated_wait_seconds)) {
        like $text, qr/^# TYPE nginx_upstream_affinity_peer_$family (?:counter|gauge)$/m,
            "$family has its TYPE";
    }
    for my $port ($fast, $slow) {
        my $p = $pace->{$port};
        is $sample{pace_replies_total}{$port}, $p->{replies},
            "$name{$port}: replies as in JSON";
        like $sample{$_}{$port} // '', qr/^\d+(?:\.\d*[1-9])?$/,
            "  $_: a plain decimal number"
            for qw(prefill_seconds_per_token decode_seconds_per_token
                   estimated_wait_seconds);
        ok abs(($sample{decode_seconds_per_token}{$port} // 0)
               - $p->{decode_ms_per_token} / 1000) < 1e-9,
            '  decode in seconds, as in JSON';
        ok abs(($sample{prefill_seconds_per_token}{$port} // 0)
               - $p->{prefill_ms_per_ktoken} / 1e6) < 1e-12,
            '  prefill in seconds a token, as in JSON';
        ok abs(($sample{estimated_wait_seconds}{$port} // -1)
               - $p->{wait_ms} / 1000) < 1e-9,
            '  wait in seconds, as in JSON';
    }
    is $sample{pace_replies_total}{$spare}, 0, 'backup: no replies';
    ok !grep({ exists $sample{$_}{$spare} }
             qw(prefill_seconds_per_token decode_seconds_per_token
                estimated_wait_seconds)),
        '  and no sample of what it never learned';
};

subtest '$affinity_reason' => sub {
    my @lines = logged();
    ok scalar(@lines), scalar(@lines) . ' requests logged';
    my @bad = grep { $_->[1] !~ /^held nowhere, 0 in flight\b/ } @lines;
    is_deeply \@bad, [],
        'each new prompt: held nowhere, sent with nothing in flight';
    like $lines[0][1], qr/^held nowhere, 0 in flight; 127\.0\.0\.1:\d+$/,
        'the first: no estimate yet';

    # A conversation's next turn follows its first, estimated now.
    ask(1, [ user => text('prompt0', 2000) ], [ assistant => 'Noted.' ],
        [ user => 'And then?' ]);
    my ($route, $reason, $port) = @{ (logged())[-1] };
    is $route, 'prefix_hit', 'a next turn follows its prefix';
    like $reason,
        qr/^held \d+ chars, 0 in flight, ~\d+ ms; 127\.0\.0\.1:(\d+) ~\d+ ms$/,
        "why: $reason";
    my ($other) = $reason =~ /127\.0\.0\.1:(\d+)/;
    is $other, $port == $fast ? $slow : $fast, '  against the other replica';
};

# A stream nginx buffers passes when its buffers fill or it ends, not
# when its first token came: its times teach nothing.
subtest 'a buffered stream is not timed' => sub {
    my $before = paces();
    ask(1, { port => $buffered }, [ user => text('buffered' . $_, 2000) ])
        for 1 .. 4;
    my $after = paces();
    for my $port ($fast, $slow) {
        is $after->{$port}{replies}, $before->{$port}{replies},
            "$name{$port}: no reply learned from";
    }
};

is_deeply [ $t->log_problems ], [], 'no alert, crit, emerg or crash in error.log';

done_testing;
