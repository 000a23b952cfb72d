#!/usr/bin/env perl

# Bodies that are not what an OpenAI client sends: each class of malformed
# or hostile JSON, and every input of the committed fuzzing corpus, is
# served (routed without the body) from memory and from a temporary file,
# no worker dies, and the error log says why once per worker, not once per
# request.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use File::Spec;
use Test::More;

use AffinityTest;
use AffinityConf qw(proxy_conf servers routes);

my $t = AffinityTest->new;
my @ports = $t->start_backends(3);
my $files = $t->port;
my $up = servers(\@ports);

$t->write_conf(proxy_conf($t, $up . <<"EOF", http => <<"HTTP"));
        session_affinity header=X-Session-ID field=user
                         field=metadata.session_id zone=hostile_s:1m;
        prefix_affinity zone=hostile_p:1m;
EOF
    # bodies over 1k go to temporary files
    server {
        listen 127.0.0.1:$files;
        client_body_buffer_size 1k;
        client_max_body_size 8m;
        access_log "${\ $t->path('logs/route.log') }" route;
        location / { proxy_pass http://llm; }
    }
HTTP
$t->start_nginx;

my $json = { 'Content-Type' => 'application/json' };
my $long = 'x' x 3000;     # so that a body also takes the temp file path

my %bodies = (
    'the 15-byte crash'     => qq({"tools":[{\x00]}}),
    'mismatched brackets'   => qq({"tools":[{]}},"messages":[{"role":"user",)
                               . qq("content":"$long"}]}),
    'object closed by ]'    => qq({"messages":[{"role":"user","content":"$long"]]}),
    'truncated'             => qq({"messages":[{"role":"user","content":"$long),
    'truncated after a key' => qq({"model":"m","messages":),
    'trailing garbage'      => qq({"messages":[]} {"x":1}),
    'NUL outside strings'   => qq({"messages":\x00[]}),
    'raw control character' => qq({"messages":[{"role":"user","content":"a\x01b"}]}),
    'raw newline in string' => qq({"messages":[{"role":"user","content":"a\nb"}]}),
    'invalid UTF-8'         => qq({"messages":[{"role":"user","content":"\xff\xfe$long"}]}),
    'overlong UTF-8'        => qq({"user":"\xc0\xaf","messages":[]}),
    'lone surrogate escape' => qq({"messages":[{"role":"user","content":"\\ud800"}]}),
    'bad escape'            => qq({"messages":[{"role":"user","content":"\\x41"}]}),
    'deep arrays'           => '{"messages":' . ('[' x 100000) . (']' x 100000) . '}',
    'deep objects'          => ('{"a":' x 5000) . '1' . ('}' x 5000),
    'unclosed depth'        => '[' x 50000,
    'huge number'           => '{"user":1' . ('0' x 400) . ',"messages":[]}',
    'huge exponent'         => '{"user":1e99999,"messages":[]}',
    'messages not an array' => '{"messages":5}',
    'content an object'     => qq({"messages":[{"role":"user","content":{"a":"$long"}}]}),
    'role a number'         => '{"messages":[{"role":7,"content":"hi"}]}',
    'tools a string'        => '{"tools":"x","messages":[]}',
    'tools of numbers'      => '{"tools":[1,2,3],"messages":[]}',
    'parts of nulls'        => '{"messages":[{"role":"user","content":[null,1,true]}]}',
    'image without url'     => '{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":5}}]}]}',
    'a top-level array'     => qq([{"role":"user","content":"$long"}]),
    'a top-level string'    => '"just a string"',
    'whitespace only'       => "  \n\t  ",
    'duplicate keys'        => qq({"user":"a","user":"b","messages":[],"messages":5}),
    'byte order mark'       => qq(\xef\xbb\xbf{"messages":[]}),
    'many small elements'   => '{"messages":[' . join(',', ('{}') x 50000) . ']}',
    'very long key'         => '{"' . ('k' x 100000) . '":1,"messages":[]}',
);

# valid bodies whose ends fall at and around page boundaries: a body in a
# temporary file is mapped, with a page of zeros after it for the parser
my %edges;
for my $pages (1 .. 3) {
    for my $delta (-64, -63, -33, -1, 0, 1, 63) {
        my $len = 4096 * $pages + $delta;
        my $head = '{"model":"m","messages":[{"role":"user","content":"';
        my $tail = '"}]}';
        $edges{"length $len"} = $head . ('e' x ($len - length($head)
                                              - length($tail))) . $tail;
    }
}

# bodies that are not JSON at all: routed as if they had no body
my @unparsable = ('the 15-byte crash', 'mismatched brackets',
    'object closed by ]', 'truncated', 'truncated after a key',
    'trailing garbage', 'NUL outside strings', 'raw control character',
    'raw newline in string', 'invalid UTF-8', 'overlong UTF-8',
    'lone surrogate escape', 'bad escape', 'deep arrays', 'deep objects',
    'unclosed depth', 'huge number', 'huge exponent', 'whitespace only',
    'byte order mark');

# the committed fuzzing corpora: every input, as a body
my %corpus;
my $root = File::Spec->catdir($FindBin::Bin, '..', 'fuzz', 'corpus');
for my $dir (glob File::Spec->catfile($root, '*')) {
    for my $file (glob File::Spec->catfile($dir, '*')) {
        next unless -f $file;
        open my $fh, '<:raw', $file or die "$file: $!";
        local $/;
        $corpus{"corpus " . join('/', (File::Spec->splitdir($file))[-2, -1])}
            = <$fh>;
    }
}
ok keys(%corpus) > 0, scalar(keys %corpus) . ' corpus inputs found';

my %all = (%bodies, %corpus);
my @names = sort keys %all;

for my $port ($t->listen_port, $files) {
    my $where = $port == $files ? 'temporary file' : 'memory';
    my %types = ('application/json' => $json, 'no type' => {});

    for my $type (sort keys %types) {
        my @failed;

        # in batches, so that many requests are in flight at once
        for (my $i = 0; $i < @names; $i += 50) {
            my @batch = @names[$i .. ($i + 49 < $#names ? $i + 49 : $#names)];
            my @res = $t->parallel([ map { {
                method => 'POST', path => '/v1/chat/completions',
                port => $port, headers => $types{$type}, body => $all{$_},
            } } @batch ]);

            for my $k (0 .. $#batch) {
                push @failed, "$batch[$k]: $res[$k]{status}"
                    unless $res[$k]{status} == 200
                        && $res[$k]{headers}{'x-backend-port'};
            }
        }

        is_deeply \@failed, [],
            scalar(@names) . " bodies served ($where, $type)";
        is_deeply [ $t->log_problems ], [], 'no worker died';
    }
}

subtest 'bodies that are not JSON are routed without them' => sub {
    for my $port ($t->listen_port, $files) {
        my $n = () = routes($t);
        my @res = $t->parallel([ map { {
            method => 'POST', path => '/', port => $port, headers => $json,
            body => $bodies{$_},
        } } @unparsable ]);
        is scalar(grep { $_->{status} == 200 } @res), scalar(@unparsable),
            'all served';
        my @routes = (routes($t))[$n .. $n + $#unparsable];
        is_deeply [ map { $_->{route} } @routes ],
            [ ('fallback') x @unparsable ], 'each by fallback';
    }
};

subtest 'bodies ending at page boundaries are read whole' => sub {
    my $n = () = routes($t);
    my @names = sort keys %edges;
    my @res = $t->parallel([ map { {
        method => 'POST', path => '/', port => $files, headers => $json,
        body => $edges{$_},
    } } @names ]);
    is scalar(grep { $_->{status} == 200 } @res), scalar(@names),
        scalar(@names) . ' served from temporary files';
    my @routes = (routes($t))[$n .. $n + $#names];
    is scalar(grep { $_->{route} =~ /^prefix_/ } @routes), scalar(@names),
        'each parsed and routed by its prompt';
};

subtest 'valid requests still route after all that' => sub {
    my $body = '{"model":"m","user":"u-after","messages":'
               . '[{"role":"user","content":"hello after the storm"}]}';
    my %seen;
    for (1 .. 5) {
        my $r = $t->http(POST => '/', headers => $json, body => $body);
        is $r->{status}, 200, 'served';
        $seen{ $r->{headers}{'x-backend-port'} }++;
    }
    is scalar(keys %seen), 1, 'sticky by its field';
};

my @warnings = $t->error_log =~ /(request body is not a valid JSON object)/g;
ok @warnings >= 1, 'the reason is logged';
ok @warnings <= 4, scalar(@warnings) . ' times: at most once per worker';

$t->stop_nginx;
is_deeply [ $t->log_problems ], [], 'no alert, crit, emerg or crash in error.log';

done_testing;
