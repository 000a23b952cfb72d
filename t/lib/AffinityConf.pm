package AffinityConf;

# Configuration snippets and log readers shared by the e2e tests: an
# upstream "llm" over the given backend ports, a proxy server on the
# harness's listen port, and a route log recording the module's variables.

use strict;
use warnings;

use Exporter 'import';
our @EXPORT_OK = qw(proxy_conf servers routes route_lines session_request
                    log_lines
                    placement moved chat proxied_upstream eventually
                    engine_figures text);

use JSON::PP ();
use sort 'stable';
use Time::HiRes qw(sleep time);

# engine_figures($t, $port, $upstream) - what the status page on $port says
# each server's engine reported (affinity_metrics): {backend port =>
# {load, cache_usage, age, elsewhere}}, undef for a server never reported.
sub engine_figures {
    my ($t, $port, $upstream) = @_;
    my $s = JSON::PP->new->decode($t->http(GET => '/', port => $port)->{body});
    return { map { ($_->{name} =~ /:(\d+)$/)[0] => $_->{engine} }
             @{ $s->{upstreams}{$upstream}{peers} } };
}

# servers(\@ports, %extra) - "server 127.0.0.1:PORT ...;" lines; $extra{PORT}
# appends parameters (weight=2, backup, down, ...) to that server.
sub servers {
    my ($ports, %extra) = @_;
    return join '', map {
        my $x = $extra{$_} ? " $extra{$_}" : '';
        "        server 127.0.0.1:$_$x;\n";
    } @$ports;
}

# proxy_conf($t, $upstream_body, %opt) - the http{} body: upstream llm with
# $upstream_body, the proxy server, and $opt{http} / $opt{location} extras.
sub proxy_conf {
    my ($t, $upstream, %opt) = @_;
    my $port = $t->listen_port;
    my $log = $t->path('logs/route.log');
    my $http = $opt{http} // '';
    my $location = $opt{location} // '';

    return <<"EOF";
    log_format route '\$msec|\$request_time|\$affinity_route|'
                     '\$affinity_session|\$upstream_addr|\$status';
    client_body_buffer_size 1m;
    client_max_body_size 8m;
$http
    upstream llm {
$upstream
    }

    server {
        listen 127.0.0.1:$port;
        access_log "$log" route;

        location / {
            proxy_pass http://llm;
            proxy_next_upstream error timeout http_502;
$location
        }
    }
EOF
}

# proxied_upstream($name, $body, $port, %opt) - one more upstream $name
# with $body (server lines and directives) and a server on $port proxying
# to it, for the http{} extras of proxy_conf; $opt{log} adds its access_log
# line.
sub proxied_upstream {
    my ($name, $body, $port, %opt) = @_;
    my $log = $opt{log} ? "\n        $opt{log}" : '';
    return <<"UPSTREAM";
    upstream $name {
$body
    }

    server {
        listen 127.0.0.1:$port;$log
        location / { proxy_pass http://$name; }
    }
UPSTREAM
}

# placement($t, \@ids, by => HEADER) - where each session goes now: {id =>
# the backend's X-Backend-Port (or the response header HEADER)}, or
# "status N" for a request that failed.
sub placement {
    my ($t, $ids, %opt) = @_;
    my $by = lc($opt{by} // 'X-Backend-Port');
    my %where;
    for my $id (@$ids) {
        my $r = $t->http(GET => '/', headers => { 'X-Session-ID' => $id });
        $where{$id} = $r->{status} == 200
            ? $r->{headers}{$by} // "no $by" : "status $r->{status}";
    }
    return \%where;
}

# moved($before, $after) - the sorted ids whose place differs.
sub moved {
    my ($before, $after) = @_;
    return [ grep { $before->{$_} ne $after->{$_} } sort keys %$before ];
}

# log_lines($path) - the lines of an access log once it has settled.  A
# client can see the end of a response before nginx logs it: after a request
# with a body nginx closes lingeringly, shutting down its side first and
# logging when the connection is finally closed.  So wait until the log
# has not grown for 150 ms (at most 3 s).
sub log_lines {
    my ($path) = @_;
    my ($size, $since, $deadline) = (-1, time, time + 3);
    while (time < $deadline) {
        my $now = -s $path // 0;
        if ($now != $size) {
            ($size, $since) = ($now, time);
        } elsif (time - $since >= 0.15) {
            last;
        }
        sleep 0.03;
    }
    open my $fh, '<', $path or return ();
    my @lines = <$fh>;
    close $fh;
    return @lines;
}

# routes($t) - the route log as a list of {route, session, upstream, status},
# in the order the requests started: with several workers, a request's line
# may be written after that of the next request its client sent.
sub routes {
    my ($t) = @_;
    return route_lines($t->path('logs/route.log'));
}

# route_lines($path) - as routes(), of another log in the "route" format.
sub route_lines {
    my ($path) = @_;
    my @r;
    for my $line (log_lines($path)) {
        chomp $line;
        my ($msec, $took, $route, $session, $upstream, $status)
            = split /\|/, $line, 6;
        push @r, { route => $route, session => $session,
                   upstream => $upstream, status => $status,
                   started => sprintf('%.0f', ($msec - $took) * 1000) };
    }
    # sort is stable: requests started in the same millisecond keep the
    # order of their lines
    return map { delete $_->{started}; $_ }
           sort { $a->{started} <=> $b->{started} } @r;
}

# session_request($id, %opt) - a request spec for $t->parallel carrying
# X-Session-ID $id (or no session header when $id is undef).
sub session_request {
    my ($id, %opt) = @_;
    my %h = %{ $opt{headers} // {} };
    $h{'X-Session-ID'} = $id if defined $id;
    return { method => $opt{method} // 'GET', path => $opt{path} // '/',
             headers => \%h, (defined $opt{body} ? (body => $opt{body}) : ()) };
}

# eventually($check, $seconds) - whether $check returns true within
# $seconds, asking every 100 ms.
sub eventually {
    my ($check, $seconds) = @_;
    my $deadline = time + $seconds;
    until ($check->()) {
        return 0 if time > $deadline;
        sleep 0.1;
    }
    return 1;
}

# json_string($text) - $text as a JSON string literal.
sub json_string {
    my ($s) = @_;
    $s =~ s/(["\\])/\\$1/g;
    $s =~ s/\n/\\n/g;
    return qq("$s");
}

# text($tag, $n) - $n characters of text unique to $tag, for prompts of a
# known size.
sub text {
    my ($tag, $n) = @_;
    my $s = '';
    $s .= "$tag-" . length($s) . ' ' while length($s) < $n;
    return substr $s, 0, $n;
}

# chat([role, text], ...) - a chat completions body of those messages.
sub chat {
    my (@messages) = @_;
    return '{"model":"llm-test","messages":['
        . join(',', map { '{"role":' . json_string($_->[0])
                          . ',"content":' . json_string($_->[1]) . '}' }
               @messages)
        . '],"max_tokens":64}';
}

1;
