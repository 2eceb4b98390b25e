package chaos

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/wire"
)

// diskFiller is a Cluster whose nodes have disks of their own to fill
// (NetnsCluster with NetnsOptions.DiskSize).
type diskFiller interface {
	FillDisk(i int, leave int64) error
}

// fillDisk fills node i's disk until leave bytes are free (negative:
// empties it again); ErrUnsupported where the tier cannot.
func (e *Env) fillDisk(i int, leave int64) error {
	f, ok := e.C.(diskFiller)
	if !ok {
		return fmt.Errorf("chaos: the %s tier has no disks of their own to fill: %w", e.Tier, ErrUnsupported)
	}
	return f.FillDisk(i, leave)
}

// diskFullFree is what the disk-full nemeses leave free: well below the
// scenarios' --min-free-disk, far from full.
const diskFullFree = 8 << 20

// diskFull fills node n's disk below the free-space guard's threshold
// until the cluster refuses an acquire with RESOURCE_EXHAUSTED
// min_free_disk (the leader reads its own disk every second, a follower's
// through gossip), holds it while the workloads run against the refusal,
// then removes the ballast and waits until acquires are granted again.
// The probes use keys of their own, outside the workloads'.
func (e *Env) diskFull(ctx context.Context, n int) error {
	detail := fmt.Sprintf("node %d below --min-free-disk", n)
	if err := e.fillDisk(n, diskFullFree); err != nil {
		e.H.Note(Event{Type: "nemesis", Name: "disk-full", Phase: "start", Detail: detail, Err: err.Error()})
		return err
	}
	e.H.Note(Event{Type: "nemesis", Name: "disk-full", Phase: "start", Detail: detail})
	e.Count("faults", 1)
	probe := 0
	acquire := func() error {
		probe++
		var last error
		for _, i := range e.Others() {
			if !e.C.Alive(i) {
				continue
			}
			_, err := e.Admin(i).Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprintf("disk-probe/%d", probe), Holder: "disk-probe", TTLMS: 1000})
			if err == nil || client.ErrorCode(err) == wire.CodeResourceExhausted {
				return err
			}
			last = err
		}
		return fmt.Errorf("no node answered the probe: %w", last)
	}
	refusedErr := func(err error) bool {
		var we *wire.Error
		return errors.As(err, &we) && we.Code == wire.CodeResourceExhausted && we.Field == "min_free_disk"
	}
	var ferr error
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := acquire()
		if refusedErr(err) {
			e.Count("disk-refusals", 1)
			e.Note("disk-refused", err.Error(), nil)
			break
		}
		if time.Now().After(deadline) {
			ferr = fmt.Errorf("no acquire refused within 30s of filling node %d's disk (last: %v)", n, err)
			break
		}
		if sleepCtx(ctx, 250*time.Millisecond) != nil {
			break
		}
	}
	if ferr == nil {
		// The workloads run against the refusal for a while.
		sleepCtx(ctx, faultFor)
	}
	uerr := e.fillDisk(n, -1)
	ev := Event{Type: "nemesis", Name: "disk-full", Phase: "stop", Detail: detail}
	if uerr != nil {
		ev.Err = uerr.Error()
	}
	e.H.Note(ev)
	if ferr != nil || uerr != nil || ctx.Err() != nil {
		return errors.Join(ferr, uerr, ctx.Err())
	}
	deadline = time.Now().Add(30 * time.Second)
	for {
		err := acquire()
		if err == nil {
			e.Count("disk-recovered", 1)
			return sleepCtx(ctx, faultFor/2)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("acquires not granted again within 30s of freeing node %d's disk: %v", n, err)
		}
		if err := sleepCtx(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
}
