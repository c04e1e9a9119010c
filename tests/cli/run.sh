#!/bin/sh
# tests/cli/run.sh - end-to-end tests of the `engram` command-line tool.
#
# Drives the built binary ($ENGRAM_BIN) in a scratch directory (removed at
# exit) with its own --root (and runs the shell block of $ENGRAM_SRC/README.md
# there), and compares what it prints with known bytes:
# the pattern fill is computed independently (the expected hex below was
# produced by a separate Python implementation of the formula in
# `engram create --help`), raw and .npy inputs are written byte by byte with
# printf, and real numpy files are used too when numpy is installed.
# Prints one line per failure and ends with "cli: N passed, M failed";
# exits 0 only when nothing failed.  POSIX sh only.

set -u

if [ -z "${ENGRAM_BIN:-}" ]; then
    echo "cli: set ENGRAM_BIN to the engram binary" >&2
    exit 2
fi
case $ENGRAM_BIN in
/*) ;;
*) ENGRAM_BIN=$(pwd)/$ENGRAM_BIN ;;
esac
case ${ENGRAM_SRC:-/} in
/*) ;;
*) ENGRAM_SRC=$(pwd)/$ENGRAM_SRC ;;
esac
if [ ! -x "$ENGRAM_BIN" ]; then
    echo "cli: ENGRAM_BIN=$ENGRAM_BIN is not an executable" >&2
    exit 2
fi

SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/engram-cli.XXXXXX") || exit 2
# The scratch tree holds table files that are read-only; rm -rf copes.
trap 'rm -rf "$SCRATCH"' EXIT
trap 'exit 130' INT TERM
CLI_TESTS=$(cd "$(dirname "$0")" && pwd)
cd "$SCRATCH" || exit 2
ROOT=$SCRATCH/root
NS_DIR=$ROOT/default

HAVE_PY=0
HAVE_NUMPY=0
# PY: a python3 with numpy if there is one (the one on PATH, else the
# system's, which scripts/setup.sh gives numpy), else any python3.
PY=python3
for _py in python3 /usr/bin/python3; do
    if command -v "$_py" >/dev/null 2>&1 && "$_py" -c 'import numpy' >/dev/null 2>&1; then
        PY=$_py
        break
    fi
done
if command -v "$PY" >/dev/null 2>&1 && "$PY" -c 'import json' >/dev/null 2>&1; then
    HAVE_PY=1
    if "$PY" -c 'import numpy' >/dev/null 2>&1; then
        HAVE_NUMPY=1
    fi
fi

# shellcheck source=lib.sh
. "$CLI_TESTS/lib.sh"

json_ok() { "$PY" -m json.tool out >/dev/null 2>&1; }
# pycheck SCRIPT: runs a Python check (of ./out); shows why it failed.
pycheck() {
    "$PY" -c "$1" 2>pyerr && return 0
    tail -n 1 pyerr | sed 's/^/  python: /'
    return 1
}

# octal N: the printf escape of byte N.
octal() { printf '\\%03o' "$1"; }

# make_npy FILE VERSION DICT DATA: writes an .npy file by hand: magic,
# version, little-endian header length, DICT padded with spaces and a
# newline so that the data is 64-byte aligned (as numpy does), then DATA
# (a printf format of octal escapes).
make_npy() {
    _f=$1 _v=$2 _d=$3 _data=$4
    if [ "$_v" = 1 ]; then _pre=10; else _pre=12; fi
    _len=$((${#_d} + 1))
    _pad=$(((64 - (_pre + _len) % 64) % 64))
    _hlen=$((_len + _pad))
    {
        printf '\223NUMPY'
        printf "$(octal "$_v")\\000"
        printf "$(octal $((_hlen % 256)))$(octal $((_hlen / 256 % 256)))"
        if [ "$_v" != 1 ]; then printf '\000\000'; fi
        printf '%s' "$_d"
        if [ "$_pad" -gt 0 ]; then printf "%${_pad}s" ''; fi
        printf '\n'
        printf "$_data"
    } >"$_f"
}

DATA12='\001\002\003\004\005\006\007\010\011\012\013\014'
HEX12="0: 01 02 03 04
1: 05 06 07 08
2: 09 0a 0b 0c"

# ---------------------------------------------------------------------------
# Version and help.
run_bare --version
check "--version prints the version" eval 'rc_is 0 && out_has "^engram [0-9][0-9]*\.[0-9][0-9]*\.[0-9]"'
cp out version.out
# --version anywhere on the line, as --help: before any other check, and
# nothing is done.
for args in "ls --version" "lookup t 0 --version" "create t --rows 1 --row-bytes 1 --version" \
    "ns rm x --version" "info --version t" "bench --bogus --version"; do
    # shellcheck disable=SC2086
    run $args
    check "engram $args prints the version" eval 'rc_is 0 && cmp -s version.out out && err_empty'
done
check "create --version created nothing" eval '[ ! -e "$ROOT" ]'
run lookup t 0 -- --version
check "--version after -- is an argument" eval 'usage_fails'
run_bare --help
check "--help prints usage" eval 'rc_is 0 && out_has "^Usage: engram" && err_empty'
check "--help names ENGRAM_ROOT and the progress interval" eval 'out_has "ENGRAM_ROOT" && out_has "ENGRAM_PROGRESS_SECS"'
run_bare -h
check "-h prints usage" eval 'rc_is 0 && out_has "^Usage: engram"'
for c in create import ls info verify lookup rm ns bench demo; do
    run_bare "$c" --help
    check "$c --help" eval 'rc_is 0 && out_has "^Usage: engram .*$c" && err_empty'
    run_bare help "$c"
    check "help $c" eval 'rc_is 0 && out_has "^Usage: engram .*$c"'
    # --help wins even over other usage errors on the line.
    run_bare "$c" --bogus --help
    check "$c --bogus --help" eval 'rc_is 0 && out_has "^Usage: engram"'
done
run_bare create --help
check "create --help documents the pattern" eval 'out_has "splitmix64" && out_has "0x9E3779B97F4A7C15"'

# ---------------------------------------------------------------------------
# Usage errors: exit 2 with a message and a hint.
run_bare
check "no command -> 2" eval 'rc_is 2 && grep -q "Usage: engram" err'
run_bare frobnicate
check "unknown command -> 2" eval 'usage_fails && err_has "unknown command" && err_has "Try"'
run ls --bogus
check "unknown option -> 2" eval 'usage_fails && err_has "unknown option"'
run --bogus ls
check "unknown global option -> 2" eval 'usage_fails'
run ls --rows 3
check "option of another command -> 2" eval 'usage_fails'
run create t
check "create without --rows -> 2" eval 'usage_fails && err_has "rows"'
run create t --rows abc --row-bytes 4
check "create --rows abc -> 2" eval 'usage_fails && err_has "abc"'
run create t --rows -5 --row-bytes 4
check "create --rows -5 -> 2" eval 'usage_fails'
run create t --rows 12x --row-bytes 4
check "create --rows 12x -> 2" eval 'usage_fails && err_has "12x"'
run create t --rows ' 12' --row-bytes 4
check "create --rows ' 12' -> 2" eval 'usage_fails'
run create t --rows 99999999999999999999999 --row-bytes 4
check "create --rows overflow -> 2" eval 'usage_fails'
run create t --rows 0 --row-bytes 4
check "create --rows 0 -> 2" eval 'usage_fails'
run create t --rows 10 --row-bytes 0
check "create --row-bytes 0 -> 2" eval 'usage_fails'
run create t --rows 10 --row-bytes 16777217
check "create --row-bytes too big -> 2" eval 'usage_fails'
run create t --rows 10 --row-bytes 8 --pitch 4
check "create --pitch < row bytes -> 2" eval 'usage_fails'
run create t --rows 18446744073709551615 --row-bytes 16
check "create of an impossible size -> 2" eval 'usage_fails'
run create t --rows 10 --row-bytes 4 --fill bogus
check "create --fill bogus -> 2" eval 'usage_fails && err_has "bogus"'
run create t --rows 10 --rows 11 --row-bytes 4
check "repeated option -> 2" eval 'usage_fails && err_has "twice"'
run create t --rows
check "option without value -> 2" eval 'usage_fails && err_has "value"'
run ls --json=yes
check "flag with a value -> 2" eval 'usage_fails'
run create 'bad/name' --rows 10 --row-bytes 4
check "invalid table name -> 2" eval 'usage_fails && err_has "bad/name"'
run create .hidden --rows 10 --row-bytes 4
check "table name starting with . -> 2" eval 'usage_fails'
run --ns ../up ls
check "invalid namespace -> 2" eval 'usage_fails'
run create a b --rows 10 --row-bytes 4
check "extra positional -> 2" eval 'usage_fails && err_has "unexpected"'
run info
check "info without a name -> 2" eval 'usage_fails'
run lookup t
check "lookup without ids -> 2" eval 'usage_fails'
run lookup t 1 x2
check "lookup of a non-numeric id -> 2" eval 'usage_fails && err_has "x2"'
run lookup t 1 --offset 1.5
check "lookup --offset 1.5 -> 2" eval 'usage_fails'
# Numbers that are numbers, but too large: "out of range", not "not a number".
run lookup t 9223372036854775807 9223372036854775808
check "lookup of an id above INT64_MAX -> 2, out of range" \
    eval 'usage_fails && err_has "9223372036854775808. is out of range" && ! err_has "not a decimal"'
run lookup t -9223372036854775809
check "lookup of an id below INT64_MIN -> 2, out of range" \
    eval 'usage_fails && err_has "out of range" && ! err_has "not a decimal"'
run lookup t 1 --offset 99999999999999999999
check "lookup --offset beyond int64 -> 2, out of range" \
    eval 'usage_fails && err_has "offset.*out of range" && ! err_has "not a decimal"'
run create t --rows 18446744073709551616 --row-bytes 4
check "create --rows beyond uint64 -> 2, out of range" \
    eval 'usage_fails && err_has "rows.*out of range" && ! err_has "not a non-negative"'
run verify
check "verify without names -> 2" eval 'usage_fails'
run verify --all t
check "verify --all with names -> 2" eval 'usage_fails'
run rm
check "rm without names -> 2" eval 'usage_fails'
run bench t --iters 0
check "bench --iters 0 -> 2" eval 'usage_fails'
run demo --tokens 0
check "demo --tokens 0 -> 2" eval 'usage_fails'
run demo extra
check "demo with an argument -> 2" eval 'usage_fails'
check "usage errors created nothing" eval '[ ! -e "$NS_DIR/t" ] && [ ! -e "$NS_DIR/a" ]'

# ---------------------------------------------------------------------------
# ls before anything exists: an error naming the missing root, not an empty
# listing.
run ls
check "ls of a missing root -> 1, naming it" eval 'fails_with 1 "root directory $ROOT does not exist" && [ ! -s out ]'
run ls --json
check "ls --json of a missing root -> 1, no JSON" eval 'fails_with 1 "does not exist" && [ ! -s out ]'

# ---------------------------------------------------------------------------
# create + ls + info + lookup, with pattern bytes computed independently.
run create t --rows 10 --row-bytes 12
check "create t says what it made" eval 'rc_is 0 && err_empty && out_is "created t: 10 rows of 12 bytes (120 B)"'
check "table file exists" test -f "$NS_DIR/t"
run ls
check "ls lists t" eval 'rc_is 0 && out_is "NAME          ROWS  ROW_BYTES      PITCH  SIZE
t               10         12         12  120 B"'
# A mistyped namespace: an error naming the path, with the closest name.
run --ns defualt ls
check "ls of a mistyped namespace -> 1, did you mean" eval 'fails_with 1 "namespace .defualt. does not exist in $ROOT; did you mean .default.?" && [ ! -s out ]'
run --ns zzzzzzzz lookup t 0
check "any command on a missing namespace -> 1, naming those there" eval 'fails_with 1 "lookup: namespace .zzzzzzzz. does not exist in $ROOT (namespaces there: .default.)"'
run lookup t 0 3 9
check "lookup pattern rows" eval 'rc_is 0 && out_is "0: 00 00 00 00 00 00 00 00 26 5a 2e 4e
3: 03 00 00 00 00 00 00 00 0d ea 38 b7
9: 09 00 00 00 00 00 00 00 4f b1 67 c9"'
run lookup t 9 -1 0
check "lookup with a dead id" eval 'rc_is 0 && out_is "9: 09 00 00 00 00 00 00 00 4f b1 67 c9
-1: dead
0: 00 00 00 00 00 00 00 00 26 5a 2e 4e"'
run lookup t -1 --zero-dead
check "lookup --zero-dead" eval 'rc_is 0 && out_is "-1: 00 00 00 00 00 00 00 00 00 00 00 00"'
run lookup t 103 -1 --offset 100
check "lookup --offset" eval 'rc_is 0 && out_is "103: 03 00 00 00 00 00 00 00 0d ea 38 b7
-1: dead"'
run lookup --offset=100 t 109
check "lookup --offset=V before the name" eval 'rc_is 0 && out_is "109: 09 00 00 00 00 00 00 00 4f b1 67 c9"'
run lookup t 3 3
check "lookup repeats ids" eval 'rc_is 0 && [ "$(grep -c "^3: 03" out)" -eq 2 ]'
LAST="engram lookup t 0 --root ROOT (global option after the command)"
"$ENGRAM_BIN" lookup t 0 --root "$ROOT" --ns default >out 2>err
rc=$?
check "global options after the command" eval 'rc_is 0 && out_is "0: 00 00 00 00 00 00 00 00 26 5a 2e 4e"'

# Bad ids: the library's message names the position and the value.
run lookup t 0 10
check "lookup of id 10 in a 10-row table -> 1" eval 'fails_with 1 "\[1\]" && err_has "10" && [ ! -s out ]'
run lookup t -5
check "lookup of id -5 -> 1" eval 'fails_with 1 "-5"'
run lookup t 5 --offset 6
check "lookup of an id below --offset -> 1" eval 'fails_with 1 "5"'
# id - offset is exact, never taken modulo 2^64: INT64_MIN is 2^64 - 1
# below the offset INT64_MAX, not row 1 of t (10 rows).
run lookup t -9223372036854775808 --offset 9223372036854775807
check "lookup of INT64_MIN with --offset INT64_MAX -> 1" \
    eval 'fails_with 1 "ids.0..0. = -9223372036854775808 minus offset 9223372036854775807" && [ ! -s out ]'
run lookup t 9223372036854775807 -9223372036854775800 --offset 9223372036854775807
check "lookup of INT64_MIN + 8 with --offset INT64_MAX (not row 9) -> 1" \
    eval 'fails_with 1 "ids.1..0. = -9223372036854775800" && [ ! -s out ]'
run lookup t 9223372036854775807 -1 --offset 9223372036854775807
check "lookup of INT64_MAX with --offset INT64_MAX is row 0" eval 'rc_is 0 && out_is "9223372036854775807: 00 00 00 00 00 00 00 00 26 5a 2e 4e
-1: dead"'
run lookup t -9223372036854775808 -9223372036854775799 --offset -9223372036854775808
check "lookup with --offset INT64_MIN: rows 0 and 9" eval 'rc_is 0 && out_is "-9223372036854775808: 00 00 00 00 00 00 00 00 26 5a 2e 4e
-9223372036854775799: 09 00 00 00 00 00 00 00 4f b1 67 c9"'
run lookup t -9223372036854775798 --offset -9223372036854775808
check "lookup of INT64_MIN + 10 with --offset INT64_MIN -> 1" eval 'fails_with 1 "-9223372036854775798" && [ ! -s out ]'
run lookup t 9223372036854775807 --offset -1
check "lookup of INT64_MAX with --offset -1 -> 1" eval 'fails_with 1 "9223372036854775807 minus offset -1"'
run lookup nosuch 0
check "lookup of a missing table -> 1" eval 'fails_with 1 "nosuch"'

# A larger table streamed in several chunks, with a seed; rows on both sides
# of the first 8 MiB chunk boundary (419430 rows of 20 bytes) are checked.
run create s7 --rows 500000 --row-bytes 20 --seed 7
check "create s7 (several chunks)" eval 'rc_is 0'
run lookup s7 0 5 419429 419430 499999
check "lookup s7 across chunk boundaries" eval 'rc_is 0 && out_is "0: 00 00 00 00 00 00 00 00 6d 4a 33 20 72 3e a6 9d cf 5c 7e 1c
5: 05 00 00 00 00 00 00 00 ae c8 4a 39 ca 9b 3e 03 78 ed 94 79
419429: 65 66 06 00 00 00 00 00 d6 e2 9e 85 95 41 e4 d4 2d f5 19 24
419430: 66 66 06 00 00 00 00 00 35 d5 28 7c 68 3c 7b 73 55 62 c8 fa
499999: 1f a1 07 00 00 00 00 00 1e e6 e4 a4 90 62 77 b5 e3 9b 67 f3"'

# Imports bigger than one 8 MiB chunk: s7's rows cut out of its table file
# (which ends exactly at data_offset + data_size), as a raw file and behind
# a hand-made .npy header; both must read back as s7 does.
run info s7 --json
S7_OFF=$(sed -n 's/^ *"data_offset": \([0-9][0-9]*\),$/\1/p' out)
tail -c +$((S7_OFF + 1)) "$NS_DIR/s7" >s7.raw
check "s7 rows cut out of the table file" eval '[ "$(wc -c <s7.raw)" -eq 10000000 ]'
run import s7raw s7.raw --row-bytes 20
check "import of a 10 MB raw file" eval 'rc_is 0 && out_is "imported s7raw: 500000 rows of 20 bytes from s7.raw"'
check "import: no progress lines when short and not on a terminal" err_empty
make_npy s7.npy 1 "{'descr': '|u1', 'fortran_order': False, 'shape': (500000, 20), }" ''
cat s7.raw >>s7.npy
# Progress when stderr is not a terminal: plain lines (here at every
# step: ENGRAM_PROGRESS_SECS=0), then a final one; stdout is not mixed in.
LAST="ENGRAM_PROGRESS_SECS=0 engram import s7npy s7.npy 2>file"
ENGRAM_PROGRESS_SECS=0 "$ENGRAM_BIN" --root "$ROOT" import s7npy s7.npy >out 2>err
rc=$?
check "import of a 10 MB .npy file" eval 'rc_is 0 && out_is "imported s7npy: 500000 rows of 20 bytes from s7.npy"'
check "non-terminal progress: a plain line per step (8 MiB chunks of 9.54 MiB)" \
    eval '[ "$(grep -c "^import s7npy: *[0-9]*%, [0-9.]* [KMG]*i*B / 9.54 MiB, [0-9.]* [KMG]*i*B/s, ETA " err)" -eq 2 ]'
check "non-terminal progress: percentages in order, ending at 100%" \
    eval '[ "$(sed -n "s/^import s7npy: *\([0-9]*\)%.*/\1/p" err | tr "\n" " ")" = "83 100 " ]'
