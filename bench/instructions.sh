#!/usr/bin/env bash
# Instructions per operation, counted by callgrind: the same operation through the
# attribute, the runtime API and a raw redis-crate EVALSHA. Instruction counts do not move
# with the machine's load, so they compare the three ways where throughput on a shared,
# noisy machine cannot (the client's whole process is counted: our code, redis-rs, Tokio).
#
#   bench/instructions.sh            # needs valgrind; ~10 min
#
# Prints a markdown table; each row's "÷ raw" is raw's count divided by the row's (the
# throughput a client-bound loop would keep).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
command -v callgrind_annotate >/dev/null || { echo "needs callgrind_annotate (valgrind)" >&2; exit 1; }
cargo build --release -q -p redguard-bench
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Instructions of one `--quick --only` run's operations, divided by the operations (the
# bench prints how many it ran: coalesced rate checks share commands). Without the peers:
# rslock runs in this process on the same `redis` crate, and its connection's task would be
# counted with ours.
per_operation() {
  local file="$out/cg.$RANDOM"
  valgrind --tool=callgrind --callgrind-out-file="$file" \
    target/release/redguard-bench --quick --no-peers --only "$1 @redis" >"$file.out" 2>/dev/null
  python3 - "$file" "$(sed -n 's/^operations: //p' "$file.out")" <<'PY'
import re, subprocess, sys
def inclusive(name):
    # Every function: at the default threshold (99% of the total) a small row's closure can
    # fall off the list and count 0.
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", sys.argv[1]],
                          capture_output=True, text=True).stdout
    return sum(int(m.group(1).replace(",", "")) for m in
               re.finditer(r"^\s*([\d,]+) \([^)]*\)\s+\?\?\?:" + re.escape(name) + r" \[", text, re.M))
# The operations' tasks, and the connection's task that writes and parses for them; not
# the set-up, the warm-up's task spawning or the percentile sorting around them.
ops = inclusive("redguard_bench::measure::closed_loop::{{closure}}::{{closure}}::{{closure}}")
io = inclusive("<futures_util::stream::stream::forward::Forward<St,Si,Item> as core::future::future::Future>::poll")
# The task that sends coalesced rate checks queued behind a call in flight.
io += inclusive("redguard::store::redis::gcra::<impl redguard::store::redis::RedisStore>::drive::{{closure}}")
# Every operation the closed loops ran, warm-ups included, as the bench printed it.
print(round((ops + io) / int(sys.argv[2])))
PY
}

echo "| operation | attribute | runtime API | raw EVALSHA | API ÷ attribute | raw ÷ API |"
echo "|---|---|---|---|---|---|"
for case in "idempotency replay" "rate gcra random keys" "lock acquire+release random keys"; do
  attribute=$(per_operation "$case (attribute)")
  api=$(per_operation "$case (runtime API)")
  raw=$(per_operation "$case (raw EVALSHA)")
  python3 -c "print(f'| $case | $attribute | $api | $raw | {$api/$attribute:.3f} | {$raw/$api:.2f} |')"
done
