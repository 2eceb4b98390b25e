package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// The diverged-follower scenario. One follower is told, as the leader's
// state check tells a server whose state hash is not the majority's, that
// its state differs (POST /internal/node/diverged over the Raft port's
// node-to-node streams, sent from the leader). From the moment that notice
// is acknowledged, the follower must answer no read from its state, stale
// or not: a prober reads it (stale list, stale get, event stream) every
// divergeProbeEvery and any answer other than 503 OUT_OF_SERVICE naming
// the state fails the run. The follower is restarted at the end (a
// restart forgets the verdict: its state check at start compares it
// again, and here it agrees).
//
// Only the in-process tier can send the notice (it holds the nodes and so
// their node-to-node streams); the netns tier skips it.

const divergeProbeEvery = 50 * time.Millisecond

// nodeHolder is a cluster whose nodes the harness holds (the in-process
// tier).
type nodeHolder interface{ Node(i int) *node.Node }

func divergeFollower(ctx context.Context, e *Env) error {
	nh, ok := e.C.(nodeHolder)
	if !ok {
		return fmt.Errorf("%w: the diverged notice travels on the Raft port's node-to-node streams", ErrUnsupported)
	}
	l, err := e.WaitLeader(ctx, 10*time.Second)
	if err != nil {
		return err
	}
	f := e.Others(l)[e.Rng.IntN(e.C.Size()-1)]
	probeCtx, stopProbe := context.WithCancel(ctx)
	probeErr := make(chan error, 1)
	return e.Fault(ctx, "diverge", fmt.Sprintf("follower %d told its state differs", f), faultFor, func() error {
		if err := sendDiverged(ctx, nh, e, l, f); err != nil {
			return err
		}
		go func() { probeErr <- e.probeDiverged(probeCtx, f) }()
		return nil
	}, func() error {
		stopProbe()
		perr := <-probeErr
		if err := e.C.Kill(f); err != nil {
			return err
		}
		if err := e.C.Restart(f); err != nil {
			return err
		}
		e.Count("restarts", 1)
		return perr
	})
}

// sendDiverged sends node f the state check's notice from node l.
func sendDiverged(ctx context.Context, nh nodeHolder, e *Env, l, f int) error {
	ln, fn := nh.Node(l), nh.Node(f)
	if ln == nil || fn == nil {
		return fmt.Errorf("node %d or %d does not run", l, f)
	}
	conf, err := ln.Cluster().Configuration()
	if err != nil {
		return err
	}
	addr := ""
	for _, s := range conf.Servers {
		if string(s.ID) == e.C.NodeID(f) {
			addr = string(s.Address)
		}
	}
	if addr == "" {
		return fmt.Errorf("node %d is not in the configuration", f)
	}
	at := fn.AppliedIndex()
	body, _ := json.Marshal(map[string]any{"index": at, "sum": "c4a05d1ffe12", "majority": "0123456789ab",
		"by": e.C.NodeID(l) + " (the chaos nemesis)"})
	hc := &http.Client{Transport: &http.Transport{DialContext: ln.DialPeer}, Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/internal/node/diverged", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("diverged notice to node %d: %s", f, resp.Status)
	}
	e.Note("diverged", "node "+strconv.Itoa(f)+" at applied index "+strconv.FormatUint(at, 10), nil)
	return nil
}

// probeDiverged reads node f, which was told its state differs, until ctx
// ends: every read must be refused with OUT_OF_SERVICE (diverged).
func (e *Env) probeDiverged(ctx context.Context, f int) error {
	cl := e.admin[f]
	// An event stream opened now must be refused too.
	probes := []struct {
		name string
		read func(context.Context) error
	}{
		{"stale list", func(ctx context.Context) error { _, err := cl.List(ctx, wire.ListRequest{Limit: 5}); return err }},
		{"stale get", func(ctx context.Context) error { _, err := cl.Get(ctx, "ls_00000000000000000000000000"); return err }},
		{"stale sessions", func(ctx context.Context) error { _, err := cl.ListSessions(ctx, "", ""); return err }},
		{"events", func(ctx context.Context) error {
			wctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			return cl.Watch(wctx, client.WatchOptions{}, func(wire.Event) error { return nil })
		}},
	}
	refused := 0
	for i := 0; ; i++ {
		p := probes[i%len(probes)]
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := p.read(rctx)
		cancel()
		if ctx.Err() != nil {
			break
		}
		var we *wire.Error
		switch code := client.ErrorCode(err); {
		case code == wire.CodeOutOfService && errors.As(err, &we) && we.ServiceState == string(node.ServiceDiverged):
			refused++
		case err == nil || code == wire.CodeLeaseNotFound:
			e.Count("diverged-answers", 1)
			return fmt.Errorf("node %d answered a %s from its state after it was told the state differs", f, p.name)
		default:
			// A transport error or a timeout: no answer, nothing shown.
		}
		if sleepCtx(ctx, divergeProbeEvery) != nil {
			break
		}
	}
	e.Count("diverged-refusals", refused)
	return nil
}