check "non-terminal progress: a final line" eval 'tail -n 1 err | grep -q "^import s7npy: done, 9.54 MiB in [0-9.]*[smh].* ([0-9.]* [KMG]*i*B/s)$"'
check "non-terminal progress: no terminal control characters" eval '! grep -q "$(printf "\r")" err && ! grep -q "$(printf "\033")" err'
LAST="ENGRAM_PROGRESS_SECS=soon engram verify s7npy"
ENGRAM_PROGRESS_SECS=soon "$ENGRAM_BIN" --root "$ROOT" verify s7npy >out 2>err
rc=$?
check "a bad ENGRAM_PROGRESS_SECS is a warning, once" eval 'rc_is 0 && out_is "s7npy: OK" && [ "$(grep -c "^engram: warning: ENGRAM_PROGRESS_SECS=.soon. is not a number" err)" -eq 1 ]'
run lookup s7 0 419429 419430 499999
cp out s7.out
run lookup s7raw 0 419429 419430 499999
check "raw import reads back across chunks" eval 'rc_is 0 && cmp -s s7.out out'
run lookup s7npy 0 419429 419430 499999
check ".npy import reads back across chunks" eval 'rc_is 0 && cmp -s s7.out out'
rm -f s7.raw s7.npy
run rm s7raw s7npy
check "rm says what it removed" eval 'rc_is 0 && out_is "removed s7raw
removed s7npy"'

# Pitch, zero and random fills.
run create p --rows 4 --row-bytes 5 --pitch 8
check "create with --pitch" eval 'rc_is 0'
run info p
check "info shows the pitch" eval 'rc_is 0 && out_has "^row_pitch  *8$" && out_has "^data_size  *32 "'
run lookup p 1 3
check "lookup with a pitch" eval 'rc_is 0 && out_is "1: 01 00 00 00 00
3: 03 00 00 00 00"'
run create z --rows 3 --row-bytes 4 --fill zero
run lookup z 2
check "zero fill" eval 'rc_is 0 && out_is "2: 00 00 00 00"'
run create r1 --rows 100 --row-bytes 16 --fill random --seed 42
run create r2 --rows 100 --row-bytes 16 --fill random --seed 42
run create r3 --rows 100 --row-bytes 16 --fill random --seed 43
run lookup r1 0 57
check "lookup of a random table" eval 'rc_is 0 && [ "$(grep -c -e "^0: [0-9a-f][0-9a-f] " -e "^57: [0-9a-f][0-9a-f] " out)" -eq 2 ]'
cp out r1.out
run lookup r2 0 57
check "random fill is reproducible from the seed" cmp -s r1.out out
run lookup r3 0 57
check "random fill depends on the seed" eval '! cmp -s r1.out out'
check "random fill is not the pattern" eval '! grep -q "^57: 39 00 00 00 00 00 00 00" r1.out'

# Create-only.
run create t --rows 10 --row-bytes 12
check "create of an existing name -> 1 (exists)" eval 'fails_with 1 "exist"'
run lookup t 3
check "the existing table is intact" eval 'rc_is 0 && out_is "3: 03 00 00 00 00 00 00 00 0d ea 38 b7"'

# info, info --json, info --map.
run info t
check "info t" eval 'rc_is 0 && out_has "^num_rows  *10$" && out_has "^row_bytes  *12$" && out_has "^kind  *file$" && out_has "^checksum  *xxh3-64:[0-9a-f]\{16\}$" && out_has "^mapped  *no$"'
run info t --map
check "info --map maps the table" eval 'rc_is 0 && out_has "^mapped  *yes$"'
run info t --json
check "info --json fields" eval 'rc_is 0 && out_has "\"num_rows\": 10," && out_has "\"row_pitch\": 12," && out_has "\"kind\": \"file\","'
OFF=$(sed -n 's/^ *"data_offset": \([0-9][0-9]*\),$/\1/p' out)
check "info --json has a data_offset" eval '[ -n "$OFF" ] && [ "$OFF" -gt 0 ]'
if [ "$HAVE_PY" = 1 ]; then
    check "info --json is valid JSON" json_ok
    check "info --json values" pycheck '
import json, sys
d = json.load(open("out"))
assert list(d)[0] == "schema" and d["schema"] == 1, d
assert d["name"] == "t" and d["num_rows"] == 10 and d["row_bytes"] == 12, d
assert d["data_size"] == 120 and d["data_offset"] % 4096 == 0, d
assert len(d["checksum"]) == 16 and d["mapped"] is False, d
'
    cp out info_t.json
    run info p --json
    cp out info_p.json
    run ls --json
    check "ls --json is valid JSON" json_ok
    check "ls --json values" pycheck '
import json
j = json.load(open("out"))
assert list(j) == ["schema", "root", "namespace", "tables", "skipped"], list(j)
assert j["schema"] == 1 and j["namespace"] == "default" and j["root"].endswith("/root"), j
assert j["skipped"] == [], j["skipped"]
d = {t["name"]: t for t in j["tables"]}
assert [t["name"] for t in j["tables"]] == ["p", "r1", "r2", "r3", "s7", "t", "z"], list(d)
assert d["t"] == {"name": "t", "kind": "file", "num_rows": 10, "row_bytes": 12, "row_pitch": 12,
                  "data_size": 120}, d["t"]
assert d["p"]["row_pitch"] == 8 and d["p"]["data_size"] == 32, d["p"]
'
    check "ls and info --json: one set of keys, the same values" pycheck '
import json
tables = {t["name"]: t for t in json.load(open("out"))["tables"]}
for name in ("t", "p"):
    info = json.load(open("info_%s.json" % name))
    for k, v in tables[name].items():
        assert k in info and info[k] == v, (name, k, v, info.get(k))
'
else
    skip_part "python3 not found: the JSON syntax checks"
fi
run info nosuch
check "info of a missing table -> 1" eval 'fails_with 1 "nosuch"'

