#!/usr/bin/env perl

# The prefill ahead of a request: two equal mock replicas whose prefill is
# slow (half a millisecond a token), both holding one system prompt.  Once
# their pace is learned, a long prompt (30,000 tokens, 15 s of prefill)
# goes to one, and a stream of long output to the other, whose first token
# comes at once.  Each then has one request in flight: the counts tie.
# Short prompts that open with the system prompt, sent next, wait behind
# the long prefill on the first replica and behind nothing on the second,
# so every one goes to the second.  The status shows the first's backlog
# while the long prompt waits for its first byte, and none once both are
# done.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use POSIX ();
use Test::More;

use AffinityTest;
use AffinityConf qw(proxy_conf servers log_lines text eventually);

my $t = AffinityTest->new(workers => 2);
my @replicas = $t->start_mock_replicas(2, '--decode-ms-per-token', 3,
                                       '--prefill-ms-per-token', 0.5);
my $status = $t->port;
my $log = $t->path('logs/ahead.log');

$t->write_conf(proxy_conf($t,
    servers(\@replicas) . "        prefix_affinity zone=ahead_prefixes:1m;\n",
    http => "    log_format ahead '\$affinity_route \"\$affinity_reason\" "
          . "\$upstream_addr';\n"
          . "    server {\n        listen 127.0.0.1:$status;\n"
          . "        location / { affinity_status; }\n    }\n",
    location => qq(            access_log "$log" ahead;\n)));
$t->start_nginx;

my $json = JSON::PP->new->canonical;

# The system prompt the replicas both hold, and the messages after it.
my $SYSTEM = text('system', 2000);

sub body {
    my ($prompt, $max_tokens, $system) = @_;
    return $json->encode({
        model          => 'llm-test',
        messages       => [ $system ? { role => 'system', content => $system }
                                    : (),
                            { role => 'user', content => $prompt } ],
        max_tokens     => $max_tokens,
        stream         => JSON::PP::true,
        stream_options => { include_usage => JSON::PP::true },
    });
}

sub request {
    my ($prompt, $max_tokens, %opt) = @_;
    return { method => 'POST', path => '/v1/chat/completions',
             headers => { 'Content-Type' => 'application/json' },
             body => body($prompt, $max_tokens, delete $opt{system}),
             %opt };
}

sub ask {
    my ($prompt, $max_tokens, %opt) = @_;
    my $timeout = delete $opt{timeout};
    my ($r) = $t->parallel([ request($prompt, $max_tokens, %opt) ],
                           $timeout ? (timeout => $timeout) : ());
    return $r;
}

# {port => peer} from the status.
sub peers {
    my $r = $t->http(GET => '/', port => $status);
    my $s = $json->decode($r->{body});
    return { map { ($_->{name} =~ /:(\d+)$/)[0] => $_ }
             @{ $s->{upstreams}{llm}{peers} } };
}

# [route, reason, port] per request logged, oldest first.
sub logged {
    return map { /^(\S+) "([^"]*)" 127\.0\.0\.1:(\d+)$/ ? [ $1, $2, $3 ] : () }
           log_lines($log);
}

# A request in a child process, for one that must stay in flight.
my @children;
sub in_background {
    my (@args) = @_;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        my $r = ask(@args, timeout => 120);
        POSIX::_exit($r->{status} == 200 ? 0 : 1);
    }
    push @children, $pid;
    return $pid;
}

# Both replicas' pace learned: distinct prompts, one at a time, so each is
# sent with nothing in flight, until each replica taught its prefill and
# its decode.
my $n = 0;
ok eventually(sub {
    ask(text('warm' . $n++, 2000), 16);
    my $p = peers();
    return !grep { !defined $p->{$_}{pace}{prefill_ms_per_ktoken}
                   || !defined $p->{$_}{pace}{decode_ms_per_token} }
           @replicas;
}, 60), 'both replicas learned their pace' or diag explain peers();

# Both hold the system prompt: prompts that open with it, all at once, fill
# its first holder to its slack, and the others go to the second.
my $first = () = logged();
my @all = $t->parallel([ map { request(text("opening$_", 400), 4,
                                       system => $SYSTEM) } 1 .. 8 ]);
is scalar(grep { $_->{status} == 200 } @all), 8, 'the openings served';
my %opened = map { $_->[2] => 1 } (logged())[ $first .. $first + 7 ];
is scalar(keys %opened), 2, 'both replicas hold the system prompt'
    or diag explain [ logged() ];

# The long prompt: 120,000 characters, 15 s of prefill on either replica.
in_background(text('long', 120000), 4, system => $SYSTEM);

my $busy;
ok eventually(sub {
    my $p = peers();
    ($busy) = grep { $p->{$_}{inflight} == 1
                     && $p->{$_}{pace}{backlog_chars} >= 100000 } @replicas;
    return defined $busy;
}, 20), 'the long prompt waits for its prefill, counted as backlog'
    or diag explain peers();
my ($other) = grep { $_ != ($busy // 0) } @replicas;

# A long stream on the other: its first token comes at once.
in_background(text('stream', 400), 3000, system => $SYSTEM);

ok eventually(sub {
    my $p = peers();
    return $p->{$other}{inflight} == 1 && $p->{$other}{pace}{backlog_chars} == 0
        && $p->{$busy}{inflight} == 1;
}, 20), 'the stream started on the other replica: one in flight each'
    or diag explain peers();

# Short prompts now: the counts tie, the prefill ahead does not.
my $p;
my $before = () = logged();
for my $k (1 .. 6) {
    my $r = ask(text('short' . $k, 400), 8, system => $SYSTEM);
    is $r->{status}, 200, "short prompt $k served";
}
my @short = (logged())[ $before .. $before + 5 ];
is scalar(grep { $_->[2] == $other } @short), 6,
    'every short prompt went to the replica with nothing ahead'
    or diag explain \@short;
like $short[0][1], qr/^held \d+ chars, 1 in flight, ~\d+ ms;/,
    'the reason gives the queue and the estimate'
    or diag explain $short[0];
like $short[0][1], qr/; 127\.0\.0\.1:$busy ~(\d+) ms$/,
    'and the other replica\'s estimate' or diag explain $short[0];
my ($theirs) = $short[0][1] =~ /~(\d+) ms$/;
ok defined $theirs && $theirs >= 3000,
    'which counts the long prefill ahead there' or diag explain $short[0];

# Each short prompt's first byte took it off again; the long one still
# waits, the stream still runs.
$p = peers();
is $p->{$other}{pace}{backlog_chars}, 0,
    'the short prompts left nothing ahead, the stream in flight'
    or diag explain $p;
cmp_ok $p->{$busy}{pace}{backlog_chars}, '>=', 100000,
    'the long prompt still waits there' or diag explain $p;

# Both done: no backlog left.
for my $pid (@children) {
    waitpid $pid, 0;
    is $? >> 8, 0, 'the request in the background was served';
}
$p = peers();
is $p->{$_}{pace}{backlog_chars}, 0, "replica $_: no backlog left"
    for @replicas;

is_deeply [ $t->log_problems ], [],
    'no alert, crit, emerg or crash in error.log';

done_testing;
