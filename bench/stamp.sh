# shellcheck shell=sh
# Where the shell benchmarks write and how they stamp what they write:
# bench/stamp.py's, for scripts that source this after scripts/lib.sh
# (which sets repo).
#
#   . "$(dirname "$0")/stamp.sh"
#
# result_path NAME      where a result named NAME goes: build/bench/NAME,
#                       or bench/results/NAME with RECORD=1
# stamp FORMAT CMD [VAR...]
#                       the stamp (markdown, text or json) of a result that
#                       the command line CMD produces, with each VAR set in
#                       the environment put before it as VAR=value
# shown PATH            PATH relative to the repository when it is in it

# shellcheck disable=SC2154  # repo: set by scripts/lib.sh
stamp_python="${PYTHON:-python3}"

result_path() { "$stamp_python" "$repo/bench/stamp.py" path "$1"; }

stamp() {
    _format="$1" _command="$2"
    shift 2
    _envs=""
    for _var; do
        _envs="$_envs --env $_var"
    done
    # shellcheck disable=SC2086  # the --env words, split on purpose
    "$stamp_python" "$repo/bench/stamp.py" "$_format" --command "$_command" \
        $_envs
}

shown() { echo "${1#"$repo"/}"; }