# ---------------------------------------------------------------------------
# import: raw files.
printf "$DATA12" >raw12.bin
run import r raw12.bin --row-bytes 4
check "import raw" eval 'rc_is 0'
run lookup r 0 1 2
check "lookup imported raw rows" eval 'rc_is 0 && out_is "$HEX12"'
run import rp raw12.bin --row-bytes 6 --pitch 8
run lookup rp 1
check "import raw with a pitch" eval 'rc_is 0 && out_is "1: 07 08 09 0a 0b 0c"'
printf '\001\002\003\004\005\006\007\010\011\012' >raw10.bin
run import bad raw10.bin --row-bytes 4
check "raw size not a multiple -> 1" eval 'fails_with 1 "multiple"'
: >empty.bin
run import bad empty.bin --row-bytes 4
check "empty raw file -> 1" eval 'fails_with 1 "empty"'
run import bad raw12.bin
check "raw without --row-bytes -> 2" eval 'usage_fails && err_has "row-bytes"'
run import bad missing.bin --row-bytes 4
check "missing input file -> 1" eval 'fails_with 1 "missing.bin"'
run import bad "$SCRATCH" --row-bytes 4
check "directory as input -> 1" eval 'fails_with 1 "regular file"'
run import r raw12.bin --row-bytes 4
check "import of an existing name -> 1" eval 'fails_with 1 "exist"'

# import: hand-made .npy files.
make_npy v1.npy 1 "{'descr': '|u1', 'fortran_order': False, 'shape': (3, 4), }" "$DATA12"
run import n1 v1.npy
check "import .npy v1" eval 'rc_is 0'
run lookup n1 0 1 2
check "lookup .npy v1 rows" eval 'rc_is 0 && out_is "$HEX12"'
make_npy v2.npy 2 "{'descr': '<u1', 'fortran_order': False, 'shape': (2, 6)}" "$DATA12"
run import n2 v2.npy --row-bytes 6
check "import .npy v2 ('<u1', --row-bytes matching)" eval 'rc_is 0'
run lookup n2 1
check "lookup .npy v2 rows" eval 'rc_is 0 && out_is "1: 07 08 09 0a 0b 0c"'
make_npy v3.npy 3 '{"shape": (6,2), "fortran_order": False, "descr": "u1"}' "$DATA12"
run import n3 v3.npy
check "import .npy v3 (other key order, 'u1')" eval 'rc_is 0'
run lookup n3 5
check "lookup .npy v3 rows" eval 'rc_is 0 && out_is "5: 0b 0c"'
run import bad v1.npy --row-bytes 3
check ".npy with a different --row-bytes -> 1" eval 'fails_with 1 "row-bytes"'

# Any plain dtype and shape: a row is the bytes of one entry of the first
# dimension, as stored.
make_npy f4.npy 1 "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 1), }" "$DATA12"
run import f4 f4.npy
check "import .npy of dtype <f4 (rows of 4 bytes)" eval 'rc_is 0'
run lookup f4 0 1 2
check "lookup .npy <f4 rows: the bytes as stored" eval 'rc_is 0 && out_is "$HEX12"'
make_npy d3.npy 1 "{'descr': '>i2', 'fortran_order': False, 'shape': (2, 3, 1), }" "$DATA12"
run import d3 d3.npy --row-bytes 6
check "import .npy 3-D >i2 (2, 3, 1): rows of 6 bytes" eval 'rc_is 0'
run lookup d3 1
check "lookup .npy 3-D rows" eval 'rc_is 0 && out_is "1: 07 08 09 0a 0b 0c"'
make_npy d1.npy 1 "{'descr': '|V3', 'fortran_order': False, 'shape': (4,), }" "$DATA12"
run import d1 d1.npy
check "import .npy 1-D |V3: rows of one 3-byte element" eval 'rc_is 0'
run lookup d1 3
check "lookup .npy 1-D rows" eval 'rc_is 0 && out_is "3: 0a 0b 0c"'
make_npy dt.npy 1 "{'descr': '<M8[ns]', 'fortran_order': False, 'shape': (1, 1), }" '\001\002\003\004\005\006\007\010'
run import dt dt.npy
check "import .npy datetime64[ns]" eval 'rc_is 0'
make_npy du.npy 1 "{'descr': '<M8[n8AO3]', 'fortran_order': False, 'shape': (1, 1), }" '\001\002\003\004\005\006\007\010'
run import bad du.npy
check ".npy datetime64 of an unknown unit -> 1" eval 'fails_with 1 "M8\[n8AO3\]"'
make_npy ob.npy 1 "{'descr': '|O', 'fortran_order': False, 'shape': (3, 1), }" "$DATA12"
run import bad ob.npy
check ".npy object dtype -> 1" eval 'fails_with 1 "object arrays hold pointers"'
make_npy f3.npy 1 "{'descr': '<f3', 'fortran_order': False, 'shape': (4, 1), }" "$DATA12"
run import bad f3.npy
check ".npy dtype <f3 -> 1" eval 'fails_with 1 "<f3"'
make_npy sc.npy 1 "{'descr': '|u1', 'fortran_order': False, 'shape': (), }" '\001'
run import bad sc.npy
check ".npy 0-D shape -> 1" eval 'fails_with 1 "scalar"'
make_npy d4.npy 1 "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }" "$DATA12"
run import bad d4.npy
check ".npy <f4 (3, 2) of 12 bytes -> 1 (truncated)" eval 'fails_with 1 "3 rows of 8 bytes"'
make_npy fo.npy 1 "{'descr': '|u1', 'fortran_order': True, 'shape': (3, 4), }" "$DATA12"
run import bad fo.npy
check ".npy fortran_order True -> 1" eval 'fails_with 1 "fortran"'
make_npy tr.npy 1 "{'descr': '|u1', 'fortran_order': False, 'shape': (3, 4), }" '\001\002\003\004\005\006\007\010\011\012'
run import bad tr.npy
check ".npy truncated data -> 1" eval 'fails_with 1 "truncated"'
make_npy ex.npy 1 "{'descr': '|u1', 'fortran_order': False, 'shape': (3, 4), }" "$DATA12\\001"
run import bad ex.npy
check ".npy with trailing bytes -> 1" eval 'fails_with 1 "after"'
make_npy st.npy 1 "{'descr': [('a', '|u1')], 'fortran_order': False, 'shape': (3, 4), }" "$DATA12"
run import bad st.npy
check ".npy structured dtype -> 1" eval 'fails_with 1 "structured"'
make_npy ek.npy 1 "{'descr': '|u1', 'fortran_order': False, 'shape': (3, 4), 'x': 1}" "$DATA12"
run import bad ek.npy
check ".npy extra key -> 1" eval 'fails_with 1 "x"'
make_npy dk.npy 1 "{'descr': '|u1', 'descr': '|u1', 'fortran_order': False, 'shape': (3, 4)}" "$DATA12"
run import bad dk.npy
check ".npy repeated key -> 1" eval 'fails_with 1 "descr"'
make_npy mk.npy 1 "{'descr': '|u1', 'shape': (3, 4)}" "$DATA12"
run import bad mk.npy
check ".npy missing key -> 1" eval 'fails_with 1 "fortran_order"'
make_npy z0.npy 1 "{'descr': '|u1', 'fortran_order': False, 'shape': (0, 4), }" ''
run import bad z0.npy
check ".npy with no rows -> 1" eval 'fails_with 1 "empty"'
make_npy big.npy 1 "{'descr': '|u1', 'fortran_order': False, 'shape': (99999999999999999999, 4), }" "$DATA12"
run import bad big.npy
check ".npy dimension overflow -> 1" eval 'fails_with 1 "large"'
make_npy sx.npy 1 "{'descr': '|u1', 'fortran_order': False, 'shape': (3, 4), } x" "$DATA12"
run import bad sx.npy
check ".npy junk after the dict -> 1" eval 'fails_with 1 "after"'
make_npy qs.npy 1 "{'descr': '|u1, 'fortran_order': False, 'shape': (3, 4)}" "$DATA12"
run import bad qs.npy
check ".npy unbalanced quotes -> 1" eval 'fails_with 1 "npy"'
{ printf '\223NUMPY\011\000\100\000'; printf "$DATA12"; } >ver.npy
run import bad ver.npy
check ".npy version 9 -> 1" eval 'fails_with 1 "version"'
{ printf '\223NUMPY\001\000\377\177'; printf "{'descr': '|u1'"; } >hl.npy
run import bad hl.npy
check ".npy header length beyond the file -> 1" eval 'fails_with 1 "truncated"'
{ printf '\223NUMPY\002\000\000\000\000\001'; printf "$DATA12"; } >hx.npy
run import bad hx.npy
check ".npy v2 header length too large -> 1" eval 'fails_with 1 "header length"'
printf '\223NUMPY\001' >pre.npy
run import bad pre.npy
check ".npy truncated preamble -> 1" eval 'fails_with 1 "truncated"'
run ls
check "failed imports created no table" eval 'rc_is 0 && out_has "^n1 " && out_lacks "^bad "'
check "failed imports left no file" eval '[ ! -e "$NS_DIR/bad" ]'

# import: files written by numpy itself.
if [ "$HAVE_NUMPY" = 1 ]; then
    "$PY" -c '
import numpy as np
a = (np.arange(35, dtype=np.uint32) * 37 % 256).astype(np.uint8).reshape(5, 7)
np.save("np1.npy", a)
with open("np2.npy", "wb") as f:
    np.lib.format.write_array(f, a, version=(2, 0))
np.save("npf4.npy", a.astype(np.float32))
np.save("npfo.npy", np.asfortranarray(a))
np.save("np3d.npy", a[:4, :6].reshape(2, 2, 6))
np.save("npi1.npy", a.astype(np.int8))
def expect(name, rows):
    with open(name, "w") as f:
        for i, r in enumerate(rows):
            f.write("%d: %s\n" % (i, " ".join("%02x" % b for b in r.tobytes())))
expect("np.expected", a)
expect("npf4.expected", a.astype(np.float32))
expect("np3d.expected", a[:4, :6].reshape(2, 2, 6))
'
    run import np1 np1.npy
    check "import numpy-saved .npy" eval 'rc_is 0'
    run lookup np1 0 1 2 3 4
    check "numpy .npy rows" cmp -s np.expected out
    run import np2 np2.npy
    run lookup np2 0 1 2 3 4
    check "numpy .npy format 2.0 rows" eval 'rc_is 0 && cmp -s np.expected out'
    run import npf4 npf4.npy
    run lookup npf4 0 1 2 3 4
    check "numpy float32 .npy: rows of 28 bytes as stored" eval 'rc_is 0 && cmp -s npf4.expected out'
    run import bad npfo.npy
    check "numpy Fortran-ordered .npy -> 1" eval 'fails_with 1 "fortran"'
    run import np3d np3d.npy
    run lookup np3d 0 1
    check "numpy 3-D .npy: rows of 12 bytes" eval 'rc_is 0 && cmp -s np3d.expected out'
    run import npi1 npi1.npy
    run lookup npi1 0 1 2 3 4
    check "numpy int8 .npy: the same bytes as uint8" eval 'rc_is 0 && cmp -s np.expected out'
else
    skip_part "numpy not found: the numpy-written .npy files"
fi

# ---------------------------------------------------------------------------
# verify, then corrupt one data byte.
run verify t s7
check "verify OK" eval 'rc_is 0 && out_is "t: OK
s7: OK"'
check "verify draws no progress bar when stderr is not a terminal" err_empty
run verify --all
check "verify --all OK" eval 'rc_is 0 && out_has "^t: OK$" && out_has "^r: OK$" && out_lacks "FAILED"'
if command -v script >/dev/null 2>&1 && script --version 2>/dev/null | grep -q util-linux; then
    LAST="script: engram verify s7 on a terminal"
    script -qec "\"$ENGRAM_BIN\" --root \"$ROOT\" verify s7" /dev/null >out 2>err </dev/null
    rc=$?
    check "verify on a terminal" eval 'rc_is 0 && out_has "s7: OK"'
    check "verify on a terminal draws a progress bar" out_has '100%'
    check "terminal progress shows bytes, rate and time left" \
        eval 'out_has "verify s7 \[#*\.*\] *[0-9]*%  [0-9.]* [KMG]*i*B / 9.54 MiB  [0-9.]* [KMG]*i*B/s  ETA "'
    check "terminal progress is one line redrawn, then erased" \
        eval '[ "$(grep -c "" out)" -eq 1 ] && grep -q "$(printf "\033\\[K\r\033\\[Ks7: OK")" out'
