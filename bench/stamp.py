#!/usr/bin/env python3
"""What produced a benchmark result, and where the result goes.

Every driver that writes a result stamps it with the command line that
produced it, the commit of the checkout (`git rev-parse --short HEAD`,
"-dirty" when files outside bench/results/ differ from it or are new;
"unknown" outside git), the module's version (AFFINITY_VERSION in
src/core/include/affinity_core.h, as `make version` prints it) and the
date, in UTC.  The python drivers import this file; the shell scripts
source bench/stamp.sh, which runs it.

Results go to build/bench/<name>, scratch that `git status` ignores,
unless RECORD=1 is in the environment (`make bench-quick RECORD=1`):
then to bench/results/<name>, where the committed results are, listed in
bench/results/README.md.  BENCH_RESULTS=DIR puts them under DIR instead
(relative to the checkout); the Makefile passes the directory it gets
from `bench/stamp.py root` that way, so that `make -n` shows it.

    bench/stamp.py root                 the directory results go under,
                                        relative to the checkout
    bench/stamp.py path NAME            where a result named NAME goes
    bench/stamp.py markdown|text|json --command CMD [--env VAR]...
                                        the stamp of a result CMD produces
                                        (each VAR set in the environment
                                        is put before CMD as VAR=value)
"""

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERSION_HEADER = os.path.join('src', 'core', 'include', 'affinity_core.h')


def recording():
    """Whether RECORD asks for the committed results to be updated."""
    return os.environ.get('RECORD', '') not in ('', '0', 'no', 'false')


def results_root():
    """The directory results go under: BENCH_RESULTS when set, else
    bench/results with RECORD=1, else build/bench."""
    given = os.environ.get('BENCH_RESULTS', '')
    if given:
        return os.path.join(REPO, given)        # as given if absolute
    if recording():
        return os.path.join(REPO, 'bench', 'results')
    return os.path.join(REPO, 'build', 'bench')


def results_path(name):
    """Where a result named `name` (a directory or a file) goes: under
    results_root()."""
    return os.path.join(results_root(), name)


def shown(path):
    """A path as the repository's files should show it: relative to the
    checkout when it is in it, so that no machine's directory gets into a
    committed result."""
    path = str(path)
    return path.replace(REPO + os.sep, '') if path != REPO else '.'


def _git(*args):
    return subprocess.run(['git', '-C', REPO] + list(args),
                          capture_output=True, text=True, check=True,
                          timeout=30).stdout.strip()


def commit():
    """The checkout's commit, short, with "-dirty" when something outside
    bench/results/ (where results are written) differs from it or is not
    tracked yet; "unknown" outside git."""
    try:
        head = _git('rev-parse', '--short', 'HEAD')
    except (OSError, subprocess.SubprocessError):
        return 'unknown'
    try:
        changes = _git('status', '--porcelain', '--', '.',
                       ':(exclude)bench/results')
    except (OSError, subprocess.SubprocessError):
        changes = ''
    return head + ('-dirty' if changes else '')


def version():
    """The module's version, from the header that defines it."""
    try:
        with open(os.path.join(REPO, VERSION_HEADER)) as f:
            m = re.search(r'^#define AFFINITY_VERSION\s+"([^"]*)"', f.read(),
                          re.M)
    except OSError:
        return 'unknown'
    return m.group(1) if m else 'unknown'


def command(argv=None, env=()):
    """The command line of this process (or argv, program first), shell
    quoted, with paths in the checkout relative to it, after the
    variables of `env` that are set, as VAR=value."""
    argv = list(sys.argv if argv is None else argv)
    if argv and os.path.isfile(argv[0]):
        program = os.path.abspath(argv[0])
        if program.startswith(REPO + os.sep):
            argv[0] = os.path.relpath(program, REPO)
    return ' '.join(assignments(env) + [shlex.quote(shown(a)) for a in argv])


def assignments(env):
    """VAR=value for each variable of env set (not empty) here."""
    return ['%s=%s' % (var, shlex.quote(shown(os.environ[var])))
            for var in env if os.environ.get(var, '') != '']


def stamp(cmd=None, env=(), program=None, argv=None):
    """{command, commit, version, date}: cmd as given, else `program`
    (a driver's file) with the arguments its main() was given, else this
    process's command line (see command())."""
    if cmd is None:
        cmd = command(None if argv is None
                      else [program or sys.argv[0]] + list(argv), env)
    return {'command': cmd,
            'commit': commit(),
            'version': version(),
            'date': time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}


def markdown(st):
    """The stamp as a markdown paragraph, for the top of a report (under
    its title)."""
    return ('Produced by `%s` at commit %s, module version %s, on %s.'
            % (st['command'], st['commit'], st['version'], st['date']))


def text(st):
    """The stamp as the header lines of a text file."""
    return ''.join('%-8s %s\n' % (key + ':', st[key])
                   for key in ('command', 'commit', 'version', 'date'))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    sub = p.add_subparsers(dest='what', required=True)
    sub.add_parser('root', help='the directory results go under')
    path = sub.add_parser('path', help='where a result named NAME goes')
    path.add_argument('name')
    for fmt in ('markdown', 'text', 'json'):
        s = sub.add_parser(fmt, help='the stamp, as ' + fmt)
        s.add_argument('--command', required=True, dest='cmd')
        s.add_argument('--env', action='append', default=[],
                       help='a variable put before the command when set')
    args = p.parse_args(argv)
    if args.what == 'root':
        print(shown(results_root()))
        return
    if args.what == 'path':
        print(results_path(args.name))
        return
    st = stamp(' '.join(assignments(args.env) + [args.cmd]))
    if args.what == 'markdown':
        print(markdown(st))
    elif args.what == 'text':
        sys.stdout.write(text(st))
    else:
        print(json.dumps(st))


if __name__ == '__main__':
    main()
