// Command river-bench drives River (github.com/riverqueue/river) for jobpool's benchmark.
//
//	river-bench migrate DSN                          River's migrations (rivermigrate), up
//	river-bench drain DSN MAXWORKERS PROFILE [KIND]  work every available job, then exit
//	river-bench serve DSN MAXWORKERS PROFILE         work jobs until SIGTERM or SIGINT
//	river-bench enqueue DSN KIND BATCH               insert one job per stdin line (its JSON args);
//	                                                 an empty line inserts the lines before it
//	river-bench single DSN                           per stdin line "KIND<TAB>ARGS": insert, answer "ok"
//
// PROFILE sets the fetch timing: "default" is River's own (FetchCooldown 100 ms,
// FetchPollInterval 1 s), "fast" the one of `river bench` (2 ms, 20 ms). KIND (bench_noop, the
// default, or bench_write) is worked besides bench_latency. bench_write inserts one row into
// bench_writes and completes the job in the same transaction (river.JobCompleteTx).
// bench_latency appends now - args.t0 (seconds) to the file named by BENCH_LATENCY_FILE.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "river-bench:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 2 {
		return errors.New("usage: river-bench migrate|drain|serve|enqueue|single DSN ...")
	}
	ctx := context.Background()
	command, dsn := args[0], args[1]
	switch command {
	case "migrate":
		return migrate(ctx, dsn)
	case "drain", "serve":
		if len(args) < 4 {
			return fmt.Errorf("%s needs DSN MAXWORKERS PROFILE [KIND]", command)
		}
		maxWorkers, err := strconv.Atoi(args[2])
		if err != nil {
			return fmt.Errorf("MAXWORKERS %q: %w", args[2], err)
		}
		kind := "bench_noop"
		if len(args) > 4 {
			kind = args[4]
		}
		return work(ctx, dsn, command == "drain", maxWorkers, args[3], kind)
	case "enqueue":
		if len(args) < 4 {
			return errors.New("enqueue needs DSN KIND BATCH")
		}
		batch, err := strconv.Atoi(args[3])
		if err != nil || batch < 1 {
			return fmt.Errorf("BATCH %q must be a positive integer", args[3])
		}
		return enqueue(ctx, dsn, args[2], batch)
	case "single":
		return single(ctx, dsn)
	}
	return fmt.Errorf("unknown command %q", command)
}

// pool opens a pgx pool of at most maxConns connections.
func pool(ctx context.Context, dsn string, maxConns int) (*pgxpool.Pool, error) {
	config, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	config.MaxConns = int32(maxConns)
	return pgxpool.NewWithConfig(ctx, config)
}

func migrate(ctx context.Context, dsn string) error {
	db, err := pool(ctx, dsn, 2)
	if err != nil {
		return err
	}
	defer db.Close()
	migrator, err := rivermigrate.New(riverpgxv5.New(db), nil)
	if err != nil {
		return err
	}
	_, err = migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	return err
}

// The benchmark's job kinds.

type noopArgs struct{}

func (noopArgs) Kind() string { return "bench_noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
}

func (noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }

type writeArgs struct {
	N int `json:"n"`
}

func (writeArgs) Kind() string { return "bench_write" }

// writeWorker inserts the job's row and completes the job in one transaction.
type writeWorker struct {
	river.WorkerDefaults[writeArgs]
	db *pgxpool.Pool
}

func (w writeWorker) Work(ctx context.Context, job *river.Job[writeArgs]) error {
	tx, err := w.db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "INSERT INTO bench_writes (job_id, payload) VALUES ($1, $2)",
		job.ID, string(job.EncodedArgs)); err != nil {
		return err
	}
	if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

type latencyArgs struct {
	T0     float64 `json:"t0"`
	Warmup bool    `json:"warmup"`
}

func (latencyArgs) Kind() string { return "bench_latency" }

type latencyWorker struct {
	river.WorkerDefaults[latencyArgs]
}

