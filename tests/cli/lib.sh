# tests/cli/lib.sh - the helpers of the CLI test scripts (run.sh,
# redis.sh), sourced by them: running the tool with its output kept, one
# check per line, and the predicates checks use.  Needs ENGRAM_BIN and
# ROOT; counts in PASS and FAIL.  POSIX sh only.

PASS=0
FAIL=0
SKIPPED=

# skip_part WHAT: a part of the script that cannot run here (WHAT names
# it and says why), said now and listed again by summary.
skip_part() {
    echo "SKIPPED (part): $1"
    SKIPPED="$SKIPPED  $1
"
}

# summary NAME: the last lines of a script: the counts, and every part
# left out here with its reason.
summary() {
    echo "$1: $PASS passed, $FAIL failed"
    [ -z "$SKIPPED" ] || printf '%s: parts skipped here:\n%s' "$1" "$SKIPPED"
}

# run ARGS...: runs engram with the scratch root; keeps stdout in ./out,
# stderr in ./err and the exit status in $rc, and remembers the command.
run() {
    LAST="engram $*"
    "$ENGRAM_BIN" --root "$ROOT" "$@" >out 2>err
    rc=$?
}

# Like run, without the --root option (for help, version, parsing).
run_bare() {
    LAST="engram $*"
    "$ENGRAM_BIN" "$@" >out 2>err
    rc=$?
}

show_last() {
    echo "  command: $LAST"
    echo "  status:  $rc"
    sed -n '1,15s/^/  stdout: /p' out
    sed -n '1,15s/^/  stderr: /p' err
}

# check DESCRIPTION COMMAND...: one test; passes when COMMAND succeeds.
check() {
    desc=$1
    shift
    if "$@"; then
        PASS=$((PASS + 1))
    else
        FAIL=$((FAIL + 1))
        echo "FAIL: $desc"
        show_last
    fi
}

rc_is() { [ "$rc" -eq "$1" ]; }
# out_is TEXT: stdout is exactly TEXT plus a final newline.
out_is() {
    printf '%s\n' "$1" >expected
    cmp -s expected out
}
out_has() { grep -q -e "$1" out; }
out_lacks() { ! grep -q -e "$1" out; }
err_has() { grep -q -i -e "$1" err; }
err_empty() { [ ! -s err ]; }
# A failure: the given status, and a message on stderr in the tool's form.
fails_with() {
    [ "$rc" -eq "$1" ] && grep -q '^engram: ' err && grep -q -i -e "$2" err
}
usage_fails() {
    [ "$rc" -eq 2 ] && grep -q '^engram: ' err
}
