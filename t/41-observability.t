#!/usr/bin/env perl

# conf-examples/observability/: the Grafana dashboard and the Prometheus
# alert rules use only metric families and labels the module exports.
#
# nginx runs the module in front of two mock inference replicas (and a
# backup server) with session_affinity, prefix_affinity, response_affinity
# and affinity_metrics; a little traffic of each kind goes through (sessions,
# prompts, Responses API continuations, bodies the balancer cannot use).
# Then the Prometheus text of affinity_status gives the families and their
# label names, and every PromQL expression of the dashboard (panel targets
# and template variables) and of the alert rules is checked against them:
#
#   - every token nginx_upstream_affinity_... is a family the module
#     exports, exactly: its families are counters and gauges, whose samples
#     carry the family's name, so no suffix (_bucket, _sum, _count) is
#     stripped, and "_total" is part of the name;
#   - a label matcher NAME{label op "value"} names a label of that family,
#     and a literal value (or a|b|c regex of literals) is one the status
#     really reports for it (routes, reasons, kinds, backup);
#   - a label in by (...) or without (...) exists on every family inside
#     the aggregation's argument; in on (...), ignoring (...), on every
#     family of the expression; in group_left (...) / group_right (...), on
#     one of them at least;
#   - label_values(SELECTOR, label) of a template variable names a label of
#     the selector's family; a legend's {{label}} and an annotation's
#     $labels.label, a label of one of the families of its expression.
#
# "instance" and "job" are allowed on every family: Prometheus adds them to
# each scraped sample.  Metrics of other exporters (such as "up") are not
# checked.  Outside expressions, any nginx_upstream_affinity_ name in the
# files (descriptions, README) must be a family too, and every family the
# module exports must appear in the dashboard or the alerts.
#
# The files' structure is checked too: the dashboard parses as JSON, has a
# datasource variable of type prometheus, and every panel has a title, a
# description, the datasource ${datasource} and targets with an expr; the
# alerts parse as a Prometheus rule file (CPAN::Meta::YAML, in perl's core;
# YAML::XS must agree when it is installed) whose every rule has alert,
# expr, for, labels.severity and annotations summary and description.  With
# promtool on PATH (Debian package prometheus), "promtool check rules"
# checks the alert file and, as recording rules, the dashboard's queries.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use CPAN::Meta::YAML;
use File::Spec;
use JSON::PP;
use Test::More;

use AffinityTest;
use AffinityConf qw(proxy_conf servers chat eventually proxied_upstream);

my $DIR = "$FindBin::Bin/../conf-examples/observability";
my $DASHBOARD = "$DIR/grafana-dashboard.json";
my $ALERTS = "$DIR/alerts.yml";
my $README = "$DIR/README.md";

# Labels Prometheus attaches to every sample of a scrape target.
my @TARGET_LABELS = qw(instance job);

# What affinity_status is documented to export: family => label names.
my %EXPECTED;
$EXPECTED{nginx_upstream_affinity_info} = [qw(version nginx)];
$EXPECTED{"nginx_upstream_affinity_$_"} = [qw(upstream peer backup)]
    for qw(peer_inflight peer_requests_total peer_failures_total peer_pins
           peer_engine_load peer_engine_cache_tokens
           peer_learned_cache_tokens peer_pace_replies_total
           peer_backlog_chars
           peer_prefill_seconds_per_token peer_decode_seconds_per_token
           peer_estimated_wait_seconds);
$EXPECTED{nginx_upstream_affinity_routes_total} = [qw(upstream peer route)];
$EXPECTED{nginx_upstream_affinity_fallbacks_total} = [qw(upstream reason)];
$EXPECTED{"nginx_upstream_affinity_balance_$_"} = [qw(upstream)]
    for qw(factor slack);
$EXPECTED{"nginx_upstream_affinity_zone_$_"} = [qw(zone kind upstream)]
    for qw(capacity entries inserts_total evictions_total expiries_total
           peer_slots peer_slots_reclaimed_total peer_slots_missing_total
           worker_rows_used worker_rows_missing_total workers_reaped_total
           inflight_recovered_total conflicts_total);
$EXPECTED{nginx_upstream_affinity_store_events_total} = [qw(upstream event)];