fi
F=$NS_DIR/t
chmod u+w "$F" 2>/dev/null
printf '\377' | dd of="$F" bs=1 seek="$OFF" conv=notrunc 2>/dev/null
run verify t
check "verify of a corrupted table -> 1" eval 'rc_is 1 && out_is "t: FAILED" && grep -q "^engram: verify" err'
run verify --all
check "verify --all reports the corrupted table" eval 'rc_is 1 && out_has "^t: FAILED$" && out_has "^s7: OK$"'
run verify nosuch
check "verify of a missing table -> 1" eval 'rc_is 1 && out_is "nosuch: FAILED"'

# ---------------------------------------------------------------------------
# rm.
run rm t z
check "rm t z" eval 'rc_is 0'
run ls
check "ls after rm" eval 'rc_is 0 && out_lacks "^t " && out_lacks "^z " && out_has "^s7 "'
check "rm unlinked the file" eval '[ ! -e "$NS_DIR/t" ]'
run lookup t 0
check "lookup after rm -> 1" eval 'fails_with 1 "t"'
run rm t
check "rm of a missing table -> 1" eval 'fails_with 1 "t"'
run create t --rows 2 --row-bytes 3
check "a removed name can be created again" eval 'rc_is 0'
run lookup t 1
check "the new table is served" eval 'rc_is 0 && out_is "1: 01 00 00"'

# Namespaces are separate.
run --ns other create t --rows 1 --row-bytes 1
run --ns other ls
check "another namespace holds only its own tables" eval 'rc_is 0 && out_has "^t " && out_lacks "^s7 "'
run --ns other lookup t 0
check "same name in another namespace" eval 'rc_is 0 && out_is "0: 00"'

# ---------------------------------------------------------------------------
# A stray entry in the namespace: ls lists the tables, warns about the
# entry on stderr and exits 0, or 1 with --strict.
printf 'not a table\n' >"$NS_DIR/notes.txt"
run ls
check "ls with a stray file lists the tables, exit 0" eval 'rc_is 0 && out_has "^s7 " && out_lacks "notes"'
check "ls with a stray file warns, labelled as a warning" \
    eval '[ "$(wc -l <err)" -eq 1 ] && grep -q "^engram: warning: skipped .notes.txt. in $NS_DIR: .*header" err && ! err_has "info"'
run ls --strict
check "ls --strict with a stray file -> 1" eval 'rc_is 1 && out_has "^s7 " && err_has "warning: skipped .notes.txt."'
run ls --json
check "ls --json with a stray file names it under skipped" eval 'rc_is 0 && err_has "warning"'
if [ "$HAVE_PY" = 1 ]; then
    check "ls --json skipped entry" pycheck '
import json
j = json.load(open("out"))
assert [s["name"] for s in j["skipped"]] == ["notes.txt"], j["skipped"]
assert "header" in j["skipped"][0]["reason"], j["skipped"]
assert "s7" in [t["name"] for t in j["tables"]], j
'
fi
rm -f "$NS_DIR/notes.txt"

# ---------------------------------------------------------------------------
# bench.
run bench s7 --ids 16 --iters 5
check "bench" eval 'rc_is 0 && out_has "memcpy" && out_has "ratios"'
run bench s7 r1 --ids 4 --iters 3
check "bench of tables with different row sizes -> 1" eval 'fails_with 1 "row size"'
run bench n1 r --cols 4 --ids 8 --iters 3 --threads 2 --json
check "bench --cols --json" eval 'rc_is 0 && out_has "\"cols\": 4,"'
if [ "$HAVE_PY" = 1 ]; then
    check "bench --json is valid JSON" json_ok
    check "bench --json values" pycheck '
import json
d = json.load(open("out"))
assert list(d)[0] == "schema" and d["schema"] == 1, d
assert d["tables"] == ["n1", "r"] and d["ids"] == 8 and d["row_bytes"] == 4, d
for k in ("engram", "engram_1thread", "memcpy"):
    r = d["results"][k]
    assert r["iters"] == 3 and r["median_ns"] > 0 and r["p99_ns"] >= r["median_ns"], r
assert d["ratio_threads_vs_1thread"] > 0 and d["ratio_engram_vs_memcpy"] > 0, d
'
fi
run bench nosuch --iters 1
check "bench of a missing table -> 1" eval 'fails_with 1 "nosuch"'