func (latencyWorker) Work(_ context.Context, job *river.Job[latencyArgs]) error {
	started := float64(time.Now().UnixNano()) / 1e9
	if job.Args.Warmup {
		return nil
	}
	out, err := os.OpenFile(os.Getenv("BENCH_LATENCY_FILE"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	_, err = fmt.Fprintf(out, "%.6f\n", started-job.Args.T0)
	return err
}

// fetchTiming is (FetchCooldown, FetchPollInterval) of a PROFILE.
func fetchTiming(profile string) (time.Duration, time.Duration, error) {
	switch profile {
	case "default":
		return river.FetchCooldownDefault, river.FetchPollIntervalDefault, nil
	case "fast":
		return 2 * time.Millisecond, 20 * time.Millisecond, nil
	}
	return 0, 0, fmt.Errorf("PROFILE %q: expected default or fast", profile)
}

// work runs one client with maxWorkers on the default queue; with drain it stops once as many
// jobs completed as were available at its start, or once no job is left unfinished (checked
// every 500 ms, for drains by several processes).
func work(ctx context.Context, dsn string, drain bool, maxWorkers int, profile, kind string) error {
	cooldown, poll, err := fetchTiming(profile)
	if err != nil {
		return err
	}
	// a connection for each writing worker, as pgx's default (4 here) would queue them
	db, err := pool(ctx, dsn, min(maxWorkers, 100)+4)
	if err != nil {
		return err
	}
	defer db.Close()
	workers := river.NewWorkers()
	switch kind {
	case "bench_noop":
		river.AddWorker(workers, noopWorker{})
	case "bench_write":
		river.AddWorker(workers, writeWorker{db: db})
	default:
		return fmt.Errorf("KIND %q: expected bench_noop or bench_write", kind)
	}
	river.AddWorker(workers, latencyWorker{})
	client, err := river.NewClient(riverpgxv5.New(db), &river.Config{
		FetchCooldown:     cooldown,
		FetchPollInterval: poll,
		Logger:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: maxWorkers}},
		Workers:           workers,
	})
	if err != nil {
		return err
	}
	var pending int
	if drain {
		if err := db.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE state = 'available'").Scan(&pending); err != nil {
			return err
		}
	}
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: pending + 1000,
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed},
	})
	defer cancel()
	stop, stopSignals := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stopSignals()
	if err := client.Start(ctx); err != nil {
		return err
	}
	// Several drain processes share one queue: each also ends once no job is left unfinished.
	ticker := time.NewTicker(500 * time.Millisecond)
	defer ticker.Stop()
	var failure error
	for failure == nil && (!drain || pending > 0) {
		select {
		case <-stop.Done():
			drain, pending = true, 0
		case <-ticker.C:
			if drain {
				var left int
				failure = db.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE state IN "+
					"('available', 'running', 'retryable', 'scheduled', 'pending')").Scan(&left)
				if left == 0 {
					pending = 0
				}
			}
		case event := <-events:
			if event.Kind == river.EventKindJobFailed { // a benchmark job never fails
				failure = fmt.Errorf("job %d (%s) failed: %v", event.Job.ID, event.Job.Kind, event.Job.Errors)
			}
			pending--
		}
	}
	return errors.Join(failure, client.Stop(ctx))
}

// rawArgs inserts a job of any kind with arguments given as JSON.
type rawArgs struct {
	kind string
	args json.RawMessage
}

func (a rawArgs) Kind() string                 { return a.kind }
func (a rawArgs) MarshalJSON() ([]byte, error) { return a.args, nil }

// inserter opens an insert-only client.
func inserter(ctx context.Context, dsn string) (*pgxpool.Pool, *river.Client[pgx.Tx], error) {
	db, err := pool(ctx, dsn, 2)
	if err != nil {
		return nil, nil, err
	}
	client, err := river.NewClient(riverpgxv5.New(db), &river.Config{
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return db, client, nil
}

// enqueue inserts one job of kind per line of stdin (its JSON args): batch 1 with Insert, one
// transaction each, larger batches with InsertManyFast (COPY FROM).
func enqueue(ctx context.Context, dsn, kind string, batch int) error {
	db, client, err := inserter(ctx, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	lines := bufio.NewScanner(os.Stdin)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	params := make([]river.InsertManyParams, 0, batch)
	flush := func() error {
		if len(params) == 0 {
			return nil
		}
		var err error
		if batch == 1 {
			_, err = client.Insert(ctx, params[0].Args, nil)
		} else {
			_, err = client.InsertManyFast(ctx, params)
		}
		params = params[:0]
		return err
	}
	for lines.Scan() {
		if len(lines.Bytes()) == 0 { // a producer's batch ends: insert it now
			if err := flush(); err != nil {
				return err
			}
			continue
		}
		args := append(json.RawMessage(nil), lines.Bytes()...)
		params = append(params, river.InsertManyParams{Args: rawArgs{kind: kind, args: args}})
		if len(params) == batch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := lines.Err(); err != nil {
		return err
	}
	return flush()
}

// single inserts one job per line "KIND<TAB>ARGS" of stdin with Insert (its own transaction)
// and answers "ok" on stdout after each, so a caller can time enqueues one by one.
func single(ctx context.Context, dsn string) error {
	db, client, err := inserter(ctx, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	lines := bufio.NewScanner(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	for lines.Scan() {
		kind, args, ok := strings.Cut(lines.Text(), "\t")
		if !ok {
			return fmt.Errorf("line %q: expected KIND<TAB>ARGS", lines.Text())
		}
		if _, err := client.Insert(ctx, rawArgs{kind: kind, args: json.RawMessage(args)}, nil); err != nil {
			return err
		}
		if _, err := out.WriteString("ok\n"); err != nil {
			return err
		}
		if err := out.Flush(); err != nil {
			return err
		}
	}
	return lines.Err()
}