sub slurp {
    my ($file) = @_;
    open my $fh, '<:raw', $file or die "read $file: $!";
    local $/;
    return scalar <$fh>;
}

# ---------------------------------------------------------------------------
# nginx with the module, and traffic of every kind

my $t = AffinityTest->new(workers => 2);
my @replicas = $t->start_mock_replicas(2, '--decode-ms-per-token', 1);
my ($spare) = $t->start_backends(1);
# A replica whose cache evicts (992 tokens), whose size only its replies
# tell: learned_cache_tokens.
my ($evicting) = $t->start_mock_replicas(1, '--cache-tokens', 1000,
                                          '--decode-ms-per-token', 0);
my $status = $t->port;
my $learning = $t->port;

# The learning upstream shares through a store nobody listens at: its
# counters are exported all the same.
my $secret = $t->path('store.secret');
{
    open my $fh, '>', $secret or die "$secret: $!";
    print {$fh} "a secret the instances share, 32 bytes\n";
    close $fh;
    chmod 0600, $secret;
}
my $no_store = $t->port;

$t->write_conf(proxy_conf($t,
    servers(\@replicas) . servers([$spare], $spare => 'backup') . <<'UPSTREAM',
        session_affinity header=X-Session-ID zone=obs_sessions:1m;
        prefix_affinity zone=obs_prefixes:1m;
        response_affinity zone=obs_responses:1m;
        affinity_metrics interval=200ms timeout=300ms;
UPSTREAM
    location => "            proxy_buffering off;\n",
    http => "    server {\n        listen 127.0.0.1:$status;\n"
          . "        location = /affinity/status { affinity_status; }\n"
          . "    }\n"
          . proxied_upstream(obs_learning => servers([$evicting])
                . "        prefix_affinity zone=obs_learning_prefixes:1m;\n"
                . "        affinity_store 127.0.0.1:$no_store secret=$secret;",
                $learning)));
$t->start_nginx;

my $json = JSON::PP->new->canonical;
my %ct = ('Content-Type' => 'application/json');

sub post {
    my ($path, $body, %headers) = @_;
    return $t->http(POST => $path, headers => { %ct, %headers }, body => $body);
}

# sessions: a first turn (session_new) and a second (session_hit)
for my $s (1 .. 4) {
    post('/v1/chat/completions', chat([ user => "session $s, first turn" ]),
         'X-Session-ID' => "obs-$s");
    post('/v1/chat/completions',
         chat([ user => "session $s, first turn" ], [ assistant => 'ok' ],
              [ user => 'second turn' ]),
         'X-Session-ID' => "obs-$s");
}

# prompts without a session: prefix_new, then prefix_hit for the next turn
for my $c (1 .. 2) {
    my $first = "conversation $c: " . ('some words of context ' x 12);
    post('/v1/chat/completions', chat([ user => $first ]));
    post('/v1/chat/completions',
         chat([ user => $first ], [ assistant => 'ok' ], [ user => 'and?' ]));
}

# a long prompt streamed with nothing in flight: its replica's pace (decode,
# prefill, wait) is learned
{
    (my $stream = chat([ user => 'a long prompt to stream ' x 60 ]))
        =~ s/\}$/,"stream":true,"stream_options":{"include_usage":true}}/;
    post('/v1/chat/completions', $stream);
}

# a conversation whose first turn the evicting replica no longer holds at
# the second: its size is learned
{
    my $first = [ user => 'a first turn ' x 115 ];
    my $to = sub {
        $t->http(POST => '/v1/chat/completions', port => $learning,
                 headers => \%ct, body => chat(@_));
    };
    $to->($first);
    $to->([ user => "other prompt $_ " x 140 ]) for 1 .. 3;
    $to->($first, [ assistant => 'ok' ], [ user => 'and then?' ]);
}

# Responses API: a stored response, its continuation and a lookup
# (response_hit), and an id nobody stored (response_lost)
my $created = post('/v1/responses', $json->encode({
    model => 'llm-test', input => 'remember this', max_output_tokens => 4 }));
is $created->{status}, 200, 'a response is stored';
my $id = eval { $json->decode($created->{body})->{id} } // 'none';
post('/v1/responses', $json->encode({
    model => 'llm-test', input => 'and then?', max_output_tokens => 4,
    previous_response_id => $id }));
$t->http(GET => "/v1/responses/$id");
$t->http(GET => '/v1/responses/resp_never_stored');