# ---------------------------------------------------------------------------
# import --safetensors: checkpoints written byte by byte (8-byte little-endian
# header length, JSON header, data).  Weight row i is bytes 0x10+4i..0x13+4i,
# scale row i is 0xa0+2i, 0xa1+2i.
# make_st FILE JSON DATA: DATA is a printf format of octal escapes.
make_st() {
    _len=${#2}
    {
        printf "$(octal $((_len % 256)))$(octal $((_len / 256)))\000\000\000\000\000\000"
        printf '%s' "$2"
        printf "$3"
    } >"$1"
}
W16='\020\021\022\023\024\025\026\027\030\031\032\033\034\035\036\037'
S8='\240\241\242\243\244\245\246\247'
WS_JSON='{"w":{"dtype":"F8_E4M3","shape":[4,4],"data_offsets":[0,16]},"s":{"dtype":"F8_E8M0","shape":[4,2],"data_offsets":[16,24]}}'
make_st m.safetensors "$WS_JSON" "$W16$S8"
run import --safetensors m.safetensors --weight w --scale s st1
check "import --safetensors" eval 'rc_is 0 && out_has "verified"'
run lookup st1 0 3
check "safetensors rows are weight + scale, packed" eval 'rc_is 0 && out_is "0: 10 11 12 13 a0 a1
3: 1c 1d 1e 1f a6 a7"'
run import --safetensors m.safetensors --weight w --scale s --rows 1:3 st2
check "import --safetensors --rows" eval 'rc_is 0'
run lookup st2 0 1
check "a row range starts at its first row" eval 'rc_is 0 && out_is "0: 14 15 16 17 a2 a3
1: 18 19 1a 1b a4 a5"'
run import --safetensors m.safetensors --weight w st3
run lookup st3 2
check "import of weights only" eval 'rc_is 0 && out_is "2: 18 19 1a 1b"'
# Sharded: the weight and the scale in two files named by an index.
make_st shard-1.safetensors '{"w":{"dtype":"F8_E4M3","shape":[4,4],"data_offsets":[0,16]}}' "$W16"
make_st shard-2.safetensors '{"s":{"dtype":"F8_E8M0","shape":[4,2],"data_offsets":[0,8]}}' "$S8"
printf '{"metadata":{},"weight_map":{"w":"shard-1.safetensors","s":"shard-2.safetensors"}}' \
    >model.safetensors.index.json
run import --safetensors model.safetensors.index.json --weight w --scale s st4
run lookup st4 3
check "import from a sharded checkpoint" eval 'rc_is 0 && out_is "3: 1c 1d 1e 1f a6 a7"'
# Bad inputs.
run import --safetensors m.safetensors st5
check "import --safetensors without --weight -> 2" usage_fails
run import st5 m.safetensors --weight w
check "--weight without --safetensors -> 2" usage_fails
run import --safetensors m.safetensors --weight w --rows 3:9 st5
check "import --rows outside the tensor -> 1" eval 'fails_with 1 "not within"'
run import --safetensors m.safetensors --weight w --scale nope st5
check "import of a missing tensor -> 1" eval 'fails_with 1 "no tensor .nope."'
make_st bad.safetensors '{"w":{"dtype":"F8_E4M3","shape":[4,4],"data_offsets":[0,16]}' "$W16"
run import --safetensors bad.safetensors --weight w st5
check "import of a header that is not JSON -> 1" eval 'fails_with 1 "not valid JSON"'
make_st short.safetensors "$WS_JSON" "$W16"
run import --safetensors short.safetensors --weight w st5
check "import of a truncated checkpoint -> 1" eval 'fails_with 1 "truncated"'
run ls
check "failed imports published nothing" eval 'rc_is 0 && out_lacks "st5"'

# A checkpoint path swapped between the check of its header and the reading
# of its rows (anyone who can write its directory can): the rows imported
# are those of the file checked, and a FIFO put at the path never blocks.
# run_timed ARGS...: like run, killed after 20 s (rc 124: a hang).  With
# SWAP_PATH and SWAP_WITH set and tests/cli/swap_open.c preloaded, the file
# SWAP_WITH is renamed over SWAP_PATH right after the first open of it.
run_timed() {
    LAST="engram $*${SWAP_PATH:+ (with $SWAP_WITH renamed over $SWAP_PATH after its first open)}"
    if [ -n "${SWAP_PATH:-}" ]; then
        ENGRAM_SWAP_PATH=$SWAP_PATH ENGRAM_SWAP_WITH=$SWAP_WITH LD_PRELOAD=$ENGRAM_SWAP_SHIM \
            ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" \
            timeout 20 "$ENGRAM_BIN" --root "$ROOT" "$@" >out 2>err
    else
        timeout 20 "$ENGRAM_BIN" --root "$ROOT" "$@" >out 2>err
    fi
    rc=$?
}
W16B='\160\161\162\163\164\165\166\167\170\171\172\173\174\175\176\177'
W_JSON='{"w":{"dtype":"F8_E4M3","shape":[4,4],"data_offsets":[0,16]}}'
mkfifo fifo-a fifo-b fifo-c fifo-d
# A FIFO at the checkpoint's path, or at the shard an index names.
SWAP_PATH=
run_timed import --safetensors fifo-a --weight w swbad
check "import of a FIFO -> 1, no hang" eval 'fails_with 1 "not a regular file"'
printf '{"weight_map":{"w":"fifo-a"}}' >fifo.safetensors.index.json
run_timed import --safetensors fifo.safetensors.index.json --weight w swbad
check "import of a shard that is a FIFO -> 1, no hang" eval 'fails_with 1 "not a regular file"'
if [ -n "${ENGRAM_SWAP_SHIM:-}" ]; then
    make_st sw1.safetensors "$W_JSON" "$W16"
    SWAP_PATH=sw1.safetensors SWAP_WITH=fifo-b
    run_timed import --safetensors sw1.safetensors --weight w swt1
    check "a FIFO swapped in after the check: the checked file is imported" \
        eval 'rc_is 0 && out_has "verified" && [ -p sw1.safetensors ]'
    make_st sw2.safetensors "$W_JSON" "$W16"
    make_st other.safetensors "$W_JSON" "$W16B"
    SWAP_PATH=sw2.safetensors SWAP_WITH=other.safetensors
    run_timed import --safetensors sw2.safetensors --weight w swt2
    check "another file swapped in after the check: the checked file is imported" \
        eval 'rc_is 0 && out_has "verified" && [ ! -e other.safetensors ]'
    SWAP_PATH=
    run lookup swt1 0 3
    check "rows of the file checked (FIFO swapped in)" eval 'rc_is 0 && out_is "0: 10 11 12 13
3: 1c 1d 1e 1f"'
    run lookup swt2 0 3
    check "rows of the file checked (other file swapped in)" eval 'rc_is 0 && out_is "0: 10 11 12 13
3: 1c 1d 1e 1f"'
    # A weight and a scale in one file: both read from one open of it.
    make_st sw4.safetensors "$WS_JSON" "$W16$S8"
    SWAP_PATH=sw4.safetensors SWAP_WITH=fifo-d
    run_timed import --safetensors sw4.safetensors --weight w --scale s swt4
    check "weight and scale of one file: one open, the checked file imported" \
        eval 'rc_is 0 && out_has "verified" && [ -p sw4.safetensors ]'
    SWAP_PATH=
    run lookup swt4 0 3
    check "rows of the file checked (weight + scale)" eval 'rc_is 0 && out_is "0: 10 11 12 13 a0 a1
3: 1c 1d 1e 1f a6 a7"'
    # Through an index, the shard is looked at once to find it, then opened
    # once to be read: a FIFO swapped in between is refused, not waited on.
    make_st sw3.safetensors "$W_JSON" "$W16"
    printf '{"weight_map":{"w":"sw3.safetensors"}}' >sw3.safetensors.index.json
    SWAP_PATH=sw3.safetensors SWAP_WITH=fifo-c
    run_timed import --safetensors sw3.safetensors.index.json --weight w swbad
    check "a FIFO swapped in at a shard -> 1, no hang" \
        eval 'fails_with 1 "not a regular file" && [ -p sw3.safetensors ]'
    SWAP_PATH=
else
    skip_part "ENGRAM_SWAP_SHIM not set: the swapped-checkpoint cases"
fi
run ls
check "no import of a FIFO published anything" eval 'rc_is 0 && out_lacks "swbad"'

# ---------------------------------------------------------------------------
# ENGRAM_ROOT: the default root when --root is not given.
run_env() { # VALUE ARGS...: engram with ENGRAM_ROOT=VALUE and no --root
    _v=$1
    shift
    LAST="ENGRAM_ROOT=$_v engram $*"
    ENGRAM_ROOT=$_v "$ENGRAM_BIN" "$@" >out 2>err
    rc=$?
}
run_env "$ROOT" lookup t 1
check "ENGRAM_ROOT is the default root" eval 'rc_is 0 && out_is "1: 01 00 00"'
run_env "$ROOT" --ns envns create e --rows 2 --row-bytes 2
check "ENGRAM_ROOT: create goes there" eval 'rc_is 0 && [ -f "$ROOT/envns/e" ]'
run_env "$SCRATCH/elsewhere" --root "$ROOT" lookup t 1
check "--root wins over ENGRAM_ROOT" eval 'rc_is 0 && out_is "1: 01 00 00"'
run_env "$SCRATCH/elsewhere" lookup t 1
check "a missing ENGRAM_ROOT is named" eval 'fails_with 1 "root directory $SCRATCH/elsewhere does not exist"'
run_env "$ROOT" --help
check "--help shows the root ENGRAM_ROOT gives" eval 'rc_is 0 && out_has "^ *$ROOT)$"'
run_env "" --help
check "an empty ENGRAM_ROOT is the built-in default" eval 'rc_is 0 && out_has "^ *\(/dev/shm/engram\|/tmp/engram\))$"'

# ---------------------------------------------------------------------------
# ns ls, ns rm.
run ns ls
check "ns ls" eval 'rc_is 0 && out_has "^NAMESPACE  *TABLES  *SIZE  *USERS  *LAST USED$" && out_has "^default  *[0-9][0-9]*  " && out_has "^envns  *1  *4 B  *0  [0-9]* s ago$" && out_has "^other  *1  *1 B  *0  "'
run ns ls --json
check "ns ls --json" eval 'rc_is 0 && out_has "\"schema\": 1,"'
if [ "$HAVE_PY" = 1 ]; then
    check "ns ls --json values" pycheck '
import json, time
j = json.load(open("out"))
assert list(j) == ["schema", "root", "namespaces", "skipped"], list(j)
assert j["schema"] == 1 and j["skipped"] == [], j
d = {n["name"]: n for n in j["namespaces"]}
assert sorted(d) == ["default", "envns", "other"], sorted(d)
e = dict(d["envns"])
assert 0 < time.time() - e.pop("last_used") < 3600, d["envns"]
assert e == {"name": "envns", "tables": 1, "data_size": 4, "users": 0, "stale_leases": 0}, e
assert d["default"]["tables"] > 5, d["default"]
'
fi
# A namespace that cannot be opened (writable by others: not trusted).
mkdir -m 700 "$ROOT/opened"
chmod 777 "$ROOT/opened"
run ns ls
check "ns ls skips an untrusted namespace with a warning" \
    eval 'rc_is 0 && out_lacks "^opened" && grep -q "^engram: warning: skipped namespace .opened. in $ROOT: .*writable by group or others" err'
run ns ls --strict
check "ns ls --strict with a skipped namespace -> 1" eval 'rc_is 1 && out_has "^envns "'
run ns ls --json
if [ "$HAVE_PY" = 1 ]; then
    check "ns ls --json lists it under skipped" pycheck '
import json
j = json.load(open("out"))
assert [s["name"] for s in j["skipped"]] == ["opened"] and "writable" in j["skipped"][0]["reason"], j
'
fi
rmdir "$ROOT/opened"
# Usage errors.
run ns
check "ns without a subcommand -> 2" usage_fails
run ns frob
check "ns frob -> 2" eval 'usage_fails && err_has "frob"'
run ns rm
check "ns rm without names -> 2" usage_fails
run ns rm 'bad/name'
check "ns rm of an invalid name -> 2" eval 'usage_fails && err_has "bad/name"'
run ns ls --force
check "ns ls --force -> 2" usage_fails
run ns rm envns --json
check "ns rm --json -> 2" usage_fails
run --ns envns ns ls
check "--ns with ns -> 2" eval 'usage_fails && err_has "--ns"'
run ns ls extra
check "ns ls with an argument -> 2" eval 'usage_fails && err_has "extra"'
check "ns usage errors removed nothing" eval '[ -f "$ROOT/envns/e" ]'
# rm: refused while it holds tables, unless --force.
run ns rm envns
check "ns rm of a namespace with tables -> 1, kept" \
    eval 'fails_with 1 "holds 1 table; not removed (--force" && [ ! -s out ] && [ -f "$ROOT/envns/e" ]'
run ns rm envnss
check "ns rm of a mistyped namespace -> 1, did you mean" eval 'fails_with 1 "did you mean .envns.?"'
printf 'x' >"$ROOT/envns/keep.me"
run ns rm envns --force
check "ns rm --force with a foreign file -> 1, nothing removed" \
    eval 'fails_with 1 "keep.me., which is not an engram table" && [ -f "$ROOT/envns/e" ] && [ -f "$ROOT/envns/keep.me" ]'
rm -f "$ROOT/envns/keep.me"
run ns rm envns --force
check "ns rm --force" eval 'rc_is 0 && out_is "removed namespace envns (1 table)" && [ ! -e "$ROOT/envns" ]'
run --ns empty create x --rows 1 --row-bytes 1
run --ns empty rm x
run ns rm empty
check "ns rm of an empty namespace" eval 'rc_is 0 && out_is "removed namespace empty (0 tables)" && [ ! -e "$ROOT/empty" ]'
run --ns envns ls
check "ls of a removed namespace -> 1" eval 'fails_with 1 "envns"'

# A writer that hangs (a temporary file made and locked as writers do, by a
# process that then stops itself): `wait` gives up at its timeout naming it.
if [ "$HAVE_PY" = 1 ]; then
    run --ns hung create other --rows 1 --row-bytes 1
    "$PY" -c '
import fcntl, os, signal, sys
fd = os.open(os.path.join(sys.argv[1], ".tmp.h.%d.1a" % os.getpid()),
             os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("ready", flush=True)
while True:
    os.kill(os.getpid(), signal.SIGSTOP)
' "$ROOT/hung" >hung.out 2>&1 &
    hung=$!
    for _ in $(seq 200); do
        grep -q ready hung.out && break
        sleep 0.05
    done
    run --ns hung wait h --timeout 1
    check "wait on a writer that hangs -> 1, naming it" \
        eval 'fails_with 1 "was not published .* within 1000 ms: it is being written by pid $hung, which has held it for "'
    kill -9 "$hung"
    wait "$hung" 2>/dev/null
    run ns rm hung --force
    check "ns rm once the hung writer is killed" eval 'rc_is 0 && [ ! -e "$ROOT/hung" ]'
fi

# Users and gc: a process waiting on a namespace holds a lease on it.
run --ns inuse create t --rows 4 --row-bytes 4
"$ENGRAM_BIN" --root "$ROOT" --ns inuse wait never --timeout 60 >/dev/null 2>&1 &
waiter=$!
for _ in $(seq 100); do
    ls -a "$ROOT/inuse" | grep -q '^\.lease\.' && break
    sleep 0.05
done
run ns ls
check "ns ls counts a user" eval 'rc_is 0 && out_has "^inuse  *1  *16 B  *1  "'
run ns rm inuse
check "ns rm of a namespace with tables in use -> 1" eval 'fails_with 1 "holds 1 table"'
run --ns inuse rm t
run ns rm inuse
check "ns rm of a namespace in use -> 1, kept" \
    eval 'fails_with 1 "in use by 1 process (pid $waiter start [0-9]* command engram)" && [ -d "$ROOT/inuse" ]'
touch -d '3 days ago' "$ROOT/inuse" "$ROOT/inuse"/.lease.*
run gc --older-than 1h
check "gc keeps a namespace in use, however old" eval 'rc_is 0 && out_has "^kept inuse: in use (1 live lease: pid $waiter "'
kill -9 $waiter
wait $waiter 2>/dev/null
run ns ls --json
if [ "$HAVE_PY" = 1 ]; then
    check "ns ls --json counts a stale lease" pycheck '
import json
d = {n["name"]: n for n in json.load(open("out"))["namespaces"]}
assert d["inuse"]["users"] == 0 and d["inuse"]["stale_leases"] == 1, d["inuse"]
'
fi
touch -d '2 hours ago' "$ROOT/inuse"
run --ns gcnew create t --rows 4 --row-bytes 4
run gc --older-than 1h --dry-run
check "gc --dry-run says, removes nothing" \
    eval 'rc_is 0 && out_has "^would remove inuse: no live lease, last used [0-9]* s ago$" && out_has "^kept gcnew: used [0-9]* s ago$" && out_has "^would remove 1 namespace, kept " && [ -d "$ROOT/inuse" ]'
run gc --older-than 1h --json
if [ "$HAVE_PY" = 1 ]; then
    check "gc --json" pycheck '
import json
j = json.load(open("out"))
assert j["schema"] == 1 and j["older_than"] == 3600 and j["dry_run"] is False, j
d = {n["name"]: n["action"] for n in j["namespaces"]}
assert d["inuse"] == "removed" and d["gcnew"] == "kept", d
'
fi
check "gc removed the idle namespace, kept the new one" eval '[ ! -e "$ROOT/inuse" ] && [ -f "$ROOT/gcnew/t" ]'
run gc --older-than 5x
check "gc --older-than 5x -> 2" eval 'usage_fails && err_has "not a duration"'
run gc extra
check "gc with an argument -> 2" usage_fails
run --ns gcnew gc
check "gc --ns -> 2" eval 'usage_fails && err_has "--ns"'
run ns rm gcnew --force
# A FIFO named like a writer's temporary file is a stray entry, not a table
# being written; the summary counts the namespace it keeps.
run --ns gcfifo create t --rows 4 --row-bytes 4
mkfifo "$ROOT/gcfifo/.tmp.t.4242.abc"
touch -d '2 hours ago' "$ROOT/gcfifo"
run gc --older-than 1h
check "gc: a FIFO .tmp.* is a stray entry, named" \
    eval 'rc_is 0 && err_has "gcfifo.* kept: .*.tmp.t.4242.abc., which is not an engram table (a FIFO" && ! err_has "being written"'
check "gc: the summary counts the namespace the warning kept" \
    eval 'kept=$(grep -c "^kept " out); out_has "^removed 0 namespaces, kept $((kept + 1)) (1 of them for what the warning above says)$" && [ -f "$ROOT/gcfifo/t" ]'
run gc --older-than 1h --strict
check "gc --strict with a stray entry -> 1" eval 'rc_is 1 && out_has "(1 of them for what the warning above says)$"'
rm -f "$ROOT/gcfifo/.tmp.t.4242.abc"
run ns rm gcfifo --force
check "ns rm once the FIFO is gone" eval 'rc_is 0 && [ ! -e "$ROOT/gcfifo" ]'

# ---------------------------------------------------------------------------
# The README's shell block, as written (its root moved into the scratch
# directory): every command in it must work with what the README's two
# scripts install, so it is run where the python3 on PATH has no numpy
# (a python3 and python that fail come first on PATH).
if [ -f "${ENGRAM_SRC:-}/README.md" ]; then
    mkdir readme readme/nopy
    for _py in python3 python; do
        printf '#!/bin/sh\necho "ModuleNotFoundError: No module named numpy" >&2\nexit 1\n' >"readme/nopy/$_py"
        chmod +x "readme/nopy/$_py"
    done
    awk '/^## Use it from the shell/{s=1} s && /^```sh$/{on=1; next} on && /^```$/{exit} on' \
        "$ENGRAM_SRC/README.md" | sed -e "s|^e=build/release/engram|e=\"$ENGRAM_BIN\"|" \
        -e "s|/tmp/eng|$SCRATCH/readme-root|g" >readme/block.sh
    LAST="the README's shell block (readme/block.sh)"
    (cd readme && PATH="$SCRATCH/readme/nopy:$PATH" sh -e block.sh) >out 2>err
    rc=$?
    check "README shell block runs, without numpy" eval 'rc_is 0 && [ -s readme/block.sh ] && out_has "^created engram:l1:h0: 100003 rows of 264 bytes"'
    check "README shell block: its rows imported" eval 'out_has "^imported my-table: 1000 rows of 264 bytes from rows.bin$"'
    check "README shell block: the namespace is removed at the end" \
        eval 'out_has "^removed namespace demo (1 table)$" && [ ! -e "$SCRATCH/readme-root/demo" ]'
else
    skip_part "ENGRAM_SRC (the source tree) not found: the README's shell block"
fi

# ---------------------------------------------------------------------------
# plan, wait, mem: deploying tables to the ranks of a node.
run plan --head-vocab 101,103,107,109,113,127,131,137 --tp 2 --dp 2
check "plan head-wise per rank" eval 'rc_is 0 && out_has "^tp 1   dp 0   shard 2   heads 4-5  rows \[420, 660)$" && [ "$(grep -c "^tp " out)" -eq 4 ]'
run plan --head-vocab 101,103,107,109,113,127 --tp 2 --dp 2 --per-tp
check "plan --per-tp: DP peers share a shard" eval 'rc_is 0 && out_has "^tp 1   dp 1   shard 1   heads 3-5  rows \[311, 660)$"'
run plan --head-vocab 101,103,107,109,113,127 --tp 3 --reads 50,1,1,1,1,50 --balanced
check "plan --balanced cuts by reads" eval 'rc_is 0 && out_has "^tp 0   dp 0   shard 0   heads 0-0 .* reads 50$" && out_has "head-wise plan: 1.471$"'
run plan --head-vocab 1,2,3,4,5,6,7 --tp 6
check "plan refuses a shard without a head" eval 'fails_with 1 "without a head"'
run plan --head-vocab 1,2,3 --tp 4
check "plan refuses more shards than heads" eval 'fails_with 1 "needs 4 shards"'
run plan --head-vocab 5,6 --tp 4 --by-rows
check "plan --by-rows: more shards than heads" eval 'rc_is 0 && out_has "^tp 1   dp 0   shard 1   rows \[3, 6)  heads 0-1$" && out_has "^tp 3   dp 0   shard 3   rows \[9, 11)  heads 1-1$"'
run plan --head-vocab 5,6 --tp 12 --by-rows
check "plan --by-rows refuses a shard without a row" eval 'fails_with 1 "only 11 rows"'
run plan --head-vocab 5,6 --tp 2 --by-rows --balanced --reads 1,1
check "plan --by-rows --balanced -> usage" eval 'usage_fails'
if [ "$HAVE_PY" -eq 1 ]; then
    run plan --head-vocab 5,6 --tp 2 --dp 2 --by-rows --json
    check "plan --by-rows --json" eval 'rc_is 0 && pycheck "
import json; p = json.load(open(\"out\"))
assert p[\"plan\"] == \"row_wise\" and p[\"rows\"] == 11
assert [(s[\"row_start\"], s[\"row_end\"]) for s in p[\"shards\"]] == [(0, 3), (3, 6), (6, 9), (9, 11)]
assert p[\"ranks\"][2][\"shard\"] == 2 and p[\"ranks\"][2][\"row_start\"] == 6
"'
fi
run plan --head-vocab 1,2,x --tp 2
check "plan --head-vocab junk -> usage" eval 'usage_fails'
run plan --tp 2
check "plan without --head-vocab -> usage" eval 'usage_fails'
run plan --head-vocab 1,2 --tp 2 --balanced
check "plan --balanced without --reads -> usage" eval 'usage_fails'
run plan --head-vocab 1,2 --tp 2 --reads 1
check "plan --reads of the wrong length -> usage" eval 'usage_fails'
if [ "$HAVE_PY" -eq 1 ]; then
    run plan --head-vocab 5,6,7,8 --tp 2 --dp 2 --per-tp --layer-ids 1,14 --reads 9,1,1,9 --json
    check "plan --json" eval 'rc_is 0 && pycheck "
import json; p = json.load(open(\"out\"))
assert p[\"schema\"] == 1 and p[\"mode\"] == \"per_tp\" and p[\"plan\"] == \"head_wise\"
r = p[\"ranks\"][3]
assert (r[\"tp_rank\"], r[\"dp_rank\"], r[\"shard\"]) == (1, 1, 1)
l = r[\"layers\"][\"14\"]
assert l == {\"tables\": [\"engram:l14:h2\", \"engram:l14:h3\"], \"offsets\": [11, 18], \"row_start\": 11, \"row_end\": 26}, l
assert p[\"imbalance\"] == {\"head_wise\": 1.0, \"balanced\": 1.0}, p[\"imbalance\"]
"'
fi

run create waited --rows 3 --row-bytes 8
run wait waited --timeout 5
check "wait on a published table" eval 'rc_is 0 && out_is "waited: published"'
run wait never-made --timeout 1
check "wait --timeout passes -> 1" eval 'fails_with 1 "not published"'
( sleep 1; "$ENGRAM_BIN" --root "$ROOT" create late --rows 2 --row-bytes 8 >/dev/null 2>&1 ) &
run wait late --timeout 30
wait
check "wait wakes when another process publishes" eval 'rc_is 0 && out_is "late: published"'
run wait --timeout 1
check "wait without a name -> usage" eval 'usage_fails'

run mem waited
check "mem shows a table" eval 'rc_is 0 && out_has "^NAME " && out_has "^waited "'
# Whatever this user may not read here (other users' processes, a
# container's PID 1) maps none of it: no warning.
check "mem: no warning of processes that map none of the table" eval 'rc_is 0 && err_empty'
if [ "$HAVE_PY" -eq 1 ]; then
    run mem --json
    check "mem --json" eval 'rc_is 0 && pycheck "
import json; p = json.load(open(\"out\"))
assert p[\"schema\"] == 1
t = {x[\"name\"]: x for x in p[\"tables\"]}
assert t[\"waited\"][\"processes\"] == 0 and t[\"waited\"][\"file_bytes\"] > 0, t
assert t[\"waited\"][\"unreadable_may_map\"] is False, t
"'
fi
run mem missing-table
check "mem of a missing table -> 1" eval 'fails_with 1 "missing-table"'
run rm waited late

# mem and a process whose maps cannot be read: a mapper that is not
# dumpable may be read by a process of its own user only with
# CAP_SYS_PTRACE.  As root, the mapper and engram run as uid 65534
# (setpriv), in a root of theirs.
hidden_mem() {
    LAST="engram mem $*"
    $AS "$ENGRAM_BIN" --root "$HROOT" mem "$@" >out 2>err
    rc=$?
}
AS= HPY= HROOT=
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null 2>&1; then
    AS="setpriv --reuid=65534 --regid=65534 --clear-groups"
fi
if [ "$(id -u)" -ne 0 ] || [ -n "$AS" ]; then
    for _py in "$PY" /usr/bin/python3; do
        if $AS "$_py" -c 'import ctypes, mmap' >/dev/null 2>&1; then
            HPY=$_py
            break
        fi
    done
fi
if [ -z "$HPY" ]; then
    skip_part "mem with a process that cannot be read: no python3 (or, as root, setpriv) to run it"
else
    HROOT=$(mktemp -d "${TMPDIR:-/tmp}/engram-cli-hidden.XXXXXX")
    [ -z "$AS" ] || chown 65534:65534 "$HROOT"
    $AS "$ENGRAM_BIN" --root "$HROOT" create hidden --rows 4096 --row-bytes 256 >/dev/null 2>&1
    $AS "$ENGRAM_BIN" --root "$HROOT" create other --rows 4096 --row-bytes 256 >/dev/null 2>&1
    $AS mkfifo "$HROOT/go"
    # PR_SET_DUMPABLE is 4; the mapper reads every page of the table.
    $AS "$HPY" -c '
import ctypes, mmap, os, sys
assert ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) == 0
f = open(sys.argv[1], "rb")
m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
sum(m[i] for i in range(0, len(m), 4096))
print(os.getpid(), flush=True)
sys.stdin.readline()
' "$HROOT/default/hidden" <"$HROOT/go" >"$HROOT/pid" 2>/dev/null &
    exec 9>"$HROOT/go"
    for _i in $(seq 100); do
        [ -s "$HROOT/pid" ] && break
        sleep 0.1
    done
    HPID=$(cat "$HROOT/pid")
    if [ -z "$HPID" ]; then
        FAIL=$((FAIL + 1))
        echo "FAIL: mem: the mapper that cannot be read did not start"
    elif $AS cat "/proc/$HPID/maps" >/dev/null 2>&1; then
        skip_part "mem with a process that cannot be read: this user reads a process that is not dumpable"
    else
        hidden_mem hidden
        check "mem: a warning when a process that cannot be read maps the table" \
            eval 'rc_is 0 && out_has "^hidden " && err_has "processes could not be read .* and may map it"'
        hidden_mem other
        check "mem: no warning for a table it does not map" eval 'rc_is 0 && err_empty'
        if [ "$HAVE_PY" -eq 1 ]; then
            hidden_mem --json
            check "mem --json: unreadable_may_map" eval 'rc_is 0 && pycheck "
import json; t = {x[\"name\"]: x for x in json.load(open(\"out\"))[\"tables\"]}
assert t[\"hidden\"][\"unreadable\"] >= 1 and t[\"hidden\"][\"unreadable_may_map\"] is True, t
assert t[\"other\"][\"unreadable\"] >= 1 and t[\"other\"][\"unreadable_may_map\"] is False, t
"'
        fi
    fi
    exec 9>&-
    wait
    rm -rf "$HROOT"
fi

# ---------------------------------------------------------------------------
# NUMA placement: create/import on a node, of a GPU's node, interleaved;
# info shows the pages per node; numa-copy; refusals.  Placed writes need a
# tmpfs namespace, so these run under /dev/shm (the scratch root above may
# be on disk, where a placed write is refused: checked too).  This machine
# may have one node: what passes is node 0, what crosses nodes is not seen.
run create disk --rows 4 --row-bytes 8 --numa-node 0
if err_has "built without libnuma"; then
    check "create --numa-node without libnuma -> 1" eval 'fails_with 1 "libnuma"'
elif [ -d /dev/shm ] && SHM=$(mktemp -d /dev/shm/engram-cli-numa.XXXXXX); then
    # The root above is under TMPDIR; where that is not a tmpfs the
    # placement is refused.
    if [ "$(stat -f -c %T "$ROOT")" != tmpfs ]; then
        check "create --numa-node on a disk namespace -> 1" eval 'fails_with 1 "needs a tmpfs namespace"'
    fi
    NROOT="$ROOT"
    ROOT=$SHM
    run create placed --rows 1000 --row-bytes 264 --numa-node 0
    check "create --numa-node 0" eval 'rc_is 0 && out_has "^created placed"'
    run info placed
    check "info shows every page on node 0" eval 'rc_is 0 && out_has "^numa_placement    node 0: 65 pages (100.0%), all 65 pages counted$"'
    if [ "$HAVE_PY" -eq 1 ]; then
        run info placed --json
        check "info --json placement" eval 'rc_is 0 && pycheck "
import json; p = json.load(open(\"out\"))[\"placement\"]
assert p == {\"page_size\": 4096, \"pages\": 65, \"sampled\": 65, \"absent\": 0,
             \"other_nodes\": 0, \"private_copy\": False, \"nodes\": {\"0\": 65}}, p
"'
    fi
    run create inter --rows 100 --row-bytes 64 --interleave all
    check "create --interleave all" eval 'rc_is 0'
    run create inter0 --rows 100 --row-bytes 64 --interleave 0
    check "create --interleave 0" eval 'rc_is 0'
    printf "$DATA12" >numa.raw
    run import imported numa.raw --row-bytes 4 --numa-node 0
    check "import --numa-node 0" eval 'rc_is 0'
    run lookup imported 2
    check "imported rows are intact" eval 'rc_is 0 && out_is "2: 09 0a 0b 0c"'
    run info imported
    check "info of the imported table" eval 'rc_is 0 && out_has "^numa_placement    node 0: 1 pages (100.0%)"'
    # A GPU by PCI bus id: any device of this machine (one node: its own
    # node or -1, both mean node 0 here), and one that does not exist.
    DEV=$(ls /sys/bus/pci/devices 2>/dev/null | head -n 1)
    if [ -n "$DEV" ] && [ "$(ls /sys/devices/system/node | grep -c '^node[0-9]')" -eq 1 ]; then
        run create gpu --rows 10 --row-bytes 8 --numa-gpu "$DEV"
        check "create --numa-gpu $DEV" eval 'rc_is 0'
    fi
    run create nogpu --rows 10 --row-bytes 8 --numa-gpu 0000:fe:1f.7
    check "create --numa-gpu of no device -> 1" eval 'fails_with 1 "0000:fe:1f.7: no such PCI device"'
    run create badgpu --rows 10 --row-bytes 8 --numa-gpu gpu0
    check "create --numa-gpu gpu0 -> 1" eval 'fails_with 1 "is not a PCI bus id"'
    run create far --rows 10 --row-bytes 8 --numa-node 63
    check "create --numa-node 63 -> 1" eval 'fails_with 1 "node 63 is not an online NUMA node"'
    run create far --rows 10 --row-bytes 8 --numa-node 64
    check "create --numa-node 64 -> 2" eval 'usage_fails && err_has "outside \[0, 63\]"'
    run create far --rows 10 --row-bytes 8 --interleave 0-x
    check "create --interleave 0-x -> 1" eval 'fails_with 1 "is not a node list"'
    run create far --rows 10 --row-bytes 8 --numa-node 0 --interleave all
    check "two placements -> 2" eval 'usage_fails && err_has "give one"'
    run ls
    check "refused creates left nothing" eval 'rc_is 0 && out_lacks "^far " && out_lacks "^nogpu "'
    # Node copies.
    run numa-copy placed --numa-node 0
    check "numa-copy writes NAME.numa0" eval 'rc_is 0 && out_is "placed.numa0: written on node 0"'
    run numa-copy placed --numa-node 0
    check "numa-copy again finds it" eval 'rc_is 0 && out_is "placed.numa0: already there"'
    run lookup placed.numa0 3
    check "the copy holds the rows" eval 'rc_is 0 && out_has "^3: 03 00 00 00 00 00 00 00 "'
    run info placed.numa0
    check "the copy is on node 0" eval 'rc_is 0 && out_has "^numa_placement    node 0: 65 pages"'
    run numa-copy missing --numa-node 0
    check "numa-copy of a missing table -> 1" eval 'fails_with 1 "missing"'
    run numa-copy placed
    check "numa-copy without --numa-node -> 2" eval 'usage_fails'
    run numa-copy placed --numa-node 5
    check "numa-copy to an offline node -> 1" eval 'fails_with 1 "node 5 is not an online NUMA node"'
    run --redis 127.0.0.1:1 create r --rows 1 --row-bytes 8 --numa-node 0
    check "--numa-node with --redis -> 2" eval 'usage_fails && err_has "not a Redis Cluster"'
    ROOT=$NROOT
    rm -rf "$SHM"
fi

# ---------------------------------------------------------------------------
# layout and hash: the n-gram hash of DeepSeek-V4.1's layout.  The expected
# ids come from the Python reference in tests/python/test_ngram.py.
V41="--layer-ids 1,14 --vocab-size 16000000 --max-ngram 4 --heads 8 --compressed-vocab 99092 --pad-id 2"
# shellcheck disable=SC2086
run layout $V41
check "layout: V4.1's rows" eval 'rc_is 0 && out_has "^layer 1: 384006168 rows; multipliers 76632096046245 " && out_has "^layer 14: 384016682 rows"'
check "layout: a column" eval 'out_has "^  1     2   1     16000079       16000057$"'
# shellcheck disable=SC2086
run layout $V41 --json
check "layout --json" eval 'rc_is 0 && out_has "\"num_rows\": 384016682"'
[ "$HAVE_PY" = 1 ] && check "layout --json parses" json_ok
cat >config.json <<'JSON'
{"model_type": "x", "text_config": {"engram_layer_ids": [1, 14], "engram_vocab_size": [16000000, 16000000],
 "engram_max_ngram_size": 4, "engram_n_head_per_ngram": 8, "engram_compressed_vocab_size": 99092,
 "engram_pad_id": 2}}
JSON
run layout --config config.json
check "layout --config" eval 'rc_is 0 && out_has "^layer 14: 384016682 rows"'
run layout --config config.json --layer-ids 14
check "layout --config with a flag over it" eval 'rc_is 0 && out_has "^layer 14: 384006168 rows" && out_lacks "^layer 1:"'
printf '{"engram_layer_ids": [1]}' >short.json
run layout --config short.json
check "layout: a missing field -> 2" eval 'usage_fails && err_has "vocab-size"'
printf '[1, 2]' >bad.json
run layout --config bad.json
check "layout: not an object -> 1" eval 'fails_with 1 "not a JSON object"'
run layout --config config.json --pad-id 99092
check "layout: a bad pad id -> 2" eval 'usage_fails && err_has "pad_id 99092"'
# shellcheck disable=SC2086
run hash 5 7 $V41
check "hash" eval 'rc_is 0 && out_has "^1 7 layer 1: 1465117 16756641 44328833 56905956 67773656 82063522 105208692 " && [ "$(wc -l <out)" -eq 4 ]'
# shellcheck disable=SC2086
run hash 5 7 $V41 --layer 14 --local
check "hash --layer --local" eval 'rc_is 0 && out_has "^1 7 layer 14: 2873305 3452693 7348428 4612309 11244571 2046759 " && [ "$(wc -l <out)" -eq 2 ]'
# A chunk after its history hashes as in the whole request.
# shellcheck disable=SC2086
run hash 5 7 -1 9 11 $V41
tail -n 2 out | cut -d' ' -f3- >whole.ids
# shellcheck disable=SC2086
run hash 11 $V41 --history 3,5,7,-1,9
cut -d' ' -f3- out >chunk.ids
check "hash --history: the same ids as the whole request" cmp -s whole.ids chunk.ids
# shellcheck disable=SC2086
run hash 5 99092 $V41
check "hash: a bad token -> 1, named" eval 'fails_with 1 "tokens\[1\] = 99092"'
# shellcheck disable=SC2086
run hash 5 $V41 --layer 2
check "hash: a layer not in the layout -> 2" eval 'usage_fails && err_has "--layer"'
# shellcheck disable=SC2086
run hash 5 x $V41
check "hash: a token that is no number -> 2" usage_fails
# A token map (int64 [4]: 3 19 0 7) by hand: raw 1 is compressed 19.
make_npy map.npy 1 "{'descr': '<i8', 'fortran_order': False, 'shape': (4,), }" \
    '\003\000\000\000\000\000\000\000\023\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\007\000\000\000\000\000\000\000'
SMALL="--layer-ids 1 --vocab-size 100 --max-ngram 3 --heads 2 --compressed-vocab 20 --pad-id 0"
# shellcheck disable=SC2086
run hash 19 3 $SMALL
cut -d' ' -f3- out >direct.ids
# shellcheck disable=SC2086
run hash 1 0 $SMALL --token-map map.npy
cut -d' ' -f3- out >mapped.ids
check "hash --token-map" eval 'rc_is 0 && cmp -s direct.ids mapped.ids'
# shellcheck disable=SC2086
run hash 4 $SMALL --token-map map.npy
check "hash: a raw token outside the map -> 1" eval 'fails_with 1 "tokens\[0\] = 4 is not a token of the map"'
make_npy badmap.npy 1 "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }" '\000\000\000\000\000\000\000\000'
# shellcheck disable=SC2086
run hash 0 $SMALL --token-map badmap.npy
check "hash: a map of floats -> 1" eval 'fails_with 1 "int32 or int64"'
# shellcheck disable=SC2086
run hash 5 7 $V41 --json
check "hash --json" eval 'rc_is 0 && out_has "\"layer_ids\": \[1, 14\]"'
[ "$HAVE_PY" = 1 ] && check "hash --json parses" json_ok

# Bad inputs to layout and hash: each refused with its status and a
# message naming what is wrong; nothing printed on stdout.
# cfg KEY VALUE: a config of the small layout with KEY's value replaced
# (each key once: the tool reads a repeated key's first value).
cfg() {
    _out='{' _sep=''
    for _kv in 'engram_layer_ids=[1]' engram_vocab_size=100 engram_max_ngram_size=3 \
               engram_n_head_per_ngram=2 engram_compressed_vocab_size=20 engram_pad_id=0; do
        _k=${_kv%%=*} _v=${_kv#*=}
        [ "$_k" = "$1" ] && _v=$2
        _out="$_out$_sep\"$_k\": $_v" _sep=', '
    done
    printf '%s}' "$_out"
}
cfg - - >good.json
run layout --config nosuch.json
check "layout: a missing --config -> 1" eval 'fails_with 1 "--config: cannot open nosuch.json: No such file" && [ ! -s out ]'
mkdir -p cfgdir
run layout --config cfgdir
check "layout: a directory as --config -> 1" eval 'fails_with 1 "cfgdir is not a regular file"'
: >empty.json
run layout --config empty.json
check "layout: an empty --config -> 1" eval 'fails_with 1 "empty.json is not a JSON object"'
printf '{"engram_layer_ids": [1' >cut.json
run layout --config cut.json
check "layout: a --config cut short -> 1" eval 'fails_with 1 "cut.json is not a JSON object"'
# Fields of the wrong type, negative, fractional, too large, or absent.
for case in \
    'engram_max_ngram_size:"3":is not a non-negative integer' \
    'engram_max_ngram_size:3.5:is not a non-negative integer' \
    'engram_n_head_per_ngram:-2:is not a non-negative integer' \
    'engram_vocab_size:1e300:is not a non-negative integer' \
    'engram_vocab_size:[100, 200]:or a list of one repeated' \
    'engram_vocab_size:[]:or a list of one repeated' \
    'engram_compressed_vocab_size:true:is not a non-negative integer' \
    'engram_pad_id:null:is not a non-negative integer' \
    'engram_layer_ids:[1.5]:not a list of layer numbers' \
    'engram_layer_ids:[-1]:not a list of layer numbers' \
    'engram_layer_ids:1:not a list of layer numbers' \
    'engram_layer_ids:"1,14":not a list of layer numbers'; do
    key=${case%%:*} rest=${case#*:}
    value=${rest%:*} why=${rest##*:}
    cfg "$key" "$value" >bad.json
    run layout --config bad.json
    check "layout: $key $value in --config -> 1" eval 'fails_with 1 "$key in bad.json .*$why" && [ ! -s out ]'
done
cfg engram_layer_ids [] >bad.json
run layout --config bad.json
check "layout: no layer ids -> 2" eval 'usage_fails && err_has "needs --layer-ids"'
cfg engram_n_head_per_ngram 4294967297 >bad.json
run layout --config bad.json
check "layout: heads past 32 bits -> 2" eval 'usage_fails && err_has "--heads .* is too large"'
cfg engram_compressed_vocab_size 0 >bad.json
run layout --config bad.json
check "layout: compressed_vocab 0 -> 2" eval 'usage_fails && err_has "compressed_vocab 0 is not in 1..2^62"'
# JSON numbers are doubles: past 2^53 a config's integer is not exact.
cfg engram_vocab_size 9007199254740993 >bad.json
run layout --config bad.json
check "layout: vocab_size past 2^53 in --config -> 1" eval 'fails_with 1 "engram_vocab_size in bad.json is not a non-negative integer"'
if [ "$(id -u)" != 0 ]; then
    cp good.json unreadable.json
    chmod 000 unreadable.json
    run layout --config unreadable.json
    check "layout: an unreadable --config -> 1" eval 'fails_with 1 "cannot open unreadable.json: Permission denied"'
    chmod 600 unreadable.json
else
    skip_part "running as root: the unreadable --config and --token-map"
fi
# Flags: bad numbers.
# shellcheck disable=SC2086
for flags in "--layer-ids 1,x" "--layer-ids 1," "--layer-ids 9223372036854775808" \
             "--vocab-size x" "--vocab-size -5" "--vocab-size 18446744073709551616" \
             "--max-ngram 4294967297" "--pad-id -1" "--heads 0" "--max-ngram 17" \
             "--vocab-size 4611686018427387904" "--compressed-vocab 0"; do
    run layout --config good.json $flags
    check "layout --config with $flags -> 2" eval 'usage_fails && [ ! -s out ]'
done
run layout --config good.json --vocab-size 18446744073709551616
check "layout: --vocab-size past 64 bits names it" eval 'err_has "--vocab-size"'
run layout --config good.json --layer-ids 9223372036854775808
check "layout: a layer id past int64 names it" eval 'err_has "--layer-ids: 9223372036854775808 is too large"'
run layout --config good.json --max-ngram 4294967297
check "layout: --max-ngram past 32 bits names it" eval 'err_has "--max-ngram, --heads or --pad-id is too large"'
run layout --layer-ids 1 --vocab-size 100
check "layout: a missing flag -> 2, named" eval 'usage_fails && err_has "needs --max-ngram"'

# hash: tokens, history and layer that are not numbers, or out of range.
# shellcheck disable=SC2086
run hash 9223372036854775808 $SMALL
check "hash: a token past int64 -> 2" eval 'usage_fails && err_has "token .9223372036854775808. is not an integer"'
# shellcheck disable=SC2086
run hash 1.5 $SMALL
check "hash: a fractional token -> 2" eval 'usage_fails && err_has "token .1.5. is not an integer"'
# shellcheck disable=SC2086
run hash 3 -2 $SMALL
check "hash: a token below -1 -> 1" eval 'fails_with 1 "tokens\[1\] = -2 is not a compressed id" && [ ! -s out ]'
# shellcheck disable=SC2086
run hash -- 3 -9223372036854775808 $SMALL
check "hash: tokens after -- (the layout flags too) -> 2" eval 'usage_fails && err_has "needs --layer-ids"'
# shellcheck disable=SC2086
run hash 3 -9223372036854775808 $SMALL
check "hash: INT64_MIN -> 1" eval 'fails_with 1 "tokens\[1\] = -9223372036854775808"'
# shellcheck disable=SC2086
run hash $SMALL
check "hash of no tokens: nothing" eval 'rc_is 0 && [ ! -s out ]'
# shellcheck disable=SC2086
run hash 1 $SMALL --history x
check "hash: --history junk -> 2" eval 'usage_fails && err_has "--history: .x. is not a token"'
# shellcheck disable=SC2086
run hash 1 $SMALL --history 1,,2
check "hash: --history with an empty item -> 2" eval 'usage_fails && err_has "--history"'
# shellcheck disable=SC2086
run hash 1 $SMALL --history "$(seq -s, 1 65)"
check "hash: --history of 65 tokens -> 2" eval 'usage_fails && err_has "at most 64 tokens"'
# shellcheck disable=SC2086
run hash 1 $SMALL --history 1,20
check "hash: a bad history token -> 1" eval 'fails_with 1 "history\[1\] = 20 is not a compressed id"'
# shellcheck disable=SC2086
run hash 1 $SMALL --layer x
check "hash: --layer junk -> 2" eval 'usage_fails && err_has "--layer: .x. is not a layer number"'
# shellcheck disable=SC2086
run hash 1 $SMALL --layer -1
check "hash: --layer -1 -> 2" eval 'usage_fails && err_has "--layer: -1 is not one of the layout"'
# Token maps that are missing, not a file, not an .npy, of the wrong
# dtype, rank or size, or with entries that are not compressed ids.
# shellcheck disable=SC2086
run hash 1 $SMALL --token-map nosuch.npy
check "hash: a missing --token-map -> 1" eval 'fails_with 1 "--token-map: cannot open nosuch.npy: No such file"'
# shellcheck disable=SC2086
run hash 1 $SMALL --token-map cfgdir
check "hash: a directory as --token-map -> 1" eval 'fails_with 1 "cfgdir is not a regular file"'
# shellcheck disable=SC2086
run hash 1 $SMALL --token-map good.json
check "hash: a --token-map that is no .npy -> 1" eval 'fails_with 1 "--token-map: good.json: "'
: >empty.npy
# shellcheck disable=SC2086
run hash 1 $SMALL --token-map empty.npy
check "hash: an empty --token-map file -> 1" eval 'fails_with 1 "empty.npy: truncated .npy preamble"'
Z8='\000\000\000\000\000\000\000\000'
for case in \
    "<i8:(0,)::the table would be empty" \
    "<i8:(2, 2):$Z8$Z8$Z8$Z8:holds <i8 of 2 dimensions" \
    "<u8:(1,):$Z8:holds <u8 of 1 dimensions; expected a 1-D int32 or int64 array" \
    ">i8:(1,):$Z8:holds >i8" \
    "|b1:(1,):\\000:holds |b1" \
    "<i2:(1,):\\000\\000:holds <i2" \
    "<i8:():$Z8:a scalar has no rows" \
    "<i8:(3,):$Z8$Z8:truncated .npy data" \
    "<i8:(2,):$Z8\\377\\377\\377\\377\\377\\377\\377\\377:token_map\\[1\\] = -1 is not a compressed id" \
    "<i4:(2,):\\000\\000\\000\\000\\024\\000\\000\\000:token_map\\[1\\] = 20 is not a compressed id"; do
    descr=${case%%:*} rest=${case#*:}
    shape=${rest%%:*} rest=${rest#*:}
    data=${rest%%:*} why=${rest#*:}
    make_npy badmap.npy 1 "{'descr': '$descr', 'fortran_order': False, 'shape': $shape, }" "$data"
    # shellcheck disable=SC2086
    run hash 0 $SMALL --token-map badmap.npy
    check "hash: a token map $descr $shape -> 1" eval 'fails_with 1 "$why" && [ ! -s out ]'
done
if [ "$(id -u)" != 0 ]; then
    cp map.npy unreadable.npy
    chmod 000 unreadable.npy
    # shellcheck disable=SC2086
    run hash 1 $SMALL --token-map unreadable.npy
    check "hash: an unreadable --token-map -> 1" eval 'fails_with 1 "cannot open unreadable.npy: Permission denied"'
    chmod 600 unreadable.npy
fi

# import --layers --config: a layout it cannot make fails before the
# checkpoint is read, and so does any bad flag after it.
run import --layers --safetensors nosuch.safetensors --config nosuch.json
check "import --layers: a missing --config -> 1" eval 'fails_with 1 "--config: cannot open nosuch.json"'
cfg engram_pad_id 20 >bad.json
run import --layers --safetensors nosuch.safetensors --config bad.json
check "import --layers: a --config of a bad layout -> 2" eval 'usage_fails && err_has "pad_id 20"'
run import --layers --safetensors nosuch.safetensors --config good.json --layer-ids 1,x
check "import --layers --config: --layer-ids junk -> 2" eval 'usage_fails && err_has "--layer-ids: .1,x. is not a comma-separated list"'
run import --layers --safetensors nosuch.safetensors --config good.json --pitch x
check "import --layers --config: --pitch junk -> 2" eval 'usage_fails && err_has "--pitch"'
run import --layers --safetensors nosuch.safetensors --config good.json --weight 'no-layer-here'
check "import --layers --config: a --weight without {L} -> 2" eval 'usage_fails && err_has "--weight"'
run import --layers --safetensors nosuch.safetensors --config good.json --shard 0
check "import --layers --config: --shard without --tp -> 2" eval 'usage_fails && err_has "--shard needs the topology"'
run import --layers --safetensors nosuch.safetensors --config good.json
check "import --layers --config: a missing checkpoint -> 1" eval 'fails_with 1 "nosuch.safetensors"'
run ls
check "import --layers: nothing imported by the refusals" eval 'out_lacks "engram:l1:"'

# ---------------------------------------------------------------------------
# Names as people type and read them: "did you mean" for a mistyped
# command or table (as for a namespace), tables in natural order, errors
# that name the command that failed.
run_bare lsx
check "a mistyped command -> 2, did you mean" eval 'usage_fails && err_has "unknown command .lsx.; did you mean .ls.?"'
run_bare help creat
check "help of a mistyped command -> 2, did you mean" eval 'usage_fails && err_has "unknown command .creat.; did you mean .create.?"'
run_bare frobnicate
check "a command like none -> 2, no guess" eval 'usage_fails && ! err_has "did you mean"'
for t in engram:l14:h2 engram:l2:h0 engram:l1:h2 engram:l1:h10 engram:l1:h9; do
    run --ns natural create "$t" --rows 3 --row-bytes 8
    check "create $t" eval 'rc_is 0'
done
NATURAL="engram:l1:h2 engram:l1:h9 engram:l1:h10 engram:l2:h0 engram:l14:h2 "
# first_words: the first word of every line of ./out after its first.
first_words() { awk 'NR > 1 { printf "%s ", $1 }' out; }
run --ns natural ls
check "ls: tables in natural order (digit runs as numbers)" eval 'rc_is 0 && [ "$(first_words)" = "$NATURAL" ]'
run --ns natural mem
check "mem: tables in natural order" eval 'rc_is 0 && [ "$(first_words)" = "$NATURAL" ]'
run --ns natural verify --all
check "verify --all: tables in natural order" eval 'rc_is 0 && [ "$(sed "s/: OK$//" out | tr "\n" " ")" = "$NATURAL" ]'
if [ "$HAVE_PY" -eq 1 ]; then
    run --ns natural ls --json
    check "ls --json: tables in natural order" eval 'rc_is 0 && pycheck "
import json; p = json.load(open(\"out\"))
assert [t[\"name\"] for t in p[\"tables\"]] == \"$NATURAL\".split(), p
"'
fi
for c in "info engram:l1:h3" "lookup engram:l1:h3 0" "verify engram:l1:h3" "rm engram:l1:h3" \
    "bench engram:l1:h3" "mem engram:l1:h3"; do
    # shellcheck disable=SC2086
    run --ns natural $c
    check "$c: a mistyped table -> 1, naming the command, did you mean" \
        eval 'fails_with 1 "^engram: ${c%% *} .engram:l1:h3.: table .engram:l1:h3. not found.*; did you mean .engram:l1:h2.?$"'
done
run --ns natural info zzzz
check "info of a table like none -> 1, no guess" eval 'fails_with 1 "zzzz" && ! err_has "did you mean"'
run --ns natural bench nope
check "bench of a missing table names bench, not info" eval 'fails_with 1 "^engram: bench .nope.:" && ! err_has "info"'

# A refused create or import leaves no namespace behind; a namespace that
# was there stays, with its tables.
run --ns refused create t --rows 100000000000000 --row-bytes 264
check "create of a table no file system holds -> 1" eval 'fails_with 1 "needs"'
check "the refused create left no namespace" eval '[ ! -e "$ROOT/refused" ]'
run --ns natural create big --rows 100000000000000 --row-bytes 264
check "create refused in a namespace that was there -> 1" eval 'fails_with 1 "needs"'
check "the namespace that was there stays, with its tables" \
    eval '[ -d "$ROOT/natural" ] && [ "$(ls "$ROOT/natural" | grep -c "^engram:")" -eq 5 ]'
if truncate -s 8T huge.raw 2>/dev/null; then
    run --ns refused import t huge.raw --row-bytes 1024
    check "import of a file no file system holds -> 1" eval 'fails_with 1 "needs"'
    check "the refused import left no namespace" eval '[ ! -e "$ROOT/refused" ]'
else
    skip_part "no sparse 8 TiB file here: the refused import"
fi
rm -f huge.raw
run ns rm natural --force

# docs/cli.md lists every command of 'engram --help', and its global options.
if [ -f "${ENGRAM_SRC:-}/docs/cli.md" ]; then
    run_bare --help
    cmds=$(awk '/^Commands:/ { on = 1; next } on && /^$/ { exit } on && /^  [a-z]/ { print $1 }' out | sort -u)
    check "--help lists commands" eval '[ -n "$cmds" ]'
    for c in $cmds; do
        check "docs/cli.md lists the command $c" grep -q "^| \`$c[ \`]" "$ENGRAM_SRC/docs/cli.md"
    done
    for o in "--root DIR" "--ns NAME" "--redis NODES"; do
        check "docs/cli.md shows the global option $o" grep -q -e "$o" "$ENGRAM_SRC/docs/cli.md"
    done
else
    skip_part "ENGRAM_SRC (the source tree) not found: docs/cli.md's commands"
fi

# ---------------------------------------------------------------------------
# demo --small: creates, checks, measures and removes its own namespace.
run demo --small --iters 20
check "demo --small" eval 'rc_is 0 && out_has "engram:l1:h0" && out_has "^ *4096 " && out_has "store stats"'
check "demo --small removed its namespace" eval '[ -d "$ROOT" ] && [ -z "$(ls "$ROOT" | grep "^demo-")" ]'
run demo --small --iters 5 --tokens 7 --ns demokeep --keep
check "demo --keep --tokens" eval 'rc_is 0 && out_has "^ *7 "'
run --ns demokeep ls
check "demo --keep kept 24 tables" eval 'rc_is 0 && [ "$(grep -c "^engram:l1:h" out)" -eq 24 ]'
run --ns demokeep lookup engram:l1:h0 5
check "demo tables hold the pattern" eval 'rc_is 0 && out_has "^5: 05 00 00 00 00 00 00 00 "'
run --ns demokeep demo --small --iters 5
check "demo into a namespace that has its tables -> 1" eval 'fails_with 1 "exist"'

summary cli
[ "$FAIL" -eq 0 ]
