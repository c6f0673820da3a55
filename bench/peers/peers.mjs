// One peer case in the closed loop of `bench/src/measure.rs`, against the bench's Redis:
//
//   node peers.mjs --port P --case NAME --in-flight N --warmup-ms W --window-ms M
//
// Prints one JSON line: {"ops","ops_per_sec","p50_us","p99_us","max_us"} (the contended
// case adds "released" and "attempts_per_section"). Run by `bench/src/peers.rs`. Every
// library runs with its defaults on one ioredis client, which keeps many commands in flight
// on its connection, like the runtime's multiplexed one.

import { parseArgs } from "node:util";
import { setTimeout as sleep, setImmediate as yieldNow } from "node:timers/promises";

import { Redis } from "ioredis";
import { RateLimiterRedis } from "rate-limiter-flexible";
import Redlock from "redlock";

const { values: args } = parseArgs({
  options: {
    port: { type: "string" },
    case: { type: "string" },
    "in-flight": { type: "string" },
    "warmup-ms": { type: "string", default: "1000" },
    "window-ms": { type: "string", default: "3000" },
  },
});
const inFlight = Number(args["in-flight"]);
const warmupMs = Number(args["warmup-ms"]);
const windowMs = Number(args["window-ms"]);

const redis = new Redis({ port: Number(args.port), host: "127.0.0.1" });

// Sorted latencies in ns → the Rust side's `Sample` (same percentile rule as `Latency::of`).
function sample(ns, elapsedNs) {
  const sorted = Float64Array.from(ns).sort();
  const pct = (p) => (sorted.length ? sorted[Math.floor((sorted.length - 1) * p)] / 1000 : 0);
  return {
    ops: sorted.length,
    ops_per_sec: sorted.length / (Number(elapsedNs) / 1e9),
    p50_us: pct(0.5),
    p99_us: pct(0.99),
    max_us: sorted.length ? sorted[sorted.length - 1] / 1000 : 0,
  };
}

// Warm-up, then the measured window (`state.measuring`); then tells the loops to stop.
// Returns the window's real length in ns.
async function windowOf(state) {
  await sleep(warmupMs);
  state.measuring = true;
  const started = process.hrtime.bigint();
  await sleep(windowMs);
  state.measuring = false;
  const elapsed = process.hrtime.bigint() - started;
  state.stop = true;
  return elapsed;
}

// `op(i)` (i unique across loops) from `inFlight` loops back to back, as
// `measure::closed_loop`. One event loop: the shared array needs no merging.
async function closedLoop(op) {
  const state = { measuring: false, stop: false };
  const latencies = [];
  let counter = 0;
  const loop = async () => {
    while (!state.stop) {
      const i = counter++;
      const started = process.hrtime.bigint();
      await op(i);
      if (state.measuring) latencies.push(Number(process.hrtime.bigint() - started));
    }
  };
  const loops = Array.from({ length: inFlight }, loop);
  const elapsed = await windowOf(state);
  await Promise.all(loops);
  return sample(latencies, elapsed);
}

// `inFlight` contenders on one lock, as `measure::contended`: take it, leave at once, queue
// again. The sample is the wait (call to entry); ops/s are critical sections per second.
// Also counts the sections whose release went through, and redlock's attempts (one script
// call each) per section: with retries on a timer, the throughput depends on them.
async function contended(acquire) {
  const state = { measuring: false, stop: false };
  const waits = [];
  let released = 0;
  let attempts = 0;
  const loop = async () => {
    while (!state.stop) {
      const started = process.hrtime.bigint();
      const lock = await acquire();
      const measured = state.measuring;
      if (measured) {
        waits.push(Number(process.hrtime.bigint() - started));
        attempts += lock.attempts.length;
      }
      await lock.release();
      if (measured) released++;
      // measure::contended yields here too.
      await yieldNow();
    }
  };
  const loops = Array.from({ length: inFlight }, loop);
  const elapsed = await windowOf(state);
  await Promise.all(loops);
  return { ...sample(waits, elapsed), released, attempts_per_section: attempts / released };
}

const cases = {
  // Points no window reaches: every consume is admitted, like the GCRA random-key rows.
  "rlf-consume": () => {
    const limiter = new RateLimiterRedis({
      storeClient: redis,
      useRedisPackage: false,
      points: 1e9,
      duration: 1,
      keyPrefix: "peer:rlf",
    });
    return closedLoop((i) => limiter.consume(`k${i}`));
  },
  // Unique keys: never locked, so no retry is needed.
  "redlock-cycle": () => {
    const redlock = new Redlock([redis], { retryCount: 0 });
    return closedLoop(async (i) => {
      const lock = await redlock.acquire([`peer:redlock:${i}`], 30000);
      await lock.release();
    });
  },
  // redlock's defaults (a retry every 200 ± 100 ms) except the count: never give up.
  "redlock-contended": () => {
    const redlock = new Redlock([redis], { retryCount: -1 });
    return contended(() => redlock.acquire(["peer:redlock:contended"], 30000));
  },
};

const run = cases[args.case];
if (!run) {
  console.error(`unknown case ${args.case}; one of ${Object.keys(cases).join(", ")}`);
  process.exit(2);
}
try {
  console.log(JSON.stringify(await run()));
  await redis.quit();
} catch (error) {
  // One line for peers.rs to show.
  console.error(`peers.mjs ${args.case}: ${error.message}`);
  process.exit(1);
}