# bodies the balancer cannot use, and a request with neither key nor body
post('/v1/chat/completions', 'just text', 'Content-Type' => 'text/plain');
post('/v1/chat/completions', '{"messages":[{"role":"user",');
post('/v1/chat/completions', '{"model":"m","temperature":0}');
$t->http(GET => '/v1/models');

# the engines' own figures (affinity_metrics) once they are in
sub prometheus {
    my $r = $t->http(GET => '/affinity/status?format=prometheus',
                     port => $status);
    is $r->{status}, 200, 'the status answers in the Prometheus format'
        or diag $r->{error} // $r->{body};
    return $r->{body} // '';
}
ok eventually(sub {
        $t->http(GET => '/affinity/status?format=prometheus', port => $status)
            ->{body} =~ /^nginx_upstream_affinity_peer_engine_load\{/m
    }, 5),
    'the replicas\' engine load is reported';

# ---------------------------------------------------------------------------
# What the module exports: family => { label => { value => 1 } }

my (%families, %types, @bad_lines);
for my $line (split /\n/, prometheus()) {
    if ($line =~ /^# TYPE (\S+) (counter|gauge)$/) {
        $types{$1} = $2;
        $families{$1} //= {};
        next;
    }
    next if $line =~ /^# HELP /;
    if ($line =~ /^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} \S+$/) {
        my ($name, $labels) = ($1, $2);
        push @bad_lines, "sample without TYPE: $line" unless $types{$name};
        while ($labels =~ /\G([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)",?/gc) {
            $families{$name}{$1}{$2} = 1;
        }
        push @bad_lines, "bad labels: $line" unless (pos($labels) // 0) == length $labels;
        next;
    }
    push @bad_lines, $line;
}
is_deeply \@bad_lines, [], 'every line of the Prometheus text is understood';

subtest 'the module exports the documented families and labels' => sub {
    my %got = map { $_ => [ sort keys %{ $families{$_} } ] } keys %families;
    my %want = map { $_ => [ sort @{ $EXPECTED{$_} } ] } keys %EXPECTED;
    for my $name (sort keys %want) {
        ok exists $got{$name}, "$name is exported" or next;
        is_deeply $got{$name}, $want{$name},
            "  with labels @{ $want{$name} }";
    }
    is_deeply [ grep { !$want{$_} } sort keys %got ], [],
        'and nothing undocumented';

    is_deeply [ sort keys %{ $families{nginx_upstream_affinity_routes_total}{route} } ],
        [ sort qw(session_hit session_new session_moved session_spill fallback
                  prefix_hit prefix_new response_hit response_lost) ],
        'every route';
    is_deeply [ sort keys %{ $families{nginx_upstream_affinity_fallbacks_total}{reason} } ],
        [ sort qw(not_buffered not_json no_body too_large read_error
                  parse_error no_prompt no_memory) ],
        'every fallback reason';
    is_deeply [ sort keys %{ $families{nginx_upstream_affinity_store_events_total}{event} } ],
        [ sort qw(published dropped refused outages read applied forged
                  malformed stale future unknown limited rewound replayed) ],
        'store_events_total: every event';
    is_deeply [ sort keys %{ $families{nginx_upstream_affinity_zone_entries}{kind} } ],
        [ qw(prefixes responses sessions) ], 'every kind of zone';
};

# ---------------------------------------------------------------------------
# PromQL: the names and labels an expression uses

# The labels a family has, scrape target labels included.
sub labels_of {
    my ($family) = @_;
    return { map { $_ => 1 } keys %{ $families{$family} // {} }, @TARGET_LABELS };
}

# The expression with string literals blanked (same length, so positions
# hold), for finding keywords and parentheses outside strings.
sub blank_strings {
    my ($expr) = @_;
    (my $b = $expr) =~ s/("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)/'"' . ('_' x (length($1) - 2)) . '"'/ge;
    return $b;
}

# The index of the parenthesis matching the one at $pos ($dir 1 or -1).
sub matching_paren {
    my ($text, $pos, $dir) = @_;
    my $depth = 0;
    for (my $i = $pos; $i >= 0 && $i < length $text; $i += $dir) {
        my $c = substr $text, $i, 1;
        $depth++ if $c eq ($dir > 0 ? '(' : ')');
        $depth-- if $c eq ($dir > 0 ? ')' : '(');
        return $i if $depth == 0;
    }
    return undef;
}

# The module's families an expression names.
sub families_in {
    my ($expr) = @_;
    my %seen;
    $seen{$1} = 1 while $expr =~ /(?<![A-Za-z0-9_:])(nginx_upstream_affinity_[A-Za-z0-9_:]*)/g;
    return sort keys %seen;
}

# Checks one expression; returns the problems found, each a string.
# $where names it in the messages.
sub check_expr {
    my ($expr, $where) = @_;
    my @problems;
    my $blank = blank_strings($expr);

    # balanced parentheses, brackets and braces outside strings
    for my $pair ([ '(', ')' ], [ '[', ']' ], [ '{', '}' ]) {
        my ($open, $close) = @$pair;
        my $depth = 0;
        for my $c (split //, $blank) {
            $depth++ if $c eq $open;
            $depth-- if $c eq $close;
            last if $depth < 0;
        }
        push @problems, "$where: unbalanced $open$close" if $depth;
    }

    my @names = families_in($expr);
    for my $name (@names) {
        push @problems, "$where: $name is not a family the module exports"
            unless $families{$name};
    }

    # selectors NAME{matchers}
    while ($blank =~ /(?<![A-Za-z0-9_:])(nginx_upstream_affinity_[A-Za-z0-9_:]*)\s*\{/g) {
        my ($name, $start) = ($1, pos $blank);
        my $end = index $blank, '}', $start;
        next if $end < 0;    # unbalanced, said above
        my $matchers = substr $expr, $start, $end - $start;
        next unless $families{$name};
        my $labels = labels_of($name);
        while ($matchers =~ /\G\s*([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)/gc) {
            my ($label, $op, $value) = ($1, $2, $3);
            if (!$labels->{$label}) {
                push @problems, "$where: $name has no label $label";
                next;
            }
            # literal values must be ones the status reports
            my $known = $families{$name}{$label} or next;    # target labels
            my @literals = $op =~ /~/
                ? ($value =~ /^[a-z_]+(?:\|[a-z_]+)*$/ ? split(/\|/, $value) : ())
                : ($value =~ /\$/ ? () : ($value));
            for my $v (@literals) {
                push @problems, "$where: $name has no $label=\"$v\" in the status"
                    unless $known->{$v};
            }
        }
        push @problems, "$where: cannot read the matchers of $name: {$matchers}"
            unless (pos($matchers) // 0) == length $matchers
                   || $matchers =~ /^\s*$/;
    }
    (my $nameless = $blank) =~ s/[A-Za-z_:][A-Za-z0-9_:]*\s*\{//g;
    push @problems, "$where: a selector without a metric name"
        if $nameless =~ /\{/;

    # label lists of by, without, on, ignoring, group_left, group_right
    while ($blank =~ /\b(by|without|on|ignoring|group_left|group_right)\s*\(/g) {
        my ($keyword, $open, $at) = ($1, pos($blank) - 1, $-[0]);
        my $close = matching_paren($blank, $open, 1);
        unless (defined $close) {
            push @problems, "$where: unclosed label list after $keyword";
            next;
        }
        my @labels = grep { length } map { s/^\s+|\s+$//gr }
                     split /,/, substr($expr, $open + 1, $close - $open - 1);
        my @scope;
        if ($keyword eq 'by' || $keyword eq 'without') {
            # the aggregation's argument: after the list, or before the
            # keyword ("sum (x) by (l)")
            my ($from, $to);
            my $after = substr $blank, $close + 1;
            if ($after =~ /^(\s*)\(/) {
                $from = $close + 1 + length $1;
                $to = matching_paren($blank, $from, 1);
            } elsif (substr($blank, 0, $at) =~ /\)(\s*)\z/) {
                $to = $at - 1 - length $1;
                $from = matching_paren($blank, $to, -1);
            }
            unless (defined $from && defined $to) {
                push @problems, "$where: no argument found for $keyword (@labels)";
                next;
            }
            ($from, $to) = ($to, $from) if $from > $to;
            @scope = families_in(substr $expr, $from, $to - $from + 1);
        } else {
            @scope = @names;
        }
        @scope = grep { $families{$_} } @scope;
        next unless @scope;
        for my $label (@labels) {
            if ($label !~ /^[a-zA-Z_]\w*$/) {
                push @problems, "$where: \"$label\" in $keyword (...) is not a label name";
                next;
            }
            my @missing = grep { !labels_of($_)->{$label} } @scope;
            if ($keyword =~ /^group_/) {
                push @problems, "$where: no family has the label $label of $keyword"
                    if @missing == @scope;
            } elsif (@missing) {
                push @problems, "$where: $keyword ($label): @missing has no label $label";
            }
        }
    }

    return @problems;
}

# Problems with {{label}} in a legend or $labels.label in an annotation:
# the label must be on one of the expression's families.
sub check_labels_shown {
    my ($expr, $labels, $where) = @_;
    my @names = grep { $families{$_} } families_in($expr);
    return () unless @names;
    my @problems;
    for my $label (@$labels) {
        push @problems, "$where: no family of its expression has the label $label"
            unless grep { labels_of($_)->{$label} } @names;
    }
    return @problems;
}

# Every nginx_upstream_affinity_ name in a file is a family.
sub unknown_names_in_text {
    my ($text, $file) = @_;
    return map { "$file: $_ is not a family the module exports" }
           grep { !$families{$_} } families_in($text);
}

my %referenced;    # family => 1, over the dashboard and the alerts

# Passes if there are no problems, else fails and lists them all.
sub no_problems {
    my ($problems, $name) = @_;
    local $Test::Builder::Level = $Test::Builder::Level + 1;
    ok !@$problems, $name or diag join "\n", @$problems;
}

# ---------------------------------------------------------------------------
# The dashboard

my $dashboard_text = slurp($DASHBOARD);
my $dashboard = eval { JSON::PP->new->relaxed(0)->decode($dashboard_text) };
ok $dashboard, 'the dashboard is valid JSON' or diag $@;
$dashboard //= {};

my @panels;
{
    my @queue = @{ $dashboard->{panels} // [] };
    while (my $p = shift @queue) {
        push @panels, $p;
        push @queue, @{ $p->{panels} // [] };    # panels of collapsed rows
    }
}

subtest 'dashboard structure' => sub {
    like $dashboard->{schemaVersion} // '', qr/^\d+$/, 'a schemaVersion';
    cmp_ok $dashboard->{schemaVersion} // 0, '>=', 39,
        'of a current Grafana (39: Grafana 11; 41: Grafana 12)';
    ok length($dashboard->{title} // ''), 'a title';
    ok length($dashboard->{uid} // ''), 'a uid';

    my %vars = map { $_->{name} => $_ } @{ $dashboard->{templating}{list} // [] };
    is $vars{datasource}{type}, 'datasource', 'a datasource variable';
    is $vars{datasource}{query}, 'prometheus', '  of Prometheus data sources';
    for my $name (qw(upstream peer)) {
        is $vars{$name}{type}, 'query', "a query variable $name";
    }
    like $vars{upstream}{definition} // '',
        qr/^label_values\(nginx_upstream_affinity_routes_total\b.*,\s*upstream\)$/,
        '  upstream: the upstream label of routes_total';
    like $vars{peer}{definition} // '', qr/,\s*peer\)$/, '  peer: a peer label';

    my (%ids, @problems);
    ok scalar(grep { $_->{type} ne 'row' } @panels) >= 10, 'panels';
    for my $p (@panels) {
        my $name = $p->{title} // "panel $p->{id}";
        push @problems, "panel $p->{id} has no title" unless length($p->{title} // '');
        push @problems, "$name: id used twice" if defined $p->{id} && $ids{ $p->{id} }++;
        push @problems, "$name: no gridPos" unless ref $p->{gridPos} eq 'HASH';
        next if $p->{type} eq 'row';    # rows group panels, query nothing
        push @problems, "$name: no description"
            unless length($p->{description} // '') > 40;
        my $ds = $p->{datasource} // {};
        push @problems, "$name: datasource is not \${datasource}"
            unless ref $ds eq 'HASH' && ($ds->{type} // '') eq 'prometheus'
                   && ($ds->{uid} // '') eq '${datasource}';
        my @targets = @{ $p->{targets} // [] };
        push @problems, "$name: no targets" unless @targets;
        my %refs;
        for my $target (@targets) {
            push @problems, "$name: a target without expr"
                unless length($target->{expr} // '');
            push @problems, "$name: refId $target->{refId} twice"
                if $refs{ $target->{refId} // '' }++;
            my $tds = $target->{datasource} // $ds;
            push @problems, "$name: a target's datasource is not \${datasource}"
                unless ($tds->{uid} // '') eq '${datasource}';
        }
    }
    no_problems(\@problems, 'every panel has a title, a description, the '
        . 'datasource variable and targets with an expression');
};

subtest 'dashboard queries use what the module exports' => sub {
    my (@problems, $n);
    for my $p (grep { $_->{type} ne 'row' } @panels) {
        for my $target (@{ $p->{targets} // [] }) {
            my $expr = $target->{expr} // next;
            my $where = "panel \"$p->{title}\" $target->{refId}";
            $n++;
            $referenced{$_} = 1 for families_in($expr);
            push @problems, check_expr($expr, $where);
            push @problems, check_labels_shown($expr,
                [ ($target->{legendFormat} // '') =~ /\{\{\s*(\w+)\s*\}\}/g ],
                "$where legend");
        }
    }
    for my $var (@{ $dashboard->{templating}{list} // [] }) {
        next unless ($var->{type} // '') eq 'query';
        my $query = ref $var->{query} eq 'HASH' ? $var->{query}{query} : $var->{query};
        for my $q (grep { defined } $query, $var->{definition}) {
            my $where = "variable $var->{name}";
            $n++;
            $referenced{$_} = 1 for families_in($q);
            my ($selector, $label) = $q =~ /^\s*label_values\((.*),\s*(\w+)\s*\)\s*$/s
                or push(@problems, "$where: not label_values(SELECTOR, label): $q"), next;
            push @problems, check_expr($selector, $where);
            my @names = grep { $families{$_} } families_in($selector);
            push @problems, "$where: label_values of no family of the module"
                unless @names;
            push @problems, "$where: $_ has no label $label"
                for grep { !labels_of($_)->{$label} } @names;
        }
    }
    push @problems, unknown_names_in_text($dashboard_text, 'grafana-dashboard.json');
    ok $n >= 20, "$n queries checked";
    no_problems(\@problems, 'every metric and label they use is exported');
};

# ---------------------------------------------------------------------------
# The alert rules

my $alerts_text = slurp($ALERTS);
my $yaml = eval { CPAN::Meta::YAML->read_string($alerts_text) };
ok $yaml, 'the alert rules are YAML (CPAN::Meta::YAML)'
    or diag $@ || CPAN::Meta::YAML->errstr;
my $rules_doc = $yaml ? $yaml->[0] : {};

SKIP: {
    skip 'YAML::XS is not installed', 1 unless eval { require YAML::XS; 1 };
    my $xs = eval { YAML::XS::Load($alerts_text) };
    # the two differ only in the whitespace of block scalars
    my $norm;
    $norm = sub {
        my ($v) = @_;
        return { map { $_ => $norm->($v->{$_}) } keys %$v } if ref $v eq 'HASH';
        return [ map { $norm->($_) } @$v ] if ref $v eq 'ARRAY';
        return defined $v ? join(' ', split ' ', $v) : $v;
    };
    is_deeply $norm->($xs), $norm->($rules_doc),
        'YAML::XS reads the same rules' or diag $@;
}

my @rules;
subtest 'alert file structure' => sub {
    my @groups = @{ ref $rules_doc eq 'HASH' && $rules_doc->{groups} || [] };
    ok @groups, 'groups';
    is_deeply [ grep { $_ ne 'groups' } keys %$rules_doc ], [],
        'nothing but groups at the top (a Prometheus rule file)';
    my (@problems, %names);
    for my $g (@groups) {
        push @problems, 'a group without a name' unless length($g->{name} // '');
        my @r = @{ $g->{rules} // [] };
        push @problems, "group $g->{name}: no rules" unless @r;
        for my $rule (@r) {
            my $name = $rule->{alert} // '(no alert name)';
            push @rules, $rule;
            push @problems, "$name: not an alerting rule"
                unless ($rule->{alert} // '') =~ /^[A-Z][A-Za-z0-9]+$/;
            push @problems, "$name: alert name used twice" if $names{$name}++;
            push @problems, "$name: no expr" unless length($rule->{expr} // '');
            push @problems, "$name: for is not a duration"
                unless ($rule->{for} // '') =~ /^(?:\d+[smhdwy])+$/;
            push @problems, "$name: severity is not critical, warning or info"
                unless ($rule->{labels}{severity} // '') =~ /^(?:critical|warning|info)$/;
            for my $a (qw(summary description)) {
                push @problems, "$name: no annotations.$a"
                    unless length($rule->{annotations}{$a} // '');
            }
            my @extra = grep { !/^(?:alert|expr|for|labels|annotations)$/ } keys %$rule;
            push @problems, "$name: unexpected keys @extra" if @extra;
        }
    }
    ok @rules >= 10, scalar(@rules) . ' alerts';
    no_problems(\@problems, 'every rule has alert, expr, for, labels.severity, '
        . 'annotations.summary and annotations.description');
};

subtest 'alert expressions use what the module exports' => sub {
    my @problems;
    for my $rule (@rules) {
        my $where = "alert $rule->{alert}";
        my $expr = $rule->{expr} // next;
        $referenced{$_} = 1 for families_in($expr);
        push @problems, check_expr($expr, $where);
        my %shown;
        for my $text (values %{ $rule->{annotations} // {} }) {
            $shown{$1} = 1 while $text =~ /\$labels\.(\w+)/g;
        }
        push @problems, check_labels_shown($expr, [ sort keys %shown ],
                                           "$where annotations");
    }
    push @problems, unknown_names_in_text($alerts_text, 'alerts.yml');
    push @problems, unknown_names_in_text(slurp($README), 'README.md');
    no_problems(\@problems, 'every metric and label they use is exported');

    for my $family (qw(nginx_upstream_affinity_info
                       nginx_upstream_affinity_peer_inflight
                       nginx_upstream_affinity_fallbacks_total
                       nginx_upstream_affinity_zone_evictions_total
                       nginx_upstream_affinity_zone_peer_slots_missing_total
                       nginx_upstream_affinity_zone_worker_rows_missing_total
                       nginx_upstream_affinity_zone_workers_reaped_total)) {
        ok scalar(grep { my $rule = $_;
                         grep { $_ eq $family } families_in($rule->{expr}) } @rules),
            "an alert watches $family";
    }
    ok scalar(grep { $_->{expr} =~ /^\s*absent\(nginx_upstream_affinity_/ } @rules),
        'an alert fires when there are no metrics at all';
};

is_deeply [ grep { !$referenced{$_} } sort keys %families ], [],
    'the dashboard and the alerts use every family the module exports';

# ---------------------------------------------------------------------------
# promtool, when installed: the PromQL parses

SKIP: {
    my ($promtool) = grep { -x } map { File::Spec->catfile($_, 'promtool') }
                     File::Spec->path;
    skip 'promtool is not installed (Debian package prometheus)', 2
        unless $promtool;

    my ($rc, $out) = run($promtool, 'check', 'rules', $ALERTS);
    is $rc, 0, 'promtool accepts the alert rules' or diag $out;

    # the dashboard's queries as recording rules, Grafana's variables
    # replaced by what they become
    my $file = $t->path('dashboard-rules.yml');
    open my $fh, '>', $file or die "write $file: $!";
    print {$fh} "groups:\n  - name: dashboard\n    rules:\n";
    my $i = 0;
    for my $p (grep { $_->{type} ne 'row' } @panels) {
        for my $target (@{ $p->{targets} // [] }) {
            (my $expr = $target->{expr}) =~ s/\$__(?:rate_interval|range|interval)/5m/g;
            $expr =~ s/\$\{?\w+\}?/.*/g;
            $i++;
            # a JSON string is a YAML scalar
            print {$fh} "      - record: dashboard:query_$i\n        expr: "
                . JSON::PP->new->allow_nonref->encode($expr) . "\n";
        }
    }
    close $fh;
    ($rc, $out) = run($promtool, 'check', 'rules', $file);
    is $rc, 0, "promtool parses the dashboard's $i queries" or diag $out;
}

# A command without a shell: (exit code, stdout+stderr).
sub run { return AffinityTest::run_command(@_) }

$t->stop_nginx;
is_deeply [ $t->log_problems ], [], 'no alert, crit, emerg or crash in error.log';

done_testing;
