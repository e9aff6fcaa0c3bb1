package jobs_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/jobs"
)

// endlessSweep expires 200 holds, then waits for its run to end, as a sweep
// of more lapsed holds than one period expires does.
type endlessSweep struct{}

func (endlessSweep) ExpireHolds(ctx context.Context, _ int) (int, error) {
	<-ctx.Done()
	return 200, fmt.Errorf("sweep: %w", context.Cause(ctx))
}

// TestSweepCutShortByItsPeriodIsAWarning: a sweep that runs to the end of
// its period (its lock's "at most") expired what it committed and leaves
// the rest to the next run: a warning with its duration, not a failed job
// (an ERROR, which an operator would page on).
func TestSweepCutShortByItsPeriodIsAWarning(t *testing.T) {
	var logged bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	job := jobs.SweepJob(50*time.Millisecond, endlessSweep{}, log)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the period is over
	if err := job.Run(ctx); err != nil {
		t.Fatalf("a sweep cut short by its period failed the job: %v", err)
	}
	out := logged.String()
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "took=") || strings.Contains(out, "level=ERROR") {
		t.Errorf("want a warning with the run's duration, got:\n%s", out)
	}
}

// failingSweep fails on its own (the database refused), within its period.
type failingSweep struct{}

func (failingSweep) ExpireHolds(context.Context, int) (int, error) {
	return 0, fmt.Errorf("sweep: relation does not exist")
}

// TestSweepThatFailsWithinItsPeriodFailsTheJob: only a run cut short by
// its period is a warning; a sweep that fails is still the job's failure.
func TestSweepThatFailsWithinItsPeriodFailsTheJob(t *testing.T) {
	job := jobs.SweepJob(time.Second, failingSweep{}, slog.New(slog.DiscardHandler))
	if err := job.Run(context.Background()); err == nil {
		t.Fatal("a failing sweep ran as if it succeeded")
	}
}
