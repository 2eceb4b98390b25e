package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/wire"
)

func (a *app) watchCmd(ctx context.Context, args []string) error {
	fs := a.newFlagSet("watch", "", "Stream lease and session events until interrupted, reconnecting (and resuming) when a stream breaks.\nWith --json, one JSON event per line.")
	cf := newClientFlags(fs)
	var opts client.WatchOptions
	fs.StringVar(&opts.Key, "key", "", "only events of this key")
	fs.StringVar(&opts.Prefix, "prefix", "", "only events of keys with this prefix")
	fs.StringVar(&opts.Holder, "holder", "", "only events of this holder")
	fs.StringVar(&opts.LastEventID, "last-event-id", "", "resume after this event id")
	fs.Uint64Var(&opts.AfterIndex, "after-index", 0, "resume after this Raft index")
	fs.BoolVar(&opts.FromStart, "from-start", false, "replay the history the node keeps")
	if err := a.parseNone(fs, args, clientEnv(), " (use --key or --prefix)"); err != nil {
		return err
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	opts.OnReconnect = func(err error, d time.Duration) {
		fmt.Fprintf(a.stderr, "watch: stream interrupted (%v); reconnecting in %s\n", err, d)
	}
	enc := json.NewEncoder(a.stdout)
	err = c.Watch(ctx, opts, func(ev wire.Event) error {
		if cf.json {
			return enc.Encode(ev)
		}
		return printEvent(a.stdout, ev)
	})
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil // interrupted: the normal way to stop watching
	}
	return err
}

// printEvent prints one event on one line.
func printEvent(w io.Writer, ev wire.Event) error {
	var b strings.Builder
	ts := ev.Time
	if ts.IsZero() {
		ts = time.Now()
	}
	fmt.Fprintf(&b, "%s %-10s %-17s", ts.Local().Format("15:04:05.000"), ev.ID, ev.Type)
	field := func(k, v string) {
		if v != "" {
			fmt.Fprintf(&b, " %s=%s", k, v)
		}
	}
	key := ev.Key
	if l := ev.Lease; l != nil {
		key = cmp.Or(key, l.Key)
		field("key", key)
		field("lease", l.LeaseID)
		field("holder", l.Holder)
		field("fencing", fmt.Sprint(l.FencingToken))
		if l.State == "active" && l.RemainingMS > 0 {
			field("remaining", msString(l.RemainingMS))
		}
	} else {
		field("key", key)
	}
	if s := ev.Session; s != nil {
		field("session", s.SessionID)
		if ev.Lease == nil {
			field("holder", s.Holder)
		}
	}
	field("reason", ev.Reason)
	field("previous", ev.Previous)
	b.WriteByte('\n')
	_, err := io.WriteString(w, b.String())
	return err
}
