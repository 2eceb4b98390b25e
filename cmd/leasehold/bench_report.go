package main

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"
)

// benchResult is the outcome of one workload.
type benchResult struct {
	Workload string `json:"workload"`
	// Via is "client" when the workload went through api/client (--via);
	// empty for the load generator's own connections.
	Via string `json:"via,omitempty"`
	// Servers is the size of the cluster --spawn started (0: --addr).
	Servers   int     `json:"servers,omitempty"`
	Clients   int     `json:"clients"`
	Seconds   float64 `json:"seconds"`
	Unit      string  `json:"unit"`        // what Ops counts
	Ops       int64   `json:"ops"`         // units done
	OpsPerSec float64 `json:"ops_per_sec"` // Ops / Seconds
	Requests  int64   `json:"requests"`    // HTTP requests measured
	Errors    int64   `json:"errors"`
	// ErrorCodes counts errors by contract code ("transport" for no answer).
	ErrorCodes map[string]int64 `json:"error_codes,omitempty"`
	// Latency is of one operation: a cycle, a grant (with its wait), a
	// renewal, a heartbeat request.
	Latency latencySummary `json:"latency"`
	// AcquireLatency is of the acquire alone (cycle only).
	AcquireLatency *latencySummary `json:"acquire_latency,omitempty"`
	// EntriesPerOp is how many Raft log entries the cluster committed per
	// operation during the measured phase, its ticks and the last
	// operations still in flight at its end included (omitted when the
	// commit index could not be read): what group commit achieved.
	EntriesPerOp float64 `json:"entries_per_op,omitempty"`
}

// latencySummary holds percentiles in milliseconds.
type latencySummary struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P99   float64 `json:"p99_ms"`
	P999  float64 `json:"p999_ms"`
	Max   float64 `json:"max_ms"`
}

// percentile returns the nearest-rank p-th percentile (0 < p <= 100) of
// sorted: the smallest sample such that at least p% of the samples are less
// than or equal to it. It returns 0 for no samples.
func percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	// The small epsilon absorbs binary rounding: 99.9% of 1000 must be
	// rank 999, not 1000 because 99.9 is not exact in floating point.
	rank := int(math.Ceil(p*float64(n)/100 - 1e-9))
	return sorted[min(max(rank, 1), n)-1]
}

// summarize sorts samples in place and summarizes them.
func summarize(samples []time.Duration) latencySummary {
	if len(samples) == 0 {
		return latencySummary{}
	}
	slices.Sort(samples)
	var sum time.Duration
	for _, d := range samples {
		sum += d
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return latencySummary{
		Count: len(samples),
		Mean:  ms(sum / time.Duration(len(samples))),
		P50:   ms(percentile(samples, 50)),
		P99:   ms(percentile(samples, 99)),
		P999:  ms(percentile(samples, 99.9)),
		Max:   ms(samples[len(samples)-1]),
	}
}

func printBench(out io.Writer, results []*benchResult) error {
	tw := tabwriter.NewWriter(out, 0, 8, 2, ' ', tabwriter.AlignRight)
	spawned := slices.ContainsFunc(results, func(r *benchResult) bool { return r.Servers > 0 })
	lead := func(r *benchResult) string {
		if spawned {
			return strconv.Itoa(r.Servers) + "\t"
		}
		return ""
	}
	if spawned {
		fmt.Fprint(tw, "servers\t")
	}
	fmt.Fprintln(tw, "workload\tclients\tops/s\tunit\tops\trequests\terrors\tp50 ms\tp99 ms\tp99.9 ms\tmax ms\tentries/op\t")
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }
	for _, r := range results {
		epo := "-"
		if r.EntriesPerOp > 0 {
			epo = strconv.FormatFloat(r.EntriesPerOp, 'f', 3, 64)
		}
		fmt.Fprintf(tw, "%s%s\t%d\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t\n", lead(r), viaLabel(r.Workload, r.Via), r.Clients,
			strconv.FormatFloat(r.OpsPerSec, 'f', 0, 64), r.Unit, r.Ops, r.Requests, r.Errors,
			f(r.Latency.P50), f(r.Latency.P99), f(r.Latency.P999), f(r.Latency.Max), epo)
		if a := r.AcquireLatency; a != nil {
			fmt.Fprintf(tw, "%s  (acquire)\t\t\t\t\t\t\t%s\t%s\t%s\t%s\t\n", lead(r), f(a.P50), f(a.P99), f(a.P999), f(a.Max))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range results {
		if len(r.ErrorCodes) > 0 {
			codes := slices.Sorted(maps.Keys(r.ErrorCodes))
			fmt.Fprintf(out, "%s errors:", viaLabel(r.Workload, r.Via))
			for _, k := range codes {
				fmt.Fprintf(out, " %s=%d", k, r.ErrorCodes[k])
			}
			fmt.Fprintln(out)
		}
	}
	return nil
}
