// graphile-worker for jobpool's benchmark: its schema, and one worker process per run.
//
//   node worker.js MODULES migrate DSN
//   node worker.js MODULES drain|serve DSN PROFILE CONCURRENCY [KIND]
//
// MODULES is the node_modules folder the bench installed (`npm ci`) from this folder's
// package-lock.json. `drain` runs graphile-worker's runOnce (it exits once no job is ready),
// `serve` its run() until SIGTERM or SIGINT. PROFILE is graphile-worker's configuration:
//   default    its defaults (maxPoolSize 10, no local queue, no batched completion)
//   published  the configuration of its published performance figures: maxPoolSize
//              CONCURRENCY + 1, localQueue.size 500, completeJobBatchDelay 0,
//              failJobBatchDelay 0
//   bounded    localQueue.size CONCURRENCY + 1 (its documentation's advice: the nearest
//              batched fetch to jobpool's claim of no more than its free slots), maxPoolSize CONCURRENCY + 1 (it
//              warns of a pool smaller than its concurrency), completeJobBatchDelay 0 and
//              failJobBatchDelay 0. Batched completion because
//              runOnce does not wait for an unbatched completion still in flight: with a
//              local queue the last jobs of a drain stay locked and unfinished without it.
// The tasks: bench_noop (nothing), bench_write (one row into bench_writes through the
// worker's pool: graphile-worker completes a job in a transaction of its own), bench_latency
// (appends now - payload.t0, in seconds, to the file named by BENCH_LATENCY_FILE).
"use strict";

const fs = require("node:fs");
const path = require("node:path");
const { createRequire } = require("node:module");

const [modules, mode, dsn, profile, concurrencyArg, kind = "bench_noop"] = process.argv.slice(2);
const { Logger, run, runMigrations, runOnce } = createRequire(
  path.join(path.resolve(modules), "package.json"),
)("graphile-worker");

// warnings and errors only: no system of the race pays for a log line per job
const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") {
    process.stderr.write(`graphile-worker ${level}: ${message}\n`);
  }
});

const taskList = {
  bench_noop: async () => {},
  bench_write: async (payload, helpers) => {
    await helpers.withPgClient((client) =>
      client.query("INSERT INTO bench_writes (job_id, payload) VALUES ($1, $2)", [
        helpers.job.id,
        JSON.stringify(payload),
      ]),
    );
  },
  bench_latency: async (payload) => {
    const started = Date.now() / 1000;
    if (!payload.warmup) {
      fs.appendFileSync(process.env.BENCH_LATENCY_FILE, `${(started - payload.t0).toFixed(6)}\n`);
    }
  },
};

function preset(concurrency) {
  const worker = { connectionString: dsn, concurrentJobs: concurrency };
  if (profile === "published") {
    Object.assign(worker, {
      maxPoolSize: concurrency + 1,
      localQueue: { size: 500 },
      completeJobBatchDelay: 0,
      failJobBatchDelay: 0,
    });
  } else if (profile === "bounded") {
    Object.assign(worker, {
      maxPoolSize: concurrency + 1,
      localQueue: { size: concurrency + 1 },
      completeJobBatchDelay: 0,
      failJobBatchDelay: 0,
    });
  } else if (profile !== "default") {
    throw new Error(`PROFILE ${profile}: expected default, published or bounded`);
  }
  return { worker };
}

async function main() {
  if (mode === "migrate") {
    await runMigrations({ connectionString: dsn, logger });
    return;
  }
  const concurrency = Number.parseInt(concurrencyArg, 10);
  if (!(concurrency > 0)) {
    throw new Error(`CONCURRENCY ${concurrencyArg}: expected a positive integer`);
  }
  if (!(kind in taskList) || kind === "bench_latency") {
    throw new Error(`KIND ${kind}: expected bench_noop or bench_write`);
  }
  const tasks = { [kind]: taskList[kind], bench_latency: taskList.bench_latency };
  const options = { preset: preset(concurrency), logger, taskList: tasks, noHandleSignals: true };
  if (mode === "drain") {
    await runOnce(options);
  } else if (mode === "serve") {
    const runner = await run(options);
    for (const signal of ["SIGTERM", "SIGINT"]) {
      process.once(signal, () => runner.stop());
    }
    await runner.promise;
  } else {
    throw new Error(`MODE ${mode}: expected migrate, drain or serve`);
  }
}

main().catch((error) => {
  process.stderr.write(`graphile-worker bench: ${error.stack || error}\n`);
  process.exit(1);
});
